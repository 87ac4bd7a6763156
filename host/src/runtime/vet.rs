//! What a backend *returns* is untrusted input too: every device node, mount, env key,
//! annotation and resource name it hands to kubelet or a CDI spec is checked here against its
//! capabilities, as its reads are checked by the [`Jail`].
//!
//! - A device node's host path resolves through the backend's own dev jail (requested ∩
//!   granted) and must be a real character or block device; the numbers read there are kept on
//!   the node, so the CDI spec never looks the path up again.
//! - A mount's host path must be absolute, clean and match the backend's `mounts` capability;
//!   its container path must match `mount_targets` and never cover what a container's programs
//!   load or trust (the loader and its config, libc, shells, `/etc/passwd|shadow|group`, the
//!   service-account token dir, `/proc`, `/sys`, `/dev`); it is read-only unless its host path
//!   matches `writable_mounts`.
//! - Env keys are plain names matching the backend's `env` capability; keys that make a loader,
//!   shell or runtime run code (`LD_*`, `CUDA_INJECTION*`, `OPENSSL_*`, `PYTHONPATH`, …) pass only
//!   when the operator's grant names that exact key.
//! - Annotation keys must match the backend's `annotations` capability and never `cdi.k8s.io/`
//!   (the host writes those itself).
//! - Resource names must match the backend's `resources` capability.
//! - Counts and sizes are capped, so a backend cannot make the host hold or stream megabytes.
//!
//! A refusal refuses the whole answer (never half of one) and says which backend, resource,
//! device, field and rule.

use super::caps::{Capabilities, Rule};
use super::jail::{FsError, Jail, MAX_BATCH, NodeStat, NodeType, OpenDirs};
use crate::gate::clip;
use crate::model::{ContainerEdits, DeviceNode, NodeNumbers, Resource};

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

/// Env keys a dynamic loader, libc, shell or language runtime acts on before or as the workload
/// runs (code to load, options to inject, where to find modules): a backend that could set them
/// could run code in every container that gets its devices. Refused unless the operator's grant
/// names the exact key.
const HOOK_ENV: &[&str] = &[
    "BASHOPTS",
    "BASH_ENV",
    "CLASSPATH",
    "DOTNET_STARTUP_HOOKS",
    "ENV",
    "GCONV_PATH",
    "GETCONF_DIR",
    "GIO_EXTRA_MODULES",
    "GIO_MODULE_DIR",
    "GLIBC_TUNABLES",
    "GTK_MODULES",
    "HOSTALIASES",
    "IFS",
    "JAVA_TOOL_OPTIONS",
    "JDK_JAVA_OPTIONS",
    "LOCALDOMAIN",
    "LOCPATH",
    "LUA_CPATH",
    "LUA_PATH",
    "NIS_PATH",
    "NLSPATH",
    "NODE_OPTIONS",
    "NODE_PATH",
    "PATH",
    "PERL5LIB",
    "PERL5OPT",
    "PERLLIB",
    "PROMPT_COMMAND",
    "PS4",
    "QT_PLUGIN_PATH",
    "RESOLV_HOST_CONF",
    "RES_OPTIONS",
    "RUBYLIB",
    "RUBYOPT",
    "SHELLOPTS",
    "TMPDIR",
    "TZDIR",
    "_JAVA_OPTIONS",
];
/// Prefixes of the same kind: the loader's and libc's (`LD_`, `DYLD_`, `MALLOC_`), CUDA's
/// injection hooks, OpenSSL's config and engines, exported bash functions, .NET profilers, and
/// Python's startup knobs.
const HOOK_ENV_PREFIXES: &[&str] =
    &["LD_", "DYLD_", "MALLOC_", "CUDA_INJECTION", "OPENSSL_", "BASH_FUNC_", "CORECLR_", "COMPlus_", "PYTHON"];

/// Whether env key `k` is one of the known loader, libc, shell and runtime hooks above: those
/// need the operator's exact word even inside a granted prefix. Every other key is judged by
/// the grant alone, which admits exact keys and vendor prefixes only (`crate::gate::EnvGrant`).
pub fn hook_env(k: &str) -> bool {
    HOOK_ENV.contains(&k) || HOOK_ENV_PREFIXES.iter().any(|p| k.starts_with(p))
}

