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
                && let Ok(device) = read_hex(sys, &format!("{dir}/device"))
            {
                // vendor and class are already read: every host call counts with hundreds of VFs.
                out.push(PciDevice {
                    numa_node: numa_node(sys, &format!("{dir}/numa_node")),
                    driver: sys.link_name(&format!("{dir}/driver")),
                    address: addr,
                    vendor: vendor as u16,
                    device: device as u16,
                    class,
                });
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

impl PciDevice {
    /// The physical function's address, for an SR-IOV virtual function (`physfn` link).
    pub fn physfn(&self, sys: &dyn Sys) -> Option<String> {
        sys.link_name(&self.attr("physfn")).filter(|a| is_pci_address(a))
    }

    /// Virtual functions of a physical function, in `virtfnN` order (not address order).
    pub fn virtfns(&self, sys: &dyn Sys) -> Vec<String> {
        let mut vfs: Vec<(u32, String)> = sys
            .list(&self.path())
            .unwrap_or_default()
            .into_iter()
            .filter_map(|e| e.strip_prefix("virtfn").and_then(|n| n.parse().ok()).map(|n: u32| (n, e)))
            .filter_map(|(n, e)| sys.link_name(&self.attr(&e)).map(|a| (n, a)))
            .collect();
        vfs.sort();
        vfs.into_iter().map(|(_, a)| a).collect()
    }

    /// The IOMMU group number (`iommu_group` → `kernel/iommu_groups/N`).
    pub fn iommu_group(&self, sys: &dyn Sys) -> Option<String> {
        sys.link_name(&self.attr("iommu_group"))
    }

    /// Entries of a per-device class directory (`net`, `drm`, `infiniband`, `infiniband_verbs`).
    pub fn class_dir(&self, sys: &dyn Sys, class: &str) -> Vec<String> {
        sys.list(&self.attr(class)).unwrap_or_default()
    }

    /// The PCIe switch (or, without one, the root port) this function hangs off: the bridge two
    /// levels up, which is the switch's upstream port. Devices sharing it talk peer-to-peer
    /// without crossing the CPU.
    pub fn switch(&self, sys: &dyn Sys) -> Option<String> {
        let up = self.upstream(sys);
        match up.len() {
            0 => None,
            1 => up.first().cloned(),
            n => up.get(n - 2).cloned(),
        }
    }

    /// Fatal AER errors since boot (`aer_dev_fatal`'s `TOTAL_ERR_FATAL`), `None` without AER.
    pub fn aer_fatal(&self, sys: &dyn Sys) -> Option<u64> {
        let text = sys.read(&self.attr("aer_dev_fatal")).ok()?;
        text.lines().find_map(|l| l.strip_prefix("TOTAL_ERR_FATAL").and_then(|v| v.trim().parse().ok()))
    }

    /// Why this function is not fit for a container, if it is not: no driver bound, or fatal
    /// PCIe errors seen since boot (the device needs a reset before anyone trusts it again).
    pub fn sickness(&self, sys: &dyn Sys, driver_ok: impl Fn(&str) -> bool) -> Option<String> {
        match &self.driver {
            None => return Some("no driver bound".into()),
            Some(d) if !driver_ok(d) => return Some(format!("bound to unexpected driver {d}")),
            Some(_) => {}
        }
        match self.aer_fatal(sys) {
            Some(n) if n > 0 => Some(format!("{n} fatal AER errors since boot")),
            _ => None,
        }
    }

    /// `0000:17:00.0`'s bus/device/function in the `lspci` sense, for attributes.
    pub fn vendor_device(&self) -> String {
        format!("{:04x}:{:04x}", self.vendor, self.device)
    }
}

/// Remembers what never changes about a PCI function while it stays on the bus (IDs, class,
/// NUMA node), so a health poll re-reads only what does (the bound driver). With hundreds of
/// VFs every host call counts. A function that leaves the bus is forgotten, so one hot-plugged
/// at the same address is read afresh.
#[derive(Default)]
pub struct PciCache {
    /// Address → (function, whether `device` and `numa_node` were read yet).
    known: std::cell::RefCell<std::collections::BTreeMap<String, (PciDevice, bool)>>,
}

impl PciCache {
    /// Like [`PciDevice::list`], reading only `driver` again for functions seen before.
    pub fn list(&self, sys: &dyn Sys, filter: impl Fn(u16, u32) -> bool) -> Result<Vec<PciDevice>, FsError> {
        let addrs = sys.list("bus/pci/devices")?;
        let mut known = self.known.borrow_mut();
        known.retain(|a, _| addrs.binary_search(a).is_ok());
        let mut out = Vec::new();
        for addr in addrs {
            let dir = format!("bus/pci/devices/{addr}");
            if !known.contains_key(&addr) {
                let (Ok(class), Ok(vendor)) =
                    (read_hex(sys, &format!("{dir}/class")), read_hex(sys, &format!("{dir}/vendor")))
                else {
                    continue;
                };
                let d = PciDevice {
                    address: addr.clone(),
                    vendor: vendor as u16,
                    device: 0,
                    class,
                    numa_node: None,
                    driver: None,
                };
                known.insert(addr.clone(), (d, false));
            }
            let Some((dev, complete)) = known.get_mut(&addr) else { continue };
            if !filter(dev.vendor, dev.class) {
                continue;
            }
            if !*complete {
                let Ok(device) = read_hex(sys, &format!("{dir}/device")) else { continue };
                dev.device = device as u16;
                dev.numa_node = numa_node(sys, &format!("{dir}/numa_node"));
                *complete = true;
            }
            let mut dev = dev.clone();
            dev.driver = sys.link_name(&format!("{dir}/driver"));
            out.push(dev);
        }
        Ok(out)
    }
}
