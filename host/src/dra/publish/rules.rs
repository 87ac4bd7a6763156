//! The rules kube-apiserver (`resource.k8s.io/v1`, 1.36) applies to a ResourceSlice, checked by
//! devplug before it sends one, so a backend's bad description is refused with the backend,
//! device and field named, and a pool is never half-published. Field paths and the order of the
//! checks follow the server's: the test over `tests/fixtures/k8s/resourceslice-verdicts*.jsonl`
//! (every case a real v1.36 server accepted or refused, boundary cases included) holds devplug to
//! the same verdicts. The API-server stand-in has its own port of upstream's validation
//! (`standins/src/apiserver/validation.rs`), held to the same recordings: neither judges the other.

use std::collections::HashSet;

use serde_json::Value;

/// Devices in one slice; 64 when any device has taints or consumes counters.
pub const MAX_DEVICES: usize = 128;
pub(crate) const MAX_DEVICES_WITH_TAINTS_OR_COUNTERS: usize = 64;
/// Attributes and capacities of one device, together.
pub const MAX_ATTRIBUTES_AND_CAPACITIES: usize = 32;
/// The name part of an attribute or capacity name (a C identifier).
/// A string or version attribute's value.
pub(crate) const MAX_ATTRIBUTE_VALUE: usize = 64;
/// Counter sets in one slice (`ResourceSliceSpec.sharedCounters`: "The maximum number of counter
/// sets is 8", the recorded 1.36 OpenAPI).
pub const MAX_COUNTER_SETS: usize = 8;
/// Counters in one set, and counters in one consumption ("The maximum number of counters is 32").
pub(crate) const MAX_COUNTERS: usize = 32;
/// Counter sets one device consumes from ("The maximum number of device counter consumptions per
/// device is 2").
pub const MAX_CONSUMPTIONS: usize = 2;
/// Taints of one device ("The maximum number of taints is 16").
pub const MAX_TAINTS: usize = 16;
/// Binding conditions, and binding failure conditions, of one device ("The maximum number of
/// binding conditions is 4").
pub const MAX_BINDING_CONDITIONS: usize = 4;

fn too_many(field: String, n: usize, max: usize) -> Problem {
    problem(field, format!("Too many: {n}: must have at most {max} items"))
}

/// One reason the server would refuse the slice: the field path it names, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub field: String,
    pub message: String,
}

fn problem(field: impl Into<String>, message: impl Into<String>) -> Problem {
    Problem { field: field.into(), message: message.into() }
}

