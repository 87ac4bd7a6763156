//! Directories only devplug can touch, and files opened only relative to them without following
//! links: the claim checkpoint and its journal, release markers, the instance lock.
//!
//! A directory is created `0700`, opened once (`O_DIRECTORY | O_NOFOLLOW`) and checked: owned
//! by devplug's user, writable by no one else. Every file in it is opened through that
//! descriptor with `O_NOFOLLOW` (so a link planted at a state path makes the open fail instead
//! of emptying or overwriting what it points at), checked to be a regular file owned by
//! devplug's user, created `0600`, and replaced by a rename inside the directory. Anything else
//! at a state path is refused with an error naming the path and what to do, and never opened,
//! truncated or written through.

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat, renameat};
use nix::sys::stat::{FileStat, Mode, SFlag, fstat, fstatat, mkdirat};
use nix::unistd::{UnlinkatFlags, unlinkat};

/// A regular file in a [`StateDir`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileEntry {
    pub name: String,
    pub len: u64,
    pub modified: std::time::SystemTime,
}

/// A directory devplug keeps state in.
#[derive(Debug)]
pub struct StateDir {
    path: PathBuf,
    fd: OwnedFd,
}

/// Why a state path was refused (not an I/O failure: something is there that devplug did not
/// put there, or put there for someone else).
fn refused(path: &Path, why: &str) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::PermissionDenied,
        format!(
            "{}: {why}; devplug keeps its state only in files it owns and opens no link: remove it (devplug creates it again)",
            path.display()
        ),
    )
}

fn io_at(path: &Path) -> impl Fn(Errno) -> std::io::Error + '_ {
    move |e| match e {
        Errno::ELOOP | Errno::ENOTDIR => refused(path, "a symbolic link or not what it should be"),
        e => std::io::Error::new(std::io::Error::from(e).kind(), format!("{}: {e}", path.display())),
    }
}

/// Whether `st` belongs to this process's user and no other user may write it.
fn own(st: &FileStat) -> Result<(), &'static str> {
    if st.st_uid != nix::unistd::geteuid().as_raw() {
        return Err("owned by another user");
    }
    if st.st_mode & 0o022 != 0 {
        return Err("writable by other users");
    }
    Ok(())
}

fn check_name(name: &str) -> std::io::Result<()> {
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{name:?} is not a file name")));
    }
    Ok(())
}

/// The name of devplug's own directory inside a directory it shares (see [`StateDir::own_place`]).
pub const OWN_SUBDIR: &str = "devplug";

impl StateDir {
    /// Where devplug keeps a state directory configured as `path`: `path` itself when it is
    /// missing (it is created `0700`) or already devplug's alone, else — a directory others may
    /// write, such as the `0777` emptyDir kubelet makes, or another user's — devplug's own
    /// `0700` sub-directory [`OWN_SUBDIR`] inside it, which [`StateDir::open`] then checks as it
    /// checks any state directory (so a sub-directory another user planted, or a link, is still
    /// refused). A link at `path` is returned as it is, to be refused by `open`.
    pub(crate) fn own_place(path: &Path) -> PathBuf {
        match nix::sys::stat::lstat(path) {
            Ok(st) if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR && own(&st).is_err() => {
                path.join(OWN_SUBDIR)
            }
            _ => path.to_owned(),
        }
    }

