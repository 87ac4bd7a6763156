//! The host's layers point one way (docs/architecture.md, "Layers"): every `crate::` path in a
//! module's non-test code names the module itself or a layer it may use, and within a folder
//! the files import each other without circles. A new back-edge fails here with the file and
//! line, before it grows into an import circle. Also: every integration test file is run.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each top-level module and the modules its code may name. `daemon`, `cli` and the binary may
/// use everything; tests inside a file (`#[cfg(test)]` and below) are not checked.
const MAY_USE: &[(&str, &[&str])] = &[
    ("sync", &[]),
    ("durable", &[]),
    ("gate", &[]),
    ("fswatch", &[]),
    ("proto", &[]),
    ("tls", &[]),
    ("model", &["gate"]),
    ("plugin_socket", &["proto", "sync", "gate"]),
    ("dra", &["model", "cdi", "proto", "durable", "sync", "gate", "plugin_socket", "tls"]),
    ("runtime", &["model", "sync", "durable", "gate"]),
    ("oci", &["sync", "durable", "gate", "tls"]),
    ("backends", &["runtime", "oci", "model", "sync", "durable", "gate", "fswatch"]),
    ("cdi", &["model", "sync", "durable", "gate"]),
    ("kubelet", &["model", "cdi", "proto", "sync", "gate", "fswatch", "plugin_socket"]),
    ("observe", &["backends", "kubelet", "dra", "model", "runtime", "oci", "sync", "gate", "plugin_socket", "durable"]),
    ("config", &["backends", "kubelet", "runtime", "oci", "model", "dra", "gate"]),
];
/// The process and its commands; `try` is the binary's `devplug try` (the test suite's
/// kubelet stand-in, compiled in).
const ANYTHING: &[&str] = &["daemon", "cli", "main", "lib", "try"];

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

/// The non-comment lines of `text` outside its `#[cfg(test)]` items (an item's braces counted
/// from the attribute to where they close, so production code after a test module is read
/// too), numbered from 1.
fn code_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    let mut depth: Option<i64> = None;
    text.lines()
        .enumerate()
        .filter(move |(_, l)| {
            let t = l.trim_start();
            if depth.is_none() && t.starts_with("#[cfg(test)]") {
                depth = Some(0);
                return false;
            }
            if let Some(d) = depth.as_mut() {
                let opened = t.matches('{').count() as i64;
                *d += opened - t.matches('}').count() as i64;
                // The item ends where its braces close (or at a `;` before any opened).
                if *d <= 0 && (opened > 0 || t.ends_with('}') || t.ends_with(';')) {
                    depth = None;
                }
                return false;
            }
            !t.starts_with("//")
        })
        .map(|(i, l)| (i + 1, l))
}

/// The first path segment of every path after `prefix` in `line`: `prefix::a::b` gives `a`,
/// `prefix::{a, b::c, self}` gives `a` and `b`.
fn after(line: &str, prefix: &str) -> Vec<String> {
    let ident = |s: &str| -> String { s.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect() };
    let mut out = Vec::new();
    for (at, _) in line.match_indices(prefix) {
        // `super::super::` is not `super::` followed by a module named `super`.
        if line[..at].ends_with("super::") {
            continue;
        }
        let rest = &line[at + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let (mut depth, mut item) = (0, String::new());
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.push(ident(item.trim()));
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                item.push(c);
            }
            out.push(ident(item.trim()));
        } else {
            out.push(ident(rest));
        }
    }
    out.retain(|n| !n.is_empty() && n != "self" && n != "super");
    out
}

