//! What a backend *returns* is untrusted input too: every device node, mount, env key,
//! annotation and resource name it hands to kubelet or a CDI spec is checked here against its
//! capabilities, as its reads are checked by the [`Jail`].
//!
//! - A device node's host path resolves through the backend's own dev jail (requested ∩
//!   granted) and must be a real character or block device; the numbers read there are kept on
//!   the node, so the CDI spec never looks the path up again.
//! - A mount's host path must be absolute, clean and match the backend's `mounts` capability;
//!   its container path must be absolute, clean and not `/`, `/proc`, `/sys` or `/dev`.
//! - Env keys are plain names and never loader or interpreter hooks (`LD_*`, `PYTHONPATH`, …).
//! - Annotation keys must match the backend's `annotations` capability and never `cdi.k8s.io/`
//!   (the host writes those itself).
//! - Resource names must match the backend's `resources` capability.
//! - Counts and sizes are capped, so a backend cannot make the host hold or stream megabytes.
//!
//! A refusal refuses the whole answer (never half of one) and says which backend, resource,
//! device, field and rule.

use super::caps::{Capabilities, Rule};
use super::jail::{FsError, Jail, MAX_BATCH, NodeStat, NodeType, OpenDirs};
use crate::model::{ContainerEdits, DeviceNode, NodeNumbers, Resource};
use crate::untrusted::clip;

/// Resources one backend may serve.
pub const MAX_RESOURCES: usize = 64;
/// Devices one resource may have.
pub const MAX_DEVICES: usize = 8192;
/// Entries in one set of edits (nodes, mounts, env and annotations each).
pub const MAX_EDIT_ENTRIES: usize = 256;
/// Attributes of one device.
pub const MAX_ATTRIBUTES: usize = 64;
/// Longest string anywhere in an answer.
pub const MAX_STRING: usize = 4096;
/// All the strings of one answer together.
pub const MAX_ANSWER_BYTES: usize = 8 << 20;

/// Env keys a container runtime or dynamic loader acts on before the workload runs: a backend
/// that could set them could run code in every container that gets its devices.
const FORBIDDEN_ENV: &[&str] = &[
    "BASH_ENV",
    "ENV",
    "GCONV_PATH",
    "GETCONF_DIR",
    "HOSTALIASES",
    "JAVA_TOOL_OPTIONS",
    "LOCALDOMAIN",
    "LOCPATH",
    "MALLOC_TRACE",
    "NIS_PATH",
    "NLSPATH",
    "NODE_OPTIONS",
    "PATH",
    "PERL5LIB",
    "PERL5OPT",
    "PYTHONHOME",
    "PYTHONPATH",
    "PYTHONSTARTUP",
    "RESOLV_HOST_CONF",
    "RES_OPTIONS",
    "RUBYLIB",
    "RUBYOPT",
    "TMPDIR",
    "TZDIR",
    "_JAVA_OPTIONS",
];
const FORBIDDEN_ENV_PREFIXES: &[&str] = &["LD_", "DYLD_", "MALLOC_"];

/// Container paths no mount may cover.
const FORBIDDEN_MOUNT_TARGETS: &[&str] = &["/", "/proc", "/sys", "/dev"];

/// What a backend may hand out: its dev jail for nodes, and the rules for the rest.
pub struct ReturnRules {
    dev: std::sync::Arc<Jail>,
    mounts: Rule,
    annotations: Rule,
    resources: Rule,
}

impl ReturnRules {
    pub fn new(caps: &Capabilities, dev: std::sync::Arc<Jail>) -> Self {
        ReturnRules {
            dev,
            mounts: caps.mounts.clone(),
            annotations: caps.annotations.clone(),
            resources: caps.resources.clone(),
        }
    }

