//! Time-slicing: one physical device advertised to kubelet as N replicas, so N containers can be
//! scheduled onto it (NVIDIA's `sharing.timeSlicing`, Intel's `shared-dev-num`).
//!
//! Replica IDs are `<device id>::<n>` (NVIDIA's form); every replica carries its device's health,
//! NUMA nodes and edits, plus two attributes: `replica-of` (the device) and `cdi-name` (the
//! device's own CDI name if it has one, else its ID), so the host writes one CDI entry per physical
//! device and a container holding two replicas of one GPU gets that GPU once. A backend calls [`Sharing::expand`] on what it
//! discovered, [`Sharing::physical`] on the IDs kubelet hands back, [`Sharing::check`] before
//! Allocate, and [`Sharing::spread`] for the preferred allocation.
//!
//! ```toml
//! [sharing]
//! replicas = 4                          # 0 or 1: no sharing
//! rename_by_default = false             # true: serve `<name>.shared` (nvidia.com/gpu.shared)
//! fail_requests_greater_than_one = false
//! resources = ["nvidia.com/gpu"]        # which resources share; empty: all of them
//! ```

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::{BackendError, Resource};

/// The separator between a device ID and its replica number.
pub const REPLICA_SEPARATOR: &str = "::";

/// A backend's `[sharing]` config.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Sharing {
    /// How many replicas each device of a shared resource is advertised as.
    pub replicas: u32,
    /// Serve a shared resource as `<name>.shared` instead of `<name>`.
    pub rename_by_default: bool,
    /// Refuse an Allocate of more than one replica: a container asking for two replicas would
    /// otherwise get one device and believe it has two.
    pub fail_requests_greater_than_one: bool,
    /// The (unrenamed) resources that are shared; empty means every resource of the backend.
    pub resources: Vec<String>,
}

impl Sharing {
    /// Whether `resource` (its unrenamed name) is advertised as replicas.
    pub fn shares(&self, resource: &str) -> bool {
        self.replicas > 1 && (self.resources.is_empty() || self.resources.iter().any(|r| r == resource))
    }

    /// The name kubelet sees for `resource`.
    pub fn served_name(&self, resource: &str) -> String {
        if self.shares(resource) && self.rename_by_default { format!("{resource}.shared") } else { resource.to_owned() }
    }

