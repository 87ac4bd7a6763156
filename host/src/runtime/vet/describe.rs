//! What a backend says of itself and of its devices beyond `discover`, bounded before the host
//! keeps it: its name and version at `init` (they show on every surface), and a WIT 0.3.0
//! `describe` answer, attached only to the devices `discover` listed.

use super::{MAX_ATTRIBUTES, MAX_DEVICES, MAX_RESOURCES, Size};
use crate::gate::clip;
use crate::model::Resource;

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
