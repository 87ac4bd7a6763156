//! What one backend call may use: the memory cap of a store (every linear memory and table of
//! every core instance in it, together), and the [`Meter`] of the work the host does on the
//! call's behalf, drawn from the backend's one [`HostWork`] budget.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The bytes the host holds for all of one backend's calls under way together (every instance,
/// every call: a poll's discover, an Allocate and a DRA prepare may run at once): at most its
/// memory cap, however many calls it has going. Each call's [`Meter`] draws on it and gives back
/// what it drew when the call ends.
#[derive(Debug)]
pub struct HostWork {
    held: AtomicUsize,
    limit: usize,
}

impl HostWork {
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(HostWork { held: AtomicUsize::new(0), limit })
    }

    /// Bytes held now for the backend's calls under way.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }
}

use wasmtime::ResourceLimiter;

/// What the host may still do for one guest call. Everything the host allocates or computes
/// because the backend asked (listings, batched reads and stats, glob results, the paths it
/// sent) is charged here: bytes against what the backend's memory cap leaves it when the call
/// starts (an answer ends up in its linear memory anyway), time against the call's deadline.
/// Host loops check it between entries, so a call ends within one entry's work of either limit
/// and the backend gets an error saying which limit it hit and how to stay under it.
#[derive(Debug)]
pub struct Meter {
    limit: usize,
    spent: usize,
    deadline: Instant,
    took: Duration,
    /// The backend's budget this call draws on, if any.
    pool: Option<Arc<HostWork>>,
}

impl Meter {
    /// A call that may make the host hold `limit` bytes for it until `took` from now.
    pub fn new(limit: usize, took: Duration) -> Self {
        Meter { limit, spent: 0, deadline: Instant::now() + took, took, pool: None }
    }

    /// When the call this meter is for must be over.
    pub(crate) fn deadline(&self) -> Instant {
        self.deadline
    }

    /// [`Meter::new`], drawing on the backend's `pool` too: what the backend's other calls
    /// under way hold counts against this one.
    pub(crate) fn drawing_on(limit: usize, took: Duration, pool: Arc<HostWork>) -> Self {
        Meter { pool: Some(pool), ..Meter::new(limit, took) }
    }

    /// Whether more host work may start for this call; the error says which limit is spent.
    pub fn check(&self) -> Result<(), String> {
        if let Some(pool) = &self.pool
            && pool.held() > pool.limit
        {
            return Err(format!(
                "the host holds {} bytes for this backend's calls under way, more than its {} byte memory cap: \
                 ask for fewer paths per batch, or make fewer calls at once",
                pool.held(),
                pool.limit
            ));
        }
        if self.spent > self.limit {
            return Err(format!(
                "the host did {} bytes of work for this call, more than the {} bytes its memory cap leaves it: \
                 ask for fewer paths per batch, or list narrower directories",
                self.spent, self.limit
            ));
        }
        if Instant::now() > self.deadline {
            return Err(format!(
                "the call's {:?} deadline passed while the host worked for it: ask for less per call",
                self.took
            ));
        }
        Ok(())
    }

    /// `bytes` more held or handed back for this call.
    pub(crate) fn charge(&mut self, bytes: usize) {
        self.spent = self.spent.saturating_add(bytes);
        if let Some(pool) = &self.pool {
            pool.held.fetch_add(bytes, Ordering::Relaxed);
        }
    }

    /// Bytes charged so far.
    pub fn spent(&self) -> usize {
        self.spent
    }
}

impl Drop for Meter {
    /// The call ended: what it held is given back to the backend's budget.
    fn drop(&mut self) {
        if let Some(pool) = &self.pool {
            pool.held.fetch_sub(self.spent, Ordering::Relaxed);
        }
    }
}

impl Default for Meter {
    /// Outside a guest call (tests, tools): no host work is cut short.
    fn default() -> Self {
        Meter::new(usize::MAX, Duration::from_secs(365 * 24 * 3600))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_meter_stops_past_its_bytes_or_its_deadline_and_says_which() {
        let mut m = Meter::new(100, Duration::from_secs(60));
        assert!(m.check().is_ok());
        m.charge(100);
        assert!(m.check().is_ok(), "up to the limit is fine");
        m.charge(1);
        assert!(m.check().unwrap_err().contains("more than the 100 bytes"));
        let late = Meter::new(usize::MAX, Duration::ZERO);
        std::thread::yield_now();
        let late_err = (0..1000).find_map(|_| late.check().err()).expect("the deadline passes");
        assert!(late_err.contains("deadline passed"), "{late_err}");
    }

    /// Issue 58 (2): a backend's calls under way share one budget (they each had their own, so
    /// a backend with several calls going made the host hold several caps' worth).
    #[test]
    fn a_backends_calls_under_way_draw_on_one_budget_given_back_when_they_end() {
        let pool = HostWork::new(100);
        let mut first = Meter::drawing_on(100, Duration::from_secs(60), pool.clone());
        let mut second = Meter::drawing_on(100, Duration::from_secs(60), pool.clone());
        first.charge(80);
        assert!(first.check().is_ok() && second.check().is_ok());
        second.charge(30);
        assert!(second.check().unwrap_err().contains("this backend's calls under way"), "110 of 100 together");
        assert!(first.check().is_err(), "the first call is over the shared budget too");
        drop(second);
        assert_eq!(pool.held(), 80);
        assert!(first.check().is_ok(), "given back when the other call ended");
        drop(first);
        assert_eq!(pool.held(), 0);
    }

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
}
