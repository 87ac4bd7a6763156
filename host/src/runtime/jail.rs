//! The [`Jail`]: one root (`/sys`, `/dev` or a fixture tree) and the [`Rule`] for it, resolving
//! every path itself so nothing outside `requested ∩ granted` is reachable.
//!
//! A path is allowed when both the path the backend named *and* the path it resolves to match a
//! requested glob and a granted glob. Resolution never escapes the root: the kernel resolves with
//! `openat2(RESOLVE_BENEATH)` from the root's descriptor (one syscall, absolute or climbing links
//! refused), and where `openat2` is missing the jail follows each symlink itself. Paths with
//! `..`, `.`, empty components, NUL or a leading `/` are refused before touching the file system.

use std::collections::VecDeque;
use std::fs;
use std::io::{ErrorKind, Read};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};

use super::caps::{Access, Rule, compile_glob};
use crate::sync::Locked;

mod batch;
mod nodes;
pub use batch::{Cost, MAX_BATCH, MAX_OPEN_DIRS, OpenDirs};
pub use nodes::{NodeStat, NodeType, parse_node_descriptor};

/// Longest path a backend may name.
const MAX_PATH: usize = 4096;
/// Symlinks followed while resolving one path, as the kernel's own limit.
const MAX_LINKS: usize = 40;
/// Lookups retried when `openat2` reports a concurrent rename (EAGAIN).
const MAX_EAGAIN_RETRIES: u32 = 64;
/// Largest attribute a backend may read.
pub(crate) const MAX_READ: u64 = 64 * 1024;

/// Failure of a capability call, mirrored into the WIT `fs-error`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FsError {
    #[error("not found")]
    NotFound,
    #[error("denied: {0}")]
    Denied(String),
    #[error("invalid path: {0}")]
    InvalidPath(String),
    #[error("i/o: {0}")]
    Io(String),
}

/// A root directory (`/sys`, `/dev` or a fixture) plus the rule for it.
#[derive(Clone, Debug)]
pub struct Jail {
    root: PathBuf,
    rule: Rule,
    /// The root opened once, for `openat2(RESOLVE_BENEATH)`: the kernel resolves every symlink
    /// in one call and refuses any that leaves the root. `None` when the root cannot be opened
    /// or the kernel (or a seccomp profile) lacks `openat2`; then the jail walks the path itself.
    beneath: Option<Arc<Beneath>>,
    /// Read `c MAJOR:MINOR` regular files as device nodes (test fixtures, where git cannot hold
    /// real nodes). Off unless the operator asks: on a real `/dev` a planted file in a
    /// world-writable directory such as `/dev/shm` would otherwise pose as any device.
    fixture_nodes: bool,
    /// Entries listings left out because the rule does not grant them, until the host reports
    /// them (`take_hidden`): a listing that silently misses an entry costs a vendor a debug
    /// cycle. Bounded: past [`MAX_HIDDEN`] the rest are only counted.
    hidden: Arc<std::sync::Mutex<(Vec<String>, usize)>>,
}

/// Hidden listing entries kept between two reports.
const MAX_HIDDEN: usize = 64;

#[derive(Debug)]
struct Beneath {
    fd: OwnedFd,
    /// The root's canonical path, to turn `/proc/self/fd/N` back into a root-relative path.
    canon: PathBuf,
}

impl Beneath {
    fn new(root: &Path) -> Option<Beneath> {
        let canon = fs::canonicalize(root).ok()?;
        let fd = fs::File::open(&canon).ok()?.into();
        let b = Beneath { fd, canon };
        // Probe once: ENOSYS/EPERM here means openat2 is unavailable (old kernel, seccomp).
        match b.open_at(".", OFlag::O_PATH) {
            Err(Errno::ENOSYS) | Err(Errno::EPERM) => None,
            _ => Some(b),
        }
    }

    fn open_at(&self, rel: &str, flags: OFlag) -> Result<OwnedFd, Errno> {
        let how = || {
            OpenHow::new()
                .flags(flags | OFlag::O_CLOEXEC)
                .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS)
        };
        // With RESOLVE_BENEATH the kernel answers EAGAIN when a rename (or mount) happened
        // anywhere on the system during the lookup, rather than vouch for the result; on a busy
        // node that is routine, and must not make an attribute look unreadable (a backend would
        // drop the device). Retried, bounded.
        let mut tries = 0;
        loop {
            match openat2(&self.fd, rel, how()) {
                Err(Errno::EAGAIN) if tries < MAX_EAGAIN_RETRIES => tries += 1,
                other => return other,
            }
        }
    }

    /// Open `rel` beneath the root and say where it really is, relative to the root.
    fn open(&self, rel: &str, flags: OFlag) -> Result<(OwnedFd, String), FsError> {
        let fd = self.open_at(rel, flags).map_err(|e| match e {
            Errno::ENOENT => FsError::NotFound,
            Errno::EXDEV => {
                FsError::Denied(format!("{rel} resolves outside the root (a symlink climbs out or is absolute)"))
            }
            Errno::ELOOP => FsError::Io(format!(
                "{rel}: too many levels of symbolic links, or a /proc magic link (such as N/root or N/fd/*), which is never followed"
            )),
            other => FsError::Io(format!("{rel}: {}", other.desc())),
        })?;
        let real = fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).map_err(io_error)?;
        let canonical = real
            .strip_prefix(&self.canon)
            .ok()
            .and_then(|p| p.to_str())
            .map(str::to_owned)
            .ok_or_else(|| FsError::Denied(format!("{rel} resolves outside the root")))?;
        Ok((fd, canonical))
    }
}

