//! The host's layers point one way (docs/architecture.md, "Layers"): every `crate::` path in a
//! module's non-test code names the module itself or a layer it may use. A new back-edge fails
//! here with the file and line, before it grows into an import circle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each top-level module and the modules its code may name. `daemon`, `cli` and the binary may
/// use everything; tests inside a file (`#[cfg(test)]` and below) are not checked.
const MAY_USE: &[(&str, &[&str])] = &[
    ("sync", &[]),
    ("durable", &[]),
    ("untrusted", &[]),
    ("fswatch", &[]),
    ("proto", &[]),
    ("model", &[]),
    ("runtime", &["model", "sync", "durable", "untrusted"]),
    ("oci", &["sync", "durable", "untrusted"]),
    ("backends", &["runtime", "oci", "model", "sync", "durable", "untrusted", "fswatch"]),
    ("cdi", &["model", "sync", "durable", "untrusted"]),
    ("kubelet", &["model", "cdi", "proto", "sync", "untrusted", "fswatch"]),
    ("observe", &["backends", "kubelet", "model", "runtime", "oci", "sync", "untrusted"]),
    ("config", &["backends", "kubelet", "runtime", "oci", "model"]),
    ("inspect", &["backends", "runtime", "model"]),
    ("pack", &["backends", "inspect", "model"]),
    ("scaffold", &[]),
];
const ANYTHING: &[&str] = &["daemon", "cli", "main", "lib"];

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read host/src") {
        let p = e.expect("dir entry").path();
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level modules each non-comment line before `#[cfg(test)]` names as `crate::NAME`.
fn uses(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let code = line.trim_start();
        if code.starts_with("#[cfg(test)]") {
            break;
        }
        if code.starts_with("//") {
            continue;
        }
        for (at, _) in line.match_indices("crate::") {
            // `$crate::` in a macro is the same crate, and counts the same.
            let name: String = line[at + 7..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            if !name.is_empty() {
                out.push((i + 1, name));
            }
        }
    }
    out
}

#[test]
fn every_layer_uses_only_the_layers_below_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut all = Vec::new();
    files(&src, &mut all);
    let rules: BTreeMap<&str, BTreeSet<&str>> =
        MAY_USE.iter().map(|(m, deps)| (*m, deps.iter().copied().collect())).collect();
    let mut seen_modules = BTreeSet::new();
    let mut wrong = Vec::new();
    for file in &all {
        let rel = file.strip_prefix(&src).expect("under src");
        let first = rel.components().next().expect("a component").as_os_str().to_string_lossy().into_owned();
        let module = first.trim_end_matches(".rs").to_owned();
        seen_modules.insert(module.clone());
        if ANYTHING.contains(&module.as_str()) {
            continue;
        }
        let Some(allowed) = rules.get(module.as_str()) else {
            wrong.push(format!(
                "src/{}: module {module} has no place in the layer table of tests/layers.rs",
                rel.display()
            ));
            continue;
        };
        let text = std::fs::read_to_string(file).expect("read source");
        for (line, used) in uses(&text) {
            if used != module && !allowed.contains(used.as_str()) {
                wrong.push(format!("src/{}:{line}: {module} uses {used}", rel.display()));
            }
        }
    }
    assert!(wrong.is_empty(), "layers pointing the wrong way (see docs/architecture.md):\n{}", wrong.join("\n"));
    // The table names no module that is gone.
    for (m, _) in MAY_USE {
        assert!(seen_modules.contains(*m), "tests/layers.rs names module {m}, which src/ no longer has");
    }
}

#[test]
fn the_checker_sees_what_it_must() {
    let text = "use crate::kubelet::X;\n// crate::observe in a comment\nlet a = $crate::model::Y;\n#[cfg(test)]\nuse crate::daemon;\n";
    let names: Vec<String> = uses(text).into_iter().map(|(_, n)| n).collect();
    assert_eq!(names, ["kubelet", "model"]);
}
