//! Test support shared by the integration tests and benchmarks (`mod support;`). Each helper
//! has its own module; [`kubelet`] is the kubelet stand-in most tests talk to.

#![allow(dead_code)]

pub mod apiserver;
pub mod binary;
pub mod daemon;
pub mod dra_node;
pub mod fixtures;
pub mod h2wire;
pub mod hardware;
pub mod hostile_registry;
pub mod kubelet;
pub mod kubelet_dra;
pub mod load;
pub mod podman;
pub mod podresources;
pub mod registry;
pub mod stats;
pub mod uds;
pub mod wasm;
