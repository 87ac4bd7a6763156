//! Two backends handing out one device node, as it is told: once per pair of resources
//! ([`Contest`]), however many nodes the pair shares, with the one line that settles it
//! (the config's `owns`, [`super::owns::Decisions`], which [`super::nodes::NodeOwners`] applies).

use std::collections::{BTreeMap, BTreeSet};

use super::nodes::Conflict;

/// Nodes named in a contest's message; the count says the rest.
const SAMPLE: usize = 3;
/// Past this many distinct patterns the remedy suggests `"**"` (every node the resource names).
const MAX_PATTERNS: usize = 4;

/// One pair of resources of two backends naming the same device nodes.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Contest {
    /// The two resources, in name order, and their backends.
    pub resources: [String; 2],
    pub backends: [String; 2],
    /// The resource the config gives the nodes to (the other side's devices naming them are
    /// withheld); `None`: undecided, both sides' devices naming them are withheld.
    pub owner: Option<String>,
    /// How many device nodes the pair shares, and the first few.
    pub nodes: usize,
    pub sample: Vec<String>,
    /// Devices withheld from kubelet and DRA, both sides together.
    pub withheld: usize,
    /// The `owns` patterns that would settle it.
    pub patterns: Vec<String>,
}

impl Contest {
    pub fn decided(&self) -> bool {
        self.owner.is_some()
    }

    /// Whether `backend` is one of the two sides.
    pub(crate) fn involves(&self, backend: &str) -> bool {
        self.backends.iter().any(|b| b == backend)
    }

    fn sample_text(&self) -> String {
        let more = self.nodes.saturating_sub(self.sample.len());
        let more = if more > 0 { format!(" and {more} more") } else { String::new() };
        format!("{}{more}", self.sample.join(", "))
    }

    /// The config line that gives the nodes to `resource`.
    pub fn remedy(&self, resource: &str) -> String {
        let patterns: Vec<String> = self.patterns.iter().map(|p| format!("{p:?}")).collect();
        format!("owns = [{}] under [resources.{resource:?}]", patterns.join(", "))
    }
}

impl std::fmt::Display for Contest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let [a, b] = &self.resources;
        let [ab, bb] = &self.backends;
        let nodes = if self.nodes == 1 { "1 device node".to_owned() } else { format!("{} device nodes", self.nodes) };
        let devices = if self.withheld == 1 { "1 device".to_owned() } else { format!("{} devices", self.withheld) };
        match &self.owner {
            // The remedy comes before the list of nodes: a reader who sees only the start
            // still learns what to do.
            None => write!(
                f,
                "resources {a} (backend {ab}) and {b} (backend {bb}) both hand out {nodes}; refused to both until the config decides: set {} (or {}) in devplug's config to give them to that resource — the other backend's other devices and grants stay as they are — or mark every device naming them shared-node = \"true\"; {devices} withheld; nodes: {}",
                self.remedy(b),
                self.remedy(a),
                self.sample_text()
            ),
            Some(owner) => {
                let other = if owner == a { b } else { a };
                write!(
                    f,
                    "{nodes} that resource {other} also names are {owner}'s by the config (owns): {devices} of {other} withheld; nodes: {}",
                    self.sample_text()
                )
            }
        }
    }
}

/// A glob for `path` relative to `/dev` that also covers its numbered siblings:
/// `/dev/infiniband/uverbs7` → `infiniband/uverbs*`.
fn pattern_of(path: &str) -> String {
    let rel = path.strip_prefix("/dev/").unwrap_or(path);
    let stem = rel.trim_end_matches(|c: char| c.is_ascii_digit());
    if stem.len() < rel.len() && !stem.ends_with('/') { format!("{stem}*") } else { rel.to_owned() }
}

