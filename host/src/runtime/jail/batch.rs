//! Batched capability calls (WIT 0.2.0's `read-many`, `read-link-many`, `list-dir-many`): the
//! same answers as one call per path, with each directory resolved once for all its entries.
//!
//! A single read costs an `openat2(RESOLVE_BENEATH)` plus a `/proc/self/fd` lookup to learn
//! where the path really is. In a batch the paths are grouped by parent directory; the parent is
//! opened (and its real path learned) once, and each entry is opened relative to it with
//! `O_NOFOLLOW`: a single component that is not a symlink lies exactly at `parent/name`, so the
//! resolved-path check needs no lookup of its own. Anything else (the entry is a symlink, the
//! parent cannot be opened, no `openat2`) takes the single-path route, so the rules and the error
//! a backend sees are the same either way.
//!
//! The opened parents are kept in an [`OpenDirs`] for the rest of one guest call: a backend asks
//! about the same device directory several times in one discover (its IDs, then its driver, then
//! its AER counters), and resolving it once saves an `openat2` and a `/proc/self/fd` lookup each
//! time after the first. A directory renamed during that call is seen under the name it had when
//! the call first opened it, as a single read racing the rename would see it; the next call
//! resolves it afresh.

use std::collections::HashMap;
use std::fs;
use std::os::fd::OwnedFd;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat, readlinkat};
use nix::sys::stat::{Mode, fstatat};

use super::nodes::{NodeStat, classify, from_descriptor};
use super::{FsError, Jail, dir_names, read_attribute};
use crate::runtime::caps::Access;
use crate::runtime::limits::Meter;

/// What an answer costs the host in bytes (its heap data and a fixed part), for the [`Meter`].
pub trait Cost {
    fn cost(&self) -> usize;
}

impl Cost for String {
    fn cost(&self) -> usize {
        std::mem::size_of::<String>() + self.len()
    }
}

impl Cost for Vec<String> {
    fn cost(&self) -> usize {
        std::mem::size_of::<Vec<String>>() + self.iter().map(Cost::cost).sum::<usize>()
    }
}

impl Cost for NodeStat {
    fn cost(&self) -> usize {
        std::mem::size_of::<NodeStat>()
    }
}

impl<T: Cost> Cost for Result<T, FsError> {
    fn cost(&self) -> usize {
        match self {
            Ok(v) => v.cost(),
            Err(FsError::Denied(s) | FsError::InvalidPath(s) | FsError::Io(s)) => 32 + s.len(),
            Err(FsError::NotFound) => 32,
        }
    }
}

/// Paths a single batched call may name.
pub const MAX_BATCH: usize = 4096;

/// Parent directories one guest call keeps open; past this many, the oldest are closed (all of
/// them: the next batch reopens what it needs), so a backend cannot pile up descriptors.
pub const MAX_OPEN_DIRS: usize = 1024;

/// A parent directory opened once for the entries of a batch that lie in it.
struct Parent {
    fd: OwnedFd,
    canonical: String,
}

/// The parent directories opened during one guest call, by the path the backend named; `None`
/// remembers one that could not be opened, so its entries take the single-path route without
/// another try. Empty it when the call ends ([`OpenDirs::clear`]).
#[derive(Default)]
pub struct OpenDirs {
    dirs: HashMap<String, Option<Parent>>,
}

impl OpenDirs {
    /// Close every directory: the next call resolves them afresh.
    pub fn clear(&mut self) {
        self.dirs.clear();
    }

    /// Directories held open now.
    pub fn len(&self) -> usize {
        self.dirs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.dirs.is_empty()
    }

    fn get(&mut self, jail: &Jail, dir: &str) -> Option<&Parent> {
        if !self.dirs.contains_key(dir) {
            if self.dirs.len() >= MAX_OPEN_DIRS {
                self.dirs.clear();
            }
            self.dirs.insert(dir.to_owned(), jail.open_parent(dir));
        }
        self.dirs.get(dir).and_then(Option::as_ref)
    }
}

