//! devplug's DRA kubelet plugin beside upstream's Go test driver (`test/e2e/dra/test-driver`,
//! built by `scripts/kube-assets/build --test-driver`), both publishing to and reading claims
//! from one real kube-apiserver, called through kubelet's DRA client pattern (the stand-in's:
//! `NodePrepareResources` / `NodeUnprepareResources` v1 over each plugin's Unix socket, found
//! through the plugin watcher), claim by claim interleaved (the order alternates), with two
//! CPU hogs running on this 2-core machine. Prints both drivers' percentiles and where devplug's
//! time goes (its `dra.*` tracing spans: the claim GET, the backend call, the checkpoint, the
//! spec write; and the status patch, which runs beside the answer). Numbers go in
//! docs/BENCHMARKS.md.
//!
//! Needs `KUBEBUILDER_ASSETS` naming a directory with `kube-apiserver`, `etcd` and
//! `dra-test-driver`; without them it says so and exits 0.
//!
//!     KUBEBUILDER_ASSETS=~/.cache/devplug-tools/kube-assets cargo bench --bench dra_upstream [-- --quick] [-- --no-hogs]

use devplug_test_support as support;

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::dra_node::{DRIVER, NODE, chaos_node};
use support::envtest::RealApiServer;
use support::fixtures::Machine;
use support::stats::report;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::{Layer, filter};

const GO_DRIVER: &str = "test-driver.cdi.k8s.io";

/// Wall time of every closed `dra.*` span, by name.
#[derive(Clone, Default)]
struct SpanTimes(Arc<Mutex<HashMap<&'static str, Vec<Duration>>>>);

struct Began(Instant);

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> Layer<S> for SpanTimes {
    fn on_new_span(&self, _: &tracing::span::Attributes<'_>, id: &tracing::span::Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(Began(Instant::now()));
        }
    }

    fn on_close(&self, id: tracing::span::Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(&id)
            && let Some(Began(at)) = span.extensions().get::<Began>()
        {
            self.0.lock().unwrap().entry(span.name()).or_default().push(at.elapsed());
        }
    }
}

impl SpanTimes {
    fn take(&self) -> HashMap<&'static str, Vec<Duration>> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

/// utime + stime of process `pid` (`self` for this one), in clock ticks.
fn cpu_ticks(pid: &str) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    f.get(11).and_then(|u| u.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0)
}

/// Nanoseconds on a CPU of process `pid`'s threads whose name starts with `prefix`
/// (`/proc/PID/task/*/schedstat`, exact where ticks are 10 ms).
fn cpu_ns(pid: &str, prefix: &str) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return 0 };
    tasks
        .flatten()
        .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with(prefix)))
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// Children killed when the bench ends, however it ends.
struct Reaped(Vec<Child>);

