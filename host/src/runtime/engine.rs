//! The shared wasmtime engines: configuration, compiling (through the compile cache keyed by
//! the component's sha256 and the engine's compatibility hash, [`super::code_cache`]), running a
//! guest call under its deadline ([`super::deadline`]), and the two compiler tiers: a large component with no optimised code at hand loads with the baseline
//! compiler (Winch: seconds) and serves from it; its optimised (Cranelift) code is compiled
//! after, at idle priority, by [`super::optimizer`], and swapped in when ready. The same path
//! with or without a cache (the cache only spares the next load the compile).

use crate::sync::Locked;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

use super::LoadError;
use super::code_cache::{create_private_dir, evict, store, write_native};
use super::deadline::{CUTOFF_SLACK, Cutoff, Cutoffs, InFlight, Timers, spawn_ticker};

/// Components from this size on load baseline-compiled first: Python's and JavaScript's (12–18
/// MB, their interpreter inside), never a Rust backend (0.1–0.4 MB, compiled optimised in well
/// under a second).
pub const BASELINE_FROM: usize = 4 << 20;

/// Limits and paths for every backend call.
#[derive(Clone, Debug)]
pub struct RuntimeConfig {
    /// Deadline of `init` and `discover`.
    pub discover_deadline: Duration,
    /// Deadline of `allocate`, `preferred-allocation`, `pre-start`, `prepare` and `unprepare`.
    pub call_deadline: Duration,
    /// Linear memory an instance may have.
    pub memory_cap: usize,
    /// Faults in a row that open a backend's breaker.
    pub breaker_threshold: u32,
    /// Where compiled components are cached; `None` disables the cache.
    pub cache_dir: Option<PathBuf>,
    /// Native code compiled at build time, by the sha256 of the component it came from (the
    /// embedded backends'); used when it fits this engine and CPU, else the component is compiled.
    pub precompiled: &'static [(&'static str, &'static [u8])],
    /// Components at least this large, with no optimised code in the cache, load with the
    /// baseline compiler first (`usize::MAX`: never).
    pub baseline_from: usize,
    /// After a baseline load, compile the optimised code in the background (at idle priority)
    /// and swap it in (a long-running `run`); one-shot commands leave it off.
    pub optimize_in_background: bool,
    /// The most compiled code the cache keeps, in bytes: past it the least recently used
    /// entries go (the manifests put the cache on a 256 MiB `emptyDir`; versions accumulated
    /// until the pod was evicted).
    pub cache_max_bytes: u64,
    /// The executable every compile of a component runs in ([`super::compile_worker`]), under
    /// [`RuntimeConfig::compile_budget`]: the `devplug` binary itself (registered by its
    /// `main`). `None` compiles in this process, unbounded: only a test binary linking the
    /// library, which has no worker, runs so.
    pub compile_worker: Option<PathBuf>,
    /// What one compile may use (memory and CPU seconds), enforced by the kernel on the worker.
    pub compile_budget: super::compile_worker::CompileBudget,
    /// The id of the operator's key (`registry.operator_key`,
    /// [`crate::oci::signature::key_id`]): native code it signed is kept in the compile cache
    /// under this id and loaded from there only while the key is the same, so code signed by
    /// a key the operator replaced is never loaded again.
    pub operator_key: Option<String>,
}

/// [`RuntimeConfig::cache_max_bytes`]'s default: room for the embedded set, two versions of a
/// large (18 MB Python) backend in both tiers and more, inside a 256 MiB volume with the pulled
/// registry versions beside it.
pub const CACHE_MAX_BYTES: u64 = 192 << 20;

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            discover_deadline: Duration::from_secs(2),
            call_deadline: Duration::from_millis(250),
            memory_cap: 64 << 20,
            breaker_threshold: 3,
            cache_dir: None,
            precompiled: &[],
            baseline_from: BASELINE_FROM,
            optimize_in_background: true,
            cache_max_bytes: CACHE_MAX_BYTES,
            compile_worker: super::compile_worker::registered(),
            compile_budget: super::compile_worker::DEFAULT_BUDGET,
            operator_key: None,
        }
    }
}

/// Whether a component came from the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheOutcome {
    /// Native code built into the binary (an embedded backend): nothing compiled.
    Precompiled,
    /// Native code `devplug precompile` made for the cluster, signed by the operator's key
    /// (`registry.operator_key`): nothing compiled on this node.
    Signed,
    Hit,
    Miss,
    Disabled,
}

/// Which compiler made a component's native code.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// Cranelift, optimising: the code every backend ends up running.
    #[default]
    Optimized,
    /// Winch, single-pass: a large component's first load, until its optimised code is ready.
    Baseline,
}

/// A compiled component, where it came from, and the sha256 of its wasm (its identity in logs,
/// metrics and the cache).
pub struct Compiled {
    pub component: Component,
    pub cache: CacheOutcome,
    pub digest: String,
    pub tier: Tier,
}

/// One compiler tier: its engine, the hash that keys its cache entries, its linkers.
struct Compiler {
    engine: Engine,
    hash: u64,
    linkers: super::bindings::Linkers,
    tier: Tier,
}

