//! The devplug guest SDK: everything a vendor needs to write a device-plugin backend in Rust.
//!
//! A backend is a type implementing [`Backend`], exported with [`backend!`]. It sees the machine
//! only through a [`Sys`]: inside devplug that is the host's capability-checked `sysfs`, `devfs`
//! and `procfs` imports ([`HostSys`]); in a native `cargo test` it is a [`FixtureSys`] over a sysfs-shaped
//! directory, so backend logic is tested without building Wasm or running the host.
//!
//! ```ignore
//! struct Mine;
//! impl devplug_sdk::Backend for Mine { /* init + discover */ }
//! devplug_sdk::backend!(Mine);
//! ```

pub mod device;
pub mod edits;
#[cfg(not(target_arch = "wasm32"))]
pub mod fixture;
mod info;
pub mod pci;
pub mod sharing;
pub mod sys;
pub mod topology;

/// The bindings generated from `wit/since_v0.3.0` (package `devplug:backend@0.3.0`).
pub mod bindings {
    wit_bindgen::generate!({
        path: "../../wit/since_v0.3.0",
        world: "devplug-backend",
        pub_export_macro: true,
        default_bindings_module: "devplug_sdk::bindings",
        generate_all,
        additional_derives: [PartialEq],
    });
}

pub use bindings::devplug::backend::devfs::{Node, NodeKind};
pub use bindings::devplug::backend::log::Level;
pub use bindings::devplug::backend::types::{
    BackendError, ContainerEdits, Device, DeviceNode, FsError, Health, Info, Mount, Resource, ResourceInfo,
};
/// The DRA types (WIT 0.3.0): what `describe` answers and `prepare` gets.
pub mod dra {
    pub use crate::bindings::exports::devplug::backend::dra::{
        AttributeValue, ClaimDevice, Counter, CounterSet, CounterUse, DeviceDescription, PoolDescription,
    };

    /// A description of device `id` of `resource` with nothing in it yet.
    pub fn describe(resource: &str, id: &str) -> DeviceDescription {
        DeviceDescription {
            resource: resource.into(),
            id: id.into(),
            attributes: Vec::new(),
            capacity: Vec::new(),
            consumes_counters: Vec::new(),
            allow_multiple_allocations: false,
        }
    }
}
#[cfg(not(target_arch = "wasm32"))]
pub use fixture::FixtureSys;
pub use sys::{HostSys, Sys};

/// The WIT package version this SDK builds against.
pub const WIT_VERSION: &str = "0.3.0";

/// A device-plugin backend. One value lives per Wasm instance, created by [`Backend::init`].
pub trait Backend: Sized + 'static {
    /// Parse `config` (TOML, empty for defaults) and say which resources this backend serves.
    fn init(config: &str, sys: &dyn Sys) -> Result<(Self, Info), BackendError>;

    /// Every resource with its devices and their health. Runs on each health poll: keep it cheap.
    fn discover(&self, sys: &dyn Sys) -> Result<Vec<Resource>, BackendError>;

    /// Pick `size` of `available`, including `must_include`. The default declines, and the host
    /// falls back to its own choice.
    fn preferred_allocation(
        &self,
        _sys: &dyn Sys,
        _resource: &str,
        _available: &[String],
        _must_include: &[String],
        _size: u32,
    ) -> Result<Vec<String>, BackendError> {
        Err(BackendError::Unsupported)
    }

    /// Edits that depend on the whole set of `ids` (the host already adds each device's own edits
    /// and the resource's common edits). The default adds nothing.
    fn allocate(&self, _sys: &dyn Sys, _resource: &str, _ids: &[String]) -> Result<ContainerEdits, BackendError> {
        Ok(edits::empty())
    }

    /// Work before a container starts; only called for resources that asked for it.
    fn pre_start(&self, _sys: &dyn Sys, _resource: &str, _ids: &[String]) -> Result<(), BackendError> {
        Ok(())
    }

    /// For DRA: typed attributes, capacities and shared counters of the devices of the latest
    /// `discover` (called right after it). The default describes nothing: DRA then publishes
    /// `discover`'s attributes as strings.
    fn describe(&self, _sys: &dyn Sys) -> Result<dra::PoolDescription, BackendError> {
        Ok(dra::PoolDescription { counter_sets: Vec::new(), devices: Vec::new() })
    }

    /// For DRA: the edits for a claim's containers beyond each device's own. `config` holds the
    /// opaque parameters for this driver (JSON). The default leaves it to `allocate`.
    fn prepare(
        &self,
        _sys: &dyn Sys,
        _claim_uid: &str,
        _devices: &[dra::ClaimDevice],
        _config: &[String],
    ) -> Result<ContainerEdits, BackendError> {
        Err(BackendError::Unsupported)
    }

    /// For DRA: undo `prepare`. The default has nothing to undo.
    fn unprepare(&self, _sys: &dyn Sys, _claim_uid: &str) -> Result<(), BackendError> {
        Ok(())
    }
}

