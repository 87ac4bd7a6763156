//! Compiling outsider code in a process the kernel bounds. wasmtime's compilers cannot be
//! interrupted or limited from inside (a compile is one long call that allocates what the input
//! asks), so a component's bytes go to a fresh `devplug` (`/proc/self/exe __compile-worker`) on
//! its stdin and its native code comes back on its stdout. The worker runs under kernel limits
//! set between fork and exec: `RLIMIT_DATA` (every private writable mapping: the heap, thread
//! stacks) and `RLIMIT_CPU` (seconds of CPU, all threads), no core dumps, no file writes, a
//! handful of descriptors, no new privileges, and it dies with the host (`PR_SET_PDEATHSIG`). A
//! compile over either bound is killed by the kernel, and the host says which bound it met and
//! what to change. Background compiles also run at `SCHED_IDLE`, the worker process with them.
//!
//! The worker is the host's own executable, compiling with the engine configuration of the
//! tier asked ([`super::engine_config`]), so its native code is what an in-process compile
//! would have made; the host still loads it through `Component::deserialize`, which checks that
//! it fits the engine.

use std::io::{Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use super::Tier;

/// The first argument that makes `devplug` a compile worker (not a subcommand: never in `--help`).
pub(crate) const WORKER_ARG: &str = "__compile-worker";

/// The most of the worker's own complaint (stderr) the host keeps.
const STDERR_KEPT: u64 = 16 << 10;

/// Exit code of a worker whose compiler refused the component (the message is on stderr).
const REFUSED: i32 = 3;

/// What one compile may use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompileBudget {
    /// The worker's private writable memory (`RLIMIT_DATA`), in bytes.
    pub memory_bytes: u64,
    /// CPU seconds every compile may use, whatever its size.
    pub cpu_base_secs: u64,
    /// CPU seconds more per MiB of component (the largest legitimate compiles are
    /// proportional to the code they compile).
    pub cpu_secs_per_mib: u64,
}

/// [`CompileBudget`]'s default: room for the largest first-party-sized components (the 18 MB
/// Python example compiles optimised, serially, in about 30 s of CPU and 250 MiB; baseline,
/// in parallel, in about 4 s and 200 MiB; docs/BENCHMARKS.md, "Compile budgets").
pub const DEFAULT_BUDGET: CompileBudget =
    CompileBudget { memory_bytes: 384 << 20, cpu_base_secs: 20, cpu_secs_per_mib: 5 };

impl CompileBudget {
    /// The CPU seconds a compile of `len` bytes may use.
    pub(crate) fn cpu_secs(&self, len: usize) -> u64 {
        let mib = (len as u64).div_ceil(1 << 20);
        self.cpu_base_secs.saturating_add(self.cpu_secs_per_mib.saturating_mul(mib))
    }
}

/// How a compile runs.
#[derive(Clone, Copy, Debug)]
pub struct Job {
    pub tier: Tier,
    /// Without wasmtime's parallel compilation (one thread: the background optimiser).
    pub serial: bool,
    /// At `SCHED_IDLE` (only on a core nothing else wants).
    pub idle: bool,
    /// For any CPU of this build's target at the portable baseline
    /// ([`super::engine_config::portable_engine_config`]), not this machine's own: code
    /// `devplug precompile` hands to every node of a cluster.
    pub portable: bool,
}

/// Why a compile gave no code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompileError {
    /// The compiler refused the component (it is not valid Wasm, or uses what this engine
    /// does not support).
    #[error("{0}")]
    Invalid(String),
    #[error(
        "its compile went over the memory bound of {mib} MiB and was stopped (a larger bound: `compile_memory_mb` in the config)"
    )]
    Memory { mib: u64 },
    #[error(
        "its compile went over its CPU budget of {secs} s and was stopped (more: `compile_cpu_secs` and `compile_cpu_secs_per_mib` in the config)"
    )]
    Cpu { secs: u64 },
    /// A background compile that gave way to a load's compile; it runs again later.
    #[error("stopped to let a backend's load compile first")]
    Preempted,
    /// The worker could not be started or ended in a way a bound does not explain.
    #[error("the compile worker failed: {0}")]
    Worker(String),
}

