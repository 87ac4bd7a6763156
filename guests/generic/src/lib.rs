//! The generic backend: devices found by path globs under `/dev`, for hardware that needs nothing
//! but its device node in the container (`/dev/kvm`, `/dev/fuse`, `/dev/net/tun`, serial adapters).
//!
//! Config (TOML), one table per resource:
//! ```toml
//! [[resource]]
//! name = "devplug.io/serial"
//! paths = ["ttyUSB*", "ttyACM*"]  # globs relative to /dev; each matching node is one device
//! count = 1                        # >1: every node is shared by this many schedulable devices
//!                                  # (through DRA: one device, `count` claims at a time)
//! together = false                 # true: all matching nodes form a single device
//! shared = true                    # another backend may hand these nodes out too, if it says so
//!                                  # as well (default: true when count > 1)
//! container_path = "/dev/my-null"  # expose the node elsewhere (only with one literal path)
//! env = { MY_DEVICE = "1" }        # set in every container that gets one of these devices
//! mounts = [{ host_path = "/etc/thing.conf", container_path = "/etc/thing.conf", read_only = true }]
//! ```
//! With no config it serves `/dev/kvm`, `/dev/fuse` and `/dev/net/tun`, 16 shares each.

use devplug_sdk::{
    Backend, BackendError, ContainerEdits, Device, Health, Info, Mount, Node, NodeKind, Resource, ResourceInfo, Sys,
    edits, invalid_config,
};
use serde::Deserialize;

const DEFAULT_CONFIG: &str = r#"
[[resource]]
name = "devplug.io/kvm"
paths = ["kvm"]
count = 16

[[resource]]
name = "devplug.io/fuse"
paths = ["fuse"]
count = 16

