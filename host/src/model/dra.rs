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
