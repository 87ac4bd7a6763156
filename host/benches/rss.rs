//! Idle memory benchmark (a bench binary): the release `devplug run` with the four first-party
//! backends on the DGX fixture, registered with the kubelet stand-in and idle, and where its
//! resident memory goes, from `/proc/PID/smaps`. Numbers go in docs/BENCHMARKS.md.

use devplug_test_support as support;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use support::binary::{Devplug, embedded_run_args};
use support::kubelet::Kubelet;

/// Resident KiB of each kind of mapping of process `pid`.
fn breakdown(pid: i32) -> anyhow::Result<BTreeMap<String, u64>> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps"))?;
    let mut out: BTreeMap<String, u64> = BTreeMap::new();
    let mut kind = String::new();
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or("");
        if first.contains('-') && first.chars().next().is_some_and(|c| c.is_ascii_hexdigit()) {
            let perms = words.next().unwrap_or("");
            let path = line.split_whitespace().nth(5).unwrap_or("");
            kind = match path {
                "" if perms.contains('x') => "anonymous executable (compiled wasm code)".into(),
                "" => "anonymous (heap arenas, linear memories, stacks)".into(),
                "[heap]" => "[heap] (main malloc arena)".into(),
                p if p.starts_with('[') => p.to_owned(),
                p if p.ends_with("devplug") && perms.contains('x') => "devplug binary: code".into(),
                p if p.ends_with("devplug") => "devplug binary: data (embedded wasm, tables)".into(),
                p => format!("file {}", Path::new(p).file_name().map(|f| f.to_string_lossy()).unwrap_or_default()),
            };
        } else if first == "Rss:" {
            *out.entry(kind.clone()).or_default() += words.next().and_then(|v| v.parse().ok()).unwrap_or(0);
        }
    }
    Ok(out)
}

fn main() -> anyhow::Result<()> {
    let machine = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/sysfs/dgx-h100");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async {
        let dir = tempfile::tempdir()?;
        let kubelet = Kubelet::start(dir.path()).await;
        let mut d = Devplug::spawn(&embedded_run_args(dir.path(), &machine));
        kubelet.wait_devices("nvidia.com/gpu", Duration::from_secs(60), |l| l.len() == 8).await?;
        // Idle: several health polls (5 s apart) have run since registration.
        tokio::time::sleep(Duration::from_secs(16)).await;
        let status = std::fs::read_to_string(format!("/proc/{}/status", d.pid()))?;
        for l in status.lines().filter(|l| l.starts_with("VmRSS") || l.starts_with("Rss") || l.starts_with("Threads")) {
            println!("{l}");
        }
        let parts = breakdown(d.pid())?;
        let mut parts: Vec<(String, u64)> = parts.into_iter().collect();
        parts.sort_by_key(|(_, kib)| std::cmp::Reverse(*kib));
        for (kind, kib) in parts.iter().filter(|(_, k)| *k >= 64) {
            println!("{:>8} KiB  {kind}", kib);
        }
        d.terminate(Duration::from_secs(10))?;
        anyhow::Ok(())
    })
}
