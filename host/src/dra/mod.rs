//! Dynamic Resource Allocation (`resource.k8s.io/v1`): the same backends served through DRA
//! beside the Device Plugin API, per resource (`[resources.NAME] api = "dra"`).
//!
//! - [`slice_rules`]: the rules the API server applies to a ResourceSlice, so devplug refuses a
//!   backend's bad description itself before anything is published.
//! - [`slices`]: a backend's devices as the slices of one pool; [`standard`]: the standard
//!   attributes (`resource.kubernetes.io/pcieRoot`, `pciBusID`, `numaNode`) the host adds.
//! - [`api`]: the API server: writing a pool, reading a claim.
//! - [`plugin`], [`checkpoint`]: the DRA kubelet plugin service (`v1` and `v1beta1`) and its
//!   crash-safe record of prepared claims (a snapshot and a [`journal`] of changes, one flush a
//!   call); [`claims`]: where each claim stands (prepared, or
//!   stuck and how to release it); [`registration`]: kubelet's plugin watcher finding it.
//! - [`health`]: the devices' health streamed to kubelet (`DRAResourceHealth` v1alpha1).
//! - [`prepare`]: what preparing a claim does (backend edits → a claim CDI spec → CDI IDs);
//!   [`status`]: the claim's `status.devices` reported Ready afterwards (KEP-4817).
//! - [`served`], [`driver`], [`node`]: what each driver serves, the task that keeps its pool
//!   and sockets, and this node's set of drivers.

pub mod api;
pub mod checkpoint;
pub mod claims;
pub mod classes;
pub mod driver;
pub mod health;
pub mod journal;
pub mod node;
pub mod plugin;
pub mod prepare;
pub mod registration;
pub mod served;
pub mod slice_rules;
pub mod slices;
pub mod standard;
pub mod status;

pub use node::{DraNode, NodeSettings};
pub use served::{DeviceCalls, ServedResource};
