//! The Wasm runtime: two wasmtime engines (optimising and baseline, component model;
//! `engine.rs`), epoch deadlines and cut-offs of guest calls (`deadline.rs`), compiles in a
//! worker process the kernel bounds (`compile_worker.rs`) with an on-disk cache of their code
//! (`code_cache.rs`), native code compiled once for a cluster and signed by its operator
//! (`native.rs`), the background optimiser, and
//! [`BackendInstance`]s that call into backends under a deadline and a memory cap. Nothing here
//! knows about gRPC or kubelet.

pub mod bindings;
pub mod caps;
mod code_cache;
pub mod compile_worker;
mod deadline;
mod engine;
pub mod engine_config;
pub mod guest_log;
mod heap;
mod incremental;
mod instance;
pub mod jail;
pub mod learn;
pub mod limits;
pub mod native;
mod optimizer;
pub mod state;
pub mod vet;

pub use engine::{BASELINE_FROM, CACHE_MAX_BYTES, CacheOutcome, Compiled, Runtime, RuntimeConfig, Tier};
pub use instance::{BackendInstance, BackendStats, CallKind};

/// Why a `.wasm` could not become a backend. Each message says what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("not a Wasm file (no \\0asm header): is it truncated, or not a .wasm at all?")]
    NotWasm,
    #[error(
        "a core Wasm module, not a component: build it with `--target wasm32-wasip2` (or wrap it with `wasm-tools component new`)"
    )]
    CoreModule,
    #[error("invalid component: {0}")]
    Invalid(String),
    #[error("not a devplug backend: {0}")]
    NotABackend(String),
    #[error(
        "built against devplug:backend@{0}, which this host does not support (it loads {supported}); rebuild it against a supported WIT version",
        supported = bindings::SUPPORTED.join(", ")
    )]
    UnsupportedVersion(String),
    #[error("imports something the host does not provide: {0}")]
    Link(String),
    #[error("init failed: {0}")]
    Init(#[from] CallError),
    #[error("discover of the new version failed, so it was not swapped in: {0}")]
    Discover(CallError),
    #[error("bad manifest: {0}")]
    Manifest(String),
    /// The compile met its budget, or its worker failed: nothing was loaded.
    #[error("not compiled: {0}")]
    Compile(compile_worker::CompileError),
    #[error("internal error: {0}")]
    Internal(String),
}

impl LoadError {
    pub(crate) fn internal(e: impl std::fmt::Display) -> Self {
        LoadError::Internal(e.to_string())
    }
}

pub use crate::model::calls::CallError;
