//! The host's one file-system watcher (inotify through `notify`): events on watched directories,
//! reduced to what the host acts on. The backends directory (hot swap, `backends::watch`) and
//! kubelet's socket directories (`kubelet::dirwatch`) both build on it.

use std::path::{Path, PathBuf};

use notify::event::{ModifyKind, RenameMode};
use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher};

/// What happened to a path in a watched directory. Reads are not reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FsEvent {
    /// Created, or renamed to this path.
    Created(PathBuf),
    /// Removed, or renamed away from this path.
    Removed(PathBuf),
    /// Written, or its metadata changed.
    Changed(PathBuf),
}

/// Keeps a watch alive; drop it to stop watching.
pub struct FsWatch {
    _watcher: RecommendedWatcher,
}

impl FsWatch {
    /// Watch `dirs` (and, with `recursive`, everything below them), calling `on` for every event
    /// on the watcher's own thread.
    pub fn new(dirs: &[&Path], recursive: bool, on: impl Fn(FsEvent) + Send + 'static) -> notify::Result<FsWatch> {
        let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            if let Ok(ev) = res {
                events(ev).into_iter().for_each(&on);
            }
        })?;
        let mode = if recursive { RecursiveMode::Recursive } else { RecursiveMode::NonRecursive };
        for dir in dirs {
            watcher.watch(dir, mode)?;
        }
        Ok(FsWatch { _watcher: watcher })
    }
}

fn events(ev: notify::Event) -> Vec<FsEvent> {
    match ev.kind {
        EventKind::Access(_) => Vec::new(),
        EventKind::Create(_) | EventKind::Modify(ModifyKind::Name(RenameMode::To)) => {
            ev.paths.into_iter().map(FsEvent::Created).collect()
        }
        EventKind::Remove(_) | EventKind::Modify(ModifyKind::Name(RenameMode::From)) => {
            ev.paths.into_iter().map(FsEvent::Removed).collect()
        }
        EventKind::Modify(ModifyKind::Name(RenameMode::Both)) => {
            let mut it = ev.paths.into_iter();
            let from = it.next().map(FsEvent::Removed);
            let to = it.next().map(FsEvent::Created);
            from.into_iter().chain(to).collect()
        }
        _ => ev.paths.into_iter().map(FsEvent::Changed).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use notify::event::{AccessKind, CreateKind, DataChange};

    fn ev(kind: EventKind, paths: &[&str]) -> notify::Event {
        let mut e = notify::Event::new(kind);
        e.paths = paths.iter().map(PathBuf::from).collect();
        e
    }

    #[test]
    fn renames_are_a_removal_and_a_creation_and_reads_are_nothing() {
        let both = ev(EventKind::Modify(ModifyKind::Name(RenameMode::Both)), &["/d/a", "/d/b"]);
        assert_eq!(events(both), [FsEvent::Removed("/d/a".into()), FsEvent::Created("/d/b".into())]);
        assert_eq!(events(ev(EventKind::Create(CreateKind::File), &["/d/s"])), [FsEvent::Created("/d/s".into())]);
        let write = ev(EventKind::Modify(ModifyKind::Data(DataChange::Content)), &["/d/f"]);
        assert_eq!(events(write), [FsEvent::Changed("/d/f".into())]);
        assert!(events(ev(EventKind::Access(AccessKind::Read), &["/d/f"])).is_empty());
    }
}
