//! What one backend call may use: the memory cap of a store (every linear memory and table of
//! every core instance in it, together), and the [`Meter`] of the work the host does on the
//! call's behalf.

use std::time::{Duration, Instant};

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
}

impl Meter {
    /// A call that may make the host hold `limit` bytes for it until `took` from now.
    pub fn new(limit: usize, took: Duration) -> Self {
        Meter { limit, spent: 0, deadline: Instant::now() + took, took }
    }

    /// Whether more host work may start for this call; the error says which limit is spent.
    pub fn check(&self) -> Result<(), String> {
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
    pub fn charge(&mut self, bytes: usize) {
        self.spent = self.spent.saturating_add(bytes);
    }

    /// Bytes charged so far.
    pub fn spent(&self) -> usize {
        self.spent
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
