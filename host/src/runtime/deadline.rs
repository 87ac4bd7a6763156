//! Deadlines of guest calls: the epoch thread that advances the engines' epochs every
//! [`EPOCH_TICK`] while a call is under way (wasmtime traps a computing guest at its epoch
//! deadline), the cut-offs that end a call blocked in a host function, the count of calls under
//! way, and the one-thread runtime that drives guest calls' timers and WASI clocks.

use std::sync::Arc;
use std::time::Duration;

use wasmtime::Engine;

use crate::sync::Locked;

/// How often the epoch advances: the granularity of every deadline.
pub(crate) const EPOCH_TICK: Duration = Duration::from_millis(5);

/// A one-thread tokio runtime of the engine's own: guest calls are futures (so they can be cut
/// off), but they run on the caller's thread, never on the daemon's async workers; this runtime
/// only drives their timers and the WASI clocks.
pub(super) struct Timers(pub(super) Option<tokio::runtime::Runtime>);

impl Drop for Timers {
    fn drop(&mut self) {
        // Dropping a runtime blocks, which async code must not do; nothing here needs waiting for.
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// Slack on top of a call's deadline before its future is dropped: the epoch deadline (5 ms
/// ticks) normally stops computing guests first, with the cleaner trap.
pub(super) const CUTOFF_SLACK: Duration = Duration::from_millis(10);

/// Cut-off deadlines of guest calls that went pending (blocked in a host function), checked by
/// the epoch thread on every tick. A call that finishes without waiting never registers one, so
/// the common call costs no timer and wakes no other thread.
#[derive(Default)]
pub(super) struct Cutoffs(std::sync::Mutex<Vec<(std::time::Instant, std::task::Waker)>>);

impl Cutoffs {
    pub(super) fn wake_expired(&self) {
        let now = std::time::Instant::now();
        let mut pending = self.0.locked();
        pending.retain(|(at, waker)| {
            if *at <= now {
                waker.wake_by_ref();
                false
            } else {
                true
            }
        });
    }
}

/// How many guest calls are under way. The epoch thread ticks only while one is: epochs matter
/// only to running guests, and an idle node's devplug then wakes once a second instead of every
/// 5 ms (it spent about 1 % of a core ticking for nothing).
#[derive(Default)]
pub(super) struct InFlight {
    calls: std::sync::Mutex<usize>,
    started: std::sync::Condvar,
}

impl InFlight {
    pub(super) fn enter(&self) -> CallUnderWay<'_> {
        *self.calls.lock().unwrap_or_else(std::sync::PoisonError::into_inner) += 1;
        self.started.notify_one();
        CallUnderWay(self)
    }

    /// Block while no call is under way (waking each `check` to see if the engine lives on).
    pub(super) fn wait_for_a_call(&self, check: Duration) {
        let mut calls = self.calls.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if *calls == 0 {
            calls = match self.started.wait_timeout(calls, check) {
                Ok((g, _)) => g,
                Err(e) => e.into_inner().0,
            };
        }
        drop(calls);
    }

    pub(super) fn busy(&self) -> bool {
        *self.calls.lock().unwrap_or_else(std::sync::PoisonError::into_inner) > 0
    }
}

/// One call counted in [`InFlight`] until dropped (also when the call panics or is cut off).
pub(super) struct CallUnderWay<'a>(&'a InFlight);

impl Drop for CallUnderWay<'_> {
    fn drop(&mut self) {
        let mut calls = self.0.calls.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        *calls = calls.saturating_sub(1);
    }
}

/// Resolves once its instant has passed; polled only when the call it races is pending.
pub(super) struct Cutoff {
    pub(super) at: std::time::Instant,
    pub(super) cutoffs: Arc<Cutoffs>,
}

impl std::future::Future for Cutoff {
    type Output = ();
    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        if std::time::Instant::now() >= self.at {
            return std::task::Poll::Ready(());
        }
        self.cutoffs.0.locked().push((self.at, cx.waker().clone()));
        std::task::Poll::Pending
    }
}

/// Advance the epoch, and wake expired cut-offs, every tick while a guest call is under way,
/// for as long as the engine lives.
pub(super) fn spawn_ticker(engines: &[&Engine], cutoffs: Arc<Cutoffs>, in_flight: Arc<InFlight>) {
    let weak: Vec<_> = engines.iter().map(|e| e.weak()).collect();
    std::thread::Builder::new()
        .name("devplug-epoch".into())
        .spawn(move || {
            loop {
                in_flight.wait_for_a_call(Duration::from_secs(1));
                let live: Vec<Engine> = weak.iter().filter_map(|w| w.upgrade()).collect();
                if live.is_empty() {
                    return;
                }
                if in_flight.busy() {
                    live.iter().for_each(Engine::increment_epoch);
                    drop(live);
                    cutoffs.wake_expired();
                    std::thread::sleep(EPOCH_TICK);
                }
            }
        })
        .expect("spawning the epoch thread");
}

/// Epoch ticks for a deadline, rounded up, plus one for the tick already under way.
pub fn ticks(d: Duration) -> u64 {
    (d.as_micros() as u64).div_ceil(EPOCH_TICK.as_micros() as u64) + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_round_up() {
        assert_eq!(ticks(Duration::from_millis(250)), 51);
        assert_eq!(ticks(Duration::from_millis(1)), 2);
    }
}
