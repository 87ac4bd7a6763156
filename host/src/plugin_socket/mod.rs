//! The plugin-socket layer: what every gRPC server kubelet dials has in common, below both the
//! Device Plugin side (`kubelet/`) and the DRA side (`dra/`).
//!
//! - [`bind`]: binding a Unix socket safely (a stale socket is replaced, nothing else ever is).
//! - [`authority`]: the HTTP/2 front that lets kubelet's plugin watcher dial tonic (grpc-go
//!   sends the socket path as `:authority`; h2 refuses it).
//! - [`serve`]: one helper that serves a tonic router on a socket through that front.
//! - [`admission`]: what the sockets' clients may hold together (request bytes, connections),
//!   and how kubelet's new connection gets in when a hostile client holds the cap.
//! - [`registration`]: the `pluginregistration.Registration` service kubelet's plugin watcher
//!   calls, recording what kubelet did (GetInfo asked, NotifyRegistrationStatus, error), and the
//!   ERROR when it never completes.

pub mod admission;
pub mod authority;
pub mod bind;
pub mod registration;
pub mod serve;

pub use bind::bind;
pub use registration::{Mode, Registration, RegistrationState, Stage};
pub use serve::serve;
