//! PCI devices as sysfs shows them under `bus/pci/devices/<domain:bus:dev.fn>`.

use crate::{FsError, Sys};

/// What every PCI backend needs to know about a function.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PciDevice {
    /// `0000:17:00.0`
    pub address: String,
    pub vendor: u16,
    pub device: u16,
    /// 24-bit class code: `0x030200` is a 3D controller.
    pub class: u32,
    /// `None` when the kernel says -1 (no NUMA affinity) or the attribute is missing.
    pub numa_node: Option<u32>,
    /// Bound driver's name (`nvidia`, `vfio-pci`), `None` when unbound.
    pub driver: Option<String>,
}

impl PciDevice {
    /// The sysfs directory of this function, relative to `/sys`.
    pub fn path(&self) -> String {
        format!("bus/pci/devices/{}", self.address)
    }

    /// `path()/attr`.
    pub fn attr(&self, attr: &str) -> String {
        format!("{}/{attr}", self.path())
    }

    /// The 8-bit base class (`0x03` display, `0x02` network, `0x12` processing accelerator).
    pub fn base_class(&self) -> u8 {
        (self.class >> 16) as u8
    }

    /// Read one function. Missing `vendor`/`device`/`class` is an error; the rest is optional.
    pub fn read(sys: &dyn Sys, address: &str) -> Result<Self, FsError> {
        let dir = format!("bus/pci/devices/{address}");
        Ok(PciDevice {
            address: address.to_owned(),
            vendor: read_hex(sys, &format!("{dir}/vendor"))? as u16,
            device: read_hex(sys, &format!("{dir}/device"))? as u16,
            class: read_hex(sys, &format!("{dir}/class"))?,
            numa_node: numa_node(sys, &format!("{dir}/numa_node")),
            driver: sys.link_name(&format!("{dir}/driver")),
        })
    }

    /// Every PCI function whose vendor/class the filter accepts, sorted by address.
    /// Functions that cannot be read (a refused or vanished path) are skipped.
    pub fn list(sys: &dyn Sys, filter: impl Fn(u16, u32) -> bool) -> Result<Vec<Self>, FsError> {
        let mut out = Vec::new();
        for addr in sys.list("bus/pci/devices")? {
            let dir = format!("bus/pci/devices/{addr}");
            let (Ok(vendor), Ok(class)) =
                (read_hex(sys, &format!("{dir}/vendor")), read_hex(sys, &format!("{dir}/class")))
            else {
                continue;
            };
            if filter(vendor as u16, class)
                && let Ok(dev) = Self::read(sys, &addr)
            {
                out.push(dev);
            }
        }
        Ok(out)
    }

    /// The chain of PCI addresses above this function (root port first), from its resolved path:
    /// `devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0` → `[0000:00:01.0, 0000:01:00.0]`.
    pub fn upstream(&self, sys: &dyn Sys) -> Vec<String> {
        let Ok(canon) = sys.canonical(&self.path()) else { return Vec::new() };
        let parts: Vec<&str> = canon.split('/').filter(|p| is_pci_address(p)).collect();
        parts.iter().take(parts.len().saturating_sub(1)).map(|s| (*s).to_owned()).collect()
    }
}

/// `0000:17:00.0`-shaped.
pub fn is_pci_address(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 12 && b[4] == b':' && b[7] == b':' && b[10] == b'.'
}

/// Parse `0x10de` (or `10de`) from an attribute.
pub fn read_hex(sys: &dyn Sys, path: &str) -> Result<u32, FsError> {
    let text = sys.read(path)?;
    let t = text.trim();
    let t = t.strip_prefix("0x").unwrap_or(t);
    u32::from_str_radix(t, 16).map_err(|_| FsError::Io(format!("{path}: not a hex number: {text:?}")))
}

/// Parse a decimal attribute.
pub fn read_u64(sys: &dyn Sys, path: &str) -> Result<u64, FsError> {
    let text = sys.read(path)?;
    text.trim().parse().map_err(|_| FsError::Io(format!("{path}: not a number: {text:?}")))
}

/// A `numa_node` attribute: -1 or missing → `None`.
pub fn numa_node(sys: &dyn Sys, path: &str) -> Option<u32> {
    sys.read(path).ok()?.trim().parse::<i64>().ok().and_then(|n| u32::try_from(n).ok())
}

/// Entries of `class/<name>` (`drm`, `net`, `infiniband`), empty when the class does not exist.
pub fn class_members(sys: &dyn Sys, class: &str) -> Vec<String> {
    sys.list(&format!("class/{class}")).unwrap_or_default()
}
