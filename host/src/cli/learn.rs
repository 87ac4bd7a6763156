//! `devplug discover --learn-requests NAME`: run backend NAME's `init` and `discover` with a grant
//! of everything on this machine (or a fixture tree), record every path it read, listed, resolved,
//! stat'ed or globbed, and print the narrowest `[requests]` that allows exactly that: each path
//! as asked and as it resolves (sysfs is full of links), PCI addresses and instance numbers
//! turned into wildcards so the manifest fits other machines too (a PCI device at any depth of
//! bridges and switches: `devices/pci*/**`), plus the nodes discover hands out and the
//! manifest's uevent subscriptions, one comment per line.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::SourceArgs;
use crate::backends::{BackendSource, manifest_for};
use crate::model::Resource;
use crate::runtime::caps::{Capabilities, Globs};
use crate::runtime::jail::Jail;
use crate::runtime::learn::{Learned, at_root, general};
use crate::runtime::state::Sandbox;
use crate::runtime::{BackendInstance, Runtime, RuntimeConfig};

/// The `[requests]` backend `name` needs, as TOML with a comment per line.
/// `merge`: files holding `[requests]` learned before, added to what this run learns.
pub fn learn_requests(args: &SourceArgs, name: &str, merge: &[std::path::PathBuf]) -> anyhow::Result<String> {
    // Read first: a bad file is reported before the backend runs.
    let mut earlier = Vec::new();
    for path in merge {
        let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("--merge {}: {e}", path.display()))?;
        earlier.push((path.display().to_string(), text));
    }
    let mut sources = BackendSource::embedded();
    for path in &args.backends {
        sources.push(BackendSource::from_file_with(path, manifest_for(path, args.manifest.as_deref()).as_deref())?);
    }
    let src = sources
        .into_iter()
        .rev()
        .find(|s| s.name == name)
        .ok_or_else(|| anyhow::anyhow!("no backend named {name} (embedded, or a --backend file {name}.wasm)"))?;
    let every: Vec<String> = vec!["**".into()];
    // procfs is where other processes' secrets are (`environ`, `cmdline`, devplug's own under
    // `self`): learning grants only what the manifest already asks for there, and of that only
    // patterns rooted in a named, non-process directory (`driver/nvidia/**`, `sys/kernel/*`).
    let (procfs, withheld) = learnable_procfs(&src.manifest.requests.procfs);
    for p in &withheld {
        tracing::warn!(
            backend = name,
            "learning without procfs {}: it can reach other processes' files; grant it by hand if it is needed",
            crate::gate::clip(p)
        );
    }
    let all = Globs {
        sysfs: every.clone(),
        dev: every.clone(),
        procfs,
        mounts: vec!["/**".into()],
        mount_targets: vec!["/**".into()],
        writable_mounts: vec!["/**".into()],
        env: vec!["*".into()],
        resources: vec!["*/*".into()],
        annotations: every,
        uevents: vec![],
    };
    let caps = Capabilities::new(&all, &all).map_err(anyhow::Error::msg)?;
    let roots = args.roots(&args.load_config()?);
    let learned = Arc::new(Learned::default());
    let runtime =
        Runtime::new(super::cache::one_shot(RuntimeConfig::default(), args.cache_dir.as_deref(), args.no_cache))?;
    let sandbox = Sandbox::new(name, &caps, &roots, runtime.config.memory_cap).learning(learned.clone());
    let config = src.manifest.config.clone().unwrap_or_default();
    let inst = BackendInstance::load(&runtime, &src.bytes, config, sandbox)?;
    let found = inst.discover()?;
    let sysfs = Jail::new(&roots.sys, caps.sysfs.clone());
    let procfs = Jail::new(&roots.proc, caps.procfs.clone());
    let dev = Jail::new(&roots.dev, caps.dev.clone()).with_fixture_nodes(roots.dev_fixtures);
    let mut out = Requests::default();
    let seen = learned.seen();
    for ((call, path), times) in &seen {
        let (view, what) = call.split_once('.').unwrap_or(("", call.as_str()));
        let (jail, list) = match view {
            "sysfs" => (&sysfs, &mut out.sysfs),
            "procfs" => (&procfs, &mut out.procfs),
            "devfs" => (&dev, &mut out.dev),
            _ => continue,
        };
        let path = path.as_str();
        let how = format!("{what} ×{times}");
        if what == "glob" {
            // A glob's matches are each stat'ed through the grant (and learned as such); the
            // pattern itself is what the backend asked, not what it used (`*` would grant all).
            continue;
        }
        // A listing asks for the directory's names (`DIR/`), never its entries' contents: the
        // entries the backend went on to open are learned from those calls.
        let names = what.starts_with("list-dir");
        if !names && write_only(jail, path) {
            list.leave_out(path, "write-only (a control file the backend has no use reading)");
            continue;
        }
        let slash = if names { "/" } else { "" };
        list.add(&format!("{path}{slash}"), &how, path, true);
        // Sysfs is full of links: the path as it resolves must be allowed too.
        let follow = !what.starts_with("read-link");
        if let Ok(r) = jail.resolve(path, follow)
            && !r.canonical.is_empty()
            && r.canonical != path
        {
            list.add(&format!("{}{slash}", r.canonical), &format!("{what}, resolved"), path, true);
        }
        // The entries of a listing the backend went on to open (`vfio-pci/0000:3b:00.6` on the
        // way to its `vendor`) as paths too: where a manifest asks for the directory whole
        // rather than `DIR/`, a listing shows only the entries granted whole.
        if names {
            for entry in opened_below(&seen, view, path).into_iter().filter(|e| !write_only(jail, e)) {
                list.add(&entry, "listed, then opened", &entry, true);
                if let Ok(r) = jail.resolve(&entry, true)
                    && r.canonical != entry
                {
                    list.add(&r.canonical, "listed, then opened, resolved", &entry, true);
                }
            }
        }
    }
    // A device's `pci` attribute is checked against the sysfs grant where it is handed out
    // (`bus/pci/devices/<address>` and where that leads), whether or not the backend read there.
    for d in found.iter().flat_map(|r| &r.devices) {
        for (_, address) in d.attributes.iter().filter(|(k, v)| k == "pci" && crate::gate::is_bus_id(v)) {
            let path = format!("bus/pci/devices/{address}");
            out.sysfs.add(&path, "a device's pci attribute", &d.id, true);
            if let Ok(r) = sysfs.resolve(&path, true) {
                out.sysfs.add(&r.canonical, "a device's pci attribute, resolved", &d.id, true);
            }
        }
    }
    out.outputs(inst.info().resources.iter().map(|(n, _)| n.clone()), &found);
    // Uevent subscriptions are the manifest's word: a run does not show which it needs.
    for u in &src.manifest.requests.uevents {
        out.uevents.add(u, "the manifest's (a run cannot show them)", u, false);
    }
    for (path, text) in &earlier {
        out.merge(text, path).map_err(|e| anyhow::anyhow!("--merge {path}: {e}"))?;
    }
    Ok(out.render(name, &roots.sys.display().to_string()))
}

