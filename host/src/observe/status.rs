//! The `/status` document as one type: the daemon writes it ([`super::http`]), `devplug status`
//! reads it (`cli/tables.rs`). Every part is the type its owner keeps (a backend's summary, a
//! registry source's status, a claim's state), so the table and the daemon cannot drift apart
//! by a misspelt key. Every field has a default: a `devplug status` reads what an older devplug
//! sends (what it lacks is empty, or says "loaded" where an older one listed only loaded
//! backends) and ignores what a newer one adds.

use serde::{Deserialize, Serialize};

use crate::backends::BackendSummary;
use crate::backends::SourceStatus;
use crate::dra::plugin::claims::ClaimStatus;
use crate::kubelet::podresources::Assignment;
use crate::model::contest::Contest;
pub use crate::plugin_socket::registration::RegistrationStatus;

/// `/status`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Status {
    pub resources: Vec<ResourceStatus>,
    pub backends: Vec<BackendSummary>,
    /// Which container holds which device (the pod resources API's answer).
    pub allocations: Vec<Assignment>,
    /// Each backend followed from a registry.
    pub sources: Vec<SourceStatus>,
    /// Each registration with kubelet (a resource's, or a DRA driver's).
    pub registrations: Vec<RegistrationStatus>,
    pub claims: Vec<ClaimStatus>,
    /// Each pair of resources naming the same device nodes; `None` from a devplug older than
    /// contests (it lists them per backend, in [`BackendSummary::conflicts`]).
    pub contests: Option<Vec<Contest>>,
}

/// One resource's devices and where kubelet sees them.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ResourceStatus {
    pub name: String,
    pub healthy: usize,
    pub unhealthy: usize,
    /// Devices withheld for a contest over their device nodes (0 from an older devplug).
    pub withheld: usize,
    /// Its endpoint's state, its DRA driver's registration, or `NotServed`.
    pub endpoint: String,
}

/// One page of `/status/devices`: resources in order, each with its devices on this page.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct DevicesPage {
    pub resources: Vec<ResourceDevices>,
    pub offset: usize,
    /// Devices on the node, all pages together.
    pub total: usize,
    /// The offset of the next page; none on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<usize>,
}

/// A resource's devices (on one page, or all of them once `devplug status` joined the pages).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ResourceDevices {
    pub name: String,
    pub devices: Vec<DeviceStatus>,
}

/// One device as devplug serves it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct DeviceStatus {
    pub id: String,
    pub health: String,
    pub numa_nodes: Vec<u32>,
    /// Its backend's attributes (a `cdi-name` among them).
    pub attributes: std::collections::BTreeMap<String, String>,
    /// The device nodes a container gets, `HOST:CONTAINER`.
    pub nodes: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a devplug of before contests, `withheld` and `loaded` sent still reads: the
    /// backends it listed are loaded, nothing is withheld, contests come per backend.
    #[test]
    fn an_older_devplugs_status_reads() {
        let older = serde_json::json!({
            "resources": [{ "name": "a.io/x", "healthy": 2, "unhealthy": 0, "endpoint": "Registered" }],
            "backends": [{ "name": "x", "version": "1", "digest": "ab", "stats": { "traps": 1 },
                           "conflicts": ["a contest"] }],
            "allocations": [], "someday": { "a": 1 },
        });
        let s: Status = serde_json::from_value(older).unwrap();
        assert_eq!((s.resources[0].healthy, s.resources[0].withheld), (2, 0));
        let b = &s.backends[0];
        assert!(b.loaded && b.stats.traps == 1 && b.conflicts == ["a contest"]);
        assert!(s.contests.is_none() && s.claims.is_empty());
    }
}
