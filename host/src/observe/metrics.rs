//! Prometheus metrics (prometheus-client, OpenMetrics text on `/metrics`).
//!
//! Events are counted where they happen (kubelet requests, registrations, swaps, backend call
//! latency); state (devices by health, backend fault counters and breaker, loaded versions, pod
//! attribution) is read from the loaded backends at scrape time, so it can never drift from what is
//! served. Backend fault counters belong to the loaded version: a swap starts them at zero again,
//! which Prometheus's `rate()` reads as a counter reset.

use crate::sync::Locked;
use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::backends::{BackendMetrics, Loaded, SourceStatus};
use crate::kubelet::KubeletMetrics;
use crate::kubelet::podresources::Assignment;
use crate::model::Health;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResourceLabel {
    resource: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HealthLabels {
    resource: String,
    health: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    resource: String,
    method: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabels {
    resource: String,
    method: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BackendLabel {
    backend: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    backend: String,
    call: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FaultLabels {
    backend: String,
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SwapLabels {
    backend: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct InfoLabels {
    backend: String,
    version: String,
    wit: String,
    digest: String,
    origin: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabels {
    backend: String,
    reference: String,
    digest: String,
    signature: String,
    from_cache: String,
}

/// A device in use. No pod, namespace, container, claim or UID: `/metrics` is served on the
/// host network, and who holds a device is for the operator only (`/status`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AllocLabels {
    resource: String,
    device: String,
}

type Hist<L> = Family<L, Histogram, fn() -> Histogram>;

fn latency() -> Histogram {
    // 50 µs .. ~1.6 s
    Histogram::new(exponential_buckets(0.000_05, 2.0, 16))
}

/// Every metric devplug exports.
pub struct Metrics {
    registry: Mutex<Registry>,
    devices: Family<HealthLabels, Gauge>,
    registrations: Family<ResourceLabel, Counter>,
    reregistrations: Family<ResourceLabel, Counter>,
    requests: Family<RequestLabels, Counter>,
    request_seconds: Hist<MethodLabels>,
    backend_call_seconds: Hist<CallLabels>,
    backend_faults: Family<FaultLabels, Counter>,
    breaker_open: Family<BackendLabel, Gauge>,
    swaps: Family<SwapLabels, Counter>,
    backend_info: Family<InfoLabels, Gauge>,
    allocated: Family<AllocLabels, Gauge>,
    registry_source: Family<SourceLabels, Gauge>,
    registry_source_failing: Family<BackendLabel, Gauge>,
    registry_source_checked: Family<BackendLabel, Gauge>,
    claims_stuck: Family<DriverLabel, Gauge>,
    claim_errors: Family<ClaimErrorLabels, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DriverLabel {
    driver: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClaimErrorLabels {
    driver: String,
    class: String,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let m = Metrics {
            registry: Mutex::new(Registry::with_prefix("devplug")),
            devices: Family::default(),
            registrations: Family::default(),
            reregistrations: Family::default(),
            requests: Family::default(),
            request_seconds: Family::new_with_constructor(latency as fn() -> Histogram),
            backend_call_seconds: Family::new_with_constructor(latency as fn() -> Histogram),
            backend_faults: Family::default(),
            breaker_open: Family::default(),
            swaps: Family::default(),
            backend_info: Family::default(),
            allocated: Family::default(),
            registry_source: Family::default(),
            registry_source_failing: Family::default(),
            registry_source_checked: Family::default(),
            claims_stuck: Family::default(),
            claim_errors: Family::default(),
        };
        {
            let mut r = m.registry.locked();
            r.register("devices", "Devices of a resource, by health, as kubelet sees them", m.devices.clone());
            r.register("registrations", "First registrations with kubelet", m.registrations.clone());
            r.register("reregistrations", "Registrations after kubelet restarted", m.reregistrations.clone());
            r.register("kubelet_requests", "Kubelet's calls, by method and outcome (ok or error)", m.requests.clone());
            r.register("kubelet_request_seconds", "Kubelet call latency", m.request_seconds.clone());
            r.register("backend_call_seconds", "Backend call latency, by call", m.backend_call_seconds.clone());
            r.register(
                "backend_faults",
                "Backend faults of the loaded version: trap, timeout, memory_cap, error",
                m.backend_faults.clone(),
            );
            r.register("backend_breaker_open", "1 while a backend's circuit breaker is open", m.breaker_open.clone());
            r.register("backend_swaps", "Hot swaps, by outcome (ok or refused)", m.swaps.clone());
            r.register("backend_info", "The loaded version of each backend (value 1)", m.backend_info.clone());
            r.register(
                "device_allocated",
                "Containers each device is assigned to (from kubelet's pod resources API; who holds it: /status)",
                m.allocated.clone(),
            );
            r.register(
                "registry_source",
                "Each backend from a registry: reference, digest on offer, signature state (value 1)",
                m.registry_source.clone(),
            );
            r.register(
                "registry_source_failing",
                "1 while a registry source's last check, pull or swap failed",
                m.registry_source_failing.clone(),
            );
            r.register(
                "registry_source_last_check_seconds",
                "Unix time of a registry source's last successful check",
                m.registry_source_checked.clone(),
            );
            r.register(
                "dra_claims_stuck",
                "DRA claims whose backend could not unprepare them, by driver (see /status claims; devplug dra release)",
                m.claims_stuck.clone(),
            );
            r.register(
                "dra_claim_errors",
                "Failed DRA prepares and unprepares, by driver and class (backend, claim, api, spec, checkpoint, stuck)",
                m.claim_errors.clone(),
            );
        }
        m
    }

    /// The OpenMetrics text, with state read from `backends` and `pods` now.
    pub fn render(
        &self,
        backends: &Loaded,
        pods: &[Assignment],
        sources: &[SourceStatus],
        claims: &crate::dra::plugin::claims::ClaimBoard,
    ) -> String {
        // One scrape at a time from clearing the state families to encoding them: a second
        // scrape clearing them in between would hand out a half-filled set.
        let r = self.registry.locked();
        self.devices.clear();
        for r in backends.snapshot() {
            for health in [Health::Healthy, Health::Unhealthy] {
                let n = r.devices.iter().filter(|d| d.health == health).count();
                self.devices
                    .get_or_create(&HealthLabels { resource: r.name.clone(), health: health.as_str().to_owned() })
                    .set(n as i64);
            }
        }
        self.backend_faults.clear();
        self.breaker_open.clear();
        self.backend_info.clear();
        for b in backends.summaries() {
            let backend = b.name.clone();
            for (kind, n) in [
                ("trap", b.stats.traps),
                ("timeout", b.stats.timeouts),
                ("memory_cap", b.stats.memory_cap_hits),
                ("error", b.stats.guest_errors),
            ] {
                let c = self.backend_faults.get_or_create(&FaultLabels { backend: backend.clone(), kind: kind.into() });
                c.inner().store(n, Ordering::Relaxed);
            }
            self.breaker_open.get_or_create(&BackendLabel { backend: backend.clone() }).set(i64::from(b.breaker_open));
            let digest = b.digest.get(..12).unwrap_or(&b.digest).to_owned();
            self.backend_info
                .get_or_create(&InfoLabels {
                    backend,
                    version: b.version.clone(),
                    wit: b.wit_version.clone(),
                    digest,
                    origin: b.origin.clone(),
                })
                .set(1);
        }
        self.claims_stuck.clear();
        for (driver, n) in claims.counts(crate::dra::plugin::claims::ClaimState::Stuck) {
            self.claims_stuck.get_or_create(&DriverLabel { driver }).set(n as i64);
        }
        // The board counts; the counter catches up to it (it only ever grows).
        for ((driver, class), n) in claims.errors() {
            let c = self.claim_errors.get_or_create(&ClaimErrorLabels { driver, class: class.to_owned() });
            c.inc_by(n.saturating_sub(c.get()));
        }
        self.allocated.clear();
        for a in pods {
            self.allocated.get_or_create(&AllocLabels { resource: a.resource.clone(), device: a.device.clone() }).inc();
        }
        self.registry_source.clear();
        self.registry_source_failing.clear();
        self.registry_source_checked.clear();
        for src in sources {
            let backend = BackendLabel { backend: src.backend.clone() };
            self.registry_source
                .get_or_create(&SourceLabels {
                    backend: src.backend.clone(),
                    reference: src.reference.clone(),
                    digest: src.digest.clone().unwrap_or_default(),
                    signature: src.signature.label().to_owned(),
                    from_cache: src.from_cache.to_string(),
                })
                .set(1);
            self.registry_source_failing
                .get_or_create(&backend)
                .set(i64::from(src.last_error.is_some() || src.swap_error.is_some()));
            self.registry_source_checked
                .get_or_create(&backend)
                .set(src.last_check.map_or(0, |t| i64::try_from(t).unwrap_or(i64::MAX)));
        }
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &r);
        out
    }
}

impl KubeletMetrics for Metrics {
    fn registered(&self, resource: &str, again: bool) {
        let l = ResourceLabel { resource: resource.to_owned() };
        if again { self.reregistrations.get_or_create(&l) } else { self.registrations.get_or_create(&l) }.inc();
    }

    /// One kubelet call: `method` as in the API (`Allocate`), `ok` or not, how long.
    fn request(&self, resource: &str, method: &str, ok: bool, took: Duration) {
        let outcome = if ok { "ok" } else { "error" };
        self.requests
            .get_or_create(&RequestLabels { resource: resource.into(), method: method.into(), outcome: outcome.into() })
            .inc();
        self.request_seconds
            .get_or_create(&MethodLabels { resource: resource.into(), method: method.into() })
            .observe(took.as_secs_f64());
    }
}

impl BackendMetrics for Metrics {
    fn backend_call(&self, backend: &str, call: &str, took: Duration) {
        self.backend_call_seconds
            .get_or_create(&CallLabels { backend: backend.into(), call: call.into() })
            .observe(took.as_secs_f64());
    }

    fn swap(&self, backend: &str, ok: bool) {
        let outcome = if ok { "ok" } else { "refused" };
        self.swaps.get_or_create(&SwapLabels { backend: backend.into(), outcome: outcome.into() }).inc();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::Metrics;
    use crate::backends::{BackendSource, DefaultGrant, Loaded};
    use crate::runtime::{Runtime, RuntimeConfig};

    /// Scrapes from several threads at once each see every series (before, one scrape could
    /// clear the families while another was encoding them).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_scrapes_each_see_the_whole_set() {
        let (wasm, manifest) = crate::backends::embedded::test_program("chaos").expect("chaos");
        let d = tempfile::tempdir().unwrap();
        std::fs::copy(wasm, d.path().join("chaos.wasm")).unwrap();
        std::fs::copy(manifest, d.path().join("chaos.toml")).unwrap();
        let src = BackendSource::from_file(&d.path().join("chaos.wasm")).unwrap();
        std::fs::create_dir_all(d.path().join("dev")).unwrap();
        std::fs::write(d.path().join("dev/null"), "c 1:3").unwrap();
        let rt = Runtime::new(RuntimeConfig::default()).unwrap();
        let roots = crate::runtime::state::Roots::fixture(d.path());
        let loaded = Arc::new(Loaded::new(rt, roots, Default::default(), DefaultGrant::Requested));
        let r = loaded.clone();
        tokio::task::spawn_blocking(move || r.load(src)).await.unwrap().unwrap();
        loaded.poll_once().await;
        let metrics = Arc::new(Metrics::new());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (r, m) = (loaded.clone(), metrics.clone());
                std::thread::spawn(move || {
                    (0..300)
                        .filter(|_| {
                            !m.render(&r, &[], &[], &crate::dra::plugin::claims::ClaimBoard::default())
                                .contains("devplug_devices{")
                        })
                        .count()
                })
            })
            .collect();
        let missing: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(missing, 0, "scrapes without the device series");
    }
}
