//! Watching the backends directory for new, changed and removed backends (inotify via `notify`).
//!
//! Files arrive in many ways: written in place, written then renamed, `cp` over, deleted then
//! created, or a Kubernetes ConfigMap/Secret/projected volume swapping its `..data` symlink to a
//! new timestamped directory. The directory is watched recursively (a file written through a
//! symlink into a ConfigMap's timestamped subdirectory changes only there), and any event means
//! "look again": the rescan compares content, so a spurious event costs a directory read. A burst of events (a `cp` is a
//! create plus many writes) is settled first: the rescan waits until the directory has been
//! quiet for [`QUIET`], but never longer than [`MAX_WAIT`] after the first event.

use std::path::Path;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::fswatch::FsWatch;

/// Quiet time that ends a burst of events.
pub(crate) const QUIET: Duration = Duration::from_millis(20);
/// Longest wait after the first event of a burst.
pub(crate) const MAX_WAIT: Duration = Duration::from_millis(500);

/// Debounced "the backends directory changed" ticks.
pub struct DirTicks {
    rx: mpsc::UnboundedReceiver<()>,
    /// When the burst being settled began; kept across calls so `changed` is cancel-safe (the
    /// run loop drops it whenever a poll comes first, and a seen event must not be lost).
    burst: Option<tokio::time::Instant>,
    _watch: FsWatch,
}

impl DirTicks {
    pub fn new(dir: &Path) -> anyhow::Result<Self> {
        let (tx, rx) = mpsc::unbounded_channel();
        // Every kind of change means "look again" (reads are not reported).
        let watch = FsWatch::new(&[dir], true, move |_| {
            let _ = tx.send(());
        })
        .map_err(|e| anyhow::anyhow!("cannot watch backends dir {}: {e}", dir.display()))?;
        Ok(DirTicks { rx, burst: None, _watch: watch })
    }

    /// Resolves once a burst of changes has settled. Pending forever if the watcher died.
    /// Cancel-safe: dropping it mid-burst and calling again resumes the same burst.
    pub async fn changed(&mut self) {
        let started = match self.burst {
            Some(t) => t,
            None => {
                if self.rx.recv().await.is_none() {
                    return std::future::pending().await;
                }
                *self.burst.insert(tokio::time::Instant::now())
            }
        };
        let deadline = started + MAX_WAIT;
        loop {
            let quiet_until = (tokio::time::Instant::now() + QUIET).min(deadline);
            match tokio::time::timeout_at(quiet_until, self.rx.recv()).await {
                Ok(Some(())) if tokio::time::Instant::now() < deadline => continue,
                _ => break,
            }
        }
        self.burst = None;
    }
}
