//! A backend's answers, in the WIT types unchanged since 0.1.0 ([`super::wit`]), turned into the
//! host's own [`crate::model`]. Shared by every version whose `types` interface is 0.1.0's.

use super::wit::{BackendError, ContainerEdits, Health, Info, Resource};
use crate::model;

pub(crate) fn backend_error(e: BackendError) -> String {
    match e {
        BackendError::InvalidConfig(s) => format!("invalid config: {s}"),
        BackendError::UnknownDevice(s) => format!("unknown device: {s}"),
        BackendError::UnknownResource(s) => format!("unknown resource: {s}"),
        BackendError::Host(e) => format!("host call failed: {e:?}"),
        BackendError::Unsupported => "unsupported".into(),
        BackendError::Other(s) => s,
    }
}

/// A backend's edits as the host's model: env entries pass the env gate here (its types are the
/// only ones a container's environment holds); the first it refuses is kept for `vet`, which
/// refuses the answer with it.
pub fn edits(e: ContainerEdits) -> model::ContainerEdits {
    let (env, malformed) = model::gated_env(e.env);
    model::ContainerEdits {
        device_nodes: e
            .device_nodes
            .into_iter()
            .map(|n| model::DeviceNode {
                container_path: n.container_path,
                host_path: n.host_path,
                permissions: n.permissions,
                numbers: None,
            })
            .collect(),
        mounts: e
            .mounts
            .into_iter()
            .map(|m| model::Mount { container_path: m.container_path, host_path: m.host_path, read_only: m.read_only })
            .collect(),
        env,
        annotations: e.annotations,
        malformed,
    }
}

pub fn resource(r: Resource) -> model::Resource {
    model::Resource {
        name: r.name,
        devices: r
            .devices
            .into_iter()
            .map(|d| model::Device {
                id: d.id,
                health: match d.health {
                    Health::Healthy => model::Health::Healthy,
                    Health::Unhealthy => model::Health::Unhealthy,
                },
                numa_nodes: d.numa_nodes,
                attributes: d.attributes,
                edits: edits(d.edits),
                vetted: Default::default(),
            })
            .collect(),
        common_edits: edits(r.common_edits),
        ..Default::default()
    }
}

pub fn info(i: Info) -> model::BackendInfo {
    model::BackendInfo {
        name: i.name,
        version: i.version,
        resources: i
            .resources
            .into_iter()
            .map(|r| {
                let opts = model::ResourceOptions {
                    preferred_allocation: r.preferred_allocation,
                    pre_start_required: r.pre_start_required,
                };
                (r.name, opts)
            })
            .collect(),
    }
}