    /// Open directory `path`, creating it (and its parents) `0700` if missing. A link, a
    /// non-directory, or a directory another user owns or may write is refused.
    pub fn open(path: &Path) -> std::io::Result<StateDir> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)
                .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", parent.display())))?;
        }
        let (parent, name) = match (path.parent(), path.file_name()) {
            (Some(p), Some(n)) => (if p.as_os_str().is_empty() { Path::new(".") } else { p }, n),
            _ => return Err(refused(path, "not a directory path")),
        };
        let parent_fd = openat(nix::fcntl::AT_FDCWD, parent, OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
            .map_err(io_at(parent))?;
        match mkdirat(&parent_fd, name, Mode::from_bits_truncate(0o700)) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(io_at(path)(e)),
        }
        let fd = openat(&parent_fd, name, OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::empty())
            .map_err(io_at(path))?;
        let st = fstat(&fd).map_err(io_at(path))?;
        own(&st).map_err(|why| refused(path, why))?;
        Ok(StateDir { path: path.to_owned(), fd })
    }

    /// The directory's path (for messages; files are never opened by it).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where file `name` is, for messages.
    pub fn shown(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// The sub-directory `name`, created `0700` if missing, checked as [`StateDir::open`] checks.
    pub(crate) fn subdir(&self, name: &str) -> std::io::Result<StateDir> {
        check_name(name)?;
        let path = self.shown(name);
        match mkdirat(&self.fd, name, Mode::from_bits_truncate(0o700)) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(io_at(&path)(e)),
        }
        let fd = openat(&self.fd, name, OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::empty())
            .map_err(io_at(&path))?;
        let st = fstat(&fd).map_err(io_at(&path))?;
        own(&st).map_err(|why| refused(&path, why))?;
        Ok(StateDir { path, fd })
    }

    /// Open `name` with `flags` (never following a link), checked to be a regular file of ours.
    fn open_file(&self, name: &str, flags: OFlag) -> std::io::Result<File> {
        check_name(name)?;
        let path = self.shown(name);
        let fd = openat(&self.fd, name, flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::from_bits_truncate(0o600))
            .map_err(io_at(&path))?;
        let st = fstat(&fd).map_err(io_at(&path))?;
        if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
            return Err(refused(&path, "not a regular file"));
        }
        own(&st).map_err(|why| refused(&path, why))?;
        Ok(File::from(fd))
    }

    /// A new file in this directory with no name (gone when closed), opened through the
    /// directory's descriptor: `O_TMPFILE` where the file system has it, else a fresh name
    /// created exclusively and unlinked at once.
    pub(crate) fn unnamed(&self) -> std::io::Result<File> {
        let flags = OFlag::O_TMPFILE | OFlag::O_RDWR | OFlag::O_CLOEXEC;
        match openat(&self.fd, ".", flags, Mode::from_bits_truncate(0o600)) {
            Ok(fd) => Ok(File::from(fd)),
            Err(Errno::EOPNOTSUPP | Errno::EISDIR | Errno::EINVAL) => {
                let tmp = format!(".unnamed.{}.{:x}.tmp", std::process::id(), rand_suffix());
                let f = self.open_file(&tmp, OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_EXCL)?;
                unlinkat(&self.fd, tmp.as_str(), UnlinkatFlags::NoRemoveDir).map_err(io_at(&self.shown(&tmp)))?;
                Ok(f)
            }
            Err(e) => Err(io_at(&self.path)(e)),
        }
    }

    /// The bytes of `name`, `None` if there is no such file.
    pub fn read(&self, name: &str) -> std::io::Result<Option<Vec<u8>>> {
        // O_NONBLOCK: a FIFO planted at a state path cannot hang the open.
        match self.open_file(name, OFlag::O_RDONLY | OFlag::O_NONBLOCK) {
            Ok(mut f) => {
                let mut bytes = Vec::new();
                std::io::Read::read_to_end(&mut f, &mut bytes)?;
                Ok(Some(bytes))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `name` opened to read (a regular file of devplug's user, no link followed).
    pub(crate) fn open_read(&self, name: &str) -> std::io::Result<File> {
        self.open_file(name, OFlag::O_RDONLY | OFlag::O_NONBLOCK)
    }

    /// Whether `name` exists (a link counts: it is refused when opened).
    pub fn exists(&self, name: &str) -> bool {
        check_name(name).is_ok() && fstatat(&self.fd, name, AtFlags::AT_SYMLINK_NOFOLLOW).is_ok()
    }

    /// `name` opened to read and append, created `0600` if missing; whether it was created.
    pub(crate) fn open_append(&self, name: &str) -> std::io::Result<(File, bool)> {
        match self.open_file(name, OFlag::O_RDWR | OFlag::O_APPEND) {
            Ok(f) => Ok((f, false)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let f = self.open_file(name, OFlag::O_RDWR | OFlag::O_APPEND | OFlag::O_CREAT | OFlag::O_EXCL)?;
                self.sync();
                Ok((f, true))
            }
            Err(e) => Err(e),
        }
    }

    /// `name` opened to read and write (not truncated), created `0600` if missing.
    pub(crate) fn open_rw(&self, name: &str) -> std::io::Result<File> {
        match self.open_file(name, OFlag::O_RDWR) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.open_file(name, OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_EXCL)
            }
            other => other,
        }
    }

    /// Create `name` empty (`0600`) unless it exists already as a file of ours.
    pub fn touch(&self, name: &str) -> std::io::Result<()> {
        match self.open_file(name, OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL) {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => self.open_file(name, OFlag::O_RDONLY).map(drop),
            Err(e) => Err(e),
        }
    }

    /// Replace `name` with `bytes`: a new `0600` file beside it, flushed when `flush`, renamed
    /// over it (a rename replaces a link itself, never its target), the directory flushed.
    pub fn write(&self, name: &str, bytes: &[u8], flush: bool) -> std::io::Result<()> {
        self.write_with(name, |f| f.write_all(bytes), flush)
    }

    /// [`StateDir::write`] of what `fill` writes into the new file (a stream too large to hold
    /// in memory); nothing replaces `name` when `fill` fails.
    pub(crate) fn write_with(
        &self,
        name: &str,
        fill: impl FnOnce(&mut File) -> std::io::Result<()>,
        flush: bool,
    ) -> std::io::Result<()> {
        check_name(name)?;
        let tmp = format!(".{name}.{}.{:x}.tmp", std::process::id(), rand_suffix());
        let mut f = self.open_file(&tmp, OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL)?;
        let written = fill(&mut f).and_then(|_| if flush { super::sync_all(&f) } else { Ok(()) });
        let renamed = written
            .and_then(|_| renameat(&self.fd, tmp.as_str(), &self.fd, name).map_err(|e| io_at(&self.shown(name))(e)));
        if let Err(e) = renamed {
            let _ = unlinkat(&self.fd, tmp.as_str(), UnlinkatFlags::NoRemoveDir);
            return Err(e);
        }
        if flush {
            self.sync();
        }
        Ok(())
    }

    /// Copy `name` to `to` in the same directory (a damaged file kept aside); never through a link.
    pub fn copy(&self, name: &str, to: &str) -> std::io::Result<()> {
        match self.read(name)? {
            Some(bytes) => self.write(to, &bytes, false),
            None => Ok(()),
        }
    }

    /// Remove `name` (a link is removed itself); whether it was there.
    pub fn remove(&self, name: &str) -> std::io::Result<bool> {
        check_name(name)?;
        match unlinkat(&self.fd, name, UnlinkatFlags::NoRemoveDir) {
            Ok(()) => Ok(true),
            Err(Errno::ENOENT) => Ok(false),
            Err(e) => Err(io_at(&self.shown(name))(e)),
        }
    }

    /// The regular files directly in the directory (links and anything else left out, never
    /// followed), with their sizes and modification times.
    pub fn files(&self) -> std::io::Result<Vec<FileEntry>> {
        let fd = self.fd.as_fd().try_clone_to_owned()?;
        let mut dir = nix::dir::Dir::from_fd(fd).map_err(io_at(&self.path))?;
        let mut out = Vec::new();
        for e in dir.iter() {
            let Ok(e) = e else { continue };
            let Ok(name) = e.file_name().to_str() else { continue };
            if name == "." || name == ".." {
                continue;
            }
            let Ok(st) = fstatat(&self.fd, name, AtFlags::AT_SYMLINK_NOFOLLOW) else { continue };
            if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
                continue;
            }
            let modified = std::time::UNIX_EPOCH
                + std::time::Duration::new(st.st_mtime.max(0) as u64, st.st_mtime_nsec.max(0) as u32);
            out.push(FileEntry { name: name.to_owned(), len: st.st_size.max(0) as u64, modified });
        }
        Ok(out)
    }

    /// Mark `name` used now (its modification time), for least-recently-used eviction.
    pub(crate) fn mark_used(&self, name: &str) -> std::io::Result<()> {
        let f = self.open_file(name, OFlag::O_RDONLY | OFlag::O_NONBLOCK)?;
        f.set_modified(std::time::SystemTime::now())
    }

    /// Flush the directory (a create, rename or unlink in it).
    pub fn sync(&self) {
        if let Ok(fd) = self.fd.as_fd().try_clone_to_owned() {
            let _ = super::sync_all(&File::from(fd));
        }
    }
}

