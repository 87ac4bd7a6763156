//! Preparing a claim on this node, from values: the claim's [`Allocation`] (read by the service)
//! → each allocated device of this driver mapped back to its backend's device → the backend's
//! edits (`prepare`, or `allocate` per resource; checked against its grants like every
//! answer, and against the node table in the port: [`crate::model::port::Port::prepare_claim`])
//! → a [`PreparedClaim`]: what kubelet is told, the claim's CDI spec
//! (`devplug-claim-<uid>-<driver>.json`, kind [`CLAIM_KIND`]) and its devices' status, written
//! by [`ClaimPreparer::commit`] once the claim is recorded. The only calls out are the
//! backend's; the spec holds each device's own edits and, at spec level, the resources' common
//! edits and what the backend returned, and lives until the claim is unprepared.

use std::collections::BTreeMap;
use std::sync::Arc;

use tracing::Instrument;

use super::checkpoint::{ClaimRef, PreparedDevice};
use super::claim_api::Allocation;
use super::service::{ClaimPreparer, PreparedClaim};
use crate::cdi::{Kind, SpecDir};
use crate::dra::error::DraError;
use crate::dra::pool_id::PoolId;
use crate::dra::served::{Served, ServedResource};
use crate::model::dra::ClaimDevice;
use crate::model::port::ClaimPart;

/// The CDI kind of every claim spec devplug writes.
pub(crate) const CLAIM_KIND: &str = "devplug.io/claim";

/// [`CLAIM_KIND`] as a CDI kind, parsed once (a constant: its test is `the_claim_kind_is_a_cdi_kind`).
static CLAIM_CDI_KIND: std::sync::LazyLock<Result<Kind, String>> =
    std::sync::LazyLock::new(|| Kind::for_resource(CLAIM_KIND));

/// The request a container names for an allocation result: a `firstAvailable` subrequest is
/// reported as `request/subrequest`, and kubelet matches containers to the base `request`
/// (upstream's `resourceclaim.BaseRequestRef`).
pub fn base_request(request: &str) -> &str {
    request.split_once('/').map_or(request, |(base, _)| base)
}

/// One driver's preparer.
pub struct Preparer {
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
    fn id(&self) -> &PoolId {
        &self.served.id
    }

    /// This driver's part of `allocation`: its devices grouped by resource, and its opaque
    /// configuration as JSON text for a backend's `prepare`.
    fn mine(&self, claim: &ClaimRef, allocation: &Allocation) -> Result<(Groups, Vec<String>), DraError> {
        let driver = &self.id().driver;
        let config: Vec<String> = allocation
            .config
            .iter()
            .filter_map(|c| c.opaque.as_ref().filter(|o| &o.driver == driver))
            .map(|o| o.parameters.0.to_string())
            .collect();
        let mut groups: Groups = BTreeMap::new();
        for r in allocation.results.iter().filter(|r| &r.driver == driver) {
            if r.pool != self.id().pool() {
                return Err(DraError::claim(
                    &claim.namespace,
                    &claim.name,
                    format!(
                        "device {} (request {}) is in pool {}, not this node's pool {}",
                        r.device,
                        r.request,
                        r.pool,
                        self.id().pool()
                    ),
                ));
            }
            let Some((resource, id)) = self.served.lookup(&r.device) else {
                return Err(DraError::claim(
                    &claim.namespace,
                    &claim.name,
                    format!(
                        "device {} (request {}) is not among driver {driver}'s devices on this node now (gone since the scheduler allocated it)",
                        r.device, r.request
                    ),
                ));
            };
            groups.entry(resource.name.clone()).or_insert_with(|| (resource, Vec::new())).1.push(Picked {
                request: r.request.clone(),
                name: r.device.clone(),
                id,
                share_id: r.share_id.clone(),
            });
        }
        Ok((groups, config))
    }
}

