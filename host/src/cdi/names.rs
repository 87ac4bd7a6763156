//! CDI names: a resource's `vendor/class` kind and its devices' names, by the rules of the CDI
//! parser (`pkg/parser` in cncf-tags/container-device-interface), and the spec file's name.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use crate::gate::CdiName;
use crate::model::{Device, Resource};

/// A resource's CDI kind: `nvidia.com/gpu` → vendor `nvidia.com`, class `gpu`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kind {
    pub vendor: String,
    pub class: String,
}

impl Kind {
    /// The kind for an extended resource name, or why CDI would refuse it.
    pub fn for_resource(resource: &str) -> Result<Kind, String> {
        let (vendor, class) =
            resource.split_once('/').ok_or_else(|| format!("{resource:?} has no vendor part for a CDI kind"))?;
        for (what, part) in [("vendor", vendor), ("class", class)] {
            if let Some(why) = vendor_or_class_problem(part) {
                return Err(format!("{resource:?}: CDI {what} {part:?} {why}"));
            }
        }
        Ok(Kind { vendor: vendor.to_owned(), class: class.to_owned() })
    }

    /// `vendor/class`, the spec's `kind`.
    pub fn kind(&self) -> String {
        format!("{}/{}", self.vendor, self.class)
    }

    /// `vendor/class=name` for a device ID, what a runtime is asked for.
    pub fn qualified(&self, device_id: &str) -> String {
        self.qualified_name(&device_name(device_id))
    }

    /// `vendor/class=name` for a CDI device name (see [`Naming`]).
    pub fn qualified_name(&self, name: &str) -> String {
        format!("{}/{}={}", self.vendor, self.class, name)
    }

    /// The spec file devplug owns for this kind: `devplug-nvidia.com_gpu.json`.
    pub fn file_name(&self) -> String {
        format!("{OWNED_PREFIX}{}_{}.json", self.vendor, self.class)
    }
}

/// Every spec file devplug writes starts with this; files without it are never touched.
pub(crate) const OWNED_PREFIX: &str = "devplug-";

fn vendor_or_class_problem(name: &str) -> Option<&'static str> {
    let b = name.as_bytes();
    match (b.first(), b.last()) {
        (None, _) | (_, None) => Some("is empty"),
        (Some(f), _) if !f.is_ascii_alphabetic() => Some("must start with a letter"),
        (_, Some(l)) if !l.is_ascii_alphanumeric() => Some("must end with a letter or digit"),
        _ if !b.iter().all(|c| c.is_ascii_alphanumeric() || b"_-.".contains(c)) => {
            Some("may hold only letters, digits, '_', '-' and '.'")
        }
        _ => None,
    }
}

/// A device's CDI name: the device ID itself when CDI accepts it (IDs already use only
/// `[A-Za-z0-9._:-]`), otherwise the ID trimmed to alphanumeric ends plus a short hash of the
/// whole ID, so two IDs never share a name and the name never changes between runs.
pub fn device_name(id: &str) -> String {
    let ok_char = crate::gate::cdi_name_char;
    let alnum_ends = id.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && id.chars().last().is_some_and(|c| c.is_ascii_alphanumeric());
    if alnum_ends && id.chars().all(ok_char) {
        return id.to_owned();
    }
    let cleaned: String = id.chars().map(|c| if ok_char(c) { c } else { '-' }).collect();
    let core = cleaned.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    let hash = hex::encode(&Sha256::digest(id.as_bytes())[..4]);
    if core.is_empty() { format!("d{hash}") } else { format!("{core}-{hash}") }
}

/// The CDI device name of a prepared claim's device: `<claim UID>-<device>`, and for a share of
/// a shared device `-<share ID>` after it (a claim may hold two shares of one device), each
/// character CDI does not take in the share ID (the scheduler's, normally a UUID) as `_`; the
/// whole through the CDI name gate.
pub(crate) fn claim_device_name(uid: &str, device: &str, share: Option<&str>) -> Result<CdiName, crate::gate::Refused> {
    let name = match share {
        Some(share) => {
            let share: String =
                share.chars().take(64).map(|c| if crate::gate::cdi_name_char(c) { c } else { '_' }).collect();
            format!("{uid}-{device}-{share}")
        }
        None => format!("{uid}-{device}"),
    };
    CdiName::new(&name)
}

/// The device attribute through which a backend names a device's CDI entries itself:
/// comma-separated names, the first used in Allocate answers (`0,GPU-<uuid>` for the names
/// `nvidia-ctk cdi generate` writes; a time-sliced GPU's replicas all name their GPU).
pub const CDI_NAME_ATTRIBUTE: &str = "cdi-name";

/// The name every device of a resource answers to when its backend names devices itself, as
/// `nvidia-ctk` writes it.
pub const ALL: &str = "all";

