//! [`BackendInstance`]: a loaded backend and a small pool of live instances of it. Every call runs
//! on an instance taken from the pool under a deadline and a memory cap; an instance that faults
//! (trap, timeout, memory cap) is dropped and the next call gets a fresh one, `init` included.
//!
//! The deadline holds twice over: an epoch deadline stops guest code that computes, and the call
//! itself is a future under a timer, so a guest blocked in a host function (a WASI sleep, a
//! poll) is cut off at the same instant by dropping it. Enough faults within the last
//! [`FAULT_WINDOW`] calls open a breaker, closed again by the next successful call.
//!
//! What a call returns is checked by [`super::vet`] before anyone sees it.

use crate::sync::Locked;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use wasmtime::{Store, Trap};

use super::bindings::{Bindings, GuestResult, Prepared};
use super::engine::{Runtime, Tier};
use super::state::{HostState, Sandbox};
use super::{CacheOutcome, CallError, LoadError};
use crate::gate::clip;
use crate::model::{BackendInfo, ContainerEdits, Resource};

/// Recent calls the breaker looks at: a backend that faults every other call trips it as
/// surely as one that faults every time.
pub(crate) const FAULT_WINDOW: usize = 10;

/// A guest call: a future borrowing the instance's bindings and store.
type GuestCall<'a, T> = Pin<Box<dyn Future<Output = wasmtime::Result<GuestResult<T>>> + Send + 'a>>;

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
    Describe,
    Prepare,
    Unprepare,
}

impl CallKind {
    pub fn as_str(self) -> &'static str {
        match self {
            CallKind::Init => "init",
            CallKind::Discover => "discover",
            CallKind::PreferredAllocation => "preferred-allocation",
            CallKind::Allocate => "allocate",
            CallKind::PreStart => "pre-start",
            CallKind::Describe => "describe",
            CallKind::Prepare => "prepare",
            CallKind::Unprepare => "unprepare",
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
    /// Answers the host refused (see [`super::vet`]).
    pub refused: AtomicU64,
    /// Outcomes of the last [`FAULT_WINDOW`] calls, `true` for a fault.
    recent: Mutex<VecDeque<bool>>,
    pub breaker_open: AtomicBool,
}

impl BackendStats {
    /// Record one call's outcome; returns the faults now in the window.
    fn record(&self, fault: bool) -> usize {
        let mut recent = self.recent.locked();
        if recent.len() == FAULT_WINDOW {
            recent.pop_front();
        }
        recent.push_back(fault);
        recent.iter().filter(|f| **f).count()
    }
}

/// One instantiated component whose `init` has run: its store and bindings, pooled while idle.
struct InitedInstance {
    store: Store<HostState>,
    bindings: Bindings,
}

/// The code a backend runs: its linked component and the engine that compiled it. A
/// baseline-loaded backend's is replaced once, when its optimised code has arrived (see
/// [`super::optimizer`]) and the next call looks; instances made from the old code are dropped,
/// not pooled again.
struct Code {
    pre: Prepared,
    engine: wasmtime::Engine,
    tier: Tier,
}

/// Idle instances of one backend.
type Pool = Mutex<Vec<InitedInstance>>;

/// A backend ready to be called.
pub struct BackendInstance {
    name: Arc<str>,
    digest: String,
    info: BackendInfo,
    runtime: Arc<Runtime>,
    /// What it runs.
    code: arc_swap::ArcSwap<Code>,
    /// The optimised code on its way from the background optimiser, while a baseline-loaded
    /// backend waits for it: taken at the next look at the code ([`Self::take_optimized`]).
    coming: Mutex<Option<tokio::sync::oneshot::Receiver<wasmtime::component::Component>>>,
    /// The WIT version it was built against (the same in every tier).
    version: &'static str,
    sandbox: Sandbox,
    config: String,
    idle: Pool,
    pub stats: BackendStats,
    pub cache: CacheOutcome,
    /// Which compiler made the code it was loaded with (see [`BackendInstance::tier`] for now).
    pub compiled_as: Tier,
    /// How long its load took, step by step (the load's log line says it).
    pub took: LoadTimes,
}

/// Where a load's time went: an operator asking why a new version took seconds to serve reads
/// these in the `backend loaded` / `backend swapped in` log line.
#[derive(Debug, Clone, Copy, Default)]
pub struct LoadTimes {
    /// Compile, or load from the cache.
    pub compile: std::time::Duration,
    /// Link, instantiate and the backend's `init`.
    pub init: std::time::Duration,
}

impl BackendInstance {
    /// Compile (or load from cache), link, instantiate and `init` a backend. Fails without side
    /// effects, so a bad new version never replaces a good one. Loaded from baseline code, it
    /// asks the background optimiser for its optimised code once it has `init`ed.
    pub fn load(runtime: &Arc<Runtime>, bytes: &[u8], config: String, sandbox: Sandbox) -> Result<Self, LoadError> {
        Self::load_signed(runtime, bytes, None, config, sandbox)
    }

