//! DRA, step 1: devplug's own ResourceSlice validation agrees with a real kube-apiserver 1.36
//! on every case of the recorded corpus (`shared/k8s/resourceslice-verdicts.jsonl`, see its
//! README): what the server accepted passes, what it refused is refused, naming the same field
//! first.

mod support;

use std::path::PathBuf;

use devplug::dra::slice_rules::problems;

fn corpus() -> PathBuf {
    // CI lays shared/ beside the clone; so does every developer machine of this project.
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/k8s/resourceslice-verdicts.jsonl")
}

#[test]
fn slice_validation_agrees_with_the_recorded_api_server_on_every_case() {
    let path = corpus();
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!("{}: {e} (the recorded corpus lives in shared/k8s beside the checkout)", path.display())
    });
    let mut disagreements = Vec::new();
    let mut cases = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        cases += 1;
        let case: serde_json::Value = serde_json::from_str(line).expect("a corpus line is JSON");
        let name = case["name"].as_str().unwrap_or("?");
        let got = problems(&case["object"]);
        let accepted = case["accepted"] == true;
        if accepted != got.is_empty() {
            disagreements.push(format!("{name}: server accepted={accepted}, devplug says {got:?}"));
            continue;
        }
        let fields: Vec<&str> = case["fields"].as_array().into_iter().flatten().filter_map(|f| f.as_str()).collect();
        if let (Some(want), Some(first)) = (fields.first(), got.first())
            && *want != first.field
        {
            disagreements
                .push(format!("{name}: server named {want}, devplug names {} ({})", first.field, first.message));
        }
    }
    assert!(cases >= 50, "only {cases} cases read from {}", path.display());
    assert!(
        disagreements.is_empty(),
        "{} of {cases} cases disagree:\n{}",
        disagreements.len(),
        disagreements.join("\n")
    );
}

