//! One devplug serves a node at a time: the instance lock, and standing by for it.
//!
//! A DaemonSet rolling update with `maxSurge` starts the new devplug pod while the old one still
//! serves. Two would fight over the same sockets (each replacing the other's), the same claim
//! checkpoint and the same CDI spec files. So every `devplug run` takes an exclusive `flock` on
//! the instance lock (`<plugins dir>/devplug/instance.lock`, on the host) before it loads a
//! backend, writes a spec or serves a socket. What needs nothing exclusive comes first: a
//! second one pulls its registries' versions and compiles every backend, then stands by: its
//! probes answer (`/readyz` says ready, "standby", so the DaemonSet controller goes on and
//! deletes the old pod), and the moment the old one has stopped — sockets removed, the pool
//! left in place — and exited (the kernel drops its lock), it takes over (it looks every
//! [`RETRY`]), with loads from memory. The lock is the process's: a crashed devplug never
//! leaves it held.

use std::fs::File;
use std::path::Path;
use std::time::Duration;

use nix::fcntl::{Flock, FlockArg};

/// How often a standing-by devplug tries the lock again: kubelet holds the node's devices
/// unhealthy from the old devplug's exit until the new one registers, so this is most of a
/// rolling update's gap (a try is a few system calls).
const RETRY: Duration = Duration::from_millis(20);

/// The held lock; dropping it (or exiting) hands the node over. `None` inside when the lock
/// file could not be had at all (a read-only or unmounted dir, logged): devplug serves anyway,
/// as it did before there was a lock.
pub struct InstanceLock {
    _held: Option<Flock<File>>,
}

/// Try to take the lock at `path` once: `Ok(None)` when another process holds it. The lock is
/// a `0600` file in a `0700` directory of devplug's user, opened without following links, so
/// no other local user can open it, let alone hold it (a `0644` lock let anyone keep a
/// restarted devplug in standby for ever).
pub(crate) fn try_acquire(path: &Path) -> anyhow::Result<Option<InstanceLock>> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        anyhow::bail!("instance lock {}: not a file path", path.display());
    };
    let dir = crate::durable::StateDir::open(dir).map_err(|e| anyhow::anyhow!("instance lock dir: {e}"))?;
    let file = dir.open_rw(name).map_err(|e| anyhow::anyhow!("instance lock: {e}"))?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(held) => {
            // Who holds it, for a person looking at the node (the lock itself is the flock).
            use std::io::{Seek, Write};
            let mut f: &File = &held;
            let _ = f.set_len(0).and_then(|_| f.rewind()).and_then(|_| writeln!(f, "{}", whoami()));
            Ok(Some(InstanceLock { _held: Some(held) }))
        }
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
        Err((_, e)) => Err(anyhow::anyhow!("instance lock {}: flock: {e}", path.display())),
    }
}

/// How this process names itself in the lock file, for the standby's log: its pod
/// (`POD_NAMESPACE`/`POD_NAME`, which the chart and manifests set from the downward API) when
/// it runs in one — a PID alone is its own PID namespace's, `1` in every pod — and its PID.
fn whoami() -> String {
    named(|k| std::env::var(k).ok())
}

/// [`whoami`] with the environment read through `var`; the pod's words pass the text gate.
fn named(var: impl Fn(&str) -> Option<String>) -> String {
    let pid = std::process::id();
    let var = |k: &str| var(k).filter(|v| !v.is_empty()).map(|v| crate::gate::clip_to(&v, 64).into_owned());
    match (var("POD_NAMESPACE"), var("POD_NAME")) {
        (Some(ns), Some(name)) => format!("pod {ns}/{name}, pid {pid} in its PID namespace"),
        (None, Some(name)) => format!("pod {name}, pid {pid} in its PID namespace"),
        _ => format!("pid {pid}"),
    }
}

/// Who holds the lock at `path`, as it wrote itself there (read without following links).
fn holder(path: &Path) -> String {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        return String::new();
    };
    let text = crate::durable::StateDir::open(dir).and_then(|d| d.read(name)).ok().flatten().unwrap_or_default();
    crate::gate::clip_to(String::from_utf8_lossy(&text).trim(), 160).into_owned()
}

