//! What goes wrong on the DRA side, typed so callers can tell a backend's failure (kubelet's
//! retry may succeed once the backend is fixed) from a claim this node cannot prepare (it was
//! allocated elsewhere, or its device went away) and from devplug's own files. Each variant
//! says where it happened; the error it wraps stays its `source` (not flattened into text), and
//! [`DraError::report`] joins the chain for what kubelet shows in the pod's events and the log.

use std::sync::Arc;

use crate::cdi::CdiError;
use crate::model::calls::{CallClass, CallError};

#[derive(Debug, thiserror::Error)]
pub enum DraError {
    /// The backend's call failed, or its answer was refused at a gate; `class` says which (its
    /// own error, a refused answer, a fault, the breaker). The backend's own words are the
    /// message: they come out of the sandbox as text.
    #[error("backend {backend}{}: {message}", resource.as_deref().map(|r| format!(", resource {r}")).unwrap_or_default())]
    Backend { backend: String, resource: Option<String>, message: String, class: CallClass },
    /// The claim, as the API server has it, cannot be prepared on this node (`claim` is
    /// `namespace/name`).
    #[error("ResourceClaim {claim}: {problem}")]
    Claim { claim: String, problem: String },
    /// The API server could not be asked.
    #[error("{doing}")]
    Api {
        doing: String,
        #[source]
        source: Arc<kube::Error>,
    },
    /// A claim's CDI spec could not be built, written or removed.
    #[error("{doing} the claim's CDI spec")]
    Spec {
        doing: &'static str,
        #[source]
        source: CdiError,
    },
    /// The checkpoint could not be written: the claim's outcome would not survive a restart.
    /// One write serves every claim of a call, so its error is shared.
    #[error("{doing}, but the checkpoint could not be written")]
    Checkpoint {
        doing: &'static str,
        #[source]
        source: Arc<std::io::Error>,
    },
    /// The backend failed to unprepare this claim before; it is not asked again. `error` is
    /// that failure as reported then.
    #[error(
        "{error} (not retried: the backend is asked once; restart devplug to ask it again, or `devplug dra release --driver {driver} {uid}` to drop the claim)"
    )]
    Stuck { error: String, driver: String, uid: String },
}

/// What kind of failure a [`DraError`] is, as `dra_claim_errors_total{driver,class}` counts it:
/// an operator tells a broken backend from a claim this node cannot serve, the API server's
/// reach and devplug's own files.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ErrorClass {
    /// A backend's failure, by the kind of call failure it was.
    Backend(CallClass),
    Claim,
    Api,
    Spec,
    Checkpoint,
    Stuck,
}

impl ErrorClass {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::Backend(CallClass::Answer) => "backend",
            ErrorClass::Backend(CallClass::Refused) => "backend_refused",
            ErrorClass::Backend(CallClass::Fault) => "backend_fault",
            ErrorClass::Backend(CallClass::BreakerOpen) => "backend_breaker_open",
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
            DraError::Backend { class, .. } => ErrorClass::Backend(*class),
            DraError::Claim { .. } => ErrorClass::Claim,
            DraError::Api { .. } => ErrorClass::Api,
            DraError::Spec { .. } => ErrorClass::Spec,
            DraError::Checkpoint { .. } => ErrorClass::Checkpoint,
            DraError::Stuck { .. } => ErrorClass::Stuck,
        }
    }

    /// A backend's error of its own about `resource` (when one is meant).
    pub fn backend(backend: &str, resource: Option<&str>, message: impl Into<String>) -> Self {
        DraError::Backend {
            backend: backend.to_owned(),
            resource: resource.map(str::to_owned),
            message: message.into(),
            class: CallClass::Answer,
        }
    }

    /// A backend's answer the host refused (a gate of its own said no).
    pub fn refused(backend: &str, message: impl Into<String>) -> Self {
        DraError::Backend {
            backend: backend.to_owned(),
            resource: None,
            message: message.into(),
            class: CallClass::Refused,
        }
    }

    /// A failed call of `resource`'s backend, its class kept.
    pub fn call(backend: &str, resource: &str, e: CallError) -> Self {
        DraError::Backend {
            backend: backend.to_owned(),
            resource: Some(resource.to_owned()),
            class: e.class(),
            message: e.to_string(),
        }
    }

    /// Claim `namespace/name` cannot be prepared here, for `problem`.
    pub fn claim(namespace: &str, name: &str, problem: impl Into<String>) -> Self {
        DraError::Claim { claim: format!("{namespace}/{name}"), problem: problem.into() }
    }

    /// The whole chain, outermost first (`context: cause: cause`), unescaped: callers pass it
    /// through the text gate where it is written. A cause whose text its wrapper already shows
    /// (some errors print their source too) is not repeated.
    pub fn report(&self) -> String {
        let mut out = self.to_string();
        let mut next = std::error::Error::source(self);
        while let Some(e) = next {
            let text = e.to_string();
            if !out.ends_with(&text) {
                out.push_str(": ");
                out.push_str(&text);
            }
            next = e.source();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_carries_the_cause_and_the_class_stays_branchable() {
        let io = Arc::new(std::io::Error::new(std::io::ErrorKind::StorageFull, "no space left on device"));
        let e = DraError::Checkpoint { doing: "prepared", source: io };
        assert_eq!(e.to_string(), "prepared, but the checkpoint could not be written");
        assert_eq!(e.report(), "prepared, but the checkpoint could not be written: no space left on device");
        assert_eq!(e.class(), ErrorClass::Checkpoint);
        let source = std::error::Error::source(&e).expect("the io error is kept");
        assert!(source.downcast_ref::<Arc<std::io::Error>>().is_some() || source.to_string().contains("no space"));
        let cdi = DraError::Spec {
            doing: "writing",
            source: CdiError::Io { path: "/var/run/cdi/x.json".into(), source: std::io::Error::other("read-only") },
        };
        assert_eq!(cdi.report(), "writing the claim's CDI spec: /var/run/cdi/x.json: read-only", "no cause twice");
        let c = DraError::claim("ml", "train", "is not allocated");
        assert_eq!(c.report(), "ResourceClaim ml/train: is not allocated");
        assert_eq!(c.class(), ErrorClass::Claim);
        let s = DraError::Stuck { error: "backend x: busy".into(), driver: "x.devplug.io".into(), uid: "u-1".into() };
        assert!(s.report().contains("devplug dra release --driver x.devplug.io u-1"), "{}", s.report());
    }
}
