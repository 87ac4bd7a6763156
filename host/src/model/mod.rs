//! The device model: the one set of types between the Wasm runtime and the kubelet layer.

pub mod calls;
pub mod contest;
pub mod dra;
pub mod names;
pub mod nodes;
pub mod owns;
pub mod port;

use std::collections::BTreeMap;

pub use crate::gate::{EnvKey, EnvValue};

/// `(key, value)` for a container's environment, from text the host itself wrote (tests, the
/// host's own defaults); `None` where the env gate refuses it.
pub fn env_entry(key: &str, value: &str) -> Option<(EnvKey, EnvValue)> {
    Some((EnvKey::new(key).ok()?, EnvValue::new(value).ok()?))
}

/// An answer's env entries past the env gate, and why the first one it refused was refused.
pub(crate) fn gated_env(
    entries: impl IntoIterator<Item = (String, String)>,
) -> (Vec<(EnvKey, EnvValue)>, Option<String>) {
    let mut malformed = None;
    let mut env = Vec::new();
    for (k, v) in entries {
        match (EnvKey::new(&k), EnvValue::new(&v)) {
            (Ok(k), Ok(v)) => env.push((k, v)),
            (Err(why), _) => {
                malformed.get_or_insert_with(|| why.to_string());
            }
            (_, Err(why)) => {
                malformed.get_or_insert_with(|| format!("env {}: {why}", crate::gate::clip(&k)));
            }
        }
    }
    (env, malformed)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Health {
    Healthy,
    Unhealthy,
}

impl Health {
    /// The exact strings kubelet understands in `Device.health`.
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Healthy => "Healthy",
            Health::Unhealthy => "Unhealthy",
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct DeviceNode {
    pub container_path: String,
    /// Empty means the same as `container_path`.
    pub host_path: String,
    pub permissions: String,
    /// The host node's type and numbers, read when the host checked the node against the
    /// backend's grants (`None` until then); CDI specs are written from these.
    #[serde(skip)]
    pub numbers: Option<NodeNumbers>,
}

/// A device node's type and numbers: what the kernel (and a container's device cgroup) knows a
/// node by, whatever path names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeNumbers {
    pub block: bool,
    pub major: u32,
    pub minor: u32,
}

impl std::fmt::Display for NodeNumbers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}:{}", if self.block { "block" } else { "char" }, self.major, self.minor)
    }
}

impl DeviceNode {
    pub fn host_path(&self) -> &str {
        if self.host_path.is_empty() { &self.container_path } else { &self.host_path }
    }
    pub fn permissions(&self) -> &str {
        if self.permissions.is_empty() { "rw" } else { &self.permissions }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Mount {
    pub container_path: String,
    pub host_path: String,
    pub read_only: bool,
}

/// What a container needs: device nodes, mounts, env, annotations (a CDI `containerEdits`).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ContainerEdits {
    pub device_nodes: Vec<DeviceNode>,
    pub mounts: Vec<Mount>,
    /// Only what the env gate admitted reaches a container: its key and value types.
    pub env: Vec<(EnvKey, EnvValue)>,
    pub annotations: Vec<(String, String)>,
    /// Why the env gate refused an entry of the backend's answer when it was read (a key that
    /// is not a plain name, a value with NUL): the answer is refused for it where it is vetted.
    #[serde(skip)]
    pub malformed: Option<String>,
}

impl ContainerEdits {
    /// Edits holding `entries` as a backend's answer would (see [`gated_env`]).
    pub fn with_env(entries: impl IntoIterator<Item = (String, String)>) -> ContainerEdits {
        let (env, malformed) = gated_env(entries);
        ContainerEdits { env, malformed, ..Default::default() }
    }

