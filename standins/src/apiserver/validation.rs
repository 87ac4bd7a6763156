//! ResourceSlice validation as kube-apiserver v1.36.2 runs it on create and update: a port of
//! `pkg/apis/resource/validation/validation.go` (`ValidateResourceSlice`,
//! `ValidateResourceSliceUpdate` and what they call) and of `ValidateObjectMeta`, in upstream's
//! order, with upstream's field paths and messages (read from OpenShift's fork at v1.36.2 as
//! vendored by openshift/microshift). Decoding comes first, as on the server: a quantity that
//! does not parse or a field of the wrong JSON type fails the whole object (HTTP 400) before any
//! rule runs.
//!
//! Nothing here comes from devplug: the recorded answers of a real server
//! (tests/fixtures/k8s/resourceslice-verdicts.jsonl) are the check on this port.

use std::collections::HashSet;

use serde_json::{Map, Value};

use super::field::Errors;
use super::formats;

/// `resource.ResourceSliceMaxDevices` and the limit with taints, counters or list attributes.
const MAX_DEVICES: usize = 128;
const MAX_DEVICES_ADVANCED: usize = 64;
const MAX_ATTRIBUTES_AND_CAPACITIES: usize = 32;
const MAX_ATTRIBUTE_VALUES: usize = 48;
const MAX_COUNTER_SETS: usize = 8;
const MAX_COUNTERS_PER_SET: usize = 32;
const MAX_CONSUMPTIONS: usize = 2;
const MAX_COUNTERS_PER_CONSUMPTION: usize = 32;
const MAX_TAINTS: usize = 16;
const MAX_BINDING_CONDITIONS: usize = 4;
const MAX_VALUE_LENGTH: usize = 64;
const DEVICE_MAX_ID: usize = 32;
const DRIVER_MAX: usize = 63;
const DISCRETE_MAX_OPTIONS: usize = 10;
/// `resource.DeviceMaxDomainLength + 1 + resource.DeviceMaxIDLength`: map keys longer than this
/// are shortened in field paths.
const KEY_PATH_MAX: usize = 63 + 1 + 32;
const TAINT_EFFECTS: [&str; 3] = ["NoExecute", "NoSchedule", "None"];

/// Why the body does not decode as a ResourceSlice (worded as Go's decoders word it).
#[derive(Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// A field of the wrong JSON type (`encoding/json`'s `UnmarshalTypeError`).
    WrongType { field: &'static str, found: &'static str, go: &'static str },
    /// A quantity `resource.ParseQuantity` refuses.
    Quantity,
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::WrongType { field, found, go } => {
                write!(f, "json: cannot unmarshal {found} into Go struct field {field} of type {go}")
            }
            DecodeError::Quantity => f.write_str(formats::QUANTITY_FORMAT),
        }
    }
}

/// Why the server did not take an object.
#[derive(Debug)]
pub enum Refusal {
    /// The body does not decode as the type (400 BadRequest).
    Decode(DecodeError),
    /// It decodes but breaks a rule (422 Invalid), every error in the server's order.
    Invalid(Errors),
}

/// What the server does with a ResourceSlice being created (`old` = `None`) or replacing
/// `old`, in its order: decode, drop the fields of disabled features (so `slice` is then what
/// it would store), validate.
pub fn resource_slice(slice: &mut Value, old: Option<&Value>) -> Result<(), Refusal> {
    decode(slice).map_err(Refusal::Decode)?;
    drop_disabled_fields(slice);
    let slice = &*slice;
    let mut errs = Errors::default();
    object_meta(&slice["metadata"], &mut errs);
    spec(&slice["spec"], old.map(|o| &o["spec"]), &mut errs);
    if errs.0.is_empty() { Ok(()) } else { Err(Refusal::Invalid(errs)) }
}

/// What the server's strategy drops before validating and storing, because its feature gate
/// is off by default in 1.36 (`DRAListTypeAttributes`: list-valued attributes;
/// `DRANodeAllocatableResources`: `nodeAllocatableResourceMappings`).
pub fn drop_disabled_fields(slice: &mut Value) {
    for d in slice["spec"]["devices"].as_array_mut().into_iter().flatten() {
        if let Some(d) = d.as_object_mut() {
            d.remove("nodeAllocatableResourceMappings");
        }
        for a in d["attributes"].as_object_mut().into_iter().flat_map(|m| m.values_mut()) {
            if let Some(a) = a.as_object_mut() {
                for k in ["bools", "ints", "strings", "versions"] {
                    a.remove(k);
                }
            }
        }
    }
}

// ----- decoding -----

