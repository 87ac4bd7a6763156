//! Topology-aware choice for `preferred-allocation`: keep a request on one NUMA node when it fits,
//! and within a node on as few PCIe switches as possible, leaving the largest blocks free for the
//! next request (best fit), as the NVIDIA and SR-IOV plugins do.

use std::collections::BTreeMap;

use crate::Sys;
use crate::pci::PciDevice;

/// Where one available device sits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placed {
    pub id: String,
    pub numa: Option<u32>,
    pub switch: Option<String>,
}

/// Choose `size` of `available` PCI functions (IDs are addresses), `must_include` first, by NUMA
/// node and then by the group `group` puts a function in (its PCIe switch, its PF, ...). An ID
/// that cannot be read is placed nowhere and chosen last.
pub fn pack_pci(
    sys: &dyn Sys,
    available: &[String],
    must_include: &[String],
    size: u32,
    group: impl Fn(&PciDevice) -> Option<String>,
) -> Vec<String> {
    let placed: Vec<Placed> = available
        .iter()
        .map(|id| match PciDevice::read(sys, id) {
            Ok(d) => Placed { id: id.clone(), numa: d.numa_node, switch: group(&d) },
            Err(_) => Placed { id: id.clone(), numa: None, switch: None },
        })
        .collect();
    pack(&placed, must_include, size as usize)
}

/// Choose `size` devices from `available`, `must_include` first. Returns fewer than `size` only
/// when `available` is too small (the host checks and falls back).
pub fn pack(available: &[Placed], must_include: &[String], size: usize) -> Vec<String> {
    let mut chosen: Vec<&Placed> = Vec::new();
    for id in must_include {
        if let Some(p) = available.iter().find(|p| &p.id == id)
            && !chosen.iter().any(|c| c.id == p.id)
        {
            chosen.push(p);
        }
    }
    let free: Vec<&Placed> = available.iter().filter(|p| !chosen.iter().any(|c| c.id == p.id)).collect();
    let need = size.saturating_sub(chosen.len());
    let numa_groups = group(&free, |p| p.numa.map(|n| n.to_string()));
    for (_, members) in order_groups(numa_groups, &chosen, need, |p| p.numa.map(|n| n.to_string())) {
        if chosen.len() >= size {
            break;
        }
        let left = size - chosen.len();
        let switch_groups = group(&members, |p| p.switch.clone());
        for (_, sw) in order_groups(switch_groups, &chosen, left, |p| p.switch.clone()) {
            for p in sw {
                if chosen.len() >= size {
                    break;
                }
                chosen.push(p);
            }
        }
    }
    chosen.into_iter().map(|p| p.id.clone()).collect()
}

fn group<'a>(
    items: &[&'a Placed],
    key: impl Fn(&Placed) -> Option<String>,
) -> BTreeMap<Option<String>, Vec<&'a Placed>> {
    let mut g: BTreeMap<Option<String>, Vec<&Placed>> = BTreeMap::new();
    for p in items {
        g.entry(key(p)).or_default().push(p);
    }
    for v in g.values_mut() {
        v.sort_by(|a, b| a.id.cmp(&b.id));
    }
    g
}

/// Groups already holding chosen devices first; then groups that can take the whole rest alone,
/// smallest first (best fit); then the others, largest first (fewest groups spanned).
fn order_groups<'a>(
    groups: BTreeMap<Option<String>, Vec<&'a Placed>>,
    chosen: &[&Placed],
    need: usize,
    key: impl Fn(&Placed) -> Option<String>,
) -> Vec<(Option<String>, Vec<&'a Placed>)> {
    let mut v: Vec<(Option<String>, Vec<&Placed>)> = groups.into_iter().collect();
    v.sort_by_key(|(k, members)| {
        let anchored = chosen.iter().filter(|c| k.is_some() && key(c) == *k).count();
        let fits = members.len() >= need;
        let size_rank = if fits { members.len() as i64 } else { -(members.len() as i64) };
        (std::cmp::Reverse(anchored), !fits, size_rank)
    });
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(i: u32) -> Placed {
        Placed { id: format!("g{i}"), numa: Some(i / 4), switch: Some(format!("sw{}", i / 2)) }
    }

    fn numa_of(ids: &[String]) -> Vec<u32> {
        let mut n: Vec<u32> = ids.iter().map(|id| id[1..].parse::<u32>().unwrap() / 4).collect();
        n.dedup();
        n
    }

    #[test]
    fn stays_on_the_must_include_devices_numa_node_and_switch() {
        let all: Vec<Placed> = (0..8).map(gpu).collect();
        let got = pack(&all, &["g5".into()], 2);
        assert_eq!(got, ["g5", "g4"], "same switch as g5");
        let got = pack(&all, &["g5".into()], 4);
        assert_eq!(numa_of(&got), [1]);
        assert_eq!(got.len(), 4);
    }

    #[test]
    fn best_fit_leaves_the_fuller_node_whole() {
        // g0..g3 on node 0 all free; only g6, g7 free on node 1: a pair goes to node 1.
        let avail: Vec<Placed> = [0, 1, 2, 3, 6, 7].into_iter().map(gpu).collect();
        assert_eq!(pack(&avail, &[], 2), ["g6", "g7"]);
        // Four fit only on node 0.
        assert_eq!(numa_of(&pack(&avail, &[], 4)), [0]);
    }

    #[test]
    fn spans_nodes_only_when_it_must() {
        let avail: Vec<Placed> = (0..8).map(gpu).collect();
        let got = pack(&avail, &["g0".into(), "g7".into()], 8);
        assert_eq!(got.len(), 8);
        let got = pack(&avail, &[], 1);
        assert_eq!(got, ["g0"]);
    }
}
