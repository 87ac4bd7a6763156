//! PCI devices as sysfs shows them under `bus/pci/devices/<domain:bus:dev.fn>`.

use crate::sys::{each, last_component};
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
        PciCache::default().list(sys, filter)
    }

    /// The chain of PCI addresses above this function (root port first), from its resolved path:
    /// `devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0` → `[0000:00:01.0, 0000:01:00.0]`.
    pub fn upstream(&self, sys: &dyn Sys) -> Vec<String> {
        let Ok(canon) = sys.canonical(&self.path()) else { return Vec::new() };
        let parts: Vec<&str> = canon.split('/').filter(|p| is_pci_address(p)).collect();
        parts.iter().take(parts.len().saturating_sub(1)).map(|s| (*s).to_owned()).collect()
    }
}

/// `TOTAL_ERR_FATAL 2` in an `aer_dev_fatal` attribute → 2.
fn parse_aer_fatal(text: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix("TOTAL_ERR_FATAL").and_then(|v| v.trim().parse().ok()))
}

/// `0000:17:00.0`-shaped.
pub fn is_pci_address(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 12 && b[4] == b':' && b[7] == b':' && b[10] == b'.'
}

/// Parse `0x10de` (or `10de`) from an attribute.
pub fn read_hex(sys: &dyn Sys, path: &str) -> Result<u32, FsError> {
    let text = sys.read(path)?;
    parse_hex(&text).ok_or_else(|| FsError::Io(format!("{path}: not a hex number: {text:?}")))
}

/// `0x10de` (or `10de`) → 0x10de.
pub fn parse_hex(text: &str) -> Option<u32> {
    let t = text.trim();
    u32::from_str_radix(t.strip_prefix("0x").unwrap_or(t), 16).ok()
}

/// A `numa_node` attribute's text: -1 → `None`.
fn parse_numa(text: &str) -> Option<u32> {
    text.trim().parse::<i64>().ok().and_then(|n| u32::try_from(n).ok())
}

/// Parse a decimal attribute.
pub fn read_u64(sys: &dyn Sys, path: &str) -> Result<u64, FsError> {
    let text = sys.read(path)?;
    text.trim().parse().map_err(|_| FsError::Io(format!("{path}: not a number: {text:?}")))
}

/// A `numa_node` attribute: -1 or missing → `None`.
pub fn numa_node(sys: &dyn Sys, path: &str) -> Option<u32> {
    parse_numa(&sys.read(path).ok()?)
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
        parse_aer_fatal(&sys.read(&self.attr("aer_dev_fatal")).ok()?)
    }

    /// Why this function is not fit for a container, if it is not: no driver bound, or fatal
    /// PCIe errors seen since boot (the device needs a reset before anyone trusts it again).
    pub fn sickness(&self, sys: &dyn Sys, driver_ok: impl Fn(&str) -> bool) -> Option<String> {
        Self::sickness_many(sys, std::slice::from_ref(self), driver_ok).pop().flatten()
    }

    /// [`PciDevice::sickness`] of every function, with their AER counters read in one host call.
    pub fn sickness_many(sys: &dyn Sys, devs: &[PciDevice], driver_ok: impl Fn(&str) -> bool) -> Vec<Option<String>> {
        let aer = each(devs, |d| d.driver.is_some().then(|| d.attr("aer_dev_fatal")), |p| sys.read_many(p));
        devs.iter()
            .zip(aer)
            .map(|(d, aer)| match &d.driver {
                None => Some("no driver bound".into()),
                Some(drv) if !driver_ok(drv) => Some(format!("bound to unexpected driver {drv}")),
                Some(_) => match aer.and_then(|r| r.ok()).and_then(|t| parse_aer_fatal(&t)) {
                    Some(n) if n > 0 => Some(format!("{n} fatal AER errors since boot")),
                    _ => None,
                },
            })
            .collect()
    }

    /// `0000:17:00.0`'s bus/device/function in the `lspci` sense, for attributes.
    pub fn vendor_device(&self) -> String {
        format!("{:04x}:{:04x}", self.vendor, self.device)
    }
}

/// Remembers what never changes about a PCI function while it stays on the bus (IDs, class,
/// NUMA node), so a health poll re-reads only what does (the bound driver). Functions the filter
/// does not select cost two reads (class, vendor), once. With hundreds of
/// VFs every host call counts. A function that leaves the bus is forgotten, so one hot-plugged
/// at the same address is read afresh.
#[derive(Default)]
pub struct PciCache {
    /// Address → (function, whether `device` and `numa_node` were read yet: only for functions a
    /// filter selected).
    known: std::cell::RefCell<std::collections::BTreeMap<String, (PciDevice, bool)>>,
}

impl PciCache {
    /// Like [`PciDevice::list`], reading only `driver` again for functions seen before. Each
    /// step is one batched host call for all functions, however many there are.
    pub fn list(&self, sys: &dyn Sys, filter: impl Fn(u16, u32) -> bool) -> Result<Vec<PciDevice>, FsError> {
        let addrs = sys.list("bus/pci/devices")?;
        let mut known = self.known.borrow_mut();
        known.retain(|a, _| addrs.binary_search(a).is_ok());
        // Functions not seen before: what the filter needs (class, vendor), whether it selects
        // them or not; the rest only for those it selects (on a machine with hundreds of VFs a
        // GPU backend would otherwise read two more files of every one of them).
        let new: Vec<&String> = addrs.iter().filter(|a| !known.contains_key(*a)).collect();
        let facts = ["class", "vendor"];
        let paths: Vec<String> = new.iter().flat_map(|a| facts.map(|f| attr(a, f))).collect();
        for (addr, got) in new.iter().zip(sys.read_many(&paths).chunks(facts.len())) {
            let hex = |i: usize| got.get(i).and_then(|r| r.as_ref().ok()).and_then(|t| parse_hex(t));
            let (Some(class), Some(vendor)) = (hex(0), hex(1)) else { continue };
            let d = PciDevice {
                address: (*addr).clone(),
                vendor: vendor as u16,
                device: 0,
                class,
                numa_node: None,
                driver: None,
            };
            known.insert((*addr).clone(), (d, false));
        }
        // Selected functions whose device ID is not known yet (new ones, or one that could not be
        // read before): device and NUMA node, in one call.
        let pending: Vec<String> = known
            .iter()
            .filter(|(_, (d, complete))| !complete && filter(d.vendor, d.class))
            .map(|(a, _)| a.clone())
            .collect();
        let paths: Vec<String> = pending.iter().flat_map(|a| [attr(a, "device"), attr(a, "numa_node")]).collect();
        for (addr, got) in pending.iter().zip(sys.read_many(&paths).chunks(2)) {
            let Some((dev, complete)) = known.get_mut(addr) else { continue };
            let Some(device) = got[0].as_ref().ok().and_then(|t| parse_hex(t)) else { continue };
            dev.device = device as u16;
            dev.numa_node = got[1].as_ref().ok().and_then(|t| parse_numa(t));
            *complete = true;
        }
        // Every selected function's driver: the one fact a poll reads again.
        let mut out: Vec<PciDevice> = known
            .values()
            .filter(|(d, complete)| *complete && filter(d.vendor, d.class))
            .map(|(d, _)| d.clone())
            .collect();
        let paths: Vec<String> = out.iter().map(|d| d.attr("driver")).collect();
        for (d, link) in out.iter_mut().zip(sys.read_link_many(&paths)) {
            d.driver = link.ok().and_then(|t| last_component(&t));
        }
        Ok(out)
    }
}

fn attr(address: &str, attr: &str) -> String {
    format!("bus/pci/devices/{address}/{attr}")
}
