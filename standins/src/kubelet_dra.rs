//! Kubelet's DRA side, as a handler of the kubelet stand-in's plugin watcher (type
//! `DRAPlugin`), doing what kubelet's DRA manager does: validate the plugin's name and
//! versions (the first service the plugin lists that this kubelet knows, as
//! `validateSupportedServices` picks; none known is a refusal), dial its endpoint, call `NodePrepareResources` / `NodeUnprepareResources` in that
//! version, and at its own start delete the node's ResourceSlices (kubelet's
//! `wipeResourceSlices`: no driver is usable until it registers again).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::proto::dra::{v1, v1beta1};
use crate::proto::pluginregistration as pr;
use tonic::transport::Channel;

use crate::apiserver::ApiServer;
use crate::kubelet::{DIAL_TIMEOUT, PluginHandler};
use crate::uds;

/// What kubelet 1.34+ knows, newest first (1.32-1.33 know only `v1beta1.DRAPlugin`).
pub const KNOWN_1_34: &[&str] = &["v1.DRAPlugin", "v1beta1.DRAPlugin"];
pub const KNOWN_1_33: &[&str] = &["v1beta1.DRAPlugin"];

/// A registered DRA plugin.
#[derive(Clone)]
pub struct DraConn {
    pub driver: String,
    pub version: &'static str,
    pub endpoint: PathBuf,
    channel: Channel,
}

/// One claim's answer, whatever the version spoken.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prepared {
    pub error: String,
    /// (requests, pool, device, CDI IDs)
    pub devices: Vec<(Vec<String>, String, String, Vec<String>)>,
    /// Each device's share ID ("" when none; v1beta1 has none).
    pub shares: Vec<String>,
}

/// A prepared device's share ID, in whichever version it came.
trait ShareId {
    fn share(&self) -> String;
}

impl ShareId for v1::Device {
    fn share(&self) -> String {
        self.share_id.clone()
    }
}

impl ShareId for v1beta1::Device {
    fn share(&self) -> String {
        String::new()
    }
}

pub struct DraKubelet {
    known: &'static [&'static str],
    node: String,
    api: Arc<ApiServer>,
    plugins: Mutex<HashMap<String, DraConn>>,
    pub registrations: std::sync::atomic::AtomicU64,
}

impl DraKubelet {
    pub fn new(known: &'static [&'static str], node: &str, api: Arc<ApiServer>) -> Arc<Self> {
        Arc::new(DraKubelet {
            known,
            node: node.to_owned(),
            api,
            plugins: Mutex::default(),
            registrations: Default::default(),
        })
    }

    pub fn plugin(&self, driver: &str) -> Option<DraConn> {
        self.plugins.lock().unwrap().get(driver).cloned()
    }

    /// Wait until `driver` is registered (polling the handler's own state).
    pub async fn wait_plugin(&self, driver: &str, timeout: Duration) -> DraConn {
        let end = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(p) = self.plugin(driver) {
                return p;
            }
            assert!(tokio::time::Instant::now() < end, "DRA plugin {driver} did not register within {timeout:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Dial `driver`'s endpoint again on a new connection for every call after this, as kubelet
    /// does after a restart (its old connection is dropped).
    pub async fn redial(&self, driver: &str) -> anyhow::Result<()> {
        let p = self.plugin(driver).ok_or_else(|| anyhow::anyhow!("{driver} not registered"))?;
        let channel = uds::connect(&p.endpoint, DIAL_TIMEOUT)
            .await
            .map_err(|e| anyhow::anyhow!("dialing {}: {e}", p.endpoint.display()))?;
        self.plugins
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(driver.to_owned(), DraConn { channel, ..p });
        Ok(())
    }

    /// `NodePrepareResources` for claims (namespace, uid, name), by claim UID.
    pub async fn prepare(
        &self,
        driver: &str,
        claims: &[(&str, &str, &str)],
    ) -> Result<HashMap<String, Prepared>, tonic::Status> {
        let p = self.plugin(driver).ok_or_else(|| tonic::Status::unavailable(format!("{driver} not registered")))?;
        if p.version == "v1.DRAPlugin" {
            in_version!(v1, p, claims, prepare)
        } else {
            in_version!(v1beta1, p, claims, prepare)
        }
    }

    /// `NodeUnprepareResources`: each claim's error ("" when it went well), by claim UID.
    pub async fn unprepare(
        &self,
        driver: &str,
        claims: &[(&str, &str, &str)],
    ) -> Result<HashMap<String, String>, tonic::Status> {
        let p = self.plugin(driver).ok_or_else(|| tonic::Status::unavailable(format!("{driver} not registered")))?;
        if p.version == "v1.DRAPlugin" {
            in_version!(v1, p, claims, unprepare)
        } else {
            in_version!(v1beta1, p, claims, unprepare)
        }
    }
}

impl DraKubelet {
    /// Open `NodeWatchResources` on `driver`'s socket, as kubelet 1.34-1.36 does for health
    /// (`v1alpha1`, always, on the DRA connection).
    pub async fn watch_health(
        &self,
        driver: &str,
    ) -> Result<tonic::Streaming<crate::proto::dra_health::v1alpha1::NodeWatchResourcesResponse>, tonic::Status> {
        use crate::proto::dra_health::v1alpha1 as h;
        let p = self.plugin(driver).ok_or_else(|| tonic::Status::unavailable(format!("{driver} not registered")))?;
        let mut client = h::dra_resource_health_client::DraResourceHealthClient::new(p.channel);
        Ok(client.node_watch_resources(h::NodeWatchResourcesRequest {}).await?.into_inner())
    }
}

/// What kubelet makes of a driver's health reports (`pkg/kubelet/cm/dra/healthinfo.go`): each
/// device's last report with the time it arrived; a device whose report is older than its
/// `health_check_timeout_seconds` (30 s when unset, zero or negative) is `Unknown`.
#[derive(Default)]
pub struct HealthView {
    devices: HashMap<String, (i32, tokio::time::Instant, Duration, String)>,
}

/// Kubelet's default health timeout.
pub const DEFAULT_HEALTH_TIMEOUT: Duration = Duration::from_secs(30);

impl HealthView {
    /// A report arrived now.
    pub fn record(&mut self, list: &crate::proto::dra_health::v1alpha1::NodeWatchResourcesResponse) {
        let now = tokio::time::Instant::now();
        for d in &list.devices {
            let Some(id) = &d.device else { continue };
            let timeout = if d.health_check_timeout_seconds > 0 {
                Duration::from_secs(d.health_check_timeout_seconds as u64)
            } else {
                DEFAULT_HEALTH_TIMEOUT
            };
            self.devices.insert(id.device_name.clone(), (d.health, now, timeout, d.message.clone()));
        }
    }

    /// Each device's health as kubelet shows it now: "Healthy", "Unhealthy" or "Unknown".
    pub fn health(&self) -> HashMap<String, &'static str> {
        let now = tokio::time::Instant::now();
        self.devices
            .iter()
            .map(|(name, (h, at, timeout, _))| {
                let shown = if now.duration_since(*at) > *timeout {
                    "Unknown"
                } else if *h == 1 {
                    "Healthy"
                } else if *h == 2 {
                    "Unhealthy"
                } else {
                    "Unknown"
                };
                (name.clone(), shown)
            })
            .collect()
    }

    /// The message of a device's last report.
    pub fn message(&self, device: &str) -> Option<&str> {
        self.devices.get(device).map(|d| d.3.as_str())
    }
}

