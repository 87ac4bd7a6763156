//! [`Sys`]: the backend's only window on the machine, and [`HostSys`], its implementation over the
//! host's capability-checked imports.
//!
//! The `*_many` calls answer many paths in one host call (WIT 0.2.0): with hundreds of devices,
//! reading each device's attributes in one batch instead of one call each is what keeps a first
//! `discover` in single-digit milliseconds.

use crate::{FsError, Node};

/// Read-only access to `/sys`, `/dev` and `/proc`. Paths are relative (`bus/pci/devices`,
/// `nvidia0`, `driver/nvidia/gpus`).
pub trait Sys {
    /// An attribute's text, one trailing newline removed.
    fn read(&self, path: &str) -> Result<String, FsError>;
    /// A directory's entry names, sorted.
    fn list(&self, path: &str) -> Result<Vec<String>, FsError>;
    /// A symlink's target, as stored.
    fn read_link(&self, path: &str) -> Result<String, FsError>;
    /// Where `path` resolves to, relative to `/sys`.
    fn canonical(&self, path: &str) -> Result<String, FsError>;
    /// Facts about one device node under `/dev`.
    fn dev_stat(&self, path: &str) -> Result<Node, FsError>;
    /// Device nodes under `/dev` matching a glob, sorted.
    fn dev_glob(&self, pattern: &str) -> Result<Vec<Node>, FsError>;
    /// A file's text under `/proc` (only what the manifest's `[requests] procfs` covers).
    fn proc_read(&self, path: &str) -> Result<String, FsError>;
    /// A directory's entry names under `/proc`, sorted.
    fn proc_list(&self, path: &str) -> Result<Vec<String>, FsError>;

    /// [`Sys::read`] of every path, answers in order, in one host call.
    fn read_many(&self, paths: &[String]) -> Vec<Result<String, FsError>> {
        paths.iter().map(|p| self.read(p)).collect()
    }
    /// [`Sys::read_link`] of every path, answers in order, in one host call.
    fn read_link_many(&self, paths: &[String]) -> Vec<Result<String, FsError>> {
        paths.iter().map(|p| self.read_link(p)).collect()
    }
    /// [`Sys::list`] of every path, answers in order, in one host call.
    fn list_many(&self, paths: &[String]) -> Vec<Result<Vec<String>, FsError>> {
        paths.iter().map(|p| self.list(p)).collect()
    }

    /// True when `path` exists and can be read as an attribute or listed as a directory.
    fn exists(&self, path: &str) -> bool {
        self.read(path).is_ok() || self.list(path).is_ok() || self.read_link(path).is_ok()
    }

    /// The last path component of a symlink's target (`driver` → `nvidia`), if it is a link.
    fn link_name(&self, path: &str) -> Option<String> {
        last_component(&self.read_link(path).ok()?)
    }
}

/// The last component of a symlink's target (`../../../bus/pci/drivers/nvidia` → `nvidia`), the
/// form [`Sys::link_name`] gives, for targets read in a batch.
pub fn last_component(target: &str) -> Option<String> {
    target.rsplit('/').next().map(str::to_owned).filter(|s| !s.is_empty())
}

/// One batched call over the paths `path_of` gives for `items` (an item without one gets `None`
/// and costs nothing), the answers back in item order:
/// `each(&devs, |d| Some(d.attr("numa_node")), |p| sys.read_many(p))`.
pub fn each<I, R>(
    items: &[I],
    path_of: impl Fn(&I) -> Option<String>,
    call: impl FnOnce(&[String]) -> Vec<Result<R, FsError>>,
) -> Vec<Option<Result<R, FsError>>> {
    let paths: Vec<Option<String>> = items.iter().map(path_of).collect();
    let asked: Vec<String> = paths.iter().flatten().cloned().collect();
    let mut answers = call(&asked).into_iter();
    paths.iter().map(|p| p.as_ref().and_then(|_| answers.next())).collect()
}

/// The host's `sysfs` and `devfs` imports. Only usable inside devplug (wasm32).
pub struct HostSys;

#[cfg(target_arch = "wasm32")]
impl Sys for HostSys {
    fn read(&self, path: &str) -> Result<String, FsError> {
        crate::bindings::devplug::backend::sysfs::read(path)
    }
    fn list(&self, path: &str) -> Result<Vec<String>, FsError> {
        crate::bindings::devplug::backend::sysfs::list_dir(path)
    }
    fn read_link(&self, path: &str) -> Result<String, FsError> {
        crate::bindings::devplug::backend::sysfs::read_link(path)
    }
    fn canonical(&self, path: &str) -> Result<String, FsError> {
        crate::bindings::devplug::backend::sysfs::canonical(path)
    }
    fn dev_stat(&self, path: &str) -> Result<Node, FsError> {
        crate::bindings::devplug::backend::devfs::stat(path)
    }
    fn dev_glob(&self, pattern: &str) -> Result<Vec<Node>, FsError> {
        crate::bindings::devplug::backend::devfs::glob(pattern)
    }
    fn proc_read(&self, path: &str) -> Result<String, FsError> {
        crate::bindings::devplug::backend::procfs::read(path)
    }
    fn proc_list(&self, path: &str) -> Result<Vec<String>, FsError> {
        crate::bindings::devplug::backend::procfs::list_dir(path)
    }
    // The host takes at most 4,096 paths per call; longer lists go in chunks.
    fn read_many(&self, paths: &[String]) -> Vec<Result<String, FsError>> {
        paths.chunks(BATCH).flat_map(crate::bindings::devplug::backend::sysfs::read_many).collect()
    }
    fn read_link_many(&self, paths: &[String]) -> Vec<Result<String, FsError>> {
        paths.chunks(BATCH).flat_map(crate::bindings::devplug::backend::sysfs::read_link_many).collect()
    }
    fn list_many(&self, paths: &[String]) -> Vec<Result<Vec<String>, FsError>> {
        paths.chunks(BATCH).flat_map(crate::bindings::devplug::backend::sysfs::list_dir_many).collect()
    }
}

/// Paths per batched host call (the host's limit).
#[cfg(target_arch = "wasm32")]
const BATCH: usize = 4096;

#[cfg(not(target_arch = "wasm32"))]
impl Sys for HostSys {
    fn read(&self, _: &str) -> Result<String, FsError> {
        Err(native())
    }
    fn list(&self, _: &str) -> Result<Vec<String>, FsError> {
        Err(native())
    }
    fn read_link(&self, _: &str) -> Result<String, FsError> {
        Err(native())
    }
    fn canonical(&self, _: &str) -> Result<String, FsError> {
        Err(native())
    }
    fn dev_stat(&self, _: &str) -> Result<Node, FsError> {
        Err(native())
    }
    fn dev_glob(&self, _: &str) -> Result<Vec<Node>, FsError> {
        Err(native())
    }
    fn proc_read(&self, _: &str) -> Result<String, FsError> {
        Err(native())
    }
    fn proc_list(&self, _: &str) -> Result<Vec<String>, FsError> {
        Err(native())
    }
}

#[cfg(not(target_arch = "wasm32"))]
fn native() -> FsError {
    FsError::Io("HostSys only works inside devplug; use FixtureSys in native tests".into())
}
