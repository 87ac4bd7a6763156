//! The GPU backend: NVIDIA, AMD and Intel GPUs found in PCI sysfs.
//!
//! | vendor | functions | resource | per-device nodes | shared nodes |
//! |---|---|---|---|---|
//! | NVIDIA | `10de`, class `03xx` | `nvidia.com/gpu` | `/dev/nvidiaN` | `nvidiactl`, `nvidia-uvm`, `nvidia-uvm-tools` |
//! | AMD | `1002`, class `03xx`/`12xx` | `amd.com/gpu` | its `dri/cardN` + `dri/renderDN` | `/dev/kfd` |
//! | Intel | `8086`, class `03xx` | `gpu.intel.com/i915` or `gpu.intel.com/xe` by driver | its `dri/cardN` + `dri/renderDN` | — |
//!
//! Device IDs are PCI addresses (`0000:18:00.0`): stable across reboots, unlike probe-order
//! indices. DRM nodes are read from the function's own `drm/` directory, never guessed from an
//! index (a BMC's VGA often holds `card0`). NVIDIA minors (`/dev/nvidiaN`) are not in sysfs: the
//! driver says them in `/proc/driver/nvidia/gpus/<pci>/information` (`Device Minor:`, with the
//! `GPU UUID:`), which the backend reads where its `procfs` grant allows. Without it, the backend
//! assumes the driver's PCI-order numbering when it starts (`init`) and keeps it, which stays
//! right when a GPU drops off the bus; a GPU that appears later takes the next free minor. Either
//! way `allocate` knows every GPU `discover` has listed.
//!
//! Health: Unhealthy when no driver (or the wrong one) is bound, when the function has seen fatal
//! AER errors since boot, or when its device node is missing. A function that disappears from
//! the bus disappears from the list.
//!
//! Config (TOML, all optional):
//! ```toml
//! vendors = ["nvidia", "amd", "intel"]   # which vendors to serve
//! [names]                                 # resource name overrides
//! nvidia = "nvidia.com/gpu"
//! ```

use std::cell::RefCell;
use std::collections::BTreeMap;

use devplug_sdk::pci::{PciCache, PciDevice};
use devplug_sdk::sys::each;
use devplug_sdk::topology::pack_pci;
use devplug_sdk::{
    Backend, BackendError, ContainerEdits, Device, Health, Info, Resource, ResourceInfo, Sys, edits, invalid_config,
};
use serde::Deserialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Vendor {
    Nvidia,
    Amd,
    Intel,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Config {
    vendors: Option<Vec<Vendor>>,
    #[serde(default)]
    names: Names,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
struct Names {
    nvidia: String,
    amd: String,
    intel_i915: String,
    intel_xe: String,
}

impl Default for Names {
    fn default() -> Self {
        Names {
            nvidia: "nvidia.com/gpu".into(),
            amd: "amd.com/gpu".into(),
            intel_i915: "gpu.intel.com/i915".into(),
            intel_xe: "gpu.intel.com/xe".into(),
        }
    }
}

pub struct Gpu {
    vendors: Vec<Vendor>,
    names: Names,
    /// NVIDIA PCI address → `/dev/nvidiaN` minor (see the module docs): the driver's word where
    /// it can be read, else the PCI order at init, then the next free minor for later arrivals.
    nvidia_minors: RefCell<BTreeMap<String, u32>>,
    driver: DriverFacts,
    pci: PciCache,
}

/// What the NVIDIA driver says about one GPU in `/proc/driver/nvidia/gpus/<pci>/information`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DriverInfo {
    pub minor: Option<u32>,
    pub uuid: Option<String>,
}

/// The driver's facts of each NVIDIA GPU, read once per binding: a GPU's minor and UUID do not
/// change while it stays bound, so a health poll reads nothing; a GPU that appears, or is bound
/// again, is read afresh. Empty facts without a `procfs` grant or without the driver.
#[derive(Default)]
struct DriverFacts {
    /// (PCI address, bound driver) → what the driver said.
    known: RefCell<BTreeMap<(String, Option<String>), DriverInfo>>,
}

impl DriverFacts {
    /// The facts of every GPU in `list`, by PCI address.
    fn of(&self, sys: &dyn Sys, list: &[PciDevice]) -> BTreeMap<String, DriverInfo> {
        let key = |d: &PciDevice| (d.address.clone(), d.driver.clone());
        let mut known = self.known.borrow_mut();
        let live: Vec<_> = list.iter().map(key).collect();
        known.retain(|k, _| live.contains(k));
        for d in list {
            known.entry(key(d)).or_insert_with(|| read_information(sys, &d.address));
        }
        known.iter().map(|((addr, _), info)| (addr.clone(), info.clone())).collect()
    }
}

/// `/proc/driver/nvidia/gpus/<pci>/information`, as much as the backend uses.
fn read_information(sys: &dyn Sys, address: &str) -> DriverInfo {
    let Ok(text) = sys.proc_read(&format!("driver/nvidia/gpus/{address}/information")) else {
        return DriverInfo::default();
    };
    let field =
        |name: &str| text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':').map(|v| v.trim().to_owned()));
    DriverInfo { minor: field("Device Minor").and_then(|m| m.parse().ok()), uuid: field("GPU UUID") }
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

