//! The stand-ins' own Unix-socket plumbing (kubelet's and the pod-resources server's), so a bug
//! in devplug's (`devplug::kubelet::uds`) cannot hide itself in tests.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

/// Listen on `path` as kubelet does: whatever was there is removed first.
pub fn bind(path: &Path) -> std::io::Result<tokio::net::UnixListener> {
    let _ = std::fs::remove_file(path);
    tokio::net::UnixListener::bind(path)
}

/// Dial `path` blocking, as kubelet's `grpc.DialContext(..., WithBlock())` with authority
/// `localhost`.
pub async fn connect(path: &Path, timeout: Duration) -> Result<Channel, tonic::transport::Error> {
    let path: PathBuf = path.to_owned();
    Endpoint::from_static("http://localhost")
        .connect_timeout(timeout)
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move { tokio::net::UnixStream::connect(path).await.map(hyper_util::rt::TokioIo::new) }
        }))
        .await
}
