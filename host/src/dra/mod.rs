//! Dynamic Resource Allocation (`resource.k8s.io/v1`): serving the same backends through DRA
//! beside the Device Plugin API (issue 26). So far: the rules the API server applies to a
//! ResourceSlice ([`slice_rules`]), a backend's devices as the slices of one pool ([`slices`]),
//! so devplug refuses a backend's bad description itself before anything is published; and the
//! DRA kubelet plugin service in `v1` and `v1beta1` ([`plugin`]) with its crash-safe record of
//! prepared claims ([`checkpoint`]).

pub mod checkpoint;
pub mod plugin;
pub mod slice_rules;
pub mod slices;
