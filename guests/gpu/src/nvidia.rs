//! NVIDIA GPUs: minors and UUIDs from the driver's `/proc`, whole GPUs and MIG instances by the
//! configured MIG strategy, and what `NVIDIA_VISIBLE_DEVICES` names for an Allocate.
//!
//! Minors (`/dev/nvidiaN`) are not in sysfs: the driver says them in
//! `/proc/driver/nvidia/gpus/<pci>/information` (`Device Minor:`, with the `GPU UUID:`), which the
//! backend reads where its `procfs` grant allows. Without it, the backend assumes the driver's
//! PCI-order numbering when it starts (`init`) and keeps it, which stays right when a GPU drops
//! off the bus; a GPU that appears later takes the next free minor. Either way `allocate` knows
//! every device `discover` has listed.

use std::cell::RefCell;
use std::collections::BTreeMap;

use devplug_sdk::pci::{PciCache, PciDevice};
use devplug_sdk::{BackendError, Device, Resource, Sys, edits};

use crate::config::{CdiNames, Config, IdStrategy, MigStrategy, Vendor};
use crate::mig;
use crate::{attributes, device, gpus, present};

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

/// The NVIDIA half of the backend's state.
#[derive(Default)]
pub struct Nvidia {
    /// PCI address → minor (see the module docs).
    minors: RefCell<BTreeMap<String, u32>>,
    driver: DriverFacts,
    /// Every device ID (whole GPU or MIG instance) the last discover listed → its
    /// `NVIDIA_VISIBLE_DEVICES` token (none for a MIG instance whose GPU's UUID is unknown).
    visible: RefCell<BTreeMap<String, Option<String>>>,
    /// GPUs in MIG mode (PCI address → their compute instances) as the last discover saw them:
    /// listed whole for DRA only, never handed out whole.
    mig_mode: RefCell<BTreeMap<String, usize>>,
}

impl Nvidia {
    /// Minors for `list`: the driver's word, else the one already known, else (at init) the PCI
    /// order, else the next free one.
    /// Each GPU's minor: the driver's word, else the next numbers after the highest the driver
    /// reported, in PCI order. A function of what the machine shows now and of nothing an
    /// instance remembers, so every instance of the backend (a pool serves calls) agrees on
    /// which `/dev/nvidiaN` and `NVIDIA_VISIBLE_DEVICES` a GPU gets.
    fn assign_minors(&self, list: &[PciDevice], facts: &BTreeMap<String, DriverInfo>) {
        let said = |d: &PciDevice| facts.get(&d.address).and_then(|f| f.minor);
        let mut next = list.iter().filter_map(said).max().map_or(0, |m| m + 1);
        let mut minors = BTreeMap::new();
        for d in list {
            let minor = said(d).unwrap_or_else(|| {
                next += 1;
                next - 1
            });
            minors.insert(d.address.clone(), minor);
        }
        *self.minors.borrow_mut() = minors;
    }

    /// Learn the GPUs present at init (minors as [`Self::assign_minors`] gives them), so
    /// `allocate` on a fresh instance knows them before any discover.
    pub fn init(&self, sys: &dyn Sys, pci: &PciCache, cfg: &Config) {
        let list = gpus(pci, sys, Vendor::Nvidia);
        let facts = self.driver.of(sys, &list);
        self.assign_minors(&list, &facts);
        self.resources(sys, pci, cfg);
    }

    /// The NVIDIA resources by the MIG strategy: `nvidia.com/gpu` alone (none, single) or with one
    /// `nvidia.com/mig-<profile>` per configured profile (mixed), before any sharing.
    pub fn resources(&self, sys: &dyn Sys, pci: &PciCache, cfg: &Config) -> Vec<Resource> {
        let list = gpus(pci, sys, Vendor::Nvidia);
        let facts = self.driver.of(sys, &list);
        self.assign_minors(&list, &facts);
        let minors = self.minors.borrow().clone();
        let sick = PciDevice::sickness_many(sys, &list, |drv| drv == "nvidia");
        let mut found = Found::default();
        for (d, problem) in list.iter().zip(sick) {
            let minor = minors.get(&d.address).copied().unwrap_or_default();
            let uuid = facts.get(&d.address).and_then(|f| f.uuid.clone());
            let instances = match cfg.mig.strategy {
                MigStrategy::None => None,
                _ => mig::instances(sys, minor),
            };
            match instances {
                None => found.whole(sys, cfg, d, minor, uuid, problem),
                Some(list) => found.mig(sys, cfg, d, minor, uuid.as_deref(), problem, list),
            }
        }
        *self.visible.borrow_mut() = std::mem::take(&mut found.visible);
        *self.mig_mode.borrow_mut() = std::mem::take(&mut found.mig_mode);
        found.into_resources(sys, cfg)
    }

