//! Bindings for `devplug:backend@0.1.0` (`wit/since_v0.1.0`, frozen): the host side of the
//! `sysfs`, `devfs` and `log` imports, and conversions of the exports into [`crate::model`].

use wasmtime::Store;
use wasmtime::component::{HasSelf, Linker};

use super::GuestResult;
use crate::model;
use crate::runtime::jail;
use crate::runtime::state::{HostState, Sandbox};
use crate::untrusted::clip;

wasmtime::component::bindgen!({
    path: "../wit/since_v0.1.0",
    world: "devplug-backend",
    // Async, so that a call blocked in a host function (a WASI sleep) can be cut off at its
    // deadline by dropping the future; trappable, so a host import that fails inside the host
    // traps this backend instead of taking the host down.
    imports: { default: async | trappable },
    exports: { default: async },
});

use self::devplug::backend::devfs::{Node, NodeKind};
use self::devplug::backend::types::{BackendError, FsError};
use exports::devplug::backend::backend as guest;

/// Directory entries a single `devfs.glob` may look at.
const GLOB_BUDGET: usize = 100_000;
/// Nodes a single `devfs.glob` may return.
const MAX_GLOB_RESULTS: usize = 4096;

pub fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    DevplugBackend::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)
}

fn fs_error(e: jail::FsError) -> FsError {
    match e {
        jail::FsError::NotFound => FsError::NotFound,
        jail::FsError::Denied(s) => FsError::Denied(clip(&s).into_owned()),
        jail::FsError::InvalidPath(s) => FsError::InvalidPath(clip(&s).into_owned()),
        jail::FsError::Io(s) => FsError::Io(clip(&s).into_owned()),
    }
}

impl HostState {
    /// Run a capability call: a refusal is logged once per path, and a panic inside the host
    /// (a devplug bug a backend found) becomes a trap of this backend, counted as its fault,
    /// instead of unwinding through wasmtime.
    fn checked<T>(
        &self,
        call: &str,
        path: &str,
        f: impl FnOnce(&HostState) -> Result<T, jail::FsError>,
    ) -> wasmtime::Result<Result<T, FsError>> {
        let r = host_call(&self.sandbox, call, || f(self))?;
        if let Err(e @ (jail::FsError::Denied(_) | jail::FsError::InvalidPath(_))) = &r {
            self.sandbox.refusals.refused(&self.sandbox, call, path, e);
        }
        Ok(r.map_err(fs_error))
    }

    fn stat_node(&self, path: &str) -> Result<Node, jail::FsError> {
        let st = self.sandbox.dev.stat_node(path)?;
        let kind = match st.kind {
            jail::NodeType::Char => NodeKind::Character,
            jail::NodeType::Block => NodeKind::Block,
            jail::NodeType::Directory => NodeKind::Directory,
            jail::NodeType::Other => NodeKind::Other,
        };
        Ok(Node { path: path.to_owned(), kind, major: st.major, minor: st.minor })
    }
}

/// `f`, with a panic turned into an error that traps the calling backend.
fn host_call<T>(sandbox: &Sandbox, call: &str, f: impl FnOnce() -> T) -> wasmtime::Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".into());
        tracing::error!(backend = &*sandbox.backend, call, "host call panicked: {}", clip(&what));
        wasmtime::Error::msg(format!("host call {call} failed inside the host: {}", clip(&what)))
    })
}

impl self::devplug::backend::types::Host for HostState {}

impl self::devplug::backend::sysfs::Host for HostState {
    async fn read(&mut self, path: String) -> wasmtime::Result<Result<String, FsError>> {
        self.checked("sysfs.read", &path, |s| s.sandbox.sysfs.read(&path))
    }

    async fn list_dir(&mut self, path: String) -> wasmtime::Result<Result<Vec<String>, FsError>> {
        self.checked("sysfs.list-dir", &path, |s| s.sandbox.sysfs.list(&path))
    }

    async fn read_link(&mut self, path: String) -> wasmtime::Result<Result<String, FsError>> {
        self.checked("sysfs.read-link", &path, |s| s.sandbox.sysfs.read_link(&path))
    }

    async fn canonical(&mut self, path: String) -> wasmtime::Result<Result<String, FsError>> {
        self.checked("sysfs.canonical", &path, |s| s.sandbox.sysfs.resolve(&path, true).map(|r| r.canonical))
    }
}

