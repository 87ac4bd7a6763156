//! What a WIT 0.3.0 backend says of its devices for DRA beyond `discover`: typed attributes,
//! capacities, what partitions consume of shared counters. The host attaches it to the resource
//! the devices belong to; the DRA side publishes it (and checks it with the API server's rules).

/// An attribute's value, typed as the API server types them.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub enum AttributeValue {
    Text(String),
    Int(i64),
    Bool(bool),
    Version(String),
}

/// A named set of amounts several devices draw from; amounts as Kubernetes quantities.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CounterSet {
    pub name: String,
    pub counters: Vec<(String, String)>,
}

/// What one device draws from a counter set.
pub type CounterUse = CounterSet;

/// One device's description.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Described {
    pub attributes: Vec<(String, AttributeValue)>,
    pub capacity: Vec<(String, String)>,
    pub consumes: Vec<CounterUse>,
    pub allow_multiple_allocations: bool,
}

/// A backend's answer to `describe`: by (resource, device ID), with the counter sets.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolDescription {
    pub counter_sets: Vec<CounterSet>,
    pub devices: Vec<(String, String, Described)>,
}

/// A device allocated to a claim, as a backend's `prepare` gets it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimDevice {
    pub request: String,
    pub resource: String,
    pub id: String,
}

pub use crate::gate::MAX_ATTRIBUTE_NAME;

/// A `discover` attribute key as a DRA attribute name: a C identifier of at most 32 bytes
/// (`unhealthy`, `cdi_name`, `pci_addr`).
pub(crate) fn attribute_name(key: &str) -> String {
    let mut s: String = key.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    if !s.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
        s.insert(0, '_');
    }
    s.truncate(MAX_ATTRIBUTE_NAME);
    s
}

/// Attributes the host writes on every device it publishes: the device-plugin resource name
/// (DeviceClasses select on it) and the NUMA node (the scheduler aligns on it). A backend's
/// attribute of the same name would replace them, so it is refused.
pub(crate) const HOST_ATTRIBUTES: &[&str] = &["resource", "numa"];

/// Domains whose attribute names belong to devplug or to Kubernetes' standard attributes
/// (`resource.kubernetes.io/pcieRoot`): the host writes those, never a backend.
const RESERVED_DOMAINS: &[&str] = &["devplug.io", "kubernetes.io", "k8s.io"];

/// Why a backend may not publish attribute `key` (a `discover` key, or a `describe` name, which
/// may be `domain/name`), if it may not.
pub(crate) fn reserved_attribute(key: &str) -> Option<String> {
    let (domain, name) = match key.rsplit_once('/') {
        Some((d, n)) => (Some(d), n),
        None => (None, key),
    };
    let name = attribute_name(name);
    if HOST_ATTRIBUTES.contains(&name.as_str()) {
        return Some(format!(
            "attribute {key:?}: {name} is written by the host (reserved: {})",
            HOST_ATTRIBUTES.join(", ")
        ));
    }
    let domain = domain?;
    // `devplug.io` itself (not a driver's `NAME.devplug.io`), Kubernetes' domains and theirs below.
    let taken = |r: &&&str| domain == **r || (**r != "devplug.io" && domain.ends_with(&format!(".{r}")));
    RESERVED_DOMAINS
        .iter()
        .find(taken)
        .map(|r| format!("attribute {key:?}: names in the {r} domain are the host's and Kubernetes' to write"))
}
