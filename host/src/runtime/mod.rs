//! The Wasm runtime: two wasmtime engines (optimising and baseline, component model, epoch
//! interruption; `engine.rs`), compiles in a worker process the kernel bounds
//! (`compile_worker.rs`) with an on-disk cache of their code, the background optimiser, and
//! [`BackendInstance`]s that call into backends under a deadline and a memory cap. Nothing here
//! knows about gRPC or kubelet.

pub mod bindings;
pub mod caps;
pub mod compile_worker;
mod engine;
pub mod engine_config;
pub mod guest_log;
mod heap;
mod instance;
pub mod jail;
pub mod learn;
pub mod limits;
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

/// Why a call into a backend failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// The backend answered with an error of its own; the instance is fine.
    #[error("backend returned an error: {0}")]
    Guest(String),
    /// The backend trapped (panic, unreachable, out-of-bounds); the instance was dropped.
    #[error("backend trapped: {0}")]
    Trap(String),
    /// The call ran past its deadline and was interrupted; the instance was dropped.
    #[error("backend exceeded its {0:?} deadline")]
    Timeout(std::time::Duration),
    /// The backend tried to grow memory past its cap; the instance was dropped.
    #[error("backend hit its memory cap of {0} bytes")]
    MemoryCap(usize),
    /// Too many faults in a short while; the backend's devices are Unhealthy until a call
    /// succeeds.
    #[error("backend is disabled after repeated failures (breaker open)")]
    BreakerOpen,
    /// The backend answered, but with something it may not hand out (a device node, mount, env
    /// key, annotation or resource name outside its grants, or more than the caps allow); the
    /// whole answer was dropped.
    #[error("the host refused the backend's answer: {0}")]
    Refused(String),
}

impl CallError {
    /// A fault (trap, timeout, memory cap) as opposed to an answer the backend chose.
    pub fn is_fault(&self) -> bool {
        matches!(self, CallError::Trap(_) | CallError::Timeout(_) | CallError::MemoryCap(_))
    }
}