impl Backend for Gpu {
    fn init(config: &str, sys: &dyn Sys) -> Result<(Self, Info), BackendError> {
        let cfg: Config = toml::from_str(config).map_err(invalid_config)?;
        let vendors = cfg.vendors.unwrap_or_else(|| vec![Vendor::Nvidia, Vendor::Amd, Vendor::Intel]);
        let pci = PciCache::default();
        let driver = DriverFacts::default();
        let nvidia_minors = if vendors.contains(&Vendor::Nvidia) {
            let list = gpus(&pci, sys, Vendor::Nvidia);
            let said = driver.of(sys, &list);
            let minor = |i: usize, d: &PciDevice| said.get(&d.address).and_then(|f| f.minor).unwrap_or(i as u32);
            list.iter().enumerate().map(|(i, d)| (d.address.clone(), minor(i, d))).collect()
        } else {
            BTreeMap::new()
        };
        let mut resources = Vec::new();
        for v in &vendors {
            let names: Vec<&String> = match v {
                Vendor::Nvidia => vec![&cfg.names.nvidia],
                Vendor::Amd => vec![&cfg.names.amd],
                Vendor::Intel => vec![&cfg.names.intel_i915, &cfg.names.intel_xe],
            };
            for n in names {
                resources.push(ResourceInfo { name: n.clone(), preferred_allocation: true, pre_start_required: false });
            }
        }
        let info = Info { name: "gpu".into(), version: env!("CARGO_PKG_VERSION").into(), resources };
        Ok((Gpu { vendors, names: cfg.names, nvidia_minors: RefCell::new(nvidia_minors), driver, pci }, info))
    }

    fn discover(&self, sys: &dyn Sys) -> Result<Vec<Resource>, BackendError> {
        let mut out = Vec::new();
        for v in &self.vendors {
            match v {
                Vendor::Nvidia => out.push(self.nvidia(sys)),
                Vendor::Amd => {
                    out.push(drm_resource(sys, &self.names.amd, gpus(&self.pci, sys, Vendor::Amd), "amdgpu", "kfd"))
                }
                Vendor::Intel => {
                    let (xe, i915): (Vec<_>, Vec<_>) = gpus(&self.pci, sys, Vendor::Intel)
                        .into_iter()
                        .partition(|d| d.driver.as_deref() == Some("xe"));
                    // An unbound Intel GPU stays in the i915 pool (its usual driver), as Unhealthy.
                    out.push(drm_resource(sys, &self.names.intel_i915, i915, "i915", ""));
                    out.push(drm_resource(sys, &self.names.intel_xe, xe, "xe", ""));
                }
            }
        }
        Ok(out)
    }

    fn preferred_allocation(
        &self,
        sys: &dyn Sys,
        _resource: &str,
        available: &[String],
        must_include: &[String],
        size: u32,
    ) -> Result<Vec<String>, BackendError> {
        Ok(pack_pci(sys, available, must_include, size, |d| d.switch(sys)))
    }

