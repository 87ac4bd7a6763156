//! `devplug pack`: backends into an OCI image layout (or an `oci-archive` tar), one layer that
//! puts every `.wasm` and its manifest at the image root, so a Kubernetes image volume (or
//! `podman --mount type=image`) mounted at `/backends` shows them where `devplug run
//! --backends /backends` looks.
//!
//! The layer is reproducible (sorted entries, zero mtimes and owners), so the same backends give
//! the same digests. Media types and digests follow the OCI image spec: the layer is
//! `application/vnd.oci.image.layer.v1.tar+gzip` with the uncompressed tar's digest as its
//! `diff_id` in the config.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde_json::json;
use sha2::{Digest, Sha256};

const INDEX: &str = "application/vnd.oci.image.index.v1+json";
const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const LAYER: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// What goes into the image: name in the image → bytes.
pub struct Contents {
    pub files: Vec<(String, Vec<u8>)>,
}

impl Contents {
    /// `.wasm` files, each with its manifest: the `.toml` argument right after it (stored as
    /// `NAME.toml`, whatever its file is called: `devplug run` looks for `NAME.toml` beside
    /// `NAME.wasm`), else `NAME.toml` beside it when there is one. Every component must be a
    /// devplug backend this host loads, and a manifest that names a backend must name this one.
    pub fn collect(paths: &[PathBuf]) -> anyhow::Result<Contents> {
        let mut files: Vec<(String, Vec<u8>)> = Vec::new();
        let mut add = |name: String, bytes: Vec<u8>| -> anyhow::Result<()> {
            anyhow::ensure!(!files.iter().any(|(n, _)| *n == name), "{name} is given twice");
            files.push((name, bytes));
            Ok(())
        };
        let is_toml = |p: &PathBuf| p.extension().is_some_and(|e| e == "toml");
        let mut i = 0;
        while i < paths.len() {
            let p = &paths[i];
            match p.extension().and_then(|e| e.to_str()) {
                Some("wasm") => {
                    let bytes = std::fs::read(p).with_context(|| format!("{}", p.display()))?;
                    crate::cli::inspect::inspect_bytes(&bytes)
                        .with_context(|| format!("{} is not a loadable backend", p.display()))?;
                    let name = file_name(p)?;
                    let stem = name.trim_end_matches(".wasm").to_owned();
                    add(name, bytes)?;
                    let manifest = match paths.get(i + 1).filter(|m| is_toml(m)) {
                        Some(m) => {
                            i += 1;
                            Some(m.clone())
                        }
                        None => Some(p.with_extension("toml")).filter(|b| b.exists()),
                    };
                    match manifest {
                        Some(m) => add(format!("{stem}.toml"), checked_manifest(&m, &stem)?.into_bytes())?,
                        None => tracing::warn!(
                            "{} has no manifest (NAME.toml beside it, or a .toml right after it): it will get no capabilities",
                            p.display()
                        ),
                    }
                }
                Some("toml") => anyhow::bail!(
                    "{}: a manifest goes right after the .wasm it belongs to (devplug pack NAME.wasm MANIFEST.toml)",
                    p.display()
                ),
                _ => anyhow::bail!("{}: give .wasm backends, each followed by its .toml manifest", p.display()),
            }
            i += 1;
        }
        anyhow::ensure!(files.iter().any(|(n, _)| n.ends_with(".wasm")), "no .wasm backend given");
        files.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(Contents { files })
    }
}

/// A manifest's text, checked: it parses, and any `name` in it is the backend's (its file stem
/// without a version), as `devplug run` will insist.
fn checked_manifest(path: &Path, stem: &str) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
    let m = crate::backends::Manifest::parse(&text)
        .map_err(|e| anyhow::anyhow!("{}: not a backend manifest: {e}", path.display()))?;
    let (base, _) = crate::backends::split_version(stem);
    if let Some(n) = m.name.as_deref().filter(|n| *n != base) {
        anyhow::bail!("{}: says name = {n:?}, but it is packed as the manifest of {stem}.wasm", path.display());
    }
    Ok(text)
}

