//! Scheduling backend discovers: one per backend at a time on a blocking thread, each backend on
//! its own cadence (one that hangs until its deadline holds up nobody else), uevents asking for
//! an extra one (debounced per backend: a storm of events is at most one discover per
//! [`UEVENT_GAP`], the last event always followed by one), and knowing when the first round is
//! over.

use std::collections::{HashMap, HashSet};

use tokio::task::JoinSet;
use tokio::time::{Duration, Instant};

/// The least time between two uevent-triggered discovers of one backend.
pub(crate) const UEVENT_GAP: Duration = Duration::from_millis(100);

use crate::backends::{Loaded, PollDone, ReadyResource};

#[derive(Default)]
pub struct Polls {
    running: JoinSet<PollDone>,
    /// Backends with a discover under way.
    busy: HashSet<String>,
    /// Backends a uevent asked for while their discover was running: once more when it ends,
    /// so the last event of a burst is always seen.
    again: HashSet<String>,
    /// Discovers of the first round still to finish; `None` before the first round started.
    first_round: Option<usize>,
    /// When each backend's last discover started.
    started: HashMap<String, Instant>,
    /// Backends a uevent asked for too soon after their last discover: when to start it.
    deferred: HashMap<String, Instant>,
}

impl Polls {
    /// Start a discover of every backend not already running one.
    pub(crate) fn start_round(&mut self, loaded: &Loaded) {
        let jobs = loaded.start_polls(&self.busy);
        self.first_round.get_or_insert(jobs.len());
        let now = Instant::now();
        for job in jobs {
            self.busy.insert(job.name.clone());
            self.started.insert(job.name.clone(), now);
            self.deferred.remove(&job.name);
            self.running.spawn_blocking(move || job.run());
        }
    }

    /// A uevent of `subsystem`: its subscribers discover now, right after the one running, or
    /// once [`UEVENT_GAP`] has passed since their last discover started.
    pub fn uevent(&mut self, loaded: &Loaded, subsystem: &str) {
        for name in loaded.subscribers(subsystem) {
            if self.busy.contains(&name) {
                self.again.insert(name);
            } else {
                self.start_debounced(loaded, name);
            }
        }
    }

    /// Start `name`'s discover now if its last one started at least [`UEVENT_GAP`] ago, else
    /// defer it until then.
    fn start_debounced(&mut self, loaded: &Loaded, name: String) {
        let due = self.started.get(&name).map_or(Instant::now(), |t| *t + UEVENT_GAP);
        if due <= Instant::now() {
            self.start_one(loaded, name);
        } else {
            self.deferred.entry(name).or_insert(due);
        }
    }

    /// When the next deferred discover is due, if any.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.deferred.values().min().copied()
    }

    /// Start the deferred discovers that are due (one still running takes the `again` route).
    pub(crate) fn start_due(&mut self, loaded: &Loaded) {
        let now = Instant::now();
        let due: Vec<String> = self.deferred.iter().filter(|(_, t)| **t <= now).map(|(n, _)| n.clone()).collect();
        for name in due {
            self.deferred.remove(&name);
            if self.busy.contains(&name) {
                self.again.insert(name);
            } else {
                self.start_one(loaded, name);
            }
        }
    }

    fn start_one(&mut self, loaded: &Loaded, name: String) {
        if let Some(job) = loaded.poll_job(&name) {
            self.busy.insert(name.clone());
            self.started.insert(name.clone(), Instant::now());
            self.deferred.remove(&name);
            self.running.spawn_blocking(move || job.run());
        }
    }

    /// The next discover to finish; pending while none runs. A discover that panicked in the
    /// host is logged and its backend stays marked busy (and unpolled) rather than be called
    /// into a host bug again.
    pub async fn next(&mut self) -> Option<PollDone> {
        if self.running.is_empty() {
            return std::future::pending().await;
        }
        match self.running.join_next().await? {
            Ok(done) => Some(done),
            Err(e) => {
                tracing::error!("a backend's discover panicked in the host: {e}");
                None
            }
        }
    }

    /// Publish a finished discover; the resources that have devices for the first time.
    pub fn finished(&mut self, loaded: &Loaded, done: PollDone) -> Vec<ReadyResource> {
        let name = done.backend().to_owned();
        self.busy.remove(&name);
        let ready = loaded.finish_poll(done);
        if self.again.remove(&name) {
            self.start_debounced(loaded, name);
        }
        if let Some(left) = self.first_round.as_mut() {
            *left = left.saturating_sub(1);
        }
        ready
    }

    /// Every backend has answered once (or there were none).
    pub(crate) fn first_round_over(&self) -> bool {
        self.first_round == Some(0)
    }
}
