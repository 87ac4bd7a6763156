//! Container Device Interface: one spec file per resource in the CDI directory, so runtimes
//! (containerd, CRI-O, podman) can inject a device by its qualified name `vendor/class=name`.
//!
//! [`names`] holds the naming rules, [`spec`] builds a spec from a device list, [`store`] owns
//! devplug's files in the directory and writes them crash-safely.

pub mod names;
pub mod spec;
pub mod store;

pub use names::{CDI_NAME_ATTRIBUTE, Kind, Naming, device_name};
pub use spec::Spec;
pub use store::{CdiError, SpecDir};
