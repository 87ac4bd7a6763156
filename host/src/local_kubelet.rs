//! `devplug try`: devplug served to a local kubelet, for a vendor or operator without a cluster.
//!
//! The kubelet here is the test suite's stand-in itself (the `devplug-standins` crate, built from
//! upstream's rules and recorded answers, not devplug's), so it enforces exactly what the tests
//! hold devplug to: kubelet's
//! registration rules, its dial back inside `Register`, `ListAndWatch` and `Allocate` over real
//! Unix sockets. It prints every registration and device-list change, and takes commands on
//! stdin: `allocate RESOURCE ID...` or `allocate RESOURCE COUNT` (kubelet's own way: healthy
//! devices, the plugin's preferred allocation when it offers one), `list`, `quit`. With resources
//! served through DRA (`--dra RESOURCE`) it also brings the API-server stand-in, kube-scheduler's
//! allocator and kubelet's DRA side, on node `--node-name` (default `local`): `slices`,
//! `claim FILE` (the ResourceClaims of a YAML/JSON file, validated as the API server does,
//! allocated as kube-scheduler does: CEL selectors, several requests, `firstAvailable`,
//! constraints across drivers, counters, taints; then prepared through kubelet's
//! `NodePrepareResources` by each driver of the claim, its CDI specs printed), `claim DRIVER
//! DEVICE...` (those devices, by DRA name or device ID) and `unprepare CLAIM`.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use devplug::cli::RunArgs;
use devplug::kubelet::RegistrationMode;
use devplug_standins::proto::deviceplugin as pb;
use tokio::io::AsyncBufReadExt;

use devplug_standins::{apiserver, kubelet, kubelet_dra, scheduler};
use k8s_openapi::api::resource::v1::DeviceClass;
use kubelet::{Kubelet, Plugin};

/// The node `try` plays, for DRA, unless `--node-name` (or `$NODE_NAME`) names another.
const DEFAULT_NODE: &str = "local";