/// What a batched call does with one entry of an opened parent; `None` means "take the
/// single-path route" (the entry is a symlink, or the fast path does not apply).
type Fast<T> = fn(&Jail, &Parent, &str, &str) -> Option<Result<T, FsError>>;

impl Jail {
    /// [`Jail::read`] of every path, answers in order; parents opened in `dirs` (or found there).
    /// Every answer is charged to `meter`; once it is spent the remaining paths get its error.
    pub fn read_many(&self, paths: &[String], dirs: &mut OpenDirs, meter: &mut Meter) -> Vec<Result<String, FsError>> {
        self.batch(paths, dirs, meter, Access::Contents, Jail::read, read_in)
    }

    /// [`Jail::read_link`] of every path, answers in order.
    pub(crate) fn read_link_many(
        &self,
        paths: &[String],
        dirs: &mut OpenDirs,
        meter: &mut Meter,
    ) -> Vec<Result<String, FsError>> {
        self.batch(paths, dirs, meter, Access::Contents, Jail::read_link, read_link_in)
    }

    /// [`Jail::stat_node`] of every path, answers in order: a device's nodes in one pass, each
    /// directory (`/dev/infiniband`, `/dev/vfio`) opened once.
    pub(crate) fn stat_nodes(
        &self,
        paths: &[String],
        dirs: &mut OpenDirs,
        meter: &mut Meter,
    ) -> Vec<Result<NodeStat, FsError>> {
        self.batch(paths, dirs, meter, Access::Contents, Jail::stat_node, stat_in)
    }

    /// [`Jail::list`] of every path, answers in order.
    pub(crate) fn list_many(
        &self,
        paths: &[String],
        dirs: &mut OpenDirs,
        meter: &mut Meter,
    ) -> Vec<Result<Vec<String>, FsError>> {
        self.batch(paths, dirs, meter, Access::Names, Jail::list, list_in)
    }

    fn batch<T: Cost>(
        &self,
        paths: &[String],
        dirs: &mut OpenDirs,
        meter: &mut Meter,
        access: Access,
        single: fn(&Jail, &str) -> Result<T, FsError>,
        fast: Fast<T>,
    ) -> Vec<Result<T, FsError>> {
        // Visit paths grouped by parent: a batch larger than `MAX_OPEN_DIRS` directories then
        // still opens each of them once.
        let mut order: Vec<usize> = (0..paths.len()).collect();
        order.sort_by_key(|&i| paths[i].rsplit_once('/').map_or("", |(p, _)| p));
        let mut out: Vec<Option<Result<T, FsError>>> = (0..paths.len()).map(|_| None).collect();
        for i in order {
            if let Err(why) = meter.check() {
                out[i] = Some(Err(FsError::Io(why)));
                continue;
            }
            let rel = paths[i].as_str();
            let answer = match self.split_checked(rel, access) {
                Err(e) => Err(e),
                Ok(None) => single(self, rel),
                Ok(Some((dir, name))) => match dirs.get(self, dir) {
                    Some(p) => fast(self, p, rel, name).unwrap_or_else(|| single(self, rel)),
                    None => single(self, rel),
                },
            };
            meter.charge(answer.cost());
            out[i] = Some(answer);
        }
        out.into_iter().map(|a| a.unwrap_or(Err(FsError::Io("internal: unanswered".into())))).collect()
    }

