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

/// grpc-go's default connection backoff (`backoff.DefaultConfig`): the first retry after
/// 1 s, each next one 1.6 times longer (its ±20 % jitter left out).
const RETRY_FIRST: Duration = Duration::from_secs(1);

/// Dial `path` as kubelet's `grpc.DialContext(ctx, ..., WithBlock())` does with a `timeout`
/// context: a failed attempt is tried again on grpc-go's backoff until the context ends (kubelet
/// sets no `FailOnNonTempDialError`). Each failed attempt's error, its causes included, is
/// handed to `failed` (a stand-in records them: devplug is not to need the retry).
pub async fn connect_blocking(
    path: &Path,
    timeout: Duration,
    mut failed: impl FnMut(String),
) -> Result<Channel, String> {
    let end = tokio::time::Instant::now() + timeout;
    let mut wait = RETRY_FIRST;
    loop {
        let left = end.saturating_duration_since(tokio::time::Instant::now());
        let attempt = tokio::time::timeout(left, connect(path, left)).await;
        let why = match attempt {
            Ok(Ok(channel)) => return Ok(channel),
            Ok(Err(e)) => chain(&e),
            Err(_) => "timed out".to_owned(),
        };
        failed(why.clone());
        if tokio::time::Instant::now() + wait >= end {
            return Err(why);
        }
        tokio::time::sleep(wait).await;
        wait = wait.mul_f64(1.6);
    }
}

/// An error with its causes, as grpc-go prints a dial's (`transport error: ... : No such file`).
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(&format!(": {c}"));
        cause = c.source();
    }
    text
}

/// One attempt of a dial of `path`, with authority `localhost` as kubelet's.
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
