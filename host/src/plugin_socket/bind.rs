//! Binding a plugin's Unix socket: a socket a previous run left behind is replaced; anything
//! else at the path (a file, a directory, a link) is refused, so a misconfigured path never
//! deletes what devplug did not create.

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
}
