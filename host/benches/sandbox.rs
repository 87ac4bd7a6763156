//! Sandbox figures for docs/security.md and docs/BENCHMARKS.md (a plain bench binary, not
//! criterion: these are worst cases, not averages): how far past its deadline a guest call that
//! spins or sleeps in WASI ends, and the host's peak RSS above idle while a backend floods it
//! with refused paths, log lines, a huge error, too many devices, and host work (listing a
//! 25,000-entry directory 256 times, reading 4,096 × 64 KiB) charged to its calls.
//!
//! `cargo bench -p devplug --bench sandbox`

use std::sync::Arc;
use std::time::{Duration, Instant};

use devplug::runtime::caps::{Capabilities, Globs};
use devplug::runtime::state::{Roots, Sandbox};
use devplug::runtime::{BackendInstance, Runtime, RuntimeConfig};

fn chaos() -> Vec<u8> {
    let (wasm, _) = devplug::backends::embedded::test_program("chaos").expect("chaos");
    std::fs::read(wasm).expect("read chaos")
}

fn sandbox(root: &std::path::Path) -> Sandbox {
    let g = Globs {
        dev: vec!["null".into()],
        sysfs: vec!["**".into()],
        resources: vec!["test.devplug.io/*".into()],
        env: vec!["CHAOS_*".into()],
        ..Globs::default()
    };
    let caps = Capabilities::new(&g, &g).expect("caps");
    Sandbox::new("chaos", &caps, &Roots::fixture(root), 64 << 20)
}

/// Peak resident set of this process so far, in KiB.
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// How far past a short discover deadline the host-work floods end: the host's loops check the
/// deadline between entries.
fn flood_overruns(bytes: &[u8], root: &std::path::Path) {
    let deadline = Duration::from_millis(100);
    let rt = Runtime::new(RuntimeConfig {
        discover_deadline: deadline,
        breaker_threshold: u32::MAX,
        ..RuntimeConfig::default()
    })
    .expect("runtime");
    for mode in ["mode=list-flood", "mode=read-flood"] {
        let mut overruns: Vec<Duration> = (0..10)
            .map(|_| {
                // `init` runs under the same deadline: load with a generous one, then call.
                let inst = BackendInstance::load(&rt, bytes, mode.into(), sandbox(root)).expect("load");
                let t0 = Instant::now();
                let _ = inst.discover();
                t0.elapsed().saturating_sub(deadline)
            })
            .collect();
        overruns.sort();
        println!(
            "{mode} vs a {deadline:?} discover deadline: overrun p50 {:?}, max {:?} (10 calls)",
            overruns[5], overruns[9]
        );
    }
}

fn main() {
    // Only run under `cargo bench` (cargo test passes no --bench flag to harness=false benches).
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let bytes = chaos();
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("dev")).expect("dev");
    std::fs::create_dir_all(dir.path().join("sys")).expect("sys");
    std::fs::write(dir.path().join("dev/null"), "c 1:3").expect("null");
    let big = dir.path().join("sys/devices/big");
    std::fs::create_dir_all(&big).expect("big");
    for i in 0..25_000 {
        std::fs::File::create(big.join(format!("entry-{i:05}"))).expect("entry");
    }
    std::fs::write(dir.path().join("sys/devices/blob"), vec![b'x'; 64 << 10]).expect("blob");
    let deadline = Duration::from_millis(250);
    // The breaker would refuse calls after three timeouts: keep it out of the measurement.
    let rt: Arc<Runtime> = Runtime::new(RuntimeConfig {
        call_deadline: deadline,
        discover_deadline: Duration::from_secs(2),
        breaker_threshold: u32::MAX,
        ..RuntimeConfig::default()
    })
    .expect("runtime");
    let load = |config: &str| {
        BackendInstance::load(&rt, &bytes, config.into(), sandbox(dir.path()).describing(true)).expect("load")
    };

    let inst = load("devices=2");
    for id in ["spin-0", "sleep-0"] {
        let mut overruns: Vec<Duration> = (0..20)
            .map(|_| {
                let t0 = Instant::now();
                let _ = inst.allocate("test.devplug.io/widget", &[id.into()]);
                t0.elapsed().saturating_sub(deadline)
            })
            .collect();
        overruns.sort();
        println!(
            "allocate {id} vs a {deadline:?} deadline: overrun p50 {:?}, max {:?} (20 calls)",
            overruns[10], overruns[19]
        );
    }

    flood_overruns(&bytes, dir.path());
    let idle = peak_rss_kib();
    println!("host peak RSS before the floods: {} MiB", idle / 1024);
    for mode in [
        "mode=path-flood",
        "mode=big-path-flood",
        "mode=list-flood",
        "mode=read-flood",
        "mode=log-flood",
        "mode=huge-error",
        "mode=glob-bomb",
        "devices=200000",
        // Issue 33: a description of 8,192 devices × 30 legal 64-byte attributes (~18 MiB), and
        // a 16 MiB version string.
        "devices=8192 describe=bomb",
        "version=16MiB",
    ] {
        let config =
            if mode == "version=16MiB" { format!("version={}", "v".repeat(16 << 20)) } else { mode.to_owned() };
        let t0 = Instant::now();
        let inst = load(&config);
        let version_len = inst.info().version.len();
        let outcome = inst
            .discover()
            .map(|r| (r.len(), r.iter().map(|r| r.described.len()).sum::<usize>(), version_len))
            .map_err(|e| e.to_string().chars().take(80).collect::<String>());
        println!(
            "{mode}: (resources, described, version bytes) {:?} in {:?}; peak RSS now {} MiB above idle",
            outcome,
            t0.elapsed(),
            peak_rss_kib().saturating_sub(idle) / 1024
        );
    }
}
