//! A backend's devices as the ResourceSlices of one pool: what devplug will publish for a
//! resource served through DRA. Device IDs become DNS labels (a PCI address such as
//! `0000:07:00.0` is not one), stably and distinctly, with the way back kept in [`Pool::ids`];
//! attributes are typed strings (what a WIT 0.1/0.2 backend says), plus the device-plugin
//! resource name and NUMA node; an Unhealthy device carries a `NoSchedule` taint with the reason.
//! Every slice is checked with [`super::rules`] before it is handed out: one bad device
//! refuses the whole pool, naming backend, device and field, so a pool is never half-published.
//!
//! A pool is built once per change of its device lists (see `dra::served`), at no generation:
//! the writer stamps the generation when it writes, and compares what the server holds by the
//! [`SPEC_HASH`] each slice carries, computed here once. Slices are k8s-openapi's typed objects
//! from here to the wire; the rules judge each as the JSON the server will read.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    Counter, CounterSet as ApiCounterSet, Device as ApiDevice, DeviceAttribute, DeviceCapacity,
    DeviceCounterConsumption, DeviceTaint, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::rules;
use crate::dra::pool_id::PoolId;
use crate::model::dra::{AttributeValue, CounterSet, attribute_name};
use crate::model::{Device, Health, Resource};

/// A counter set's (or a device's draw on one) amounts as the API writes them.
fn counters(set: &CounterSet) -> BTreeMap<String, Counter> {
    set.counters.iter().map(|(k, q)| (k.clone(), Counter { value: Quantity(q.clone()) })).collect()
}

/// An attribute of each type the host publishes.
pub fn text(s: &str) -> DeviceAttribute {
    DeviceAttribute { string: Some(s.to_owned()), ..Default::default() }
}

pub fn int(i: i64) -> DeviceAttribute {
    DeviceAttribute { int: Some(i), ..Default::default() }
}

/// Bytes of device JSON one pool may publish, all its slices together: a backend's answers are
/// capped at 8 MiB each (`runtime::vet`), and what devplug builds and writes to the API server
/// from them is capped the same way, so one backend cannot make the host hold, hash and send
/// tens of megabytes per sync.
pub(crate) const MAX_POOL_BYTES: usize = 8 << 20;

/// How many bytes `v` is as JSON, without building the text.
fn json_len(v: &impl serde::Serialize) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    let _ = serde_json::to_writer(&mut c, v);
    c.0
}

/// The taint an Unhealthy device carries.
pub(crate) const UNHEALTHY_TAINT: &str = "devplug.io/unhealthy";

/// The annotation with the SHA-256 of the spec devplug built for a slice (generation left out).
pub(crate) const SPEC_HASH: &str = "devplug.io/spec-sha256";

/// The hash [`SPEC_HASH`] carries for `slice`: its spec as devplug serialises it, at generation 0.
pub(crate) fn spec_hash(slice: &ResourceSlice) -> String {
    use sha2::{Digest, Sha256};
    let mut spec = slice.spec.clone();
    spec.pool.generation = 0;
    hex::encode(Sha256::digest(serde_json::to_vec(&spec).unwrap_or_default()))
}

/// A pool ready to publish: by name, its slices at generation 0 with their [`SPEC_HASH`]es,
/// and by device name the device and resource each name stands for (the way back from what
/// the scheduler allocated).
#[derive(Debug)]
pub struct Pool {
    pub slices: BTreeMap<String, (ResourceSlice, String)>,
    pub ids: BTreeMap<String, (String, String)>,
}

impl Pool {
    /// The slices as written at `generation`, in the writer's order.
    pub fn at(&self, generation: i64) -> Vec<ResourceSlice> {
        let mut slices: Vec<ResourceSlice> = self.slices.values().map(|(s, _)| s.clone()).collect();
        for s in &mut slices {
            s.spec.pool.generation = generation;
        }
        slices
    }
}