/// A line to stdout; a reader that went away is not an error (SIGPIPE stays ignored here, as in
/// `run`, because the daemon inside writes to sockets whose peers may be gone).
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// Run devplug (configured by `args`, its kubelet local) until `quit`, end of input or `shutdown`.
pub async fn run(args: &RunArgs, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
    let mut cfg = args.config()?;
    let scratch = tempfile::tempdir()?;
    // A local kubelet of its own, CDI specs and the HTTP endpoints beside it, unless the user
    // chose: never a real node's directories by surprise.
    if args.kubelet_dir.is_none() {
        cfg.kubelet_dir = scratch.path().join("device-plugins");
    }
    if args.cdi_dir.is_none() {
        cfg.cdi_dir = scratch.path().join("cdi");
    }
    if args.metrics_addr.is_none() {
        cfg.metrics_addr = "127.0.0.1:0".parse()?;
    }
    // The compile cache every command shares (a vendor's `discover` compiled it already).
    if cfg.cache_dir.is_none() {
        cfg.cache_dir = devplug::cli::cache::dir(None);
    }
    // Resources served through DRA (`--dra RESOURCE`, or `api = "dra"` in the config) get a
    // local API server (the test suite's stand-in, which validates slices and claim status as
    // kube-apiserver 1.36 does) and kubelet's DRA side; plugins then register through kubelet's
    // plugin watcher, as on a real node.
    let dra_on = cfg.uses_dra();
    let node = args.node_name.clone().unwrap_or_else(|| DEFAULT_NODE.to_owned());
    if let Some(why) = devplug::dra::publish::rules::subdomain_problem(&node) {
        anyhow::bail!("node name {node:?} is not a DNS subdomain ({why}): give another --node-name");
    }
    let (kubelet, dra) = if dra_on {
        let api = Arc::new(
            apiserver::ApiServer::try_start(&[node.as_str()])
                .await
                .map_err(|e| anyhow::anyhow!("start the local API server on 127.0.0.1: {e}"))?,
        );
        let kubeconfig = scratch.path().join("kubeconfig");
        // The token is a secret: written `0600`, never through a link (devplug's own state files).
        devplug::durable::StateDir::open(scratch.path())
            .and_then(|d| d.write("kubeconfig", api.kubeconfig().as_bytes(), false))
            .map_err(|e| anyhow::anyhow!("write the local kubeconfig {}: {e}", kubeconfig.display()))?;
        cfg.dra.kubeconfig = Some(kubeconfig);
        cfg.dra.node_name = Some(node.clone());
        if args.dra_plugins_dir.is_none() {
            cfg.dra.plugins_dir = Some(scratch.path().join("plugins"));
        }
        if args.plugins_registry_dir.is_none() {
            cfg.plugins_registry_dir = Some(scratch.path().join("plugins_registry"));
        }
        cfg.registration = RegistrationMode::PluginWatcher;
        let registry = cfg.plugins_registry_dir();
        let kubelet = Arc::new(Kubelet::start_with_watcher(&cfg.kubelet_dir, &registry).await);
        let dra = kubelet_dra::DraKubelet::new(kubelet_dra::KNOWN_1_34, &node, api.clone());
        kubelet.handle("DRAPlugin", dra.clone());
        let dra = Dra {
            api,
            kubelet: dra,
            cdi: cfg.cdi_dir.clone(),
            node: node.clone(),
            selectors: scheduler::cel::Selectors::new(),
            claims: Default::default(),
            made: Default::default(),
        };
        (kubelet, Some(dra))
    } else {
        cfg.registration = RegistrationMode::KubeletSocket;
        (Arc::new(Kubelet::start(&cfg.kubelet_dir).await), None)
    };
    let commands = if dra.is_some() {
        "allocate RESOURCE ID...|COUNT, list, slices, claim FILE, claim DRIVER DEVICE..., unprepare CLAIM, quit"
    } else {
        "allocate RESOURCE ID...|COUNT, list, quit"
    };
    say!("local kubelet at {} — commands: {commands}", cfg.kubelet_dir.display());
    let (quit_tx, quit_rx) = tokio::sync::oneshot::channel::<()>();
    let stop = async move {
        tokio::select! {
            _ = shutdown => {}
            _ = quit_rx => {}
        }
    };
    // `--kubelet-only`: the devplug under test is another process, registering here.
    let daemon = if args.kubelet_only {
        tokio::spawn(async move {
            stop.await;
            anyhow::Ok(())
        })
    } else {
        tokio::spawn(devplug::daemon::run(cfg, stop))
    };
    let printer = tokio::spawn(print_changes(kubelet.clone()));
    let dra_printer = dra.as_ref().map(|d| tokio::spawn(print_pools(d.api.clone(), d.node.clone())));
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    loop {
        tokio::select! {
            line = lines.next_line() => {
                let Some(line) = line? else { break };
                let words: Vec<&str> = line.split_whitespace().collect();
                match words.as_slice() {
                    [] => {}
                    ["quit" | "exit"] => break,
                    ["list"] => list(&kubelet).await,
                    ["allocate", rest @ ..] => match allocate(&kubelet, rest).await {
                        Ok(v) => say!("{}", serde_json::to_string_pretty(&v)?),
                        Err(e) => say!("allocate failed: {e:#}"),
                    },
                    ["slices"] if dra.is_some() => {
                        if let Some(d) = &dra {
                            say!("{}", serde_json::to_string_pretty(&d.api.slices(&d.node, None).into_values().collect::<Vec<_>>())?);
                        }
                    }
                    ["claim", file] if dra.is_some() => {
                        if let Some(d) = &dra {
                            match d.claim_file(file).await {
                                Ok(text) => say!("{text}"),
                                Err(e) => say!("claim failed: {e:#}"),
                            }
                        }
                    }
                    ["claim", driver, devices @ ..] if dra.is_some() && !devices.is_empty() => {
                        if let Some(d) = &dra {
                            match d.claim_devices(driver, devices).await {
                                Ok(text) => say!("{text}"),
                                Err(e) => say!("claim failed: {e:#}"),
                            }
                        }
                    }
                    ["unprepare", name] if dra.is_some() => {
                        if let Some(d) = &dra {
                            match d.unprepare(name).await {
                                Ok(()) => say!("unprepared {name}"),
                                Err(e) => say!("unprepare failed: {e:#}"),
                            }
                        }
                    }
                    _ => say!("commands: {commands}"),
                }
            }
            _ = daemon_done(&daemon) => break,
        }
    }
    printer.abort();
    if let Some(p) = dra_printer {
        p.abort();
    }
    let _ = quit_tx.send(());
    daemon.await?
}

/// The DRA side of `try`: the local API server, kubelet's DRA manager, the scheduler's
/// allocator, and the claims prepared.
struct Dra {
    api: Arc<apiserver::ApiServer>,
    kubelet: Arc<kubelet_dra::DraKubelet>,
    cdi: std::path::PathBuf,
    node: String,
    selectors: scheduler::cel::Selectors,
    /// Claim name → what was prepared for it.
    claims: std::sync::Mutex<BTreeMap<String, Held>>,
    /// Claims made so far, for UIDs and default names.
    made: std::sync::atomic::AtomicUsize,
}

