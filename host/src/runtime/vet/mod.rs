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
//! device, field and rule. What no grant changes (hook env keys, protected mount targets) is in
//! [`policy`]; what a backend says of itself and its `describe` answer, in [`describe`].

mod describe;
mod policy;

pub use describe::{MAX_COUNTER_SETS, MAX_RESOURCE_NAME, MAX_VERSION, described, info};
pub use policy::hook_env;
use policy::{clean_absolute, protected_target};

use super::caps::{Capabilities, Rule};
use super::jail::{FsError, Jail, MAX_BATCH, NodeStat, NodeType, OpenDirs};
use crate::gate::clip;
use crate::model::{ContainerEdits, DeviceNode, NodeNumbers, Resource};

/// Resources one backend may serve.
pub(crate) const MAX_RESOURCES: usize = 64;
/// Devices one resource may have.
pub const MAX_DEVICES: usize = 8192;
/// Entries in one set of edits (nodes, mounts, env and annotations each).
pub(crate) const MAX_EDIT_ENTRIES: usize = 256;
/// Attributes of one device.
pub(crate) const MAX_ATTRIBUTES: usize = 64;
/// Longest string anywhere in an answer.
pub(crate) const MAX_STRING: usize = 4096;
/// All the strings of one answer together.
pub(crate) const MAX_ANSWER_BYTES: usize = 8 << 20;

/// The discover attribute a backend names a device's PCI address in (standard `pciBusID`,
/// `pcieRoot` are derived from it).
pub(crate) const PCI_ATTRIBUTE: &str = "pci";
/// The discover attribute a NIC backend names a device's network interface in (claim status).
pub(crate) const NETDEV_ATTRIBUTE: &str = "netdev";

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

/// Host node path (below `/dev`) → what the dev jail said about it.
#[derive(Default)]
struct NodeStats(std::collections::HashMap<String, Result<NodeStat, FsError>>);

/// Running total of an answer's string bytes.
#[derive(Default)]
pub(super) struct Size(usize);

impl Size {
    pub(super) fn add(&mut self, s: &str) -> Result<(), String> {
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