impl CompileError {
    /// A bound the compile met (as opposed to a component the compiler refused).
    pub(crate) fn over_budget(&self) -> bool {
        matches!(self, CompileError::Memory { .. } | CompileError::Cpu { .. })
    }
}

/// Native code and what making it cost.
pub struct Native {
    pub code: Vec<u8>,
    /// CPU the worker used (user and system, all threads).
    pub cpu: Duration,
    /// The worker's peak resident memory, in bytes.
    pub peak_bytes: u64,
    /// With an incremental cache: functions reused from it, and compiled.
    pub counts: Option<(u64, u64)>,
}

/// The one compile worker of a runtime at a time, so compiles never add up past one bound (the
/// pod's memory limit holds the host and one worker). A compile a component's load waits for
/// (foreground) goes first: it stops a background compile under way, which is run again after.
#[derive(Default)]
pub struct Slot {
    state: std::sync::Mutex<SlotState>,
    changed: std::sync::Condvar,
}

#[derive(Default)]
struct SlotState {
    foreground_waiting: usize,
    foreground_running: bool,
    /// A background compile holds the slot; its worker's pid once started.
    background: Option<Option<libc::pid_t>>,
    /// The background compile was told to give way.
    preempt: bool,
}

impl Slot {
    /// Whether a background compile's worker runs now.
    pub fn background_running(&self) -> bool {
        use crate::sync::Locked;
        matches!(self.state.locked().background, Some(Some(_)))
    }

    fn acquire(&self, foreground: bool) -> SlotGuard<'_> {
        use crate::sync::Locked;
        let mut st = self.state.locked();
        if foreground {
            st.foreground_waiting += 1;
            loop {
                if let Some(pid) = st.background {
                    st.preempt = true;
                    if let Some(pid) = pid {
                        // SAFETY: a signal to our own, not yet reaped, worker.
                        unsafe { libc::kill(pid, libc::SIGKILL) };
                    }
                }
                if !st.foreground_running && st.background.is_none() {
                    break;
                }
                st = self.changed.wait(st).unwrap_or_else(std::sync::PoisonError::into_inner);
            }
            st.foreground_waiting -= 1;
            st.foreground_running = true;
        } else {
            while st.foreground_running || st.foreground_waiting > 0 || st.background.is_some() {
                st = self.changed.wait(st).unwrap_or_else(std::sync::PoisonError::into_inner);
            }
            st.background = Some(None);
            st.preempt = false;
        }
        SlotGuard { slot: self, foreground }
    }
}

struct SlotGuard<'a> {
    slot: &'a Slot,
    foreground: bool,
}

impl SlotGuard<'_> {
    /// Record the background worker's pid; false when it was told to give way meanwhile.
    fn started(&self, pid: libc::pid_t) -> bool {
        use crate::sync::Locked;
        let mut st = self.slot.state.locked();
        if self.foreground {
            return true;
        }
        st.background = Some(Some(pid));
        !st.preempt
    }

    fn preempted(&self) -> bool {
        use crate::sync::Locked;
        !self.foreground && self.slot.state.locked().preempt
    }
}

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        use crate::sync::Locked;
        let mut st = self.slot.state.locked();
        if self.foreground {
            st.foreground_running = false;
        } else {
            st.background = None;
        }
        self.slot.changed.notify_all();
    }
}

static REGISTERED: OnceLock<PathBuf> = OnceLock::new();

/// Called first thing by the `devplug` binary: serves as a compile worker when asked (the
/// returned exit code ends the process), and otherwise registers this executable as the worker
/// every [`super::RuntimeConfig::default`] uses. A process that never registers (a test binary
/// linking the library) compiles in-process unless its config names a worker.
pub fn serve_or_register() -> Option<std::process::ExitCode> {
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() != Some(std::ffi::OsStr::new(WORKER_ARG)) {
        // The running executable itself, even if its file is replaced by an upgrade.
        let _ = REGISTERED.set(PathBuf::from("/proc/self/exe"));
        return None;
    }
    let args: Vec<String> = args.filter_map(|a| a.into_string().ok()).collect();
    Some(serve(&args))
}

