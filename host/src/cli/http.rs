//! A minimal HTTP/1 client for devplug's own listener (`devplug status`).

/// GET `path` from devplug's HTTP listener at `addr`; (status code, body).
pub async fn http_get(addr: &str, path: &str) -> anyhow::Result<(u16, String)> {
    use http_body_util::BodyExt;
    let stream = tokio::time::timeout(std::time::Duration::from_secs(5), tokio::net::TcpStream::connect(addr))
        .await
        .map_err(|_| anyhow::anyhow!("{addr}: connect timed out"))?
        .map_err(|e| anyhow::anyhow!("cannot reach devplug at {addr} (its --metrics-addr): {e}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let req = hyper::Request::get(path)
        .header(hyper::header::HOST, addr)
        .body(http_body_util::Empty::<bytes::Bytes>::new())?;
    let resp = sender.send_request(req).await?;
    let code = resp.status().as_u16();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((code, String::from_utf8_lossy(&body).into_owned()))
}
