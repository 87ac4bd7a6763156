//! `devplug try`: devplug served to a local kubelet, for a vendor or operator without a cluster.
//!
//! The kubelet here is the test suite's stand-in itself (`tests/support/kubelet.rs`, compiled
//! into the binary), so it enforces exactly what the tests hold devplug to: kubelet's
//! registration rules, its dial back inside `Register`, `ListAndWatch` and `Allocate` over real
//! Unix sockets. It prints every registration and device-list change, and takes commands on
//! stdin: `allocate RESOURCE ID...` or `allocate RESOURCE COUNT` (kubelet's own way: healthy
//! devices, the plugin's preferred allocation when it offers one), `list`, `quit`.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use devplug::cli::RunArgs;
use devplug::kubelet::RegistrationMode;
use devplug::proto::deviceplugin as pb;
use tokio::io::AsyncBufReadExt;

#[allow(dead_code)]
#[path = "../../tests/support/uds.rs"]
mod uds;

#[allow(dead_code)]
#[path = "../../tests/support/h2wire.rs"]
mod h2wire;

#[allow(dead_code)]
#[path = "../../tests/support/kubelet.rs"]
mod standin;

use standin::{Kubelet, Plugin};

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
    cfg.registration = RegistrationMode::KubeletSocket;
    let kubelet = Arc::new(Kubelet::start(&cfg.kubelet_dir).await);
    say!(
        "local kubelet at {} — commands: allocate RESOURCE ID...|COUNT, list, quit",
        cfg.kubelet_dir.join("kubelet.sock").display()
    );
    let (quit_tx, quit_rx) = tokio::sync::oneshot::channel::<()>();
    let stop = async move {
        tokio::select! {
            _ = shutdown => {}
            _ = quit_rx => {}
        }
    };
    let daemon = tokio::spawn(devplug::daemon::run(cfg, stop));
    let printer = tokio::spawn(print_changes(kubelet.clone()));
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
                    _ => say!("commands: allocate RESOURCE ID...|COUNT, list, quit"),
                }
            }
            _ = daemon_done(&daemon) => break,
        }
    }
    printer.abort();
    let _ = quit_tx.send(());
    daemon.await?
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
