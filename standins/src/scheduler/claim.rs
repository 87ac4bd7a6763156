//! A ResourceClaim as the API server takes it, for the allocator: decoded strictly against
//! `resource.k8s.io/v1` (an unknown field is an error naming its path, as the server answers
//! kubectl's default `--validate=strict`), from a ResourceClaim or a ResourceClaimTemplate,
//! and checked for what the allocator relies on, with the server's field paths: request names,
//! one of `exactly`/`firstAvailable`, allocation modes and counts, selectors that compile,
//! constraints naming requests the claim has.

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceClaimSpec, ResourceClaimTemplate};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value as Json;

use super::cel::Selectors;

/// Why a document is not a claim the allocator can take: the field and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ClaimError(pub String);

/// `doc` as a `T` of `kind`, refusing any field `resource.k8s.io/v1` does not have.
pub fn strict<T: DeserializeOwned + Serialize>(doc: &Json, kind: &str) -> Result<T, ClaimError> {
    // A value of the wrong type names its field path too, as an unknown field does.
    let typed: T = serde_path_to_error::deserialize(doc.clone()).map_err(|e| {
        let at = e.path().to_string();
        let why = e.into_inner();
        let at = if at == "." { String::new() } else { format!("{at}: ") };
        ClaimError(format!("{kind} in version \"v1\" cannot be handled as a {kind}: {at}{why}"))
    })?;
    let back = serde_json::to_value(&typed).map_err(|e| ClaimError(format!("{kind}: {e}")))?;
    let mut unknown = Vec::new();
    unknown_fields(doc, &back, String::new(), &mut unknown);
    if !unknown.is_empty() {
        let list: Vec<String> = unknown.iter().map(|f| format!("unknown field \"{f}\"")).collect();
        return Err(ClaimError(format!(
            "{kind} in version \"v1\" cannot be handled as a {kind}: strict decoding error: {}",
            list.join(", ")
        )));
    }
    Ok(typed)
}

