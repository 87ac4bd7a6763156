//! The GPU backend: NVIDIA, AMD and Intel GPUs found in PCI sysfs.
//!
//! | vendor | functions | resource | per-device nodes | shared nodes |
//! |---|---|---|---|---|
//! | NVIDIA | `10de`, class `03xx` | `nvidia.com/gpu` | `/dev/nvidiaN` | `nvidiactl`, `nvidia-uvm`, `nvidia-uvm-tools` |
//! | NVIDIA MIG | instances in `/proc/driver/nvidia/capabilities` | `nvidia.com/gpu` or `nvidia.com/mig-<profile>` | `/dev/nvidiaN` + 2 `nvidia-caps/nvidia-capM` | as above |
//! | AMD | `1002`, class `03xx`/`12xx` | `amd.com/gpu` | its `dri/cardN` + `dri/renderDN` | `/dev/kfd` |
//! | AMD partitions (MI300 DPX/QPX/CPX) | KFD topology nodes of a split GPU | `amd.com/gpu` | the partition's `dri/renderDN` | `/dev/kfd` |
//! | Intel | `8086`, class `03xx` | `gpu.intel.com/i915` or `gpu.intel.com/xe` by driver | its `dri/cardN` + `dri/renderDN` | — |
//!
//! Device IDs are PCI addresses (`0000:18:00.0`; MIG instances `0000:07:00.0-gi1-ci0`; AMD
//! partitions `0000:05:00.0-xcp3`, see [`amd`]; replicas
//! of a time-sliced GPU `0000:18:00.0::3`): stable across reboots, unlike probe-order indices. DRM
//! nodes are read from the function's own `drm/` directory, never guessed from an index (a BMC's
//! VGA often holds `card0`). NVIDIA minors, UUIDs and MIG: see [`nvidia`] and [`mig`].
//!
//! Health: Unhealthy when no driver (or the wrong one) is bound, when the function has seen fatal
//! AER errors since boot, or when its device node is missing. A function that disappears from
//! the bus disappears from the list. Replicas and MIG instances follow their GPU.
//!
//! Config: see [`config`].

pub mod amd;
pub mod config;
pub mod dra;
mod mig;
pub mod nvidia;

use devplug_sdk::pci::{PciCache, PciDevice};
use devplug_sdk::sharing::Sharing;
use devplug_sdk::sys::each;
use devplug_sdk::topology::{Placed, pack};
use devplug_sdk::{Backend, BackendError, ContainerEdits, Device, Info, Resource, ResourceInfo, Sys, edits};

use config::{Config, MigStrategy, Vendor};

pub struct Gpu {
    cfg: Config,
    vendors: Vec<Vendor>,
    nvidia: nvidia::Nvidia,
    pci: PciCache,
}

fn is_gpu(vendor: u16, class: u32) -> Option<Vendor> {
    let base = (class >> 16) as u8;
    match (vendor, base) {
        (0x10de, 0x03) => Some(Vendor::Nvidia),
        (0x1002, 0x03 | 0x12) => Some(Vendor::Amd),
        (0x8086, 0x03) => Some(Vendor::Intel),
        _ => None,
    }
}

/// The GPUs of one vendor, sorted by PCI address. Display devices of other vendors (the BMC's
/// ASPEED VGA) are skipped.
fn gpus(cache: &PciCache, sys: &dyn Sys, vendor: Vendor) -> Vec<PciDevice> {
    let mut list = cache.list(sys, |v, c| is_gpu(v, c) == Some(vendor)).unwrap_or_default();
    if vendor == Vendor::Amd {
        // Other AMD functions of class 03xx/12xx with a driver other than amdgpu (e.g. the HDMI
        // audio of a consumer card is 04xx and already excluded) are not GPUs we can hand out.
        list.retain(|d| d.driver.as_deref().is_none_or(|drv| drv == "amdgpu"));
    }
    list
}

impl Gpu {
    /// Every resource name this backend may serve, unrenamed, for its vendors and MIG strategy.
    fn resource_names(&self) -> Vec<String> {
        let n = &self.cfg.names;
        let mut out = Vec::new();
        for v in &self.vendors {
            match v {
                Vendor::Nvidia => {
                    out.push(n.nvidia.clone());
                    if self.cfg.mig.strategy == MigStrategy::Mixed {
                        out.extend(self.cfg.mig.all_profiles().into_iter().map(|p| n.mig(p)));
                    }
                }
                Vendor::Amd => out.push(n.amd.clone()),
                Vendor::Intel => out.extend([n.intel_i915.clone(), n.intel_xe.clone()]),
            }
        }
        out
    }

