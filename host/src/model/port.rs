//! The port both APIs (and the CLI's `allocate`) call: a resource's [`BackendCalls`] with the
//! node gate inside. What it returns has passed [`NodeOwners::admit`] already ([`Admitted`],
//! the only type the answer writers take), so no caller can reach a writer with an ungated
//! answer, and the gate is written once: [`Port::allocate`] for one container's devices of one
//! resource, [`Port::prepare_claim`] for a claim's devices across the resources of its driver
//! (a claim may hold a GPU and its NIC of two resources; each is gated against all it holds).
//! A refusal is a [`CallError::Refused`] (the backend's bug), so each API's edge tells it as
//! it tells every other refused answer.
//!
//! [`NodeOwners::admit`]: super::nodes::NodeOwners::admit

use std::sync::Arc;

use super::calls::{BackendCalls, CallError};
use super::dra::ClaimDevice;
use super::nodes::{Admitted, Foreign, OwnersView};
use super::{ContainerEdits, Device, Resource};

/// One resource's calls and the node table its answers are checked against.
#[derive(Clone)]
pub struct Port {
    backend: String,
    resource: String,
    calls: Arc<dyn BackendCalls>,
    owners: OwnersView,
}

/// One resource's share of a claim: its device list as the claim was checked against it, and
/// the devices the claim holds there (each with its entry in that list).
pub struct ClaimPart<'a> {
    pub port: &'a Port,
    pub list: &'a Resource,
    pub devices: Vec<(ClaimDevice, &'a Device)>,
}

/// A claim's edits past the node gate: each part's devices' own edits (in the parts' order)
/// and what every container of the claim gets (the backend's answer and the common edits).
#[derive(Debug)]
pub struct GatedClaim {
    pub devices: Vec<Vec<Admitted>>,
    pub common: Admitted,
}

/// A failed claim call, with the resource whose call failed.
#[derive(Debug, thiserror::Error)]
#[error("{resource}: {error}")]
pub struct ClaimCallError {
    pub backend: String,
    pub resource: String,
    #[source]
    pub error: CallError,
}

impl Port {
    pub fn new(backend: &str, resource: &str, calls: Arc<dyn BackendCalls>, owners: OwnersView) -> Port {
        Port { backend: backend.to_owned(), resource: resource.to_owned(), calls, owners }
    }

    pub fn backend(&self) -> &str {
        &self.backend
    }

    pub fn resource(&self) -> &str {
        &self.resource
    }

    /// One container's edits for devices `ids` of `list` (the list they were checked against):
    /// the resource's common edits, each device's own and the backend's `allocate` answer,
    /// merged and gated.
    pub async fn allocate(&self, list: &Resource, ids: &[String]) -> Result<Admitted, CallError> {
        let answer = self.calls.allocate(ids.to_vec()).await?;
        self.owners
            .load()
            .admit_allocation(list, ids, answer)
            .map_err(|why| self.refused("allocate", &self.resource, why))
    }

    /// The backend's choice of `size` devices among `available` (no edits: nothing to gate).
    pub async fn preferred_allocation(
        &self,
        available: Vec<String>,
        must_include: Vec<String>,
        size: u32,
    ) -> Result<Vec<String>, CallError> {
        self.calls.preferred_allocation(available, must_include, size).await
    }

    /// Ready devices `ids` before a container starts.
    pub async fn pre_start(&self, ids: Vec<String>) -> Result<(), CallError> {
        self.calls.pre_start(ids).await
    }

