//! [`FixtureSys`]: a [`Sys`] over sysfs- and dev-shaped directories, for native unit tests of
//! backend logic. It follows the same conventions as the host: a regular file under the dev root
//! whose content is `c MAJOR:MINOR` (or `b ...`) stands for a device node, since git cannot store
//! real ones. It does no capability checks: those are the host's job and are tested there.

use std::fs;
use std::path::{Path, PathBuf};

use crate::{FsError, Node, NodeKind, Sys};

/// Sysfs at `sys_root`, `/dev` at `dev_root`, `/proc` at `proc_root`.
pub struct FixtureSys {
    sys_root: PathBuf,
    dev_root: PathBuf,
    proc_root: PathBuf,
}

impl FixtureSys {
    /// A fixture machine laid out as `<dir>/sys`, `<dir>/dev` and `<dir>/proc`.
    pub fn machine(dir: impl AsRef<Path>) -> Self {
        let dir = dir.as_ref();
        Self { sys_root: dir.join("sys"), dev_root: dir.join("dev"), proc_root: dir.join("proc") }
    }

    /// One of the fixture machines committed in the devplug repository
    /// (`tests/fixtures/sysfs/<name>`: `dgx-h100`, `cx6dx-sriov`, …), for backends built in it.
    pub fn repo_machine(name: &str) -> Self {
        Self::machine(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/sysfs").join(name))
    }

    /// Sysfs and `/dev` at these roots, and no `/proc`.
    pub fn new(sys_root: impl Into<PathBuf>, dev_root: impl Into<PathBuf>) -> Self {
        Self { sys_root: sys_root.into(), dev_root: dev_root.into(), proc_root: PathBuf::from("/nonexistent") }
    }

    fn node(&self, rel: &str) -> Result<Node, FsError> {
        let path = self.dev_root.join(rel);
        let meta = fs::metadata(&path).map_err(io)?;
        let (kind, major, minor) = if meta.is_dir() {
            (NodeKind::Directory, 0, 0)
        } else {
            let text = fs::read_to_string(&path).unwrap_or_default();
            parse_descriptor(&text).unwrap_or((NodeKind::Other, 0, 0))
        };
        Ok(Node { path: rel.to_owned(), kind, major, minor })
    }
}

/// `c 195:0` → (char, 195, 0).
pub fn parse_descriptor(text: &str) -> Option<(NodeKind, u32, u32)> {
    let (kind, rest) = text.trim().split_once(' ')?;
    let kind = match kind {
        "c" => NodeKind::Character,
        "b" => NodeKind::Block,
        _ => return None,
    };
    let (major, minor) = rest.split_once(':')?;
    Some((kind, major.parse().ok()?, minor.parse().ok()?))
}

fn io(e: std::io::Error) -> FsError {
    match e.kind() {
        std::io::ErrorKind::NotFound => FsError::NotFound,
        _ => FsError::Io(e.to_string()),
    }
}

fn read_text(path: &Path) -> Result<String, FsError> {
    let mut s = fs::read_to_string(path).map_err(io)?;
    if s.ends_with('\n') {
        s.pop();
    }
    Ok(s)
}

fn list_names(path: &Path) -> Result<Vec<String>, FsError> {
    let mut names: Vec<String> = fs::read_dir(path)
        .map_err(io)?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    names.sort();
    Ok(names)
}

impl Sys for FixtureSys {
    fn read(&self, path: &str) -> Result<String, FsError> {
        read_text(&self.sys_root.join(path))
    }

    fn list(&self, path: &str) -> Result<Vec<String>, FsError> {
        list_names(&self.sys_root.join(path))
    }

    fn proc_read(&self, path: &str) -> Result<String, FsError> {
        read_text(&self.proc_root.join(path))
    }

    fn proc_list(&self, path: &str) -> Result<Vec<String>, FsError> {
        list_names(&self.proc_root.join(path))
    }

    fn read_link(&self, path: &str) -> Result<String, FsError> {
        let target = fs::read_link(self.sys_root.join(path)).map_err(io)?;
        Ok(target.to_string_lossy().into_owned())
    }

    fn canonical(&self, path: &str) -> Result<String, FsError> {
        let root = fs::canonicalize(&self.sys_root).map_err(io)?;
        let full = fs::canonicalize(self.sys_root.join(path)).map_err(io)?;
        full.strip_prefix(&root).map(|p| p.to_string_lossy().into_owned()).map_err(|_| FsError::Denied(path.to_owned()))
    }

    fn dev_stat(&self, path: &str) -> Result<Node, FsError> {
        self.node(path)
    }

    fn dev_glob(&self, pattern: &str) -> Result<Vec<Node>, FsError> {
        let matcher = globset::GlobBuilder::new(pattern)
            .literal_separator(true)
            .build()
            .map_err(|e| FsError::InvalidPath(e.to_string()))?
            .compile_matcher();
        let mut out = Vec::new();
        let mut stack = vec![String::new()];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = fs::read_dir(self.dev_root.join(&dir)) else { continue };
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let rel = if dir.is_empty() { name } else { format!("{dir}/{name}") };
                if matcher.is_match(&rel) {
                    out.push(self.node(&rel)?);
                }
                if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    stack.push(rel);
                }
            }
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }
}