/// Every reason `slice` (a ResourceSlice as JSON) would be refused, in the server's order; empty
/// when it would be accepted.
pub fn problems(slice: &Value) -> Vec<Problem> {
    // Quantities that do not parse fail the decoding itself (HTTP 400), before any validation.
    let mut out = quantity_problems(slice);
    if !out.is_empty() {
        return out;
    }
    let spec = &slice["spec"];
    if let Some(name) = slice["metadata"]["name"].as_str()
        && let Some(why) = subdomain_problem(name)
    {
        out.push(problem("metadata.name", why));
    }
    metadata_problems(&slice["metadata"], &mut out);
    driver_problems(spec["driver"].as_str().unwrap_or_default(), "spec.driver", &mut out);
    pool_problems(&spec["pool"], &mut out);
    let mut selected = 0;
    match spec.get("nodeName").and_then(Value::as_str) {
        Some("") => out.push(problem("spec.nodeName", "must be either unset or set to a non-empty string")),
        Some(node) => {
            selected += 1;
            if let Some(why) = subdomain_problem(node) {
                out.push(problem("spec.nodeName", format!("{node:?}: {why}")));
            }
        }
        None => {}
    }
    if let Some(sel) = spec.get("nodeSelector").filter(|v| !v.is_null()) {
        selected += 1;
        if sel["nodeSelectorTerms"].as_array().map_or(0, Vec::len) != 1 {
            out.push(problem("spec.nodeSelector.nodeSelectorTerms", "must have exactly one node selector term"));
        }
    }
    for key in ["allNodes", "perDeviceNodeSelection"] {
        match spec.get(key).and_then(Value::as_bool) {
            Some(true) => selected += 1,
            Some(false) => out.push(problem(format!("spec.{key}"), "must be either unset or set to true")),
            None => {}
        }
    }
    match selected {
        1 => {}
        0 => out.push(problem(
            "spec",
            "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required",
        )),
        _ => {
            out.push(problem("spec", "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection`"))
        }
    }
    let devices = spec["devices"].as_array().map(Vec::as_slice).unwrap_or_default();
    let counters = spec["sharedCounters"].as_array().map(Vec::as_slice).unwrap_or_default();
    // Present, not non-empty: the server refuses `devices: []` beside `sharedCounters: []` too.
    if !spec["devices"].is_null() && !spec["sharedCounters"].is_null() {
        out.push(problem("spec", "only one of `sharedCounters` or `devices` is allowed"));
    }
    if counters.len() > MAX_COUNTER_SETS {
        out.push(too_many("spec.sharedCounters".into(), counters.len(), MAX_COUNTER_SETS));
    } else {
        let mut set_names = HashSet::new();
        for (i, set) in counters.iter().enumerate() {
            let at = format!("spec.sharedCounters[{i}]");
            let set_name = set["name"].as_str().unwrap_or_default();
            if let Some(why) = label_problem(set_name) {
                out.push(problem(format!("{at}.name"), why));
            } else if !set_names.insert(set_name) {
                out.push(problem(at.clone(), format!("Duplicate value: {set_name:?}")));
            }
            counter_map_problems(&set["counters"], &format!("{at}.counters"), &mut out);
        }
    }
    let limited = devices.iter().any(|d| {
        d["taints"].as_array().is_some_and(|t| !t.is_empty())
            || d["consumesCounters"].as_array().is_some_and(|c| !c.is_empty())
    });
    let max = if limited { MAX_DEVICES_WITH_TAINTS_OR_COUNTERS } else { MAX_DEVICES };
    if devices.len() > max {
        out.push(problem("spec.devices", format!("Too many: {}: must have at most {max} items", devices.len())));
    }
    let mut names = HashSet::new();
    for (i, d) in devices.iter().enumerate() {
        device_problems(i, d, &mut names, spec["perDeviceNodeSelection"] == true, &mut out);
    }
    out
}

fn pool_problems(pool: &Value, out: &mut Vec<Problem>) {
    let name = pool["name"].as_str().unwrap_or_default();
    if name.len() > 253 {
        out.push(problem("spec.pool.name", "Too long: may not be more than 253 bytes"));
    }
    // A pool name is one or more DNS subdomains joined by slashes.
    if let Some(why) = name.split('/').find_map(subdomain_problem_unbounded) {
        out.push(problem("spec.pool.name", format!("{name:?}: {why}")));
    }
    if pool["generation"].as_i64().is_some_and(|g| g < 0) {
        out.push(problem("spec.pool.generation", "must be greater than or equal to zero"));
    }
    if pool["resourceSliceCount"].as_i64().is_none_or(|c| c <= 0) {
        out.push(problem("spec.pool.resourceSliceCount", "must be greater than zero"));
    }
}