/// Container paths no mount may cover, whatever the grants: a container's root, kernel views,
/// the directories its programs and libraries come from.
const FORBIDDEN_MOUNT_TARGETS: &[&str] = &[
    "/",
    "/proc",
    "/sys",
    "/dev",
    "/etc",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/usr",
    "/usr/bin",
    "/usr/sbin",
    "/usr/lib",
    "/usr/lib32",
    "/usr/lib64",
    "/usr/libexec",
    "/var/run",
    "/run",
];
/// Files no mount may cover: the loader's config and cache, and the user and group databases.
const FORBIDDEN_MOUNT_FILES: &[&str] = &[
    "/etc/ld.so.preload",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/passwd",
    "/etc/shadow",
    "/etc/group",
    "/etc/gshadow",
    "/etc/sudoers",
    "/etc/nsswitch.conf",
];
/// Trees no mount may land in: kernel views, the loader's config dir, and where Kubernetes puts
/// a pod's service-account token and other secrets.
const FORBIDDEN_MOUNT_TREES: &[&str] =
    &["/proc/", "/sys/", "/etc/ld.so.conf.d/", "/var/run/secrets/", "/run/secrets/", "/etc/sudoers.d/"];
/// Program directories whose shells and loader and libc files no mount may replace.
const PROGRAM_DIRS: &[&str] =
    &["/bin", "/sbin", "/usr/bin", "/usr/sbin", "/lib", "/lib32", "/lib64", "/usr/lib", "/usr/lib32", "/usr/lib64"];
/// Shells (and `env`, which scripts run through), by file name.
const SHELLS: &[&str] = &["sh", "bash", "dash", "ash", "zsh", "ksh", "mksh", "busybox", "env"];
/// File-name prefixes of the dynamic loader and the C library's parts.
const LOADER_FILES: &[&str] =
    &["ld-linux", "ld-musl", "ld.so", "libc.so", "libc-", "libc.musl", "libpthread", "libdl.", "libm.so", "librt."];

/// The discover attribute a backend names a device's PCI address in (standard `pciBusID`,
/// `pcieRoot` are derived from it).
pub const PCI_ATTRIBUTE: &str = "pci";
/// The discover attribute a NIC backend names a device's network interface in (claim status).
pub const NETDEV_ATTRIBUTE: &str = "netdev";

/// A backend's sysfs jail as the PCI address gate asks it: granted means the backend could read
/// `bus/pci/devices/<id>` under both names (the link and where it resolves); present means the
/// kernel lists the device.
struct SysfsPci<'a>(&'a Jail);

impl crate::gate::PciLookup for SysfsPci<'_> {
    fn granted(&self, bus_id: &str) -> bool {
        !matches!(
            self.0.resolve(&format!("bus/pci/devices/{bus_id}"), true),
            Err(FsError::Denied(_) | FsError::InvalidPath(_))
        )
    }

    fn present(&self, bus_id: &str) -> bool {
        self.0.resolve(&format!("bus/pci/devices/{bus_id}"), true).is_ok()
    }
}

/// What a backend may hand out: its dev jail for nodes, and the rules for the rest.
pub struct ReturnRules {
    dev: std::sync::Arc<Jail>,
    /// The backend's sysfs jail: a PCI address it names must be one it may read.
    sysfs: std::sync::Arc<Jail>,
    mounts: Rule,
    mount_targets: Rule,
    writable_mounts: Rule,
    env: crate::gate::EnvRule,
    annotations: Rule,
    resources: Rule,
}