fn decode(slice: &Value) -> Result<(), DecodeError> {
    let spec = &slice["spec"];
    let want = |v: &Value, ok: fn(&Value) -> bool, field: &'static str, go: &'static str| {
        if v.is_null() || ok(v) { Ok(()) } else { Err(DecodeError::WrongType { field, found: json_kind(v), go }) }
    };
    let int = |v: &Value| v.as_i64().is_some();
    let string = |v: &Value| v.is_string();
    let boolean = |v: &Value| v.is_boolean();
    let object = |v: &Value| v.is_object();
    let array = |v: &Value| v.is_array();
    want(&slice["metadata"], object, "ResourceSlice.metadata", "v1.ObjectMeta")?;
    want(spec, object, "ResourceSlice.spec", "v1.ResourceSliceSpec")?;
    want(&spec["driver"], string, "ResourceSliceSpec.spec.driver", "string")?;
    want(&spec["nodeName"], string, "ResourceSliceSpec.spec.nodeName", "string")?;
    want(&spec["allNodes"], boolean, "ResourceSliceSpec.spec.allNodes", "bool")?;
    want(&spec["perDeviceNodeSelection"], boolean, "ResourceSliceSpec.spec.perDeviceNodeSelection", "bool")?;
    want(&spec["pool"], object, "ResourceSliceSpec.spec.pool", "v1.ResourcePool")?;
    want(&spec["pool"]["name"], string, "ResourcePool.spec.pool.name", "string")?;
    want(&spec["pool"]["generation"], int, "ResourcePool.spec.pool.generation", "int64")?;
    want(&spec["pool"]["resourceSliceCount"], int, "ResourcePool.spec.pool.resourceSliceCount", "int64")?;
    want(&spec["devices"], array, "ResourceSliceSpec.spec.devices", "[]v1.Device")?;
    want(&spec["sharedCounters"], array, "ResourceSliceSpec.spec.sharedCounters", "[]v1.CounterSet")?;
    let quantity = |v: &Value| -> Result<(), DecodeError> {
        match v {
            Value::Null => Ok(()),
            Value::String(s) if formats::quantity(s).is_some() => Ok(()),
            Value::Number(n) if n.is_i64() || n.is_f64() => Ok(()),
            _ => Err(DecodeError::Quantity),
        }
    };
    let counters = |m: &Value| -> Result<(), DecodeError> {
        for c in m.as_object().into_iter().flat_map(Map::values) {
            quantity(&c["value"])?;
        }
        Ok(())
    };
    for set in spec["sharedCounters"].as_array().into_iter().flatten() {
        counters(&set["counters"])?;
    }
    for d in spec["devices"].as_array().into_iter().flatten() {
        want(d, object, "ResourceSliceSpec.spec.devices", "v1.Device")?;
        want(&d["name"], string, "Device.spec.devices.name", "string")?;
        want(&d["attributes"], object, "Device.spec.devices.attributes", "map[v1.QualifiedName]v1.DeviceAttribute")?;
        want(&d["capacity"], object, "Device.spec.devices.capacity", "map[v1.QualifiedName]v1.DeviceCapacity")?;
        want(&d["taints"], array, "Device.spec.devices.taints", "[]v1.DeviceTaint")?;
        want(&d["allowMultipleAllocations"], boolean, "Device.spec.devices.allowMultipleAllocations", "bool")?;
        for a in d["attributes"].as_object().into_iter().flat_map(Map::values) {
            want(&a["int"], int, "DeviceAttribute.spec.devices.attributes.int", "int64")?;
            want(&a["bool"], boolean, "DeviceAttribute.spec.devices.attributes.bool", "bool")?;
            want(&a["string"], string, "DeviceAttribute.spec.devices.attributes.string", "string")?;
            want(&a["version"], string, "DeviceAttribute.spec.devices.attributes.version", "string")?;
        }
        for c in d["capacity"].as_object().into_iter().flat_map(Map::values) {
            quantity(&c["value"])?;
            let p = &c["requestPolicy"];
            quantity(&p["default"])?;
            for v in p["validValues"].as_array().into_iter().flatten() {
                quantity(v)?;
            }
            for k in ["min", "max", "step"] {
                quantity(&p["validRange"][k])?;
            }
        }
        for c in d["consumesCounters"].as_array().into_iter().flatten() {
            counters(&c["counters"])?;
        }
    }
    Ok(())
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

// ----- metadata -----

/// `ValidateObjectMeta(meta, namespaced=false, NameIsDNSSubdomain)`.
fn object_meta(meta: &Value, errs: &mut Errors) {
    let name = meta["name"].as_str().unwrap_or("");
    let generate = meta["generateName"].as_str().unwrap_or("");
    if !generate.is_empty() {
        // `NameIsDNSSubdomain(prefix, true)`: the prefix without its trailing dash.
        let prefix = generate.strip_suffix('-').unwrap_or(generate);
        errs.each_invalid("metadata.generateName", generate, formats::dns1123_subdomain(prefix));
    }
    if name.is_empty() {
        if generate.is_empty() {
            errs.required("metadata.name", "name or generateName is required");
        }
    } else {
        errs.each_invalid("metadata.name", name, formats::dns1123_subdomain(name));
    }
    if meta.get("namespace").and_then(Value::as_str).is_some_and(|n| !n.is_empty()) {
        errs.forbidden("metadata.namespace", "not allowed on this type");
    }
    for (k, v) in meta["labels"].as_object().into_iter().flatten() {
        errs.each_invalid("metadata.labels", k, formats::qualified_name(k));
        let v = v.as_str().unwrap_or("");
        errs.each_invalid("metadata.labels", v, formats::label_value(v));
    }
    let mut size = 0;
    for (k, v) in meta["annotations"].as_object().into_iter().flatten() {
        errs.each_invalid("metadata.annotations", k, formats::qualified_name(&k.to_lowercase()));
        size += k.len() + v.as_str().map_or(0, str::len);
    }
    if size > 256 * 1024 {
        errs.too_long("metadata.annotations", 256 * 1024);
    }
    // `ValidateOwnerReferences`: its paths have no index.
    let mut first_controller: Option<String> = None;
    for r in meta["ownerReferences"].as_array().into_iter().flatten() {
        let at = "metadata.ownerReferences";
        let text = |k: &str| r[k].as_str().unwrap_or("").to_owned();
        let version = text("apiVersion").rsplit('/').next().unwrap_or("").to_owned();
        if version.is_empty() {
            errs.invalid_str(&format!("{at}.apiVersion"), &text("apiVersion"), "version must not be empty");
        }
        for k in ["kind", "name", "uid"] {
            if text(k).is_empty() {
                errs.invalid_str(&format!("{at}.{k}"), "", "must not be empty");
            }
        }
        if r["controller"] == true {
            let name = format!("{}/{}", text("kind"), text("name"));
            match &first_controller {
                Some(first) => errs.invalid_raw(
                    at,
                    meta["ownerReferences"].to_string(),
                    format!("Only one reference can have Controller set to true. Found \"true\" in references for {first} and {name}"),
                ),
                None => first_controller = Some(name),
            }
        }
    }
}

// ----- spec -----

fn spec(spec: &Value, old: Option<&Value>, errs: &mut Errors) {
    driver_name(spec["driver"].as_str().unwrap_or(""), "spec.driver", errs);
    pool(&spec["pool"], errs);
    if let Some(old) = old {
        for (path, new, was) in [
            ("spec.pool.name", &spec["pool"]["name"], &old["pool"]["name"]),
            ("spec.driver", &spec["driver"], &old["driver"]),
            ("spec.nodeName", &spec["nodeName"], &old["nodeName"]),
        ] {
            if new != was {
                errs.invalid_json(path, new, "field is immutable");
            }
        }
    }
    let mut set = Vec::new();
    match spec.get("nodeName").and_then(Value::as_str) {
        Some("") => errs.invalid_str("spec.nodeName", "", "must be either unset or set to a non-empty string"),
        Some(n) => {
            set.push("`nodeName`");
            node_name(n, "spec.nodeName", errs);
        }
        None => {}
    }
    if let Some(sel) = spec.get("nodeSelector").filter(|v| !v.is_null()) {
        set.push("`nodeSelector`");
        let terms = sel["nodeSelectorTerms"].as_array().map_or(0, Vec::len);
        if terms != 1 {
            errs.invalid_raw(
                "spec.nodeSelector.nodeSelectorTerms",
                go_terms(&sel["nodeSelectorTerms"]),
                "must have exactly one node selector term",
            );
        }
    }
    for (field, word) in [("allNodes", "`allNodes`"), ("perDeviceNodeSelection", "`perDeviceNodeSelection`")] {
        match spec.get(field).and_then(Value::as_bool) {
            Some(true) => set.push(word),
            Some(false) => {
                errs.invalid_raw(&format!("spec.{field}"), "false".into(), "must be either unset or set to true")
            }
            None => {}
        }
    }
    match set.len() {
        0 => errs.required(
            "spec",
            "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required",
        ),
        1 => {}
        _ => errs.invalid_str(
            "spec",
            &format!("{{{}}}", set.join(", ")),
            "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required, but multiple fields are set",
        ),
    }
    let present = |v: &Value| !v.is_null();
    if present(&spec["sharedCounters"]) && present(&spec["devices"]) {
        errs.invalid_str("spec", "", "only one of `sharedCounters` or `devices` is allowed");
    }
    let devices = spec["devices"].as_array().map(Vec::as_slice).unwrap_or_default();
    let advanced = devices.iter().any(|d| {
        d["taints"].as_array().is_some_and(|t| !t.is_empty())
            || d["consumesCounters"].as_array().is_some_and(|c| !c.is_empty())
            || d["attributes"]
                .as_object()
                .into_iter()
                .flat_map(Map::values)
                .any(|a| ["bools", "ints", "strings", "versions"].iter().any(|k| !a[*k].is_null()))
    });
    let max = if advanced { MAX_DEVICES_ADVANCED } else { MAX_DEVICES };
    let per_device = spec["perDeviceNodeSelection"] == true;
    set_of(
        devices,
        max,
        "spec.devices",
        errs,
        |d| d["name"].as_str().unwrap_or("").to_owned(),
        |d, at, errs| {
            let old_device = old.and_then(|o| {
                o["devices"].as_array().into_iter().flatten().find(|od| od["name"] == d["name"] && !d["name"].is_null())
            });
            device(d, old_device, at, per_device, errs);
        },
    );
    let sets = spec["sharedCounters"].as_array().map(Vec::as_slice).unwrap_or_default();
    set_of(
        sets,
        MAX_COUNTER_SETS,
        "spec.sharedCounters",
        errs,
        |s| s["name"].as_str().unwrap_or("").to_owned(),
        counter_set,
    );
}

/// Node selector terms as `json.Marshal` prints the internal `core.NodeSelectorTerm` (Go field
/// names, nulls for empty lists).
fn go_terms(terms: &Value) -> String {
    let requirements = |v: &Value| -> Value {
        match v.as_array() {
            Some(list) if !list.is_empty() => Value::Array(
                list.iter()
                    .map(|r| {
                        let values = r["values"]
                            .as_array()
                            .filter(|v| !v.is_empty())
                            .map_or(Value::Null, |v| Value::Array(v.clone()));
                        serde_json::json!({ "Key": r["key"], "Operator": r["operator"], "Values": values })
                    })
                    .collect(),
            ),
            _ => Value::Null,
        }
    };
    let shown: Vec<String> = terms
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            // Field order as Go prints it (serde_json sorts object keys).
            format!(
                "{{\"MatchExpressions\":{},\"MatchFields\":{}}}",
                go_requirements(&requirements(&t["matchExpressions"])),
                go_requirements(&requirements(&t["matchFields"]))
            )
        })
        .collect();
    format!("[{}]", shown.join(","))
}

