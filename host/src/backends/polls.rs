//! Health polling: each backend's `discover` as a job that runs on a blocking thread
//! ([`PollJob`]), and publishing its answer to the resources' device-list streams
//! ([`Loaded::finish_poll`]). A discover that raced a swap or an unload is dropped, and a failed
//! one keeps the last list.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

/// Health changes named in the one record a poll writes; the rest are counted.
const MAX_FLIPS_NAMED: usize = 16;

use super::loaded::{Loaded, MAX_LOGGED, ResSlot};
use super::routing::{ReadyResource, ResourceCalls};
use super::slot::Slot;
use crate::model::contest;
use crate::model::nodes::{self, NodeOwners};
use crate::model::port::Port;
use crate::model::{Device, Health, Resource};
use crate::runtime::{BackendInstance, CallError};
use crate::sync::Locked;

/// One backend's discover, ready to run on a blocking thread.
pub struct PollJob {
    pub name: String,
    slot: Arc<Slot>,
    inst: Arc<BackendInstance>,
}

impl PollJob {
    /// Call the backend (blocking, bounded by its discover deadline).
    pub fn run(self) -> PollDone {
        let t0 = std::time::Instant::now();
        let result = self.inst.discover();
        PollDone { job: self, result, took: t0.elapsed() }
    }
}

/// A finished discover, for [`Loaded::finish_poll`].
pub struct PollDone {
    job: PollJob,
    result: Result<Vec<Resource>, CallError>,
    took: std::time::Duration,
}

impl PollDone {
    pub fn backend(&self) -> &str {
        &self.job.name
    }
}

/// What a poll found.
#[derive(Default)]
pub struct PollReport {
    /// Resources that have devices for the first time: start serving them to kubelet.
    pub ready: Vec<ReadyResource>,
}

impl Loaded {
    /// One `discover` for each loaded backend not in `busy`. Each runs on its own (blocking)
    /// and is handed back with [`finish_poll`](Self::finish_poll), so a backend that takes its
    /// whole deadline delays no other backend's poll.
    pub(crate) fn start_polls(&self, busy: &HashSet<String>) -> Vec<PollJob> {
        self.backends
            .locked()
            .iter()
            .filter(|(n, _)| !busy.contains(*n))
            .map(|(n, s)| PollJob { name: n.clone(), slot: s.clone(), inst: s.current.load_full() })
            .collect()
    }

    /// The discover of backend `name` alone (a uevent asked for it).
    pub(crate) fn poll_job(&self, name: &str) -> Option<PollJob> {
        let backends = self.backends.locked();
        let s = backends.get(name)?;
        Some(PollJob { name: name.to_owned(), slot: s.clone(), inst: s.current.load_full() })
    }

    /// Backends subscribed to kernel uevents of `subsystem`.
    pub(crate) fn subscribers(&self, subsystem: &str) -> Vec<String> {
        let backends = self.backends.locked();
        backends.iter().filter(|(_, s)| s.current.load().subscribes(subsystem)).map(|(n, _)| n.clone()).collect()
    }

    /// Publish a finished poll; returns resources to start serving.
    pub(crate) fn finish_poll(&self, done: PollDone) -> Vec<ReadyResource> {
        let PollDone { job, result, took } = done;
        self.metrics.backend_call(&job.name, "discover", took);
        let mut ready = Vec::new();
        self.publish_discovered(&job.name, &job.slot, &job.inst, result, &mut ready);
        ready
    }

    /// Run every backend's `discover`, all at once, and update the device lists.
    pub(crate) async fn poll_once(&self) -> PollReport {
        let jobs = self.start_polls(&HashSet::new());
        let runs = jobs.into_iter().map(|job| async move {
            let name = job.name.clone();
            tokio::task::spawn_blocking(move || job.run()).await.map_err(|e| (name, e))
        });
        let mut report = PollReport::default();
        for done in futures::future::join_all(runs).await {
            match done {
                Ok(done) => report.ready.extend(self.finish_poll(done)),
                Err((name, e)) => tracing::error!(backend = %name, "discover panicked in the host: {e}"),
            }
        }
        report
    }