/// Why a pool was not built: the backend, device and field, and what the API server's rule says.
#[derive(Debug, thiserror::Error)]
#[error("backend {backend}, device {device:?}: {field}: {message}")]
pub struct PoolError {
    pub backend: String,
    pub device: String,
    pub field: String,
    pub message: String,
}

/// Device ID → a lowercase RFC 1123 label: the ID itself when it is one, otherwise its letters
/// and digits lowercased with everything else as `-`, and a short hash of the ID so two IDs
/// never share a name.
pub fn device_name(id: &str) -> String {
    if rules::label_problem(id).is_none() {
        return id.to_owned();
    }
    let mut base: String =
        id.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).collect();
    while base.contains("--") {
        base = base.replace("--", "-");
    }
    let base = base.trim_matches('-');
    use sha2::{Digest, Sha256};
    let hash = hex::encode(&Sha256::digest(id.as_bytes())[..4]);
    let keep = &base[..base.len().min(63 - 1 - hash.len())];
    let keep = keep.trim_end_matches('-');
    if keep.is_empty() { format!("d-{hash}") } else { format!("{keep}-{hash}") }
}

/// The attribute replicas of a time-sliced or shared device carry, naming that device (the
/// SDK's `Sharing::expand`, the generic backend's `count` shares).
pub(crate) const REPLICA_OF: &str = "replica-of";

/// The attribute a replica is published with: the DRA name of the device it shares, so a claim
/// can ask for replicas of distinct devices (`distinctAttribute`) or of one (`matchAttribute`).
pub(crate) const REPLICA_OF_ATTRIBUTE: &str = "replicaOf";

/// The pool device `d` is published as. Every replica is a device of its own, as in the Device
/// Plugin API: the scheduler counts devices, so a pod asking `devplug.io/fuse: 2` through the
/// DeviceClass's `extendedResourceName` (KEP-5004) gets two replicas, which kube-scheduler 1.36
/// cannot do with one shared device (it never picks a device twice for one request).
pub(crate) fn pool_device_name(d: &Device) -> String {
    device_name(&d.id)
}

fn replica_of(d: &Device) -> Option<&str> {
    d.attributes.iter().find(|(k, _)| k == REPLICA_OF).map(|(_, v)| v.as_str()).filter(|v| !v.is_empty())
}

