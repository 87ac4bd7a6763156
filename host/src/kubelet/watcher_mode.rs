//! Plugin-watcher mode: serve the resource's socket in kubelet's `plugins_registry` together
//! with the `pluginregistration` service; kubelet's watcher finds it, asks `GetInfo` and reports
//! through `NotifyRegistrationStatus` (see [`super::registration`]), also after a restart of
//! its own. Only our socket vanishing needs devplug to act.

use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::broadcast;

use super::dirwatch::DirEvent;
use super::plumbing::{EndpointCtx, FIRST_BACKOFF, back_off, finish, serve, stop_server};
use super::registration::WatcherRegistration;
use super::service::{DevicePluginService, StreamTracker};
use super::state::EndpointState;
use super::{ResourceHandle, names};

/// Serve `handle` where kubelet's plugin watcher finds it until the endpoint is cancelled; the
/// socket is removed then.
pub(super) async fn run(mut ctx: EndpointCtx, handle: ResourceHandle) {
    let resource = handle.name.clone();
    // Whether the next registration is the first of this endpoint (for the metrics).
    let first = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sock_path: PathBuf = ctx.paths.plugins_registry_dir.join(names::socket_file_name(&resource));
    let mut backoff = FIRST_BACKOFF;
    loop {
        let stop = ctx.cancel.child_token();
        let tracker = Arc::new(StreamTracker::default());
        let svc = DevicePluginService::new(handle.clone(), tracker, stop.clone());
        let reg = WatcherRegistration {
            resource: resource.clone(),
            endpoint: sock_path.display().to_string(),
            state: ctx.state.clone(),
            registered: ctx.registrations.clone(),
            metrics: handle.metrics.clone(),
            first: first.clone(),
        };
        let server = match serve(&sock_path, svc, Some(reg), stop.clone()) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(resource = %resource, socket = %sock_path.display(), error = %e, "cannot serve the plugin socket; retrying");
                if !back_off(&mut ctx, &mut backoff, None).await {
                    return;
                }
                continue;
            }
        };
        backoff = FIRST_BACKOFF;
        ctx.state.send_replace(EndpointState::WaitingForKubelet);
        tracing::info!(resource = %resource, socket = %sock_path.display(), "serving for kubelet's plugin watcher");
        // Kubelet's watcher finds the socket by itself, also after a kubelet restart; only the
        // socket vanishing needs us.
        loop {
            tokio::select! {
                _ = ctx.cancel.cancelled() => return finish(&stop, server, &sock_path).await,
                ev = ctx.events.recv() => match ev {
                    Ok(DirEvent::Removed(p)) if p == sock_path && !sock_path.exists() => break,
                    Err(broadcast::error::RecvError::Lagged(_)) if !sock_path.exists() => break,
                    Err(broadcast::error::RecvError::Closed) => return finish(&stop, server, &sock_path).await,
                    _ => {}
                },
            }
        }
        tracing::info!(resource = %resource, "plugin socket deleted; serving it again");
        stop_server(&stop, server).await;
    }
}