fn device_problems(i: usize, d: &Value, names: &mut HashSet<String>, per_device: bool, out: &mut Vec<Problem>) {
    let at = format!("spec.devices[{i}]");
    let name = d["name"].as_str().unwrap_or_default();
    if let Some(why) = label_problem(name) {
        out.push(problem(format!("{at}.name"), format!("{name:?}: {why}")));
    } else if !names.insert(name.to_owned()) {
        out.push(problem(at.clone(), format!("Duplicate value: {name:?}")));
    }
    let attributes = d["attributes"].as_object();
    let capacity = d["capacity"].as_object();
    let total = attributes.map_or(0, |a| a.len()) + capacity.map_or(0, |c| c.len());
    if total > MAX_ATTRIBUTES_AND_CAPACITIES {
        out.push(problem(
            at.clone(),
            format!(
                "{total}: the total number of attributes and capacities must not exceed {MAX_ATTRIBUTES_AND_CAPACITIES}"
            ),
        ));
    }
    for (key, v) in attributes.into_iter().flatten() {
        if let Some(why) = qualified_name_problem(key) {
            // The server's field, which names no key; the message names it (clipped), since
            // `attributes: Too long` alone left a vendor guessing which one.
            let key = crate::gate::clip_to(key, 80);
            out.push(problem(format!("{at}.attributes"), format!("{why} (attribute {key:?})")));
            continue;
        }
        let kinds = ["int", "bool", "string", "version"].iter().filter(|k| !v[**k].is_null()).count();
        if kinds != 1 {
            out.push(problem(format!("{at}.attributes[{key}]"), "exactly one value must be specified"));
            continue;
        }
        if let Some(s) = v["string"].as_str()
            && s.len() > MAX_ATTRIBUTE_VALUE
        {
            out.push(problem(
                format!("{at}.attributes[{key}].string"),
                format!("Too long: may not be more than {MAX_ATTRIBUTE_VALUE} bytes"),
            ));
        }
        if let Some(s) = v["version"].as_str()
            && (s.len() > MAX_ATTRIBUTE_VALUE || semver::Version::parse(s).is_err())
        {
            out.push(problem(
                format!("{at}.attributes[{key}].version"),
                "must be a string compatible with semver.org spec 2.0.0",
            ));
        }
    }
    let shared = d["allowMultipleAllocations"] == true;
    for (key, v) in capacity.into_iter().flatten() {
        if let Some(why) = qualified_name_problem(key) {
            let key = crate::gate::clip_to(key, 80);
            out.push(problem(format!("{at}.capacity"), format!("{why} (capacity {key:?})")));
            continue;
        }
        let policy = &v["requestPolicy"];
        if !policy.is_null() {
            let field = format!("{at}.capacity[{key}].requestPolicy");
            if shared {
                request_policy_problems(&v["value"], policy, &field, out);
            } else {
                out.push(problem(field, "Forbidden: allowMultipleAllocations must be true"));
            }
        }
    }
    let consumes = d["consumesCounters"].as_array().map(Vec::as_slice).unwrap_or_default();
    if consumes.len() > MAX_CONSUMPTIONS {
        out.push(too_many(format!("{at}.consumesCounters"), consumes.len(), MAX_CONSUMPTIONS));
    } else {
        let mut sets = HashSet::new();
        for (j, c) in consumes.iter().enumerate() {
            let set = c["counterSet"].as_str().unwrap_or_default();
            if let Some(why) = label_problem(set) {
                out.push(problem(format!("{at}.consumesCounters[{j}].counterSet"), why));
            } else if !sets.insert(set) {
                out.push(problem(format!("{at}.consumesCounters[{j}]"), format!("Duplicate value: {set:?}")));
            }
            counter_map_problems(&c["counters"], &format!("{at}.consumesCounters[{j}].counters"), out);
        }
    }
    let taints = d["taints"].as_array().map_or(0, Vec::len);
    if taints > MAX_TAINTS {
        out.push(too_many(format!("{at}.taints"), taints, MAX_TAINTS));
    }
    for key in ["bindingConditions", "bindingFailureConditions"] {
        let n = d[key].as_array().map_or(0, Vec::len);
        if n > MAX_BINDING_CONDITIONS {
            out.push(too_many(format!("{at}.{key}"), n, MAX_BINDING_CONDITIONS));
        }
    }
    for (j, t) in d["taints"].as_array().into_iter().flatten().enumerate() {
        let key = t["key"].as_str().unwrap_or_default();
        if let Some(why) = label_key_problem(key) {
            out.push(problem(format!("{at}.taints[{j}].key"), format!("{key:?}: {why}")));
        }
        if let Some(value) = t["value"].as_str().filter(|v| !v.is_empty())
            && let Some(why) = label_value_problem(value)
        {
            out.push(problem(format!("{at}.taints[{j}].value"), format!("{value:?}: {why}")));
        }
        let effect = t["effect"].as_str().unwrap_or_default();
        if effect.is_empty() {
            out.push(problem(format!("{at}.taints[{j}].effect"), "Required value"));
        } else if !["NoSchedule", "NoExecute", "None"].contains(&effect) {
            out.push(problem(
                format!("{at}.taints[{j}].effect"),
                format!("Unsupported value: {effect:?}: supported values: \"NoExecute\", \"NoSchedule\", \"None\""),
            ));
        }
    }
    binding_problems(d, &at, out);
    node_selection_problems(d, &at, per_device, out);
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array().into_iter().flatten().map(|s| s.as_str().unwrap_or_default()).collect()
}

