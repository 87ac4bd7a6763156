//! The first-party backends compiled into the binary (components, manifests and their native code
//! precompiled at build time), and the test programs' paths (built by `build.rs` from `guests/`).

include!(concat!(env!("OUT_DIR"), "/guests.rs"));

/// Path of a test program's component, for the test suite and benchmarks.
#[doc(hidden)]
pub fn test_program(name: &str) -> Option<(&'static str, &'static str)> {
    TEST_PROGRAMS.iter().find(|(n, _, _)| *n == name).map(|(_, wasm, manifest)| (*wasm, *manifest))
}
