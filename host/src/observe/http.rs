//! The `--metrics-addr` listener: `/healthz` (the control loop turns), `/readyz` (the first poll is
//! done and every resource with devices is registered with kubelet; the DaemonSet's probes use
//! both), `/metrics` (Prometheus) and `/status` (JSON for `devplug status`).

use std::net::SocketAddr;
use std::sync::Arc;

use std::sync::atomic::{AtomicBool, Ordering};

use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use tokio_util::sync::CancellationToken;

use super::Metrics;
use crate::backends::{Loaded, Statuses};
use crate::kubelet::Endpoints;
use crate::kubelet::podresources::PodAssignments;
use crate::plugin_socket::Stage;

/// What the HTTP endpoints (probes, metrics, status) look at.
#[derive(Clone)]
pub struct Probes {
    pub endpoints: Arc<Endpoints>,
    pub loaded: Arc<Loaded>,
    /// The process's metrics, rendered on `/metrics` with the state read now.
    pub metrics: Arc<Metrics>,
    pub pods: Arc<PodAssignments>,
    /// Set once the first discover round has been published.
    pub polled: Arc<AtomicBool>,
    /// A [`Standby`] as `u8`: whether this devplug stands by for the instance lock.
    pub standby: Arc<std::sync::atomic::AtomicU8>,
    /// Beaten by the control loop on every turn.
    pub heartbeat: Arc<Heartbeat>,
    /// The backends from registries: reference, digest, signature, last check and error.
    pub sources: Arc<Statuses>,
    /// The DRA claims this node holds: prepared, or stuck and how to release them.
    pub claims: Arc<crate::dra::plugin::claims::ClaimBoard>,
    /// Permits for building `/status/devices` pages.
    pub device_pages: Arc<tokio::sync::Semaphore>,
    /// The DRA driver a backend's resources are served through (the config's rule).
    pub dra_driver: Arc<dyn Fn(&str) -> String + Send + Sync>,
}

impl Probes {
    /// Permits for [`Probes::device_pages`].
    pub(crate) fn device_pages() -> Arc<tokio::sync::Semaphore> {
        Arc::new(tokio::sync::Semaphore::new(DEVICE_PAGES_AT_ONCE))
    }
}

/// A control loop that has not turned for this long is stalled: `/healthz` fails, so kubelet's
/// liveness probe restarts the pod. Longer than any one turn may take (a poll is bounded by the
/// discover deadline, a swap by init + discover).
pub const STALLED_AFTER: std::time::Duration = std::time::Duration::from_secs(30);

/// When the control loop last turned.
pub struct Heartbeat {
    start: std::time::Instant,
    last_ms: std::sync::atomic::AtomicU64,
    stalled_after: std::time::Duration,
}

impl Heartbeat {
    pub fn new(stalled_after: std::time::Duration) -> Self {
        Heartbeat { start: std::time::Instant::now(), last_ms: Default::default(), stalled_after }
    }

    pub(crate) fn beat(&self) {
        self.last_ms.store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// How long the loop has not turned, if that is longer than allowed.
    pub fn stalled(&self) -> Option<std::time::Duration> {
        let since =
            self.start.elapsed().saturating_sub(std::time::Duration::from_millis(self.last_ms.load(Ordering::Relaxed)));
        (since > self.stalled_after).then_some(since)
    }
}

async fn healthz(State(h): State<Probes>) -> (StatusCode, String) {
    match h.heartbeat.stalled() {
        None => (StatusCode::OK, "ok\n".into()),
        Some(d) => (StatusCode::SERVICE_UNAVAILABLE, format!("control loop stalled: no turn for {d:.1?}\n")),
    }
}

/// Where a devplug is with the instance lock (`daemon::handover`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standby {
    /// Serving (or never stood by).
    No = 0,
    /// Waiting for the other devplug: ready, so a rolling update goes on.
    Waiting = 1,
    /// Waited past the registration timeout: not ready.
    Overdue = 2,
}

impl From<u8> for Standby {
    fn from(v: u8) -> Standby {
        match v {
            1 => Standby::Waiting,
            2 => Standby::Overdue,
            _ => Standby::No,
        }
    }
}