/// Binding conditions: each a label key, no repeats, failures never among the conditions, and
/// neither list without the other.
fn binding_problems(d: &Value, at: &str, out: &mut Vec<Problem>) {
    let conditions = strings(&d["bindingConditions"]);
    let failures = strings(&d["bindingFailureConditions"]);
    for (key, list) in [("bindingConditions", &conditions), ("bindingFailureConditions", &failures)] {
        let mut seen = HashSet::new();
        for (j, c) in list.iter().enumerate() {
            if let Some(why) = label_key_problem(c) {
                out.push(problem(format!("{at}.{key}[{j}]"), format!("{c:?}: {why}")));
            }
            if !seen.insert(*c) {
                out.push(problem(format!("{at}.{key}[{j}]"), format!("Duplicate value: {c:?}")));
            }
        }
    }
    for (j, c) in failures.iter().enumerate() {
        if conditions.contains(c) {
            out.push(problem(
                format!("{at}.bindingFailureConditions[{j}]"),
                format!("{c:?}: bindingFailureConditions must not overlap with bindingConditions"),
            ));
        }
    }
    if conditions.is_empty() && !failures.is_empty() {
        out.push(problem(
            format!("{at}.bindingConditions"),
            "bindingConditions are required to use bindingFailureConditions",
        ));
    }
    if !conditions.is_empty() && failures.is_empty() {
        out.push(problem(
            format!("{at}.bindingFailureConditions"),
            "bindingFailureConditions are required to use bindingConditions",
        ));
    }
}

/// A device names its node only in a slice with `perDeviceNodeSelection`, and then exactly once.
fn node_selection_problems(d: &Value, at: &str, per_device: bool, out: &mut Vec<Problem>) {
    let set = |k: &str| d.get(k).is_some_and(|v| !v.is_null());
    if !per_device {
        if set("nodeName") || set("nodeSelector") || set("allNodes") {
            out.push(problem(
                at,
                "`nodeName`, `nodeSelector` and `allNodes` can only be set if `perDeviceNodeSelection` is set to true in the ResourceSlice spec",
            ));
        }
        return;
    }
    let mut chosen = 0;
    if set("nodeName") {
        match d["nodeName"].as_str().unwrap_or_default() {
            "" => out.push(problem(format!("{at}.nodeName"), "must not be empty")),
            node => {
                chosen += 1;
                if let Some(why) = subdomain_problem(node) {
                    out.push(problem(format!("{at}.nodeName"), format!("{node:?}: {why}")));
                }
            }
        }
    }
    if set("nodeSelector") {
        chosen += 1;
    }
    if set("allNodes") {
        if d["allNodes"] == true {
            chosen += 1;
        } else {
            out.push(problem(format!("{at}.allNodes"), "must be either unset or set to true"));
        }
    }
    if chosen != 1 {
        out.push(problem(
            at,
            "exactly one of `nodeName`, `nodeSelector`, or `allNodes` is required when `perDeviceNodeSelection` is set to true in the ResourceSlice spec",
        ));
    }
}

/// A map of counters (a set's, or a consumption's): not empty, at most [`MAX_COUNTERS`], each
/// name a DNS label.
fn counter_map_problems(counters: &Value, field: &str, out: &mut Vec<Problem>) {
    let map = counters.as_object().filter(|m| !m.is_empty());
    let Some(map) = map else {
        out.push(problem(field, "Required value"));
        return;
    };
    if map.len() > MAX_COUNTERS {
        out.push(too_many(field.to_owned(), map.len(), MAX_COUNTERS));
        return;
    }
    for name in map.keys() {
        if let Some(why) = label_problem(name) {
            out.push(problem(field, format!("{name:?}: {why}")));
        }
    }
}