impl ReturnRules {
    pub fn new(caps: &Capabilities, dev: std::sync::Arc<Jail>, sysfs: std::sync::Arc<Jail>) -> Self {
        ReturnRules {
            dev,
            sysfs,
            mounts: caps.mounts.clone(),
            mount_targets: caps.mount_targets.clone(),
            writable_mounts: caps.writable_mounts.clone(),
            env: caps.env.clone(),
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
                d.vetted = crate::model::Vetted::default();
                for (k, v) in &d.attributes {
                    size.add(k).and_then(|_| size.add(v)).map_err(|e| format!("{}: attribute: {e}", place()))?;
                    if let Some(why) = crate::model::dra::reserved_attribute(k) {
                        return Err(format!("{}: {}", place(), clip(&why)));
                    }
                    // The attributes the host derives published values from pass their gates here,
                    // where the backend's grants are known; the rest of the host reads `vetted`.
                    match k.as_str() {
                        PCI_ATTRIBUTE => {
                            let pci = crate::gate::PciAddress::new(v, &SysfsPci(&self.sysfs));
                            d.vetted.pci = Some(pci.map_err(|e| format!("{}: attribute pci: {e}", place()))?);
                        }
                        NETDEV_ATTRIBUTE => {
                            let name = crate::gate::IfName::new(v);
                            d.vetted.netdev = Some(name.map_err(|e| format!("{}: attribute netdev: {e}", place()))?);
                        }
                        _ => {}
                    }
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
        if let Some(why) = &e.malformed {
            return Err(why.clone());
        }
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
            self.mount(&m.host_path, &m.container_path, m.read_only)?;
        }
        for (k, v) in &e.env {
            size.add(k.as_str())?;
            size.add(v.as_str())?;
            self.env_key(k)?;
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

    fn mount(&self, host: &str, container: &str, read_only: bool) -> Result<(), String> {
        let field = |what: &str, why: String| format!("mount {what}: {why}");
        clean_absolute(container).map_err(|why| field("container path", why))?;
        if let Some(why) = protected_target(container) {
            return Err(field("container path", format!("{container} must not be mounted over: {why}")));
        }
        if !self.mount_targets.allows(&container[1..]) {
            let why = if self.mount_targets.requested(&container[1..]) {
                "not granted to this backend (grant.mount_targets)"
            } else {
                "not requested in the backend's manifest ([requests] mount_targets)"
            };
            return Err(field("container path", format!("{}: {why}", clip(container))));
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
        if !read_only && !self.writable_mounts.allows(&host[1..]) {
            return Err(field(
                "host path",
                format!(
                    "{} is mounted read-write but is not in writable_mounts (requested and granted); mount it read-only",
                    clip(host)
                ),
            ));
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

impl ReturnRules {
    /// An env key the backend may set: a plain name it requested and was granted; a key that
    /// makes programs load or run code only when the operator's grant names it exactly.
    fn env_key(&self, key: &crate::gate::EnvKey) -> Result<(), String> {
        let k = key.as_str();
        if hook_env(k) && !(self.env.allows(key) && self.env.named(key)) {
            return Err(format!(
                "env key {k} changes how programs load or start; it passes only if the operator's grant names it exactly (grant.env = [\"{k}\"])"
            ));
        }
        if !self.env.allows(key) {
            let why = if self.env.requested(key) {
                "not granted to this backend (grant.env)"
            } else {
                "not requested in the backend's manifest ([requests] env)"
            };
            return Err(format!("env key {k}: {why}"));
        }
        Ok(())
    }
}

/// Why no mount may land on container path `p` (clean and absolute), if it is protected.
fn protected_target(p: &str) -> Option<&'static str> {
    if FORBIDDEN_MOUNT_TARGETS.contains(&p) {
        return Some("a directory the container's programs or kernel views live in");
    }
    if FORBIDDEN_MOUNT_FILES.contains(&p) {
        return Some("the loader's configuration or the user and group databases");
    }
    if FORBIDDEN_MOUNT_TREES.iter().any(|t| p.starts_with(t)) {
        return Some("kernel views, the loader's configuration, or the pod's secrets");
    }
    let (dir, name) = p.rsplit_once('/')?;
    let dir = if dir.is_empty() { "/" } else { dir };
    // A program dir itself, or a dir inside one (`/usr/lib/x86_64-linux-gnu`), holds the shells,
    // the loader and libc.
    let in_program_dir = PROGRAM_DIRS.iter().any(|d| dir == *d || dir.starts_with(&format!("{d}/")));
    if in_program_dir && (SHELLS.contains(&name) || LOADER_FILES.iter().any(|f| name.starts_with(f))) {
        return Some("a shell, the dynamic loader or libc");
    }
    None
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
            mount_targets: vec!["/**".into()],
            writable_mounts: vec!["/opt/vendor/rw/**".into()],
            env: vec![
                "NVIDIA_*".into(),
                "VENDOR_*".into(),
                "LD_*".into(),
                "CUDA_INJECTION64_PATH".into(),
                "A=B".into(),
            ],
            resources: vec!["example.com/*".into()],
            annotations: vec!["example.com/*".into(), "cdi.k8s.io/*".into()],
            ..Globs::default()
        };
        let caps = Capabilities::new(&requested, granted).unwrap();
        let jail = Arc::new(Jail::new(dev_dir, caps.dev.clone()).with_fixture_nodes(true));
        ReturnRules::new(&caps, jail.clone(), jail)
    }

    fn all() -> Globs {
        let all = vec!["**".to_owned()];
        Globs {
            sysfs: vec![],
            procfs: vec![],
            dev: all.clone(),
            mounts: vec!["/**".into()],
            mount_targets: vec!["/**".into()],
            writable_mounts: vec![],
            env: vec!["*".into()],
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
            mounts: vec![Mount { host_path: host.into(), container_path: container.into(), read_only: true }],
            ..Default::default()
        }
    }

    fn rw_mount(host: &str, container: &str) -> ContainerEdits {
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
        let env = |k: &str| ContainerEdits::with_env([(k.to_owned(), "x".to_owned())]);
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
            (mount("/opt/vendor/lib", "/etc/ld.so.preload"), "the loader's configuration"),
            (mount("/opt/vendor/lib", "/etc/passwd"), "user and group databases"),
            (mount("/opt/vendor/lib", "/usr/lib/x86_64-linux-gnu/libc.so.6"), "dynamic loader or libc"),
            (mount("/opt/vendor/lib", "/lib64/ld-linux-x86-64.so.2"), "dynamic loader or libc"),
            (mount("/opt/vendor/lib", "/bin/sh"), "a shell"),
            (mount("/opt/vendor/lib", "/var/run/secrets/kubernetes.io/serviceaccount"), "pod's secrets"),
            (mount("/opt/vendor/lib", "/etc"), "must not be mounted over"),
            (rw_mount("/opt/vendor/lib", "/usr/local/vendor"), "not in writable_mounts"),
            (env("LD_PRELOAD"), "changes how programs load"),
            (env("PYTHONPATH"), "changes how programs load"),
            (env("CUDA_INJECTION64_PATH"), "grant names it exactly"),
            (env("OPENSSL_CONF"), "changes how programs load"),
            (env("GLIBC_TUNABLES"), "changes how programs load"),
            (env("SHELLOPTS"), "changes how programs load"),
            (env("JDK_JAVA_OPTIONS"), "changes how programs load"),
            (env("BASH_FUNC_ls%%"), "not a plain name"),
            (env("OTHER_DEVICES"), "not requested in the backend's manifest ([requests] env)"),
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
        e.env.push(crate::model::env_entry("NVIDIA_VISIBLE_DEVICES", "0,1").unwrap());
        e.annotations.push(("example.com/x".into(), "y".into()));
        r.allocate("example.com/x", &mut e).unwrap();
        assert_eq!(e.device_nodes[0].numbers, Some(NodeNumbers { block: false, major: 1, minor: 3 }));
        assert!(r.resource("example.com/x").is_ok());
        assert!(r.resource("nvidia.com/gpu").unwrap_err().contains("does not request"));
        // Read-write only where requested and granted.
        let rw = rules(d.path(), &Globs { writable_mounts: vec!["/opt/vendor/rw/**".into()], ..all() });
        rw.allocate("example.com/x", &mut rw_mount("/opt/vendor/rw/state", "/var/lib/vendor")).unwrap();
    }

    /// Issue 41: a glob grant admits keys only inside the vendor prefix it names; the 13
    /// code-running and 5 network-redirecting keys that passed `env = ["*"]` and the word
    /// classifier are outside any vendor's prefix, so they are refused, and the grant gate
    /// refuses `*` itself at config load (`crate::gate::EnvGrant`).
    #[test]
    fn a_prefix_grant_admits_only_its_prefix() {
        let d = tempfile::tempdir().unwrap();
        let with_env = |granted: &[&str]| {
            let requested = Globs { env: vec!["*".into()], ..all() };
            let granted = Globs { env: granted.iter().map(|s| s.to_string()).collect(), ..all() };
            let caps = Capabilities::new(&requested, &granted).unwrap();
            let jail = Arc::new(Jail::new(d.path(), caps.dev.clone()));
            ReturnRules::new(&caps, jail.clone(), jail)
        };
        let vendor = with_env(&["NVIDIA_*", "PCIDEVICE_*", "VK_LAYER_PATH"]);
        let env = |k: &str| ContainerEdits::with_env([(k.to_owned(), "/opt/x.so".to_owned())]);
        let outside = [
            // code-running
            "ERL_AFLAGS",
            "LUA_INIT",
            "VIMINIT",
            "PS1",
            "DOTNET_ADDITIONAL_DEPS",
            "EXINIT",
            "MYVIMRC",
            "R_PROFILE_USER",
            "GEM_HOME",
            "IRBRC",
            "PHPRC",
            "TCLLIBPATH",
            "GUILE_LOAD_PATH",
            // network-redirecting
            "PIP_INDEX_URL",
            "HF_ENDPOINT",
            "DOCKER_HOST",
            "npm_config_registry",
            "CONDA_CHANNELS",
            // what the word classifier caught, still refused
            "OCL_ICD_FILENAMES",
            "HSA_TOOLS_LIB",
            "HTTPS_PROXY",
        ];
        for k in outside {
            let e = vendor.allocate("example.com/x", &mut env(k)).expect_err(k);
            assert!(e.contains("not granted"), "{k}: {e}");
        }
        vendor.allocate("example.com/x", &mut env("VK_LAYER_PATH")).expect("named exactly, it passes");
        for k in ["NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "PCIDEVICE_OPENSHIFT_IO_MLXNICS"] {
            vendor.allocate("example.com/x", &mut env(k)).unwrap_or_else(|e| panic!("{k}: {e}"));
        }
        // A value with a NUL would end the variable early in the container's envp.
        let nul = ContainerEdits::with_env([("NVIDIA_X".to_owned(), "a\0LD_PRELOAD=/x".to_owned())]);
        assert!(vendor.allocate("example.com/x", &mut nul.clone()).unwrap_err().contains("NUL"));
    }

    /// Issue 41: a device's `pci` must be an address the backend may read and the kernel
    /// lists before `pciBusID`/`pcieRoot` are derived from it (another vendor's NIC and a made-up
    /// address were published); `netdev` must be an interface name the kernel would take (ESC,
    /// BEL and a newline reached a claim's `networkData.interfaceName`).
    #[test]
    fn derived_attributes_pass_their_gates_before_the_host_publishes_them() {
        let d = tempfile::tempdir().unwrap();
        let sys = d.path();
        for id in ["0000:3b:00.0", "0000:5e:00.0"] {
            std::fs::create_dir_all(sys.join("devices/pci0000:00").join(id)).unwrap();
            std::fs::create_dir_all(sys.join("bus/pci/devices")).unwrap();
            std::os::unix::fs::symlink(
                format!("../../../devices/pci0000:00/{id}"),
                sys.join("bus/pci/devices").join(id),
            )
            .unwrap();
        }
        // Granted: its own NIC, and any address under 0000:99 (which does not exist).
        let granted = vec![
            "bus/pci/devices/0000:3b:00.0".to_owned(),
            "devices/pci0000:00/0000:3b:00.0".to_owned(),
            "bus/pci/devices/0000:99:*".to_owned(),
        ];
        let caps =
            Capabilities::new(&Globs { sysfs: granted.clone(), ..all() }, &Globs { sysfs: granted, ..all() }).unwrap();
        let r = ReturnRules::new(
            &caps,
            Arc::new(Jail::new(sys, caps.dev.clone())),
            Arc::new(Jail::new(sys, caps.sysfs.clone())),
        );
        let answer = |attrs: &[(&str, &str)]| {
            let mut res = [Resource {
                name: "example.com/x".into(),
                devices: vec![crate::model::Device {
                    id: "d0".into(),
                    vetted: Default::default(),
                    health: crate::model::Health::Healthy,
                    numa_nodes: vec![],
                    attributes: attrs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
                    edits: Default::default(),
                }],
                ..Default::default()
            }];
            r.discover(&mut res).map(|_| res[0].devices[0].vetted.clone())
        };
        let ok = answer(&[("pci", "0000:3b:00.0"), ("netdev", "ens1f0np0")]).unwrap();
        assert_eq!(ok.pci.unwrap().as_str(), "0000:3b:00.0");
        assert_eq!(ok.netdev.unwrap().as_str(), "ens1f0np0");
        let other_vendor = answer(&[("pci", "0000:5e:00.0")]).unwrap_err();
        assert!(
            other_vendor.contains("device d0: attribute pci") && other_vendor.contains("not granted"),
            "{other_vendor}"
        );
        let made_up = answer(&[("pci", "0000:99:00.0")]).unwrap_err();
        assert!(made_up.contains("no such device"), "{made_up}");
        let terminal = answer(&[("netdev", "e\u{1b}[2J\u{7}\n")]).unwrap_err();
        assert!(terminal.contains("attribute netdev") && !terminal.contains('\u{1b}'), "{terminal}");
        assert_eq!(
            answer(&[("note", "0000:5e:00.0")]).unwrap(),
            crate::model::Vetted::default(),
            "other keys are data"
        );
    }

    /// A code-loading env key passes only when the operator's grant names that exact key; a
    /// glob that happens to match it is not enough.
    #[test]
    fn hook_env_keys_need_the_operators_exact_word() {
        let d = tempfile::tempdir().unwrap();
        let env = |k: &str| ContainerEdits::with_env([(k.to_owned(), "/opt/vendor/inject.so".to_owned())]);
        let by_glob = rules(d.path(), &Globs { env: vec!["*".into()], ..all() });
        assert!(by_glob.allocate("example.com/x", &mut env("CUDA_INJECTION64_PATH")).is_err());
        let named = rules(d.path(), &Globs { env: vec!["CUDA_INJECTION64_PATH".into()], ..all() });
        named.allocate("example.com/x", &mut env("CUDA_INJECTION64_PATH")).unwrap();
        assert!(named.allocate("example.com/x", &mut env("NVIDIA_VISIBLE_DEVICES")).unwrap_err().contains("grant.env"));
    }

    #[test]
    fn answers_beyond_the_caps_are_refused_whole() {
        let d = tempfile::tempdir().unwrap();
        let r = rules(d.path(), &all());
        let dev = |i: usize| crate::model::Device {
            id: format!("d{i}"),
            vetted: Default::default(),
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
        // The host's own attribute names are not a backend's to set.
        for key in ["numa", "resource"] {
            let forged = Resource {
                name: "example.com/x".into(),
                devices: vec![crate::model::Device { attributes: vec![(key.into(), "7".into())], ..dev(0) }],
                ..Default::default()
            };
            let e = r.discover(&mut [forged]).unwrap_err();
            assert!(e.contains("written by the host"), "{key}: {e}");
        }
    }
}

/// Longest backend version the host keeps (it shows in `/status`, tables and a metric label).
pub const MAX_VERSION: usize = 64;
/// Longest resource name (a qualified Kubernetes name is at most 253 + 1 + 63 bytes).
pub const MAX_RESOURCE_NAME: usize = 317;

/// Bound what a backend says of itself at `init`: its name and version clipped (controls
/// escaped, at most [`MAX_VERSION`] characters), at most [`MAX_RESOURCES`] resources, names no
/// longer than a Kubernetes name can be. The version shows on every surface, so it is cut here
/// once rather than at each.
pub fn info(info: &mut crate::model::BackendInfo) {
    info.name = crate::gate::clip_to(&info.name, MAX_VERSION).into_owned();
    info.version = crate::gate::clip_to(&info.version, MAX_VERSION).into_owned();
    info.resources.truncate(MAX_RESOURCES);
    info.resources.retain(|(name, _)| {
        let ok = name.len() <= MAX_RESOURCE_NAME;
        if !ok {
            tracing::error!(
                "resource not served: a name of {} bytes, more than {MAX_RESOURCE_NAME}: {}",
                name.len(),
                clip(name)
            );
        }
        ok
    });
}

/// Counter sets a description may name, and counters in one set or use.
pub const MAX_COUNTER_SETS: usize = 64;

/// Attach a `describe` answer to the resources of the `discover` it follows. Only devices that
/// discover listed, under the resource it listed them in, are described; a description naming
/// another is refused whole (a backend must not describe what it does not serve), as is one
/// past the host's caps. The API server's own rules (names, lengths, counts) are checked where
/// the slices are built, per backend and device.
pub fn described(resources: &mut [Resource], d: crate::model::dra::PoolDescription) -> Result<(), String> {
    // One total for the whole answer, as for `discover`'s: every string counts once.
    let size = std::cell::RefCell::new(Size::default());
    let strings = |s: &str| -> Result<(), String> { size.borrow_mut().add(s).map_err(|e| format!("describe: {e}")) };
    if d.counter_sets.len() > MAX_COUNTER_SETS || d.devices.len() > MAX_DEVICES {
        return Err(format!(
            "describe: {} counter sets and {} devices, more than {MAX_COUNTER_SETS} and {MAX_DEVICES}",
            d.counter_sets.len(),
            d.devices.len()
        ));
    }
    for set in &d.counter_sets {
        strings(&set.name)?;
        if set.counters.len() > MAX_ATTRIBUTES {
            return Err(format!("describe: counter set {}: more than {MAX_ATTRIBUTES} counters", clip(&set.name)));
        }
        for (k, v) in &set.counters {
            strings(k)?;
            strings(v)?;
        }
    }
    let mut by_resource: std::collections::BTreeMap<String, Vec<(String, crate::model::dra::Described)>> =
        Default::default();
    for (resource, id, desc) in d.devices {
        strings(&resource)?;
        strings(&id)?;
        let Some(r) = resources.iter().find(|r| r.name == resource) else {
            return Err(format!("describe: resource {} is not one discover listed", clip(&resource)));
        };
        if r.device(&id).is_none() {
            return Err(format!("describe: device {} is not one of {}'s devices", clip(&id), clip(&resource)));
        }
        let place = format!("describe: {resource} device {}", clip(&id));
        if desc.attributes.len() + desc.capacity.len() > MAX_ATTRIBUTES || desc.consumes.len() > MAX_COUNTER_SETS {
            return Err(format!("{place}: more than {MAX_ATTRIBUTES} attributes and capacities"));
        }
        for (k, v) in &desc.attributes {
            strings(k)?;
            if let Some(why) = crate::model::dra::reserved_attribute(k) {
                return Err(format!("{place}: {}", clip(&why)));
            }
            if let crate::model::dra::AttributeValue::Text(s) | crate::model::dra::AttributeValue::Version(s) = v {
                strings(s)?;
            }
        }
        for (k, v) in desc.capacity.iter().chain(desc.consumes.iter().flat_map(|u| u.counters.iter())) {
            strings(k)?;
            strings(v)?;
        }
        for u in &desc.consumes {
            if !d.counter_sets.iter().any(|s| s.name == u.name) {
                return Err(format!(
                    "{place}: consumes from counter set {}, which it does not describe",
                    clip(&u.name)
                ));
            }
        }
        by_resource.entry(resource).or_default().push((id, desc));
    }
    for r in resources.iter_mut() {
        let Some(described) = by_resource.remove(&r.name) else { continue };
        let used: std::collections::BTreeSet<&str> =
            described.iter().flat_map(|(_, d)| d.consumes.iter().map(|u| u.name.as_str())).collect();
        r.counter_sets = d.counter_sets.iter().filter(|s| used.contains(s.name.as_str())).cloned().collect();
        r.described = described.into_iter().collect();
    }
    Ok(())
}

#[cfg(test)]
mod described_tests {
    use super::described;
    use crate::model::dra::{AttributeValue, CounterSet, Described, PoolDescription};
    use crate::model::{Device, Health, Resource};

    fn listed() -> Vec<Resource> {
        let d = |id: &str| Device {
            id: id.into(),
            vetted: Default::default(),
            health: Health::Healthy,
            numa_nodes: vec![],
            attributes: vec![],
            edits: Default::default(),
        };
        vec![Resource { name: "a.io/x".into(), devices: vec![d("x0"), d("x1")], ..Default::default() }]
    }

    fn about(resource: &str, id: &str, set: &str) -> (String, String, Described) {
        let desc = Described {
            attributes: vec![("n".into(), AttributeValue::Int(1))],
            consumes: vec![CounterSet { name: set.into(), counters: vec![("m".into(), "1Gi".into())] }],
            ..Default::default()
        };
        (resource.into(), id.into(), desc)
    }

    #[test]
    fn a_description_attaches_only_to_what_discover_listed() {
        let sets = vec![CounterSet { name: "pool".into(), counters: vec![("m".into(), "4Gi".into())] }];
        let mut r = listed();
        let ok = PoolDescription { counter_sets: sets.clone(), devices: vec![about("a.io/x", "x1", "pool")] };
        described(&mut r, ok).unwrap();
        assert_eq!(r[0].described["x1"].attributes[0].1, AttributeValue::Int(1));
        assert_eq!(r[0].counter_sets, sets);
        for (bad, why) in [
            (about("a.io/x", "stranger", "pool"), "not one of a.io/x's devices"),
            (about("b.io/y", "x1", "pool"), "not one discover listed"),
            (about("a.io/x", "x0", "elsewhere"), "which it does not describe"),
        ] {
            let mut r = listed();
            let e = described(&mut r, PoolDescription { counter_sets: sets.clone(), devices: vec![bad] }).unwrap_err();
            assert!(e.contains(why), "{e}");
            assert!(r[0].described.is_empty(), "nothing of a refused description is kept");
        }
    }

    /// Issue 33: one `describe` answer of legal strings (thirty 64-byte attributes on each of
    /// 8,192 devices, ~18 MiB) is refused whole by the same 8 MiB total as `discover`'s.
    #[test]
    fn a_description_is_bounded_as_a_whole_not_only_string_by_string() {
        let dev = |i: usize| Device {
            id: format!("d{i}"),
            vetted: Default::default(),
            health: Health::Healthy,
            numa_nodes: vec![],
            attributes: vec![],
            edits: Default::default(),
        };
        let mut r =
            vec![Resource { name: "a.io/x".into(), devices: (0..8192).map(dev).collect(), ..Default::default() }];
        let devices = (0..8192)
            .map(|i| {
                let attributes =
                    (0..30).map(|a| (format!("a{a:02}"), AttributeValue::Text(format!("{a:064}")))).collect();
                ("a.io/x".to_owned(), format!("d{i}"), Described { attributes, ..Default::default() })
            })
            .collect();
        let e = described(&mut r, PoolDescription { counter_sets: vec![], devices }).unwrap_err();
        assert!(e.contains("larger than 8388608 bytes"), "{e}");
        assert!(r[0].described.is_empty());
    }

    /// The host writes `resource` and `numa` (DeviceClasses select on the one, the scheduler
    /// aligns on the other) and Kubernetes' standard names: a description naming them is refused.
    #[test]
    fn a_description_cannot_take_the_hosts_attribute_names() {
        for key in ["resource", "numa", "chaos.devplug.io/numa", "devplug.io/x", "resource.kubernetes.io/pcieRoot"] {
            let mut r = listed();
            let desc = Described { attributes: vec![(key.into(), AttributeValue::Int(0))], ..Default::default() };
            let d = PoolDescription { counter_sets: vec![], devices: vec![("a.io/x".into(), "x0".into(), desc)] };
            let e = described(&mut r, d).unwrap_err();
            assert!(e.contains("host"), "{key}: {e}");
        }
        let mut r = listed();
        let desc = Described { attributes: vec![("numa_ok".into(), AttributeValue::Int(0))], ..Default::default() };
        described(
            &mut r,
            PoolDescription { counter_sets: vec![], devices: vec![("a.io/x".into(), "x0".into(), desc)] },
        )
        .unwrap();
    }
}
