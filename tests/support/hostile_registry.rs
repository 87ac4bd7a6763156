//! A deliberately hostile OCI registry on loopback: it answers the distribution API's `/v2/`,
//! manifest `HEAD`/`GET` and blob `GET` like a registry, but misbehaves the way a compromised or
//! broken registry would: in a blob body, a manifest or index body, or the body of the token
//! server its `401` challenge sends clients to. It counts every body byte it sends, so a test can
//! say how much devplug read before refusing. The real registry (`support::registry`, Debian's
//! `docker-registry`) covers the normal path; this exists because no real registry lies on cue.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How the blob body misbehaves.
#[derive(Clone, Copy, Debug)]
pub enum Blob {
    /// Streams bytes for ever (chunked encoding).
    Endless,
    /// Announces (and sends) 64 MiB where the descriptor said 1,000 bytes.
    LyingLength,
    /// One byte every 100 ms, for ever.
    Drip,
}

/// What the registry attacks.
#[derive(Clone, Copy, Debug)]
pub enum Attack {
    Blob(Blob),
    /// The manifest `GET` streams for ever (no digest header on `HEAD`, so a client must `GET`).
    EndlessManifest,
    /// The same, served as an image index.
    EndlessIndex,
    /// Every `/v2/` request is answered `401 Bearer realm=<this registry>/token`, whose body
    /// streams for ever.
    EndlessToken,
}

/// The size the manifest's layer descriptor announces.
pub const LAYER_SIZE: usize = 1000;

pub struct HostileRegistry {
    pub addr: String,
    /// Blob body bytes sent so far.
    pub sent: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for HostileRegistry {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn sha256(b: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(b)))
}

impl HostileRegistry {
    /// Serve repository `evil` (tag `latest`): a Wasm-artifact manifest whose one layer claims
    /// [`LAYER_SIZE`] bytes, its blob misbehaving as `blob` says.
    pub async fn start(blob: Blob) -> Self {
        Self::attack(Attack::Blob(blob)).await
    }

    /// Serve repository `evil` misbehaving as `attack` says.
    pub async fn attack(attack: Attack) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let config = b"{}".to_vec();
        let layer_digest = sha256(&vec![0u8; LAYER_SIZE]);
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": { "mediaType": "application/vnd.wasm.config.v0+json", "digest": sha256(&config), "size": config.len() },
            "layers": [{ "mediaType": "application/wasm", "digest": layer_digest, "size": LAYER_SIZE }],
        })
        .to_string()
        .into_bytes();
        let sent = Arc::new(AtomicU64::new(0));
        let counter = sent.clone();
        let addr_for_task = addr.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((sock, _)) = listener.accept().await else { return };
                let (manifest, counter, addr) = (manifest.clone(), counter.clone(), addr_for_task.clone());
                tokio::spawn(async move {
                    let _ = serve(sock, &manifest, attack, &counter, &addr).await;
                });
            }
        });
        HostileRegistry { addr, sent, task }
    }

    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::SeqCst)
    }
}

/// 16 KiB chunks of a chunked body, up to 1 GiB (bounded, as every test loop must be; far past
/// anything devplug may read).
async fn endless(sock: &mut TcpStream, ctype: &str, sent: &AtomicU64) -> std::io::Result<()> {
    let head =
        format!("HTTP/1.1 200 OK\r\nContent-Type: {ctype}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n");
    sock.write_all(head.as_bytes()).await?;
    let chunk = vec![b' '; 16 << 10];
    for _ in 0..(1u64 << 30) / chunk.len() as u64 {
        sock.write_all(format!("{:x}\r\n", chunk.len()).as_bytes()).await?;
        sock.write_all(&chunk).await?;
        sock.write_all(b"\r\n").await?;
        sent.fetch_add(chunk.len() as u64, Ordering::SeqCst);
    }
    Ok(())
}

