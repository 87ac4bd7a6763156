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
//! complex. The address is the backend's word, so it is checked (format, a link that exists and
//! ends in that address) before the host publishes anything derived from it.

use std::path::Path;

use serde_json::{Value, json};

/// The prefix of Kubernetes' standard attribute names.
pub const PREFIX: &str = "resource.kubernetes.io/";
/// The discover attribute a backend names a device's PCI address in.
pub const PCI_ATTRIBUTE: &str = "pci";

/// Whether `s` is a PCI bus ID as sysfs names devices: `dddd:bb:dd.f`, lowercase hex.
pub fn is_bus_id(s: &str) -> bool {
    let b = s.as_bytes();
    let hex = |r: std::ops::Range<usize>| b[r].iter().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c));
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && hex(0..4)
        && hex(5..7)
        && hex(8..10)
        && (b'0'..=b'7').contains(&b[11])
}

/// The PCIe root complex (`pci0000:3a`) of PCI device `bus_id` under sysfs `sysfs`.
pub fn pcie_root(sysfs: &Path, bus_id: &str) -> Result<String, String> {
    if !is_bus_id(bus_id) {
        return Err(format!("{:?} is not a PCI bus ID (dddd:bb:dd.f)", crate::untrusted::clip(bus_id)));
    }
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

/// The standard attributes of a device with discover attributes `attributes` and NUMA nodes
/// `numa`: name → typed value. `sysfs` is where the host reads PCIe roots (none: no `pcieRoot`).
pub fn attributes(sysfs: Option<&Path>, attributes: &[(String, String)], numa: &[u32]) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    if let Some(numa) = numa.first() {
        out.push((format!("{PREFIX}numaNode"), json!({ "int": numa })));
    }
    let Some((_, bus_id)) = attributes.iter().find(|(k, v)| k == PCI_ATTRIBUTE && is_bus_id(v)) else { return out };
    out.push((format!("{PREFIX}pciBusID"), json!({ "string": bus_id })));
    if let Some(sysfs) = sysfs {
        match pcie_root(sysfs, bus_id) {
            Ok(root) => out.push((format!("{PREFIX}pcieRoot"), json!({ "string": root }))),
            Err(why) => tracing::debug!("no pcieRoot for {bus_id}: {why}"),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_are_checked_before_anything_is_read() {
        assert!(is_bus_id("0000:3b:00.0"));
        assert!(is_bus_id("0001:00:1f.7"));
        for bad in ["0000:3B:00.0", "0000:3b:00.8", "0000:3b:00", "../../../etc", "0000:3b:00.0/..", ""] {
            assert!(!is_bus_id(bad), "{bad}");
        }
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
        assert_eq!(pcie_root(sys, "0000:02:00.0").unwrap(), "pci0000:00");
        assert!(pcie_root(sys, "0000:03:00.0").unwrap_err().contains("not into devices/pci"));
        assert!(pcie_root(sys, "0000:04:00.0").unwrap_err().contains("not 0000:04:00.0"));
        assert!(pcie_root(sys, "0000:05:00.0").is_err());
        let attrs = attributes(Some(sys), &[("pci".into(), "0000:02:00.0".into())], &[1]);
        let names: Vec<&str> = attrs.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            ["resource.kubernetes.io/numaNode", "resource.kubernetes.io/pciBusID", "resource.kubernetes.io/pcieRoot"]
        );
        assert!(attributes(Some(sys), &[("pci".into(), "not-an-address".into())], &[]).is_empty());
    }
}
