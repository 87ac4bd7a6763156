//! Rolling-update handover benchmark (a bench binary: it reports percentiles): a devplug serves
//! the DGX fixture to the kubelet stand-in; a second one starts beside it with an empty cache
//! dir of its own (as a new pod's emptyDir is) and stands by; the first gets SIGTERM. Measured:
//! the first's exit → every resource registered again by the second with its full device list
//! (what kubelet holds unhealthy meanwhile). The backends come from a directory, so the standby
//! has to compile them (the embedded ones are precompiled into the binary); it does so before
//! it stands by. Numbers go in docs/BENCHMARKS.md ("Rolling-update handover").

use devplug_test_support as support;

use std::path::Path;
use std::time::{Duration, Instant};

use support::binary::{Devplug, embedded_run_args};
use support::kubelet::Kubelet;
use support::stats::pct;

/// Resources the DGX fixture has devices for, with their counts (tests/fixtures/golden).
const EXPECTED: &[(&str, usize)] = &[("nvidia.com/gpu", 8), ("devplug.io/kvm", 16), ("devplug.io/fuse", 16)];
const T: Duration = Duration::from_secs(120);

async fn handover_once(machine: &Path, files: &Path) -> anyhow::Result<Duration> {
    let dir = tempfile::tempdir()?;
    let kubelet = Kubelet::start(&dir.path().join("device-plugins")).await;
    let args = |cache: &Path| {
        let mut a = embedded_run_args(&dir.path().join("device-plugins"), machine);
        a.extend(["--no-embedded".into(), "--backends".into(), files.display().to_string()]);
        a.extend(["--default-grant".into(), "requested".into(), "--cache-dir".into(), cache.display().to_string()]);
        a
    };
    let mut old = Devplug::spawn(&args(&dir.path().join("old-cache")));
    for (resource, n) in EXPECTED {
        kubelet
            .wait_devices(resource, T, |l| l.len() == *n)
            .await
            .map_err(|e| anyhow::anyhow!("{e}\n{}", old.log()))?;
    }
    let before = kubelet.registrations();
    let new = Devplug::spawn(&args(&dir.path().join("new-cache")));
    new.wait_log("standing by until it exits", T)?;
    old.terminate(T)?;
    let exited = Instant::now();
    let want = before + EXPECTED.len() as u64;
    kubelet.wait_for(T, "the standby's registrations", |k| k.registrations() >= want).await?;
    for (resource, n) in EXPECTED {
        kubelet
            .wait_devices(resource, T, |l| l.len() == *n)
            .await
            .map_err(|e| anyhow::anyhow!("{e}\n{}", new.log()))?;
    }
    Ok(exited.elapsed())
}

fn main() -> anyhow::Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    let machine = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/sysfs/dgx-h100");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let files = tempfile::tempdir()?;
    for (name, bytes, manifest) in devplug::backends::embedded::FIRST_PARTY {
        std::fs::write(files.path().join(format!("{name}.wasm")), bytes)?;
        std::fs::write(files.path().join(format!("{name}.toml")), manifest)?;
    }
    let runs = if quick { 3 } else { 10 };
    rt.block_on(async {
        let mut v = Vec::new();
        for _ in 0..runs {
            v.push(handover_once(&machine, files.path()).await?);
        }
        v.sort();
        println!(
            "old devplug's exit -> standby serving {} resources with full lists (backends from a dir, empty cache): n={} min={:?} p50={:?} max={:?}",
            EXPECTED.len(),
            v.len(),
            v[0],
            pct(&v, 0.5),
            v[v.len() - 1]
        );
        anyhow::Ok(())
    })
}