    /// Whether the backend may serve `resource`, and if not, why.
    pub fn resource(&self, name: &str) -> Result<(), String> {
        if self.resources.allows(name) {
            return Ok(());
        }
        let why = if self.resources.requested(name) {
            "the operator's grant does not include it (grant.resources)"
        } else {
            "the backend's manifest does not request it ([requests] resources)"
        };
        Err(format!("resource name {}: {why}", clip(name)))
    }

    /// Check a discover answer and fill in each device node's numbers.
    pub fn discover(&self, resources: &mut [Resource]) -> Result<(), String> {
        if resources.len() > MAX_RESOURCES {
            return Err(format!("{} resources, more than {MAX_RESOURCES}", resources.len()));
        }
        let stats = self.node_stats(resources.iter().flat_map(|r| {
            std::iter::once(&r.common_edits).chain(r.devices.iter().take(MAX_DEVICES).map(|d| &d.edits))
        }));
        let mut size = Size::default();
        for r in resources.iter_mut() {
            size.add(&r.name)?;
            self.resource(&r.name)?;
            let at = |d: &str| format!("resource {}{d}", r.name);
            if r.devices.len() > MAX_DEVICES {
                return Err(format!("{}: {} devices, more than {MAX_DEVICES}", at(""), r.devices.len()));
            }
            self.edits(&mut r.common_edits, &mut size, &stats).map_err(|e| format!("{}, common edits: {e}", at("")))?;
            let mut ids = std::collections::HashSet::new();
            for d in &mut r.devices {
                if let Some(p) = crate::model::device_id_problem(&d.id) {
                    return Err(format!("{}: {}", at(""), clip(&p)));
                }
                if !ids.insert(d.id.clone()) {
                    return Err(format!("{}: duplicate device ID {:?}", at(""), clip(&d.id)));
                }
                let place = || at(&format!(", device {}", clip(&d.id)));
                size.add(&d.id).map_err(|e| format!("{}: {e}", place()))?;
                if d.attributes.len() > MAX_ATTRIBUTES {
                    return Err(format!("{}: more than {MAX_ATTRIBUTES} attributes", place()));
                }
                for (k, v) in &d.attributes {
                    size.add(k).and_then(|_| size.add(v)).map_err(|e| format!("{}: attribute: {e}", place()))?;
                }
                self.edits(&mut d.edits, &mut size, &stats).map_err(|e| format!("{}: {e}", place()))?;
            }
        }
        Ok(())
    }