    /// The unrenamed resource behind the name kubelet used.
    fn original(&self, served: &str) -> Result<String, BackendError> {
        let names = self.resource_names();
        self.cfg
            .sharing
            .original(served, names.iter().map(String::as_str))
            .map(str::to_owned)
            .ok_or_else(|| BackendError::UnknownResource(served.to_owned()))
    }

    fn is_nvidia(&self, resource: &str) -> bool {
        self.vendors.contains(&Vendor::Nvidia)
            && (resource == self.cfg.names.nvidia || resource.starts_with(&self.cfg.names.mig("")))
    }
}

impl Backend for Gpu {
    fn init(config: &str, sys: &dyn Sys) -> Result<(Self, Info), BackendError> {
        let cfg = Config::parse(config)?;
        let vendors = cfg.vendors.clone().unwrap_or_else(|| vec![Vendor::Nvidia, Vendor::Amd, Vendor::Intel]);
        let gpu = Gpu { cfg, vendors, nvidia: nvidia::Nvidia::default(), pci: PciCache::default() };
        if gpu.vendors.contains(&Vendor::Nvidia) {
            gpu.nvidia.init(sys, &gpu.pci, &gpu.cfg);
        }
        let resources = gpu
            .resource_names()
            .into_iter()
            .map(|n| ResourceInfo::plain(gpu.cfg.sharing.served_name(&n)).with_preferred_allocation())
            .collect::<Vec<_>>();
        let info = Info::new("gpu", env!("CARGO_PKG_VERSION"), resources);
        Ok((gpu, info))
    }

    fn discover(&self, sys: &dyn Sys) -> Result<Vec<Resource>, BackendError> {
        let mut out = Vec::new();
        let names = &self.cfg.names;
        for v in &self.vendors {
            match v {
                Vendor::Nvidia => out.extend(self.nvidia.resources(sys, &self.pci, &self.cfg)),
                Vendor::Amd => out.push(amd_resource(sys, &names.amd, gpus(&self.pci, sys, Vendor::Amd))),
                Vendor::Intel => {
                    let (xe, i915): (Vec<_>, Vec<_>) = gpus(&self.pci, sys, Vendor::Intel)
                        .into_iter()
                        .partition(|d| d.driver.as_deref() == Some("xe"));
                    // An unbound Intel GPU stays in the i915 pool (its usual driver), as Unhealthy.
                    out.push(drm_resource(sys, &names.intel_i915, i915, "i915", ""));
                    out.push(drm_resource(sys, &names.intel_xe, xe, "xe", ""));
                }
            }
        }
        Ok(out.into_iter().map(|r| self.cfg.sharing.expand(r)).collect())
    }

    fn preferred_allocation(
        &self,
        sys: &dyn Sys,
        resource: &str,
        available: &[String],
        must_include: &[String],
        size: u32,
    ) -> Result<Vec<String>, BackendError> {
        let original = self.original(resource)?;
        if self.cfg.sharing.shares(&original) {
            return Ok(self.cfg.sharing.spread(available, must_include, size));
        }
        // MIG instances sit where their GPU sits.
        let placed: Vec<Placed> = available
            .iter()
            .map(|id| match PciDevice::read(sys, parent(id)) {
                Ok(d) => Placed { id: id.clone(), numa: d.numa_node, switch: d.switch(sys) },
                Err(_) => Placed { id: id.clone(), numa: None, switch: None },
            })
            .collect();
        Ok(pack(&placed, must_include, size as usize))
    }

    fn describe(&self, sys: &dyn Sys) -> Result<devplug_sdk::dra::PoolDescription, BackendError> {
        Ok(dra::describe(&self.discover(sys)?))
    }

