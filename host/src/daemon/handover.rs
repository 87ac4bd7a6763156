//! One devplug serves a node at a time: the instance lock, and standing by for it.
//!
//! A DaemonSet rolling update with `maxSurge` starts the new devplug pod while the old one still
//! serves. Two would fight over the same sockets (each replacing the other's), the same claim
//! checkpoint and the same CDI spec files. So every `devplug run` takes an exclusive `flock` on
//! the instance lock (`<plugins dir>/devplug/instance.lock`, on the host) before it loads a
//! backend, writes a spec or serves a socket. A second one stands by: its probes answer
//! (`/readyz` says ready, "standby", so the DaemonSet controller goes on and deletes the old
//! pod), and the moment the old one has stopped — sockets removed, the pool left in place —
//! and exited (the kernel drops its lock), it takes over. The lock is the process's: a
//! crashed devplug never leaves it held.

use std::fs::File;
use std::path::Path;
use std::time::Duration;

use nix::fcntl::{Flock, FlockArg};

/// How often a standing-by devplug tries the lock again.
const RETRY: Duration = Duration::from_millis(100);

/// The held lock; dropping it (or exiting) hands the node over. `None` inside when the lock
/// file could not be had at all (a read-only or unmounted dir, logged): devplug serves anyway,
/// as it did before there was a lock.
pub struct InstanceLock {
    _held: Option<Flock<File>>,
}

/// Try to take the lock at `path` once: `Ok(None)` when another process holds it.
pub fn try_acquire(path: &Path) -> anyhow::Result<Option<InstanceLock>> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| anyhow::anyhow!("instance lock dir {}: {e}", dir.display()))?;
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| anyhow::anyhow!("instance lock {}: {e}", path.display()))?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(held) => {
            // Who holds it, for a person looking at the node (the lock itself is the flock).
            use std::io::{Seek, Write};
            let mut f: &File = &held;
            let _ = f.set_len(0).and_then(|_| f.rewind()).and_then(|_| writeln!(f, "{}", std::process::id()));
            Ok(Some(InstanceLock { _held: Some(held) }))
        }
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
        Err((_, e)) => Err(anyhow::anyhow!("instance lock {}: flock: {e}", path.display())),
    }
}

/// Take the lock at `path`, standing by (with one log line) while another devplug holds it;
/// `on_standby` is told when standing by starts and ends. `None` when `cancelled` came first.
pub async fn acquire(
    path: &Path,
    cancelled: impl std::future::Future<Output = ()>,
    on_standby: impl Fn(bool),
) -> anyhow::Result<Option<InstanceLock>> {
    tokio::pin!(cancelled);
    let mut said = false;
    loop {
        let attempt = match try_acquire(path) {
            Ok(a) => a,
            Err(e) if !said => {
                tracing::warn!(
                    "{e:#}: serving without the instance lock, so a second devplug on this node (a rolling update with maxSurge) would not wait for this one; mount the plugins dir (deploy/ does) or set instance_lock"
                );
                return Ok(Some(InstanceLock { _held: None }));
            }
            Err(e) => return Err(e),
        };
        if let Some(lock) = attempt {
            if said {
                on_standby(false);
                tracing::info!(lock = %path.display(), "the other devplug on this node has exited; taking over");
            }
            return Ok(Some(lock));
        }
        if !said {
            said = true;
            on_standby(true);
            let holder = std::fs::read_to_string(path).unwrap_or_default();
            tracing::info!(lock = %path.display(), holder_pid = %holder.trim(),
                "another devplug serves this node; standing by until it exits (a rolling update)");
        }
        tokio::select! {
            _ = &mut cancelled => return Ok(None),
            _ = tokio::time::sleep(RETRY) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_second_instance_stands_by_until_the_first_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("devplug/instance.lock");
        let first = try_acquire(&path).unwrap().expect("a free lock is taken");
        assert_eq!(std::fs::read_to_string(&path).unwrap().trim(), std::process::id().to_string());
        assert!(try_acquire(&path).unwrap().is_none(), "held: a second open of the file cannot take it");
        let standby = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = standby.clone();
        let waiting = tokio::spawn({
            let path = path.clone();
            async move { acquire(&path, std::future::pending(), move |s| seen.lock().unwrap().push(s)).await }
        });
        while standby.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        assert!(!waiting.is_finished());
        drop(first);
        let second = waiting.await.unwrap().unwrap().expect("taken once the first is gone");
        assert_eq!(*standby.lock().unwrap(), [true, false]);
        drop(second);
        // Cancelled while standing by: no lock.
        let _held = try_acquire(&path).unwrap().unwrap();
        assert!(acquire(&path, async {}, |_| {}).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn a_lock_that_cannot_be_had_at_all_does_not_keep_devplug_from_serving() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("not-a-dir");
        std::fs::write(&file, b"").unwrap();
        let lock = acquire(&file.join("instance.lock"), std::future::pending(), |_| panic!("no standby")).await;
        assert!(lock.unwrap().expect("served without the lock")._held.is_none());
    }
}
