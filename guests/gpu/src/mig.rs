//! MIG instances of one NVIDIA GPU, as the driver publishes them in `/proc` (NVIDIA's MIG user
//! guide, "Device Nodes and Capabilities"):
//!
//! ```text
//! /proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<G>/access         DeviceFileMinor: <m>
//! /proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<G>/ci<C>/access   DeviceFileMinor: <n>
//! ```
//!
//! The `mig` directory exists while the GPU is in MIG mode; each live GPU instance and compute
//! instance has its directory, whose `access` file names the minor of the
//! `/dev/nvidia-caps/nvidia-cap<m>` node a container needs to use it. A container gets the parent
//! GPU's `/dev/nvidiaN` plus the caps of its GPU instance and compute instance.

use devplug_sdk::Sys;

/// One compute instance: what a container is given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Instance {
    pub gi: u32,
    pub ci: u32,
    /// Minor of the GPU instance's `nvidia-cap` node.
    pub gi_cap: u32,
    /// Minor of the compute instance's `nvidia-cap` node.
    pub ci_cap: u32,
}

impl Instance {
    /// The device ID: `<pci>-gi<G>-ci<C>` (stable while the geometry stays, like the instance).
    pub fn id(&self, pci: &str) -> String {
        format!("{pci}-gi{}-ci{}", self.gi, self.ci)
    }

    /// The `/dev` nodes of the instance, parent GPU first.
    pub fn nodes(&self, gpu_minor: u32) -> [String; 3] {
        [
            format!("nvidia{gpu_minor}"),
            format!("nvidia-caps/nvidia-cap{}", self.gi_cap),
            format!("nvidia-caps/nvidia-cap{}", self.ci_cap),
        ]
    }
}

/// The PCI address behind a MIG device ID (or the ID itself when it is a whole GPU's).
pub fn parent(id: &str) -> &str {
    id.split_once("-gi").map_or(id, |(pci, _)| pci)
}

/// The compute instances of the GPU with minor `minor`, sorted by (GI, CI), or `None` when it is
/// not in MIG mode (or the backend may not read its capabilities). An instance whose `access`
/// file cannot be read or parsed is left out: without its minor it cannot be handed out.
pub fn instances(sys: &dyn Sys, minor: u32) -> Option<Vec<Instance>> {
    let base = format!("driver/nvidia/capabilities/gpu{minor}/mig");
    let gis = sys.proc_list(&base).ok()?;
    let mut out = Vec::new();
    for gi_dir in gis {
        let Some(gi) = numbered(&gi_dir, "gi") else { continue };
        let Some(gi_cap) = access_minor(sys, &format!("{base}/{gi_dir}/access")) else { continue };
        let cis = sys.proc_list(&format!("{base}/{gi_dir}")).unwrap_or_default();
        for ci_dir in cis {
            let Some(ci) = numbered(&ci_dir, "ci") else { continue };
            if let Some(ci_cap) = access_minor(sys, &format!("{base}/{gi_dir}/{ci_dir}/access")) {
                out.push(Instance { gi, ci, gi_cap, ci_cap });
            }
        }
    }
    out.sort_by_key(|i| (i.gi, i.ci));
    Some(out)
}

/// `gi12` → 12.
fn numbered(name: &str, prefix: &str) -> Option<u32> {
    name.strip_prefix(prefix)?.parse().ok()
}

/// `DeviceFileMinor: <n>` of an `access` file.
fn access_minor(sys: &dyn Sys, path: &str) -> Option<u32> {
    let text = sys.proc_read(path).ok()?;
    text.lines().find_map(|l| l.strip_prefix("DeviceFileMinor:")?.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parents_of_ids() {
        assert_eq!(parent("0000:07:00.0-gi3-ci0"), "0000:07:00.0");
        assert_eq!(parent("0000:07:00.0"), "0000:07:00.0");
        let i = Instance { gi: 3, ci: 0, gi_cap: 39, ci_cap: 40 };
        assert_eq!(i.id("0000:07:00.0"), "0000:07:00.0-gi3-ci0");
        assert_eq!(i.nodes(2)[1], "nvidia-caps/nvidia-cap39");
    }
}
