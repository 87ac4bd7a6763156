//! The DeviceClass for a resource served through DRA: it selects the resource's devices of its
//! driver (CEL on the `resource` attribute every devplug device carries) and names the
//! resource as its `extendedResourceName` (KEP-5004), so a pod that asks `devplug.io/fuse: 1`
//! keeps working after the resource moves from the Device Plugin API to DRA.

use serde_json::{Value, json};

/// The class's name: `vendor.io/class` → `class.vendor.io` (a DNS subdomain, as the API wants).
pub fn class_name(resource: &str) -> String {
    let (vendor, class) = resource.split_once('/').unwrap_or(("devplug.io", resource));
    let name = format!("{class}.{vendor}").to_ascii_lowercase();
    let name: String = name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '.' { c } else { '-' }).collect();
    name.split('.').map(|l| l.trim_matches('-')).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(".")
}

/// The DeviceClass of `resource`, served by `driver`.
pub fn device_class(resource: &str, driver: &str) -> Value {
    // Attribute names without a domain are the driver's: `device.attributes[DRIVER].resource`.
    let expression = format!("device.driver == {driver:?} && device.attributes[{driver:?}].resource == {resource:?}");
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {
            "name": class_name(resource),
            "labels": { super::api::MANAGED_BY.0: super::api::MANAGED_BY.1 },
        },
        "spec": {
            "selectors": [{ "cel": { "expression": expression } }],
            "extendedResourceName": resource,
        },
    })
}

/// Several classes as one `v1` List, which `kubectl apply -f -` takes.
pub fn list(classes: Vec<Value>) -> Value {
    json!({ "apiVersion": "v1", "kind": "List", "items": classes })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_names_are_subdomains_and_the_class_selects_by_driver_and_resource() {
        assert_eq!(class_name("devplug.io/fuse"), "fuse.devplug.io");
        assert_eq!(class_name("nvidia.com/mig-1g.10gb"), "mig-1g.10gb.nvidia.com");
        assert_eq!(class_name("Acme.io/Big_Thing"), "big-thing.acme.io");
        for r in ["devplug.io/fuse", "nvidia.com/mig-1g.10gb", "x.io/-a_"] {
            assert!(super::super::slice_rules::subdomain_problem(&class_name(r)).is_none(), "{r}");
        }
        let c = device_class("devplug.io/fuse", "generic.devplug.io");
        assert_eq!(c["spec"]["extendedResourceName"], "devplug.io/fuse");
        assert_eq!(
            c["spec"]["selectors"][0]["cel"]["expression"],
            "device.driver == \"generic.devplug.io\" && device.attributes[\"generic.devplug.io\"].resource == \"devplug.io/fuse\""
        );
    }
}