impl Compiler {
    fn new(config: &wasmtime::Config, tier: Tier) -> anyhow::Result<Compiler> {
        let engine = Engine::new(config)?;
        let mut h = DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut h);
        Ok(Compiler { engine, hash: h.finish(), linkers: Default::default(), tier })
    }

    /// The cache file of a component's code from this compiler.
    fn entry(&self, digest: &str) -> String {
        match self.tier {
            Tier::Optimized => format!("{digest}-{:016x}.cwasm", self.hash),
            Tier::Baseline => format!("{digest}-{:016x}-baseline.cwasm", self.hash),
        }
    }

    /// The cache file of a component's native code signed by operator key `key`.
    fn signed_entry(&self, digest: &str, key: &str) -> String {
        format!("{digest}-{:016x}-signed-{key}.cwasm", self.hash)
    }
}

/// The engines every backend shares.
pub struct Runtime {
    optimized: Compiler,
    /// `None` where Winch does not compile.
    baseline: Option<Compiler>,
    pub config: RuntimeConfig,
    pub cache_hits: AtomicU64,
    /// Optimised code for components loaded baseline-compiled.
    optimizer: Arc<super::optimizer::Optimizer>,
    /// Drives the WASI clocks of guest calls (see [`Runtime::run_until`]).
    timers: Timers,
    /// Deadlines of guest calls that are waiting in the host, woken by the epoch thread.
    cutoffs: Arc<Cutoffs>,
    /// Guest calls under way: the epoch thread ticks only while there is one.
    in_flight: Arc<InFlight>,
    /// Code compiled ahead of its load ([`Runtime::prepare`]), by digest, taken by the first
    /// [`Runtime::compile`] of the same bytes.
    prepared: std::sync::Mutex<std::collections::HashMap<String, Compiled>>,
    /// The one compile worker at a time ([`super::compile_worker::Slot`]).
    slot: Arc<super::compile_worker::Slot>,
}

impl Runtime {
    pub fn new(config: RuntimeConfig) -> anyhow::Result<Arc<Self>> {
        let optimized = Compiler::new(&super::engine_config::engine_config(), Tier::Optimized)?;
        let baseline = match super::engine_config::baseline_engine_config() {
            Some(c) => Some(Compiler::new(&c, Tier::Baseline)?),
            None => None,
        };
        let cutoffs = Arc::new(Cutoffs::default());
        let in_flight = Arc::new(InFlight::default());
        let engines: Vec<&Engine> =
            std::iter::once(&optimized.engine).chain(baseline.as_ref().map(|b| &b.engine)).collect();
        spawn_ticker(&engines, cutoffs.clone(), in_flight.clone());
        if let Some(dir) = &config.cache_dir {
            create_private_dir(dir)?;
            // What a killed devplug left (a whole entry's temp file) goes now, and the cache
            // starts within its bound.
            if let Ok(state) = crate::durable::StateDir::open(dir) {
                evict(&state, dir, "", config.cache_max_bytes);
            }
        }
        let timers = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("devplug-guest-timers")
            .enable_all()
            .build()?;
        Ok(Arc::new(Runtime {
            optimized,
            baseline,
            config,
            cache_hits: AtomicU64::new(0),
            optimizer: Arc::default(),
            timers: Timers(Some(timers)),
            cutoffs,
            in_flight,
            prepared: Default::default(),
            slot: Arc::default(),
        }))
    }

    /// Compile `bytes` now, for a [`Runtime::compile`] of the same bytes later to take at once:
    /// a devplug standing by for the instance lock compiles every backend it will serve while
    /// the old one still serves, so it serves within moments of taking over. A component that
    /// fails to compile is left for that later compile to fail on, and say so. Blocking.
    pub fn prepare(&self, backend: Option<&str>, bytes: &[u8], signed: Option<crate::durable::Spooled>) {
        let digest = sha256_hex(bytes);
        if self.prepared.locked().contains_key(&digest) {
            return;
        }
        if let Ok(compiled) = self.compile_for(backend, bytes, signed) {
            self.prepared.locked().insert(digest, compiled);
        }
    }

    /// Drop what was prepared and not loaded (a backend removed while standing by).
    pub(crate) fn forget_prepared(&self) {
        self.prepared.locked().clear();
    }

