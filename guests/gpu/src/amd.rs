//! AMD compute partitions (Instinct MI300: SPX, DPX, QPX, CPX): a GPU split into XCPs is served
//! as one device per partition, each with its own render node, as ROCm hands them out.
//!
//! The driver's word is KFD's topology (`/sys/class/kfd/kfd/topology/nodes/N`, Linux
//! `amdkfd/kfd_topology.c`): one node per active partition, numbered in probe order after the
//! CPU nodes, whose `properties` name the partition's render minor (`drm_render_minor`, its XCP's
//! DRM device: `amdgpu_xcp.N` for every partition but the first) and its GPU
//! (`domain`, `location_id` = bus << 8 | devfn). A GPU with one node is served whole, as before
//! (its card and render node); node numbers and render minors are read, never assumed, since
//! they move with every mode switch. The partition modes come from the GPU's
//! `current_compute_partition` and `current_memory_partition` (`amdgpu_gfx.c`, `amdgpu_gmc.c`).

use std::collections::BTreeMap;

use devplug_sdk::Sys;
use devplug_sdk::pci::PciDevice;

const NODES: &str = "class/kfd/kfd/topology/nodes";
const AMD: u64 = 0x1002;

/// One active partition of a GPU, as KFD lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Partition {
    /// Its place among its GPU's partitions (0 for the GPU's own DRM device).
    pub index: usize,
    pub render_minor: u32,
    /// Compute units (`simd_count / simd_per_cu`).
    pub compute_units: Option<u64>,
    /// Frame-buffer memory it sees, in bytes (`mem_banks/0`): with NPS, partitions on one
    /// memory partition see the same memory.
    pub memory: Option<u64>,
}

/// `name value` lines (KFD's `properties` files).
fn properties(text: &str) -> BTreeMap<&str, u64> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k, v.trim().parse().ok()?))
        })
        .collect()
}

/// `0000:05:00.0` from KFD's `domain` and `location_id`.
fn address(domain: u64, location: u64) -> Option<String> {
    (domain <= 0xffff && location <= 0xffff).then(|| {
        let (bus, devfn) = (location >> 8, location & 0xff);
        format!("{domain:04x}:{bus:02x}:{:02x}.{}", devfn >> 3, devfn & 7)
    })
}

/// The active partitions of every AMD GPU KFD knows, by the GPU's PCI address, each GPU's in
/// node order. Empty when KFD is not loaded or its topology may not be read.
pub fn partitions(sys: &dyn Sys) -> BTreeMap<String, Vec<Partition>> {
    let mut nodes: Vec<u32> = sys.list(NODES).unwrap_or_default().iter().filter_map(|n| n.parse().ok()).collect();
    nodes.sort_unstable();
    let paths: Vec<String> = nodes
        .iter()
        .flat_map(|n| [format!("{NODES}/{n}/properties"), format!("{NODES}/{n}/mem_banks/0/properties")])
        .collect();
    let texts = sys.read_many(&paths);
    let mut out: BTreeMap<String, Vec<Partition>> = BTreeMap::new();
    for pair in texts.chunks(2) {
        let Some(Ok(props)) = pair.first() else { continue };
        let p = properties(props);
        let get = |k: &str| p.get(k).copied();
        if get("simd_count").unwrap_or(0) == 0 || get("vendor_id") != Some(AMD) {
            continue; // a CPU node, or another vendor's
        }
        let (Some(addr), Some(minor)) = (
            get("location_id").and_then(|l| address(get("domain").unwrap_or(0), l)),
            get("drm_render_minor").and_then(|m| u32::try_from(m).ok()),
        ) else {
            continue;
        };
        let memory =
            pair.get(1).and_then(|r| r.as_ref().ok()).and_then(|t| properties(t).get("size_in_bytes").copied());
        let compute_units = get("simd_per_cu").filter(|&s| s > 0).and_then(|s| Some(get("simd_count")? / s));
        let list = out.entry(addr).or_default();
        list.push(Partition { index: list.len(), render_minor: minor, compute_units, memory });
    }
    out
}

/// The GPU's compute and memory partition modes as attributes (`compute-partition = CPX`,
/// `memory-partition = NPS4`), those the driver has.
pub fn mode_attributes(sys: &dyn Sys, gpu: &PciDevice) -> Vec<(String, String)> {
    [("current_compute_partition", "compute-partition"), ("current_memory_partition", "memory-partition")]
        .into_iter()
        .filter_map(|(file, attr)| {
            let mode = sys.read(&gpu.attr(file)).ok()?.trim().to_owned();
            let plausible = !mode.is_empty() && mode.len() <= 16 && mode.chars().all(|c| c.is_ascii_alphanumeric());
            plausible.then(|| (attr.to_owned(), mode))
        })
        .collect()
}

/// The device ID of partition `index` of the GPU at `pci`.
pub fn partition_id(pci: &str, index: usize) -> String {
    format!("{pci}-xcp{index}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use devplug_sdk::FixtureSys;

    #[test]
    fn kfd_locations_are_pci_addresses() {
        assert_eq!(address(0, 0x0500).as_deref(), Some("0000:05:00.0"));
        assert_eq!(address(1, 0xe50b).as_deref(), Some("0001:e5:01.3"));
        assert_eq!(address(0x10000, 0), None);
    }

    #[test]
    fn spx_has_one_partition_per_gpu_and_cpx_eight_with_their_own_render_minors() {
        let spx = partitions(&FixtureSys::repo_machine("amd-mi300x"));
        assert_eq!(spx.len(), 8);
        assert!(spx.values().all(|p| p.len() == 1));
        assert_eq!(spx["0000:25:00.0"][0].render_minor, 136);
        assert_eq!(spx["0000:05:00.0"][0].compute_units, Some(304));
        let cpx = partitions(&FixtureSys::repo_machine("amd-mi300x-cpx"));
        assert_eq!(cpx.len(), 8);
        let gpu1 = &cpx["0000:25:00.0"];
        assert_eq!(gpu1.iter().map(|p| p.render_minor).collect::<Vec<_>>(), (136..144).collect::<Vec<_>>());
        assert_eq!(gpu1[3].compute_units, Some(38));
        assert_eq!(gpu1[3].memory, Some(48 << 30), "NPS4: a quarter of 192 GiB");
    }
}
