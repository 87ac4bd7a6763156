//! MIG instances of one NVIDIA GPU, as the driver publishes them in `/proc` (NVIDIA's MIG user
//! guide, "Device Nodes and Capabilities"):
//!
//! ```text
//! /proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<G>/access         DeviceFileMinor: <m>
//! /proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<G>/ci<C>/access   DeviceFileMinor: <n>
//! ```
//!
//! The driver makes the `mig` directory for **every** GPU it attaches, MIG mode or not
//! (open-gpu-kernel-modules, `src/nvidia/arch/nvalloc/unix/src/os.c`, `osRmCapRegisterGpu`);
//! each GPU instance adds its `gi<G>` directory when it is created (`osRmCapRegisterSmcPartition`)
//! and each compute instance its `ci<C>` (`osRmCapRegisterSmcExecutionPartition`). Each `access`
//! file names the minor of the `/dev/nvidia-caps/nvidia-cap<m>` node a container needs to use
//! it (`kernel-open/nvidia/nv-caps.c`). A container gets the parent GPU's `/dev/nvidiaN` plus the
//! caps of its GPU instance and compute instance.
//!
//! So a GPU with at least one GPU instance is in MIG mode; a GPU without any is served whole.
//! `/proc` cannot tell a GPU in MIG mode with no instances yet from one with MIG off, so such a
//! GPU is listed whole until its first instance appears (the next poll moves it).

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

/// The compute instances of the GPU with minor `minor`, sorted by (GI, CI), or `None` when it has
/// no GPU instance (it is served whole; see the module docs) or the backend may not read its
/// capabilities. An instance whose `access` file cannot be read or parsed is left out: without
/// its minor it cannot be handed out.
pub fn instances(sys: &dyn Sys, minor: u32) -> Option<Vec<Instance>> {
    let base = format!("driver/nvidia/capabilities/gpu{minor}/mig");
    let gis: Vec<(u32, String)> =
        sys.proc_list(&base).ok()?.into_iter().filter_map(|name| numbered(&name, "gi").map(|gi| (gi, name))).collect();
    if gis.is_empty() {
        return None;
    }
    let mut out = Vec::new();
    for (gi, gi_dir) in gis {
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

    /// A `/proc` of the driver's shape in a directory of its own, removed when dropped.
    struct Proc(std::path::PathBuf);

    impl Proc {
        fn new(tag: &str) -> Proc {
            let dir = std::env::temp_dir().join(format!("devplug-gpu-mig-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            Proc(dir)
        }
        fn file(&self, rel: &str, text: &str) {
            let p = self.0.join("proc").join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        fn dir(&self, rel: &str) {
            std::fs::create_dir_all(self.0.join("proc").join(rel)).unwrap();
        }
    }

    impl Drop for Proc {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// The driver makes `gpu<M>/mig` for every GPU; only GPU instances put a GPU in MIG mode.
    #[test]
    fn a_gpu_is_in_mig_mode_only_with_gpu_instances() {
        let p = Proc::new("mode");
        let base = "driver/nvidia/capabilities";
        p.dir(&format!("{base}/gpu1/mig"));
        p.file(
            &format!("{base}/gpu0/mig/gi3/access"),
            "DeviceFileMinor: 30\nDeviceFileMode: 292\nDeviceFileModify: 1\n",
        );
        p.file(
            &format!("{base}/gpu0/mig/gi3/ci0/access"),
            "DeviceFileMinor: 31\nDeviceFileMode: 292\nDeviceFileModify: 1\n",
        );
        // A GPU instance whose compute instance is not created yet: MIG mode, nothing to hand out.
        p.dir(&format!("{base}/gpu2/mig/gi1"));
        p.file(&format!("{base}/gpu2/mig/gi1/access"), "DeviceFileMinor: 12\n");
        let sys = devplug_sdk::FixtureSys::machine(&p.0);
        assert_eq!(instances(&sys, 0), Some(vec![Instance { gi: 3, ci: 0, gi_cap: 30, ci_cap: 31 }]));
        assert_eq!(instances(&sys, 1), None, "an empty mig directory is a whole GPU");
        assert_eq!(instances(&sys, 2), Some(vec![]), "a GPU instance alone is MIG mode");
        assert_eq!(instances(&sys, 7), None, "no directory at all (no procfs grant, old driver)");
    }
}
