//! Kubernetes' standard device attributes, written by the host (a backend may not: see
//! `model::dra::reserved_attribute`): `resource.kubernetes.io/pciBusID` and `pcieRoot` for a
//! device whose backend names its PCI address in the `pci` attribute (every first-party backend
//! does), and `numaNode` for a device with a NUMA node. Drivers of different vendors align on
//! these (a GPU and a NIC under one PCIe root, `matchAttribute` in a claim's constraints), which
//! a vendor-named attribute cannot do.
//!
//! Beside them the host writes devplug's own `devplug.io/pcieSwitch`: Kubernetes has no standard
//! name for the PCIe switch a device sits under, and without one each backend named it its own
//! way (the gpu backend's `pcie-switch`, a vendor's `pcie_switch`), so no claim could match a
//! GPU and a NIC of two drivers on one switch (peer-to-peer without crossing the root port).
//!
//! The PCIe root comes from sysfs as upstream's `deviceattribute.GetPCIeRootAttributeByPCIBusID`
//! reads it: the kernel's `bus/pci/devices/<bus ID>` link points into
//! `devices/pci<domain>:<bus>/…/<bus ID>`, and the `pci<domain>:<bus>` component is the root
//! complex. The address is the backend's word: only a [`PciAddress`] (well formed, granted to
//! that backend, present in sysfs) is published or read from.

use std::path::Path;

use k8s_openapi::api::resource::v1::DeviceAttribute;

use super::pool::{int, text};

use crate::gate::PciAddress;

/// The prefix of Kubernetes' standard attribute names.
pub(crate) const PREFIX: &str = "resource.kubernetes.io/";

/// Where the kernel puts PCI device `bus_id` under sysfs `sysfs`: the target of its
/// `bus/pci/devices/<bus ID>` link, `…/devices/pci<domain>:<bus>/<bridge>/…/<bus ID>`, read once
/// for both [`pcie_root`] and [`pcie_switch`].
pub(crate) fn pci_path(sysfs: &Path, bus_id: &PciAddress) -> Result<String, String> {
    let link = sysfs.join("bus/pci/devices").join(bus_id.as_str());
    let target = std::fs::read_link(&link).map_err(|e| format!("{}: {e}", link.display()))?;
    Ok(target.to_string_lossy().into_owned())
}

/// The PCIe root complex (`pci0000:3a`) of PCI device `bus_id` whose [`pci_path`] is `target`.
pub(crate) fn pcie_root(target: &str, bus_id: &PciAddress) -> Result<String, String> {
    let bus_id = bus_id.as_str();
    let rest = target.trim_start_matches("../");
    let root = rest
        .strip_prefix("devices/")
        .and_then(|r| r.split('/').next())
        .filter(|root| root.starts_with("pci"))
        .ok_or_else(|| format!("bus/pci/devices/{bus_id} points at {target}, not into devices/pci…"))?;
    if !rest.ends_with(&format!("/{bus_id}")) {
        return Err(format!("bus/pci/devices/{bus_id} points at {target}, which is not {bus_id}"));
    }
    Ok(root.to_owned())
}

/// devplug's attribute for the PCIe switch a device sits under.
pub(crate) const PCIE_SWITCH: &str = "devplug.io/pcieSwitch";

/// The upstream port (`0000:15:00.0`) of the PCIe switch PCI device `bus_id` sits directly
/// under, from its [`pci_path`] `target`: a switch is an upstream port with downstream ports
/// below it, so a device behind one has at least three bridges between it and its root complex
/// (root port, switch upstream port, switch downstream port), and its parent's parent is the
/// switch's upstream port. `None` for a device with no switch above it (on a root port, or
/// behind a lone bridge): that is no switch to share.
pub(crate) fn pcie_switch(target: &str, bus_id: &PciAddress) -> Option<String> {
    let rest = target.trim_start_matches("../");
    let mut parts = rest.strip_prefix("devices/")?.split('/');
    parts.next().filter(|root| root.starts_with("pci"))?;
    let chain: Vec<&str> = parts.collect();
    // Every step a PCI function, ending at the device itself.
    if chain.last() != Some(&bus_id.as_str()) || !chain.iter().all(|c| crate::gate::is_bus_id(c)) {
        return None;
    }
    let bridges = &chain[..chain.len() - 1];
    (bridges.len() >= 3).then(|| bridges[bridges.len() - 2].to_owned())
}

