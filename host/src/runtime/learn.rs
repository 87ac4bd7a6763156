//! What a backend touched, for `devplug discover --learn-requests`: every path it read, listed,
//! resolved, stat'ed or globbed through its capability calls, as it asked for them. The command
//! turns this into the narrowest `[requests]` that allows exactly that.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::sync::Locked;

/// Capability calls seen: (call, path as asked) → how many times.
#[derive(Default)]
pub struct Learned(Mutex<BTreeMap<(String, String), u64>>);

/// Distinct (call, path) pairs remembered: a backend cannot make the recorder grow without bound.
const MAX_LEARNED: usize = 100_000;

impl Learned {
    pub fn record(&self, call: &str, path: &str) {
        let mut seen = self.0.locked();
        let key = (call.to_owned(), path.to_owned());
        if seen.len() < MAX_LEARNED || seen.contains_key(&key) {
            *seen.entry(key).or_default() += 1;
        }
    }

    /// Everything seen, by (call, path).
    pub fn seen(&self) -> BTreeMap<(String, String), u64> {
        self.0.locked().clone()
    }
}
