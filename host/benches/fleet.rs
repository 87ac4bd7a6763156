//! Fleet rollout benchmark (a bench binary): N `devplug run` nodes (default 20, `--nodes N`)
//! following one signed tag on a real registry (Debian's `docker-registry`, its access log
//! counted), each serving the backend's resource through DRA to one API server (the stand-in,
//! whose request log is counted), each with a compile cache of its own (every node of a fleet
//! has never seen a new version). Reported:
//!
//! - steady state: registry requests per node per poll, API writes per node, over a window in
//!   which nothing changes;
//! - rollout: time from the push to every node's pool showing the new version (per node and
//!   all), registry requests and API writes per node for the move.
//!
//! - compiles: how many nodes compiled the new version, how many loaded native code signed by
//!   the operator, and the CPU the fleet's compile workers spent on the move (each node's
//!   reaped children, from `/proc/PID/stat`).
//!
//! With `--precompiled`, the nodes hold `registry.operator_key` and each version is compiled
//! once by `devplug precompile` before the followed tag moves to it (`--promote`): the fleet
//! spends that one compile instead of one per node.
//!
//! `cargo bench --bench fleet -- --nodes 20 [--precompiled]`. Numbers go in docs/BENCHMARKS.md
//! with the arithmetic for 1,000 nodes.

use devplug_test_support as support;

use std::path::Path;
use std::time::{Duration, Instant};

use devplug_standins::apiserver::ApiServer;
use support::binary::{Devplug, run_args};
use support::fixtures::Machine;
use support::registry::{Registry, openssl_keypair, push_chaos};

const DRIVER: &str = "chaos.devplug.io";
/// How often each node resolves the tag.
const POLL: Duration = Duration::from_secs(1);
/// The window of the steady-state counts.
const STEADY: Duration = Duration::from_secs(10);

/// API requests that write (create, replace, delete) ResourceSlices, so far.
fn slice_writes(api: &ApiServer) -> usize {
    api.log().iter().filter(|l| l.starts_with("POST ") || l.starts_with("PUT ") || l.starts_with("DELETE")).count()
}

/// CPU seconds `pid`'s reaped children used (its compile workers): `cutime + cstime`.
fn children_cpu(pid: i32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // After the command's `(…)`, fields 3 on: cutime and cstime are fields 16 and 17.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let f: Vec<f64> = rest.split_whitespace().map(|v| v.parse().unwrap_or(0.0)).collect();
    // SAFETY: sysconf with a valid name.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (f.get(13).copied().unwrap_or(0.0) + f.get(14).copied().unwrap_or(0.0)) / hz.max(1.0)
}

