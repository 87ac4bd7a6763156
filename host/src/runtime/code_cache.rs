//! The compile cache on disk: native code of compiled components, one `.cwasm` file per
//! (component sha256, engine, tier), and one `.incr` incremental cache per backend
//! ([`super::incremental`]), written through devplug's own state directory (`0600`
//! files, no links followed) and kept within its byte bound by least recent use; a temp file a
//! killed write left is removed at start.

use std::path::Path;
use std::time::Duration;

use wasmtime::component::Component;

/// Write a component's native code into the cache as `name`, then keep the cache within
/// `max` bytes; a failure is logged, not fatal.
pub(super) fn store(state: &crate::durable::StateDir, dir: &Path, name: &str, component: &Component, max: u64) {
    match component.serialize() {
        Ok(native) => {
            write_native(state, dir, name, &native);
        }
        Err(e) => tracing::warn!(error = %e, "could not serialize a compiled backend"),
    }
    evict(state, dir, name, max);
}

/// [`store`] for code compiled elsewhere (the background optimiser), the cache opened here;
/// `replaces` (the same component's baseline entry) is removed once it is written: every later
/// load takes the optimised entry, and the baseline one is tens of MB for a large backend.
pub(super) fn store_native(dir: &Path, name: &str, native: &[u8], max: u64, replaces: Option<&str>) {
    match crate::durable::StateDir::open(dir) {
        Ok(state) => {
            if write_native(&state, dir, name, native)
                && let Some(old) = replaces
            {
                let _ = state.remove(old);
            }
            evict(&state, dir, name, max);
        }
        Err(e) => tracing::warn!(dir = %dir.display(), error = %e, "compile cache refused; optimised code not kept"),
    }
}

/// Whether it was written (a failure is logged).
pub(super) fn write_native(state: &crate::durable::StateDir, dir: &Path, name: &str, native: &[u8]) -> bool {
    let written = state.write(name, native, true);
    if let Err(e) = &written {
        tracing::warn!(dir = %dir.display(), error = %e, "could not write the compile cache; continuing without it");
    }
    written.is_ok()
}

/// A temp file of an entry's write older than this was left by a write that never finished (a
/// devplug killed while writing): writing even a 100 MB entry takes seconds.
pub(super) const STALE_TEMP: Duration = Duration::from_secs(600);

/// Remove the least recently used compiled code until the cache's `.cwasm` files (and the temp
/// files of writes under way) take at most `max` bytes; `keep` (just written) stays whatever its
/// size. Temp files an interrupted write left ([`STALE_TEMP`]) are removed first; a fresh one,
/// perhaps another devplug's write under way (a rolling update shares a hostPath cache), is
/// counted and left alone. Only this module's own entries are counted or removed (the
/// registry's pulled versions live in sub-directories).
pub(super) fn evict(state: &crate::durable::StateDir, dir: &Path, keep: &str, max: u64) {
    let Ok(mut files) = state.files() else { return };
    // `StateDir::write`'s temp name of an entry: `.NAME.cwasm.PID.RAND.tmp` (`.incr.` for an
    // incremental cache).
    let temp = |f: &crate::durable::FileEntry| {
        f.name.starts_with('.') && (f.name.contains(".cwasm.") || f.name.contains(".incr.")) && f.name.ends_with(".tmp")
    };
    let now = std::time::SystemTime::now();
    let stale = |f: &crate::durable::FileEntry| now.duration_since(f.modified).is_ok_and(|age| age >= STALE_TEMP);
    for f in files.iter().filter(|f| temp(f) && stale(f)) {
        match state.remove(&f.name) {
            Ok(_) => {
                tracing::info!(dir = %dir.display(), file = %f.name, bytes = f.len, "removed the temp file of a compile cache write that never finished")
            }
            Err(e) => {
                tracing::warn!(dir = %dir.display(), file = %f.name, error = %e, "could not remove a stale compile cache temp file")
            }
        }
    }
    let entry = |f: &crate::durable::FileEntry| {
        (f.name.ends_with(".cwasm") || f.name.ends_with(".incr")) && !f.name.starts_with('.')
    };
    files.retain(|f| entry(f) || (temp(f) && !stale(f)));
    let mut total: u64 = files.iter().map(|f| f.len).sum();
    if total <= max {
        return;
    }
    files.sort_by_key(|f| f.modified);
    for f in files.iter().filter(|f| f.name != keep && !temp(f)) {
        if total <= max {
            break;
        }
        match state.remove(&f.name) {
            Ok(_) => {
                total = total.saturating_sub(f.len);
                tracing::info!(dir = %dir.display(), entry = %f.name, bytes = f.len, "compile cache over its size limit: least recently used entry removed");
            }
            Err(e) => {
                tracing::warn!(dir = %dir.display(), entry = %f.name, error = %e, "could not remove a compile cache entry")
            }
        }
    }
}

pub(super) fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 49: the cache only grew. Past its limit the least recently used entries go (a
    /// hit counts as a use), the entry just written stays, and nothing but `.cwasm` (and
    /// `.incr`) files is counted or touched.
    #[test]
    fn the_compile_cache_keeps_to_its_size_by_least_recent_use() {
        let d = tempfile::tempdir().unwrap();
        let state = crate::durable::StateDir::open(d.path()).unwrap();
        let old = std::time::SystemTime::now() - Duration::from_secs(3600);
        for (i, name) in ["a.cwasm", "b.incr", "c.cwasm", "other.json"].iter().enumerate() {
            state.write(name, &[0u8; 1000], false).unwrap();
            let f = std::fs::File::options().write(true).open(d.path().join(name)).unwrap();
            f.set_modified(old + Duration::from_secs(i as u64 * 60)).unwrap();
        }
        // `a` is the oldest write but was used since.
        state.mark_used("a.cwasm").unwrap();
        state.write("new.cwasm", &[0u8; 1500], false).unwrap();
        evict(&state, d.path(), "new.cwasm", 3000);
        let mut left: Vec<String> = state.files().unwrap().into_iter().map(|f| f.name).collect();
        left.sort();
        assert_eq!(left, ["a.cwasm", "new.cwasm", "other.json"]);
        // The entry just written stays even when it alone is over the limit.
        evict(&state, d.path(), "new.cwasm", 10);
        let left: Vec<String> = state.files().unwrap().into_iter().map(|f| f.name).collect();
        assert!(left.contains(&"new.cwasm".to_owned()) && !left.contains(&"a.cwasm".to_owned()), "{left:?}");
    }
}
