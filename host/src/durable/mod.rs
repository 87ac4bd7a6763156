//! Writing a file so that a reader, or a crash at any instant, sees the whole old file or the
//! whole new one: a temp file in the same directory, fsynced, renamed over the target, and the
//! directory fsynced. Used for CDI specs and the compile cache. Every flush devplug makes goes
//! through here and is counted ([`fsyncs`]), so a benchmark can say what an operation costs.
//! State devplug alone may touch (the claim checkpoint, release markers, the instance lock)
//! lives in a [`StateDir`].

mod spooled;
mod state_dir;

pub use spooled::Spooled;
pub use state_dir::{FileEntry, OWN_SUBDIR, StateDir};

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// Replace `path` (in `dir`) with `bytes`, mode `mode`. The temp file is named
/// `{temp_prefix}*.tmp`, so readers that glob for real files never pick it up.
pub(crate) fn write_file(dir: &Path, path: &Path, bytes: &[u8], temp_prefix: &str, mode: u32) -> std::io::Result<()> {
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
pub(crate) fn write_file_unflushed(
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

/// The bytes of the regular file at `path`, at most `max` of them: a link, a FIFO, a device or
/// a larger file is an error, never followed, waited on or read without end (a directory
/// devplug writes into but does not own, such as a CDI spec dir, may hold anything).
pub(crate) fn read_regular(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let file =
        fs::OpenOptions::new().read(true).custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK).open(path)?;
    let meta = file.metadata()?;
    let kind = meta.file_type();
    if !kind.is_file() || kind.is_fifo() || meta.len() > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{}: not a regular file of at most {max} bytes", path.display()),
        ));
    }
    let mut bytes = Vec::new();
    file.take(max).read_to_end(&mut bytes)?;
    Ok(bytes)
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
pub(crate) fn sync_all(file: &fs::File) -> std::io::Result<()> {
    counted();
    file.sync_all()
}

/// `fdatasync` `file`, counted.
pub(crate) fn sync_data(file: &fs::File) -> std::io::Result<()> {
    counted();
    file.sync_data()
}

/// Make a rename or unlink in `dir` durable. Best effort: some file systems refuse fsync on a
/// directory.
pub(crate) fn sync_dir(dir: &Path) {
    if let Ok(d) = fs::File::open(dir) {
        let _ = sync_all(&d);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A link named like one of devplug's CDI specs (to `/dev/zero`, or to a secret) is never
    /// read through, and a FIFO never blocks the read.
    #[test]
    fn only_a_bounded_regular_file_is_read() {
        let d = tempfile::tempdir().unwrap();
        let spec = d.path().join("devplug-a.json");
        fs::write(&spec, b"{}").unwrap();
        assert_eq!(read_regular(&spec, 16).unwrap(), b"{}");
        assert!(read_regular(&spec, 1).is_err(), "larger than the cap");
        let link = d.path().join("devplug-b.json");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        assert!(read_regular(&link, 1 << 20).is_err());
        let fifo = d.path().join("devplug-c.json");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        assert!(read_regular(&fifo, 1 << 20).is_err());
    }
}
