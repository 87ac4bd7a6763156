//! Small constructors for [`ContainerEdits`], so backends read as what they hand a container.

use crate::{ContainerEdits, DeviceNode, Mount};

/// No edits.
pub fn empty() -> ContainerEdits {
    ContainerEdits { device_nodes: Vec::new(), mounts: Vec::new(), env: Vec::new(), annotations: Vec::new() }
}

/// A device node at the same path in the container as on the host (`path` is relative to `/dev`
/// or absolute), read-write.
pub fn dev_node(path: &str) -> DeviceNode {
    let abs = if path.starts_with('/') { path.to_owned() } else { format!("/dev/{path}") };
    DeviceNode { container_path: abs, host_path: String::new(), permissions: "rw".into() }
}

/// Edits with just these device nodes.
pub fn nodes<'a>(paths: impl IntoIterator<Item = &'a str>) -> ContainerEdits {
    ContainerEdits { device_nodes: paths.into_iter().map(dev_node).collect(), ..empty() }
}

/// Edits with one environment variable.
pub fn env(key: &str, value: &str) -> ContainerEdits {
    ContainerEdits { env: vec![(key.to_owned(), value.to_owned())], ..empty() }
}

/// A read-only bind mount at the same path.
pub fn ro_mount(path: &str) -> Mount {
    Mount { container_path: path.to_owned(), host_path: path.to_owned(), read_only: true }
}

/// Append `more` to `into`.
pub fn merge(into: &mut ContainerEdits, more: ContainerEdits) {
    into.device_nodes.extend(more.device_nodes);
    into.mounts.extend(more.mounts);
    into.env.extend(more.env);
    into.annotations.extend(more.annotations);
}
