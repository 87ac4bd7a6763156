//! Native code attached to a backend's manifest in the registry: `devplug precompile` compiles a
//! component once for a cluster and stores the code as an OCI artifact whose `subject` is the
//! component's manifest, signed (cosign's format, [`super::signature`]) with the **operator's**
//! key, which nodes are given apart from the backends' key (`registry.operator_key`). A node
//! holding that key looks for the artifact of (component manifest digest, engine fingerprint)
//! under one tag, checks the signature and every binding, and hands the code to the runtime;
//! anything else and it compiles the component as before.
//!
//! The artifact: an OCI image manifest with `artifactType` [`ARTIFACT_TYPE`], the empty config,
//! one [`LAYER_MEDIA_TYPE`] layer (wasmtime's `.cwasm`), `subject` the component's manifest, and
//! annotations naming the component's sha256 ([`COMPONENT_ANNOTATION`]), the engine fingerprint
//! ([`ENGINE_ANNOTATION`], [`crate::runtime::native::fingerprint`]) and the target. It is tagged
//! `sha256-<manifest hex>.native-<fingerprint, 16 hex>` ([`tag`]), as cosign tags signatures, so
//! one GET finds it on any registry (the referrers API is not everywhere: Debian's
//! `docker-registry` has none), and `subject` lets registries that have it list it as a
//! referrer.

use oci_client::Reference;
use oci_client::manifest::{OCI_IMAGE_MEDIA_TYPE, OciImageManifest};
use oci_client::secrets::RegistryAuth;
use p256::ecdsa::VerifyingKey;

use super::fetch::{FetchError, Fetcher};
use super::signature::{self, SignatureState};

/// The `artifactType` of a native code artifact.
pub(crate) const ARTIFACT_TYPE: &str = "application/vnd.devplug.native.v1";
/// Its one layer: wasmtime's serialized component (`.cwasm`).
pub(crate) const LAYER_MEDIA_TYPE: &str = "application/vnd.devplug.native.cwasm.v1";
/// The OCI 1.1 empty descriptor's media type (an artifact's config when it has none).
pub(crate) const EMPTY_MEDIA_TYPE: &str = "application/vnd.oci.empty.v1+json";
/// `sha256:<hex>` of the component (the `application/wasm` layer) the code was compiled from.
pub(crate) const COMPONENT_ANNOTATION: &str = "io.devplug.native.component";
/// The engine fingerprint the code was compiled for.
pub(crate) const ENGINE_ANNOTATION: &str = "io.devplug.native.engine";
/// The target triple, for people (the fingerprint already binds it).
pub(crate) const TARGET_ANNOTATION: &str = "io.devplug.native.target";

/// The largest native code devplug pulls: the 18 MB Python example compiles to about 60 MB.
pub(crate) const MAX_NATIVE: i64 = 256 << 20;

/// The tag of the native code of manifest `subject` (`sha256:…`) for engine `fingerprint`.
pub fn tag(subject: &str, fingerprint: &str) -> String {
    format!("{}.native-{}", subject.replace(':', "-"), &fingerprint[..16.min(fingerprint.len())])
}

/// Why a node compiles a version itself rather than load native code for it.
#[derive(Debug, thiserror::Error)]
pub enum NoNative {
    /// Nothing under the tag: not precompiled (yet) for this engine.
    #[error(
        "no native code for this engine in the registry (tag {tag}); run `devplug precompile` for it (docs/registry.md)"
    )]
    Missing { tag: String },
    /// Something is there, and it is not code this node may load.
    #[error("native code refused: {0}")]
    Refused(String),
    /// The registry did not answer as asked (a network error, a 500): looked for again at the
    /// next version.
    #[error("native code not fetched: {0}")]
    Unreachable(String),
}

/// What native code a node looks for.
pub struct Wanted<'a> {
    /// The version's manifest digest (`sha256:…`).
    pub subject: &'a str,
    /// `sha256:<hex>` of its component.
    pub component: &'a str,
    /// This node's engine fingerprint ([`crate::runtime::native::fingerprint`]).
    pub fingerprint: &'a str,
}

