//! One bindings module per WIT version the host has ever shipped (Zed's extension_host model).
//! A component is matched to a module by the versioned name of its `backend` export; adding
//! `0.2.0` means adding `v0_2_0.rs`, a variant to [`Bindings`], and a line to [`SUPPORTED`].

use wasmtime::component::{Component, Linker};
use wasmtime::{Engine, Store};

use super::state::HostState;
use crate::model::{BackendInfo, ContainerEdits, Resource};

pub mod v0_1_0;

/// WIT package versions this host loads, oldest first.
pub const SUPPORTED: &[&str] = &["0.1.0"];

/// A backend's answer: `Ok`, or the error it chose to return (not a trap).
pub type GuestResult<T> = Result<T, String>;

/// The exports of one instantiated backend, whatever WIT version it was built against.
pub enum Bindings {
    V0_1_0(v0_1_0::DevplugBackend),
}

/// Version-specific linker setup and instantiation.
pub enum Pre {
    V0_1_0(v0_1_0::DevplugBackendPre<HostState>),
}

/// The `devplug:backend` version a component exports, read from its type, e.g. `0.1.0`.
pub fn exported_version(engine: &Engine, component: &Component) -> Option<String> {
    component
        .component_type()
        .exports(engine)
        .find_map(|(name, _)| name.strip_prefix("devplug:backend/backend@").map(str::to_owned))
}

impl Pre {
    /// Link the host's imports (and a WASI with nothing in it) for `component`'s version.
    pub fn new(engine: &Engine, component: &Component) -> Result<Self, super::LoadError> {
        let version = exported_version(engine, component).ok_or_else(|| {
            let exports: Vec<String> = component.component_type().exports(engine).map(|(n, _)| n.to_owned()).collect();
            super::LoadError::NotABackend(format!(
                "it exports [{}] but not devplug:backend/backend; build it against the WIT in wit/",
                exports.join(", ")
            ))
        })?;
        let mut linker: Linker<HostState> = Linker::new(engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(super::LoadError::internal)?;
        match version.as_str() {
            "0.1.0" => {
                v0_1_0::add_to_linker(&mut linker).map_err(super::LoadError::internal)?;
                let pre = linker.instantiate_pre(component).map_err(|e| super::LoadError::Link(format!("{e:#}")))?;
                let pre = v0_1_0::DevplugBackendPre::new(pre).map_err(|e| super::LoadError::Link(format!("{e:#}")))?;
                Ok(Pre::V0_1_0(pre))
            }
            other => Err(super::LoadError::UnsupportedVersion(other.to_owned())),
        }
    }

    pub async fn instantiate(&self, store: &mut Store<HostState>) -> wasmtime::Result<Bindings> {
        match self {
            Pre::V0_1_0(pre) => Ok(Bindings::V0_1_0(pre.instantiate_async(store).await?)),
        }
    }

    pub fn version(&self) -> &'static str {
        match self {
            Pre::V0_1_0(_) => "0.1.0",
        }
    }
}

impl Bindings {
    pub async fn init(&self, store: &mut Store<HostState>, config: &str) -> wasmtime::Result<GuestResult<BackendInfo>> {
        match self {
            Bindings::V0_1_0(b) => v0_1_0::init(b, store, config).await,
        }
    }

    pub async fn discover(&self, store: &mut Store<HostState>) -> wasmtime::Result<GuestResult<Vec<Resource>>> {
        match self {
            Bindings::V0_1_0(b) => v0_1_0::discover(b, store).await,
        }
    }

    pub async fn preferred_allocation(
        &self,
        store: &mut Store<HostState>,
        resource: &str,
        available: &[String],
        must_include: &[String],
        size: u32,
    ) -> wasmtime::Result<GuestResult<Vec<String>>> {
        match self {
            Bindings::V0_1_0(b) => {
                v0_1_0::preferred_allocation(b, store, resource, available, must_include, size).await
            }
        }
    }

    pub async fn allocate(
        &self,
        store: &mut Store<HostState>,
        resource: &str,
        ids: &[String],
    ) -> wasmtime::Result<GuestResult<ContainerEdits>> {
        match self {
            Bindings::V0_1_0(b) => v0_1_0::allocate(b, store, resource, ids).await,
        }
    }

    pub async fn pre_start(
        &self,
        store: &mut Store<HostState>,
        resource: &str,
        ids: &[String],
    ) -> wasmtime::Result<GuestResult<()>> {
        match self {
            Bindings::V0_1_0(b) => v0_1_0::pre_start(b, store, resource, ids).await,
        }
    }
}
