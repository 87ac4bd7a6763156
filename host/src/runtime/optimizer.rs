//! The background optimiser: a large component first served from baseline (Winch) code gets its
//! optimised (Cranelift) code here, after it serves, without ever competing with serving.
//!
//! One worker thread at idle priority (`SCHED_IDLE`: it runs only on a core nothing else
//! wants), compiling one component at a time without wasmtime's parallel compilation (one core,
//! and a fraction of the working memory). A [`Job`] is a plain value: what to compile, where to
//! keep the result ([`Keep`], the compile cache) and the channel its code goes back on. The
//! code is written to the cache (where it replaces the baseline code's entry) and sent to the
//! instance that asked, which takes it for its next calls. The queue is bounded and skips a job
//! whose receiver is gone (a newer version replaced the instance before its turn), so a burst of
//! swaps costs at most [`MAX_QUEUED`] compiles.

use std::collections::{HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};

use tokio::sync::oneshot;
use wasmtime::component::Component;

use crate::sync::Locked;

/// The worker thread's name (the kernel shows its first 15 bytes).
const THREAD: &str = "devplug-optimize";

/// Components waiting for their optimised code, at most; past it the oldest waiting one keeps
/// its baseline code (said in a WARN) until it loads again.
pub(crate) const MAX_QUEUED: usize = 8;

/// Where and under what budget the optimised code is compiled (see
/// [`super::compile_worker`]).
pub struct Worker {
    pub exe: PathBuf,
    pub budget: super::compile_worker::CompileBudget,
    pub slot: Arc<super::compile_worker::Slot>,
}

/// Where a job's code is kept: the compile cache's directory and entries.
pub struct Keep {
    pub dir: PathBuf,
    /// The cache's byte bound.
    pub max_bytes: u64,
    /// The baseline code, written first at the worker's idle priority: a restart before the
    /// optimised code is ready loads it, and writing it on the way to serving would delay the
    /// new version by its serialize and write.
    pub baseline: Option<Component>,
    /// The baseline code's entry, removed once the optimised code is written.
    pub baseline_entry: Option<String>,
    /// The optimised code's entry.
    pub optimized_entry: String,
    /// The backend's incremental cache ([`super::incremental`]): read before the compile,
    /// replaced by its entries after.
    pub incremental_entry: String,
    /// The marker written when the compile goes over its budget (holding `budget`), so a
    /// restart (or a crash loop) does not compile this version again.
    pub over_budget_marker: String,
    pub budget: String,
}

/// One component to optimise.
pub struct Job {
    /// The backend it is (for the log).
    pub backend: String,
    /// Its sha256 (the cache key and what `/status` shows as pending).
    pub digest: String,
    /// The worker process it is compiled in; `None` in this thread, unbounded (a test binary).
    pub worker: Option<Worker>,
    /// The engine the code is for (the optimising one, which serves).
    pub engine: wasmtime::Engine,
    /// The compile cache, when there is one.
    pub keep: Option<Keep>,
    pub bytes: Arc<[u8]>,
    /// Where the code goes. The instance that asked holds the receiver: once it is dropped (the
    /// instance is gone) the job is no longer wanted.
    pub deliver: oneshot::Sender<Component>,
}

impl Job {
    fn wanted(&self) -> bool {
        !self.deliver.is_closed()
    }
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// The digest being compiled now.
    running: Option<String>,
    /// Whether the worker thread was started.
    started: bool,
}

/// The queue and its worker.
#[derive(Default)]
pub struct Optimizer {
    queue: Mutex<Queue>,
    changed: Condvar,
    /// Components whose compile went over its budget in this process (by digest): they keep
    /// their baseline code and are not compiled again (the cache keeps a marker too).
    gave_up: Mutex<HashSet<String>>,
}

impl Optimizer {
    /// Queue `job`; the worker starts on first use and ends once this optimiser's other
    /// owner (the runtime) is gone.
    pub fn push(self: &Arc<Self>, job: Job) {
        let mut q = self.queue.locked();
        if q.running.as_deref() == Some(job.digest.as_str()) || q.jobs.iter().any(|j| j.digest == job.digest) {
            // The same code is on its way already; this instance loads it from the cache or
            // asks again when it next loads.
            return;
        }
        if q.jobs.len() >= MAX_QUEUED
            && let Some(dropped) = q.jobs.pop_front()
        {
            tracing::warn!(
                digest = &dropped.digest[..12.min(dropped.digest.len())],
                "background optimiser queue full: this component keeps its baseline code until it loads again"
            );
        }
        q.jobs.push_back(job);
        if !q.started {
            q.started = true;
            let me = self.clone();
            let spawned = std::thread::Builder::new().name(THREAD.into()).spawn(move || me.work());
            if let Err(e) = spawned {
                q.started = false;
                tracing::warn!(error = %e, "could not start the background optimiser: baseline code keeps serving");
            }
        }
        self.changed.notify_all();
    }

    /// Whether `digest` waits for, or is getting, its optimised code.
    pub fn pending(&self, digest: &str) -> bool {
        let q = self.queue.locked();
        q.running.as_deref() == Some(digest) || q.jobs.iter().any(|j| j.digest == digest)
    }

