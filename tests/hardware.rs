//! The first-party backends (embedded in the binary) on the real-hardware sysfs fixtures:
//! discover output against golden files, Allocate answers through the kubelet stand-in, health
//! flips seen on ListAndWatch, NUMA packing of preferred allocations.
//!
//! `DEVPLUG_BLESS=1 cargo test --test hardware` rewrites the fixture trees from
//! `support/hardware.rs` and the golden files from what the backends answer; review the diff.

use devplug_test_support as support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use devplug::config::Config;
use devplug::kubelet::RegistrationMode;
use devplug_standins::proto::deviceplugin as pb;
use support::binary::on_machine;
use support::daemon::Daemon;
use support::hardware::{Func, MACHINES, Tree, build, chain, mig_geometry, nvidia_information, snapshot};
use support::kubelet::Kubelet;

const T: Duration = Duration::from_secs(30);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The committed tree of machine `name` (what README's tour and vendors use).
fn committed(name: &str) -> PathBuf {
    repo().join("tests/fixtures/sysfs").join(name)
}

/// Machine `name` freshly generated, which the tests serve: the committed tree is the same
/// (`committed_fixtures_match_their_generator`) except for empty directories, which git cannot
/// hold and drivers do make (every GPU's `capabilities/gpuN/mig`).
fn fixture(name: &str) -> PathBuf {
    static GENERATED: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let root = GENERATED.get_or_init(|| {
        // In the target dir, not the machine's temp dir: a static is never dropped.
        let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("generated-fixtures");
        let _ = std::fs::remove_dir_all(&root);
        for name in MACHINES {
            build(name, &root.join(name));
        }
        root
    });
    root.join(name)
}

fn golden_path(name: &str) -> PathBuf {
    repo().join("tests/fixtures/golden").join(format!("{name}.json"))
}

fn bless() -> bool {
    std::env::var_os("DEVPLUG_BLESS").is_some()
}

/// Compare `got` with the golden file's `section`, or write it when blessing.
fn check_golden(name: &str, section: &str, got: serde_json::Value) {
    let path = golden_path(name);
    let mut doc: serde_json::Value = std::fs::read_to_string(&path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_else(|| serde_json::json!({}));
    if bless() {
        doc[section] = got;
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, serde_json::to_string_pretty(&doc).unwrap() + "\n").unwrap();
        return;
    }
    assert_eq!(
        doc[section],
        got,
        "{name}: {section} differs from {} (DEVPLUG_BLESS=1 to accept, then review the diff)",
        path.display()
    );
}

#[test]
fn committed_fixtures_match_their_generator() {
    for name in MACHINES {
        let dir = committed(name);
        if bless() {
            let _ = std::fs::remove_dir_all(&dir);
            build(name, &dir);
            continue;
        }
        let fresh = tempfile::tempdir().unwrap();
        build(name, fresh.path());
        let (want, got) = (snapshot(fresh.path()), snapshot(&dir));
        let missing: Vec<&String> = want.keys().filter(|k| !got.contains_key(*k)).collect();
        let extra: Vec<&String> = got.keys().filter(|k| !want.contains_key(*k)).collect();
        let changed: Vec<&String> = want.keys().filter(|k| got.get(*k).is_some_and(|v| v != &want[*k])).collect();
        assert!(
            missing.is_empty() && extra.is_empty() && changed.is_empty(),
            "{name}: committed tree differs from the generator: missing {missing:?}, extra {extra:?}, changed {changed:?}"
        );
    }
}

/// Compiled backends shared by every run in this suite.
fn cache_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("wasm-cache")
}

fn discover_json(machine: &Path) -> serde_json::Value {
    serde_json::from_str(&on_machine(&["discover"], machine, &cache_dir(), &["--format", "json"])).unwrap()
}

#[test]
fn discover_on_every_fixture_matches_its_golden_file() {
    for name in MACHINES {
        let v = discover_json(&fixture(name));
        assert_eq!(v["errors"], serde_json::json!([]), "{name}");
        let loaded: Vec<&str> = v["backends"].as_array().unwrap().iter().map(|b| b["name"].as_str().unwrap()).collect();
        assert_eq!(loaded, ["fpga", "generic", "gpu", "nic"], "{name}");
        check_golden(name, "discover", v["resources"].clone());
    }
}

fn daemon_config(kubelet_dir: &Path, machine: &Path) -> Config {
    Config {
        kubelet_dir: kubelet_dir.to_owned(),
        registration: RegistrationMode::KubeletSocket,
        backends_dir: None,
        embedded: true,
        sysfs_root: machine.join("sys"),
        dev_root: machine.join("dev"),
        proc_root: machine.join("proc"),
        dev_fixtures: true,
        metrics_addr: "127.0.0.1:0".parse().unwrap(),
        poll_interval: Duration::from_millis(50),
        cache_dir: Some(cache_dir()),
        // CDI has its own tests (tests/cdi.rs); never write into the real /var/run/cdi here.
        write_cdi: false,
        ..Config::default()
    }
}

