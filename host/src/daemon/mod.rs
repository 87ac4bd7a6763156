//! The daemon (`devplug run`): its control loop loads the backends, polls them, serves each
//! resource to kubelet, keeps its CDI spec current, hot-swaps backends when their directory or
//! registry reference changes, and stops cleanly on SIGTERM whatever a backend is doing.
//!
//! - [`start`]: putting the parts together and loading the backends.
//! - [`polls`]: when each backend's discover runs.
//! - [`serve`]: handing a resource with devices to the kubelet layer, and taking it back.
//! - [`specs`]: the CDI directory's side of the loop.
//! - [`trim`]: giving back start-up memory once start-up is over.

mod handover;
mod polls;
mod serve;
mod specs;
mod start;
mod trim;
pub use trim::tune_allocator;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio_util::sync::CancellationToken;

use crate::backends::uevents::Uevent;
use crate::backends::watch::DirTicks;
use crate::backends::{BackendSource, Loaded, PollDone, Reconciler};
use crate::cdi::SpecDir;
use crate::config::Config;
use crate::kubelet::Endpoints;
use crate::observe;
use polls::Polls;

/// Why the control loop woke up.
enum Wake {
    Swap,
    Poll,
    Polled(PollDone),
    /// A kernel uevent of this subsystem.
    Uevent(String),
    /// A uevent-triggered discover that was held back (see `polls::UEVENT_GAP`) is due.
    Deferred,
    Beat,
}

/// How often the control loop shows it is alive even with nothing to do.
const BEAT: std::time::Duration = std::time::Duration::from_secs(1);

/// Run until `shutdown` resolves; then stop serving and remove every socket.
///
/// Nothing a backend does holds up the loop's answer to `shutdown`: loading at start, each
/// poll and each swap run as futures raced against it (a backend call cut short keeps running
/// on its blocking thread only until its own deadline, and nothing waits for it).
pub async fn run(cfg: Config, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    tokio::pin!(shutdown);
    let Some(mut daemon) = Daemon::start(cfg, shutdown.as_mut()).await? else { return Ok(()) };
    daemon.control_loop(shutdown.as_mut()).await;
    daemon.stop().await;
    Ok(())
}

/// The running daemon: what the control loop reads and drives.
struct Daemon {
    cfg: Config,
    loaded: Arc<Loaded>,
    specs: Option<Arc<SpecDir>>,
    endpoints: Arc<Endpoints>,
    /// Resources served through DRA (`None` when none is configured, or DRA is unavailable).
    dra: Option<Arc<crate::dra::node::DraNode>>,
    metrics: Arc<observe::Metrics>,
    /// Swaps and unloads backends as their sources change.
    reconciler: Reconciler,
    polls: Polls,
    /// Set once the first discover round has been published (`/readyz`).
    polled: Arc<AtomicBool>,
    heartbeat: Arc<observe::Heartbeat>,
    /// Stops the HTTP server and the pod-resources poller.
    stop: CancellationToken,
    /// The follower's task, when backends come from registries.
    following: Option<tokio::task::JoinHandle<()>>,
    /// The registry versions on offer; a change means reconcile.
    pulled: tokio::sync::watch::Receiver<Vec<BackendSource>>,
    /// This devplug's hold on the node; released when the daemon is dropped, after `stop`.
    _instance: handover::InstanceLock,
    /// Settled changes of the backends directory (none without one, or when it cannot be watched).
    ticks: Option<DirTicks>,
    uevents: Option<tokio::sync::mpsc::Receiver<Uevent>>,
    beat: tokio::time::Interval,
    next_poll: tokio::time::Instant,
    /// Start-up memory given back (once, the poll after the first round).
    trimmed: bool,
    /// Stale CDI specs not yet swept (once, after the first round).
    sweep_pending: bool,
}

impl Daemon {
    async fn control_loop<F: Future<Output = ()>>(&mut self, mut shutdown: Pin<&mut F>) {
        loop {
            self.heartbeat.beat();
            let wake = tokio::select! {
                biased;
                _ = &mut shutdown => return,
                wake = self.next_wake() => wake,
            };
            tokio::select! {
                biased;
                _ = &mut shutdown => return,
                _ = self.handle(wake) => {}
            }
        }
    }

    /// Wait for the next thing to do.
    async fn next_wake(&mut self) -> Wake {
        let Daemon { ticks, uevents, pulled, following, polls, beat, next_poll, reconciler, .. } = self;
        let tick = async {
            match ticks.as_mut() {
                Some(t) => t.changed().await,
                None => std::future::pending().await,
            }
        };
        let uevent = async {
            match uevents.as_mut() {
                Some(rx) => rx.recv().await,
                None => std::future::pending().await,
            }
        };
        let removal = reconciler.next_removal();
        let removal = async {
            match removal {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let due = polls.next_due();
        let deferred = async {
            match due {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            _ = tick => Wake::Swap,
            Ok(()) = pulled.changed(), if following.is_some() => Wake::Swap,
            _ = removal => Wake::Swap,
            _ = tokio::time::sleep_until(*next_poll) => Wake::Poll,
            done = polls.next() => done.map_or(Wake::Beat, Wake::Polled),
            Some(ev) = uevent => Wake::Uevent(ev.subsystem),
            _ = deferred => Wake::Deferred,
            _ = beat.tick() => Wake::Beat,
        }
    }

    async fn handle(&mut self, wake: Wake) {
        match wake {
            Wake::Swap => {
                let changes = self.reconciler.reconcile(&self.cfg.catalog()).await;
                self.stop_serving(changes.retired).await;
                self.serve(changes.ready).await;
            }
            Wake::Poll => {
                // The poll after the first round: start-up (loading, first lists, registration)
                // is over, and what only it needed can go.
                if self.polled.load(Ordering::Acquire) && !std::mem::replace(&mut self.trimmed, true) {
                    tokio::task::spawn_blocking(trim::after_start);
                }
                self.polls.start_round(&self.loaded);
                self.note_first_round();
                self.next_poll = tokio::time::Instant::now() + self.cfg.poll_interval;
                return;
            }
            Wake::Uevent(subsystem) => return self.polls.uevent(&self.loaded, &subsystem),
            Wake::Deferred => return self.polls.start_due(&self.loaded),
            Wake::Polled(done) => {
                let ready = self.polls.finished(&self.loaded, done);
                self.serve(ready).await;
                self.note_first_round();
            }
            Wake::Beat => return,
        }
        // Once every backend has answered once, specs for resources no backend serves any more
        // (left by a killed devplug) go.
        if let Some(specs) = &self.specs
            && self.polled.load(Ordering::Acquire)
        {
            specs::sweep_once(specs, &self.loaded, &self.cfg, &mut self.sweep_pending);
        }
    }

    fn note_first_round(&self) {
        if self.polls.first_round_over() {
            self.polled.store(true, Ordering::Release);
        }
    }

    /// Stop serving: sockets removed, specs removed, tasks ended.
    async fn stop(self) {
        // A successor still compiling would leave kubelet without this node's devices for as
        // long; serve on until it stands by (bounded, see handover.rs).
        handover::await_successor(&handover::preparing_path(&self.cfg.instance_lock()), handover::SUCCESSOR_PATIENCE)
            .await;
        tracing::info!("shutting down: closing sockets");
        self.stop.cancel();
        if let Some(f) = self.following {
            f.abort();
        }
        self.endpoints.shutdown().await;
        if let Some(dra) = &self.dra {
            dra.shutdown().await;
        }
        if let Some(specs) = &self.specs {
            specs.remove_all();
        }
    }
}