    /// Whether `digest`'s optimised compile went over its budget in this process.
    pub(crate) fn gave_up(&self, digest: &str) -> bool {
        self.gave_up.locked().contains(digest)
    }

    /// Block until every job queued so far has finished (tests, benchmarks, a clean exit).
    pub(crate) fn wait_idle(&self) {
        let mut q = self.queue.locked();
        while q.started && (q.running.is_some() || !q.jobs.is_empty()) {
            q = self.changed.wait(q).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    fn work(self: Arc<Self>) {
        lower_priority();
        // Built on first use: a node that never loads a large backend never pays for it.
        let mut serial: Option<wasmtime::Engine> = None;
        loop {
            let job = {
                let mut q = self.queue.locked();
                loop {
                    if Arc::strong_count(&self) == 1 {
                        q.started = false;
                        self.changed.notify_all();
                        return;
                    }
                    if let Some(job) = q.jobs.pop_front() {
                        q.running = Some(job.digest.clone());
                        break job;
                    }
                    // Wakes now and then to end with the engine.
                    q = match self.changed.wait_timeout(q, std::time::Duration::from_secs(5)) {
                        Ok((q, _)) => q,
                        Err(e) => e.into_inner().0,
                    };
                }
            };
            let again = if job.wanted() { self.compile(&mut serial, job) } else { None };
            let mut q = self.queue.locked();
            if let Some(job) = again {
                // It gave way to a load's compile: first in line once that is done.
                q.jobs.push_front(job);
            }
            q.running = None;
            self.changed.notify_all();
        }
    }

    /// Compile `job`; the job back when it gave way to a load's compile and is to run again.
    fn compile(&self, serial: &mut Option<wasmtime::Engine>, mut job: Job) -> Option<Job> {
        if let Some(k) = &mut job.keep
            && let (Some(code), Some(entry)) = (k.baseline.take(), &k.baseline_entry)
        {
            match crate::durable::StateDir::open(&k.dir) {
                Ok(state) => super::code_cache::store(&state, &k.dir, entry, &code, k.max_bytes),
                Err(e) => {
                    tracing::warn!(dir = %k.dir.display(), error = %e, "compile cache refused; baseline code not kept")
                }
            }
        }
        let short = job.digest[..12.min(job.digest.len())].to_owned();
        let started = std::time::Instant::now();
        let native = match &job.worker {
            Some(w) => {
                let how = super::compile_worker::Job {
                    tier: super::Tier::Optimized,
                    serial: true,
                    idle: true,
                    portable: false,
                };
                let state = job.keep.as_ref().and_then(|k| crate::durable::StateDir::open(&k.dir).ok());
                let done = match (&state, &job.keep) {
                    (Some(state), Some(k)) => super::compile_worker::compile_incremental(
                        &w.exe,
                        &w.slot,
                        how,
                        &job.bytes,
                        &w.budget,
                        (state, &k.incremental_entry, k.max_bytes / 2),
                    )
                    .map(|(native, reused)| (native, Some(reused))),
                    _ => super::compile_worker::compile(&w.exe, &w.slot, how, &job.bytes, &w.budget).map(|n| (n, None)),
                };
                match done {
                    Ok((native, reused)) => {
                        tracing::debug!(backend = %job.backend, cpu_secs = native.cpu.as_secs_f64(), peak_mib = native.peak_bytes >> 20, reused = reused.as_ref().map(|r| r.hits), "optimised compile done in the worker");
                        native.code
                    }
                    Err(super::compile_worker::CompileError::Preempted) => return Some(job),
                    Err(e) => {
                        if e.over_budget() {
                            // Recorded before it is said: what the log promises holds from then.
                            self.give_up(&job);
                            tracing::error!(backend = %job.backend, digest = %short, error = %e, "optimising a baseline-loaded backend was given up: it keeps serving from its baseline code, and this version is not optimised again");
                        } else {
                            tracing::warn!(backend = %job.backend, digest = %short, error = %e, "optimising a baseline-loaded backend failed; it keeps its baseline code");
                        }
                        return None;
                    }
                }
            }
            None => Self::compile_here(serial, &job)?,
        };
        if let Some(k) = &job.keep {
            super::code_cache::store_native(
                &k.dir,
                &k.optimized_entry,
                &native,
                k.max_bytes,
                k.baseline_entry.as_deref(),
            );
        }
        // SAFETY: `native` was produced just now from these bytes by this executable (its
        // worker, or this thread) with an engine configured as the job's (the optimising one;
        // only parallel compilation differs, which is not part of the code); deserialize still
        // checks that they agree.
        match unsafe { Component::deserialize(&job.engine, &native) } {
            Ok(component) => {
                drop(native);
                if job.deliver.send(component).is_ok() {
                    tracing::info!(
                        backend = %job.backend,
                        digest = %short,
                        secs = started.elapsed().as_secs_f64(),
                        "optimised code compiled in the background; its backend takes it at its next call"
                    );
                }
            }
            Err(e) => {
                tracing::warn!(backend = %job.backend, digest = %short, error = %format!("{e:#}"), "optimised code did not load; the backend keeps its baseline code")
            }
        }
        // What the compiler used is free now: give it back to the kernel.
        super::heap::release_freed();
        None
    }

    /// Record that `job` went over its budget: in this process, and in the cache beside its
    /// entries.
    fn give_up(&self, job: &Job) {
        self.gave_up.locked().insert(job.digest.clone());
        if let Some(k) = &job.keep
            && let Ok(state) = crate::durable::StateDir::open(&k.dir)
        {
            let _ = state.write(&k.over_budget_marker, k.budget.as_bytes(), false);
        }
    }

    /// The optimised code compiled on this thread (no worker: a test binary).
    fn compile_here(serial: &mut Option<wasmtime::Engine>, job: &Job) -> Option<Vec<u8>> {
        if serial.is_none() {
            let mut config = super::engine_config::engine_config();
            config.parallel_compilation(false);
            match wasmtime::Engine::new(&config) {
                Ok(e) => *serial = Some(e),
                Err(e) => {
                    tracing::warn!(error = %e, "background optimiser: no engine; baseline code keeps serving");
                    return None;
                }
            }
        }
        let engine = serial.as_ref()?;
        match engine.precompile_component(&job.bytes) {
            Ok(n) => Some(n),
            Err(e) => {
                tracing::warn!(backend = %job.backend, error = %format!("{e:#}"), "optimising a baseline-loaded backend failed; it keeps its baseline code");
                None
            }
        }
    }
}

/// Run this thread only when a core is otherwise idle (`SCHED_IDLE`), and at the lowest nice
/// value where that is refused.
fn lower_priority() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: plain syscalls on the calling thread (pid 0), with a valid parameter block.
    let idle = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } == 0;
    if !idle {
        // SAFETY: as above; `setpriority` on this thread's id.
        let tid = unsafe { libc::gettid() };
        let _ = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19) };
        tracing::debug!("SCHED_IDLE refused; background optimiser at nice 19");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::{Runtime, RuntimeConfig};

    /// The optimised code is compiled on a thread at idle priority, for the optimising engine
    /// (what serves), once per component however often asked, and only while its instance
    /// lives (holds the receiver).
    #[test]
    fn optimised_code_is_compiled_at_idle_priority_once_and_only_while_wanted() {
        let rt = Runtime::new(RuntimeConfig::default()).unwrap();
        let (_, wasm, _) = crate::backends::embedded::FIRST_PARTY[0];
        let mut a = rt.optimize_later("embedded", "a", Arc::from(wasm), None).expect("queued");
        let mut again = rt.optimize_later("embedded", "a", Arc::from(wasm), None).expect("asked");
        let gone = rt.optimize_later("embedded", "gone", Arc::from(wasm), None).expect("queued");
        drop(gone);
        rt.finish_background_compiles();
        let code = a.try_recv().expect("the optimised code came back");
        assert!(wasmtime::Engine::same(code.engine(), rt.engine()), "for the engine that serves");
        assert!(again.try_recv().is_err(), "the same digest is compiled once");
        assert!(!rt.optimizing("a") && !rt.optimizing("gone"));
        assert_eq!(worker_policy(), Some(libc::SCHED_IDLE), "the worker thread runs at idle priority");
        // One-shot commands compile nothing in the background.
        let one_shot =
            Runtime::new(RuntimeConfig { optimize_in_background: false, ..RuntimeConfig::default() }).unwrap();
        assert!(one_shot.optimize_later("embedded", "b", Arc::from(wasm), None).is_none());
    }

    /// The scheduling policy of this process's optimiser thread (found by its name, as the
    /// kernel keeps it: 15 bytes), while it lives.
    fn worker_policy() -> Option<i32> {
        std::fs::read_dir("/proc/self/task").ok()?.flatten().find_map(|t| {
            let name = std::fs::read_to_string(t.path().join("comm")).ok()?;
            let tid: libc::pid_t = t.file_name().to_str()?.parse().ok()?;
            // SAFETY: a plain syscall naming a thread of this process.
            (name.trim_end() == &THREAD[..15]).then(|| unsafe { libc::sched_getscheduler(tid) })
        })
    }

    /// A burst of swaps queues at most `MAX_QUEUED` compiles: the oldest waiting one keeps its
    /// baseline code.
    #[test]
    fn the_queue_is_bounded() {
        let q = Arc::new(Optimizer::default());
        // The worker is never started here: its flag is set, so pushes only queue.
        q.queue.locked().started = true;
        let mut receivers = Vec::new();
        for i in 0..MAX_QUEUED + 3 {
            let (deliver, rx) = oneshot::channel();
            receivers.push(rx);
            let job = Job {
                backend: "b".into(),
                digest: format!("d{i}"),
                worker: None,
                engine: wasmtime::Engine::default(),
                keep: None,
                bytes: Arc::from(&b""[..]),
                deliver,
            };
            q.push(job);
        }
        let q = q.queue.locked();
        assert_eq!(q.jobs.len(), MAX_QUEUED);
        assert_eq!(q.jobs.front().map(|j| j.digest.as_str()), Some("d3"), "the oldest went");
    }
}
