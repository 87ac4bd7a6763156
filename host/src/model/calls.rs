//! The one port below both APIs: [`BackendCalls`], the calls a resource's backend answers
//! (Allocate and its helpers for the Device Plugin API, `prepare`/`unprepare` for DRA), with one
//! error, [`CallError`]. The backends layer implements it once (routed to the current instance);
//! the kubelet and DRA layers take it as a value and each maps a [`CallError`] to its own wire
//! at its own edge, keeping its [`CallClass`]: a trap, a timeout, an open breaker and a refused
//! answer stay distinguishable all the way to the status code and the metric.

use super::ContainerEdits;
use super::dra::ClaimDevice;

/// Why a call into a backend failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// The backend answered with an error of its own; the instance is fine.
    #[error("backend returned an error: {0}")]
    Guest(String),
    /// The backend trapped (panic, unreachable, out-of-bounds); the instance was dropped.
    #[error("backend trapped: {0}")]
    Trap(String),
    /// The call ran past its deadline and was interrupted; the instance was dropped.
    #[error("backend exceeded its {0:?} deadline")]
    Timeout(std::time::Duration),
    /// The backend tried to grow memory past its cap; the instance was dropped.
    #[error("backend hit its memory cap of {0} bytes")]
    MemoryCap(usize),
    /// Too many faults in a short while; the backend's devices are Unhealthy until a call
    /// succeeds.
    #[error("backend is disabled after repeated failures (breaker open)")]
    BreakerOpen,
    /// The backend answered, but with something it may not hand out (a device node, mount, env
    /// key, annotation or resource name outside its grants, or more than the caps allow); the
    /// whole answer was dropped.
    #[error("the host refused the backend's answer: {0}")]
    Refused(String),
}

/// What kind of failure a [`CallError`] is, as each API tells it apart: the backend's own answer
/// (the request will fail the same way again), a refused answer (the backend's bug), a fault
/// (trap, timeout, memory cap: a retry may find a fresh instance) or the breaker (no call made).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CallClass {
    Answer,
    Refused,
    Fault,
    BreakerOpen,
}

impl CallError {
    /// A fault (trap, timeout, memory cap) as opposed to an answer the backend chose.
    pub fn is_fault(&self) -> bool {
        self.class() == CallClass::Fault
    }

    pub fn class(&self) -> CallClass {
        match self {
            CallError::Guest(_) => CallClass::Answer,
            CallError::Refused(_) => CallClass::Refused,
            CallError::Trap(_) | CallError::Timeout(_) | CallError::MemoryCap(_) => CallClass::Fault,
            CallError::BreakerOpen => CallClass::BreakerOpen,
        }
    }
}

/// A resource's backend calls, whichever API asks. Answers are the backend's as they passed its
/// grants; the node gate (devices of other backends) is applied by the caller, which knows the
/// whole request (a container's devices, a claim's across resources).
#[async_trait::async_trait]
pub trait BackendCalls: Send + Sync + 'static {
    /// The edits that depend on the whole set of IDs handed to one container (per-device and
    /// common edits come from the device list).
    async fn allocate(&self, ids: Vec<String>) -> Result<ContainerEdits, CallError>;

    /// The backend's choice of `size` devices among `available`, `must_include` among them.
    async fn preferred_allocation(
        &self,
        available: Vec<String>,
        must_include: Vec<String>,
        size: u32,
    ) -> Result<Vec<String>, CallError>;

    /// Ready devices `ids` before a container starts.
    async fn pre_start(&self, ids: Vec<String>) -> Result<(), CallError>;

    /// The backend's edits for a DRA claim's devices (WIT 0.3.0 `prepare`); `Ok(None)` when it
    /// leaves them to `allocate`.
    async fn prepare(
        &self,
        claim: String,
        devices: Vec<ClaimDevice>,
        config: Vec<String>,
    ) -> Result<Option<ContainerEdits>, CallError>;

    /// Undo the backend's `prepare` of a claim.
    async fn unprepare(&self, claim: String) -> Result<(), CallError>;
}

/// A backend of fixed answers that records every call (`allocate a,b`, `prepare UID [r:res:id]
/// config …`, `unprepare UID`, …): the one stub both APIs' tests serve, with no Wasm behind it.
/// `allocate` answers `edits` plus `ALLOCATED=<ids>`; `prepare` answers `whole`; every call
/// fails with `fail` when it is set.
#[derive(Default)]
pub struct FixedCalls {
    pub edits: ContainerEdits,
    pub whole: Option<ContainerEdits>,
    pub fail: Option<CallError>,
    pub calls: std::sync::Mutex<Vec<String>>,
}

impl FixedCalls {
    /// The calls so far, in order.
    pub fn calls(&self) -> Vec<String> {
        self.calls.lock().map(|c| c.clone()).unwrap_or_default()
    }

    fn record(&self, call: String) -> Result<(), CallError> {
        if let Ok(mut c) = self.calls.lock() {
            c.push(call);
        }
        match &self.fail {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }
}

#[async_trait::async_trait]
impl BackendCalls for FixedCalls {
    async fn allocate(&self, ids: Vec<String>) -> Result<ContainerEdits, CallError> {
        self.record(format!("allocate {}", ids.join(",")))?;
        let mut edits = self.edits.clone();
        edits.merge(&ContainerEdits::with_env([("ALLOCATED".into(), ids.join(","))]));
        Ok(edits)
    }

    async fn preferred_allocation(
        &self,
        available: Vec<String>,
        must_include: Vec<String>,
        size: u32,
    ) -> Result<Vec<String>, CallError> {
        self.record(format!("preferred_allocation {} of {}", size, available.join(",")))?;
        let mut out = must_include;
        out.extend(available.into_iter().filter(|id| !out.contains(id)).collect::<Vec<_>>());
        out.truncate(size as usize);
        Ok(out)
    }

    async fn pre_start(&self, ids: Vec<String>) -> Result<(), CallError> {
        self.record(format!("pre_start {}", ids.join(",")))
    }

    async fn prepare(
        &self,
        claim: String,
        devices: Vec<ClaimDevice>,
        config: Vec<String>,
    ) -> Result<Option<ContainerEdits>, CallError> {
        let ids: Vec<String> = devices.iter().map(|d| format!("{}:{}:{}", d.request, d.resource, d.id)).collect();
        self.record(format!("prepare {claim} [{}] config {}", ids.join(" "), config.join(" ")))?;
        Ok(self.whole.clone())
    }

    async fn unprepare(&self, claim: String) -> Result<(), CallError> {
        self.record(format!("unprepare {claim}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_has_its_class() {
        assert_eq!(CallError::Guest("no".into()).class(), CallClass::Answer);
        assert_eq!(CallError::Refused("node".into()).class(), CallClass::Refused);
        assert_eq!(CallError::Trap("x".into()).class(), CallClass::Fault);
        assert_eq!(CallError::Timeout(std::time::Duration::from_secs(1)).class(), CallClass::Fault);
        assert_eq!(CallError::MemoryCap(1).class(), CallClass::Fault);
        assert_eq!(CallError::BreakerOpen.class(), CallClass::BreakerOpen);
        assert!(CallError::Trap("x".into()).is_fault() && !CallError::BreakerOpen.is_fault());
    }
}
