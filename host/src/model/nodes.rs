//! Who owns each device node on this machine, and the one gate every node set a container or a
//! claim finally gets passes through.
//!
//! [`NodeOwners`] is built from every backend's last discover (before anything is refused): a
//! host node a device names in its own edits is that device's. A node is known by what the
//! kernel knows it by — its type, major and minor as the host vetted them ([`NodeKey`]) — not by
//! the path that names it: udev makes `/dev/char/195:0` for `/dev/nvidia0`, and a second name
//! of a node is the same node. Two rules follow from it, and neither depends on which backend
//! loaded first:
//!
//! - **Contested nodes are nobody's.** A node that devices of two backends both name (not every
//!   one of them declaring `shared-node`), or that one backend's device names while another
//!   backend's common edits hand it to all its containers, is refused to both sides (every
//!   device naming it; every device of the resource handing it out) until the operator's config
//!   decides: one resource's `owns` ([`super::owns::Decisions`]) gives it that resource and
//!   withholds only the other side's devices naming it, or every device naming it is marked
//!   shared: [`NodeOwners::conflicts`]. The first backend to finish its discover used to keep
//!   the node, so a small hostile backend won the race.
//! - **A container or claim gets only its own devices' nodes.** What it finally gets (the
//!   per-device edits of what it holds, the resource's common edits and the backend's
//!   `allocate`/`prepare` answer, merged) passes [`NodeOwners::admit`]: a node owned by a device
//!   outside the allocation, of any backend, is refused with both resources named. The answer
//!   writers take only the [`Admitted`] this returns (kubelet's Allocate answer, a claim's CDI
//!   spec), so a new producer of edits cannot reach them around the check.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use arc_swap::ArcSwap;

use super::owns::Decisions;
use super::{ContainerEdits, Device, DeviceNode, NodeNumbers, Resource, SHARED_NODE};

/// A node as the table knows it: its vetted type and numbers; a node the host has not vetted
/// yet (none reaches a writer) by its path.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum NodeKey {
    Numbers(NodeNumbers),
    Path(String),
}

impl NodeKey {
    pub fn of(n: &DeviceNode) -> NodeKey {
        match n.numbers {
            Some(numbers) => NodeKey::Numbers(numbers),
            None => NodeKey::Path(n.host_path().to_owned()),
        }
    }
}

/// The current table, shared by the poll loop (which replaces it whenever a discover changes
/// what any backend names) and every answer writer (which reads it per answer).
#[derive(Clone, Default)]
pub struct OwnersView(Arc<ArcSwap<NodeOwners>>);

impl OwnersView {
    pub fn load(&self) -> Arc<NodeOwners> {
        self.0.load_full()
    }

    pub fn store(&self, table: NodeOwners) {
        self.0.store(Arc::new(table));
    }
}

/// A device whose own edits name a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    pub backend: String,
    pub resource: String,
    pub device: String,
    /// The path this device names the node by.
    pub path: String,
    /// The device declares `shared-node`.
    pub shared: bool,
}

/// Every per-device node on the machine and its owners; and which resources hand each node to
/// all their containers (common edits).
#[derive(Clone, Debug, Default)]
pub struct NodeOwners {
    owners: BTreeMap<NodeKey, Vec<Owner>>,
    /// Node → (backend, resource, the path it names it by) whose common edits hand it to every
    /// container.
    common: BTreeMap<NodeKey, Vec<(String, String, String)>>,
    /// Nodes the config gives one resource (`owns`): node → (backend, resource, its path).
    decided: BTreeMap<NodeKey, (String, String, String)>,
}

fn shared(d: &Device) -> bool {
    d.attributes.iter().any(|(k, v)| k == SHARED_NODE && v == "true")
}

/// A node two backends would both hand out, as the refused side sees it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct Conflict {
    /// The host path the refused resource names it by (`/dev/dri/renderD128`).
    pub node: String,
    /// The node's type and numbers, when vetted (`char 226:128`).
    pub numbers: Option<String>,
    /// The other side: a resource, its backend, and the path it names the node by.
    pub holder: String,
    pub holder_backend: String,
    pub holder_path: String,
    /// The devices of the refused resource that named it.
    pub devices: Vec<String>,
    /// The config gives the node to the holder (`owns`): this side is withheld by decision,
    /// not refused for want of one.
    pub decided: bool,
}

