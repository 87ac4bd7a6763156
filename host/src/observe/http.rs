//! `/healthz` (the process answers) and `/readyz` (every resource with devices is registered with
//! kubelet) on the `--metrics-addr` listener; the DaemonSet's probes use them.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use tokio_util::sync::CancellationToken;

use crate::kubelet::{EndpointState, Endpoints};

/// What the probes look at.
#[derive(Clone)]
pub struct Health {
    pub endpoints: Arc<Endpoints>,
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(h): State<Health>) -> (StatusCode, String) {
    let states = h.endpoints.states().await;
    let waiting: Vec<String> =
        states.iter().filter(|(_, s)| *s != EndpointState::Registered).map(|(n, s)| format!("{n}: {s:?}")).collect();
    if waiting.is_empty() {
        (StatusCode::OK, format!("ready: {} resources registered\n", states.len()))
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, format!("not ready:\n{}\n", waiting.join("\n")))
    }
}

/// Serve the probes until `stop`. Binding errors are returned so a port clash is reported.
pub async fn serve(addr: SocketAddr, health: Health, stop: CancellationToken) -> anyhow::Result<()> {
    let app = Router::new().route("/healthz", get(healthz)).route("/readyz", get(readyz)).with_state(health);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr} (--metrics-addr): {e}"))?;
    tracing::info!(%addr, "serving /healthz and /readyz");
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned()).await {
            tracing::warn!(error = %e, "health endpoint stopped");
        }
    });
    Ok(())
}
