//! How an Allocate answer hands devices to the container runtime: the strategies, alone or
//! several at once.
//!
//! - `device-specs`: the classic answer, DeviceSpecs + mounts + envs. Every runtime kubelet
//!   supports understands it, which is why it is the default.
//! - `cdi-cri`: `cdi_devices` (KEP-4009, kubelet ≥ 1.28; GA in 1.31) naming each device's CDI
//!   name; the runtime (containerd ≥ 1.7 with CDI on, CRI-O ≥ 1.23) injects it from the spec file.
//! - `cdi-annotations`: the same names in a `cdi.k8s.io/` annotation, for runtimes that read CDI
//!   from annotations but predate the CRI field.
//!
//! Per-device and common edits live in the CDI spec, so a CDI-only answer carries just what the
//! backend's `allocate` computed for this particular set of IDs (it depends on the set, so it
//! cannot be in a spec). When a CDI strategy is chosen but no spec could be written, the answer
//! falls back to device-specs for that call and says so in the log: the pod starts. The answer
//! never writes a spec: every device list is in its spec before kubelet sees it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde::{Deserialize, Serialize};

use crate::cdi::{Kind, Naming, SpecDir};
use crate::model::nodes::Admitted;
use crate::model::{ContainerEdits, Resource};
use crate::proto::deviceplugin as pb;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    DeviceSpecs,
    CdiCri,
    CdiAnnotations,
}

impl Strategy {
    pub(crate) fn is_cdi(self) -> bool {
        matches!(self, Strategy::CdiCri | Strategy::CdiAnnotations)
    }
}

/// Where a resource's CDI specs are.
#[derive(Clone)]
pub struct CdiTarget {
    pub kind: Kind,
    pub specs: Arc<SpecDir>,
}

/// How one resource answers Allocate.
#[derive(Clone)]
pub struct Delivery {
    pub strategies: Vec<Strategy>,
    pub cdi: Option<CdiTarget>,
    warned: Arc<AtomicBool>,
}

impl Default for Delivery {
    fn default() -> Self {
        Delivery::new(vec![Strategy::DeviceSpecs], None)
    }
}

impl Delivery {
    pub fn new(strategies: Vec<Strategy>, cdi: Option<CdiTarget>) -> Self {
        Delivery { strategies, cdi, warned: Arc::default() }
    }

    fn has(&self, s: Strategy) -> bool {
        self.strategies.contains(&s)
    }

    /// One container's answer: what the node gate admitted for `ids` (everything, for the
    /// classic strategy; the backend's `allocate` answer alone when the rest is in a CDI spec).
    pub fn answer(&self, resource: &Resource, ids: &[String], admitted: &Admitted) -> pb::ContainerAllocateResponse {
        let wants_cdi = self.strategies.iter().any(|s| s.is_cdi());
        // Two replicas of one device share its CDI name: the runtime is asked for it once.
        let mut cdi_names: Vec<String> = Vec::new();
        if wants_cdi {
            let naming = Naming::of(resource);
            for id in ids {
                let n = naming.name_of(id);
                if !cdi_names.contains(&n) {
                    cdi_names.push(n);
                }
            }
        }
        let cdi = if wants_cdi { self.usable_cdi(resource, &cdi_names) } else { None };
        let classic = self.has(Strategy::DeviceSpecs) || (wants_cdi && cdi.is_none());
        let edits = if classic { admitted.edits() } else { admitted.answer() };
        let mut out = to_container_response(edits);
        if let Some(kind) = cdi {
            let names: Vec<String> = cdi_names.iter().map(|n| kind.qualified_name(n)).collect();
            if self.has(Strategy::CdiCri) {
                out.cdi_devices = names.iter().map(|n| pb::CdiDevice { name: n.clone() }).collect();
            }
            if self.has(Strategy::CdiAnnotations) {
                out.annotations.insert(annotation_key(&kind), names.join(","));
            }
        }
        out
    }

