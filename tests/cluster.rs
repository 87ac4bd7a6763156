//! devplug deployed as a user deploys it, on a real single-node cluster (tests/support/cluster.rs:
//! kubelet, containerd with CDI, kube-apiserver with `Node,RBAC`, the controller-manager and the
//! scheduler, all built from source by scripts/kube-assets/build): the host image built by
//! `deploy/image-context.sh` + `buildah bud -f deploy/Containerfile`, a backend in an image volume
//! (`devplug pack` of the JavaScript example), `helm install` of the chart, then pods asking for
//! devices by every route a cluster offers, a rolling update under a stream of such pods, and a
//! kubelet restart under running ones; then the plain manifests in deploy/kubernetes/, as
//! shipped (their images are the test's builds under the names they give). Without the assets
//! it says in one line that it did not run.

use devplug_test_support as support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::cluster::{Cluster, NODE, PAUSE, pod};
use support::podman::Podman;

const TEST: &str = "the_chart_serves_pods_on_a_real_single_node_cluster";
const HOST_IMAGE: &str = "localhost/devplug-e2e/host:1";
const BACKENDS_IMAGE: &str = "localhost/devplug-e2e/backends:1";
const NS: &str = "e2e";
/// The names deploy/kubernetes/*.yaml give the images (the test's builds, tagged so).
const SHIPPED_HOST: &str = "ghcr.io/devplug/devplug:0.2.0";
const SHIPPED_BACKENDS: &str = "ghcr.io/devplug/backends:0.1.0";
const SHIPPED_FALLBACK: &str = "ghcr.io/devplug/backends-fallback:0.1.0";
const T: Duration = Duration::from_secs(180);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace").to_owned()
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

/// A device node's numbers as busybox `stat -c %t:%T` prints them (hex major:minor).
fn numbers(path: &str) -> String {
    use std::os::unix::fs::MetadataExt;
    let rdev = std::fs::metadata(path).unwrap_or_else(|e| panic!("{path}: {e}")).rdev();
    format!("{:x}:{:x}", nix::sys::stat::major(rdev), nix::sys::stat::minor(rdev))
}

/// The images the cluster runs, as one docker archive for `ctr images import`: the host image
/// (deploy/Containerfile over deploy/image-context.sh, no base image), the backends image
/// (`devplug pack` of the JavaScript example and its manifest), the sandboxes' pause image
/// (kubernetes' own build/pause/linux/pause.c from the assets' source tree, built static) and
/// the test pods' busybox.
fn images(podman: &Podman, work: &Path, assets: &Path) -> PathBuf {
    let ctx = work.join("ctx");
    let st = Command::new(repo().join("deploy/image-context.sh"))
        .arg(&ctx)
        .arg(support::binary::BIN)
        .output()
        .expect("image-context.sh");
    assert!(st.status.success(), "image-context.sh: {}", support::podman::text(&st));
    let containerfile = s(&repo().join("deploy/Containerfile"));
    podman.ok("buildah", &["bud", "--isolation", "chroot", "-f", &containerfile, "-t", HOST_IMAGE, &s(&ctx)]);

    let examples = support::examples::built();
    let packed = work.join("backends.tar");
    let (code, _, err) =
        support::binary::run(&["pack", "--tar", &s(&packed), "--tag", "e2e", &s(&examples.join("js-fusetun.wasm"))]);
    assert_eq!(code, 0, "devplug pack: {err}");
    let pulled = podman.ok("podman", &["pull", "-q", &format!("oci-archive:{}", s(&packed))]);
    podman.ok("podman", &["tag", pulled.trim(), BACKENDS_IMAGE]);
    podman.ok("podman", &["tag", HOST_IMAGE, SHIPPED_HOST]);
    podman.ok("podman", &["tag", BACKENDS_IMAGE, SHIPPED_BACKENDS]);
    // The fallback image for clusters without image volumes, from its Containerfile, over the
    // busybox the tests have (its FROM names Docker Hub's).
    let fallback = work.join("fallback");
    std::fs::create_dir_all(&fallback).expect("fallback context");
    for f in ["js-fusetun.wasm", "js-fusetun.toml"] {
        std::fs::copy(examples.join(f), fallback.join(f)).expect("copy the example");
    }
    let containerfile = repo().join("deploy/Containerfile.backends-fallback");
    let from = std::fs::read_to_string(&containerfile)
        .expect("Containerfile.backends-fallback")
        .lines()
        .find_map(|l| l.strip_prefix("FROM ").map(|f| f.trim().to_owned()))
        .expect("a FROM line");
    podman.ok("podman", &["tag", support::podman::IMAGE, &from]);
    podman.ok(
        "buildah",
        &[
            "bud",
            "--isolation",
            "chroot",
            "--pull=never",
            "-f",
            &s(&containerfile),
            "-t",
            SHIPPED_FALLBACK,
            &s(&fallback),
        ],
    );

    let pause_root = work.join("pause");
    std::fs::create_dir_all(&pause_root).expect("pause rootfs");
    let source = assets.join(support::cluster::PAUSE_SOURCE);
    let cc = Command::new("cc")
        .args(["-Os", "-static", "-DVERSION=devplug-e2e", "-o"])
        .arg(pause_root.join("pause"))
        .arg(&source)
        .output()
        .expect("cc");
    assert!(cc.status.success(), "building {}: {}", source.display(), support::podman::text(&cc));
    let tar = work.join("pause.tar");
    let st = Command::new("tar").arg("-C").arg(&pause_root).arg("-cf").arg(&tar).arg("pause").status().expect("tar");
    assert!(st.success(), "tar of the pause rootfs");
    podman.ok("podman", &["import", "--change", "ENTRYPOINT [\"/pause\"]", &s(&tar), PAUSE]);

    let archive = work.join("images.tar");
    podman.ok(
        "podman",
        &[
            "save",
            "--format",
            "docker-archive",
            "-m",
            "-o",
            &s(&archive),
            HOST_IMAGE,
            BACKENDS_IMAGE,
            SHIPPED_HOST,
            SHIPPED_BACKENDS,
            SHIPPED_FALLBACK,
            PAUSE,
            support::podman::IMAGE,
        ],
    );
    archive
}

