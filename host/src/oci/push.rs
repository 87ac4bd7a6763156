//! `devplug push`'s half of the registry (the vendor build only, feature `push`): a backend
//! stored as a Wasm OCI artifact, by digest first and tagged after, so a signature can be
//! stored before anyone following the tag sees it. The node only pulls (`artifact.rs`), so the
//! node build links neither this nor `oci-wasm` and the WIT tooling under it.

use std::collections::BTreeMap;

use base64::Engine;
use oci_client::errors::OciDistributionError;
use oci_client::manifest::{OCI_IMAGE_MEDIA_TYPE, OciImageManifest};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use oci_wasm::WasmConfig;
use sha2::Digest;

use super::artifact::{MANIFEST_ANNOTATION, NAME_ANNOTATION};

/// An artifact pushed by digest, not tagged yet: its manifest's digest and bytes.
pub struct Staged {
    pub digest: String,
    body: Vec<u8>,
}

/// Push backend `name` (its component and manifest text) as a Wasm OCI artifact to the
/// repository of `reference`, **by digest**: the blobs and the manifest are stored, but no tag
/// names them until [`tag`] (so a signature can be stored first, and a push that fails half way
/// publishes nothing anyone follows). The manifest is the one `oci-wasm` writes (config
/// `application/vnd.wasm.config.v0+json`, one `application/wasm` layer) with devplug's
/// annotations.
pub(crate) async fn push_untagged(
    client: &Client,
    auth: &RegistryAuth,
    reference: &Reference,
    name: &str,
    component: Vec<u8>,
    manifest: Option<&str>,
) -> anyhow::Result<Staged> {
    use oci_wasm::ToConfig;
    let (mut config, layer) = WasmConfig::from_raw_component(component, None)
        .map_err(|e| anyhow::anyhow!("{name}: not a Wasm component oci-wasm can describe: {e}"))?;
    // oci-wasm stamps the push time; the Unix epoch instead (as ko and rules_oci do), so the
    // same component and manifest always push to the same digest and a re-push moves nothing.
    config.created = Default::default();
    let mut annotations = BTreeMap::from([
        (NAME_ANNOTATION.to_owned(), name.to_owned()),
        ("org.opencontainers.image.title".to_owned(), format!("{name}.wasm")),
    ]);
    if let Some(m) = manifest {
        annotations.insert(MANIFEST_ANNOTATION.to_owned(), base64::engine::general_purpose::STANDARD.encode(m));
    }
    let config = config.to_config().map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
    let layers = vec![layer];
    let mut image = OciImageManifest::build(&layers, &config, Some(annotations));
    image.media_type = Some(oci_wasm::WASM_MANIFEST_MEDIA_TYPE.to_owned());
    let at = |what: &str, e: OciDistributionError| anyhow::anyhow!("pushing {reference}: {what}: {e}");
    client.store_auth_if_needed(reference.resolve_registry(), auth).await;
    client
        .push_blob(reference, layers[0].data.clone(), &layers[0].sha256_digest())
        .await
        .map_err(|e| at("the component", e))?;
    client.push_blob(reference, config.data.clone(), &image.config.digest).await.map_err(|e| at("the config", e))?;
    let body = serde_json::to_vec(&image)?;
    let digest = format!("sha256:{}", hex::encode(sha2::Sha256::digest(&body)));
    let by_digest =
        Reference::with_digest(reference.registry().to_owned(), reference.repository().to_owned(), digest.clone());
    client
        .push_manifest_raw(&by_digest, body.clone(), OCI_IMAGE_MEDIA_TYPE.parse()?)
        .await
        .map_err(|e| at("the manifest", e))?;
    Ok(Staged { digest, body })
}

/// Point `reference`'s tag at a staged artifact (the same manifest bytes, so the same digest).
pub async fn tag(client: &Client, reference: &Reference, staged: &Staged) -> anyhow::Result<()> {
    if reference.digest().is_some() {
        return Ok(());
    }
    client
        .push_manifest_raw(reference, staged.body.clone(), OCI_IMAGE_MEDIA_TYPE.parse()?)
        .await
        .map(drop)
        .map_err(|e| anyhow::anyhow!("tagging {reference}: {e}"))
}
