//! Preparing a claim on this node: the claim's allocation read from the API server, each
//! allocated device of this driver mapped back to its backend's device, the backend asked for
//! its edits (`allocate`, checked against its grants like every answer), and one CDI spec
//! written for the claim and driver (`devplug-claim-<uid>-<driver>.json`, kind [`CLAIM_KIND`]) whose device IDs go
//! back to kubelet. The claim's spec holds each device's own edits and, at spec level, the
//! resources' common edits and what `allocate` returned; it lives until the claim is
//! unprepared, independent of the resources' own specs.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::ResourceClaim;
use tracing::Instrument;

use super::checkpoint::{ClaimRef, PreparedDevice};
use super::service::{ClaimPreparer, PreparedClaim};
use crate::cdi::{Kind, SpecDir};
use crate::dra::served::{Served, ServedResource};
use crate::dra::{DraError, PoolId};
use crate::model::ContainerEdits;
use crate::model::dra::ClaimDevice;

/// The CDI kind of every claim spec devplug writes.
pub const CLAIM_KIND: &str = "devplug.io/claim";

/// The request a container names for an allocation result: a `firstAvailable` subrequest is
/// reported as `request/subrequest`, and kubelet matches containers to the base `request`
/// (upstream's `resourceclaim.BaseRequestRef`).
pub fn base_request(request: &str) -> &str {
    request.split_once('/').map_or(request, |(base, _)| base)
}

/// A share ID (a UUID from the scheduler) as part of a CDI device name, which takes
/// `[A-Za-z0-9_.:-]`: anything else becomes `_`.
fn cdi_safe(s: &str) -> String {
    s.chars().take(64).map(|c| if c.is_ascii_alphanumeric() || "_.:-".contains(c) { c } else { '_' }).collect()
}

/// The claim `namespace/name` as the API server has it.
async fn claim(client: &kube::Client, namespace: &str, name: &str) -> Result<ResourceClaim, DraError> {
    kube::Api::<ResourceClaim>::namespaced(client.clone(), namespace)
        .get(name)
        .instrument(tracing::debug_span!("dra.claim_get"))
        .await
        .map_err(|e| {
            DraError::Api(format!("reading ResourceClaim {namespace}/{name}: {}", crate::gate::clip(&e.to_string())))
        })
}

/// One driver's preparer.
pub struct Preparer {
    pub client: kube::Client,
    /// The driver's resources and pool on this node.
    pub served: Arc<Served>,
    pub specs: Arc<SpecDir>,
    /// Reports a committed claim's devices Ready in its status.
    pub status: Arc<super::status::Reporter>,
}

/// An allocated device of this driver.
struct Picked {
    request: String,
    /// Its name in the pool.
    name: String,
    /// The backend's device ID behind the name.
    id: String,
    /// The allocation's share of a device several claims may hold.
    share_id: Option<String>,
}
/// The allocated devices by resource.
type Groups = BTreeMap<String, (ServedResource, Vec<Picked>)>;

impl Preparer {
    /// The devices of this driver the claim was allocated, grouped by resource.
    fn id(&self) -> &PoolId {
        &self.served.id
    }

    async fn allocated(&self, claim: &ClaimRef) -> Result<(Groups, Vec<String>), DraError> {
        let rc = self::claim(&self.client, &claim.namespace, &claim.name).await?;
        let uid = rc.metadata.uid.clone().unwrap_or_default();
        if uid != claim.uid {
            return Err(DraError::Claim(format!(
                "ResourceClaim {}/{} has UID {uid:?}, kubelet asked for {:?}: it was deleted and created again",
                claim.namespace, claim.name, claim.uid
            )));
        }
        let Some(allocation) = rc.status.and_then(|s| s.allocation) else {
            return Err(DraError::Claim(format!("ResourceClaim {}/{} is not allocated", claim.namespace, claim.name)));
        };
        let devices = allocation.devices.unwrap_or_default();
        // The opaque parameters of this driver's configuration (class's first, then the claim's),
        // as JSON text, for a backend's `prepare`.
        let config: Vec<String> = devices
            .config
            .unwrap_or_default()
            .into_iter()
            .filter_map(|c| c.opaque.filter(|o| o.driver == self.id().driver))
            .map(|o| o.parameters.0.to_string())
            .collect();
        let results = devices.results.unwrap_or_default();
        let mut groups: BTreeMap<String, (ServedResource, Vec<Picked>)> = BTreeMap::new();
        for r in results.into_iter().filter(|r| r.driver == self.id().driver) {
            if r.pool != self.id().pool() {
                return Err(DraError::Claim(format!(
                    "device {} (request {}) is in pool {}, not this node's pool {}",
                    r.device,
                    r.request,
                    r.pool,
                    self.id().pool()
                )));
            }
            let Some((resource, id)) = self.served.lookup(&r.device) else {
                return Err(DraError::Claim(format!(
                    "device {} (request {}) is not among driver {}'s devices on this node now (gone since the scheduler allocated it)",
                    r.device,
                    r.request,
                    self.id().driver
                )));
            };
            groups.entry(resource.name.clone()).or_insert_with(|| (resource, Vec::new())).1.push(Picked {
                request: r.request,
                name: r.device,
                id,
                share_id: r.share_id,
            });
        }
        Ok((groups, config))
    }
}