/// A path the jail accepted: where it is on disk and what it is called, relative to the root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    pub real: PathBuf,
    pub canonical: String,
}

impl Jail {
    pub fn new(root: impl Into<PathBuf>, rule: Rule) -> Self {
        let root = root.into();
        let beneath = Beneath::new(&root).map(Arc::new);
        Jail { root, rule, beneath, fixture_nodes: false, hidden: Default::default() }
    }

    /// Let `c MAJOR:MINOR` / `b MAJOR:MINOR` files stand for device nodes (fixture trees only).
    pub(crate) fn with_fixture_nodes(mut self, on: bool) -> Self {
        self.fixture_nodes = on;
        self
    }

    /// The checks of the name asked for: syntax, then requested ∩ granted.
    fn admit<'a>(&self, rel: &'a str) -> Result<Vec<&'a str>, FsError> {
        self.admit_for(rel, Access::Contents)
    }

    /// [`Jail::admit`] for `access`: a directory granted as `DIR/` is admitted for its names.
    fn admit_for<'a>(&self, rel: &'a str, access: Access) -> Result<Vec<&'a str>, FsError> {
        let comps = validate(rel)?;
        if !self.rule.admits(rel, access) {
            return Err(FsError::Denied(not_granted(&self.rule, rel, access)));
        }
        Ok(comps)
    }

    /// `rel` opened beneath the root with `flags` for `access`, after checking both the name
    /// asked for and where it really is; the descriptor and that real path.
    fn open_admitted(
        &self,
        b: &Beneath,
        rel: &str,
        flags: OFlag,
        access: Access,
    ) -> Result<(OwnedFd, String), FsError> {
        self.admit_for(rel, access)?;
        let (fd, canonical) = b.open(rel, flags)?;
        self.check_canonical_for(rel, &canonical, access)?;
        Ok((fd, canonical))
    }

    fn check_canonical(&self, rel: &str, canonical: &str) -> Result<(), FsError> {
        self.check_canonical_for(rel, canonical, Access::Contents)
    }

    fn check_canonical_for(&self, rel: &str, canonical: &str, access: Access) -> Result<(), FsError> {
        if canonical != rel && !self.rule.admits(canonical, access) {
            let slash = if access == Access::Names { "/" } else { "" };
            return Err(FsError::Denied(format!(
                "{rel} resolves to {canonical}, which is {}",
                if self.rule.requested_for(canonical, access) {
                    "not granted".to_owned()
                } else {
                    format!(
                        "not requested in the manifest (add \"{canonical}{slash}\", or a glob covering it, to [requests] {})",
                        self.rule.key()
                    )
                }
            )));
        }
        Ok(())
    }

    /// Whether `rel` (a path the rule refused) is there under the root, for the operator's
    /// account of the refusal only: the backend is told "denied" either way, so it learns
    /// nothing of what it may not see.
    pub fn present(&self, rel: &str) -> bool {
        !rel.is_empty()
            && !rel.starts_with('/')
            && !rel.split('/').any(|c| c == "..")
            && fs::symlink_metadata(self.root.join(rel)).is_ok()
    }

    /// Check and resolve `rel`. With `follow_last = false` the last component is not followed
    /// (for `read-link`).
    pub fn resolve(&self, rel: &str, follow_last: bool) -> Result<Resolved, FsError> {
        self.resolve_for(rel, follow_last, Access::Contents)
    }

    /// [`Jail::resolve`] for `access`.
    fn resolve_for(&self, rel: &str, follow_last: bool, access: Access) -> Result<Resolved, FsError> {
        let comps = self.admit_for(rel, access)?;
        let canonical = match &self.beneath {
            Some(b) if follow_last => b.open(rel, OFlag::O_PATH)?.1,
            Some(b) => match rel.rsplit_once('/') {
                Some((parent, last)) => {
                    format!("{}/{last}", b.open(parent, OFlag::O_PATH)?.1).trim_start_matches('/').to_owned()
                }
                None => rel.to_owned(),
            },
            None => self.walk(comps, follow_last)?,
        };
        self.check_canonical_for(rel, &canonical, access)?;
        Ok(Resolved { real: self.root.join(&canonical), canonical })
    }

    /// Follow symlinks component by component, never letting the OS follow one for us.
    fn walk(&self, comps: Vec<&str>, follow_last: bool) -> Result<String, FsError> {
        let mut done: Vec<String> = Vec::new();
        let mut todo: VecDeque<String> = comps.into_iter().map(str::to_owned).collect();
        let mut links = 0;
        while let Some(c) = todo.pop_front() {
            match c.as_str() {
                "" | "." => continue,
                ".." => {
                    if done.pop().is_none() {
                        return Err(FsError::Denied("a symlink climbs above the root".into()));
                    }
                    continue;
                }
                _ => {}
            }
            let here = self.root.join(done.join("/")).join(&c);
            let meta = fs::symlink_metadata(&here).map_err(io_error)?;
            if meta.file_type().is_symlink() && (follow_last || !todo.is_empty()) {
                links += 1;
                if links > MAX_LINKS {
                    return Err(FsError::Io("too many levels of symbolic links".into()));
                }
                let target = fs::read_link(&here).map_err(io_error)?;
                let target = target.to_str().ok_or_else(|| FsError::Io("non-UTF-8 link".into()))?;
                if target.starts_with('/') {
                    return Err(FsError::Denied(format!("absolute symlink to {target}")));
                }
                for t in target.split('/').rev() {
                    todo.push_front(t.to_owned());
                }
            } else {
                done.push(c);
            }
        }
        Ok(done.join("/"))
    }

    /// An attribute's text (regular files only, so a planted FIFO cannot block the host).
    pub fn read(&self, rel: &str) -> Result<String, FsError> {
        let file = match &self.beneath {
            // One open resolves and checks; O_NONBLOCK so a FIFO cannot hang the host.
            Some(b) => {
                fs::File::from(self.open_admitted(b, rel, OFlag::O_RDONLY | OFlag::O_NONBLOCK, Access::Contents)?.0)
            }
            None => {
                let r = self.resolve(rel, true)?;
                fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
                    .open(&r.real)
                    .map_err(io_error)?
            }
        };
        read_attribute(rel, file)
    }

    /// Directory entries the backend may see, sorted. Every name, where the directory is granted
    /// as `DIR/` under both the name asked for and where it resolves; otherwise an entry is shown
    /// only when both its path under the name asked for and its path under where that name
    /// resolves are allowed (a granted symlink to a directory must not list what lies beyond the
    /// grant). The entries are read from the descriptor the check opened, so nothing can be
    /// swapped in between.
    pub fn list(&self, rel: &str) -> Result<Vec<String>, FsError> {
        let (names, canonical) = match &self.beneath {
            Some(b) => {
                let (fd, canonical) = if rel.is_empty() {
                    (b.open(".", OFlag::O_RDONLY | OFlag::O_DIRECTORY)?.0, String::new())
                } else {
                    self.open_admitted(b, rel, OFlag::O_RDONLY | OFlag::O_DIRECTORY, Access::Names)?
                };
                (dir_names(rel, fd)?, canonical)
            }
            None => {
                let r = if rel.is_empty() {
                    Resolved { real: self.root.clone(), canonical: String::new() }
                } else {
                    self.resolve_for(rel, true, Access::Names)?
                };
                let names = fs::read_dir(&r.real).map_err(io_error)?;
                let names = capped_listing(rel, names.filter_map(|e| e.ok()?.file_name().into_string().ok()))?;
                (names, r.canonical)
            }
        };
        Ok(self.visible(rel, &canonical, names))
    }

    /// The entries of directory `rel` (really at `canonical`) the backend may see, sorted.
    fn visible(&self, rel: &str, canonical: &str, names: Vec<String>) -> Vec<String> {
        if self.rule.lists_all(rel) && (canonical == rel || self.rule.lists_all(canonical)) {
            let mut names = names;
            names.sort();
            return names;
        }
        let (mut names, hidden): (Vec<String>, Vec<String>) = names.into_iter().partition(|name| {
            self.rule.allows(&join(rel, name)) && (canonical == rel || self.rule.allows(&join(canonical, name)))
        });
        if !hidden.is_empty() {
            let mut h = self.hidden.locked();
            h.1 += hidden.len();
            let room = MAX_HIDDEN.saturating_sub(h.0.len());
            h.0.extend(hidden.iter().take(room).map(|name| join(rel, name)));
        }
        names.sort();
        names
    }

    /// The entries listings left out since the last call (up to [`MAX_HIDDEN`] of them), and
    /// how many there were in all.
    pub(crate) fn take_hidden(&self) -> (Vec<String>, usize) {
        std::mem::take(&mut *self.hidden.locked())
    }

    /// A symlink's stored target.
    pub fn read_link(&self, rel: &str) -> Result<String, FsError> {
        let target = match (&self.beneath, rel.rsplit_once('/')) {
            // Read the link relative to its already-open parent: no second walk from `/`.
            (Some(b), Some((parent, last))) => {
                self.admit(rel)?;
                let (dir, canonical_parent) = b.open(parent, OFlag::O_PATH | OFlag::O_DIRECTORY)?;
                self.check_canonical(rel, format!("{canonical_parent}/{last}").trim_start_matches('/'))?;
                nix::fcntl::readlinkat(&dir, last)
                    .map_err(|e| match e {
                        Errno::ENOENT => FsError::NotFound,
                        Errno::EINVAL => FsError::Io(format!("{rel} is not a symbolic link")),
                        other => FsError::Io(format!("{rel}: {}", other.desc())),
                    })?
                    .into()
            }
            _ => fs::read_link(self.resolve(rel, false)?.real).map_err(io_error)?,
        };
        target.into_os_string().into_string().map_err(|_| FsError::Io("non-UTF-8 link".into()))
    }

    /// Every allowed path under the root that matches `pattern`, sorted. The walk follows the
    /// pattern component by component (a literal component is looked up, not listed; a
    /// directory no component can match is never read), so its cost depends on the pattern,
    /// not on how big the root is; symlinked directories are not descended. `budget` bounds the
    /// directory entries looked at, whatever the pattern.
    pub fn glob(&self, pattern: &str, budget: usize) -> Result<Vec<String>, FsError> {
        let full = compile_glob(pattern).map_err(FsError::InvalidPath)?.compile_matcher();
        let comps: Vec<&str> = pattern.split('/').collect();
        let mut step = Vec::with_capacity(comps.len());
        for c in &comps {
            step.push(match *c {
                "**" => Step::Any,
                c if !c.contains(['*', '?', '[', '{']) => Step::Literal(c),
                c => Step::Match(compile_glob(c).map_err(FsError::InvalidPath)?.compile_matcher()),
            });
        }
        let mut walk = GlobWalk { jail: self, full: &full, step: &step, out: Vec::new(), seen: 0, budget };
        walk.dir("", 0)?;
        let mut out = walk.out;
        out.sort();
        out.dedup();
        Ok(out)
    }
}

