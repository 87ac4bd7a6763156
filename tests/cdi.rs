//! CDI: the spec files devplug writes, checked against the CDI JSON schema for every hardware
//! fixture, proven with a real container engine (podman injecting each device by its CDI name),
//! and never torn by a SIGKILL in the middle of a rewrite.

use devplug_test_support as support;

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use devplug::backends::BackendSettings;
use devplug::config::Config;
use devplug::kubelet::RegistrationMode;
use devplug::kubelet::Strategy;
use devplug_standins::proto::deviceplugin as pb;
use notify::Watcher;
use support::binary::{Devplug, on_machine, run_args};
use support::daemon::{Daemon, chaos_dir, config};
use support::fixtures::Machine;
use support::hardware::MACHINES;
use support::kubelet::Kubelet;
use support::podman::{Podman, SystemCdi, text};

const T: Duration = Duration::from_secs(20);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("repo root").to_owned()
}

fn cache_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("wasm-cache")
}

/// The vendored CDI schema, its `defs.json#/...` references pointed at the vendored defs (the
/// two files merged, so nothing is fetched).
fn validator() -> jsonschema::Validator {
    let dir = repo().join("tests/fixtures/cdi-schema");
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
    let schema = read("schema.json").replace("\"defs.json#/definitions/", "\"#/definitions/");
    let mut schema: serde_json::Value = serde_json::from_str(&schema).expect("schema.json");
    let defs: serde_json::Value = serde_json::from_str(&read("defs.json")).expect("defs.json");
    schema["definitions"] = defs["definitions"].clone();
    jsonschema::validator_for(&schema).expect("the CDI schema compiles")
}

fn check_schema(v: &jsonschema::Validator, file: &Path, spec: &serde_json::Value) {
    // The upstream schema leaves the spec-level containerEdits unchecked: check it as a
    // device's containerEdits, through the same schema.
    let mut spec = spec.clone();
    if let Some(edits) = spec.as_object_mut().and_then(|o| o.remove("containerEdits")) {
        let probe = serde_json::json!({"name": "spec-level", "containerEdits": edits});
        spec["devices"].as_array_mut().expect("devices").push(probe);
    }
    let errors: Vec<String> = v.iter_errors(&spec).map(|e| format!("{} at {}", e, e.instance_path())).collect();
    assert!(errors.is_empty(), "{} does not validate against the CDI schema:\n{}", file.display(), errors.join("\n"));
}

fn read_json(p: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .unwrap_or_else(|e| panic!("{} is not JSON: {e}", p.display()))
}

#[test]
fn generated_specs_validate_against_the_cdi_schema_for_every_fixture() {
    let v = validator();
    // The schema is not a rubber stamp: a spec without devices or with a stray field fails.
    assert!(!v.is_valid(&serde_json::json!({"cdiVersion": "0.3.0", "kind": "a.io/b"})));
    assert!(!v.is_valid(&serde_json::json!({"cdiVersion": "0.3.0", "kind": "a.io/b", "devices": [{"name": "x"}]})));
    let bad_node = serde_json::json!({"cdiVersion": "0.3.0", "kind": "a.io/b", "devices": [
        {"name": "x", "containerEdits": {"deviceNodes": [{"path": "/dev/x", "major": "ten"}]}}]});
    assert!(!v.is_valid(&bad_node));
    let mut kinds_seen = BTreeMap::new();
    for machine in MACHINES {
        let root = repo().join("tests/fixtures/sysfs").join(machine);
        let out = tempfile::tempdir().unwrap();
        let out_dir = out.path().display().to_string();
        let stdout = on_machine(&["cdi", "generate"], &root, &cache_dir(), &["--out", &out_dir]);
        let discover = discover_ids(&root);
        let files: Vec<PathBuf> = stdout.lines().map(PathBuf::from).collect();
        let mut on_disk: Vec<PathBuf> = std::fs::read_dir(out.path()).unwrap().flatten().map(|e| e.path()).collect();
        on_disk.sort();
        let mut listed = files.clone();
        listed.sort();
        assert_eq!(listed, on_disk, "{machine}: generate prints exactly the files it wrote");
        // One spec per resource that has devices.
        let with_devices: Vec<&String> = discover.iter().filter(|(_, ids)| !ids.is_empty()).map(|(r, _)| r).collect();
        assert_eq!(files.len(), with_devices.len(), "{machine}: {files:?} vs {with_devices:?}");
        for f in &files {
            let spec = read_json(f);
            check_schema(&v, f, &spec);
            let kind = spec["kind"].as_str().unwrap().to_owned();
            let names: Vec<&str> =
                spec["devices"].as_array().unwrap().iter().map(|d| d["name"].as_str().unwrap()).collect();
            assert_eq!(names, discover[&kind], "{machine}: CDI device names are the device IDs");
            // The lowest version that covers it: PCI-address names start with a digit (0.5.0);
            // names starting with a letter, without host paths, need only 0.3.0.
            let want =
                if names.iter().any(|n| n.starts_with(|c: char| c.is_ascii_digit())) { "0.5.0" } else { "0.3.0" };
            assert_eq!(spec["cdiVersion"], want, "{machine} {kind}");
            // Device nodes carry the numbers from the fixture's dev tree.
            for d in spec["devices"].as_array().unwrap() {
                for n in d["containerEdits"]["deviceNodes"].as_array().into_iter().flatten() {
                    let path = n["path"].as_str().unwrap();
                    let desc =
                        std::fs::read_to_string(root.join("dev").join(path.trim_start_matches("/dev/"))).unwrap();
                    let want = format!("{} {}:{}", n["type"].as_str().unwrap(), n["major"], n["minor"]);
                    assert_eq!(desc.trim(), want, "{machine} {path}");
                }
            }
            kinds_seen.insert(kind, spec["cdiVersion"].as_str().unwrap().to_owned());
        }
    }
    for k in ["nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/i915", "devplug.io/sriov_rdma", "devplug.io/kvm"] {
        assert!(kinds_seen.contains_key(k), "no spec for {k} on any fixture: {kinds_seen:?}");
    }
}

