//! The per-instance store data: the backend's jails, its memory cap, and a WASI context that has
//! nothing in it (no preopens, env, args, sockets or name lookup), with stdout/stderr sent to
//! `tracing` under the backend's name, at a bounded rate.

use crate::sync::Locked;
use std::collections::{HashSet, VecDeque};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use wasmtime::ResourceLimiter;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use std::path::{Path, PathBuf};

use super::caps::Capabilities;
use super::jail::{FsError, Jail, OpenDirs};

/// Refused paths already logged for one backend, so a hostile loop cannot flood the log. Paths
/// are remembered clipped ([`crate::untrusted::clip`]), so the set stays small whatever the
/// backend sends.
#[derive(Default)]
pub struct RefusalLog {
    seen: Mutex<HashSet<String>>,
}

/// Distinct refusals remembered per backend; past this, refusals are counted but not logged.
const MAX_REMEMBERED: usize = 1024;

impl RefusalLog {
    pub fn refused(&self, sandbox: &Sandbox, call: &str, path: &str, err: &FsError) {
        let backend = &*sandbox.backend;
        let mut seen = self.seen.locked();
        if seen.len() >= MAX_REMEMBERED {
            return;
        }
        let path = crate::untrusted::clip(path);
        if seen.insert(format!("{call} {path}")) && sandbox.log.admit(backend) {
            if seen.len() == MAX_REMEMBERED {
                tracing::warn!(backend, "further refused paths of this backend are not logged");
            }
            let reason = err.to_string();
            tracing::warn!(backend, call, path = %path, reason = %crate::untrusted::clip(&reason), "refused a backend's access");
        }
    }
}

impl RefusalLog {
    /// Whether `what` (already clipped) is new for this backend: a refused answer repeated on
    /// every poll is logged once.
    pub fn first_time(&self, what: &str) -> bool {
        let mut seen = self.seen.locked();
        seen.len() < MAX_REMEMBERED && seen.insert(format!("answer {what}"))
    }
}

/// Lines a backend may log in a burst, and per second after that (its `log` calls, stdout,
/// stderr and the host's refusal lines about it together).
const LOG_BURST: f64 = 200.0;
const LOG_PER_SECOND: f64 = 20.0;

/// A per-backend token bucket for log lines. What it drops is counted, and said once the
/// backend is below its rate again, so an operator learns that lines are missing.
pub struct LogBudget {
    bucket: Mutex<(f64, Instant, u64)>,
    pub dropped: AtomicU64,
}

impl Default for LogBudget {
    fn default() -> Self {
        LogBudget { bucket: Mutex::new((LOG_BURST, Instant::now(), 0)), dropped: AtomicU64::new(0) }
    }
}

