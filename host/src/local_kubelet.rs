//! `devplug try`: devplug served to a local kubelet, for a vendor or operator without a cluster.
//!
//! The kubelet here is the test suite's stand-in itself (the `devplug-standins` crate, built from
//! upstream's rules and recorded answers, not devplug's), so it enforces exactly what the tests
//! hold devplug to: kubelet's
//! registration rules, its dial back inside `Register`, `ListAndWatch` and `Allocate` over real
//! Unix sockets. It prints every registration and device-list change, and takes commands on
//! stdin: `allocate RESOURCE ID...` or `allocate RESOURCE COUNT` (kubelet's own way: healthy
//! devices, the plugin's preferred allocation when it offers one), `list`, `quit`. With resources
//! served through DRA (`--dra RESOURCE`) it also brings the API-server stand-in and kubelet's DRA
//! side: `slices`, `claim DRIVER DEVICE...` (allocated as the scheduler would, prepared through
//! kubelet's `NodePrepareResources`, its CDI spec printed) and `unprepare CLAIM`.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use devplug::cli::RunArgs;
use devplug::kubelet::RegistrationMode;
use devplug_standins::proto::deviceplugin as pb;
use tokio::io::AsyncBufReadExt;

use devplug_standins::{apiserver, kubelet, kubelet_dra};
use kubelet::{Kubelet, Plugin};