/// DRA, step 2: what the first-party backends discover on the real-hardware fixtures becomes
/// pools of slices the recorded server's rules accept (device IDs such as PCI addresses renamed
/// to DNS labels, attributes typed, at most 128 devices a slice).
#[test]
fn first_party_devices_on_the_fixtures_make_valid_pools() {
    use devplug::model::{ContainerEdits, Device, Health, Resource};
    use support::hardware::{MACHINES, build};
    let root = tempfile::tempdir().unwrap();
    let cache = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("wasm-cache");
    let mut pools = 0;
    for machine in MACHINES {
        let m = root.path().join(machine);
        build(machine, &m);
        let out = support::binary::on_machine(&["discover"], &m, &cache, &["--format", "json"]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        for r in v["resources"].as_array().unwrap() {
            let devices: Vec<Device> = r["devices"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| Device {
                    id: d["id"].as_str().unwrap().into(),
                    health: if d["health"] == "Healthy" { Health::Healthy } else { Health::Unhealthy },
                    numa_nodes: d["numa_nodes"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|n| n.as_u64())
                        .map(|n| n as u32)
                        .collect(),
                    attributes: d["attributes"]
                        .as_object()
                        .into_iter()
                        .flatten()
                        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                        .collect(),
                    edits: ContainerEdits::default(),
                })
                .collect();
            let name = r["name"].as_str().unwrap();
            let resource = Resource { name: name.into(), devices, ..Default::default() };
            let pool = devplug::dra::slices::pool("fixture", "devplug.io", "node-a", "node-a", 1, &[resource])
                .unwrap_or_else(|e| panic!("{machine}: {name}: {e}"));
            assert!(!pool.slices.is_empty());
            pools += 1;
        }
    }
    assert!(pools >= 10, "only {pools} pools");
}

/// What a backend and the API server would decide, for the plugin tests: a claim named `bad`
/// fails, every other gets one device with a CDI ID named after it. It counts its calls, so the
/// tests see the checkpoint answering instead.
#[derive(Default)]
struct CountingPreparer {
    prepares: std::sync::atomic::AtomicU32,
    unprepares: std::sync::atomic::AtomicU32,
}

#[async_trait::async_trait]
impl devplug::dra::plugin::ClaimPreparer for CountingPreparer {
    async fn prepare(
        &self,
        claim: &devplug::dra::checkpoint::ClaimRef,
    ) -> Result<Vec<devplug::dra::checkpoint::PreparedDevice>, String> {
        self.prepares.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if claim.name == "bad" {
            return Err("no device fits claim bad".into());
        }
        Ok(vec![devplug::dra::checkpoint::PreparedDevice {
            request_names: vec!["gpu".into()],
            pool_name: "node-a".into(),
            device_name: "gpu-0".into(),
            cdi_device_ids: vec![format!("devplug.io/gpu={}", claim.name)],
        }])
    }

    async fn unprepare(
        &self,
        _: &devplug::dra::checkpoint::ClaimRef,
        _: &[devplug::dra::checkpoint::PreparedDevice],
    ) -> Result<(), String> {
        self.unprepares.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }
}

/// DRA, step 3: the kubelet-facing plugin over a real Unix socket, in both API versions kubelet
/// speaks. One entry per claim, a failed claim is its entry's error (the RPC succeeds), a
/// repeated prepare is answered from the checkpoint without preparing again, also after a
/// restart of the plugin, and unprepare is idempotent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dra_plugin_prepares_idempotently_in_both_versions_and_survives_a_restart() {
    use devplug::dra::checkpoint::Checkpoint;
    use devplug::dra::plugin::{DraPlugin, serve};
    use devplug::proto::dra::{v1, v1beta1};
    use std::sync::Arc;
    use std::sync::atomic::Ordering;
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("dra.sock");
    let state = dir.path().join("state");
    let preparer = Arc::new(CountingPreparer::default());
    let start = || {
        let plugin = Arc::new(DraPlugin::new(preparer.clone(), Checkpoint::open(&state).unwrap()));
        let stop = tokio_util::sync::CancellationToken::new();
        (serve(plugin, &socket, stop.clone()).unwrap(), stop)
    };
    let claim = |name: &str| v1::Claim { namespace: "ml".into(), uid: format!("uid-{name}"), name: name.into() };
    let (server, stop) = start();
    let channel = support::uds::connect(&socket, std::time::Duration::from_secs(10)).await.unwrap();
    let mut kubelet = v1::dra_plugin_client::DraPluginClient::new(channel);
    let req = v1::NodePrepareResourcesRequest { claims: vec![claim("train"), claim("bad")] };
    let first = kubelet.node_prepare_resources(req.clone()).await.unwrap().into_inner();
    assert_eq!(first.claims.len(), 2, "one entry per claim");
    assert_eq!(first.claims["uid-train"].devices[0].cdi_device_ids, ["devplug.io/gpu=train"]);
    assert!(first.claims["uid-train"].error.is_empty());
    assert_eq!(first.claims["uid-bad"].error, "no device fits claim bad");
    assert_eq!(preparer.prepares.load(Ordering::SeqCst), 2);
    // Asked again: the prepared claim comes from the checkpoint; the failed one is tried again.
    let again = kubelet.node_prepare_resources(req.clone()).await.unwrap().into_inner();
    assert_eq!(again.claims["uid-train"], first.claims["uid-train"]);
    assert_eq!(preparer.prepares.load(Ordering::SeqCst), 3, "only the failed claim was prepared again");
    // devplug restarts: the checkpoint on disk answers, in the older version too.
    stop.cancel();
    server.await.unwrap();
    let (server, stop) = start();
    let channel = support::uds::connect(&socket, std::time::Duration::from_secs(10)).await.unwrap();
    let mut old_kubelet = v1beta1::dra_plugin_client::DraPluginClient::new(channel.clone());
    let beta = v1beta1::NodePrepareResourcesRequest {
        claims: vec![v1beta1::Claim { namespace: "ml".into(), uid: "uid-train".into(), name: "train".into() }],
    };
    let after = old_kubelet.node_prepare_resources(beta).await.unwrap().into_inner();
    assert_eq!(after.claims["uid-train"].devices[0].cdi_device_ids, ["devplug.io/gpu=train"]);
    assert_eq!(preparer.prepares.load(Ordering::SeqCst), 3, "nothing prepared again after the restart");
    // Unprepare undoes it once; a repeat (or a claim never prepared here) succeeds.
    let mut kubelet = v1::dra_plugin_client::DraPluginClient::new(channel);
    for _ in 0..2 {
        let un = v1::NodeUnprepareResourcesRequest { claims: vec![claim("train"), claim("never")] };
        let un = kubelet.node_unprepare_resources(un).await.unwrap().into_inner();
        assert_eq!(un.claims.len(), 2);
        assert!(un.claims.values().all(|c| c.error.is_empty()), "{un:?}");
    }
    assert_eq!(preparer.unprepares.load(Ordering::SeqCst), 1);
    let fresh = kubelet.node_prepare_resources(req).await.unwrap().into_inner();
    assert!(fresh.claims["uid-train"].error.is_empty());
    assert_eq!(preparer.prepares.load(Ordering::SeqCst), 5, "an unprepared claim is prepared afresh");
    stop.cancel();
    server.await.unwrap();
}

