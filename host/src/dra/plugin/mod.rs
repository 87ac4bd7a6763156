//! The kubelet-plugin side of DRA (upstream's `kubeletplugin` package): the `DRAPlugin`
//! service kubelet calls on a driver's `dra.sock`, and what it keeps on the node.
//!
//! - [`service`]: `NodePrepareResources` / `NodeUnprepareResources` in `v1` and `v1beta1`,
//!   claim locks, one checkpoint flush a call, the claim read through [`claim_api`] (checked
//!   into an [`Allocation`]); [`prepare`]: what preparing a claim does, from values (this
//!   driver's devices → the backend's edits → a [`PreparedClaim`] whose CDI spec is written
//!   once the claim is recorded).
//! - [`checkpoint`], [`journal`]: the crash-safe record of prepared claims.
//! - [`claims`]: where each claim stands (prepared, or stuck and how to release it).
//! - [`status`]: the claim's `status.devices` reported Ready (KEP-4817).
//! - [`health`]: the devices' health streamed to kubelet (KEP-4680).
//! - [`registration`]: kubelet's plugin watcher finding the driver.

pub mod checkpoint;
pub mod claim_api;
pub mod claims;
pub mod health;
pub mod journal;
pub mod prepare;
pub mod registration;
pub mod service;
pub mod status;

pub use checkpoint::{Checkpoint, ClaimRef, PreparedDevice};
pub use claim_api::{Allocation, ApiServer, ClaimApi};
pub use service::{ClaimPreparer, DraPlugin, PreparedClaim};