    /// Run a guest call on this thread until it finishes or `deadline` (plus a little slack)
    /// passes; `None` when it was cut off. Its first slice runs right here: until it finishes,
    /// waits in a host function, or yields at the next epoch tick (every [`EPOCH_TICK`](super::deadline::EPOCH_TICK) a
    /// running guest gives its thread back, see [`yield_or_trap`](super::deadline::yield_or_trap)), so on one of the daemon's
    /// async workers a call holds the worker for one tick at most. A call that is not done by
    /// then goes on inside `block_in_place` there (the worker's other tasks move away), or
    /// blocks a blocking thread or the CLI's main thread. Kubelet's calls take microseconds:
    /// they finish in the first slice and never pay `block_in_place`'s hand-off of the worker
    /// (a thread woken per call: a tenth of the unprepare round trip under CPU load).
    pub(crate) fn run_until<T>(&self, deadline: Duration, call: impl std::future::Future<Output = T>) -> Option<T> {
        let handle = self.timers.0.as_ref()?.handle();
        let _ticking = self.in_flight.enter();
        let cutoff = Cutoff::at(std::time::Instant::now() + deadline + CUTOFF_SLACK, self.cutoffs.clone());
        let call = std::pin::pin!(call);
        let cutoff = std::pin::pin!(cutoff);
        // `select` polls the call first: one that finishes without waiting never polls (and so
        // never registers) its cut-off.
        let mut both = futures::future::select(call, cutoff);
        let first = {
            // The WASI clocks' timers are the engine's runtime's, whichever thread this is.
            let _timers = handle.enter();
            let waker = futures::task::noop_waker();
            std::future::Future::poll(std::pin::Pin::new(&mut both), &mut std::task::Context::from_waker(&waker))
        };
        // `block_on` polls at once: nothing the first poll's waker missed is lost.
        let done = match first {
            std::task::Poll::Ready(done) => done,
            std::task::Poll::Pending => super::deadline::off_the_worker(|| handle.block_on(both)),
        };
        match done {
            futures::future::Either::Left((out, _)) => Some(out),
            futures::future::Either::Right(((), _)) => None,
        }
    }

    /// The optimising engine (the one embedded backends and type queries use).
    pub fn engine(&self) -> &Engine {
        &self.optimized.engine
    }

    /// The linkers of the engine `component` was compiled for.
    pub(crate) fn linkers_for(&self, component: &Component) -> &super::bindings::Linkers {
        match &self.baseline {
            Some(b) if Engine::same(component.engine(), &b.engine) => &b.linkers,
            _ => &self.optimized.linkers,
        }
    }

    /// Compile `bytes` (or load the native code this host compiled for them before). Large
    /// components with no optimised code at hand load baseline-compiled (see [`BASELINE_FROM`]
    /// and [`Runtime::optimize_later`]), with a cache or without.
    pub fn compile(&self, bytes: &[u8]) -> Result<Compiled, LoadError> {
        self.compile_for(None, bytes, None)
    }

