//! [`BackendInstance`]: a loaded backend and a small pool of live instances of it. Every call runs
//! on an instance taken from the pool under an epoch deadline and a memory cap; an instance that
//! faults (trap, timeout, memory cap) is dropped and the next call gets a fresh one, `init`
//! included. Faults in a row open a breaker, closed again by the next successful call.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use wasmtime::{Store, Trap};

use super::bindings::{Bindings, GuestResult, Pre};
use super::engine::{Runtime, ticks};
use super::state::{HostState, Sandbox};
use super::{CacheOutcome, CallError, LoadError};
use crate::model::{BackendInfo, ContainerEdits, Resource};

/// Idle instances kept per backend: enough that a slow discover never holds up an allocate.
const MAX_IDLE: usize = 4;

/// Which export a call goes to, for deadlines, logs and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CallKind {
    Init,
    Discover,
    PreferredAllocation,
    Allocate,
    PreStart,
}

impl CallKind {
    pub fn as_str(self) -> &'static str {
        match self {
            CallKind::Init => "init",
            CallKind::Discover => "discover",
            CallKind::PreferredAllocation => "preferred-allocation",
            CallKind::Allocate => "allocate",
            CallKind::PreStart => "pre-start",
        }
    }
}

/// Counters for one backend, read by metrics and status.
#[derive(Default, Debug)]
pub struct BackendStats {
    pub calls: AtomicU64,
    pub guest_errors: AtomicU64,
    pub traps: AtomicU64,
    pub timeouts: AtomicU64,
    pub memory_cap_hits: AtomicU64,
    pub instantiations: AtomicU64,
    pub consecutive_faults: AtomicU32,
    pub breaker_open: AtomicBool,
}

struct Live {
    store: Store<HostState>,
    bindings: Bindings,
}

/// A backend ready to be called.
pub struct BackendInstance {
    name: Arc<str>,
    digest: String,
    info: BackendInfo,
    runtime: Arc<Runtime>,
    pre: Pre,
    sandbox: Sandbox,
    config: String,
    idle: Mutex<Vec<Live>>,
    pub stats: BackendStats,
    pub cache: CacheOutcome,
}

impl BackendInstance {
    /// Compile (or load from cache), link, instantiate and `init` a backend. Fails without side
    /// effects, so a bad new version never replaces a good one.
    pub fn load(runtime: &Arc<Runtime>, bytes: &[u8], config: String, sandbox: Sandbox) -> Result<Self, LoadError> {
        let compiled = runtime.compile(bytes)?;
        let pre = Pre::new(runtime.engine(), &compiled.component)?;
        let mut me = BackendInstance {
            name: sandbox.backend.clone(),
            digest: compiled.digest,
            info: BackendInfo::default(),
            runtime: runtime.clone(),
            pre,
            sandbox,
            config,
            idle: Mutex::new(Vec::new()),
            stats: BackendStats::default(),
            cache: compiled.cache,
        };
        let (live, info) = me.instantiate()?;
        me.info = info;
        me.put_back(live);
        Ok(me)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// sha256 of the component bytes.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    pub fn info(&self) -> &BackendInfo {
        &self.info
    }

