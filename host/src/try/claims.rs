//! The DRA side of `devplug try`: the local API server, kubelet's DRA manager and the
//! scheduler's allocator, the claims a vendor sends (`claim FILE`, `claim DRIVER DEVICE...`)
//! allocated and prepared, and `unprepare`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use devplug_standins::{apiserver, kubelet_dra, scheduler};
use k8s_openapi::api::resource::v1::DeviceClass;

/// The DRA side of `try`: the local API server, kubelet's DRA manager, the scheduler's
/// allocator, and the claims prepared.
pub(super) struct Dra {
    /// The status socket of the devplug serving this node (`try`'s own, or a separate `run`'s
    /// with the same plugins dir): asked why a resource has no devices.
    pub(super) status: std::path::PathBuf,
    pub(super) api: Arc<apiserver::ApiServer>,
    pub(super) kubelet: Arc<kubelet_dra::DraKubelet>,
    pub(super) cdi: std::path::PathBuf,
    pub(super) node: String,
    /// The resources the configuration serves through DRA: a claim waits for each of them.
    pub(super) resources: Vec<String>,
    pub(super) selectors: scheduler::cel::Selectors,
    /// Claim name → what was prepared for it.
    pub(super) claims: std::sync::Mutex<BTreeMap<String, Held>>,
    /// Claims made so far, for UIDs and default names.
    pub(super) made: std::sync::atomic::AtomicUsize,
}

/// A prepared claim: its UID, the drivers that prepared it, and its allocation's results
/// (devices other claims cannot have).
pub(super) struct Held {
    uid: String,
    drivers: Vec<String>,
    results: Vec<serde_json::Value>,
}

/// The allocation results of the claims `held`: devices other claims cannot have.
fn allocated(held: &BTreeMap<String, Held>) -> Vec<serde_json::Value> {
    held.values().flat_map(|h| h.results.clone()).collect()
}

/// What a claim found missing when it was tried: the DRA resources without devices, the
/// backends failing then (`BACKEND: why`), and whether the whole wait passed.
#[derive(Default)]
struct Missing {
    resources: Vec<String>,
    failing: Vec<String>,
    waited: bool,
}

/// A `/status` backend that is failing, as `BACKEND: why` (its error clipped, as any outsider
/// text shown); `None` for one serving well.
fn failing_backend(b: &serde_json::Value) -> Option<String> {
    let name = devplug::gate::clip(b["name"].as_str().unwrap_or("?")).into_owned();
    let error = b["last_error"].as_str().map(|e| devplug::gate::clip_to(e, 1024).into_owned());
    let state = if b["loaded"] == false {
        "not loaded"
    } else if b["breaker_open"] == true {
        "its circuit breaker is open (its devices Unhealthy, calls refused until it answers again)"
    } else if error.is_some() {
        "its discover is failing"
    } else {
        return None;
    };
    Some(match error {
        Some(e) => format!("backend {name}: {state}: {e}"),
        None => format!("backend {name}: {state}"),
    })
}

/// The namespace `try`'s claims live in.
const NAMESPACE: &str = "default";

/// How long a claim waits for every DRA resource's devices to be published.
const WAIT_FOR_BACKENDS: Duration = Duration::from_secs(30);

/// Largest claim file `claim FILE` reads.
const MAX_CLAIM_FILE: u64 = 1 << 20;