/// The standard attributes of a device whose gated PCI address is `pci` and whose NUMA nodes
/// are `numa`: name → typed value. `sysfs` is where the host reads PCIe roots (none: no
/// `pcieRoot`).
pub fn attributes(sysfs: Option<&Path>, pci: Option<&PciAddress>, numa: &[u32]) -> Vec<(String, DeviceAttribute)> {
    let mut out = Vec::new();
    if let Some(numa) = numa.first() {
        out.push((format!("{PREFIX}numaNode"), int(i64::from(*numa))));
    }
    let Some(bus_id) = pci else { return out };
    out.push((format!("{PREFIX}pciBusID"), text(bus_id.as_str())));
    if let Some(sysfs) = sysfs {
        match pci_path(sysfs, bus_id).and_then(|target| Ok((pcie_root(&target, bus_id)?, target))) {
            Ok((root, target)) => {
                out.push((format!("{PREFIX}pcieRoot"), text(&root)));
                if let Some(switch) = pcie_switch(&target, bus_id) {
                    out.push((PCIE_SWITCH.to_owned(), text(&switch)));
                }
            }
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
        let root = |id: &str| pci_path(sys, &pci(id)).and_then(|t| pcie_root(&t, &pci(id)));
        assert_eq!(root("0000:02:00.0").unwrap(), "pci0000:00");
        assert!(root("0000:03:00.0").unwrap_err().contains("not into devices/pci"));
        assert!(root("0000:04:00.0").unwrap_err().contains("not 0000:04:00.0"));
        assert!(root("0000:05:00.0").is_err());
        let attrs = attributes(Some(sys), Some(&pci("0000:02:00.0")), &[1]);
        let names: Vec<&str> = attrs.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            ["resource.kubernetes.io/numaNode", "resource.kubernetes.io/pciBusID", "resource.kubernetes.io/pcieRoot"]
        );
        assert!(attributes(Some(sys), None, &[]).is_empty());
    }

    /// A device behind a switch (root port, switch upstream and downstream ports above it, as
    /// `pci_scan_bridge` nests them in sysfs) names the upstream port; one on a root port, or
    /// behind a lone bridge, names none; a link through something that is not a PCI function
    /// is not trusted.
    #[test]
    fn the_pcie_switch_is_the_upstream_port_above_the_downstream_port() {
        let d = tempfile::tempdir().unwrap();
        let sys = d.path();
        std::fs::create_dir_all(sys.join("bus/pci/devices")).unwrap();
        let link =
            |id: &str, target: &str| std::os::unix::fs::symlink(target, sys.join("bus/pci/devices").join(id)).unwrap();
        link("0000:17:00.0", "../../../devices/pci0000:14/0000:14:01.0/0000:15:00.0/0000:16:02.0/0000:17:00.0");
        link("0000:02:00.0", "../../../devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0");
        link("0000:41:00.0", "../../../devices/pci0000:40/0000:40:01.0/0000:41:00.0");
        link("0000:19:00.0", "../../../devices/pci0000:14/0000:14:01.0/evil/0000:16:02.0/0000:19:00.0");
        let switch = |id: &str| pcie_switch(&pci_path(sys, &pci(id)).unwrap(), &pci(id));
        assert_eq!(switch("0000:17:00.0").as_deref(), Some("0000:15:00.0"));
        assert_eq!(switch("0000:02:00.0"), None, "a lone bridge is no switch");
        assert_eq!(switch("0000:41:00.0"), None, "on a root port");
        assert_eq!(switch("0000:19:00.0"), None);
        let attrs = attributes(Some(sys), Some(&pci("0000:17:00.0")), &[]);
        assert_eq!(attrs.last(), Some(&(PCIE_SWITCH.to_owned(), text("0000:15:00.0"))));
    }
}