/// Paths of `given` that the typed round trip `known` lost (a `null` is not a field).
fn unknown_fields(given: &Json, known: &Json, at: String, out: &mut Vec<String>) {
    match (given, known) {
        (Json::Object(g), Json::Object(k)) => {
            for (key, v) in g.iter().filter(|(_, v)| !v.is_null()) {
                let path = if at.is_empty() { key.clone() } else { format!("{at}.{key}") };
                match k.get(key) {
                    None => out.push(path),
                    // Opaque parameters are the driver's, any JSON at all.
                    Some(_) if key == "parameters" => {}
                    Some(kv) => unknown_fields(v, kv, path, out),
                }
            }
        }
        (Json::Array(g), Json::Array(k)) => {
            for (i, (gv, kv)) in g.iter().zip(k).enumerate() {
                unknown_fields(gv, kv, format!("{at}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// What one YAML/JSON document is to the allocator.
pub enum Document {
    /// A claim, named, with its spec (from a ResourceClaim, or a template's `spec.spec`).
    Claim {
        name: Option<String>,
        spec: ResourceClaimSpec,
    },
    Class(Box<DeviceClass>),
}

/// `doc` by its `kind`: a ResourceClaim, ResourceClaimTemplate or DeviceClass of
/// `resource.k8s.io/v1`, decoded strictly.
pub fn document(doc: &Json) -> Result<Document, ClaimError> {
    let (api, kind) = (doc["apiVersion"].as_str().unwrap_or(""), doc["kind"].as_str().unwrap_or(""));
    if api != "resource.k8s.io/v1" {
        return Err(ClaimError(format!(
            "apiVersion {api:?} (kind {kind:?}): only resource.k8s.io/v1 ResourceClaim, ResourceClaimTemplate and DeviceClass are taken"
        )));
    }
    match kind {
        "ResourceClaim" => {
            let c: ResourceClaim = strict(doc, kind)?;
            Ok(Document::Claim { name: c.metadata.name, spec: c.spec })
        }
        "ResourceClaimTemplate" => {
            let t: ResourceClaimTemplate = strict(doc, kind)?;
            Ok(Document::Claim { name: t.metadata.name, spec: t.spec.spec })
        }
        "DeviceClass" => Ok(Document::Class(Box::new(strict(doc, kind)?))),
        other => Err(ClaimError(format!(
            "kind {other:?}: only ResourceClaim, ResourceClaimTemplate and DeviceClass are taken"
        ))),
    }
}

/// A DNS label's problem, as apimachinery's `IsDNS1123Label` words it.
fn label_problem(s: &str) -> Option<&'static str> {
    let ok = !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-');
    (!ok).then_some(
        "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character",
    )
}

/// The API server's checks of `spec` that the allocator relies on (field paths as the server's).
pub fn validate(spec: &ResourceClaimSpec, selectors: &Selectors) -> Result<(), ClaimError> {
    let mut errs: Vec<String> = Vec::new();
    let devices = spec.devices.as_ref();
    let requests = devices.and_then(|d| d.requests.as_deref()).unwrap_or_default();
    let mut names: Vec<String> = Vec::new();
    for (i, r) in requests.iter().enumerate() {
        let at = format!("spec.devices.requests[{i}]");
        if let Some(why) = label_problem(&r.name) {
            errs.push(format!("{at}.name: Invalid value: {:?}: {why}", r.name));
        }
        if names.contains(&r.name) {
            errs.push(format!("{at}.name: Duplicate value: {:?}", r.name));
        }
        names.push(r.name.clone());
        let mut alternatives = Vec::new();
        match (&r.exactly, &r.first_available) {
            (Some(e), None) => alternatives.push((
                format!("{at}.exactly"),
                e.allocation_mode.as_deref(),
                e.count,
                e.selectors.as_deref().unwrap_or_default(),
                e.admin_access,
            )),
            (None, Some(subs)) if !subs.is_empty() => {
                for (j, s) in subs.iter().enumerate() {
                    let sat = format!("{at}.firstAvailable[{j}]");
                    if let Some(why) = label_problem(&s.name) {
                        errs.push(format!("{sat}.name: Invalid value: {:?}: {why}", s.name));
                    }
                    alternatives.push((
                        sat,
                        s.allocation_mode.as_deref(),
                        s.count,
                        s.selectors.as_deref().unwrap_or_default(),
                        None,
                    ));
                }
            }
            _ => errs.push(format!("{at}: Required value: exactly one of `exactly` or `firstAvailable` is required")),
        }
        for (sat, mode, count, sels, admin) in alternatives {
            match (mode.unwrap_or("ExactCount"), count) {
                ("ExactCount", Some(c)) if c < 1 => {
                    errs.push(format!("{sat}.count: Invalid value: {c}: must be greater than zero"))
                }
                ("ExactCount", _) => {}
                ("All", Some(c)) => errs.push(format!(
                    "{sat}.count: Invalid value: {c}: must not be specified when allocationMode is 'All'"
                )),
                ("All", None) => {}
                (m, _) => errs.push(format!(
                    "{sat}.allocationMode: Unsupported value: {m:?}: supported values: \"All\", \"ExactCount\""
                )),
            }
            if admin == Some(true) {
                errs.push(format!(
                    "{sat}.adminAccess: Forbidden: admin access needs a namespace labelled resource.kubernetes.io/admin-access, which devplug try does not have"
                ));
            }
            for (k, s) in sels.iter().enumerate() {
                match &s.cel {
                    Some(c) => match selectors.compile(&c.expression) {
                        Ok(_) => {}
                        Err(e @ super::cel::CelError::TooComplex) => {
                            errs.push(format!("{sat}.selectors[{k}].cel.expression: Forbidden: {e}"))
                        }
                        Err(e) => errs.push(format!(
                            "{sat}.selectors[{k}].cel.expression: Invalid value: {:?}: {e}",
                            c.expression
                        )),
                    },
                    None => errs.push(format!("{sat}.selectors[{k}].cel: Required value")),
                }
            }
        }
    }
    for (i, c) in devices.and_then(|d| d.constraints.as_deref()).unwrap_or_default().iter().enumerate() {
        let at = format!("spec.devices.constraints[{i}]");
        for (j, r) in c.requests.iter().flatten().enumerate() {
            let parent = r.split_once('/').map_or(r.as_str(), |(p, _)| p);
            if !names.iter().any(|n| n == parent) {
                errs.push(format!("{at}.requests[{j}]: Invalid value: {r:?}: must be the name of a request in the claim or the name of a request and the subrequest separated by '/'"));
            }
        }
        match (&c.match_attribute, &c.distinct_attribute) {
            (Some(a), None) | (None, Some(a)) => {
                let field = if c.match_attribute.is_some() { "matchAttribute" } else { "distinctAttribute" };
                if !a.contains('/') {
                    errs.push(format!("{at}.{field}: Required value: a fully qualified name must be the domain and the name separated by a slash"));
                }
            }
            _ => errs.push(format!(
                "{at}: Required value: exactly one of `matchAttribute` or `distinctAttribute` is required"
            )),
        }
    }
    if errs.is_empty() { Ok(()) } else { Err(ClaimError(errs.join("; "))) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claim(requests: Json) -> Json {
        json!({ "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": { "name": "c" },
                "spec": { "devices": { "requests": requests } } })
    }

    #[test]
    fn an_unknown_field_is_refused_by_its_path() {
        let doc = claim(json!([{ "name": "gpu", "exactly": { "deviceClassName": "g", "selector": [] } }]));
        let e = document(&doc).err().map(|e| e.0).unwrap_or_default();
        assert!(
            e.contains(r#"strict decoding error: unknown field "spec.devices.requests[0].exactly.selector""#),
            "{e}"
        );
        let ok = claim(json!([{ "name": "gpu", "exactly": { "deviceClassName": "g", "selectors": [] } }]));
        assert!(document(&ok).is_ok());
    }

    /// Issue 52: a value of the wrong type is refused by its path too.
    #[test]
    fn a_type_error_is_refused_by_its_path() {
        let doc = claim(json!([{ "name": "gpu", "exactly": { "deviceClassName": "g", "count": "two" } }]));
        let e = document(&doc).err().map(|e| e.0).unwrap_or_default();
        assert!(e.contains("spec.devices.requests[0].exactly.count: invalid type: string \"two\""), "{e}");
    }

    #[test]
    fn validation_names_the_field_as_the_api_server_does() {
        let s = Selectors::new();
        let check = |requests: Json| match document(&claim(requests)) {
            Ok(Document::Claim { spec, .. }) => validate(&spec, &s).err().map(|e| e.0).unwrap_or_default(),
            _ => "not a claim".into(),
        };
        assert!(
            check(json!([{ "name": "Gpu", "exactly": { "deviceClassName": "g" } }]))
                .contains("spec.devices.requests[0].name: Invalid value")
        );
        assert!(check(json!([{ "name": "gpu" }])).contains("exactly one of `exactly` or `firstAvailable`"));
        assert!(
            check(json!([{ "name": "gpu", "exactly": { "deviceClassName": "g", "count": 0 } }]))
                .contains("requests[0].exactly.count")
        );
        assert!(
            check(
                json!([{ "name": "gpu", "exactly": { "deviceClassName": "g", "allocationMode": "All", "count": 2 } }])
            )
            .contains("must not be specified")
        );
        let bad_cel = check(
            json!([{ "name": "gpu", "exactly": { "deviceClassName": "g", "selectors": [{ "cel": { "expression": "device.driver ==" } }] } }]),
        );
        assert!(bad_cel.contains("requests[0].exactly.selectors[0].cel.expression: Invalid value"), "{bad_cel}");
        assert_eq!(check(json!([{ "name": "gpu", "exactly": { "deviceClassName": "g", "count": 2 } }])), "");
    }
}