async fn readyz(State(h): State<Probes>) -> (StatusCode, String) {
    // Standing by is ready: a DaemonSet rolling update with maxSurge deletes the old pod only
    // once the new one is ready, and only then can the new one take over.
    match Standby::from(h.standby.load(Ordering::Acquire)) {
        Standby::Waiting => {
            return (StatusCode::OK, "ready: standby, another devplug serves this node until it exits\n".into());
        }
        Standby::Overdue => {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                "not ready: standing by past the registration timeout; the devplug holding the instance lock has not exited (see the ERROR naming it)\n".into(),
            );
        }
        Standby::No => {}
    }
    if !h.polled.load(Ordering::Acquire) {
        return (StatusCode::SERVICE_UNAVAILABLE, "not ready: backends are still starting\n".into());
    }
    // Every registration with kubelet: the resources' and the DRA drivers'.
    let board = h.endpoints.board();
    let all = board.all();
    let waiting: Vec<String> = all
        .iter()
        .filter(|r| r.stage != Stage::Registered)
        .map(|r| match r.overdue(board.patience) {
            Some(why) => why,
            None => format!("{}: {} ({} on {})", r.subject, r.stage, r.mode, r.socket.display()),
        })
        .collect();
    // Devices two backends both hand out are withheld from both until the config decides: the
    // node serves less than it has, and says so here as well as in the ERROR.
    let contests = h.loaded.contests();
    let (undecided, decided): (Vec<_>, Vec<_>) = contests.iter().partition(|c| !c.decided());
    let waiting: Vec<String> = waiting.into_iter().chain(undecided.iter().map(|c| c.to_string())).collect();
    if waiting.is_empty() {
        let withheld: usize = decided.iter().map(|c| c.withheld).sum();
        let by_config = if withheld > 0 {
            format!("; {withheld} devices withheld by the config's owns (see devplug status)")
        } else {
            String::new()
        };
        (StatusCode::OK, format!("ready: {} registrations with kubelet{by_config}\n", all.len()))
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, format!("not ready:\n{}\n", waiting.join("\n")))
    }
}

async fn metrics(State(h): State<Probes>) -> impl IntoResponse {
    let body = h.metrics.render(&h.loaded, &h.pods.get(), &h.sources.all(), &h.claims);
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], body)
}

async fn status(State(h): State<Probes>) -> Json<super::status::Status> {
    let states: std::collections::BTreeMap<String, String> =
        h.endpoints.states().await.into_iter().map(|(n, s)| (n, s.to_string())).collect();
    let summaries = h.loaded.summaries();
    let registrations = h.endpoints.board().all();
    // A resource served through DRA has no endpoint of its own: its driver's registration is.
    let dra_endpoint = |resource: &str| -> Option<String> {
        if !h.loaded.serves_dra(resource) {
            return None;
        }
        let backend = summaries.iter().find(|b| b.resources.iter().any(|r| r == resource))?;
        let driver = (h.dra_driver)(&backend.name);
        let subject = format!("DRA driver {driver}");
        Some(match registrations.iter().find(|r| r.subject == subject) {
            Some(r) => format!("{subject}: {}", r.stage),
            None => format!("{subject}: not started"),
        })
    };
    let resources: Vec<super::status::ResourceStatus> = h
        .loaded
        .snapshot()
        .iter()
        .map(|r| {
            let healthy = r.devices.iter().filter(|d| d.health == crate::model::Health::Healthy).count();
            let endpoint = states.get(&r.name).cloned().or_else(|| dra_endpoint(&r.name));
            super::status::ResourceStatus {
                name: r.name.clone(),
                healthy,
                unhealthy: r.devices.len() - healthy,
                withheld: h.loaded.withheld(&r.name),
                endpoint: endpoint.unwrap_or_else(|| "NotServed".into()),
            }
        })
        .collect();
    Json(super::status::Status {
        resources,
        backends: summaries,
        allocations: h.pods.get().to_vec(),
        sources: h.sources.all(),
        registrations: h.endpoints.board().statuses(),
        claims: h.claims.all(),
        contests: Some(h.loaded.contests()),
    })
}

/// Devices one `/status/devices` page holds by default, and at most.
pub(crate) const DEVICES_PAGE: usize = 500;
pub(crate) const MAX_DEVICES_PAGE: usize = 2000;
/// `/status/devices` pages built at once; more are answered 503 at once (each page is bounded,
/// so this bounds the memory the listener can be made to use).
const DEVICE_PAGES_AT_ONCE: usize = 2;

/// Which page of `/status/devices`.
#[derive(serde::Deserialize)]
struct Page {
    #[serde(default)]
    offset: usize,
    #[serde(default = "default_page")]
    limit: usize,
}

fn default_page() -> usize {
    DEVICES_PAGE
}