/// Why a `--merge` file was refused.
#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    #[error("not TOML: {0}")]
    NotToml(#[from] toml::de::Error),
    #[error("it has no [requests] table (merge the output of --learn-requests or a manifest)")]
    NoRequests,
    #[error("[requests] {0} is not a request this host knows")]
    UnknownKey(String),
    #[error("[requests] {0} is not a list of strings")]
    NotStrings(String),
}

/// Longest pattern a learned manifest holds (a manifest's globs are capped at 512 bytes).
const MAX_PATTERN: usize = 512;

/// The entries of directory `dir` (in `view`) that a learned call went into or opened.
fn opened_below(seen: &BTreeMap<(String, String), u64>, view: &str, dir: &str) -> BTreeSet<String> {
    let prefix = if dir.is_empty() { String::new() } else { format!("{dir}/") };
    seen.keys()
        .filter(|(call, _)| call.split('.').next() == Some(view))
        .filter_map(|(_, p)| p.strip_prefix(&prefix)?.split('/').next())
        .filter(|e| !e.is_empty())
        .map(|e| format!("{prefix}{e}"))
        .collect()
}

/// Whether `path` is a file nobody may read (mode without any read bit: sysfs's `bind`,
/// `unbind`, `new_id`, `remove_id` and `uevent` are 0200, `drivers/base/bus.c`,
/// `drivers/pci/pci-driver.c`). Root reads them all the same, so the run cannot tell by trying.
fn write_only(jail: &Jail, path: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    jail.resolve(path, true)
        .ok()
        .and_then(|r| std::fs::metadata(r.real).ok())
        .is_some_and(|m| m.is_file() && m.permissions().mode() & 0o444 == 0)
}