    /// The host nodes of an answer's edits, each distinct path stat'ed once, in one batch (each
    /// directory such as `/dev/infiniband` opened once, not once per device). Bounded like the
    /// answer itself; a node past the bound is stat'ed on its own when checked.
    fn node_stats<'a>(&self, edits: impl Iterator<Item = &'a ContainerEdits>) -> NodeStats {
        let mut seen = std::collections::HashSet::new();
        let mut paths = Vec::new();
        let mut bytes = 0;
        'all: for e in edits {
            for n in e.device_nodes.iter().take(MAX_EDIT_ENTRIES) {
                let Some(rel) = n.host_path().strip_prefix("/dev/") else { continue };
                bytes += rel.len();
                if bytes > MAX_ANSWER_BYTES || paths.len() >= MAX_BATCH {
                    break 'all;
                }
                if seen.insert(rel) {
                    paths.push(rel.to_owned());
                }
            }
        }
        let answers =
            self.dev.stat_nodes(&paths, &mut OpenDirs::default(), &mut crate::runtime::limits::Meter::default());
        NodeStats(paths.into_iter().zip(answers).collect())
    }

    /// Check an allocate answer for `resource`.
    pub fn allocate(&self, resource: &str, edits: &mut ContainerEdits) -> Result<(), String> {
        self.edits(edits, &mut Size::default(), &NodeStats::default())
            .map_err(|e| format!("resource {resource}, allocate: {e}"))
    }

    fn edits(&self, e: &mut ContainerEdits, size: &mut Size, stats: &NodeStats) -> Result<(), String> {
        for (what, n) in [
            ("device nodes", e.device_nodes.len()),
            ("mounts", e.mounts.len()),
            ("env", e.env.len()),
            ("annotations", e.annotations.len()),
        ] {
            if n > MAX_EDIT_ENTRIES {
                return Err(format!("{n} {what}, more than {MAX_EDIT_ENTRIES}"));
            }
        }
        for n in &mut e.device_nodes {
            size.add(&n.container_path)?;
            size.add(&n.host_path)?;
            self.node(n, stats)?;
        }
        for m in &e.mounts {
            size.add(&m.container_path)?;
            size.add(&m.host_path)?;
            self.mount(&m.host_path, &m.container_path)?;
        }
        for (k, v) in &e.env {
            size.add(k)?;
            size.add(v)?;
            env_key(k)?;
        }
        for (k, v) in &e.annotations {
            size.add(k)?;
            size.add(v)?;
            self.annotation(k)?;
        }
        Ok(())
    }

    fn node(&self, n: &mut DeviceNode, stats: &NodeStats) -> Result<(), String> {
        let field = |what: &str, why: String| format!("device node {what}: {why}");
        clean_absolute(&n.container_path).map_err(|why| field("container path", why))?;
        if !n.container_path.starts_with("/dev/") {
            return Err(field("container path", format!("{} is not under /dev/", clip(&n.container_path))));
        }
        if !n.permissions.chars().all(|c| matches!(c, 'r' | 'w' | 'm')) {
            return Err(field("permissions", format!("{:?} is not made of r, w, m", clip(&n.permissions))));
        }
        let host = n.host_path().to_owned();
        clean_absolute(&host).map_err(|why| field("host path", why))?;
        let rel = host
            .strip_prefix("/dev/")
            .ok_or_else(|| field("host path", format!("{} is not under /dev/", clip(&host))))?;
        let st = match stats.0.get(rel) {
            Some(known) => known.clone(),
            None => self.dev.stat_node(rel),
        }
        .map_err(|e| field("host path", format!("{}: {e}", clip(&host))))?;
        let block = match st.kind {
            NodeType::Char => false,
            NodeType::Block => true,
            _ => return Err(field("host path", format!("{} is not a character or block device", clip(&host)))),
        };
        n.numbers = Some(NodeNumbers { block, major: st.major, minor: st.minor });
        Ok(())
    }

    fn mount(&self, host: &str, container: &str) -> Result<(), String> {
        let field = |what: &str, why: String| format!("mount {what}: {why}");
        clean_absolute(container).map_err(|why| field("container path", why))?;
        if FORBIDDEN_MOUNT_TARGETS.contains(&container)
            || container.starts_with("/proc/")
            || container.starts_with("/sys/")
        {
            return Err(field("container path", format!("{container} must not be mounted over")));
        }
        clean_absolute(host).map_err(|why| field("host path", why))?;
        let rel = &host[1..];
        if rel.is_empty() {
            return Err(field("host path", "the host's root is never mounted".into()));
        }
        if !self.mounts.allows(rel) {
            let why = if self.mounts.requested(rel) {
                "not granted to this backend (grant.mounts)"
            } else {
                "not requested in the backend's manifest ([requests] mounts)"
            };
            return Err(field("host path", format!("{}: {why}", clip(host))));
        }
        // Where the path really leads on this host must be allowed too: a symlink could point a
        // granted name at anything.
        if let Ok(real) = std::fs::canonicalize(host) {
            let real = real.to_string_lossy();
            let real_rel = real.trim_start_matches('/');
            if real_rel != rel && (real_rel.is_empty() || !self.mounts.allows(real_rel)) {
                return Err(field(
                    "host path",
                    format!("{} resolves to {}, which is not allowed", clip(host), clip(&real)),
                ));
            }
        }
        Ok(())
    }

    fn annotation(&self, key: &str) -> Result<(), String> {
        if key.starts_with("cdi.k8s.io/") {
            return Err(format!("annotation {}: cdi.k8s.io/ keys are the host's to write", clip(key)));
        }
        if !self.annotations.allows(key) {
            let why = if self.annotations.requested(key) {
                "not granted to this backend (grant.annotations)"
            } else {
                "not requested in the backend's manifest ([requests] annotations)"
            };
            return Err(format!("annotation {}: {why}", clip(key)));
        }
        Ok(())
    }
}

