//! Cranelift's incremental compilation cache across versions of one backend: what a backend's
//! last optimised compile made of each function, handed to the compile of its next version, so
//! the functions the two share (a new componentize-js or componentize-py version changes its
//! script, not the engine or interpreter around it) are not compiled again.
//!
//! The cache is never held by the host: a compile worker ([`super::compile_worker`]) reads the
//! previous entries from the cache file itself (descriptor 3, opened by the host without
//! following links), and streams every entry *this* compile uses or makes down a pipe
//! (descriptor 4) as it goes — one version's worth, whatever the number of versions before —
//! which the host writes into the next cache file (`NAME-HASH.incr` in the compile cache
//! directory, under its byte bound and file rules) and keeps only if the compile succeeds. One
//! cache per backend: one backend's compile never reads another's.
//!
//! The file: entries of `[u32 LE key length][key][u32 LE value length][value]`.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::sync::Locked;

/// The descriptor the worker reads the previous cache from.
pub(crate) const PREVIOUS_FD: i32 = 3;
/// The descriptor the worker writes the next cache to.
pub(crate) const NEXT_FD: i32 = 4;

/// The cache the worker compiles with: the previous compile's entries (borrowed from the file's
/// bytes), and the next cache's stream.
pub(crate) struct Store {
    previous: HashMap<&'static [u8], &'static [u8]>,
    next: Mutex<Next>,
    hits: AtomicU64,
    misses: AtomicU64,
}

/// The next cache as it is written: each key once; `out` gone after a write failed (the host
/// then keeps no cache, and the compile is a whole one next time).
struct Next {
    out: Option<Box<dyn Write + Send>>,
    written: HashSet<Vec<u8>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "incremental::Store({} previous entries)", self.previous.len())
    }
}

