//! The API server's ResourceClaims as the plugin side meets them: the one port through which a
//! claim is read (by the service, before the driver prepares it, as upstream's
//! `kubeletplugin` does) and a prepared claim's status applied. What comes back is checked
//! here and handed on as an [`Allocation`]: plain values, so `prepare` needs no API server and
//! is tested with a fake one.

use std::sync::Arc;

use k8s_openapi::api::resource::v1::{
    AllocatedDeviceStatus, DeviceAllocationConfiguration, DeviceRequestAllocationResult, ResourceClaim,
};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tracing::Instrument;

use super::checkpoint::ClaimRef;
use crate::dra::error::DraError;

/// Where claims are read and their status applied.
#[async_trait::async_trait]
pub trait ClaimApi: Send + Sync + 'static {
    /// Claim `namespace/name` as the API server has it now.
    async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, DraError>;
    /// Apply `devices` as `driver`'s part of the claim's `status.devices` (server-side apply
    /// under the driver's own field manager).
    async fn apply_status(
        &self,
        driver: &str,
        claim: &ClaimRef,
        devices: &[AllocatedDeviceStatus],
    ) -> Result<(), StatusRefused>;
}

/// The real API server.
pub struct ApiServer(pub kube::Client);

#[async_trait::async_trait]
impl ClaimApi for ApiServer {
    async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, DraError> {
        Api::<ResourceClaim>::namespaced(self.0.clone(), namespace)
            .get(name)
            .instrument(tracing::debug_span!("dra.claim_get"))
            .await
            .map_err(|e| DraError::Api {
                doing: format!("reading ResourceClaim {namespace}/{name}"),
                source: Arc::new(e),
            })
    }

    async fn apply_status(
        &self,
        driver: &str,
        claim: &ClaimRef,
        devices: &[AllocatedDeviceStatus],
    ) -> Result<(), StatusRefused> {
        // The apply names only what this driver owns: its devices' entries (typed, serialised
        // as the API has them) under the claim's identity; never a spec.
        let patch = json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": { "name": claim.name, "namespace": claim.namespace },
            "status": { "devices": devices },
        });
        Api::<ResourceClaim>::namespaced(self.0.clone(), &claim.namespace)
            .patch_status(&claim.name, &PatchParams::apply(&field_manager(driver)).force(), &Patch::Apply(&patch))
            .await
            .map(drop)
            .map_err(|e| {
                let claim = format!("{}/{}", claim.namespace, claim.name);
                let write = crate::dra::refusal::Write::ClaimStatus { claim: &claim, driver };
                StatusRefused {
                    cause: crate::dra::refusal::cause(&e),
                    message: crate::dra::refusal::explain(write, &e),
                }
            })
    }
}

/// Why a claim's `status.devices` was not written: the kind (one WARN per driver and kind) and
/// the whole sentence.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct StatusRefused {
    pub cause: crate::dra::refusal::Cause,
    pub message: String,
}

/// The field manager a driver applies claim status as.
pub(crate) fn field_manager(driver: &str) -> String {
    let mut m = format!("devplug-{driver}");
    m.truncate(128);
    m
}

/// What the scheduler allocated a claim, of every driver (each driver's `prepare` takes its
/// own): the devices and the opaque configuration, the class's first, then the claim's.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Allocation {
    pub results: Vec<DeviceRequestAllocationResult>,
    pub config: Vec<DeviceAllocationConfiguration>,
}

/// `claim` as kubelet named it, checked against the API server's copy `found`: the same object
/// (a claim deleted and created again under the same name has a new UID) and allocated.
pub fn allocation(claim: &ClaimRef, found: ResourceClaim) -> Result<Allocation, DraError> {
    let uid = found.metadata.uid.unwrap_or_default();
    if uid != claim.uid {
        return Err(DraError::claim(
            &claim.namespace,
            &claim.name,
            format!("has UID {uid:?}, kubelet asked for {:?}: it was deleted and created again", claim.uid),
        ));
    }
    let Some(allocation) = found.status.and_then(|s| s.allocation) else {
        return Err(DraError::claim(&claim.namespace, &claim.name, "is not allocated"));
    };
    let devices = allocation.devices.unwrap_or_default();
    Ok(Allocation { results: devices.results.unwrap_or_default(), config: devices.config.unwrap_or_default() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::{AllocationResult, DeviceAllocationResult, ResourceClaimStatus};

    fn found(uid: &str, allocated: bool) -> ResourceClaim {
        let mut rc = ResourceClaim::default();
        rc.metadata.uid = Some(uid.into());
        if allocated {
            let result = DeviceRequestAllocationResult {
                driver: "gpu.devplug.io".into(),
                pool: "node-a".into(),
                device: "gpu-0".into(),
                request: "gpu".into(),
                ..Default::default()
            };
            rc.status = Some(ResourceClaimStatus {
                allocation: Some(AllocationResult {
                    devices: Some(DeviceAllocationResult { results: Some(vec![result]), config: None }),
                    ..Default::default()
                }),
                ..Default::default()
            });
        }
        rc
    }

    #[test]
    fn a_replaced_or_unallocated_claim_is_refused_with_what_happened() {
        let claim = ClaimRef { namespace: "ml".into(), uid: "u-1".into(), name: "train".into() };
        let a = allocation(&claim, found("u-1", true)).unwrap();
        assert_eq!((a.results.len(), a.results[0].device.as_str()), (1, "gpu-0"));
        let e = allocation(&claim, found("u-2", true)).unwrap_err();
        assert!(matches!(e, DraError::Claim { .. }), "{e:?}");
        assert!(e.report().contains("deleted and created again"), "{}", e.report());
        let e = allocation(&claim, found("u-1", false)).unwrap_err();
        assert_eq!(e.report(), "ResourceClaim ml/train: is not allocated");
        assert_eq!(field_manager(&"d".repeat(300)).len(), 128);
    }
}
