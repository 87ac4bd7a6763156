//! [`Sys`]: the backend's only window on the machine, and [`HostSys`], its implementation over the
//! host's capability-checked imports.

use crate::{FsError, Node};

/// Read-only access to `/sys` and `/dev`. Paths are relative (`bus/pci/devices`, `nvidia0`).
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

    /// True when `path` exists and can be read as an attribute or listed as a directory.
    fn exists(&self, path: &str) -> bool {
        self.read(path).is_ok() || self.list(path).is_ok() || self.read_link(path).is_ok()
    }

    /// The last path component of a symlink's target (`driver` → `nvidia`), if it is a link.
    fn link_name(&self, path: &str) -> Option<String> {
        let target = self.read_link(path).ok()?;
        target.rsplit('/').next().map(str::to_owned).filter(|s| !s.is_empty())
    }
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
}

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
}

#[cfg(not(target_arch = "wasm32"))]
fn native() -> FsError {
    FsError::Io("HostSys only works inside devplug; use FixtureSys in native tests".into())
}