    /// Syntax and grant checks of `rel`, and its parent and last component when the fast path
    /// can serve it (`None`: the root or a top-level name, served by the single-path route).
    fn split_checked<'a>(&self, rel: &'a str, access: Access) -> Result<Option<(&'a str, &'a str)>, FsError> {
        if rel.is_empty() {
            // Only `list` takes it (the root); the single route says so.
            return Ok(None);
        }
        self.admit_for(rel, access)?;
        Ok(rel.rsplit_once('/'))
    }

    fn open_parent(&self, dir: &str) -> Option<Parent> {
        let b = self.beneath.as_ref()?;
        let (fd, canonical) = b.open(dir, OFlag::O_PATH | OFlag::O_DIRECTORY).ok()?;
        Some(Parent { fd, canonical })
    }

    /// The entry's real path, checked like any resolved path.
    fn entry_checked(&self, p: &Parent, rel: &str, name: &str, access: Access) -> Result<(), FsError> {
        let canonical = format!("{}/{name}", p.canonical);
        self.check_canonical_for(rel, canonical.trim_start_matches('/'), access)
    }
}

fn open_entry(p: &Parent, name: &str, flags: OFlag) -> Option<Result<OwnedFd, FsError>> {
    match openat(&p.fd, name, flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::empty()) {
        Ok(fd) => Some(Ok(fd)),
        Err(Errno::ENOENT) => Some(Err(FsError::NotFound)),
        // A symlink (ELOOP; ENOTDIR for O_DIRECTORY on one) or anything unusual: the single route
        // resolves it properly.
        Err(_) => None,
    }
}

fn read_in(j: &Jail, p: &Parent, rel: &str, name: &str) -> Option<Result<String, FsError>> {
    let fd = match open_entry(p, name, OFlag::O_RDONLY | OFlag::O_NONBLOCK)? {
        Ok(fd) => fd,
        Err(e) => return Some(Err(e)),
    };
    Some(j.entry_checked(p, rel, name, Access::Contents).and_then(|()| read_attribute(rel, fs::File::from(fd))))
}

fn read_link_in(j: &Jail, p: &Parent, rel: &str, name: &str) -> Option<Result<String, FsError>> {
    if let Err(e) = j.entry_checked(p, rel, name, Access::Contents) {
        return Some(Err(e));
    }
    Some(match readlinkat(&p.fd, name) {
        Ok(t) => t.into_string().map_err(|_| FsError::Io("non-UTF-8 link".into())),
        Err(Errno::ENOENT) => Err(FsError::NotFound),
        Err(Errno::EINVAL) => Err(FsError::Io(format!("{rel} is not a symbolic link"))),
        Err(other) => Err(FsError::Io(format!("{rel}: {}", other.desc()))),
    })
}

fn list_in(j: &Jail, p: &Parent, rel: &str, name: &str) -> Option<Result<Vec<String>, FsError>> {
    let fd = match open_entry(p, name, OFlag::O_RDONLY | OFlag::O_DIRECTORY)? {
        Ok(fd) => fd,
        Err(e) => return Some(Err(e)),
    };
    if let Err(e) = j.entry_checked(p, rel, name, Access::Names) {
        return Some(Err(e));
    }
    let canonical = format!("{}/{name}", p.canonical).trim_start_matches('/').to_owned();
    let names = match dir_names(rel, fd) {
        Ok(n) => n,
        Err(e) => return Some(Err(e)),
    };
    Some(Ok(j.visible(rel, &canonical, names)))
}

fn stat_in(j: &Jail, p: &Parent, rel: &str, name: &str) -> Option<Result<NodeStat, FsError>> {
    let st = match fstatat(&p.fd, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(Errno::ENOENT) => return Some(Err(FsError::NotFound)),
        Err(_) => return None,
    };
    if st.st_mode & nix::libc::S_IFMT == nix::libc::S_IFLNK {
        // A link (`/dev/dri/by-path/…`): the single route resolves and checks where it leads.
        return None;
    }
    if let Err(e) = j.entry_checked(p, rel, name, Access::Contents) {
        return Some(Err(e));
    }
    let size = u64::try_from(st.st_size).unwrap_or(0);
    Some(Ok(match classify(st.st_mode, st.st_rdev, size, j.fixture_nodes) {
        Some(node) => node,
        None => from_descriptor(read_in(j, p, rel, name).and_then(Result::ok).as_deref()),
    }))
}
