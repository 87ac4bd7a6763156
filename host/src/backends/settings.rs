//! What the operator configures about backends: per-backend settings (`[backends.NAME]`), the
//! grant a backend gets when the config names none, and where backends come from.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use crate::runtime::caps::Globs;

/// What a backend from the directory may touch when the config grants it nothing explicitly.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum DefaultGrant {
    /// Nothing (the safe default): every third-party backend needs an explicit grant.
    #[default]
    None,
    /// Whatever its manifest requests.
    Requested,
}

/// Per-backend settings.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendSettings {
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Passed to the backend's `init` as is (TOML by convention).
    #[serde(default)]
    pub config: String,
    /// Capabilities granted; `None` → the default for the backend's origin.
    pub grant: Option<Globs>,
    /// Let a `NAME.wasm` in the backends directory replace the embedded backend `NAME` (and so
    /// receive this entry's config and grant). Off by default: a file must not take a
    /// first-party backend's place, or its grant, by its name alone.
    #[serde(default)]
    pub replace_embedded: bool,
    /// Take this backend from a registry: `registry/repo:tag` (followed) or `registry/repo@sha256:…`
    /// (pinned). See `[registry]`.
    #[serde(default)]
    pub image: Option<String>,
    /// The DRA driver name its resources served through DRA are published under (default
    /// `NAME.devplug.io`); a vendor's own name (`gpu.nvidia.com`) lets DeviceClasses written for
    /// the vendor's driver select devplug's devices.
    #[serde(default)]
    pub dra_driver: Option<String>,
    /// `grant` is there but says nothing of `resources` (configs written before devplug 0.2.0,
    /// when a grant had only `sysfs` and `dev`): every kind added since gets the origin's default
    /// grant, with a warning (see `Loaded::capabilities`). Set by `Config::parse`.
    #[serde(skip)]
    pub grant_resources_unstated: bool,
}

impl Default for BackendSettings {
    fn default() -> Self {
        BackendSettings {
            enabled: true,
            config: String::new(),
            grant: None,
            replace_embedded: false,
            image: None,
            dra_driver: None,
            grant_resources_unstated: false,
        }
    }
}

fn yes() -> bool {
    true
}

/// Where the backends to load come from, as the operator configured it.
#[derive(Clone, Copy)]
pub struct Catalog<'a> {
    /// Load the first-party backends built into the binary.
    pub embedded: bool,
    /// The backends directory, if any.
    pub dir: Option<&'a Path>,
    pub settings: &'a BTreeMap<String, BackendSettings>,
}
