//! One bindings module per WIT version the host has ever shipped (Zed's extension_host model).
//! A component is matched to a module by the versioned name of its `backend` export, semver
//! style (0.1.x → `v0_1_0`, 0.2.x → `v0_2_0`). Adding a version means a `vX_Y_Z.rs` (its
//! `bindgen!` and [`glue::version_glue`]), a variant in [`Bindings`] and [`Prepared`] (every
//! `match` on them is exhaustive, so the compiler lists what else to write), and one row in
//! [`VERSIONS`]. The host side of the imports is written once, in [`host_calls`].

use std::sync::OnceLock;

use wasmtime::component::{Component, InstancePre, Linker};
use wasmtime::{Engine, Store};

use super::state::HostState;
use crate::model::dra::{ClaimDevice, PoolDescription};
use crate::model::{BackendInfo, ContainerEdits, Resource};

mod answers;
mod glue;
pub mod host_calls;
pub mod v0_1_0;
pub mod v0_2_0;
pub mod v0_3_0;

/// The `types` interface every version so far shares: 0.1.0's, unchanged in 0.2.0 and 0.3.0.
pub use v0_1_0::devplug::backend::types as wit_interface;
use wit_interface as wit;

/// One WIT package version this host serves: everything the version-independent code needs to
/// know about it, in one row.
struct Version {
    version: &'static str,
    /// Adds the version's imports to a linker.
    add_to_linker: fn(&mut Linker<HostState>) -> wasmtime::Result<()>,
    /// Wraps a component linked with those imports in the version's typed exports.
    prepare: fn(InstancePre<HostState>) -> wasmtime::Result<Prepared>,
    /// Whether it exports the `dra` calls (`describe`, `prepare`, `unprepare`).
    dra: bool,
}

/// Every WIT package version this host loads, oldest first. A component is served by exactly
/// the row [`module_for`] picks; there is no fallback row.
const VERSIONS: &[Version] = &[
    Version {
        version: v0_1_0::VERSION,
        add_to_linker: v0_1_0::add_to_linker,
        prepare: |pre| Ok(Prepared::V0_1_0(v0_1_0::DevplugBackendPre::new(pre)?)),
        dra: false,
    },
    Version {
        version: v0_2_0::VERSION,
        add_to_linker: v0_2_0::add_to_linker,
        prepare: |pre| Ok(Prepared::V0_2_0(v0_2_0::DevplugBackendPre::new(pre)?)),
        dra: false,
    },
    Version {
        version: v0_3_0::VERSION,
        add_to_linker: v0_3_0::add_to_linker,
        prepare: |pre| Ok(Prepared::V0_3_0(v0_3_0::DevplugBackendPre::new(pre)?)),
        dra: true,
    },
];

/// WIT package versions this host loads, oldest first (read from [`VERSIONS`]).
pub const SUPPORTED: [&str; VERSIONS.len()] = {
    let mut out = [""; VERSIONS.len()];
    let mut i = 0;
    while i < VERSIONS.len() {
        out[i] = VERSIONS[i].version;
        i += 1;
    }
    out
};

/// A backend's answer: `Ok`, or the error it chose to return (not a trap).
pub type GuestResult<T> = Result<T, String>;

/// The exports of one instantiated backend, whatever WIT version it was built against.
pub enum Bindings {
    V0_1_0(v0_1_0::DevplugBackend),
    V0_2_0(v0_2_0::DevplugBackend),
    V0_3_0(v0_3_0::DevplugBackend),
}

/// A component linked against the host's imports for its version, ready to instantiate.
pub enum Prepared {
    V0_1_0(v0_1_0::DevplugBackendPre<HostState>),
    V0_2_0(v0_2_0::DevplugBackendPre<HostState>),
    V0_3_0(v0_3_0::DevplugBackendPre<HostState>),
}

/// One linker per WIT version (WASI with nothing in it, plus that version's imports), built the
/// first time a component of that version loads and shared by every later load.
#[derive(Default)]
pub struct Linkers {
    built: [OnceLock<Result<Linker<HostState>, String>>; VERSIONS.len()],
}

