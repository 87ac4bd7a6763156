//! Kubernetes' standard device attributes, written by the host (a backend may not: see
//! `model::dra::reserved_attribute`): `resource.kubernetes.io/pciBusID` and `pcieRoot` for a
//! device whose backend names its PCI address in the `pci` attribute (every first-party backend
//! does), and `numaNode` for a device with a NUMA node. Drivers of different vendors align on
//! these (a GPU and a NIC under one PCIe root, `matchAttribute` in a claim's constraints), which
//! a vendor-named attribute cannot do.
//!
//! The PCIe root comes from sysfs as upstream's `deviceattribute.GetPCIeRootAttributeByPCIBusID`
//! reads it: the kernel's `bus/pci/devices/<bus ID>` link points into
//! `devices/pci<domain>:<bus>/…/<bus ID>`, and the `pci<domain>:<bus>` component is the root
//! complex. The address is the backend's word: only a [`PciAddress`] (well formed, granted to
//! that backend, present in sysfs) is published or read from.

use std::path::Path;

use serde_json::{Value, json};

use crate::gate::PciAddress;

/// The prefix of Kubernetes' standard attribute names.
pub const PREFIX: &str = "resource.kubernetes.io/";

/// The PCIe root complex (`pci0000:3a`) of PCI device `bus_id` under sysfs `sysfs`.
pub fn pcie_root(sysfs: &Path, bus_id: &PciAddress) -> Result<String, String> {
    let bus_id = bus_id.as_str();
    let link = sysfs.join("bus/pci/devices").join(bus_id);
    let target = std::fs::read_link(&link).map_err(|e| format!("{}: {e}", link.display()))?;
    let target = target.to_string_lossy();
    let mut rest: &str = &target;
    while let Some(r) = rest.strip_prefix("../") {
        rest = r;
    }
    let root = rest
        .strip_prefix("devices/")
        .and_then(|r| r.split('/').next())
        .filter(|root| root.starts_with("pci"))
        .ok_or_else(|| format!("{} points at {target}, not into devices/pci…", link.display()))?;
    if !rest.ends_with(&format!("/{bus_id}")) {
        return Err(format!("{} points at {target}, which is not {bus_id}", link.display()));
    }
    Ok(root.to_owned())
}

/// The standard attributes of a device whose gated PCI address is `pci` and whose NUMA nodes
/// are `numa`: name → typed value. `sysfs` is where the host reads PCIe roots (none: no
/// `pcieRoot`).
pub fn attributes(sysfs: Option<&Path>, pci: Option<&PciAddress>, numa: &[u32]) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    if let Some(numa) = numa.first() {
        out.push((format!("{PREFIX}numaNode"), json!({ "int": numa })));
    }
    let Some(bus_id) = pci else { return out };
    out.push((format!("{PREFIX}pciBusID"), json!({ "string": bus_id.as_str() })));
    if let Some(sysfs) = sysfs {
        match pcie_root(sysfs, bus_id) {
            Ok(root) => out.push((format!("{PREFIX}pcieRoot"), json!({ "string": root }))),
            Err(why) => tracing::debug!("no pcieRoot for {}: {why}", bus_id.as_str()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every address in these tests is granted and present: the gate's own tests cover the rest.
    struct Everything;
    impl crate::gate::PciLookup for Everything {
        fn granted(&self, _: &str) -> bool {
            true
        }
        fn present(&self, _: &str) -> bool {
            true
        }
    }
    fn pci(s: &str) -> PciAddress {
        PciAddress::new(s, &Everything).unwrap()
    }

    /// The layouts upstream's `GetPCIeRootAttributeByPCIBusID` tests: a device behind a bridge,
    /// a link into something that is not a root complex, a link to another device, none at all.
    #[test]
    fn the_root_complex_is_read_from_the_kernels_link() {
        let d = tempfile::tempdir().unwrap();
        let sys = d.path();
        std::fs::create_dir_all(sys.join("bus/pci/devices")).unwrap();
        let link =
            |id: &str, target: &str| std::os::unix::fs::symlink(target, sys.join("bus/pci/devices").join(id)).unwrap();
        link("0000:02:00.0", "../../../devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0");
        link("0000:03:00.0", "../../../devices/platform/0000:03:00.0");
        link("0000:04:00.0", "../../../devices/pci0000:00/0000:00:13.1");
        assert_eq!(pcie_root(sys, &pci("0000:02:00.0")).unwrap(), "pci0000:00");
        assert!(pcie_root(sys, &pci("0000:03:00.0")).unwrap_err().contains("not into devices/pci"));
        assert!(pcie_root(sys, &pci("0000:04:00.0")).unwrap_err().contains("not 0000:04:00.0"));
        assert!(pcie_root(sys, &pci("0000:05:00.0")).is_err());
        let attrs = attributes(Some(sys), Some(&pci("0000:02:00.0")), &[1]);
        let names: Vec<&str> = attrs.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            ["resource.kubernetes.io/numaNode", "resource.kubernetes.io/pciBusID", "resource.kubernetes.io/pcieRoot"]
        );
        assert!(attributes(Some(sys), None, &[]).is_empty());
    }
}