/// An env key a process may have and no loader or interpreter acts on.
fn env_key(k: &str) -> Result<(), String> {
    let plain = k.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !plain {
        return Err(format!("env key {:?} is not a plain name ([A-Za-z_][A-Za-z0-9_]*)", clip(k)));
    }
    if FORBIDDEN_ENV.contains(&k) || FORBIDDEN_ENV_PREFIXES.iter().any(|p| k.starts_with(p)) {
        return Err(format!("env key {k} changes how programs load or start; no backend may set it"));
    }
    Ok(())
}

/// Absolute, and no `.`, `..`, empty component or NUL.
fn clean_absolute(p: &str) -> Result<(), String> {
    let Some(rest) = p.strip_prefix('/') else {
        return Err(format!("{} is not an absolute path", clip(p)));
    };
    if p.contains('\0') {
        return Err(format!("{} contains NUL", clip(p)));
    }
    if p != "/" && rest.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
        return Err(format!("{} is not clean ('.', '..' or an empty component)", clip(p)));
    }
    Ok(())
}

/// Host node path (below `/dev`) → what the dev jail said about it.
#[derive(Default)]
struct NodeStats(std::collections::HashMap<String, Result<NodeStat, FsError>>);

/// Running total of an answer's string bytes.
#[derive(Default)]
struct Size(usize);

