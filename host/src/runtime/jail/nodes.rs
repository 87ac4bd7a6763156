//! Device nodes as the jail sees them: a node's type and numbers, read from the descriptor the
//! capability check opened, and fixture "nodes" (`c MAJOR:MINOR` files) for test trees, which
//! count only when the jail was told to take them.

use std::fs;

use nix::fcntl::OFlag;

use super::{FsError, Jail, io_error};

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
    pub fn stat_node(&self, rel: &str) -> Result<NodeStat, FsError> {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        // Stat the descriptor the check opened: no second lookup by name that a rename could
        // redirect.
        let meta = match &self.beneath {
            Some(b) => fs::File::from(self.open_admitted(b, rel, OFlag::O_PATH)?.0).metadata().map_err(io_error)?,
            None => fs::metadata(self.resolve(rel, true)?.real).map_err(io_error)?,
        };
        let ft = meta.file_type();
        let (kind, major, minor) = if ft.is_char_device() || ft.is_block_device() {
            let rdev = meta.rdev();
            let kind = if ft.is_char_device() { NodeType::Char } else { NodeType::Block };
            (kind, nix::sys::stat::major(rdev) as u32, nix::sys::stat::minor(rdev) as u32)
        } else if ft.is_dir() {
            (NodeType::Directory, 0, 0)
        } else if self.fixture_nodes && ft.is_file() && meta.len() < 64 {
            match self.read(rel).ok().as_deref().and_then(parse_node_descriptor) {
                Some(('c', ma, mi)) => (NodeType::Char, ma, mi),
                Some((_, ma, mi)) => (NodeType::Block, ma, mi),
                None => (NodeType::Other, 0, 0),
            }
        } else {
            (NodeType::Other, 0, 0)
        };
        Ok(NodeStat { kind, major, minor })
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
