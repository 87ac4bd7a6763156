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
pub(super) struct Cutoffs(std::sync::Mutex<Vec<(std::time::Instant, Arc<futures::task::AtomicWaker>)>>);

impl Cutoffs {
    pub(super) fn wake_expired(&self) {
        let now = std::time::Instant::now();
        let mut pending = self.0.locked();
        pending.retain(|(at, waker)| {
            if *at <= now {
                waker.wake();
                false
            } else {
                true
            }
        });
    }
}

/// How many guest calls are under way, and whether the epoch thread is parked. It ticks only
/// while a call is under way: epochs matter only to running guests, and an idle node's devplug
/// then wakes once a second instead of every 5 ms (it spent about 1 % of a core ticking for
/// nothing). A call that starts while it still ticks wakes no thread.
#[derive(Default)]
pub(super) struct InFlight {
    state: std::sync::Mutex<Ticking>,
    started: std::sync::Condvar,
}

#[derive(Default)]
struct Ticking {
    calls: usize,
    parked: bool,
}

impl InFlight {
    pub(super) fn enter(&self) -> CallUnderWay<'_> {
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        state.calls += 1;
        if state.parked {
            state.parked = false;
            self.started.notify_one();
        }
        CallUnderWay(self)
    }

    /// Park while no call is under way (waking each `check` to see if the engine lives on).
    pub(super) fn park_until_a_call(&self, check: Duration) {
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if state.calls == 0 {
            state.parked = true;
            state = match self.started.wait_timeout(state, check) {
                Ok((g, _)) => g,
                Err(e) => e.into_inner().0,
            };
            state.parked = false;
        }
        drop(state);
    }

    pub(super) fn busy(&self) -> bool {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner).calls > 0
    }
}

/// One call counted in [`InFlight`] until dropped (also when the call panics or is cut off).
pub(super) struct CallUnderWay<'a>(&'a InFlight);

impl Drop for CallUnderWay<'_> {
    fn drop(&mut self) {
        let mut state = self.0.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        state.calls = state.calls.saturating_sub(1);
    }
}

/// Resolves once its instant has passed; polled only when the call it races is pending. It is
/// registered with the epoch thread once, however often it is polled (a computing guest yields
/// at every tick, and each yield polls it again).
pub(super) struct Cutoff {
    at: std::time::Instant,
    cutoffs: Arc<Cutoffs>,
    waker: Option<Arc<futures::task::AtomicWaker>>,
}

impl Cutoff {
    pub(super) fn at(at: std::time::Instant, cutoffs: Arc<Cutoffs>) -> Self {
        Cutoff { at, cutoffs, waker: None }
    }
}

impl std::future::Future for Cutoff {
    type Output = ();
    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        if std::time::Instant::now() >= self.at {
            return std::task::Poll::Ready(());
        }
        match &self.waker {
            Some(w) => w.register(cx.waker()),
            None => {
                let w = Arc::new(futures::task::AtomicWaker::new());
                w.register(cx.waker());
                self.cutoffs.0.locked().push((self.at, w.clone()));
                self.waker = Some(w);
            }
        }
        std::task::Poll::Pending
    }
}

/// Advance the epoch, and wake expired cut-offs, every tick while a guest call is under way
/// for as long as the engine lives.
pub(super) fn spawn_ticker(engines: &[&Engine], cutoffs: Arc<Cutoffs>, in_flight: Arc<InFlight>) {
    let weak: Vec<_> = engines.iter().map(|e| e.weak()).collect();
    std::thread::Builder::new()
        .name("devplug-epoch".into())
        .spawn(move || {
            loop {
                in_flight.park_until_a_call(Duration::from_secs(1));
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

/// Run `f`, which may block for long, without holding up an async worker: inside
/// `block_in_place` on a multi-thread runtime's thread (its other tasks move to another
/// thread), as it is anywhere else (a blocking thread, the CLI's main thread).
pub(crate) fn off_the_worker<R>(f: impl FnOnce() -> R) -> R {
    let on_worker = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if on_worker { tokio::task::block_in_place(f) } else { f() }
}

/// What a backend's store does at each epoch tick while its guest runs: trap
/// (`Trap::Interrupt`, told as a timeout) once the call's deadline `ends` has passed; before
/// that, yield (the call's future returns `Pending`, so whoever polls it gets its thread back:
/// see `Runtime::run_until`) and run on until the next tick.
pub(crate) fn yield_or_trap(ends: std::time::Instant) -> wasmtime::UpdateDeadline {
    if std::time::Instant::now() >= ends {
        wasmtime::UpdateDeadline::Interrupt
    } else {
        wasmtime::UpdateDeadline::Yield(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_running_guest_yields_until_its_deadline_then_traps() {
        let now = std::time::Instant::now();
        assert!(matches!(yield_or_trap(now + Duration::from_secs(5)), wasmtime::UpdateDeadline::Yield(1)));
        assert!(matches!(yield_or_trap(now), wasmtime::UpdateDeadline::Interrupt));
    }

    /// A guest that yields at every tick polls its cut-off again each time: it is registered
    /// once, and woken once when it expires.
    #[test]
    fn a_cut_off_polled_again_and_again_is_registered_once() {
        use std::future::Future;
        let cutoffs = Arc::new(Cutoffs::default());
        let mut cut = Cutoff::at(std::time::Instant::now() + Duration::from_millis(30), cutoffs.clone());
        let waker = futures::task::noop_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        for _ in 0..100 {
            assert!(std::pin::Pin::new(&mut cut).poll(&mut cx).is_pending());
        }
        assert_eq!(cutoffs.0.locked().len(), 1);
        std::thread::sleep(Duration::from_millis(40));
        cutoffs.wake_expired();
        assert!(cutoffs.0.locked().is_empty());
        assert!(std::pin::Pin::new(&mut cut).poll(&mut cx).is_ready());
    }
}