/// One component of a glob, as the walk uses it.
enum Step<'a> {
    Literal(&'a str),
    Match(globset::GlobMatcher),
    /// `**`: any depth (at most [`GLOB_DEPTH`] levels).
    Any,
}

/// Levels a `**` descends.
const GLOB_DEPTH: usize = 8;

struct GlobWalk<'a> {
    jail: &'a Jail,
    full: &'a globset::GlobMatcher,
    step: &'a [Step<'a>],
    out: Vec<String>,
    seen: usize,
    budget: usize,
}

impl GlobWalk<'_> {
    fn count(&mut self) -> Result<(), FsError> {
        self.seen += 1;
        if self.seen > self.budget {
            return Err(FsError::Io(format!("the pattern looks at more than {} entries", self.budget)));
        }
        Ok(())
    }

    fn offer(&mut self, rel: String) {
        if self.full.is_match(&rel) && self.jail.rule.allows(&rel) {
            self.out.push(rel);
        }
    }

    /// Entries of `dir` (relative to the root) with whether each is a real directory.
    fn entries(&mut self, dir: &str) -> Vec<(String, bool)> {
        let Ok(rd) = fs::read_dir(self.jail.root.join(dir)) else { return Vec::new() };
        rd.flatten()
            .filter_map(|e| Some((e.file_name().into_string().ok()?, e.file_type().is_ok_and(|t| t.is_dir()))))
            .collect()
    }

    fn dir(&mut self, dir: &str, i: usize) -> Result<(), FsError> {
        let last = i + 1 == self.step.len();
        match &self.step[i] {
            Step::Literal(name) => {
                self.count()?;
                let rel = join(dir, name);
                match fs::symlink_metadata(self.jail.root.join(&rel)) {
                    Ok(_) if last => self.offer(rel),
                    Ok(m) if m.is_dir() => self.dir(&rel, i + 1)?,
                    _ => {}
                }
            }
            Step::Match(m) => {
                for (name, is_dir) in self.entries(dir) {
                    self.count()?;
                    if !m.is_match(&name) {
                        continue;
                    }
                    let rel = join(dir, &name);
                    if last {
                        self.offer(rel);
                    } else if is_dir {
                        self.dir(&rel, i + 1)?;
                    }
                }
            }
            Step::Any => self.below(dir, 0)?,
        }
        Ok(())
    }

    /// Everything under `dir`, each checked against the whole pattern.
    fn below(&mut self, dir: &str, depth: usize) -> Result<(), FsError> {
        for (name, is_dir) in self.entries(dir) {
            self.count()?;
            let rel = join(dir, &name);
            if is_dir && depth + 1 < GLOB_DEPTH {
                self.below(&rel, depth + 1)?;
            }
            self.offer(rel);
        }
        Ok(())
    }
}