/// One call in API version `$m` (the versions' generated types are distinct but alike).
macro_rules! in_version {
    ($m:ident, $p:expr, $claims:expr, $call:ident) => {{
        let claims: Vec<$m::Claim> = $claims
            .iter()
            .map(|(ns, uid, name)| $m::Claim { namespace: (*ns).into(), uid: (*uid).into(), name: (*name).into() })
            .collect();
        let mut client = $m::dra_plugin_client::DraPluginClient::new($p.channel);
        in_version!(@$call $m, client, claims)
    }};
    (@prepare $m:ident, $client:ident, $claims:ident) => {{
        let r = $client.node_prepare_resources($m::NodePrepareResourcesRequest { claims: $claims }).await?;
        Ok(r.into_inner()
            .claims
            .into_iter()
            .map(|(uid, c)| {
                let shares = c.devices.iter().map(ShareId::share).collect();
                let devices = c.devices.into_iter().map(|d| (d.request_names, d.pool_name, d.device_name, d.cdi_device_ids)).collect();
                (uid, Prepared { error: c.error, devices, shares })
            })
            .collect())
    }};
    (@unprepare $m:ident, $client:ident, $claims:ident) => {{
        let r = $client.node_unprepare_resources($m::NodeUnprepareResourcesRequest { claims: $claims }).await?;
        Ok(r.into_inner().claims.into_iter().map(|(uid, c)| (uid, c.error)).collect())
    }};
}
use in_version;

/// Kubelet's check of a driver name: a DNS subdomain (written here independently of devplug's).
fn driver_name_ok(name: &str) -> bool {
    name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

#[tonic::async_trait]
impl PluginHandler for DraKubelet {
    async fn register(&self, _socket: &Path, info: &pr::PluginInfo) -> Result<(), String> {
        if !driver_name_ok(&info.name) {
            return Err(format!("DRA plugin name {:?} is not a DNS subdomain", info.name));
        }
        if info.supported_versions.is_empty() {
            return Err(format!("registering DRA plugin {:?}: empty list for supported versions", info.name));
        }
        let Some(version) =
            info.supported_versions.iter().find_map(|v| self.known.iter().find(|k| **k == v.as_str()).copied())
        else {
            return Err(format!(
                "registering DRA plugin {:?}: none of the versions specified {:?} are supported",
                info.name, info.supported_versions
            ));
        };
        let endpoint = PathBuf::from(&info.endpoint);
        if !endpoint.is_absolute() {
            return Err(format!("DRA plugin {:?}: endpoint {:?} is not an absolute path", info.name, info.endpoint));
        }
        let channel =
            uds::connect(&endpoint, DIAL_TIMEOUT).await.map_err(|e| format!("dialing {}: {e}", endpoint.display()))?;
        self.plugins
            .lock()
            .unwrap()
            .insert(info.name.clone(), DraConn { driver: info.name.clone(), version, endpoint, channel });
        self.registrations.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

    async fn restarted(&self) {
        self.plugins.lock().unwrap().clear();
        self.api.wipe(&self.node);
    }
}