/// The node `try` plays, for DRA.
const NODE: &str = "local";

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
    let (kubelet, dra) = if dra_on {
        let api = Arc::new(
            apiserver::ApiServer::try_start(&[NODE])
                .await
                .map_err(|e| anyhow::anyhow!("start the local API server on 127.0.0.1: {e}"))?,
        );
        let kubeconfig = scratch.path().join("kubeconfig");
        // The token is a secret: written `0600`, never through a link (devplug's own state files).
        devplug::durable::StateDir::open(scratch.path())
            .and_then(|d| d.write("kubeconfig", api.kubeconfig().as_bytes(), false))
            .map_err(|e| anyhow::anyhow!("write the local kubeconfig {}: {e}", kubeconfig.display()))?;
        cfg.dra.kubeconfig = Some(kubeconfig);
        cfg.dra.node_name = Some(NODE.into());
        if args.dra_plugins_dir.is_none() {
            cfg.dra.plugins_dir = Some(scratch.path().join("plugins"));
        }
        if args.plugins_registry_dir.is_none() {
            cfg.plugins_registry_dir = Some(scratch.path().join("plugins_registry"));
        }
        cfg.registration = RegistrationMode::PluginWatcher;
        let registry = cfg.plugins_registry_dir();
        let kubelet = Arc::new(Kubelet::start_with_watcher(&cfg.kubelet_dir, &registry).await);
        let dra = kubelet_dra::DraKubelet::new(kubelet_dra::KNOWN_1_34, NODE, api.clone());
        kubelet.handle("DRAPlugin", dra.clone());
        (kubelet, Some(Dra { api, kubelet: dra, cdi: cfg.cdi_dir.clone(), claims: Default::default() }))
    } else {
        cfg.registration = RegistrationMode::KubeletSocket;
        (Arc::new(Kubelet::start(&cfg.kubelet_dir).await), None)
    };
    let commands = if dra.is_some() {
        "allocate RESOURCE ID...|COUNT, list, slices, claim DRIVER DEVICE..., unprepare CLAIM, quit"
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
    let dra_printer = dra.as_ref().map(|d| tokio::spawn(print_pools(d.api.clone())));
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
                            say!("{}", serde_json::to_string_pretty(&d.api.slices(NODE, None).into_values().collect::<Vec<_>>())?);
                        }
                    }
                    ["claim", driver, devices @ ..] if dra.is_some() && !devices.is_empty() => {
                        if let Some(d) = &dra {
                            match d.claim(driver, devices).await {
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

/// The DRA side of `try`: the local API server, kubelet's DRA manager, and the claims made.
struct Dra {
    api: Arc<apiserver::ApiServer>,
    kubelet: Arc<kubelet_dra::DraKubelet>,
    cdi: std::path::PathBuf,
    /// Claim name → (driver, UID).
    claims: std::sync::Mutex<BTreeMap<String, (String, String)>>,
}

impl Dra {
    /// Allocate a claim of `devices` of `driver`'s pool on this node, as the scheduler would
    /// (a share ID for a device several claims may hold), and prepare it through kubelet's DRA
    /// call; the answer and the claim's CDI spec, as text.
    async fn claim(&self, driver: &str, devices: &[&str]) -> anyhow::Result<String> {
        let pool = self.api.devices(NODE, driver);
        anyhow::ensure!(!pool.is_empty(), "driver {driver} has no devices published (see `slices`)");
        let n = self.claims.lock().map_err(|_| anyhow::anyhow!("claims lock"))?.len() + 1;
        let (name, uid) = (format!("claim-{n}"), format!("0c1a1000-0000-4000-8000-{n:012x}"));
        let mut picked = Vec::new();
        for (i, d) in devices.iter().enumerate() {
            let device = pool.get(*d).ok_or_else(|| {
                anyhow::anyhow!(
                    "no device {d} in {driver}'s pool: {}",
                    pool.keys().cloned().collect::<Vec<_>>().join(", ")
                )
            })?;
            let share = (device["allowMultipleAllocations"] == true)
                .then(|| format!("5ba7e000-0000-4000-8000-{:06x}{i:06x}", n));
            picked.push((format!("req-{i}"), (*d).to_owned(), share));
        }
        let shared: Vec<(&str, &str, &str, &str, &str)> =
            picked.iter().map(|(r, d, s)| (r.as_str(), driver, NODE, d.as_str(), s.as_deref().unwrap_or(""))).collect();
        if picked.iter().any(|(_, _, s)| s.is_some()) {
            self.api.allocate_shared_claim("default", &name, &uid, &shared);
        } else {
            let plain: Vec<(&str, &str, &str, &str)> = shared.iter().map(|(r, d, p, n, _)| (*r, *d, *p, *n)).collect();
            self.api.allocate_claim("default", &name, &uid, &plain);
        }
        let answers = self.kubelet.prepare(driver, &[("default", uid.as_str(), name.as_str())]).await?;
        let a = answers.get(&uid).ok_or_else(|| anyhow::anyhow!("the driver gave no answer for {name}"))?;
        anyhow::ensure!(a.error.is_empty(), "{name}: {}", a.error);
        self.claims
            .lock()
            .map_err(|_| anyhow::anyhow!("claims lock"))?
            .insert(name.clone(), (driver.to_owned(), uid.clone()));
        let mut out = format!("prepared {name} (uid {uid}) through {driver}:\n");
        for ((requests, _, device, cdi), share) in a.devices.iter().zip(&a.shares) {
            let share = if share.is_empty() { String::new() } else { format!(" share {share}") };
            out.push_str(&format!("  {} {device}{share}: CDI {}\n", requests.join(","), cdi.join(", ")));
        }
        let spec = self.cdi.join(format!("devplug-claim-{uid}.json"));
        match std::fs::read_to_string(&spec) {
            Ok(text) => out.push_str(&format!("CDI spec {}:\n{text}", spec.display())),
            Err(e) => out.push_str(&format!("no CDI spec at {}: {e}", spec.display())),
        }
        Ok(out)
    }

    async fn unprepare(&self, name: &str) -> anyhow::Result<()> {
        let (driver, uid) = self
            .claims
            .lock()
            .map_err(|_| anyhow::anyhow!("claims lock"))?
            .get(name)
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("no claim {name} was prepared here"))?;
        let answers = self.kubelet.unprepare(&driver, &[("default", uid.as_str(), name)]).await?;
        let e = answers.get(&uid).cloned().unwrap_or_default();
        anyhow::ensure!(e.is_empty(), "{e}");
        Ok(())
    }
}

/// Every change of a DRA pool on this node: its driver and device names.
async fn print_pools(api: Arc<apiserver::ApiServer>) {
    let mut last: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut ticks = tokio::time::interval(Duration::from_millis(100));
    loop {
        ticks.tick().await;
        let drivers: std::collections::BTreeSet<String> =
            api.slices(NODE, None).values().filter_map(|s| s["spec"]["driver"].as_str().map(str::to_owned)).collect();
        for driver in drivers {
            let names: Vec<String> = api.devices(NODE, &driver).into_keys().collect();
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
