//! Devices exclusive unless shared: a device node is handed out by one backend's resource, not
//! by two backends at once (a vendor's AMD backend and devplug's own gpu backend both serving
//! `/dev/dri/renderD128` gave two containers one GPU). A node two backends' devices name passes
//! only when every device naming it declares sharing (the host-recognised attribute
//! `shared-node = "true"`: `/dev/kvm`, `/dev/fuse`, `/dev/null` are many users' by nature).
//! Otherwise the resource that already hands the node out keeps it, and the newcomer's devices
//! naming it are refused, with an ERROR naming both resources and the node, shown in `/status`
//! and failing `devplug discover`.
//!
//! Within one backend the backend arranges its own resources (a MIG instance names its GPU's
//! node, whole and parts are one vendor's view), and a resource's common edits (`nvidiactl`,
//! `kfd`: every device's control nodes) are shared by design; the per-device nodes of different
//! backends are what can collide.

use std::collections::{BTreeMap, BTreeSet};

use crate::model::{Device, Resource};

pub use crate::model::SHARED_NODE;

/// A node two backends' resources would both hand out.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct Conflict {
    /// The host path (`/dev/dri/renderD128`).
    pub node: String,
    /// The resource that keeps it, and its backend.
    pub holder: String,
    pub holder_backend: String,
    /// The devices of the refused resource that named it.
    pub devices: Vec<String>,
}

impl std::fmt::Display for Conflict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "device node {} is already handed out by resource {} (backend {}); refused for {} — give these devices to one backend (narrow the other's grant.dev, or disable it), or mark every device naming the node shared-node = \"true\"",
            crate::gate::clip(&self.node),
            self.holder,
            self.holder_backend,
            crate::gate::clip(&self.devices.join(", "))
        )
    }
}

fn shared(d: &Device) -> bool {
    d.attributes.iter().any(|(k, v)| k == SHARED_NODE && v == "true")
}

/// Per-device nodes of `r`: host path → whether every device naming it declares sharing.
fn nodes(r: &Resource) -> BTreeMap<&str, bool> {
    let mut out: BTreeMap<&str, bool> = BTreeMap::new();
    for d in &r.devices {
        for n in &d.edits.device_nodes {
            let all = out.entry(n.host_path()).or_insert(true);
            *all &= shared(d);
        }
    }
    out
}

/// What `next` (resource `name` of backend `backend`) would hand out that `others` (resource
/// name, backend, published list) already hand out, unless both sides declare sharing.
pub fn conflicts<'a>(
    others: impl Iterator<Item = (&'a str, &'a str, &'a Resource)>,
    backend: &str,
    next: &Resource,
) -> Vec<Conflict> {
    let mine = nodes(next);
    if mine.is_empty() {
        return Vec::new();
    }
    let mut out: BTreeMap<&str, Conflict> = BTreeMap::new();
    for (holder, holder_backend, r) in others.filter(|(_, b, _)| *b != backend) {
        for (node, theirs_shared) in nodes(r) {
            let Some(mine_shared) = mine.get(node) else { continue };
            if *mine_shared && theirs_shared {
                continue;
            }
            out.entry(node).or_insert_with(|| Conflict {
                node: node.to_owned(),
                holder: holder.to_owned(),
                holder_backend: holder_backend.to_owned(),
                devices: next
                    .devices
                    .iter()
                    .filter(|d| d.edits.device_nodes.iter().any(|n| n.host_path() == node))
                    .map(|d| d.id.clone())
                    .collect(),
            });
        }
    }
    out.into_values().collect()
}

/// `next` without the devices `conflicts` refuse.
pub fn refuse(next: &mut Resource, conflicts: &[Conflict]) {
    let refused: BTreeSet<&str> = conflicts.iter().flat_map(|c| c.devices.iter().map(String::as_str)).collect();
    next.devices.retain(|d| !refused.contains(d.id.as_str()));
    let ids: BTreeSet<&str> = next.devices.iter().map(|d| d.id.as_str()).collect();
    next.described.retain(|id, _| ids.contains(id.as_str()));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ContainerEdits, DeviceNode, Health};

    fn res(name: &str, devices: &[(&str, &str, bool)]) -> Resource {
        Resource {
            name: name.into(),
            devices: devices
                .iter()
                .map(|(id, node, shared)| Device {
                    id: (*id).into(),
                    health: Health::Healthy,
                    numa_nodes: vec![],
                    attributes: if *shared { vec![(SHARED_NODE.into(), "true".into())] } else { vec![] },
                    edits: ContainerEdits {
                        device_nodes: vec![DeviceNode { container_path: (*node).into(), ..Default::default() }],
                        ..Default::default()
                    },
                    vetted: Default::default(),
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn a_node_two_backends_hand_out_is_refused_unless_both_share_it() {
        let gpu =
            res("amd.com/gpu", &[("card0", "/dev/dri/renderD128", false), ("card1", "/dev/dri/renderD129", false)]);
        let vendor =
            res("amd.com/mi300x", &[("gpu-0", "/dev/dri/renderD128", false), ("gpu-9", "/dev/dri/renderD200", false)]);
        let c = conflicts([("amd.com/gpu", "gpu", &gpu)].into_iter(), "mi300x", &vendor);
        assert_eq!(c.len(), 1);
        assert_eq!(
            (c[0].node.as_str(), c[0].holder.as_str(), c[0].devices.as_slice()),
            ("/dev/dri/renderD128", "amd.com/gpu", &["gpu-0".to_owned()][..])
        );
        let shown = c[0].to_string();
        assert!(
            shown.contains("amd.com/gpu") && shown.contains("/dev/dri/renderD128") && shown.contains("grant.dev"),
            "{shown}"
        );
        let mut kept = vendor.clone();
        refuse(&mut kept, &c);
        assert_eq!(kept.devices.iter().map(|d| d.id.as_str()).collect::<Vec<_>>(), ["gpu-9"]);
        // The same backend's own resources are its business.
        assert!(conflicts([("amd.com/gpu", "mi300x", &gpu)].into_iter(), "mi300x", &vendor).is_empty());
        // Shared only when every side says so.
        let kvm_a = res("a.io/kvm", &[("k", "/dev/kvm", true)]);
        let kvm_b = res("b.io/kvm", &[("k", "/dev/kvm", true)]);
        let kvm_c = res("c.io/kvm", &[("k", "/dev/kvm", false)]);
        assert!(conflicts([("a.io/kvm", "a", &kvm_a)].into_iter(), "b", &kvm_b).is_empty());
        assert_eq!(conflicts([("a.io/kvm", "a", &kvm_a)].into_iter(), "c", &kvm_c).len(), 1);
        assert_eq!(conflicts([("c.io/kvm", "c", &kvm_c)].into_iter(), "a", &kvm_a).len(), 1);
    }
}