fn go_requirements(v: &Value) -> String {
    match v.as_array() {
        None => "null".into(),
        Some(list) => {
            let items: Vec<String> = list
                .iter()
                .map(|r| format!("{{\"Key\":{},\"Operator\":{},\"Values\":{}}}", r["Key"], r["Operator"], r["Values"]))
                .collect();
            format!("[{}]", items.join(","))
        }
    }
}

/// `validateSet`: too many items stops there; then each item; then duplicates by key.
fn set_of(
    items: &[Value],
    max: usize,
    path: &str,
    errs: &mut Errors,
    key: impl Fn(&Value) -> String,
    mut each: impl FnMut(&Value, &str, &mut Errors),
) {
    if items.len() > max {
        errs.too_many(path, items.len(), max);
        return;
    }
    for (i, item) in items.iter().enumerate() {
        each(item, &format!("{path}[{i}]"), errs);
    }
    let mut seen = HashSet::new();
    for (i, item) in items.iter().enumerate() {
        let k = key(item);
        if !seen.insert(k.clone()) {
            errs.duplicate(&format!("{path}[{i}]"), &k);
        }
    }
}

/// `ValidateCSIDriverName`.
fn driver_name(name: &str, path: &str, errs: &mut Errors) {
    if name.is_empty() {
        errs.required(path, "");
        return;
    }
    if name.len() > DRIVER_MAX {
        errs.too_long(path, DRIVER_MAX);
    }
    errs.each_invalid(path, name, formats::dns1123_subdomain(&name.to_lowercase()));
}

