//! `devplug:backend@0.2.0` (`wit/since_v0.2.0`): 0.1.0 plus batched `sysfs` reads
//! (`read-many`, `read-link-many`, `list-dir-many`) and a read-only `procfs` view. `types` is
//! unchanged, so it is 0.1.0's Rust types ([`super::wit`]) and the answers convert the same way.

/// This module's WIT package version.
pub const VERSION: &str = "0.2.0";

wasmtime::component::bindgen!({
    path: "../wit/since_v0.2.0",
    world: "devplug-backend",
    imports: { default: async | trappable },
    exports: { default: async },
    with: { "devplug:backend/types": super::wit_interface },
});

super::glue::since_0_2_0_glue!();