impl std::fmt::Display for Conflict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let numbers = self.numbers.as_ref().map(|n| format!(" ({n})")).unwrap_or_default();
        let there = if self.holder_path == self.node {
            String::new()
        } else {
            format!(" as {}", crate::gate::clip(&self.holder_path))
        };
        let (node, holder, backend) =
            (crate::gate::clip(&self.node), crate::gate::clip(&self.holder), crate::gate::clip(&self.holder_backend));
        let devices = self.devices.join(", ");
        let devices = crate::gate::clip(&devices);
        if self.decided {
            return write!(
                f,
                "device node {node}{numbers} is resource {holder}'s (backend {backend}){there} by the config (owns); withheld here for {devices}"
            );
        }
        write!(
            f,
            "device node {node}{numbers} is also handed out by resource {holder} (backend {backend}){there}; refused to both until the config decides — set owns under one resource's [resources.\"…\"], or mark every device naming it shared-node = \"true\"; refused here for {devices}"
        )
    }
}

/// A node a container or claim would get that belongs to a device it does not hold (or that
/// two backends contest). The text names the owner; the caller names the answer's resource or
/// claim ([`resource`](Self::resource)) before it, so one rule reads the same on every path.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "device node {node} belongs to device {} of resource {} (backend {}){}, which was not allocated here; refused",
    .owner.device,
    .owner.resource,
    .owner.backend,
    if .owner.path == *.node { String::new() } else { format!(" as {}", .owner.path) }
)]
pub struct Foreign {
    pub node: String,
    /// The device that owns it: its backend, resource, and the path it names the node by (a
    /// second name of the same node, or the same), each clipped for the message.
    pub owner: Box<Owner>,
    /// The resource (or claim) whose answer named it.
    pub resource: String,
}

/// What a container or claim gets, past [`NodeOwners::admit`] or
/// [`NodeOwners::admit_allocation`]: the only way to the writers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Admitted {
    /// Everything it gets.
    edits: ContainerEdits,
    /// Of that, what the backend computed for this set of devices (its `allocate` answer):
    /// what an answer carries when the device specs are in a CDI spec already.
    answer: ContainerEdits,
}

impl Admitted {
    pub fn edits(&self) -> &ContainerEdits {
        &self.edits
    }

    pub fn answer(&self) -> &ContainerEdits {
        &self.answer
    }
}

/// The devices an allocation holds: (resource, device ID) pairs.
pub type Held<'a> = [(&'a str, &'a str)];

