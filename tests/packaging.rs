//! Shipping backends: `devplug pack` writes OCI images that skopeo (and so registries and
//! image volumes) accept, with right digests and media types and the backends at the image root;
//! and every manifest under `deploy/` validates against the Kubernetes OpenAPI schema.

use devplug_test_support as support;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};
use support::binary::run;
use support::chart::{repo, tool};
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

/// `kubernetes-validate --strict -k VERSION file`: (passed, output).
fn validate(file: &Path, version: &str) -> (bool, String) {
    let out = Command::new(tool("kubernetes-validate")).args(["--strict", "-k", version]).arg(file).output().unwrap();
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

#[test]
fn deploy_manifests_and_the_rendered_chart_validate_against_the_kubernetes_schema() {
    // 1.35: the first release with image volumes on by default.
    const K8S: &str = "1.35.0";
    let dir = repo().join("deploy/kubernetes");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.path()).collect();
    files.sort();
    assert_eq!(files.len(), 3, "{files:?}");
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
                "registry:\n  sources:\n    acme: registry.example.com/acme/devplug-backend:1.2\n  grants:\n    acme: '{ dev = [\"acme*\"], resources = [\"acme.com/*\"] }'\n  pullSecret: regcred\n  publicKey: |\n    -----BEGIN PUBLIC KEY-----\n    MFkw\n    -----END PUBLIC KEY-----\n  operatorKey: |\n    -----BEGIN PUBLIC KEY-----\n    MFko\n    -----END PUBLIC KEY-----\n  plainHTTP: [\"mirror.local:5000\"]\n",
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
                assert_eq!(cfg["registry"]["operator_key"].as_str(), Some("/etc/devplug/operator.pub"));
                assert!(block_scalar(&yaml, "operator.pub").contains("MFko"), "the operator's key is its own file");
                assert!(
                    yaml.contains("secretName: regcred") && yaml.contains("path: /var/lib/devplug/cache"),
                    "{yaml}"
                );
            }
            _ => assert!(yaml.contains("reference: ghcr.io/devplug/backends"), "{yaml}"),
        }
    }
}

/// Issue 62: the chart and both manifests mounted the host's `/dev` read-only at `/dev`, where
/// kubelet puts the default `terminationMessagePath` (`/dev/termination-log`): runc could not
/// create it and the container never started. Every pod spec devplug ships leaves `/dev` to the
/// runtime (the host's is mounted elsewhere and named by `--dev-root`), and runs this release.
#[test]
fn every_shipped_pod_spec_leaves_dev_to_the_runtime_and_runs_this_release() {
    let version = env!("CARGO_PKG_VERSION");
    let chart = std::fs::read_to_string(repo().join("deploy/helm/devplug/Chart.yaml")).unwrap();
    assert!(
        chart.contains(&format!("appVersion: \"{version}\"")),
        "the chart's appVersion is the release {version}:\n{chart}"
    );
    let mut specs: Vec<(String, Vec<serde_json::Value>)> = Vec::new();
    for f in ["devplug.yaml", "devplug-no-image-volume.yaml", "devplug-dra.yaml"] {
        let text = std::fs::read_to_string(repo().join("deploy/kubernetes").join(f)).unwrap();
        specs.push((f.to_owned(), support::chart::objects(&text)));
    }
    for sets in [&[][..], &["backends.imageVolume=false"][..], &["dra.resources.devplug\\.io/fuse=generic"][..]] {
        specs.push((format!("chart {sets:?}"), support::chart::render(sets)));
    }
    for (name, objects) in &specs {
        let pod = &support::chart::find(objects, "DaemonSet", None)["spec"]["template"]["spec"];
        let host_dev = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["hostPath"]["path"] == "/dev")
            .expect("the host's /dev");
        for c in
            pod["containers"].as_array().unwrap().iter().chain(pod["initContainers"].as_array().into_iter().flatten())
        {
            let message = c["terminationMessagePath"].as_str().unwrap_or("/dev/termination-log");
            for m in c["volumeMounts"].as_array().into_iter().flatten() {
                let at = m["mountPath"].as_str().unwrap();
                assert!(
                    !(message == at || message.starts_with(&format!("{}/", at.trim_end_matches('/')))),
                    "{name}: {} mounts {at} over its termination message path {message}",
                    c["name"]
                );
                if m["name"] == host_dev["name"] {
                    let arg = format!("--dev-root={at}");
                    assert!(
                        c["args"].as_array().unwrap().iter().any(|a| a == &serde_json::json!(arg)),
                        "{name}: devplug is told where the host's /dev is ({arg})"
                    );
                }
            }
            if c["name"] == "devplug" {
                let image = c["image"].as_str().unwrap();
                assert!(image.ends_with(&format!(":{version}")), "{name}: the host image is this release: {image}");
                let env: Vec<&str> =
                    c["env"].as_array().into_iter().flatten().filter_map(|e| e["name"].as_str()).collect();
                assert!(
                    env.contains(&"POD_NAME") && env.contains(&"POD_NAMESPACE"),
                    "{name}: the lock holder is named by its pod: {env:?}"
                );
            }
        }
    }
}