    /// Refuse a GPU in MIG mode asked for whole: its compute is in its instances. (DRA lists it
    /// so the scheduler can weigh a whole GPU against its instances on one counter set; a claim
    /// it was allocated to lands here when the GPU has instances.)
    pub fn refuse_mig_mode(&self, ids: &[String]) -> Result<(), BackendError> {
        let mig = self.mig_mode.borrow();
        match ids.iter().find_map(|id| mig.get(id).map(|n| (id, n))) {
            None => Ok(()),
            Some((id, n)) => Err(BackendError::Other(format!(
                "GPU {id} is in MIG mode with {n} compute instance(s), so it cannot be used whole: \
                 request a MIG instance (a device with mig_profile), or destroy its instances and \
                 disable MIG mode (nvidia-smi mig -dci; nvidia-smi mig -dgi; nvidia-smi -i {id} -mig 0) \
                 so devplug lists it whole"
            ))),
        }
    }

    /// `NVIDIA_VISIBLE_DEVICES` for physical device IDs, or the first ID this backend never
    /// listed. `None` when no ID has a token.
    pub fn visible_devices(&self, ids: &[String]) -> Result<Option<String>, BackendError> {
        let known = self.visible.borrow();
        let mut tokens = Vec::new();
        for id in ids {
            match known.get(id) {
                None => return Err(BackendError::UnknownDevice(id.clone())),
                Some(Some(t)) => tokens.push(t.clone()),
                Some(None) => {}
            }
        }
        Ok((!tokens.is_empty()).then(|| tokens.join(",")))
    }
}

/// What one discover found, sorted into the pools the strategies need.
#[derive(Default)]
struct Found {
    whole: Vec<Device>,
    /// MIG instances by profile.
    by_profile: BTreeMap<String, Vec<Device>>,
    /// MIG instances the config gives no profile.
    unprofiled: Vec<Device>,
    visible: BTreeMap<String, Option<String>>,
    mig_mode: BTreeMap<String, usize>,
}

impl Found {
    fn whole(
        &mut self,
        sys: &dyn Sys,
        cfg: &Config,
        d: &PciDevice,
        minor: u32,
        uuid: Option<String>,
        problem: Option<String>,
    ) {
        let node = format!("nvidia{minor}");
        let problem = problem.or_else(|| missing(sys, std::slice::from_ref(&node)));
        let mut attrs = attributes(sys, d);
        attrs.push(("minor".into(), minor.to_string()));
        if let Some(u) = &uuid {
            attrs.push(("uuid".into(), u.clone()));
        }
        if cfg.cdi_device_names == CdiNames::NvidiaCtk {
            let names: Vec<String> = std::iter::once(minor.to_string()).chain(uuid.clone()).collect();
            attrs.push(("cdi-name".into(), names.join(",")));
        }
        let token = match (cfg.device_id_strategy, uuid) {
            (IdStrategy::Uuid, Some(u)) => u,
            _ => minor.to_string(),
        };
        self.visible.insert(d.address.clone(), Some(token));
        self.whole.push(device(&d.address, d, problem.as_deref(), attrs, edits::nodes([node.as_str()])));
    }