    fn allocate(&self, _sys: &dyn Sys, resource: &str, ids: &[String]) -> Result<ContainerEdits, BackendError> {
        let original = self.original(resource)?;
        self.cfg.sharing.check(&original, ids)?;
        if !self.is_nvidia(&original) {
            return Ok(edits::empty());
        }
        // The NVIDIA container toolkit reads this; with the nodes handed over directly it only
        // narrows what the toolkit would add. Two replicas of one GPU name it once.
        let physical = Sharing::physical_set(ids);
        self.nvidia.refuse_mig_mode(&physical)?;
        Ok(match self.nvidia.visible_devices(&physical)? {
            Some(v) => edits::env("NVIDIA_VISIBLE_DEVICES", &v),
            None => edits::empty(),
        })
    }
}

/// The GPU a device ID names: a MIG instance's (`-giG-ciC`) or a partition's (`-xcpN`).
fn parent(id: &str) -> &str {
    let id = mig::parent(id);
    id.split_once("-xcp").map_or(id, |(pci, _)| pci)
}

/// AMD GPUs: a partitioned GPU as one device per partition (its render node and `/dev/kfd`),
/// any other whole (see [`amd`]). Every device says its GPU's partition modes.
fn amd_resource(sys: &dyn Sys, name: &str, list: Vec<PciDevice>) -> Resource {
    // KFD is read only where there is an AMD GPU: an NVIDIA box's grant need not name it.
    let parts = if list.is_empty() { Default::default() } else { amd::partitions(sys) };
    let (split, whole): (Vec<_>, Vec<_>) =
        list.into_iter().partition(|d| parts.get(&d.address).is_some_and(|p| p.len() > 1));
    let whole_modes: Vec<_> = whole.iter().map(|d| amd::mode_attributes(sys, d)).collect();
    let mut r = drm_resource(sys, name, whole, "amdgpu", "kfd");
    // `drm_resource` lists one device per function, in order.
    for (d, modes) in r.devices.iter_mut().zip(whole_modes) {
        d.attributes.extend(modes);
    }
    let sick = PciDevice::sickness_many(sys, &split, |drv| drv == "amdgpu");
    for (d, sickness) in split.iter().zip(sick) {
        // Read once per GPU (its PCIe switch is a walk up the links), shared by its partitions.
        let mut gpu_attrs = attributes(sys, d);
        gpu_attrs.extend(amd::mode_attributes(sys, d));
        for p in parts.get(&d.address).into_iter().flatten() {
            let node = format!("dri/renderD{}", p.render_minor);
            let problem =
                sickness.clone().or_else(|| sys.dev_stat(&node).is_err().then(|| format!("/dev/{node} is missing")));
            let mut attrs = gpu_attrs.clone();
            attrs.push(("partition".into(), p.index.to_string()));
            attrs.extend(p.compute_units.map(|c| ("compute-units".to_owned(), c.to_string())));
            attrs.extend(p.memory.map(|m| ("memory".to_owned(), m.to_string())));
            let id = amd::partition_id(&d.address, p.index);
            r.devices.push(device(&id, d, problem.as_deref(), attrs, edits::nodes([node.as_str()])));
        }
    }
    r.devices.sort_by(|a, b| a.id.cmp(&b.id));
    r
}

/// A resource of DRM GPUs (AMD, Intel): each device gets its own card and render node.
fn drm_resource(sys: &dyn Sys, name: &str, list: Vec<PciDevice>, driver: &str, shared: &str) -> Resource {
    let drm = each(&list, |d| Some(d.attr("drm")), |paths| sys.list_many(paths));
    let sick = PciDevice::sickness_many(sys, &list, |drv| drv == driver);
    let mut devices = Vec::new();
    for ((d, drm), mut problem) in list.iter().zip(drm).zip(sick) {
        let mut nodes: Vec<String> = drm
            .and_then(|r| r.ok())
            .unwrap_or_default()
            .into_iter()
            .filter(|n| n.starts_with("card") || n.starts_with("renderD"))
            .map(|n| format!("dri/{n}"))
            .collect();
        nodes.sort();
        if problem.is_none() {
            if nodes.is_empty() {
                problem = Some("no DRM nodes (driver still probing?)".into());
            } else if let Some(missing) = nodes.iter().find(|n| sys.dev_stat(n).is_err()) {
                problem = Some(format!("/dev/{missing} is missing"));
            }
        }
        let attrs = attributes(sys, d);
        devices.push(device(&d.address, d, problem.as_deref(), attrs, edits::nodes(nodes.iter().map(String::as_str))));
    }
    let common = if shared.is_empty() { edits::empty() } else { present(sys, &[shared]) };
    Resource { name: name.to_owned(), devices, common_edits: common }
}

