//! The `v1beta1.DevicePlugin` gRPC service for one resource.
//!
//! Kubelet's requests are checked against the current device list before any backend is called:
//! unknown, unhealthy or duplicate IDs are `InvalidArgument` with the IDs named. Preferred
//! allocations from a backend are checked too and replaced by a plain choice when wrong.

use std::collections::HashSet;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Notify;
use tokio_stream::Stream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::ResourceHandle;
use crate::model::calls::{CallClass, CallError};
use crate::model::{Health, Resource};
use crate::proto::deviceplugin as pb;

/// The least time between two lists sent on one ListAndWatch stream: a burst of changes (health
/// flipping with every uevent) reaches kubelet as at most one list per gap, the newest; a change
/// after a quiet spell goes out at once.
pub(crate) const MIN_SEND_GAP: std::time::Duration = std::time::Duration::from_millis(100);

/// Tracks the ListAndWatch streams of one serving generation, to notice kubelet letting go.
#[derive(Default)]
pub struct StreamTracker {
    open: AtomicUsize,
    all_closed: Notify,
}

impl StreamTracker {
    /// Resolves when the last open stream closes (never, if none was ever opened).
    pub(crate) async fn all_closed(&self) {
        self.all_closed.notified().await
    }
}

struct StreamGuard(Arc<StreamTracker>);

impl Drop for StreamGuard {
    fn drop(&mut self) {
        if self.0.open.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.all_closed.notify_one();
        }
    }
}

/// One resource's DevicePlugin service, for one serving generation.
#[derive(Clone)]
pub struct DevicePluginService {
    handle: ResourceHandle,
    streams: Arc<StreamTracker>,
    cancel: CancellationToken,
}

impl DevicePluginService {
    pub fn new(handle: ResourceHandle, streams: Arc<StreamTracker>, cancel: CancellationToken) -> Self {
        DevicePluginService { handle, streams, cancel }
    }

    /// Run one kubelet RPC, reporting its outcome and latency to the metrics.
    async fn timed<T>(
        &self,
        method: &'static str,
        call: impl std::future::Future<Output = Result<T, Status>>,
    ) -> Result<T, Status> {
        let t0 = std::time::Instant::now();
        let out = call.await;
        if let Some(m) = &self.handle.metrics {
            m.request(&self.handle.name, method, out.is_ok(), t0.elapsed());
        }
        out
    }

    fn snapshot(&self) -> Arc<Resource> {
        self.handle.devices.borrow().clone()
    }

    /// Check a container's IDs: known, healthy, no duplicates.
    fn check_ids(&self, snap: &Resource, ids: &[String], need_healthy: bool) -> Result<(), Status> {
        let mut seen = HashSet::new();
        let dups: Vec<&str> = ids.iter().filter(|id| !seen.insert(id.as_str())).map(String::as_str).collect();
        if !dups.is_empty() {
            return Err(Status::invalid_argument(format!(
                "{}: device IDs requested twice: {}",
                self.handle.name,
                dups.join(", ")
            )));
        }
        let unknown: Vec<&str> = ids.iter().filter(|id| snap.device(id).is_none()).map(String::as_str).collect();
        if !unknown.is_empty() {
            return Err(Status::invalid_argument(format!(
                "{}: unknown device IDs: {} ({} devices are known; kubelet's view may be stale, it gets a fresh list on ListAndWatch)",
                self.handle.name,
                unknown.join(", "),
                snap.devices.len()
            )));
        }
        if need_healthy {
            let sick: Vec<&str> = ids
                .iter()
                .filter(|id| snap.device(id).is_some_and(|d| d.health != Health::Healthy))
                .map(String::as_str)
                .collect();
            if !sick.is_empty() {
                return Err(Status::invalid_argument(format!(
                    "{}: devices are Unhealthy and cannot be allocated: {}",
                    self.handle.name,
                    sick.join(", ")
                )));
            }
        }
        Ok(())
    }
}

/// A backend's failure as kubelet gets it, its text through the text gate (escaped, clipped):
/// the backend's own error or a refused answer is `Internal` (the pod fails with its message);
/// a backend that cannot answer (trap, timeout, memory cap, open breaker) is `Unavailable`,
/// which kubelet retries.
fn status(resource: &str, e: CallError) -> Status {
    let class = e.class();
    let m = match e {
        CallError::Guest(m) => m,
        other => other.to_string(),
    };
    let text = crate::gate::clip_to(&format!("{resource}: {m}"), crate::gate::MAX_WIRE_ERROR).into_owned();
    match class {
        CallClass::Answer | CallClass::Refused => Status::internal(text),
        CallClass::Fault | CallClass::BreakerOpen => Status::unavailable(text),
    }
}