    #[allow(clippy::too_many_arguments)]
    fn mig(
        &mut self,
        sys: &dyn Sys,
        cfg: &Config,
        d: &PciDevice,
        minor: u32,
        uuid: Option<&str>,
        problem: Option<String>,
        instances: Vec<mig::Instance>,
    ) {
        // The GPU itself is not listed, in either API: in MIG mode it cannot be handed out whole
        // (this backend does not reconfigure MIG), and a whole-GPU device the scheduler could
        // allocate once the instances are free would be a claim no prepare can ever serve
        // (issue 52). Its instances draw on its counter set (see `dra::describe`).
        self.mig_mode.insert(d.address.clone(), instances.len());
        for inst in instances {
            let id = inst.id(&d.address);
            let nodes = inst.nodes(minor);
            let profile = cfg.mig.profile(&d.address, inst.gi);
            let problem = problem.clone().or_else(|| missing(sys, &nodes)).or_else(|| {
                profile.is_none().then(|| {
                    format!(
                        "MIG GPU instance {} has no profile in [mig.profiles] (nvidia-smi mig -lgi lists it)",
                        inst.gi
                    )
                })
            });
            let mut attrs = attributes(sys, d);
            attrs.push(("minor".into(), minor.to_string()));
            attrs.push(("mig-gi".into(), inst.gi.to_string()));
            attrs.push(("mig-ci".into(), inst.ci.to_string()));
            attrs.push(("mig-profile".into(), profile.unwrap_or("unknown").to_owned()));
            if let Some(u) = uuid {
                attrs.push(("uuid".into(), u.to_owned()));
            }
            // The toolkit's MIG-<GPU-UUID>/<gi>/<ci> form needs no NVML: the GPU's UUID and the
            // instance IDs are enough.
            self.visible.insert(id.clone(), uuid.map(|u| format!("MIG-{u}/{}/{}", inst.gi, inst.ci)));
            let dev = device(&id, d, problem.as_deref(), attrs, edits::nodes(nodes.iter().map(String::as_str)));
            match profile {
                Some(p) => self.by_profile.entry(p.to_owned()).or_default().push(dev),
                None => self.unprofiled.push(dev),
            }
        }
    }

    fn into_resources(mut self, sys: &dyn Sys, cfg: &Config) -> Vec<Resource> {
        let common = present(sys, &["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"]);
        let resource = |name: String, devices: Vec<Device>| Resource { name, devices, common_edits: common.clone() };
        match cfg.mig.strategy {
            MigStrategy::None => vec![resource(cfg.names.nvidia.clone(), self.whole)],
            MigStrategy::Mixed => {
                // Unprofiled instances are listed under the GPU resource, Unhealthy with the
                // reason, so the operator sees them rather than a silent gap.
                let mut gpu = self.whole;
                gpu.extend(self.unprofiled);
                let mut out = vec![resource(cfg.names.nvidia.clone(), gpu)];
                for p in cfg.mig.all_profiles() {
                    out.push(resource(cfg.names.mig(p), self.by_profile.remove(p).unwrap_or_default()));
                }
                out
            }
            MigStrategy::Single => {
                if self.by_profile.is_empty() && self.unprofiled.is_empty() {
                    return vec![resource(cfg.names.nvidia.clone(), self.whole)];
                }
                let profiles: Vec<&str> = self.by_profile.keys().map(String::as_str).collect();
                let why = if !self.whole.is_empty() {
                    Some(format!(
                        "MIG strategy single: {} GPU(s) are not in MIG mode; put every GPU in MIG mode or use mixed",
                        self.whole.len()
                    ))
                } else if profiles.len() > 1 {
                    Some(format!(
                        "MIG strategy single needs one profile on every GPU, found {}; use mixed",
                        profiles.join(", ")
                    ))
                } else {
                    None
                };
                let mut devices: Vec<Device> = self.by_profile.into_values().flatten().collect();
                devices.extend(self.unprofiled);
                if let Some(why) = why {
                    devices.extend(self.whole);
                    for d in &mut devices {
                        d.fail(&why);
                    }
                }
                devices.sort_by(|a, b| a.id.cmp(&b.id));
                vec![resource(cfg.names.nvidia.clone(), devices)]
            }
        }
    }
}

/// The first of `nodes` missing under `/dev`, as a problem.
fn missing(sys: &dyn Sys, nodes: &[String]) -> Option<String> {
    nodes.iter().find(|n| sys.dev_stat(n).is_err()).map(|n| format!("/dev/{n} is missing"))
}
