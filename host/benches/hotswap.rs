//! Hot-swap benchmark (a bench binary: it reports percentiles): the time from a new backend
//! file landing in the backends directory (written to a temp name, renamed in) to kubelet's
//! ListAndWatch stream showing the new version's device list, through the whole host: the
//! directory watch and its settling window, compile (or compile-cache hit), instantiate, `init`,
//! `discover`, swap, publish. Numbers go in docs/BENCHMARKS.md.

use devplug_test_support as support;

use std::path::Path;
use std::time::{Duration, Instant};

use support::daemon::{Daemon, WIDGET, chaos_build, chaos_dir, chaos_manifest, config};
use support::fixtures::Machine;
use support::kubelet::Kubelet;
use support::stats::report;

fn land(dir: &Path, wasm: &[u8], toml: &str) -> anyhow::Result<()> {
    for (name, bytes) in [("chaos.toml", toml.as_bytes()), ("chaos.wasm", wasm)] {
        std::fs::write(dir.join(format!(".{name}.tmp")), bytes)?;
    }
    for name in ["chaos.toml", "chaos.wasm"] {
        std::fs::rename(dir.join(format!(".{name}.tmp")), dir.join(name))?;
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    let rounds: u32 = if quick { 2 } else { 10 };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async {
        let dir = tempfile::tempdir()?;
        let cache = tempfile::tempdir()?;
        let (m, backends) = (Machine::generic_box(), chaos_dir());
        land(backends.path(), &chaos_build(0), &chaos_manifest(0, "ok"))?;
        let kubelet = Kubelet::start(dir.path()).await;
        let mut cfg = config(dir.path(), &m, backends.path(), "");
        cfg.cache_dir = Some(cache.path().to_owned());
        let daemon = Daemon::start(cfg);
        kubelet.wait_devices(WIDGET, Duration::from_secs(30), |l| l.len() == 4).await?;
        let t = Duration::from_secs(30);

        // Cold: every version is a new file, so every swap compiles.
        let mut cold = Vec::new();
        for k in 1..=rounds {
            let t0 = Instant::now();
            land(backends.path(), &chaos_build(k), &chaos_manifest(k, "ok"))?;
            kubelet.wait_devices(WIDGET, t, |l| l.len() == 4 + k as usize).await?;
            cold.push(t0.elapsed());
        }
        // From cache: alternate between two versions compiled before (a roll back and forth).
        let mut warm = Vec::new();
        for i in 0..rounds * 2 {
            let k = if i % 2 == 0 { 1 } else { 2 };
            let t0 = Instant::now();
            land(backends.path(), &chaos_build(k), &chaos_manifest(k, "ok"))?;
            kubelet.wait_devices(WIDGET, t, |l| l.len() == 4 + k as usize).await?;
            warm.push(t0.elapsed());
        }
        report("landing → new list on the stream, cold compile", cold);
        report("landing → new list on the stream, compile cache hit", warm);
        daemon.stop().await?;
        anyhow::Ok(())
    })
}
