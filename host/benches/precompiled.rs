//! Compiled once per cluster (a bench binary): a `devplug run` node following a tag on a real
//! registry (Debian's `docker-registry`) with `registry.operator_key`, serving the 12 MB
//! JavaScript example (`--python`: the 18 MB Python one). Each new version is pushed (signed by
//! the vendor) to a staging tag, compiled once by `devplug precompile` (signed by the operator),
//! then the followed tag is moved to it: the node has never seen it. Measured, quiet and with two
//! CPU hogs, in one run:
//!
//! - `devplug precompile`'s compile (the one compile the cluster does);
//! - tag moved → the new version serving from the signed native code (`cache=Signed`), and its
//!   load's steps;
//! - kubelet's Allocate p50/p99 from the first call after the swap, against the version before
//!   (optimised code too);
//! - the node's peak RSS (VmHWM, reset before the move) above idle;
//! - beside it, the tiered path: a version moved to without precompiling (baseline first, then
//!   optimised in the background), as a node without the key or artifact does it.
//!
//! `cargo bench --profile dev --bench precompiled [-- --python]`. Numbers go in
//! docs/BENCHMARKS.md.

use devplug_test_support as support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use devplug_standins::proto::deviceplugin as pb;
use support::binary::{BIN, Devplug, embedded_run_args};
use support::kubelet::Kubelet;
use support::registry::{Registry, openssl_keypair};
use support::rollout::{hogs, kib, new_version, reset_peak};
use support::stats::pct;

const T: Duration = Duration::from_secs(240);

fn count(d: &Devplug, needle: &str) -> usize {
    d.log().matches(needle).count()
}