#[async_trait::async_trait]
impl ClaimPreparer for Preparer {
    async fn prepare(&self, claim: &ClaimRef, allocation: &Allocation) -> Result<PreparedClaim, DraError> {
        let (groups, config) = self.mine(claim, allocation)?;
        let Some((first, _)) = groups.values().next() else {
            // Nothing of this driver's: kubelet is told so, nothing is written.
            return Ok(PreparedClaim::devices(Vec::new()));
        };
        let kind = CLAIM_CDI_KIND
            .as_ref()
            .map_err(|e| DraError::Spec { doing: "naming", source: crate::cdi::CdiError::Name(e.clone()) })?;
        // Each resource's list once, as the claim is checked against it and gated.
        let lists: Vec<Arc<crate::model::Resource>> =
            groups.values().map(|(served, _)| served.devices.borrow().clone()).collect();
        let mut parts = Vec::with_capacity(groups.len());
        for ((resource, (served, picked)), list) in groups.iter().zip(&lists) {
            let mut devices = Vec::with_capacity(picked.len());
            for p in picked {
                let Some(d) = list.device(&p.id) else {
                    return Err(DraError::claim(
                        &claim.namespace,
                        &claim.name,
                        format!("device {} ({resource} {}) went away while the claim was prepared", p.name, p.id),
                    ));
                };
                let held = ClaimDevice { request: p.request.clone(), resource: resource.clone(), id: p.id.clone() };
                devices.push((held, d));
            }
            parts.push(ClaimPart { port: &served.port, list, devices });
        }
        // A WIT 0.3.0 backend prepares the claim whole (one driver is one backend); otherwise,
        // or when it says `unsupported`, each resource's `allocate` gives the edits. Either way
        // through the port's node gate: the spec carries the claim's own devices' nodes and
        // nodes no device owns, never another device's, of any backend.
        let label = format!("claim {}/{}", claim.namespace, claim.name);
        let gated = first
            .port
            .prepare_claim(&claim.uid, &label, &parts, config)
            .instrument(tracing::debug_span!("dra.backend_call"))
            .await
            .map_err(|e| DraError::call(&e.backend, &e.resource, e.error))?;
        let mut out = Vec::new();
        let mut status = Vec::new();
        let mut spec_devices = Vec::new();
        for ((part, (_, picked)), admitted) in parts.iter().zip(groups.values()).zip(gated.devices) {
            for ((Picked { request, name, share_id, .. }, (_, d)), admitted) in
                picked.iter().zip(&part.devices).zip(admitted)
            {
                // A CDI device per share: one claim may hold two shares of a shared device. The
                // UID and names come from the API server: the name passes the CDI name gate.
                let cdi_name = crate::cdi::names::claim_device_name(&claim.uid, name, share_id.as_deref())
                    .map_err(|e| DraError::claim(&claim.namespace, &claim.name, e.to_string()))?;
                status.push(super::status::entry(self.id(), name, share_id.as_deref(), d));
                out.push(PreparedDevice {
                    request_names: vec![base_request(request).to_owned()],
                    pool_name: self.id().pool().to_owned(),
                    device_name: name.clone(),
                    cdi_device_ids: vec![kind.qualified_name(cdi_name.as_str())],
                    share_id: share_id.clone(),
                });
                spec_devices.push((cdi_name, admitted));
            }
        }
        let spec = crate::cdi::spec::build_claim(kind, &spec_devices, &gated.common);
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

    async fn unprepare(&self, claim: &ClaimRef) -> Result<(), DraError> {
        // The backend first: if it cannot undo its part, the claim stays prepared (and its spec
        // stays) so kubelet's retry finds it as it was.
        if let Some(r) = self.served.resources().first() {
            r.port
                .unprepare(&claim.uid)
                .instrument(tracing::debug_span!("dra.backend_call"))
                .await
                .map_err(|e| DraError::call(&r.backend, &r.name, e))?;
        }
        self.release(claim)
    }
}

#[cfg(test)]
mod tests {
    //! `prepare` from values with a fake backend: no API server, no socket.
    use k8s_openapi::api::resource::v1::{
        DeviceAllocationConfiguration, DeviceRequestAllocationResult, OpaqueDeviceConfiguration,
    };
    use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
    use tokio::sync::watch;

    use super::*;
    use crate::dra::error::ErrorClass;
    use crate::model::calls::{CallClass, CallError, FixedCalls};
    use crate::model::{ContainerEdits, Device, DeviceNode, Health, Resource};

    const DRIVER: &str = "gpu.devplug.io";

    #[test]
    fn the_claim_kind_is_a_cdi_kind() {
        assert!(CLAIM_CDI_KIND.is_ok(), "{:?}", CLAIM_CDI_KIND.as_ref().err());
    }

    /// No API server: the status reports go nowhere.
    struct NoApi;
    #[async_trait::async_trait]
    impl super::super::claim_api::ClaimApi for NoApi {
        async fn get(&self, _: &str, _: &str) -> Result<k8s_openapi::api::resource::v1::ResourceClaim, DraError> {
            unreachable!("prepare never reads the API server")
        }
        async fn apply_status(
            &self,
            _: &str,
            _: &ClaimRef,
            _: &[k8s_openapi::api::resource::v1::AllocatedDeviceStatus],
        ) -> Result<(), super::super::claim_api::StatusRefused> {
            Ok(())
        }
    }

