//! DRA benchmark (a bench binary, for percentiles): the prepare round trip through the kubelet
//! DRA stand-in (v1 over the plugin's Unix socket: claim read from the API-server stand-in,
//! the backend's allocate, the claim's CDI spec and the checkpoint written), next to the
//! device-plugin Allocate round trip of `benches/kubelet.rs`; and a device change announced by
//! a real kernel uevent → the pool's new generation in the API server. Numbers go in
//! docs/BENCHMARKS.md.

use devplug_test_support as support;

use std::time::{Duration, Instant};

use support::daemon::Daemon;
use support::dra_node::{ChaosNode, DRIVER, NODE, chaos_node};
use support::fixtures::Machine;
use support::stats::report;

const LO_UEVENT: &str = "/sys/devices/virtual/net/lo/uevent";

/// A node serving chaos (`chaos_config`, manifest lines `extra`) through DRA, its pool published
/// (the machine is handed back: its tree lives as long as it does).
async fn node(chaos_config: &str, extra: &str, uevents: bool) -> anyhow::Result<(Machine, ChaosNode, Daemon)> {
    let m = Machine::generic_box();
    let mut n = chaos_node(&m, chaos_config, extra).await;
    n.cfg.uevents = uevents;
    if uevents {
        n.cfg.poll_interval = Duration::from_secs(3600);
    }
    let daemon = Daemon::start(n.cfg.clone());
    n.dra.wait_plugin(DRIVER, Duration::from_secs(30)).await;
    let end = Instant::now() + Duration::from_secs(30);
    while n.api.devices(NODE, DRIVER).is_empty() {
        anyhow::ensure!(Instant::now() < end, "no pool published");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok((m, n, daemon))
}

fn main() -> anyhow::Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async {
        let (_m, n, daemon) = node("devices=8", "", false).await?;
        let (api, dra) = (n.api.clone(), n.dra.clone());
        let n = if quick { 200 } else { 2_000 };
        let (mut prepare, mut unprepare) = (Vec::with_capacity(n), Vec::with_capacity(n));
        // Flushes (fsync, fdatasync) the daemon made, counted by devplug's durable layer (the
        // daemon runs in this process).
        let (mut prepare_fsyncs, mut unprepare_fsyncs) = (0u64, 0u64);
        for i in 0..n + 50 {
            let (name, uid) = (format!("c{i}"), format!("uid-{i}"));
            let device = format!("widget-{}", i % 8);
            api.allocate_claim("bench", &name, &uid, &[("dev", DRIVER, NODE, &device)]);
            let claim = [("bench", uid.as_str(), name.as_str())];
            let f0 = devplug::durable::fsyncs();
            let t = Instant::now();
            let answer = dra.prepare(DRIVER, &claim).await?;
            let took = t.elapsed();
            let f1 = devplug::durable::fsyncs();
            anyhow::ensure!(answer[&uid].error.is_empty(), "{:?}", answer[&uid]);
            let t = Instant::now();
            dra.unprepare(DRIVER, &claim).await?;
            // The first 50 warm up (connections, caches).
            if i >= 50 {
                prepare.push(took);
                unprepare.push(t.elapsed());
                prepare_fsyncs += f1 - f0;
                unprepare_fsyncs += devplug::durable::fsyncs() - f1;
            }
        }
        report("DRA prepare round trip (1 device, v1 over UDS, claim GET + allocate + spec + checkpoint)", prepare);
        report("DRA unprepare round trip", unprepare);
        println!(
            "flushes per prepare {:.2}, per unprepare {:.2} (fsync + fdatasync, {n} calls)",
            prepare_fsyncs as f64 / n as f64,
            unprepare_fsyncs as f64 / n as f64
        );
        // Eight claims in one call (kubelet batches a pod's claims): one flush for all.
        let mut batch = Vec::new();
        let mut batch_fsyncs = 0;
        for round in 0..if quick { 20 } else { 200 } {
            let claims: Vec<(String, String)> =
                (0..8).map(|k| (format!("b{round}-{k}"), format!("uid-b{round}-{k}"))).collect();
            for (k, (name, uid)) in claims.iter().enumerate() {
                api.allocate_claim("bench", name, uid, &[("dev", DRIVER, NODE, &format!("widget-{k}"))]);
            }
            let refs: Vec<(&str, &str, &str)> = claims.iter().map(|(n, u)| ("bench", u.as_str(), n.as_str())).collect();
            let f0 = devplug::durable::fsyncs();
            let t = Instant::now();
            let answer = dra.prepare(DRIVER, &refs).await?;
            batch.push(t.elapsed());
            batch_fsyncs += devplug::durable::fsyncs() - f0;
            anyhow::ensure!(answer.values().all(|a| a.error.is_empty()), "{answer:?}");
            dra.unprepare(DRIVER, &refs).await?;
        }
        let rounds = batch.len() as f64;
        report("DRA prepare of 8 claims in one call", batch);
        println!("flushes per 8-claim prepare call {:.2}", batch_fsyncs as f64 / rounds);
        daemon.stop().await?;

        // Device change by real kernel uevent → new pool generation at the API server.
        if let Err(e) = std::fs::write(LO_UEVENT, "change") {
            println!("uevent → slice: skipped, cannot trigger a uevent here ({e}; needs root)");
            return Ok(());
        }
        let (_m, n, daemon) = node("mode=churn devices=3", "uevents = [\"net\"]\n", true).await?;
        let api = n.api.clone();
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