/// The driver name: required, at most 63 characters, a DNS subdomain once lowercased (the rules
/// of a CSI driver name, which the server reuses).
fn driver_problems(driver: &str, field: &str, out: &mut Vec<Problem>) {
    if driver.is_empty() {
        out.push(problem(field, "Required value"));
        return;
    }
    if driver.len() > 63 {
        out.push(problem(field, "Too long: may not be more than 63 bytes"));
    }
    if let Some(why) = subdomain_problem_unbounded(&driver.to_lowercase()) {
        out.push(problem(field, format!("{driver:?}: {why}")));
    }
}

/// Labels (keys qualified names, values label values) and owner references (each with an
/// API version, kind, name and UID); the server names these fields without keys or indexes.
fn metadata_problems(meta: &Value, out: &mut Vec<Problem>) {
    for (k, v) in meta["labels"].as_object().into_iter().flatten() {
        if let Some(why) = label_key_problem(k) {
            out.push(problem("metadata.labels", format!("{k:?}: {why}")));
        }
        let v = v.as_str().unwrap_or_default();
        if let Some(why) = label_value_problem(v) {
            out.push(problem("metadata.labels", format!("{v:?}: {why}")));
        }
    }
    for r in meta["ownerReferences"].as_array().into_iter().flatten() {
        for key in ["apiVersion", "kind", "name", "uid"] {
            if r[key].as_str().is_none_or(str::is_empty) {
                out.push(problem(format!("metadata.ownerReferences.{key}"), "must not be empty"));
            }
        }
    }
}

/// A quantity's value, close enough to order quantities and check steps (requestPolicy).
fn quantity_value(v: &Value) -> Option<f64> {
    let q = v.as_str()?;
    if !is_quantity(q) {
        return None;
    }
    let body = q.strip_prefix(['+', '-']).unwrap_or(q);
    let split = body.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(body.len());
    let (number, suffix) = body.split_at(split);
    let n: f64 = number.parse().ok()?;
    let scale = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        e => 10f64.powi(e[1..].parse().ok()?),
    };
    Some(if q.starts_with('-') { -n * scale } else { n * scale })
}

/// A shared capacity's request policy: one kind of policy; discrete values sorted, within the
/// capacity and holding the default; a range with a minimum within the capacity, the default
/// inside it, and the default and maximum on its steps.
fn request_policy_problems(capacity: &Value, policy: &Value, field: &str, out: &mut Vec<Problem>) {
    let q = |v: &Value| quantity_value(v).unwrap_or(0.0);
    let values = policy["validValues"].as_array().map(Vec::as_slice).unwrap_or_default();
    let range = &policy["validRange"];
    let default = &policy["default"];
    if !values.is_empty() && !range.is_null() {
        out.push(problem(field, "Forbidden: exactly one policy can be specified, cannot specify \"validValues\" and \"validRange\" at the same time"));
        return;
    }
    if !values.is_empty() {
        if default.is_null() {
            out.push(problem(format!("{field}.default"), "Required value: required when validValues is defined"));
            return;
        }
        let at = format!("{field}.validValues");
        for (i, pair) in values.windows(2).enumerate() {
            if q(&pair[0]) > q(&pair[1]) {
                out.push(problem(format!("{at}[{}]", i + 1), "values must be sorted in ascending order"));
            }
        }
        for (i, v) in values.iter().enumerate() {
            if q(v) > q(capacity) {
                out.push(problem(
                    format!("{at}[{i}]"),
                    format!("{v}: option is larger than capacity value: {capacity}"),
                ));
            }
        }
        if !values.iter().any(|v| q(v) == q(default)) {
            out.push(problem(at, "default value is not valid according to the requestPolicy"));
        }
    } else if !range.is_null() {
        if default.is_null() {
            out.push(problem(format!("{field}.default"), "Required value: required when validRange is defined"));
            return;
        }
        let at = format!("{field}.validRange");
        let (min, max, step) = (&range["min"], &range["max"], &range["step"]);
        if min.is_null() {
            out.push(problem(format!("{at}.min"), "Required value: required when validRange is defined"));
            return;
        }
        if q(min) > q(capacity) {
            out.push(problem(format!("{at}.min"), format!("min is larger than capacity value: {capacity}")));
        }
        if q(default) < q(min) {
            out.push(problem(format!("{at}.min"), format!("default is less than min: {min}")));
        }
        if !max.is_null() {
            if q(min) > q(max) {
                out.push(problem(format!("{at}.max"), format!("min is larger than max: {max}")));
            }
            if q(max) > q(capacity) {
                out.push(problem(format!("{at}.max"), format!("max is larger than capacity value: {capacity}")));
            }
            if q(default) > q(max) {
                out.push(problem(format!("{at}.max"), format!("default is more than max: {max}")));
            }
        }
        if !step.is_null() && q(step) > 0.0 {
            if q(min) + q(step) > q(capacity) {
                out.push(problem(format!("{at}.step"), format!("one step is larger than capacity value: {capacity}")));
            }
            let off = |v: &Value| ((q(v) - q(min)) / q(step)).fract().abs() > 1e-9;
            if off(default) || (!max.is_null() && off(max)) {
                out.push(problem(
                    format!("{at}.step"),
                    format!("value is not a multiple of a given step ({step}) from ({min})"),
                ));
            }
        }
    }
}