/// A prepared claim: its UID, the drivers that prepared it, and its allocation's results
/// (devices other claims cannot have).
struct Held {
    uid: String,
    drivers: Vec<String>,
    results: Vec<serde_json::Value>,
}

/// The allocation results of the claims `held`: devices other claims cannot have.
fn allocated(held: &BTreeMap<String, Held>) -> Vec<serde_json::Value> {
    held.values().flat_map(|h| h.results.clone()).collect()
}

/// The namespace `try`'s claims live in.
const NAMESPACE: &str = "default";

/// Largest claim file `claim FILE` reads.
const MAX_CLAIM_FILE: u64 = 1 << 20;

impl Dra {
    fn held(&self) -> anyhow::Result<std::sync::MutexGuard<'_, BTreeMap<String, Held>>> {
        self.claims.lock().map_err(|_| anyhow::anyhow!("the claims table was poisoned by an earlier panic"))
    }

    /// Wait (up to 30 s) until this node has a pool published: a claim typed (or piped) while
    /// the backends are still loading waits for them, as a pod stays pending until devices
    /// are published, rather than failing on an empty node.
    async fn published(&self) {
        let end = tokio::time::Instant::now() + Duration::from_secs(30);
        while self.api.slices(&self.node, None).is_empty() && tokio::time::Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The DeviceClasses devplug installs for the resources published on this node (`dra
    /// deviceclasses`), by name.
    fn classes(&self) -> BTreeMap<String, DeviceClass> {
        let mut classes = BTreeMap::new();
        for slice in self.api.slices(&self.node, None).values() {
            let driver = slice["spec"]["driver"].as_str().unwrap_or("");
            for d in slice["spec"]["devices"].as_array().into_iter().flatten() {
                if let Some(resource) = d["attributes"]["resource"]["string"].as_str() {
                    let class = devplug::dra::publish::classes::device_class(resource, driver);
                    if let Ok(c) = serde_json::from_value::<DeviceClass>(class) {
                        classes.insert(c.metadata.name.clone().unwrap_or_default(), c);
                    }
                }
            }
        }
        classes
    }

    /// `claim FILE`: each ResourceClaim (or ResourceClaimTemplate) of a YAML or JSON file,
    /// validated as the API server does, allocated from this node's published devices as
    /// kube-scheduler does (with devplug's DeviceClasses and any the file has), and prepared.
    async fn claim_file(&self, path: &str) -> anyhow::Result<String> {
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
        self.published().await;
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
            match prepared {
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

    /// `claim DRIVER DEVICE...`: the devices named (by their DRA name or devplug device ID) of
    /// `driver`'s pool on this node, allocated as given (as an admin would write a claim's
    /// allocation), and prepared.
    async fn claim_devices(&self, driver: &str, devices: &[&str]) -> anyhow::Result<String> {
        self.published().await;
        let pool = self.api.devices(&self.node, driver);
        anyhow::ensure!(
            !pool.is_empty(),
            "driver {driver} has no devices published on node {} (see `slices`)",
            self.node
        );
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
            let resource = device["attributes"]["resource"]["string"].as_str().unwrap_or("");
            let request = format!("device-{i}");
            requests.push(serde_json::json!({ "name": request, "exactly": {
                "deviceClassName": devplug::dra::publish::classes::class_name(resource) } }));
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
            let answer = match self.kubelet.prepare(driver, &me).await {
                Ok(answers) => {
                    answers.get(&uid).cloned().ok_or_else(|| anyhow::anyhow!("{driver} gave no answer for {name}"))
                }
                Err(e) => Err(anyhow::anyhow!("{driver}: {}", e.message())),
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

    async fn unprepare(&self, name: &str) -> anyhow::Result<()> {
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

/// Every change of a DRA pool on this node: its driver and device names.
async fn print_pools(api: Arc<apiserver::ApiServer>, node: String) {
    let mut last: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut ticks = tokio::time::interval(Duration::from_millis(100));
    loop {
        ticks.tick().await;
        let drivers: std::collections::BTreeSet<String> =
            api.slices(&node, None).values().filter_map(|s| s["spec"]["driver"].as_str().map(str::to_owned)).collect();
        for driver in drivers {
            let names: Vec<String> = api.devices(&node, &driver).into_keys().collect();
            if !names.is_empty() && last.get(&driver) != Some(&names) {
                say!("DRA driver {driver}: {} devices published: {}", names.len(), names.join(" "));
                last.insert(driver, names);
            }
        }
    }
}

/// Resolves once the daemon task ended (it stops on its own only on a fatal error).
async fn daemon_done(daemon: &tokio::task::JoinHandle<anyhow::Result<()>>) {
    while !daemon.is_finished() {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Every registration and every new device list, as they happen.
async fn print_changes(kubelet: Arc<Kubelet>) {
    let mut seen: BTreeMap<String, u64> = BTreeMap::new();
    let mut ticks = tokio::time::interval(Duration::from_millis(100));
    loop {
        ticks.tick().await;
        for p in kubelet.plugins().await {
            let updates = p.updates.load(Ordering::SeqCst);
            match seen.insert(p.resource.clone(), updates) {
                None => {
                    say!(
                        "registered {} (preferred allocation: {}, pre-start: {})",
                        p.resource,
                        yes(p.options.get_preferred_allocation_available),
                        yes(p.options.pre_start_required)
                    );
                    print_devices(&p);
                }
                Some(before) if before != updates => print_devices(&p),
                Some(_) => {}
            }
        }
    }
}

fn yes(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

fn print_devices(p: &Plugin) {
    let list = p.devices.borrow().clone();
    let healthy = list.iter().filter(|d| d.health == "Healthy").count();
    let ids: Vec<String> = list
        .iter()
        .map(|d| if d.health == "Healthy" { d.id.clone() } else { format!("{} (Unhealthy)", d.id) })
        .collect();
    say!("{}: {} devices, {healthy} healthy: {}", p.resource, list.len(), ids.join(" "));
}

async fn list(kubelet: &Kubelet) {
    let plugins = kubelet.plugins().await;
    if plugins.is_empty() {
        say!("nothing registered yet");
    }
    for p in plugins {
        print_devices(&p);
    }
}

/// `RESOURCE ID...` or `RESOURCE COUNT`, asked as kubelet asks: one container.
async fn allocate(kubelet: &Kubelet, words: &[&str]) -> anyhow::Result<serde_json::Value> {
    let [resource, rest @ ..] = words else { anyhow::bail!("allocate RESOURCE ID...|COUNT") };
    anyhow::ensure!(!rest.is_empty(), "allocate RESOURCE ID...|COUNT");
    let p = kubelet.plugin(resource).await.ok_or_else(|| anyhow::anyhow!("{resource} is not registered"))?;
    let mut client = p.client.clone();
    let ids: Vec<String> = match rest {
        [count] if count.parse::<usize>().is_ok() => {
            let n: usize = count.parse()?;
            let healthy: Vec<String> =
                p.devices.borrow().iter().filter(|d| d.health == "Healthy").map(|d| d.id.clone()).collect();
            anyhow::ensure!(healthy.len() >= n, "{resource} has {} healthy devices, {n} asked for", healthy.len());
            if p.options.get_preferred_allocation_available {
                let req = pb::PreferredAllocationRequest {
                    container_requests: vec![pb::ContainerPreferredAllocationRequest {
                        available_device_i_ds: healthy.clone(),
                        must_include_device_i_ds: vec![],
                        allocation_size: n as i32,
                    }],
                };
                let resp = client.get_preferred_allocation(req).await?.into_inner();
                resp.container_responses.into_iter().next().map(|c| c.device_i_ds).unwrap_or_default()
            } else {
                healthy.into_iter().take(n).collect()
            }
        }
        ids => ids.iter().map(|s| (*s).to_owned()).collect(),
    };
    let req =
        pb::AllocateRequest { container_requests: vec![pb::ContainerAllocateRequest { devices_ids: ids.clone() }] };
    let c = client.allocate(req).await?.into_inner().container_responses.into_iter().next().unwrap_or_default();
    Ok(serde_json::json!({
        "resource": resource,
        "allocated": ids,
        "envs": c.envs.into_iter().collect::<BTreeMap<_, _>>(),
        "devices": c.devices.iter().map(|d| serde_json::json!({
            "host_path": d.host_path, "container_path": d.container_path, "permissions": d.permissions,
        })).collect::<Vec<_>>(),
        "mounts": c.mounts.iter().map(|m| serde_json::json!({
            "host_path": m.host_path, "container_path": m.container_path, "read_only": m.read_only,
        })).collect::<Vec<_>>(),
        "annotations": c.annotations.into_iter().collect::<BTreeMap<_, _>>(),
        "cdi_devices": c.cdi_devices.iter().map(|d| d.name.clone()).collect::<Vec<_>>(),
    }))
}