/// Issue 59: the plain manifests carry DRA too, and say no more nor less than the chart: the
/// DRA variant is the chart rendered with one resource served through DRA (plus its Namespace),
/// so its RBAC and policy are the ones the least-privilege tests exercise.
#[test]
fn the_plain_dra_manifest_is_what_the_chart_renders() {
    let text = std::fs::read_to_string(repo().join("deploy/kubernetes/devplug-dra.yaml")).unwrap();
    let mut plain = support::chart::objects(&text);
    assert_eq!(plain.remove(0)["kind"], "Namespace");
    let rendered = support::chart::render(&["dra.resources.devplug\\.io/fuse=generic"]);
    assert!(
        plain == rendered,
        "deploy/kubernetes/devplug-dra.yaml is not what the chart renders: generate it again (its header says how)"
    );
    for kind in [
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "DeviceClass",
        "DaemonSet",
    ] {
        support::chart::find(&plain, kind, None);
    }
    // Least privilege, as the chart states it: no wildcard, no arbitrary-node, no verb devplug
    // does not use, and the status of claims only for its own drivers.
    let rules = support::chart::rbac_rules(&plain);
    for r in &rules {
        for list in [&r.verbs, &r.resources, &r.api_groups] {
            assert!(!list.iter().any(|v| v == "*"), "{r:?}");
        }
        assert!(
            !r.verbs.iter().any(|v| v.starts_with("arbitrary-node:")
                || v == "deletecollection"
                || v == "patch" && r.resources != ["resourceclaims/status"]),
            "{r:?}"
        );
    }
    let driver_rule =
        rules.iter().find(|r| r.resources == ["resourceclaims/driver"]).expect("the granular status rule");
    assert_eq!(
        (driver_rule.verbs.as_slice(), driver_rule.resource_names.as_slice()),
        (&["associated-node:patch".to_owned()][..], &["generic.devplug.io".to_owned()][..])
    );
    let policy = support::chart::slice_policy(&plain);
    assert_eq!(
        (policy.username.as_str(), policy.drivers.as_slice()),
        ("system:serviceaccount:devplug:devplug", &["generic.devplug.io".to_owned()][..])
    );
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

/// The host image from deploy/Containerfile (buildah, no registry) and a backends image of
/// chaos from `devplug pack` (loaded as a registry would deliver it), named `…:e2e-<test>`.
fn images(podman: &support::podman::Podman, work: &Path, test: &str) -> (String, String) {
    let s = |p: &Path| p.display().to_string();
    let ctx = work.join("ctx");
    let st = Command::new(repo().join("deploy/image-context.sh")).arg(&ctx).arg(support::binary::BIN).output().unwrap();
    assert!(st.status.success(), "image-context.sh: {}", String::from_utf8_lossy(&st.stderr));
    let containerfile = s(&repo().join("deploy/Containerfile"));
    let tag = format!("localhost/devplug-host:e2e-{test}-{}", std::process::id());
    podman.ok("buildah", &["bud", "--isolation", "chroot", "-f", &containerfile, "-t", &tag, &s(&ctx)]);
    let (_src, wasm, _) = backend_dir();
    let archive = work.join("backends.tar");
    let (code, _, err) = run(&["pack", "--tar", &s(&archive), "--tag", "e2e", &s(&wasm)]);
    assert_eq!(code, 0, "{err}");
    let pulled = podman.ok("podman", &["pull", "-q", &format!("oci-archive:{}", s(&archive))]);
    let backends_image = format!("localhost/devplug-backends:e2e-{test}-{}", std::process::id());
    podman.ok("podman", &["tag", pulled.trim(), &backends_image]);
    (tag, backends_image)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_image_serves_kubelet_with_the_packed_backends_mounted_as_an_image() {
    use support::fixtures::Machine;
    let podman = tokio::task::spawn_blocking(support::podman::Podman::new).await.unwrap();
    let work = tempfile::tempdir().unwrap();
    let s = |p: &Path| p.display().to_string();
    let (tag, backends_image) = images(&podman, work.path(), "image");

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

/// How kubelet and containerd start the devplug container of a rendered pod spec, on podman's
/// runc: every volume mount at its path with its `readOnly` (a hostPath `/dev` or `/sys` is the
/// host's own, read-only; any other hostPath a private directory of the test's; a ConfigMap its
/// files; an emptyDir a `0777` directory, as kubelet makes it; an image volume the image), the
/// termination message file kubelet bind-mounts at `terminationMessagePath` (default
/// `/dev/termination-log`), the container's args and env (downward API values filled in),
/// `readOnlyRootFilesystem` without podman's extra tmpfs mounts, `capabilities.drop`,
/// `allowPrivilegeEscalation`, `runAsUser`. The network is the container's own (hostNetwork
/// would share the test machine's ports). Returns `podman run -d`'s output.
fn run_as_kubelet(
    podman: &support::podman::Podman,
    objects: &[serde_json::Value],
    host: &Path,
    image: &str,
    backends_image: &str,
    name: &str,
) -> std::process::Output {
    let pod = &support::chart::find(objects, "DaemonSet", None)["spec"]["template"]["spec"];
    let c = pod["containers"].as_array().unwrap().iter().find(|c| c["name"] == "devplug").unwrap();
    let mut args: Vec<String> =
        vec!["run".into(), "-d".into(), "--name".into(), name.into(), "--network".into(), "none".into()];
    let sc = &c["securityContext"];
    if sc["readOnlyRootFilesystem"] == true {
        args.extend(["--read-only".into(), "--read-only-tmpfs=false".into()]);
    }
    if sc["allowPrivilegeEscalation"] == false {
        args.extend(["--security-opt".into(), "no-new-privileges".into()]);
    }
    for cap in sc["capabilities"]["drop"].as_array().into_iter().flatten() {
        args.extend(["--cap-drop".into(), cap.as_str().unwrap().into()]);
    }
    if let Some(uid) = sc["runAsUser"].as_i64() {
        args.extend(["--user".into(), uid.to_string()]);
    }
    for e in c["env"].as_array().into_iter().flatten() {
        let value = match e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
            Some("metadata.name") => "devplug-e2e".to_owned(),
            Some("metadata.namespace") => "devplug".to_owned(),
            Some("spec.nodeName") => "node-a".to_owned(),
            _ => e["value"].as_str().unwrap_or_default().to_owned(),
        };
        args.extend(["--env".into(), format!("{}={value}", e["name"].as_str().unwrap())]);
    }
    for m in c["volumeMounts"].as_array().unwrap() {
        let at = m["mountPath"].as_str().unwrap();
        let ro = m["readOnly"] == true;
        let v = pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == m["name"]).unwrap();
        let source = if let Some(path) = v["hostPath"]["path"].as_str() {
            // The host's /dev and /sys, and kubelet's dirs where the chart was told they are
            // (`kubeletDir`: kubelet and devplug then name its sockets by the same paths).
            if path == "/dev" || path == "/sys" || Path::new(path).starts_with(host) {
                PathBuf::from(path)
            } else {
                host.join(path.trim_start_matches('/'))
            }
        } else if let Some(cm) = v["configMap"]["name"].as_str() {
            let data = &support::chart::find(objects, "ConfigMap", Some(cm))["data"];
            let dir = host.join("configmaps").join(cm);
            std::fs::create_dir_all(&dir).unwrap();
            for (k, text) in data.as_object().unwrap() {
                std::fs::write(dir.join(k), text.as_str().unwrap()).unwrap();
            }
            dir
        } else if v.get("emptyDir").is_some() {
            use std::os::unix::fs::PermissionsExt;
            let dir = host.join("emptydir").join(v["name"].as_str().unwrap());
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
            dir
        } else if v.get("image").is_some() {
            args.extend(["--mount".into(), format!("type=image,source={backends_image},destination={at}")]);
            continue;
        } else {
            panic!("a volume kind this emulation does not know: {v}");
        };
        std::fs::create_dir_all(&source).unwrap();
        args.extend(["-v".into(), format!("{}:{at}{}", source.display(), if ro { ":ro" } else { "" })]);
    }
    // Kubelet makes the termination message file in the pod's directory and mounts it.
    let message = host.join("termination-log");
    std::fs::write(&message, b"").unwrap();
    let message_path = c["terminationMessagePath"].as_str().unwrap_or("/dev/termination-log");
    args.extend(["-v".into(), format!("{}:{message_path}", message.display())]);
    args.push(image.into());
    args.extend(c["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_owned()));
    podman.tool("podman").args(&args).output().unwrap()
}

/// Issue 62: the chart's pod never started on a real kubelet and containerd (the host's `/dev`
/// read-only over the container's, where the termination message file goes). The chart's
/// default pod spec, started as kubelet would start it on runc: it runs, loads the embedded
/// backends and the image volume's, uses its emptyDir cache, and registers with kubelet's
/// plugin watcher (the kubelet stand-in, in the host dirs the spec mounts). The
/// same spec with the host's `/dev` at `/dev` fails as it failed on the real cluster, so the
/// emulation is no more forgiving than kubelet there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_charts_pod_spec_starts_as_kubelet_starts_it() {
    let podman = tokio::task::spawn_blocking(support::podman::Podman::new).await.unwrap();
    let work = tempfile::tempdir().unwrap();
    let (image, backends_image) = images(&podman, work.path(), "pod");
    // The chart's defaults, but the image volume's backend granted what it requests (so it has
    // devices to register) and kubelet's dirs in the test's own place (`kubeletDir`, as for a
    // kubelet with another root dir), where the kubelet stand-in serves.
    let host = work.path().join("host");
    let kubelet_root = host.join("var/lib/kubelet");
    let objects = support::chart::render(&[
        "config=default_grant = \"requested\"",
        &format!("kubeletDir={}", kubelet_root.display()),
    ]);

    // The spec as it was: refused by the runtime, as on the real cluster.
    let mut old = objects.clone();
    for o in old.iter_mut().filter(|o| o["kind"] == "DaemonSet") {
        for m in o["spec"]["template"]["spec"]["containers"][0]["volumeMounts"].as_array_mut().unwrap() {
            if m["name"] == "dev" {
                m["mountPath"] = serde_json::json!("/dev");
            }
        }
    }
    let old_name = format!("devplug-e2e-old-{}", std::process::id());
    let _old_guard = Container(&podman, old_name.clone());
    let out = run_as_kubelet(&podman, &old, &work.path().join("old-host"), &image, &backends_image, &old_name);
    let said = support::podman::text(&out);
    assert!(
        !out.status.success() && said.contains("read-only file system"),
        "the old layout must fail to start:\n{said}"
    );

    // The chart as shipped.
    let kdir = kubelet_root.join("device-plugins");
    let registry = kubelet_root.join("plugins_registry");
    std::fs::create_dir_all(&kdir).unwrap();
    std::fs::create_dir_all(&registry).unwrap();
    let kubelet = support::kubelet::Kubelet::start_with_watcher(&kdir, &registry).await;
    let name = format!("devplug-e2e-pod-{}", std::process::id());
    let _guard = Container(&podman, name.clone());
    let out = run_as_kubelet(&podman, &objects, &host, &image, &backends_image, &name);
    assert!(out.status.success(), "the chart's pod spec must start:\n{}", support::podman::text(&out));
    let logs = || support::podman::text(&podman.tool("podman").args(["logs", &name]).output().unwrap());
    let end = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !logs().contains("backends loaded") {
        let state = podman.ok("podman", &["inspect", "-f", "{{.State.Status}}", &name]);
        assert!(
            state.trim() == "running" && std::time::Instant::now() < end,
            "devplug did not load its backends ({state}):\n{}",
            logs()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let log = logs();
    assert!(log.contains("origin=/backends/chaos.wasm"), "the image volume's backend loaded:\n{log}");
    assert!(!log.contains("compile cache refused"), "the emptyDir cache is used:\n{log}");
    let cache = host.join("emptydir/cache/devplug");
    assert!(
        std::fs::read_dir(&cache).map(|d| d.count() > 0).unwrap_or(false),
        "compiled code kept in {}:\n{log}",
        cache.display()
    );
    // It registers through kubelet's plugin watcher, from the socket dirs kubelet shares.
    let plugin = kubelet.wait_registered(support::daemon::WIDGET, 1, std::time::Duration::from_secs(60)).await;
    plugin.unwrap_or_else(|e| panic!("{e}\n{}", logs()));
}