/// Take the lock at `path`, standing by (with one log line) while another devplug holds it;
/// `on_standby` is told when standing by starts and ends, and that the wait is overdue once it
/// has lasted `patience` (then one ERROR names the holder: a standby that never takes over is
/// not ready). `None` when `cancelled` came first.
pub(crate) async fn acquire(
    path: &Path,
    patience: Duration,
    cancelled: impl std::future::Future<Output = ()>,
    on_standby: impl Fn(Standby),
) -> anyhow::Result<Option<InstanceLock>> {
    tokio::pin!(cancelled);
    let mut since: Option<tokio::time::Instant> = None;
    let mut overdue = false;
    loop {
        let attempt = match try_acquire(path) {
            Ok(a) => a,
            Err(e) if since.is_none() => {
                tracing::warn!(
                    "{e:#}: serving without the instance lock, so a second devplug on this node (a rolling update with maxSurge) would not wait for this one; mount the plugins dir (deploy/ does) or set instance_lock"
                );
                return Ok(Some(InstanceLock { _held: None }));
            }
            Err(e) => return Err(e),
        };
        if let Some(lock) = attempt {
            if since.is_some() {
                on_standby(Standby::No);
                tracing::info!(lock = %path.display(), "the other devplug on this node has exited; taking over");
            }
            return Ok(Some(lock));
        }
        match since {
            None => {
                since = Some(tokio::time::Instant::now());
                on_standby(Standby::Waiting);
                tracing::info!(lock = %path.display(), holder = %holder(path),
                    "another devplug serves this node; standing by until it exits (a rolling update)");
            }
            Some(t) if !overdue && t.elapsed() >= patience => {
                overdue = true;
                on_standby(Standby::Overdue);
                tracing::error!(lock = %path.display(), holder = %holder(path), waited = ?patience,
                    "still standing by: the devplug holding the instance lock has not exited; this one is not ready. Stop the process named (or the old pod) so this one can serve");
            }
            Some(_) => {}
        }
        tokio::select! {
            _ = &mut cancelled => return Ok(None),
            _ = tokio::time::sleep(RETRY) => {}
        }
    }
}

pub use crate::observe::Standby;

/// The longest a stopping devplug waits for a successor to finish preparing: below the chart's
/// 30 s `terminationGracePeriodSeconds`, so kubelet never has to kill it, and a successor whose
/// compile hangs costs at most this (the old one then hands over anyway).
pub(crate) const SUCCESSOR_PATIENCE: Duration = Duration::from_secs(20);

/// The preparing lock's path: `preparing.lock` beside the instance lock.
pub(crate) fn preparing_path(instance_lock: &Path) -> std::path::PathBuf {
    instance_lock.with_file_name("preparing.lock")
}

/// Held by a starting devplug from its first step until it stands by (or serves): a
/// devplug told to stop waits for it before it lets go of the node. The DaemonSet controller
/// deletes the old pod once the new one is ready, and on the host network that readiness can
/// be the old pod's own answer (both listen on the one port), so without this the old one
/// could stop while the new one still compiles: kubelet then holds the node's devices
/// unhealthy for the whole compile and rejects pods scheduled meanwhile. `None` inside when
/// another devplug is preparing too, or the lock could not be had (this one then just starts).
pub struct Preparing {
    _held: Option<InstanceLock>,
}

/// Take the preparing lock at `path`, if no one else holds it.
pub fn preparing(path: &Path) -> Preparing {
    Preparing { _held: try_acquire(path).ok().flatten() }
}