/// The worker executable [`super::RuntimeConfig::default`] names.
pub fn registered() -> Option<PathBuf> {
    REGISTERED.get().cloned()
}

/// The worker: `TIER [serial] [portable] [incremental]`, the component on stdin (after an
/// incremental cache with `incremental`), its native code on stdout (framed with the next cache).
fn serve(args: &[String]) -> std::process::ExitCode {
    let fail = |msg: &str, code: u8| {
        let _ = writeln!(std::io::stderr(), "{msg}");
        std::process::ExitCode::from(code)
    };
    let portable = args.iter().skip(1).any(|a| a == "portable");
    let incremental = args.iter().skip(1).any(|a| a == "incremental");
    let config = match args.first().map(String::as_str) {
        Some("optimized") if portable => {
            match super::engine_config::portable_engine_config(env!("DEVPLUG_BUILD_TARGET")) {
                Ok(c) => Some(c),
                Err(e) => return fail(&format!("no portable engine: {e:#}"), 2),
            }
        }
        Some("optimized") => Some(super::engine_config::engine_config()),
        Some("baseline") if !portable => super::engine_config::baseline_engine_config(),
        _ => return fail("usage: devplug __compile-worker optimized|baseline [serial] [portable]", 2),
    };
    let Some(mut config) = config else { return fail("this build has no baseline compiler", 2) };
    // Two arenas and large blocks mapped on their own: the compiler's threads then fragment
    // less of the bound (the 18 MB Python example's baseline compile fits 384 MiB so, not
    // 448 MiB with glibc's defaults).
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only changes allocator parameters; no other thread exists yet.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
    }
    config.parallel_compilation(!args.iter().skip(1).any(|a| a == "serial"));
    let mut bytes = Vec::new();
    if let Err(e) = std::io::stdin().lock().read_to_end(&mut bytes) {
        return fail(&format!("reading the component: {e}"), 2);
    }
    // With a cache (super::incremental): the previous entries on descriptor 3 (absent: none),
    // the next ones written to descriptor 4 as the compile makes or uses them.
    let store = if incremental {
        use std::os::fd::FromRawFd;
        let open = |fd| {
            // SAFETY: F_GETFD only asks whether the descriptor is open.
            unsafe { libc::fcntl(fd, libc::F_GETFD) >= 0 }
        };
        if !open(super::incremental::NEXT_FD) {
            return fail("no descriptor for the incremental cache", 2);
        }
        // SAFETY: descriptor 4 is the pipe's write end the host set up between fork and exec
        // (checked open), and 3, when open, the previous cache file; nothing else owns them.
        let next = unsafe { std::fs::File::from_raw_fd(super::incremental::NEXT_FD) };
        let previous: &'static [u8] = if open(super::incremental::PREVIOUS_FD) {
            // SAFETY: as above.
            let prev = unsafe { std::fs::File::from_raw_fd(super::incremental::PREVIOUS_FD) };
            map_read_only(&prev).unwrap_or_default()
        } else {
            &[]
        };
        let store = std::sync::Arc::new(super::incremental::Store::new(
            previous,
            Box::new(std::io::BufWriter::with_capacity(1 << 16, next)),
        ));
        if let Err(e) = config.enable_incremental_compilation(store.clone()) {
            return fail(&format!("no incremental cache: {e:#}"), 2);
        }
        Some(store)
    } else {
        None
    };
    let engine = match wasmtime::Engine::new(&config) {
        Ok(e) => e,
        Err(e) => return fail(&format!("no engine: {e:#}"), 2),
    };
    let native = match engine.precompile_component(&bytes) {
        Ok(native) => native,
        Err(e) => return fail(&format!("{e:#}"), REFUSED as u8),
    };
    drop(bytes);
    if let Some(store) = &store {
        if !store.finish() {
            return fail("writing the incremental cache failed", 2);
        }
        let (hits, misses) = store.counts();
        let _ = writeln!(std::io::stderr(), "{}", super::incremental::counts_line(hits, misses));
    }
    match std::io::stdout().lock().write_all(&native) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => fail(&format!("writing the code: {e}"), 2),
    }
}

