//! Operating devplug: `/metrics` series and values through a scripted scenario (parsed with a
//! Prometheus text-format parser), `/readyz` following kubelet, pod attribution from the pod
//! resources API (and working without it), `devplug status`, and a quiet log when idle.

use devplug_test_support as support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use devplug_standins::proto::deviceplugin as pb;
use support::binary::{Devplug, run, run_args};
use support::daemon::{WIDGET, chaos_build, chaos_paths};
use support::fixtures::Machine;
use support::kubelet::Kubelet;
use support::podresources::PodResources;

const T: Duration = Duration::from_secs(30);

/// A backends dir with chaos at version `1.0.k` and this extra config.
fn chaos(dir: &Path, k: u32, extra: &str) {
    let orig = std::fs::read_to_string(chaos_paths().1).unwrap();
    let toml =
        format!("config = \"names=widget-0,widget-1,widget-2,trap-3 devices=4 version=1.0.{k} {extra}\"\n{orig}");
    // Both files written first, then renamed back to back: one new version, not two.
    for (name, bytes) in [("chaos.toml", toml.into_bytes()), ("chaos.wasm", chaos_build(k))] {
        std::fs::write(dir.join(format!(".{name}.tmp")), bytes).unwrap();
    }
    for name in ["chaos.toml", "chaos.wasm"] {
        std::fs::rename(dir.join(format!(".{name}.tmp")), dir.join(name)).unwrap();
    }
}

struct Setup {
    _root: tempfile::TempDir,
    kdir: PathBuf,
    backends: PathBuf,
    machine: Machine,
}

fn setup() -> Setup {
    let root = tempfile::tempdir().unwrap();
    let (kdir, backends) = (root.path().join("device-plugins"), root.path().join("backends"));
    std::fs::create_dir_all(&kdir).unwrap();
    std::fs::create_dir_all(&backends).unwrap();
    chaos(&backends, 0, "");
    Setup { _root: root, kdir, backends, machine: Machine::generic_box() }
}

/// `devplug run` with a fast poll; returns it and its HTTP address (from its log).
fn start(s: &Setup, poll: &str) -> (Devplug, String) {
    let cfg = s.backends.parent().unwrap().join("devplug.toml");
    std::fs::write(&cfg, "pod_resources_interval = \"100ms\"\n").unwrap();
    let mut args = run_args(&s.kdir, &s.backends, &s.machine);
    args.extend(["--config".into(), cfg.display().to_string(), "--poll-interval".into(), poll.into()]);
    let d = Devplug::spawn(&args);
    d.wait_log("serving /healthz, /readyz, /metrics and /status", T).unwrap();
    let log = d.log();
    let line = log.lines().find(|l| l.contains("serving /healthz")).unwrap();
    let addr = line.split("addr=").nth(1).unwrap().split_whitespace().next().unwrap().to_owned();
    (d, addr)
}

async fn get(addr: &str, path: &str) -> (u16, String) {
    devplug::cli::http_get(addr, path).await.unwrap()
}

