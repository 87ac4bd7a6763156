//! gRPC over Unix sockets: binding a listener (replacing a stale socket) and dialing a channel.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tonic::transport::{Channel, Endpoint};

/// Bind `path`, removing a socket a previous run left behind. Refuses to remove anything that is
/// not a socket, so a misconfigured path never deletes a file.
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path)?,
        Ok(_) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket; refusing to replace it", path.display()),
            ));
        }
        Err(_) => {}
    }
    UnixListener::bind(path)
}

/// A channel to the gRPC server on `path`. Connects eagerly, within `timeout`.
pub async fn connect(path: &Path, timeout: Duration) -> Result<Channel, tonic::transport::Error> {
    let path: PathBuf = path.to_owned();
    // The URI is ignored by the connector; kubelet itself dials with authority "localhost".
    Endpoint::from_static("http://localhost")
        .connect_timeout(timeout)
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move { UnixStream::connect(path).await.map(TokioIo::new) }
        }))
        .await
}
