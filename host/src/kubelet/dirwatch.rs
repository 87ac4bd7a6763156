//! Watches kubelet's socket directories (inotify via `notify`) and broadcasts socket files
//! appearing and disappearing. Directories are watched, not files: kubelet deletes and re-creates
//! the files themselves.

use std::path::{Path, PathBuf};

use tokio::sync::broadcast;

use crate::fswatch::{FsEvent, FsWatch};

/// A file appeared in or vanished from a watched directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DirEvent {
    Created(PathBuf),
    Removed(PathBuf),
}

/// Keeps the watch alive; drop it to stop watching.
pub struct DirWatcher {
    _watch: FsWatch,
    tx: broadcast::Sender<DirEvent>,
}

impl DirWatcher {
    /// Watch `dirs` (created if missing, as kubelet would).
    pub fn new(dirs: &[&Path]) -> anyhow::Result<Self> {
        let (tx, _) = broadcast::channel(256);
        let sender = tx.clone();
        for dir in dirs {
            if !dir.exists() {
                tracing::info!(dir = %dir.display(), "creating kubelet socket directory, which does not exist yet");
                std::fs::create_dir_all(dir)?;
            }
        }
        let watch = FsWatch::new(dirs, false, move |ev| {
            let ev = match ev {
                FsEvent::Created(p) => DirEvent::Created(p),
                FsEvent::Removed(p) => DirEvent::Removed(p),
                FsEvent::Changed(_) => return,
            };
            // No subscriber (no endpoint running) is fine.
            let _ = sender.send(ev);
        })?;
        Ok(DirWatcher { _watch: watch, tx })
    }

    pub fn subscribe(&self) -> broadcast::Receiver<DirEvent> {
        self.tx.subscribe()
    }
}