/// Wait, at most `patience`, until no devplug holds the preparing lock at `path` (a successor
/// has finished preparing, or there is none); says once that it waits, and if it gave up.
pub(crate) async fn await_successor(path: &Path, patience: Duration) {
    let start = tokio::time::Instant::now();
    let mut said = false;
    loop {
        match try_acquire(path) {
            // Free (dropped at once), or not to be had at all: nothing to wait for.
            Ok(Some(_)) | Err(_) => {
                if said {
                    tracing::info!(
                        waited_ms = start.elapsed().as_millis() as u64,
                        "the next devplug has prepared; handing over"
                    );
                }
                return;
            }
            Ok(None) => {}
        }
        if !said {
            said = true;
            tracing::info!(lock = %path.display(), holder = %holder(path),
                "the next devplug on this node is still preparing; serving on until it stands by");
        }
        if start.elapsed() >= patience {
            tracing::warn!(lock = %path.display(), holder = %holder(path), waited = ?patience,
                "the next devplug has not finished preparing; handing over anyway (kubelet holds this node's devices unhealthy until it serves)");
            return;
        }
        tokio::time::sleep(RETRY).await;
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
        assert_eq!(std::fs::read_to_string(&path).unwrap().trim(), whoami());
        assert!(try_acquire(&path).unwrap().is_none(), "held: a second open of the file cannot take it");
        let standby = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = standby.clone();
        let waiting = tokio::spawn({
            let path = path.clone();
            async move {
                acquire(&path, Duration::from_secs(600), std::future::pending(), move |s| seen.lock().unwrap().push(s))
                    .await
            }
        });
        while standby.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        assert!(!waiting.is_finished());
        drop(first);
        let second = waiting.await.unwrap().unwrap().expect("taken once the first is gone");
        assert_eq!(*standby.lock().unwrap(), [Standby::Waiting, Standby::No]);
        drop(second);
        // Cancelled while standing by: no lock.
        let _held = try_acquire(&path).unwrap().unwrap();
        assert!(acquire(&path, Duration::from_secs(600), async {}, |_| {}).await.unwrap().is_none());
    }

    /// Issue 62, found on a real cluster: the old devplug stopped while the new one still
    /// compiled (its readiness answered by the old pod on the shared port), and kubelet held
    /// the node's devices unhealthy for 3.6 s. A stopping devplug now waits for a preparing
    /// one, and no longer than its patience.
    #[tokio::test(start_paused = true)]
    async fn a_stopping_instance_waits_for_a_preparing_successor_within_its_patience() {
        let dir = tempfile::tempdir().unwrap();
        let path = preparing_path(&dir.path().join("devplug/instance.lock"));
        assert_eq!(path, dir.path().join("devplug/preparing.lock"));
        // No successor: no wait at all.
        let t = tokio::time::Instant::now();
        await_successor(&path, SUCCESSOR_PATIENCE).await;
        assert_eq!(t.elapsed(), Duration::ZERO);
        // A successor preparing: the wait ends the moment it is done.
        let successor = preparing(&path);
        assert!(successor._held.is_some());
        assert!(preparing(&path)._held.is_none(), "one preparer at a time");
        let waiting = tokio::spawn({
            let path = path.clone();
            async move { await_successor(&path, SUCCESSOR_PATIENCE).await }
        });
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(!waiting.is_finished(), "serves on while the successor prepares");
        drop(successor);
        tokio::time::sleep(RETRY * 2).await;
        assert!(waiting.is_finished(), "hands over once the successor has prepared");
        // A successor that never finishes costs the patience, not more.
        let _stuck = preparing(&path);
        let t = tokio::time::Instant::now();
        await_successor(&path, SUCCESSOR_PATIENCE).await;
        assert!(t.elapsed() >= SUCCESSOR_PATIENCE && t.elapsed() < SUCCESSOR_PATIENCE + RETRY * 2);
    }

    /// Issue 62: the standby said `holder_pid=1`, the old pod's PID in its own namespace.
    #[test]
    fn the_holder_is_named_by_its_pod() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
        };
        let pid = std::process::id();
        assert_eq!(
            named(env(&[("POD_NAMESPACE", "devplug"), ("POD_NAME", "devplug-x7k2p")])),
            format!("pod devplug/devplug-x7k2p, pid {pid} in its PID namespace")
        );
        assert_eq!(named(env(&[])), format!("pid {pid}"));
        assert!(!named(env(&[("POD_NAME", "a\nb\u{1b}[2J")])).contains('\u{1b}'), "escaped");
    }

    /// Issue 41: the lock was `0644` and followed links, so any local user could hold it (a
    /// restarted devplug stood by for ever, `/readyz` 200) or point it at a file to truncate.
    /// Now it is `0600` in a `0700` dir, a link there is refused, and a standby past its
    /// patience says so and is not ready.
    #[tokio::test(start_paused = true)]
    async fn only_devplugs_user_can_hold_the_lock_and_an_endless_standby_is_not_ready() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("devplug/instance.lock");
        let held = try_acquire(&path).unwrap().unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!((mode(&path), mode(path.parent().unwrap())), (0o600, 0o700));
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let s2 = seen.clone();
        let waiting = tokio::spawn({
            let path = path.clone();
            async move {
                acquire(&path, Duration::from_secs(30), std::future::pending(), move |s| s2.lock().unwrap().push(s))
                    .await
            }
        });
        tokio::time::sleep(Duration::from_secs(31)).await;
        assert_eq!(*seen.lock().unwrap(), [Standby::Waiting, Standby::Overdue]);
        waiting.abort();
        drop(held);
        // A link planted at the lock path: refused, its target untouched.
        let target = dir.path().join("precious");
        std::fs::write(&target, b"keep me").unwrap();
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(&target, &path).unwrap();
        let Err(e) = try_acquire(&path) else { panic!("a lock through a link was taken") };
        let e = e.to_string();
        assert!(e.contains("remove it"), "{e}");
        assert_eq!(std::fs::read(&target).unwrap(), b"keep me");
    }

    #[tokio::test]
    async fn a_lock_that_cannot_be_had_at_all_does_not_keep_devplug_from_serving() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("not-a-dir");
        std::fs::write(&file, b"").unwrap();
        let lock = acquire(&file.join("instance.lock"), Duration::from_secs(600), std::future::pending(), |_| {
            panic!("no standby")
        })
        .await;
        assert!(lock.unwrap().expect("served without the lock")._held.is_none());
    }
}
