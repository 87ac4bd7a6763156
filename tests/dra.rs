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
