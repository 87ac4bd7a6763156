//! One backend in a registry, pulled or pushed. Two layouts are read:
//!
//! - the **Wasm OCI artifact** (CNCF TAG Runtime's layout, as `wkg`, wasmtime and Spin use it,
//!   written with `oci-wasm`): config `application/vnd.wasm.config.v0+json`, one
//!   `application/wasm` layer; devplug's manifest (`NAME.toml`) travels base64-encoded in the
//!   manifest annotation [`MANIFEST_ANNOTATION`] (base64 because oci-client writes canonical JSON,
//!   which leaves newlines raw, and registries refuse those), so every Wasm tool still sees a
//!   plain component;
//! - the **image `devplug pack` writes** (pushed with skopeo or any registry client): tar layers
//!   (`+gzip` or not) with `NAME.wasm` and `NAME.toml` at the root.
//!
//! Every byte is checked against its digest (the manifest against the digest it was resolved to
//! or pinned at, each blob against its descriptor) before anything else looks at it.

use std::collections::BTreeMap;
use std::io::Read;

use base64::Engine;

use oci_client::Reference;
use oci_client::errors::OciDistributionError;
use oci_client::manifest::{IMAGE_MANIFEST_MEDIA_TYPE, OCI_IMAGE_MEDIA_TYPE, OciDescriptor, OciImageManifest};
use oci_client::secrets::RegistryAuth;

use super::fetch::{FetchError, Fetcher};

/// The config media type of a Wasm OCI artifact (the CNCF TAG Runtime layout that `oci-wasm`,
/// wkg and wasmCloud write; `devplug push` writes it through `oci-wasm`, in the vendor build).
pub(crate) const WASM_MANIFEST_CONFIG_MEDIA_TYPE: &str = "application/vnd.wasm.config.v0+json";
/// The media type of a Wasm OCI artifact's one layer: the component itself.
pub(crate) const WASM_LAYER_MEDIA_TYPE: &str = "application/wasm";

/// The manifest annotation carrying the backend's `NAME.toml`, base64 (standard alphabet).
pub(crate) const MANIFEST_ANNOTATION: &str = "io.devplug.backend.manifest";
/// The annotation naming the backend.
pub(crate) const NAME_ANNOTATION: &str = "io.devplug.backend.name";

/// The largest layer devplug pulls (the Python example backend is 18 MB).
pub(crate) const MAX_LAYER: i64 = 64 << 20;

/// A backend as pulled.
#[derive(Clone, Debug)]
pub struct Pulled {
    /// The manifest digest (`sha256:…`) the reference resolved to.
    pub digest: String,
    pub component: Vec<u8>,
    /// `NAME.toml`, empty when the artifact carries none (the backend then gets no capabilities).
    pub manifest: String,
    /// `wasm-artifact` or `devplug-pack`.
    pub layout: &'static str,
    /// The backend's name as the artifact states it ([`NAME_ANNOTATION`]), if it does.
    pub name: Option<String>,
}

/// The image manifest `reference` names, as bytes (at most [`super::fetch::MAX_MANIFEST`]), and its
/// digest, checked against the bytes and, for a digest reference, against the digest asked for.
async fn manifest_raw(
    fetcher: &Fetcher,
    auth: &RegistryAuth,
    reference: &Reference,
) -> anyhow::Result<(Vec<u8>, String)> {
    Ok(fetcher.manifest(reference, auth, &[OCI_IMAGE_MEDIA_TYPE, IMAGE_MANIFEST_MEDIA_TYPE]).await?)
}

/// What `reference` resolves to now, without pulling anything else: a `HEAD` of the manifest (its
/// `Docker-Content-Digest`), so a follow tick never downloads an unchanged manifest's body; a
/// registry that sends no digest header gets a capped `GET`.
pub async fn resolve(fetcher: &Fetcher, auth: &RegistryAuth, reference: &Reference) -> anyhow::Result<String> {
    Ok(fetcher.digest(reference, auth, &[OCI_IMAGE_MEDIA_TYPE, IMAGE_MANIFEST_MEDIA_TYPE]).await?)
}

