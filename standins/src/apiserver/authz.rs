//! Who a request is and what it may do, as kube-apiserver decides it on the paths the stand-in
//! serves (upstream: `plugin/pkg/auth/authorizer/rbac`, `pkg/registry/resource/utils.go`,
//! `staging/.../apiserver/pkg/endpoints/handlers/responsewriters/errors.go`).
//!
//! A bearer token names an [`Identity`]: the stand-in's admin (`system:masters`, allowed
//! everything, as RBAC's superuser group is), or a ServiceAccount — bound to a Pod on a node
//! when it stands for a projected token, which then carries the node's name in its extra
//! `authentication.kubernetes.io/node-name`, as the real authenticator sets it. A
//! ServiceAccount may do what the RBAC rules given to the stand-in allow, decided as upstream's
//! `RuleAllows` does (verb, API group, `resource[/subresource]`, resource names; `*` matches
//! any), and is refused with upstream's message otherwise. On top, where the stand-in is told
//! the cluster runs one, the effect of a ValidatingAdmissionPolicy that keeps a ServiceAccount
//! to ResourceSlices of its token's node and its drivers ([`SlicePolicy`]: the chart ships such
//! a policy, as NVIDIA's and Intel's drivers do).

use axum::http::StatusCode;
use serde_json::Value;

use super::{Failure, status};

/// The extra key the ServiceAccount authenticator fills from a Pod-bound token's node claim.
pub const NODE_NAME_KEY: &str = "authentication.kubernetes.io/node-name";

/// Who sent a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Identity {
    /// `system:masters`: every request is allowed, as RBAC allows its superuser group.
    Admin,
    /// `system:serviceaccount:NAMESPACE:NAME`, with the node of the Pod its token is bound to.
    ServiceAccount { namespace: String, name: String, node: Option<String> },
}

impl Identity {
    pub fn username(&self) -> String {
        match self {
            Identity::Admin => "devplug-test".into(),
            Identity::ServiceAccount { namespace, name, .. } => format!("system:serviceaccount:{namespace}:{name}"),
        }
    }
}

/// One RBAC `PolicyRule` (`rbac.authorization.k8s.io/v1`), as a ClusterRole lists it.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rule {
    #[serde(default)]
    pub api_groups: Vec<String>,
    #[serde(default)]
    pub resources: Vec<String>,
    #[serde(default)]
    pub verbs: Vec<String>,
    #[serde(default)]
    pub resource_names: Vec<String>,
}

/// What a request asks to do, as the authorizer sees it.
#[derive(Clone, Copy, Debug)]
pub struct Attributes<'a> {
    pub verb: &'a str,
    pub group: &'a str,
    pub resource: &'a str,
    pub subresource: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
}

impl Rule {
    /// Upstream's `RuleAllows`: every part of the request is matched by the rule.
    fn allows(&self, a: &Attributes) -> bool {
        let has = |list: &[String], v: &str| list.iter().any(|x| x == "*" || x == v);
        let combined =
            if a.subresource.is_empty() { a.resource.to_owned() } else { format!("{}/{}", a.resource, a.subresource) };
        let resource_ok = self.resources.iter().any(|r| {
            r == "*"
                || *r == combined
                // `*/status` matches the subresource of every resource.
                || (!a.subresource.is_empty() && *r == format!("*/{}", a.subresource))
        });
        has(&self.verbs, a.verb)
            && has(&self.api_groups, a.group)
            && resource_ok
            && (self.resource_names.is_empty() || self.resource_names.iter().any(|n| n == a.name))
    }
}

/// Whether `id`, holding `rules`, may do `a`.
pub fn allowed(id: &Identity, rules: &[Rule], a: &Attributes) -> bool {
    match id {
        Identity::Admin => true,
        Identity::ServiceAccount { .. } => rules.iter().any(|r| r.allows(a)),
    }
}

/// Upstream's `forbiddenMessage`: `User "U" cannot VERB resource "R[/S]" in API group "G" …`.
pub fn forbidden_message(id: &Identity, a: &Attributes) -> String {
    let resource =
        if a.subresource.is_empty() { a.resource.to_owned() } else { format!("{}/{}", a.resource, a.subresource) };
    let scope = if a.namespace.is_empty() {
        "at the cluster scope".to_owned()
    } else {
        format!("in the namespace {:?}", a.namespace)
    };
    format!("User {:?} cannot {} resource {resource:?} in API group {:?} {scope}", id.username(), a.verb, a.group)
}