impl self::devplug::backend::devfs::Host for HostState {
    async fn stat(&mut self, path: String) -> wasmtime::Result<Result<Node, FsError>> {
        self.checked("devfs.stat", &path, |s| s.stat_node(&path))
    }

    async fn glob(&mut self, pattern: String) -> wasmtime::Result<Result<Vec<Node>, FsError>> {
        let paths = match self.checked("devfs.glob", &pattern, |s| s.sandbox.dev.glob(&pattern, GLOB_BUDGET))? {
            Ok(p) => p,
            Err(e) => return Ok(Err(e)),
        };
        if paths.len() > MAX_GLOB_RESULTS {
            return Ok(Err(FsError::Io(format!("the pattern matches more than {MAX_GLOB_RESULTS} nodes"))));
        }
        // An entry that matched but resolves somewhere ungranted is left out (and logged once).
        let mut nodes = Vec::with_capacity(paths.len());
        for p in &paths {
            if let Ok(n) = self.checked("devfs.glob", p, |s| s.stat_node(p))? {
                nodes.push(n);
            }
        }
        Ok(Ok(nodes))
    }
}

/// Characters of one guest log message kept.
const MAX_LOG_MESSAGE: usize = 1024;

impl self::devplug::backend::log::Host for HostState {
    async fn log(&mut self, level: self::devplug::backend::log::Level, message: String) -> wasmtime::Result<()> {
        use self::devplug::backend::log::Level;
        let backend = &*self.sandbox.backend;
        if !self.sandbox.log.admit(backend) {
            return Ok(());
        }
        let message = crate::untrusted::clip_to(&message, MAX_LOG_MESSAGE);
        match level {
            Level::Trace => tracing::trace!(backend, "{message}"),
            Level::Debug => tracing::debug!(backend, "{message}"),
            Level::Info => tracing::info!(backend, "{message}"),
            Level::Warn => tracing::warn!(backend, "{message}"),
            Level::Error => tracing::error!(backend, "{message}"),
        }
        Ok(())
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
                numbers: None,
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

pub async fn init(
    b: &DevplugBackend,
    store: &mut Store<HostState>,
    config: &str,
) -> wasmtime::Result<GuestResult<model::BackendInfo>> {
    Ok(b.devplug_backend_backend().call_init(store, config).await?.map_err(backend_error).map(|i| model::BackendInfo {
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

pub async fn discover(
    b: &DevplugBackend,
    store: &mut Store<HostState>,
) -> wasmtime::Result<GuestResult<Vec<model::Resource>>> {
    Ok(b.devplug_backend_backend()
        .call_discover(store)
        .await?
        .map_err(backend_error)
        .map(|rs| rs.into_iter().map(resource).collect()))
}

pub async fn preferred_allocation(
    b: &DevplugBackend,
    store: &mut Store<HostState>,
    res: &str,
    available: &[String],
    must_include: &[String],
    size: u32,
) -> wasmtime::Result<GuestResult<Vec<String>>> {
    let g: &guest::Guest = b.devplug_backend_backend();
    Ok(g.call_preferred_allocation(store, res, available, must_include, size).await?.map_err(backend_error))
}

pub async fn allocate(
    b: &DevplugBackend,
    store: &mut Store<HostState>,
    res: &str,
    ids: &[String],
) -> wasmtime::Result<GuestResult<model::ContainerEdits>> {
    Ok(b.devplug_backend_backend().call_allocate(store, res, ids).await?.map_err(backend_error).map(edits))
}

pub async fn pre_start(
    b: &DevplugBackend,
    store: &mut Store<HostState>,
    res: &str,
    ids: &[String],
) -> wasmtime::Result<GuestResult<()>> {
    Ok(b.devplug_backend_backend().call_pre_start(store, res, ids).await?.map_err(backend_error))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_in_a_host_call_becomes_an_error_not_an_unwind() {
        let caps = crate::runtime::caps::Capabilities::new(&Default::default(), &Default::default()).unwrap();
        let d = tempfile::tempdir().unwrap();
        let sb = Sandbox::new("x", &caps, d.path(), d.path(), false, 1 << 20);
        let e = host_call(&sb, "devfs.glob", || -> u32 { panic!("regex compilation shouldn't fail") }).unwrap_err();
        assert!(e.to_string().contains("devfs.glob failed inside the host"), "{e}");
        assert_eq!(host_call(&sb, "sysfs.read", || 7).unwrap(), 7);
    }
}