    /// [`BackendInstance::load`] with the operator-signed native code of `bytes`, when the
    /// registry had some ([`Runtime::compile_for`], which also reuses what the backend's
    /// earlier version compiled to).
    pub fn load_signed(
        runtime: &Arc<Runtime>,
        bytes: &[u8],
        signed: Option<crate::durable::Spooled>,
        config: String,
        sandbox: Sandbox,
    ) -> Result<Self, LoadError> {
        let started = std::time::Instant::now();
        let compiled = runtime.compile_for(Some(&sandbox.backend), bytes, signed)?;
        let compiled_at = std::time::Instant::now();
        let engine = compiled.component.engine().clone();
        let pre = Prepared::new(&engine, runtime.linkers_for(&compiled.component), &compiled.component)?;
        let baseline = (compiled.tier == Tier::Baseline).then(|| compiled.component.clone());
        let version = pre.version();
        let tier = compiled.tier;
        let mut me = BackendInstance {
            name: sandbox.backend.clone(),
            digest: compiled.digest,
            info: BackendInfo::default(),
            runtime: runtime.clone(),
            code: arc_swap::ArcSwap::from_pointee(Code { pre, engine, tier }),
            coming: Mutex::default(),
            version,
            sandbox,
            config,
            idle: Pool::default(),
            stats: BackendStats::default(),
            cache: compiled.cache,
            compiled_as: tier,
            took: LoadTimes { compile: compiled_at - started, init: Default::default() },
        };
        let (live, info) = me.instantiate()?;
        me.info = info;
        me.put_back(live);
        me.took.init = compiled_at.elapsed();
        if let Some(baseline) = baseline {
            let coming = me.runtime.optimize_later(&me.name, &me.digest, Arc::from(bytes), Some(baseline));
            me.coming = Mutex::new(coming);
        }
        Ok(me)
    }

    /// Swap in the optimised code if it has arrived, letting the idle baseline instances go
    /// (their memory with them). Calls under way finish on the code they started with.
    fn take_optimized(&self) {
        let mut coming = self.coming.locked();
        let Some(receiver) = coming.as_mut() else { return };
        let component = match receiver.try_recv() {
            Ok(c) => c,
            Err(tokio::sync::oneshot::error::TryRecvError::Empty) => return,
            // The optimiser gave up, or another instance of the same code asked first.
            Err(tokio::sync::oneshot::error::TryRecvError::Closed) => {
                *coming = None;
                return;
            }
        };
        *coming = None;
        let rt = &self.runtime;
        match Prepared::new(rt.engine(), rt.linkers_for(&component), &component) {
            Ok(pre) => {
                self.code.store(Arc::new(Code { pre, engine: rt.engine().clone(), tier: Tier::Optimized }));
                self.idle.locked().clear();
                tracing::info!(backend = %self.name, compiler = ?Tier::Optimized, "optimised code swapped in");
            }
            Err(e) => {
                tracing::warn!(backend = %self.name, error = %e, "optimised code did not link; baseline code keeps serving")
            }
        }
    }

    /// Which compiler made the code it runs now.
    pub fn tier(&self) -> Tier {
        self.take_optimized();
        self.code.load().tier
    }

    /// Whether its optimised code is being (or waits to be) compiled.
    pub fn optimizing(&self) -> bool {
        self.tier() == Tier::Baseline && self.runtime.optimizing(&self.digest)
    }

    /// sha256 of the component bytes.
    /// The accesses of the machine this instance was refused (logged once each).
    pub fn refusals(&self) -> &super::state::RefusalLog {
        &self.sandbox.refusals
    }

    pub fn digest(&self) -> &str {
        &self.digest
    }

    pub fn info(&self) -> &BackendInfo {
        &self.info
    }

    pub fn wit_version(&self) -> &'static str {
        self.version
    }