    /// [`Runtime::compile`] for a load that knows more:
    ///
    /// - `signed`: native code for `bytes` that the operator's key signed
    ///   ([`crate::oci::native`] verified it and its binding to this component and engine): it
    ///   is loaded (and kept in the compile cache) instead of compiling, unless the cache already
    ///   holds optimised code. Code that does not load into this engine (another CPU, a damaged
    ///   artifact) is said in one line and the component is compiled as without it.
    /// - `backend`: the backend it is. A large component of a backend whose earlier version
    ///   this node optimised is compiled optimised at once, from that compile's functions
    ///   ([`super::incremental`]), rather than baseline first; should that compile fail or go
    ///   over its budget, the tiered path follows.
    pub fn compile_for(
        &self,
        backend: Option<&str>,
        bytes: &[u8],
        signed: Option<crate::durable::Spooled>,
    ) -> Result<Compiled, LoadError> {
        check_header(bytes)?;
        let digest = sha256_hex(bytes);
        if let Some(compiled) = self.prepared.locked().remove(&digest) {
            return Ok(compiled);
        }
        let done = |component, cache, tier| Compiled { component, cache, digest: digest.clone(), tier };
        if let Some(component) = self.precompiled(&digest) {
            return Ok(done(component, CacheOutcome::Precompiled, Tier::Optimized));
        }
        // Signed code kept before, while the operator's key is the one that signed it.
        let signed_entry = self.config.operator_key.as_deref().map(|key| self.optimized.signed_entry(&digest, key));
        let cache = self.config.cache_dir.as_deref().and_then(|d| Some((crate::durable::StateDir::open(d).ok()?, d)));
        if let (Some((state, dir)), Some(entry)) = (&cache, &signed_entry)
            && let Some(c) = self.cached_entry(state, dir, &self.optimized, entry)
        {
            return Ok(done(c, CacheOutcome::Signed, Tier::Optimized));
        }
        if let Some(native) = signed {
            if let Some(c) = cache.as_ref().and_then(|(state, dir)| self.cached(state, dir, &self.optimized, &digest)) {
                return Ok(done(c, CacheOutcome::Hit, Tier::Optimized));
            }
            if let (Some((state, dir)), Some(name)) = (&cache, &signed_entry) {
                // Kept first, then mapped from there: the code pages in as it runs instead of
                // a whole copy beside the download (37 MB for the 12 MB JavaScript example).
                if let Err(e) = state.write_with(name, |f| native.write_into(f), false) {
                    tracing::warn!(dir = %dir.display(), error = %e, "could not keep the operator-signed native code; compiling it here instead");
                    return self.compile_for(backend, bytes, None);
                }
                super::heap::release_freed();
                match self.mapped(state, name) {
                    Ok(component) => {
                        evict(state, dir, name, self.config.cache_max_bytes);
                        return Ok(done(component, CacheOutcome::Signed, Tier::Optimized));
                    }
                    Err(e) => {
                        let _ = state.remove(name);
                        tracing::warn!(
                            digest = &digest[..12],
                            reason = %format!("{e:#}"),
                            "the operator-signed native code does not load into this engine; compiling it here instead"
                        );
                        return self.compile_for(backend, bytes, None);
                    }
                }
            }
            // No compile cache to keep it in: loaded from memory.
            let native = match native.into_bytes() {
                Ok(b) => b,
                Err(e) => {
                    tracing::warn!(error = %e, "could not read the operator-signed native code; compiling it here instead");
                    return self.compile_for(backend, bytes, None);
                }
            };
            // SAFETY: `native` is what the operator's key signed for this component's digest and
            // this engine's fingerprint (checked by `oci::native::fetch` before it got here): the
            // operator vouches that `devplug precompile` made it, which is the trust
            // `deserialize` asks for; deserialize still checks that it fits this engine and CPU.
            match unsafe { Component::deserialize(&self.optimized.engine, &native) } {
                Ok(component) => return Ok(done(component, CacheOutcome::Signed, Tier::Optimized)),
                Err(e) => tracing::warn!(
                    digest = &digest[..12],
                    reason = %format!("{e:#}"),
                    "the operator-signed native code does not load into this engine; compiling it here instead"
                ),
            }
        }
        let baseline = self.baseline.as_ref().filter(|_| bytes.len() >= self.config.baseline_from);
        let Some(dir) = &self.config.cache_dir else {
            let compiler = baseline.unwrap_or(&self.optimized);
            let (component, _) = self.build(compiler, bytes)?;
            return Ok(done(component, CacheOutcome::Disabled, compiler.tier));
        };
        // Native code is loaded from here, so the directory must be devplug's alone: created
        // 0700, checked to be its user's and writable by no one else, and its files opened
        // without following links (`StateDir`). Anything else: compile, cache nothing.
        let state = match crate::durable::StateDir::open(dir) {
            Ok(state) => Some(state),
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "compile cache refused; compiling without it");
                None
            }
        };
        if let Some(c) = state.as_ref().and_then(|s| self.cached(s, dir, &self.optimized, &digest)) {
            return Ok(done(c, CacheOutcome::Hit, Tier::Optimized));
        }
        let compiler = baseline.unwrap_or(&self.optimized);
        if compiler.tier == Tier::Baseline
            && let Some(c) = state.as_ref().and_then(|s| self.cached(s, dir, compiler, &digest))
        {
            return Ok(done(c, CacheOutcome::Hit, Tier::Baseline));
        }
        if compiler.tier == Tier::Baseline
            && let (Some(state), Some(backend)) = (&state, backend)
            && let Some(c) = self.build_incremental(state, dir, backend, &digest, bytes)
        {
            return Ok(done(c, CacheOutcome::Miss, Tier::Optimized));
        }
        let (component, native) = self.build(compiler, bytes)?;
        // Baseline code a background compile will follow is cached by that compile's job
        // ([`Runtime::optimize_later`]), at idle priority: not on the way to serving.
        let deferred = compiler.tier == Tier::Baseline && self.config.optimize_in_background;
        if let (Some(state), false) = (&state, deferred) {
            let name = compiler.entry(&digest);
            match native {
                Some(native) => {
                    write_native(state, dir, &name, &native);
                    evict(state, dir, &name, self.config.cache_max_bytes);
                }
                None => store(state, dir, &name, &component, self.config.cache_max_bytes),
            }
        }
        Ok(done(component, CacheOutcome::Miss, compiler.tier))
    }

    /// The optimised code of `bytes` (component `digest` of `backend`) compiled now with the
    /// incremental cache the backend's last optimised compile left, the cache replaced by this
    /// compile's; `None` (said in one line) when there is no such cache, no worker, or the
    /// compile failed or met [`INCREMENTAL_BUDGET`]'s CPU bound.
    fn build_incremental(
        &self,
        state: &crate::durable::StateDir,
        dir: &Path,
        backend: &str,
        digest: &str,
        bytes: &[u8],
    ) -> Option<Component> {
        let exe = self.config.compile_worker.as_ref()?;
        let entry = super::incremental::entry(backend, self.optimized.hash);
        if !state.exists(&entry) {
            return None;
        }
        let started = std::time::Instant::now();
        let job = super::compile_worker::Job { tier: Tier::Optimized, serial: false, idle: false, portable: false };
        let budget = super::compile_worker::CompileBudget {
            cpu_base_secs: INCREMENTAL_BUDGET.cpu_base_secs.min(self.config.compile_budget.cpu_base_secs),
            cpu_secs_per_mib: INCREMENTAL_BUDGET.cpu_secs_per_mib.min(self.config.compile_budget.cpu_secs_per_mib),
            ..self.config.compile_budget.clone()
        };
        let cap = self.config.cache_max_bytes / 2;
        let done =
            super::compile_worker::compile_incremental(exe, &self.slot, job, bytes, &budget, (state, &entry, cap));
        let short = &digest[..12.min(digest.len())];
        let (native, reused) = match done {
            Ok(d) => d,
            Err(e) => {
                tracing::info!(backend, digest = short, reason = %e, "the optimised compile from the version before's functions did not finish; loading baseline code first");
                return None;
            }
        };
        // Kept first, then mapped from there (as signed code is): no whole copy of the code
        // beside the worker's answer.
        let name = self.optimized.entry(digest);
        let kept = write_native(state, dir, &name, &native.code);
        let loaded = if kept {
            drop(native);
            super::heap::release_freed();
            self.mapped(state, &name)
        } else {
            // SAFETY: as in `build`: what this executable's worker made from these bytes just
            // now with the optimising engine's configuration; deserialize checks they agree.
            unsafe { Component::deserialize(&self.optimized.engine, &native.code) }.map_err(anyhow::Error::from)
        };
        let component = match loaded {
            Ok(c) => c,
            Err(e) => {
                let _ = state.remove(&name);
                tracing::warn!(backend, digest = short, error = %format!("{e:#}"), "the optimised code compiled from the version before's functions did not load; loading baseline code first");
                return None;
            }
        };
        evict(state, dir, &name, self.config.cache_max_bytes);
        tracing::info!(
            backend,
            digest = short,
            reused = reused.hits,
            compiled = reused.misses,
            ms = started.elapsed().as_millis() as u64,
            "compiled optimised at once from the version before's functions"
        );
        Some(component)
    }

    /// Compile `bytes` with `compiler`: in the worker under the budget when there is one (its
    /// native code returned too, for the cache), else here.
    fn build(&self, compiler: &Compiler, bytes: &[u8]) -> Result<(Component, Option<Vec<u8>>), LoadError> {
        let Some(exe) = &self.config.compile_worker else {
            let component = compile_with(&compiler.engine, bytes);
            // The compiler's working set (hundreds of MB for a large component) is garbage now.
            super::heap::release_freed();
            return Ok((component?, None));
        };
        let job = super::compile_worker::Job { tier: compiler.tier, serial: false, idle: false, portable: false };
        let native = super::compile_worker::compile(exe, &self.slot, job, bytes, &self.config.compile_budget)
            .map_err(compile_error)?;
        // SAFETY: `native` is what this very executable (the worker is `/proc/self/exe`, or the
        // path the embedder named) made from these bytes just now with this tier's engine
        // configuration; deserialize still checks that it fits this engine and CPU.
        let component = unsafe { Component::deserialize(&compiler.engine, &native.code) }
            .map_err(|e| LoadError::Internal(format!("the compile worker's code did not load: {e:#}")))?;
        tracing::debug!(
            tier = ?compiler.tier,
            cpu_secs = native.cpu.as_secs_f64(),
            peak_mib = native.peak_bytes >> 20,
            "compiled in the worker"
        );
        Ok((component, Some(native.code)))
    }

    /// The optimised code in cache file `name` (signed by the operator, or just compiled by
    /// this node's worker), mapped rather than read: its pages come in as the code runs.
    fn mapped(&self, state: &crate::durable::StateDir, name: &str) -> anyhow::Result<Component> {
        use std::os::fd::AsRawFd;
        let file = state.open_read(name)?;
        // The descriptor's own path: the file opened without following links is the one mapped.
        let path = format!("/proc/self/fd/{}", file.as_raw_fd());
        // SAFETY: the file is the code `compile_for` just wrote: operator-signed (see its SAFETY
        // note for the trust) or this executable's worker's, in the compile cache dir that is devplug's user's alone
        // (0700, checked), opened without following links. A mapping stays valid for the code's
        // life: devplug replaces cache files only by rename and removes them by unlink, which
        // never change a mapped inode's bytes, so the SIGBUS a file truncated in place would
        // cause needs a writer with devplug's own user; deserialize checks the engine.
        let component = unsafe { Component::deserialize_file(&self.optimized.engine, &path) }?;
        drop(file);
        Ok(component)
    }

    /// `compiler`'s cached code of the component with this digest, if it is there and loads.
    fn cached(
        &self,
        state: &crate::durable::StateDir,
        dir: &Path,
        compiler: &Compiler,
        digest: &str,
    ) -> Option<Component> {
        self.cached_entry(state, dir, compiler, &compiler.entry(digest))
    }

    /// The code in cache file `name`, if it is there and loads into `compiler`'s engine.
    fn cached_entry(
        &self,
        state: &crate::durable::StateDir,
        dir: &Path,
        compiler: &Compiler,
        name: &str,
    ) -> Option<Component> {
        let path = dir.join(name);
        let native = state
            .read(name)
            .inspect_err(|e| tracing::warn!(path = %path.display(), error = %e, "compile cache entry refused"))
            .ok()??;
        // Read into memory rather than mmap the file: a cache file truncated or rewritten under
        // a running host would otherwise turn into SIGBUS in live code.
        // SAFETY: the cache dir is devplug's user's alone (0700, checked), files are keyed by the
        // wasm's hash and this engine's compatibility hash (a signed entry also by the operator
        // key that signed it, checked before it was written), opened without following links,
        // and only this code writes them (atomically, by rename); deserialize still checks the
        // engine compatibility.
        match unsafe { Component::deserialize(&compiler.engine, &native) } {
            Ok(c) => {
                self.cache_hits.fetch_add(1, Ordering::Relaxed);
                // Recently used is what eviction keeps.
                let _ = state.mark_used(name);
                tracing::debug!(path = %path.display(), "loaded compiled backend from cache");
                Some(c)
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "discarding unusable cache entry");
                let _ = state.remove(name);
                None
            }
        }
    }

    /// Queue the optimised compile of component `digest` (loaded baseline-compiled as
    /// `baseline`) on the background optimiser, after what is queued; its code comes back on
    /// the receiver, and dropping the receiver says it is no longer wanted. With a compile cache
    /// the job first writes the baseline code there (a restart before the optimised code is
    /// ready loads it), then the optimised code, which replaces it. `None` when this runtime does
    /// no background compiles (one-shot commands) or this version went over its budget before.
    pub(crate) fn optimize_later(
        &self,
        backend: &str,
        digest: &str,
        bytes: Arc<[u8]>,
        baseline: Option<Component>,
    ) -> Option<tokio::sync::oneshot::Receiver<Component>> {
        if !self.config.optimize_in_background {
            return None;
        }
        let marker = format!("{digest}-{:016x}.over-budget", self.optimized.hash);
        let budget = budget_text(&self.config.compile_budget);
        if self.optimizer.gave_up(digest) || self.marked_over_budget(&marker, &budget) {
            tracing::warn!(
                backend,
                digest = &digest[..12.min(digest.len())],
                "this version's optimised compile went over its budget before: it serves from baseline code (a larger `compile_memory_mb` or `compile_cpu_secs` lets it be tried again)"
            );
            return None;
        }
        let keep = self.config.cache_dir.clone().map(|dir| super::optimizer::Keep {
            dir,
            max_bytes: self.config.cache_max_bytes,
            baseline_entry: self.baseline.as_ref().map(|b| b.entry(digest)),
            baseline: baseline.filter(|_| self.baseline.is_some()),
            optimized_entry: self.optimized.entry(digest),
            incremental_entry: super::incremental::entry(backend, self.optimized.hash),
            over_budget_marker: marker,
            budget,
        });
        let worker = self.config.compile_worker.clone().map(|exe| super::optimizer::Worker {
            exe,
            budget: self.config.compile_budget.clone(),
            slot: self.slot.clone(),
        });
        let (deliver, receiver) = tokio::sync::oneshot::channel();
        self.optimizer.push(super::optimizer::Job {
            backend: backend.to_owned(),
            digest: digest.to_owned(),
            worker,
            engine: self.optimized.engine.clone(),
            keep,
            bytes,
            deliver,
        });
        Some(receiver)
    }

    /// Whether the cache holds `marker` (a compile over `budget`, or a larger one, before).
    fn marked_over_budget(&self, marker: &str, budget: &str) -> bool {
        let Some(dir) = &self.config.cache_dir else { return false };
        let Ok(state) = crate::durable::StateDir::open(dir) else { return false };
        match state.read(marker) {
            Ok(Some(was)) => std::str::from_utf8(&was).is_ok_and(|was| budget_at_most(budget, was)),
            _ => false,
        }
    }

    /// Whether component `digest` waits for, or is getting, its optimised code.
    pub fn optimizing(&self, digest: &str) -> bool {
        self.optimizer.pending(digest)
    }

    /// Wait for the background compiles queued so far (tests, benchmarks, a clean exit).
    pub fn finish_background_compiles(&self) {
        self.optimizer.wait_idle();
    }

    /// The build-time native code of the component with this digest, if there is some and it
    /// fits this engine and CPU.
    fn precompiled(&self, digest: &str) -> Option<Component> {
        let (_, native) = self.config.precompiled.iter().find(|(d, _)| *d == digest)?;
        // SAFETY: the table holds what this binary's own build script produced from these very
        // bytes (the digest) with `engine_config`; deserialize still checks that the artifact
        // fits this engine's settings and this CPU's features.
        match unsafe { Component::deserialize(&self.optimized.engine, native) } {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::info!(
                    digest,
                    reason = %format!("{e:#}"),
                    "the precompiled code of an embedded backend does not fit this CPU or engine; compiling it instead"
                );
                None
            }
        }
    }
}