/// A few random bits for temp names (collisions are refused by `O_EXCL` anyway).
fn rand_suffix() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 62: kubelet makes an emptyDir `0777`; the chart's default cache is one, and devplug
    /// refused it, so every pod compiled every backend again. Its own `0700` directory inside
    /// is used instead, with the same ownership rules; a directory of its own is used as it is.
    #[test]
    fn a_shared_directory_holds_devplugs_own_private_one() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let shared = d.path().join("emptydir");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(StateDir::open(&shared).unwrap_err().to_string().contains("writable by other users"));
        let place = StateDir::own_place(&shared);
        assert_eq!(place, shared.join(OWN_SUBDIR));
        let state = StateDir::open(&place).unwrap();
        state.write("entry", b"code", false).unwrap();
        let mode = std::fs::metadata(&place).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "devplug's own directory is private");
        // The same place on the next start (the cache is found again).
        assert_eq!(StateDir::own_place(&shared), place);
        assert_eq!(StateDir::open(&place).unwrap().read("entry").unwrap().as_deref(), Some(&b"code"[..]));
        // A private directory, or none yet, is used as it is.
        let own = d.path().join("own");
        assert_eq!(StateDir::own_place(&own), own);
        StateDir::open(&own).unwrap();
        assert_eq!(StateDir::own_place(&own), own);
        // What another user could plant in the shared directory is still refused: a link at
        // devplug's name, or a directory others may write.
        std::fs::remove_dir_all(&place).unwrap();
        std::os::unix::fs::symlink(&own, &place).unwrap();
        assert!(StateDir::open(&StateDir::own_place(&shared)).is_err(), "a link planted at devplug's name");
        std::fs::remove_file(&place).unwrap();
        std::fs::create_dir(&place).unwrap();
        std::fs::set_permissions(&place, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(
            StateDir::open(&StateDir::own_place(&shared)).unwrap_err().to_string().contains("writable by other users")
        );
        // A link at the configured path itself is not looked through either.
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&shared, &link).unwrap();
        assert_eq!(StateDir::own_place(&link), link);
        assert!(StateDir::open(&link).is_err());
    }
    use std::os::unix::fs::{PermissionsExt, symlink};

    /// A download spooled before it is checked goes into the directory devplug opened, never
    /// through its path: after the directory is moved and a link planted at its old name, the
    /// unnamed file is still made beside the moved directory's files, the link's target gets
    /// nothing, and no name is left behind.
    #[test]
    fn an_unnamed_file_is_made_through_the_directory_not_its_path() {
        use std::io::{Read, Seek, Write};
        use std::os::unix::fs::MetadataExt;
        let d = tempfile::tempdir().unwrap();
        let (at, moved, elsewhere) = (d.path().join("cache"), d.path().join("moved"), d.path().join("elsewhere"));
        let state = StateDir::open(&at).unwrap();
        std::fs::rename(&at, &moved).unwrap();
        std::fs::create_dir(&elsewhere).unwrap();
        symlink(&elsewhere, &at).unwrap();
        let mut f = state.unnamed().unwrap();
        f.write_all(b"native code").unwrap();
        let meta = f.metadata().unwrap();
        assert_eq!(meta.nlink(), 0, "no name");
        assert_eq!(meta.mode() & 0o777, 0o600);
        assert_eq!(meta.dev(), std::fs::metadata(&moved).unwrap().dev());
        assert_eq!(std::fs::read_dir(&moved).unwrap().count(), 0);
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
        f.rewind().unwrap();
        let mut back = String::new();
        f.read_to_string(&mut back).unwrap();
        assert_eq!(back, "native code");
    }

    #[test]
    fn state_is_created_private_and_written_whole() {
        let d = tempfile::tempdir().unwrap();
        let dir = StateDir::open(&d.path().join("a/b")).unwrap();
        assert_eq!(std::fs::metadata(d.path().join("a/b")).unwrap().permissions().mode() & 0o777, 0o700);
        dir.write("f", b"one", true).unwrap();
        dir.write("f", b"two", false).unwrap();
        assert_eq!(dir.read("f").unwrap().unwrap(), b"two");
        assert_eq!(std::fs::metadata(d.path().join("a/b/f")).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(dir.read("missing").unwrap(), None);
        let (mut f, created) = dir.open_append("log").unwrap();
        assert!(created);
        f.write_all(b"x\n").unwrap();
        assert!(!dir.open_append("log").unwrap().1);
        assert!(dir.remove("log").unwrap() && !dir.remove("log").unwrap());
        assert!(dir.subdir("../x").is_err() && dir.read("a/b").is_err());
    }

    /// Issue 41: a link planted at a state path made devplug empty or overwrite its target.
    #[test]
    fn a_link_or_a_non_file_at_a_state_path_is_refused_and_its_target_untouched() {
        let d = tempfile::tempdir().unwrap();
        let dir = StateDir::open(&d.path().join("s")).unwrap();
        let target = d.path().join("precious");
        std::fs::write(&target, b"keep me").unwrap();
        symlink(&target, d.path().join("s/journal")).unwrap();
        symlink(&target, d.path().join("s/lock")).unwrap();
        std::fs::create_dir(d.path().join("s/dir")).unwrap();
        for e in [
            dir.open_append("journal").unwrap_err(),
            dir.open_rw("lock").unwrap_err(),
            dir.read("journal").unwrap_err(),
            dir.read("dir").unwrap_err(),
            dir.touch("journal").unwrap_err(),
        ] {
            assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}");
            assert!(e.to_string().contains("remove it"), "{e}");
        }
        assert_eq!(std::fs::read(&target).unwrap(), b"keep me", "the link's target is untouched");
        // A rename replaces the link, never what it points at.
        dir.write("journal", b"mine", false).unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"keep me");
        assert_eq!(dir.read("journal").unwrap().unwrap(), b"mine");
        // The directory itself: a link, or one others may write, is refused.
        symlink(d.path().join("s"), d.path().join("linked")).unwrap();
        assert!(StateDir::open(&d.path().join("linked")).is_err());
        std::fs::create_dir(d.path().join("open")).unwrap();
        std::fs::set_permissions(d.path().join("open"), std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(StateDir::open(&d.path().join("open")).unwrap_err().to_string().contains("writable by other users"));
    }
}