    /// Whether a kernel uevent of `subsystem` should make this backend discover again.
    pub(crate) fn subscribes(&self, subsystem: &str) -> bool {
        self.sandbox.uevents.allows(subsystem)
    }

    /// Whether one more log record about this backend may be written now: everything the host
    /// logs because of what a backend did (its own lines, refusals, health flips) draws on one
    /// budget, so a backend cannot flood the host's log through any of them.
    pub(crate) fn may_log(&self) -> bool {
        self.sandbox.log.admit(&self.name)
    }

    pub fn breaker_open(&self) -> bool {
        self.stats.breaker_open.load(Ordering::Relaxed)
    }

    /// A fresh store and instance, with `init` run under the discover deadline. The resources
    /// `init` declares outside the backend's `resources` capability are dropped here, each with
    /// one error line, so nothing else ever sees them.
    fn instantiate(&self) -> Result<(InitedInstance, BackendInfo), CallError> {
        let deadline = self.runtime.config.discover_deadline;
        let code = self.code.load_full();
        let mut store = Store::new(&code.engine, HostState::new(self.sandbox.clone()));
        store.limiter(|s| &mut s.limiter);
        // Every tick: trap past the call's deadline, else give the thread back and run on.
        store.epoch_deadline_callback(|ctx| Ok(super::deadline::yield_or_trap(ctx.data().meter.deadline())));
        store.set_epoch_deadline(1);
        store.data_mut().begin_call(deadline);
        let (pre, config) = (&code.pre, self.config.as_str());
        let outcome = self.runtime.run_until(deadline, async {
            let b = pre.instantiate(&mut store).await?;
            let info = b.init(&mut store, config).await?;
            Ok((info, b))
        });
        store.data_mut().end_call();
        match outcome {
            Some(Ok((Ok(mut info), bindings))) => {
                super::vet::info(&mut info);
                info.resources.retain(|(name, _)| match self.sandbox.returns.resource(name) {
                    Ok(()) => true,
                    Err(why) => {
                        tracing::error!(backend = %self.name, "resource not served: {why}");
                        false
                    }
                });
                Ok((InitedInstance { store, bindings }, info))
            }
            Some(Ok((Err(msg), _))) => Err(CallError::Guest(clip(&msg).into_owned())),
            Some(Err(e)) => Err(self.classify(&store, e, deadline)),
            None => {
                self.stats.timeouts.fetch_add(1, Ordering::Relaxed);
                Err(CallError::Timeout(deadline))
            }
        }
    }

    /// Pool `live` again, unless it runs code that has been replaced since.
    fn put_back(&self, live: InitedInstance) {
        if !self.current(&live) {
            return;
        }
        let mut idle = self.idle.locked();
        if idle.len() < MAX_IDLE {
            idle.push(live);
        }
    }

    /// Whether `live` runs the backend's current code.
    fn current(&self, live: &InitedInstance) -> bool {
        wasmtime::Engine::same(live.store.engine(), &self.code.load().engine)
    }

