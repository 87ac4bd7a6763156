//! Everything devplug *reads* from a registry — manifests (and indexes), blobs, and the bearer
//! tokens that open them — over its own small client, so that every body is read to a byte cap:
//! a registry or token server that streams for ever is cut off at the cap, not when memory runs
//! out. oci-client (used for pushing) reads manifest and token bodies whole, with no way to bound
//! them (oras-project/rust-oci-client#206).
//!
//! The distribution protocol as registries speak it: `GET`/`HEAD /v2/<repo>/manifests/<ref>`,
//! `GET /v2/<repo>/blobs/<digest>` (redirects followed; credentials are not sent to another
//! host), and on `401` the challenge in `WWW-Authenticate`: `Basic` (retry with the
//! credentials) or `Bearer realm=…,service=…,scope=…` (a token from the realm, with the
//! credentials when there are any, then a retry with it). Every byte is checked against its
//! digest before it is returned.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use base64::Engine;
use oci_client::Reference;
use oci_client::secrets::RegistryAuth;
use sha2::{Digest, Sha256};

use crate::sync::Locked;

/// The largest manifest or index devplug reads: the distribution spec asks registries and
/// clients to support manifests of at least 4 MB, and devplug's are a few KiB.
pub(crate) const MAX_MANIFEST: usize = 4 << 20;
/// The largest token answer devplug reads (a JWT is a few KiB).
pub(crate) const MAX_TOKEN: usize = 256 << 10;
/// The largest error body kept for a message.
const MAX_ERROR_BODY: usize = 4 << 10;

/// Why a fetch failed, where callers tell the kinds apart.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("{what} is not there (404)")]
    NotFound { what: String },
    #[error("{what}: the registry sent more than {max} bytes; refused")]
    TooLarge { what: String, max: usize },
    /// A blob longer than its descriptor's `size`.
    #[error("{what}: the registry sent more than the {max} bytes the descriptor announced; refused")]
    LargerThanAnnounced { what: String, max: usize },
    #[error("{what}: digest mismatch: its bytes hash to {actual}, not {expected}")]
    DigestMismatch { what: String, expected: String, actual: String },
    #[error("{what}: {status} {message}")]
    Status { what: String, status: u16, message: String },
    #[error("{what}: {message}")]
    Other { what: String, message: String },
}

/// A registry reader with byte caps.
pub struct Fetcher {
    http: reqwest::Client,
    /// Registries (`host:port`) spoken to over plain HTTP.
    plain_http: Vec<String>,
    /// The last bearer token per (registry, scope): reused until the registry refuses it.
    tokens: Mutex<HashMap<(String, String), String>>,
}

impl Fetcher {
    pub fn new(plain_http: Vec<String>, ca_pem: Option<&[u8]>, timeout: Duration) -> anyhow::Result<Self> {
        crate::tls::install_crypto();
        let mut b = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .read_timeout(timeout)
            .redirect(reqwest::redirect::Policy::limited(5))
            .user_agent(concat!("devplug/", env!("CARGO_PKG_VERSION")));
        if let Some(pem) = ca_pem {
            let certs = reqwest::Certificate::from_pem_bundle(pem)
                .map_err(|e| anyhow::anyhow!("registry.ca_file: not PEM certificates: {e}"))?;
            for c in certs {
                b = b.add_root_certificate(c);
            }
        }
        let http = b.build().map_err(|e| anyhow::anyhow!("registry client: {e}"))?;
        Ok(Fetcher { http, plain_http, tokens: Mutex::default() })
    }

    fn base(&self, reference: &Reference) -> String {
        let registry = reference.resolve_registry();
        let scheme = if self.plain_http.iter().any(|h| h == registry) { "http" } else { "https" };
        format!("{scheme}://{registry}/v2/{}", reference.repository())
    }