/// `ValidateNodeName(name, prefix=false)`: a DNS subdomain.
fn node_name(name: &str, path: &str, errs: &mut Errors) {
    errs.each_invalid(path, name, formats::dns1123_subdomain(name));
}

fn pool(pool: &Value, errs: &mut Errors) {
    let name = pool["name"].as_str().unwrap_or("");
    if name.is_empty() {
        errs.required("spec.pool.name", "");
    } else {
        if name.len() > formats::DNS1123_SUBDOMAIN_MAX {
            errs.too_long("spec.pool.name", formats::DNS1123_SUBDOMAIN_MAX);
        }
        for part in name.split('/') {
            errs.each_invalid("spec.pool.name", part, formats::dns1123_subdomain(part));
        }
    }
    let count = pool["resourceSliceCount"].as_i64().unwrap_or(0);
    if count <= 0 {
        errs.invalid_raw("spec.pool.resourceSliceCount", count.to_string(), "must be greater than zero");
    }
    let generation = pool["generation"].as_i64().unwrap_or(0);
    if generation < 0 {
        errs.invalid_raw("spec.pool.generation", generation.to_string(), "must be greater than or equal to zero");
    }
}

fn counter_name(name: &str, path: &str, errs: &mut Errors) {
    errs.each_invalid(path, name, formats::dns1123_label(name));
}