async fn wait_count(d: &Devplug, needle: &str, n: usize, within: Duration) -> anyhow::Result<bool> {
    let end = Instant::now() + within;
    while count(d, needle) < n {
        if Instant::now() >= end {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(true)
}

/// `devplug ARGS`, its JSON answer.
fn devplug(args: &[&str]) -> anyhow::Result<serde_json::Value> {
    let out = Command::new(BIN).args(args).env("RUST_LOG", "warn").output()?;
    anyhow::ensure!(out.status.success(), "devplug {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// 300 Allocates, sorted.
async fn allocates(
    c: &mut pb::device_plugin_client::DevicePluginClient<tonic::transport::Channel>,
    id: &str,
) -> anyhow::Result<Vec<Duration>> {
    let mut v = Vec::new();
    for _ in 0..300 {
        let req = pb::AllocateRequest {
            container_requests: vec![pb::ContainerAllocateRequest { devices_ids: vec![id.to_owned()] }],
        };
        let t0 = Instant::now();
        c.allocate(req).await?;
        v.push(t0.elapsed());
    }
    v.sort();
    Ok(v)
}

/// The `compile_ms=… init_ms=… discover_ms=… cache=…` of the last `backend swapped in` line.
fn steps(d: &Devplug) -> String {
    let log = d.log();
    let line = log.lines().rfind(|l| l.contains("backend swapped in")).unwrap_or_default();
    line.split_whitespace()
        .filter(|w| ["compile_ms=", "init_ms=", "discover_ms=", "cache="].iter().any(|k| w.starts_with(k)))
        .collect::<Vec<_>>()
        .join(" ")
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
        let reg = Registry::start(false);
        let raw = reg.raw();
        let (vendor_key, vendor_pub) = openssl_keypair(root.path(), "vendor");
        let (op_key, op_pub) = openssl_keypair(root.path(), "operator");
        let (staging, stable) = (reg.reference(file, "staging"), reg.reference(file, "stable"));
        let s = |p: &Path| p.display().to_string();
        // Version `n` pushed to staging (signed by the vendor), compiled once when `precompile`;
        // its manifest digest and the compile's seconds.
        let stage = |n: u8, precompile: bool| -> anyhow::Result<(String, Option<f64>)> {
            let dir = root.path().join(format!("v{n}"));
            std::fs::create_dir_all(&dir)?;
            std::fs::write(dir.join(format!("{file}.wasm")), new_version(&bytes, n))?;
            std::fs::write(dir.join(format!("{file}.toml")), &manifest)?;
            let wasm = s(&dir.join(format!("{file}.wasm")));
            let pushed =
                devplug(&["push", &staging, &wasm, "--plain-http", &reg.addr, "--sign-key", &s(&vendor_key)])?;
            let digest = pushed["digest"].as_str().unwrap_or_default().to_owned();
            if !precompile {
                return Ok((digest, None));
            }
            let (op, vp) = (s(&op_key), s(&vendor_pub));
            let out = devplug(&["precompile", &staging, "--plain-http", &reg.addr, "--key", &op, "--public-key", &vp])?;
            println!("  precompiled v{n}: {:.1} MB of native code", out["native"]["bytes"].as_f64().unwrap_or_default() / 1e6);
            Ok((digest, out["compile_secs"].as_f64()))
        };
        for hogs_n in [0usize, 2] {
            let work = root.path().join(format!("run-{hogs_n}"));
            let (kdir, backends, cache) = (work.join("k"), work.join("backends"), work.join("cache"));
            for d in [&kdir, &backends, &cache] {
                std::fs::create_dir_all(d)?;
            }
            let base = 10 * hogs_n as u8;
            // The version the node starts on, precompiled and promoted.
            let (first, _) = stage(base, true)?;
            let (m, _) = raw.manifest_bytes(&format!("{}/devplug/{file}@{first}", reg.addr)).await;
            raw.put_manifest_bytes(&stable, m).await;
            let cfg = work.join("devplug.toml");
            std::fs::write(
                &cfg,
                format!(
                    "[limits]\nmemory_mb = 256\ndiscover_timeout = \"30s\"\ncall_timeout = \"5s\"\n\
                     [backends.{file}]\nimage = \"{stable}\"\n\
                     [registry]\npoll = \"100ms\"\ntimeout = \"60s\"\nplain_http = [\"{}\"]\n\
                     public_key = \"{}\"\noperator_key = \"{}\"\n",
                    reg.addr,
                    vendor_pub.display(),
                    op_pub.display()
                ),
            )?;
            let kubelet = Kubelet::start(&kdir).await;
            let mut args = embedded_run_args(&kdir, &root.path().join("machine"));
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
            anyhow::ensure!(count(&d, "cache=Signed") == 1, "the first version loaded from signed code:\n{}", d.log());
            tokio::time::sleep(Duration::from_secs(2)).await;
            let idle_rss = kib(d.pid(), "VmRSS:");
            // The signed path: compiled once (before the tag moves), then the tag moved.
            let (next, compile_secs) = stage(base + 1, true)?;
            let (m, _) = raw.manifest_bytes(&format!("{}/devplug/{file}@{next}", reg.addr)).await;
            let mut c = plugin.client.clone();
            // Allocate before and after under the same load: the hogs run for both.
            let _hogs = hogs(hogs_n);
            let idle = allocates(&mut c, id).await?;
            reset_peak(d.pid())?;
            let moved = Instant::now();
            raw.put_manifest_bytes(&stable, m).await;
            anyhow::ensure!(wait_count(&d, "backend swapped in", 1, T).await?, "no swap:\n{}", d.log());
            let served = moved.elapsed();
            let signed_steps = steps(&d);
            let after = allocates(&mut c, id).await?;
            let peak = kib(d.pid(), "VmHWM:");
            drop(_hogs);

            // The tiered path beside it: a version nobody precompiled.
            let (tiered, _) = stage(base + 2, false)?;
            let (m, _) = raw.manifest_bytes(&format!("{}/devplug/{file}@{tiered}", reg.addr)).await;
            let _hogs = hogs(hogs_n);
            let moved = Instant::now();
            raw.put_manifest_bytes(&stable, m).await;
            anyhow::ensure!(wait_count(&d, "backend swapped in", 2, T).await?, "no swap:\n{}", d.log());
            let tiered_served = moved.elapsed();
            let tiered_steps = steps(&d);
            // The optimised code of the tiered path: with the hogs busy it runs only on idle
            // cycles, so the window ends after 20 s and the hogs stop.
            let under_load = wait_count(&d, "optimised code swapped in", 1, Duration::from_secs(20)).await?;
            drop(_hogs);
            anyhow::ensure!(wait_count(&d, "optimised code swapped in", 1, T).await?, "never optimised:\n{}", d.log());
            let tiered_optimised = moved.elapsed();

            println!("--- {file}, {hogs_n} CPU hogs ---");
            println!("devplug precompile (the cluster's one compile): {:.2} s", compile_secs.unwrap_or_default());
            println!("signed: tag moved -> new version serving optimised code: {:.2} s ({signed_steps})", served.as_secs_f64());
            let (i50, i99, a50, a99) = (pct(&idle, 0.5), pct(&idle, 0.99), pct(&after, 0.5), pct(&after, 0.99));
            println!(
                "Allocate before p50 {i50:?} p99 {i99:?}; from the first call after the swap p50 {a50:?} p99 {a99:?}; ratio p50 {:.2} p99 {:.2}",
                a50.as_secs_f64() / i50.as_secs_f64(),
                a99.as_secs_f64() / i99.as_secs_f64()
            );
            println!(
                "RSS idle {} MiB; peak during the signed swap {} MiB (+{} MiB)",
                idle_rss / 1024,
                peak / 1024,
                peak.saturating_sub(idle_rss) / 1024
            );
            println!(
                "tiered (no artifact): tag moved -> serving baseline code {:.2} s ({tiered_steps}); optimised code swapped in {:.2} s ({})",
                tiered_served.as_secs_f64(),
                tiered_optimised.as_secs_f64(),
                if under_load || hogs_n == 0 { "while the load ran" } else { "after the hogs stopped" }
            );
            drop(d);
        }
        anyhow::Ok(())
    })
}