    /// An idle instance of the current code, if one is pooled.
    fn take(&self) -> Option<InitedInstance> {
        self.take_optimized();
        let live = self.idle.locked().pop()?;
        // Pooled before the code changed (a call was under way when it was swapped).
        self.current(&live).then_some(live)
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
            // The host's own words first and whole: the root cause says what kind of trap.
            // Then the backend's, marked as its own and on a budget of their own (a backend
            // that prints a host-like message before trapping must not speak first, nor push
            // the host's cause out of a clipped line): its exception (a JavaScript or Python
            // runtime's), then its last stderr lines (a Rust panic message).
            let host = crate::gate::clip_to(&e.root_cause().to_string(), 512).into_owned();
            let mut backend = String::new();
            if let Some(thrown) = store.data().exception() {
                backend = format!("its exception: {thrown}");
            }
            let said = store.data().last_words();
            if !said.is_empty() {
                let sep = if backend.is_empty() { "" } else { "; " };
                backend = format!("{backend}{sep}its last words: {said}");
            }
            CallError::Trap(if backend.is_empty() {
                host
            } else {
                format!(
                    "{host}; the backend said (its own words, not devplug's): {}",
                    crate::gate::clip_to(&backend, 512)
                )
            })
        }
    }

    /// Run one export on a pooled instance under `kind`'s deadline. May be called on an async
    /// worker of a multi-thread runtime: the guest holds it for one epoch tick at most
    /// (`Runtime::run_until`), and a new instance is made off it.
    fn call<T>(
        &self,
        kind: CallKind,
        f: impl for<'a> FnOnce(&'a Bindings, &'a mut Store<HostState>) -> GuestCall<'a, T>,
    ) -> Result<T, CallError> {
        self.stats.calls.fetch_add(1, Ordering::Relaxed);
        let deadline = match kind {
            CallKind::Init | CallKind::Discover | CallKind::Describe => self.runtime.config.discover_deadline,
            _ => self.runtime.config.call_deadline,
        };
        let pooled = self.take();
        let mut live = match pooled {
            Some(live) => live,
            // Instantiating copies the component's memory in (megabytes for an interpreter's).
            None => match super::deadline::off_the_worker(|| self.instantiate()) {
                Ok((live, _)) => live,
                Err(e) => return Err(self.fault(kind, e)),
            },
        };
        live.store.set_epoch_deadline(1);
        live.store.data_mut().begin_call(deadline);
        let InitedInstance { store, bindings } = &mut live;
        let outcome = self.runtime.run_until(deadline, f(bindings, store));
        live.store.data_mut().end_call();
        match outcome {
            Some(Ok(Ok(v))) => {
                self.put_back(live);
                self.succeeded();
                Ok(v)
            }
            Some(Ok(Err(msg))) => {
                self.put_back(live);
                self.succeeded();
                self.stats.guest_errors.fetch_add(1, Ordering::Relaxed);
                Err(CallError::Guest(clip(&msg).into_owned()))
            }
            Some(Err(e)) => {
                let err = self.classify(&live.store, e, deadline);
                // The instance is dropped here: after a trap its store cannot be entered again.
                Err(self.fault(kind, err))
            }
            None => {
                // Cut off while blocked in the host: the call's future (and with it the guest's
                // stack) is gone, and so is the instance.
                self.stats.timeouts.fetch_add(1, Ordering::Relaxed);
                Err(self.fault(kind, CallError::Timeout(deadline)))
            }
        }
    }

    fn succeeded(&self) {
        self.stats.record(false);
        if self.stats.breaker_open.swap(false, Ordering::Relaxed) {
            tracing::info!(backend = %self.name, "backend answered again; breaker closed");
        }
    }

    fn fault(&self, kind: CallKind, err: CallError) -> CallError {
        if !err.is_fault() {
            return err;
        }
        let n = self.stats.record(true);
        if self.sandbox.log.admit(&self.name) {
            tracing::warn!(backend = %self.name, call = kind.as_str(), error = %err, "backend call failed; its instance was discarded");
        }
        if n >= self.runtime.config.breaker_threshold as usize && !self.stats.breaker_open.swap(true, Ordering::Relaxed)
        {
            tracing::error!(
                backend = %self.name,
                faults = n,
                window = FAULT_WINDOW,
                "breaker open: the backend's devices are reported Unhealthy and allocations refused until it answers again"
            );
        }
        err
    }

    /// Drop an answer the host will not pass on, counting it.
    fn refuse(&self, call: CallKind, why: String) -> CallError {
        self.stats.refused.fetch_add(1, Ordering::Relaxed);
        let why = clip(&why).into_owned();
        if self.sandbox.refusals.first_time(&why) && self.sandbox.log.admit(&self.name) {
            tracing::error!(backend = %self.name, call = call.as_str(), "answer refused: {why}");
        }
        CallError::Refused(why)
    }

    pub fn discover(&self) -> Result<Vec<Resource>, CallError> {
        let mut found = self.call(CallKind::Discover, |b, s| Box::pin(b.discover(s)))?;
        self.sandbox.returns.discover(&mut found).map_err(|why| self.refuse(CallKind::Discover, why))?;
        if self.has_dra() && self.sandbox.describe {
            // The list stands without its description: a failed or refused `describe` costs the
            // backend its typed attributes (DRA publishes discover's strings), never its devices.
            if let Ok(d) = self.call(CallKind::Describe, |b, s| Box::pin(b.describe(s)))
                && let Err(why) = super::vet::described(&mut found, d)
            {
                drop(self.refuse(CallKind::Describe, why));
            }
        }
        Ok(found)
    }

    /// Whether the backend has the `dra` calls (WIT 0.3.0 and later).
    pub(crate) fn has_dra(&self) -> bool {
        super::bindings::has_dra(self.version)
    }

    /// The backend's edits for a claim's devices, checked against its grants like `allocate`'s;
    /// `Ok(None)` when the backend leaves it to `allocate` (always before WIT 0.3.0).
    pub fn prepare(
        &self,
        claim: &str,
        devices: &[crate::model::dra::ClaimDevice],
        config: &[String],
    ) -> Result<Option<ContainerEdits>, CallError> {
        self.refuse_if_open()?;
        if !self.has_dra() {
            return Ok(None);
        }
        let (c, d, cfg) = (claim.to_owned(), devices.to_vec(), config.to_vec());
        let edits =
            self.call(CallKind::Prepare, move |b, s| Box::pin(async move { b.prepare(s, &c, &d, &cfg).await }))?;
        let Some(mut edits) = edits else { return Ok(None) };
        let resource = devices.first().map_or("", |d| d.resource.as_str());
        self.sandbox.returns.allocate(resource, &mut edits).map_err(|why| self.refuse(CallKind::Prepare, why))?;
        Ok(Some(edits))
    }

    /// Undo `prepare` for a claim (nothing before WIT 0.3.0).
    pub fn unprepare(&self, claim: &str) -> Result<(), CallError> {
        if !self.has_dra() {
            return Ok(());
        }
        let c = claim.to_owned();
        self.call(CallKind::Unprepare, move |b, s| Box::pin(async move { b.unprepare(s, &c).await }))
    }

    pub fn preferred_allocation(
        &self,
        resource: &str,
        available: &[String],
        must_include: &[String],
        size: u32,
    ) -> Result<Vec<String>, CallError> {
        self.refuse_if_open()?;
        // The call's future owns its arguments: it must not borrow beyond the store it runs in.
        let (r, available, must) = (resource.to_owned(), available.to_vec(), must_include.to_vec());
        self.call(CallKind::PreferredAllocation, move |b, s| {
            Box::pin(async move { b.preferred_allocation(s, &r, &available, &must, size).await })
        })
    }

    pub fn allocate(&self, resource: &str, ids: &[String]) -> Result<ContainerEdits, CallError> {
        self.refuse_if_open()?;
        let (r, owned) = (resource.to_owned(), ids.to_vec());
        let mut edits =
            self.call(CallKind::Allocate, move |b, s| Box::pin(async move { b.allocate(s, &r, &owned).await }))?;
        self.sandbox.returns.allocate(resource, &mut edits).map_err(|why| self.refuse(CallKind::Allocate, why))?;
        Ok(edits)
    }

    pub fn pre_start(&self, resource: &str, ids: &[String]) -> Result<(), CallError> {
        self.refuse_if_open()?;
        let (r, ids) = (resource.to_owned(), ids.to_vec());
        self.call(CallKind::PreStart, move |b, s| Box::pin(async move { b.pre_start(s, &r, &ids).await }))
    }

    fn refuse_if_open(&self) -> Result<(), CallError> {
        if self.breaker_open() { Err(CallError::BreakerOpen) } else { Ok(()) }
    }
}

