//! The registry client for backends as OCI artifacts: pulling by reference, verifying (blob
//! digests always; cosign-compatible signatures when the operator gives a key), pushing, and a
//! content-addressed cache on the node. Following references over time, and turning what was
//! pulled into backend sources, is the backends' side ([`crate::backends::Follower`]).
//!
//! - [`settings`]: the `[registry]` config section and the clients it makes (auth, CA, plain HTTP).
//! - [`fetch`]: every read from a registry (manifests, blobs, tokens), each body byte-capped.
//! - [`artifact`]: pulling a backend: the Wasm OCI artifact layout (the manifest in an
//!   annotation) or the image `devplug pack` writes.
//! - `push`: storing one (`oci-wasm` writes the layout), in the vendor build only (feature
//!   `push`; the node never pushes).
//! - [`signature`]: cosign's simple-signing format with ECDSA P-256 keys.
//! - [`native`]: native code compiled once per cluster (`devplug precompile`), attached to a
//!   backend's manifest and signed by the operator's key; found, checked and fetched by nodes.
//! - [`cache`]: the content-addressed store that serves a restart with the registry down.

pub mod artifact;
pub mod cache;
pub mod fetch;
pub mod native;
#[cfg(feature = "push")]
pub mod push;
pub mod settings;
pub mod signature;

pub use artifact::{Pulled, pull};
pub use settings::RegistrySettings;
pub use signature::SignatureState;