impl LogBudget {
    /// Whether one more line of `backend` may be logged now.
    pub fn admit(&self, backend: &str) -> bool {
        let mut b = self.bucket.locked();
        let (tokens, last, unreported) = &mut *b;
        let now = Instant::now();
        *tokens = (*tokens + now.duration_since(*last).as_secs_f64() * LOG_PER_SECOND).min(LOG_BURST);
        *last = now;
        if *tokens < 1.0 {
            *unreported += 1;
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        *tokens -= 1.0;
        if *unreported > 0 {
            tracing::warn!(
                backend,
                dropped = *unreported,
                "log lines of this backend were dropped: it logs faster than its rate limit"
            );
            *unreported = 0;
        }
        true
    }
}

/// Where a backend's views of the machine are rooted: `/sys`, `/dev` and `/proc`, or fixture
/// trees in tests.
#[derive(Clone, Debug)]
pub struct Roots {
    pub sys: PathBuf,
    pub dev: PathBuf,
    pub proc: PathBuf,
    /// Let `c MAJOR:MINOR` files under `dev` stand for device nodes (fixture trees only).
    pub dev_fixtures: bool,
}

impl Default for Roots {
    fn default() -> Self {
        Roots { sys: "/sys".into(), dev: "/dev".into(), proc: "/proc".into(), dev_fixtures: false }
    }
}

impl Roots {
    /// A fixture machine laid out as `M/sys`, `M/dev`, `M/proc`, with descriptor files for nodes.
    pub fn fixture(machine: &Path) -> Self {
        Roots { sys: machine.join("sys"), dev: machine.join("dev"), proc: machine.join("proc"), dev_fixtures: true }
    }
}

/// Everything one backend instance may touch.
#[derive(Clone)]
pub struct Sandbox {
    pub backend: Arc<str>,
    pub sysfs: Arc<Jail>,
    pub dev: Arc<Jail>,
    pub procfs: Arc<Jail>,
    pub refusals: Arc<RefusalLog>,
    /// Shared by every instance of the backend.
    pub log: Arc<LogBudget>,
    /// What the backend may hand to containers and kubelet (see [`super::vet`]).
    pub returns: Arc<super::vet::ReturnRules>,
    /// Kernel uevent subsystems that trigger its `discover`.
    pub uevents: super::caps::Rule,
    pub memory_cap: usize,
}

impl Sandbox {
    /// The sandbox of backend `name`: `caps` over the machine's `roots`, with fresh logs and
    /// limits.
    pub fn new(name: &str, caps: &Capabilities, roots: &Roots, memory_cap: usize) -> Self {
        let dev = Arc::new(Jail::new(&roots.dev, caps.dev.clone()).with_fixture_nodes(roots.dev_fixtures));
        Sandbox {
            backend: name.into(),
            sysfs: Arc::new(Jail::new(&roots.sys, caps.sysfs.clone())),
            procfs: Arc::new(Jail::new(&roots.proc, caps.procfs.clone())),
            returns: Arc::new(super::vet::ReturnRules::new(caps, dev.clone())),
            uevents: caps.uevents.clone(),
            dev,
            refusals: Arc::new(RefusalLog::default()),
            log: Arc::new(LogBudget::default()),
            memory_cap,
        }
    }
}

/// Store data for one instance.
pub struct HostState {
    pub sandbox: Sandbox,
    pub limiter: MemoryCap,
    /// Sysfs directories the current call's batched reads opened; closed when the call ends.
    pub open_dirs: OpenDirs,
    /// The guest's last stderr lines in the current call: a trap's reason is often only there.
    words: Arc<Mutex<VecDeque<String>>>,
    wasi: WasiCtx,
    table: ResourceTable,
}

/// Stderr lines kept for a trap's message.
const LAST_WORDS: usize = 3;

impl HostState {
    pub fn new(sandbox: Sandbox) -> Self {
        let words: Arc<Mutex<VecDeque<String>>> = Arc::default();
        let out =
            |stream, tail| GuestOutput { backend: sandbox.backend.clone(), log: sandbox.log.clone(), stream, tail };
        let mut b = WasiCtx::builder();
        b.stdout(out("stdout", None))
            .stderr(out("stderr", Some(words.clone())))
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .socket_addr_check(|_, _| Box::pin(async { false }));
        HostState {
            limiter: MemoryCap { max: sandbox.memory_cap, hit: false, used: 0, table_elements: 0 },
            open_dirs: OpenDirs::default(),
            words,
            sandbox,
            wasi: b.build(),
            table: ResourceTable::new(),
        }
    }
}

impl HostState {
    /// The guest's last stderr lines since [`forget_words`](Self::forget_words), joined.
    pub fn last_words(&self) -> String {
        self.words.locked().iter().cloned().collect::<Vec<_>>().join(" | ")
    }

