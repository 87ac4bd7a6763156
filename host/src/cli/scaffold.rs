//! `devplug new backend NAME --lang rust|python|js`: a ready-to-build backend project with the
//! WIT contract, a manifest, a fixture machine and a test. The Rust project vendors the guest SDK
//! (it is not on crates.io yet), so it builds anywhere with the `wasm32-wasip2` target.

use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::config::Config;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    Rust,
    Python,
    Js,
}

/// The contract every new project builds against, whatever its language: the newest (0.3.0,
/// with DRA's `describe`, `prepare` and `unprepare`).
const WIT: &[(&str, &str)] = &[
    ("backend.wit", include_str!("../../../wit/since_v0.3.0/backend.wit")),
    ("dra.wit", include_str!("../../../wit/since_v0.3.0/dra.wit")),
    ("host.wit", include_str!("../../../wit/since_v0.3.0/host.wit")),
    ("types.wit", include_str!("../../../wit/since_v0.3.0/types.wit")),
];

/// The WIT version a new project of `lang` builds against.
pub fn wit_version(_lang: Lang) -> &'static str {
    "0.3.0"
}

const SDK: &[(&str, &str)] = &[
    ("lib.rs", include_str!("../../../guests/sdk/src/lib.rs")),
    ("device.rs", include_str!("../../../guests/sdk/src/device.rs")),
    ("edits.rs", include_str!("../../../guests/sdk/src/edits.rs")),
    ("fixture.rs", include_str!("../../../guests/sdk/src/fixture.rs")),
    ("info.rs", include_str!("../../../guests/sdk/src/info.rs")),
    ("pci.rs", include_str!("../../../guests/sdk/src/pci.rs")),
    ("sharing.rs", include_str!("../../../guests/sdk/src/sharing.rs")),
    ("sys.rs", include_str!("../../../guests/sdk/src/sys.rs")),
    ("topology.rs", include_str!("../../../guests/sdk/src/topology.rs")),
];

/// Why `name` cannot name a backend, if it cannot.
fn name_problem(name: &str) -> Option<&'static str> {
    let ok = name.len() <= 40
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.ends_with('-');
    (!ok).then_some("use 1 to 40 characters of [a-z0-9-], starting with a letter")
}