/// One kind of request: pattern → (how it was used, an example path); and the paths left out,
/// each with why.
#[derive(Default)]
struct Patterns(BTreeMap<String, (BTreeSet<String>, String)>, BTreeMap<String, &'static str>);

impl Patterns {
    fn leave_out(&mut self, path: &str, why: &'static str) {
        self.1.insert(general(path), why);
    }

    fn add(&mut self, path: &str, how: &str, example: &str, generalize: bool) {
        let pattern = if generalize { general(path) } else { path.to_owned() };
        let e = self.0.entry(pattern).or_insert_with(|| (BTreeSet::new(), example.to_owned()));
        e.0.insert(how.split(" ×").next().unwrap_or(how).to_owned());
    }
}

#[derive(Default)]
struct Requests {
    sysfs: Patterns,
    dev: Patterns,
    procfs: Patterns,
    resources: Patterns,
    env: Patterns,
    mounts: Patterns,
    mount_targets: Patterns,
    writable_mounts: Patterns,
    annotations: Patterns,
    uevents: Patterns,
}

impl Requests {
    /// What the backend handed out in `init` and `discover`.
    fn outputs(&mut self, names: impl Iterator<Item = String>, found: &[Resource]) {
        for n in names {
            self.resources.add(&n, "served", &n, false);
        }
        for r in found {
            let edits = std::iter::once(&r.common_edits).chain(r.devices.iter().map(|d| &d.edits));
            for e in edits {
                // Nodes handed out (`accel_controlD0`) need `dev` even when never stat'ed.
                for n in &e.device_nodes {
                    if let Some(rel) = n.host_path().strip_prefix("/dev/") {
                        self.dev.add(rel, "handed out", &r.name, true);
                    }
                }
                for (k, _) in &e.env {
                    self.env.add(k.as_str(), "set", &r.name, false);
                }
                for (k, _) in &e.annotations {
                    self.annotations.add(k, "set", &r.name, false);
                }
                for m in &e.mounts {
                    self.mounts.add(&m.host_path, "mounted", &r.name, false);
                    self.mount_targets.add(&m.container_path, "mounted at", &r.name, false);
                    if !m.read_only {
                        self.writable_mounts.add(&m.host_path, "mounted read-write", &r.name, false);
                    }
                }
            }
        }
    }

    /// Every kind of request under its manifest key, in the manifest's order.
    fn kinds(&mut self) -> [(&'static str, &mut Patterns); 10] {
        [
            ("sysfs", &mut self.sysfs),
            ("dev", &mut self.dev),
            ("procfs", &mut self.procfs),
            ("resources", &mut self.resources),
            ("env", &mut self.env),
            ("mounts", &mut self.mounts),
            ("mount_targets", &mut self.mount_targets),
            ("writable_mounts", &mut self.writable_mounts),
            ("annotations", &mut self.annotations),
            ("uevents", &mut self.uevents),
        ]
    }

    /// Add the `[requests]` of a manifest learned before (`--merge`): every pattern as written,
    /// its comment naming the file.
    fn merge(&mut self, text: &str, file: &str) -> Result<(), MergeError> {
        let doc: toml::Table = toml::from_str(text)?;
        let requests = doc.get("requests").and_then(toml::Value::as_table).ok_or(MergeError::NoRequests)?;
        let file = crate::gate::clip_to(file, 80).replace(char::is_control, "?");
        let how = format!("learned before ({file})");
        for (key, value) in requests {
            let named = || crate::gate::clip(key).into_owned();
            let mut kinds = self.kinds();
            let list = kinds.iter_mut().find(|(k, _)| k == key).ok_or_else(|| MergeError::UnknownKey(named()))?;
            let patterns = value.as_array().ok_or_else(|| MergeError::NotStrings(named()))?;
            for p in patterns {
                list.1.add(p.as_str().ok_or_else(|| MergeError::NotStrings(named()))?, &how, &file, false);
            }
        }
        Ok(())
    }

    fn render(&mut self, name: &str, root: &str) -> String {
        let mut out = format!(
            "# Learned by `devplug discover --learn-requests {name}` on {root}: what init and discover\n\
             # used. allocate may hand out more (see `devplug allocate`); review before shipping.\n\
             [requests]\n"
        );
        for (key, p) in self.kinds() {
            if p.0.is_empty() && p.1.is_empty() {
                if key == "uevents" {
                    // A run cannot show which kernel events a backend wants to be woken by.
                    out.push_str(
                        "# uevents: the kernel subsystems whose events should run discover at once (e.g. [\"pci\", \"net\"]);\n\
                         # a run cannot show them, so add the ones your devices come and go through.\n",
                    );
                }
                out.push_str(&format!("{key} = []\n"));
                continue;
            }
            out.push_str(&format!("{key} = [\n"));
            for (pattern, why) in &p.1 {
                let shown = crate::gate::clip_to(pattern, 120).replace(char::is_control, "?");
                out.push_str(&format!("  # left out: {shown} is {why}\n"));
            }
            for (pattern, (how, example)) in &p.0 {
                // A backend chose these paths: a pattern no grant could hold is left out (and
                // said so), a comment's example is clipped and escaped so it stays a comment.
                if pattern.len() > MAX_PATTERN || pattern.chars().any(char::is_control) {
                    out.push_str(&format!(
                        "  # left out: a path of {} bytes or with control characters\n",
                        pattern.len()
                    ));
                    continue;
                }
                if key != "resources" && key != "uevents" && at_root(pattern) {
                    let shown = crate::gate::clip_to(pattern, 40).replace(char::is_control, "?");
                    out.push_str(&format!("  # left out: {shown:?} is a wildcard at the root of the tree\n"));
                    continue;
                }
                let how: Vec<&str> = how.iter().map(String::as_str).collect();
                let line = format!("  {},", toml_string(pattern));
                let example = crate::gate::clip_to(example, 120);
                out.push_str(&format!("{line:<60} # {} (e.g. {example})\n", how.join(", ")));
            }
            out.push_str("]\n");
        }
        out
    }
}

/// The manifest's procfs requests a learning run may use, and those it withholds: a pattern
/// passes only when its first component is a literal name that is not a process (`self`,
/// `thread-self`, a PID) and no component names a process's `environ`, `cmdline`, `mem` or
/// `maps`-like files.
fn learnable_procfs(requested: &[String]) -> (Vec<String>, Vec<String>) {
    const PROCESS_FILES: &[&str] = &["environ", "cmdline", "mem", "maps", "smaps", "fd", "cwd", "root", "exe", "auxv"];
    requested.iter().cloned().partition(|p| {
        let first = p.split('/').next().unwrap_or("");
        let literal = !first.is_empty() && first.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c));
        literal
            && !first.chars().all(|c| c.is_ascii_digit())
            && !matches!(first, "self" | "thread-self")
            && !p.split('/').any(|c| PROCESS_FILES.contains(&c))
    })
}

