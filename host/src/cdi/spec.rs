//! A CDI spec (`SPEC.md` of cncf-tags/container-device-interface) built from one resource's
//! device list, stamped with the lowest `cdiVersion` that covers what it uses: runtimes in the
//! field (podman 4.3 reads up to 0.5.0) refuse a spec whose version they do not know, even when
//! nothing in it needs the newer version.

use serde::{Deserialize, Serialize};

use super::names::{ALL, Kind, Naming};
use crate::model::nodes::Admitted;
use crate::model::{self, ContainerEdits, Resource};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Spec {
    pub cdi_version: String,
    pub kind: String,
    pub devices: Vec<SpecDevice>,
    #[serde(default, skip_serializing_if = "Edits::is_empty")]
    pub container_edits: Edits,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SpecDevice {
    pub name: String,
    pub container_edits: Edits,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Edits {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<Node>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
}

impl Edits {
    pub fn is_empty(&self) -> bool {
        self.env.is_empty() && self.device_nodes.is_empty() && self.mounts.is_empty()
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Node {
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Mount {
    pub host_path: String,
    pub container_path: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

/// The spec for `resource`: one CDI device per device, or per name its backend gave (see
/// [`Naming`]; all devices, healthy or not: a container already running with a device that
/// turned unhealthy must still restart), the resource's common edits at spec level. Device node types and numbers are the ones the host
/// read when it checked the node against the backend's grants; a node without them (none
/// reach here from a backend) is left for the runtime to stat.
pub fn build(resource: &Resource, kind: &Kind) -> Spec {
    let mut spec = Spec {
        cdi_version: String::new(),
        kind: kind.kind(),
        devices: naming_entries(resource),
        container_edits: edits(&resource.common_edits),
    };
    spec.cdi_version = min_version(&spec).to_owned();
    spec
}

/// A DRA claim's spec: one CDI device per allocated device (each `(name, its own edits)`, the
/// name past the CDI name gate), and
/// at spec level what every container of the claim gets (the resources' common edits and the
/// backend's answer). Each part comes past the node gate ([`Admitted`]), the only way here.
pub(crate) fn build_claim(kind: &Kind, devices: &[(crate::gate::CdiName, Admitted)], common: &Admitted) -> Spec {
    let mut spec = Spec {
        cdi_version: String::new(),
        kind: kind.kind(),
        devices: devices
            .iter()
            .map(|(name, e)| SpecDevice { name: name.as_str().to_owned(), container_edits: edits(e.edits()) })
            .collect(),
        container_edits: edits(common.edits()),
    };
    spec.cdi_version = min_version(&spec).to_owned();
    spec
}

fn naming_entries(resource: &Resource) -> Vec<SpecDevice> {
    let naming = Naming::of(resource);
    let mut out: Vec<SpecDevice> = naming
        .entries
        .iter()
        .map(|(name, d)| SpecDevice { name: name.clone(), container_edits: edits(&d.edits) })
        .collect();
    if naming.all {
        let mut every = ContainerEdits::default();
        for d in &resource.devices {
            every.merge(&d.edits);
        }
        out.push(SpecDevice { name: ALL.to_owned(), container_edits: edits(&every) });
    }
    out
}

fn edits(e: &ContainerEdits) -> Edits {
    Edits {
        env: e.env.iter().map(|(k, v)| format!("{}={}", k.as_str(), v.as_str())).collect(),
        device_nodes: e.device_nodes.iter().map(node).collect(),
        mounts: e.mounts.iter().map(mount).collect(),
    }
}

fn node(n: &model::DeviceNode) -> Node {
    let host = n.host_path();
    let (kind, major, minor) = match n.numbers {
        Some(s) => (Some(if s.block { "b" } else { "c" }), Some(i64::from(s.major)), Some(i64::from(s.minor))),
        None => (None, None, None),
    };
    Node {
        path: n.container_path.clone(),
        host_path: (host != n.container_path).then(|| host.to_owned()),
        kind: kind.map(str::to_owned),
        major,
        minor,
        permissions: Some(n.permissions().to_owned()),
    }
}

/// A bind mount; options rather than `type: bind`, since `type` needs cdiVersion 0.4.0.
fn mount(m: &model::Mount) -> Mount {
    let mode = if m.read_only { "ro" } else { "rw" };
    Mount {
        host_path: m.host_path.clone(),
        container_path: m.container_path.clone(),
        options: [mode, "nosuid", "nodev", "rbind"].map(str::to_owned).to_vec(),
        kind: None,
    }
}

/// The lowest CDI version whose schema covers everything `spec` uses (the rules of
/// `specs-go/version.go`): 0.4.0 for a mount `type`, 0.5.0 for a device name not starting
/// with a letter or a node `hostPath`, 0.6.0 for a dot in the class. Annotations (also 0.6.0)
/// are never written.
pub(crate) fn min_version(spec: &Spec) -> &'static str {
    let all_edits = || spec.devices.iter().map(|d| &d.container_edits).chain([&spec.container_edits]);
    let class_has_dot = spec.kind.split_once('/').is_some_and(|(_, c)| c.contains('.'));
    let name_not_letter = spec.devices.iter().any(|d| !d.name.chars().next().is_some_and(|c| c.is_ascii_alphabetic()));
    let host_path = all_edits().any(|e| e.device_nodes.iter().any(|n| n.host_path.is_some()));
    let mount_type = all_edits().any(|e| e.mounts.iter().any(|m| m.kind.is_some()));
    if class_has_dot {
        "0.6.0"
    } else if name_not_letter || host_path {
        "0.5.0"
    } else if mount_type {
        "0.4.0"
    } else {
        "0.3.0"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Device, DeviceNode, Health, NodeNumbers};

    fn res(name: &str, ids: &[&str]) -> Resource {
        Resource {
            name: name.into(),
            devices: ids
                .iter()
                .map(|id| Device {
                    id: (*id).into(),
                    vetted: Default::default(),
                    health: Health::Healthy,
                    numa_nodes: vec![],
                    attributes: vec![],
                    edits: ContainerEdits {
                        device_nodes: vec![DeviceNode {
                            container_path: "/dev/kvm".into(),
                            numbers: Some(NodeNumbers { block: false, major: 10, minor: 232 }),
                            ..Default::default()
                        }],
                        ..Default::default()
                    },
                })
                .collect(),
            common_edits: ContainerEdits::default(),
            ..Default::default()
        }
    }

    #[test]
    fn nodes_get_type_and_numbers_and_the_version_is_the_lowest_that_fits() {
        let kind = Kind::for_resource("devplug.io/kvm").unwrap();
        let s = build(&res("devplug.io/kvm", &["kvm-0"]), &kind);
        assert_eq!(s.cdi_version, "0.3.0");
        let n = &s.devices[0].container_edits.device_nodes[0];
        assert_eq!((n.kind.as_deref(), n.major, n.minor, n.host_path.as_ref()), (Some("c"), Some(10), Some(232), None));
        assert_eq!(build(&res("devplug.io/kvm", &["0000:17:00.0"]), &kind).cdi_version, "0.5.0");
        let dotted = Kind::for_resource("xilinx.com/fpga-u250.1").unwrap();
        assert_eq!(build(&res("xilinx.com/fpga-u250.1", &["a"]), &dotted).cdi_version, "0.6.0");
        let mut moved = res("devplug.io/kvm", &["kvm-0"]);
        moved.devices[0].edits.device_nodes[0].host_path = "/dev/kvm".into();
        moved.devices[0].edits.device_nodes[0].container_path = "/dev/kvm2".into();
        assert_eq!(build(&moved, &kind).cdi_version, "0.5.0");
    }
}