/// Whether `err` says some content did not match its digest: the artifact's fault, not the
/// network's, so worth remembering rather than retrying.
pub(crate) fn is_digest_mismatch(err: &anyhow::Error) -> bool {
    err.chain().any(|c| {
        matches!(c.downcast_ref::<OciDistributionError>(), Some(OciDistributionError::DigestError(_)))
            || matches!(c.downcast_ref::<FetchError>(), Some(FetchError::DigestMismatch { .. }))
    })
}

/// `reference` pinned to `digest` (same registry and repository): what resolving it gave.
pub fn pinned(reference: &Reference, digest: &str) -> Reference {
    Reference::with_digest(reference.registry().to_owned(), reference.repository().to_owned(), digest.to_owned())
}

/// Pull backend `name` from `reference`.
pub async fn pull(fetcher: &Fetcher, auth: &RegistryAuth, reference: &Reference, name: &str) -> anyhow::Result<Pulled> {
    let (raw, digest) = manifest_raw(fetcher, auth, reference).await?;
    let manifest: OciImageManifest =
        serde_json::from_slice(&raw).map_err(|e| anyhow::anyhow!("{reference}: not an image manifest: {e}"))?;
    // Blobs are fetched by digest from the same repository: what the manifest names is what is read.
    let pinned = pinned(reference, &digest);
    for l in &manifest.layers {
        anyhow::ensure!(
            (0..=MAX_LAYER).contains(&l.size),
            "{reference}: layer {} is {} bytes, more than devplug pulls ({MAX_LAYER})",
            l.digest,
            l.size
        );
    }
    if manifest.config.media_type == WASM_MANIFEST_CONFIG_MEDIA_TYPE {
        let layer = match manifest.layers.as_slice() {
            [l] if l.media_type == WASM_LAYER_MEDIA_TYPE => l,
            _ => anyhow::bail!("{reference}: a Wasm artifact must have exactly one {WASM_LAYER_MEDIA_TYPE} layer"),
        };
        let component = blob(fetcher, auth, &pinned, layer).await?;
        let text = match manifest.annotations.as_ref().and_then(|a| a.get(MANIFEST_ANNOTATION)) {
            Some(b64) => {
                let raw = base64::engine::general_purpose::STANDARD
                    .decode(b64.trim())
                    .map_err(|e| anyhow::anyhow!("{reference}: annotation {MANIFEST_ANNOTATION} is not base64: {e}"))?;
                String::from_utf8(raw)
                    .map_err(|_| anyhow::anyhow!("{reference}: annotation {MANIFEST_ANNOTATION} is not UTF-8 TOML"))?
            }
            None => String::new(),
        };
        let stated = manifest.annotations.as_ref().and_then(|a| a.get(NAME_ANNOTATION)).cloned();
        return Ok(Pulled { digest, component, manifest: text, layout: "wasm-artifact", name: stated });
    }
    let wasm_name = format!("{name}.wasm");
    let mut layers = Vec::new();
    for l in &manifest.layers {
        let gz = l.media_type.ends_with("+gzip") || l.media_type.ends_with(".tar.gzip");
        anyhow::ensure!(
            l.media_type.contains(".tar") || l.media_type.contains("layer.v1"),
            "{reference}: layer {} has media type {}, neither a Wasm artifact nor an image layer",
            l.digest,
            l.media_type
        );
        layers.push((l.digest.clone(), gz, blob(fetcher, auth, &pinned, l).await?));
    }
    let unpack = |name: &str| -> anyhow::Result<(BTreeMap<String, Vec<u8>>, Unpacked)> {
        let wanted = [format!("{name}.wasm"), format!("{name}.toml")];
        let mut unpacked = Unpacked { wanted, left: MAX_UNPACKED, other_wasm: Default::default() };
        let mut files = BTreeMap::new();
        for (digest, gz, data) in &layers {
            untar(data, *gz, &mut unpacked, &mut files)
                .map_err(|e| anyhow::anyhow!("{reference}: layer {digest}: {e}"))?;
        }
        Ok((files, unpacked))
    };
    let (mut files, unpacked) = unpack(name)?;
    // An image holding one backend under another name (pushed as `mi300x-backends`, packed from
    // `mi300x.wasm`) is that backend: its own name, which `--name` or the config's key may
    // still override.
    let mut found = name.to_owned();
    if !files.contains_key(&wasm_name) {
        let all = &unpacked.other_wasm;
        let [only] = all.iter().collect::<Vec<_>>()[..] else {
            anyhow::bail!(
                "{reference}: the image has no {wasm_name} at its root (it has {all:?}); name the backend to take                  with --name (`devplug pull`) or as its key in the config ([backends.NAME])"
            )
        };
        found = only.trim_end_matches(".wasm").to_owned();
        files = unpack(&found)?.0;
    }
    let component = files
        .remove(&format!("{found}.wasm"))
        .ok_or_else(|| anyhow::anyhow!("{reference}: {found}.wasm vanished between two reads of the image"))?;
    let text = match files.remove(&format!("{found}.toml")) {
        Some(t) => String::from_utf8(t).map_err(|_| anyhow::anyhow!("{reference}: {found}.toml is not UTF-8"))?,
        None => String::new(),
    };
    Ok(Pulled { digest, component, manifest: text, layout: "devplug-pack", name: Some(found) })
}