    /// Publish one backend's discover result to its resources' streams.
    pub(super) fn publish_discovered(
        &self,
        name: &str,
        slot: &Arc<Slot>,
        inst: &BackendInstance,
        result: Result<Vec<Resource>, CallError>,
        ready: &mut Vec<ReadyResource>,
    ) {
        // A discover that raced a swap or unload must not publish over the newer state.
        let current = self.backends.locked().get(name).is_some_and(|s| Arc::ptr_eq(s, slot));
        if !current || !std::ptr::eq(slot.current.load().as_ref(), inst) {
            return;
        }
        self.note_error(name, slot, result.as_ref().err());
        let breaker = inst.breaker_open();
        let ok = result.is_ok();
        let found: BTreeMap<String, Resource> = match result {
            Ok(list) => list.into_iter().map(|r| (r.name.clone(), r)).collect(),
            Err(_) => BTreeMap::new(),
        };
        let mut resources = self.resources.locked();
        // This backend's new lists as it discovered them: what the node-ownership table is
        // built from (a device refused for a contested node still names it).
        for (rname, rs) in resources.iter_mut().filter(|(_, r)| r.backend == name) {
            let mut next = match found.get(rname) {
                // Already vetted (IDs, sizes, grants) by the runtime.
                Some(r) => r.clone(),
                // A failed discover keeps the last list (a passing fault must not empty
                // kubelet's view); an answer without this resource means no devices.
                None if ok => Resource { name: rname.clone(), ..Default::default() },
                None => (*rs.raw).clone(),
            };
            if breaker {
                next.devices.iter_mut().for_each(|d| d.health = Health::Unhealthy);
            }
            rs.raw = Arc::new(next);
        }
        // Every health change of this poll, for one record (a backend flipping thousands of
        // devices writes one line per poll, inside its log budget, not one per device).
        let mut flips: Vec<String> = Vec::new();
        let mut flipped = 0usize;
        for (rname, rs) in self.settle(&mut resources, Some(name)) {
            let prev = rs.tx.borrow().clone();
            let next = self.published(rname, rs);
            let kubelet_changed = prev.kubelet_view() != next.kubelet_view();
            if kubelet_changed {
                for d in &next.devices {
                    let before = prev.device(&d.id).map(|p| p.health);
                    if before.is_some_and(|b| b != d.health) {
                        flipped += 1;
                        if flips.len() < MAX_FLIPS_NAMED {
                            // The backend's reason, where it gave one (the SDK's `unhealthy`
                            // attribute), clipped as any backend text.
                            let why = match d.health {
                                Health::Unhealthy => d
                                    .attributes
                                    .iter()
                                    .find(|(k, _)| k == "unhealthy")
                                    .map(|(_, v)| format!(" ({})", crate::gate::clip_to(v, 160)))
                                    .unwrap_or_default(),
                                Health::Healthy => String::new(),
                            };
                            flips.push(format!("{rname} {} {}{why}", d.id, d.health.as_str()));
                        }
                    }
                }
                // A device that went is news too (kubelet stops offering it): said with the
                // health changes, in the same record and budget.
                for d in prev.devices.iter().filter(|d| next.device(&d.id).is_none()) {
                    flipped += 1;
                    if flips.len() < MAX_FLIPS_NAMED {
                        flips.push(format!("{rname} {} removed", d.id));
                    }
                }
            }
            self.send(rs, next, kubelet_changed);
            if !rs.published && !rs.tx.borrow().devices.is_empty() {
                rs.published = true;
                ready.push(ReadyResource {
                    name: rname.clone(),
                    backend: name.to_owned(),
                    options: rs.options,
                    devices: rs.tx.subscribe(),
                    port: Port::new(
                        name,
                        rname,
                        Arc::new(ResourceCalls {
                            slot: slot.clone(),
                            resource: rname.clone(),
                            backend: name.to_owned(),
                            metrics: self.metrics.clone(),
                        }),
                        self.owners.clone(),
                    ),
                });
            }
        }
        if flipped > 0 && inst.may_log() {
            let more = flipped - flips.len();
            let more = if more > 0 { format!(" and {more} more") } else { String::new() };
            tracing::warn!(backend = %name, changed = flipped, "device health changed: {}{more}", flips.join(", "));
        }
        let extras: Vec<&String> = found.keys().filter(|k| !resources.contains_key(*k)).collect();
        for extra in extras {
            let key = format!("undeclared {extra}");
            if let Some(r) = resources.values_mut().find(|r| r.backend == name)
                && r.logged.len() < MAX_LOGGED
                && r.logged.insert(key)
            {
                tracing::warn!(backend = %name, resource = %extra, "discover returned a resource init did not declare; ignored");
            }
        }
    }