#[async_trait::async_trait]
impl ClaimPreparer for Preparer {
    async fn prepare(&self, claim: &ClaimRef) -> Result<PreparedClaim, DraError> {
        let (groups, config) = self.allocated(claim).await?;
        let kind = Kind::for_resource(CLAIM_KIND).map_err(|e| DraError::Claim(format!("the claims' CDI kind: {e}")))?;
        let mut common = ContainerEdits::default();
        let mut out = Vec::new();
        let mut status = Vec::new();
        // A WIT 0.3.0 backend prepares the claim whole (one driver is one backend); otherwise,
        // or when it says `unsupported`, each resource's `allocate` gives the edits.
        let claim_devices: Vec<ClaimDevice> = groups
            .iter()
            .flat_map(|(resource, (_, picked))| {
                picked.iter().map(|p| ClaimDevice {
                    request: p.request.clone(),
                    resource: resource.clone(),
                    id: p.id.clone(),
                })
            })
            .collect();
        let whole = match groups.values().next() {
            Some((served, _)) => {
                served
                    .calls
                    .prepare(claim.uid.clone(), claim_devices, config)
                    .instrument(tracing::debug_span!("dra.backend_call"))
                    .await?
            }
            None => None,
        };
        if let Some(edits) = &whole {
            common.merge(edits);
        }
        // The node gate's view and what the claim holds, across its resources: its spec carries
        // its own devices' nodes and nodes no device owns, never another device's, of any
        // backend (the rule Allocate's answers follow too).
        let owners = groups.values().next().map(|(s, _)| s.owners.load()).unwrap_or_default();
        let backend = groups.values().next().map(|(s, _)| s.backend.clone()).unwrap_or_default();
        let held: Vec<(String, String)> = groups
            .iter()
            .flat_map(|(resource, (_, picked))| picked.iter().map(move |p| (resource.clone(), p.id.clone())))
            .collect();
        let held: Vec<(&str, &str)> = held.iter().map(|(r, id)| (r.as_str(), id.as_str())).collect();
        let label = format!("claim {}/{}", claim.namespace, claim.name);
        let refused = |why: crate::model::nodes::Foreign| {
            tracing::error!(backend = %backend, claim = %label, owner = %why.owner_resource, "prepare answer refused: {why}");
            DraError::backend(&backend, None, format!("answer for {label} refused: {why}"))
        };
        let mut spec_devices = Vec::new();
        for (resource, (served, picked)) in groups {
            let ids: Vec<String> = picked.iter().map(|p| p.id.clone()).collect();
            let list = served.devices.borrow().clone();
            if whole.is_none() {
                let extra =
                    served.calls.allocate(ids.clone()).instrument(tracing::debug_span!("dra.backend_call")).await?;
                common.merge(&extra);
            }
            common.merge(&list.common_edits);
            for Picked { request, name, id, share_id } in picked {
                let Some(d) = list.device(&id) else {
                    return Err(DraError::Claim(format!(
                        "device {name} ({resource} {id}) went away while the claim was prepared"
                    )));
                };
                // A CDI device per share: one claim may hold two shares of a shared device. The
                // UID and names come from the API server: the name passes the CDI name gate.
                let cdi_name = match &share_id {
                    Some(share) => format!("{}-{name}-{}", claim.uid, cdi_safe(share)),
                    None => format!("{}-{name}", claim.uid),
                };
                let cdi_name = crate::gate::CdiName::new(&cdi_name)
                    .map_err(|e| DraError::Claim(format!("claim {}/{}: {e}", claim.namespace, claim.name)))?;
                status.push(super::status::entry(self.id(), &name, share_id.as_deref(), d));
                spec_devices.push((cdi_name.clone(), owners.admit(&label, &held, d.edits.clone()).map_err(&refused)?));
                out.push(PreparedDevice {
                    request_names: vec![base_request(&request).to_owned()],
                    pool_name: self.id().pool().to_owned(),
                    device_name: name,
                    cdi_device_ids: vec![kind.qualified_name(cdi_name.as_str())],
                    share_id,
                });
            }
        }
        if out.is_empty() {
            return Ok(PreparedClaim::devices(out));
        }
        let common = owners.admit(&label, &held, common).map_err(&refused)?;
        let spec = crate::cdi::spec::build_claim(&kind, &spec_devices, &common);
        Ok(PreparedClaim { devices: out, spec: Some(spec), status })
    }

    fn commit(&self, claim: &ClaimRef, prepared: PreparedClaim) -> Result<(), DraError> {
        let Some(spec) = prepared.spec else { return Ok(()) };
        tracing::debug_span!("dra.spec_write")
            .in_scope(|| self.specs.write_claim_unflushed(&claim.uid, &self.id().driver, &spec))
            .map_err(|source| DraError::Spec { doing: "writing", source })?;
        self.status.report(claim.clone(), prepared.status);
        Ok(())
    }

    fn intact(&self, claim: &ClaimRef) -> bool {
        self.specs.has_claim(&claim.uid, &self.id().driver)
    }

    fn release(&self, claim: &ClaimRef) -> Result<(), DraError> {
        tracing::debug_span!("dra.spec_remove")
            .in_scope(|| self.specs.remove_claim(&claim.uid, &self.id().driver))
            .map_err(|source| DraError::Spec { doing: "removing", source })
    }

    async fn unprepare(&self, claim: &ClaimRef, _devices: &[PreparedDevice]) -> Result<(), DraError> {
        // The backend first: if it cannot undo its part, the claim stays prepared (and its spec
        // stays) so kubelet's retry finds it as it was.
        if let Some(r) = self.served.resources().first() {
            r.calls.unprepare(claim.uid.clone()).instrument(tracing::debug_span!("dra.backend_call")).await?;
        }
        self.release(claim)
    }
}
