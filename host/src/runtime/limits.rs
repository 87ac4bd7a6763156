//! What one backend call may use: the memory cap of a store (every linear memory and table of
//! every core instance in it, together).

use wasmtime::ResourceLimiter;

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
