//! DRA, step 1: devplug's own ResourceSlice validation agrees with a real kube-apiserver 1.36
//! on every case of the recorded corpus (`shared/k8s/resourceslice-verdicts.jsonl`, see its
//! README): what the server accepted passes, what it refused is refused, naming the same field
//! first.

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
