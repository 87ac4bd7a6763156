//! Registering with kubelet: the `v1beta1.Registration/Register` call (socket mode) and the
//! `pluginregistration.Registration` service kubelet's plugin watcher calls (watcher mode).

use std::path::Path;
use std::time::Duration;

use tokio::sync::watch;
use tonic::{Request, Response, Status};

use super::state::EndpointState;
use super::{KubeletMetrics, ResourceHandle, uds};
use crate::proto::deviceplugin as dp;
use crate::proto::pluginregistration as pr;

/// Kubelet dials back inside Register with a 10 s timeout; allow for that plus slack.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(15);

/// How long a `kubelet.sock` that refuses connections is given to start listening: the file
/// appears at `bind`, a moment before kubelet's `listen`, and a fresh kubelet answers within
/// milliseconds. Past this, kubelet is really not there.
const CONNECT_PATIENCE: Duration = Duration::from_secs(1);
const CONNECT_RETRY: Duration = Duration::from_millis(5);

/// Call Register on kubelet's socket. Our own server must already be serving `endpoint`.
pub async fn register(kubelet_sock: &Path, endpoint: &str, handle: &ResourceHandle) -> anyhow::Result<()> {
    let give_up = tokio::time::Instant::now() + CONNECT_PATIENCE;
    let channel = loop {
        match uds::connect(kubelet_sock, Duration::from_secs(5)).await {
            Ok(c) => break c,
            Err(_) if tokio::time::Instant::now() < give_up => tokio::time::sleep(CONNECT_RETRY).await,
            Err(e) => anyhow::bail!("cannot connect to {}: {e}", kubelet_sock.display()),
        }
    };
    let mut client = dp::registration_client::RegistrationClient::new(channel);
    let req = dp::RegisterRequest {
        version: dp::VERSION.to_owned(),
        endpoint: endpoint.to_owned(),
        resource_name: handle.name.clone(),
        options: Some(dp::DevicePluginOptions {
            pre_start_required: handle.options.pre_start_required,
            get_preferred_allocation_available: handle.options.preferred_allocation,
        }),
    };
    match tokio::time::timeout(REGISTER_TIMEOUT, client.register(req)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(status)) => Err(anyhow::anyhow!("kubelet refused the registration: {}", status.message())),
        Err(_) => Err(anyhow::anyhow!("kubelet did not answer Register within {REGISTER_TIMEOUT:?}")),
    }
}

/// What kubelet's plugin watcher asks of a plugin socket in `plugins_registry`.
pub struct WatcherRegistration {
    pub resource: String,
    /// Absolute path of the socket serving DevicePlugin (the same socket).
    pub endpoint: String,
    pub state: watch::Sender<EndpointState>,
    pub registered: std::sync::Arc<std::sync::atomic::AtomicU64>,
    pub metrics: Option<std::sync::Arc<dyn KubeletMetrics>>,
    pub first: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

#[tonic::async_trait]
impl pr::registration_server::Registration for WatcherRegistration {
    async fn get_info(&self, _: Request<pr::InfoRequest>) -> Result<Response<pr::PluginInfo>, Status> {
        Ok(Response::new(pr::PluginInfo {
            r#type: pr::DEVICE_PLUGIN.to_owned(),
            name: self.resource.clone(),
            endpoint: self.endpoint.clone(),
            supported_versions: vec![dp::VERSION.to_owned()],
        }))
    }

    async fn notify_registration_status(
        &self,
        req: Request<pr::RegistrationStatus>,
    ) -> Result<Response<pr::RegistrationStatusResponse>, Status> {
        let s = req.into_inner();
        if s.plugin_registered {
            self.registered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let again = !self.first.swap(false, std::sync::atomic::Ordering::Relaxed);
            if let Some(m) = &self.metrics {
                m.registered(&self.resource, again);
            }
            tracing::info!(resource = %self.resource, mode = "plugin-watcher", "registered with kubelet");
            self.state.send_replace(EndpointState::Registered);
        } else {
            tracing::warn!(resource = %self.resource, error = %s.error, "kubelet's plugin watcher refused the registration");
            self.state.send_replace(EndpointState::Refused(s.error));
        }
        Ok(Response::new(pr::RegistrationStatusResponse {}))
    }
}
