//! Binding a plugin's Unix socket: a socket a previous run left behind is replaced; anything
//! else at the path (a file, a directory, a link) is refused, so a misconfigured path never
//! deletes what devplug did not create.
//!
//! The socket is bound at its own name, and no other name ever appears in the directory:
//! kubelet's plugin watcher `stat`s every name created in its directory *before* it looks at
//! whether the name is hidden (`pluginwatcher.handleCreateEvent`), so a hidden name bound and
//! then renamed away made kubelet log an ERROR ("stat file … failed") for every socket at every
//! start. The watcher only queues a new socket; its reconciler dials it on its next pass, long
//! after `listen` (which follows `bind` in the same call here).

use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use tokio::net::UnixListener;

/// Bind `path`, removing a stale socket there first.
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path)?,
        Ok(_) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket; refusing to replace it", path.display()),
            ));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(std::io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
    }
    UnixListener::bind(path).map_err(|e| std::io::Error::new(e.kind(), format!("binding {}: {e}", path.display())))
}

/// Remove the socket at `path` if it is one (and still there): what [`bind`] made, at the end.
pub fn unbind(path: &Path) {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            if let Err(e) = std::fs::remove_file(path)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(socket = %path.display(), error = %e, "could not remove socket");
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_stale_socket_is_replaced_and_a_file_never_is() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("p.sock");
        drop(bind(&sock).unwrap());
        assert!(sock.exists(), "a dropped listener leaves its file: stale");
        let _again = bind(&sock).expect("a stale socket is replaced");

        let file = dir.path().join("precious");
        std::fs::write(&file, b"keep").unwrap();
        let e = bind(&file).unwrap_err();
        assert!(e.to_string().contains("not a socket"), "{e}");
        unbind(&file);
        assert_eq!(std::fs::read(&file).unwrap(), b"keep", "neither bind nor unbind removes a file");

        unbind(&sock);
        assert!(!sock.exists());
    }

    /// Issue 62: kubelet's plugin watcher stats every name created in its directory, hidden or
    /// not, and logged an ERROR for the hidden name devplug bound and renamed away. Seen through
    /// the kernel's own inotify (what kubelet's fsnotify reads): binding, and binding again over
    /// a stale socket, make no name in the directory but the socket's own, and the socket
    /// accepts as soon as its name is there.
    #[tokio::test]
    async fn no_name_but_the_sockets_own_ever_appears_in_its_directory() {
        use notify::{EventKind, RecursiveMode, Watcher};
        let dir = tempfile::tempdir().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let mut watcher = notify::recommended_watcher(tx).unwrap();
        watcher.watch(dir.path(), RecursiveMode::NonRecursive).unwrap();
        let sock = dir.path().join("p.sock");
        drop(bind(&sock).unwrap());
        let listener = bind(&sock).unwrap();
        // inotify delivers in order: once the marker's event is read, every earlier one was.
        std::fs::write(dir.path().join("marker"), b"").unwrap();
        let mut named = std::collections::BTreeSet::new();
        loop {
            let event = rx.recv_timeout(std::time::Duration::from_secs(30)).expect("inotify events").unwrap();
            if matches!(event.kind, EventKind::Create(_) | EventKind::Modify(notify::event::ModifyKind::Name(_))) {
                named
                    .extend(event.paths.iter().filter_map(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned()));
            }
            if named.contains("marker") {
                break;
            }
        }
        assert_eq!(named.into_iter().collect::<Vec<_>>(), ["marker", "p.sock"], "no other name appeared");
        let (dialed, accepted) = tokio::join!(tokio::net::UnixStream::connect(&sock), listener.accept());
        dialed.expect("the socket accepts as soon as its name is there");
        accepted.unwrap();
    }
}
