//! Writing a file so that a reader, or a crash at any instant, sees the whole old file or the
//! whole new one: a temp file in the same directory, fsynced, renamed over the target, and the
//! directory fsynced. Used for CDI specs and the compile cache.

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
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    sync_dir(dir);
    Ok(())
}

/// Make a rename or unlink in `dir` durable. Best effort: some file systems refuse fsync on a
/// directory.
pub fn sync_dir(dir: &Path) {
    if let Ok(d) = fs::File::open(dir) {
        let _ = d.sync_all();
    }
}