/// `file` mapped read-only for the rest of the process (the worker's: it ends after its
/// compile). A read-only file mapping is not private writable memory, so the previous cache
/// (tens of MB) does not count against the worker's `RLIMIT_DATA` bound as a read into memory
/// would. `None` when it cannot be mapped (an empty cache then).
fn map_read_only(file: &std::fs::File) -> Option<&'static [u8]> {
    use std::os::fd::AsRawFd;
    let len = usize::try_from(file.metadata().ok()?.len()).ok().filter(|&l| l > 0)?;
    // SAFETY: a new read-only private mapping of an open file, never unmapped; the host
    // replaces cache files only by rename, so the mapped inode's bytes do not change under it.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_PRIVATE, file.as_raw_fd(), 0) };
    if p == libc::MAP_FAILED {
        return None;
    }
    // SAFETY: the mapping is `len` readable bytes that live for the rest of the process.
    Some(unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) })
}

/// Compile `bytes` in a worker (`exe`) under `budget`, once `slot` is free. Blocking (a compile
/// takes seconds).
pub fn compile(
    exe: &Path,
    slot: &Slot,
    job: Job,
    bytes: &[u8],
    budget: &CompileBudget,
) -> Result<Native, CompileError> {
    run(exe, slot, job, None, bytes, budget).map(|(n, _)| n)
}

/// What a compile with an incremental cache spared.
pub struct Reused {
    /// Functions whose code came from the previous cache, and functions compiled.
    pub hits: u64,
    pub misses: u64,
    /// Whether the next cache was kept (it fit in `cap` and the compile succeeded).
    pub kept: bool,
}

/// [`compile`] with Cranelift's incremental cache ([`super::incremental`]): the worker reads the
/// previous entries from cache file `entry` of `state` (if there is one) and streams the next
/// ones, which replace it if the compile succeeds and they fit in `cap` bytes. Neither is ever
/// in this process's memory.
pub fn compile_incremental(
    exe: &Path,
    slot: &Slot,
    job: Job,
    bytes: &[u8],
    budget: &CompileBudget,
    (state, entry, cap): (&crate::durable::StateDir, &str, u64),
) -> Result<(Native, Reused), CompileError> {
    let previous = state.open_read(entry).ok();
    let mut outcome = None;
    let kept = state.write_with(
        entry,
        |next| {
            let streams = Streams { previous: previous.as_ref(), next, cap };
            let done = run(exe, slot, job, Some(streams), bytes, budget);
            let complete = matches!(&done, Ok((_, Some(true))));
            outcome = Some(done);
            if complete { Ok(()) } else { Err(std::io::Error::other("no complete cache")) }
        },
        false,
    );
    let (native, _) =
        outcome.unwrap_or_else(|| Err(CompileError::Worker("the cache file could not be made".into())))?;
    let (hits, misses) = native.counts.unwrap_or_default();
    Ok((native, Reused { hits, misses, kept: kept.is_ok() }))
}

/// The descriptors of a compile with an incremental cache.
struct Streams<'a> {
    previous: Option<&'a std::fs::File>,
    next: &'a mut std::fs::File,
    /// The most of the next cache written; past it the rest is read and dropped.
    cap: u64,
}