impl NodeOwners {
    /// The table of `lists`: (backend, resource as its backend last discovered it), with no
    /// decisions.
    pub fn build<'a>(lists: impl IntoIterator<Item = (&'a str, &'a Resource)>) -> NodeOwners {
        Self::build_decided(lists, &Decisions::default())
    }

    /// The table of `lists` under the operator's `decisions`: a node exactly one resource's
    /// `owns` covers (at the path that resource names it by) is that resource's.
    pub(crate) fn build_decided<'a>(
        lists: impl IntoIterator<Item = (&'a str, &'a Resource)>,
        decisions: &Decisions,
    ) -> NodeOwners {
        let mut t = NodeOwners::default();
        for (backend, r) in lists {
            for d in &r.devices {
                let shared = shared(d);
                for n in &d.edits.device_nodes {
                    let owners = t.owners.entry(NodeKey::of(n)).or_default();
                    if !owners.iter().any(|o| o.resource == r.name && o.device == d.id) {
                        owners.push(Owner {
                            backend: backend.to_owned(),
                            resource: r.name.clone(),
                            device: d.id.clone(),
                            path: n.host_path().to_owned(),
                            shared,
                        });
                    }
                }
            }
            for n in &r.common_edits.device_nodes {
                let users = t.common.entry(NodeKey::of(n)).or_default();
                if !users.iter().any(|(b, res, _)| b == backend && *res == r.name) {
                    users.push((backend.to_owned(), r.name.clone(), n.host_path().to_owned()));
                }
            }
        }
        if !decisions.is_empty() {
            let claims = t
                .owners
                .iter()
                .flat_map(|(k, os)| os.iter().map(move |o| (k, (&o.backend, &o.resource, &o.path))))
                .chain(t.common.iter().flat_map(|(k, us)| us.iter().map(move |(b, r, p)| (k, (b, r, p)))));
            let mut by_node: BTreeMap<NodeKey, Vec<(String, String, String)>> = BTreeMap::new();
            for (k, (b, r, p)) in claims {
                if decisions.owns(r, p) {
                    let v = by_node.entry(k.clone()).or_default();
                    if !v.iter().any(|(_, vr, _)| vr == r) {
                        v.push((b.clone(), r.clone(), p.clone()));
                    }
                }
            }
            // Two resources' `owns` covering one node decide nothing: it stays contested.
            t.decided = by_node
                .into_iter()
                .filter(|(_, v)| v.len() == 1)
                .filter_map(|(k, mut v)| Some((k, v.pop()?)))
                .collect();
        }
        t
    }

    /// The devices whose own edits name node `n` (by any of its names).
    pub fn owners(&self, n: &DeviceNode) -> &[Owner] {
        self.owners.get(&NodeKey::of(n)).map_or(&[], Vec::as_slice)
    }

    /// What of `resource` (backend `backend`'s) is contested: each node one of its devices
    /// names that another backend's device names too (unless every device naming it is
    /// shared) or that another backend's resource hands to all its containers; and each node
    /// its common edits hand every container that another backend's device names as its own
    /// (then every device of the resource is refused: each would carry the node).
    pub(crate) fn conflicts(&self, backend: &str, resource: &Resource) -> Vec<Conflict> {
        let mut out: BTreeMap<String, Conflict> = BTreeMap::new();
        let mut add = |n: &DeviceNode, holder: (&str, &str, &str), device: &str, decided: bool| {
            let path = n.host_path();
            let c = out.entry(path.to_owned()).or_insert_with(|| Conflict {
                node: path.to_owned(),
                numbers: n.numbers.map(|x| x.to_string()),
                holder: holder.0.to_owned(),
                holder_backend: holder.1.to_owned(),
                holder_path: holder.2.to_owned(),
                devices: Vec::new(),
                decided,
            });
            if !c.devices.iter().any(|d| d == device) {
                c.devices.push(device.to_owned());
            }
        };
        // A node the config decided: nobody's contest. This side keeps it, or (another
        // backend's resource owning it) its devices naming it are withheld.
        let decided = |n: &DeviceNode| -> Option<Option<(&str, &str, &str)>> {
            let (b, r, p) = self.decided.get(&NodeKey::of(n))?;
            Some((*r != resource.name && b != backend).then_some((r.as_str(), b.as_str(), p.as_str())))
        };
        let mut withheld: Vec<(DeviceNode, (String, String, String), String)> = Vec::new();
        for d in &resource.devices {
            for n in &d.edits.device_nodes {
                if let Some(owner) = decided(n) {
                    if let Some((r, b, p)) = owner {
                        withheld.push((n.clone(), (r.to_owned(), b.to_owned(), p.to_owned()), d.id.clone()));
                    }
                    continue;
                }
                let owners = self.owners(n);
                let all_shared = owners.iter().all(|o| o.shared);
                let rival = owners
                    .iter()
                    .find(|o| o.backend != backend && !all_shared)
                    .map(|o| (o.resource.as_str(), o.backend.as_str(), o.path.as_str()))
                    .or_else(|| {
                        let common = self.common.get(&NodeKey::of(n))?;
                        common.iter().find(|(b, ..)| b != backend).map(|(b, r, p)| (r.as_str(), b.as_str(), p.as_str()))
                    });
                if let Some(holder) = rival {
                    add(n, holder, &d.id, false);
                }
            }
        }
        for n in &resource.common_edits.device_nodes {
            if let Some(owner) = decided(n) {
                if let Some((r, b, p)) = owner {
                    for d in &resource.devices {
                        withheld.push((n.clone(), (r.to_owned(), b.to_owned(), p.to_owned()), d.id.clone()));
                    }
                }
                continue;
            }
            if let Some(o) = self.owners(n).iter().find(|o| o.backend != backend) {
                for d in &resource.devices {
                    add(n, (&o.resource, &o.backend, &o.path), &d.id, false);
                }
            }
        }
        for (n, (r, b, p), device) in &withheld {
            add(n, (r, b, p), device, true);
        }
        out.into_values().collect()
    }

    /// What one container holding devices `ids` of `resource` gets: the resource's common
    /// edits, each device's own and the backend's `answer` for the set, merged as the classic
    /// answer merges them, and checked whole by [`admit`](Self::admit)'s rule.
    pub(crate) fn admit_allocation(
        &self,
        resource: &Resource,
        ids: &[String],
        answer: ContainerEdits,
    ) -> Result<Admitted, Foreign> {
        let mut edits = resource.common_edits.clone();
        for id in ids {
            if let Some(d) = resource.device(id) {
                edits.merge(&d.edits);
            }
        }
        edits.merge(&answer);
        let held: Vec<(&str, &str)> = ids.iter().map(|id| (resource.name.as_str(), id.as_str())).collect();
        self.check(&resource.name, &held, &edits)?;
        Ok(Admitted { edits, answer })
    }

    /// `edits` for an allocation holding `held`, on behalf of `resource` (named in errors): every
    /// node in it is one of `held`'s own or a node no device owns (`/dev/nvidiactl`). Anything
    /// else is another device's (shared or not: sharing lets several devices name one node, it
    /// does not give the node to containers holding none of them), or contested between two
    /// backends, and refused.
    pub(crate) fn admit(&self, resource: &str, held: &Held<'_>, edits: ContainerEdits) -> Result<Admitted, Foreign> {
        self.check(resource, held, &edits)?;
        Ok(Admitted { answer: edits.clone(), edits })
    }

    fn check(&self, resource: &str, held: &Held<'_>, edits: &ContainerEdits) -> Result<(), Foreign> {
        for n in &edits.device_nodes {
            let path = n.host_path();
            let all = self.owners(n);
            // A node the config gave one resource is that resource's devices' alone.
            let decided = self.decided.get(&NodeKey::of(n));
            let owners: Vec<&Owner> = match decided {
                Some((_, r, _)) => all.iter().filter(|o| o.resource == *r).collect(),
                None => all.iter().collect(),
            };
            let holds = |o: &Owner| held.iter().any(|(r, id)| *r == o.resource && *id == o.device);
            let Some(first) = owners.first().copied() else {
                // Decided for a resource handing it to all its containers: theirs, no one else's.
                match (decided, all.first()) {
                    (Some((_, r, _)), Some(o)) if *r != resource && !held.iter().any(|(hr, _)| hr == r) => {
                        return Err(self.foreign(path, o, resource));
                    }
                    _ => continue,
                }
            };
            // Contested between backends: nobody's until the config decides, held or not.
            let contested = decided.is_none()
                && owners.iter().any(|o| o.backend != first.backend)
                && !owners.iter().all(|o| o.shared);
            if !contested && owners.iter().any(|o| holds(o)) {
                continue;
            }
            let o = owners.iter().copied().find(|o| !holds(o)).unwrap_or(first);
            return Err(self.foreign(path, o, resource));
        }
        Ok(())
    }

    fn foreign(&self, path: &str, o: &Owner, resource: &str) -> Foreign {
        let clip = |s: &str| crate::gate::clip(s).into_owned();
        Foreign {
            node: clip(path),
            owner: Box::new(Owner {
                backend: clip(&o.backend),
                resource: clip(&o.resource),
                device: clip(&o.device),
                path: clip(&o.path),
                shared: o.shared,
            }),
            resource: clip(resource),
        }
    }
}