/// One device of resource `r` as the API writes it, named `name`: discover's attributes as
/// strings, a WIT 0.3.0 description's typed ones, the host's own (`resource`, `numa`, the
/// standard names where there is room), capacities, counters, sharing and its taint.
fn pool_device(sysfs: Option<&std::path::Path>, r: &Resource, d: &Device, name: &str) -> ApiDevice {
    let mut attributes = BTreeMap::new();
    for (k, v) in d
        .attributes
        .iter()
        .filter(|(k, _)| k != REPLICA_OF && k != crate::model::DRA_ONLY && k != crate::model::SHARED_NODE)
    {
        attributes.insert(attribute_name(k), text(v));
    }
    if let Some(of) = replica_of(d) {
        attributes.insert(REPLICA_OF_ATTRIBUTE.into(), text(&device_name(of)));
    }
    // A WIT 0.3.0 backend's own description: typed values under its own names (a name
    // the API server refuses refuses the pool, naming the device and field).
    let described = r.described.get(&d.id);
    for (k, v) in described.iter().flat_map(|x| x.attributes.iter()) {
        let value = match v {
            AttributeValue::Text(s) => text(s),
            AttributeValue::Int(i) => int(*i),
            AttributeValue::Bool(b) => DeviceAttribute { bool: Some(*b), ..Default::default() },
            AttributeValue::Version(s) => DeviceAttribute { version: Some(s.clone()), ..Default::default() },
        };
        attributes.insert(k.clone(), value);
    }
    // The host's own attributes last, so nothing a backend says can replace them (its
    // answers naming them are refused before they get here: `vet`).
    attributes.insert("resource".into(), text(&r.name));
    match d.numa_nodes.first() {
        Some(numa) => attributes.insert("numa".into(), int(i64::from(*numa))),
        None => attributes.remove("numa"),
    };
    // Kubernetes' standard names, where the device has room for them (the server takes
    // 32 attributes and capacities a device).
    let capacities = described.map_or(0, |x| x.capacity.len());
    for (k, v) in super::standard::attributes(sysfs, d.vetted.pci.as_ref(), &d.numa_nodes) {
        if attributes.len() + capacities < rules::MAX_ATTRIBUTES_AND_CAPACITIES {
            attributes.insert(k, v);
        }
    }
    let capacity: BTreeMap<String, DeviceCapacity> = described
        .iter()
        .flat_map(|x| x.capacity.iter())
        .map(|(k, q)| (k.clone(), DeviceCapacity { value: Quantity(q.clone()), request_policy: None }))
        .collect();
    let consumes: Vec<DeviceCounterConsumption> = described
        .iter()
        .flat_map(|x| x.consumes.iter())
        .map(|c| DeviceCounterConsumption { counter_set: c.name.clone(), counters: counters(c) })
        .collect();
    ApiDevice {
        name: name.to_owned(),
        attributes: Some(attributes),
        capacity: (!capacity.is_empty()).then_some(capacity),
        consumes_counters: (!consumes.is_empty()).then_some(consumes),
        allow_multiple_allocations: described.is_some_and(|x| x.allow_multiple_allocations).then_some(true),
        taints: (d.health == Health::Unhealthy).then(|| vec![unhealthy_taint(d)]),
        ..Default::default()
    }
}

/// The taint an Unhealthy device carries, its value the backend's reason as a label value.
fn unhealthy_taint(d: &Device) -> DeviceTaint {
    let why = d.attributes.iter().find(|(k, _)| k == "unhealthy").map_or("", |(_, v)| v.as_str());
    // A label value keeps `[A-Za-z0-9_.-]`: every run of anything else becomes one `_`, so
    // the words stay apart (`bound to 4xxxvf, not vfio-pci` → `bound_to_4xxxvf_not_vfio-pci`).
    let mut value = String::new();
    for c in why.chars() {
        if c.is_ascii_alphanumeric() || "-_.".contains(c) {
            value.push(c);
        } else if !value.is_empty() && !value.ends_with(['_', '-', '.']) {
            value.push('_');
        }
    }
    let value: String = value.chars().take(63).collect();
    let value = value.trim_matches(|c: char| !c.is_ascii_alphanumeric()).to_owned();
    DeviceTaint {
        key: UNHEALTHY_TAINT.to_owned(),
        value: Some(value),
        effect: "NoSchedule".to_owned(),
        time_added: None,
    }
}