    /// The manifest `reference` names (read to [`MAX_MANIFEST`] bytes) and its digest, checked
    /// against the bytes (and, for a digest reference, against the digest asked for).
    pub async fn manifest(
        &self,
        reference: &Reference,
        auth: &RegistryAuth,
        accept: &[&str],
    ) -> Result<(Vec<u8>, String), FetchError> {
        let what = format!("manifest {reference}");
        let url = format!("{}/manifests/{}", self.base(reference), tag_or_digest(reference));
        let resp = self.send(reqwest::Method::GET, &url, reference, auth, accept, &what).await?;
        let header = digest_header(&resp);
        let body = read_capped(resp, MAX_MANIFEST, &what).await?;
        let actual = sha256(&body);
        let expected = reference.digest().map(str::to_owned).or(header);
        if let Some(expected) = expected
            && expected.starts_with("sha256:")
            && expected != actual
        {
            return Err(FetchError::DigestMismatch { what, expected, actual });
        }
        Ok((body, actual))
    }

    /// What `reference` resolves to now: a `HEAD` (its `Docker-Content-Digest`), or, from a
    /// registry that sends none, the digest of a capped `GET`.
    pub async fn digest(
        &self,
        reference: &Reference,
        auth: &RegistryAuth,
        accept: &[&str],
    ) -> Result<String, FetchError> {
        if let Some(d) = reference.digest() {
            return Ok(d.to_owned());
        }
        let what = format!("manifest {reference}");
        let url = format!("{}/manifests/{}", self.base(reference), tag_or_digest(reference));
        let resp = self.send(reqwest::Method::HEAD, &url, reference, auth, accept, &what).await?;
        match digest_header(&resp) {
            Some(d) => Ok(d),
            None => Ok(self.manifest(reference, auth, accept).await?.1),
        }
    }

    /// Blob `digest` of `reference`'s repository, at most `max` bytes, checked against `digest`.
    pub async fn blob(
        &self,
        reference: &Reference,
        auth: &RegistryAuth,
        digest: &str,
        max: usize,
    ) -> Result<Vec<u8>, FetchError> {
        let what = format!("{reference}: blob {digest}");
        let url = format!("{}/blobs/{digest}", self.base(reference));
        let resp = self.send(reqwest::Method::GET, &url, reference, auth, &[], &what).await?;
        let body = read_capped(resp, max, &what).await.map_err(|e| match e {
            FetchError::TooLarge { what, max } => FetchError::LargerThanAnnounced { what, max },
            e => e,
        })?;
        let actual = sha256(&body);
        if actual != digest {
            return Err(FetchError::DigestMismatch { what, expected: digest.to_owned(), actual });
        }
        Ok(body)
    }

    /// [`Fetcher::blob`] written into `out` as it arrives (never held whole in memory), at most
    /// `max` bytes, checked against `digest`; on any error what was written is garbage.
    pub async fn blob_to(
        &self,
        reference: &Reference,
        auth: &RegistryAuth,
        digest: &str,
        max: usize,
        out: &mut std::fs::File,
    ) -> Result<(), FetchError> {
        use std::io::Write;
        let what = format!("{reference}: blob {digest}");
        let url = format!("{}/blobs/{digest}", self.base(reference));
        let mut resp = self.send(reqwest::Method::GET, &url, reference, auth, &[], &what).await?;
        let too_large = || FetchError::LargerThanAnnounced { what: what.clone(), max };
        if resp.content_length().is_some_and(|n| n > max as u64) {
            return Err(too_large());
        }
        let (mut h, mut len) = (Sha256::new(), 0usize);
        while let Some(chunk) =
            resp.chunk().await.map_err(|e| FetchError::Other { what: what.clone(), message: plain(&e) })?
        {
            len += chunk.len();
            if len > max {
                return Err(too_large());
            }
            h.update(&chunk);
            out.write_all(&chunk).map_err(|e| FetchError::Other { what: what.clone(), message: e.to_string() })?;
        }
        let actual = format!("sha256:{}", hex::encode(h.finalize()));
        if actual != digest {
            return Err(FetchError::DigestMismatch { what, expected: digest.to_owned(), actual });
        }
        Ok(())
    }