impl Drop for Reaped {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let hogs = !args.iter().any(|a| a == "--no-hogs");
    let Some(assets) = std::env::var_os("KUBEBUILDER_ASSETS").map(std::path::PathBuf::from) else {
        println!(
            "dra_upstream: skipped (KUBEBUILDER_ASSETS is not set; scripts/kube-assets/build --test-driver makes it)"
        );
        return Ok(());
    };
    let go_driver = assets.join("dra-test-driver");
    if !go_driver.is_file() {
        println!("dra_upstream: skipped ({} is missing; scripts/kube-assets/build --test-driver)", go_driver.display());
        return Ok(());
    }
    let spans = SpanTimes::default();
    let only_dra = filter::filter_fn(|m| m.is_span() && m.name().starts_with("dra."));
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(spans.clone().with_filter(only_dra)))?;
    let client_rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    client_rt.block_on(async {
        let server = RealApiServer::from_env("dra_upstream").await.expect("KUBEBUILDER_ASSETS is set");
        server.create_node(NODE).await;
        let m = Machine::generic_box();
        let node = chaos_node(&m, "devices=8", "").await;
        let kubeconfig = node.root.path().join("kubeconfig-real");
        server.write_kubeconfig(&kubeconfig);
        let mut cfg = node.cfg.clone();
        cfg.dra.kubeconfig = Some(kubeconfig.clone());
        // devplug's defaults, not the test suite's 100 ms health poll.
        cfg.poll_interval = devplug::config::Config::default().poll_interval;
        // devplug in a runtime and threads of its own, as in its own process.
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let devplug = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("devplug-rt")
                .enable_all()
                .build()
                .expect("rt");
            rt.block_on(devplug::daemon::run(cfg, async move {
                let _ = stop_rx.await;
            }))
        });
        let root = node.root.path();
        let mut children = Reaped(Vec::new());
        // The test driver makes the parent of its socket directory, not the directory.
        std::fs::create_dir_all(root.join("plugins").join(GO_DRIVER))?;
        children.0.push(
            Command::new(&go_driver)
                .arg("--kubeconfig")
                .arg(&kubeconfig)
                .args(["-v", "0", "kubelet-plugin", "--node-name", NODE, "--num-devices", "8"])
                .arg("--cdi-dir")
                .arg(root.join("cdi-go"))
                .arg("--datadir")
                .arg(root.join("plugins"))
                .arg("--plugin-registration-path")
                .arg(root.join("plugins_registry"))
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(root.join("go-driver.log"))?)
                .spawn()?,
        );
        node.dra.wait_plugin(DRIVER, Duration::from_secs(60)).await;
        let end = Instant::now() + Duration::from_secs(60);
        while node.dra.plugin(GO_DRIVER).is_none() {
            if Instant::now() > end {
                let log = std::fs::read_to_string(root.join("go-driver.log")).unwrap_or_default();
                anyhow::bail!("the Go test driver did not register within 60 s; its log:\n{log}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if hogs {
            for _ in 0..2 {
                children.0.push(Command::new("sh").args(["-c", "while :; do :; done"]).spawn()?);
            }
        }
        let n = if quick { 100 } else { 1_000 };
        let warm = 30;
        let mut times: HashMap<(&str, &str), Vec<Duration>> = HashMap::new();
        for i in 0..n + warm {
            let k = i % 8;
            let d_name = format!("d{i}");
            let g_name = format!("g{i}");
            let d_uid = server.allocate_claim("bench", &d_name, &[("dev", DRIVER, NODE, &format!("widget-{k}"))]).await;
            let g_uid =
                server.allocate_claim("bench", &g_name, &[("dev", GO_DRIVER, NODE, &format!("device-{k:02}"))]).await;
            let mut pair = [(DRIVER, d_uid, d_name), (GO_DRIVER, g_uid, g_name)];
            if i % 2 == 1 {
                pair.reverse();
            }
            if i == warm {
                spans.take();
            }
            for (driver, uid, name) in &pair {
                let claim = [("bench", uid.as_str(), name.as_str())];
                let t = Instant::now();
                let answer = node.dra.prepare(driver, &claim).await?;
                let took = t.elapsed();
                anyhow::ensure!(answer[uid].error.is_empty(), "{driver}: {:?}", answer[uid]);
                let t = Instant::now();
                let un = node.dra.unprepare(driver, &claim).await?;
                let un_took = t.elapsed();
                anyhow::ensure!(un[uid].is_empty(), "{driver}: {un:?}");
                if i >= warm {
                    times.entry((driver, "prepare")).or_default().push(took);
                    times.entry((driver, "unprepare")).or_default().push(un_took);
                }
            }
        }
        let hogged = if hogs { "2 CPU hogs" } else { "no hogs" };
        for driver in [DRIVER, GO_DRIVER] {
            for call in ["prepare", "unprepare"] {
                report(&format!("{driver} {call} ({hogged})"), times.remove(&(driver, call)).unwrap_or_default());
            }
        }
        let mut by_span: Vec<_> = spans.take().into_iter().collect();
        by_span.sort();
        for (name, v) in by_span {
            if !v.is_empty() {
                report(&format!("devplug span {name}"), v);
            }
        }
        // Idle: the hogs stopped, nothing asked of either driver; CPU over a minute after a
        // warm-up. This process is devplug plus the idle kubelet stand-in and client.
        for mut hog in children.0.drain(1..) {
            let _ = hog.kill();
            let _ = hog.wait();
        }
        let go_pid = children.0[0].id().to_string();
        let (warm_up, window) = if quick { (5, 20) } else { (15, 60) };
        tokio::time::sleep(Duration::from_secs(warm_up)).await;
        let (d0, g0) = (cpu_ns("self", "devplug"), cpu_ns(&go_pid, ""));
        let (dt0, gt0) = (cpu_ticks("self"), cpu_ticks(&go_pid));
        tokio::time::sleep(Duration::from_secs(window)).await;
        let (d1, g1) = (cpu_ns("self", "devplug"), cpu_ns(&go_pid, ""));
        let (dt1, gt1) = (cpu_ticks("self"), cpu_ticks(&go_pid));
        for (who, ns, ticks) in [
            ("devplug (its threads; ticks: the whole bench process)", d1 - d0, dt1 - dt0),
            ("Go test driver", g1 - g0, gt1 - gt0),
        ] {
            println!(
                "idle {who}: {:.1} ms CPU in {window} s = {:.4} % of a core ({ticks} ticks)",
                ns as f64 / 1e6,
                ns as f64 / 1e9 / window as f64 * 100.0
            );
        }
        let _ = stop_tx.send(());
        drop(children);
        let _ = devplug.join();
        Ok(())
    })
}