/// Whether CDI accepts `name` as a device name as it is (the CDI-name gate).
fn is_cdi_name(name: &str) -> bool {
    crate::gate::CdiName::new(name).is_ok()
}

/// The CDI entries of one resource: which names its spec holds, which device's edits each
/// carries, and the name an Allocate answer uses for each device ID.
///
/// A device's names are its `cdi-name` attribute where the backend gave one (each checked like
/// any untrusted input: a name CDI would refuse is dropped), else its ID's [`device_name`]. Two
/// devices may share a name only with equal edits (replicas of one GPU): a name first claimed by
/// a device with other edits falls back to the ID's name, so a container never gets another
/// device's nodes through a shared name. When any device names itself, an [`ALL`] entry with
/// every device's edits is added (unless a device took that name), as `nvidia-ctk` does.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Naming<'a> {
    /// (name, device) in spec order; the device provides the entry's edits.
    pub entries: Vec<(String, &'a Device)>,
    /// Device ID → the name Allocate answers with.
    primary: BTreeMap<&'a str, String>,
    /// Whether an `all` entry belongs in the spec.
    pub all: bool,
}

impl<'a> Naming<'a> {
    pub fn of(resource: &'a Resource) -> Naming<'a> {
        let mut n = Naming::default();
        let mut owner: BTreeMap<String, &Device> = BTreeMap::new();
        let mut declared = false;
        for d in &resource.devices {
            let asked: Vec<String> = d
                .attributes
                .iter()
                .find(|(k, _)| k == CDI_NAME_ATTRIBUTE)
                .map(|(_, v)| v.split(',').map(str::trim).filter(|x| is_cdi_name(x)).map(str::to_owned).collect())
                .unwrap_or_default();
            declared |= !asked.is_empty();
            let mut mine: Vec<String> = Vec::new();
            for name in asked {
                match owner.get(&name) {
                    Some(o) if o.edits != d.edits => {}
                    Some(_) => mine.push(name),
                    None => {
                        owner.insert(name.clone(), d);
                        n.entries.push((name.clone(), d));
                        mine.push(name);
                    }
                }
            }
            if mine.is_empty() {
                // The ID's own name, unless another device with other edits took it (a forged
                // `cdi-name` equal to this device's ID): then a name derived from the ID's hash,
                // so no device is ever answered with another device's entry.
                let mut own = device_name(&d.id);
                let mut salt = 0u32;
                while owner.get(&own).is_some_and(|o| o.edits != d.edits) {
                    salt += 1;
                    let hash = hex::encode(&Sha256::digest(format!("{}\0{salt}", d.id).as_bytes())[..4]);
                    own = format!("d{hash}");
                }
                if !owner.contains_key(&own) {
                    owner.insert(own.clone(), d);
                    n.entries.push((own.clone(), d));
                }
                mine.push(own);
            }
            n.primary.insert(&d.id, mine.swap_remove(0));
        }
        n.all = declared && !owner.contains_key(ALL);
        n
    }

    /// The name Allocate answers with for device `id` (its own ID's name if it is not listed).
    pub(crate) fn name_of(&self, id: &str) -> String {
        self.primary.get(id).cloned().unwrap_or_else(|| device_name(id))
    }

    /// Whether the spec holds an entry called `name`.
    pub fn has(&self, name: &str) -> bool {
        self.entries.iter().any(|(n, _)| n == name) || (self.all && name == ALL)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A share ID becomes CDI characters; a name CDI refuses (a UID that ends in `-`) is an
    /// error, not a spec entry.
    #[test]
    fn a_claims_device_names_are_made_here_and_gated() {
        let n = claim_device_name("u-1", "gpu-0", Some("0b1/x")).unwrap();
        assert_eq!(n.as_str(), "u-1-gpu-0-0b1_x");
        assert_eq!(claim_device_name("u-1", "gpu-0", None).unwrap().as_str(), "u-1-gpu-0");
        assert!(claim_device_name("u-1", "gpu-0", Some("x\n")).is_err(), "a trailing '_' is no CDI name end");
        assert!(claim_device_name("-u", "gpu-0", None).is_err());
    }

    #[test]
    fn kinds_follow_the_cdi_parser() {
        let k = Kind::for_resource("nvidia.com/gpu").unwrap();
        assert_eq!((k.kind(), k.file_name()), ("nvidia.com/gpu".into(), "devplug-nvidia.com_gpu.json".into()));
        assert_eq!(k.qualified("0000:17:00.0"), "nvidia.com/gpu=0000:17:00.0");
        assert!(Kind::for_resource("example.com/9lives").unwrap_err().contains("start with a letter"));
        assert!(Kind::for_resource("gpu").unwrap_err().contains("no vendor"));
        assert!(Kind::for_resource("example.com/a_").unwrap_err().contains("end with"));
    }

    #[test]
    fn device_names_are_the_id_when_valid_and_stable_and_distinct_otherwise() {
        assert_eq!(device_name("0000:17:00.0"), "0000:17:00.0");
        assert_eq!(device_name("kvm-3"), "kvm-3");
        let a = device_name("-a-");
        let b = device_name("a");
        let c = device_name("_a_");
        assert!(a.starts_with("a-") && a != b && a != c, "{a} {b} {c}");
        assert_eq!(device_name("-a-"), a, "stable");
        assert!(device_name("--").starts_with('d'));
        for n in [a, c, device_name("--")] {
            assert!(
                n.chars().next().unwrap().is_ascii_alphanumeric() && n.chars().last().unwrap().is_ascii_alphanumeric()
            );
        }
    }

    fn dev(id: &str, node: &str, cdi: Option<&str>) -> Device {
        Device {
            id: id.into(),
            health: crate::model::Health::Healthy,
            numa_nodes: vec![],
            attributes: cdi.map(|c| vec![(CDI_NAME_ATTRIBUTE.to_owned(), c.to_owned())]).unwrap_or_default(),
            edits: crate::model::ContainerEdits {
                device_nodes: vec![crate::model::DeviceNode { container_path: node.into(), ..Default::default() }],
                ..Default::default()
            },
            vetted: Default::default(),
        }
    }

    /// Issue 41: a device that names itself after another device's ID used to take that
    /// device's entry, so Allocate of the other device (`cdi-cri`) handed out this one's node.
    #[test]
    fn a_forged_cdi_name_never_takes_another_devices_entry() {
        let r = Resource {
            name: "nvidia.com/gpu".into(),
            devices: vec![dev("gpu-1", "/dev/nvidia1", Some("gpu-0")), dev("gpu-0", "/dev/nvidia0", None)],
            ..Default::default()
        };
        let n = Naming::of(&r);
        for d in &r.devices {
            let name = n.name_of(&d.id);
            let (_, owner) = n.entries.iter().find(|(e, _)| *e == name).unwrap();
            assert_eq!(owner.edits, d.edits, "{} answered with {name}, another device's entry", d.id);
        }
    }

    proptest::proptest! {
        /// Whatever the devices call themselves, each is answered with an entry holding its own edits.
        #[test]
        fn every_device_is_answered_with_its_own_edits(
            names in proptest::collection::vec(("[a-c]{1,2}", proptest::option::of("[a-c,]{0,5}"), 0u8..3), 1..8)
        ) {
            let devices: Vec<Device> = names.iter().enumerate().map(|(i, (id, cdi, node))| {
                dev(&format!("{id}{i}"), &format!("/dev/n{node}"), cdi.as_deref())
            }).collect();
            let mut devices = devices;
            // IDs may equal other devices' names: rename half of them to collide.
            for (i, (id, _, _)) in names.iter().enumerate() {
                if i % 2 == 0 { devices[i].id = id.clone(); }
            }
            let mut seen = std::collections::HashSet::new();
            devices.retain(|d| seen.insert(d.id.clone()));
            let r = Resource { name: "v.com/c".into(), devices, ..Default::default() };
            let n = Naming::of(&r);
            for d in &r.devices {
                let name = n.name_of(&d.id);
                let owner = n.entries.iter().find(|(e, _)| *e == name).map(|(_, o)| o);
                proptest::prop_assert!(owner.is_some_and(|o| o.edits == d.edits), "{} -> {name}", d.id);
            }
        }
    }

    #[test]
    fn devices_named_by_their_backend_share_entries_only_with_equal_edits() {
        let r = Resource {
            name: "nvidia.com/gpu".into(),
            devices: vec![
                dev("a::0", "/dev/nvidia0", Some("0,GPU-aaa")),
                dev("a::1", "/dev/nvidia0", Some("0,GPU-aaa")),
                dev("b::0", "/dev/nvidia1", Some("0")), // claims a name with other edits
                dev("c", "/dev/nvidia2", Some("bad name!,")), // nothing usable
            ],
            common_edits: Default::default(),
            ..Default::default()
        };
        let n = Naming::of(&r);
        let names: Vec<&str> = n.entries.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["0", "GPU-aaa", "b::0", "c"]);
        assert_eq!((n.name_of("a::1"), n.name_of("b::0"), n.name_of("c")), ("0".into(), "b::0".into(), "c".into()));
        assert!(n.all && n.has("all") && !n.has("1"));
        let plain = Resource { devices: vec![dev("x", "/dev/x", None)], ..r.clone() };
        assert!(!Naming::of(&plain).all, "no all entry unless the backend names devices");
    }
}
