//! The API server's refusals of devplug's own writes, said once and with what to do: the host's
//! words first (what it tried and which rule its ServiceAccount needs: resource, verb, name, and
//! whether the chart grants it), then the server's message, once (kube's own `Display` of an
//! API error prints the message and then the whole Status again).

/// One write devplug makes to the API server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Write<'a> {
    /// Create, replace or delete ResourceSlice `name` of `driver`'s pool on `node`.
    Slice { verb: &'a str, name: &'a str, driver: &'a str, node: &'a str },
    /// Server-side apply of `driver`'s entries in `status.devices` of claim `claim` (`ns/name`).
    ClaimStatus { claim: &'a str, driver: &'a str },
}

/// What an API error says, once: `CODE Reason: message` for a Status, else the error's text.
pub fn said(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if !s.message.is_empty() => {
            let reason = if s.reason.is_empty() { String::new() } else { format!(" {}", s.reason) };
            format!("{}{reason}: {}", s.code, s.message)
        }
        kube::Error::Api(s) => format!("{} {}", s.code, s.reason),
        other => other.to_string(),
    }
}

/// Why a write was refused, in kinds the operator acts on differently.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cause {
    /// RBAC refused the request itself (403 from the authorizer).
    Rbac,
    /// The chart's ValidatingAdmissionPolicy refused it: a slice of another node or driver.
    Policy,
    /// `DRAResourceClaimGranularStatusAuthorization` refused `status.devices` (422).
    DeviceStatusRule,
    /// Anything else the server answered (or could not).
    Other,
}

/// The kind of refusal `e` is.
pub fn cause(e: &kube::Error) -> Cause {
    let kube::Error::Api(s) = e else { return Cause::Other };
    match s.code {
        403 if s.message.contains("ValidatingAdmissionPolicy") => Cause::Policy,
        403 => Cause::Rbac,
        422 if s.message.contains("requires resource=\"resourceclaims/driver\"") => Cause::DeviceStatusRule,
        _ => Cause::Other,
    }
}

/// The whole sentence for a refused `write`: what devplug tried, what its ServiceAccount
/// lacks and where the chart stands on it, then the server's words.
pub fn explain(write: Write, e: &kube::Error) -> String {
    let server = said(e);
    let advice = match (write, cause(e)) {
        (Write::Slice { verb, name, .. }, Cause::Rbac) => format!(
            "devplug's ServiceAccount lacks RBAC verb {verb:?} on resource \"resourceslices\" (API group resource.k8s.io){}; the Helm chart grants it in ClusterRole devplug-dra (deploy/helm/devplug/templates/dra.yaml), bound to the chart's ServiceAccount: check the pod runs under that account",
            if name.is_empty() { String::new() } else { format!(", ResourceSlice {name}") }
        ),
        (Write::Slice { node, driver, .. }, Cause::Policy) => format!(
            "the cluster's admission policy keeps devplug to ResourceSlices of the node its token is bound to and of its own drivers, and refused this one (node {node}, driver {driver}): the chart's ValidatingAdmissionPolicy devplug-resourceslices does this on purpose. Check that --node-name / NODE_NAME is the node this pod runs on and that the driver is one the chart's dra.resources names"
        ),
        (Write::ClaimStatus { driver, .. }, Cause::DeviceStatusRule) => format!(
            "devplug's ServiceAccount lacks verb \"associated-node:patch\" on resource \"resourceclaims/driver\" named {driver:?} (Kubernetes 1.36+ requires it to write status.devices: DRAResourceClaimGranularStatusAuthorization); the Helm chart grants it from 0.2.0 for the drivers dra.resources names (older charts granted only resourceclaims/status): upgrade the chart, or add the rule to the ClusterRole your manifests bind. Never grant arbitrary-node:patch: it lets a node write the status of claims on every node"
        ),
        (Write::ClaimStatus { .. }, Cause::Rbac) => "devplug's ServiceAccount lacks RBAC verb \"patch\" on resource \"resourceclaims/status\"; the Helm chart grants it in ClusterRole devplug-dra".to_owned(),
        _ => String::new(),
    };
    let what = match write {
        Write::Slice { verb, name: "", driver, .. } => {
            format!("{verb} a ResourceSlice of driver {driver}")
        }
        Write::Slice { verb, name, .. } => format!("{verb} ResourceSlice {name}"),
        Write::ClaimStatus { claim, driver } => format!("write {driver}'s status.devices of ResourceClaim {claim}"),
    };
    if advice.is_empty() {
        format!("the API server refused to {what}: {server}")
    } else {
        format!("the API server refused to {what}: {advice}. The server said: {server}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16, reason: &str, message: &str) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            reason: reason.into(),
            message: message.into(),
            ..Default::default()
        }))
    }

    /// Issue 59: the WARN said the RBAC was missing "although the Helm chart grants it", and
    /// printed the server's answer twice.
    #[test]
    fn a_refusal_names_the_missing_rule_and_gives_the_servers_words_once() {
        let msg = "ResourceClaim.resource.k8s.io \"c\" is invalid: status.devices: Forbidden: changing status.devices requires resource=\"resourceclaims/driver\", verb=\"[associated-node:patch arbitrary-node:patch]\" permission: …";
        let e = api(422, "Invalid", msg);
        assert_eq!(cause(&e), Cause::DeviceStatusRule);
        let text = explain(Write::ClaimStatus { claim: "ml/c", driver: "gpu.devplug.io" }, &e);
        assert!(text.starts_with("the API server refused to write gpu.devplug.io's status.devices of ResourceClaim ml/c: devplug's ServiceAccount lacks verb \"associated-node:patch\""), "{text}");
        assert_eq!(text.matches("is invalid").count(), 1, "the server's message once: {text}");
        assert!(!kube::Error::Api(Box::default()).to_string().is_empty());

        let e = api(
            403,
            "Forbidden",
            "ValidatingAdmissionPolicy 'devplug-resourceslices' with binding 'devplug-resourceslices' denied request: …",
        );
        let text = explain(Write::Slice { verb: "create", name: "", driver: "gpu.devplug.io", node: "node-b" }, &e);
        assert!(text.contains("node node-b, driver gpu.devplug.io") && text.contains("NODE_NAME"), "{text}");

        let e = api(
            403,
            "Forbidden",
            "resourceslices.resource.k8s.io \"s\" is forbidden: User \"system:serviceaccount:devplug:devplug\" cannot delete resource …",
        );
        let text = explain(Write::Slice { verb: "delete", name: "s", driver: "gpu.devplug.io", node: "node-a" }, &e);
        assert!(
            text.contains("lacks RBAC verb \"delete\" on resource \"resourceslices\"")
                && text.contains("ResourceSlice s"),
            "{text}"
        );

        let e = api(409, "Conflict", "the object has been modified");
        assert_eq!(
            explain(Write::Slice { verb: "update", name: "s", driver: "d", node: "n" }, &e),
            "the API server refused to update ResourceSlice s: 409 Conflict: the object has been modified"
        );
    }
}
