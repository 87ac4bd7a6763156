//! Binding a plugin's Unix socket: a socket a previous run left behind is replaced; anything
//! else at the path (a file, a directory, a link) is refused, so a misconfigured path never
//! deletes what devplug did not create.
//!
//! The socket is bound and listening under a hidden name first and then renamed into place, so
//! its name appears only once it accepts: kubelet's plugin watcher dials a socket the moment it
//! sees it (and ignores names starting with `.`), and a dial between `bind` and `listen` is
//! refused, which would cost a registration retry.

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
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let hidden = path.with_file_name(format!(".dp{}-{n}.sock", std::process::id()));
    let _ = std::fs::remove_file(&hidden);
    let listener = UnixListener::bind(&hidden)
        .map_err(|e| std::io::Error::new(e.kind(), format!("binding {}: {e}", hidden.display())))?;
    if let Err(e) = std::fs::rename(&hidden, path) {
        let _ = std::fs::remove_file(&hidden);
        return Err(std::io::Error::new(e.kind(), format!("moving the socket to {}: {e}", path.display())));
    }
    Ok(listener)
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

    /// The socket's name appears only once it listens: a dial the moment it is seen connects.
    #[tokio::test]
    async fn the_name_appears_only_once_the_socket_listens() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("p.sock");
        let listener = bind(&sock).unwrap();
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["p.sock"], "no hidden name left behind");
        let (dialed, accepted) = tokio::join!(tokio::net::UnixStream::connect(&sock), listener.accept());
        dialed.expect("the socket accepts as soon as its name is there");
        accepted.unwrap();
    }
}