/// Every quantity the slice carries (capacities, counters, counters consumed), as the decoder
/// reads them.
fn quantity_problems(slice: &Value) -> Vec<Problem> {
    let spec = &slice["spec"];
    let mut out = Vec::new();
    for key in ["generation", "resourceSliceCount"] {
        let v = &spec["pool"][key];
        if !v.is_null() && v.as_i64().is_none() {
            out.push(problem(format!("spec.pool.{key}"), format!("json: cannot unmarshal {v} into an int64")));
        }
    }
    let mut check = |field: String, v: &Value| {
        if let Some(q) = v["value"].as_str()
            && !is_quantity(q)
        {
            out.push(problem(
                field,
                format!(
                    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {q:?}"
                ),
            ));
        }
    };
    for (i, d) in spec["devices"].as_array().into_iter().flatten().enumerate() {
        for (k, v) in d["capacity"].as_object().into_iter().flatten() {
            check(format!("spec.devices[{i}].capacity[{k}].value"), v);
        }
        for (j, c) in d["consumesCounters"].as_array().into_iter().flatten().enumerate() {
            for (k, v) in c["counters"].as_object().into_iter().flatten() {
                check(format!("spec.devices[{i}].consumesCounters[{j}].counters[{k}].value"), v);
            }
        }
    }
    for (i, s) in spec["sharedCounters"].as_array().into_iter().flatten().enumerate() {
        for (k, v) in s["counters"].as_object().into_iter().flatten() {
            check(format!("spec.sharedCounters[{i}].counters[{k}].value"), v);
        }
    }
    out
}

/// A Kubernetes quantity: a number, then a binary-SI, decimal-SI or exponent suffix.
pub fn is_quantity(q: &str) -> bool {
    let body = q.strip_prefix(['+', '-']).unwrap_or(q);
    let digits = body.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(body.len());
    let (number, suffix) = body.split_at(digits);
    if !number.chars().any(|c| c.is_ascii_digit()) || number.matches('.').count() > 1 {
        return false;
    }
    const SUFFIXES: &[&str] = &["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u", "m", "k", "M", "G", "T", "P", "E"];
    if SUFFIXES.contains(&suffix) {
        return true;
    }
    match suffix.strip_prefix(['e', 'E']) {
        Some(exp) => {
            let exp = exp.strip_prefix(['+', '-']).unwrap_or(exp);
            !exp.is_empty() && exp.chars().all(|c| c.is_ascii_digit())
        }
        None => false,
    }
}

