//! The publishing side of DRA (upstream's `resourceslice` package): a driver's devices as
//! one pool of ResourceSlices, checked against the API server's own rules before anything is
//! written, and kept on the server by a writer that watches what the server holds.
//!
//! - [`pool`]: a backend's device lists → the pool's slices and the way back from each device
//!   name; [`standard`]: Kubernetes' standard attributes the host adds.
//! - [`rules`]: the API server's ResourceSlice validation, so a bad description is refused here,
//!   naming backend, device and field.
//! - [`writer`], [`view`]: writing a pool whole, generation by generation; what the server holds.
//! - [`classes`]: the DeviceClass of each resource served through DRA.

pub mod classes;
pub mod pool;
pub mod rules;
pub mod standard;
pub mod view;
pub mod writer;

pub use pool::{Pool, PoolError, pool_on};
pub use writer::{PoolWriter, Written};