/// `/status/devices?offset=N&limit=M`: one page of every resource's devices as devplug serves
/// them — health, NUMA nodes, attributes (a backend's `cdi-name` among them) and the device nodes
/// a container gets — in resource then device order, with `total` and, when more follow, `next`
/// (the offset of the next page). A page is at most [`MAX_DEVICES_PAGE`] devices, and at most
/// two pages are built at once, so a node with a hundred thousand devices answers in bounded
/// memory however many clients ask.
async fn status_devices(State(h): State<Probes>, Query(page): Query<Page>) -> axum::response::Response {
    let Ok(_permit) = h.device_pages.clone().try_acquire_owned() else {
        return (StatusCode::SERVICE_UNAVAILABLE, "busy: other /status/devices pages are being built; try again\n")
            .into_response();
    };
    let limit = page.limit.clamp(1, MAX_DEVICES_PAGE);
    let snapshot = h.loaded.snapshot();
    let total: usize = snapshot.iter().map(|r| r.devices.len()).sum();
    let mut skip = page.offset;
    let mut left = limit;
    let mut resources = Vec::new();
    for r in &snapshot {
        if left == 0 {
            break;
        }
        if skip >= r.devices.len() {
            skip -= r.devices.len();
            continue;
        }
        let devices: Vec<super::status::DeviceStatus> = r.devices[skip..]
            .iter()
            .take(left)
            .map(|d| super::status::DeviceStatus {
                id: d.id.clone(),
                health: d.health.as_str().to_owned(),
                numa_nodes: d.numa_nodes.clone(),
                attributes: d.attributes.iter().cloned().collect(),
                nodes: d.edits.device_nodes.iter().map(|n| format!("{}:{}", n.host_path(), n.container_path)).collect(),
            })
            .collect();
        skip = 0;
        left -= devices.len();
        resources.push(super::status::ResourceDevices { name: r.name.clone(), devices });
    }
    let end = page.offset.saturating_add(limit - left);
    let next = (end < total).then_some(end);
    Json(super::status::DevicesPage { resources, offset: page.offset, total, next }).into_response()
}

/// The routes that carry identities (pods, namespaces, claims and their UIDs): for the
/// operator only, so never on a port other hosts can reach.
fn status_routes(app: Router<Probes>) -> Router<Probes> {
    app.route("/status", get(status)).route("/status/devices", get(status_devices))
}

/// Serve the probes and `/metrics` on `addr` until `stop`. `/status` and its device pages are
/// served there too only when `addr` is a loopback address (else only on the status socket,
/// [`serve_status`]): the manifests open this port on the host network. Binding errors are
/// returned so a port clash is reported.
pub async fn serve(addr: SocketAddr, probes: Probes, stop: CancellationToken) -> anyhow::Result<()> {
    let mut app =
        Router::new().route("/healthz", get(healthz)).route("/readyz", get(readyz)).route("/metrics", get(metrics));
    if addr.ip().is_loopback() {
        app = status_routes(app);
    }
    let app = app.fallback(not_here).with_state(probes);
    let listener = listen(addr).map_err(|e| anyhow::anyhow!("cannot listen on {addr} (--metrics-addr): {e}"))?;
    let addr = listener.local_addr().unwrap_or(addr);
    let what = if addr.ip().is_loopback() {
        "/healthz, /readyz, /metrics and /status"
    } else {
        "/healthz, /readyz and /metrics"
    };
    tracing::info!(%addr, "serving {what}");
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned()).await {
            tracing::warn!(error = %e, "health endpoint stopped");
        }
    });
    Ok(())
}

async fn not_here(uri: axum::http::Uri) -> (StatusCode, String) {
    let hint = if uri.path().starts_with("/status") {
        "; /status is served on devplug's status socket (status_socket, for `devplug status`) or a loopback --metrics-addr"
    } else {
        ""
    };
    (StatusCode::NOT_FOUND, format!("not found{hint}\n"))
}

/// Serve `/status`, its device pages and the probes on the Unix socket `path` (a `0600` socket
/// in devplug's `0700` state directory: only devplug's user, the operator, reads it) until
/// `stop`; the socket is removed then.
pub async fn serve_status(path: &std::path::Path, probes: Probes, stop: CancellationToken) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(dir) = path.parent() {
        crate::durable::StateDir::open(dir).map_err(|e| anyhow::anyhow!("status socket dir: {e}"))?;
    }
    let listener = crate::plugin_socket::bind(path).map_err(|e| anyhow::anyhow!("status socket: {e}"))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| anyhow::anyhow!("status socket {}: {e}", path.display()))?;
    let app = status_routes(Router::new().route("/healthz", get(healthz)).route("/readyz", get(readyz)))
        .route("/metrics", get(metrics))
        .with_state(probes);
    tracing::info!(socket = %path.display(), "serving /status for `devplug status`");
    let path = path.to_owned();
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned()).await {
            tracing::warn!(error = %e, "status socket stopped");
        }
        crate::plugin_socket::bind::unbind(&path);
    });
    Ok(())
}

/// Listen on `addr` with `SO_REUSEPORT`: during a rolling update two devplug pods share the host
/// network on one node, and the new one's probes must answer while the old one still listens.
fn listen(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    tokio::net::TcpListener::from_std(socket.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loop_that_stops_turning_is_stalled() {
        let fresh = Heartbeat::new(STALLED_AFTER);
        fresh.beat();
        assert_eq!(fresh.stalled(), None);
        // Never beaten, and any time at all is too long.
        let stuck = Heartbeat::new(std::time::Duration::ZERO);
        assert!(stuck.stalled().is_some(), "no beat within the allowed time");
    }

    #[tokio::test]
    async fn two_instances_can_listen_on_one_probe_port() {
        let first = listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let port = first.local_addr().unwrap();
        let second = listen(port).expect("the port is shared, as two pods on one host network share it");
        assert_eq!(second.local_addr().unwrap(), port);
    }
}