/// The top-level modules each non-comment line before `#[cfg(test)]` names as `crate::NAME`.
fn uses(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in code_lines(text) {
        for (at, _) in line.match_indices("crate::") {
            // `$crate::` in a macro is the same crate, and counts the same.
            let name: String = line[at + 7..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            if !name.is_empty() {
                out.push((n, name));
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

/// The sibling modules that each module of folder `dir` (a top-level module of src/) imports:
/// `super::X` from its own file, `super::super::X` from a file below it, `crate::DIR::X` from
/// anywhere. The folder's `mod.rs` is its front door, not a module of its own, and is left out.
fn sibling_edges(src: &Path, dir: &str) -> BTreeMap<String, BTreeSet<String>> {
    let root = src.join(dir);
    let mut all = Vec::new();
    files(&root, &mut all);
    let module_of = |p: &Path| -> Option<String> {
        let rel = p.strip_prefix(&root).ok()?;
        let first = rel.components().next()?.as_os_str().to_string_lossy().trim_end_matches(".rs").to_owned();
        (first != "mod").then_some(first)
    };
    let modules: BTreeSet<String> = all.iter().filter_map(|p| module_of(p)).collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &all {
        let Some(from) = module_of(file) else { continue };
        let depth = file.strip_prefix(&root).map_or(0, |r| r.components().count());
        let text = std::fs::read_to_string(file).expect("read source");
        for (_, line) in code_lines(&text) {
            let mut named = after(line, &format!("crate::{dir}::"));
            match depth {
                1 => named.extend(after(line, "super::")),
                _ => named.extend(after(line, "super::super::")),
            }
            for to in named {
                if to != from && modules.contains(&to) {
                    edges.entry(from.clone()).or_default().insert(to);
                }
            }
        }
    }
    edges
}

/// One circle in `edges`, as the path that closes it, if there is any.
fn a_circle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == n) {
            let mut circle = path[i..].to_vec();
            circle.push(n.to_owned());
            return Some(circle);
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_owned());
        for next in edges.get(n).into_iter().flatten() {
            if let Some(c) = visit(next, edges, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    edges.keys().find_map(|n| visit(n, edges, &mut Vec::new(), &mut done))
}

#[test]
fn no_folder_has_an_import_circle_between_its_files() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut circles = Vec::new();
    for entry in std::fs::read_dir(&src).expect("read host/src") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            let dir = path.file_name().expect("a name").to_string_lossy().into_owned();
            if let Some(c) = a_circle(&sibling_edges(&src, &dir)) {
                circles.push(format!("src/{dir}/: {}", c.join(" -> ")));
            }
        }
    }
    assert!(
        circles.is_empty(),
        "files of one folder import each other in a circle (move what both need into a leaf file):\n{}",
        circles.join("\n")
    );
}

#[test]
fn the_circle_finder_finds_circles() {
    let e = |pairs: &[(&str, &str)]| {
        let mut m: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in pairs {
            m.entry((*a).to_owned()).or_default().insert((*b).to_owned());
        }
        m
    };
    assert_eq!(
        a_circle(&e(&[("a", "b"), ("b", "c"), ("c", "a")])),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    assert_eq!(a_circle(&e(&[("a", "b"), ("b", "c"), ("a", "c")])), None);
    assert_eq!(after("use super::{plumbing::{a, b}, state::EndpointState, self};", "super::"), ["plumbing", "state"]);
    assert_eq!(after("use super::super::jail::Jail;", "super::"), Vec::<String>::new());
    assert_eq!(after("use super::super::jail::Jail;", "super::super::"), ["jail"]);
}

/// Files in the top-level tests/ belong to no package: cargo runs one only when host/Cargo.toml
/// lists it as a `[[test]]`. A file that is not listed would never run, and never fail.
#[test]
fn every_integration_test_file_is_listed_as_a_test_target() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest).expect("read host/Cargo.toml");
    let doc: toml::Table = text.parse().expect("host/Cargo.toml is TOML");
    let listed: BTreeSet<String> = doc
        .get("test")
        .and_then(|t| t.as_array())
        .into_iter()
        .flatten()
        .filter_map(|t| t.get("path").and_then(|p| p.as_str()).map(str::to_owned))
        .collect();
    let tests = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests");
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(&tests).expect("read tests/") {
        let p = entry.expect("dir entry").path();
        if p.extension().is_some_and(|x| x == "rs") {
            let want = format!("../tests/{}", p.file_name().expect("a name").to_string_lossy());
            if !listed.contains(&want) {
                missing.push(want);
            }
        }
    }
    assert!(
        missing.is_empty(),
        "test files cargo never runs (add a [[test]] with this path to host/Cargo.toml): {missing:?}"
    );
}

#[test]
fn the_checker_sees_what_it_must() {
    let text = "use crate::kubelet::X;\n// crate::observe in a comment\nlet a = $crate::model::Y;\n#[cfg(test)]\nuse crate::daemon;\n";
    let names: Vec<String> = uses(text).into_iter().map(|(_, n)| n).collect();
    assert_eq!(names, ["kubelet", "model"]);
}

/// Issue 50: the node build (`--no-default-features`, the DaemonSet image) links no stand-in,
/// CEL or scheduler code; only the vendor build's `try` feature brings them.
#[test]
fn the_node_build_links_no_stand_in_or_cel() {
    let tree = |features: &[&str]| -> String {
        let out = std::process::Command::new(env!("CARGO"))
            .args(["tree", "--offline", "--locked", "-p", "devplug", "-e", "normal", "--prefix", "none"])
            .args(features)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .expect("run cargo tree");
        assert!(out.status.success(), "cargo tree: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let crate_names = |t: &str| -> BTreeSet<String> {
        t.lines().filter_map(|l| l.split_whitespace().next()).map(str::to_owned).collect()
    };
    let node = crate_names(&tree(&["--no-default-features"]));
    for absent in ["devplug-standins", "cel", "antlr4rust", "kube_quantity"] {
        assert!(!node.contains(absent), "the node build links {absent}");
    }
    let vendor = crate_names(&tree(&[]));
    assert!(vendor.contains("devplug-standins") && vendor.contains("cel"), "the vendor build has try");
}

/// Issue 50: README's layout names every room of the host (each folder of `host/src`) and every
/// top-level folder, and names no folder that is not there.
#[test]
fn the_readme_layout_names_every_folder_and_only_real_ones() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let mut missing = Vec::new();
    let dirs = |p: &Path| -> Vec<String> {
        let mut out: Vec<String> = std::fs::read_dir(p)
            .expect("read dir")
            .flatten()
            .filter(|e| e.path().is_dir())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with('.') && n != "target")
            .collect();
        out.sort();
        out
    };
    for room in dirs(&root.join("host/src")) {
        if !readme.contains(&format!("`host/src/{room}/`")) {
            missing.push(format!("host/src/{room}/"));
        }
    }
    for top in dirs(&root) {
        if top != "host" && !readme.contains(&format!("`{top}/`")) {
            missing.push(format!("{top}/"));
        }
    }
    assert!(missing.is_empty(), "README's layout does not name: {missing:?}");
    for (at, _) in readme.match_indices("`host/src/") {
        let name: String = readme[at + 1..].chars().take_while(|c| *c != '`').collect();
        assert!(root.join(&name).exists(), "README names {name}, which is not there");
    }
}