[[resource]]
name = "devplug.io/tun"
paths = ["net/tun"]
count = 16
"#;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default)]
    resource: Vec<ResourceConfig>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResourceConfig {
    name: String,
    paths: Vec<String>,
    #[serde(default = "one")]
    count: u32,
    #[serde(default)]
    together: bool,
    /// Whether these nodes may also be handed out by another backend's resource that says the
    /// same (`shared-node`); default: when `count` shares them anyway.
    shared: Option<bool>,
    container_path: Option<String>,
    #[serde(default)]
    env: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    mounts: Vec<MountConfig>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MountConfig {
    host_path: String,
    container_path: String,
    #[serde(default = "yes")]
    read_only: bool,
}

fn yes() -> bool {
    true
}

fn one() -> u32 {
    1
}

/// Kubelet caps device IDs at 63 characters.
const MAX_ID: usize = 63;
/// A resource may not ask for absurd share counts: kubelet keeps every ID in memory.
const MAX_COUNT: u32 = 1024;

pub struct Generic {
    resources: Vec<ResourceConfig>,
}

impl Backend for Generic {
    fn init(config: &str, _sys: &dyn Sys) -> Result<(Self, Info), BackendError> {
        let text = if config.trim().is_empty() { DEFAULT_CONFIG } else { config };
        let cfg: Config = toml::from_str(text).map_err(invalid_config)?;
        for r in &cfg.resource {
            if !r.name.contains('/') {
                return Err(invalid_config(format!(
                    "resource {:?}: name must be an extended resource name like example.com/thing",
                    r.name
                )));
            }
            if r.paths.is_empty() {
                return Err(invalid_config(format!("resource {:?}: paths is empty", r.name)));
            }
            if let Some(cp) = &r.container_path {
                let literal = r.paths.len() == 1 && !r.paths[0].contains(['*', '?', '[', '{']);
                if !literal || r.together || !cp.starts_with('/') {
                    return Err(invalid_config(format!(
                        "resource {:?}: container_path needs exactly one literal path, no `together`, and an absolute container path",
                        r.name
                    )));
                }
            }
            if let Some(m) =
                r.mounts.iter().find(|m| !m.host_path.starts_with('/') || !m.container_path.starts_with('/'))
            {
                return Err(invalid_config(format!(
                    "resource {:?}: mount {:?} -> {:?} needs absolute paths",
                    r.name, m.host_path, m.container_path
                )));
            }
            if r.count == 0 || r.count > MAX_COUNT {
                return Err(invalid_config(format!(
                    "resource {:?}: count must be 1..={MAX_COUNT}, got {}",
                    r.name, r.count
                )));
            }
        }
        // One node, two of this backend's resources: two containers would get one device.
        // Allowed only when both resources say so (`shared = true`, not merely a count > 1).
        for (i, a) in cfg.resource.iter().enumerate() {
            for b in &cfg.resource[i + 1..] {
                let both_shared = a.shared == Some(true) && b.shared == Some(true);
                if let Some(p) = a.paths.iter().find(|p| literal(p) && b.paths.contains(p))
                    && !both_shared
                {
                    return Err(invalid_config(format!(
                        "resources {:?} and {:?} both name /dev/{p}: give the node to one resource, or set shared = true on both",
                        a.name, b.name
                    )));
                }
            }
        }
        let resources = cfg.resource.iter().map(|r| ResourceInfo::plain(r.name.clone()));
        let info = Info::new("generic", env!("CARGO_PKG_VERSION"), resources);
        Ok((Generic { resources: cfg.resource }, info))
    }

    fn discover(&self, sys: &dyn Sys) -> Result<Vec<Resource>, BackendError> {
        // Globs of two resources can meet on one node (`ttyUSB*`, `ttyUSB0`): the first resource
        // in the config keeps it, unless both are declared shared.
        let mut taken: Vec<(String, bool)> = Vec::new();
        Ok(self.resources.iter().map(|r| discover_one(sys, r, &mut taken)).collect())
    }

    /// Typed facts for DRA: a single-node device's `major` and `minor` numbers (what a cgroup
    /// device rule names), from the host's stat of the node.
    fn describe(&self, sys: &dyn Sys) -> Result<devplug_sdk::dra::PoolDescription, BackendError> {
        use devplug_sdk::dra::{self, AttributeValue};
        let mut devices = Vec::new();
        // Shares of one node stat it once.
        let mut stats: std::collections::BTreeMap<String, Option<Node>> = Default::default();
        for r in self.discover(sys)? {
            for d in &r.devices {
                let [node] = d.edits.device_nodes.as_slice() else { continue };
                let host = if node.host_path.is_empty() { &node.container_path } else { &node.host_path };
                let Some(path) = host.strip_prefix("/dev/") else { continue };
                let stat = stats.entry(path.to_owned()).or_insert_with(|| sys.dev_stat(path).ok());
                let Some(n) = stat else { continue };
                let attributes = vec![
                    ("major".into(), AttributeValue::Integer(i64::from(n.major))),
                    ("minor".into(), AttributeValue::Integer(i64::from(n.minor))),
                ];
                devices.push(dra::DeviceDescription { attributes, ..dra::describe(&r.name, &d.id) });
            }
        }
        Ok(dra::PoolDescription { counter_sets: Vec::new(), devices })
    }
}

/// Whether a configured path is one node, not a glob.
fn literal(p: &str) -> bool {
    !p.contains(['*', '?', '[', '{'])
}

/// Resource `r`'s devices; `taken`: nodes earlier resources of this config hold (and whether
/// that resource declared them shared).
fn discover_one(sys: &dyn Sys, r: &ResourceConfig, taken: &mut Vec<(String, bool)>) -> Resource {
    let mut nodes: Vec<Node> = Vec::new();
    let shared = r.shared == Some(true);
    for pattern in &r.paths {
        // A refused or missing glob just finds nothing: the host already logged the refusal.
        for node in sys.dev_glob(pattern).unwrap_or_default() {
            if !matches!(node.kind, NodeKind::Character | NodeKind::Block) || nodes.iter().any(|n| n.path == node.path)
            {
                continue;
            }
            if taken.iter().any(|(p, s)| *p == node.path && !(*s && shared)) {
                continue;
            }
            nodes.push(node);
        }
    }
    taken.extend(nodes.iter().map(|n| (n.path.clone(), shared)));
    let groups: Vec<(String, Vec<&Node>)> = if r.together {
        if nodes.is_empty() { Vec::new() } else { vec![(short_name(&r.name), nodes.iter().collect())] }
    } else {
        nodes.iter().map(|n| (sanitize(&n.path), vec![n])).collect()
    };
    let mut devices = Vec::new();
    for (base, group) in groups {
        let mut node_edits: ContainerEdits = edits::nodes(group.iter().map(|n| n.path.as_str()));
        if let (Some(cp), [node]) = (&r.container_path, node_edits.device_nodes.as_mut_slice()) {
            node.host_path = std::mem::replace(&mut node.container_path, cp.clone());
        }
        for i in 0..r.count {
            let id = if r.count == 1 { base.clone() } else { format!("{base}-{i}") };
            let mut id = device_id(&id);
            // Two paths can sanitize to one ID (`a/b`, `a_b`): tell them apart by the path.
            if devices.iter().any(|d: &Device| d.id == id) {
                let path = group.iter().map(|n| n.path.as_str()).collect::<Vec<_>>().join(",");
                id = with_hash(&id, &format!("{path}#{i}"));
            }
            let mut attributes =
                vec![("paths".into(), group.iter().map(|n| format!("/dev/{}", n.path)).collect::<Vec<_>>().join(","))];
            // Shares of one node are replicas of one device: DRA publishes that device once,
            // for as many claims at a time as there are shares.
            if r.count > 1 {
                attributes.push(("replica-of".into(), device_id(&base)));
            }
            if r.shared.unwrap_or(r.count > 1) {
                attributes.push(("shared-node".into(), "true".into()));
            }
            devices.push(Device {
                id,
                health: Health::Healthy,
                numa_nodes: Vec::new(),
                attributes,
                edits: node_edits.clone(),
            });
        }
    }
    let mut common = edits::empty();
    if !devices.is_empty() {
        common.env = r.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        common.mounts = r
            .mounts
            .iter()
            .map(|m| Mount {
                host_path: m.host_path.clone(),
                container_path: m.container_path.clone(),
                read_only: m.read_only,
            })
            .collect();
    }
    Resource { name: r.name.clone(), devices, common_edits: common }
}

/// `devplug.io/kvm` → `kvm`.
fn short_name(resource: &str) -> String {
    sanitize(resource.rsplit('/').next().unwrap_or(resource))
}

/// Device IDs may hold `[A-Za-z0-9._-]`: `net/tun` → `net_tun`.
fn sanitize(s: &str) -> String {
    devplug_sdk::id_chars(s)
}

/// `id` as kubelet takes it: at most 63 characters. A longer one keeps its start and ends in a
/// hash of the whole, so two long paths with a common prefix stay two devices.
fn device_id(id: &str) -> String {
    if id.len() <= MAX_ID { id.to_owned() } else { with_hash(id, id) }
}

/// `id` cut to leave room for `-` and eight hex digits of a hash of `key`.
fn with_hash(id: &str, key: &str) -> String {
    // FNV-1a: stable across builds and platforms, unlike std's hasher.
    let hash = key.bytes().fold(0x811c_9dc5_u32, |h, b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193));
    let keep = id.len().min(MAX_ID - 9);
    format!("{}-{hash:08x}", &id[..keep])
}