/// The entry names of an opened directory (not `.` and `..`), unsorted. Read through an owning
/// iterator: the borrowing one rewinds the directory when dropped, a wasted `lseek`.
fn dir_names(rel: &str, fd: OwnedFd) -> Result<Vec<String>, FsError> {
    let dir = nix::dir::Dir::from_fd(fd).map_err(|e| FsError::Io(format!("{rel}: {}", e.desc())))?;
    capped_listing(
        rel,
        dir.into_iter()
            .filter_map(|e| e.ok()?.file_name().to_str().ok().map(str::to_owned))
            .filter(|n| n != "." && n != ".."),
    )
}

/// Entries one listing may have: a directory larger than this is refused rather than copied
/// (sysfs's largest, `bus/pci/devices` of a big machine, has a few thousand).
pub(crate) const MAX_LIST_ENTRIES: usize = 65_536;

/// The names of a listing, refused past [`MAX_LIST_ENTRIES`] before the host holds them all.
fn capped_listing(rel: &str, names: impl Iterator<Item = String>) -> Result<Vec<String>, FsError> {
    let mut out = Vec::new();
    for name in names {
        if out.len() == MAX_LIST_ENTRIES {
            return Err(FsError::Io(format!(
                "{rel} has more than {MAX_LIST_ENTRIES} entries; list a narrower directory"
            )));
        }
        out.push(name);
    }
    Ok(out)
}

/// An opened attribute's text: regular files only (a planted FIFO must not block the host), at
/// most [`MAX_READ`] bytes, one trailing newline removed.
fn read_attribute(rel: &str, file: fs::File) -> Result<String, FsError> {
    if !file.metadata().map_err(io_error)?.is_file() {
        return Err(FsError::Io(format!("{rel} is not a regular file")));
    }
    let mut buf = Vec::new();
    file.take(MAX_READ + 1).read_to_end(&mut buf).map_err(io_error)?;
    if buf.len() as u64 > MAX_READ {
        return Err(FsError::Io(format!("{rel} is larger than {MAX_READ} bytes")));
    }
    let mut text = String::from_utf8_lossy(&buf).into_owned();
    if text.ends_with('\n') {
        text.pop();
    }
    Ok(text)
}

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() { name.to_owned() } else { format!("{dir}/{name}") }
}

fn not_granted(rule: &Rule, rel: &str, access: Access) -> String {
    if rule.requested_for(rel, access) {
        format!("{rel} is not granted to this backend")
    } else if access == Access::Names {
        format!(
            "{rel} is not requested in the backend's manifest (add \"{rel}/\" to [requests] {} to list its names, \
             or a glob covering the entries it needs)",
            rule.key()
        )
    } else {
        format!(
            "{rel} is not requested in the backend's manifest (add {rel:?}, or a glob covering it, to [requests] {})",
            rule.key()
        )
    }
}

