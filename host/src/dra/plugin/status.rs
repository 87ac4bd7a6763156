//! Claim device status (KEP-4817, `status.devices` of a `resource.k8s.io/v1` ResourceClaim):
//! once a claim is prepared, each of its devices from this driver is reported `Ready`, with the
//! network data a NIC backend knows (its `netdev` attribute is the interface name). Written by
//! server-side apply under the driver's own field manager, so another driver's entries and the
//! scheduler's fields are never touched. Best effort: a cluster without the feature
//! (`DRAResourceClaimDeviceStatus`, beta and on since 1.33) or without the RBAC
//! (`resourceclaims/status` patch, and since 1.36 `resourceclaims/driver` `associated-node:patch`
//! for the driver) costs one WARN per driver and cause, naming the missing rule
//! ([`crate::dra::refusal`]); prepare goes on either way.

use std::collections::HashSet;

use crate::sync::Locked;

use k8s_openapi::api::resource::v1::{AllocatedDeviceStatus, NetworkDeviceData};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use super::checkpoint::ClaimRef;
use super::claim_api::ClaimApi;
use crate::dra::pool_id::PoolId;
use crate::model::Device;

/// Which prepared devices get a `status.devices` entry (`[dra] claim_status`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StatusPolicy {
    /// Every device, `Ready` (one server-side apply per prepared claim).
    All,
    /// Devices with network data (a NIC's interface name), where the entry tells the pod
    /// something it cannot learn otherwise: what upstream's network drivers report. The
    /// default: a server-side apply costs the API server more than the claim's GET (9.5 ms
    /// against 2.7 ms at p50 on a loaded node, docs/BENCHMARKS.md), and kubelet already knows
    /// the claim is prepared.
    #[default]
    Network,
    /// None.
    Off,
}

impl StatusPolicy {
    /// Whether `entry` (from [`entry`]) is reported.
    pub fn keeps(self, entry: &AllocatedDeviceStatus) -> bool {
        match self {
            StatusPolicy::All => true,
            StatusPolicy::Network => entry.network_data.is_some(),
            StatusPolicy::Off => false,
        }
    }
}

/// One device's entry in `status.devices` of pool `id`: `Ready`, prepared on its node.
pub fn entry(id: &PoolId, name: &str, share_id: Option<&str>, device: &Device) -> AllocatedDeviceStatus {
    let (driver, pool, node) = (&id.driver, id.pool(), &id.node);
    AllocatedDeviceStatus {
        driver: driver.clone(),
        pool: pool.to_owned(),
        device: name.to_owned(),
        share_id: share_id.map(str::to_owned),
        conditions: Some(vec![Condition {
            type_: "Ready".into(),
            status: "True".into(),
            reason: "Prepared".into(),
            message: format!("prepared by devplug on node {node}"),
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::now()),
            observed_generation: None,
        }]),
        // Only a name past the interface-name gate (set by the vet from the `netdev` attribute).
        network_data: device
            .vetted
            .netdev
            .as_ref()
            .map(|name| NetworkDeviceData { interface_name: Some(name.as_str().to_owned()), ..Default::default() }),
        data: None,
    }
}

/// Applies a prepared claim's status in the background, warning once per driver when the
/// cluster will not take it.
pub struct Reporter {
    api: std::sync::Arc<dyn ClaimApi>,
    pub driver: String,
    pub policy: StatusPolicy,
    /// The causes already warned about (each once).
    warned: std::sync::Mutex<HashSet<crate::dra::refusal::Cause>>,
}

impl Reporter {
    pub fn new(api: std::sync::Arc<dyn ClaimApi>, driver: String, policy: StatusPolicy) -> std::sync::Arc<Reporter> {
        std::sync::Arc::new(Reporter { api, driver, policy, warned: Default::default() })
    }

    /// Report `devices` of `claim` Ready, those the policy keeps; never waits for the API server.
    pub fn report(self: &std::sync::Arc<Self>, claim: ClaimRef, mut devices: Vec<AllocatedDeviceStatus>) {
        devices.retain(|d| self.policy.keeps(d));
        if devices.is_empty() {
            return;
        }
        let me = self.clone();
        tokio::spawn(async move {
            let applied = me.api.apply_status(&me.driver, &claim, &devices);
            match tracing::Instrument::instrument(applied, tracing::debug_span!("dra.status_patch")).await {
                Ok(()) => {
                    tracing::debug!(driver = %me.driver, claim = %format!("{}/{}", claim.namespace, claim.name), "claim device status written")
                }
                Err(e) if me.warned.locked().insert(e.cause) => tracing::warn!(
                    driver = %me.driver,
                    "claim device status not written, the claim is prepared all the same: {}; said once per driver and cause",
                    crate::gate::clip_to(&e.message, 2048)
                ),
                Err(e) => {
                    tracing::debug!(driver = %me.driver, "claim device status not written: {}", crate::gate::clip(&e.message))
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Health;

    #[test]
    fn the_default_policy_reports_only_devices_with_network_data() {
        let plain = Device {
            id: "gpu-0".into(),
            health: Health::Healthy,
            numa_nodes: vec![],
            attributes: vec![],
            edits: Default::default(),
            vetted: Default::default(),
        };
        let mut nic = plain.clone();
        nic.vetted.netdev = crate::gate::IfName::new("ens1f0v0").ok();
        let id = PoolId::new("d.devplug.io", "node-a");
        let (plain, nic) = (entry(&id, "gpu-0", None, &plain), entry(&id, "vf-0", None, &nic));
        assert_eq!(StatusPolicy::default(), StatusPolicy::Network);
        assert!(!StatusPolicy::Network.keeps(&plain) && StatusPolicy::Network.keeps(&nic));
        assert!(StatusPolicy::All.keeps(&plain) && !StatusPolicy::Off.keeps(&nic));
    }

    #[test]
    fn an_entry_is_ready_and_carries_the_share_and_the_interface() {
        let d = Device {
            id: "0000:3b:00.2".into(),
            health: Health::Healthy,
            numa_nodes: vec![],
            attributes: vec![("netdev".into(), "ens1f0np0v0".into())],
            edits: Default::default(),
            vetted: crate::model::Vetted {
                netdev: Some(crate::gate::IfName::new("ens1f0np0v0").unwrap()),
                ..Default::default()
            },
        };
        // As the wire has it (the typed value serialised as the apply sends it).
        let e = serde_json::to_value(entry(&PoolId::new("nic.devplug.io", "node-a"), "vf-0", Some("s-1"), &d)).unwrap();
        assert_eq!(e["conditions"][0]["type"], "Ready");
        assert_eq!(e["conditions"][0]["status"], "True");
        let at = e["conditions"][0]["lastTransitionTime"].as_str().unwrap();
        assert!(at.ends_with('Z') && !at.contains('.'), "RFC 3339 in seconds, as metav1.Time: {at}");
        assert_eq!(e["shareID"], "s-1");
        assert_eq!(e["networkData"]["interfaceName"], "ens1f0np0v0");
        assert_eq!(e["pool"], "node-a");
        let plain = Device { attributes: vec![], vetted: Default::default(), ..d };
        let e = serde_json::to_value(entry(&PoolId::new("nic.devplug.io", "node-a"), "vf-0", None, &plain)).unwrap();
        assert!(e["shareID"].is_null() && e["networkData"].is_null(), "{e}");
    }
}
