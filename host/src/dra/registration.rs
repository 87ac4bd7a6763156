//! Kubelet finding a driver's DRA plugin: the `pluginregistration.Registration` service on
//! `plugins_registry/DRIVER-reg.sock` (type `DRAPlugin`, the driver's name, the endpoint of its
//! `dra.sock`, the versions of [`dra::SERVICES`]). Kubelet's plugin watcher calls `GetInfo`
//! when the socket appears (and again after kubelet restarts) and reports the outcome through
//! `NotifyRegistrationStatus`; each report of success is a moment to check the driver's
//! ResourceSlices, since kubelet deletes a node's slices when it starts.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use crate::proto::dra;
use crate::proto::pluginregistration as pr;

/// The registration socket of `driver` in `registry_dir`.
pub fn registration_socket(registry_dir: &Path, driver: &str) -> PathBuf {
    registry_dir.join(format!("{driver}-reg.sock"))
}

/// The DRA service socket of `driver` in kubelet's plugins dir.
pub fn plugin_socket(plugins_dir: &Path, driver: &str) -> PathBuf {
    plugins_dir.join(driver).join("dra.sock")
}

/// What the registration service tells kubelet, and whom it tells of kubelet's answer.
pub struct DraRegistration {
    pub driver: String,
    pub endpoint: String,
    /// Woken on every successful registration.
    pub registered: Arc<Notify>,
}

#[tonic::async_trait]
impl pr::registration_server::Registration for DraRegistration {
    async fn get_info(&self, _: Request<pr::InfoRequest>) -> Result<Response<pr::PluginInfo>, Status> {
        Ok(Response::new(pr::PluginInfo {
            r#type: pr::DRA_PLUGIN.to_owned(),
            name: self.driver.clone(),
            endpoint: self.endpoint.clone(),
            supported_versions: dra::SERVICES.iter().map(|s| (*s).to_owned()).collect(),
        }))
    }

    async fn notify_registration_status(
        &self,
        req: Request<pr::RegistrationStatus>,
    ) -> Result<Response<pr::RegistrationStatusResponse>, Status> {
        let s = req.into_inner();
        if s.plugin_registered {
            tracing::info!(driver = %self.driver, "DRA plugin registered with kubelet");
            self.registered.notify_one();
        } else {
            tracing::error!(driver = %self.driver, error = %s.error, "kubelet refused the DRA plugin");
        }
        Ok(Response::new(pr::RegistrationStatusResponse {}))
    }
}

/// Serve `reg` on `path` (a stale socket there is replaced) until `stop`.
pub fn serve(reg: DraRegistration, path: &Path, stop: CancellationToken) -> std::io::Result<JoinHandle<()>> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let incoming = UnixListenerStream::new(tokio::net::UnixListener::bind(path)?);
    let router = tonic::transport::Server::builder().add_service(pr::registration_server::RegistrationServer::new(reg));
    let shown = path.display().to_string();
    Ok(tokio::spawn(async move {
        if let Err(e) = router.serve_with_incoming_shutdown(incoming, stop.cancelled_owned()).await {
            tracing::warn!(socket = %shown, error = %e, "DRA registration server stopped with an error");
        }
    }))
}