    /// The unrenamed resource behind a name kubelet used, among `names`.
    pub fn original<'a>(&self, served: &str, names: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
        names.into_iter().find(|n| self.served_name(n) == served)
    }

    /// `resource` as kubelet sees it: renamed, and every device replaced by its replicas.
    pub fn expand(&self, mut resource: Resource) -> Resource {
        if !self.shares(&resource.name) {
            return resource;
        }
        resource.name = self.served_name(&resource.name);
        let mut devices = Vec::with_capacity(resource.devices.len() * self.replicas as usize);
        for d in resource.devices {
            for n in 0..self.replicas {
                let mut r = d.clone();
                r.id = format!("{}{REPLICA_SEPARATOR}{n}", d.id);
                r.attributes.push(("replica-of".into(), d.id.clone()));
                if !r.attributes.iter().any(|(k, _)| k == "cdi-name") {
                    r.attributes.push(("cdi-name".into(), d.id.clone()));
                }
                devices.push(r);
            }
        }
        resource.devices = devices;
        resource
    }

    /// The physical device behind a (replica) ID; an ID without a replica suffix is its own.
    pub fn physical(id: &str) -> &str {
        id.rsplit_once(REPLICA_SEPARATOR).map_or(id, |(device, _)| device)
    }

    /// The distinct physical devices behind `ids`, in first-seen order.
    pub fn physical_set(ids: &[String]) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for id in ids {
            let p = Self::physical(id);
            if !out.iter().any(|o| o == p) {
                out.push(p.to_owned());
            }
        }
        out
    }

    /// Refuse a request the operator ruled out (`fail_requests_greater_than_one`).
    pub fn check(&self, resource: &str, ids: &[String]) -> Result<(), BackendError> {
        if self.shares(resource) && self.fail_requests_greater_than_one && ids.len() > 1 {
            return Err(BackendError::Other(format!(
                "{} is time-sliced with fail_requests_greater_than_one: a container may ask for one replica, \
                 this one asked for {} ({}); request 1, or use a resource that is not shared",
                self.served_name(resource),
                ids.len(),
                ids.join(", ")
            )));
        }
        Ok(())
    }

    /// A preferred allocation of replicas that spreads the container over as many physical
    /// devices as it can, taking replicas of the least-used devices first (a device with fewer of
    /// its replicas still available already has more containers on it).
    pub fn spread(&self, available: &[String], must_include: &[String], size: u32) -> Vec<String> {
        let mut free: BTreeMap<&str, Vec<&String>> = BTreeMap::new();
        for id in available {
            free.entry(Self::physical(id)).or_default().push(id);
        }
        let mut chosen: Vec<String> = Vec::new();
        let mut taken: BTreeMap<&str, u32> = BTreeMap::new();
        for id in must_include {
            if available.contains(id) && !chosen.contains(id) {
                chosen.push(id.clone());
                *taken.entry(Self::physical(id)).or_default() += 1;
            }
        }
        while chosen.len() < size as usize {
            // Load of a device = replicas in use by others + replicas this container takes.
            let next = free
                .iter()
                .filter_map(|(dev, ids)| {
                    let pick = ids.iter().find(|id| !chosen.contains(id))?;
                    let mine = taken.get(dev).copied().unwrap_or(0);
                    let used = self.replicas.saturating_sub(ids.len() as u32);
                    Some(((mine, used), *dev, (*pick).clone()))
                })
                .min_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(b.1)));
            let Some((_, dev, id)) = next else { break };
            *taken.entry(dev).or_default() += 1;
            chosen.push(id);
        }
        chosen
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Device, Health, edits};

    fn resource(name: &str, ids: &[&str]) -> Resource {
        let device = |id: &&str| Device {
            id: (*id).to_owned(),
            health: if id.ends_with('1') { Health::Unhealthy } else { Health::Healthy },
            numa_nodes: vec![0],
            attributes: vec![],
            edits: edits::nodes([*id]),
        };
        Resource { name: name.into(), devices: ids.iter().map(device).collect(), common_edits: edits::empty() }
    }

    fn sharing(replicas: u32) -> Sharing {
        Sharing { replicas, ..Sharing::default() }
    }

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| (*x).to_owned()).collect()
    }

    #[test]
    fn replicas_copy_their_device_and_name_it() {
        let r = sharing(3).expand(resource("a.io/x", &["d0", "d1"]));
        let ids: Vec<&str> = r.devices.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, ["d0::0", "d0::1", "d0::2", "d1::0", "d1::1", "d1::2"]);
        assert!(r.devices[3..].iter().all(|d| d.health == Health::Unhealthy), "health follows the device");
        assert_eq!(r.devices[4].edits.device_nodes[0].container_path, "/dev/d1");
        assert!(r.devices[4].attributes.contains(&("cdi-name".into(), "d1".into())));
        assert_eq!(r.name, "a.io/x");
    }

    #[test]
    fn one_replica_or_an_unlisted_resource_is_left_alone() {
        let r = resource("a.io/x", &["d0"]);
        assert_eq!(sharing(1).expand(r.clone()), r);
        let only_y = Sharing { resources: s(&["a.io/y"]), ..sharing(4) };
        assert_eq!(only_y.expand(r.clone()), r);
    }

    #[test]
    fn renaming_maps_back() {
        let sh = Sharing { rename_by_default: true, ..sharing(2) };
        assert_eq!(sh.expand(resource("a.io/x", &["d0"])).name, "a.io/x.shared");
        assert_eq!(sh.original("a.io/x.shared", ["a.io/y", "a.io/x"]), Some("a.io/x"));
        assert_eq!(sh.original("a.io/x", ["a.io/x"]), None);
    }

    #[test]
    fn physical_devices_are_deduplicated() {
        assert_eq!(Sharing::physical("0000:18:00.0::3"), "0000:18:00.0");
        assert_eq!(Sharing::physical("0000:18:00.0"), "0000:18:00.0");
        assert_eq!(Sharing::physical_set(&s(&["a::1", "b::0", "a::0"])), s(&["a", "b"]));
    }

    #[test]
    fn more_than_one_replica_is_refused_only_when_asked() {
        let strict = Sharing { fail_requests_greater_than_one: true, ..sharing(4) };
        let e = strict.check("a.io/x", &s(&["d0::0", "d0::1"])).unwrap_err();
        assert!(matches!(&e, BackendError::Other(m) if m.contains("asked for 2")), "{e:?}");
        assert!(strict.check("a.io/x", &s(&["d0::0"])).is_ok());
        assert!(sharing(4).check("a.io/x", &s(&["d0::0", "d0::1"])).is_ok());
    }

    #[test]
    fn spread_prefers_idle_devices_and_keeps_must_include() {
        let sh = sharing(4);
        // d0 has all 4 replicas free, d1 has 2 (two containers on it), d2 has 4.
        let avail = s(&["d0::0", "d0::1", "d0::2", "d0::3", "d1::2", "d1::3", "d2::0", "d2::1", "d2::2", "d2::3"]);
        assert_eq!(sh.spread(&avail, &[], 2), s(&["d0::0", "d2::0"]));
        assert_eq!(sh.spread(&avail, &s(&["d1::3"]), 2), s(&["d1::3", "d0::0"]));
        // More than there are devices: the second round goes to the least-loaded again.
        assert_eq!(sh.spread(&avail, &[], 4), s(&["d0::0", "d2::0", "d1::2", "d0::1"]));
        assert_eq!(sh.spread(&avail, &[], 11).len(), 10, "never more than available");
    }
}