fn toml_string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| format!("{s:?}"))
}

#[cfg(test)]
mod tests {
    use super::{Requests, general, learnable_procfs};

    #[test]
    fn learning_never_opens_other_processes_files() {
        let asked: Vec<String> = [
            "driver/nvidia/**",
            "sys/kernel/ostype",
            "self/**",
            "**",
            "*/environ",
            "1/cmdline",
            "thread-self/x",
            "driver/x/environ",
        ]
        .map(str::to_owned)
        .to_vec();
        let (kept, withheld) = learnable_procfs(&asked);
        assert_eq!(kept, ["driver/nvidia/**", "sys/kernel/ostype"]);
        assert_eq!(withheld.len(), 6);
    }

    #[test]
    fn learned_output_stays_a_manifest_whatever_the_paths_say() {
        let mut r = Requests::default();
        let forged = "class/x\n[backends.evil.grant]\nsysfs = [\"**\"]";
        r.sysfs.add(forged, "read", forged, false);
        r.sysfs.add(&"a".repeat(100_000), "read", "x", false);
        r.dev.add("null", "stat", forged, false);
        let text = r.render("b", "/");
        assert!(!text.contains("\n[backends"), "{text}");
        let parsed: toml::Value = toml::from_str(&text).expect("the output parses as TOML");
        assert!(parsed.get("backends").is_none(), "{text}");
        assert!(text.len() < 4096, "{} bytes", text.len());
    }

