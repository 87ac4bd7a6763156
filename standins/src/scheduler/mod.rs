//! kube-scheduler's DRA side for one node, for `devplug try` and the tests: claims decoded and
//! validated as the API server takes them ([`claim`]), selectors evaluated as the scheduler
//! does ([`cel`]), and devices allocated as its structured-parameters allocator does
//! ([`allocate`]).

pub mod allocate;
pub mod cel;
pub mod claim;

pub use allocate::{AllocError, allocate, node_selector, share_id};
