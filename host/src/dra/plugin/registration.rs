//! Kubelet finding a driver's DRA plugin: the registration socket
//! `plugins_registry/DRIVER-reg.sock` served with [`crate::plugin_socket::Registration`] (type
//! `DRAPlugin`, the driver's name, the endpoint of its `dra.sock`, the versions of
//! [`dra::SERVICES`] and the health services). Kubelet's plugin watcher calls `GetInfo` when the
//! socket appears (and again after kubelet restarts) and reports the outcome through
//! `NotifyRegistrationStatus`; each report of success is a moment to check the driver's
//! ResourceSlices, since kubelet deletes a node's slices when it starts.

use std::path::{Path, PathBuf};

use crate::proto::pluginregistration as pr;
use crate::proto::{dra, dra_health};

/// The registration socket of `driver` in `registry_dir`.
pub(crate) fn registration_socket(registry_dir: &Path, driver: &str) -> PathBuf {
    registry_dir.join(format!("{driver}-reg.sock"))
}

/// The DRA service socket of `driver` in kubelet's plugins dir.
pub fn plugin_socket(plugins_dir: &Path, driver: &str) -> PathBuf {
    plugins_dir.join(driver).join("dra.sock")
}

/// What the registration service tells kubelet about `driver` serving on `endpoint`: the
/// DRAPlugin versions newest first (kubelet picks the first it speaks), then the health
/// services.
pub fn info(driver: &str, endpoint: &Path) -> pr::PluginInfo {
    pr::PluginInfo {
        r#type: pr::DRA_PLUGIN.to_owned(),
        name: driver.to_owned(),
        endpoint: endpoint.display().to_string(),
        supported_versions: dra::SERVICES.iter().chain(dra_health::SERVICES.iter()).map(|s| (*s).to_owned()).collect(),
    }
}
