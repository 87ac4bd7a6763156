//! Test support shared by the integration tests and benchmarks, a crate of its own (each test
//! file has `use devplug_test_support as support;`): built once, not compiled into every test
//! binary. Each helper has its own module; [`kubelet`] is the kubelet stand-in most tests talk
//! to. Paths Cargo gives only a package's own tests come from [`paths`].

// The kubelet and API-server stand-ins are a crate of their own (standins/), also used by
// `devplug try`; re-exported here under the names the tests have always used.
#[allow(unused_imports)]
pub use devplug_standins::{apiserver, h2wire, kubelet, kubelet_dra, uds};

pub mod attacks;
pub mod binary;
pub mod bomb;
pub mod chart;
pub mod cluster;
pub mod daemon;
pub mod dra_node;
pub mod envtest;
pub mod examples;
pub mod fixtures;
pub mod guide;
pub mod hardware;
pub mod hostile_registry;
pub mod load;
pub mod paths;
pub mod podman;
pub mod podresources;
pub mod registry;
pub mod rollout;
pub mod stats;
pub mod wasm;