/// `devplug precompile REFERENCE --promote TAG` on `reg` with the operator's key.
fn precompile(reg: &Registry, reference: &str, promote: &str, key: &Path, vendor: &Path) -> anyhow::Result<f64> {
    let out = std::process::Command::new(support::binary::BIN)
        .args(["precompile", reference, "--plain-http", &reg.addr, "--promote", promote, "--key"])
        .arg(key)
        .arg("--public-key")
        .arg(vendor)
        .output()?;
    anyhow::ensure!(out.status.success(), "precompile: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    Ok(v["compile_secs"].as_f64().unwrap_or_default())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let precompiled = args.iter().any(|a| a == "--precompiled");
    let nodes: usize = args
        .iter()
        .position(|a| a == "--nodes")
        .and_then(|i| args.get(i + 1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(20);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async {
        let reg = Registry::start_logged();
        let work = tempfile::tempdir()?;
        let (key, pubkey) = openssl_keypair(work.path(), "ops");
        let (op_key, op_pub) = openssl_keypair(work.path(), "operator");
        let (stable, staging) = (reg.reference("chaos", "stable"), reg.reference("chaos", "staging"));
        if precompiled {
            push_chaos(&reg, &staging, work.path(), 0, &key)?;
            precompile(&reg, &staging, "stable", &op_key, &pubkey)?;
        } else {
            push_chaos(&reg, &stable, work.path(), 0, &key)?;
        }
        let operator = if precompiled { format!("operator_key = \"{}\"\n", op_pub.display()) } else { String::new() };
        let names: Vec<String> = (0..nodes).map(|i| format!("node-{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let api = ApiServer::start(&refs).await;
        let kubeconfig = work.path().join("kubeconfig");
        api.write_kubeconfig(&kubeconfig);
        let m = Machine::generic_box();
        let empty = work.path().join("empty");
        std::fs::create_dir_all(&empty)?;
        let s = |p: &Path| p.display().to_string();
        let mut fleet: Vec<Devplug> = Vec::new();
        for name in &names {
            let dir = work.path().join(name);
            let kdir = dir.join("device-plugins");
            std::fs::create_dir_all(&kdir)?;
            let cfg = dir.join("devplug.toml");
            std::fs::write(
                &cfg,
                format!(
                    "[backends.chaos]\nimage = \"{stable}\"\n[registry]\npoll = \"{}s\"\nplain_http = [\"{}\"]\npublic_key = \"{}\"\n{operator}\
                     [resources.\"test.devplug.io/widget\"]\napi = \"dra\"\n[dra]\nkubeconfig = \"{}\"\nnode_name = \"{name}\"\n",
                    POLL.as_secs(),
                    reg.addr,
                    pubkey.display(),
                    kubeconfig.display()
                ),
            )?;
            let mut args = run_args(&kdir, &empty, &m);
            args.extend(["--config".into(), s(&cfg), "--cache-dir".into(), s(&dir.join("cache"))]);
            fleet.push(Devplug::spawn(&args));
        }
        let serving = |devices: usize| {
            names.iter().filter(|n| api.devices(n, DRIVER).len() == devices).count()
        };
        let t0 = Instant::now();
        while serving(4) < nodes {
            anyhow::ensure!(t0.elapsed() < Duration::from_secs(300), "only {} of {nodes} nodes published v0", serving(4));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        println!("{nodes} nodes started and published v0 in {:.1} s", t0.elapsed().as_secs_f64());

        // Steady state: nothing moves for a while.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (r0, w0) = (reg.requests().len(), slice_writes(&api));
        tokio::time::sleep(STEADY).await;
        let steady: Vec<String> = reg.requests()[r0..].to_vec();
        let polls = (STEADY.as_secs_f64() / POLL.as_secs_f64()) * nodes as f64;
        let mut kinds = std::collections::BTreeMap::<String, usize>::new();
        for r in &steady {
            let kind = r.split('/').take(2).collect::<Vec<_>>().join("/") + if r.contains("/manifests/") { " …/manifests/…" } else { " …" };
            *kinds.entry(kind).or_default() += 1;
        }
        println!(
            "steady {} s: {} registry requests = {:.2} per node per poll ({kinds:?}); {} slice writes",
            STEADY.as_secs(),
            steady.len(),
            steady.len() as f64 / polls,
            slice_writes(&api) - w0
        );

        // Rollout: the tag moves to v1 (5 devices).
        let (r1, w1) = (reg.requests().len(), slice_writes(&api));
        let cpu0: Vec<f64> = fleet.iter().map(|d| children_cpu(d.pid())).collect();
        let (pushed, cluster_compile) = if precompiled {
            // The vendor's push goes to staging; the operator's job compiles it once, then moves
            // the tag the fleet follows.
            push_chaos(&reg, &staging, work.path(), 1, &key)?;
            let pushed = Instant::now();
            (pushed, Some(precompile(&reg, &staging, "stable", &op_key, &pubkey)?))
        } else {
            push_chaos(&reg, &stable, work.path(), 1, &key)?;
            (Instant::now(), None)
        };
        let mut done: Vec<Option<Duration>> = vec![None; nodes];
        while done.iter().any(Option::is_none) {
            anyhow::ensure!(
                pushed.elapsed() < Duration::from_secs(600),
                "rollout stuck: {} of {nodes} serve v1",
                done.iter().filter(|d| d.is_some()).count()
            );
            for (i, n) in names.iter().enumerate() {
                if done[i].is_none() && api.devices(n, DRIVER).len() == 5 {
                    done[i] = Some(pushed.elapsed());
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let all = pushed.elapsed();
        // Let every node's last poll of the move finish before counting.
        tokio::time::sleep(POLL * 2).await;
        let moved = reg.requests().len() - r1;
        let writes = slice_writes(&api) - w1;
        let times: Vec<Duration> = done.into_iter().flatten().collect();
        support::stats::report("push -> a node's pool shows v1", times);
        println!("push -> every one of {nodes} nodes serves v1: {:.2} s", all.as_secs_f64());
        println!(
            "the move: {moved} registry requests = {:.1} per node (polls included); {writes} slice writes = {:.2} per node",
            moved as f64 / nodes as f64,
            writes as f64 / nodes as f64
        );
        let swapped = |d: &Devplug| d.log().lines().rfind(|l| l.contains("backend swapped in")).unwrap_or_default().to_owned();
        let signed = fleet.iter().filter(|d| swapped(d).contains("cache=Signed")).count();
        let compiled = fleet.iter().filter(|d| swapped(d).contains("cache=Miss")).count();
        let cpu: f64 = fleet.iter().zip(&cpu0).map(|(d, c0)| children_cpu(d.pid()) - c0).sum();
        println!(
            "compiles of v1: {compiled} nodes compiled it, {signed} loaded the operator-signed code; the fleet's compile workers used {cpu:.2} CPU s{}",
            cluster_compile.map(|s| format!("; devplug precompile's one compile took {s:.2} s")).unwrap_or_default()
        );
        for d in &mut fleet {
            let _ = d.terminate(Duration::from_secs(30));
        }
        anyhow::Ok(())
    })
}
