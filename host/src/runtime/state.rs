//! The per-instance store data: the backend's jails, its memory cap, and a WASI context that has
//! nothing in it (no preopens, env, args, sockets or name lookup), with stdout/stderr sent to
//! `tracing` under the backend's name.

use std::collections::HashSet;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use wasmtime::ResourceLimiter;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::caps::{FsError, Jail};

/// Refused paths already logged for one backend, so a hostile loop cannot flood the log.
#[derive(Default)]
pub struct RefusalLog {
    seen: Mutex<HashSet<String>>,
}

/// Distinct refusals remembered per backend; past this, refusals are counted but not logged.
const MAX_REMEMBERED: usize = 1024;

impl RefusalLog {
    pub fn refused(&self, backend: &str, call: &str, path: &str, err: &FsError) {
        let Ok(mut seen) = self.seen.lock() else { return };
        if seen.len() >= MAX_REMEMBERED {
            return;
        }
        let key = format!("{call} {path}");
        if seen.insert(key) {
            if seen.len() == MAX_REMEMBERED {
                tracing::warn!(backend, "further refused paths of this backend are not logged");
            }
            tracing::warn!(backend, call, path, reason = %err, "refused a backend's access");
        }
    }
}

/// Everything one backend instance may touch.
#[derive(Clone)]
pub struct Sandbox {
    pub backend: Arc<str>,
    pub sysfs: Arc<Jail>,
    pub dev: Arc<Jail>,
    pub refusals: Arc<RefusalLog>,
    pub memory_cap: usize,
}

/// Store data for one instance.
pub struct HostState {
    pub sandbox: Sandbox,
    pub limiter: MemoryCap,
    wasi: WasiCtx,
    table: ResourceTable,
}

impl HostState {
    pub fn new(sandbox: Sandbox) -> Self {
        let name = sandbox.backend.clone();
        let mut b = WasiCtx::builder();
        b.stdout(GuestOutput { backend: name.clone(), stream: "stdout" })
            .stderr(GuestOutput { backend: name, stream: "stderr" })
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .socket_addr_check(|_, _| Box::pin(async { false }));
        HostState {
            limiter: MemoryCap { max: sandbox.memory_cap, hit: false },
            sandbox,
            wasi: b.build(),
            table: ResourceTable::new(),
        }
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

/// A memory cap that remembers it was hit: with `trap_on_grow_failure` a failed grow is an
/// error, not a `wasmtime::Trap`, and an allocator that sees `memory.grow` fail aborts with a
/// plain `unreachable`; this flag is how both are told apart from other traps.
pub struct MemoryCap {
    pub max: usize,
    pub hit: bool,
}

/// Table elements an instance may have (function tables of ordinary guests are small).
const MAX_TABLE_ELEMENTS: usize = 100_000;

impl ResourceLimiter for MemoryCap {
    fn memory_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.max {
            self.hit = true;
            return Ok(false);
        }
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }

    fn instances(&self) -> usize {
        // A component instantiates a handful of core instances (its module plus adapters).
        64
    }

    fn memories(&self) -> usize {
        16
    }

    fn tables(&self) -> usize {
        64
    }
}

/// Guest stdout/stderr, logged line by line with the backend's name.
struct GuestOutput {
    backend: Arc<str>,
    stream: &'static str,
}

impl IsTerminal for GuestOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for GuestOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(LineLogger { backend: self.backend.clone(), stream: self.stream, buf: Vec::new() })
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(LineLogger { backend: self.backend.clone(), stream: self.stream, buf: Vec::new() })
    }
}

/// Longest line kept before it is logged anyway.
const MAX_LINE: usize = 4096;

struct LineLogger {
    backend: Arc<str>,
    stream: &'static str,
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
        tracing::info!(backend = &*self.backend, stream = self.stream, "{line}");
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