/// Poll `path` until `pred` holds on (status, body), bounded.
async fn wait_http(addr: &str, path: &str, what: &str, pred: impl Fn(u16, &str) -> bool) -> String {
    let deadline = Instant::now() + T;
    loop {
        let (code, body) = get(addr, path).await;
        if pred(code, &body) {
            return body;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what} on {path}: {code}\n{body}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn alloc(id: &str) -> pb::AllocateRequest {
    pb::AllocateRequest { container_requests: vec![pb::ContainerAllocateRequest { devices_ids: vec![id.to_owned()] }] }
}

/// Samples of a scrape, as `name{label="v",...}` (labels sorted) → value.
fn samples(text: &str) -> std::collections::BTreeMap<String, f64> {
    let lines = text.lines().map(|l| Ok(l.to_owned()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("the output parses as Prometheus text");
    scrape
        .samples
        .into_iter()
        .map(|s| {
            let mut labels: Vec<String> = s.labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
            labels.sort();
            let value = match s.value {
                prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Gauge(v) => v,
                prometheus_parse::Value::Untyped(v) => v,
                _ => f64::NAN,
            };
            (format!("{}{{{}}}", s.metric, labels.join(",")), value)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_tell_the_story_of_a_scripted_scenario() {
    let s = setup();
    let kubelet = Kubelet::start(&s.kdir).await;
    let pods = PodResources::serve(&s.kdir.parent().unwrap().join("pod-resources/kubelet.sock"));
    let (d, addr) = start(&s, "200ms");
    let plugin = kubelet.wait_registered(WIDGET, 1, T).await.unwrap();
    let mut c = plugin.client.clone();

    // Three pods get a device each.
    for i in 0..3 {
        let id = format!("widget-{i}");
        c.allocate(alloc(&id)).await.unwrap();
        pods.assign("ml", &format!("train-{i}"), "main", WIDGET, &[&id]);
    }
    // A new version marks widget-2 Unhealthy; then its trap-3 traps.
    chaos(&s.backends, 1, "sick=widget-2");
    kubelet.wait_devices(WIDGET, T, |l| l.iter().any(|d| d.id == "widget-2" && d.health == "Unhealthy")).await.unwrap();
    let err = c.allocate(alloc("trap-3")).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable);
    let err = c.allocate(alloc("widget-9")).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);

    let text = wait_http(&addr, "/metrics", "pod attribution", |_, b| b.contains("device=\"widget-2\"}")).await;
    let m = samples(&text);
    let r = "resource=\"test.devplug.io/widget\"";
    let want: Vec<(String, f64)> = vec![
        (format!("devplug_devices{{health=\"Healthy\",{r}}}"), 3.0),
        (format!("devplug_devices{{health=\"Unhealthy\",{r}}}"), 1.0),
        (format!("devplug_registrations_total{{{r}}}"), 1.0),
        (format!("devplug_kubelet_requests_total{{method=\"Allocate\",outcome=\"ok\",{r}}}"), 3.0),
        (format!("devplug_kubelet_requests_total{{method=\"Allocate\",outcome=\"error\",{r}}}"), 2.0),
        (format!("devplug_kubelet_request_seconds_count{{method=\"Allocate\",{r}}}"), 5.0),
        // The unknown ID never reached the backend: 4 backend calls for 5 requests.
        ("devplug_backend_call_seconds_count{backend=\"chaos\",call=\"allocate\"}".into(), 4.0),
        ("devplug_backend_swaps_total{backend=\"chaos\",outcome=\"ok\"}".into(), 1.0),
        ("devplug_backend_faults_total{backend=\"chaos\",kind=\"trap\"}".into(), 1.0),
        ("devplug_backend_faults_total{backend=\"chaos\",kind=\"timeout\"}".into(), 0.0),
        ("devplug_backend_breaker_open{backend=\"chaos\"}".into(), 0.0),
    ];
    for (series, value) in &want {
        assert_eq!(m.get(series), Some(value), "{series}\n{text}");
    }
    for i in 0..3 {
        let series = format!("devplug_device_allocated{{device=\"widget-{i}\",{r}}}");
        assert_eq!(m.get(&series), Some(&1.0), "{series}\n{text}");
    }
    // Issue 41: who holds a device is the operator's to see (`/status`), never a label on the
    // port the manifests open to the network.
    for label in ["pod=", "namespace=", "container=", "uid=", "claim="] {
        assert!(!text.contains(label), "{label} in /metrics:\n{text}");
    }
    let info: Vec<&String> = m.keys().filter(|k| k.starts_with("devplug_backend_info{")).collect();
    assert_eq!(info.len(), 1, "{info:?}");
    assert!(info[0].contains("version=\"1.0.1\"") && info[0].contains("wit=\"0.3.0\""), "{info:?}");
    assert!(!m.keys().any(|k| k.starts_with("devplug_reregistrations_total")), "no kubelet restart happened");

    // `devplug status` shows the same picture to a person.
    let (code, out, err) = run(&["status", "--addr", &addr]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("test.devplug.io/widget") && out.contains("Registered"), "{out}");
    assert!(out.lines().any(|l| l.starts_with("chaos") && l.contains("1.0.1") && l.contains("closed")), "{out}");
    assert!(out.contains("ml/train-1/main"), "{out}");
    // The columns line up: the kubelet state starts where its header does.
    let header = out.lines().find(|l| l.starts_with("RESOURCE")).unwrap();
    let row = out.lines().find(|l| l.starts_with("test.devplug.io/widget")).unwrap();
    assert_eq!(header.find("KUBELET"), row.find("Registered"), "misaligned:\n{out}");
    // Two digests, each named for what it is (issue 28).
    assert!(out.contains("COMPONENT SHA256") && !out.contains(" DIGEST "), "{out}");
    // `--devices`: what devplug serves, device by device.
    let (code, out, err) = run(&["status", "--addr", &addr, "--devices", "--format", "json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let devices = v["resources"][0]["devices"].as_array().unwrap();
    let ids: Vec<&str> = devices.iter().map(|d| d["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["widget-0", "widget-1", "widget-2", "trap-3"], "{v}");
    assert_eq!(devices[0]["health"], "Healthy");
    assert_eq!(devices[1]["nodes"], serde_json::json!(["/dev/null:/dev/null"]), "{v}");
    assert_eq!(devices[1]["numa_nodes"], serde_json::json!([1]), "{v}");
    assert_eq!(devices[1]["attributes"]["index"], "1", "{v}");
    // The listener answers in bounded pages; the CLI above joined them.
    let (code, body) = get(&addr, "/status/devices?limit=3").await;
    assert_eq!(code, 200, "{body}");
    let first: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(first["resources"][0]["devices"].as_array().unwrap().len(), 3, "{first}");
    assert_eq!((first["total"].as_u64(), first["next"].as_u64()), (Some(4), Some(3)), "{first}");
    let (_, body) = get(&addr, "/status/devices?offset=3&limit=100000").await;
    let last: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(last["resources"][0]["devices"][0]["id"], "trap-3", "{last}");
    assert!(last["next"].is_null(), "the last page says so: {last}");
    let (code, table, err) = run(&["status", "--addr", &addr, "--devices"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("test.devplug.io/widget") && l.contains("widget-1") && l.contains("Healthy")),
        "{table}"
    );
    drop(d);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_follows_kubelet_and_attribution_is_optional() {
    let s = setup();
    let (d, addr) = start(&s, "100ms");
    // No kubelet yet: alive but not ready.
    assert_eq!(get(&addr, "/healthz").await.0, 200);
    wait_http(&addr, "/readyz", "503 while waiting for kubelet", |c, b| c == 503 && b.contains("WaitingForKubelet"))
        .await;
    let mut kubelet = Kubelet::start(&s.kdir).await;
    let plugin = kubelet.wait_registered(WIDGET, 1, T).await.unwrap();
    wait_http(&addr, "/readyz", "200 once registered", |c, _| c == 200).await;
    // Kubelet goes away (its socket with it): not ready; back: ready again.
    kubelet.shutdown().await;
    wait_http(&addr, "/readyz", "503 after kubelet.sock is gone", |c, _| c == 503).await;
    kubelet.restart().await;
    kubelet.wait_registered(WIDGET, 2, T).await.unwrap();
    wait_http(&addr, "/readyz", "200 once re-registered", |c, _| c == 200).await;
    let m = samples(&get(&addr, "/metrics").await.1);
    assert_eq!(m.get("devplug_reregistrations_total{resource=\"test.devplug.io/widget\"}"), Some(&1.0));

    // No pod resources socket anywhere: Allocate works, attribution is off, said once.
    drop(plugin);
    let mut c = kubelet.plugin(WIDGET).await.unwrap().client;
    for _ in 0..20 {
        c.allocate(alloc("widget-0")).await.unwrap();
    }
    // Let many pod-resources polls (every 100 ms) pass: wait for 20 more discover rounds.
    let rounds = |m: &std::collections::BTreeMap<String, f64>| {
        m.get("devplug_backend_call_seconds_count{backend=\"chaos\",call=\"discover\"}").copied().unwrap_or(0.0)
    };
    let start_rounds = rounds(&samples(&get(&addr, "/metrics").await.1));
    wait_http(&addr, "/metrics", "20 more polls", |_, b| rounds(&samples(b)) >= start_rounds + 20.0).await;
    let log = d.log();
    assert_eq!(log.matches("pod attribution is off").count(), 1, "{log}");
    assert!(!get(&addr, "/metrics").await.1.contains("devplug_device_allocated{"), "nothing attributed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_devplug_logs_state_changes_not_polls() {
    let s = setup();
    let kubelet = Kubelet::start(&s.kdir).await;
    let (d, addr) = start(&s, "100ms");
    kubelet.wait_registered(WIDGET, 1, T).await.unwrap();
    let settled = d.log().lines().count();
    // 100 health polls (the 10 idle minutes at a 1 s poll would be 600; the log does not
    // grow with polls at all, so the count of polls is what matters, not the clock).
    let rounds = |b: &str| {
        samples(b)
            .get("devplug_backend_call_seconds_count{backend=\"chaos\",call=\"discover\"}")
            .copied()
            .unwrap_or(0.0)
    };
    let first = rounds(&get(&addr, "/metrics").await.1);
    wait_http(&addr, "/metrics", "100 polls", |_, b| rounds(b) >= first + 100.0).await;
    let log = d.log();
    let new: Vec<&str> = log.lines().skip(settled).collect();
    assert!(new.len() <= 2, "an idle devplug logged {} lines over 100 polls:\n{}", new.len(), new.join("\n"));
}

/// The HTTP endpoints come up before the backends load (issue 28): with a backend whose `init`
/// sleeps (a cold compile or a slow vendor init looks the same from outside), `/healthz` and
/// `/status` answer and `/readyz` says "not ready" while that init is still under way, so a
/// liveness probe never restarts a devplug that is only busy starting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_answer_while_backends_are_still_loading() {
    let s = setup();
    std::fs::remove_file(s.backends.join("chaos.wasm")).unwrap();
    chaos(&s.backends, 0, "mode=sleep-init");
    let cfg = s.backends.parent().unwrap().join("devplug.toml");
    std::fs::write(&cfg, "[limits]\ndiscover_timeout = \"60s\"\n").unwrap();
    let mut args = run_args(&s.kdir, &s.backends, &s.machine);
    args.extend(["--config".into(), cfg.display().to_string()]);
    let mut d = Devplug::spawn(&args);
    d.wait_log("serving /healthz, /readyz, /metrics and /status", T).unwrap();
    let log = d.log();
    let line = log.lines().find(|l| l.contains("serving /healthz")).unwrap();
    let addr = line.split("addr=").nth(1).unwrap().split_whitespace().next().unwrap().to_owned();
    d.wait_log("chaos: napping", T).unwrap();
    let t0 = Instant::now();
    let (healthz, _) = get(&addr, "/healthz").await;
    let (readyz, why) = get(&addr, "/readyz").await;
    let (status, body) = get(&addr, "/status").await;
    eprintln!("probes answered in {:?} while a backend's init slept", t0.elapsed());
    assert_eq!(healthz, 200);
    assert_eq!(readyz, 503, "{why}");
    assert!(why.contains("still starting"), "{why}");
    assert_eq!(status, 200, "{body}");
    assert!(!d.log().contains("backends loaded"), "the init was over before the probes were asked:\n{}", d.log());
    assert!(d.terminate(T).unwrap().success());
}

/// Issue 41: the port the manifests open on the host network (`0.0.0.0:9400`) served `/status`
/// with every claim's namespace, name and UID to anyone on the network. Now it serves the probes
/// and `/metrics` only; `/status` is on a `0600` Unix socket in devplug's `0700` state dir, which
/// `devplug status` reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_network_port_serves_probes_and_metrics_only_and_status_stays_on_the_private_socket() {
    use std::os::unix::fs::PermissionsExt;
    let s = setup();
    let mut args = run_args(&s.kdir, &s.backends, &s.machine);
    let at = args.iter().position(|a| a == "127.0.0.1:0").unwrap();
    args[at] = "0.0.0.0:0".into();
    let d = Devplug::spawn(&args);
    d.wait_log("serving /healthz, /readyz and /metrics", T).unwrap();
    d.wait_log("serving /status for `devplug status`", T).unwrap();
    let log = d.log();
    let line = log.lines().find(|l| l.contains("serving /healthz")).unwrap();
    let port = line.split("addr=0.0.0.0:").nth(1).unwrap().split_whitespace().next().unwrap().to_owned();
    let addr = format!("127.0.0.1:{port}");
    let (code, body) = get(&addr, "/status").await;
    assert_eq!(code, 404, "{body}");
    assert!(body.contains("status socket"), "{body}");
    assert_eq!(get(&addr, "/status/devices").await.0, 404);
    assert_eq!(get(&addr, "/metrics").await.0, 200);
    let socket = s.kdir.parent().unwrap().join("plugins/devplug/status.sock");
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!((mode(&socket), mode(socket.parent().unwrap())), (0o600, 0o700));
    let shown = socket.display().to_string();
    let out =
        tokio::task::spawn_blocking(move || run(&["status", "--addr", &shown, "--format", "json"])).await.unwrap();
    assert_eq!(out.0, 0, "{}", out.2);
    let v: serde_json::Value = serde_json::from_str(&out.1).unwrap();
    assert!(v["backends"].is_array(), "{v}");
    drop(d);
}

/// The scheduling policy of process `pid`'s thread named `name` (kernel `comm`, at most 15
/// bytes), from `/proc/PID/task/TID/stat` (field 41).
fn thread_policy(pid: i32, name: &str) -> Option<u32> {
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()?.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim_end() != name {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("stat")).ok()?;
        // Fields after the `(comm)` one, which may hold spaces: state is field 3, policy 41.
        let rest = stat.rsplit_once(')')?.1;
        return rest.split_whitespace().nth(41 - 3).and_then(|p| p.parse().ok());
    }
    None
}

/// Issue 51: a large backend (`baseline_from_mb = 0` makes the chaos backend one) is served
/// from baseline code as soon as that is ready; its optimised code is compiled after, on a
/// thread at idle priority (`SCHED_IDLE`), and swapped into the running backend without a
/// reload (before, it was only cached for the next load); `/status` and `devplug status` say
/// which code serves, and kubelet's Allocate is answered by the optimised code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_backend_serves_baseline_code_first_and_its_optimised_code_swaps_in_at_idle_priority() {
    const SCHED_IDLE: u32 = 5;
    let s = setup();
    let kubelet = Kubelet::start(&s.kdir).await;
    let cfg = s.backends.parent().unwrap().join("devplug.toml");
    std::fs::write(&cfg, "baseline_from_mb = 0\n").unwrap();
    let mut args = run_args(&s.kdir, &s.backends, &s.machine);
    args.extend(["--config".into(), cfg.display().to_string()]);
    let d = Devplug::spawn(&args);
    let plugin = kubelet.wait_registered(WIDGET, 1, T).await.unwrap();
    let loaded = d.log();
    let loaded =
        loaded.lines().find(|l| l.contains("backend loaded") && l.contains("backend=chaos")).unwrap().to_owned();
    assert!(loaded.contains("compiler=Baseline"), "served from baseline code first: {loaded}");
    // The line says where the load's time went.
    for step in ["compile_ms=", "init_ms="] {
        let v = loaded.split(step).nth(1).and_then(|r| r.split_whitespace().next()).unwrap_or_default();
        assert!(v.parse::<u64>().is_ok(), "{step} a number of milliseconds: {loaded}");
    }
    d.wait_log("optimised code swapped in", T).unwrap();
    assert_eq!(thread_policy(d.pid(), "devplug-optimiz"), Some(SCHED_IDLE), "the optimiser runs at idle priority");
    let log = d.log();
    let line = log.lines().find(|l| l.contains("serving /healthz")).unwrap();
    let addr = line.split("addr=").nth(1).unwrap().split_whitespace().next().unwrap().to_owned();
    let body = wait_http(&addr, "/status", "the optimised code", |_, b| b.contains("\"optimized\"")).await;
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let chaos = v["backends"].as_array().unwrap().iter().find(|b| b["name"] == "chaos").unwrap().clone();
    assert_eq!(
        (chaos["compiler"].as_str(), chaos["optimizing"].as_bool()),
        (Some("optimized"), Some(false)),
        "{chaos}"
    );
    let socket = s.kdir.parent().unwrap().join("plugins/devplug/status.sock").display().to_string();
    let (code, table, err) = tokio::task::spawn_blocking(move || run(&["status", "--addr", &socket])).await.unwrap();
    assert_eq!(code, 0, "{err}");
    assert!(table.lines().any(|l| l.starts_with("chaos") && l.contains("optimized")), "{table}");
    let mut c = plugin.client.clone();
    let answer = c.allocate(alloc("widget-1")).await.unwrap().into_inner();
    assert!(!answer.container_responses.is_empty());
    assert_eq!(log.matches("backend loaded").count(), 1, "no reload: {log}");
    drop(d);
}

/// Issue 62: the chart's default cache is an emptyDir, which kubelet creates `0777`; devplug
/// refused it (`compile cache refused … writable by other users`), so every pod compiled every
/// backend again. Through the binary, with a `0777` directory as `--cache-dir`: the first run
/// compiles and keeps the code in devplug's own `0700` directory inside it, the next run
/// loads it from there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_dir_others_may_write_holds_devplugs_own_private_cache() {
    use std::os::unix::fs::PermissionsExt;
    let s = setup();
    let shared = s.backends.parent().unwrap().join("emptydir");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut cache_of_run = Vec::new();
    for _ in 0..2 {
        let kubelet = Kubelet::start(&s.kdir).await;
        let mut args = run_args(&s.kdir, &s.backends, &s.machine);
        args.extend(["--cache-dir".into(), shared.display().to_string()]);
        let mut d = Devplug::spawn(&args);
        kubelet.wait_registered(WIDGET, 1, T).await.unwrap();
        let log = d.log();
        assert!(!log.contains("compile cache refused"), "{log}");
        let line = log.lines().find(|l| l.contains("backend loaded") && l.contains("backend=chaos")).unwrap();
        cache_of_run.push(line.split("cache=").nth(1).and_then(|r| r.split_whitespace().next()).unwrap().to_owned());
        d.terminate(T).unwrap();
    }
    assert_eq!(cache_of_run, ["Miss", "Hit"], "the second run loads what the first compiled");
    let own = shared.join("devplug");
    assert_eq!(std::fs::metadata(&own).unwrap().permissions().mode() & 0o777, 0o700);
    assert!(std::fs::read_dir(&own).unwrap().count() > 0, "the compiled code is in devplug's own directory");
}

/// Issue 58 (6): a backend that failed to load at start was absent from `/status` and
/// `devplug status` (only the log said so). It is listed, not loaded, with its error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_fails_to_load_is_in_status_with_its_error() {
    let s = setup();
    let manifest = std::fs::read_to_string(chaos_paths().1).unwrap().replace("name = \"chaos\"", "name = \"broken\"");
    std::fs::write(s.backends.join("broken.toml"), manifest).unwrap();
    std::fs::write(s.backends.join("broken.wasm"), b"not a component at all").unwrap();
    let kubelet = Kubelet::start(&s.kdir).await;
    let (d, addr) = start(&s, "1s");
    kubelet.wait_registered(WIDGET, 1, T).await.unwrap();
    let body = wait_http(&addr, "/status", "the broken backend", |_, b| b.contains("\"broken\"")).await;
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let broken = v["backends"].as_array().unwrap().iter().find(|b| b["name"] == "broken").unwrap().clone();
    assert_eq!(broken["loaded"], false, "{broken}");
    let error = broken["last_error"].as_str().unwrap_or_default();
    assert!(error.starts_with("not loaded: "), "{broken}");
    let chaos = v["backends"].as_array().unwrap().iter().find(|b| b["name"] == "chaos").unwrap().clone();
    assert_eq!(chaos["loaded"], true, "the good backend beside it serves: {chaos}");
    let socket = s.kdir.parent().unwrap().join("plugins/devplug/status.sock").display().to_string();
    let (code, table, err) = tokio::task::spawn_blocking(move || run(&["status", "--addr", &socket])).await.unwrap();
    assert_eq!(code, 0, "{err}");
    let row = table.lines().find(|l| l.starts_with("broken")).unwrap_or_else(|| panic!("{table}"));
    assert!(row.contains("NOT LOADED") && row.contains("not loaded: "), "{table}");
    drop(d);
}