    /// The node-ownership table from every resource's latest lists, stored for the answer
    /// writers; then each resource's conflicts under it. Other backends' resources whose
    /// conflicts changed (a node became contested, or free again) are republished here; the
    /// resources of `mine` are handed back for the caller to publish (its own may have changed
    /// for other reasons too).
    pub(super) fn settle<'a>(
        &self,
        resources: &'a mut BTreeMap<String, ResSlot>,
        mine: Option<&str>,
    ) -> Vec<(&'a String, &'a mut ResSlot)> {
        let table = NodeOwners::build_decided(
            resources.values().map(|r| (r.backend.as_str(), r.raw.as_ref())),
            &self.decisions,
        );
        let mut changed: HashSet<String> = HashSet::new();
        for (rname, rs) in resources.iter_mut() {
            let conflicts = table.conflicts(&rs.backend, &rs.raw);
            if conflicts != rs.conflicts {
                rs.conflicts = conflicts;
                changed.insert(rname.clone());
            }
        }
        // Stored before any list is sent: a device refused now is refused by the writers too.
        self.owners.store(table);
        if !changed.is_empty() {
            self.report_contests(resources);
        }
        let mut own = Vec::new();
        for (rname, rs) in resources.iter_mut() {
            if Some(rs.backend.as_str()) == mine {
                own.push((rname, rs));
            } else if changed.contains(rname) {
                let prev = rs.tx.borrow().clone();
                let next = self.published(rname, rs);
                let kubelet_changed = prev.kubelet_view() != next.kubelet_view();
                self.send(rs, next, kubelet_changed);
            }
        }
        own
    }

    /// Tell each contest once per pair of resources, however many nodes it spans: an ERROR
    /// when it starts or grows (undecided), an INFO when the config's `owns` settles it or it
    /// ends.
    fn report_contests(&self, resources: &BTreeMap<String, ResSlot>) {
        let now = contest::contests(
            resources.iter().map(|(name, r)| (name.as_str(), r.backend.as_str(), r.conflicts.as_slice())),
        );
        let mut known = self.contests.locked();
        for c in &now {
            let before = known.iter().find(|k| k.resources == c.resources);
            if before == Some(c) {
                continue;
            }
            let [a, b] = &c.resources;
            if c.decided() {
                tracing::info!(resources = %format!("{a}, {b}"), nodes = c.nodes, withheld = c.withheld, "{c}");
            } else {
                tracing::error!(resources = %format!("{a}, {b}"), nodes = c.nodes, withheld = c.withheld, "{c}");
            }
        }
        for gone in known.iter().filter(|k| !now.iter().any(|c| c.resources == k.resources)) {
            let [a, b] = &gone.resources;
            tracing::info!(resources = %format!("{a}, {b}"), "resources {a} and {b} no longer name the same device nodes: their devices are served again");
        }
        *known = now;
    }

    /// What `rs` publishes: its latest list without the devices of contested nodes, and
    /// without DRA-only devices unless the resource is served through DRA.
    fn published(&self, rname: &str, rs: &ResSlot) -> Resource {
        let mut next = (*rs.raw).clone();
        // A device its backend lists for DRA only (a GPU in MIG mode beside its instances)
        // never reaches kubelet's Device Plugin API, nor that resource's CDI spec.
        if !self.serves_dra(rname) && next.devices.iter().any(Device::dra_only) {
            next.devices.retain(|d| !d.dra_only());
            let ids: Vec<&str> = next.devices.iter().map(|d| d.id.as_str()).collect();
            next.described.retain(|id, _| ids.contains(&id.as_str()));
        }
        nodes::refuse(&mut next, &rs.conflicts);
        next
    }

    /// Send `next` on `rs`'s stream if it differs. Every reader hears of every change and
    /// decides what matters to it: kubelet's ListAndWatch sends only what kubelet would notice,
    /// DRA republishes any change.
    fn send(&self, rs: &ResSlot, next: Resource, kubelet_changed: bool) {
        let changed = kubelet_changed || next != **rs.tx.borrow();
        if let Some(hook) = &self.publish_hook
            && changed
        {
            hook(&next);
        }
        rs.tx.send_if_modified(|v| {
            *v = Arc::new(next);
            changed
        });
    }

    fn note_error(&self, backend: &str, slot: &Slot, err: Option<&CallError>) {
        let mut last = slot.last_error.locked();
        let now = err.map(|e| e.to_string());
        if now != *last {
            match &now {
                Some(e) if !err.is_some_and(CallError::is_fault) => {
                    tracing::warn!(backend, error = %e, "discover failed; keeping the last device list")
                }
                None if last.is_some() => tracing::info!(backend, "discover works again"),
                _ => {}
            }
            *last = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::super::loaded::testing::{generic, loaded, poll};

    fn kvm_devices(l: &super::Loaded) -> usize {
        l.snapshot().iter().find(|r| r.name == "test.io/kvm").map_or(0, |r| r.devices.len())
    }

    #[test]
    fn a_discover_that_raced_a_swap_is_not_published() {
        let d = tempfile::tempdir().unwrap();
        let l = loaded(d.path());
        let b = generic("b", &[("test.io/kvm", "kvm")]);
        l.load(b.clone()).unwrap();
        poll(&l);
        assert_eq!(kvm_devices(&l), 2);
        // The old instance's discover still sees /dev/kvm ...
        let stale = l.start_polls(&HashSet::new()).pop().unwrap().run();
        // ... which is gone by the time the new version is swapped in and publishes.
        std::fs::remove_file(d.path().join("dev/kvm")).unwrap();
        l.swap(b).unwrap();
        assert_eq!(kvm_devices(&l), 0);
        assert!(l.finish_poll(stale).is_empty());
        assert_eq!(kvm_devices(&l), 0, "the stale discover put the old devices back");
    }

    #[test]
    fn a_discover_that_raced_an_unload_resurrects_nothing() {
        let d = tempfile::tempdir().unwrap();
        let l = loaded(d.path());
        l.load(generic("b", &[("test.io/kvm", "kvm")])).unwrap();
        let stale = l.poll_job("b").unwrap().run();
        drop(l.unload("b"));
        assert!(l.finish_poll(stale).is_empty());
        assert!(l.snapshot().is_empty());
    }

    #[test]
    fn a_resource_is_handed_up_once_when_it_first_has_devices() {
        let d = tempfile::tempdir().unwrap();
        let l = loaded(d.path());
        std::fs::remove_file(d.path().join("dev/kvm")).unwrap();
        l.load(generic("b", &[("test.io/kvm", "kvm")])).unwrap();
        assert!(poll(&l).ready.is_empty(), "no devices yet: nothing to serve");
        std::fs::write(d.path().join("dev/kvm"), "c 10:232").unwrap();
        assert_eq!(poll(&l).ready.len(), 1);
        assert!(poll(&l).ready.is_empty(), "and never again");
    }
}