    fn gpu(i: u32) -> Device {
        Device {
            id: format!("gpu-{i}"),
            health: Health::Healthy,
            numa_nodes: vec![0],
            attributes: vec![],
            edits: ContainerEdits {
                device_nodes: vec![DeviceNode {
                    container_path: format!("/dev/nvidia{i}"),
                    host_path: String::new(),
                    permissions: "rw".into(),
                    numbers: None,
                }],
                ..Default::default()
            },
            vetted: Default::default(),
        }
    }

    struct Bench {
        preparer: Preparer,
        backend: Arc<FixedCalls>,
        owners: crate::model::nodes::OwnersView,
        _dir: tempfile::TempDir,
    }

    fn bench(backend: FixedCalls) -> Bench {
        let dir = tempfile::tempdir().unwrap();
        let backend = Arc::new(backend);
        let list = Resource {
            name: "nvidia.com/gpu".into(),
            devices: vec![gpu(0), gpu(1)],
            common_edits: ContainerEdits {
                device_nodes: vec![DeviceNode {
                    container_path: "/dev/nvidiactl".into(),
                    host_path: String::new(),
                    permissions: "rw".into(),
                    numbers: None,
                }],
                ..Default::default()
            },
            ..Default::default()
        };
        let owners = crate::model::nodes::OwnersView::default();
        owners.store(crate::model::nodes::NodeOwners::build([("gpu", &list)]));
        // The receiver keeps the last list after its sender is gone.
        let (_, devices) = watch::channel(Arc::new(list));
        let served = Arc::new(Served::new(PoolId::new(DRIVER, "node-a"), None));
        served.add(ServedResource {
            name: "nvidia.com/gpu".into(),
            backend: "gpu".into(),
            devices,
            port: crate::model::port::Port::new("gpu", "nvidia.com/gpu", backend.clone(), owners.clone()),
        });
        let preparer = Preparer {
            served,
            specs: Arc::new(SpecDir::open(dir.path()).unwrap()),
            status: super::super::status::Reporter::new(Arc::new(NoApi), DRIVER.into(), Default::default()),
        };
        Bench { preparer, backend, owners, _dir: dir }
    }

    fn result(
        driver: &str,
        pool: &str,
        device: &str,
        request: &str,
        share: Option<&str>,
    ) -> DeviceRequestAllocationResult {
        DeviceRequestAllocationResult {
            driver: driver.into(),
            pool: pool.into(),
            device: device.into(),
            request: request.into(),
            share_id: share.map(Into::into),
            ..Default::default()
        }
    }

    fn opaque(driver: &str, json: &str) -> DeviceAllocationConfiguration {
        DeviceAllocationConfiguration {
            opaque: Some(OpaqueDeviceConfiguration {
                driver: driver.into(),
                parameters: RawExtension(serde_json::from_str(json).unwrap()),
            }),
            source: "FromClaim".into(),
            requests: None,
        }
    }

    fn claim() -> ClaimRef {
        ClaimRef { namespace: "ml".into(), uid: "u-1".into(), name: "train".into() }
    }

