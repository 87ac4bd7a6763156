//! Dynamic Resource Allocation (`resource.k8s.io/v1`): serving the same backends through DRA
//! beside the Device Plugin API (issue 26). This first step holds the rules the API server
//! applies to a ResourceSlice ([`slice_rules`]), so devplug refuses a backend's bad description
//! itself, naming backend, device and field, before anything is published.

pub mod slice_rules;