fn device(
    id: &str,
    d: &PciDevice,
    problem: Option<&str>,
    attributes: Vec<(String, String)>,
    edits: ContainerEdits,
) -> Device {
    Device::new(id).numa(d.numa_node).attrs(attributes).edits(edits).problem(problem)
}

fn attributes(sys: &dyn Sys, d: &PciDevice) -> Vec<(String, String)> {
    let mut a = vec![
        ("pci".to_owned(), d.address.clone()),
        ("model".to_owned(), d.vendor_device()),
        ("driver".to_owned(), d.driver.clone().unwrap_or_else(|| "none".into())),
    ];
    if let Some(sw) = d.switch(sys) {
        a.push(("pcie-switch".into(), sw));
    }
    a
}

/// Edits with those of `nodes` that exist.
fn present(sys: &dyn Sys, nodes: &[&str]) -> ContainerEdits {
    edits::nodes(nodes.iter().copied().filter(|n| sys.dev_stat(n).is_ok()))
}

devplug_sdk::backend!(Gpu);

#[cfg(test)]
mod tests {
    use super::*;
    use devplug_sdk::{FixtureSys, Health};

    fn fixture(name: &str) -> FixtureSys {
        FixtureSys::repo_machine(name)
    }

    fn ids(r: &Resource) -> Vec<&str> {
        r.devices.iter().map(|d| d.id.as_str()).collect()
    }

    #[test]
    fn dgx_lists_eight_gpus_on_two_numa_nodes_and_skips_the_bmc_vga() {
        let sys = fixture("dgx-h100");
        let (b, _) = Gpu::init("", &sys).unwrap();
        let res = b.discover(&sys).unwrap();
        let nv = res.iter().find(|r| r.name == "nvidia.com/gpu").unwrap();
        assert_eq!(nv.devices.len(), 8);
        assert!(!ids(nv).contains(&"0000:03:00.0"));
        assert_eq!(nv.devices[0].numa_nodes, [0]);
        assert_eq!(nv.devices[7].numa_nodes, [1]);
        assert_eq!(nv.devices[7].edits.device_nodes[0].container_path, "/dev/nvidia7");
        assert_eq!(nv.common_edits.device_nodes.len(), 3);
        assert!(nv.devices.iter().all(|d| d.health == Health::Healthy));
    }

    #[test]
    fn amd_render_nodes_come_from_each_functions_own_drm_dir() {
        let sys = fixture("amd-mi300x");
        let (b, _) = Gpu::init("vendors = [\"amd\"]", &sys).unwrap();
        let res = b.discover(&sys).unwrap();
        assert_eq!(res.len(), 1);
        let first = &res[0].devices[0];
        let paths: Vec<&str> = first.edits.device_nodes.iter().map(|n| n.container_path.as_str()).collect();
        assert_eq!(paths, ["/dev/dri/card1", "/dev/dri/renderD128"], "card0 belongs to the BMC");
        assert_eq!(res[0].common_edits.device_nodes[0].container_path, "/dev/kfd");
    }

    #[test]
    fn intel_gpus_split_by_driver() {
        let sys = fixture("intel-gpu-max");
        let (b, _) = Gpu::init("vendors = [\"intel\"]", &sys).unwrap();
        let res = b.discover(&sys).unwrap();
        assert_eq!(res[0].name, "gpu.intel.com/i915");
        assert_eq!(res[0].devices.len(), 3);
        assert_eq!(res[1].name, "gpu.intel.com/xe");
        assert_eq!(res[1].devices.len(), 1);
    }

