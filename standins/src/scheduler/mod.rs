//! kube-scheduler's DRA side for one node, for `devplug try` and the tests: claim files read with
//! their work bounded ([`documents`]), claims decoded and validated as the API server takes them
//! ([`claim`]), selectors evaluated as the scheduler
//! does ([`cel`]), and devices allocated as its structured-parameters allocator does
//! ([`allocate`]).

pub mod allocate;
pub mod cel;
pub mod cel_cost;
pub mod claim;
pub mod documents;

pub use allocate::{AllocError, allocate, node_selector, share_id};
