//! Registry benchmark (a bench binary: it reports percentiles), against a real registry (Debian's
//! `docker-registry` on 127.0.0.1, started here):
//!
//! - tag moved → the new version's list on kubelet's ListAndWatch stream, with `registry.poll =
//!   100ms` so the number is mostly the pipeline (resolve, signature, pull, compile or cache hit,
//!   init, discover, swap), cache miss (a new component every time) and hit (a tag moved back
//!   and forth between two versions pulled and compiled before);
//! - cold start from the node's cache with the registry down: process start → resource
//!   registered with its full list;
//! - `devplug pull` of the 18 MB Python example backend (resolve, download, digest checks).
//!
//! `--quick` runs fewer rounds. Numbers go in docs/BENCHMARKS.md.

use devplug_test_support as support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use support::binary::{BIN, Devplug, run_args};
use support::daemon::WIDGET;
use support::fixtures::Machine;
use support::kubelet::Kubelet;
use support::registry::{Registry, openssl_keypair, push_chaos};
use support::stats::report;

fn main() -> anyhow::Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    let rounds: u32 = if quick { 3 } else { 15 };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async {
        let mut reg = Registry::start(false);
        let work = tempfile::tempdir()?;
        let (key, pubkey) = openssl_keypair(work.path(), "ops");
        let stable = reg.reference("chaos", "stable");
        push_chaos(&reg, &stable, work.path(), 0, &key)?;
        let backends = work.path().join("empty");
        std::fs::create_dir_all(&backends)?;
        let cfg = work.path().join("devplug.toml");
        std::fs::write(
            &cfg,
            format!(
                "[backends.chaos]\nimage = \"{stable}\"\n[registry]\npoll = \"100ms\"\nplain_http = [\"{}\"]\npublic_key = \"{}\"\n",
                reg.addr,
                pubkey.display()
            ),
        )?;
        let m = Machine::generic_box();
        let kdir = work.path().join("k");
        let kubelet = Kubelet::start(&kdir).await;
        let mut args = run_args(&kdir, &backends, &m);
        let s = |p: &Path| p.display().to_string();
        args.extend(["--config".into(), s(&cfg), "--cache-dir".into(), s(&work.path().join("cache"))]);
        let mut d = Devplug::spawn(&args);
        let t = Duration::from_secs(60);
        kubelet.wait_devices(WIDGET, t, |l| l.len() == 4).await?;

        // Cache miss: a new component each time.
        let mut miss = Vec::new();
        let mut digests = Vec::new();
        for k in 1..=rounds {
            let digest = push_chaos(&reg, &stable, work.path(), k, &key)?;
            let t0 = Instant::now();
            kubelet.wait_devices(WIDGET, t, |l| l.len() == 4 + k as usize).await?;
            miss.push(t0.elapsed());
            digests.push(digest);
        }
        // Cache hit: the tag moves between the last two versions (skopeo copies the manifests
        // byte for byte, so the digests are the ones pulled and compiled before).
        let mut hit = Vec::new();
        let (a, b) = (rounds - 1, rounds);
        let mut last = b;
        for i in 0..rounds {
            let k = if i % 2 == 0 { a } else { b };
            last = k;
            let digest = &digests[k as usize - 1];
            let st = Command::new("skopeo")
                .args(["copy", "--src-tls-verify=false", "--dest-tls-verify=false"])
                .arg(format!("docker://{}/devplug/chaos@{digest}", reg.addr))
                .arg(format!("docker://{stable}"))
                .output()?;
            anyhow::ensure!(st.status.success(), "skopeo: {}", String::from_utf8_lossy(&st.stderr));
            let t0 = Instant::now();
            kubelet.wait_devices(WIDGET, t, |l| l.len() == 4 + k as usize).await?;
            hit.push(t0.elapsed());
        }
        report("tag moved -> new list on the stream, cache miss (poll 100ms)", miss);
        report("tag moved -> new list on the stream, cache hit (poll 100ms)", hit);

        // Cold start from cache with the registry down.
        d.terminate(t)?;
        reg.stop();
        let mut cold = Vec::new();
        for _ in 0..rounds.min(5) {
            let before = kubelet.registrations();
            let t0 = Instant::now();
            let mut d = Devplug::spawn(&args);
            kubelet.wait_for(t, "re-registration", |k| k.registrations() > before).await?;
            kubelet.wait_devices(WIDGET, t, |l| l.len() == 4 + last as usize).await?;
            cold.push(t0.elapsed());
            d.terminate(t)?;
        }
        report("start with the registry down -> registered from cache", cold);

        // Pull of the Python example (18 MB).
        reg.restart();
        let ex = work.path().join("examples");
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("repo");
        let tools = std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/devplug-tools/bin")).expect("HOME");
        let path = format!("{}:{}", tools.display(), std::env::var("PATH").unwrap_or_default());
        let st = Command::new(repo.join("guests/examples/build.sh")).arg(&ex).env("PATH", path).output()?;
        anyhow::ensure!(st.status.success(), "build.sh: {}", String::from_utf8_lossy(&st.stderr));
        let py = reg.reference("py-serial", "1");
        let wasm = ex.join("py-serial.wasm");
        let size = std::fs::metadata(&wasm)?.len();
        let out = Command::new(BIN)
            .args(["push", &py])
            .arg(&wasm)
            .args(["--manifest"])
            .arg(repo.join("guests/examples/python-serial/devplug.toml"))
            .args(["--plain-http", &reg.addr])
            .output()?;
        anyhow::ensure!(out.status.success(), "push py: {}", String::from_utf8_lossy(&out.stderr));
        let mut pulls = Vec::new();
        for i in 0..rounds.min(5) {
            let dir = work.path().join(format!("pulled-{i}"));
            let t0 = Instant::now();
            let out = Command::new(BIN)
                .args(["pull", &py, "--name", "py-serial", "--plain-http", &reg.addr, "--out"])
                .arg(&dir)
                .output()?;
            pulls.push(t0.elapsed());
            anyhow::ensure!(out.status.success(), "pull py: {}", String::from_utf8_lossy(&out.stderr));
        }
        report(&format!("devplug pull of the Python example ({:.1} MB)", size as f64 / 1e6), pulls);
        Ok(())
    })
}
