//! Stand-ins for the parts of a Kubernetes node devplug talks to but the test suite cannot run:
//! kubelet's device manager and plugin watcher ([`kubelet`]), kubelet's DRA manager
//! ([`kubelet_dra`]), kube-apiserver's `resource.k8s.io/v1` ([`apiserver`]) and kube-scheduler's
//! DRA allocator ([`scheduler`]).
//!
//! They are built from upstream's code and from what real kubelet 1.36 and kube-apiserver 1.36
//! sent and answered (tests/fixtures/k8s), never from devplug's rules: this crate does not
//! depend on devplug. devplug's tests talk to them, and so does `devplug try` (a vendor's local
//! kubelet), which is why nothing here panics on what a plugin sends.

pub mod apiserver;
pub mod h2wire;
pub mod kubelet;
pub mod kubelet_dra;
pub mod proto;
pub mod scheduler;
pub mod uds;