    fn allocate(&self, _sys: &dyn Sys, resource: &str, ids: &[String]) -> Result<ContainerEdits, BackendError> {
        if resource != self.names.nvidia {
            return Ok(edits::empty());
        }
        // The NVIDIA container toolkit reads this; with the nodes handed over directly it only
        // narrows what the toolkit would add.
        let known = self.nvidia_minors.borrow();
        let minors: Result<Vec<String>, BackendError> = ids
            .iter()
            .map(|id| known.get(id).map(|m| m.to_string()).ok_or_else(|| BackendError::UnknownDevice(id.clone())))
            .collect();
        Ok(edits::env("NVIDIA_VISIBLE_DEVICES", &minors?.join(",")))
    }
}

impl Gpu {
    fn nvidia(&self, sys: &dyn Sys) -> Resource {
        let list = gpus(&self.pci, sys, Vendor::Nvidia);
        let driver = self.driver.of(sys, &list);
        let mut minors = self.nvidia_minors.borrow_mut();
        for d in &list {
            let said = driver.get(&d.address).and_then(|i| i.minor);
            let next = minors.values().max().map_or(0, |m| m + 1);
            let minor = said.or_else(|| minors.get(&d.address).copied()).unwrap_or(next);
            minors.insert(d.address.clone(), minor);
        }
        let sick = PciDevice::sickness_many(sys, &list, |drv| drv == "nvidia");
        let mut devices = Vec::new();
        for (d, mut problem) in list.iter().zip(sick) {
            let minor = minors.get(&d.address).copied().unwrap_or_default();
            let node = format!("nvidia{minor}");
            if problem.is_none() && sys.dev_stat(&node).is_err() {
                problem = Some(format!("/dev/{node} is missing"));
            }
            let mut attrs = attributes(sys, d, problem.as_deref());
            attrs.push(("minor".into(), minor.to_string()));
            if let Some(uuid) = driver.get(&d.address).and_then(|i| i.uuid.clone()) {
                attrs.push(("uuid".into(), uuid));
            }
            devices.push(device(d, problem.is_none(), attrs, edits::nodes([node.as_str()])));
        }
        let common = present(sys, &["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"]);
        Resource { name: self.names.nvidia.clone(), devices, common_edits: common }
    }
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
        let attrs = attributes(sys, d, problem.as_deref());
        devices.push(device(d, problem.is_none(), attrs, edits::nodes(nodes.iter().map(String::as_str))));
    }
    let common = if shared.is_empty() { edits::empty() } else { present(sys, &[shared]) };
    Resource { name: name.to_owned(), devices, common_edits: common }
}

fn device(d: &PciDevice, healthy: bool, attributes: Vec<(String, String)>, edits: ContainerEdits) -> Device {
    Device {
        id: d.address.clone(),
        health: if healthy { Health::Healthy } else { Health::Unhealthy },
        numa_nodes: d.numa_node.into_iter().collect(),
        attributes,
        edits,
    }
}

fn attributes(sys: &dyn Sys, d: &PciDevice, problem: Option<&str>) -> Vec<(String, String)> {
    let mut a = vec![
        ("pci".to_owned(), d.address.clone()),
        ("model".to_owned(), d.vendor_device()),
        ("driver".to_owned(), d.driver.clone().unwrap_or_else(|| "none".into())),
    ];
    if let Some(sw) = d.switch(sys) {
        a.push(("pcie-switch".into(), sw));
    }
    if let Some(p) = problem {
        a.push(("unhealthy".into(), p.to_owned()));
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
    use devplug_sdk::FixtureSys;

    fn fixture(name: &str) -> FixtureSys {
        FixtureSys::machine(format!("{}/../../tests/fixtures/sysfs/{name}", env!("CARGO_MANIFEST_DIR")))
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
        let all: Vec<String> = b.nvidia(&sys).devices.iter().map(|d| d.id.clone()).collect();
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

    #[test]
    fn unknown_config_keys_are_refused() {
        let sys = fixture("plain");
        assert!(matches!(Gpu::init("vendor = [\"nvidia\"]", &sys), Err(BackendError::InvalidConfig(_))));
        assert!(matches!(Gpu::init("vendors = [\"matrox\"]", &sys), Err(BackendError::InvalidConfig(_))));
    }
}
