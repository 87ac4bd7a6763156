//! DRA benchmark (a bench binary, for percentiles): the prepare round trip through the kubelet
//! DRA stand-in (v1 over the plugin's Unix socket: claim read from the API-server stand-in,
//! the backend's allocate, the claim's CDI spec and the checkpoint written), next to the
//! device-plugin Allocate round trip of `benches/kubelet.rs`; and a device change announced by
//! a real kernel uevent → the pool's new generation in the API server. Numbers go in
//! docs/BENCHMARKS.md.

#[path = "../../tests/support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use support::apiserver::ApiServer;
use support::daemon::{Daemon, WIDGET, chaos_paths, config};
use support::fixtures::Machine;
use support::kubelet::Kubelet;
use support::kubelet_dra::{DraKubelet, KNOWN_1_34};

const NODE: &str = "node-a";
const DRIVER: &str = "chaos.devplug.io";
const LO_UEVENT: &str = "/sys/devices/virtual/net/lo/uevent";

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn report(name: &str, mut v: Vec<Duration>) {
    v.sort();
    println!(
        "{name}: n={} p50={:?} p90={:?} p99={:?} max={:?}",
        v.len(),
        pct(&v, 0.5),
        pct(&v, 0.9),
        pct(&v, 0.99),
        v[v.len() - 1]
    );
}

/// A node serving chaos (`chaos_config`, manifest lines `extra`) through DRA.
async fn node(
    chaos_config: &str,
    extra: &str,
    uevents: bool,
) -> anyhow::Result<(tempfile::TempDir, Machine, Arc<ApiServer>, Kubelet, Arc<DraKubelet>, Daemon)> {
    let dir = tempfile::tempdir()?;
    let m = Machine::generic_box();
    let backends = dir.path().join("backends");
    std::fs::create_dir_all(&backends)?;
    let (wasm, manifest) = chaos_paths();
    std::fs::copy(wasm, backends.join("chaos.wasm"))?;
    std::fs::write(backends.join("chaos.toml"), format!("{}{extra}", std::fs::read_to_string(manifest)?))?;
    let api = Arc::new(ApiServer::start(&[NODE]).await);
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig);
    let (kdir, registry) = (dir.path().join("device-plugins"), dir.path().join("plugins_registry"));
    let kubelet = Kubelet::start_with_watcher(&kdir, &registry).await;
    let dra = DraKubelet::new(KNOWN_1_34, NODE, api.clone());
    kubelet.handle("DRAPlugin", dra.clone());
    let mut cfg = config(&kdir, &m, &backends, chaos_config);
    cfg.registration = devplug::kubelet::RegistrationMode::PluginWatcher;
    cfg.plugins_registry_dir = Some(registry);
    cfg.write_cdi = true;
    cfg.cdi_dir = dir.path().join("cdi");
    cfg.uevents = uevents;
    if uevents {
        cfg.poll_interval = Duration::from_secs(3600);
    }
    cfg.resources.insert(
        WIDGET.into(),
        devplug::config::ResourceSettings { allocate: None, write_cdi: None, api: devplug::config::Api::Dra },
    );
    cfg.dra.kubeconfig = Some(kubeconfig);
    cfg.dra.node_name = Some(NODE.into());
    cfg.dra.plugins_dir = Some(dir.path().join("plugins"));
    let daemon = Daemon::start(cfg);
    dra.wait_plugin(DRIVER, Duration::from_secs(30)).await;
    let end = Instant::now() + Duration::from_secs(30);
    while api.devices(NODE, DRIVER).is_empty() {
        anyhow::ensure!(Instant::now() < end, "no pool published");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok((dir, m, api, kubelet, dra, daemon))
}

fn main() -> anyhow::Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async {
        let (_dir, _m, api, _kubelet, dra, daemon) = node("devices=8", "", false).await?;
        let n = if quick { 200 } else { 2_000 };
        let (mut prepare, mut unprepare) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for i in 0..n + 50 {
            let (name, uid) = (format!("c{i}"), format!("uid-{i}"));
            let device = format!("widget-{}", i % 8);
            api.allocate_claim("bench", &name, &uid, &[("dev", DRIVER, NODE, &device)]);
            let claim = [("bench", uid.as_str(), name.as_str())];
            let t = Instant::now();
            let answer = dra.prepare(DRIVER, &claim).await?;
            let took = t.elapsed();
            anyhow::ensure!(answer[&uid].error.is_empty(), "{:?}", answer[&uid]);
            let t = Instant::now();
            dra.unprepare(DRIVER, &claim).await?;
            // The first 50 warm up (connections, caches).
            if i >= 50 {
                prepare.push(took);
                unprepare.push(t.elapsed());
            }
        }
        report("DRA prepare round trip (1 device, v1 over UDS, claim GET + allocate + spec + checkpoint)", prepare);
        report("DRA unprepare round trip", unprepare);
        daemon.stop().await?;

        // Device change by real kernel uevent → new pool generation at the API server.
        if let Err(e) = std::fs::write(LO_UEVENT, "change") {
            println!("uevent → slice: skipped, cannot trigger a uevent here ({e}; needs root)");
            return Ok(());
        }
        let (_dir, _m, api, _kubelet, _dra, daemon) =
            node("mode=churn devices=3", "uevents = [\"net\"]\n", true).await?;
        let generation =
            || api.slices(NODE, Some(DRIVER)).values().filter_map(|s| s["spec"]["pool"]["generation"].as_i64()).max();
        let mut took = Vec::new();
        for _ in 0..if quick { 5 } else { 40 } {
            // Apart by more than the uevent debounce gap, so each is handled at once.
            tokio::time::sleep(Duration::from_millis(250)).await;
            let before = generation();
            let t = Instant::now();
            std::fs::write(LO_UEVENT, "change")?;
            while generation() == before {
                anyhow::ensure!(t.elapsed() < Duration::from_secs(10), "no new generation after a uevent");
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
            took.push(t.elapsed());
        }
        report("uevent → pool's new generation at the API server", took);
        daemon.stop().await?;
        Ok(())
    })
}