    #[test]
    fn preferred_allocation_packs_by_numa_then_switch() {
        let sys = fixture("dgx-h100");
        let (b, _) = Gpu::init("", &sys).unwrap();
        let all: Vec<String> = b.discover(&sys).unwrap()[0].devices.iter().map(|d| d.id.clone()).collect();
        let numa = |ids: &[String]| {
            let mut n: Vec<u32> =
                ids.iter().map(|id| PciDevice::read(&sys, id).unwrap().numa_node.unwrap()).collect::<Vec<_>>();
            n.sort();
            n.dedup();
            n
        };
        for size in [1u32, 2, 4] {
            for must in [vec![], vec![all[5].clone()], vec![all[0].clone(), all[1].clone()]] {
                if must.len() > size as usize {
                    continue;
                }
                let got = b.preferred_allocation(&sys, "nvidia.com/gpu", &all, &must, size).unwrap();
                assert_eq!(got.len(), size as usize);
                assert!(must.iter().all(|m| got.contains(m)), "{got:?} misses {must:?}");
                assert_eq!(numa(&got).len(), 1, "size {size} must {must:?}: {got:?} spans NUMA nodes");
            }
        }
        // A pair with one GPU given stays behind that GPU's switch.
        let got = b.preferred_allocation(&sys, "nvidia.com/gpu", &all, &[all[2].clone()], 2).unwrap();
        assert_eq!(got, [all[2].clone(), all[3].clone()]);
        let got = b.preferred_allocation(&sys, "nvidia.com/gpu", &all, &[], 8).unwrap();
        assert_eq!(got.len(), 8);
    }

    #[test]
    fn allocate_names_the_minors_and_refuses_unknown_ids() {
        let sys = fixture("dgx-h100");
        let (b, _) = Gpu::init("", &sys).unwrap();
        let e = b.allocate(&sys, "nvidia.com/gpu", &["0000:2a:00.0".into(), "0000:db:00.0".into()]).unwrap();
        assert_eq!(e.env, [("NVIDIA_VISIBLE_DEVICES".to_owned(), "1,7".to_owned())]);
        assert!(matches!(
            b.allocate(&sys, "nvidia.com/gpu", &["0000:99:00.0".into()]),
            Err(BackendError::UnknownDevice(_))
        ));
    }

