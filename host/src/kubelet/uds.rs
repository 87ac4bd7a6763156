//! Dialing a gRPC server over a Unix socket (kubelet's `kubelet.sock`, its pod-resources socket).
//! Binding our own sockets is [`crate::plugin_socket::bind`]'s job.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint};

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