/// The device list as kubelet wants it.
pub(crate) fn to_proto_devices(r: &Resource) -> Vec<pb::Device> {
    r.devices
        .iter()
        .map(|d| pb::Device {
            id: d.id.clone(),
            health: d.health.as_str().to_owned(),
            topology: (!d.numa_nodes.is_empty()).then(|| pb::TopologyInfo {
                nodes: d.numa_nodes.iter().map(|n| pb::NumaNode { id: i64::from(*n) }).collect(),
            }),
        })
        .collect()
}

/// A valid preferred allocation, or why the backend's is not.
fn preferred_problem(answer: &[String], available: &[String], must: &[String], size: usize) -> Option<String> {
    let set: HashSet<&str> = answer.iter().map(String::as_str).collect();
    if set.len() != answer.len() {
        return Some("it repeats IDs".into());
    }
    if answer.len() != size {
        return Some(format!("it has {} IDs, {size} were asked for", answer.len()));
    }
    if let Some(id) = must.iter().find(|id| !set.contains(id.as_str())) {
        return Some(format!("it leaves out must-include {id}"));
    }
    if let Some(id) = answer.iter().find(|id| !available.contains(id)) {
        return Some(format!("{id} is not available"));
    }
    None
}

/// The host's own choice: the must-include IDs, then available ones in order.
fn plain_choice(available: &[String], must: &[String], size: usize) -> Vec<String> {
    let mut out: Vec<String> = must.to_vec();
    for id in available {
        if out.len() >= size {
            break;
        }
        if !out.contains(id) {
            out.push(id.clone());
        }
    }
    out
}