    /// Append `other`, skipping device nodes and mounts already present (two devices of a
    /// resource often share a control node) and letting later env/annotation values win.
    pub fn merge(&mut self, other: &ContainerEdits) {
        for n in &other.device_nodes {
            if !self.device_nodes.iter().any(|m| m.container_path == n.container_path) {
                self.device_nodes.push(n.clone());
            }
        }
        for m in &other.mounts {
            if !self.mounts.iter().any(|x| x.container_path == m.container_path) {
                self.mounts.push(m.clone());
            }
        }
        for (k, v) in &other.env {
            upsert(&mut self.env, k, v);
        }
        for (k, v) in &other.annotations {
            upsert(&mut self.annotations, k, v);
        }
        if self.malformed.is_none() {
            self.malformed.clone_from(&other.malformed);
        }
    }
}

fn upsert<K: PartialEq + Clone, V: Clone>(list: &mut Vec<(K, V)>, k: &K, v: &V) {
    match list.iter_mut().find(|(key, _)| key == k) {
        Some(entry) => entry.1 = v.clone(),
        None => list.push((k.clone(), v.clone())),
    }
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Device {
    pub id: String,
    pub health: Health,
    pub numa_nodes: Vec<u32>,
    pub attributes: Vec<(String, String)>,
    pub edits: ContainerEdits,
    /// What the host's gates made of the attributes it derives from (set by `runtime::vet` from
    /// the backend's grants; a backend cannot write it). Shown by `discover` and `/status` when
    /// not empty.
    #[serde(skip_serializing_if = "Vetted::is_empty")]
    pub vetted: Vetted,
}

/// A device's attributes the host publishes derived values of, each past its destination's gate.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Vetted {
    /// The `pci` attribute: granted to the backend and present in sysfs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pci: Option<crate::gate::PciAddress>,
    /// The `netdev` attribute: a valid kernel interface name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub netdev: Option<crate::gate::IfName>,
}

impl Vetted {
    pub fn is_empty(&self) -> bool {
        self.pci.is_none() && self.netdev.is_none()
    }
}

/// The attribute a device declares that its nodes may also be handed out by another backend's
/// resource (every device naming the node must declare it: [`nodes`]).
pub(crate) const SHARED_NODE: &str = "shared-node";

/// The attribute a backend sets on a device it lists for DRA only (the SDK's `Device::dra_only`).
pub(crate) const DRA_ONLY: &str = "dra-only";

impl Device {
    /// Whether the backend listed this device for DRA only: the Device Plugin API never sees it.
    pub fn dra_only(&self) -> bool {
        self.attributes.iter().any(|(k, v)| k == DRA_ONLY && v == "true")
    }
}

/// Per-resource options announced to kubelet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ResourceOptions {
    pub preferred_allocation: bool,
    pub pre_start_required: bool,
}

/// One extended resource as a backend last reported it.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Resource {
    pub name: String,
    pub devices: Vec<Device>,
    pub common_edits: ContainerEdits,
    /// What a WIT 0.3.0 backend's `describe` said of these devices, by device ID (empty for
    /// older backends): what DRA publishes beyond the attributes above.
    pub described: BTreeMap<String, dra::Described>,
    /// The counter sets these devices draw from (`described[..].consumes` names them).
    pub counter_sets: Vec<dra::CounterSet>,
}

impl Resource {
    pub fn device(&self, id: &str) -> Option<&Device> {
        self.devices.iter().find(|d| d.id == id)
    }

    /// What kubelet sees of this resource: ID → (health, NUMA nodes). Used to decide whether a
    /// new discover result is worth a ListAndWatch update.
    pub(crate) fn kubelet_view(&self) -> BTreeMap<&str, (Health, &[u32])> {
        self.devices.iter().map(|d| (d.id.as_str(), (d.health, d.numa_nodes.as_slice()))).collect()
    }
}

/// What a backend says about itself at `init`.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct BackendInfo {
    pub name: String,
    pub version: String,
    pub resources: Vec<(String, ResourceOptions)>,
}

/// Kubelet's limit on device ID length.
pub(crate) const MAX_DEVICE_ID: usize = 63;

/// Why a device ID from a backend cannot go to kubelet, if it cannot.
pub(crate) fn device_id_problem(id: &str) -> Option<String> {
    if id.is_empty() {
        return Some("empty device ID".into());
    }
    if id.len() > MAX_DEVICE_ID {
        return Some(format!("device ID {id:?} is longer than {MAX_DEVICE_ID} characters"));
    }
    if let Some(c) = id.chars().find(|c| !(c.is_ascii_alphanumeric() || "._-:".contains(*c))) {
        return Some(format!("device ID {id:?} contains {c:?}; use [A-Za-z0-9._:-]"));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_dedups_nodes_and_lets_later_env_win() {
        let node = |p: &str| DeviceNode { container_path: p.into(), ..Default::default() };
        let mut a = ContainerEdits {
            device_nodes: vec![node("/dev/nvidiactl"), node("/dev/nvidia0")],
            env: vec![env_entry("A", "1").unwrap()],
            ..Default::default()
        };
        let b = ContainerEdits {
            device_nodes: vec![node("/dev/nvidiactl"), node("/dev/nvidia1")],
            env: vec![env_entry("A", "2").unwrap(), env_entry("B", "3").unwrap()],
            ..Default::default()
        };
        a.merge(&b);
        let paths: Vec<_> = a.device_nodes.iter().map(|n| n.container_path.as_str()).collect();
        assert_eq!(paths, ["/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia1"]);
        assert_eq!(a.env, vec![env_entry("A", "2").unwrap(), env_entry("B", "3").unwrap()]);
    }

    #[test]
    fn device_ids_are_checked_against_kubelet_rules() {
        assert_eq!(device_id_problem("0000:17:00.0"), None);
        assert!(device_id_problem("").is_some());
        assert!(device_id_problem(&"x".repeat(64)).unwrap().contains("63"));
        assert!(device_id_problem("a/b").unwrap().contains("'/'"));
        assert_eq!(device_id_problem(&"x".repeat(63)), None);
    }
}
