//! The GPU backend's config (TOML, every key optional), checked whole at `init` so a typo is an
//! `invalid-config` error naming the key instead of a silently ignored option.
//!
//! ```toml
//! vendors = ["nvidia", "amd", "intel"]   # which vendors to serve
//! device_id_strategy = "index"            # NVIDIA_VISIBLE_DEVICES by minor ("index") or "uuid"
//! cdi_device_names = "devplug"            # or "nvidia-ctk": CDI names 0, GPU-<uuid>, all
//! [names]                                 # resource name overrides
//! nvidia = "nvidia.com/gpu"
//! [sharing]                               # time-slicing, see devplug_sdk::sharing
//! replicas = 4
//! [mig]
//! strategy = "mixed"                      # none | single | mixed
//! [mig.profiles]                          # GPU instance ID → profile, per GPU or for "all"
//! all = { 1 = "3g.40gb", 2 = "2g.20gb", 3 = "1g.10gb", 4 = "1g.10gb" }
//! ```

use std::collections::BTreeMap;

use devplug_sdk::pci::is_pci_address;
use devplug_sdk::sharing::Sharing;
use devplug_sdk::{BackendError, invalid_config};
use serde::Deserialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Vendor {
    Nvidia,
    Amd,
    Intel,
}

/// How `NVIDIA_VISIBLE_DEVICES` names the GPUs of an Allocate (NVIDIA's `deviceIDStrategy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IdStrategy {
    /// The GPU's minor (`/dev/nvidiaN`), which is its index on every machine whose driver
    /// numbers GPUs in PCI order (the default).
    #[default]
    Index,
    /// `GPU-<uuid>` from the driver; the minor where the driver's word is not readable.
    Uuid,
}

/// How the CDI spec names each device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CdiNames {
    /// The device ID (`nvidia.com/gpu=0000:18:00.0`).
    #[default]
    Devplug,
    /// The names `nvidia-ctk cdi generate` writes: `nvidia.com/gpu=0`, `=GPU-<uuid>`, `=all`.
    NvidiaCtk,
}

/// How MIG instances are advertised (NVIDIA's `migStrategy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MigStrategy {
    /// MIG is ignored: every GPU is one `nvidia.com/gpu`.
    #[default]
    None,
    /// Every GPU is in MIG mode with one profile throughout; the instances are `nvidia.com/gpu`.
    Single,
    /// Full GPUs are `nvidia.com/gpu`, instances `nvidia.com/mig-<profile>`.
    Mixed,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Mig {
    pub strategy: MigStrategy,
    /// `"all"` or a PCI address → GPU instance ID → profile (`1g.10gb`). The driver's `/proc`
    /// says which instances exist and their device nodes, but not their profile: only NVML
    /// knows, and a sandboxed backend has no NVML. `nvidia-smi mig -lgi` shows both.
    pub profiles: BTreeMap<String, BTreeMap<String, String>>,
}

impl Mig {
    /// The profile of GPU instance `gi` on the GPU at `pci`, if the operator said it.
    pub fn profile(&self, pci: &str, gi: u32) -> Option<&str> {
        let key = gi.to_string();
        [pci, "all"].iter().find_map(|g| self.profiles.get(*g)?.get(&key)).map(String::as_str)
    }