#[cfg(test)]
mod tests {
    //! One instance on an empty machine, everything granted: how calls are counted, faults
    //! open the breaker and a success closes it, and what an older WIT version is not asked.
    use super::*;
    use crate::runtime::caps::{Capabilities, Globs};
    use crate::runtime::state::Roots;
    use crate::runtime::{Runtime, RuntimeConfig};

    fn load(bytes: &[u8], config: &str, breaker_threshold: u32) -> (tempfile::TempDir, BackendInstance) {
        let dir = tempfile::tempdir().unwrap();
        for d in ["sys", "dev", "proc"] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        // A fixture device node (`Roots::fixture` reads `c MAJOR:MINOR` files): /dev/null.
        std::fs::write(dir.path().join("dev/null"), "c 1:3\n").unwrap();
        let all = Globs {
            sysfs: vec!["**".into()],
            dev: vec!["null".into()],
            procfs: vec!["**".into()],
            resources: vec!["**".into()],
            annotations: vec!["**".into()],
            env: vec!["*".into()],
            ..Globs::default()
        };
        let caps = Capabilities::new(&all, &all).unwrap();
        let rt = Runtime::new(RuntimeConfig { breaker_threshold, ..RuntimeConfig::default() }).unwrap();
        let sandbox = Sandbox::new("t", &caps, &Roots::fixture(dir.path()), 64 << 20);
        let inst = BackendInstance::load(&rt, bytes, config.into(), sandbox).unwrap();
        (dir, inst)
    }