    /// One request, answering a `401` challenge once (Basic or Bearer).
    async fn send(
        &self,
        method: reqwest::Method,
        url: &str,
        reference: &Reference,
        auth: &RegistryAuth,
        accept: &[&str],
        what: &str,
    ) -> Result<reqwest::Response, FetchError> {
        let other = |e: reqwest::Error| FetchError::Other { what: what.to_owned(), message: plain(&e) };
        let registry = reference.resolve_registry().to_owned();
        let scope = format!("repository:{}:pull", reference.repository());
        let request = |authorization: Option<String>| {
            let mut r = self.http.request(method.clone(), url);
            if !accept.is_empty() {
                r = r.header(reqwest::header::ACCEPT, accept.join(", "));
            }
            if let Some(a) = authorization {
                r = r.header(reqwest::header::AUTHORIZATION, a);
            }
            r
        };
        let cached = self.tokens.locked().get(&(registry.clone(), scope.clone())).cloned();
        let mut resp = request(cached.as_ref().map(|t| format!("Bearer {t}"))).send().await.map_err(other)?;
        if resp.status() == reqwest::StatusCode::UNAUTHORIZED {
            let challenge =
                resp.headers().get(reqwest::header::WWW_AUTHENTICATE).and_then(|v| v.to_str().ok()).unwrap_or("");
            let authorization = match Challenge::parse(challenge) {
                Some(Challenge::Basic) => match auth {
                    RegistryAuth::Basic(u, p) => Some(basic(u, p)),
                    _ => None,
                },
                Some(Challenge::Bearer { realm, service, scope: asked }) => {
                    let scope = asked.unwrap_or(scope.clone());
                    let token = self.token(&realm, service.as_deref(), &scope, auth, what).await?;
                    self.tokens.locked().insert((registry, scope), token.clone());
                    Some(format!("Bearer {token}"))
                }
                None => None,
            };
            if let Some(a) = authorization {
                resp = request(Some(a)).send().await.map_err(other)?;
            }
        }
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        if status == reqwest::StatusCode::NOT_FOUND {
            return Err(FetchError::NotFound { what: what.to_owned() });
        }
        let body = read_capped(resp, MAX_ERROR_BODY, what).await.unwrap_or_default();
        let hint = match status {
            reqwest::StatusCode::UNAUTHORIZED | reqwest::StatusCode::FORBIDDEN => {
                " (not authorized: give credentials for this registry in registry.auth_file, or --auth-file)"
            }
            _ => "",
        };
        Err(FetchError::Status {
            what: what.to_owned(),
            status: status.as_u16(),
            message: format!(
                "{}{hint} {}",
                status.canonical_reason().unwrap_or(""),
                crate::gate::clip(String::from_utf8_lossy(&body).trim())
            )
            .trim_end()
            .to_owned(),
        })
    }

    /// A bearer token from `realm` (body read to [`MAX_TOKEN`] bytes).
    async fn token(
        &self,
        realm: &str,
        service: Option<&str>,
        scope: &str,
        auth: &RegistryAuth,
        what: &str,
    ) -> Result<String, FetchError> {
        let fail = |message: String| FetchError::Other { what: format!("{what}: token from {realm}"), message };
        let mut query = vec![("scope", scope)];
        if let Some(s) = service {
            query.push(("service", s));
        }
        let mut r = self.http.get(realm).query(&query);
        if let RegistryAuth::Basic(u, p) = auth {
            r = r.header(reqwest::header::AUTHORIZATION, basic(u, p));
        }
        let resp = r.send().await.map_err(|e| fail(plain(&e)))?;
        let status = resp.status();
        let body = read_capped(resp, MAX_TOKEN, &format!("{what}: token from {realm}")).await?;
        if !status.is_success() {
            return Err(fail(format!("{status}: {}", crate::gate::clip(&String::from_utf8_lossy(&body)))));
        }
        #[derive(serde::Deserialize)]
        struct Answer {
            token: Option<String>,
            access_token: Option<String>,
        }
        let a: Answer = serde_json::from_slice(&body).map_err(|e| fail(format!("not a token answer: {e}")))?;
        a.token.or(a.access_token).filter(|t| !t.is_empty()).ok_or_else(|| fail("the answer holds no token".into()))
    }
}