/// Write the project into `dir` (which must not exist yet). Returns the files written.
pub fn new_backend(name: &str, lang: Lang, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    if let Some(why) = name_problem(name) {
        anyhow::bail!("backend name {name:?}: {why}");
    }
    anyhow::ensure!(!dir.exists(), "{} already exists; choose a new directory", dir.display());
    let resource = format!("example.com/{name}");
    let crate_name = name.replace('-', "_");
    let fill =
        |t: &str| t.replace("{{name}}", name).replace("{{resource}}", &resource).replace("{{crate}}", &crate_name);
    let wit = WIT;
    let mut files: Vec<(String, String)> = wit.iter().map(|(f, t)| (format!("wit/{f}"), (*t).to_owned())).collect();
    files.push((
        "devplug.toml".into(),
        format!("# What this backend may see and hand out; the operator grants it (or less) in devplug's config.\n# Its name is its .wasm file's name; `devplug pack X.wasm devplug.toml` stores this as X.toml.\n[requests]\n# It reads only /dev. A backend that reads sysfs asks for those paths here: run\n# `devplug discover --learn-requests {name} --backend {name}.wasm` to print exactly what yours\n# uses; a PCI one, for example:\n# sysfs = [\"bus/pci/devices\", \"bus/pci/devices/*/{{vendor,device,class,numa_node}}\"]\nsysfs = []\ndev = [\"{name}*\"]\nresources = [\"{resource}\"]\n# Env keys it sets in containers, and mounts (host paths, their container paths): none yet.\nenv = []\nmounts = []\nmount_targets = []\n"),
    ));
    // A claim as kube-scheduler takes it, selecting by a typed attribute `describe` gives: what
    // `devplug try --dra RESOURCE` then `claim claim.yaml` allocates and prepares.
    let driver = Config::default().dra_driver(name);
    let class = crate::dra::publish::classes::class_name(&resource);
    files.push((
        "claim.yaml".into(),
        format!(
            "# One {name} device, the one whose node's minor number is 1, as kube-scheduler allocates it:\n\
             # `devplug try --dra {resource} ...`, then `claim claim.yaml` (or `kubectl apply -f` on a cluster).\n\
             apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata:\n  name: {name}-one\nspec:\n  devices:\n\
             \x20   requests:\n    - name: dev\n      exactly:\n        deviceClassName: {class}\n        selectors:\n\
             \x20       - cel:\n            expression: device.attributes[\"{driver}\"].minor == 1\n"
        ),
    ));
    files.push((format!("tests/fixture/dev/{name}0"), "c 240:0\n".into()));
    files.push((format!("tests/fixture/dev/{name}1"), "c 240:1\n".into()));
    files.push(("tests/fixture/sys/README".into(), "A fixture /sys: add the attributes your backend reads.\n".into()));
    let (build, test, wasm) = match lang {
        Lang::Rust => {
            files.push(("Cargo.toml".into(), fill(include_str!("../../templates/rust/Cargo.toml"))));
            files.push(("src/lib.rs".into(), fill(include_str!("../../templates/rust/lib.rs"))));
            files.push(("devplug-sdk/Cargo.toml".into(), include_str!("../../templates/rust/sdk-Cargo.toml").into()));
            for (f, t) in SDK {
                // The vendored SDK finds the WIT beside it, not in devplug's repository layout.
                files.push((format!("devplug-sdk/src/{f}"), t.replace("\"../../wit/since_v0.3.0\"", "\"../wit\"")));
            }
            files.push((".gitignore".into(), "/target\n".into()));
            // Cargo names the artifact after the crate (`-` becomes `_`); the backend's name is
            // its file's, so the build copies it to NAME.wasm, as the manifest's comments say.
            (
                format!(
                    "cargo build --release --target wasm32-wasip2\ncp target/wasm32-wasip2/release/{crate_name}.wasm {name}.wasm"
                ),
                "cargo test".to_owned(),
                format!("{name}.wasm"),
            )
        }
        Lang::Python => {
            // Under src/, so componentize-py reads only the app, never the fixture tree (which has
            // sysfs's symlink loops).
            files.push(("src/app.py".into(), fill(include_str!("../../templates/python/app.py"))));
            files.push(("test.sh".into(), fill(include_str!("../../templates/python/test.sh"))));
            files.push((".gitignore".into(), "*.wasm\n__pycache__/\n".into()));
            (
                format!("componentize-py -d wit -w devplug-backend componentize app -p src -o {name}.wasm"),
                "./test.sh".to_owned(),
                format!("{name}.wasm"),
            )
        }
        Lang::Js => {
            files.push(("backend.js".into(), fill(include_str!("../../templates/js/backend.js"))));
            files.push(("test.js".into(), fill(include_str!("../../templates/js/test.js"))));
            files.push(("package.json".into(), fill(include_str!("../../templates/js/package.json"))));
            let lock = include_str!("../../templates/js/package-lock.json").replace("devplug-example-js-fusetun", name);
            files.push(("package-lock.json".into(), lock));
            files.push((".gitignore".into(), "node_modules/\n*.wasm\n".into()));
            ("npm install && npm run build".to_owned(), "npm test".to_owned(), format!("{name}.wasm"))
        }
    };
    files.push((
        "README.md".into(),
        format!(
            "# {name}\n\nA devplug backend serving `{resource}`, generated by `devplug new backend`.\n\n\
             ```sh\n{build}\n{test}\ndevplug discover --backend {wasm} --manifest devplug.toml --sysfs-root tests/fixture/sys --dev-root tests/fixture/dev --dev-fixtures\n\
             devplug pack --out image {wasm} devplug.toml\n```\n\n\
             The contract is `wit/` (devplug:backend@{}). See devplug's docs/writing-a-backend.md.\n",
            wit_version(lang)
        ),
    ));
    let mut written = Vec::new();
    for (rel, text) in files {
        let p = dir.join(&rel);
        std::fs::create_dir_all(p.parent().unwrap_or(dir)).with_context(|| format!("{}", p.display()))?;
        std::fs::write(&p, text).with_context(|| format!("{}", p.display()))?;
        written.push(p);
    }
    if lang == Lang::Python {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.join("test.sh"), std::fs::Permissions::from_mode(0o755))?;
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rust_project_with_a_dash_builds_the_backend_its_manifest_names() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("p");
        new_backend("mi300x-rs", Lang::Rust, &dir).unwrap();
        let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
        assert!(readme.contains("cp target/wasm32-wasip2/release/mi300x_rs.wasm mi300x-rs.wasm"), "{readme}");
        assert!(readme.contains("devplug discover --backend mi300x-rs.wasm"), "{readme}");
        let manifest = std::fs::read_to_string(dir.join("devplug.toml")).unwrap();
        assert!(manifest.contains("--backend mi300x-rs.wasm"), "{manifest}");
    }

    #[test]
    fn names_are_checked_and_directories_never_overwritten() {
        let d = tempfile::tempdir().unwrap();
        assert!(
            new_backend("Bad_Name", Lang::Rust, &d.path().join("x")).unwrap_err().to_string().contains("[a-z0-9-]")
        );
        assert!(new_backend("ok", Lang::Js, d.path()).unwrap_err().to_string().contains("already exists"));
        let files = new_backend("my-dev", Lang::Rust, &d.path().join("my-dev")).unwrap();
        let lib = std::fs::read_to_string(d.path().join("my-dev/src/lib.rs")).unwrap();
        assert!(lib.contains("example.com/my-dev") && !lib.contains("{{"), "{lib}");
        let sdk = std::fs::read_to_string(d.path().join("my-dev/devplug-sdk/src/lib.rs")).unwrap();
        assert!(sdk.contains("path: \"../wit\""), "the vendored SDK points at the project's WIT");
        assert!(files.iter().any(|f| f.ends_with("wit/backend.wit")));
    }

    #[test]
    fn the_vendored_sdk_has_every_file_of_the_sdk() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../guests/sdk/src");
        let mut files: Vec<String> =
            std::fs::read_dir(dir).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        files.sort();
        let mut vendored: Vec<String> = SDK.iter().map(|(f, _)| (*f).to_owned()).collect();
        vendored.sort();
        assert_eq!(files, vendored, "add the new SDK file to scaffold::SDK (and its deps to sdk-Cargo.toml)");
    }
}
