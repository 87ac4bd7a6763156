//! Registering with kubelet in socket mode: the `v1beta1.Registration/Register` call on
//! `kubelet.sock`. (Watcher mode serves [`crate::plugin_socket::Registration`].)

use std::path::Path;
use std::time::Duration;

use super::{ResourceHandle, uds};
use crate::proto::deviceplugin as dp;

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