impl Size {
    fn add(&mut self, s: &str) -> Result<(), String> {
        if s.len() > MAX_STRING {
            return Err(format!("a string of {} bytes, more than {MAX_STRING}: {}", s.len(), clip(s)));
        }
        self.0 += s.len();
        if self.0 > MAX_ANSWER_BYTES {
            return Err(format!("the answer is larger than {MAX_ANSWER_BYTES} bytes"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Mount;
    use crate::runtime::caps::Globs;
    use std::sync::Arc;

    fn rules(dev_dir: &std::path::Path, granted: &Globs) -> ReturnRules {
        let requested = Globs {
            dev: vec!["null".into(), "shm/*".into(), "mem".into()],
            mounts: vec!["/opt/vendor/**".into(), "/".into()],
            resources: vec!["example.com/*".into()],
            annotations: vec!["example.com/*".into(), "cdi.k8s.io/*".into()],
            ..Globs::default()
        };
        let caps = Capabilities::new(&requested, granted).unwrap();
        let jail = Jail::new(dev_dir, caps.dev.clone()).with_fixture_nodes(true);
        ReturnRules::new(&caps, Arc::new(jail))
    }

    fn all() -> Globs {
        let all = vec!["**".to_owned()];
        Globs {
            sysfs: vec![],
            procfs: vec![],
            dev: all.clone(),
            mounts: vec!["/**".into()],
            resources: all.clone(),
            annotations: all,
            uevents: vec![],
        }
    }

    fn node(container: &str, host: &str) -> ContainerEdits {
        ContainerEdits {
            device_nodes: vec![DeviceNode {
                container_path: container.into(),
                host_path: host.into(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn mount(host: &str, container: &str) -> ContainerEdits {
        ContainerEdits {
            mounts: vec![Mount { host_path: host.into(), container_path: container.into(), read_only: false }],
            ..Default::default()
        }
    }

    #[test]
    fn every_hostile_edit_is_refused_with_its_reason() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("null"), "c 1:3").unwrap();
        std::fs::create_dir_all(d.path().join("shm")).unwrap();
        std::fs::write(d.path().join("shm/planted"), "plain text").unwrap();
        let r = rules(d.path(), &Globs { dev: vec!["null".into(), "shm/*".into()], ..all() });
        let env = |k: &str| ContainerEdits { env: vec![(k.into(), "x".into())], ..Default::default() };
        let ann = |k: &str| ContainerEdits { annotations: vec![(k.into(), "x".into())], ..Default::default() };
        let cases: Vec<(ContainerEdits, &str)> = vec![
            (node("/dev/sda", ""), "not requested"),
            (node("/dev/mem", ""), "not granted"),
            (node("/dev/innocent", "/dev/mem"), "not granted"),
            (node("/dev/x", "/dev/shm/planted"), "not a character or block device"),
            (node("/dev/x", "/etc/passwd"), "not under /dev/"),
            (node("/dev/x", "/dev/../etc/passwd"), "not clean"),
            (node("/etc/x", "/dev/null"), "not under /dev/"),
            (mount("/", "/host"), "root is never mounted"),
            (mount("/var/run/containerd/containerd.sock", "/c.sock"), "not requested"),
            (mount("/var/lib/kubelet", "/k"), "not requested"),
            (mount("/opt/vendor/lib", "/proc/sys"), "must not be mounted over"),
            (mount("/opt/vendor/lib", "/"), "must not be mounted over"),
            (mount("/opt/vendor/../../etc", "/e"), "not clean"),
            (mount("opt/vendor/lib", "/e"), "not an absolute path"),
            (env("LD_PRELOAD"), "changes how programs load"),
            (env("PYTHONPATH"), "changes how programs load"),
            (env("A=B"), "not a plain name"),
            (ann("cdi.k8s.io/x"), "host's to write"),
            (ann("other.io/x"), "not requested"),
        ];
        for (mut e, needle) in cases {
            let shown = format!("{e:?}");
            let err = r.allocate("example.com/x", &mut e).expect_err(&shown);
            assert!(err.contains(needle), "{shown}: {err}");
        }
    }

    #[test]
    fn what_is_granted_passes_and_nodes_carry_their_numbers() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("null"), "c 1:3").unwrap();
        let r = rules(d.path(), &all());
        let mut e = node("/dev/devplug-null", "/dev/null");
        e.merge(&mount("/opt/vendor/lib", "/usr/local/vendor"));
        e.env.push(("NVIDIA_VISIBLE_DEVICES".into(), "0,1".into()));
        e.annotations.push(("example.com/x".into(), "y".into()));
        r.allocate("example.com/x", &mut e).unwrap();
        assert_eq!(e.device_nodes[0].numbers, Some(NodeNumbers { block: false, major: 1, minor: 3 }));
        assert!(r.resource("example.com/x").is_ok());
        assert!(r.resource("nvidia.com/gpu").unwrap_err().contains("does not request"));
    }

    #[test]
    fn answers_beyond_the_caps_are_refused_whole() {
        let d = tempfile::tempdir().unwrap();
        let r = rules(d.path(), &all());
        let dev = |i: usize| crate::model::Device {
            id: format!("d{i}"),
            health: crate::model::Health::Healthy,
            numa_nodes: vec![],
            attributes: vec![],
            edits: ContainerEdits::default(),
        };
        let many = Resource {
            name: "example.com/x".into(),
            devices: (0..MAX_DEVICES + 1).map(dev).collect(),
            ..Default::default()
        };
        assert!(r.discover(&mut [many]).unwrap_err().contains("more than"));
        let big = Resource {
            name: "example.com/x".into(),
            devices: vec![crate::model::Device {
                attributes: vec![("k".into(), "v".repeat(MAX_STRING + 1))],
                ..dev(0)
            }],
            ..Default::default()
        };
        assert!(r.discover(&mut [big]).unwrap_err().contains("device d0"));
        let stolen = Resource { name: "nvidia.com/gpu".into(), devices: vec![dev(0)], ..Default::default() };
        assert!(r.discover(&mut [stolen]).unwrap_err().contains("nvidia.com/gpu"));
    }
}