/// The most CPU an optimised compile from the version before's functions may take on the way
/// to serving (at most the configured budget): past it the version loads from baseline code
/// first, as without a cache. A version sharing its functions with the one before compiles well
/// within it (docs/BENCHMARKS.md, "Incremental"); one sharing little meets it, and pays that
/// time before its baseline load.
pub const INCREMENTAL_BUDGET: super::compile_worker::CompileBudget =
    super::compile_worker::CompileBudget { memory_bytes: 0, cpu_base_secs: 4, cpu_secs_per_mib: 1 };

/// A budget as kept in an over-budget marker: `MEMORY_BYTES CPU_BASE CPU_PER_MIB`.
fn budget_text(b: &super::compile_worker::CompileBudget) -> String {
    format!("{} {} {}", b.memory_bytes, b.cpu_base_secs, b.cpu_secs_per_mib)
}

/// Whether budget `now` gives nothing more than `was` (both [`budget_text`]): a compile over
/// `was` would go over `now` too. A marker that does not parse counts as no marker.
fn budget_at_most(now: &str, was: &str) -> bool {
    let nums = |t: &str| t.split(' ').map(|n| n.parse::<u64>().ok()).collect::<Option<Vec<u64>>>();
    match (nums(now), nums(was)) {
        (Some(a), Some(b)) if a.len() == 3 && b.len() == 3 => a.iter().zip(&b).all(|(a, b)| a <= b),
        _ => false,
    }
}