/// A worker's run: `bytes` on its stdin, its code from its stdout; with `streams`, the
/// incremental cache's two descriptors too, and whether the next cache was written whole.
fn run(
    exe: &Path,
    slot: &Slot,
    job: Job,
    streams: Option<Streams<'_>>,
    bytes: &[u8],
    budget: &CompileBudget,
) -> Result<(Native, Option<bool>), CompileError> {
    let held = slot.acquire(!job.idle);
    let cpu_secs = budget.cpu_secs(bytes.len());
    let memory = budget.memory_bytes;
    let mut cmd = Command::new(exe);
    cmd.arg0("devplug-compile")
        .arg(WORKER_ARG)
        .arg(match job.tier {
            Tier::Optimized => "optimized",
            Tier::Baseline => "baseline",
        })
        .args(job.serial.then_some("serial"))
        .args(job.portable.then_some("portable"))
        .args(streams.is_some().then_some("incremental"))
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let idle = job.idle;
    // The cache's descriptors, above the ones `Command` sets up, to be put at 3 and 4 in the
    // child; the pipe's write end is the parent's until the spawn, then only the child's.
    let (descriptors, next_read) = match &streams {
        Some(st) => {
            let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
                .map_err(|e| CompileError::Worker(format!("a pipe for the incremental cache: {e}")))?;
            let above = |fd: std::os::fd::BorrowedFd<'_>| {
                nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(10))
                    .map_err(|e| CompileError::Worker(format!("a descriptor for the incremental cache: {e}")))
            };
            use std::os::fd::{AsFd, FromRawFd, OwnedFd};
            // SAFETY: F_DUPFD_CLOEXEC returned new descriptors this process now owns.
            let previous =
                st.previous.map(|f| above(f.as_fd())).transpose()?.map(|fd| unsafe { OwnedFd::from_raw_fd(fd) });
            let write = unsafe { OwnedFd::from_raw_fd(above(write.as_fd())?) };
            (Some((previous, write)), Some(read))
        }
        None => (None, None),
    };
    let raw = descriptors.as_ref().map(|(p, w)| {
        use std::os::fd::AsRawFd;
        (p.as_ref().map(AsRawFd::as_raw_fd), w.as_raw_fd())
    });
    // SAFETY: between fork and exec only async-signal-safe syscalls run (setrlimit, prctl,
    // sched_setscheduler, dup2), on plain values; nothing allocates or takes a lock.
    unsafe {
        cmd.pre_exec(move || {
            if let Some((previous, next)) = raw {
                // Both are at 10 or above, so neither is overwritten by the other's dup2; dup2
                // leaves the copies without close-on-exec.
                if let Some(p) = previous
                    && libc::dup2(p, super::incremental::PREVIOUS_FD) < 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::dup2(next, super::incremental::NEXT_FD) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            limit_self(memory, cpu_secs, idle)
        });
    }
    let spawned = cmd.spawn().map_err(|e| CompileError::Worker(format!("{}: {e}", exe.display())));
    // The write end is the child's alone now: the read below ends when the worker does.
    drop(descriptors);
    let mut child = spawned?;
    let pid = child.id() as libc::pid_t;
    if !held.started(pid) {
        let _ = child.kill();
    }
    let (Some(mut stdin), Some(stdout), Some(stderr)) = (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(CompileError::Worker("no pipes to the worker".into()));
    };
    let mut code = Vec::new();
    let mut complaint = String::new();
    let mut cache_whole = None;
    std::thread::scope(|s| {
        // A worker killed mid-read makes this write fail (EPIPE): its status says why.
        s.spawn(move || {
            let _ = stdin.write_all(bytes);
        });
        let err = s.spawn(move || {
            let mut text = String::new();
            let _ = stderr.take(STDERR_KEPT).read_to_string(&mut text);
            text
        });
        let cache = match (streams, next_read) {
            (Some(st), Some(read)) => Some(s.spawn(move || copy_capped(std::fs::File::from(read), st.next, st.cap))),
            _ => None,
        };
        // The worker cannot make more than its memory bound; reading more is refused.
        let _ = stdout.take(memory.saturating_add(1)).read_to_end(&mut code);
        complaint = err.join().unwrap_or_default();
        cache_whole = cache.map(|c| c.join().unwrap_or(false));
    });
    let (status, usage) = reap(pid).map_err(|e| CompileError::Worker(format!("waiting for the worker: {e}")))?;
    // Reaped here, so `child` must not wait again.
    drop(child);
    let cpu = usage.cpu;
    if !status.success() && held.preempted() {
        return Err(CompileError::Preempted);
    }
    let ended = if status.success() && (code.len() as u64) <= memory {
        let counts = super::incremental::parse_counts(&complaint);
        return Ok((Native { code, cpu, peak_bytes: usage.peak_bytes, counts }, cache_whole));
    } else if status.code() == Some(REFUSED) {
        return Err(CompileError::Invalid(complaint.trim().to_owned()));
    } else if let Some(sig) = status.signal() {
        let name = nix::sys::signal::Signal::try_from(sig).map(|s| s.as_str()).unwrap_or("a signal");
        format!("killed by {name}")
    } else {
        format!("exit status {}", status.code().unwrap_or(-1))
    };
    // The kernel's two ways of enforcing the bounds: SIGXCPU/SIGKILL past RLIMIT_CPU, and an
    // allocation refused past RLIMIT_DATA (Rust aborts, saying so).
    if cpu.as_secs() >= cpu_secs || matches!(status.signal(), Some(libc::SIGXCPU)) {
        return Err(CompileError::Cpu { secs: cpu_secs });
    }
    if complaint.contains("memory allocation of") || complaint.contains("out of memory") {
        return Err(CompileError::Memory { mib: memory >> 20 });
    }
    let said = complaint.lines().last().unwrap_or("").trim();
    Err(CompileError::Worker(if said.is_empty() { ended } else { format!("{ended}: {}", crate::gate::clip(said)) }))
}