async fn serve(
    mut sock: TcpStream,
    manifest: &[u8],
    attack: Attack,
    sent: &AtomicU64,
    addr: &str,
) -> std::io::Result<()> {
    let mut req = Vec::new();
    let mut buf = [0u8; 4096];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = sock.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        req.extend_from_slice(&buf[..n]);
        if req.len() > 64 << 10 {
            return Ok(());
        }
    }
    let head = String::from_utf8_lossy(&req);
    let line = head.lines().next().unwrap_or_default();
    let (method, path) = {
        let mut parts = line.split_whitespace();
        (parts.next().unwrap_or_default().to_owned(), parts.next().unwrap_or_default().to_owned())
    };
    let ok = |ctype: &str, extra: &str, len: usize| {
        format!("HTTP/1.1 200 OK\r\nContent-Type: {ctype}\r\nContent-Length: {len}\r\n{extra}Connection: close\r\n\r\n")
    };
    if path.starts_with("/token") {
        return endless(&mut sock, "application/json", sent).await;
    }
    let authorized = head.lines().any(|l| l.to_ascii_lowercase().starts_with("authorization:"));
    if matches!(attack, Attack::EndlessToken) && path.starts_with("/v2/") && !authorized {
        let challenge = format!("WWW-Authenticate: Bearer realm=\"http://{addr}/token\",service=\"evil\"\r\n");
        let answer = format!("HTTP/1.1 401 Unauthorized\r\n{challenge}Content-Length: 0\r\nConnection: close\r\n\r\n");
        return sock.write_all(answer.as_bytes()).await;
    }
    if path.starts_with("/v2/evil/manifests/") {
        let ctype = match attack {
            Attack::EndlessManifest => Some("application/vnd.oci.image.manifest.v1+json"),
            Attack::EndlessIndex => Some("application/vnd.oci.image.index.v1+json"),
            _ => None,
        };
        if let Some(ctype) = ctype {
            if method == "HEAD" {
                let answer = format!("HTTP/1.1 200 OK\r\nContent-Type: {ctype}\r\nConnection: close\r\n\r\n");
                return sock.write_all(answer.as_bytes()).await;
            }
            return endless(&mut sock, ctype, sent).await;
        }
    }
    let Attack::Blob(blob) = attack else {
        return sock.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").await;
    };
    if path == "/v2/" {
        sock.write_all(ok("application/json", "", 2).as_bytes()).await?;
        return sock.write_all(b"{}").await;
    }
    if path.starts_with("/v2/evil/manifests/") {
        let digest = format!("Docker-Content-Digest: {}\r\n", sha256(manifest));
        sock.write_all(ok("application/vnd.oci.image.manifest.v1+json", &digest, manifest.len()).as_bytes()).await?;
        if method != "HEAD" {
            sock.write_all(manifest).await?;
        }
        return Ok(());
    }
    if path.starts_with("/v2/evil/blobs/") {
        let chunk = vec![0u8; 16 << 10];
        match blob {
            Blob::Endless => {
                sock.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n").await?;
                // Bounded, as every test loop must be: 1 GiB is far past anything devplug may read.
                for _ in 0..(1u64 << 30) / chunk.len() as u64 {
                    sock.write_all(format!("{:x}\r\n", chunk.len()).as_bytes()).await?;
                    sock.write_all(&chunk).await?;
                    sock.write_all(b"\r\n").await?;
                    sent.fetch_add(chunk.len() as u64, Ordering::SeqCst);
                }
            }
            Blob::LyingLength => {
                sock.write_all(ok("application/octet-stream", "", 64 << 20).as_bytes()).await?;
                for _ in 0..(64u64 << 20) / chunk.len() as u64 {
                    sock.write_all(&chunk).await?;
                    sent.fetch_add(chunk.len() as u64, Ordering::SeqCst);
                }
            }
            Blob::Drip => {
                sock.write_all(ok("application/octet-stream", "", LAYER_SIZE).as_bytes()).await?;
                for _ in 0..LAYER_SIZE {
                    sock.write_all(&[0]).await?;
                    sent.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        return Ok(());
    }
    sock.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").await
}
