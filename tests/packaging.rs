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

/// A tool the suite's setup (`./scripts/test`) installs; a test that needs it fails loudly
/// without it rather than passing.
fn tool(name: &str) -> PathBuf {
    let installed = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/devplug-tools/bin"));
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain(installed)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("`{name}` is not on PATH: run the suite with ./scripts/test, which installs it"))
}

/// `kubernetes-validate --strict -k VERSION file`: (passed, output).
fn validate(file: &Path, version: &str) -> (bool, String) {
    let out = Command::new(tool("kubernetes-validate")).args(["--strict", "-k", version]).arg(file).output().unwrap();
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_owned()
}

#[test]
fn deploy_manifests_and_the_rendered_chart_validate_against_the_kubernetes_schema() {
    // 1.35: the first release with image volumes on by default.
    const K8S: &str = "1.35.0";
    let dir = repo().join("deploy/kubernetes");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.path()).collect();
    files.sort();
    assert_eq!(files.len(), 2, "{files:?}");
    for f in &files {
        let (ok, out) = validate(f, K8S);
        assert!(ok && out.contains("passed for resource daemonset/devplug"), "{}:\n{out}", f.display());
        // A slow first load must not meet the liveness probe (issue 28).
        assert!(std::fs::read_to_string(f).unwrap().contains("startupProbe:"), "{}: no startupProbe", f.display());
    }
    // The schema is not a rubber stamp: before image volumes existed, the same DaemonSet fails.
    let (ok, out) = validate(&dir.join("devplug.yaml"), "1.30.0");
    assert!(!ok && out.contains("'image' was unexpected"), "{out}");

    let rendered = tempfile::tempdir().unwrap();
    for (name, sets) in [
        ("default", vec![]),
        ("init-container", vec!["backends.imageVolume=false"]),
        ("no-backends", vec!["backends.enabled=false", "metrics.service.enabled=false"]),
        ("service-monitor", vec!["metrics.serviceMonitor.enabled=true", "nodeSelector.gpu=true"]),
        ("registry", vec!["cache.hostPath=/var/lib/devplug/cache"]),
        ("dra", vec!["dra.resources.devplug\\.io/fuse=generic", "dra.resources.nvidia\\.com/gpu=gpu"]),
    ] {
        let mut cmd = Command::new(tool("helm"));
        cmd.args(["template", "devplug"]).arg(repo().join("deploy/helm/devplug")).args(["--namespace", "devplug"]);
        if name == "registry" {
            let values = rendered.path().join("registry-values.yaml");
            std::fs::write(
                &values,
                "registry:\n  sources:\n    acme: registry.example.com/acme/devplug-backend:1.2\n  grants:\n    acme: '{ dev = [\"acme*\"], resources = [\"acme.com/*\"] }'\n  pullSecret: regcred\n  publicKey: |\n    -----BEGIN PUBLIC KEY-----\n    MFkw\n    -----END PUBLIC KEY-----\n  plainHTTP: [\"mirror.local:5000\"]\n",
            )
            .unwrap();
            cmd.arg("--values").arg(&values);
        }
        for s in &sets {
            cmd.args(["--set", s]);
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "helm template ({name}): {}", String::from_utf8_lossy(&out.stderr));
        let yaml = String::from_utf8(out.stdout).unwrap();
        let f = rendered.path().join(format!("{name}.yaml"));
        std::fs::write(&f, &yaml).unwrap();
        let (ok, report) = validate(&f, K8S);
        assert!(ok && report.contains("passed for resource daemonset/devplug"), "chart ({name}):\n{report}\n{yaml}");
        assert!(yaml.contains("startupProbe:"), "chart ({name}): no startupProbe");
        match name {
            "init-container" => assert!(yaml.contains("initContainers:") && !yaml.contains("reference:"), "{yaml}"),
            "no-backends" => assert!(!yaml.contains("/backends") && !yaml.contains("kind: Service\n"), "{yaml}"),
            "dra" => {
                // RBAC, the node's name, the plugins dir, a token; the class `devplug dra
                // deviceclasses` prints; and devplug.toml serving the resource through DRA.
                for want in [
                    "kind: ClusterRole\n",
                    "resources: [\"resourceslices\"]",
                    "fieldPath: spec.nodeName",
                    "/var/lib/kubelet/plugins\n",
                    "automountServiceAccountToken: true",
                    "kind: DeviceClass",
                    "name: fuse.devplug.io",
                    // Never the class NVIDIA's own DRA driver installs (gpu.nvidia.com).
                    "name: gpu.nvidia.com.devplug.io",
                    "extendedResourceName: \"devplug.io/fuse\"",
                    "device.attributes[\\\"generic.devplug.io\\\"].resource == \\\"devplug.io/fuse\\\"",
                ] {
                    assert!(yaml.contains(want), "chart (dra): no {want:?}\n{yaml}");
                }
                let text = block_scalar(&yaml, "devplug.toml");
                let cfg = devplug::config::Config::parse(&text).unwrap_or_else(|e| panic!("{e:#}\n{text}"));
                assert_eq!(cfg.api("devplug.io/fuse"), devplug::config::Api::Dra);
            }
            "service-monitor" => {
                assert!(yaml.contains("kind: ServiceMonitor") && yaml.contains("\"gpu\": \"true\""), "{yaml}")
            }
            "registry" => {
                // The rendered devplug.toml is TOML devplug reads, with the source, its grant and
                // the policy; the pull secret and the cache are mounted.
                let text = block_scalar(&yaml, "devplug.toml");
                let cfg: toml::Value = toml::from_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
                assert_eq!(
                    cfg["backends"]["acme"]["image"].as_str(),
                    Some("registry.example.com/acme/devplug-backend:1.2")
                );
                assert_eq!(cfg["backends"]["acme"]["grant"]["resources"][0].as_str(), Some("acme.com/*"));
                assert_eq!(cfg["registry"]["public_key"].as_str(), Some("/etc/devplug/cosign.pub"));
                assert_eq!(cfg["registry"]["plain_http"][0].as_str(), Some("mirror.local:5000"));
                assert!(block_scalar(&yaml, "cosign.pub").contains("BEGIN PUBLIC KEY"));
                assert!(
                    yaml.contains("secretName: regcred") && yaml.contains("path: /var/lib/devplug/cache"),
                    "{yaml}"
                );
            }
            _ => assert!(yaml.contains("reference: ghcr.io/devplug/backends"), "{yaml}"),
        }
    }
}