impl wasmtime::CacheStore for Store {
    fn get(&self, key: &[u8]) -> Option<Cow<'_, [u8]>> {
        match self.previous.get(key) {
            Some(v) => {
                self.hits.fetch_add(1, Ordering::Relaxed);
                self.emit(key, v);
                Some(Cow::Borrowed(v))
            }
            None => {
                self.misses.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    fn insert(&self, key: &[u8], value: Vec<u8>) -> bool {
        self.emit(key, &value)
    }
}

impl Store {
    /// A store over `previous` (a file that does not parse is an empty cache: the compile is
    /// then a whole one, never a wrong one), writing the next cache to `next`.
    pub(crate) fn new(previous: &'static [u8], next: Box<dyn Write + Send>) -> Store {
        Store {
            previous: decode(previous).unwrap_or_default(),
            next: Mutex::new(Next { out: Some(next), written: HashSet::new() }),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// Functions found in the previous compile's entries, and compiled.
    pub(crate) fn counts(&self) -> (u64, u64) {
        (self.hits.load(Ordering::Relaxed), self.misses.load(Ordering::Relaxed))
    }

    /// Write an entry of the next cache (once per key); whether the stream still works.
    fn emit(&self, key: &[u8], value: &[u8]) -> bool {
        let mut next = self.next.locked();
        if !next.written.insert(key.to_vec()) {
            return next.out.is_some();
        }
        let Some(out) = next.out.as_mut() else { return false };
        if write_entry(out, key, value).is_err() {
            next.out = None;
            return false;
        }
        true
    }

    /// Flush the next cache; whether all of it was written.
    pub(crate) fn finish(&self) -> bool {
        let mut next = self.next.locked();
        next.out.as_mut().is_some_and(|o| o.flush().is_ok())
    }
}

/// One entry, framed.
pub(crate) fn write_entry(out: &mut dyn Write, key: &[u8], value: &[u8]) -> std::io::Result<()> {
    let too_long = || std::io::Error::other("an entry past 4 GiB");
    out.write_all(&u32::try_from(key.len()).map_err(|_| too_long())?.to_le_bytes())?;
    out.write_all(key)?;
    out.write_all(&u32::try_from(value.len()).map_err(|_| too_long())?.to_le_bytes())?;
    out.write_all(value)
}

/// The entries of `blob`, borrowed from it, or `None` when it does not parse to its end.
pub(crate) fn decode(mut blob: &[u8]) -> Option<HashMap<&[u8], &[u8]>> {
    fn take<'a>(blob: &mut &'a [u8]) -> Option<&'a [u8]> {
        let (len, rest) = blob.split_first_chunk::<4>()?;
        let len = u32::from_le_bytes(*len) as usize;
        let (part, rest) = (rest.get(..len)?, rest.get(len..)?);
        *blob = rest;
        Some(part)
    }
    let mut out = HashMap::new();
    while !blob.is_empty() {
        let k = take(&mut blob)?;
        let v = take(&mut blob)?;
        out.insert(k, v);
    }
    Some(out)
}

/// The worker's line on stderr saying what the cache spared.
pub(crate) fn counts_line(hits: u64, misses: u64) -> String {
    format!("incremental: reused={hits} compiled={misses}")
}

/// The counts in the worker's stderr ([`counts_line`]), if it said them.
pub(crate) fn parse_counts(stderr: &str) -> Option<(u64, u64)> {
    let line = stderr.lines().rfind(|l| l.starts_with("incremental: "))?;
    let num = |key: &str| line.split_whitespace().find_map(|w| w.strip_prefix(key)).and_then(|n| n.parse().ok());
    Some((num("reused=")?, num("compiled=")?))
}

/// The compile cache file of backend `backend`'s incremental cache for the engine with
/// compatibility hash `hash` (the backend's name hashed: names are the operator's, files are
/// devplug's).
pub(crate) fn entry(backend: &str, hash: u64) -> String {
    use sha2::Digest;
    format!("{}-{hash:016x}.incr", &hex::encode(sha2::Sha256::digest(backend.as_bytes()))[..16])
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmtime::CacheStore;

    /// A writer the test reads back.
    #[derive(Clone, Default)]
    struct Shared(std::sync::Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.locked().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn blob(entries: &[(&[u8], &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for (k, v) in entries {
            write_entry(&mut out, k, v).unwrap();
        }
        out
    }

    #[test]
    fn files_frame_entries_and_what_does_not_parse_is_an_empty_cache() {
        let b = blob(&[(b"k1", b"v1"), (b"", b"empty key"), (b"k3", b"")]);
        let back = decode(&b).unwrap();
        assert_eq!(back.len(), 3);
        assert_eq!(back[b"k1".as_slice()], b"v1");
        assert!(decode(&b[..b.len() - 1]).is_none(), "cut short");
        assert!(decode(&[0xff, 0xff, 0xff, 0xff, 1]).is_none(), "a length past the end");
        let garbage: &'static [u8] = b"garbage";
        assert!(Store::new(garbage, Box::new(Shared::default())).previous.is_empty());
        assert_eq!(parse_counts(&format!("x\n{}\n", counts_line(3, 4))), Some((3, 4)));
        assert_eq!(parse_counts("no such line"), None);
    }

    /// The next cache holds what this compile used or added, each once, never what it did not
    /// touch: one version's worth, whatever came before.
    #[test]
    fn the_next_cache_keeps_only_what_this_compile_used() {
        let previous: &'static [u8] = blob(&[(b"a", b"1"), (b"b", b"2")]).leak();
        let out = Shared::default();
        let store = Store::new(previous, Box::new(out.clone()));
        assert_eq!(store.get(b"a").as_deref(), Some(b"1".as_slice()));
        assert_eq!(store.get(b"a").as_deref(), Some(b"1".as_slice()));
        assert!(store.get(b"z").is_none());
        assert!(store.insert(b"c", b"3".to_vec()));
        assert_eq!(store.counts(), (2, 1));
        assert!(store.finish());
        let written = out.0.locked().clone();
        let next = decode(&written).unwrap();
        let mut keys: Vec<&[u8]> = next.keys().copied().collect();
        keys.sort();
        assert_eq!(keys, [b"a".as_slice(), b"c"]);
        assert_eq!(written.len(), blob(&[(b"a", b"1"), (b"c", b"3")]).len(), "each entry once");
    }
}