    fn usable_cdi(&self, resource: &Resource, names: &[String]) -> Option<Kind> {
        let failure = match &self.cdi {
            None => "no CDI spec can be written for it (see the log line at startup)".to_owned(),
            Some(t) if t.specs.covers(&resource.name, names) => return Some(t.kind.clone()),
            Some(_) => {
                "its CDI spec on disk does not name these devices (it could not be written: see the log)".to_owned()
            }
        };
        if !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(resource = %resource.name, "answering Allocate with device specs: {failure}");
        }
        None
    }
}

/// `cdi.k8s.io/devplug_<class>`: the annotation form's key, whose name part kubelet and the CDI
/// library both cap at 63 characters.
fn annotation_key(kind: &Kind) -> String {
    let name: String = crate::model::names::name_chars(&format!("devplug_{}", kind.class)).chars().take(63).collect();
    format!("cdi.k8s.io/{}", name.trim_end_matches(|c: char| !c.is_ascii_alphanumeric()))
}

/// Classic Allocate answer: DeviceSpecs, mounts, env and annotations.
fn to_container_response(edits: &ContainerEdits) -> pb::ContainerAllocateResponse {
    pb::ContainerAllocateResponse {
        envs: edits.env.iter().map(|(k, v)| (k.as_str().to_owned(), v.as_str().to_owned())).collect(),
        mounts: edits
            .mounts
            .iter()
            .map(|m| pb::Mount {
                container_path: m.container_path.clone(),
                host_path: m.host_path.clone(),
                read_only: m.read_only,
            })
            .collect(),
        devices: edits
            .device_nodes
            .iter()
            .map(|n| pb::DeviceSpec {
                container_path: n.container_path.clone(),
                host_path: n.host_path().to_owned(),
                permissions: n.permissions().to_owned(),
            })
            .collect(),
        annotations: edits.annotations.iter().cloned().collect(),
        cdi_devices: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Allocate only reads: a spec that is not on disk yet means device specs for this call,
    /// never a write from the Allocate path (which runs on an async worker, and might hold an
    /// older list than the poll loop's).
    #[test]
    fn an_allocate_never_writes_a_spec() {
        use crate::model::{Device, DeviceNode, Health, NodeNumbers};
        let d = tempfile::tempdir().unwrap();
        let specs = Arc::new(SpecDir::open(d.path()).unwrap());
        let kind = Kind::for_resource("example.com/kvm").unwrap();
        let node = DeviceNode {
            container_path: "/dev/kvm".into(),
            numbers: Some(NodeNumbers { block: false, major: 10, minor: 232 }),
            ..Default::default()
        };
        let r = Resource {
            name: "example.com/kvm".into(),
            devices: vec![Device {
                id: "kvm".into(),
                health: Health::Healthy,
                numa_nodes: vec![],
                attributes: vec![],
                edits: ContainerEdits { device_nodes: vec![node], ..Default::default() },
                vetted: Default::default(),
            }],
            common_edits: ContainerEdits::default(),
            ..Default::default()
        };
        let delivery = Delivery::new(vec![Strategy::CdiCri], Some(CdiTarget { kind, specs: specs.clone() }));
        let ids = vec!["kvm".to_owned()];
        let owners = crate::model::nodes::NodeOwners::build([("b", &r)]);
        let admitted = owners.admit_allocation(&r, &ids, ContainerEdits::default()).unwrap();
        let before = delivery.answer(&r, &ids, &admitted);
        assert!(std::fs::read_dir(d.path()).unwrap().next().is_none(), "Allocate wrote into the CDI dir");
        assert!(before.cdi_devices.is_empty() && before.devices.len() == 1, "device specs instead: {before:?}");
        specs.sync(&r).unwrap();
        let after = delivery.answer(&r, &ids, &admitted);
        assert_eq!(after.cdi_devices[0].name, "example.com/kvm=kvm");
    }

    #[test]
    fn annotation_keys_fit_the_cdi_rules() {
        let k = Kind::for_resource("nvidia.com/gpu").unwrap();
        assert_eq!(annotation_key(&k), "cdi.k8s.io/devplug_gpu");
        let long = Kind::for_resource(&format!("x.io/{}", "a".repeat(80))).unwrap();
        assert_eq!(annotation_key(&long).len(), "cdi.k8s.io/".len() + 63);
    }
}
