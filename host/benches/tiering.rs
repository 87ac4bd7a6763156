//! Tiered loading benchmark (a bench binary): a running `devplug run` serving the 12 MB
//! JavaScript example backend (`guests/examples/js-fusetun`) gets a new version (same code,
//! new digest: a node that has never seen it, cache empty for it), landed in its backends
//! directory. Measured, quiet and with two CPU hogs, in one run:
//!
//! - new file → the new version serving (`backend swapped in`: init and discover on baseline
//!   code, swapped, published);
//! - new file → its optimised code swapped in (the background compile at idle priority);
//! - kubelet's Allocate p50/p99 while that compile runs, against idle;
//! - peak RSS (VmHWM, reset before the swap) above idle, RSS while the baseline code serves, and
//!   RSS once the optimised code serves;
//! - then a third version on the same node, which optimised the one before: served from
//!   optimised code compiled at once from the incremental cache that compile left (time, how
//!   many functions it reused, Allocate before and after, peak RSS).
//!
//! The second version is landed with the backend's incremental cache removed: the tiered path
//! as on a node that never optimised this backend.
//!
//! `cargo bench --bench tiering`; `--python` uses the 18 MB Python example instead. Numbers go
//! in docs/BENCHMARKS.md.

use devplug_test_support as support;

use std::path::Path;
use std::time::{Duration, Instant};

use devplug_standins::proto::deviceplugin as pb;
use support::binary::{Devplug, embedded_run_args};
use support::kubelet::Kubelet;
use support::rollout::{hogs, kib, new_version, reset_peak};

const T: Duration = Duration::from_secs(240);

fn count(d: &Devplug, needle: &str) -> usize {
    d.log().matches(needle).count()
}