devplug_sdk::backend!(Generic);

#[cfg(test)]
mod tests {
    use super::*;
    use devplug_sdk::FixtureSys;

    fn machine() -> (tempfile::TempDir, FixtureSys) {
        let d = tempfile::tempdir().unwrap();
        for (rel, content) in [
            ("dev/kvm", "c 10:232"),
            ("dev/net/tun", "c 10:200"),
            ("dev/ttyUSB0", "c 188:0"),
            ("dev/ttyUSB1", "c 188:1"),
            ("dev/not-a-node", "hello"),
        ] {
            let p = d.path().join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, content).unwrap();
        }
        let sys = FixtureSys::machine(d.path());
        (d, sys)
    }

    #[test]
    fn default_config_shares_each_present_node_sixteen_ways() {
        let (_d, sys) = machine();
        let (b, info) = Generic::init("", &sys).unwrap();
        assert_eq!(info.resources.len(), 3);
        let res = b.discover(&sys).unwrap();
        let kvm = res.iter().find(|r| r.name == "devplug.io/kvm").unwrap();
        assert_eq!(kvm.devices.len(), 16);
        assert_eq!(kvm.devices[3].id, "kvm-3");
        assert_eq!(kvm.devices[0].edits.device_nodes[0].container_path, "/dev/kvm");
        let fuse = res.iter().find(|r| r.name == "devplug.io/fuse").unwrap();
        assert!(fuse.devices.is_empty(), "no /dev/fuse in the fixture");
        let tun = res.iter().find(|r| r.name == "devplug.io/tun").unwrap();
        assert_eq!(tun.devices[0].id, "net_tun-0");
        assert!(kvm.devices.iter().all(|d| d.attributes.contains(&("replica-of".into(), "kvm".into()))));
        // DRA: the node's numbers, typed, on every share.
        let pool = b.describe(&sys).unwrap();
        let kvm0 = pool.devices.iter().find(|d| d.id == "kvm-0").unwrap();
        use devplug_sdk::dra::AttributeValue::Integer;
        assert_eq!(kvm0.attributes, [("major".into(), Integer(10)), ("minor".into(), Integer(232))]);
    }

    #[test]
    fn globs_make_one_device_per_node_and_skip_regular_files() {
        let (_d, sys) = machine();
        let cfg = "[[resource]]\nname = \"x.io/serial\"\npaths = [\"ttyUSB*\", \"not-a-node\"]\n";
        let (b, _) = Generic::init(cfg, &sys).unwrap();
        let res = b.discover(&sys).unwrap();
        let ids: Vec<_> = res[0].devices.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, ["ttyUSB0", "ttyUSB1"]);
    }

    #[test]
    fn together_groups_all_matches_into_one_device() {
        let (_d, sys) = machine();
        let cfg = "[[resource]]\nname = \"x.io/serial\"\npaths = [\"ttyUSB*\"]\ntogether = true\n";
        let (b, _) = Generic::init(cfg, &sys).unwrap();
        let res = b.discover(&sys).unwrap();
        assert_eq!(res[0].devices.len(), 1);
        assert_eq!(res[0].devices[0].id, "serial");
        assert_eq!(res[0].devices[0].edits.device_nodes.len(), 2);
    }

    #[test]
    fn bad_configs_are_refused_with_the_reason() {
        let (_d, sys) = machine();
        for (cfg, needle) in [
            ("[[resource]]\nname = \"nodomain\"\npaths = [\"kvm\"]\n", "extended resource name"),
            ("[[resource]]\nname = \"a.io/b\"\npaths = []\n", "paths is empty"),
            ("[[resource]]\nname = \"a.io/b\"\npaths = [\"kvm\"]\ncount = 0\n", "count must be"),
            ("[[resource]]\nname = \"a.io/b\"\npaths = [\"kvm\"]\ncolour = 1\n", "colour"),
            ("not toml at all [", ""),
        ] {
            match Generic::init(cfg, &sys) {
                Err(BackendError::InvalidConfig(msg)) => assert!(msg.contains(needle), "{msg}"),
                Err(e) => panic!("wrong error for {cfg:?}: {e:?}"),
                Ok(_) => panic!("accepted {cfg:?}"),
            }
        }
    }

    /// Issue 49: two resources of one config naming one node would give two containers one
    /// device; refused at config load unless both declare sharing, and where globs meet, the
    /// first resource keeps the node.
    #[test]
    fn one_node_under_two_resources_is_refused_unless_both_share_it() {
        let (_d, sys) = machine();
        let two = "[[resource]]\nname = \"x.io/alpha\"\npaths = [\"kvm\"]\n[[resource]]\nname = \"x.io/beta\"\npaths = [\"kvm\"]\n";
        match Generic::init(two, &sys) {
            Err(BackendError::InvalidConfig(msg)) => {
                assert!(msg.contains("x.io/alpha") && msg.contains("x.io/beta") && msg.contains("/dev/kvm"), "{msg}")
            }
            other => panic!("accepted: {:?}", other.err()),
        }
        // Shares of each (count > 1) are not a declaration: the two resources still collide.
        let counted = two.replace("paths = [\"kvm\"]\n", "paths = [\"kvm\"]\ncount = 2\n");
        assert!(Generic::init(&counted, &sys).is_err());
        let shared = two.replace("paths = [\"kvm\"]\n", "paths = [\"kvm\"]\nshared = true\n");
        let (b, _) = Generic::init(&shared, &sys).unwrap();
        assert!(b.discover(&sys).unwrap().iter().all(|r| r.devices.len() == 1));
        // Globs that meet: the first resource keeps the node.
        let globs = "[[resource]]\nname = \"x.io/usb\"\npaths = [\"ttyUSB*\"]\n[[resource]]\nname = \"x.io/zero\"\npaths = [\"ttyUSB0\"]\n";
        let (b, _) = Generic::init(globs, &sys).unwrap();
        let res = b.discover(&sys).unwrap();
        assert_eq!(res[0].devices.len(), 2);
        assert!(res[1].devices.is_empty(), "{:?}", res[1].devices);
    }

    #[test]
    fn a_node_can_be_re_exposed_with_env_and_mounts() {
        let (_d, sys) = machine();
        let cfg = r#"
[[resource]]
name = "x.io/kvm"
paths = ["kvm"]
container_path = "/dev/my-kvm"
env = { MY_KVM = "yes" }
mounts = [{ host_path = "/etc/hostname", container_path = "/etc/kvm-host" }]
"#;
        let (b, _) = Generic::init(cfg, &sys).unwrap();
        let r = &b.discover(&sys).unwrap()[0];
        let n = &r.devices[0].edits.device_nodes[0];
        assert_eq!((n.container_path.as_str(), n.host_path.as_str()), ("/dev/my-kvm", "/dev/kvm"));
        assert_eq!(r.common_edits.env, [("MY_KVM".to_owned(), "yes".to_owned())]);
        assert!(r.common_edits.mounts[0].read_only, "mounts are read-only unless said otherwise");
        for bad in [
            "[[resource]]\nname = \"x.io/a\"\npaths = [\"tty*\"]\ncontainer_path = \"/dev/a\"\n",
            "[[resource]]\nname = \"x.io/a\"\npaths = [\"kvm\"]\ncontainer_path = \"dev/a\"\n",
            "[[resource]]\nname = \"x.io/a\"\npaths = [\"kvm\"]\nmounts = [{ host_path = \"etc\", container_path = \"/e\" }]\n",
        ] {
            assert!(matches!(Generic::init(bad, &sys), Err(BackendError::InvalidConfig(_))), "{bad}");
        }
    }

    #[test]
    fn long_and_clashing_paths_still_give_distinct_ids() {
        let long = "x".repeat(70);
        let a = device_id(&format!("{long}a"));
        let b = device_id(&format!("{long}b"));
        assert!(a.len() <= MAX_ID && b.len() <= MAX_ID, "{a} {b}");
        assert_ne!(a, b, "a common 63-character prefix must not merge two devices");
        assert_eq!(device_id("kvm"), "kvm");
        assert_ne!(with_hash("net_tun", "net/tun#0"), with_hash("net_tun", "net_tun#0"));
    }
}