type ListStream = Pin<Box<dyn Stream<Item = Result<pb::ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl pb::device_plugin_server::DevicePlugin for DevicePluginService {
    async fn get_device_plugin_options(
        &self,
        _: Request<pb::Empty>,
    ) -> Result<Response<pb::DevicePluginOptions>, Status> {
        Ok(Response::new(pb::DevicePluginOptions {
            pre_start_required: self.handle.options.pre_start_required,
            get_preferred_allocation_available: self.handle.options.preferred_allocation,
        }))
    }

    type ListAndWatchStream = ListStream;

    async fn list_and_watch(&self, _: Request<pb::Empty>) -> Result<Response<ListStream>, Status> {
        self.streams.open.fetch_add(1, Ordering::AcqRel);
        let guard = StreamGuard(self.streams.clone());
        let cancel = self.cancel.clone();
        // The current list at once, then every change, at most one per `MIN_SEND_GAP` (a burst
        // collapses to the newest list, which is what kubelet needs). When this serving
        // generation stops, a change already published is still sent first, without waiting: a
        // retired resource's last word is its empty list.
        let rx = self.handle.devices.clone();
        // Only what kubelet sees (IDs, health, topology) is sent: a change of attributes or
        // edits alone (what DRA and the CDI specs care about) sends nothing.
        let start = (rx, cancel, guard, None::<(tokio::time::Instant, Vec<pb::Device>)>);
        let stream = futures::stream::unfold(start, |(mut rx, cancel, guard, last)| async move {
            loop {
                if let Some((last_sent, _)) = &last {
                    tokio::select! {
                        biased;
                        changed = rx.changed() => changed.ok()?,
                        _ = cancel.cancelled() => {
                            if !rx.has_changed().unwrap_or(false) {
                                return None;
                            }
                        }
                    }
                    tokio::select! {
                        biased;
                        _ = cancel.cancelled() => {}
                        _ = tokio::time::sleep_until(*last_sent + MIN_SEND_GAP) => {}
                    }
                }
                let list = to_proto_devices(&rx.borrow_and_update());
                if last.as_ref().is_some_and(|(_, sent)| *sent == list) {
                    if cancel.is_cancelled() {
                        return None;
                    }
                    continue;
                }
                let next = Some((tokio::time::Instant::now(), list.clone()));
                return Some((Ok(pb::ListAndWatchResponse { devices: list }), (rx, cancel, guard, next)));
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        req: Request<pb::PreferredAllocationRequest>,
    ) -> Result<Response<pb::PreferredAllocationResponse>, Status> {
        self.timed("GetPreferredAllocation", async {
            let mut out = Vec::new();
            for c in req.into_inner().container_requests {
                let size = usize::try_from(c.allocation_size)
                    .map_err(|_| Status::invalid_argument(format!("{}: negative allocation size", self.handle.name)))?;
                let (available, must) = (c.available_device_i_ds, c.must_include_device_i_ds);
                let snap = self.snapshot();
                self.check_ids(&snap, &available, false)?;
                self.check_ids(&snap, &must, false)?;
                let answer = if self.handle.options.preferred_allocation {
                    match self.handle.port.preferred_allocation(available.clone(), must.clone(), size as u32).await {
                        Ok(ids) => match preferred_problem(&ids, &available, &must, size) {
                            None => ids,
                            Some(why) => {
                                tracing::warn!(resource = %self.handle.name, "backend's preferred allocation ignored: {why}");
                                plain_choice(&available, &must, size)
                            }
                        },
                        Err(e) => {
                            tracing::warn!(resource = %self.handle.name, error = %e, "preferred allocation failed; using a plain choice");
                            plain_choice(&available, &must, size)
                        }
                    }
                } else {
                    plain_choice(&available, &must, size)
                };
                out.push(pb::ContainerPreferredAllocationResponse { device_i_ds: answer });
            }
            Ok(Response::new(pb::PreferredAllocationResponse { container_responses: out }))
        })
        .await
    }

    async fn allocate(&self, req: Request<pb::AllocateRequest>) -> Result<Response<pb::AllocateResponse>, Status> {
        self.timed("Allocate", async {
            let reqs = req.into_inner().container_requests;
            let snap = self.snapshot();
            // Check every container before calling the backend once, so a bad request has no effect.
            for c in &reqs {
                if c.devices_ids.is_empty() {
                    return Err(Status::invalid_argument(format!(
                        "{}: a container request names no devices",
                        self.handle.name
                    )));
                }
                self.check_ids(&snap, &c.devices_ids, true)?;
            }
            let mut out = Vec::with_capacity(reqs.len());
            for c in reqs {
                // Past the port's node gate, the same as a DRA claim's: no container gets a node
                // of a device it was not allocated, of any backend.
                let admitted =
                    self.handle.port.allocate(&snap, &c.devices_ids).await.map_err(|e| status(&self.handle.name, e))?;
                out.push(self.handle.delivery.answer(&snap, &c.devices_ids, &admitted));
            }
            Ok(Response::new(pb::AllocateResponse { container_responses: out }))
        })
        .await
    }

    async fn pre_start_container(
        &self,
        req: Request<pb::PreStartContainerRequest>,
    ) -> Result<Response<pb::PreStartContainerResponse>, Status> {
        self.timed("PreStartContainer", async {
            let ids = req.into_inner().devices_ids;
            self.check_ids(&self.snapshot(), &ids, false)?;
            self.handle.port.pre_start(ids).await.map_err(|e| status(&self.handle.name, e))?;
            Ok(Response::new(pb::PreStartContainerResponse {}))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn preferred_answers_are_checked() {
        let avail = s(&["a", "b", "c", "d"]);
        assert_eq!(preferred_problem(&s(&["a", "b"]), &avail, &s(&["a"]), 2), None);
        assert!(preferred_problem(&s(&["a"]), &avail, &[], 2).unwrap().contains("1 IDs"));
        assert!(preferred_problem(&s(&["b", "c"]), &avail, &s(&["a"]), 2).unwrap().contains("must-include a"));
        assert!(preferred_problem(&s(&["a", "z"]), &avail, &[], 2).unwrap().contains("z is not available"));
        assert!(preferred_problem(&s(&["a", "a"]), &avail, &[], 2).unwrap().contains("repeats"));
    }

    #[test]
    fn plain_choice_keeps_must_include_first() {
        assert_eq!(plain_choice(&s(&["a", "b", "c"]), &s(&["c"]), 2), s(&["c", "a"]));
    }

    /// Issue 63: the one call error becomes kubelet's status classes at this edge: the
    /// backend's own error and a refused answer fail the pod (`Internal`), a fault or the
    /// breaker is `Unavailable`, which kubelet retries; the resource's name comes first.
    #[test]
    fn call_errors_reach_kubelet_as_its_status_classes() {
        use tonic::Code;
        let code = |e: CallError| {
            let st = status("a.io/b", e);
            assert!(st.message().starts_with("a.io/b: "), "{}", st.message());
            st.code()
        };
        assert_eq!(code(CallError::Guest("no".into())), Code::Internal);
        assert_eq!(status("a.io/b", CallError::Guest("no".into())).message(), "a.io/b: no");
        assert_eq!(code(CallError::Refused("node".into())), Code::Internal);
        assert_eq!(code(CallError::Trap("x".into())), Code::Unavailable);
        assert_eq!(code(CallError::Timeout(std::time::Duration::from_secs(2))), Code::Unavailable);
        assert_eq!(code(CallError::BreakerOpen), Code::Unavailable);
    }

    /// A resource with one device whose ID says which state it is.
    /// The service of resource `a.io/b`, its device list from `rx`.
    fn serving(rx: tokio::sync::watch::Receiver<Arc<Resource>>) -> DevicePluginService {
        let handle = ResourceHandle {
            name: "a.io/b".into(),
            options: Default::default(),
            devices: rx,
            port: crate::model::port::Port::new(
                "b",
                "a.io/b",
                Arc::new(crate::model::calls::FixedCalls { fail: Some(CallError::BreakerOpen), ..Default::default() }),
                Default::default(),
            ),
            delivery: Default::default(),
            metrics: None,
        };
        DevicePluginService::new(handle, Arc::default(), CancellationToken::new())
    }

    fn state(i: u32) -> Arc<Resource> {
        let device = crate::model::Device {
            id: format!("d{i}"),
            health: Health::Healthy,
            numa_nodes: vec![],
            attributes: vec![],
            edits: Default::default(),
            vetted: Default::default(),
        };
        Arc::new(Resource { name: "a.io/b".into(), devices: vec![device], ..Default::default() })
    }

    /// A change kubelet would not notice (an attribute, an edit: what DRA and the CDI specs
    /// care about) sends no list; the next change kubelet sees is sent as usual (issue 35: every
    /// change now reaches every reader of the device list, each decides what matters to it).
    #[tokio::test(start_paused = true)]
    async fn list_and_watch_skips_changes_kubelet_would_not_notice() {
        use pb::device_plugin_server::DevicePlugin;
        use tokio_stream::StreamExt;
        let (tx, rx) = tokio::sync::watch::channel(state(0));
        let svc = serving(rx);
        let mut stream = svc.list_and_watch(Request::new(pb::Empty {})).await.unwrap().into_inner();
        assert_eq!(stream.next().await.unwrap().unwrap().devices[0].health, "Healthy");
        for i in 0..5 {
            let mut r = (*state(0)).clone();
            r.devices[0].attributes = vec![("tick".into(), i.to_string())];
            tx.send(Arc::new(r)).unwrap();
            tokio::time::sleep(MIN_SEND_GAP * 2).await;
        }
        let mut sick = (*state(0)).clone();
        sick.devices[0].health = Health::Unhealthy;
        tx.send(Arc::new(sick)).unwrap();
        let next = stream.next().await.unwrap().unwrap();
        assert_eq!(next.devices[0].health, "Unhealthy", "the five attribute changes sent nothing before this");
    }

    /// A storm of changes (one every 2 ms for 2 s, as health flipping with every uevent would
    /// make) reaches kubelet as at most one list per `MIN_SEND_GAP`, the last state always
    /// among them; a change after a quiet spell goes out at once. Time is tokio's paused clock.
    #[tokio::test(start_paused = true)]
    async fn list_and_watch_coalesces_bursts_and_always_sends_the_last_state() {
        use pb::device_plugin_server::DevicePlugin;
        use tokio_stream::StreamExt;
        let (tx, rx) = tokio::sync::watch::channel(state(0));
        let svc = serving(rx);
        let mut stream = svc.list_and_watch(Request::new(pb::Empty {})).await.unwrap().into_inner();
        let id = |r: pb::ListAndWatchResponse| r.devices[0].id.clone();
        assert_eq!(id(stream.next().await.unwrap().unwrap()), "d0");
        tokio::time::sleep(MIN_SEND_GAP * 2).await;
        let t0 = tokio::time::Instant::now();
        tx.send(state(1)).unwrap();
        assert_eq!(id(stream.next().await.unwrap().unwrap()), "d1");
        assert_eq!(t0.elapsed(), std::time::Duration::ZERO, "the first change after a quiet spell waits for nothing");
        let storm = tokio::spawn(async move {
            for i in 2..1002 {
                tx.send(state(i)).unwrap();
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            }
            tx
        });
        let t0 = tokio::time::Instant::now();
        let mut sent = Vec::new();
        while sent.last().is_none_or(|last| last != "d1001") {
            sent.push(id(stream.next().await.unwrap().unwrap()));
        }
        let took = t0.elapsed();
        let _tx = storm.await.unwrap();
        let most = (took.as_millis() / MIN_SEND_GAP.as_millis()) as usize + 1;
        assert!(sent.len() <= most, "{} lists in {took:?} (at most {most})", sent.len());
        assert!(sent.len() >= 10, "the storm is still seen while it lasts: {sent:?}");
    }
}