fn counter_set(set: &Value, at: &str, errs: &mut Errors) {
    let name = set["name"].as_str().unwrap_or("");
    if name.is_empty() {
        errs.required(&format!("{at}.name"), "");
    } else {
        counter_name(name, &format!("{at}.name"), errs);
    }
    counters_map(&set["counters"], MAX_COUNTERS_PER_SET, &format!("{at}.counters"), errs);
}

fn counters_map(m: &Value, max: usize, path: &str, errs: &mut Errors) {
    let map = m.as_object().filter(|m| !m.is_empty());
    let Some(map) = map else {
        errs.required(path, "");
        return;
    };
    if map.len() > max {
        errs.too_many(path, map.len(), max);
        return;
    }
    for k in map.keys() {
        counter_name(k, path, errs);
    }
}

fn key_path(path: &str, key: &str) -> String {
    let max = KEY_PATH_MAX.max(16);
    let shown = if key.len() <= max {
        key.to_owned()
    } else {
        let remaining = max - 3;
        let (head, tail) = (remaining.div_ceil(2), remaining / 2);
        let bytes = key.as_bytes();
        format!(
            "{}...{}",
            String::from_utf8_lossy(&bytes[..head]),
            String::from_utf8_lossy(&bytes[bytes.len() - tail..])
        )
    };
    format!("{path}[{shown}]")
}