    #[tokio::test]
    async fn a_claim_becomes_its_devices_cdi_ids_and_one_spec_from_values() {
        let b = bench(FixedCalls {
            whole: Some(ContainerEdits::with_env([("FROM_PREPARE".into(), "1".into())])),
            ..Default::default()
        });
        let allocation = Allocation {
            results: vec![
                result(DRIVER, "node-a", "gpu-1", "big/fast", None),
                // Another driver's device in the same claim is that driver's to prepare.
                result("nic.devplug.io", "node-a", "vf-0", "net", None),
            ],
            config: vec![opaque(DRIVER, r#"{"mode":"exclusive"}"#), opaque("nic.devplug.io", r#"{"mtu":9000}"#)],
        };
        let p = b.preparer.prepare(&claim(), &allocation).await.unwrap();
        assert_eq!(p.devices.len(), 1);
        let d = &p.devices[0];
        assert_eq!((d.request_names.as_slice(), d.device_name.as_str()), (&["big".to_owned()][..], "gpu-1"));
        assert_eq!(d.cdi_device_ids, ["devplug.io/claim=u-1-gpu-1"]);
        assert_eq!(
            b.backend.calls(),
            [r#"prepare u-1 [big/fast:nvidia.com/gpu:gpu-1] config {"mode":"exclusive"}"#],
            "only this driver's devices and configuration reach the backend, and no allocate"
        );
        let spec = serde_json::to_string(p.spec.as_ref().unwrap()).unwrap();
        for wanted in ["/dev/nvidia1", "/dev/nvidiactl", "FROM_PREPARE=1", "u-1-gpu-1"] {
            assert!(spec.contains(wanted), "{wanted} missing from {spec}");
        }
        assert!(!spec.contains("/dev/nvidia0"), "a device the claim does not hold: {spec}");
        assert_eq!(p.status.len(), 1);
    }

    #[tokio::test]
    async fn a_backend_without_prepare_gives_its_edits_through_allocate_and_shares_get_a_device_each() {
        let b = bench(FixedCalls::default());
        let allocation = Allocation {
            results: vec![
                result(DRIVER, "node-a", "gpu-0", "a", Some("6f9c2a")),
                result(DRIVER, "node-a", "gpu-0", "b", Some("0b1/x")),
            ],
            config: vec![],
        };
        let p = b.preparer.prepare(&claim(), &allocation).await.unwrap();
        let ids: Vec<&str> = p.devices.iter().map(|d| d.cdi_device_ids[0].as_str()).collect();
        assert_eq!(ids, ["devplug.io/claim=u-1-gpu-0-6f9c2a", "devplug.io/claim=u-1-gpu-0-0b1_x"]);
        assert_eq!(p.devices[1].share_id.as_deref(), Some("0b1/x"), "kubelet matches the share as allocated");
        let calls = b.backend.calls();
        assert_eq!(calls.last().map(String::as_str), Some("allocate gpu-0,gpu-0"), "{calls:?}");
        assert!(serde_json::to_string(&p.spec).unwrap().contains("ALLOCATED=gpu-0,gpu-0"));
    }

    #[tokio::test]
    async fn a_device_of_another_pool_or_gone_is_the_claims_error_and_the_backend_is_not_asked() {
        let b = bench(FixedCalls::default());
        for (device, pool, says) in [
            ("gpu-0", "node-b", "is in pool node-b, not this node's pool node-a"),
            ("gpu-7", "node-a", "is not among driver gpu.devplug.io's devices on this node now"),
        ] {
            let allocation = Allocation { results: vec![result(DRIVER, pool, device, "gpu", None)], config: vec![] };
            let e = b.preparer.prepare(&claim(), &allocation).await.unwrap_err();
            assert_eq!(e.class(), ErrorClass::Claim, "{e:?}");
            assert!(
                e.report().starts_with("ResourceClaim ml/train: device ") && e.report().contains(says),
                "{}",
                e.report()
            );
        }
        assert!(b.backend.calls().is_empty());
        let none = b.preparer.prepare(&claim(), &Allocation::default()).await.unwrap();
        assert!(none.devices.is_empty() && none.spec.is_none(), "nothing of this driver's: nothing to write");
    }

    #[tokio::test]
    async fn a_backends_failure_or_a_foreign_node_in_its_answer_is_the_backends_error() {
        let b = bench(FixedCalls {
            fail: Some(CallError::Guest("GPU 0000:07:00.0 is in MIG mode".into())),
            ..Default::default()
        });
        let allocation = Allocation { results: vec![result(DRIVER, "node-a", "gpu-0", "gpu", None)], config: vec![] };
        let e = b.preparer.prepare(&claim(), &allocation).await.unwrap_err();
        assert_eq!(e.class(), ErrorClass::Backend(CallClass::Answer));
        assert!(e.report().contains("in MIG mode"), "{}", e.report());
        // Issue 63: a fault keeps its class through the DRA error (the metric's label).
        let b = bench(FixedCalls { fail: Some(CallError::Trap("unreachable".into())), ..Default::default() });
        let e = b.preparer.prepare(&claim(), &allocation).await.unwrap_err();
        assert_eq!((e.class(), e.class().as_str()), (ErrorClass::Backend(CallClass::Fault), "backend_fault"));
        let b = bench(FixedCalls { fail: Some(CallError::BreakerOpen), ..Default::default() });
        let e = b.preparer.prepare(&claim(), &allocation).await.unwrap_err();
        assert_eq!(e.class().as_str(), "backend_breaker_open");
        // The backend hands the claim gpu-1's node: another device's, refused.
        let foreign = ContainerEdits {
            device_nodes: vec![DeviceNode {
                container_path: "/dev/nvidia1".into(),
                host_path: String::new(),
                permissions: "rw".into(),
                numbers: None,
            }],
            ..Default::default()
        };
        let b = bench(FixedCalls { whole: Some(foreign.clone()), ..Default::default() });
        assert!(!b.owners.load().owners(&foreign.device_nodes[0]).is_empty());
        let e = b.preparer.prepare(&claim(), &allocation).await.unwrap_err();
        assert_eq!(e.class(), ErrorClass::Backend(CallClass::Refused));
        assert!(e.report().contains("refused"), "{}", e.report());
    }
}
