//! Building a [`Device`] with the health convention of the first-party backends: a device is
//! Healthy unless there is a problem, and then the problem, in words, is its `unhealthy`
//! attribute (what `devplug discover` and `devplug status` show an operator).

use crate::{ContainerEdits, Device, Health, edits};

/// The attribute that keeps a device out of the Device Plugin API ([`Device::dra_only`]).
pub const DRA_ONLY: &str = "dra-only";

impl Device {
    /// A Healthy device with no NUMA node, attributes or edits yet.
    pub fn new(id: impl Into<String>) -> Device {
        Device {
            id: id.into(),
            health: Health::Healthy,
            numa_nodes: Vec::new(),
            attributes: Vec::new(),
            edits: edits::empty(),
        }
    }

    /// The NUMA node the device is attached to, if known.
    pub fn numa(mut self, node: Option<u32>) -> Device {
        self.numa_nodes = node.into_iter().collect();
        self
    }

    /// Add attributes (shown by `devplug discover`).
    pub fn attrs(mut self, attributes: impl IntoIterator<Item = (String, String)>) -> Device {
        self.attributes.extend(attributes);
        self
    }

    /// What a container needs for this device alone.
    pub fn edits(mut self, edits: ContainerEdits) -> Device {
        self.edits = edits;
        self
    }

    /// Unhealthy for `problem`, when there is one (see [`Device::fail`]).
    pub fn problem(mut self, problem: Option<&str>) -> Device {
        if let Some(why) = problem {
            self.fail(why);
        }
        self
    }

    /// Publish the device only through DRA: the host leaves it out of what kubelet's Device
    /// Plugin API sees (and of that resource's CDI spec). For a device that exists only as what
    /// DRA's scheduler arbitrates, such as a GPU in MIG mode beside its instances, all drawing
    /// on one counter set: through the Device Plugin API it would be counted twice.
    pub fn dra_only(mut self) -> Device {
        if !self.attributes.iter().any(|(k, _)| k == DRA_ONLY) {
            self.attributes.push((DRA_ONLY.to_owned(), "true".to_owned()));
        }
        self
    }

    /// Mark the device Unhealthy because of `why`. A device already Unhealthy keeps its first
    /// reason: that is the one to fix first.
    pub fn fail(&mut self, why: &str) {
        if self.health == Health::Healthy {
            self.health = Health::Unhealthy;
            self.attributes.push(("unhealthy".to_owned(), why.to_owned()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_follows_the_first_problem() {
        let d = Device::new("a").numa(Some(1)).attrs([("k".to_owned(), "v".to_owned())]).problem(None);
        assert_eq!((d.health, d.numa_nodes.as_slice(), d.attributes.len()), (Health::Healthy, &[1u32][..], 1));
        let mut d = d.problem(Some("no driver"));
        d.fail("node missing");
        assert_eq!(d.health, Health::Unhealthy);
        assert_eq!(d.attributes.last(), Some(&("unhealthy".to_owned(), "no driver".to_owned())));
        assert_eq!(d.attributes.iter().filter(|(k, _)| k == "unhealthy").count(), 1);
    }
}