/// The operator-signed native code of `wanted` in `reference`'s repository: found under
/// [`tag`], its manifest bound to the version, component and engine, signed by `key`, its one
/// layer at most [`MAX_NATIVE`] bytes and matching its digest. Streamed into `scratch` (an
/// unnamed file of devplug's cache) when given, else read into memory.
pub async fn fetch(
    fetcher: &Fetcher,
    auth: &RegistryAuth,
    reference: &Reference,
    wanted: Wanted<'_>,
    key: &VerifyingKey,
    scratch: Option<std::fs::File>,
) -> Result<crate::durable::Spooled, NoNative> {
    let Wanted { subject, component: component_digest, fingerprint } = wanted;
    let tag = tag(subject, fingerprint);
    let at = Reference::with_tag(reference.registry().to_owned(), reference.repository().to_owned(), tag.clone());
    let (raw, digest) = match fetcher.manifest(&at, auth, &[OCI_IMAGE_MEDIA_TYPE]).await {
        Ok(m) => m,
        Err(FetchError::NotFound { .. }) => return Err(NoNative::Missing { tag }),
        Err(e @ FetchError::DigestMismatch { .. }) => return Err(NoNative::Refused(e.to_string())),
        Err(e) => return Err(NoNative::Unreachable(e.to_string())),
    };
    let manifest: OciImageManifest =
        serde_json::from_slice(&raw).map_err(|e| NoNative::Refused(format!("{at}: not an image manifest: {e}")))?;
    let layer = check_binding(&manifest, subject, component_digest, fingerprint).map_err(NoNative::Refused)?;
    let pinned = super::artifact::pinned(reference, &digest);
    match signature::verify(fetcher, auth, &pinned, &digest, Some(key)).await {
        Ok(SignatureState::Verified) => {}
        Ok(SignatureState::Missing) => {
            return Err(NoNative::Refused(format!("{at} ({digest}) is not signed (registry.operator_key)")));
        }
        Ok(state) => return Err(NoNative::Refused(format!("{at} ({digest}): {state} (registry.operator_key)"))),
        Err(e) => return Err(NoNative::Unreachable(format!("{e:#}"))),
    }
    let failed = |e: FetchError| match e {
        FetchError::DigestMismatch { .. } | FetchError::TooLarge { .. } | FetchError::LargerThanAnnounced { .. } => {
            NoNative::Refused(e.to_string())
        }
        e => NoNative::Unreachable(e.to_string()),
    };
    use crate::durable::Spooled;
    match scratch {
        Some(mut file) => {
            fetcher.blob_to(&pinned, auth, &layer.digest, layer.size as usize, &mut file).await.map_err(failed)?;
            Ok(Spooled::File(file))
        }
        None => {
            fetcher.blob(&pinned, auth, &layer.digest, layer.size as usize).await.map(Spooled::Bytes).map_err(failed)
        }
    }
}

/// What in a native artifact's manifest must hold before its code is fetched: its type, the
/// manifest it is attached to, the component and engine it was compiled from and for, and one
/// layer of native code within [`MAX_NATIVE`]. The layer, or why not.
pub(crate) fn check_binding<'m>(
    manifest: &'m OciImageManifest,
    subject: &str,
    component_digest: &str,
    fingerprint: &str,
) -> Result<&'m oci_client::manifest::OciDescriptor, String> {
    if manifest.artifact_type.as_deref() != Some(ARTIFACT_TYPE) {
        return Err(format!("its artifactType is {:?}, not {ARTIFACT_TYPE}", manifest.artifact_type));
    }
    let attached = manifest.subject.as_ref().map(|s| s.digest.as_str());
    if attached != Some(subject) {
        return Err(format!("it is attached to {attached:?}, not to this version's manifest {subject}"));
    }
    let annotation = |key: &str| manifest.annotations.as_ref().and_then(|a| a.get(key)).map(String::as_str);
    if annotation(COMPONENT_ANNOTATION) != Some(component_digest) {
        return Err(format!(
            "it was compiled from component {:?}, not this version's {component_digest}",
            annotation(COMPONENT_ANNOTATION)
        ));
    }
    if annotation(ENGINE_ANNOTATION) != Some(fingerprint) {
        return Err(format!(
            "it was compiled for engine {:?}, not this node's {fingerprint} (precompile with the same devplug version as the nodes)",
            annotation(ENGINE_ANNOTATION)
        ));
    }
    let layer = match manifest.layers.as_slice() {
        [l] if l.media_type == LAYER_MEDIA_TYPE => l,
        _ => return Err(format!("it must have exactly one {LAYER_MEDIA_TYPE} layer")),
    };
    if !(1..=MAX_NATIVE).contains(&layer.size) {
        return Err(format!("its code is {} bytes; devplug pulls 1 to {MAX_NATIVE}", layer.size));
    }
    Ok(layer)
}

/// Native code for one version and engine, as [`attach`] stores it.
pub struct Attachment {
    /// The component's manifest (the version) the code belongs to.
    pub subject: oci_client::manifest::OciDescriptor,
    /// `sha256:<hex>` of the component it was compiled from.
    pub component: String,
    /// The engine it was compiled for (the runtime's `native::fingerprint`).
    pub fingerprint: String,
    /// The target triple it was compiled for (the runtime's `native::target`).
    pub target: String,
    pub code: Vec<u8>,
}

