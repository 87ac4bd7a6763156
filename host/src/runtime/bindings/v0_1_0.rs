//! Bindings for `devplug:backend@0.1.0` (`wit/since_v0.1.0`, frozen): the host side of the
//! `sysfs`, `devfs` and `log` imports, and conversions of the exports into [`crate::model`].

use wasmtime::Store;
use wasmtime::component::{HasSelf, Linker};

use super::GuestResult;
use crate::model;
use crate::runtime::caps;
use crate::runtime::state::HostState;

wasmtime::component::bindgen!({
    path: "../wit/since_v0.1.0",
    world: "devplug-backend",
});

use self::devplug::backend::devfs::{Node, NodeKind};
use self::devplug::backend::types::{BackendError, FsError};
use exports::devplug::backend::backend as guest;

/// Entries a single `devfs.glob` may walk over.
const MAX_GLOB_ENTRIES: usize = 20_000;

pub fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    DevplugBackend::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)
}

fn fs_error(e: caps::FsError) -> FsError {
    match e {
        caps::FsError::NotFound => FsError::NotFound,
        caps::FsError::Denied(s) => FsError::Denied(s),
        caps::FsError::InvalidPath(s) => FsError::InvalidPath(s),
        caps::FsError::Io(s) => FsError::Io(s),
    }
}

impl HostState {
    /// Run a capability call, logging a refusal once per path.
    fn checked<T>(&self, call: &str, path: &str, r: Result<T, caps::FsError>) -> Result<T, FsError> {
        if let Err(e @ (caps::FsError::Denied(_) | caps::FsError::InvalidPath(_))) = &r {
            self.sandbox.refusals.refused(&self.sandbox.backend, call, path, e);
        }
        r.map_err(fs_error)
    }

    fn stat_node(&self, path: &str) -> Result<Node, caps::FsError> {
        let st = self.sandbox.dev.stat_node(path)?;
        let kind = match st.kind {
            caps::NodeType::Char => NodeKind::Character,
            caps::NodeType::Block => NodeKind::Block,
            caps::NodeType::Directory => NodeKind::Directory,
            caps::NodeType::Other => NodeKind::Other,
        };
        Ok(Node { path: path.to_owned(), kind, major: st.major, minor: st.minor })
    }
}

impl self::devplug::backend::types::Host for HostState {}

impl self::devplug::backend::sysfs::Host for HostState {
    fn read(&mut self, path: String) -> Result<String, FsError> {
        let r = self.sandbox.sysfs.read(&path);
        self.checked("sysfs.read", &path, r)
    }

    fn list_dir(&mut self, path: String) -> Result<Vec<String>, FsError> {
        let r = self.sandbox.sysfs.list(&path);
        self.checked("sysfs.list-dir", &path, r)
    }

    fn read_link(&mut self, path: String) -> Result<String, FsError> {
        let r = self.sandbox.sysfs.read_link(&path);
        self.checked("sysfs.read-link", &path, r)
    }

    fn canonical(&mut self, path: String) -> Result<String, FsError> {
        let r = self.sandbox.sysfs.resolve(&path, true).map(|r| r.canonical);
        self.checked("sysfs.canonical", &path, r)
    }
}

impl self::devplug::backend::devfs::Host for HostState {
    fn stat(&mut self, path: String) -> Result<Node, FsError> {
        let r = self.stat_node(&path);
        self.checked("devfs.stat", &path, r)
    }

    fn glob(&mut self, pattern: String) -> Result<Vec<Node>, FsError> {
        let paths = self.sandbox.dev.glob(&pattern, MAX_GLOB_ENTRIES);
        let paths = self.checked("devfs.glob", &pattern, paths)?;
        // An entry that matched but resolves somewhere ungranted is left out (and logged once).
        Ok(paths
            .iter()
            .filter_map(|p| {
                let r = self.stat_node(p);
                self.checked("devfs.glob", p, r).ok()
            })
            .collect())
    }
}

impl self::devplug::backend::log::Host for HostState {
    fn log(&mut self, level: self::devplug::backend::log::Level, message: String) {
        use self::devplug::backend::log::Level;
        let backend = &*self.sandbox.backend;
        // Guest text is bounded so a backend cannot write megabyte log lines.
        let message: String = message.chars().take(4096).collect();
        match level {
            Level::Trace => tracing::trace!(backend, "{message}"),
            Level::Debug => tracing::debug!(backend, "{message}"),
            Level::Info => tracing::info!(backend, "{message}"),
            Level::Warn => tracing::warn!(backend, "{message}"),
            Level::Error => tracing::error!(backend, "{message}"),
        }
    }
}

fn backend_error(e: BackendError) -> String {
    match e {
        BackendError::InvalidConfig(s) => format!("invalid config: {s}"),
        BackendError::UnknownDevice(s) => format!("unknown device: {s}"),
        BackendError::UnknownResource(s) => format!("unknown resource: {s}"),
        BackendError::Host(e) => format!("host call failed: {e:?}"),
        BackendError::Unsupported => "unsupported".into(),
        BackendError::Other(s) => s,
    }
}

fn edits(e: self::devplug::backend::types::ContainerEdits) -> model::ContainerEdits {
    model::ContainerEdits {
        device_nodes: e
            .device_nodes
            .into_iter()
            .map(|n| model::DeviceNode {
                container_path: n.container_path,
                host_path: n.host_path,
                permissions: n.permissions,
            })
            .collect(),
        mounts: e
            .mounts
            .into_iter()
            .map(|m| model::Mount { container_path: m.container_path, host_path: m.host_path, read_only: m.read_only })
            .collect(),
        env: e.env,
        annotations: e.annotations,
    }
}

fn resource(r: self::devplug::backend::types::Resource) -> model::Resource {
    use self::devplug::backend::types::Health;
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
            })
            .collect(),
        common_edits: edits(r.common_edits),
    }
}

pub fn init(
    b: &DevplugBackend,
    store: &mut Store<HostState>,
    config: &str,
) -> wasmtime::Result<GuestResult<model::BackendInfo>> {
    Ok(b.devplug_backend_backend().call_init(store, config)?.map_err(backend_error).map(|i| model::BackendInfo {
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
    }))
}

pub fn discover(
    b: &DevplugBackend,
    store: &mut Store<HostState>,
) -> wasmtime::Result<GuestResult<Vec<model::Resource>>> {
    Ok(b.devplug_backend_backend()
        .call_discover(store)?
        .map_err(backend_error)
        .map(|rs| rs.into_iter().map(resource).collect()))
}

pub fn preferred_allocation(
    b: &DevplugBackend,
    store: &mut Store<HostState>,
    res: &str,
    available: &[String],
    must_include: &[String],
    size: u32,
) -> wasmtime::Result<GuestResult<Vec<String>>> {
    let g: &guest::Guest = b.devplug_backend_backend();
    Ok(g.call_preferred_allocation(store, res, available, must_include, size)?.map_err(backend_error))
}

pub fn allocate(
    b: &DevplugBackend,
    store: &mut Store<HostState>,
    res: &str,
    ids: &[String],
) -> wasmtime::Result<GuestResult<model::ContainerEdits>> {
    Ok(b.devplug_backend_backend().call_allocate(store, res, ids)?.map_err(backend_error).map(edits))
}

pub fn pre_start(
    b: &DevplugBackend,
    store: &mut Store<HostState>,
    res: &str,
    ids: &[String],
) -> wasmtime::Result<GuestResult<()>> {
    Ok(b.devplug_backend_backend().call_pre_start(store, res, ids)?.map_err(backend_error))
}