async fn wait_count(d: &Devplug, needle: &str, n: usize) -> anyhow::Result<()> {
    let end = Instant::now() + T;
    while count(d, needle) < n {
        anyhow::ensure!(Instant::now() < end, "no {n}× {needle:?} in the log:\n{}", d.log());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn main() -> anyhow::Result<()> {
    let python = std::env::args().any(|a| a == "--python");
    let (file, resource, id) = if python {
        ("py-serial", "devplug.io/serial", "ttyUSB0")
    } else {
        ("js-fusetun", "devplug.io/js-fuse", "fuse-0")
    };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async {
        let root = tempfile::tempdir()?;
        for (rel, desc) in [("dev/ttyUSB0", "c 188:0"), ("dev/fuse", "c 10:229"), ("dev/net/tun", "c 10:200")] {
            let p = root.path().join("machine").join(rel);
            std::fs::create_dir_all(p.parent().expect("parent"))?;
            std::fs::write(p, desc)?;
        }
        for d in ["sys", "proc"] {
            std::fs::create_dir_all(root.path().join("machine").join(d))?;
        }
        let ex = support::examples::built();
        let bytes = std::fs::read(ex.join(format!("{file}.wasm")))?;
        let manifest = std::fs::read_to_string(ex.join(format!("{file}.toml")))?;
        println!("{file}: {:.1} MB", bytes.len() as f64 / 1e6);
        for hogs_n in [0usize, 2] {
            let work = root.path().join(format!("run-{hogs_n}"));
            let (kdir, backends, cache) = (work.join("k"), work.join("backends"), work.join("cache"));
            for d in [&kdir, &backends, &cache] {
                std::fs::create_dir_all(d)?;
            }
            std::fs::write(backends.join(format!("{file}.toml")), &manifest)?;
            std::fs::write(backends.join(format!("{file}.wasm")), new_version(&bytes, 0))?;
            let cfg = work.join("devplug.toml");
            std::fs::write(&cfg, "[limits]\nmemory_mb = 256\ndiscover_timeout = \"30s\"\ncall_timeout = \"5s\"\n")?;
            let kubelet = Kubelet::start(&kdir).await;
            let mut args = embedded_run_args(&kdir, &root.path().join("machine"));
            let s = |p: &Path| p.display().to_string();
            args.extend(
                [
                    "--no-embedded",
                    "--backends-dir",
                    &s(&backends),
                    "--default-grant",
                    "requested",
                    "--cache-dir",
                    &s(&cache),
                    "--config",
                    &s(&cfg),
                ]
                .map(str::to_owned),
            );
            let d = Devplug::spawn(&args);
            let plugin = kubelet.wait_plugin(resource, T).await?;
            // The first version, served and optimised: the idle state a node is in.
            wait_count(&d, "optimised code swapped in", 1).await?;
            tokio::time::sleep(Duration::from_secs(2)).await;
            let idle_rss = kib(d.pid(), "VmRSS:");
            let mut c = plugin.client.clone();
            let req = || pb::AllocateRequest {
                container_requests: vec![pb::ContainerAllocateRequest { devices_ids: vec![id.to_owned()] }],
            };
            let mut idle = Vec::new();
            for _ in 0..300 {
                let t0 = Instant::now();
                c.allocate(req()).await?;
                idle.push(t0.elapsed());
            }
            let _hogs = hogs(hogs_n);
            // Reset the peak (VmHWM) to the current RSS.
            reset_peak(d.pid())?;
            // A version this node never saw, on a node that never optimised this backend
            // either: the incremental cache the first version's compile left is removed.
            for e in std::fs::read_dir(&cache)?.flatten() {
                if e.file_name().to_string_lossy().ends_with(".incr") {
                    std::fs::remove_file(e.path())?;
                }
            }
            let tmp = backends.join(format!(".{file}.wasm.tmp"));
            std::fs::write(&tmp, new_version(&bytes, 1))?;
            let landed = Instant::now();
            std::fs::rename(&tmp, backends.join(format!("{file}.wasm")))?;
            wait_count(&d, "backend swapped in", 1).await?;
            let served = landed.elapsed();
            // What the node holds while the baseline code serves: the compiler's garbage given
            // back (runtime/heap.rs), or not.
            let serving_rss = kib(d.pid(), "VmRSS:");
            // Kubelet's calls while the optimised compile waits or runs; with the hogs busy it
            // runs only on idle cycles, so the window ends after 20 s and the hogs stop.
            let mut during = Vec::new();
            let window = Instant::now();
            while count(&d, "optimised code swapped in") < 2 && window.elapsed() < Duration::from_secs(20) {
                let t0 = Instant::now();
                c.allocate(req()).await?;
                during.push(t0.elapsed());
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let under_load = count(&d, "optimised code swapped in") >= 2;
            drop(_hogs);
            wait_count(&d, "optimised code swapped in", 2).await?;
            let optimised = landed.elapsed();
            let peak = kib(d.pid(), "VmHWM:");
            tokio::time::sleep(Duration::from_secs(12)).await;
            let after = kib(d.pid(), "VmRSS:");
            let (i50, i99) = (pct(&mut idle, 0.5), pct(&mut idle, 0.99));
            let (d50, d99) = if during.is_empty() {
                (Duration::ZERO, Duration::ZERO)
            } else {
                (pct(&mut during, 0.5), pct(&mut during, 0.99))
            };
            println!("--- {file}, {hogs_n} CPU hogs ---");
            println!("new file -> new version serving: {:.2} s", served.as_secs_f64());
            // Where the load's time went, as the log line says it.
            let log = d.log();
            let swapped = log.lines().rfind(|l| l.contains("backend swapped in")).unwrap_or_default();
            let steps: Vec<&str> = swapped
                .split_whitespace()
                .filter(|w| ["compile_ms=", "init_ms=", "discover_ms="].iter().any(|k| w.starts_with(k)))
                .collect();
            println!("  its load: {}", steps.join(" "));
            println!(
                "new file -> optimised code swapped in: {:.2} s ({})",
                optimised.as_secs_f64(),
                if under_load || hogs_n == 0 { "while the load ran" } else { "after the hogs stopped: it ran on idle cycles only" }
            );
            println!(
                "Allocate idle p50 {i50:?} p99 {i99:?}; during the background compile (n={}) p50 {d50:?} p99 {d99:?}; ratio p50 {:.2} p99 {:.2}",
                during.len(),
                d50.as_secs_f64() / i50.as_secs_f64(),
                d99.as_secs_f64() / i99.as_secs_f64()
            );
            println!(
                "RSS idle {} MiB; peak during the swap and compile {} MiB (+{} MiB); while the baseline code serves {} MiB; after the optimised code serves {} MiB",
                idle_rss / 1024,
                peak / 1024,
                peak.saturating_sub(idle_rss) / 1024,
                serving_rss / 1024,
                after / 1024
            );
            // Incremental: a third version on this node, which optimised the one before (its
            // background compile left the backend's incremental cache): compiled optimised at
            // once from those functions.
            let _hogs = hogs(hogs_n);
            let mut before = Vec::new();
            for _ in 0..300 {
                let t0 = Instant::now();
                c.allocate(req()).await?;
                before.push(t0.elapsed());
            }
            let rss = kib(d.pid(), "VmRSS:");
            reset_peak(d.pid())?;
            std::fs::write(&tmp, new_version(&bytes, 2))?;
            let landed = Instant::now();
            std::fs::rename(&tmp, backends.join(format!("{file}.wasm")))?;
            wait_count(&d, "backend swapped in", 2).await?;
            let served = landed.elapsed();
            let mut after = Vec::new();
            for _ in 0..300 {
                let t0 = Instant::now();
                c.allocate(req()).await?;
                after.push(t0.elapsed());
            }
            let peak = kib(d.pid(), "VmHWM:");
            drop(_hogs);
            let log = d.log();
            let swapped = log.lines().rfind(|l| l.contains("backend swapped in")).unwrap_or_default();
            let reused = log.lines().rfind(|l| l.contains("compiled optimised at once")).unwrap_or("(not compiled incrementally)");
            let (b50, b99, a50, a99) = (pct(&mut before, 0.5), pct(&mut before, 0.99), pct(&mut after, 0.5), pct(&mut after, 0.99));
            println!(
                "incremental: new file -> new version serving: {:.2} s ({})",
                served.as_secs_f64(),
                swapped.split_whitespace().filter(|w| w.starts_with("compiler=") || w.starts_with("compile_ms=")).collect::<Vec<_>>().join(" ")
            );
            println!(
                "  {}",
                reused.split_whitespace().filter(|w| ["reused=", "compiled=", "ms="].iter().any(|k| w.starts_with(k))).collect::<Vec<_>>().join(" ")
            );
            println!(
                "  Allocate before p50 {b50:?} p99 {b99:?}; from the first call after p50 {a50:?} p99 {a99:?}; ratio p50 {:.2} p99 {:.2}",
                a50.as_secs_f64() / b50.as_secs_f64(),
                a99.as_secs_f64() / b99.as_secs_f64()
            );
            println!("  RSS before {} MiB; peak {} MiB (+{} MiB)", rss / 1024, peak / 1024, peak.saturating_sub(rss) / 1024);
            drop(d);
        }
        anyhow::Ok(())
    })
}