/// Issue 17: with `cdi_device_names = "nvidia-ctk"` the spec holds the names NVIDIA's toolkit
/// writes (`0`, `GPU-<uuid>` per GPU, `all`), time-sliced replicas share their GPU's entry, and
/// an Allocate of two replicas of one GPU asks the runtime for that GPU once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nvidia_ctk_names_and_replicas_share_one_entry_per_gpu() {
    let gpu = "cdi_device_names = \"nvidia-ctk\"\n[sharing]\nreplicas = 2\n";
    let root = repo().join("tests/fixtures/sysfs/dgx-h100");
    let work = tempfile::tempdir().unwrap();
    let file = work.path().join("devplug.toml");
    std::fs::write(&file, format!("[backends.gpu]\nconfig = \'\'\'\n{gpu}\'\'\'\n")).unwrap();
    let out = work.path().join("cdi");
    let args = ["--out", &out.display().to_string(), "--config", &file.display().to_string()];
    on_machine(&["cdi", "generate"], &root, &cache_dir(), &args);
    let spec_path = out.join("devplug-nvidia.com_gpu.json");
    let spec = read_json(&spec_path);
    check_schema(&validator(), &spec_path, &spec);
    let names: Vec<&str> = spec["devices"].as_array().unwrap().iter().map(|d| d["name"].as_str().unwrap()).collect();
    assert_eq!(names.len(), 8 * 2 + 1, "{names:?}");
    assert_eq!(names[0], "0");
    assert!(names[1].starts_with("GPU-") && names[2] == "1", "{names:?}");
    assert_eq!(names.last(), Some(&"all"));
    let all = &spec["devices"][16]["containerEdits"]["deviceNodes"];
    assert_eq!(all.as_array().unwrap().len(), 8, "all = every GPU's node once: {all}");

    let dir = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::start(dir.path()).await;
    let cfg = Config {
        allocate: vec![Strategy::CdiCri],
        backends: [("gpu".to_owned(), BackendSettings { config: gpu.into(), ..Default::default() })].into(),
        ..fixture_config(dir.path(), &root)
    };
    let daemon = Daemon::start(cfg);
    let plugin = kubelet.wait_plugin("nvidia.com/gpu", T).await.unwrap();
    kubelet.wait_devices("nvidia.com/gpu", T, |l| l.len() == 16).await.unwrap();
    assert_eq!(read_json(&dir.path().join("cdi/devplug-nvidia.com_gpu.json")), spec, "run writes what generate does");
    let ids = ["0000:2a:00.0::0", "0000:2a:00.0::1", "0000:3a:00.0::1"].map(String::from).to_vec();
    let req = pb::AllocateRequest { container_requests: vec![pb::ContainerAllocateRequest { devices_ids: ids }] };
    let resp = plugin.client.clone().allocate(req).await.unwrap().into_inner();
    let got: Vec<&str> = resp.container_responses[0].cdi_devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(got, ["nvidia.com/gpu=1", "nvidia.com/gpu=2"]);
    daemon.stop().await.unwrap();
}

