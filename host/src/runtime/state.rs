//! The per-instance store data ([`HostState`]): the backend's [`Sandbox`] (its jails over the
//! machine's [`Roots`], what it may return, its refusal log), its memory cap
//! ([`super::limits`]), and a WASI context that has nothing in it (no preopens, env, args,
//! sockets or name lookup), with stdout/stderr sent to the log ([`super::guest_log`]).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::caps::Capabilities;
use super::guest_log::{GuestOutput, LogBudget};
use super::jail::{FsError, Jail, OpenDirs};
use super::limits::{MemoryCap, Meter};
use crate::sync::Locked;

/// Refused paths already logged for one backend, so a hostile loop cannot flood the log. Paths
/// are remembered clipped ([`crate::gate::clip`]), so the set stays small whatever the
/// backend sends.
#[derive(Default)]
pub struct RefusalLog {
    seen: Mutex<HashSet<String>>,
    /// The distinct refused accesses, as `devplug discover` lists them.
    refused: Mutex<Vec<Refusal>>,
}

/// One distinct access a backend was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub call: String,
    /// Clipped and escaped.
    pub path: String,
    /// Whether a grant would allow it (a malformed path is refused whatever is granted).
    pub grantable: bool,
    /// Whether the path is there on this machine: a refused look at what is not here lost the
    /// backend nothing (it would have been told NotFound), so it does not fail `discover`.
    pub present: bool,
}

/// Distinct refusals remembered per backend; past this, refusals are counted but not logged.
const MAX_REMEMBERED: usize = 1024;

impl RefusalLog {
    pub fn refused(&self, sandbox: &Sandbox, call: &str, path: &str, err: &FsError, present: bool) {
        let backend = &*sandbox.backend;
        let mut seen = self.seen.locked();
        if seen.len() >= MAX_REMEMBERED {
            return;
        }
        let path = crate::gate::clip(path);
        let new = seen.insert(format!("{call} {path}"));
        if new {
            let grantable = matches!(err, FsError::Denied(_));
            self.refused.locked().push(Refusal { call: call.to_owned(), path: path.to_string(), grantable, present });
        }
        if new && sandbox.log.admit(backend) {
            if seen.len() == MAX_REMEMBERED {
                tracing::warn!(backend, "further refused paths of this backend are not logged");
            }
            let reason = err.to_string();
            tracing::warn!(backend, call, path = %path, reason = %crate::gate::clip(&reason), "refused a backend's access");
        }
    }
}

impl RefusalLog {
    /// The first `limit` distinct accesses refused.
    pub fn paths(&self, limit: usize) -> Vec<Refusal> {
        self.refused.locked().iter().take(limit).cloned().collect()
    }

    /// How many distinct accesses were refused (what `devplug status` counts).
    pub fn count(&self) -> u64 {
        self.refused.locked().len() as u64
    }

    /// Whether `what` (already clipped) is new for this backend: a refused answer repeated on
    /// every poll is logged once.
    pub(crate) fn first_time(&self, what: &str) -> bool {
        let mut seen = self.seen.locked();
        seen.len() < MAX_REMEMBERED && seen.insert(format!("answer {what}"))
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
    /// What the host holds for all of the backend's calls under way, together (shared by every
    /// instance, as the memory cap bounds each).
    pub host_work: Arc<super::limits::HostWork>,
    /// Records every capability call that was answered (`devplug discover --learn-requests`).
    pub learn: Option<Arc<super::learn::Learned>>,
    /// Ask a WIT 0.3.0 backend's `describe` after each `discover`: only when it may serve a
    /// resource this node serves through DRA (a description costs the backend a call).
    pub describe: bool,
}

impl Sandbox {
    /// The sandbox of backend `name`: `caps` over the machine's `roots`, with fresh logs and
    /// limits.
    pub fn new(name: &str, caps: &Capabilities, roots: &Roots, memory_cap: usize) -> Self {
        let dev = Arc::new(Jail::new(&roots.dev, caps.dev.clone()).with_fixture_nodes(roots.dev_fixtures));
        let sysfs = Arc::new(Jail::new(&roots.sys, caps.sysfs.clone()));
        Sandbox {
            backend: name.into(),
            sysfs: sysfs.clone(),
            procfs: Arc::new(Jail::new(&roots.proc, caps.procfs.clone())),
            returns: Arc::new(super::vet::ReturnRules::new(caps, dev.clone(), sysfs)),
            uevents: caps.uevents.clone(),
            dev,
            refusals: Arc::new(RefusalLog::default()),
            log: Arc::new(LogBudget::default()),
            memory_cap,
            host_work: super::limits::HostWork::new(memory_cap),
            learn: None,
            describe: false,
        }
    }

    /// The same sandbox, asking `describe` after each `discover` (see [`Sandbox::describe`]).
    pub fn describing(mut self, describe: bool) -> Self {
        self.describe = describe;
        self
    }

    /// The same sandbox, recording what the backend touches into `learned`.
    pub fn learning(mut self, learned: Arc<super::learn::Learned>) -> Self {
        self.learn = Some(learned);
        self
    }
}

/// Host work after which a call's end gives the freed memory back to the kernel.
const TRIM_AFTER: usize = 4 << 20;

/// Store data for one instance.
pub struct HostState {
    pub sandbox: Sandbox,
    pub limiter: MemoryCap,
    /// Sysfs directories the current call's batched reads opened; closed when the call ends.
    pub open_dirs: OpenDirs,
    /// The host work the current call may still cause (see [`Meter`]).
    pub meter: Meter,
    /// The guest's last stderr lines in the current call: a trap's reason is often only there.
    words: Arc<Mutex<super::guest_log::LastWords>>,
    wasi: WasiCtx,
    table: ResourceTable,
}

impl HostState {
    pub fn new(sandbox: Sandbox) -> Self {
        let words: Arc<Mutex<super::guest_log::LastWords>> = Arc::default();
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
            meter: Meter::default(),
            words,
            sandbox,
            wasi: b.build(),
            table: ResourceTable::new(),
        }
    }
}

impl HostState {
    /// The guest's last stderr lines in the current call (see [`begin_call`](Self::begin_call)), joined.
    pub(crate) fn last_words(&self) -> String {
        self.words.locked().joined()
    }

    /// The uncaught exception the guest's runtime printed in the current call, and where it was
    /// raised, if it printed one.
    pub fn exception(&self) -> Option<String> {
        self.words.locked().exception()
    }

    /// A guest call starts that may run for `deadline`: its meter is set to what the memory cap
    /// leaves the backend now, its stderr tail and memory-cap flag are cleared.
    pub(crate) fn begin_call(&mut self, deadline: std::time::Duration) {
        let left = self.limiter.max.saturating_sub(self.limiter.used);
        self.meter = Meter::drawing_on(left, deadline, self.sandbox.host_work.clone());
        self.limiter.hit = false;
        self.words.locked().clear();
    }

    /// The guest call ended: what it resolved is not trusted by the next one (see
    /// [`OpenDirs`]), and its meter is spent.
    pub(crate) fn end_call(&mut self) {
        self.open_dirs.clear();
        let ended = std::mem::replace(&mut self.meter, Meter::new(0, std::time::Duration::ZERO));
        let held = ended.spent();
        drop(ended);
        // Megabytes the host held for the call are free now; glibc keeps freed blocks of the
        // call's thread arena for reuse unless told, and each blocking thread has its own.
        if held >= TRIM_AFTER {
            super::heap::release_freed();
        }
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}