fn device(d: &Value, old: Option<&Value>, at: &str, per_device_node_selection: bool, errs: &mut Errors) {
    let multiple = d["allowMultipleAllocations"] == true;
    let name = d["name"].as_str().unwrap_or("");
    errs.each_invalid(&format!("{at}.name"), name, formats::dns1123_label(name));
    let attributes = d["attributes"].as_object();
    let capacity = d["capacity"].as_object();
    let total = attributes.map_or(0, Map::len) + capacity.map_or(0, Map::len);
    if total > MAX_ATTRIBUTES_AND_CAPACITIES {
        errs.invalid_raw(
            at,
            total.to_string(),
            format!("the total number of attributes and capacities must not exceed {MAX_ATTRIBUTES_AND_CAPACITIES}"),
        );
    }
    let values: usize = attributes
        .into_iter()
        .flat_map(Map::values)
        .map(|a| {
            let lists: usize =
                ["bools", "ints", "strings", "versions"].iter().map(|k| a[*k].as_array().map_or(0, Vec::len)).sum();
            lists.max(1)
        })
        .sum();
    if values > MAX_ATTRIBUTE_VALUES {
        errs.invalid_raw(
            at,
            values.to_string(),
            format!("the total number of attribute values must not exceed {MAX_ATTRIBUTE_VALUES}"),
        );
    }
    let attrs_path = format!("{at}.attributes");
    for (k, a) in attributes.into_iter().flatten() {
        qualified_name(k, &attrs_path, errs);
        attribute(a, &key_path(&attrs_path, k), errs);
    }
    let cap_path = format!("{at}.capacity");
    for (k, c) in capacity.into_iter().flatten() {
        qualified_name(k, &cap_path, errs);
        let p = &c["requestPolicy"];
        if !p.is_null() {
            let policy_path = format!("{}.requestPolicy", key_path(&cap_path, k));
            if multiple {
                request_policy(&c["value"], p, &policy_path, errs);
            } else {
                errs.forbidden(&policy_path, "allowMultipleAllocations must be true");
            }
        }
    }
    let taints = d["taints"].as_array().map(Vec::as_slice).unwrap_or_default();
    let unchanged = old.is_some_and(|o| o["taints"] == d["taints"]);
    if !unchanged {
        if taints.len() > MAX_TAINTS {
            errs.too_many(&format!("{at}.taints"), taints.len(), MAX_TAINTS);
        } else {
            for (i, t) in taints.iter().enumerate() {
                taint(t, &format!("{at}.taints[{i}]"), errs);
            }
        }
    }
    let consumptions = d["consumesCounters"].as_array().map(Vec::as_slice).unwrap_or_default();
    set_of(
        consumptions,
        MAX_CONSUMPTIONS,
        &format!("{at}.consumesCounters"),
        errs,
        |c| c["counterSet"].as_str().unwrap_or("").to_owned(),
        |c, at, errs| {
            let set = c["counterSet"].as_str().unwrap_or("");
            if set.is_empty() {
                errs.required(&format!("{at}.counterSet"), "");
            } else {
                counter_name(set, &format!("{at}.counterSet"), errs);
            }
            counters_map(&c["counters"], MAX_COUNTERS_PER_CONSUMPTION, &format!("{at}.counters"), errs);
        },
    );
    let node_name_set = d.get("nodeName").is_some_and(|v| !v.is_null());
    let selector_set = d.get("nodeSelector").is_some_and(|v| !v.is_null());
    let all_set = d.get("allNodes").is_some_and(|v| !v.is_null());
    if per_device_node_selection {
        let mut set = Vec::new();
        if node_name_set {
            match d["nodeName"].as_str().unwrap_or("") {
                "" => errs.invalid_str(&format!("{at}.nodeName"), "", "must not be empty"),
                n => {
                    set.push("`nodeName`");
                    node_name(n, &format!("{at}.nodeName"), errs);
                }
            }
        }
        if selector_set {
            set.push("`nodeSelector`");
        }
        if all_set {
            if d["allNodes"] == true {
                set.push("`allNodes`");
            } else {
                errs.invalid_raw(&format!("{at}.allNodes"), "false".into(), "must be either unset or set to true");
            }
        }
        const WHY: &str = "exactly one of `nodeName`, `nodeSelector`, or `allNodes` is required when `perDeviceNodeSelection` is set to true in the ResourceSlice spec";
        match set.len() {
            0 => errs.required(at, WHY),
            1 => {}
            _ => errs.invalid_str(at, &format!("{{{}}}", set.join(", ")), WHY),
        }
    } else if node_name_set || selector_set || all_set {
        errs.invalid_raw(
            at,
            "null".into(),
            "`nodeName`, `nodeSelector` and `allNodes` can only be set if `perDeviceNodeSelection` is set to true in the ResourceSlice spec",
        );
    }
    binding_conditions(d, at, errs);
}

/// `validateQualifiedName`: a C identifier, or a driver-name domain, `/` and a C identifier.
fn qualified_name(name: &str, path: &str, errs: &mut Errors) {
    let parts: Vec<&str> = name.split('/').collect();
    let id = |id: &str, errs: &mut Errors| {
        if id.len() > DEVICE_MAX_ID {
            errs.too_long(path, DEVICE_MAX_ID);
        }
        errs.each_invalid(path, id, formats::c_identifier(id));
    };
    match parts.as_slice() {
        [one] => id(one, errs),
        [domain, rest, ..] => {
            if domain.is_empty() {
                errs.invalid_str(path, "", "the domain must not be empty");
            } else {
                driver_name(domain, path, errs);
            }
            if rest.is_empty() {
                errs.invalid_str(path, "", "the name must not be empty");
            } else {
                id(rest, errs);
            }
        }
        [] => {}
    }
}

fn attribute(a: &Value, path: &str, errs: &mut Errors) {
    let mut fields = 0;
    for k in ["bool", "int"] {
        if !a[k].is_null() {
            fields += 1;
        }
    }
    if let Some(s) = a["string"].as_str() {
        fields += 1;
        if s.len() > MAX_VALUE_LENGTH {
            errs.too_long(&format!("{path}.string"), MAX_VALUE_LENGTH);
        }
    }
    if let Some(v) = a["version"].as_str() {
        fields += 1;
        version(v, &format!("{path}.version"), errs);
    }
    for (k, check) in [("bools", 0), ("ints", 0), ("strings", 1), ("versions", 2)] {
        let Some(list) = a.get(k).filter(|v| !v.is_null()) else { continue };
        fields += 1;
        let items = list.as_array().map(Vec::as_slice).unwrap_or_default();
        if items.is_empty() {
            errs.invalid_json(&format!("{path}.{k}"), list, "must not be empty if specified");
        }
        for (i, item) in items.iter().enumerate() {
            let s = item.as_str().unwrap_or("");
            match check {
                1 if s.len() > MAX_VALUE_LENGTH => errs.too_long(&format!("{path}.{k}[{i}]"), MAX_VALUE_LENGTH),
                2 => version(s, &format!("{path}.{k}[{i}]"), errs),
                _ => {}
            }
        }
    }
    match fields {
        0 => errs.invalid_str(path, "", "exactly one value must be specified"),
        1 => {}
        _ => errs.invalid_raw(path, go_attribute(a), "exactly one value must be specified"),
    }
}

