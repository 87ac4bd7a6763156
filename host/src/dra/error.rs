//! What goes wrong on the DRA side, typed so callers can tell a backend's failure (kubelet's
//! retry may succeed once the backend is fixed) from a claim this node cannot prepare (it was
//! allocated elsewhere, or its device went away) and from devplug's own files. Every variant's
//! text names where it happened and is what kubelet shows in the pod's events.

use crate::cdi::CdiError;

#[derive(Debug, thiserror::Error)]
pub enum DraError {
    /// The backend's call failed, or its answer was refused at a gate.
    #[error("backend {backend}{}: {message}", resource.as_deref().map(|r| format!(", resource {r}")).unwrap_or_default())]
    Backend { backend: String, resource: Option<String>, message: String },
    /// The claim, as the API server has it, cannot be prepared on this node.
    #[error("{0}")]
    Claim(String),
    /// The API server could not be asked.
    #[error("{0}")]
    Api(String),
    /// A claim's CDI spec could not be written or removed.
    #[error("{doing} the claim's CDI spec: {source}")]
    Spec {
        doing: &'static str,
        #[source]
        source: CdiError,
    },
    /// The checkpoint could not be written: the claim's outcome would not survive a restart.
    #[error("{0}")]
    Checkpoint(String),
    /// The backend failed to unprepare this claim before; it is not asked again.
    #[error("{0}")]
    Stuck(String),
}

/// What kind of failure a [`DraError`] is, as `dra_claim_errors_total{driver,class}` counts it:
/// an operator tells a broken backend from a claim this node cannot serve, the API server's
/// reach and devplug's own files.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ErrorClass {
    Backend,
    Claim,
    Api,
    Spec,
    Checkpoint,
    Stuck,
}

impl ErrorClass {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::Backend => "backend",
            ErrorClass::Claim => "claim",
            ErrorClass::Api => "api",
            ErrorClass::Spec => "spec",
            ErrorClass::Checkpoint => "checkpoint",
            ErrorClass::Stuck => "stuck",
        }
    }
}

impl DraError {
    /// Its class, for the metric and for callers that branch on the kind of failure.
    pub fn class(&self) -> ErrorClass {
        match self {
            DraError::Backend { .. } => ErrorClass::Backend,
            DraError::Claim(_) => ErrorClass::Claim,
            DraError::Api(_) => ErrorClass::Api,
            DraError::Spec { .. } => ErrorClass::Spec,
            DraError::Checkpoint(_) => ErrorClass::Checkpoint,
            DraError::Stuck(_) => ErrorClass::Stuck,
        }
    }

    /// A backend's failure of `resource` (when one is meant).
    pub fn backend(backend: &str, resource: Option<&str>, message: impl Into<String>) -> Self {
        DraError::Backend {
            backend: backend.to_owned(),
            resource: resource.map(str::to_owned),
            message: message.into(),
        }
    }
}