/// `NewForbidden(gr, name, err)`'s message: `R.G "NAME" is forbidden: WHY` (no name: `R.G is forbidden`).
pub fn forbidden_text(a: &Attributes, why: &str) -> String {
    let gr = if a.group.is_empty() { a.resource.to_owned() } else { format!("{}.{}", a.resource, a.group) };
    if a.name.is_empty() {
        format!("{gr} is forbidden: {why}")
    } else {
        format!("{gr} {:?} is forbidden: {why}", a.name)
    }
}

/// The 403 of a request RBAC did not allow.
pub fn forbidden(id: &Identity, a: &Attributes) -> Failure {
    status(StatusCode::FORBIDDEN, "Forbidden", forbidden_text(a, &forbidden_message(id, a)), vec![])
}

/// `Ok` when `id` may do `a`, else `403` with upstream's message.
pub fn check(id: &Identity, rules: &[Rule], a: &Attributes) -> Result<(), Failure> {
    if allowed(id, rules, a) { Ok(()) } else { Err(forbidden(id, a)) }
}

/// The effect of a ValidatingAdmissionPolicy (and its `Deny` binding) that limits one
/// ServiceAccount's ResourceSlice writes to slices of the node its token is bound to, for the
/// listed drivers: on create the new slice, on delete the stored one, on update both.
#[derive(Clone, Debug)]
pub struct SlicePolicy {
    /// The policy's (and its binding's) name, for the refusal's words.
    pub name: String,
    /// `system:serviceaccount:NS:NAME` the policy matches.
    pub username: String,
    pub drivers: Vec<String>,
}

impl SlicePolicy {
    /// The refusal of `id` writing (`operation` CREATE, UPDATE or DELETE) `new` over `old`, if
    /// the policy refuses it: 403 (the policy's validations say `reason: Forbidden`), in the
    /// admission plugin's words.
    pub fn judge(
        &self,
        id: &Identity,
        operation: &str,
        new: Option<&Value>,
        old: Option<&Value>,
    ) -> Result<(), Failure> {
        if id.username() != self.username {
            return Ok(());
        }
        let node = match id {
            Identity::ServiceAccount { node: Some(n), .. } => n.as_str(),
            _ => {
                return Err(self.deny(
                    "no node association found for this user: it must run in a pod on a node, with a token bound to that pod",
                ));
            }
        };
        for slice in [new, old].into_iter().flatten() {
            let on = slice["spec"]["nodeName"].as_str().unwrap_or("");
            let driver = slice["spec"]["driver"].as_str().unwrap_or("");
            if on != node {
                let whose = if on.is_empty() {
                    "cluster-wide ResourceSlices".to_owned()
                } else {
                    format!("ResourceSlices of node {on}")
                };
                return Err(self.deny(&format!("{operation}: this user runs on node {node} and may not write {whose}")));
            }
            if !self.drivers.iter().any(|d| d == driver) {
                return Err(self.deny(&format!(
                    "{operation}: this user may write only ResourceSlices of its drivers ({}), not of driver {driver}",
                    self.drivers.join(", ")
                )));
            }
        }
        Ok(())
    }

    fn deny(&self, message: &str) -> Failure {
        status(
            StatusCode::FORBIDDEN,
            "Forbidden",
            format!("ValidatingAdmissionPolicy '{}' with binding '{}' denied request: {message}", self.name, self.name),
            vec![],
        )
    }
}

/// The node a claim's allocation is for, as upstream's `nodeNameFromAllocation` reads it: one
/// term, no expressions, one `metadata.name In [node]` field; anything else names no node.
pub fn allocated_node(claim: &Value) -> Option<&str> {
    let terms = claim["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"].as_array()?;
    let [term] = terms.as_slice() else { return None };
    if term["matchExpressions"].as_array().is_some_and(|e| !e.is_empty()) {
        return None;
    }
    let [f] = term["matchFields"].as_array()?.as_slice() else { return None };
    let values = f["values"].as_array()?;
    match (f["key"].as_str(), f["operator"].as_str(), values.as_slice()) {
        (Some("metadata.name"), Some("In"), [v]) => v.as_str(),
        _ => None,
    }
}

