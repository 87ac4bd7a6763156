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
