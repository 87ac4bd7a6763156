//! Dynamic Resource Allocation (`resource.k8s.io/v1`): the same backends served through DRA
//! beside the Device Plugin API, per resource (`[resources.NAME] api = "dra"`). Split as
//! upstream splits its helpers:
//!
//! - [`publish`]: the publishing side (`resourceslice`): a driver's devices as one pool of
//!   ResourceSlices, checked by the API server's rules, kept on the server by a watching writer.
//! - [`plugin`]: the kubelet-plugin side (`kubeletplugin`): prepare and unprepare, the
//!   checkpoint, claim status, health, registration.
//! - [`served`]: what a driver serves now and the pool built from it, once per change, shared by
//!   both sides; [`pool_id`]: which pool is meant; [`error`]: what crosses the DRA ports.
//! - [`driver`], [`node`]: the task that keeps one driver's pool and sockets, and this node's
//!   set of drivers; [`client`]: the API server connection.
//!
//! A claim's path, as values: kubelet → `plugin::service` (locks, checkpoint; the claim read
//! through `plugin::claim_api` into an [`plugin::Allocation`]) → `plugin::prepare` (the
//! backend's edits, a [`plugin::PreparedClaim`]) → `cdi::SpecDir::write_claim_unflushed`.

pub mod client;
pub mod driver;
pub mod error;
pub mod node;
pub mod plugin;
pub mod pool_id;
pub mod publish;
pub mod refusal;
pub mod served;
