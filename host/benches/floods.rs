//! Peak memory under the issue-41 floods (a bench binary): `devplug run` (the build this bench is
//! compiled with) serving the chaos backend to the kubelet stand-in, then, one after another,
//! flooded on its plugin socket with empty HTTP/2 CONTINUATION frames (one header block that
//! never ends), and with readers of its status socket and `/status/devices`. After each flood:
//! whether devplug still answers, and its peak RSS (`VmHWM`) above idle. Numbers go in
//! docs/BENCHMARKS.md; the target is idle + the backend's memory cap (64 MiB) + 32 MiB.
//!
//! Issue 49: 2,000 connections each holding a half-sent header block on the plugin socket, with
//! kubelet's Allocate timed idle and during the flood; and `devplug try` fed each claim-file
//! attack (YAML aliases, a nested `all()`, a `cel.bind` chain, an unsatisfiable claim over
//! 2,048 devices): time to the error and `try`'s peak RSS.

use devplug_test_support as support;

use std::path::Path;
use std::time::Duration;

use support::binary::{Devplug, run_args};
use support::daemon::{WIDGET, chaos_dir};
use support::fixtures::Machine;
use support::kubelet::Kubelet;
use tokio::io::AsyncWriteExt;

fn kib(pid: i32, key: &str) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status.lines().find(|l| l.starts_with(key)).ok_or_else(|| anyhow::anyhow!("no {key}"))?;
    Ok(line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or(0))
}

/// One connection writing `frames` empty CONTINUATION frames after an open HEADERS frame;
/// how many were written before devplug ended the connection.
async fn continuation_flood(socket: &Path, frames: usize) -> usize {
    use support::h2wire::{CONTINUATION, HEADERS, PREFACE, SETTINGS, frame};
    let Ok(mut s) = tokio::net::UnixStream::connect(socket).await else { return 0 };
    let mut start = PREFACE.to_vec();
    start.extend(frame(SETTINGS, 0, 0, b""));
    start.extend(frame(HEADERS, 0, 1, b""));
    if s.write_all(&start).await.is_err() {
        return 0;
    }
    let empty = frame(CONTINUATION, 0, 1, b"");
    let chunk: Vec<u8> = empty.iter().copied().cycle().take(empty.len() * 4096).collect();
    let mut sent = 0;
    while sent < frames {
        if s.write_all(&chunk).await.is_err() {
            break;
        }
        sent += 4096;
    }
    sent
}

fn main() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async {
        let dir = tempfile::tempdir()?;
        let kdir = dir.path().join("device-plugins");
        let (m, backends) = (Machine::generic_box(), chaos_dir());
        let kubelet = Kubelet::start(&kdir).await;
        let d = Devplug::spawn(&run_args(&kdir, backends.path(), &m));
        kubelet.wait_devices(WIDGET, Duration::from_secs(60), |l| !l.is_empty()).await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let idle = kib(d.pid(), "VmRSS")?;
        println!("idle RSS {} MiB", idle / 1024);

        let socket = kdir.join("devplug-test.devplug.io_widget.sock");
        let t0 = std::time::Instant::now();
        let sent = continuation_flood(&socket, 120_000_000).await;
        let peak = kib(d.pid(), "VmHWM")?;
        println!(
            "CONTINUATION flood: {sent} frames written before devplug ended the connection ({:?}); peak RSS +{} MiB above idle",
            t0.elapsed(),
            peak.saturating_sub(idle) / 1024
        );
        let alive = kubelet.wait_devices(WIDGET, Duration::from_secs(5), |l| !l.is_empty()).await.is_ok();
        println!("  still serving kubelet: {alive}");

        let status_socket = dir.path().join("plugins/devplug/status.sock");
        let t0 = std::time::Instant::now();
        let readers = (0..64).map(|_| {
            let addr = status_socket.display().to_string();
            tokio::spawn(async move {
                for _ in 0..20 {
                    let _ = devplug::cli::http_get(&addr, "/status/devices?offset=0").await;
                }
            })
        });
        futures::future::join_all(readers).await;
        let mine = devplug::cli::all_devices(&status_socket.display().to_string()).await;
        let peak = kib(d.pid(), "VmHWM")?;
        println!(
            "status flood: 64 readers × 20 pages in {:?}; the operator's `status --devices` {}; peak RSS +{} MiB above idle",
            t0.elapsed(),
            if mine.is_ok() { "completed" } else { "failed" },
            peak.saturating_sub(idle) / 1024
        );
        connection_flood(&kubelet, &socket, d.pid(), idle).await?;
        drop(d);
        claim_file_attacks()?;
        Ok(())
    })
}

