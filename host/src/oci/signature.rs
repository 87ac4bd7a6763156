//! cosign-compatible signatures: cosign's "simple signing" payload naming the manifest digest,
//! signed with ECDSA P-256 / SHA-256, stored as a manifest tagged `sha256-<hex>.sig` in the same
//! repository, the base64 signature in the layer annotation `dev.cosignproject.cosign/signature`.
//! `cosign sign --key` writes exactly this, and `cosign verify --key` accepts what [`sign`] pushes.
//!
//! Why not the `sigstore` crate: its keyless (Fulcio/Rekor) half, which devplug has no use for on a
//! node without internet, doubles the dependency tree and the build on 2 cores; key-based
//! verification is this file on top of RustCrypto's `p256`.

use std::collections::BTreeMap;
use std::path::Path;

use base64::Engine;
use oci_client::client::{Config, ImageLayer};
use oci_client::manifest::OciImageManifest;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use p256::ecdsa::signature::{Signer, Verifier};
use p256::ecdsa::{DerSignature, Signature, SigningKey, VerifyingKey};
use p256::pkcs8::{DecodePrivateKey, DecodePublicKey};
use serde::Serialize;

/// The media type of a simple-signing payload layer.
pub(crate) const SIMPLE_SIGNING: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// The layer annotation holding the base64 signature.
pub(crate) const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";

/// What verification found.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case", tag = "state", content = "detail")]
pub enum SignatureState {
    /// No key configured: signatures are not asked for.
    #[default]
    NotRequired,
    /// A signature by the configured key names this digest.
    Verified,
    /// No `sha256-<hex>.sig` manifest.
    Missing,
    /// Signatures exist, none valid for this digest and key (why).
    Invalid(String),
}

impl SignatureState {
    pub fn accepted(&self) -> bool {
        matches!(self, SignatureState::NotRequired | SignatureState::Verified)
    }

    pub fn label(&self) -> &'static str {
        match self {
            SignatureState::NotRequired => "not-required",
            SignatureState::Verified => "verified",
            SignatureState::Missing => "missing",
            SignatureState::Invalid(_) => "invalid",
        }
    }
}

impl std::fmt::Display for SignatureState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SignatureState::Invalid(why) => write!(f, "invalid signature: {why}"),
            other => f.write_str(other.label()),
        }
    }
}

pub(crate) fn load_public_key(path: &Path) -> anyhow::Result<VerifyingKey> {
    let pem = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("public key {}: {e}", path.display()))?;
    VerifyingKey::from_public_key_pem(&pem).map_err(|e| {
        anyhow::anyhow!("public key {}: not an ECDSA P-256 PEM public key (cosign.pub): {e}", path.display())
    })
}

/// A short id of a public key (16 hex of the sha256 of its compressed point): names what it
/// signed in the compile cache.
pub fn key_id(key: &VerifyingKey) -> String {
    use sha2::Digest;
    hex::encode(&sha2::Sha256::digest(key.to_encoded_point(true).as_bytes())[..8])
}

pub(crate) fn load_private_key(path: &Path) -> anyhow::Result<SigningKey> {
    let pem = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("private key {}: {e}", path.display()))?;
    SigningKey::from_pkcs8_pem(&pem).map_err(|e| {
        anyhow::anyhow!(
            "private key {}: not an unencrypted PKCS#8 ECDSA P-256 PEM key (openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256): {e}",
            path.display()
        )
    })
}

/// The tag cosign stores the signatures of `digest` under.
pub(crate) fn signature_tag(digest: &str) -> String {
    format!("{}.sig", digest.replace(':', "-"))
}

/// cosign's simple-signing payload for `repository` at `digest`.
pub fn payload(repository: &str, digest: &str) -> Vec<u8> {
    let v = serde_json::json!({
        "critical": {
            "identity": { "docker-reference": repository },
            "image": { "docker-manifest-digest": digest },
            "type": "cosign container image signature",
        },
        "optional": null,
    });
    serde_json::to_vec(&v).unwrap_or_default()
}

/// Whether `signature_b64` (DER, base64) over `payload` is valid for `key` and the payload names
/// `digest`.
pub fn check(key: &VerifyingKey, payload: &[u8], signature_b64: &str, digest: &str) -> Result<(), String> {
    let raw = base64::engine::general_purpose::STANDARD
        .decode(signature_b64.trim())
        .map_err(|e| format!("signature is not base64: {e}"))?;
    let sig = Signature::from_der(&raw)
        .or_else(|_| Signature::from_slice(&raw))
        .map_err(|e| format!("signature is not an ECDSA signature: {e}"))?;
    key.verify(payload, &sig).map_err(|_| "signature does not match the key".to_owned())?;
    let v: serde_json::Value = serde_json::from_slice(payload).map_err(|e| format!("payload is not JSON: {e}"))?;
    let named = v["critical"]["image"]["docker-manifest-digest"].as_str().unwrap_or_default();
    if named != digest {
        return Err(format!("the signature is for {named:?}, not {digest}"));
    }
    Ok(())
}

