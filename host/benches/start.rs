//! Start-up benchmark (a bench binary: it reports percentiles): process start of the release
//! `devplug run` → every resource with devices registered with the kubelet stand-in and its full
//! device list on the ListAndWatch stream, on the DGX fixture, with no cache dir. The embedded
//! backends come precompiled; for comparison the same components loaded from a backends dir are
//! compiled at every start without a cache, and loaded from a warm one with it. Numbers go in
//! docs/BENCHMARKS.md.

use devplug_test_support as support;

use std::path::Path;
use std::time::{Duration, Instant};

use support::binary::{Devplug, embedded_run_args};
use support::kubelet::Kubelet;
use support::stats::pct;

/// Resources the DGX fixture has devices for, with their counts (tests/fixtures/golden).
const EXPECTED: &[(&str, usize)] = &[("nvidia.com/gpu", 8), ("devplug.io/kvm", 16), ("devplug.io/fuse", 16)];

/// One start: spawn `devplug run` with `extra` flags, wait until kubelet has every resource's list.
async fn start_once(machine: &Path, extra: &[String]) -> anyhow::Result<Duration> {
    let dir = tempfile::tempdir()?;
    let kubelet = Kubelet::start(dir.path()).await;
    let mut args = embedded_run_args(dir.path(), machine);
    args.extend(extra.iter().cloned());
    let t = Instant::now();
    let mut d = Devplug::spawn(&args);
    for (resource, n) in EXPECTED {
        kubelet
            .wait_devices(resource, Duration::from_secs(120), |l| l.len() == *n)
            .await
            .map_err(|e| anyhow::anyhow!("{e}\n{}", d.log()))?;
    }
    let took = t.elapsed();
    d.terminate(Duration::from_secs(10))?;
    Ok(took)
}

fn main() -> anyhow::Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    let machine = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/sysfs/dgx-h100");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    // The embedded components as files, for the compiled-at-start comparison.
    let files = tempfile::tempdir()?;
    for (name, bytes, manifest) in devplug::backends::embedded::FIRST_PARTY {
        std::fs::write(files.path().join(format!("{name}.wasm")), bytes)?;
        std::fs::write(files.path().join(format!("{name}.toml")), manifest)?;
    }
    let cache = tempfile::tempdir()?;
    let dir_args = |cache: Option<&Path>| {
        let mut a = vec!["--no-embedded".to_owned(), "--backends".into(), files.path().display().to_string()];
        a.extend(["--default-grant".into(), "requested".into()]);
        if let Some(c) = cache {
            a.extend(["--cache-dir".into(), c.display().to_string()]);
        }
        a
    };
    let runs = if quick { 3 } else { 15 };
    rt.block_on(async {
        for (name, extra, n) in [
            ("embedded, precompiled, no cache dir", Vec::new(), runs),
            ("same components from a dir, no cache (compiled at start)", dir_args(None), runs.min(3)),
            ("same components from a dir, warm cache", dir_args(Some(cache.path())), runs),
        ] {
            if extra.iter().any(|a| a == "--cache-dir") {
                start_once(&machine, &extra).await?; // fill the cache
            }
            let mut v = Vec::new();
            for _ in 0..n {
                v.push(start_once(&machine, &extra).await?);
            }
            v.sort();
            println!(
                "start -> {} resources registered with full lists, {name}: n={} min={:?} p50={:?} max={:?}",
                EXPECTED.len(),
                v.len(),
                v[0],
                pct(&v, 0.5),
                v[v.len() - 1]
            );
        }
        anyhow::Ok(())
    })
}