    fn chaos() -> Vec<u8> {
        let (path, _) = crate::backends::embedded::test_program("chaos").expect("chaos is built");
        std::fs::read(path).unwrap()
    }

    /// Faults in the window open the breaker at the threshold; then calls are refused without
    /// reaching the backend; the next success (a discover, which runs whatever the breaker) closes it.
    #[test]
    fn faults_open_the_breaker_and_a_success_closes_it() {
        let (_dir, inst) = load(&chaos(), "devices=2", 2);
        let trap = || inst.allocate("test.devplug.io/widget", &["trap-1".into()]);
        assert!(matches!(trap(), Err(CallError::Trap(_))));
        assert!(!inst.breaker_open(), "one fault is under the threshold");
        assert!(matches!(trap(), Err(CallError::Trap(_))));
        assert!(inst.breaker_open(), "the second opens it");
        let calls = inst.stats.calls.load(Ordering::Relaxed);
        assert_eq!(inst.allocate("test.devplug.io/widget", &["widget-0".into()]), Err(CallError::BreakerOpen));
        assert_eq!(inst.stats.calls.load(Ordering::Relaxed), calls, "refused without a call");
        assert_eq!(inst.stats.traps.load(Ordering::Relaxed), 2);
        inst.discover().unwrap();
        assert!(!inst.breaker_open(), "a success closes it");
        assert!(inst.allocate("test.devplug.io/widget", &["widget-0".into()]).is_ok());
    }

    /// A guest that spins, called right on an async worker (as kubelet's calls are), holds it
    /// for one epoch tick at most: on a runtime of one worker, another task runs while the call
    /// is under way (it would not if the call kept the worker to its deadline), and the call
    /// still ends at its deadline; a call that finishes never leaves the worker.
    #[test]
    fn a_spinning_call_on_an_async_worker_lets_the_workers_other_tasks_run() {
        use std::sync::atomic::AtomicU8;
        let (_dir, inst) = load(&chaos(), "devices=2", 10);
        let inst = Arc::new(inst);
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        // 0: before the call, 1: under way, 2: over; the watcher records what it saw.
        let phase = Arc::new(AtomicU8::new(0));
        let seen_under_way = Arc::new(AtomicBool::new(false));
        let (p, seen) = (phase.clone(), seen_under_way.clone());
        rt.block_on(async move {
            let watcher = tokio::spawn(async move {
                while p.load(Ordering::SeqCst) < 2 {
                    if p.load(Ordering::SeqCst) == 1 {
                        seen.store(true, Ordering::SeqCst);
                    }
                    tokio::task::yield_now().await;
                }
            });
            let spinning = tokio::spawn({
                let (inst, phase) = (inst.clone(), phase.clone());
                async move {
                    assert!(
                        inst.allocate("test.devplug.io/widget", &["widget-0".into()]).is_ok(),
                        "a call that finishes"
                    );
                    phase.store(1, Ordering::SeqCst);
                    let out = inst.allocate("test.devplug.io/widget", &["spin-0".into()]);
                    phase.store(2, Ordering::SeqCst);
                    out
                }
            });
            assert!(matches!(spinning.await.unwrap(), Err(CallError::Timeout(_))));
            watcher.await.unwrap();
        });
        assert!(seen_under_way.load(Ordering::SeqCst), "the worker's other task ran while the guest spun");
    }

    /// A backend built against WIT 0.2.0 has no `dra` calls: `prepare` leaves the edits to
    /// `allocate` and `unprepare` has nothing to undo, neither reaching the backend.
    #[test]
    fn a_backend_before_0_3_is_not_asked_to_prepare_or_unprepare() {
        let bytes = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/compat/v0.2.0.wasm")).unwrap();
        let (_dir, inst) = load(&bytes, "", 3);
        assert_eq!(inst.wit_version(), "0.2.0");
        assert!(!inst.has_dra());
        let calls = inst.stats.calls.load(Ordering::Relaxed);
        assert_eq!(inst.prepare("uid-1", &[], &[]), Ok(None));
        assert_eq!(inst.unprepare("uid-1"), Ok(()));
        assert_eq!(inst.stats.calls.load(Ordering::Relaxed), calls, "no call made");
    }
}
