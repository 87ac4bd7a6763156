//! Writing a file so that a reader, or a crash at any instant, sees the whole old file or the
//! whole new one: a temp file in the same directory, fsynced, renamed over the target, and the
//! directory fsynced. Used for CDI specs and the compile cache. Every flush devplug makes goes
//! through here and is counted ([`fsyncs`]), so a benchmark can say what an operation costs.

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// Replace `path` (in `dir`) with `bytes`, mode `mode`. The temp file is named
/// `{temp_prefix}*.tmp`, so readers that glob for real files never pick it up.
pub fn write_file(dir: &Path, path: &Path, bytes: &[u8], temp_prefix: &str, mode: u32) -> std::io::Result<()> {
    let mut tmp = tempfile::Builder::new().prefix(temp_prefix).suffix(".tmp").tempfile_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().set_permissions(fs::Permissions::from_mode(mode))?;
    sync_all(tmp.as_file())?;
    tmp.persist(path).map_err(|e| e.error)?;
    sync_dir(dir);
    Ok(())
}

/// [`write_file`] without flushing: readers see the whole old file or the whole new one, and a
/// killed process leaves one of them, but a power cut may lose the write. For files devplug
/// writes again whenever they may be gone (a claim's CDI spec: a reboot is noticed by its boot
/// ID, a missing spec by its absence).
pub fn write_file_unflushed(
    dir: &Path,
    path: &Path,
    bytes: &[u8],
    temp_prefix: &str,
    mode: u32,
) -> std::io::Result<()> {
    let mut tmp = tempfile::Builder::new().prefix(temp_prefix).suffix(".tmp").tempfile_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().set_permissions(fs::Permissions::from_mode(mode))?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

static FSYNCS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Flushes (`fsync`, `fdatasync`) this process has made so far.
pub fn fsyncs() -> u64 {
    FSYNCS.load(std::sync::atomic::Ordering::Relaxed)
}

fn counted() {
    FSYNCS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// `fsync` `file`, counted.
pub fn sync_all(file: &fs::File) -> std::io::Result<()> {
    counted();
    file.sync_all()
}

/// `fdatasync` `file`, counted.
pub fn sync_data(file: &fs::File) -> std::io::Result<()> {
    counted();
    file.sync_data()
}

/// Make a rename or unlink in `dir` durable. Best effort: some file systems refuse fsync on a
/// directory.
pub fn sync_dir(dir: &Path) {
    if let Ok(d) = fs::File::open(dir) {
        let _ = sync_all(&d);
    }
}
