//! Device nodes as the jail sees them: a node's type and numbers, read from the descriptor the
//! capability check opened, and fixture "nodes" (`c MAJOR:MINOR` files) for test trees, which
//! count only when the jail was told to take them.

use std::fs;

use nix::fcntl::OFlag;

use super::{FsError, Jail, io_error};
use crate::runtime::caps::Access;

/// What a path under the dev root is, as a container runtime needs to know it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeType {
    Char,
    Block,
    Directory,
    Other,
}

/// A device node's type and numbers (0/0 for anything but a char or block node).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeStat {
    pub kind: NodeType,
    pub major: u32,
    pub minor: u32,
}

impl Jail {
    /// Type and device numbers of `rel`, following links inside the root. Real nodes are read
    /// from their metadata; with fixture nodes on, a `c MAJOR:MINOR` file counts as a node.
    pub(crate) fn stat_node(&self, rel: &str) -> Result<NodeStat, FsError> {
        use std::os::unix::fs::MetadataExt;
        // Stat the descriptor the check opened: no second lookup by name that a rename could
        // redirect.
        let meta = match &self.beneath {
            Some(b) => fs::File::from(self.open_admitted(b, rel, OFlag::O_PATH, Access::Contents)?.0)
                .metadata()
                .map_err(io_error)?,
            None => fs::metadata(self.resolve(rel, true)?.real).map_err(io_error)?,
        };
        match classify(meta.mode(), meta.rdev(), meta.len(), self.fixture_nodes) {
            Some(st) => Ok(st),
            None => Ok(from_descriptor(self.read(rel).ok().as_deref())),
        }
    }
}

/// A node's type and numbers from its `stat` fields; `None` for a small regular file that may be
/// a fixture descriptor (with fixture nodes on), which the caller reads and hands to
/// [`from_descriptor`].
pub(super) fn classify(mode: u32, rdev: u64, size: u64, fixture_nodes: bool) -> Option<NodeStat> {
    use nix::libc::{S_IFBLK, S_IFCHR, S_IFDIR, S_IFMT, S_IFREG};
    let numbers =
        |kind| NodeStat { kind, major: nix::sys::stat::major(rdev) as u32, minor: nix::sys::stat::minor(rdev) as u32 };
    let none = |kind| NodeStat { kind, major: 0, minor: 0 };
    Some(match mode & S_IFMT {
        S_IFCHR => numbers(NodeType::Char),
        S_IFBLK => numbers(NodeType::Block),
        S_IFDIR => none(NodeType::Directory),
        S_IFREG if fixture_nodes && size < 64 => return None,
        _ => none(NodeType::Other),
    })
}

/// A fixture descriptor's node (`c MAJOR:MINOR`), or `Other` when the text is not one.
pub(super) fn from_descriptor(text: Option<&str>) -> NodeStat {
    match text.and_then(parse_node_descriptor) {
        Some(('c', major, minor)) => NodeStat { kind: NodeType::Char, major, minor },
        Some((_, major, minor)) => NodeStat { kind: NodeType::Block, major, minor },
        None => NodeStat { kind: NodeType::Other, major: 0, minor: 0 },
    }
}

/// Reading a fixture "device node": a regular file holding `c MAJOR:MINOR` or `b MAJOR:MINOR`,
/// because git cannot store real nodes. Real nodes are read from their metadata instead.
pub fn parse_node_descriptor(text: &str) -> Option<(char, u32, u32)> {
    let (kind, rest) = text.trim().split_once(' ')?;
    let kind = match kind {
        "c" => 'c',
        "b" => 'b',
        _ => return None,
    };
    let (major, minor) = rest.split_once(':')?;
    Some((kind, major.parse().ok()?, minor.parse().ok()?))
}
