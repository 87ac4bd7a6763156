//! `devplug try`: devplug served to a local kubelet, for a vendor or operator without a cluster.
//! This file runs it and reads the prompt; [`claims`] is the DRA side (claim files, allocation,
//! prepare), [`print`] what it prints and the Device Plugin commands. Only in the vendor build
//! (the `try` feature): the node binary links none of it.
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
//! DEVICE... [--tolerate-taints]` (those devices, by DRA name or device ID; a tainted,
//! Unhealthy one only when the claim tolerates taints, as the scheduler decides) and
//! `unprepare CLAIM`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use devplug::cli::RunArgs;
use devplug::kubelet::RegistrationMode;
use tokio::io::AsyncBufReadExt;

use devplug_standins::{apiserver, kubelet, kubelet_dra, scheduler};
use kubelet::Kubelet;

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

mod claims;
mod print;

use claims::Dra;
use print::{allocate, list, print_changes, print_pools};

/// Run devplug (configured by `args`, its kubelet local) until `quit`, end of input or `shutdown`.
pub async fn run(args: &RunArgs, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
    let mut cfg = args.config()?;
    let scratch = tempfile::tempdir()?;
    local_dirs(args, &mut cfg, scratch.path())?;
    let node = args.node_name.clone().unwrap_or_else(|| DEFAULT_NODE.to_owned());
    devplug::dra::node::check_node_name(&node)?;
    // Which resources go through DRA: `allocate` of one says so instead of "not registered".
    let dra_resources = cfg.dra_resources();
    let (kubelet, dra) = if cfg.uses_dra() {
        let (kubelet, dra) = start_dra(args, &mut cfg, scratch.path(), &node).await?;
        (kubelet, Some(dra))
    } else {
        cfg.registration = RegistrationMode::KubeletSocket;
        let kubelet = Kubelet::try_start(&cfg.kubelet_dir, None)
            .await
            .map_err(|e| anyhow::anyhow!("start the local kubelet: {e}"))?;
        (Arc::new(kubelet), None)
    };
    let commands = if dra.is_some() {
        "allocate RESOURCE ID...|COUNT, list, slices, claim FILE, claim DRIVER DEVICE... [--tolerate-taints], unprepare CLAIM, quit"
    } else {
        "allocate RESOURCE ID...|COUNT, list, quit"
    };
    say!("local kubelet at {} — commands: {commands}", cfg.kubelet_dir.display());
    if args.kubelet_only && dra.is_some() {
        say!("{}", separate_run(&cfg, &node, &args.dra));
    }
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
    let here = Commands { kubelet: &kubelet, dra: dra.as_ref(), dra_resources: &dra_resources, help: commands };
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    loop {
        tokio::select! {
            line = lines.next_line() => {
                let Some(line) = line? else { break };
                if !here.run(&line).await? {
                    break;
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

/// A local kubelet of `try`'s own, CDI specs and the HTTP endpoints beside it (under
/// `scratch`), unless the user chose: never a real node's directories by surprise.
fn local_dirs(args: &RunArgs, cfg: &mut devplug::config::Config, scratch: &std::path::Path) -> anyhow::Result<()> {
    if args.kubelet_dir.is_none() {
        cfg.kubelet_dir = scratch.join("device-plugins");
    }
    if args.cdi_dir.is_none() {
        cfg.cdi_dir = scratch.join("cdi");
    }
    if args.metrics_addr.is_none() {
        cfg.metrics_addr = "127.0.0.1:0".parse()?;
    }
    // The compile cache every command shares (a vendor's `discover` compiled it already).
    if cfg.cache_dir.is_none() {
        cfg.cache_dir = devplug::cli::cache::dir(None);
    }
    Ok(())
}

/// Resources served through DRA (`--dra RESOURCE`, or `api = "dra"` in the config) get a local
/// API server (the test suite's stand-in, which validates slices and claim status as
/// kube-apiserver 1.36 does) and kubelet's DRA side; plugins then register through kubelet's
/// plugin watcher, as on a real node. `cfg` is pointed at them.
async fn start_dra(
    args: &RunArgs,
    cfg: &mut devplug::config::Config,
    scratch: &std::path::Path,
    node: &str,
) -> anyhow::Result<(Arc<Kubelet>, Dra)> {
    let api = Arc::new(
        apiserver::ApiServer::try_start(&[node])
            .await
            .map_err(|e| anyhow::anyhow!("start the local API server on 127.0.0.1: {e}"))?,
    );
    // `try`'s `--kubeconfig` says where to write the local server's kubeconfig (for a separate
    // `devplug run`), not which server to use: `try` is the server.
    let kubeconfig = args.kubeconfig.clone().unwrap_or_else(|| scratch.join("kubeconfig"));
    write_kubeconfig(&kubeconfig, &api.kubeconfig())?;
    cfg.dra.kubeconfig = Some(kubeconfig);
    cfg.dra.node_name = Some(node.to_owned());
    // A separate `run --kubelet-dir K` finds kubelet's plugin dirs beside K, as on a node;
    // otherwise they are `try`'s own.
    let beside_kubelet = args.kubelet_only && args.kubelet_dir.is_some();
    if args.dra_plugins_dir.is_none() && !beside_kubelet {
        cfg.dra.plugins_dir = Some(scratch.join("plugins"));
    }
    if args.plugins_registry_dir.is_none() && !beside_kubelet {
        cfg.plugins_registry_dir = Some(scratch.join("plugins_registry"));
    }
    cfg.registration = RegistrationMode::PluginWatcher;
    let registry = cfg.plugins_registry_dir();
    let kubelet = Arc::new(
        Kubelet::try_start(&cfg.kubelet_dir, Some(&registry))
            .await
            .map_err(|e| anyhow::anyhow!("start the local kubelet: {e}"))?,
    );
    let dra = kubelet_dra::DraKubelet::new(kubelet_dra::KNOWN_1_34, node, api.clone());
    kubelet.handle("DRAPlugin", dra.clone());
    let dra = Dra {
        status: cfg.status_socket(),
        api,
        kubelet: dra,
        cdi: cfg.cdi_dir.clone(),
        node: node.to_owned(),
        resources: cfg.dra_resources(),
        selectors: scheduler::cel::Selectors::new(),
        claims: Default::default(),
        made: Default::default(),
    };
    Ok((kubelet, dra))
}

/// What the prompt's commands act on.
struct Commands<'a> {
    kubelet: &'a Kubelet,
    dra: Option<&'a Dra>,
    dra_resources: &'a [String],
    help: &'a str,
}

impl Commands<'_> {
    /// One line typed at the prompt; `false` to stop.
    async fn run(&self, line: &str) -> anyhow::Result<bool> {
        let words: Vec<&str> = line.split_whitespace().collect();
        match (words.as_slice(), self.dra) {
            ([], _) => {}
            (["quit" | "exit"], _) => return Ok(false),
            (["list"], _) => list(self.kubelet).await,
            (["allocate", rest @ ..], _) => match allocate(self.kubelet, rest, self.dra_resources).await {
                Ok(v) => say!("{}", serde_json::to_string_pretty(&v)?),
                Err(e) => say!("allocate failed: {e:#}"),
            },
            (["slices"], Some(d)) => {
                say!(
                    "{}",
                    serde_json::to_string_pretty(&d.api.slices(&d.node, None).into_values().collect::<Vec<_>>())?
                )
            }
            (["claim", file], Some(d)) => match d.claim_file(file).await {
                Ok(text) => say!("{text}"),
                Err(e) => say!("claim failed: {e:#}"),
            },
            (["claim", driver, devices @ ..], Some(d)) if !devices.is_empty() => {
                match d.claim_devices(driver, devices).await {
                    Ok(text) => say!("{text}"),
                    Err(e) => say!("claim failed: {e:#}"),
                }
            }
            (["unprepare", name], Some(d)) => match d.unprepare(name).await {
                Ok(()) => say!("unprepared {name}"),
                Err(e) => say!("unprepare failed: {e:#}"),
            },
            _ => say!("commands: {}", self.help),
        }
        Ok(true)
    }
}

/// Write the local API server's kubeconfig to `path`: `0600`, never through a link (its token is
/// a secret), in a directory of the user's own (created `0700` when missing).
fn write_kubeconfig(path: &std::path::Path, text: &str) -> anyhow::Result<()> {
    let fail = |e: &dyn std::fmt::Display| anyhow::anyhow!("write the local kubeconfig {}: {e}", path.display());
    let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        return Err(fail(&"give a file path (--kubeconfig)"));
    };
    let dir = if dir.as_os_str().is_empty() { std::path::Path::new(".") } else { dir };
    devplug::durable::StateDir::open(dir).and_then(|d| d.write(name, text.as_bytes(), false)).map_err(|e| fail(&e))
}

/// What `try --kubelet-only --dra` prints: where its API server's kubeconfig is, and the flags
/// a separate `devplug run` needs to reach this kubelet, its plugin dirs and that server.
fn separate_run(cfg: &devplug::config::Config, node: &str, dra: &[String]) -> String {
    let kubeconfig = cfg.dra.kubeconfig.as_deref().map(|p| p.display().to_string()).unwrap_or_default();
    let mut flags = vec![format!("--kubelet-dir {}", cfg.kubelet_dir.display())];
    // Kubelet's plugin dirs only where they are not the ones beside --kubelet-dir.
    let mut beside = cfg.clone();
    beside.plugins_registry_dir = None;
    beside.dra.plugins_dir = None;
    if cfg.plugins_registry_dir() != beside.plugins_registry_dir() {
        flags.push(format!("--plugins-registry-dir {}", cfg.plugins_registry_dir().display()));
    }
    if cfg.dra_plugins_dir() != beside.dra_plugins_dir() {
        flags.push(format!("--dra-plugins-dir {}", cfg.dra_plugins_dir().display()));
    }
    flags.extend([
        format!("--cdi-dir {}", cfg.cdi_dir.display()),
        format!("--kubeconfig {kubeconfig}"),
        format!("--node-name {node}"),
    ]);
    flags.extend(dra.iter().map(|r| format!("--dra {r}")));
    format!(
        "local API server: kubeconfig {kubeconfig} (node {node}); a separate devplug serves this node with: devplug run {} (plus its own config and backend flags)",
        flags.join(" ")
    )
}

/// Resolves once the daemon task ended (it stops on its own only on a fatal error).
async fn daemon_done(daemon: &tokio::task::JoinHandle<anyhow::Result<()>>) {
    while !daemon.is_finished() {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