/// `DRAResourceClaimGranularStatusAuthorization` (beta, on by default since 1.36): changing a
/// driver's entries of `status.devices` needs `associated-node:VERB` on `resourceclaims/driver`
/// named for the driver, when the requester is a ServiceAccount bound to the claim's node (else,
/// or failing that, `arbitrary-node:VERB`). `drivers` are those whose entries changed. The
/// refusal is the 422 upstream's strategy answers, with the first denial's words.
pub fn device_status(
    id: &Identity,
    rules: &[Rule],
    verb: &str,
    claim: &Value,
    drivers: &std::collections::BTreeSet<String>,
) -> Result<(), Failure> {
    let name = claim["metadata"]["name"].as_str().unwrap_or("");
    let namespace = claim["metadata"]["namespace"].as_str().unwrap_or("");
    let associated = match (id, allocated_node(claim)) {
        (Identity::ServiceAccount { node: Some(n), .. }, Some(on)) => n == on,
        _ => false,
    };
    let verbs: Vec<String> = if associated {
        vec![format!("associated-node:{verb}"), format!("arbitrary-node:{verb}")]
    } else {
        vec![format!("arbitrary-node:{verb}")]
    };
    let mut causes = Vec::new();
    for driver in drivers {
        let attrs = |verb| Attributes {
            verb,
            group: "resource.k8s.io",
            resource: "resourceclaims",
            subresource: "driver",
            namespace,
            name: driver.as_str(),
        };
        if verbs.iter().any(|v| allowed(id, rules, &attrs(v.as_str()))) {
            continue;
        }
        let first = attrs(verbs[0].as_str());
        let why = forbidden_text(&first, &forbidden_message(id, &first));
        let shown: Vec<&str> = verbs.iter().map(String::as_str).collect();
        causes.push(format!(
            "changing status.devices requires resource=\"resourceclaims/driver\", verb=\"[{}]\" permission: {why}",
            shown.join(" ")
        ));
    }
    if causes.is_empty() {
        return Ok(());
    }
    let listed: Vec<String> = causes.iter().map(|c| format!("status.devices: Forbidden: {c}")).collect();
    let all = if listed.len() == 1 { listed[0].clone() } else { format!("[{}]", listed.join(", ")) };
    let details: Vec<Value> = causes
        .iter()
        .map(|c| serde_json::json!({ "reason": "FieldValueForbidden", "message": format!("Forbidden: {c}"), "field": "status.devices" }))
        .collect();
    Err(status(
        StatusCode::UNPROCESSABLE_ENTITY,
        "Invalid",
        format!("ResourceClaim.resource.k8s.io {name:?} is invalid: {all}"),
        details,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(groups: &[&str], resources: &[&str], verbs: &[&str], names: &[&str]) -> Rule {
        let v = |l: &[&str]| l.iter().map(|s| s.to_string()).collect();
        Rule { api_groups: v(groups), resources: v(resources), verbs: v(verbs), resource_names: v(names) }
    }

    fn sa(node: Option<&str>) -> Identity {
        Identity::ServiceAccount { namespace: "devplug".into(), name: "devplug".into(), node: node.map(str::to_owned) }
    }

    #[test]
    fn rules_match_as_rbac_matches_them() {
        let rules = [
            rule(&["resource.k8s.io"], &["resourceslices"], &["create", "delete"], &[]),
            rule(&["resource.k8s.io"], &["resourceclaims/driver"], &["associated-node:patch"], &["gpu.devplug.io"]),
        ];
        let a = |verb, resource, sub, name| Attributes {
            verb,
            group: "resource.k8s.io",
            resource,
            subresource: sub,
            namespace: "",
            name,
        };
        assert!(allowed(&sa(None), &rules, &a("create", "resourceslices", "", "")));
        assert!(!allowed(&sa(None), &rules, &a("update", "resourceslices", "", "x")), "a verb not listed");
        assert!(!allowed(&sa(None), &rules, &a("patch", "resourceclaims", "status", "c")), "a subresource not listed");
        assert!(allowed(&sa(None), &rules, &a("associated-node:patch", "resourceclaims", "driver", "gpu.devplug.io")));
        assert!(!allowed(&sa(None), &rules, &a("associated-node:patch", "resourceclaims", "driver", "nic.devplug.io")));
        assert!(!allowed(&sa(None), &rules, &a("arbitrary-node:patch", "resourceclaims", "driver", "gpu.devplug.io")));
        assert!(allowed(&Identity::Admin, &[], &a("delete", "nodes", "", "n")));
        let denied = a("update", "resourceslices", "", "s-1");
        assert_eq!(
            forbidden_text(&denied, &forbidden_message(&sa(None), &denied)),
            "resourceslices.resource.k8s.io \"s-1\" is forbidden: User \"system:serviceaccount:devplug:devplug\" cannot update resource \"resourceslices\" in API group \"resource.k8s.io\" at the cluster scope"
        );
    }

    #[test]
    fn device_status_needs_the_driver_rule_for_the_claims_node() {
        let rules =
            [rule(&["resource.k8s.io"], &["resourceclaims/driver"], &["associated-node:patch"], &["gpu.devplug.io"])];
        let claim = serde_json::json!({
            "metadata": { "name": "c", "namespace": "ml" },
            "status": { "allocation": { "nodeSelector": { "nodeSelectorTerms": [
                { "matchFields": [{ "key": "metadata.name", "operator": "In", "values": ["node-a"] }] }
            ] } } }
        });
        let drivers = std::collections::BTreeSet::from(["gpu.devplug.io".to_owned()]);
        assert!(device_status(&sa(Some("node-a")), &rules, "patch", &claim, &drivers).is_ok());
        let (code, body) = device_status(&sa(Some("node-b")), &rules, "patch", &claim, &drivers).unwrap_err();
        assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY);
        let msg = body["message"].as_str().unwrap();
        assert!(
            msg.contains("verb=\"[arbitrary-node:patch]\""),
            "another node's claim: only arbitrary-node is asked: {msg}"
        );
        let (_, body) = device_status(&sa(Some("node-a")), &[], "patch", &claim, &drivers).unwrap_err();
        assert!(
            body["message"].as_str().unwrap().contains(
                "verb=\"[associated-node:patch arbitrary-node:patch]\" permission: resourceclaims.resource.k8s.io \"gpu.devplug.io\" is forbidden: User \"system:serviceaccount:devplug:devplug\" cannot associated-node:patch resource \"resourceclaims/driver\" in API group \"resource.k8s.io\" in the namespace \"ml\""
            ),
            "{body:?}"
        );
    }

    #[test]
    fn the_slice_policy_keeps_a_node_agent_to_its_node_and_drivers() {
        let p = SlicePolicy {
            name: "devplug-resourceslices".into(),
            username: "system:serviceaccount:devplug:devplug".into(),
            drivers: vec!["gpu.devplug.io".into()],
        };
        let slice = |node: &str, driver: &str| serde_json::json!({ "spec": { "nodeName": node, "driver": driver } });
        let mine = slice("node-a", "gpu.devplug.io");
        assert!(p.judge(&sa(Some("node-a")), "CREATE", Some(&mine), None).is_ok());
        assert!(p.judge(&sa(Some("node-b")), "CREATE", Some(&mine), None).is_err(), "another node's");
        assert!(p.judge(&sa(Some("node-a")), "CREATE", Some(&slice("node-a", "gpu.nvidia.com")), None).is_err());
        assert!(
            p.judge(&sa(Some("node-a")), "UPDATE", Some(&mine), Some(&slice("node-b", "gpu.devplug.io"))).is_err(),
            "taking another node's slice over"
        );
        assert!(p.judge(&sa(Some("node-a")), "DELETE", None, Some(&slice("node-b", "gpu.devplug.io"))).is_err());
        assert!(p.judge(&sa(None), "CREATE", Some(&mine), None).is_err(), "a token bound to no node");
        assert!(
            p.judge(&Identity::Admin, "DELETE", None, Some(&slice("node-b", "x"))).is_ok(),
            "the policy matches one user"
        );
        let (code, body) = p.judge(&sa(Some("node-b")), "CREATE", Some(&mine), None).unwrap_err();
        assert_eq!(code, StatusCode::FORBIDDEN);
        assert!(body["message"].as_str().unwrap().starts_with(
            "ValidatingAdmissionPolicy 'devplug-resourceslices' with binding 'devplug-resourceslices' denied request: "
        ));
    }
}