/// `helm ARGS` against the cluster, with helm's own state in `work`.
fn helm(c: &Cluster, work: &Path, args: &[&str]) -> String {
    let out = Command::new(support::chart::tool("helm"))
        .args(args)
        .arg("--kubeconfig")
        .arg(c.admin_kubeconfig())
        .env("HELM_CACHE_HOME", work.join("helm/cache"))
        .env("HELM_CONFIG_HOME", work.join("helm/config"))
        .env("HELM_DATA_HOME", work.join("helm/data"))
        .output()
        .expect("run helm");
    assert!(out.status.success(), "helm {}:\n{}", args.join(" "), support::podman::text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// devplug's pods, as the API server has them.
async fn devplug_pods(c: &Cluster) -> Vec<Value> {
    c.get("/api/v1/namespaces/devplug/pods").await["items"].as_array().cloned().unwrap_or_default()
}

/// Each pod's name and status, for messages.
fn statuses(pods: &[Value]) -> Vec<String> {
    pods.iter().map(|p| format!("{}: {}", p["metadata"]["name"], p["status"])).collect()
}

fn ready(pod: &Value) -> bool {
    pod["status"]["conditions"].as_array().into_iter().flatten().any(|c| c["type"] == "Ready" && c["status"] == "True")
}

fn phase(pod: &Value) -> &str {
    pod["status"]["phase"].as_str().unwrap_or("")
}

/// What a finished pod's container wrote to its termination message.
fn message(pod: &Value) -> Option<String> {
    let state = &pod["status"]["containerStatuses"][0]["state"]["terminated"];
    state["message"].as_str().map(|m| m.trim().to_owned())
}

/// Wait until the node offers `count` of `resource` (kubelet's allocatable, from the plugin's list).
async fn wait_allocatable(c: &Cluster, resource: &str, count: &str) {
    let end = Instant::now() + T;
    loop {
        let node = c.get(&format!("/api/v1/nodes/{NODE}")).await;
        if node["status"]["allocatable"][resource] == count {
            return;
        }
        assert!(
            Instant::now() < end,
            "{resource} never allocatable ×{count}: {}\ndevplug:\n{}",
            node["status"]["allocatable"],
            devplug_log(c).await
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn devplug_log(c: &Cluster) -> String {
    let mut out = String::new();
    for p in devplug_pods(c).await {
        let name = p["metadata"]["name"].as_str().unwrap_or("");
        out.push_str(&format!("--- {name}\n{}", c.pod_log("devplug", name)));
    }
    out
}

/// A pod that checks `device` inside its container and ends, writing the node's numbers to its
/// termination message; `limits` and `extra` say how it asks for the device.
async fn run_checker(c: &Cluster, name: &str, device: &str, limits: BTreeMap<&str, &str>, extra: Value) {
    let script = format!("stat -c %t:%T {device} > /dev/termination-log");
    let spec = pod(name, support::podman::IMAGE, &script, limits, extra);
    c.create(&format!("/api/v1/namespaces/{NS}/pods"), &spec).await;
}

/// Wait until the checker pod `name` ended; it must have succeeded and seen `device`'s numbers.
async fn checked(c: &Cluster, name: &str, device: &str) -> Value {
    let pod = c.wait_pod(NS, name, T, |p| matches!(phase(p), "Succeeded" | "Failed").then(|| p.clone())).await;
    if phase(&pod) != "Succeeded" {
        let specs: Vec<String> = std::fs::read_dir(c.cdi_dir())
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| format!("{}: {}", e.path().display(), std::fs::read_to_string(e.path()).unwrap_or_default()))
            .collect();
        panic!(
            "{name} failed: {}\nits log:\n{}\nCDI specs: {specs:#?}\ncontainerd:\n{}\ndevplug:\n{}",
            pod["status"],
            c.pod_log(NS, name),
            c.tail("containerd"),
            devplug_log(c).await
        );
    }
    assert_eq!(message(&pod).as_deref(), Some(numbers(device).as_str()), "{name} saw another node as {device}");
    pod
}

fn limits(resource: &'static str) -> BTreeMap<&'static str, &'static str> {
    BTreeMap::from([(resource, "1")])
}

/// A claim for one `/dev/fuse` share from the chart's DeviceClass.
fn fuse_claim(name: &str) -> Value {
    json!({ "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": { "name": name },
        "spec": { "devices": { "requests": [{ "name": "fuse", "exactly": { "deviceClassName": "fuse.devplug.io" } }] } } })
}

fn with_claim(claim: &str) -> Value {
    json!({ "resourceClaims": [{ "name": "fuse", "resourceClaimName": claim }] })
}

/// The seconds of a klog line's time of day (`I1202 13:28:40.639885 …`).
fn klog_seconds(line: &str) -> Option<f64> {
    let time = line.split_whitespace().nth(1)?;
    let mut parts = time.split(':');
    let (h, m, s): (f64, f64, f64) =
        (parts.next()?.parse().ok()?, parts.next()?.parse().ok()?, parts.next()?.parse().ok()?);
    Some(h * 3600.0 + m * 60.0 + s)
}

/// The lines of kubelet's log (first, last) from its first word that `resource`'s plugin went
/// (disconnected or deregistered) to its next registration of it.
fn handover_window(log: &str, resource: &str) -> Option<(usize, usize)> {
    let lines: Vec<&str> = log.lines().collect();
    let gone = lines.iter().position(|l| {
        (l.contains("\"Device plugin disconnected\"") || l.contains("\"Deregistering plugin\""))
            && l.contains(&format!("\"{resource}\""))
    })?;
    let back = lines[gone..]
        .iter()
        .position(|l| l.contains("\"Registered client\"") && l.contains(&format!("name=\"{resource}\"")))?;
    Some((gone, gone + back))
}

/// How long kubelet was without `resource`'s plugin in a handover ([`handover_window`]), in s.
fn handover_gap(log: &str, resource: &str) -> Option<f64> {
    let (from, to) = handover_window(log, resource)?;
    let lines: Vec<&str> = log.lines().collect();
    Some(((klog_seconds(lines[to])? - klog_seconds(lines[from])?) * 1000.0).round() / 1000.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_serves_pods_on_a_real_single_node_cluster() {
    let Some(assets) = support::cluster::assets(TEST) else { return };
    let started = Instant::now();
    let work = tempfile::tempdir().expect("tempdir");
    let podman = tokio::task::spawn_blocking(Podman::new).await.expect("podman");
    let archive = {
        let (work, assets) = (work.path().to_owned(), assets.clone());
        tokio::task::spawn_blocking(move || images(&podman, &work, &assets)).await.expect("images")
    };
    let mut c = Cluster::up(&assets).await;
    c.import(&archive);
    eprintln!("{TEST}: cluster up and images imported after {:.1} s", started.elapsed().as_secs_f64());

    // The chart, as an operator sets it for a node with /dev/kvm, /dev/fuse and /dev/net/tun:
    // FUSE through DRA; TUN the image's JavaScript backend's (the generic backend told to leave
    // it, or both would be refused it); claim status for every device (so the test sees devplug
    // write it under the chart's RBAC).
    let config = work.path().join("devplug.toml");
    std::fs::write(
        &config,
        r#"poll_interval = "2s"
allocate = ["device-specs"]
default_grant = "none"
[dra]
claim_status = "all"
[backends.generic]
config = """
[[resource]]
name = "devplug.io/kvm"
paths = ["kvm"]
count = 16
[[resource]]
name = "devplug.io/fuse"
paths = ["fuse"]
count = 16
"""
[backends.js-fusetun]
grant = { dev = ["net/tun"], resources = ["devplug.io/js-fuse", "devplug.io/js-tun"], env = ["JS_DEVICES"] }
"#,
    )
    .expect("config");
    let port = std::net::TcpListener::bind("0.0.0.0:0").and_then(|l| l.local_addr()).expect("a free port").port();
    let chart = s(&repo().join("deploy/helm/devplug"));
    let sets = [
        format!("image.repository={}", HOST_IMAGE.rsplit_once(':').map_or(HOST_IMAGE, |(r, _)| r)),
        "image.tag=1".into(),
        "image.pullPolicy=Never".into(),
        format!("backends.reference={BACKENDS_IMAGE}"),
        "backends.pullPolicy=Never".into(),
        format!("cdiDir={}", s(&c.cdi_dir())),
        format!("metrics.port={port}"),
        "dra.resources.devplug\\.io/fuse=generic".into(),
    ];
    let mut args = vec!["install", "devplug", &chart, "--namespace", "devplug", "--create-namespace"];
    for set in &sets {
        args.extend(["--set", set]);
    }
    let config_file = format!("config={}", s(&config));
    args.extend(["--set-file", &config_file]);
    helm(&c, work.path(), &args);

    // The pod starts (read-only root, host /dev read-only beside the runtime's own) and is Ready.
    let first = ready_devplug(&c, "the chart's devplug Ready").await;
    eprintln!("{TEST}: devplug Ready after {:.1} s", started.elapsed().as_secs_f64());
    wait_allocatable(&c, "devplug.io/kvm", "16").await;
    wait_allocatable(&c, "devplug.io/js-tun", "4").await;
    c.namespace(NS).await;

    // A device-plugin pod, a pod asking for the DRA resource by its extended-resource name
    // (KEP-5004: the scheduler makes its claim), a DRA claim's pod (CDI injected by
    // containerd), and the image-volume backend's resource.
    run_checker(&c, "kvm", "/dev/kvm", limits("devplug.io/kvm"), json!({})).await;
    run_checker(&c, "fuse-by-name", "/dev/fuse", limits("devplug.io/fuse"), json!({})).await;
    c.create(&format!("/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims"), &fuse_claim("fuse")).await;
    run_checker(&c, "fuse-claim", "/dev/fuse", BTreeMap::new(), with_claim("fuse")).await;
    run_checker(&c, "js-tun", "/dev/net/tun", limits("devplug.io/js-tun"), json!({})).await;
    checked(&c, "kvm", "/dev/kvm").await;
    let by_name = checked(&c, "fuse-by-name", "/dev/fuse").await;
    assert!(
        by_name["status"]["extendedResourceClaimStatus"]["resourceClaimName"].is_string(),
        "devplug.io/fuse was served through DRA (a claim the scheduler made): {}",
        by_name["status"]
    );
    checked(&c, "fuse-claim", "/dev/fuse").await;
    checked(&c, "js-tun", "/dev/net/tun").await;
    let first_name = first["metadata"]["name"].as_str().unwrap_or_default().to_owned();
    let log = c.pod_log("devplug", &first_name);
    assert!(log.contains("origin=/backends/js-fusetun.wasm"), "js-fusetun came from the image volume:\n{log}");

    // Pods that hold devices across the rolling update and the kubelet restart.
    let hold = "stat -c %t:%T /dev/kvm > /dev/termination-log; exec sleep 100000";
    c.create(
        &format!("/api/v1/namespaces/{NS}/pods"),
        &pod("hold-kvm", support::podman::IMAGE, hold, limits("devplug.io/kvm"), json!({})),
    )
    .await;
    c.create(&format!("/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims"), &fuse_claim("held")).await;
    let hold = "exec sleep 100000";
    c.create(
        &format!("/api/v1/namespaces/{NS}/pods"),
        &pod("hold-fuse", support::podman::IMAGE, hold, BTreeMap::new(), with_claim("held")),
    )
    .await;
    let running = |p: &Value| {
        (phase(p) == "Running")
            .then(|| p["status"]["containerStatuses"][0]["containerID"].as_str().map(str::to_owned))
            .flatten()
    };
    let kvm_container = c.wait_pod(NS, "hold-kvm", T, running).await;
    let fuse_container = c.wait_pod(NS, "hold-fuse", T, running).await;
    let in_container = |c: &Cluster, id: &str, dev: &str| {
        let pid = c.container_pid(id).unwrap_or_else(|| panic!("no running task for {id}"));
        let path = format!("/proc/{pid}/root{dev}");
        std::path::Path::new(&path).exists().then(|| numbers(&path))
    };
    assert_eq!(in_container(&c, &kvm_container, "/dev/kvm"), Some(numbers("/dev/kvm")));
    assert_eq!(in_container(&c, &fuse_container, "/dev/fuse"), Some(numbers("/dev/fuse")));
    assert_eq!(in_container(&c, &fuse_container, "/dev/kvm"), None, "a claim for FUSE gives no other node");

    // Claim status, written by devplug under the chart's RBAC (its pod-bound token).
    let end = Instant::now() + T;
    loop {
        let claim = c.get(&format!("/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims/held")).await;
        let devices = claim["status"]["devices"].as_array().cloned().unwrap_or_default();
        if devices.iter().any(|d| d["driver"] == "generic.devplug.io") {
            break;
        }
        assert!(Instant::now() < end, "devplug wrote no claim status: {}\n{}", claim["status"], devplug_log(&c).await);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // A rolling update under a stream of pods asking for devices (one every 2 s, a device-plugin
    // and a DRA one in turn): none may be rejected, and the held pods keep their devices.
    let stop = Arc::new(AtomicBool::new(false));
    let created = Arc::new(AtomicUsize::new(0));
    let stream = {
        let (stop, created) = (stop.clone(), created.clone());
        let api = c.api.client();
        tokio::spawn(async move {
            let mut names = Vec::new();
            let mut tick = tokio::time::interval(Duration::from_secs(2));
            let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::namespaced(api, NS);
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                let i = names.len();
                let (name, resource) = if i % 2 == 0 {
                    (format!("stream-kvm-{i}"), "devplug.io/kvm")
                } else {
                    (format!("stream-fuse-{i}"), "devplug.io/fuse")
                };
                let device = if i % 2 == 0 { "/dev/kvm" } else { "/dev/fuse" };
                let spec = pod(
                    &name,
                    support::podman::IMAGE,
                    &format!("stat -c %t:%T {device} > /dev/termination-log"),
                    limits(resource),
                    json!({}),
                );
                let spec = serde_json::from_value(spec).expect("a Pod");
                pods.create(&kube::api::PostParams::default(), &spec).await.expect("create a stream pod");
                names.push((name, device));
                created.store(names.len(), Ordering::Relaxed);
            }
            names
        })
    };
    let upgrade_started = Instant::now();
    let args = ["upgrade", "devplug", &chart, "--namespace", "devplug", "--reuse-values", "--set", "registry.poll=59s"];
    helm(&c, work.path(), &args);
    let first_uid = first["metadata"]["uid"].clone();
    let second = wait_devplug(&c, "the rolling update", |pods| {
        (pods.len() == 1 && pods[0]["metadata"]["uid"] != first_uid && ready(&pods[0])).then(|| pods[0].clone())
    })
    .await;
    let rollout = upgrade_started.elapsed();
    // Five more pods of the stream against the new devplug alone.
    let until = created.load(Ordering::Relaxed) + 5;
    while created.load(Ordering::Relaxed) < until && !stream.is_finished() {
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let names = stream.await.expect("the stream");
    // A pod kubelet admits while it has no plugin for the resource is refused, whichever plugin
    // it is: kubelet drops a plugin at once when its stream ends, and its plugin watcher
    // registers the next one on its once-a-second pass. devplug's part is that the window is
    // that pass alone (the successor prepared before the old one let go). So: every pod ran
    // with its device, save at most one refused by kubelet inside that window.
    let kubelet_log = c.log("kubelet");
    let window = handover_window(&kubelet_log, "devplug.io/kvm");
    let gap = handover_gap(&kubelet_log, "devplug.io/kvm");
    let mut failed = Vec::new();
    let mut refused_in_window = Vec::new();
    for (name, device) in &names {
        let p = c.wait_pod(NS, name, T, |p| matches!(phase(p), "Succeeded" | "Failed").then(|| p.clone())).await;
        if phase(&p) == "Succeeded" && message(&p).as_deref() == Some(numbers(device).as_str()) {
            continue;
        }
        let denied = kubelet_log
            .lines()
            .position(|l| l.contains("\"Pod admission denied\"") && l.contains(&format!("pod=\"{NS}/{name}\"")));
        match (denied, window) {
            (Some(at), Some((from, to)))
                if p["status"]["reason"] == "UnexpectedAdmissionError" && from <= at && at <= to =>
            {
                refused_in_window.push(name.clone())
            }
            _ => failed.push(format!("{name}: {}", p["status"])),
        }
    }
    assert!(
        failed.is_empty() && refused_in_window.len() <= 1,
        "{} of {} pods failed across the rolling update outside kubelet's re-registration pass, {refused_in_window:?} inside it:\n{}",
        failed.len(),
        names.len(),
        failed.join("\n")
    );
    eprintln!(
        "{TEST}: rolling update done in {:.1} s, {} pods created every 2 s through it, refused: {refused_in_window:?}; \
         kubelet was without devplug.io/kvm's plugin for {gap:?} s",
        rollout.as_secs_f64(),
        names.len()
    );
    let second_name = second["metadata"]["name"].as_str().unwrap_or_default().to_owned();
    let log = c.pod_log("devplug", &second_name);
    assert!(!log.contains("compile cache refused"), "the new pod used the chart's cache volume:\n{log}");

    // kubelet restarts: running pods keep their devices, devplug registers again and new pods
    // get devices.
    c.restart_kubelet().await;
    let end = Instant::now() + T;
    let logged = |log: &str, parts: &[&str]| log.lines().any(|l| parts.iter().all(|p| l.contains(p)));
    while !(logged(&c.log("kubelet"), &["\"Registered client\"", "name=\"devplug.io/kvm\""])
        && logged(&c.log("kubelet"), &["\"Registered DRA plugin\"", "driverName=\"generic.devplug.io\""]))
    {
        assert!(Instant::now() < end, "devplug never registered again after kubelet's restart:\n{}", c.log("kubelet"));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(in_container(&c, &kvm_container, "/dev/kvm"), Some(numbers("/dev/kvm")), "hold-kvm kept /dev/kvm");
    assert_eq!(in_container(&c, &fuse_container, "/dev/fuse"), Some(numbers("/dev/fuse")), "hold-fuse kept /dev/fuse");
    // kubelet lists the pods it learned again from the API server once it has them.
    let end = Instant::now() + T;
    loop {
        let channel = support::uds::connect(&c.pod_resources_socket(), Duration::from_secs(10))
            .await
            .expect("pod resources socket");
        let listed = devplug::proto::podresources::pod_resources_lister_client::PodResourcesListerClient::new(channel)
            .list(devplug::proto::podresources::ListPodResourcesRequest {})
            .await
            .expect("kubelet lists pod resources")
            .into_inner();
        let held = listed
            .pod_resources
            .iter()
            .filter(|p| p.name == "hold-kvm")
            .flat_map(|p| &p.containers)
            .flat_map(|c| &c.devices)
            .filter(|d| d.resource_name == "devplug.io/kvm")
            .count();
        if held == 1 {
            break;
        }
        assert!(Instant::now() < end, "kubelet lost hold-kvm's device in its restart: {listed:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    run_checker(&c, "kvm-after-restart", "/dev/kvm", limits("devplug.io/kvm"), json!({})).await;
    run_checker(&c, "fuse-after-restart", "/dev/fuse", limits("devplug.io/fuse"), json!({})).await;
    checked(&c, "kvm-after-restart", "/dev/kvm").await;
    checked(&c, "fuse-after-restart", "/dev/fuse").await;

    // Plugin sockets appear in kubelet's watched directories without an error from kubelet.
    let kubelet_log = format!(
        "{}{}",
        std::fs::read_to_string(c.path("logs/kubelet.before-restart.log")).unwrap_or_default(),
        c.log("kubelet")
    );
    let errors: Vec<&str> = kubelet_log
        .lines()
        .filter(|l| l.starts_with('E') && (l.contains("plugins_registry") || l.contains("device-plugins")))
        .collect();
    assert!(errors.is_empty(), "kubelet logged errors about devplug's sockets:\n{}", errors.join("\n"));

    helm(&c, work.path(), &["uninstall", "devplug", "--namespace", "devplug", "--wait"]);
    wait_no_devplug(&c).await;

    // The plain manifests, as shipped: deploy/kubernetes/devplug.yaml (the backends from an
    // image volume), then its DaemonSet as devplug-no-image-volume.yaml has it (an init
    // container copies them from the fallback image). They write CDI specs to the machine's
    // /var/run/cdi, so the test holds it and puts it back.
    let _cdi = tokio::task::spawn_blocking(support::podman::SystemCdi::take).await.expect("/var/run/cdi");
    for (file, checker) in [("devplug.yaml", "kvm-plain"), ("devplug-no-image-volume.yaml", "kvm-fallback")] {
        let text = std::fs::read_to_string(repo().join("deploy/kubernetes").join(file)).expect("manifest");
        for image in [SHIPPED_HOST, if file == "devplug.yaml" { SHIPPED_BACKENDS } else { SHIPPED_FALLBACK }] {
            assert!(text.contains(image), "{file} names {image} (the test tags its builds so)");
        }
        for o in support::chart::objects(&text) {
            let ns = o["metadata"]["namespace"].as_str().unwrap_or("devplug");
            let collection = match o["kind"].as_str().unwrap_or_default() {
                "Namespace" => "/api/v1/namespaces".to_owned(),
                "ServiceAccount" => format!("/api/v1/namespaces/{ns}/serviceaccounts"),
                "ConfigMap" => format!("/api/v1/namespaces/{ns}/configmaps"),
                "DaemonSet" => format!("/apis/apps/v1/namespaces/{ns}/daemonsets"),
                kind => panic!("{file}: a {kind} the test does not create"),
            };
            let (code, answer) = c.api.send("POST", &collection, Some(&o)).await;
            assert!(code == 201 || code == 409 && o["kind"] == "Namespace", "{file}: create {}: {answer}", o["kind"]);
        }
        ready_devplug(&c, &format!("{file}: devplug Ready")).await;
        run_checker(&c, checker, "/dev/kvm", limits("devplug.io/kvm"), json!({})).await;
        checked(&c, checker, "/dev/kvm").await;
        let log = devplug_log(&c).await;
        assert!(log.contains("origin=/backends/js-fusetun.wasm"), "{file}: the image's backend was loaded:\n{log}");
        let (code, answer) = c.api.send("DELETE", "/apis/apps/v1/namespaces/devplug/daemonsets/devplug", None).await;
        assert_eq!(code, 200, "{answer}");
        wait_no_devplug(&c).await;
        eprintln!("{TEST}: deploy/kubernetes/{file} served a pod /dev/kvm");
    }
    eprintln!("{TEST}: passed in {:.1} s", started.elapsed().as_secs_f64());
}

/// Wait until devplug's pods are as `wanted` says (`Some(what the caller keeps)`), or panic
/// after [`T`] saying `what` never happened, with their statuses and logs.
async fn wait_devplug<R>(c: &Cluster, what: &str, wanted: impl Fn(&[Value]) -> Option<R>) -> R {
    let end = Instant::now() + T;
    loop {
        let pods = devplug_pods(c).await;
        if let Some(r) = wanted(&pods) {
            return r;
        }
        assert!(
            Instant::now() < end,
            "{what} never happened: {:?}\n{}\nkubelet:\n{}",
            statuses(&pods),
            devplug_log(c).await,
            c.tail("kubelet")
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Wait until no devplug pod is left.
async fn wait_no_devplug(c: &Cluster) {
    wait_devplug(c, "devplug's pods going", |pods| pods.is_empty().then_some(())).await
}

/// Wait until a devplug pod is Ready; that pod.
async fn ready_devplug(c: &Cluster, what: &str) -> Value {
    wait_devplug(c, what, |pods| pods.iter().find(|p| ready(p)).cloned()).await
}