/// DRA, step 4: the API-server stand-in the end-to-end tests publish to answers every recorded
/// case as the real kube-apiserver 1.36 did: the HTTP status, and for refusals the causes'
/// field paths (in order).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_stand_in_answers_every_recorded_case_as_the_real_server_did() {
    let api = support::apiserver::ApiServer::start(&["node-a"]).await;
    let text = std::fs::read_to_string(corpus()).expect("the recorded corpus");
    let mut wrong = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let case: serde_json::Value = serde_json::from_str(line).unwrap();
        api.store.lock().unwrap().slices.clear();
        let (code, answer) = api.post("/apis/resource.k8s.io/v1/resourceslices", &case["object"]).await;
        let name = case["name"].as_str().unwrap_or("?");
        if u64::from(code) != case["status"].as_u64().unwrap() {
            wrong.push(format!("{name}: {code}, recorded {}: {answer}", case["status"]));
            continue;
        }
        let recorded: Vec<&str> = case["fields"].as_array().into_iter().flatten().filter_map(|f| f.as_str()).collect();
        let given: Vec<&str> =
            answer["details"]["causes"].as_array().into_iter().flatten().filter_map(|c| c["field"].as_str()).collect();
        if recorded.first() != given.first() {
            wrong.push(format!("{name}: causes {given:?}, recorded {recorded:?}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

const T: std::time::Duration = std::time::Duration::from_secs(30);

/// Wait until `f` holds, polling (the stand-ins' state is plain data).
async fn until(what: &str, mut f: impl FnMut() -> bool) {
    let end = tokio::time::Instant::now() + T;
    while !f() {
        assert!(tokio::time::Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// The pieces of a node serving the embedded generic backend's `/dev/null` (two shares)
/// through DRA: an API server with Node `node-a`, a kubelet whose plugin watcher has DRA's
/// handler, and the daemon's config (CDI specs in the machine's `/var/run/cdi`, where podman
/// reads them, held by `SystemCdi`).
struct DraNode {
    dir: tempfile::TempDir,
    api: std::sync::Arc<support::apiserver::ApiServer>,
    kubelet: support::kubelet::Kubelet,
    dra: std::sync::Arc<support::kubelet_dra::DraKubelet>,
    resource: String,
    cfg: devplug::config::Config,
}

const NODE: &str = "node-a";
const DRIVER: &str = "generic.devplug.io";

async fn dra_node(cdi: &std::path::Path, api: devplug::config::Api) -> DraNode {
    use devplug::backends::BackendSettings;
    let dir = tempfile::tempdir().unwrap();
    let api_server = std::sync::Arc::new(support::apiserver::ApiServer::start(&[NODE]).await);
    let kubeconfig = dir.path().join("kubeconfig");
    api_server.write_kubeconfig(&kubeconfig);
    let (dp_dir, registry) = (dir.path().join("device-plugins"), dir.path().join("plugins_registry"));
    let kubelet = support::kubelet::Kubelet::start_with_watcher(&dp_dir, &registry).await;
    let dra = support::kubelet_dra::DraKubelet::new(support::kubelet_dra::KNOWN_1_34, NODE, api_server.clone());
    kubelet.handle("DRAPlugin", dra.clone());
    let resource = format!("e2e-{}.devplug.io/null", std::process::id());
    let generic = format!(
        "[[resource]]\nname = \"{resource}\"\npaths = [\"null\"]\ncount = 2\ncontainer_path = \"/dev/devplug-null\"\n\
         env = {{ DEVPLUG_E2E = \"null-ok\" }}\n"
    );
    let mut cfg = devplug::config::Config {
        kubelet_dir: dp_dir,
        plugins_registry_dir: Some(registry),
        registration: devplug::kubelet::RegistrationMode::PluginWatcher,
        embedded: true,
        cdi_dir: cdi.to_owned(),
        uevents: false,
        metrics_addr: "127.0.0.1:0".parse().unwrap(),
        poll_interval: std::time::Duration::from_millis(200),
        cache_dir: Some(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("wasm-cache")),
        ..Default::default()
    };
    for off in ["gpu", "nic", "fpga"] {
        cfg.backends.insert(off.into(), BackendSettings { enabled: false, ..Default::default() });
    }
    cfg.backends.insert("generic".into(), BackendSettings { config: generic, ..Default::default() });
    cfg.resources.insert(resource.clone(), devplug::config::ResourceSettings { allocate: None, write_cdi: None, api });
    cfg.dra.kubeconfig = Some(kubeconfig);
    cfg.dra.node_name = Some(NODE.into());
    cfg.dra.plugins_dir = Some(dir.path().join("plugins"));
    cfg.dra.resync = std::time::Duration::from_secs(1);
    DraNode { dir, api: api_server, kubelet, dra, resource, cfg }
}

/// DRA end to end on this machine, in-process: the embedded generic backend's devices published
/// as slices the API stand-in accepts (owned by the Node), the plugin registered through
/// kubelet's watcher in v1, a claim prepared into CDI IDs that podman resolves to the right
/// `/dev` node, a repeat answered the same, an unknown device refused in its own entry, devplug
/// restarted with the claim prepared, kubelet restarted (slices wiped and put back), unprepare.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resource_served_through_dra_prepares_claims_podman_runs() {
    use support::podman::{Podman, SystemCdi, text};
    let podman = tokio::task::spawn_blocking(Podman::new).await.unwrap();
    let system_cdi = SystemCdi::take();
    let mut n = dra_node(system_cdi.dir(), devplug::config::Api::Dra).await;
    let daemon = support::daemon::Daemon::start(n.cfg.clone());

    n.dra.wait_plugin(DRIVER, T).await;
    assert_eq!(n.dra.plugin(DRIVER).unwrap().version, "v1.DRAPlugin", "kubelet 1.34+ picks v1");
    until("the pool", || n.api.devices(NODE, DRIVER).len() == 2).await;
    let slices = n.api.slices(NODE, Some(DRIVER));
    let slice = slices.values().next().unwrap();
    assert_eq!(slice["metadata"]["ownerReferences"][0]["uid"], "node-uid-node-a", "owned by the Node");
    assert_eq!(slice["metadata"]["labels"]["app.kubernetes.io/managed-by"], "devplug");
    let devices = n.api.devices(NODE, DRIVER);
    assert!(devices.contains_key("null-1"), "{devices:?}");
    assert_eq!(devices["null-1"]["attributes"]["resource"]["string"], n.resource.as_str());
    assert!(n.kubelet.plugin(&n.resource).await.is_none(), "never served through the Device Plugin API as well");

    n.api.allocate_claim("ml", "train", "uid-train", &[("dev", DRIVER, NODE, "null-1")]);
    n.api.allocate_claim("ml", "ghost", "uid-ghost", &[("dev", DRIVER, NODE, "null-9")]);
    let claims = [("ml", "uid-train", "train"), ("ml", "uid-ghost", "ghost")];
    let first = n.dra.prepare(DRIVER, &claims).await.unwrap();
    let train = &first["uid-train"];
    assert!(train.error.is_empty(), "{train:?}");
    let ids = train.devices[0].3.clone();
    assert_eq!(ids, ["devplug.io/claim=uid-train-null-1"]);
    assert_eq!((train.devices[0].1.as_str(), train.devices[0].2.as_str()), (NODE, "null-1"));
    assert!(first["uid-ghost"].error.contains("null-9"), "{:?}", first["uid-ghost"]);
    let claim_spec = system_cdi.dir().join("devplug-claim-uid-train.json");
    assert!(claim_spec.exists());

    let script = "stat -c 'node %F %t:%T' /dev/devplug-null; echo \"env $DEVPLUG_E2E\"";
    let out = tokio::task::block_in_place(|| podman.run(&ids, script));
    assert!(out.status.success(), "podman run with {ids:?} failed:\n{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("node character special file 1:3"), "{}", text(&out));
    assert!(stdout.contains("env null-ok"), "{}", text(&out));

    // devplug restarts with the claim prepared: the pool goes with it and comes back, the claim's
    // spec stays, and the same prepare gets the same answer.
    daemon.stop().await.unwrap();
    assert!(n.api.slices(NODE, Some(DRIVER)).is_empty(), "slices deleted on shutdown");
    assert!(claim_spec.exists(), "a prepared claim's spec outlives devplug");
    let daemon = support::daemon::Daemon::start(n.cfg.clone());
    until("the pool after a devplug restart", || n.api.devices(NODE, DRIVER).len() == 2).await;
    n.dra.wait_plugin(DRIVER, T).await;
    let again = n.dra.prepare(DRIVER, &claims[..1]).await.unwrap();
    assert_eq!(again["uid-train"], *train);

    // Kubelet restarts: it deletes the node's slices; devplug puts them back.
    let before = n.dra.registrations.load(std::sync::atomic::Ordering::SeqCst);
    n.kubelet.restart().await;
    until("a new registration", || n.dra.registrations.load(std::sync::atomic::Ordering::SeqCst) > before).await;
    until("the pool after a kubelet restart", || n.api.devices(NODE, DRIVER).len() == 2).await;

    let un = n.dra.unprepare(DRIVER, &claims[..1]).await.unwrap();
    assert_eq!(un["uid-train"], "");
    assert!(!claim_spec.exists(), "unprepare removes the claim's spec");
    let un = n.dra.unprepare(DRIVER, &claims[..1]).await.unwrap();
    assert_eq!(un["uid-train"], "", "a repeated unprepare succeeds");
    daemon.stop().await.unwrap();
    drop(n.dir);
}
