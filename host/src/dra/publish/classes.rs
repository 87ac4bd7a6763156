//! The DeviceClass for a resource served through DRA: it selects the resource's devices of its
//! driver (CEL on the `resource` attribute every devplug device carries) and names the
//! resource as its `extendedResourceName` (KEP-5004), so a pod that asks `devplug.io/fuse: 1`
//! keeps working after the resource moves from the Device Plugin API to DRA.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{CELDeviceSelector, DeviceClass, DeviceClassSpec, DeviceSelector};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Value, json};

/// Where every class devplug names lives: DeviceClasses are cluster-wide, and a vendor's own DRA
/// driver installs classes named after its domain (`gpu.nvidia.com`, `gpu.intel.com`), so
/// devplug's must never take one of those names.
pub(crate) const CLASS_DOMAIN: &str = "devplug.io";

/// The class's name: `vendor.io/class` → `class.vendor.io.devplug.io` (`devplug.io/fuse` →
/// `fuse.devplug.io`): a DNS subdomain, as the API wants, always in [`CLASS_DOMAIN`], so never
/// a vendor driver's class (`nvidia.com/gpu` is `gpu.nvidia.com.devplug.io`, not NVIDIA's
/// `gpu.nvidia.com`). Stable: the same resource always gets the same name.
pub fn class_name(resource: &str) -> String {
    let (vendor, class) = resource.split_once('/').unwrap_or((CLASS_DOMAIN, resource));
    let name = format!("{class}.{vendor}").to_ascii_lowercase();
    let name: String = name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '.' { c } else { '-' }).collect();
    let name = name
        .split('.')
        .map(|l| l.trim_matches('-').chars().take(63).collect::<String>())
        .map(|l| l.trim_matches('-').to_owned())
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(".");
    let ours = name == CLASS_DOMAIN || name.ends_with(&format!(".{CLASS_DOMAIN}"));
    let name = if ours { name } else { format!("{name}.{CLASS_DOMAIN}") };
    if name.len() <= 253 {
        return name;
    }
    // Too long for a subdomain: the class part and a hash of the whole resource name.
    use sha2::{Digest, Sha256};
    let hash = hex::encode(&Sha256::digest(resource.as_bytes())[..4]);
    let label: String = name.split('.').next().unwrap_or("class").chars().take(40).collect();
    format!("{}-{hash}.{CLASS_DOMAIN}", label.trim_matches('-'))
}

/// The name devplug 0.2 gave `resource`'s class (`class.vendor.io`), for the migration note.
pub(crate) fn class_name_before_0_3(resource: &str) -> String {
    let (vendor, class) = resource.split_once('/').unwrap_or((CLASS_DOMAIN, resource));
    let name = format!("{class}.{vendor}").to_ascii_lowercase();
    let name: String = name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '.' { c } else { '-' }).collect();
    name.split('.').map(|l| l.trim_matches('-')).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(".")
}

/// The DeviceClass of `resource`, served by `driver`.
pub fn device_class(resource: &str, driver: &str) -> DeviceClass {
    // Attribute names without a domain are the driver's: `device.attributes[DRIVER].resource`.
    let expression = format!("device.driver == {driver:?} && device.attributes[{driver:?}].resource == {resource:?}");
    DeviceClass {
        metadata: ObjectMeta {
            name: Some(class_name(resource)),
            labels: Some(BTreeMap::from([(
                super::writer::MANAGED_BY.0.to_owned(),
                super::writer::MANAGED_BY.1.to_owned(),
            )])),
            ..Default::default()
        },
        spec: DeviceClassSpec {
            selectors: Some(vec![DeviceSelector { cel: Some(CELDeviceSelector { expression }) }]),
            extended_resource_name: Some(resource.to_owned()),
            ..Default::default()
        },
    }
}

/// Several objects (classes, slices) as one `v1` List, which `kubectl apply -f -` takes.
pub fn list(items: Vec<Value>) -> Value {
    json!({ "apiVersion": "v1", "kind": "List", "items": items })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_names_are_subdomains_and_the_class_selects_by_driver_and_resource() {
        assert_eq!(class_name("devplug.io/fuse"), "fuse.devplug.io");
        assert_eq!(class_name("nvidia.com/mig-1g.10gb"), "mig-1g.10gb.nvidia.com.devplug.io");
        assert_eq!(class_name("Acme.io/Big_Thing"), "big-thing.acme.io.devplug.io");
        assert_eq!(class_name("gpu.devplug.io/x"), "x.gpu.devplug.io");
        let long = format!("{}.io/{}", "v".repeat(250), "c".repeat(63));
        for r in ["devplug.io/fuse", "nvidia.com/mig-1g.10gb", "x.io/-a_", long.as_str()] {
            let name = class_name(r);
            assert!(super::super::rules::subdomain_problem(&name).is_none(), "{r}: {name}");
            assert!(name.ends_with(".devplug.io"), "{name}");
        }
        let c = serde_json::to_value(device_class("devplug.io/fuse", "generic.devplug.io")).unwrap();
        assert_eq!((c["apiVersion"].as_str(), c["kind"].as_str()), (Some("resource.k8s.io/v1"), Some("DeviceClass")));
        assert_eq!(c["spec"]["extendedResourceName"], "devplug.io/fuse");
        assert_eq!(
            c["spec"]["selectors"][0]["cel"]["expression"],
            "device.driver == \"generic.devplug.io\" && device.attributes[\"generic.devplug.io\"].resource == \"devplug.io/fuse\""
        );
    }

    /// DeviceClasses are cluster-wide: no name devplug gives a first-party resource equals one
    /// NVIDIA's, Intel's or AMD's own DRA driver installs (k8s-dra-driver-gpu: `gpu.nvidia.com`,
    /// `mig.nvidia.com`, `compute-domain-daemon.nvidia.com`,
    /// `compute-domain-default-channel.nvidia.com`; intel-resource-drivers-for-kubernetes:
    /// `gpu.intel.com`, `gaudi.intel.com`, `qat.intel.com`; AMD: `gpu.amd.com`), though 0.2's did.
    #[test]
    fn no_class_name_is_a_vendor_drivers() {
        let vendor = [
            "gpu.nvidia.com",
            "mig.nvidia.com",
            "compute-domain-daemon.nvidia.com",
            "compute-domain-default-channel.nvidia.com",
            "gpu.intel.com",
            "gaudi.intel.com",
            "qat.intel.com",
            "gpu.amd.com",
        ];
        let ours = [
            "nvidia.com/gpu",
            "nvidia.com/mig",
            "nvidia.com/mig-1g.10gb",
            "gpu.intel.com/i915",
            "gpu.intel.com/xe",
            "intel.com/gpu",
            "habana.ai/gaudi",
            "intel.com/gaudi",
            "amd.com/gpu",
            "devplug.io/fuse",
        ];
        assert!(vendor.contains(&class_name_before_0_3("nvidia.com/gpu").as_str()), "0.2 collided");
        for r in ours {
            let name = class_name(r);
            assert!(!vendor.contains(&name.as_str()), "{r} → {name}");
        }
    }
}