/// Compile `bytes` with `engine` in this process, a truncated file said as such.
fn compile_with(engine: &Engine, bytes: &[u8]) -> Result<Component, LoadError> {
    Component::new(engine, bytes).map_err(|e| invalid(format!("{e:#}")))
}

/// A compile the worker could not finish, as a load error.
fn compile_error(e: super::compile_worker::CompileError) -> LoadError {
    match e {
        super::compile_worker::CompileError::Invalid(msg) => invalid(msg),
        e => LoadError::Compile(e),
    }
}

/// The compiler's refusal, a truncated file said as such.
fn invalid(msg: String) -> LoadError {
    // A section reaching past the end is what a half-written or cut-off file looks like.
    if msg.contains("out of bounds") || msg.contains("unexpected end") {
        LoadError::Invalid(format!("the file is truncated (or corrupt): {msg}"))
    } else {
        LoadError::Invalid(msg)
    }
}

/// Tell garbage, core modules and components apart before handing bytes to cranelift.
pub(crate) fn check_header(bytes: &[u8]) -> Result<(), LoadError> {
    if bytes.len() < 8 || &bytes[..4] != b"\0asm" {
        return Err(LoadError::NotWasm);
    }
    // Core modules carry version 1 and layer 0; components carry layer 1.
    if bytes[4..8] == [1, 0, 0, 0] {
        return Err(LoadError::CoreModule);
    }
    Ok(())
}

