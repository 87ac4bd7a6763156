//! devplug: a Kubernetes device-plugin host whose vendor backends are sandboxed Wasm components.
//!
//! Data flows one way: [`runtime`] runs backends and yields the [`model`] of devices; [`backends`]
//! keeps them loaded, polled and routed per resource; [`kubelet`] serves that model to kubelet over
//! the Device Plugin API ([`dra`] through DRA; both on the sockets of [`plugin_socket`]), and [`cdi`] writes the same devices as CDI spec files. The kubelet layer never sees wasmtime types and the runtime never sees
//! gRPC types: [`model`] is the only type they share.

pub mod backends;
pub mod cdi;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod dra;
pub mod durable;
pub mod fswatch;
pub mod gate;
pub mod kubelet;
pub mod model;
pub mod observe;
pub mod oci;
pub mod plugin_socket;
pub mod proto;
pub mod runtime;
pub mod sync;
pub mod tls;