/// Issue 43: a resource configured `write_cdi = false` gets no spec from any path of `run`, not
/// even for a moment (its first serving wrote one, which the first sweep then removed): every
/// file event in the CDI directory is watched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resource_configured_without_cdi_gets_no_spec() {
    let root = repo().join("tests/fixtures/sysfs/dgx-h100");
    let dir = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::start(dir.path()).await;
    let no_spec = devplug::config::ResourceSettings {
        allocate: Some(vec![Strategy::DeviceSpecs]),
        write_cdi: Some(false),
        api: devplug::config::Api::DevicePlugin,
        owns: Vec::new(),
    };
    let cfg =
        Config { resources: [("nvidia.com/gpu".to_owned(), no_spec)].into(), ..fixture_config(dir.path(), &root) };
    std::fs::create_dir_all(dir.path().join("cdi")).unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let log = seen.clone();
    let mut watcher = notify::recommended_watcher(move |e: notify::Result<notify::Event>| {
        if let Ok(e) = e {
            log.lock().unwrap().extend(e.paths.iter().map(|p| p.display().to_string()));
        }
    })
    .unwrap();
    watcher.watch(&dir.path().join("cdi"), notify::RecursiveMode::NonRecursive).unwrap();
    let daemon = Daemon::start(cfg);
    kubelet.wait_devices("nvidia.com/gpu", T, |l| l.len() == 8).await.unwrap();
    // Another resource of the same machine is served with its spec (so specs are on at all);
    // its spec is renamed into place before it registers, so once kubelet lists it, it is there.
    kubelet.wait_devices("devplug.io/kvm", T, |l| !l.is_empty()).await.unwrap();
    let others: Vec<String> = std::fs::read_dir(dir.path().join("cdi"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        others.iter().any(|f| f.contains("devplug.io_kvm")),
        "no spec at all, the test would prove nothing: {others:?}"
    );
    daemon.stop().await.unwrap();
    drop(watcher);
    let touched = seen.lock().unwrap().clone();
    assert!(
        !touched.iter().any(|f| f.contains("nvidia.com_gpu")),
        "a write_cdi = false resource's spec was written: {touched:?}"
    );
}

/// `run` on the fixture machine `root`, its kubelet and CDI dir in `dir`.
fn fixture_config(dir: &Path, root: &Path) -> Config {
    Config {
        kubelet_dir: dir.to_owned(),
        registration: RegistrationMode::KubeletSocket,
        sysfs_root: root.join("sys"),
        dev_root: root.join("dev"),
        proc_root: root.join("proc"),
        dev_fixtures: true,
        metrics_addr: "127.0.0.1:0".parse().unwrap(),
        cdi_dir: dir.join("cdi"),
        cache_dir: Some(cache_dir()),
        ..Config::default()
    }
}