/// Syntax checks that need no file system.
fn validate(rel: &str) -> Result<Vec<&str>, FsError> {
    let bad = |why: &str| Err(FsError::InvalidPath(format!("{rel:?}: {why}")));
    if rel.is_empty() {
        return bad("empty path");
    }
    if rel.len() > MAX_PATH {
        return bad("too long");
    }
    if rel.contains('\0') {
        return bad("contains NUL");
    }
    if rel.starts_with('/') {
        return bad("absolute paths are not allowed; paths are relative to the root");
    }
    let comps: Vec<&str> = rel.split('/').collect();
    if comps.iter().any(|c| *c == ".." || *c == "." || c.is_empty()) {
        return bad("'.', '..' and empty components are not allowed");
    }
    Ok(comps)
}

fn io_error(e: std::io::Error) -> FsError {
    match e.kind() {
        ErrorKind::NotFound => FsError::NotFound,
        _ => FsError::Io(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::Manifest;
    use crate::runtime::limits::Meter;
    use std::os::unix::fs::symlink;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    /// A small sysfs with the kernel's layout: bus/pci/devices/X -> ../../../devices/pci0000:00/X.
    fn sysfs() -> (tempfile::TempDir, Jail) {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        let dev = r.join("devices/pci0000:00/0000:00:01.0");
        fs::create_dir_all(&dev).unwrap();
        fs::write(dev.join("vendor"), "0x10de\n").unwrap();
        fs::write(dev.join("secret"), "s3cret\n").unwrap();
        fs::create_dir_all(r.join("bus/pci/devices")).unwrap();
        fs::create_dir_all(r.join("bus/pci/drivers/nvidia")).unwrap();
        symlink("../../../devices/pci0000:00/0000:00:01.0", r.join("bus/pci/devices/0000:00:01.0")).unwrap();
        symlink("../../../bus/pci/drivers/nvidia", dev.join("driver")).unwrap();
        symlink("/etc", dev.join("abs")).unwrap();
        symlink("../../../../..", dev.join("up")).unwrap();
        let rule = Rule::new(
            &strings(&[
                "bus/pci/devices",
                "bus/pci/devices/*",
                "bus/pci/devices/*/{vendor,driver,abs,up}",
                "devices/**/vendor",
                "devices/**/driver",
            ]),
            &strings(&["**"]),
        )
        .unwrap();
        let jail = Jail::new(r, rule);
        (d, jail)
    }

    #[test]
    fn reads_through_the_kernels_symlinks_and_checks_the_resolved_path() {
        let (_d, j) = sysfs();
        assert_eq!(j.read("bus/pci/devices/0000:00:01.0/vendor").unwrap(), "0x10de");
        let r = j.resolve("bus/pci/devices/0000:00:01.0/vendor", true).unwrap();
        assert_eq!(r.canonical, "devices/pci0000:00/0000:00:01.0/vendor");
        assert_eq!(j.read_link("bus/pci/devices/0000:00:01.0/driver").unwrap(), "../../../bus/pci/drivers/nvidia");
        assert_eq!(j.list("bus/pci/devices").unwrap(), ["0000:00:01.0"]);
    }

    /// Issue 52 (1): `DIR/` grants a directory's names and nothing inside: a driver directory
    /// lists its devices and its write-only control files, and none of them opens.
    #[test]
    fn a_names_grant_lists_every_name_and_opens_nothing() {
        let (d, _) = sysfs();
        let r = d.path();
        fs::write(r.join("bus/pci/drivers/nvidia/bind"), "").unwrap();
        symlink("../../../../devices/pci0000:00/0000:00:01.0", r.join("bus/pci/drivers/nvidia/0000:00:01.0")).unwrap();
        let jail = |req: &[&str], grant: &[&str]| Jail::new(r, Rule::new(&strings(req), &strings(grant)).unwrap());
        fn denied<T>(x: Result<T, FsError>) -> bool {
            matches!(x, Err(FsError::Denied(_)))
        }
        let drv = "bus/pci/drivers/nvidia";
        let j = jail(&["bus/pci/drivers/nvidia/"], &["**"]);
        assert_eq!(j.list(drv).unwrap(), ["0000:00:01.0", "bind"]);
        let many = j.list_many(&strings(&[drv]), &mut OpenDirs::default(), &mut Meter::default());
        assert_eq!(many[0].as_deref().unwrap(), ["0000:00:01.0", "bind"], "batched the same");
        assert!(denied(j.read("bus/pci/drivers/nvidia/bind")));
        assert!(denied(j.resolve("bus/pci/drivers/nvidia/0000:00:01.0", true)));
        assert!(denied(j.read_link("bus/pci/drivers/nvidia/0000:00:01.0")));
        assert!(denied(j.list("bus/pci/drivers/nvidia/0000:00:01.0")), "a directory below is not granted");
        assert!(denied(j.read(drv)) && denied(j.resolve(drv, true)), "names only, not the path itself");
        // The operator's grant decides too: whole paths grant names, `DIR/` grants names only.
        assert!(denied(jail(&["bus/pci/drivers/nvidia/"], &["bus/pci/devices/**"]).list(drv)));
        let names_only = jail(&["bus/pci/drivers/nvidia/", "bus/pci/drivers/nvidia/*"], &["bus/pci/drivers/*/"]);
        assert_eq!(names_only.list(drv).unwrap().len(), 2);
        assert!(denied(names_only.read("bus/pci/drivers/nvidia/bind")));
        // Without `DIR/`, a listing shows only the entries granted whole, as before.
        let whole = jail(&[drv, "bus/pci/drivers/nvidia/0000:*"], &["**"]);
        assert_eq!(whole.list(drv).unwrap(), ["0000:00:01.0"]);
        // A refusal says what to add.
        let e = jail(&["bus/pci/devices/*"], &["**"]).list(drv).unwrap_err().to_string();
        assert!(e.contains("\"bus/pci/drivers/nvidia/\""), "{e}");
        // A name granted as `DIR/` that resolves elsewhere lists nothing beyond the grant.
        let link = jail(&["bus/pci/devices/*/", "bus/pci/devices/*"], &["**"]);
        assert!(denied(link.list("bus/pci/devices/0000:00:01.0")));
        let both = jail(&["bus/pci/devices/*/", "devices/pci0000:00/*/"], &["**"]);
        assert!(both.list("bus/pci/devices/0000:00:01.0").unwrap().contains(&"secret".to_owned()));
        assert!(denied(both.read("bus/pci/devices/0000:00:01.0/secret")));
    }

    #[test]
    fn refuses_every_way_out() {
        let (_d, j) = sysfs();
        let cases = [
            "../etc/passwd",
            "/etc/passwd",
            "bus/pci/devices/../../../etc/passwd",
            "bus/pci/devices/0000:00:01.0/abs/passwd",
            "bus/pci/devices/0000:00:01.0/abs",
            "bus/pci/devices/0000:00:01.0/up",
            "bus/pci/devices/0000:00:01.0/secret",
            "bus/pci/devices/./0000:00:01.0/vendor",
            "bus//pci",
            "bus/pci/devices/0000:00:01.0/vendor\0x",
        ];
        for p in cases {
            let err = j.read(p).unwrap_err();
            assert!(matches!(err, FsError::Denied(_) | FsError::InvalidPath(_)), "{p}: {err:?}");
        }
    }

    #[test]
    fn a_grant_narrows_a_request() {
        let (d, _) = sysfs();
        let rule =
            Rule::new(&strings(&["bus/pci/devices/*/vendor", "devices/**/vendor"]), &strings(&["bus/**"])).unwrap();
        let j = Jail::new(d.path(), rule);
        // The named path is granted, but it resolves under devices/, which is not.
        match j.read("bus/pci/devices/0000:00:01.0/vendor").unwrap_err() {
            FsError::Denied(why) => assert!(why.contains("not granted"), "{why}"),
            e => panic!("{e:?}"),
        }
    }

    #[test]
    fn listing_hides_ungranted_entries_and_glob_respects_grants() {
        let (d, _) = sysfs();
        fs::write(d.path().join("kvm"), "c 10:232").unwrap();
        fs::write(d.path().join("sda"), "b 8:0").unwrap();
        let j = Jail::new(d.path(), Rule::new(&strings(&["*"]), &strings(&["kvm", "bus"])).unwrap());
        assert_eq!(j.list("").unwrap(), ["bus", "kvm"]);
        assert_eq!(j.glob("*", 1000).unwrap(), ["bus", "kvm"]);
        assert!(matches!(j.glob("../*", 1000), Err(FsError::InvalidPath(_))));
    }

    #[test]
    fn node_descriptors() {
        assert_eq!(parse_node_descriptor("c 195:0\n"), Some(('c', 195, 0)));
        assert_eq!(parse_node_descriptor("b 8:1"), Some(('b', 8, 1)));
        assert_eq!(parse_node_descriptor("hello"), None);
    }

    #[test]
    fn listing_a_granted_symlink_shows_only_entries_granted_where_it_leads() {
        let (d, _) = sysfs();
        // `bus/pci/devices/X` is granted with everything under it; where it leads is granted only
        // for `vendor`, so `secret` must not be listed through the link.
        let rule = Rule::new(
            &strings(&["bus/pci/devices/*", "bus/pci/devices/*/*", "devices/pci0000:00/*", "devices/**/vendor"]),
            &strings(&["**"]),
        )
        .unwrap();
        let j = Jail::new(d.path(), rule);
        assert_eq!(j.list("bus/pci/devices/0000:00:01.0").unwrap(), ["vendor"]);
    }

    #[test]
    fn fixture_nodes_only_count_when_switched_on() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("mem"), "c 1:1\n").unwrap();
        let all = strings(&["**"]);
        let off = Jail::new(d.path(), Rule::new(&all, &all).unwrap());
        assert_eq!(off.stat_node("mem").unwrap().kind, NodeType::Other, "a planted file is no device");
        let on = Jail::new(d.path(), Rule::new(&all, &all).unwrap()).with_fixture_nodes(true);
        assert_eq!(on.stat_node("mem").unwrap(), NodeStat { kind: NodeType::Char, major: 1, minor: 1 });
    }

    #[test]
    fn hostile_globs_are_errors_not_panics() {
        let d = tempfile::tempdir().unwrap();
        let all = strings(&["**"]);
        let j = Jail::new(d.path(), Rule::new(&all, &all).unwrap());
        for p in ["*".repeat(100_000), "a".repeat(16 << 20), "{".repeat(300), "[".to_owned(), "x\0y".to_owned()] {
            assert!(matches!(j.glob(&p, 1000), Err(FsError::InvalidPath(_))), "{}", crate::gate::clip(&p));
        }
        assert!(Manifest::parse(&format!("[requests]\ndev = [\"{}\"]\n", "*".repeat(100))).is_err());
    }

    #[test]
    fn a_glob_costs_what_its_pattern_needs_not_what_the_root_holds() {
        let d = tempfile::tempdir().unwrap();
        for i in 0..25_000 {
            fs::write(d.path().join(format!("tty{i}")), "").unwrap();
        }
        fs::create_dir_all(d.path().join("dri")).unwrap();
        for n in ["renderD128", "renderD129", "card0"] {
            fs::write(d.path().join("dri").join(n), "c 226:128").unwrap();
        }
        let all = strings(&["**"]);
        let j = Jail::new(d.path(), Rule::new(&all, &all).unwrap());
        // A literal first component is looked up, not listed: a budget of 10 entries is plenty.
        assert_eq!(j.glob("dri/renderD*", 10).unwrap(), ["dri/renderD128", "dri/renderD129"]);
        // A wildcard over the big directory reads it once, within an ordinary budget.
        assert_eq!(j.glob("tty2499[0-9]", 100_000).unwrap().len(), 10);
        assert!(j.glob("**", 1000).is_err(), "the budget bounds a walk of everything");
    }

    /// Renames elsewhere under the root (as a CDI writer or podman does all the time) make the
    /// kernel answer EAGAIN to `openat2(RESOLVE_BENEATH)` now and then; reads must not fail.
    #[test]
    fn reads_survive_concurrent_renames() {
        let (d, j) = sysfs();
        let churn = d.path().join("churn");
        fs::create_dir_all(&churn).unwrap();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let renamer = {
            let (churn, stop) = (churn.clone(), stop.clone());
            std::thread::spawn(move || {
                fs::write(churn.join("a"), "x").unwrap();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _ = fs::rename(churn.join("a"), churn.join("b"));
                    let _ = fs::rename(churn.join("b"), churn.join("a"));
                }
            })
        };
        let failed = (0..20_000).filter(|_| j.read("bus/pci/devices/0000:00:01.0/vendor").is_err()).count();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        renamer.join().unwrap();
        assert_eq!(failed, 0, "reads failed while renames happened elsewhere");
    }

    /// A batch answers exactly what one call per path would, whatever it is asked: attributes,
    /// links, subdirectories, FIFOs, refused and malformed paths, in any order.
    #[test]
    fn batched_calls_answer_what_single_calls_answer() {
        let (d, _) = sysfs();
        let dev = d.path().join("devices/pci0000:00/0000:00:01.0");
        fs::create_dir_all(dev.join("net/eth0")).unwrap();
        fs::write(dev.join("net/eth0/carrier"), "1\n").unwrap();
        symlink("vendor", dev.join("alias")).unwrap();
        nix::unistd::mkfifo(&dev.join("fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        fs::write(dev.join("big"), vec![b'x'; MAX_READ as usize + 1]).unwrap();
        let rule = Rule::new(&strings(&["bus/**", "devices/**"]), &strings(&["**"])).unwrap();
        let j = Jail::new(d.path(), rule);
        let dev = "bus/pci/devices/0000:00:01.0";
        let paths: Vec<String> = [
            "vendor",
            "secret",
            "driver",
            "abs",
            "up",
            "alias",
            "fifo",
            "big",
            "net",
            "net/eth0",
            "net/eth0/carrier",
            "missing",
            "../x",
            "",
        ]
        .iter()
        .map(|p| if p.is_empty() { String::new() } else { format!("{dev}/{p}") })
        .chain(["bus/pci/devices".into(), "/etc/passwd".into(), "devices/pci0000:00/0000:00:01.0/vendor".into()])
        .collect();
        let mut shuffled = paths.clone();
        shuffled.reverse();
        // Fresh directories for each batch, and one set kept across all of them (as in a call).
        let mut kept = OpenDirs::default();
        for paths in [&paths, &shuffled] {
            for dirs in [&mut OpenDirs::default(), &mut kept] {
                let single: Vec<_> = paths.iter().map(|p| j.read(p)).collect();
                assert_eq!(j.read_many(paths, dirs, &mut Meter::default()), single);
                let single: Vec<_> = paths.iter().map(|p| j.read_link(p)).collect();
                assert_eq!(j.read_link_many(paths, dirs, &mut Meter::default()), single);
                let single: Vec<_> = paths.iter().map(|p| j.list(p)).collect();
                assert_eq!(j.list_many(paths, dirs, &mut Meter::default()), single);
            }
        }
        assert!(!kept.is_empty(), "the batches opened their parents in the kept set");
        // And the answers are the real ones, not equal failures.
        let got = j.read_many(&paths[..2], &mut OpenDirs::default(), &mut Meter::default());
        assert_eq!(got, [Ok("0x10de".to_owned()), Ok("s3cret".to_owned())]);
        assert!(
            matches!(
                &j.read_many(&paths[3..4], &mut OpenDirs::default(), &mut Meter::default())[0],
                Err(FsError::Denied(_))
            ),
            "abs leaves the root"
        );
    }

    #[test]
    fn a_call_resolves_each_directory_once_and_the_next_call_afresh() {
        let (d, j) = sysfs();
        let vendor = vec!["bus/pci/devices/0000:00:01.0/vendor".to_owned()];
        let mut dirs = OpenDirs::default();
        assert_eq!(j.read_many(&vendor, &mut dirs, &mut Meter::default()), [Ok("0x10de".to_owned())]);
        // The device leaves and another takes its address (hot-unplug, hot-plug).
        let other = d.path().join("devices/pci0000:00/0000:00:02.0");
        fs::create_dir_all(&other).unwrap();
        fs::write(other.join("vendor"), "0x1002\n").unwrap();
        fs::remove_file(d.path().join("bus/pci/devices/0000:00:01.0")).unwrap();
        symlink("../../../devices/pci0000:00/0000:00:02.0", d.path().join("bus/pci/devices/0000:00:01.0")).unwrap();
        // Within the call: the directory it resolved first, as a read racing the swap would see.
        assert_eq!(j.read_many(&vendor, &mut dirs, &mut Meter::default()), [Ok("0x10de".to_owned())]);
        // The directory it holds is removed: gone, not an error of another kind.
        fs::remove_dir_all(d.path().join("devices/pci0000:00/0000:00:01.0")).unwrap();
        assert_eq!(j.read_many(&vendor, &mut dirs, &mut Meter::default()), [Err(FsError::NotFound)]);
        // The next call sees the new device.
        dirs.clear();
        assert_eq!(j.read_many(&vendor, &mut dirs, &mut Meter::default()), [Ok("0x1002".to_owned())]);
    }

    #[test]
    fn a_call_holds_at_most_max_open_dirs_directories() {
        let d = tempfile::tempdir().unwrap();
        let n = MAX_OPEN_DIRS + 10;
        for i in 0..n {
            fs::create_dir_all(d.path().join(format!("d{i}"))).unwrap();
            fs::write(d.path().join(format!("d{i}/a")), format!("{i}")).unwrap();
        }
        let j = Jail::new(d.path(), Rule::new(&strings(&["**"]), &strings(&["**"])).unwrap());
        let paths: Vec<String> = (0..n).map(|i| format!("d{i}/a")).collect();
        let mut dirs = OpenDirs::default();
        let got = j.read_many(&paths, &mut dirs, &mut Meter::default());
        assert!(got.iter().enumerate().all(|(i, r)| r.as_deref() == Ok(i.to_string().as_str())));
        assert!(!dirs.is_empty() && dirs.len() <= MAX_OPEN_DIRS, "{} directories held", dirs.len());
    }

    #[test]
    fn batched_node_stats_answer_what_single_stats_answer() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        fs::create_dir_all(r.join("infiniband")).unwrap();
        fs::write(r.join("infiniband/uverbs0"), "c 231:192").unwrap();
        fs::write(r.join("infiniband/rdma_cm"), "c 10:58\n").unwrap();
        fs::write(r.join("infiniband/junk"), "hello").unwrap();
        fs::create_dir_all(r.join("dri/by-path")).unwrap();
        fs::write(r.join("dri/card0"), "b 226:0").unwrap();
        symlink("../card0", r.join("dri/by-path/pci-0000:01:00.0-card")).unwrap();
        symlink("/etc/passwd", r.join("dri/evil")).unwrap();
        fs::create_dir_all(r.join("secret")).unwrap();
        fs::write(r.join("secret/key"), "c 1:1").unwrap();
        symlink("../secret/key", r.join("dri/sideways")).unwrap();
        let paths: Vec<String> = [
            "infiniband/uverbs0",
            "infiniband/rdma_cm",
            "infiniband/junk",
            "infiniband",
            "dri/by-path/pci-0000:01:00.0-card",
            "dri/evil",
            "dri/sideways",
            "missing/x",
            "../x",
            "secret/x",
        ]
        .map(String::from)
        .to_vec();
        for fixture in [true, false] {
            let rule = Rule::new(&strings(&["**"]), &strings(&["infiniband", "infiniband/*", "dri/**"])).unwrap();
            let j = Jail::new(r, rule).with_fixture_nodes(fixture);
            let single: Vec<_> = paths.iter().map(|p| j.stat_node(p)).collect();
            assert_eq!(j.stat_nodes(&paths, &mut OpenDirs::default(), &mut Meter::default()), single);
            if fixture {
                assert_eq!(single[0], Ok(NodeStat { kind: NodeType::Char, major: 231, minor: 192 }));
                assert_eq!(single[4], Ok(NodeStat { kind: NodeType::Block, major: 226, minor: 0 }));
                assert!(matches!(single[6], Err(FsError::Denied(_))), "{:?}", single[6]);
            }
        }
        // A real node, from its metadata.
        let j = Jail::new("/dev", Rule::new(&strings(&["null"]), &strings(&["null"])).unwrap());
        assert_eq!(
            j.stat_nodes(&["null".to_owned()], &mut OpenDirs::default(), &mut Meter::default()),
            [Ok(NodeStat { kind: NodeType::Char, major: 1, minor: 3 })]
        );
    }

    #[test]
    fn attributes_are_read_whole_up_to_the_limit_and_refused_past_it() {
        let d = tempfile::tempdir().unwrap();
        let max = MAX_READ as usize;
        for (name, len) in [("empty", 0), ("page", 4096), ("page1", 4097), ("max", max), ("over", max + 1)] {
            fs::write(d.path().join(name), "x".repeat(len)).unwrap();
        }
        fs::write(d.path().join("nl"), "0x10de\n").unwrap();
        let j = Jail::new(d.path(), Rule::new(&strings(&["*"]), &strings(&["*"])).unwrap());
        for (name, len) in [("empty", 0), ("page", 4096), ("page1", 4097), ("max", max)] {
            assert_eq!(j.read(name).map(|t| t.len()), Ok(len), "{name}");
        }
        assert!(matches!(j.read("over"), Err(FsError::Io(m)) if m.contains("larger than")));
        assert_eq!(j.read("nl").unwrap(), "0x10de");
    }
}