impl Dra {
    fn held(&self) -> anyhow::Result<std::sync::MutexGuard<'_, BTreeMap<String, Held>>> {
        self.claims.lock().map_err(|_| anyhow::anyhow!("the claims table was poisoned by an earlier panic"))
    }

    /// Wait (up to [`WAIT_FOR_BACKENDS`]) until every resource the configuration serves
    /// through DRA has devices published on this node: a claim typed (or piped) while the
    /// backends are still loading waits for all of them, as a pod stays pending until devices
    /// are published, rather than being allocated from the first pool to appear. What is still
    /// missing when the wait ends is returned, for the error to name.
    ///
    /// The wait ends sooner when the devplug serving this node has finished starting and a
    /// backend of it is failing (not loaded, its discover failing, its breaker open): devices
    /// will not come until it is fixed, and the claim's error says which and why.
    async fn published(&self) -> Missing {
        let end = tokio::time::Instant::now() + WAIT_FOR_BACKENDS;
        let mut asked = tokio::time::Instant::now();
        let mut failing = None;
        loop {
            let resources = self.missing();
            if resources.is_empty() {
                return Missing::default();
            }
            if tokio::time::Instant::now() >= asked {
                failing = self.failing().await;
                asked = tokio::time::Instant::now() + Duration::from_millis(500);
            }
            let waited = end.saturating_duration_since(tokio::time::Instant::now()).is_zero();
            if waited || failing.as_ref().is_some_and(|f| !f.is_empty()) {
                return Missing { resources, failing: failing.unwrap_or_default(), waited };
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Wait (up to [`WAIT_FOR_BACKENDS`]) for `driver`'s kubelet plugin to register: its
    /// slices can be published before its socket is, and kubelet retries a pod's prepare until
    /// the driver registers rather than failing it.
    async fn registered(&self, driver: &str) -> anyhow::Result<()> {
        let end = tokio::time::Instant::now() + WAIT_FOR_BACKENDS;
        while self.kubelet.plugin(driver).is_none() {
            anyhow::ensure!(
                tokio::time::Instant::now() < end,
                "DRA driver {driver} did not register with this kubelet within {}s (see `devplug status` on the node)",
                WAIT_FOR_BACKENDS.as_secs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// The failing backends of the devplug serving this node, each as `BACKEND: why`; `None`
    /// while it is still starting or cannot be asked (then nothing is concluded from it).
    async fn failing(&self) -> Option<Vec<String>> {
        let addr = self.status.to_str()?;
        let (code, ready) = devplug::cli::http_get(addr, "/readyz").await.ok()?;
        if code != 200 && ready.contains("still starting") {
            return None;
        }
        let status = devplug::cli::http_json(addr, "/status").await.ok()?;
        Some(status["backends"].as_array().into_iter().flatten().filter_map(failing_backend).collect())
    }

    /// The DRA resources with no device published on this node yet.
    fn missing(&self) -> Vec<String> {
        let slices = self.api.slices(&self.node, None);
        let published: std::collections::BTreeSet<&str> = slices
            .values()
            .flat_map(|s| s["spec"]["devices"].as_array().into_iter().flatten())
            .filter_map(|d| d["attributes"]["resource"]["string"].as_str())
            .collect();
        self.resources.iter().filter(|r| !published.contains(r.as_str())).cloned().collect()
    }

    /// A failed claim's error, with the resources still without devices when it was tried and
    /// the failing backends that explain it.
    fn still_loading(missing: &Missing, e: anyhow::Error) -> anyhow::Error {
        if missing.resources.is_empty() {
            return e;
        }
        let resources = missing.resources.join(", ");
        let why = if !missing.failing.is_empty() {
            format!(
                "these resources have no devices published: {resources}; failing in the devplug serving this node (see `devplug status`): {}",
                missing.failing.join("; ")
            )
        } else if missing.waited {
            format!(
                "after {}s these resources still had no devices published (their backends may still be loading, or found none): {resources}",
                WAIT_FOR_BACKENDS.as_secs()
            )
        } else {
            format!("these resources have no devices published: {resources}")
        };
        e.context(why)
    }

    /// The DeviceClasses devplug installs for the resources published on this node (`dra
    /// deviceclasses`), by name.
    fn classes(&self) -> BTreeMap<String, DeviceClass> {
        let mut classes = BTreeMap::new();
        for slice in self.api.slices(&self.node, None).values() {
            let driver = slice["spec"]["driver"].as_str().unwrap_or("");
            for d in slice["spec"]["devices"].as_array().into_iter().flatten() {
                if let Some(resource) = d["attributes"]["resource"]["string"].as_str() {
                    let c = devplug::dra::publish::classes::device_class(resource, driver);
                    classes.insert(c.metadata.name.clone().unwrap_or_default(), c);
                }
            }
        }
        classes
    }

    /// `claim FILE`: each ResourceClaim (or ResourceClaimTemplate) of a YAML or JSON file,
    /// validated as the API server does, allocated from this node's published devices as
    /// kube-scheduler does (with devplug's DeviceClasses and any the file has), and prepared.
    pub(super) async fn claim_file(&self, path: &str) -> anyhow::Result<String> {
        let mut bytes = Vec::new();
        std::fs::File::open(path)
            .and_then(|f| std::io::Read::read_to_end(&mut std::io::Read::take(f, MAX_CLAIM_FILE + 1), &mut bytes))
            .map_err(|e| anyhow::anyhow!("read claim file {path}: {e}"))?;
        anyhow::ensure!(
            bytes.len() as u64 <= MAX_CLAIM_FILE,
            "claim file {path} is larger than {MAX_CLAIM_FILE} bytes"
        );
        let text = String::from_utf8(bytes).map_err(|_| anyhow::anyhow!("claim file {path} is not UTF-8"))?;
        let docs = scheduler::documents::documents(&text).map_err(|e| anyhow::anyhow!("{path}, {e}"))?;
        let mut file_classes = BTreeMap::new();
        let mut claims = Vec::new();
        for (i, doc) in docs.iter().enumerate() {
            match scheduler::claim::document(doc).map_err(|e| anyhow::anyhow!("{path}, document {}: {e}", i + 1))? {
                scheduler::claim::Document::Class(c) => {
                    file_classes.insert(c.metadata.name.clone().unwrap_or_default(), *c);
                }
                scheduler::claim::Document::Claim { name, spec } => {
                    scheduler::claim::validate(&spec, &self.selectors)
                        .map_err(|e| anyhow::anyhow!("{path}, document {}: ResourceClaim is invalid: {e}", i + 1))?;
                    claims.push((name, spec));
                }
            }
        }
        anyhow::ensure!(!claims.is_empty(), "{path} has no ResourceClaim or ResourceClaimTemplate");
        let missing = self.published().await;
        // devplug's classes, and the file's over them.
        let mut classes = self.classes();
        classes.extend(file_classes);
        let mut out = String::new();
        for (name, spec) in claims {
            let n = self.made.fetch_add(1, Ordering::SeqCst) + 1;
            let name = name.unwrap_or_else(|| format!("claim-{n}"));
            let allocated = {
                let held = self.held()?;
                anyhow::ensure!(
                    !held.contains_key(&name),
                    "claim {name} is prepared already: `unprepare {name}` first"
                );
                allocated(&held)
            };
            let slices: Vec<serde_json::Value> = self.api.slices(&self.node, None).into_values().collect();
            let prepared = match scheduler::allocate(
                scheduler::allocate::deadline(),
                &self.selectors,
                &self.node,
                &slices,
                &classes,
                &allocated,
                NAMESPACE,
                &name,
                &spec,
            ) {
                Ok(allocation) => self.prepare(n, &name, serde_json::to_value(&spec)?, allocation).await,
                Err(e) => Err(e.into()),
            };
            match prepared.map_err(|e| Self::still_loading(&missing, e)) {
                Ok(text) => out.push_str(&text),
                // The file's claims before this one stay prepared: what they got, then why this
                // one failed.
                Err(e) if !out.is_empty() => {
                    out.push_str(&format!("claim failed: {name} (the claims above stay prepared): {e:#}"));
                    return Ok(out);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// `claim DRIVER DEVICE... [--tolerate-taints]`: the devices named (by their DRA name or
    /// devplug device ID) of `driver`'s pool on this node, allocated as given (as an admin
    /// would write a claim's allocation), and prepared. A tainted device (an Unhealthy one) is
    /// refused with its taint, as the scheduler refuses it, unless the claim tolerates taints.
    pub(super) async fn claim_devices(&self, driver: &str, words: &[&str]) -> anyhow::Result<String> {
        let tolerate = words.contains(&"--tolerate-taints");
        let devices: Vec<&str> = words.iter().copied().filter(|w| *w != "--tolerate-taints").collect();
        anyhow::ensure!(!devices.is_empty(), "name at least one device: claim DRIVER DEVICE... [--tolerate-taints]");
        let missing = self.published().await;
        let pool = self.api.devices(&self.node, driver);
        if pool.is_empty() {
            let e = anyhow::anyhow!("driver {driver} has no devices published on node {} (see `slices`)", self.node);
            return Err(Self::still_loading(&missing, e));
        }
        let n = self.made.fetch_add(1, Ordering::SeqCst) + 1;
        let name = format!("claim-{n}");
        let held = allocated(&*self.held()?);
        let mut requests = Vec::new();
        let mut results = Vec::new();
        for (i, d) in devices.iter().enumerate() {
            let dra_name = devplug::dra::publish::pool::device_name(d);
            let (device_name, device) =
                pool.get_key_value(*d).or_else(|| pool.get_key_value(&dra_name)).ok_or_else(|| {
                    anyhow::anyhow!(
                        "no device {d} (DRA name {dra_name}) in {driver}'s pool: {}",
                        pool.keys().cloned().collect::<Vec<_>>().join(", ")
                    )
                })?;
            let shared = device["allowMultipleAllocations"] == true;
            let busy = held
                .iter()
                .any(|r| r["driver"] == driver && r["device"] == device_name.as_str() && !r["shareID"].is_string());
            anyhow::ensure!(shared || !busy, "device {d} of {driver} is in another prepared claim: unprepare it first");
            let taints: Vec<String> = device["taints"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|t| {
                    let (k, v, e) = (t["key"].as_str(), t["value"].as_str(), t["effect"].as_str());
                    format!("{}={}:{}", k.unwrap_or("?"), v.unwrap_or(""), e.unwrap_or("?"))
                })
                .collect();
            anyhow::ensure!(
                tolerate || taints.is_empty(),
                "device {d} of {driver} is tainted {} (its backend reports it Unhealthy): the scheduler allocates it only to a claim that tolerates the taint; `claim {driver} {d} --tolerate-taints` prepares it anyway",
                taints.join(", ")
            );
            let resource = device["attributes"]["resource"]["string"].as_str().unwrap_or("");
            let request = format!("device-{i}");
            let mut exactly =
                serde_json::json!({ "deviceClassName": devplug::dra::publish::classes::class_name(resource) });
            if tolerate {
                exactly["tolerations"] = serde_json::json!([{ "operator": "Exists" }]);
            }
            requests.push(serde_json::json!({ "name": request, "exactly": exactly }));
            let mut result =
                serde_json::json!({ "request": request, "driver": driver, "pool": self.node, "device": device_name });
            if shared {
                result["shareID"] = serde_json::json!(scheduler::share_id());
            }
            results.push(result);
        }
        let allocation = serde_json::json!({
            "devices": { "results": results },
            "nodeSelector": scheduler::node_selector(&self.node),
        });
        self.prepare(n, &name, serde_json::json!({ "devices": { "requests": requests } }), allocation).await
    }

    /// Store claim `name` allocated, have each of its drivers prepare it through kubelet's DRA
    /// call, and say what they answered and the claim's CDI specs. A driver that fails undoes
    /// the others' part: nothing stays half-prepared.
    async fn prepare(
        &self,
        n: usize,
        name: &str,
        spec: serde_json::Value,
        allocation: serde_json::Value,
    ) -> anyhow::Result<String> {
        let uid = format!("0c1a1000-0000-4000-8000-{n:012x}");
        let results: Vec<serde_json::Value> = allocation["devices"]["results"].as_array().cloned().unwrap_or_default();
        let drivers: Vec<String> = results
            .iter()
            .filter_map(|r| r["driver"].as_str().map(str::to_owned))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        self.api.put_claim(NAMESPACE, name, &uid, spec, allocation);
        let me = [(NAMESPACE, uid.as_str(), name)];
        let mut out = format!("prepared {name} (uid {uid}) on node {}:\n", self.node);
        let mut done: Vec<&str> = Vec::new();
        for driver in &drivers {
            let answer = match self.registered(driver).await {
                Err(e) => Err(e),
                Ok(()) => match self.kubelet.prepare(driver, &me).await {
                    Ok(answers) => {
                        answers.get(&uid).cloned().ok_or_else(|| anyhow::anyhow!("{driver} gave no answer for {name}"))
                    }
                    Err(e) => Err(anyhow::anyhow!("{driver}: {}", e.message())),
                },
            }
            .and_then(|a| if a.error.is_empty() { Ok(a) } else { Err(anyhow::anyhow!("{driver}: {}", a.error)) });
            let a = match answer {
                Ok(a) => a,
                Err(e) => {
                    for d in done {
                        let _ = self.kubelet.unprepare(d, &me).await;
                    }
                    self.api.delete_claim(NAMESPACE, name);
                    return Err(e.context(format!("prepare {name}")));
                }
            };
            done.push(driver);
            for ((requests, _, device, cdi), share) in a.devices.iter().zip(&a.shares) {
                let share = if share.is_empty() { String::new() } else { format!(" share {share}") };
                out.push_str(&format!("  {} {driver} {device}{share}: CDI {}\n", requests.join(","), cdi.join(", ")));
            }
        }
        for driver in &drivers {
            let spec = self.cdi.join(format!("devplug-claim-{uid}-{driver}.json"));
            match std::fs::read_to_string(&spec) {
                Ok(text) => out.push_str(&format!("CDI spec {}:\n{text}", spec.display())),
                Err(e) => out.push_str(&format!("no CDI spec at {}: {e}\n", spec.display())),
            }
        }
        self.held()?.insert(name.to_owned(), Held { uid, drivers, results });
        Ok(out)
    }

    pub(super) async fn unprepare(&self, name: &str) -> anyhow::Result<()> {
        let (uid, drivers) = {
            let held = self.held()?;
            let h = held.get(name).ok_or_else(|| anyhow::anyhow!("no claim {name} was prepared here"))?;
            (h.uid.clone(), h.drivers.clone())
        };
        for driver in &drivers {
            let answers = self.kubelet.unprepare(driver, &[(NAMESPACE, uid.as_str(), name)]).await?;
            let e = answers.get(&uid).cloned().unwrap_or_default();
            anyhow::ensure!(e.is_empty(), "{driver}: {e}");
        }
        self.held()?.remove(name);
        self.api.delete_claim(NAMESPACE, name);
        Ok(())
    }
}