    /// Every profile the config names, sorted, once.
    pub fn all_profiles(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.profiles.values().flat_map(|m| m.values().map(String::as_str)).collect();
        v.sort();
        v.dedup();
        v
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub vendors: Option<Vec<Vendor>>,
    #[serde(default)]
    pub names: Names,
    #[serde(default)]
    pub sharing: Sharing,
    #[serde(default)]
    pub device_id_strategy: IdStrategy,
    #[serde(default)]
    pub cdi_device_names: CdiNames,
    #[serde(default)]
    pub mig: Mig,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Names {
    pub nvidia: String,
    pub amd: String,
    pub intel_i915: String,
    pub intel_xe: String,
}

impl Default for Names {
    fn default() -> Self {
        Names {
            nvidia: "nvidia.com/gpu".into(),
            amd: "amd.com/gpu".into(),
            intel_i915: "gpu.intel.com/i915".into(),
            intel_xe: "gpu.intel.com/xe".into(),
        }
    }
}

impl Names {
    /// The resource of MIG profile `profile` under the mixed strategy: `nvidia.com/mig-1g.10gb`
    /// (a `+` as in `1g.10gb+me` is not allowed in a resource name and becomes `.`, as NVIDIA's
    /// plugin does).
    pub fn mig(&self, profile: &str) -> String {
        let domain = self.nvidia.split_once('/').map_or("nvidia.com", |(d, _)| d);
        format!("{domain}/mig-{}", profile.replace('+', "."))
    }
}

impl Config {
    pub fn parse(text: &str) -> Result<Config, BackendError> {
        let cfg: Config = toml::from_str(text).map_err(invalid_config)?;
        for (gpu, instances) in &cfg.mig.profiles {
            if gpu != "all" && !is_pci_address(gpu) {
                return Err(invalid_config(format!(
                    "[mig.profiles] key {gpu:?} is neither \"all\" nor a PCI address like \"0000:07:00.0\""
                )));
            }
            for (gi, profile) in instances {
                if gi.parse::<u32>().is_err() {
                    return Err(invalid_config(format!(
                        "[mig.profiles] {gpu:?}: {gi:?} is not a GPU instance ID (the number `nvidia-smi mig -lgi` shows)"
                    )));
                }
                if !is_profile(profile) {
                    return Err(invalid_config(format!(
                        "[mig.profiles] {gpu:?}.{gi}: {profile:?} is not a MIG profile like \"1g.10gb\" or \"1g.10gb+me\""
                    )));
                }
            }
        }
        if cfg.sharing.replicas > 64 {
            return Err(invalid_config(format!("[sharing] replicas = {} is more than 64", cfg.sharing.replicas)));
        }
        Ok(cfg)
    }
}

/// `<n>g.<m>gb` with an optional `+me`/`+gfx`-style suffix.
fn is_profile(p: &str) -> bool {
    let (core, suffix) = p.split_once('+').unwrap_or((p, ""));
    let Some((slices, mem)) = core.split_once("g.") else { return false };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    digits(slices)
        && mem.strip_suffix("gb").is_some_and(digits)
        && suffix.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_are_checked_and_found_per_gpu_before_all() {
        let c = Config::parse(
            "[mig]\nstrategy = \"mixed\"\n[mig.profiles]\nall = { 1 = \"3g.40gb\" }\n\"0000:07:00.0\" = { 1 = \"4g.40gb\", 5 = \"1g.10gb+me\" }\n",
        )
        .unwrap();
        assert_eq!(c.mig.profile("0000:07:00.0", 1), Some("4g.40gb"));
        assert_eq!(c.mig.profile("0000:0f:00.0", 1), Some("3g.40gb"));
        assert_eq!(c.mig.profile("0000:0f:00.0", 2), None);
        assert_eq!(c.mig.all_profiles(), ["1g.10gb+me", "3g.40gb", "4g.40gb"]);
        assert_eq!(c.names.mig("1g.10gb+me"), "nvidia.com/mig-1g.10gb.me");
        for bad in [
            "[mig.profiles]\ngpu0 = { 1 = \"1g.10gb\" }",
            "[mig.profiles]\nall = { one = \"1g.10gb\" }",
            "[mig.profiles]\nall = { 1 = \"big\" }",
            "[mig]\nstrategy = \"sometimes\"",
            "device_id_strategy = \"serial\"",
            "[sharing]\nreplicas = 1000",
        ] {
            assert!(matches!(Config::parse(bad), Err(BackendError::InvalidConfig(_))), "{bad}");
        }
    }
}