    pub fn wit_version(&self) -> &'static str {
        self.pre.version()
    }

    pub fn breaker_open(&self) -> bool {
        self.stats.breaker_open.load(Ordering::Relaxed)
    }

    /// A fresh store and instance, with `init` run under the discover deadline.
    fn instantiate(&self) -> Result<(Live, BackendInfo), CallError> {
        self.stats.instantiations.fetch_add(1, Ordering::Relaxed);
        let mut store = Store::new(self.runtime.engine(), HostState::new(self.sandbox.clone()));
        store.limiter(|s| &mut s.limiter);
        store.set_epoch_deadline(ticks(self.runtime.config.discover_deadline));
        let outcome = self.pre.instantiate(&mut store).and_then(|b| Ok((b.init(&mut store, &self.config)?, b)));
        match outcome {
            Ok((Ok(info), bindings)) => Ok((Live { store, bindings }, info)),
            Ok((Err(msg), _)) => Err(CallError::Guest(msg)),
            Err(e) => Err(self.classify(&store, e, self.runtime.config.discover_deadline)),
        }
    }

    fn put_back(&self, live: Live) {
        if let Ok(mut idle) = self.idle.lock()
            && idle.len() < MAX_IDLE
        {
            idle.push(live);
        }
    }

    fn classify(&self, store: &Store<HostState>, e: wasmtime::Error, deadline: Duration) -> CallError {
        if store.data().limiter.hit {
            self.stats.memory_cap_hits.fetch_add(1, Ordering::Relaxed);
            CallError::MemoryCap(self.sandbox.memory_cap)
        } else if e.downcast_ref::<Trap>() == Some(&Trap::Interrupt) {
            self.stats.timeouts.fetch_add(1, Ordering::Relaxed);
            CallError::Timeout(deadline)
        } else {
            self.stats.traps.fetch_add(1, Ordering::Relaxed);
            CallError::Trap(format!("{e:#}").lines().next().unwrap_or("trap").to_owned())
        }
    }

    /// Run one export on a pooled instance. Blocking: call from a blocking thread.
    fn call<T>(
        &self,
        kind: CallKind,
        f: impl FnOnce(&Bindings, &mut Store<HostState>) -> wasmtime::Result<GuestResult<T>>,
    ) -> Result<T, CallError> {
        self.stats.calls.fetch_add(1, Ordering::Relaxed);
        let deadline = match kind {
            CallKind::Init | CallKind::Discover => self.runtime.config.discover_deadline,
            _ => self.runtime.config.call_deadline,
        };
        let pooled = self.idle.lock().ok().and_then(|mut idle| idle.pop());
        let mut live = match pooled {
            Some(live) => live,
            None => match self.instantiate() {
                Ok((live, _)) => live,
                Err(e) => return Err(self.fault(kind, e)),
            },
        };
        live.store.set_epoch_deadline(ticks(deadline));
        live.store.data_mut().limiter.hit = false;
        match f(&live.bindings, &mut live.store) {
            Ok(Ok(v)) => {
                self.put_back(live);
                self.succeeded();
                Ok(v)
            }
            Ok(Err(msg)) => {
                self.put_back(live);
                self.succeeded();
                self.stats.guest_errors.fetch_add(1, Ordering::Relaxed);
                Err(CallError::Guest(msg))
            }
            Err(e) => {
                let err = self.classify(&live.store, e, deadline);
                // The instance is dropped here: after a trap its store cannot be entered again.
                Err(self.fault(kind, err))
            }
        }
    }

    fn succeeded(&self) {
        self.stats.consecutive_faults.store(0, Ordering::Relaxed);
        if self.stats.breaker_open.swap(false, Ordering::Relaxed) {
            tracing::info!(backend = %self.name, "backend answered again; breaker closed");
        }
    }

    fn fault(&self, kind: CallKind, err: CallError) -> CallError {
        if !err.is_fault() {
            return err;
        }
        let n = self.stats.consecutive_faults.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::warn!(backend = %self.name, call = kind.as_str(), error = %err, "backend call failed; its instance was discarded");
        if n >= self.runtime.config.breaker_threshold && !self.stats.breaker_open.swap(true, Ordering::Relaxed) {
            tracing::error!(
                backend = %self.name,
                faults = n,
                "breaker open: the backend's devices are reported Unhealthy and allocations refused until it answers again"
            );
        }
        err
    }

    pub fn discover(&self) -> Result<Vec<Resource>, CallError> {
        self.call(CallKind::Discover, |b, s| b.discover(s))
    }

    pub fn preferred_allocation(
        &self,
        resource: &str,
        available: &[String],
        must_include: &[String],
        size: u32,
    ) -> Result<Vec<String>, CallError> {
        self.refuse_if_open()?;
        self.call(CallKind::PreferredAllocation, |b, s| {
            b.preferred_allocation(s, resource, available, must_include, size)
        })
    }

    pub fn allocate(&self, resource: &str, ids: &[String]) -> Result<ContainerEdits, CallError> {
        self.refuse_if_open()?;
        self.call(CallKind::Allocate, |b, s| b.allocate(s, resource, ids))
    }

    pub fn pre_start(&self, resource: &str, ids: &[String]) -> Result<(), CallError> {
        self.refuse_if_open()?;
        self.call(CallKind::PreStart, |b, s| b.pre_start(s, resource, ids))
    }

    fn refuse_if_open(&self) -> Result<(), CallError> {
        if self.breaker_open() { Err(CallError::BreakerOpen) } else { Ok(()) }
    }
}
