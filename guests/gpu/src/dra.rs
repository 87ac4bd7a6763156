//! The GPU backend in DRA terms (WIT 0.3.0 `describe`): its facts as typed attributes, and a
//! GPU in MIG mode as a counter set its MIG instances draw from, so the scheduler sees which
//! instances share one GPU and what of it each takes. The GPU in MIG mode is not a device of
//! its own: it cannot be prepared whole while its instances exist.
//!
//! The geometry is NVIDIA's (MIG user guide, "Supported MIG Profiles"): an A100 or H100 has 7
//! compute slices and 8 memory slices; a profile `<N>g.<M>gb` takes N compute slices and M GB of
//! memory, in slices of an eighth of the GPU's memory (A100 80GB: `3g.40gb` = 3 compute and 4
//! memory slices, `7g.80gb` = all of both). The GPU's memory comes from its PCI device ID; for a
//! model not in [`memory_gb`] the instances are described without counters.

use devplug_sdk::Resource;
use devplug_sdk::dra::{self, AttributeValue, Counter, CounterSet, CounterUse, PoolDescription};

/// Compute and memory slices of a GPU that supports MIG.
const COMPUTE_SLICES: u32 = 7;
const MEMORY_SLICES: u32 = 8;

/// Memory of the MIG-capable NVIDIA GPUs by PCI `vendor:device` (the PCI ID database).
fn memory_gb(model: &str) -> Option<u32> {
    match model {
        "10de:20b0" | "10de:20f1" => Some(40), // A100-SXM4-40GB, A100-PCIE-40GB
        "10de:20b2" | "10de:20b5" => Some(80), // A100-SXM4-80GB, A100 80GB PCIe
        "10de:2330" | "10de:2331" => Some(80), // H100 SXM5 80GB, H100 PCIe
        _ => None,
    }
}

/// `3g.40gb` (or `1g.10gb+me`) → (compute slices, memory GB).
fn profile(p: &str) -> Option<(u32, u32)> {
    let p = p.split('+').next()?;
    let (g, m) = p.split_once('.')?;
    Some((g.strip_suffix('g')?.parse().ok()?, m.strip_suffix("gb")?.parse().ok()?))
}

fn counter(name: &str, value: u32) -> Counter {
    Counter { name: name.into(), value: value.to_string() }
}

/// Typed attributes of every device, and the MIG counters, from what `discover` listed.
pub fn describe(resources: &[Resource]) -> PoolDescription {
    let mut out = PoolDescription { counter_sets: Vec::new(), devices: Vec::new() };
    for r in resources {
        for d in &r.devices {
            let attr = |k: &str| d.attributes.iter().find(|(key, _)| key == k).map(|(_, v)| v.as_str());
            let mut desc = dra::describe(&r.name, &d.id);
            for (from, to) in [("minor", "minor"), ("mig-gi", "mig_gi"), ("mig-ci", "mig_ci")] {
                if let Some(i) = attr(from).and_then(|v| v.parse::<i64>().ok()) {
                    desc.attributes.push((to.into(), AttributeValue::Integer(i)));
                }
            }
            let total = attr("model").and_then(memory_gb);
            // (compute, memory) slices an instance takes: its profile's.
            let takes = attr("mig-profile")
                .and_then(profile)
                .and_then(|(compute, gb)| total.map(|t| (compute, gb.div_ceil(t / MEMORY_SLICES))));
            if let (Some((compute, memory)), Some(minor)) = (takes, attr("minor")) {
                let set = format!("gpu-{minor}-slices");
                desc.consumes_counters.push(CounterUse {
                    counter_set: set.clone(),
                    counters: vec![counter("compute", compute), counter("memory", memory)],
                });
                if !out.counter_sets.iter().any(|s| s.name == set) {
                    out.counter_sets.push(CounterSet {
                        name: set,
                        counters: vec![counter("compute", COMPUTE_SLICES), counter("memory", MEMORY_SLICES)],
                    });
                }
            }
            if !desc.attributes.is_empty() || !desc.consumes_counters.is_empty() {
                out.devices.push(desc);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_take_their_slices_of_the_gpu() {
        assert_eq!(profile("3g.40gb"), Some((3, 40)));
        assert_eq!(profile("1g.10gb+me"), Some((1, 10)));
        assert_eq!(profile("unknown"), None);
        // A100 80GB: an eighth is 10 GB; A100 40GB: 5 GB.
        assert_eq!(40u32.div_ceil(80 / MEMORY_SLICES), 4);
        assert_eq!(20u32.div_ceil(40 / MEMORY_SLICES), 4);
        assert_eq!(80u32.div_ceil(80 / MEMORY_SLICES), 8);
    }
}