/// An AllocateResponse as JSON with stable ordering, for golden files.
fn response_json(r: &pb::ContainerAllocateResponse) -> serde_json::Value {
    let envs: BTreeMap<&String, &String> = r.envs.iter().collect();
    let devices: Vec<String> =
        r.devices.iter().map(|d| format!("{} <- {} ({})", d.container_path, d.host_path, d.permissions)).collect();
    let mounts: Vec<String> = r
        .mounts
        .iter()
        .map(|m| format!("{} <- {}{}", m.container_path, m.host_path, if m.read_only { " (ro)" } else { "" }))
        .collect();
    serde_json::json!({ "envs": envs, "devices": devices, "mounts": mounts })
}

/// Allocate the first two healthy devices of every resource `discovered` lists (generic-backend
/// resources only on the plain box) through the kubelet stand-in; the answers by resource.
async fn allocate_answers(name: &str, cfg: Config, discovered: &serde_json::Value) -> serde_json::Value {
    let kubelet = Kubelet::start(&cfg.kubelet_dir).await;
    let daemon = Daemon::start(cfg);
    let mut answers = serde_json::Map::new();
    for r in discovered["resources"].as_array().unwrap() {
        let rname = r["name"].as_str().unwrap();
        let healthy: Vec<String> = r["devices"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| d["health"] == "Healthy")
            .map(|d| d["id"].as_str().unwrap().to_owned())
            .collect();
        // The generic backend's defaults are on every box: check them once, on the plain one.
        let generic = ["devplug.io/kvm", "devplug.io/fuse", "devplug.io/tun"].contains(&rname);
        if healthy.is_empty() || (generic && name != "plain") {
            continue;
        }
        let plugin = kubelet.wait_plugin(rname, T).await.unwrap();
        kubelet.wait_devices(rname, T, |l| !l.is_empty()).await.unwrap();
        let ids: Vec<String> = healthy.iter().take(2).cloned().collect();
        let resp = plugin
            .client
            .clone()
            .allocate(pb::AllocateRequest {
                container_requests: vec![pb::ContainerAllocateRequest { devices_ids: ids.clone() }],
            })
            .await
            .unwrap_or_else(|e| panic!("{name} {rname}: {e}"))
            .into_inner();
        answers.insert(
            rname.to_owned(),
            serde_json::json!({ "ids": ids, "response": response_json(&resp.container_responses[0]) }),
        );
    }
    daemon.stop().await.unwrap();
    serde_json::Value::Object(answers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocate_on_every_fixture_hands_out_the_right_nodes_and_env() {
    for name in MACHINES {
        let dir = tempfile::tempdir().unwrap();
        let expected = discover_json(&fixture(name));
        let answers = allocate_answers(name, daemon_config(dir.path(), &fixture(name)), &expected).await;
        check_golden(name, "allocate", answers);
    }
}

/// The MIG geometry of `dgx-a100-mig`, as `nvidia-smi mig -lgi` would list it.
const A100_PROFILES: &str = "[mig.profiles]\n\
    \"0000:07:00.0\" = { 1 = \"3g.40gb\", 5 = \"2g.20gb\", 13 = \"1g.10gb\", 14 = \"1g.10gb\" }\n\
    \"0000:0f:00.0\" = { 1 = \"3g.40gb\", 2 = \"3g.40gb\" }\n\
    \"0000:47:00.0\" = { 7 = \"1g.10gb\", 8 = \"1g.10gb\", 9 = \"1g.10gb\", 10 = \"1g.10gb\", 11 = \"1g.10gb\", 12 = \"1g.10gb\", 13 = \"1g.10gb\" }\n";

/// The GPU backend's options as NVIDIA's plugin has them (issue 17): (golden file, machine,
/// gpu config). Each gets golden discover and Allocate answers through the kubelet stand-in.
fn gpu_scenarios() -> Vec<(&'static str, &'static str, String)> {
    vec![
        ("gpu-time-slicing", "dgx-h100", "[sharing]\nreplicas = 4\n".into()),
        (
            "gpu-uuid-nvidia-ctk",
            "dgx-h100",
            "device_id_strategy = \"uuid\"\ncdi_device_names = \"nvidia-ctk\"\n".into(),
        ),
        ("gpu-mig-mixed", "dgx-a100-mig", format!("[mig]\nstrategy = \"mixed\"\n{A100_PROFILES}")),
        ("gpu-mig-single", "dgx-a100-mig", format!("[mig]\nstrategy = \"single\"\n{A100_PROFILES}")),
    ]
}

/// A config file giving the gpu backend `gpu` as its config (and the other backends nothing
/// new).
fn gpu_config_file(dir: &Path, gpu: &str) -> PathBuf {
    let file = dir.join("devplug.toml");
    std::fs::write(&file, format!("[backends.gpu]\nconfig = \'\'\'\n{gpu}\'\'\'\n")).unwrap();
    file
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_sharing_mig_and_naming_options_match_their_golden_files() {
    for (golden, machine, gpu) in gpu_scenarios() {
        let dir = tempfile::tempdir().unwrap();
        let file = gpu_config_file(dir.path(), &gpu);
        let out = on_machine(
            &["discover"],
            &fixture(machine),
            &cache_dir(),
            &["--format", "json", "--config", &file.display().to_string()],
        );
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["errors"], serde_json::json!([]), "{golden}");
        let gpu_only = serde_json::json!({ "resources": v["resources"].as_array().unwrap().iter()
            .filter(|r| r["name"].as_str().unwrap().starts_with("nvidia.com/")).cloned().collect::<Vec<_>>() });
        check_golden(golden, "discover", gpu_only["resources"].clone());
        let mut cfg = daemon_config(dir.path(), &fixture(machine));
        cfg.backends.insert("gpu".into(), gpu_settings(&gpu));
        check_golden(golden, "allocate", allocate_answers(golden, cfg, &gpu_only).await);
    }
}

/// MIG `mixed` on the driver's real layout (issue 25): the driver makes `capabilities/gpuN/mig`
/// for every GPU, so a GPU is in MIG mode only when it has GPU instances. GPUs 3–7 of the
/// DGX A100 have the directory and no instance: they are whole GPUs, not gone.
#[test]
fn mig_mixed_on_the_drivers_layout_serves_whole_gpus_beside_their_instances() {
    let m = fixture("dgx-a100-mig");
    for minor in 0..8 {
        assert!(m.join(format!("proc/driver/nvidia/capabilities/gpu{minor}/mig")).is_dir(), "the driver's layout");
    }
    let dir = tempfile::tempdir().unwrap();
    let file = gpu_config_file(dir.path(), &format!("[mig]\nstrategy = \"mixed\"\n{A100_PROFILES}"));
    let out =
        on_machine(&["discover"], &m, &cache_dir(), &["--format", "json", "--config", &file.display().to_string()]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let ids = |name: &str| -> Vec<String> {
        let r = v["resources"].as_array().unwrap().iter().find(|r| r["name"] == name);
        let devices = r.unwrap_or_else(|| panic!("no {name} in {v}"))["devices"].as_array().unwrap().clone();
        devices.iter().map(|d| d["id"].as_str().unwrap().to_owned()).collect()
    };
    assert_eq!(
        ids("nvidia.com/gpu"),
        ["0000:4e:00.0", "0000:87:00.0", "0000:90:00.0", "0000:b7:00.0", "0000:bd:00.0"],
        "the GPUs without instances are served whole"
    );
    assert_eq!(ids("nvidia.com/mig-3g.40gb").len(), 3);
    assert_eq!(ids("nvidia.com/mig-2g.20gb"), ["0000:07:00.0-gi5-ci0"]);
    assert_eq!(ids("nvidia.com/mig-1g.10gb").len(), 9);
}

/// Machine `m` served to a kubelet stand-in in a dir of its own, the gpu backend configured with
/// `gpu`.
async fn serve_with_gpu(m: &Path, gpu: &str) -> (tempfile::TempDir, Kubelet, Daemon) {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::start(dir.path()).await;
    let mut cfg = daemon_config(dir.path(), m);
    cfg.backends.insert("gpu".into(), gpu_settings(gpu));
    (dir, kubelet, Daemon::start(cfg))
}

fn gpu_settings(config: &str) -> devplug::backends::BackendSettings {
    devplug::backends::BackendSettings { config: config.to_owned(), ..Default::default() }
}

/// MIG `single` on a node where every GPU is in MIG mode with one profile: the instances are
/// `nvidia.com/gpu`, each handed out with its parent GPU and its two caps. Then a GPU instance
/// is destroyed (`nvidia-smi mig -dgi`): it leaves the list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mig_single_serves_uniform_instances_as_gpus_and_follows_the_geometry() {
    const GPU: &str = "nvidia.com/gpu";
    let copy = copy_fixture("dgx-a100-mig");
    let m = copy.path().join("m");
    std::fs::remove_dir_all(m.join("proc/driver/nvidia/capabilities")).unwrap();
    let t = Tree::new(&m);
    for minor in 0..8 {
        mig_geometry(&t, minor, &[7, 8, 9, 10, 11, 12, 13]);
    }
    let gpu = "[mig]\nstrategy = \"single\"\n[mig.profiles]\nall = { 7 = \"1g.10gb\", 8 = \"1g.10gb\", 9 = \"1g.10gb\", 10 = \"1g.10gb\", 11 = \"1g.10gb\", 12 = \"1g.10gb\", 13 = \"1g.10gb\" }\n";
    let (_dir, kubelet, daemon) = serve_with_gpu(&m, gpu).await;
    let plugin = kubelet.wait_plugin(GPU, T).await.unwrap();
    let list = kubelet.wait_devices(GPU, T, |l| l.len() == 56).await.unwrap();
    assert!(list.iter().all(|d| d.health == "Healthy"), "{list:?}");
    let req = pb::AllocateRequest {
        container_requests: vec![pb::ContainerAllocateRequest { devices_ids: vec!["0000:90:00.0-gi9-ci0".into()] }],
    };
    let resp = plugin.client.clone().allocate(req).await.unwrap().into_inner();
    let nodes: Vec<&str> = resp.container_responses[0].devices.iter().map(|d| d.container_path.as_str()).collect();
    // GPU 5: gi 9's cap minor is 3 + 5 * 135 + 9 * 9 = 759, its ci0's 760.
    assert_eq!(
        nodes[3..],
        ["/dev/nvidia5", "/dev/nvidia-caps/nvidia-cap759", "/dev/nvidia-caps/nvidia-cap760"],
        "{nodes:?}"
    );
    assert!(resp.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"].ends_with("/9/0"));

    std::fs::remove_dir_all(m.join("proc/driver/nvidia/capabilities/gpu5/mig/gi9")).unwrap();
    // No uevent for a MIG change: the poll notices.
    let list = kubelet.wait_devices(GPU, T, |l| l.len() == 55).await.unwrap();
    assert!(!list.iter().any(|d| d.id == "0000:90:00.0-gi9-ci0"));
    daemon.stop().await.unwrap();
}

/// Time-slicing through kubelet: two replicas of one GPU are that GPU once; with
/// `fail_requests_greater_than_one` the same request is refused with the reason, one replica
/// is fine, and replicas follow their GPU's health.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_of_one_gpu_are_that_gpu_once_or_refused_when_the_operator_says_so() {
    const SHARED: &str = "nvidia.com/gpu.shared";
    let copy = copy_fixture("dgx-h100");
    let m = copy.path().join("m");
    let strict = "[sharing]\nreplicas = 4\nrename_by_default = true\nfail_requests_greater_than_one = true\n";
    let (_dir, kubelet, daemon) = serve_with_gpu(&m, strict).await;
    let plugin = kubelet.wait_plugin(SHARED, T).await.unwrap();
    kubelet.wait_devices(SHARED, T, |l| l.len() == 32).await.unwrap();
    let ask = |ids: &[&str]| pb::AllocateRequest {
        container_requests: vec![pb::ContainerAllocateRequest {
            devices_ids: ids.iter().map(|s| s.to_string()).collect(),
        }],
    };
    let err = plugin.client.clone().allocate(ask(&["0000:2a:00.0::0", "0000:2a:00.0::2"])).await.unwrap_err();
    assert!(
        err.message().contains("fail_requests_greater_than_one") && err.message().contains("asked for 2"),
        "{err:?}"
    );
    let ok = plugin.client.clone().allocate(ask(&["0000:2a:00.0::2"])).await.unwrap().into_inner();
    assert_eq!(ok.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"], "1");

    // Health follows the GPU: all four replicas of a GPU whose driver goes away turn Unhealthy.
    std::fs::remove_file(pci_dir(&m, "0000:2a:00.0").join("driver")).unwrap();
    kubelet
        .wait_devices(SHARED, T, |l| {
            l.iter().filter(|d| d.health == "Unhealthy").map(|d| d.id.as_str()).collect::<Vec<_>>()
                == ["0000:2a:00.0::0", "0000:2a:00.0::1", "0000:2a:00.0::2", "0000:2a:00.0::3"]
        })
        .await
        .unwrap();
    daemon.stop().await.unwrap();
}

/// A writable copy of a fixture (symlinks kept as they are).
fn copy_fixture(name: &str) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    let st = std::process::Command::new("cp").arg("-a").arg(fixture(name)).arg(d.path().join("m")).status().unwrap();
    assert!(st.success());
    d
}

/// A writable copy of fixture `name` (kept alive by the first value; the machine is the second)
/// served by a daemon to a kubelet stand-in in its own dir.
async fn serve_copy(name: &str) -> (tempfile::TempDir, PathBuf, tempfile::TempDir, Kubelet, Daemon) {
    let copy = copy_fixture(name);
    let m = copy.path().join("m");
    let dir = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::start(dir.path()).await;
    let daemon = Daemon::start(daemon_config(dir.path(), &m));
    (copy, m, dir, kubelet, daemon)
}

/// The real directory of a PCI function in a machine copy.
fn pci_dir(machine: &Path, addr: &str) -> PathBuf {
    std::fs::canonicalize(machine.join("sys/bus/pci/devices").join(addr)).unwrap()
}

async fn wait_health(k: &Kubelet, resource: &str, id: &str, health: &str) {
    k.wait_devices(resource, T, |l| l.iter().any(|d| d.id == id && d.health == health))
        .await
        .unwrap_or_else(|e| panic!("{resource} {id} never became {health}: {e}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_flips_reach_kubelet_and_flip_back() {
    // GPU: driver unbound, then fatal AER errors.
    let (copy, m, _dir, kubelet, daemon) = serve_copy("dgx-h100").await;
    const GPU: &str = "nvidia.com/gpu";
    kubelet.wait_devices(GPU, T, |l| l.len() == 8 && l.iter().all(|d| d.health == "Healthy")).await.unwrap();

    let gpu1 = pci_dir(&m, "0000:2a:00.0");
    let target = std::fs::read_link(gpu1.join("driver")).unwrap();
    std::fs::remove_file(gpu1.join("driver")).unwrap();
    wait_health(&kubelet, GPU, "0000:2a:00.0", "Unhealthy").await;
    let list = kubelet.wait_devices(GPU, T, |_| true).await.unwrap();
    assert_eq!(list.iter().filter(|d| d.health == "Unhealthy").count(), 1, "only the unbound GPU: {list:?}");
    std::os::unix::fs::symlink(&target, gpu1.join("driver")).unwrap();
    wait_health(&kubelet, GPU, "0000:2a:00.0", "Healthy").await;

    let gpu0 = pci_dir(&m, "0000:18:00.0").join("aer_dev_fatal");
    let clean = std::fs::read_to_string(&gpu0).unwrap();
    std::fs::write(&gpu0, clean.replace("TOTAL_ERR_FATAL 0", "TOTAL_ERR_FATAL 1").replace("MalfTLP 0", "MalfTLP 1"))
        .unwrap();
    wait_health(&kubelet, GPU, "0000:18:00.0", "Unhealthy").await;
    std::fs::write(&gpu0, clean).unwrap();
    wait_health(&kubelet, GPU, "0000:18:00.0", "Healthy").await;
    daemon.stop().await.unwrap();

    drop(copy);

    // NIC: carrier lost on a VF's link.
    let (_copy, m, _dir, kubelet, daemon) = serve_copy("e810-sriov").await;
    const NET: &str = "devplug.io/sriov_netdev";
    wait_health(&kubelet, NET, "0000:af:01.2", "Healthy").await;
    let carrier = pci_dir(&m, "0000:af:01.2").join("net/ens2f0v2/carrier");
    std::fs::write(&carrier, "0\n").unwrap();
    wait_health(&kubelet, NET, "0000:af:01.2", "Unhealthy").await;
    std::fs::write(&carrier, "1\n").unwrap();
    wait_health(&kubelet, NET, "0000:af:01.2", "Healthy").await;
    daemon.stop().await.unwrap();
}

/// Allocate one GPU through kubelet; the NVIDIA_VISIBLE_DEVICES and device node it got.
async fn allocate_gpu(k: &Kubelet, id: &str) -> (String, String) {
    let plugin = k.plugin("nvidia.com/gpu").await.unwrap();
    let req = pb::AllocateRequest {
        container_requests: vec![pb::ContainerAllocateRequest { devices_ids: vec![id.to_owned()] }],
    };
    let resp = plugin.client.clone().allocate(req).await.unwrap_or_else(|e| panic!("allocate {id}: {e}")).into_inner();
    let c = &resp.container_responses[0];
    // Its own node: `/dev/nvidiaN`, not the shared `nvidiactl`/`nvidia-uvm*`.
    let own = c
        .devices
        .iter()
        .map(|d| d.container_path.clone())
        .find(|p| p.strip_prefix("/dev/nvidia").is_some_and(|n| n.parse::<u32>().is_ok()));
    (c.envs.get("NVIDIA_VISIBLE_DEVICES").cloned().unwrap_or_default(), own.unwrap_or_default())
}

/// A GPU hot-plugged into a running DGX: sysfs function, driver bound, `/dev/nvidiaN`, and (when
/// `minor_from_driver`) the driver's `/proc` information naming its minor.
fn hot_add_gpu(m: &Path, addr: &str, minor: u32, minor_from_driver: bool) {
    let mut t = Tree::new(m);
    // The driver's /proc entry first, as the driver makes it while probing, before the
    // `driver` link appears in sysfs.
    if minor_from_driver {
        t.file(&format!("proc/driver/nvidia/gpus/{addr}/information"), &nvidia_information(addr, minor, 7));
    }
    t.node(&format!("nvidia{minor}"), 195, minor);
    let bus = &addr[5..7];
    t.pci(Func {
        parents: chain(&format!("pci0000:{bus}"), &[&format!("0000:{bus}:01.0")]),
        addr,
        vendor: 0x10de,
        device: 0x2330,
        class: 0x030200,
        numa: 1,
        driver: Some("nvidia"),
    });
}

/// Issue 15's hot-add bug: a GPU that appears after `init` must be allocatable, with the minor
/// the driver gave it, or (without the driver's word) the next free one, not refused as unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_added_while_running_is_listed_and_allocatable() {
    let (_copy, m, _dir, kubelet, daemon) = serve_copy("dgx-h100").await;
    const GPU: &str = "nvidia.com/gpu";
    kubelet.wait_devices(GPU, T, |l| l.len() == 8).await.unwrap();
    assert_eq!(allocate_gpu(&kubelet, "0000:2a:00.0").await, ("1".to_owned(), "/dev/nvidia1".to_owned()));

    // With the driver's /proc information: its minor (12, not the 8 an order would guess).
    hot_add_gpu(&m, "0000:e4:00.0", 12, true);
    kubelet.wait_devices(GPU, T, |l| l.len() == 9 && l.iter().all(|d| d.health == "Healthy")).await.unwrap();
    assert_eq!(allocate_gpu(&kubelet, "0000:e4:00.0").await, ("12".to_owned(), "/dev/nvidia12".to_owned()));

    // Without it: the next free minor, and the node of that minor.
    hot_add_gpu(&m, "0000:f0:00.0", 13, false);
    kubelet.wait_devices(GPU, T, |l| l.len() == 10 && l.iter().all(|d| d.health == "Healthy")).await.unwrap();
    assert_eq!(allocate_gpu(&kubelet, "0000:f0:00.0").await, ("13".to_owned(), "/dev/nvidia13".to_owned()));
    // The GPUs that were there keep their minors.
    assert_eq!(allocate_gpu(&kubelet, "0000:db:00.0").await, ("7".to_owned(), "/dev/nvidia7".to_owned()));
    daemon.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preferred_allocations_on_the_dgx_stay_within_one_numa_node_when_they_can() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::start(dir.path()).await;
    let daemon = Daemon::start(daemon_config(dir.path(), &fixture("dgx-h100")));
    const GPU: &str = "nvidia.com/gpu";
    let plugin = kubelet.wait_plugin(GPU, T).await.unwrap();
    let list = kubelet.wait_devices(GPU, T, |l| l.len() == 8).await.unwrap();
    let numa: BTreeMap<String, i64> =
        list.iter().map(|d| (d.id.clone(), d.topology.as_ref().unwrap().nodes[0].id)).collect();
    let all: Vec<String> = numa.keys().cloned().collect();
    let node1: Vec<String> = all.iter().filter(|id| numa[*id] == 1).cloned().collect();
    let cases: Vec<(Vec<String>, Vec<String>, i32)> = vec![
        (all.clone(), vec![], 1),
        (all.clone(), vec![all[6].clone()], 1),
        (all.clone(), vec![], 2),
        (all.clone(), vec![all[5].clone()], 2),
        (all.clone(), vec![all[0].clone(), all[1].clone()], 4),
        (all.clone(), vec![all[7].clone()], 4),
        // Two GPUs of node 0 already taken: four still fit on node 1 only.
        (all[2..].to_vec(), vec![], 4),
        // Node 1 partly taken: a pair best-fits into what is left there.
        (all[..4].iter().chain(&node1[2..]).cloned().collect(), vec![], 2),
        (all.clone(), vec![all[3].clone()], 8),
    ];
    for (available, must, size) in cases {
        let resp = plugin
            .client
            .clone()
            .get_preferred_allocation(pb::PreferredAllocationRequest {
                container_requests: vec![pb::ContainerPreferredAllocationRequest {
                    available_device_i_ds: available.clone(),
                    must_include_device_i_ds: must.clone(),
                    allocation_size: size,
                }],
            })
            .await
            .unwrap()
            .into_inner();
        let got = &resp.container_responses[0].device_i_ds;
        assert_eq!(got.len(), size as usize, "{got:?}");
        assert!(must.iter().all(|m| got.contains(m)), "{got:?} lacks {must:?}");
        assert!(got.iter().all(|g| available.contains(g)), "{got:?} not all available");
        let nodes: std::collections::BTreeSet<i64> = got.iter().map(|g| numa[g]).collect();
        let fits_one_node = [0, 1].iter().any(|n| {
            available.iter().filter(|a| numa[*a] == *n).count() >= size as usize && must.iter().all(|m| numa[m] == *n)
        });
        if fits_one_node {
            assert_eq!(nodes.len(), 1, "size {size}, must {must:?}: {got:?} spans NUMA nodes {nodes:?}");
        }
        if size == 2 && must.is_empty() && available.len() == 6 {
            assert_eq!(nodes.into_iter().collect::<Vec<_>>(), [1], "best fit keeps node 0's four free: {got:?}");
        }
    }
    daemon.stop().await.unwrap();
}

/// `nvidia.com/gpu` as `discover` finds it on `m` with config `grant` (which must refuse nothing).
fn nvidia_gpus_granted(m: &Path, grant: &str) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("devplug.toml");
    std::fs::write(&file, grant).unwrap();
    let out = on_machine(&["discover"], m, &cache_dir(), &["--format", "json", "--config", file.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["resources"].as_array().unwrap().iter().find(|r| r["name"] == "nvidia.com/gpu").cloned().unwrap_or_default()
}

/// Issue 34: a listing entry the grant hides is a refusal like a refused read (it is why a
/// device goes missing): `discover` names it with the grant that allows it, shows it in its
/// output and exits non-zero; a running devplug logs it once and counts it in `/status`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_entry_the_grant_hides_shows_in_log_status_and_exit_code() {
    let m = fixture("dgx-h100");
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("devplug.toml");
    // The GPU manifest's requests, but only functions on buses 0x1?: the DGX's first GPU.
    std::fs::write(
        &cfg,
        "[backends.gpu.grant]\n\
         sysfs = [\"bus/pci/devices\", \"bus/pci/devices/0000:1*\", \"bus/pci/devices/0000:1*/**\", \"devices/pci*/**\"]\n\
         dev = [\"nvidia*\"]\nprocfs = [\"driver/nvidia/gpus/*/information\"]\n\
         [backends.generic]\nenabled = false\n[backends.nic]\nenabled = false\n[backends.fpga]\nenabled = false\n",
    )
    .unwrap();
    let (cfg_s, cache) = (cfg.display().to_string(), cache_dir().display().to_string());
    let (code, out, err) =
        support::binary::run_on_machine(&["discover"], &m, &cache_dir(), &["--config", &cfg_s, "--format", "json"]);
    assert_ne!(code, 0, "a refusal fails discover: {err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let hidden = "bus/pci/devices/0000:2a:00.0";
    let refused = v["refused"].as_array().unwrap();
    let entry = refused.iter().find(|r| r["path"] == hidden).unwrap_or_else(|| panic!("{hidden} not in {refused:?}"));
    assert_eq!(entry["backend"], "gpu");
    assert_eq!(
        entry["grant"].as_str().unwrap(),
        "[backends.gpu.grant] sysfs = [\"bus/pci/devices/????:??:??.?\"] (or in its manifest's [requests])"
    );
    // Issue 42: the entries one wildcard allows are one piece of advice, not one per entry.
    let same_grant = refused.iter().filter(|r| r["grant"] == entry["grant"]).count();
    assert!(same_grant >= 7, "{refused:?}");
    let advice: Vec<&str> =
        err.lines().filter(|l| l.contains("backend gpu was refused sysfs.list-dir bus/pci/devices/")).collect();
    assert_eq!(advice.len(), 1, "{err}");
    assert!(advice[0].contains(&format!("and {} more the same grant allows", same_grant - 1)), "{err}");
    assert!(advice[0].contains("sysfs = [\"bus/pci/devices/????:??:??.?\"]"), "{err}");
    let gpus = v["resources"].as_array().unwrap().iter().find(|r| r["name"] == "nvidia.com/gpu").unwrap();
    assert_eq!(gpus["devices"].as_array().unwrap().len(), 1, "the grant hides seven of the eight");

    // A running devplug: logged once, counted in /status.
    let kdir = dir.path().join("kubelet");
    std::fs::create_dir_all(&kdir).unwrap();
    let mut args = support::binary::embedded_run_args(&kdir, &m);
    args.extend(["--config".into(), cfg_s.clone(), "--cache-dir".into(), cache.clone()]);
    let mut d = support::binary::Devplug::spawn(&args);
    d.wait_log("serving /healthz, /readyz, /metrics and /status", T).unwrap();
    let log = d.log();
    let line = log.lines().find(|l| l.contains("serving /healthz")).unwrap();
    let addr = line.split("addr=").nth(1).unwrap().split_whitespace().next().unwrap().to_owned();
    d.wait_log(hidden, T).unwrap();
    d.wait_log("backends loaded", T).unwrap();
    let (code, body) = devplug::cli::http_get(&addr, "/status").await.unwrap();
    assert_eq!(code, 200, "{body}");
    let status: serde_json::Value = serde_json::from_str(&body).unwrap();
    let gpu = status["backends"].as_array().unwrap().iter().find(|b| b["name"] == "gpu").unwrap();
    assert!(gpu["stats"]["denied"].as_u64().unwrap() >= 7, "{gpu}");
    assert!(gpu["denied"].as_array().unwrap().iter().any(|x| x["path"] == hidden), "{gpu}");
    assert_eq!(d.log().matches(&format!("path={hidden} ")).count(), 1, "logged once, however often it polls");
    assert!(d.terminate(T).unwrap().success());
}

/// Issue 34: requests learned on a machine whose GPUs sit on root ports are written for any
/// depth of bridges (`devices/pci*/**`, never a fixed `devices/*/*/*`), so they serve the DGX,
/// whose GPUs sit behind PCIe switches: the same devices, attributes and edits as with
/// everything granted. They also carry the nodes discover hands out and the manifest's uevents.
#[test]
fn requests_learned_without_switches_serve_a_machine_with_them() {
    let root = tempfile::tempdir().unwrap();
    let flat = root.path().join("flat");
    support::hardware::build_flat_h100(&flat);
    let learned = on_machine(&["discover", "--learn-requests", "gpu"], &flat, &cache_dir(), &[]);
    assert!(learned.contains("\"devices/pci*/**"), "{learned}");
    assert!(!learned.contains("\"devices/*/*"), "no pattern fixed to this machine's depth: {learned}");
    assert!(learned.contains("\"nvidia[0-9]*\""), "the nodes discover hands out: {learned}");
    assert!(learned.contains("uevents = [") && learned.contains("\"pci\""), "the manifest's uevents: {learned}");
    let m = fixture("dgx-h100");
    let gpus = |grant: &str| nvidia_gpus_granted(&m, grant);
    let full = gpus("");
    assert_eq!(full["devices"].as_array().unwrap().len(), 8, "{full}");
    assert!(full.to_string().contains("pcie-switch"), "the DGX's GPUs are behind switches: {full}");
    let with_learned = gpus(&learned.replace("[requests]", "[backends.gpu.grant]"));
    assert_eq!(with_learned, full, "requests learned on the flat machine see less on the DGX");
}

/// The AMD GPUs discover finds on `m` with `grant` as the whole config, and what it refused of
/// what `m` has (a refused look at a node `m` lacks, `nvidiactl` on an AMD box, lost nothing).
fn amd_gpus_granted(m: &Path, grant: &str) -> (serde_json::Value, serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("devplug.toml");
    std::fs::write(&file, grant).unwrap();
    let (_, out, _) = support::binary::run_on_machine(
        &["discover"],
        m,
        &cache_dir(),
        &["--format", "json", "--config", file.to_str().unwrap()],
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let amd =
        v["resources"].as_array().unwrap().iter().find(|r| r["name"] == "amd.com/gpu").cloned().unwrap_or_default();
    let here: Vec<serde_json::Value> =
        v["refused"].as_array().unwrap().iter().filter(|r| r["present"] != false).cloned().collect();
    (amd, serde_json::Value::Array(here))
}

/// Issue 42: requests learned on MI300Xs in SPX (KFD topology nodes 0–9, render minors 128,
/// 136, …) serve the same box in CPX (nodes 0–65, 64 partitions on renderD128–191): numbered
/// directories, minors and partition devices are learned as wildcards. `--merge` adds what was
/// learned before, each pattern once.
#[test]
fn requests_learned_in_one_partition_mode_serve_the_others() {
    let spx = fixture("amd-mi300x");
    let cpx = fixture("amd-mi300x-cpx");
    let learned = on_machine(&["discover", "--learn-requests", "gpu"], &spx, &cache_dir(), &[]);
    assert!(learned.contains("\"class/kfd/kfd/topology/nodes/[0-9]*/properties\""), "{learned}");
    assert!(!learned.contains("nodes/9"), "no node learned one by one: {learned}");
    assert!(learned.contains("\"dri/renderD[0-9]*\""), "{learned}");
    let grant = learned.replace("[requests]", "[backends.gpu.grant]");
    let (full, _) = amd_gpus_granted(&cpx, "");
    let devices = full["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 64, "8 GPUs × 8 CPX partitions: {full}");
    let (with_learned, refused) = amd_gpus_granted(&cpx, &grant);
    assert_eq!(refused, serde_json::json!([]), "learned in SPX, nothing refused in CPX");
    assert_eq!(with_learned, full, "requests learned in SPX see less in CPX");
    assert!(devices.iter().all(|d| d["health"] == "Healthy"), "{full}");

    // Merged: what CPX learns and what SPX learned, each pattern once, valid TOML.
    let dir = tempfile::tempdir().unwrap();
    let before = dir.path().join("spx.toml");
    std::fs::write(&before, &learned).unwrap();
    let merged = on_machine(
        &["discover", "--learn-requests", "gpu", "--merge", before.to_str().unwrap()],
        &cpx,
        &cache_dir(),
        &[],
    );
    let doc: toml::Table = toml::from_str(&merged).unwrap();
    let sysfs: Vec<&str> = doc["requests"]["sysfs"].as_array().unwrap().iter().map(|p| p.as_str().unwrap()).collect();
    let mut unique = sysfs.clone();
    unique.dedup();
    assert_eq!(unique.len(), sysfs.len(), "{merged}");
    assert!(merged.contains("learned before"), "{merged}");
    let (merged_sees, refused) = amd_gpus_granted(&spx, &merged.replace("[requests]", "[backends.gpu.grant]"));
    assert_eq!(refused, serde_json::json!([]), "{merged}");
    assert_eq!(merged_sees, amd_gpus_granted(&spx, "").0);
    // A file that is not a manifest is refused before the backend runs, naming the file.
    std::fs::write(&before, "sysfs = []").unwrap();
    let (code, _, err) = support::binary::run_on_machine(
        &["discover", "--learn-requests", "gpu", "--merge", before.to_str().unwrap()],
        &cpx,
        &cache_dir(),
        &[],
    );
    assert_ne!(code, 0);
    assert!(err.contains("spx.toml") && err.contains("no [requests]"), "{err}");
}

/// `devplug discover --learn-requests` (issue 28): the requests it learns for the gpu backend
/// on the DGX H100 are enough — granted exactly those, the backend discovers the same devices,
/// attributes and nodes as with its full manifest — and needed: granted nothing, it finds none.
#[test]
fn learned_requests_are_enough_and_needed() {
    let m = fixture("dgx-h100");
    let learned = on_machine(&["discover", "--learn-requests", "gpu"], &m, &cache_dir(), &[]);
    assert!(learned.contains("\"bus/pci/devices/????:??:??.?/vendor\","), "{learned}");
    assert!(learned.contains("\"driver/nvidia/gpus/????:??:??.?/information\","), "{learned}");
    let gpus = |grant: &str| nvidia_gpus_granted(&m, grant);
    let full = gpus("");
    assert_eq!(full["devices"].as_array().unwrap().len(), 8, "{full}");
    let with_learned = gpus(&learned.replace("[requests]", "[backends.gpu.grant]"));
    assert_eq!(with_learned, full, "the learned requests change what the backend sees");
    // Without them it finds nothing, and says what it was refused (issue 34: exit non-zero).
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("devplug.toml");
    std::fs::write(&file, "[backends.gpu.grant]\n").unwrap();
    let (code, out, _) = support::binary::run_on_machine(
        &["discover"],
        &m,
        &cache_dir(),
        &["--config", file.to_str().unwrap(), "--format", "json"],
    );
    assert_ne!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let none =
        v["resources"].as_array().unwrap().iter().find(|r| r["name"] == "nvidia.com/gpu").cloned().unwrap_or_default();
    assert!(none["devices"].as_array().is_none_or(|d| d.is_empty()), "without them it finds nothing: {none}");
    assert!(v["refused"].as_array().unwrap().iter().any(|r| r["path"] == "bus/pci/devices"), "{v}");
}