use crate::gate::subdomain_problem_unbounded;
pub use crate::gate::{
    MAX_ATTRIBUTE_NAME, label_key_problem, label_problem, label_value_problem, qualified_name_problem,
    subdomain_problem,
};

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 41: nine counter sets passed devplug's rules; the server takes at most eight. Every
    /// limit the 1.36 OpenAPI states for slices, devices and counters is checked.
    #[test]
    fn every_stated_server_limit_is_checked() {
        use serde_json::json;
        let counters = |n: usize| -> Value { (0..n).map(|i| (format!("c{i}"), json!({ "value": "1" }))).collect() };
        let sets: Vec<Value> =
            (0..9).map(|i| json!({ "name": format!("gpu-{i}-slices"), "counters": counters(1) })).collect();
        let slice = |spec: Value| {
            let mut spec = spec;
            spec["driver"] = json!("gpu.devplug.io");
            spec["nodeName"] = json!("node-a");
            spec["pool"] = json!({ "name": "node-a", "generation": 1, "resourceSliceCount": 1 });
            json!({ "metadata": { "name": "s" }, "spec": spec })
        };
        let fields =
            |v: &Value| problems(v).into_iter().map(|p| format!("{}: {}", p.field, p.message)).collect::<Vec<_>>();
        assert_eq!(
            fields(&slice(json!({ "sharedCounters": sets }))),
            ["spec.sharedCounters: Too many: 9: must have at most 8 items"]
        );
        assert!(problems(&slice(json!({ "sharedCounters": sets[..8] }))).is_empty());
        let wide = json!([{ "name": "s", "counters": counters(33) }]);
        assert_eq!(
            fields(&slice(json!({ "sharedCounters": wide }))),
            ["spec.sharedCounters[0].counters: Too many: 33: must have at most 32 items"]
        );
        let twice = json!([{ "name": "s", "counters": counters(1) }, { "name": "s", "counters": counters(1) }]);
        assert!(fields(&slice(json!({ "sharedCounters": twice })))[0].contains("Duplicate value"));
        let device = json!({
            "name": "d",
            "consumesCounters": [
                { "counterSet": "a", "counters": counters(33) },
                { "counterSet": "a", "counters": counters(1) },
                { "counterSet": "b", "counters": counters(1) },
            ],
            "taints": (0..17).map(|i| json!({ "key": format!("k{i}"), "effect": "NoSchedule" })).collect::<Vec<_>>(),
            "bindsToNode": true,
            "bindingConditions": ["a", "b", "c", "d", "e"],
            "bindingFailureConditions": ["a"],
        });
        assert_eq!(
            fields(&slice(json!({ "devices": [device] }))),
            // As the server's `validateSet`: a list over its limit is not looked into further.
            [
                "spec.devices[0].consumesCounters: Too many: 3: must have at most 2 items",
                "spec.devices[0].taints: Too many: 17: must have at most 16 items",
                "spec.devices[0].bindingConditions: Too many: 5: must have at most 4 items",
                "spec.devices[0].bindingFailureConditions[0]: \"a\": bindingFailureConditions must not overlap with bindingConditions",
            ]
        );
        // Issue 42: a bad attribute or capacity name is named in the field.
        let long = "x".repeat(40);
        let named =
            json!({ "name": "d", "attributes": { &long: { "int": 1 } }, "capacity": { "bad name": { "value": "1" } } });
        let got = fields(&slice(json!({ "devices": [named] })));
        assert!(
            got[0].starts_with("spec.devices[0].attributes: Too long")
                && got[0].ends_with(&format!("(attribute \"{long}\")")),
            "{got:?}"
        );
        assert!(
            got[1].starts_with("spec.devices[0].capacity: ") && got[1].ends_with("(capacity \"bad name\")"),
            "{got:?}"
        );
    }

    #[test]
    fn quantities_parse_as_the_api_server_reads_them() {
        for ok in ["80Gi", "108", "1.5", "1e3", "+5m", "-1", "2E-3", "0.5Ki"] {
            assert!(is_quantity(ok), "{ok}");
        }
        for bad in ["80 GiB", "abc", "1..2", "", "Gi", "1e", "5x"] {
            assert!(!is_quantity(bad), "{bad}");
        }
    }

    #[test]
    fn names_follow_the_servers_shapes() {
        assert!(label_problem("gpu-0").is_none());
        assert!(label_problem("0000:07:00.0").is_some(), "a PCI address is not a device name");
        assert!(qualified_name_problem("devplug.io/pci").is_none());
        assert!(qualified_name_problem("x".repeat(33).as_str()).unwrap().contains("32 bytes"));
        assert!(label_key_problem("devplug.io/unhealthy").is_none());
        assert!(label_key_problem("bad key!").is_some());
    }
}