/// Allocate of one device `n` times on kubelet's own connection; the latencies.
async fn allocates(kubelet: &Kubelet, n: usize) -> anyhow::Result<Vec<Duration>> {
    use devplug_standins::proto::deviceplugin as pb;
    let plugin = kubelet.plugin(WIDGET).await.ok_or_else(|| anyhow::anyhow!("not registered"))?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let req = pb::AllocateRequest {
            container_requests: vec![pb::ContainerAllocateRequest { devices_ids: vec!["widget-0".into()] }],
        };
        let t0 = std::time::Instant::now();
        plugin.client.clone().allocate(req).await?;
        out.push(t0.elapsed());
    }
    out.sort();
    Ok(out)
}

/// 2,000 connections, each the preface and a HEADERS frame without END_HEADERS, held open.
async fn connection_flood(kubelet: &Kubelet, socket: &Path, pid: i32, idle: u64) -> anyhow::Result<()> {
    use std::io::Write;
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit read and write only the struct here.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        lim.rlim_cur = lim.rlim_max.min(8192);
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
    }
    let quiet = allocates(kubelet, 200).await?;
    let t0 = std::time::Instant::now();
    let mut held = Vec::new();
    for _ in 0..2000 {
        let Ok(mut c) = std::os::unix::net::UnixStream::connect(socket) else { continue };
        let mut bytes = support::h2wire::PREFACE.to_vec();
        bytes.extend(support::h2wire::frame(support::h2wire::SETTINGS, 0, 0, b""));
        bytes.extend(support::h2wire::frame(support::h2wire::HEADERS, 0, 1, &[0x82, 0x86, 0x84, 0x41]));
        let _ = c.write_all(&bytes);
        held.push(c);
    }
    let opened = t0.elapsed();
    let during = allocates(kubelet, 200).await?;
    let peak = kib(pid, "VmHWM")?;
    let p = |v: &[Duration], q: f64| v[((v.len() - 1) as f64 * q) as usize];
    println!(
        "connection flood: {} connections opened in {opened:?}; peak RSS +{} MiB above idle; Allocate p50 {:?} / p99 {:?} during (idle {:?} / {:?})",
        held.len(),
        peak.saturating_sub(idle) / 1024,
        p(&during, 0.5),
        p(&during, 0.99),
        p(&quiet, 0.5),
        p(&quiet, 0.99)
    );
    Ok(())
}

/// `devplug try` over 2,048 chaos devices, fed each attack: how long to the error, and its peak RSS.
fn claim_file_attacks() -> anyhow::Result<()> {
    let m = Machine::generic_box();
    let extra = ["--dra", "test.devplug.io/widget"];
    let (_backends, mut t) = support::binary::try_chaos_with(&m, "--backends-dir", Some("devices=2048"), &extra);
    t.wait_for("DRA driver chaos.devplug.io: 2048 devices published");
    let work = tempfile::tempdir()?;
    // 740 KB of aliases, as the file.
    for (i, (what, text, _)) in support::attacks::claim_files(740_000).iter().enumerate() {
        let path = work.path().join(format!("attack-{i}.yaml"));
        std::fs::write(&path, text)?;
        let t0 = std::time::Instant::now();
        t.send(&format!("claim {}", path.display()));
        let why = t.wait_for("claim failed").pop().unwrap_or_default();
        println!(
            "try, {what} ({} bytes): error in {:?}, try's peak RSS {} MiB: {}",
            text.len(),
            t0.elapsed(),
            kib(t.pid(), "VmHWM")? / 1024,
            &why[..why.len().min(120)]
        );
    }
    Ok(())
}