impl Linkers {
    fn get(&self, engine: &Engine, i: usize) -> Result<&Linker<HostState>, super::LoadError> {
        let add = VERSIONS[i].add_to_linker;
        let built = self.built[i].get_or_init(|| {
            let mut linker: Linker<HostState> = Linker::new(engine);
            wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(|e| format!("{e:#}"))?;
            add(&mut linker).map_err(|e| format!("{e:#}"))?;
            Ok(linker)
        });
        built.as_ref().map_err(super::LoadError::internal)
    }
}

/// The `devplug:backend` version a component exports, read from its type, e.g. `0.1.0`.
pub(crate) fn exported_version(engine: &Engine, component: &Component) -> Option<String> {
    component
        .component_type()
        .exports(engine)
        .find_map(|(name, _)| name.strip_prefix("devplug:backend/backend@").map(str::to_owned))
}

/// Whether this host loads components built against WIT `version` (semver: any 0.1.x, 0.2.x).
pub(crate) fn supports(version: &str) -> bool {
    module_for(version).is_some()
}

/// Whether a backend built against WIT `version` has the `dra` calls (its row says).
pub(crate) fn has_dra(version: &str) -> bool {
    module_for(version).is_some_and(|i| VERSIONS[i].dra)
}

/// The index into [`VERSIONS`] of the module that serves `version`: same major, and for 0.x the
/// same minor (semver compatibility; a patch release never changes the interface).
fn module_for(version: &str) -> Option<usize> {
    let v = semver::Version::parse(version).ok()?;
    VERSIONS.iter().position(|row| {
        let Ok(k) = semver::Version::parse(row.version) else { return false };
        k.major == v.major && (k.major > 0 || k.minor == v.minor)
    })
}

impl Prepared {
    /// Link `component` with the host's imports for its version.
    pub fn new(engine: &Engine, linkers: &Linkers, component: &Component) -> Result<Self, super::LoadError> {
        let version = exported_version(engine, component).ok_or_else(|| {
            let exports: Vec<String> = component.component_type().exports(engine).map(|(n, _)| n.to_owned()).collect();
            super::LoadError::NotABackend(format!(
                "it exports [{}] but not devplug:backend/backend; build it against the WIT in wit/",
                exports.join(", ")
            ))
        })?;
        let i = module_for(&version).ok_or_else(|| super::LoadError::UnsupportedVersion(version.clone()))?;
        let linker = linkers.get(engine, i)?;
        let link_error = |e: wasmtime::Error| super::LoadError::Link(format!("{e:#}"));
        let pre = linker.instantiate_pre(component).map_err(link_error)?;
        (VERSIONS[i].prepare)(pre).map_err(link_error)
    }

    pub async fn instantiate(&self, store: &mut Store<HostState>) -> wasmtime::Result<Bindings> {
        match self {
            Prepared::V0_1_0(pre) => Ok(Bindings::V0_1_0(pre.instantiate_async(store).await?)),
            Prepared::V0_2_0(pre) => Ok(Bindings::V0_2_0(pre.instantiate_async(store).await?)),
            Prepared::V0_3_0(pre) => Ok(Bindings::V0_3_0(pre.instantiate_async(store).await?)),
        }
    }

    /// The host module's WIT version serving this component.
    pub fn version(&self) -> &'static str {
        match self {
            Prepared::V0_1_0(_) => v0_1_0::VERSION,
            Prepared::V0_2_0(_) => v0_2_0::VERSION,
            Prepared::V0_3_0(_) => v0_3_0::VERSION,
        }
    }
}

impl Bindings {
    pub async fn init(&self, store: &mut Store<HostState>, config: &str) -> wasmtime::Result<GuestResult<BackendInfo>> {
        match self {
            Bindings::V0_1_0(b) => v0_1_0::init(b, store, config).await,
            Bindings::V0_2_0(b) => v0_2_0::init(b, store, config).await,
            Bindings::V0_3_0(b) => v0_3_0::init(b, store, config).await,
        }
    }