/// Look up and check the signatures of `digest` in `reference`'s repository.
/// The largest simple-signing payload devplug reads (cosign's are a few hundred bytes).
const MAX_PAYLOAD: usize = 64 * 1024;

pub async fn verify(
    fetcher: &super::fetch::Fetcher,
    auth: &RegistryAuth,
    reference: &Reference,
    digest: &str,
    key: Option<&VerifyingKey>,
) -> anyhow::Result<SignatureState> {
    let Some(key) = key else { return Ok(SignatureState::NotRequired) };
    let sig_ref =
        Reference::with_tag(reference.registry().to_owned(), reference.repository().to_owned(), signature_tag(digest));
    let raw = match fetcher.manifest(&sig_ref, auth, &[oci_client::manifest::OCI_IMAGE_MEDIA_TYPE]).await {
        Ok((raw, _)) => raw,
        Err(super::fetch::FetchError::NotFound { .. }) => return Ok(SignatureState::Missing),
        Err(e) => anyhow::bail!("fetching the signature {sig_ref}: {e}"),
    };
    let manifest: OciImageManifest =
        serde_json::from_slice(&raw).map_err(|e| anyhow::anyhow!("signature manifest {sig_ref}: {e}"))?;
    let mut why = Vec::new();
    for layer in manifest.layers.iter().filter(|l| l.media_type == SIMPLE_SIGNING) {
        let Some(sig) = layer.annotations.as_ref().and_then(|a| a.get(SIGNATURE_ANNOTATION)) else {
            why.push("a layer without a signature annotation".to_owned());
            continue;
        };
        if !(0..=MAX_PAYLOAD as i64).contains(&layer.size) {
            why.push(format!("a payload of {} bytes", layer.size));
            continue;
        }
        // At most the descriptor's size: a registry that streams more is cut off there.
        let payload = match super::artifact::capped_blob(fetcher, auth, &sig_ref, layer, layer.size as usize).await {
            Ok(p) => p,
            Err(e) => {
                why.push(format!("payload {}: {e:#}", layer.digest));
                continue;
            }
        };
        match check(key, &payload, sig, digest) {
            Ok(()) => return Ok(SignatureState::Verified),
            Err(e) => why.push(e),
        }
    }
    if why.is_empty() {
        why.push("no simple-signing layer".into());
    }
    Ok(SignatureState::Invalid(why.join("; ")))
}

/// Sign `digest` of `reference`'s repository with `key` and push the signature as cosign does.
pub async fn sign(
    client: &Client,
    auth: &RegistryAuth,
    reference: &Reference,
    digest: &str,
    key: &SigningKey,
) -> anyhow::Result<Reference> {
    let repo = format!("{}/{}", reference.resolve_registry(), reference.repository());
    let body = payload(&repo, digest);
    let sig: DerSignature = key.sign(&body);
    let b64 = base64::engine::general_purpose::STANDARD.encode(sig.as_bytes());
    let annotations = BTreeMap::from([(SIGNATURE_ANNOTATION.to_owned(), b64)]);
    let layer = ImageLayer::new(body, SIMPLE_SIGNING.to_owned(), Some(annotations));
    let config = Config::new(b"{}".to_vec(), "application/vnd.oci.image.config.v1+json".to_owned(), None);
    let sig_ref =
        Reference::with_tag(reference.registry().to_owned(), reference.repository().to_owned(), signature_tag(digest));
    client.push(&sig_ref, &[layer], config, auth, None).await.map_err(|e| anyhow::anyhow!("pushing {sig_ref}: {e}"))?;
    Ok(sig_ref)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_bind_key_payload_and_digest() {
        let sk = SigningKey::from_slice(&[7u8; 32]).unwrap();
        let vk = VerifyingKey::from(&sk);
        let d = "sha256:".to_owned() + &"ab".repeat(32);
        let body = payload("127.0.0.1:5000/devplug/gpu", &d);
        let sig: DerSignature = sk.sign(&body);
        let b64 = base64::engine::general_purpose::STANDARD.encode(sig.as_bytes());
        assert_eq!(check(&vk, &body, &b64, &d), Ok(()));
        let other = "sha256:".to_owned() + &"cd".repeat(32);
        assert!(check(&vk, &body, &b64, &other).unwrap_err().contains("not sha256:cd"));
        let wrong = VerifyingKey::from(&SigningKey::from_slice(&[9u8; 32]).unwrap());
        assert!(check(&wrong, &body, &b64, &d).unwrap_err().contains("does not match"));
        let mut tampered = body.clone();
        tampered[5] ^= 1;
        assert!(check(&vk, &tampered, &b64, &d).is_err());
        assert!(check(&vk, &body, "%%%", &d).unwrap_err().contains("base64"));
        assert_eq!(signature_tag(&d), format!("sha256-{}.sig", "ab".repeat(32)));
    }
}