/// The internal `DeviceAttribute` struct as `json.Marshal` prints it (Go field names, nulls).
fn go_attribute(a: &Value) -> String {
    let pick = |k: &str| if a[k].is_null() { Value::Null } else { a[k].clone() };
    let mut out = String::from("{");
    for (i, (go, k)) in [
        ("IntValue", "int"),
        ("BoolValue", "bool"),
        ("StringValue", "string"),
        ("VersionValue", "version"),
        ("IntValues", "ints"),
        ("BoolValues", "bools"),
        ("StringValues", "strings"),
        ("VersionValues", "versions"),
    ]
    .iter()
    .enumerate()
    {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&format!("\"{go}\":{}", pick(k)));
    }
    out.push('}');
    out
}

fn version(v: &str, path: &str, errs: &mut Errors) {
    if !formats::semver(v) {
        errs.invalid_str(path, v, "must be a string compatible with semver.org spec 2.0.0");
    }
    if v.len() > MAX_VALUE_LENGTH {
        errs.too_long(path, MAX_VALUE_LENGTH);
    }
}

fn q(v: &Value) -> i128 {
    match v {
        Value::String(s) => formats::quantity(s).unwrap_or(0),
        Value::Number(n) => n.as_f64().map_or(0, |f| (f * 1e9) as i128),
        _ => 0,
    }
}

fn shown(v: &Value) -> String {
    v.as_str().map(str::to_owned).unwrap_or_else(|| v.to_string())
}

fn request_policy(capacity: &Value, p: &Value, path: &str, errs: &mut Errors) {
    let values = p["validValues"].as_array().map(Vec::as_slice).unwrap_or_default();
    let range = &p["validRange"];
    if !values.is_empty() && !range.is_null() {
        errs.forbidden(
            path,
            "exactly one policy can be specified, cannot specify \"validValues\" and \"validRange\" at the same time",
        );
        return;
    }
    let max = q(capacity);
    let default = &p["default"];
    if !values.is_empty() {
        if default.is_null() {
            errs.required(&format!("{path}.default"), "required when validValues is defined");
            return;
        }
        let vpath = format!("{path}.validValues");
        for i in 0..values.len().saturating_sub(1) {
            if q(&values[i]) > q(&values[i + 1]) {
                errs.invalid_str(
                    &format!("{vpath}[{}]", i + 1),
                    &shown(&values[i + 1]),
                    "values must be sorted in ascending order",
                );
            }
        }
        if values.len() > DISCRETE_MAX_OPTIONS {
            errs.too_many(&vpath, values.len(), DISCRETE_MAX_OPTIONS);
        } else {
            let mut found = false;
            let mut seen = HashSet::new();
            for (i, v) in values.iter().enumerate() {
                if q(v) > max {
                    errs.invalid_str(
                        &format!("{vpath}[{i}]"),
                        &shown(v),
                        format!("option is larger than capacity value: {}", shown(capacity)),
                    );
                }
                if q(v) == q(default) {
                    found = true;
                }
                if !seen.insert(q(v) / 1_000_000_000) {
                    errs.duplicate(&format!("{vpath}[{i}]"), &(q(v) / 1_000_000_000).to_string());
                }
            }
            if !found {
                errs.invalid_str(&vpath, &shown(default), "default value is not valid according to the requestPolicy");
            }
        }
    } else if !range.is_null() {
        if default.is_null() {
            errs.required(&format!("{path}.default"), "required when validRange is defined");
            return;
        }
        let rpath = format!("{path}.validRange");
        let min = &range["min"];
        if min.is_null() {
            errs.required(&format!("{rpath}.min"), "required when validRange is defined");
            return;
        }
        if q(min) > max {
            errs.invalid_str(
                &format!("{rpath}.min"),
                &shown(min),
                format!("min is larger than capacity value: {}", shown(capacity)),
            );
        }
        if q(default) < q(min) {
            errs.invalid_str(
                &format!("{rpath}.min"),
                &shown(default),
                format!("default is less than min: {}", shown(min)),
            );
        }
        let top = &range["max"];
        if !top.is_null() {
            if q(min) > q(top) {
                errs.invalid_str(
                    &format!("{rpath}.max"),
                    &shown(min),
                    format!("min is larger than max: {}", shown(top)),
                );
            }
            if q(top) > max {
                errs.invalid_str(
                    &format!("{rpath}.max"),
                    &shown(top),
                    format!("max is larger than capacity value: {}", shown(capacity)),
                );
            }
            if q(default) > q(top) {
                errs.invalid_str(
                    &format!("{rpath}.max"),
                    &shown(default),
                    format!("default is more than max: {}", shown(top)),
                );
            }
        }
        let step = &range["step"];
        if !step.is_null() {
            let (s, m) = (q(step), q(min));
            if m + s > max {
                errs.invalid_str(
                    &format!("{rpath}.step"),
                    &shown(step),
                    format!("one step is larger than capacity value: {}", shown(capacity)),
                );
            }
            // `Quantity.Value()`: whole units, rounded up.
            let units = |n: i128| if n % 1_000_000_000 == 0 { n / 1_000_000_000 } else { n / 1_000_000_000 + 1 };
            let multiple = |v: &Value| {
                let step_units = units(s);
                step_units != 0 && (units(q(v)) - units(m)) % step_units != 0
            };
            let why = format!("value is not a multiple of a given step ({}) from ({})", shown(step), shown(min));
            if multiple(default) {
                errs.invalid_str(&format!("{rpath}.step"), &shown(default), why.clone());
            }
            if !top.is_null() && multiple(top) {
                errs.invalid_str(&format!("{rpath}.step"), &shown(top), why);
            }
        }
    }
}

