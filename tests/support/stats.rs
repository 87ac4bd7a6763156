//! Percentiles for the bench binaries (they report p50/p90/p99, which criterion does not).

use std::time::Duration;

/// The `p` quantile (0..=1) of `sorted`.
pub fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// Print `name: n=… min=… p50=… p90=… p99=… max=…` of `v`.
pub fn report(name: &str, mut v: Vec<Duration>) {
    v.sort();
    println!(
        "{name}: n={} min={:?} p50={:?} p90={:?} p99={:?} max={:?}",
        v.len(),
        v[0],
        pct(&v, 0.5),
        pct(&v, 0.9),
        pct(&v, 0.99),
        v[v.len() - 1]
    );
}

/// `key` (`VmRSS`, `VmHWM`) of process `pid`, in MiB.
pub fn memory_mib(pid: i32, key: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc/PID/status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status"));
    kib >> 10
}