    /// Claim `uid`'s edits (`label` names it in errors): the backend's `prepare` of the whole
    /// claim through this port (one driver is one backend), or, when it leaves them to
    /// `allocate`, each part's `allocate`; then each part's common edits, and every device's
    /// own. Each is gated against everything the claim holds, across its parts.
    pub(crate) async fn prepare_claim(
        &self,
        uid: &str,
        label: &str,
        parts: &[ClaimPart<'_>],
        config: Vec<String>,
    ) -> Result<GatedClaim, ClaimCallError> {
        let all: Vec<ClaimDevice> = parts.iter().flat_map(|p| p.devices.iter().map(|(c, _)| c.clone())).collect();
        let whole = self.calls.prepare(uid.to_owned(), all, config).await.map_err(|e| self.failed(e))?;
        let mut common = whole.clone().unwrap_or_default();
        for part in parts {
            if whole.is_none() {
                let ids: Vec<String> = part.devices.iter().map(|(c, _)| c.id.clone()).collect();
                common.merge(&part.port.calls.allocate(ids).await.map_err(|e| part.port.failed(e))?);
            }
            common.merge(&part.list.common_edits);
        }
        let owners = self.owners.load();
        let held: Vec<(&str, &str)> =
            parts.iter().flat_map(|p| p.devices.iter().map(|(c, _)| (c.resource.as_str(), c.id.as_str()))).collect();
        let gate = |edits: ContainerEdits| {
            owners.admit(label, &held, edits).map_err(|why| self.failed(self.refused("prepare", label, why)))
        };
        let devices = parts
            .iter()
            .map(|p| p.devices.iter().map(|(_, d)| gate(d.edits.clone())).collect::<Result<Vec<_>, _>>())
            .collect::<Result<Vec<_>, _>>()?;
        Ok(GatedClaim { devices, common: gate(common)? })
    }

    /// Undo the backend's `prepare` of claim `uid`.
    pub async fn unprepare(&self, uid: &str) -> Result<(), CallError> {
        self.calls.unprepare(uid.to_owned()).await
    }

    fn refused(&self, call: &str, whose: &str, why: Foreign) -> CallError {
        tracing::error!(backend = %self.backend, resource = %self.resource, owner = %why.owner.resource, "{call} answer for {whose} refused: {why}");
        CallError::Refused(format!("{call} answer for {whose}: {why}"))
    }

    fn failed(&self, error: CallError) -> ClaimCallError {
        ClaimCallError { backend: self.backend.clone(), resource: self.resource.clone(), error }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::calls::{CallClass, FixedCalls};
    use crate::model::nodes::NodeOwners;
    use crate::model::{DeviceNode, Health};

    fn nodes(paths: &[&str]) -> ContainerEdits {
        let node = |p: &&str| DeviceNode { container_path: (*p).into(), ..Default::default() };
        ContainerEdits { device_nodes: paths.iter().map(node).collect(), ..Default::default() }
    }

    fn resource(name: &str, devices: &[(&str, &str)]) -> Resource {
        let device = |(id, node): &(&str, &str)| Device {
            id: (*id).into(),
            health: Health::Healthy,
            numa_nodes: vec![],
            attributes: vec![],
            edits: nodes(&[node]),
            vetted: Default::default(),
        };
        Resource { name: name.into(), devices: devices.iter().map(device).collect(), ..Default::default() }
    }

    /// A backend whose every answer hands out `paths`.
    fn answering(paths: &[&str]) -> Arc<FixedCalls> {
        Arc::new(FixedCalls { edits: nodes(paths), ..Default::default() })
    }

    fn paths(a: &Admitted) -> Vec<&str> {
        a.edits().device_nodes.iter().map(DeviceNode::host_path).collect()
    }

    /// A container gets its own device's node; another device's node in the backend's answer
    /// is refused as the backend's bug, naming the device that owns it.
    #[tokio::test]
    async fn allocate_answers_pass_the_gate_or_are_refused() {
        let gpu = resource("gpu", &[("0", "/dev/g0"), ("1", "/dev/g1")]);
        let owners = OwnersView::default();
        owners.store(NodeOwners::build([("b", &gpu)]));
        let honest = Port::new("b", "gpu", answering(&[]), owners.clone());
        assert_eq!(paths(&honest.allocate(&gpu, &["0".into()]).await.unwrap()), ["/dev/g0"]);
        let greedy = Port::new("b", "gpu", answering(&["/dev/g1"]), owners);
        let e = greedy.allocate(&gpu, &["0".into()]).await.unwrap_err();
        assert_eq!(e.class(), CallClass::Refused, "{e}");
        assert!(e.to_string().contains("/dev/g1") && e.to_string().contains("device 1 of resource gpu"), "{e}");
    }

    /// A claim across two resources of one backend: the backend prepares it whole through the
    /// first part's port, or each part's `allocate` answers (the stub's `prepare` leaves it to
    /// them). A node of the other part's device is the claim's (held claim-wide); a node of a
    /// device the claim does not hold is refused.
    #[tokio::test]
    async fn a_claim_is_gated_against_everything_it_holds() {
        let gpu = resource("gpu", &[("0", "/dev/g0"), ("1", "/dev/g1")]);
        let nic = resource("nic", &[("0", "/dev/n0")]);
        let owners = OwnersView::default();
        owners.store(NodeOwners::build([("b", &gpu), ("b", &nic)]));
        let gpu_calls = answering(&[]);
        let gpu_port = Port::new("b", "gpu", gpu_calls.clone(), owners.clone());
        let held = |resource: &str| ClaimDevice { request: "r".into(), resource: resource.into(), id: "0".into() };
        let claim = |nic_port| {
            vec![
                ClaimPart { port: &gpu_port, list: &gpu, devices: vec![(held("gpu"), &gpu.devices[0])] },
                ClaimPart { port: nic_port, list: &nic, devices: vec![(held("nic"), &nic.devices[0])] },
            ]
        };
        // The nic's answer names the GPU node the claim holds: its own.
        let fair = Port::new("b", "nic", answering(&["/dev/g0"]), owners.clone());
        let got = gpu_port.prepare_claim("uid", "claim ns/c", &claim(&fair), vec!["cfg".into()]).await.unwrap();
        assert_eq!((paths(&got.devices[0][0]), paths(&got.devices[1][0])), (vec!["/dev/g0"], vec!["/dev/n0"]));
        assert_eq!(paths(&got.common), ["/dev/g0"]);
        assert_eq!(gpu_calls.calls(), ["prepare uid [r:gpu:0 r:nic:0] config cfg", "allocate 0"]);
        // The nic's answer names the GPU the claim does not hold: refused for the claim.
        let greedy = Port::new("b", "nic", answering(&["/dev/g1"]), owners);
        let e = gpu_port.prepare_claim("uid", "claim ns/c", &claim(&greedy), vec![]).await.unwrap_err();
        assert_eq!(e.error.class(), CallClass::Refused, "{e}");
        assert!(e.to_string().contains("claim ns/c") && e.to_string().contains("device 1 of resource gpu"), "{e}");
        // A failed part's call names its resource.
        let broken = Port::new(
            "b",
            "nic",
            Arc::new(FixedCalls { fail: Some(CallError::BreakerOpen), ..Default::default() }),
            OwnersView::default(),
        );
        let e = gpu_port.prepare_claim("uid", "claim ns/c", &claim(&broken), vec![]).await.unwrap_err();
        assert_eq!((e.resource.as_str(), e.error.class()), ("nic", CallClass::BreakerOpen), "{e}");
    }
}
