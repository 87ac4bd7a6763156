//! A minimal HTTP/1 client for devplug's own listener (`devplug status`).

use crate::observe::status::{DevicesPage, ResourceDevices};

/// Bytes of one answer the CLI reads: a `/status` document or one device page (at most
/// 2,000 devices) is far below it; whatever answers on the address, however much it sends, is
/// read no further.
pub const MAX_ANSWER_BYTES: usize = 64 << 20;

/// How long one answer may take, connection included: a listener that stops mid-answer does
/// not hang `devplug status`.
pub const ANSWER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// GET `path` from devplug at `addr` (a Unix socket path, or a host:port); (status code, body),
/// the body at most [`MAX_ANSWER_BYTES`], the whole within [`ANSWER_TIMEOUT`].
pub async fn http_get(addr: &str, path: &str) -> anyhow::Result<(u16, String)> {
    tokio::time::timeout(ANSWER_TIMEOUT, get(addr, path))
        .await
        .map_err(|_| anyhow::anyhow!("devplug at {addr} did not answer {path} within {}s", ANSWER_TIMEOUT.as_secs()))?
}

async fn get(addr: &str, path: &str) -> anyhow::Result<(u16, String)> {
    use http_body_util::BodyExt;
    let connect = std::time::Duration::from_secs(5);
    let unix = addr.starts_with('/') || addr.starts_with('.');
    let io: Box<dyn Io> = if unix {
        let stream = tokio::time::timeout(connect, tokio::net::UnixStream::connect(addr))
            .await
            .map_err(|_| anyhow::anyhow!("{addr}: connect timed out"))?
            .map_err(|e| {
                anyhow::anyhow!("cannot reach devplug at {addr} (its status socket; run as devplug's user): {e}")
            })?;
        Box::new(stream)
    } else {
        let stream = tokio::time::timeout(connect, tokio::net::TcpStream::connect(addr))
            .await
            .map_err(|_| anyhow::anyhow!("{addr}: connect timed out"))?
            .map_err(|e| anyhow::anyhow!("cannot reach devplug at {addr} (a loopback --metrics-addr): {e}"))?;
        Box::new(stream)
    };
    let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(io)).await?;
    tokio::spawn(conn);
    let host = if unix { "localhost" } else { addr };
    let req = hyper::Request::get(path)
        .header(hyper::header::HOST, host)
        .body(http_body_util::Empty::<bytes::Bytes>::new())?;
    let resp = sender.send_request(req).await?;
    let code = resp.status().as_u16();
    let body = http_body_util::Limited::new(resp.into_body(), MAX_ANSWER_BYTES).collect().await.map_err(|e| {
        anyhow::anyhow!(
            "devplug at {addr}: its answer to {path} was refused: {e} (more than {MAX_ANSWER_BYTES} bytes?)"
        )
    })?;
    let body = body.to_bytes();
    Ok((code, String::from_utf8_lossy(&body).into_owned()))
}

/// A stream either kind of address gives.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> Io for T {}

/// GET `path` and parse its JSON; a non-200 answer is an error saying what devplug said.
pub async fn http_json(addr: &str, path: &str) -> anyhow::Result<serde_json::Value> {
    let (code, body) = http_get(addr, path).await?;
    anyhow::ensure!(code == 200, "devplug at {addr} answered {code} to {path}: {}", crate::gate::clip(&body));
    Ok(serde_json::from_str(&body)?)
}

/// A `/status/devices` page; a busy answer (503: pages being built for other readers) is asked
/// again with a growing pause, for up to half a minute, so `devplug status --devices` completes
/// however many others read.
async fn busy_page(addr: &str, path: &str) -> anyhow::Result<DevicesPage> {
    let mut pause = std::time::Duration::from_millis(20);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let (code, body) = http_get(addr, path).await?;
        if code == 503 && tokio::time::Instant::now() + pause < deadline {
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(std::time::Duration::from_secs(1));
            continue;
        }
        anyhow::ensure!(code == 200, "devplug at {addr} answered {code} to {path}: {}", crate::gate::clip(&body));
        return serde_json::from_str(&body)
            .map_err(|e| anyhow::anyhow!("devplug at {addr}: its {path} did not read as a device page ({e})"));
    }
}

/// Every page of `/status/devices`, joined (a resource split across pages is one entry again).
pub async fn all_devices(addr: &str) -> anyhow::Result<Vec<ResourceDevices>> {
    let mut resources: Vec<ResourceDevices> = Vec::new();
    let mut offset = 0usize;
    loop {
        let page = busy_page(addr, &format!("/status/devices?offset={offset}")).await?;
        for r in page.resources {
            match resources.last_mut() {
                Some(last) if last.name == r.name => last.devices.extend(r.devices),
                _ => resources.push(r),
            }
        }
        match page.next {
            Some(next) if next > offset => offset = next,
            _ => break,
        }
    }
    Ok(resources)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whatever answers on the address: an endless body is cut at the bound with the host's
    /// words first, not read into memory.
    #[tokio::test]
    async fn an_answer_past_the_bound_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("status.sock");
        let listener = tokio::net::UnixListener::bind(&sock).unwrap();
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let (mut s, _) = listener.accept().await.unwrap();
            let mut req = [0u8; 1024];
            let _ = s.read(&mut req).await;
            let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", MAX_ANSWER_BYTES * 2);
            s.write_all(head.as_bytes()).await.unwrap();
            let chunk = vec![b'x'; 1 << 20];
            for _ in 0..(MAX_ANSWER_BYTES >> 20) * 2 {
                if s.write_all(&chunk).await.is_err() {
                    return;
                }
            }
        });
        let e = http_get(sock.to_str().unwrap(), "/status").await.unwrap_err().to_string();
        assert!(e.starts_with("devplug at ") && e.contains("was refused"), "{e}");
    }
}