/// The blob `layer` names, at most its descriptor's size (itself at most [`MAX_LAYER`]): a
/// registry that sends more (an endless body, a Content-Length that lies) is cut off there.
async fn blob(
    fetcher: &Fetcher,
    auth: &RegistryAuth,
    reference: &Reference,
    layer: &OciDescriptor,
) -> anyhow::Result<Vec<u8>> {
    let size = usize::try_from(layer.size)
        .map_err(|_| anyhow::anyhow!("{reference}: blob {} has a negative size", layer.digest))?;
    capped_blob(fetcher, auth, reference, layer, size).await
}

/// Blob `layer`, refused past `max` bytes and checked against the descriptor's digest.
pub(crate) async fn capped_blob(
    fetcher: &Fetcher,
    auth: &RegistryAuth,
    reference: &Reference,
    layer: &OciDescriptor,
    max: usize,
) -> anyhow::Result<Vec<u8>> {
    Ok(fetcher.blob(reference, auth, &layer.digest, max).await?)
}

/// Bytes all of an image's layers may unpack to, together (a 249 KiB gzip layer unpacks to
/// 256 MiB: six of them took devplug to 1.5 GiB).
pub(crate) const MAX_UNPACKED: u64 = 4 * MAX_LAYER as u64;
/// Other `.wasm` names an image's root holds, kept (names only) for the error that lists them.
const MAX_OTHER_NAMES: usize = 32;

/// What unpacking an image keeps across its layers: the two files it uses, the bytes left of
/// [`MAX_UNPACKED`], and the names of the other components it saw.
struct Unpacked {
    wanted: [String; 2],
    left: u64,
    other_wasm: std::collections::BTreeSet<String>,
}