    #[test]
    fn merging_adds_what_was_learned_before_and_refuses_what_is_not_a_manifest() {
        let mut r = Requests::default();
        r.sysfs.add("class/kfd/kfd/topology/nodes/3/properties", "read", "x", true);
        let before = "[requests]\nsysfs = [\"class/kfd/kfd/topology/nodes/[0-9]*/properties\", \"devices/platform/amdgpu_xcp.[0-9]*\"]\ndev = [\"dri/renderD[0-9]*\"]\n";
        r.merge(before, "spx.toml").unwrap();
        let text = r.render("b", "/");
        let parsed: toml::Table = toml::from_str(&text).unwrap();
        let sysfs = parsed["requests"]["sysfs"].as_array().unwrap();
        assert_eq!(sysfs.len(), 2, "one pattern learned twice is one line: {text}");
        assert!(text.contains("learned before (spx.toml)"), "{text}");
        assert_eq!(parsed["requests"]["dev"].as_array().unwrap().len(), 1, "{text}");
        assert!(r.merge("sysfs = []", "f").unwrap_err().to_string().contains("no [requests]"));
        assert!(r.merge("[requests]\nnetwork = [\"*\"]", "f").unwrap_err().to_string().contains("network"));
        assert!(r.merge("[requests]\nsysfs = \"x\"", "f").unwrap_err().to_string().contains("not a list"));
        r.merge("[requests]\nsysfs = [\"a\"]", "evil\n[backends.x]").unwrap();
        assert!(!r.render("b", "/").contains("\n[backends"), "a file name stays in its comment");
    }

    #[test]
    fn machine_specific_parts_become_wildcards() {
        assert_eq!(general("bus/pci/devices/0000:3b:00.0/vendor"), "bus/pci/devices/????:??:??.?/vendor");
        // Any depth of bridges: the same pattern with or without a switch in between.
        assert_eq!(general("devices/pci0000:3a/0000:3a:00.0/0000:3b:00.1/net"), "devices/pci*/**/????:??:??.?/net");
        assert_eq!(
            general("devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0/net"),
            "devices/pci*/**/????:??:??.?/net"
        );
        // A directory's names stay names; a PCI function's pattern matches no control file.
        assert_eq!(general("bus/pci/drivers/vfio-pci/"), "bus/pci/drivers/vfio-pci/");
        assert_eq!(general("bus/pci/drivers/vfio-pci/0000:6b:00.1"), "bus/pci/drivers/vfio-pci/????:??:??.?");
        let function = globset::Glob::new(crate::runtime::learn::PCI_FUNCTION).unwrap().compile_matcher();
        assert!(function.is_match("0000:6b:00.1"));
        for name in ["bind", "unbind", "new_id", "remove_id", "uevent", "module", "net", "driver"] {
            assert!(!function.is_match(name), "{name}");
        }
        assert_eq!(general("devices/pci0000:15"), "devices/pci*");
        assert_eq!(general("class/drm/card1"), "class/drm/card[0-9]*");
        assert_eq!(general("driver/nvidia/capabilities/gpu0/mig"), "driver/nvidia/capabilities/gpu[0-9]*/mig");
        assert_eq!(general("bus/pci/devices"), "bus/pci/devices");
        assert_eq!(general("mlx5_core"), "mlx5_core", "a name that ends in letters stays");
        assert_eq!(general("infiniband/mlx5_0"), "infiniband/mlx5_[0-9]*");
        // Counted-out directories (KFD's topology nodes: 10 in SPX, 66 in CPX on 8 MI300X).
        assert_eq!(
            general("class/kfd/kfd/topology/nodes/12/mem_banks/0/properties"),
            "class/kfd/kfd/topology/nodes/[0-9]*/mem_banks/[0-9]*/properties"
        );
        assert_eq!(general("kernel/iommu_groups/34/devices"), "kernel/iommu_groups/[0-9]*/devices");
        assert_eq!(general("devices/platform/amdgpu_xcp.12/drm"), "devices/platform/amdgpu_xcp.[0-9]*/drm");
        assert_eq!(general("12/status"), "12/status", "a leading number is a procfs PID: never widened");
        // Names a backend chose that look like wildcards stay literal.
        assert_eq!(general("class/x[1]/*"), "class/x\\[1\\]/\\*");
        assert_eq!(general("**"), "\\*\\*");
    }

    #[test]
    fn no_learned_pattern_is_a_wildcard_at_the_root() {
        let mut r = Requests::default();
        for p in ["**", "*", "**/vendor", "*/x", "class/drm"] {
            r.sysfs.add(p, "read", p, false);
        }
        r.resources.add("*/*", "served", "x", false);
        let text = r.render("b", "/");
        let parsed: toml::Table = toml::from_str(&text).unwrap();
        let sysfs = parsed["requests"]["sysfs"].as_array().unwrap();
        assert_eq!(sysfs.len(), 1, "{text}");
        assert_eq!(sysfs[0].as_str(), Some("class/drm"));
        assert!(text.contains("wildcard at the root"), "{text}");
    }
}