/// Hex sha256 of a component: its identity in logs, metrics and the cache.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The epoch thread ticks only while a call is under way: counted for the whole call, a
    /// call cut off at its deadline included, and not after.
    #[test]
    fn calls_are_counted_while_under_way_and_not_after() {
        let rt = Runtime::new(RuntimeConfig::default()).unwrap();
        assert!(!rt.in_flight.busy(), "an idle engine has no call under way");
        let seen = rt.run_until(Duration::from_secs(5), async { rt.in_flight.busy() });
        assert_eq!(seen, Some(true));
        assert!(!rt.in_flight.busy());
        let cut = rt.run_until(Duration::from_millis(1), std::future::pending::<()>());
        assert_eq!(cut, None, "cut off at its deadline: the epoch thread woke its cut-off while ticking");
        assert!(!rt.in_flight.busy(), "a call cut off is no longer counted");
    }

    #[test]
    fn headers_are_told_apart() {
        assert!(matches!(check_header(b"hello world"), Err(LoadError::NotWasm)));
        assert!(matches!(check_header(b"\0asm"), Err(LoadError::NotWasm)));
        assert!(matches!(check_header(b"\0asm\x01\0\0\0"), Err(LoadError::CoreModule)));
        assert!(check_header(b"\0asm\x0d\0\x01\0").is_ok());
    }

    #[test]
    fn precompiled_code_is_used_when_it_fits_and_compiled_around_when_not() {
        let (_, wasm, _) = crate::backends::embedded::FIRST_PARTY[0];
        let digest = sha256_hex(wasm);
        // What build.rs does: the same configuration, a portable CPU baseline.
        let portable = super::super::engine_config::portable_engine_config(env!("DEVPLUG_BUILD_TARGET")).unwrap();
        let native: &'static [u8] = Engine::new(&portable).unwrap().precompile_component(wasm).unwrap().leak();
        let table: &'static [(&'static str, &'static [u8])] = vec![(&*digest.clone().leak(), native)].leak();
        let rt = Runtime::new(RuntimeConfig { precompiled: table, ..RuntimeConfig::default() }).unwrap();
        assert_eq!(rt.compile(wasm).unwrap().cache, CacheOutcome::Precompiled);
        // Code from an engine configured differently (no epoch interruption) does not fit: the
        // component is compiled instead, and still loads.
        let mut other = super::super::engine_config::engine_config();
        other.epoch_interruption(false);
        let alien: &'static [u8] = Engine::new(&other).unwrap().precompile_component(wasm).unwrap().leak();
        let table: &'static [(&'static str, &'static [u8])] = vec![(&*digest.leak(), alien)].leak();
        let rt = Runtime::new(RuntimeConfig { precompiled: table, ..RuntimeConfig::default() }).unwrap();
        assert_eq!(rt.compile(wasm).unwrap().cache, CacheOutcome::Disabled);
    }

    /// Issue 58 (6): a kill during a cache write left its temp file (a whole entry), never
    /// removed nor counted, so the cache ended over its bound, one more per crash loop. A
    /// stale one goes at the next start; a fresh one (a write under way) is counted, not touched.
    #[test]
    fn an_interrupted_writes_temp_file_is_removed_at_start_and_a_fresh_one_counted() {
        use super::super::code_cache::STALE_TEMP;
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        let state = crate::durable::StateDir::open(&cache).unwrap();
        state.write("a.cwasm", &[1; 1000], false).unwrap();
        state.write(".b.cwasm.77.1f.tmp", &[2; 5000], false).unwrap();
        state.write(".c.cwasm.78.2e.tmp", &[3; 600], false).unwrap();
        let old = std::time::SystemTime::now() - STALE_TEMP - Duration::from_secs(1);
        std::fs::File::options().write(true).open(cache.join(".b.cwasm.77.1f.tmp")).unwrap().set_modified(old).unwrap();
        let _rt = Runtime::new(RuntimeConfig {
            cache_dir: Some(cache.clone()),
            cache_max_bytes: 1200,
            ..RuntimeConfig::default()
        })
        .unwrap();
        let names = |s: &crate::durable::StateDir| {
            let mut v: Vec<String> = s.files().unwrap().into_iter().map(|f| f.name).collect();
            v.sort();
            v
        };
        // The stale temp is gone; the fresh one (600 bytes) counts, so 1,000 more is over 1,200.
        assert_eq!(names(&state), [".c.cwasm.78.2e.tmp"], "the entry went to make room beside the write under way");
        state.write("d.cwasm", &[4; 100], false).unwrap();
        evict(&state, &cache, "d.cwasm", 1200);
        assert_eq!(names(&state), [".c.cwasm.78.2e.tmp", "d.cwasm"], "a fresh temp file is never removed");
    }

    /// Issue 61: signed native code is loaded instead of compiling and kept in the cache under
    /// the operator key's id: loaded from there while the key stays, never once it changed.
    /// Code that does not load (cut short) is compiled around.
    #[test]
    fn signed_code_is_kept_under_its_key_and_bad_code_compiled_around() {
        let wasm = std::fs::read(crate::backends::embedded::test_program("chaos").unwrap().0).unwrap();
        let native =
            super::super::native::precompile(None, &wasm, &super::super::compile_worker::DEFAULT_BUDGET).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let rt = |key: &str| {
            Runtime::new(RuntimeConfig {
                cache_dir: Some(dir.path().join("cache")),
                operator_key: Some(key.to_owned()),
                compile_worker: None,
                ..RuntimeConfig::default()
            })
            .unwrap()
        };
        let cut = native[..native.len() / 2].to_vec();
        assert_eq!(
            rt("aa").compile_for(None, &wasm, Some(crate::durable::Spooled::Bytes(cut))).unwrap().cache,
            CacheOutcome::Miss,
            "compiled around"
        );
        std::fs::remove_dir_all(dir.path().join("cache")).unwrap();
        assert_eq!(
            rt("aa").compile_for(None, &wasm, Some(crate::durable::Spooled::Bytes(native))).unwrap().cache,
            CacheOutcome::Signed
        );
        assert_eq!(rt("aa").compile(&wasm).unwrap().cache, CacheOutcome::Signed, "from the cache, same key");
        assert_eq!(rt("bb").compile(&wasm).unwrap().cache, CacheOutcome::Miss, "another key: compiled here");
        assert_eq!(rt("bb").compile(&wasm).unwrap().cache, CacheOutcome::Hit, "and cached as compiled here");
    }

    /// Issue 62: a standby compiles before it holds the instance lock; its load after takes
    /// that code once (and a later compile of the same bytes compiles again).
    #[test]
    fn prepared_code_is_taken_by_the_next_compile_of_the_same_bytes() {
        let wasm = std::fs::read(crate::backends::embedded::test_program("chaos").unwrap().0).unwrap();
        let rt = Runtime::new(RuntimeConfig::default()).unwrap();
        rt.prepare(None, &wasm, None);
        rt.prepare(None, &wasm, None);
        assert_eq!(rt.prepared.locked().len(), 1, "prepared once");
        rt.prepare(None, b"\0asm\x0d\0\x01\0 not a component", None);
        assert_eq!(rt.prepared.locked().len(), 1, "what does not compile is left for the load to fail on");
        let compiled = rt.compile(&wasm).unwrap();
        assert_eq!(compiled.digest, sha256_hex(&wasm));
        assert!(rt.prepared.locked().is_empty(), "taken by the load");
        rt.prepare(None, &wasm, None);
        rt.forget_prepared();
        assert!(rt.prepared.locked().is_empty());
    }
}