/// Copy `from` into `to` up to `cap` bytes, then drain the rest (the worker must never block
/// on a full pipe); whether all of it was copied.
fn copy_capped(mut from: std::fs::File, to: &mut std::fs::File, cap: u64) -> bool {
    let copied = std::io::copy(&mut (&mut from).take(cap), to);
    let rest = std::io::copy(&mut from, &mut std::io::sink());
    matches!((copied, rest), (Ok(_), Ok(0)))
}

/// The limits of the worker, applied to itself between fork and exec.
fn limit_self(memory: u64, cpu_secs: u64, idle: bool) -> std::io::Result<()> {
    let set = |resource, soft: u64, hard: u64| {
        let lim = libc::rlimit { rlim_cur: soft, rlim_max: hard };
        // SAFETY: setrlimit on this process with a valid limit block.
        if unsafe { libc::setrlimit(resource, &lim) } == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
    };
    set(libc::RLIMIT_DATA, memory, memory)?;
    // SIGXCPU at the soft limit, SIGKILL a second later should it be caught.
    set(libc::RLIMIT_CPU, cpu_secs, cpu_secs.saturating_add(1))?;
    set(libc::RLIMIT_CORE, 0, 0)?;
    set(libc::RLIMIT_FSIZE, 0, 0)?;
    set(libc::RLIMIT_NOFILE, 32, 32)?;
    // SAFETY: prctl with integer arguments on this process.
    unsafe {
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) != 0
            || libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1 as libc::c_ulong, 0, 0, 0) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    if idle {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: as above; refused only where the policy is not allowed, which leaves the
        // worker at the caller's priority (the optimiser thread lowered its own already).
        let _ = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
    }
    Ok(())
}

struct Usage {
    cpu: Duration,
    peak_bytes: u64,
}

/// Wait for `pid` and take what it used.
fn reap(pid: libc::pid_t) -> std::io::Result<(std::process::ExitStatus, Usage)> {
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value to be overwritten.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: waits for our own child, writing into the two locals.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if r == pid {
            break;
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, (t.tv_usec as u32).saturating_mul(1000));
    let cpu = tv(usage.ru_utime) + tv(usage.ru_stime);
    let peak_bytes = (usage.ru_maxrss as u64).saturating_mul(1024);
    Ok((std::process::ExitStatus::from_raw(status), Usage { cpu, peak_bytes }))
}
