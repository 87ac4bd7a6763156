//! Serving a tonic router on a plugin socket, every connection through the
//! [`authority`](super::authority) front, until a cancel token fires.

use std::path::Path;

use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::service::Routes;

use super::authority::KubeletStream;

/// Bind `path` (see [`super::bind`]) and serve `routes` there until `stop`; `what` names the
/// server in the log line of an abnormal end.
pub fn serve(
    path: &Path,
    routes: Routes,
    stop: CancellationToken,
    what: &'static str,
) -> std::io::Result<JoinHandle<()>> {
    let incoming = UnixListenerStream::new(super::bind(path)?).map(|s| s.map(KubeletStream::new));
    let shown = path.display().to_string();
    Ok(tokio::spawn(async move {
        let server = tonic::transport::Server::builder().add_routes(routes);
        if let Err(e) = server.serve_with_incoming_shutdown(incoming, stop.cancelled_owned()).await {
            tracing::warn!(socket = %shown, error = %e, "{what} stopped with an error");
        }
    }))
}