/// The wanted regular files at the root of a tar layer (later layers win, as in an image); every
/// byte read, kept or not, is charged to `unpacked.left`.
fn untar(data: &[u8], gz: bool, unpacked: &mut Unpacked, into: &mut BTreeMap<String, Vec<u8>>) -> anyhow::Result<()> {
    let reader: Box<dyn Read> = if gz { Box::new(flate2::read::GzDecoder::new(data)) } else { Box::new(data) };
    let budget = unpacked.left;
    let mut limited = reader.take(budget);
    let result = (|| -> anyhow::Result<()> {
        let mut ar = tar::Archive::new(&mut limited);
        for entry in ar.entries()? {
            let mut entry = entry?;
            if !entry.header().entry_type().is_file() {
                continue;
            }
            let path = entry.path()?.to_string_lossy().trim_start_matches("./").to_owned();
            if path.contains('/') {
                continue;
            }
            if !unpacked.wanted.contains(&path) {
                if path.ends_with(".wasm") && unpacked.other_wasm.len() < MAX_OTHER_NAMES {
                    unpacked.other_wasm.insert(crate::gate::clip_to(&path, 128).into_owned());
                }
                continue;
            }
            anyhow::ensure!(
                entry.header().size()? <= MAX_LAYER as u64,
                "{} is larger than a backend may be ({MAX_LAYER} bytes)",
                crate::gate::clip(&path)
            );
            let mut buf = Vec::new();
            entry.read_to_end(&mut buf)?;
            into.insert(path, buf);
        }
        Ok(())
    })();
    unpacked.left = limited.limit();
    if unpacked.left == 0 {
        anyhow::bail!("the image's layers unpack to more than {MAX_UNPACKED} bytes together");
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use oci_client::errors::DigestError;

    /// A gzip layer of `files` (name, size in zero bytes).
    fn layer(files: &[(&str, usize)]) -> Vec<u8> {
        let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        let mut tar = tar::Builder::new(gz);
        for (name, size) in files {
            let mut h = tar::Header::new_gnu();
            h.set_size(*size as u64);
            h.set_mode(0o644);
            h.set_cksum();
            tar.append_data(&mut h, name, std::io::repeat(0).take(*size as u64)).unwrap();
        }
        tar.into_inner().unwrap().finish().unwrap()
    }

    /// Issue 41: six small gzip layers, each unpacking to hundreds of MiB of `.wasm` files it
    /// does not use, took `devplug pull` to 1.5 GiB: every root `.wasm` was kept, each layer
    /// capped on its own. Now one budget covers all layers and only the wanted files are kept.
    #[test]
    fn unpacking_is_bounded_across_layers_and_keeps_only_what_it_uses() {
        let bomb = layer(&[("decoy-a.wasm", 400 << 10), ("b.wasm", 1000), ("b.toml", 10), ("decoy-b.wasm", 400 << 10)]);
        assert!(bomb.len() < 16 << 10, "{} bytes compressed", bomb.len());
        let wanted =
            || Unpacked { wanted: ["b.wasm".into(), "b.toml".into()], left: 1 << 20, other_wasm: Default::default() };
        let mut u = wanted();
        let mut files = BTreeMap::new();
        untar(&bomb, true, &mut u, &mut files).unwrap();
        assert_eq!(files.keys().collect::<Vec<_>>(), ["b.toml", "b.wasm"], "only the files it uses are kept");
        assert_eq!(u.other_wasm.iter().collect::<Vec<_>>(), ["decoy-a.wasm", "decoy-b.wasm"]);
        // The second layer finds the budget spent by the first: refused, not unpacked.
        let e = untar(&bomb, true, &mut u, &mut files).unwrap_err().to_string();
        assert!(e.contains("unpack to more than"), "{e}");
    }

    #[test]
    fn a_digest_mismatch_is_told_apart_from_a_network_failure() {
        let mismatch = OciDistributionError::DigestError(DigestError::VerificationError {
            expected: "sha256:aa".into(),
            actual: "sha256:bb".into(),
        });
        assert!(is_digest_mismatch(&anyhow::Error::new(mismatch).context("r.io/x@sha256:aa: blob sha256:aa")));
        let down = OciDistributionError::ServerError { code: 503, url: "http://r.io".into(), message: "busy".into() };
        assert!(!is_digest_mismatch(&anyhow::Error::new(down).context("r.io/x:1")));
        assert!(!is_digest_mismatch(&anyhow::anyhow!("digest expected sha256:aa")), "words are not the error");
    }
}