/// Resource → device IDs, from `devplug discover`.
fn discover_ids(root: &Path) -> BTreeMap<String, Vec<String>> {
    let out = on_machine(&["discover"], root, &cache_dir(), &["--format", "json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let ids = r["devices"].as_array().unwrap().iter().map(|d| d["id"].as_str().unwrap().to_owned()).collect();
            (r["name"].as_str().unwrap().to_owned(), ids)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn podman_runs_containers_with_the_cdi_devices_allocate_names() {
    let podman = tokio::task::spawn_blocking(Podman::new).await.unwrap();
    let vendor = format!("e2e-{}.devplug.io", std::process::id());
    let (null_res, kvm_res) = (format!("{vendor}/null"), format!("{vendor}/kvm"));
    let marker = podman.root().join("marker");
    std::fs::write(&marker, "mounted-by-cdi\n").unwrap();
    let has_kvm = std::fs::metadata("/dev/kvm").is_ok_and(|m| {
        use std::os::unix::fs::FileTypeExt;
        m.file_type().is_char_device()
    });
    let mut generic = format!(
        "[[resource]]\nname = \"{null_res}\"\npaths = [\"null\"]\ncount = 2\ncontainer_path = \"/dev/devplug-null\"\n\
         env = {{ DEVPLUG_E2E = \"null-ok\" }}\n\
         mounts = [{{ host_path = \"{}\", container_path = \"/devplug-e2e/marker\" }}]\n",
        marker.display()
    );
    if has_kvm {
        generic.push_str(&format!("[[resource]]\nname = \"{kvm_res}\"\npaths = [\"kvm\"]\n"));
    }

    let dir = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::start(dir.path()).await;
    let (m, backends) = (Machine::generic_box(), chaos_dir());
    let mut cfg = config(dir.path(), &m, backends.path(), "");
    cfg.backends.clear();
    cfg.backends_dir = None;
    cfg.embedded = true;
    cfg.sysfs_root = "/sys".into();
    cfg.dev_root = "/dev".into();
    cfg.dev_fixtures = false;
    cfg.write_cdi = true;
    // Podman reads no other directory: the guard serialises its users and restores it, even
    // when an assertion below fails.
    let system_cdi = SystemCdi::take();
    cfg.cdi_dir = system_cdi.dir().to_owned();
    cfg.allocate = vec![Strategy::CdiCri];
    cfg.cache_dir = Some(cache_dir());
    for off in ["gpu", "nic", "fpga"] {
        cfg.backends.insert(off.into(), BackendSettings { enabled: false, ..Default::default() });
    }
    cfg.backends.insert("generic".into(), BackendSettings { config: generic, ..Default::default() });
    let spec_file = |r: &str| system_cdi.dir().join(format!("devplug-{}.json", r.replace('/', "_")));
    let daemon = Daemon::start(cfg);

    let plugin = kubelet.wait_plugin(&null_res, T).await.unwrap();
    check_schema(&validator(), &spec_file(&null_res), &read_json(&spec_file(&null_res)));
    assert_eq!(read_json(&spec_file(&null_res))["cdiVersion"], "0.5.0", "hostPath on a node needs 0.5.0");
    let req = pb::AllocateRequest {
        container_requests: vec![pb::ContainerAllocateRequest { devices_ids: vec!["null-1".into()] }],
    };
    let resp = plugin.client.clone().allocate(req).await.unwrap().into_inner();
    let c = &resp.container_responses[0];
    let mut names: Vec<String> = c.cdi_devices.iter().map(|d| d.name.clone()).collect();
    assert_eq!(names, [format!("{null_res}=null-1")]);
    assert!(
        c.devices.is_empty() && c.envs.is_empty() && c.mounts.is_empty(),
        "cdi-cri alone: the edits are in the spec, {c:?}"
    );
    let mut script =
        String::from("stat -c 'node %F %t:%T' /dev/devplug-null; echo \"env $DEVPLUG_E2E\"; cat /devplug-e2e/marker");
    if has_kvm {
        let kvm = kubelet.wait_plugin(&kvm_res, T).await.unwrap();
        let req = pb::AllocateRequest {
            container_requests: vec![pb::ContainerAllocateRequest { devices_ids: vec!["kvm".into()] }],
        };
        let resp = kvm.client.clone().allocate(req).await.unwrap().into_inner();
        names.extend(resp.container_responses[0].cdi_devices.iter().map(|d| d.name.clone()));
        script.push_str("; stat -c 'kvm %F %t:%T' /dev/kvm");
    } else {
        eprintln!("no /dev/kvm on this machine: the podman test covers /dev/null re-exposed only");
    }

    let out = {
        let (names, script) = (names.clone(), script.clone());
        let podman = &podman;
        tokio::task::block_in_place(|| podman.run(&names, &script))
    };
    assert!(out.status.success(), "podman run with {names:?} failed:\n{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("node character special file 1:3"), "{}", text(&out));
    assert!(stdout.contains("env null-ok"), "{}", text(&out));
    assert!(stdout.contains("mounted-by-cdi"), "{}", text(&out));
    if has_kvm {
        assert!(stdout.contains("kvm character special file a:e8"), "{}", text(&out));
    }

    // A name no spec defines is refused by the engine, not silently dropped.
    let bogus = format!("{null_res}=no-such-device");
    let out = tokio::task::block_in_place(|| podman.run(std::slice::from_ref(&bogus), "true"));
    assert!(!out.status.success(), "podman accepted an unknown CDI device:\n{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no-such-device") || err.contains("unresolvable"), "{}", text(&out));

    daemon.stop().await.unwrap();
    assert!(!spec_file(&null_res).exists(), "the spec is removed on a clean stop");
}

#[test]
fn sigkill_during_spec_rewrites_never_leaves_a_torn_spec() {
    let v = validator();
    let dir = tempfile::tempdir().unwrap();
    let (m, backends) = (Machine::generic_box(), chaos_dir());
    let cdi = m.root().join("cdi");
    std::fs::create_dir_all(&cdi).unwrap();
    // A file devplug did not write: it must survive everything below byte for byte.
    let foreign = cdi.join("vendor-other.json");
    std::fs::write(&foreign, "{\"cdiVersion\":\"0.3.0\",\"kind\":\"other.io/x\",\"devices\":[]}").unwrap();
    let cfg = dir.path().join("devplug.toml");
    // A big spec (about 600 KB) that changes on every poll: each poll is a rewrite.
    std::fs::write(&cfg, "[backends.chaos]\nconfig = \"mode=churn devices=2000\"\n").unwrap();
    let s = |p: &Path| p.display().to_string();
    let mut args = run_args(&dir.path().join("kubelet"), backends.path(), &m);
    args.extend(["--config", &s(&cfg), "--poll-interval", "100ms", "--cache-dir", &s(&cache_dir())].map(str::to_owned));
    let spec = cdi.join("devplug-test.devplug.io_widget.json");
    let is_temp = |p: &Path| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(".devplug-"));

    // Count temp-file creations (one per write) so the kill lands while a rewrite is under way.
    let created = Arc::new(AtomicUsize::new(0));
    let target = Arc::new(AtomicUsize::new(usize::MAX));
    let pid = Arc::new(AtomicUsize::new(0));
    let (c2, t2, p2) = (created.clone(), target.clone(), pid.clone());
    let mut watcher = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
        let Ok(ev) = ev else { return };
        if matches!(ev.kind, notify::EventKind::Create(_)) && ev.paths.iter().any(|p| is_temp(p)) {
            let n = c2.fetch_add(1, Ordering::SeqCst) + 1;
            // `swap(0)` disarms: one kill per round, never `kill(0)` (the whole process group),
            // and a late event from the previous round cannot hit a stale pid.
            if n >= t2.load(Ordering::SeqCst) {
                let pid = p2.swap(0, Ordering::SeqCst) as i32;
                if pid > 0 {
                    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
                }
            }
        }
    })
    .unwrap();
    watcher.watch(&cdi, notify::RecursiveMode::NonRecursive).unwrap();

    let mut torn_writes = 0;
    for round in 0..100 {
        pid.store(0, Ordering::SeqCst);
        created.store(0, Ordering::SeqCst);
        // Kill during a write that replaces an existing spec: a process's first write replaces
        // what the killed one before it left; round 0 has no predecessor, so it waits for its 2nd.
        target.store(if round == 0 { 2 } else { 1 + round % 2 }, Ordering::SeqCst);
        let mut d = Devplug::spawn(&args);
        pid.store(d.pid() as usize, Ordering::SeqCst);
        let st = d.wait_exit(T).unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_eq!(st.signal(), Some(9), "round {round}: devplug ended otherwise: {st:?}\n{}", d.log());
        let entries: Vec<PathBuf> = std::fs::read_dir(&cdi).unwrap().flatten().map(|e| e.path()).collect();
        torn_writes += usize::from(entries.iter().any(|p| is_temp(p)));
        // What a CDI reader loads (*.json) is always whole and valid.
        assert!(spec.exists(), "round {round}: the spec vanished");
        let v_spec = read_json(&spec);
        check_schema(&v, &spec, &v_spec);
        let n = v_spec["devices"].as_array().unwrap().len();
        assert!(n == 2000 || n == 1999, "round {round}: {n} devices");
    }
    drop(watcher);
    eprintln!("{torn_writes} of 100 SIGKILLs landed between a temp file's creation and its rename");
    // The kills did land mid-write (a temp file was left behind), or this test proved nothing.
    assert!(torn_writes >= 10, "only {torn_writes} of 100 kills interrupted a write");
    assert_eq!(
        std::fs::read_to_string(&foreign).unwrap(),
        "{\"cdiVersion\":\"0.3.0\",\"kind\":\"other.io/x\",\"devices\":[]}",
        "a file devplug did not write was touched"
    );

    // A clean run afterwards sweeps the temp files and, on SIGTERM, removes its spec.
    target.store(usize::MAX, Ordering::SeqCst);
    let mut d = Devplug::spawn(&args);
    d.wait_log("serving resource", T).unwrap();
    let st = d.terminate(T).unwrap();
    assert!(st.success(), "{st:?}\n{}", d.log());
    let left: Vec<String> =
        std::fs::read_dir(&cdi).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(left, ["vendor-other.json"], "temp files swept, spec removed, the foreign file kept");
}
