//! Dynamic Resource Allocation (`resource.k8s.io/v1`): serving the same backends through DRA
//! beside the Device Plugin API (issue 26). So far: the rules the API server applies to a
//! ResourceSlice ([`slice_rules`]), and a backend's devices as the slices of one pool
//! ([`slices`]), so devplug refuses a backend's bad description itself, naming backend, device
//! and field, before anything is published.

pub mod slice_rules;
pub mod slices;
