//! `devplug:backend@0.1.0` (`wit/since_v0.1.0`, frozen): `sysfs`, `devfs`, `log`. Its `types`
//! are the ones every later version has kept so far ([`super::wit`]).

/// This module's WIT package version.
pub const VERSION: &str = "0.1.0";

wasmtime::component::bindgen!({
    path: "../wit/since_v0.1.0",
    world: "devplug-backend",
    // Async, so that a call blocked in a host function (a WASI sleep) can be cut off at its
    // deadline by dropping the future; trappable, so a host import that fails inside the host
    // traps this backend instead of taking the host down.
    imports: { default: async | trappable },
    exports: { default: async },
});

impl self::devplug::backend::types::Host for HostState {}

super::glue::version_glue!(sysfs: {});