/// The contests among `sides`: each resource (name, backend) with its conflicts, folded into
/// one [`Contest`] per pair of resources.
pub fn contests<'a>(sides: impl IntoIterator<Item = (&'a str, &'a str, &'a [Conflict])>) -> Vec<Contest> {
    #[derive(Default)]
    struct Pair {
        backends: [String; 2],
        /// Each node once, by its numbers where vetted (a second name of it is the same node),
        /// with the path that names it.
        nodes: BTreeMap<String, (String, String)>,
        withheld: BTreeSet<(String, String)>,
        owner: Option<String>,
    }
    let mut pairs: BTreeMap<[String; 2], Pair> = BTreeMap::new();
    for (resource, backend, conflicts) in sides {
        for c in conflicts {
            let mut key = [resource.to_owned(), c.holder.clone()];
            let mut backends = [backend.to_owned(), c.holder_backend.clone()];
            if key[0] > key[1] {
                key.swap(0, 1);
                backends.swap(0, 1);
            }
            let p = pairs.entry(key).or_default();
            p.backends = backends;
            // A node both sides name by different paths (udev's `/dev/char/195:0` for
            // `/dev/nvidia0`) is shown by both names and its numbers.
            let shown = match (&c.numbers, c.holder_path != c.node) {
                (Some(n), true) => format!("{} = {} ({n})", c.node, c.holder_path),
                (Some(n), false) => format!("{} ({n})", c.node),
                (None, true) => format!("{} = {}", c.node, c.holder_path),
                (None, false) => c.node.clone(),
            };
            p.nodes.entry(c.numbers.clone().unwrap_or_else(|| c.node.clone())).or_insert((c.node.clone(), shown));
            p.withheld.extend(c.devices.iter().map(|d| (resource.to_owned(), d.clone())));
            if c.decided {
                p.owner = Some(c.holder.clone());
            }
        }
    }
    pairs
        .into_iter()
        .map(|(resources, p)| {
            let mut paths: Vec<&(String, String)> = p.nodes.values().collect();
            // Numbered siblings in number order (uverbs2 before uverbs10).
            paths.sort_by_key(|(s, _)| {
                let stem = s.trim_end_matches(|c: char| c.is_ascii_digit());
                (stem.to_owned(), s[stem.len()..].parse::<u64>().unwrap_or(0), s.to_string())
            });
            let mut patterns: BTreeSet<String> = paths.iter().map(|(s, _)| pattern_of(s)).collect();
            // Many kinds of node: every node the resource names is the shorter line.
            if patterns.len() > MAX_PATTERNS {
                patterns = BTreeSet::from(["**".to_owned()]);
            }
            Contest {
                nodes: p.nodes.len(),
                sample: paths.iter().take(SAMPLE).map(|(_, shown)| crate::gate::clip(shown).into_owned()).collect(),
                withheld: p.withheld.len(),
                patterns: patterns.into_iter().map(|s| crate::gate::clip(&s).into_owned()).collect(),
                owner: p.owner,
                backends: p.backends,
                resources,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::nodes::{NodeOwners, refuse};
    use crate::model::owns::Decisions;
    use crate::model::{ContainerEdits, Device, DeviceNode, Health, Resource};

    fn res(name: &str, devices: &[(&str, &str)]) -> Resource {
        Resource {
            name: name.into(),
            devices: devices
                .iter()
                .map(|(id, n)| Device {
                    id: (*id).into(),
                    health: Health::Healthy,
                    numa_nodes: vec![],
                    attributes: vec![],
                    edits: ContainerEdits {
                        device_nodes: vec![DeviceNode { container_path: (*n).into(), ..Default::default() }],
                        ..Default::default()
                    },
                    vetted: Default::default(),
                })
                .collect(),
            ..Default::default()
        }
    }

    fn owns(resource: &str, patterns: &[&str]) -> (String, globset::GlobSet) {
        let mut b = globset::GlobSetBuilder::new();
        for p in patterns {
            b.add(globset::GlobBuilder::new(p).literal_separator(true).build().unwrap());
        }
        (resource.to_owned(), b.build().unwrap())
    }

    fn edits(paths: &[&str]) -> ContainerEdits {
        ContainerEdits {
            device_nodes: paths
                .iter()
                .map(|p| DeviceNode { container_path: (*p).into(), ..Default::default() })
                .collect(),
            ..Default::default()
        }
    }

    /// Issue 60 (1): the EFA vendor's backend and the nic backend both name every uverbs node.
    /// Undecided, both sides lose them, told as one contest with the line that settles it;
    /// with `owns` on the vendor's resource only the nic side's devices naming them go, its
    /// other devices stay, and the writers' gate follows the decision.
    #[test]
    fn a_node_the_config_gives_one_resource_is_withheld_only_from_the_other() {
        let efa = res(
            "vpc.amazonaws.com/efa",
            &[
                ("efa-0", "/dev/infiniband/uverbs0"),
                ("efa-1", "/dev/infiniband/uverbs1"),
                ("efa-2", "/dev/infiniband/uverbs2"),
                ("efa-10", "/dev/infiniband/uverbs10"),
            ],
        );
        let nic = res(
            "devplug.io/rdma",
            &[
                ("0000:10:00.0", "/dev/infiniband/uverbs0"),
                ("0000:11:00.0", "/dev/infiniband/uverbs1"),
                ("0000:12:00.0", "/dev/infiniband/uverbs2"),
                ("0000:13:00.0", "/dev/infiniband/uverbs10"),
                ("0000:20:00.0", "/dev/vfio/12"),
            ],
        );
        let lists = [("efa", &efa), ("nic", &nic)];

        let t = NodeOwners::build(lists);
        let (theirs, ours) = (t.conflicts("efa", &efa), t.conflicts("nic", &nic));
        assert_eq!((theirs.len(), ours.len()), (4, 4));
        let told = contests([("vpc.amazonaws.com/efa", "efa", &theirs[..]), ("devplug.io/rdma", "nic", &ours[..])]);
        assert_eq!(told.len(), 1, "one contest per pair of resources: {told:?}");
        let c = &told[0];
        assert_eq!((c.nodes, c.withheld, c.decided()), (4, 8, false));
        assert_eq!(c.patterns, ["infiniband/uverbs*"]);
        // Numbered siblings in number order, the rest counted.
        assert_eq!(c.sample, ["/dev/infiniband/uverbs0", "/dev/infiniband/uverbs1", "/dev/infiniband/uverbs2"]);
        let line = c.to_string();
        let remedy = line.find(r#"owns = ["infiniband/uverbs*"] under [resources."vpc.amazonaws.com/efa"]"#);
        let nodes = line.find("nodes: ");
        assert!(remedy.is_some() && remedy < nodes, "the remedy comes first: {line}");
        assert!(line.contains(r#"[resources."devplug.io/rdma"]"#) && line.contains("and 1 more"), "{line}");

        let decided = Decisions::new(vec![owns("vpc.amazonaws.com/efa", &["infiniband/uverbs*"])]);
        let t = NodeOwners::build_decided(lists, &decided);
        assert!(t.conflicts("efa", &efa).is_empty(), "the owner keeps its nodes");
        let ours = t.conflicts("nic", &nic);
        assert_eq!(ours.len(), 4);
        assert!(ours.iter().all(|c| c.decided && c.holder == "vpc.amazonaws.com/efa"));
        let mut kept = nic.clone();
        refuse(&mut kept, &ours);
        assert_eq!(kept.devices.iter().map(|d| d.id.as_str()).collect::<Vec<_>>(), ["0000:20:00.0"]);
        let told = contests([("devplug.io/rdma", "nic", &ours[..])]);
        assert_eq!((told[0].owner.as_deref(), told[0].withheld), (Some("vpc.amazonaws.com/efa"), 4));
        assert!(told[0].to_string().contains("by the config (owns)"), "{}", told[0]);
        // The writers: the owner's holder gets its node; the other side's never does.
        let held = [("vpc.amazonaws.com/efa", "efa-1")];
        assert!(t.admit("vpc.amazonaws.com/efa", &held, edits(&["/dev/infiniband/uverbs1"])).is_ok());
        let e = t
            .admit("devplug.io/rdma", &[("devplug.io/rdma", "0000:11:00.0")], edits(&["/dev/infiniband/uverbs1"]))
            .unwrap_err();
        assert_eq!((e.owner.resource.as_str(), e.owner.device.as_str()), ("vpc.amazonaws.com/efa", "efa-1"));
        // A node outside the owner's patterns is not decided by them.
        let narrow = Decisions::new(vec![owns("vpc.amazonaws.com/efa", &["infiniband/uverbs0"])]);
        let t = NodeOwners::build_decided(lists, &narrow);
        assert_eq!(t.conflicts("efa", &efa).len(), 3);
    }

    /// Two resources' `owns` covering one node decide nothing: it stays contested, refused to
    /// both, rather than going to whichever rule is read first.
    #[test]
    fn two_owners_of_one_node_leave_it_contested() {
        let a = res("a.io/gpu", &[("g", "/dev/dri/renderD128")]);
        let b = res("b.io/gpu", &[("h", "/dev/dri/renderD128")]);
        let both = Decisions::new(vec![owns("a.io/gpu", &["dri/*"]), owns("b.io/gpu", &["dri/renderD*"])]);
        let t = NodeOwners::build_decided([("a", &a), ("b", &b)], &both);
        assert!(t.conflicts("a", &a).iter().all(|c| !c.decided) && t.conflicts("a", &a).len() == 1);
        assert_eq!(t.conflicts("b", &b).len(), 1);
        assert!(t.admit("a.io/gpu", &[("a.io/gpu", "g")], edits(&["/dev/dri/renderD128"])).is_err());
    }

    #[test]
    fn the_suggested_pattern_covers_numbered_siblings() {
        assert_eq!(pattern_of("/dev/infiniband/uverbs17"), "infiniband/uverbs*");
        assert_eq!(pattern_of("/dev/vfio/12"), "vfio/12");
        assert_eq!(pattern_of("/dev/kvm"), "kvm");
        assert_eq!(pattern_of("/dev/nvidia0"), "nvidia*");
    }
}