/// Attach native code to its version in `reference`'s repository: the blobs and the manifest
/// by digest, then its signature by `key`, and the tag last, so the tag never names unsigned
/// code. The artifact manifest's digest and its tag.
pub async fn attach(
    client: &oci_client::Client,
    auth: &RegistryAuth,
    reference: &Reference,
    native: Attachment,
    key: &p256::ecdsa::SigningKey,
) -> anyhow::Result<(String, Reference)> {
    let Attachment { subject, component: component_digest, fingerprint, target, code: native } = native;
    let fingerprint = fingerprint.as_str();
    let component_digest = component_digest.as_str();
    use sha2::Digest;
    let hex = |b: &[u8]| format!("sha256:{}", hex::encode(sha2::Sha256::digest(b)));
    let empty = b"{}".to_vec();
    let config = oci_client::manifest::OciDescriptor {
        media_type: EMPTY_MEDIA_TYPE.to_owned(),
        digest: hex(&empty),
        size: empty.len() as i64,
        ..Default::default()
    };
    let layer = oci_client::manifest::OciDescriptor {
        media_type: LAYER_MEDIA_TYPE.to_owned(),
        digest: hex(&native),
        size: native.len() as i64,
        ..Default::default()
    };
    let subject_digest = subject.digest.clone();
    let annotations = std::collections::BTreeMap::from([
        (COMPONENT_ANNOTATION.to_owned(), component_digest.to_owned()),
        (ENGINE_ANNOTATION.to_owned(), fingerprint.to_owned()),
        (TARGET_ANNOTATION.to_owned(), target),
    ]);
    let manifest = OciImageManifest {
        schema_version: 2,
        media_type: Some(OCI_IMAGE_MEDIA_TYPE.to_owned()),
        config,
        layers: vec![layer],
        subject: Some(subject),
        artifact_type: Some(ARTIFACT_TYPE.to_owned()),
        annotations: Some(annotations),
    };
    let at = |what: &str, e: oci_client::errors::OciDistributionError| anyhow::anyhow!("pushing {what}: {e}");
    client.store_auth_if_needed(reference.resolve_registry(), auth).await;
    let layer_digest = manifest.layers[0].digest.clone();
    client.push_blob(reference, native, &layer_digest).await.map_err(|e| at("the native code", e))?;
    client.push_blob(reference, empty, &manifest.config.digest).await.map_err(|e| at("the empty config", e))?;
    let body = serde_json::to_vec(&manifest)?;
    let digest = hex(&body);
    let pinned = super::artifact::pinned(reference, &digest);
    client
        .push_manifest_raw(&pinned, body.clone(), OCI_IMAGE_MEDIA_TYPE.parse()?)
        .await
        .map_err(|e| at("the native code's manifest", e))?;
    signature::sign(client, auth, reference, &digest, key)
        .await
        .map_err(|e| anyhow::anyhow!("{e:#}; the native code is stored by digest ({digest}) but no tag names it"))?;
    let tagged = Reference::with_tag(
        reference.registry().to_owned(),
        reference.repository().to_owned(),
        tag(&subject_digest, fingerprint),
    );
    client
        .push_manifest_raw(&tagged, body, OCI_IMAGE_MEDIA_TYPE.parse()?)
        .await
        .map_err(|e| at(&format!("the tag {tagged}"), e))?;
    Ok((digest, tagged))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn artifact(subject: &str, component: &str, engine: &str) -> OciImageManifest {
        let d = |h: &str| format!("sha256:{}", h.repeat(64));
        OciImageManifest {
            artifact_type: Some(ARTIFACT_TYPE.into()),
            subject: Some(oci_client::manifest::OciDescriptor { digest: subject.into(), ..Default::default() }),
            layers: vec![oci_client::manifest::OciDescriptor {
                media_type: LAYER_MEDIA_TYPE.into(),
                digest: d("c"),
                size: 1000,
                ..Default::default()
            }],
            annotations: Some(
                [
                    (COMPONENT_ANNOTATION.to_owned(), component.to_owned()),
                    (ENGINE_ANNOTATION.to_owned(), engine.to_owned()),
                ]
                .into(),
            ),
            ..Default::default()
        }
    }

    /// Each binding is checked: the type, the manifest it is attached to, the component, the
    /// engine, the one layer and its size.
    #[test]
    fn a_native_artifact_is_bound_to_its_version_and_engine() {
        let (s, c, e) =
            ("sha256:".to_owned() + &"1".repeat(64), "sha256:".to_owned() + &"2".repeat(64), "f".repeat(64));
        assert!(check_binding(&artifact(&s, &c, &e), &s, &c, &e).is_ok());
        let other = "sha256:".to_owned() + &"9".repeat(64);
        assert!(check_binding(&artifact(&other, &c, &e), &s, &c, &e).unwrap_err().contains("attached to"));
        assert!(check_binding(&artifact(&s, &other, &e), &s, &c, &e).unwrap_err().contains("compiled from component"));
        assert!(check_binding(&artifact(&s, &c, &"e".repeat(64)), &s, &c, &e).unwrap_err().contains("for engine"));
        let mut m = artifact(&s, &c, &e);
        m.artifact_type = Some("application/vnd.dev.cosign.simplesigning.v1+json".into());
        assert!(check_binding(&m, &s, &c, &e).unwrap_err().contains("artifactType"));
        let mut m = artifact(&s, &c, &e);
        m.layers[0].size = MAX_NATIVE + 1;
        assert!(check_binding(&m, &s, &c, &e).unwrap_err().contains("bytes"));
        let mut m = artifact(&s, &c, &e);
        m.layers.push(m.layers[0].clone());
        assert!(check_binding(&m, &s, &c, &e).unwrap_err().contains("exactly one"));
        assert_eq!(tag(&s, &e), format!("sha256-{}.native-{}", "1".repeat(64), "f".repeat(16)));
    }
}