    pub async fn discover(&self, store: &mut Store<HostState>) -> wasmtime::Result<GuestResult<Vec<Resource>>> {
        match self {
            Bindings::V0_1_0(b) => v0_1_0::discover(b, store).await,
            Bindings::V0_2_0(b) => v0_2_0::discover(b, store).await,
            Bindings::V0_3_0(b) => v0_3_0::discover(b, store).await,
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
            Bindings::V0_2_0(b) => {
                v0_2_0::preferred_allocation(b, store, resource, available, must_include, size).await
            }
            Bindings::V0_3_0(b) => {
                v0_3_0::preferred_allocation(b, store, resource, available, must_include, size).await
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
            Bindings::V0_2_0(b) => v0_2_0::allocate(b, store, resource, ids).await,
            Bindings::V0_3_0(b) => v0_3_0::allocate(b, store, resource, ids).await,
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
            Bindings::V0_2_0(b) => v0_2_0::pre_start(b, store, resource, ids).await,
            Bindings::V0_3_0(b) => v0_3_0::pre_start(b, store, resource, ids).await,
        }
    }

    /// `describe`; an empty description before 0.3.0.
    pub async fn describe(&self, store: &mut Store<HostState>) -> wasmtime::Result<GuestResult<PoolDescription>> {
        match self {
            Bindings::V0_1_0(_) | Bindings::V0_2_0(_) => Ok(Ok(PoolDescription::default())),
            Bindings::V0_3_0(b) => v0_3_0::describe(b, store).await,
        }
    }

    /// `prepare`; `Ok(None)` when the backend leaves it to `allocate` (always before 0.3.0).
    pub async fn prepare(
        &self,
        store: &mut Store<HostState>,
        claim: &str,
        devices: &[ClaimDevice],
        config: &[String],
    ) -> wasmtime::Result<GuestResult<Option<ContainerEdits>>> {
        match self {
            Bindings::V0_1_0(_) | Bindings::V0_2_0(_) => Ok(Ok(None)),
            Bindings::V0_3_0(b) => v0_3_0::prepare(b, store, claim, devices, config).await,
        }
    }

    /// `unprepare` (nothing to undo before 0.3.0).
    pub async fn unprepare(&self, store: &mut Store<HostState>, claim: &str) -> wasmtime::Result<GuestResult<()>> {
        match self {
            Bindings::V0_1_0(_) | Bindings::V0_2_0(_) => Ok(Ok(())),
            Bindings::V0_3_0(b) => v0_3_0::unprepare(b, store, claim).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_match_semver_style() {
        assert_eq!(module_for("0.1.0"), Some(0));
        assert_eq!(module_for("0.1.7"), Some(0), "a 0.1 patch release is served by the 0.1.0 module");
        assert_eq!(module_for("0.2.0"), Some(1));
        assert_eq!(module_for("0.2.3"), Some(1));
        assert_eq!(module_for("0.3.1"), Some(2));
        assert_eq!(module_for("0.4.0"), None, "a newer minor of 0.x is a different interface");
        assert_eq!(module_for("1.1.0"), None);
        assert_eq!(module_for("not-a-version"), None);
        // Issue 63: the `dra` calls by the row, so a patch release of an older version has none
        // (the instance compared strings, and gave 0.2.1 the calls of 0.3.0).
        assert!(!has_dra("0.1.0") && !has_dra("0.2.1") && has_dra("0.3.0") && has_dra("0.3.2"));
        assert!(!has_dra("0.4.0"));
    }

    #[test]
    fn every_version_row_serves_its_own_version() {
        for (i, row) in VERSIONS.iter().enumerate() {
            assert_eq!(module_for(row.version), Some(i), "{} is served by another row", row.version);
            assert_eq!(SUPPORTED[i], row.version);
        }
    }

    /// A component of each version is wrapped by its own row (not merely by the newest one).
    #[test]
    fn components_are_prepared_by_the_row_of_their_version() {
        let rt = crate::runtime::Runtime::new(crate::runtime::RuntimeConfig::default()).unwrap();
        let (chaos, _) = crate::backends::embedded::test_program("chaos").expect("chaos is built");
        let cases = [
            (std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/compat/v0.1.0.wasm")).unwrap(), "0.1.0"),
            (std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/compat/v0.2.0.wasm")).unwrap(), "0.2.0"),
            (std::fs::read(chaos).unwrap(), "0.3.0"),
        ];
        for (bytes, version) in cases {
            let compiled = rt.compile(&bytes).unwrap();
            let prepared =
                Prepared::new(rt.engine(), rt.linkers_for(&compiled.component), &compiled.component).unwrap();
            assert_eq!(prepared.version(), version);
        }
    }
}