fn file_name(p: &Path) -> anyhow::Result<String> {
    p.file_name()
        .and_then(|n| n.to_str())
        .map(str::to_owned)
        .ok_or_else(|| anyhow::anyhow!("{}: no file name", p.display()))
}

/// A regular file owned by root, mode 0644, mtime 0: the same input gives the same tar.
fn file_header(len: usize) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_size(len as u64);
    h.set_mode(0o644);
    h.set_mtime(0);
    h.set_uid(0);
    h.set_gid(0);
    h.set_entry_type(tar::EntryType::Regular);
    h
}

fn sha256(b: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(b)))
}

/// The OCI architecture name of the machine packing (wasm is the same everywhere, but image
/// volumes are pulled for the node's platform).
pub(crate) fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// An OCI image layout in memory: path in the layout → bytes.
pub struct Layout {
    pub entries: Vec<(String, Vec<u8>)>,
    pub manifest_digest: String,
}

/// Build the layout: one gzip layer, its config, a manifest, and `index.json` naming it `tag`.
pub fn layout(contents: &Contents, tag: &str, arch: &str) -> anyhow::Result<Layout> {
    let mut tar = tar::Builder::new(Vec::new());
    tar.mode(tar::HeaderMode::Deterministic);
    for (name, bytes) in &contents.files {
        tar.append_data(&mut file_header(bytes.len()), name, bytes.as_slice())?;
    }
    let raw = tar.into_inner()?;
    let mut gz = flate2::GzBuilder::new().mtime(0).write(Vec::new(), flate2::Compression::default());
    gz.write_all(&raw)?;
    let layer = gz.finish()?;
    let config = serde_json::to_vec(&json!({
        "architecture": arch,
        "os": "linux",
        "config": {},
        "rootfs": { "type": "layers", "diff_ids": [sha256(&raw)] },
        "history": [{ "created_by": "devplug pack", "comment": "devplug backends" }],
    }))?;
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": { "mediaType": CONFIG, "digest": sha256(&config), "size": config.len() },
        "layers": [{ "mediaType": LAYER, "digest": sha256(&layer), "size": layer.len() }],
        "annotations": { "org.opencontainers.image.title": "devplug backends" },
    }))?;
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": INDEX,
        "manifests": [{
            "mediaType": MANIFEST,
            "digest": sha256(&manifest),
            "size": manifest.len(),
            "platform": { "architecture": arch, "os": "linux" },
            "annotations": { "org.opencontainers.image.ref.name": tag },
        }],
    }))?;
    let blob = |b: &[u8]| format!("blobs/sha256/{}", &sha256(b)["sha256:".len()..]);
    let manifest_digest = sha256(&manifest);
    let entries = vec![
        ("oci-layout".to_owned(), br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec()),
        ("index.json".to_owned(), index),
        (blob(&manifest), manifest),
        (blob(&config), config),
        (blob(&layer), layer),
    ];
    Ok(Layout { entries, manifest_digest })
}

impl Layout {
    /// Write the layout into `dir` (created; existing files of the same names replaced).
    pub fn write_dir(&self, dir: &Path) -> anyhow::Result<()> {
        for (path, bytes) in &self.entries {
            let p = dir.join(path);
            if let Some(parent) = p.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(&p, bytes).with_context(|| format!("{}", p.display()))?;
        }
        Ok(())
    }

    /// Write the layout as one tar file (the `oci-archive` format).
    pub fn write_tar(&self, file: &Path) -> anyhow::Result<()> {
        let mut tar = tar::Builder::new(std::fs::File::create(file).with_context(|| format!("{}", file.display()))?);
        tar.mode(tar::HeaderMode::Deterministic);
        for (path, bytes) in &self.entries {
            tar.append_data(&mut file_header(bytes.len()), path, bytes.as_slice())?;
        }
        tar.into_inner()?.sync_all()?;
        Ok(())
    }
}