    pub fn forget_words(&mut self) {
        self.words.locked().clear();
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

/// The memory cap of one store: every linear memory of every core instance in it counts
/// against one budget, so a component cannot multiply the cap by carrying many memories. It
/// remembers it was hit: with `trap_on_grow_failure` a failed grow is an error, not a
/// `wasmtime::Trap`, and an allocator that sees `memory.grow` fail aborts with a plain
/// `unreachable`; this flag is how both are told apart from other traps.
pub struct MemoryCap {
    pub max: usize,
    pub hit: bool,
    /// Bytes of linear memory the store has now, all memories together.
    pub used: usize,
    /// Table elements the store has now, all tables together.
    pub table_elements: usize,
}

/// Table elements a store may have (function tables of ordinary guests are small).
const MAX_TABLE_ELEMENTS: usize = 100_000;

impl ResourceLimiter for MemoryCap {
    fn memory_growing(&mut self, current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        let total = self.used.saturating_sub(current).saturating_add(desired);
        if total > self.max {
            self.hit = true;
            return Ok(false);
        }
        self.used = total;
        Ok(true)
    }

    fn table_growing(&mut self, current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        let total = self.table_elements.saturating_sub(current).saturating_add(desired);
        if total > MAX_TABLE_ELEMENTS {
            return Ok(false);
        }
        self.table_elements = total;
        Ok(true)
    }

    fn instances(&self) -> usize {
        // A component instantiates a handful of core instances (its modules plus adapters; a
        // componentize-py component about a dozen).
        32
    }

    fn memories(&self) -> usize {
        8
    }

    fn tables(&self) -> usize {
        32
    }
}

/// Guest stdout/stderr, logged line by line with the backend's name.
struct GuestOutput {
    backend: Arc<str>,
    log: Arc<LogBudget>,
    stream: &'static str,
    tail: Option<Arc<Mutex<VecDeque<String>>>>,
}

impl IsTerminal for GuestOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for GuestOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.logger())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.logger())
    }
}

impl GuestOutput {
    fn logger(&self) -> LineLogger {
        LineLogger {
            backend: self.backend.clone(),
            log: self.log.clone(),
            stream: self.stream,
            tail: self.tail.clone(),
            buf: Vec::new(),
        }
    }
}

/// Longest line kept before it is logged anyway.
const MAX_LINE: usize = 1024;

struct LineLogger {
    backend: Arc<str>,
    log: Arc<LogBudget>,
    stream: &'static str,
    tail: Option<Arc<Mutex<VecDeque<String>>>>,
    buf: Vec<u8>,
}

impl LineLogger {
    fn push(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if b == b'\n' || self.buf.len() >= MAX_LINE {
                self.emit();
                if b == b'\n' {
                    continue;
                }
            }
            self.buf.push(b);
        }
    }

    fn emit(&mut self) {
        let line = String::from_utf8_lossy(&self.buf);
        if let Some(tail) = &self.tail
            && !line.trim().is_empty()
            && !line.starts_with("note: run with")
        {
            let mut t = tail.locked();
            if t.len() == LAST_WORDS {
                t.pop_front();
            }
            t.push_back(crate::untrusted::clip_to(line.trim(), 512).into_owned());
        }
        if self.log.admit(&self.backend) {
            tracing::info!(backend = &*self.backend, stream = self.stream, "{line}");
        }
        self.buf.clear();
    }
}

impl Drop for LineLogger {
    fn drop(&mut self) {
        if !self.buf.is_empty() {
            self.emit();
        }
    }
}

#[async_trait::async_trait]
impl Pollable for LineLogger {
    async fn ready(&mut self) {}
}

impl OutputStream for LineLogger {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.push(&bytes);
        Ok(())
    }
    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }
    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(MAX_LINE)
    }
}

impl tokio::io::AsyncWrite for LineLogger {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        self.get_mut().push(buf);
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memory_cap_covers_all_memories_of_a_store_together() {
        let mut cap = MemoryCap { max: 64 << 20, hit: false, used: 0, table_elements: 0 };
        // Fourteen memories of 60 MiB each, as a component with many core instances would ask.
        assert!(cap.memory_growing(0, 60 << 20, None).unwrap());
        assert!(!cap.memory_growing(0, 60 << 20, None).unwrap(), "the second memory exceeds the store's cap");
        assert!(cap.hit);
        // Growing the first memory within the cap still works; the total is what counts.
        assert!(cap.memory_growing(60 << 20, 64 << 20, None).unwrap());
        assert!(!cap.memory_growing(0, 1, None).unwrap());
        assert!(cap.table_growing(0, 60_000, None).unwrap());
        assert!(!cap.table_growing(0, 60_000, None).unwrap());
    }

    #[test]
    fn the_log_budget_admits_a_burst_then_drops_and_counts() {
        let b = LogBudget::default();
        let admitted = (0..10_000).filter(|_| b.admit("x")).count();
        assert!((200..=260).contains(&admitted), "{admitted}");
        assert!(b.dropped.load(Ordering::Relaxed) >= 9_000);
    }
}