/// Log through the host (tagged with the backend's name there). Outside Wasm, prints to stderr.
pub fn log(level: Level, message: &str) {
    #[cfg(target_arch = "wasm32")]
    bindings::devplug::backend::log::log(level, message);
    #[cfg(not(target_arch = "wasm32"))]
    eprintln!("[{level:?}] {message}");
}

/// `s` as device-ID or resource-name characters: every character outside `[A-Za-z0-9._-]`
/// becomes `_` (`net/tun` → `net_tun`).
pub fn id_chars(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' }).collect()
}

/// Shorthand for a [`BackendError::InvalidConfig`], on one line: a parser's message that spans
/// several (`toml`'s draws the place under its first line) keeps its words, joined by `; `,
/// without the drawing, since the host shows a backend's line breaks as the two characters `\n`.
pub fn invalid_config(what: impl std::fmt::Display) -> BackendError {
    BackendError::InvalidConfig(one_line(&what.to_string()))
}

/// `text`'s lines joined by `; `, less the ones that only draw where an error is (`  |`,
/// `3 | key =`, `  |     ^`).
fn one_line(text: &str) -> String {
    let drawing = |l: &str| {
        let t = l.trim();
        let gutter = t.trim_start_matches(|c: char| c.is_ascii_digit()).trim_start();
        t.is_empty() || gutter.starts_with('|')
    };
    text.lines().filter(|l| !drawing(l)).map(str::trim).collect::<Vec<_>>().join("; ")
}

/// Export `$ty` (a [`Backend`]) as this component's `devplug:backend/backend` implementation.
#[macro_export]
macro_rules! backend {
    ($ty:ty) => {
        mod __devplug_export {
            use super::*;
            use $crate::bindings::exports::devplug::backend::backend as __wit;

            ::std::thread_local! {
                static STATE: ::std::cell::RefCell<::std::option::Option<$ty>> =
                    const { ::std::cell::RefCell::new(::std::option::Option::None) };
            }

            fn with<R>(
                f: impl FnOnce(&$ty) -> ::std::result::Result<R, $crate::BackendError>,
            ) -> ::std::result::Result<R, $crate::BackendError> {
                STATE.with(|s| match s.borrow().as_ref() {
                    Some(b) => f(b),
                    None => Err($crate::BackendError::Other("init was not called".into())),
                })
            }

            #[allow(dead_code)]
            pub struct Export;

            impl __wit::Guest for Export {
                fn init(config: String) -> Result<$crate::Info, $crate::BackendError> {
                    let (b, info) = <$ty as $crate::Backend>::init(&config, &$crate::HostSys)?;
                    STATE.with(|s| *s.borrow_mut() = Some(b));
                    Ok(info)
                }
                fn discover() -> Result<Vec<$crate::Resource>, $crate::BackendError> {
                    with(|b| $crate::Backend::discover(b, &$crate::HostSys))
                }
                fn preferred_allocation(
                    resource: String,
                    available: Vec<String>,
                    must_include: Vec<String>,
                    size: u32,
                ) -> Result<Vec<String>, $crate::BackendError> {
                    with(|b| {
                        $crate::Backend::preferred_allocation(
                            b, &$crate::HostSys, &resource, &available, &must_include, size,
                        )
                    })
                }
                fn allocate(
                    resource: String,
                    ids: Vec<String>,
                ) -> Result<$crate::ContainerEdits, $crate::BackendError> {
                    with(|b| $crate::Backend::allocate(b, &$crate::HostSys, &resource, &ids))
                }
                fn pre_start(resource: String, ids: Vec<String>) -> Result<(), $crate::BackendError> {
                    with(|b| $crate::Backend::pre_start(b, &$crate::HostSys, &resource, &ids))
                }
            }

            impl $crate::bindings::exports::devplug::backend::dra::Guest for Export {
                fn describe() -> Result<$crate::dra::PoolDescription, $crate::BackendError> {
                    with(|b| $crate::Backend::describe(b, &$crate::HostSys))
                }
                fn prepare(
                    claim_uid: String,
                    devices: Vec<$crate::dra::ClaimDevice>,
                    config: Vec<String>,
                ) -> Result<$crate::ContainerEdits, $crate::BackendError> {
                    with(|b| $crate::Backend::prepare(b, &$crate::HostSys, &claim_uid, &devices, &config))
                }
                fn unprepare(claim_uid: String) -> Result<(), $crate::BackendError> {
                    with(|b| $crate::Backend::unprepare(b, &$crate::HostSys, &claim_uid))
                }
            }

            // Native builds (unit tests) link as ordinary libraries: the component's export
            // symbols (`devplug:backend/backend@0.3.0#init`) are not valid native linker names.
            #[cfg(target_arch = "wasm32")]
            $crate::bindings::export!(Export with_types_in $crate::bindings);
        }
    };
}