fn taint(t: &Value, at: &str, errs: &mut Errors) {
    let key = t["key"].as_str().unwrap_or("");
    label_name(key, &format!("{at}.key"), errs);
    let value = t["value"].as_str().unwrap_or("");
    if !value.is_empty() {
        errs.each_invalid(&format!("{at}.value"), value, formats::label_value(value));
    }
    match t["effect"].as_str().unwrap_or("") {
        "" => errs.required(&format!("{at}.effect"), ""),
        e if !TAINT_EFFECTS.contains(&e) => errs.not_supported(&format!("{at}.effect"), e, &TAINT_EFFECTS),
        _ => {}
    }
}

/// `metav1validation.ValidateLabelName`.
fn label_name(name: &str, path: &str, errs: &mut Errors) {
    errs.each_invalid(path, name, formats::qualified_name(name));
}

fn binding_conditions(d: &Value, at: &str, errs: &mut Errors) {
    let strings = |k: &str| -> Vec<String> {
        d[k].as_array().into_iter().flatten().map(|v| v.as_str().unwrap_or("").to_owned()).collect()
    };
    let conditions = strings("bindingConditions");
    let failures = strings("bindingFailureConditions");
    for (k, list) in [("bindingConditions", &conditions), ("bindingFailureConditions", &failures)] {
        let path = format!("{at}.{k}");
        if list.len() > MAX_BINDING_CONDITIONS {
            errs.too_many(&path, list.len(), MAX_BINDING_CONDITIONS);
        } else {
            for (i, c) in list.iter().enumerate() {
                label_name(c, &format!("{path}[{i}]"), errs);
            }
        }
    }
    let mut seen = HashSet::new();
    for (i, c) in conditions.iter().enumerate() {
        if !seen.insert(c) {
            errs.duplicate(&format!("{at}.bindingConditions[{i}]"), c);
        }
    }
    let mut seen_failures = HashSet::new();
    for (i, c) in failures.iter().enumerate() {
        if !seen_failures.insert(c) {
            errs.duplicate(&format!("{at}.bindingFailureConditions[{i}]"), c);
        }
        if conditions.contains(c) {
            errs.invalid_str(
                &format!("{at}.bindingFailureConditions[{i}]"),
                c,
                "bindingFailureConditions must not overlap with bindingConditions",
            );
        }
    }
    if conditions.is_empty() && !failures.is_empty() {
        errs.invalid_raw(
            &format!("{at}.bindingConditions"),
            "null".into(),
            "bindingConditions are required to use bindingFailureConditions",
        );
    }
    if failures.is_empty() && !conditions.is_empty() {
        errs.invalid_raw(
            &format!("{at}.bindingFailureConditions"),
            "null".into(),
            "bindingFailureConditions are required to use bindingConditions",
        );
    }
}