/// `resource` without the devices `conflicts` refuse.
pub fn refuse(resource: &mut Resource, conflicts: &[Conflict]) {
    let refused: BTreeSet<&str> = conflicts.iter().flat_map(|c| c.devices.iter().map(String::as_str)).collect();
    if refused.is_empty() {
        return;
    }
    resource.devices.retain(|d| !refused.contains(d.id.as_str()));
    let ids: BTreeSet<&str> = resource.devices.iter().map(|d| d.id.as_str()).collect();
    resource.described.retain(|id, _| ids.contains(id.as_str()));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{DeviceNode, Health};

    fn node(p: &str) -> DeviceNode {
        DeviceNode { container_path: p.into(), ..Default::default() }
    }

    fn res(name: &str, devices: &[(&str, &str, bool)]) -> Resource {
        Resource {
            name: name.into(),
            devices: devices
                .iter()
                .map(|(id, n, shared)| Device {
                    id: (*id).into(),
                    health: Health::Healthy,
                    numa_nodes: vec![],
                    attributes: if *shared { vec![(SHARED_NODE.into(), "true".into())] } else { vec![] },
                    edits: ContainerEdits { device_nodes: vec![node(n)], ..Default::default() },
                    vetted: Default::default(),
                })
                .collect(),
            ..Default::default()
        }
    }

    fn with_nodes(paths: &[&str]) -> ContainerEdits {
        ContainerEdits { device_nodes: paths.iter().map(|p| node(p)).collect(), ..Default::default() }
    }

    /// Issue 49: the contested node is refused to both sides, whichever backend came first.
    #[test]
    fn a_node_two_backends_name_is_refused_to_both_whatever_the_order() {
        let gpu =
            res("amd.com/gpu", &[("card0", "/dev/dri/renderD128", false), ("card1", "/dev/dri/renderD129", false)]);
        let vendor =
            res("amd.com/mi300x", &[("gpu-0", "/dev/dri/renderD128", false), ("gpu-9", "/dev/dri/renderD200", false)]);
        for order in [[("gpu", &gpu), ("mi300x", &vendor)], [("mi300x", &vendor), ("gpu", &gpu)]] {
            let t = NodeOwners::build(order);
            let theirs = t.conflicts("mi300x", &vendor);
            let ours = t.conflicts("gpu", &gpu);
            assert_eq!(theirs.len(), 1);
            assert_eq!(
                (theirs[0].node.as_str(), theirs[0].holder.as_str(), theirs[0].devices.as_slice()),
                ("/dev/dri/renderD128", "amd.com/gpu", &["gpu-0".to_owned()][..])
            );
            assert_eq!(
                (ours[0].holder.as_str(), ours[0].devices.as_slice()),
                ("amd.com/mi300x", &["card0".to_owned()][..])
            );
            let shown = theirs[0].to_string();
            assert!(shown.contains("amd.com/gpu") && shown.contains("renderD128") && shown.contains("owns"), "{shown}");
            let mut kept = vendor.clone();
            refuse(&mut kept, &theirs);
            assert_eq!(kept.devices.iter().map(|d| d.id.as_str()).collect::<Vec<_>>(), ["gpu-9"]);
        }
        // One backend's own resources are its business (MIG instances name their GPU's node).
        let t = NodeOwners::build([("gpu", &gpu), ("gpu", &vendor)]);
        assert!(t.conflicts("gpu", &vendor).is_empty());
        // Shared only when every side says so.
        let kvm_a = res("a.io/kvm", &[("k", "/dev/kvm", true)]);
        let kvm_b = res("b.io/kvm", &[("k", "/dev/kvm", true)]);
        let kvm_c = res("c.io/kvm", &[("k", "/dev/kvm", false)]);
        assert!(NodeOwners::build([("a", &kvm_a), ("b", &kvm_b)]).conflicts("b", &kvm_b).is_empty());
        let t = NodeOwners::build([("a", &kvm_a), ("c", &kvm_c)]);
        assert_eq!((t.conflicts("a", &kvm_a).len(), t.conflicts("c", &kvm_c).len()), (1, 1));
    }

    /// Issue 58 (1): udev's `/dev/char/195:0` is `/dev/nvidia0`; a second backend naming it
    /// handed the same GPU to a second container. The table keys nodes by their vetted type and
    /// numbers: the second name is contested exactly as the first, both names said, and a
    /// container holding neither device gets it under no name.
    #[test]
    fn a_second_name_of_a_node_is_the_same_node() {
        let numbered = |p: &str, major: u32, minor: u32| DeviceNode {
            container_path: p.into(),
            numbers: Some(NodeNumbers { block: false, major, minor }),
            ..Default::default()
        };
        let mut gpu = res("nvidia.com/gpu", &[("GPU-0", "/dev/nvidia0", false), ("GPU-1", "/dev/nvidia1", false)]);
        gpu.devices[0].edits.device_nodes = vec![numbered("/dev/nvidia0", 195, 0)];
        gpu.devices[1].edits.device_nodes = vec![numbered("/dev/nvidia1", 195, 1)];
        let mut alias = res("acme.com/gpu", &[("a-0", "/dev/char/195:0", false)]);
        alias.devices[0].edits.device_nodes = vec![numbered("/dev/char/195:0", 195, 0)];
        let t = NodeOwners::build([("gpu", &gpu), ("acme", &alias)]);
        let theirs = t.conflicts("acme", &alias);
        assert_eq!(theirs.len(), 1, "{theirs:?}");
        let shown = theirs[0].to_string();
        assert!(
            shown.contains("/dev/char/195:0 (char 195:0)")
                && shown.contains("nvidia.com/gpu")
                && shown.contains("as /dev/nvidia0"),
            "{shown}"
        );
        let ours = t.conflicts("gpu", &gpu);
        assert_eq!(
            (ours.len(), ours[0].holder.as_str(), ours[0].devices.as_slice()),
            (1, "acme.com/gpu", &["GPU-0".to_owned()][..])
        );
        // A container holding GPU-1 cannot get GPU-0 by its other name either.
        let e = t
            .admit(
                "nvidia.com/gpu",
                &[("nvidia.com/gpu", "GPU-1")],
                ContainerEdits { device_nodes: vec![numbered("/dev/char/195:0", 195, 0)], ..Default::default() },
            )
            .unwrap_err();
        assert!(e.to_string().contains("GPU-0") && e.to_string().contains("as /dev/nvidia0"), "{e}");
        // A block device with the same numbers is another node.
        let mut disk = res("acme.com/disk", &[("d-0", "/dev/sda", false)]);
        disk.devices[0].edits.device_nodes = vec![DeviceNode {
            numbers: Some(NodeNumbers { block: true, major: 195, minor: 0 }),
            ..numbered("/dev/sda", 195, 0)
        }];
        assert!(NodeOwners::build([("gpu", &gpu), ("disk", &disk)]).conflicts("disk", &disk).is_empty());
    }

    /// A node one backend's device names while another backend's common edits hand it to every
    /// container is contested too: the device is refused, and so is every device of the
    /// resource whose containers would all get it (a backend putting the GPU backend's
    /// `renderD128` in its common edits gave it to each of its containers).
    #[test]
    fn a_device_node_in_another_backends_common_edits_is_refused_to_both() {
        let mut gpu = res("nvidia.com/gpu", &[("GPU-0", "/dev/nvidia0", false), ("GPU-1", "/dev/nvidia1", false)]);
        gpu.common_edits = with_nodes(&["/dev/nvidiactl"]);
        let mut evil = res("evil.io/x", &[("x-0", "/dev/evil0", false), ("x-1", "/dev/evil1", false)]);
        evil.common_edits = with_nodes(&["/dev/nvidia0"]);
        for order in [[("gpu", &gpu), ("evil", &evil)], [("evil", &evil), ("gpu", &gpu)]] {
            let t = NodeOwners::build(order);
            let theirs = t.conflicts("evil", &evil);
            assert_eq!(theirs.len(), 1);
            assert_eq!((theirs[0].holder.as_str(), theirs[0].devices.len()), ("nvidia.com/gpu", 2));
            let ours = t.conflicts("gpu", &gpu);
            assert_eq!((ours[0].holder.as_str(), ours[0].devices.as_slice()), ("evil.io/x", &["GPU-0".to_owned()][..]));
        }
        // A device claiming the GPU backend's control node: the same, the other way round.
        let grab = res("evil.io/ctl", &[("ctl", "/dev/nvidiactl", false)]);
        let t = NodeOwners::build([("gpu", &gpu), ("evil", &grab)]);
        assert_eq!(t.conflicts("evil", &grab)[0].holder, "nvidia.com/gpu");
        assert_eq!(t.conflicts("gpu", &gpu)[0].devices.len(), 2);
    }

    #[test]
    fn an_allocation_gets_its_own_nodes_and_unowned_ones_never_a_neighbours() {
        let mut gpu = res("nvidia.com/gpu", &[("GPU-0", "/dev/nvidia0", false), ("GPU-1", "/dev/nvidia1", false)]);
        gpu.common_edits = with_nodes(&["/dev/nvidiactl"]);
        let other = res("evil.io/x", &[("x", "/dev/evil0", false)]);
        let t = NodeOwners::build([("gpu", &gpu), ("evil", &other)]);
        let held = [("nvidia.com/gpu", "GPU-0")];
        let ok = t.admit("nvidia.com/gpu", &held, with_nodes(&["/dev/nvidia0", "/dev/nvidiactl"])).unwrap();
        assert_eq!(ok.edits().device_nodes.len(), 2);
        let e = t.admit("nvidia.com/gpu", &held, with_nodes(&["/dev/nvidia1"])).unwrap_err();
        assert_eq!((e.owner.device.as_str(), e.owner.resource.as_str()), ("GPU-1", "nvidia.com/gpu"));
        // Another backend's answer naming the GPU's node: both resources named.
        let e = t.admit("evil.io/x", &[("evil.io/x", "x")], with_nodes(&["/dev/nvidia0"])).unwrap_err();
        let shown = e.to_string();
        assert!(shown.contains("nvidia.com/gpu") && shown.contains("GPU-0"), "{shown}");
        assert_eq!(e.resource, "evil.io/x");
        // Held by the allocation under another resource of the same claim: fine.
        let both = [("evil.io/x", "x"), ("nvidia.com/gpu", "GPU-0")];
        assert!(t.admit("claim", &both, with_nodes(&["/dev/nvidia0", "/dev/evil0"])).is_ok());
    }

    /// Shared devices share a node among themselves, not with containers holding none of them;
    /// and a contested node is refused even to a holder, whichever side it is.
    #[test]
    fn shared_and_contested_nodes_at_the_writer() {
        let kvm = res("devplug.io/kvm", &[("kvm-0", "/dev/kvm", true), ("kvm-1", "/dev/kvm", true)]);
        let vm = res("acme.io/vm", &[("vm-0", "/dev/acme0", false)]);
        let t = NodeOwners::build([("generic", &kvm), ("acme", &vm)]);
        assert!(t.admit("devplug.io/kvm", &[("devplug.io/kvm", "kvm-1")], with_nodes(&["/dev/kvm"])).is_ok());
        assert!(t.admit("acme.io/vm", &[("acme.io/vm", "vm-0")], with_nodes(&["/dev/kvm"])).is_err());
        let a = res("a.io/gpu", &[("g", "/dev/dri/renderD128", false)]);
        let b = res("b.io/gpu", &[("h", "/dev/dri/renderD128", false)]);
        let t = NodeOwners::build([("a", &a), ("b", &b)]);
        let e = t.admit("a.io/gpu", &[("a.io/gpu", "g")], with_nodes(&["/dev/dri/renderD128"])).unwrap_err();
        assert_eq!(e.owner.resource, "b.io/gpu");
        assert!(t.admit("b.io/gpu", &[("b.io/gpu", "h")], with_nodes(&["/dev/dri/renderD128"])).is_err());
    }
}
