//! Backends from OCI registries: pulled by reference (a tag is followed, a digest is pinned),
//! verified (blob digests always; cosign-compatible signatures when the operator gives a key),
//! cached by content on the node, and handed to the daemon as ordinary backend sources, so a new
//! version takes the same hot-swap path as a file in the backends directory.
//!
//! - [`settings`]: the `[registry]` config section and the client it makes (auth, CA, plain HTTP).
//! - [`artifact`]: pulling and pushing a backend: the Wasm OCI artifact layout (`oci-wasm`, the
//!   manifest in an annotation) or the image `devplug pack` writes.
//! - [`signature`]: cosign's simple-signing format with ECDSA P-256 keys.
//! - [`cache`]: the content-addressed store that serves a restart with the registry down.
//! - [`follow`]: the per-reference state machine the daemon polls.

pub mod artifact;
pub mod cache;
pub mod follow;
pub mod settings;
pub mod signature;

pub use artifact::{Pulled, pull, push};
pub use follow::{Follower, SourceStatus};
pub use settings::RegistrySettings;
pub use signature::SignatureState;
