//! Watches kubelet's socket directories (inotify via `notify`) and broadcasts socket files
//! appearing and disappearing. Directories are watched, not files: kubelet deletes and re-creates
//! the files themselves.

use std::path::{Path, PathBuf};

use notify::event::{ModifyKind, RenameMode};
use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::broadcast;

/// A file appeared in or vanished from a watched directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DirEvent {
    Created(PathBuf),
    Removed(PathBuf),
}

/// Keeps the watch alive; drop it to stop watching.
pub struct DirWatcher {
    _watcher: RecommendedWatcher,
    tx: broadcast::Sender<DirEvent>,
}

impl DirWatcher {
    /// Watch `dirs` (created if missing, as kubelet would).
    pub fn new(dirs: &[&Path]) -> anyhow::Result<Self> {
        let (tx, _) = broadcast::channel(256);
        let sender = tx.clone();
        let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            let Ok(ev) = res else { return };
            let send = |e| {
                let _ = sender.send(e);
            };
            match ev.kind {
                EventKind::Create(_) | EventKind::Modify(ModifyKind::Name(RenameMode::To)) => {
                    ev.paths.into_iter().for_each(|p| send(DirEvent::Created(p)))
                }
                EventKind::Remove(_) | EventKind::Modify(ModifyKind::Name(RenameMode::From)) => {
                    ev.paths.into_iter().for_each(|p| send(DirEvent::Removed(p)))
                }
                EventKind::Modify(ModifyKind::Name(RenameMode::Both)) => {
                    let mut it = ev.paths.into_iter();
                    if let Some(from) = it.next() {
                        send(DirEvent::Removed(from));
                    }
                    if let Some(to) = it.next() {
                        send(DirEvent::Created(to));
                    }
                }
                _ => {}
            }
        })?;
        for dir in dirs {
            if !dir.exists() {
                tracing::info!(dir = %dir.display(), "creating kubelet socket directory, which does not exist yet");
                std::fs::create_dir_all(dir)?;
            }
            watcher.watch(dir, RecursiveMode::NonRecursive)?;
        }
        Ok(DirWatcher { _watcher: watcher, tx })
    }

    pub fn subscribe(&self) -> broadcast::Receiver<DirEvent> {
        self.tx.subscribe()
    }
}