    fn attr<'a>(d: &'a Device, key: &str) -> Option<&'a str> {
        d.attributes.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| (*x).to_owned()).collect()
    }

    #[test]
    fn uuids_name_the_devices_when_asked() {
        let sys = fixture("dgx-h100");
        let (b, _) = Gpu::init("device_id_strategy = \"uuid\"", &sys).unwrap();
        let res = b.discover(&sys).unwrap();
        let uuid = attr(&res[0].devices[1], "uuid").unwrap().to_owned();
        assert!(uuid.starts_with("GPU-"), "{uuid}");
        let e = b.allocate(&sys, "nvidia.com/gpu", &s(&["0000:2a:00.0"])).unwrap();
        assert_eq!(e.env, [("NVIDIA_VISIBLE_DEVICES".to_owned(), uuid.clone())]);
        let (ctk, _) = Gpu::init("cdi_device_names = \"nvidia-ctk\"", &sys).unwrap();
        let d = &ctk.discover(&sys).unwrap()[0].devices[1];
        assert_eq!(attr(d, "cdi-name"), Some(format!("1,{uuid}").as_str()));
    }

    #[test]
    fn time_slicing_advertises_replicas_that_map_back_to_one_gpu() {
        let sys = fixture("dgx-h100");
        let cfg = "[sharing]\nreplicas = 4\nrename_by_default = true\nresources = [\"nvidia.com/gpu\"]";
        let (b, info) = Gpu::init(cfg, &sys).unwrap();
        assert_eq!(info.resources[0].name, "nvidia.com/gpu.shared");
        assert_eq!(info.resources[1].name, "amd.com/gpu", "only the listed resource is shared");
        let res = b.discover(&sys).unwrap();
        assert_eq!(res[0].name, "nvidia.com/gpu.shared");
        assert_eq!(res[0].devices.len(), 32);
        assert_eq!(res[0].devices[5].id, "0000:2a:00.0::1");
        let e = b.allocate(&sys, "nvidia.com/gpu.shared", &s(&["0000:2a:00.0::1", "0000:2a:00.0::3"])).unwrap();
        assert_eq!(e.env, [("NVIDIA_VISIBLE_DEVICES".to_owned(), "1".to_owned())], "one GPU, named once");
        let all: Vec<String> = res[0].devices.iter().map(|d| d.id.clone()).collect();
        let got = b.preferred_allocation(&sys, "nvidia.com/gpu.shared", &all, &[], 2).unwrap();
        assert_ne!(Sharing::physical(&got[0]), Sharing::physical(&got[1]), "spread over GPUs: {got:?}");
        assert!(matches!(
            b.allocate(&sys, "nvidia.com/gpu", &s(&["0000:2a:00.0"])),
            Err(BackendError::UnknownResource(_))
        ));
        let strict = format!("{cfg}\nfail_requests_greater_than_one = true");
        let (b, _) = Gpu::init(&strict, &sys).unwrap();
        let e = b.allocate(&sys, "nvidia.com/gpu.shared", &s(&["0000:2a:00.0::1", "0000:2a:00.0::3"])).unwrap_err();
        assert!(matches!(&e, BackendError::Other(m) if m.contains("fail_requests_greater_than_one")), "{e:?}");
        assert!(b.allocate(&sys, "nvidia.com/gpu.shared", &s(&["0000:2a:00.0::1"])).is_ok());
    }

    #[test]
    fn amd_and_intel_gpus_share_the_same_way() {
        let sys = fixture("amd-mi300x");
        let (b, _) = Gpu::init("vendors = [\"amd\"]\n[sharing]\nreplicas = 2", &sys).unwrap();
        let res = b.discover(&sys).unwrap();
        assert_eq!(res[0].devices.len(), 16);
        assert_eq!(res[0].devices[0].edits, res[0].devices[1].edits);
    }

    const MIXED: &str = "[mig]\nstrategy = \"mixed\"\n[mig.profiles]\n\"0000:07:00.0\" = { 1 = \"3g.40gb\", 5 = \"2g.20gb\", 13 = \"1g.10gb\", 14 = \"1g.10gb\" }\n\"0000:0f:00.0\" = { 1 = \"3g.40gb\", 2 = \"3g.40gb\" }\nall = { 7 = \"1g.10gb\", 8 = \"1g.10gb\", 9 = \"1g.10gb\", 10 = \"1g.10gb\", 11 = \"1g.10gb\", 12 = \"1g.10gb\", 13 = \"1g.10gb\" }\n";

    #[test]
    fn mig_mixed_lists_whole_gpus_and_each_profile_apart() {
        let sys = fixture("dgx-a100-mig");
        let (b, info) = Gpu::init(&format!("vendors = [\"nvidia\"]\n{MIXED}"), &sys).unwrap();
        let names: Vec<&str> = info.resources.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(
            names,
            ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb", "nvidia.com/mig-3g.40gb"]
        );
        let res = b.discover(&sys).unwrap();
        let count: Vec<usize> = res.iter().map(|r| r.devices.len()).collect();
        // nvidia.com/gpu: the 5 GPUs not in MIG mode (the 3 in MIG mode are not listed whole).
        assert_eq!(count, [5, 9, 1, 3]);
        assert!(res[0].devices.iter().all(|d| attr(d, "dra-only").is_none()), "nothing for DRA alone");
        let e = b.allocate(&sys, "nvidia.com/gpu", &s(&["0000:0f:00.0"])).unwrap_err().to_string();
        assert!(e.contains("MIG mode with 2 compute instance(s)") && e.contains("-mig 0"), "{e}");
        assert!(
            b.allocate(&sys, "nvidia.com/gpu", &s(&["0000:4e:00.0"])).is_ok(),
            "a GPU not in MIG mode is handed out"
        );
        let two = &res[2].devices[0];
        assert_eq!(two.id, "0000:07:00.0-gi5-ci0");
        let nodes: Vec<&str> = two.edits.device_nodes.iter().map(|n| n.container_path.as_str()).collect();
        assert_eq!(nodes, ["/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap48", "/dev/nvidia-caps/nvidia-cap49"]);
        assert!(res.iter().all(|r| r.devices.iter().all(|d| d.health == Health::Healthy)));
        let uuid = attr(two, "uuid").unwrap();
        let e = b.allocate(&sys, "nvidia.com/mig-2g.20gb", &s(&["0000:07:00.0-gi5-ci0"])).unwrap();
        assert_eq!(e.env, [("NVIDIA_VISIBLE_DEVICES".to_owned(), format!("MIG-{uuid}/5/0"))]);
        assert!(matches!(
            b.allocate(&sys, "nvidia.com/mig-2g.20gb", &s(&["0000:07:00.0-gi6-ci0"])),
            Err(BackendError::UnknownDevice(_))
        ));
        // Same NUMA node as the GPU: both 1g slices of GPU 0 before any of GPU 2's.
        let ids: Vec<String> = res[1].devices.iter().map(|d| d.id.clone()).collect();
        let got = b.preferred_allocation(&sys, "nvidia.com/mig-1g.10gb", &ids, &[], 2).unwrap();
        assert!(got.iter().all(|id| mig::parent(id) == mig::parent(&got[0])), "{got:?}");
    }

    /// Issue 35: a GPU in MIG mode is a counter set its instances draw on (free, they exceed
    /// nothing). Issue 52: the GPU itself is not published whole: once its instances were free
    /// the scheduler allocated it, and no prepare could serve it.
    #[test]
    fn mig_instances_draw_on_one_counter_set_and_the_gpu_is_not_published_whole() {
        let sys = fixture("dgx-a100-mig");
        let (b, _) = Gpu::init(&format!("vendors = [\"nvidia\"]\n{MIXED}"), &sys).unwrap();
        let pool = dra::describe(&b.discover(&sys).unwrap());
        assert_eq!(pool.counter_sets.len(), 3, "one set per GPU in MIG mode");
        for set in &pool.counter_sets {
            let cap = |n: &str| -> u32 { set.counters.iter().find(|c| c.name == n).unwrap().value.parse().unwrap() };
            assert_eq!((cap("compute"), cap("memory")), (7, 8));
            let mut whole = Vec::new();
            let mut used = (0u32, 0u32);
            for d in &pool.devices {
                for u in d.consumes_counters.iter().filter(|u| u.counter_set == set.name) {
                    let take =
                        |n: &str| -> u32 { u.counters.iter().find(|c| c.name == n).unwrap().value.parse().unwrap() };
                    if d.id.contains("-gi") {
                        used = (used.0 + take("compute"), used.1 + take("memory"));
                    } else {
                        whole.push((d.id.clone(), take("compute"), take("memory")));
                    }
                }
            }
            assert!(used.0 <= 7 && used.1 <= 8, "{}: instances take {used:?}", set.name);
            assert!(used.0 > 0, "{}: its instances draw on it", set.name);
            assert!(whole.is_empty(), "{}: no whole GPU in MIG mode draws on it: {whole:?}", set.name);
        }
        let res = b.discover(&sys).unwrap();
        for mig_gpu in ["0000:07:00.0", "0000:0f:00.0", "0000:47:00.0"] {
            assert!(res.iter().all(|r| r.devices.iter().all(|d| d.id != mig_gpu)), "{mig_gpu} listed whole");
        }
    }

    #[test]
    fn mig_instances_without_a_profile_are_shown_unhealthy_not_dropped() {
        let sys = fixture("dgx-a100-mig");
        let (b, _) = Gpu::init("vendors = [\"nvidia\"]\n[mig]\nstrategy = \"mixed\"", &sys).unwrap();
        let res = b.discover(&sys).unwrap();
        assert_eq!(res.len(), 1);
        let sick: Vec<&Device> = res[0].devices.iter().filter(|d| d.health == Health::Unhealthy).collect();
        assert_eq!(sick.len(), 13);
        assert!(attr(sick[0], "unhealthy").unwrap().contains("[mig.profiles]"));
    }

    #[test]
    fn mig_single_refuses_a_mixed_geometry_and_none_ignores_mig() {
        let sys = fixture("dgx-a100-mig");
        let single = MIXED.replace("mixed", "single");
        let (b, info) = Gpu::init(&format!("vendors = [\"nvidia\"]\n{single}"), &sys).unwrap();
        assert_eq!(info.resources.len(), 1);
        let res = b.discover(&sys).unwrap();
        assert_eq!(res[0].devices.len(), 18, "13 instances and the 5 GPUs not in MIG mode");
        assert!(res[0].devices.iter().all(|d| d.health == Health::Unhealthy));
        assert!(attr(&res[0].devices[0], "unhealthy").unwrap().contains("not in MIG mode"));
        let (b, _) = Gpu::init("vendors = [\"nvidia\"]", &sys).unwrap();
        let res = b.discover(&sys).unwrap();
        assert_eq!(ids(&res[0]).len(), 8);
    }

    #[test]
    fn unknown_config_keys_are_refused() {
        let sys = fixture("plain");
        assert!(matches!(Gpu::init("vendor = [\"nvidia\"]", &sys), Err(BackendError::InvalidConfig(_))));
        assert!(matches!(Gpu::init("vendors = [\"matrox\"]", &sys), Err(BackendError::InvalidConfig(_))));
    }
}