/// The slices of `backend`'s pool `id`, from the device lists of the `resources` it serves
/// through DRA, on a machine whose sysfs is at `sysfs`: PCI devices get their standard
/// `pcieRoot` (none without a sysfs).
pub fn pool_on(
    sysfs: Option<&std::path::Path>,
    backend: &str,
    id: &PoolId,
    resources: &[Resource],
) -> Result<Pool, PoolError> {
    let (driver, node, pool, generation) = (&id.driver, &id.node, id.pool(), 0);
    let fail = |device: &str, field: String, message: String| PoolError {
        backend: backend.to_owned(),
        device: device.to_owned(),
        field,
        message,
    };
    let mut ids = BTreeMap::new();
    let mut devices = Vec::new();
    let mut bytes = 0usize;
    for r in resources {
        for d in &r.devices {
            let name = pool_device_name(d);
            if let Some((other, _)) = ids.insert(name.clone(), (d.id.clone(), r.name.clone())) {
                return Err(fail(&d.id, "name".into(), format!("its DRA name {name} is also {other}'s")));
            }
            let device = pool_device(sysfs, r, d, &name);
            bytes += json_len(&device);
            if bytes > MAX_POOL_BYTES {
                return Err(fail(
                    "(the pool)",
                    "size".into(),
                    format!(
                        "its devices come to more than {MAX_POOL_BYTES} bytes of JSON; describe fewer or shorter attributes"
                    ),
                ));
            }
            devices.push((d.id.clone(), device));
        }
    }
    let tainted = devices.iter().any(|(_, d)| d.taints.is_some() || d.consumes_counters.is_some());
    // Counter sets go in slices of their own (a slice has `sharedCounters` or `devices`).
    let mut sets: Vec<ApiCounterSet> = Vec::new();
    for set in resources.iter().flat_map(|r| r.counter_sets.iter()) {
        if !sets.iter().any(|s| s.name == set.name) {
            sets.push(ApiCounterSet { name: set.name.clone(), counters: counters(set) });
        }
    }
    let per_slice = if tainted { rules::MAX_DEVICES_WITH_TAINTS_OR_COUNTERS } else { rules::MAX_DEVICES };
    let chunks: Vec<&[(String, ApiDevice)]> =
        if devices.is_empty() { vec![&devices[..]] } else { devices.chunks(per_slice).collect() };
    let count = chunks.len() + usize::from(!sets.is_empty());
    let prefix = device_name(&format!("{node}-{driver}"));
    let slice =
        |name: String, devices: Option<Vec<ApiDevice>>, shared_counters: Option<Vec<ApiCounterSet>>| ResourceSlice {
            metadata: ObjectMeta { name: Some(name), ..Default::default() },
            spec: ResourceSliceSpec {
                driver: driver.clone(),
                node_name: Some(node.clone()),
                pool: ResourcePool { name: pool.to_owned(), generation, resource_slice_count: count as i64 },
                devices,
                shared_counters,
                ..Default::default()
            },
        };
    // Each judged as the JSON the server will read.
    let judged = |s: &ResourceSlice| match serde_json::to_value(s) {
        Ok(v) => rules::problems(&v).into_iter().next(),
        Err(e) => Some(rules::Problem { field: "spec".into(), message: format!("not serialisable: {e}") }),
    };
    let mut slices = BTreeMap::new();
    let mut keep = |s: ResourceSlice| {
        let hash = spec_hash(&s);
        slices.insert(s.metadata.name.clone().unwrap_or_default(), (s, hash));
    };
    if !sets.is_empty() {
        let s = slice(format!("{prefix}-counters"), None, Some(sets));
        if let Some(p) = judged(&s) {
            return Err(fail("(counter sets)", p.field, p.message));
        }
        keep(s);
    }
    for (i, chunk) in chunks.into_iter().enumerate() {
        let s = slice(format!("{prefix}-{i}"), Some(chunk.iter().map(|(_, d)| d.clone()).collect()), None);
        if let Some(p) = judged(&s) {
            // Name the device the field is about, when it is about one.
            let device = p
                .field
                .strip_prefix("spec.devices[")
                .and_then(|rest| rest.split(']').next()?.parse::<usize>().ok())
                .and_then(|j| chunk.get(j))
                .map_or_else(|| "(the pool)".to_owned(), |(id, _)| id.clone());
            return Err(fail(&device, p.field, p.message));
        }
        keep(s);
    }
    Ok(Pool { slices, ids })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(backend: &str, id: &PoolId, resources: &[Resource]) -> Result<Pool, PoolError> {
        pool_on(None, backend, id, resources)
    }

    /// The slices as the server reads them, in the writer's order.
    fn wire(slices: &[ResourceSlice]) -> Vec<serde_json::Value> {
        slices.iter().map(|s| serde_json::to_value(s).unwrap()).collect()
    }

    fn json(p: &Pool) -> Vec<serde_json::Value> {
        wire(&p.at(0))
    }
    use crate::model::{ContainerEdits, Device};

    fn id(driver: &str) -> PoolId {
        PoolId::new(driver, "node-a")
    }

    fn device(id: &str, health: Health, attrs: &[(&str, &str)]) -> Device {
        Device {
            id: id.into(),
            health,
            numa_nodes: vec![1],
            attributes: attrs.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect(),
            edits: ContainerEdits::default(),
            vetted: Default::default(),
        }
    }

    fn resource(name: &str, devices: Vec<Device>) -> Resource {
        Resource { name: name.into(), devices, ..Default::default() }
    }

    /// Replicas of one device are one pool device several claims may hold (a `shares`
    /// capacity, one each by default); the way back names the first replica; a `dra-only`
    /// marker and `replica-of` are the host's, never published.
    #[test]
    fn replicas_are_devices_of_their_own() {
        let replicas: Vec<Device> = (0..3)
            .map(|i| device(&format!("kvm-{i}"), Health::Healthy, &[("replica-of", "kvm"), ("paths", "/dev/kvm")]))
            .collect();
        let mut lone = device("tun", Health::Healthy, &[("dra-only", "true")]);
        lone.numa_nodes.clear();
        let p = pool(
            "generic",
            &id("generic.devplug.io"),
            &[resource("devplug.io/kvm", replicas), resource("devplug.io/tun", vec![lone])],
        )
        .unwrap();
        let slices = json(&p);
        let devices = slices[0]["spec"]["devices"].as_array().unwrap();
        let names: Vec<&str> = devices.iter().map(|d| d["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["kvm-0", "kvm-1", "kvm-2", "tun"]);
        for kvm in &devices[..3] {
            // What the scheduler counts for an extended resource: one device per replica.
            assert!(kvm["allowMultipleAllocations"].is_null() && kvm["capacity"]["shares"].is_null(), "{kvm}");
            assert_eq!(kvm["attributes"]["replicaOf"]["string"], "kvm");
            assert!(kvm["attributes"]["replica_of"].is_null());
        }
        assert!(devices[3]["attributes"]["dra_only"].is_null() && devices[3]["attributes"]["replicaOf"].is_null());
        assert_eq!(p.ids["kvm-1"], ("kvm-1".to_owned(), "devplug.io/kvm".to_owned()));
        assert!(rules::problems(&slices[0]).is_empty());
    }

    /// Issue 33: what a pool publishes is bounded as a whole (8,192 devices × 32 legal
    /// attributes is ~20 MiB of JSON): refused with the size named, nothing half-built.
    #[test]
    fn a_pool_is_bounded_in_bytes_as_a_whole() {
        let attrs: Vec<(String, String)> = (0..32).map(|a| (format!("a{a:02}"), format!("{a:064}"))).collect();
        let attrs: Vec<(&str, &str)> = attrs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let devices = (0..8192).map(|i| device(&format!("d{i}"), Health::Healthy, &attrs)).collect();
        let e = pool("b", &id("b.devplug.io"), &[resource("x.io/w", devices)]).unwrap_err();
        assert_eq!(e.field, "size", "{e}");
        assert!(e.message.contains(&MAX_POOL_BYTES.to_string()), "{e}");
    }

    /// The host's own `resource` and `numa` are written last: whatever a backend's attributes
    /// said (its answers naming them are refused earlier, in `vet`), the published values are the
    /// host's.
    #[test]
    fn the_hosts_attributes_are_never_replaced() {
        let mut d = device("d0", Health::Healthy, &[("numa", "9"), ("resource", "evil.io/x")]);
        d.numa_nodes = vec![];
        let mut r = resource("x.io/w", vec![d]);
        let typed = crate::model::dra::Described {
            attributes: vec![("resource".into(), AttributeValue::Text("evil.io/y".into()))],
            ..Default::default()
        };
        r.described.insert("d0".into(), typed);
        let p = pool("b", &id("b.devplug.io"), &[r]).unwrap();
        let slices = json(&p);
        let attrs = &slices[0]["spec"]["devices"][0]["attributes"];
        assert_eq!(attrs["resource"]["string"], "x.io/w", "{attrs}");
        assert!(attrs["numa"].is_null(), "no NUMA node known, none published: {attrs}");
    }

    #[test]
    fn device_ids_become_stable_distinct_labels() {
        assert_eq!(device_name("kvm-0"), "kvm-0", "a label stays itself");
        let a = device_name("0000:07:00.0");
        let b = device_name("0000:07:00.1");
        assert!(rules::label_problem(&a).is_none() && rules::label_problem(&b).is_none(), "{a} {b}");
        assert_ne!(a, b);
        assert_eq!(a, device_name("0000:07:00.0"), "the same ID always gets the same name");
        assert!(a.starts_with("0000-07-00-0-"), "{a}");
        let long = device_name(&"GPU_".repeat(40));
        assert!(long.len() <= 63 && rules::label_problem(&long).is_none(), "{long}");
        assert!(rules::label_problem(&device_name("::")).is_none());
    }

    #[test]
    fn a_pool_is_chunked_typed_tainted_and_valid() {
        let many: Vec<Device> = (0..300)
            .map(|i| device(&format!("0000:{:02x}:00.{}", i / 8, i % 8), Health::Healthy, &[("model", "A100")]))
            .collect();
        let p = pool("gpu", &id("gpu.devplug.io"), &[resource("nvidia.com/gpu", many)]).unwrap();
        assert!(p.slices.values().all(|(s, _)| s.spec.pool.generation == 0), "built at no generation");
        let at3 = wire(&p.at(3));
        let sizes: Vec<usize> = at3.iter().map(|s| s["spec"]["devices"].as_array().unwrap().len()).collect();
        assert_eq!(sizes, [128, 128, 44]);
        assert!(
            at3.iter().all(|s| s["spec"]["pool"]["resourceSliceCount"] == 3 && s["spec"]["pool"]["generation"] == 3)
        );
        let first = &at3[0]["spec"]["devices"][0];
        assert_eq!(first["attributes"]["resource"]["string"], "nvidia.com/gpu");
        assert_eq!(first["attributes"]["numa"]["int"], 1);
        assert_eq!(p.ids[first["name"].as_str().unwrap()].0, "0000:00:00.0", "the way back from a name");
        // One Unhealthy device: a taint with the reason, and 64 devices a slice.
        let mut some = (0..100).map(|i| device(&format!("d{i}"), Health::Healthy, &[])).collect::<Vec<_>>();
        some[7] = device("d7", Health::Unhealthy, &[("unhealthy", "AER: 3 fatal errors")]);
        let p = pool("gpu", &id("gpu.devplug.io"), &[resource("nvidia.com/gpu", some)]).unwrap();
        assert_eq!(p.slices.len(), 2);
        let slices = json(&p);
        let taint = &slices[0]["spec"]["devices"][7]["taints"][0];
        assert_eq!(taint["key"], UNHEALTHY_TAINT);
        assert_eq!(taint["value"], "AER_3_fatal_errors", "words stay apart");
    }

    #[test]
    fn a_bad_description_refuses_the_whole_pool_naming_backend_device_and_field() {
        let devices = vec![
            device("ok", Health::Healthy, &[]),
            device("talkative", Health::Healthy, &[("paths", &"/dev/x,".repeat(20))]),
        ];
        let e = pool("generic", &id("generic.devplug.io"), &[resource("devplug.io/x", devices)]).unwrap_err();
        assert_eq!((e.backend.as_str(), e.device.as_str()), ("generic", "talkative"));
        assert_eq!(e.field, "spec.devices[1].attributes[paths].string");
        assert!(e.to_string().contains("64 bytes"), "{e}");
    }
}