/// The text of a ConfigMap's `key: |` block (its lines indented one level deeper than the key).
fn block_scalar(yaml: &str, key: &str) -> String {
    let mut lines = yaml.lines().skip_while(|l| l.trim() != format!("{key}: |"));
    let head = lines.next().unwrap_or_else(|| panic!("no {key} in\n{yaml}"));
    let indent = head.len() - head.trim_start().len() + 2;
    lines
        .take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() >= indent)
        .map(|l| l.get(indent..).unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Removes the test's container however the test ends.
struct Container<'a>(&'a support::podman::Podman, String);

impl Drop for Container<'_> {
    fn drop(&mut self) {
        let _ = self.0.tool("podman").args(["rm", "-f", "-t", "0", &self.1]).output();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_image_serves_kubelet_with_the_packed_backends_mounted_as_an_image() {
    use support::fixtures::Machine;
    let podman = tokio::task::spawn_blocking(support::podman::Podman::new).await.unwrap();
    let work = tempfile::tempdir().unwrap();
    let s = |p: &Path| p.display().to_string();

    // The host image, from deploy/Containerfile, with buildah and no registry.
    let ctx = work.path().join("ctx");
    let st = Command::new(repo().join("deploy/image-context.sh")).arg(&ctx).arg(support::binary::BIN).output().unwrap();
    assert!(st.status.success(), "image-context.sh: {}", String::from_utf8_lossy(&st.stderr));
    let containerfile = s(&repo().join("deploy/Containerfile"));
    let tag = format!("localhost/devplug-host:e2e-{}", std::process::id());
    podman.ok("buildah", &["bud", "--isolation", "chroot", "-f", &containerfile, "-t", &tag, &s(&ctx)]);

    // The backends image, from `devplug pack`, loaded as a registry would deliver it.
    let (_src, wasm, _) = backend_dir();
    let archive = work.path().join("backends.tar");
    let (code, _, err) = run(&["pack", "--tar", &s(&archive), "--tag", "e2e", &s(&wasm)]);
    assert_eq!(code, 0, "{err}");
    let pulled = podman.ok("podman", &["pull", "-q", &format!("oci-archive:{}", s(&archive))]);
    let backends_image = format!("localhost/devplug-backends:e2e-{}", std::process::id());
    podman.ok("podman", &["tag", pulled.trim(), &backends_image]);

    // Run it as the DaemonSet does: read-only root, no capabilities, the backends image mounted
    // read-only at /backends, kubelet's dir and a fixture machine bind-mounted.
    let kdir = work.path().join("device-plugins");
    std::fs::create_dir_all(&kdir).unwrap();
    let kubelet = support::kubelet::Kubelet::start(&kdir).await;
    let m = Machine::generic_box();
    let name = format!("devplug-e2e-{}", std::process::id());
    let image_mount = format!("type=image,source={backends_image},destination=/backends");
    let kubelet_mount = format!("{}:/var/lib/kubelet/device-plugins", s(&kdir));
    let machine_mount = format!("{}:/machine:ro", s(m.root()));
    let _guard = Container(&podman, name.clone());
    podman.ok(
        "podman",
        &[
            "run",
            "-d",
            "--name",
            &name,
            "--network",
            "none",
            "--read-only",
            "--cap-drop",
            "ALL",
            "--security-opt",
            "no-new-privileges",
            "--mount",
            &image_mount,
            "-v",
            &kubelet_mount,
            "-v",
            &machine_mount,
            "--tmpfs",
            "/var/run/cdi",
            &tag,
            "run",
            "--backends",
            "/backends",
            "--no-embedded",
            "--default-grant",
            "requested",
            "--registration",
            "kubelet-socket",
            "--sysfs-root",
            "/machine/sys",
            "--dev-root",
            "/machine/dev",
            "--dev-fixtures",
            "--poll-interval",
            "200ms",
        ],
    );
    let plugin = kubelet
        .wait_registered(support::daemon::WIDGET, 1, std::time::Duration::from_secs(30))
        .await
        .unwrap_or_else(|e| {
            let log = podman.tool("podman").args(["logs", &name]).output().unwrap();
            panic!("{e}\ncontainer log:\n{}", support::podman::text(&log))
        });
    let req = devplug_standins::proto::deviceplugin::AllocateRequest {
        container_requests: vec![devplug_standins::proto::deviceplugin::ContainerAllocateRequest {
            devices_ids: vec!["widget-2".into()],
        }],
    };
    let resp = plugin.client.clone().allocate(req).await.unwrap().into_inner();
    assert_eq!(resp.container_responses[0].envs["CHAOS_IDS"], "widget-2");
    let log = support::podman::text(&podman.tool("podman").args(["logs", &name]).output().unwrap());
    assert!(log.contains("origin=/backends/chaos.wasm"), "the backend came from the image volume:\n{log}");
}
