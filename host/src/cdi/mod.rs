//! Container Device Interface: one spec file per resource in the CDI directory, so runtimes
//! (containerd, CRI-O, podman) can inject a device by its qualified name `vendor/class=name`.
//!
//! [`names`] holds the naming rules, [`spec`] builds a spec from a device list, [`store`] owns
//! devplug's files in the directory and writes them crash-safely.

pub mod names;
pub mod spec;
pub mod store;

pub use names::{Kind, device_name};
pub use spec::Spec;
pub use store::{CdiError, SpecDir};

use crate::runtime::caps::{Jail, Rule};

/// A jail over the host's `/dev` that may look at everything: the host itself, not a backend,
/// reads node types and numbers for the specs.
pub fn dev_view(dev_root: &std::path::Path) -> Jail {
    let all = vec!["**".to_owned()];
    // Both globs are constants and compile.
    let rule = Rule::new(&all, &all).unwrap_or_else(|e| unreachable!("constant glob: {e}"));
    Jail::new(dev_root, rule)
}