/// A `401`'s challenge.
#[derive(Debug, PartialEq, Eq)]
enum Challenge {
    Basic,
    Bearer { realm: String, service: Option<String>, scope: Option<String> },
}

impl Challenge {
    fn parse(header: &str) -> Option<Challenge> {
        let (scheme, rest) = header.trim().split_once(' ').unwrap_or((header.trim(), ""));
        if scheme.eq_ignore_ascii_case("basic") {
            return Some(Challenge::Basic);
        }
        if !scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        let mut params: HashMap<String, String> = HashMap::new();
        let mut rest = rest.trim();
        while !rest.is_empty() {
            let (key, after) = rest.split_once('=')?;
            let key = key.trim().trim_start_matches(',').trim().to_ascii_lowercase();
            let after = after.trim_start();
            let (value, next) = match after.strip_prefix('"') {
                Some(q) => {
                    let end = q.find('"')?;
                    (q[..end].to_owned(), &q[end + 1..])
                }
                None => {
                    let end = after.find(',').unwrap_or(after.len());
                    (after[..end].trim().to_owned(), &after[end..])
                }
            };
            params.insert(key, value);
            rest = next.trim_start().trim_start_matches(',').trim_start();
        }
        let realm = params.remove("realm").filter(|r| r.starts_with("http://") || r.starts_with("https://"))?;
        Some(Challenge::Bearer { realm, service: params.remove("service"), scope: params.remove("scope") })
    }
}

fn basic(user: &str, password: &str) -> String {
    format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}")))
}

fn tag_or_digest(r: &Reference) -> String {
    r.digest().or(r.tag()).unwrap_or("latest").to_owned()
}

fn digest_header(resp: &reqwest::Response) -> Option<String> {
    resp.headers().get("docker-content-digest").and_then(|v| v.to_str().ok()).map(str::to_owned)
}

fn sha256(b: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(b)))
}

/// An error with its causes, as one line.
fn plain(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

/// The body of `resp`, refused as soon as it passes `max` bytes (whatever Content-Length said).
async fn read_capped(mut resp: reqwest::Response, max: usize, what: &str) -> Result<Vec<u8>, FetchError> {
    if resp.content_length().is_some_and(|n| n > max as u64) {
        return Err(FetchError::TooLarge { what: what.to_owned(), max });
    }
    let mut out = Vec::new();
    while let Some(chunk) =
        resp.chunk().await.map_err(|e| FetchError::Other { what: what.to_owned(), message: plain(&e) })?
    {
        if out.len() + chunk.len() > max {
            return Err(FetchError::TooLarge { what: what.to_owned(), max });
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges_are_read_as_registries_write_them() {
        assert_eq!(Challenge::parse("Basic realm=\"Registry Realm\""), Some(Challenge::Basic));
        assert_eq!(
            Challenge::parse(
                "Bearer realm=\"https://auth.docker.io/token\",service=\"registry.docker.io\",scope=\"repository:library/x:pull\""
            ),
            Some(Challenge::Bearer {
                realm: "https://auth.docker.io/token".into(),
                service: Some("registry.docker.io".into()),
                scope: Some("repository:library/x:pull".into()),
            })
        );
        assert_eq!(
            Challenge::parse("bearer realm=http://127.0.0.1:1/t, service=r"),
            Some(Challenge::Bearer { realm: "http://127.0.0.1:1/t".into(), service: Some("r".into()), scope: None })
        );
        assert_eq!(Challenge::parse("Bearer realm=\"file:///etc/passwd\""), None, "a realm is an HTTP URL");
        assert_eq!(Challenge::parse("Negotiate x"), None);
        assert_eq!(Challenge::parse("Bearer realm=\"unterminated"), None);
    }
}
