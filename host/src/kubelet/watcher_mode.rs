//! Plugin-watcher mode: serve the resource's socket in kubelet's `plugins_registry` together
//! with the `pluginregistration` service ([`crate::plugin_socket::Registration`]); kubelet's
//! watcher finds it, asks `GetInfo` and reports through `NotifyRegistrationStatus`, also after
//! a restart of its own. Only our socket vanishing needs devplug to act — and, in `auto` mode,
//! a watcher that never calls: then devplug registers through `kubelet.sock` instead.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::broadcast;

use super::dirwatch::DirEvent;
use super::plumbing::{EndpointCtx, FIRST_BACKOFF, back_off, finish, serve, stop_server};
use super::service::{DevicePluginService, StreamTracker};
use super::{ResourceHandle, names};
use crate::plugin_socket::{Registration, Stage};
use crate::proto::deviceplugin as dp;
use crate::proto::deviceplugin::KUBELET_SOCKET;
use crate::proto::pluginregistration as pr;

/// How the watcher-mode endpoint ended.
pub(super) enum Ended {
    /// Cancelled: the socket is removed.
    Stopped,
    /// `auto` mode, and kubelet's watcher never called within the patience while `kubelet.sock`
    /// is there: register through it instead (the socket is removed).
    FallBack(EndpointCtx),
}

/// Serve `handle` where kubelet's plugin watcher finds it until the endpoint is cancelled (or,
/// with `fall_back`, until it is clear the watcher will not call).
pub(super) async fn run(mut ctx: EndpointCtx, handle: ResourceHandle, fall_back: bool) -> Ended {
    let resource = handle.name.clone();
    let sock_path: PathBuf = ctx.paths.plugins_registry_dir.join(names::socket_file_name(&resource));
    let kubelet_sock = ctx.paths.device_plugin_dir.join(KUBELET_SOCKET);
    ctx.registering_at(crate::plugin_socket::Mode::PluginWatcher, &sock_path);
    let mut registered = ctx.registration.subscribe();
    let mut seen = 0u64;
    let mut backoff = FIRST_BACKOFF;
    loop {
        let stop = ctx.cancel.child_token();
        let tracker = Arc::new(StreamTracker::default());
        let svc = DevicePluginService::new(handle.clone(), tracker, stop.clone());
        let info = pr::PluginInfo {
            r#type: pr::DEVICE_PLUGIN.to_owned(),
            name: resource.clone(),
            endpoint: sock_path.display().to_string(),
            supported_versions: vec![dp::VERSION.to_owned()],
        };
        let reg = Registration::new(info, ctx.registration.clone());
        let server = match serve(&sock_path, svc, Some(reg), stop.clone()) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(resource = %resource, socket = %sock_path.display(), error = %e, "cannot serve the plugin socket; retrying");
                if !back_off(&mut ctx, &mut backoff, None).await {
                    return Ended::Stopped;
                }
                continue;
            }
        };
        backoff = FIRST_BACKOFF;
        ctx.set(Stage::Serving);
        tracing::info!(resource = %resource, socket = %sock_path.display(), "serving for kubelet's plugin watcher");
        let patience = tokio::time::sleep(ctx.patience);
        tokio::pin!(patience);
        // Kubelet's watcher finds the socket by itself, also after a kubelet restart; only the
        // socket vanishing needs us.
        loop {
            tokio::select! {
                _ = ctx.cancel.cancelled() => {
                    finish(&stop, server, &sock_path).await;
                    return Ended::Stopped;
                }
                _ = &mut patience, if fall_back && seen == 0 => {
                    // Looked at again every `patience` until kubelet calls or falling back is
                    // possible (a finished sleep would fire again at once).
                    patience.as_mut().reset(tokio::time::Instant::now() + ctx.patience);
                    let asked = ctx.registration.borrow().info_asked;
                    if asked == 0 && kubelet_sock.exists() {
                        tracing::warn!(resource = %resource, socket = %sock_path.display(), kubelet = %kubelet_sock.display(),
                            "kubelet's plugin watcher never called in {:?}; registering through kubelet.sock instead (set registration = \"kubelet-socket\" or \"plugin-watcher\" to choose)", ctx.patience);
                        finish(&stop, server, &sock_path).await;
                        return Ended::FallBack(ctx);
                    }
                }
                r = registered.changed() => {
                    if r.is_err() {
                        finish(&stop, server, &sock_path).await;
                        return Ended::Stopped;
                    }
                    // The Registration service moved the stage itself; count what is new.
                    let count = registered.borrow_and_update().registered;
                    if count > seen {
                        seen = count;
                        ctx.registrations.fetch_add(1, Ordering::Relaxed);
                        if let Some(m) = &handle.metrics {
                            m.registered(&resource, count > 1);
                        }
                    }
                }
                ev = ctx.events.recv() => match ev {
                    Ok(DirEvent::Removed(p)) if p == sock_path && !sock_path.exists() => break,
                    Err(broadcast::error::RecvError::Lagged(_)) if !sock_path.exists() => break,
                    Err(broadcast::error::RecvError::Closed) => {
                        finish(&stop, server, &sock_path).await;
                        return Ended::Stopped;
                    }
                    _ => {}
                },
            }
        }
        tracing::info!(resource = %resource, "plugin socket deleted; serving it again");
        stop_server(&stop, server).await;
    }
}
