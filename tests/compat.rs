//! WIT compatibility on real components: the frozen contracts never change, and a backend built
//! against `devplug:backend@0.1.0` (`tests/compat/v0.1.0.wasm`, compiled once and checked in)
//! keeps serving kubelet in this host, as does a 0.1.x patch release of it. The file formats of
//! each release (`tests/compat/config-0.1.0.toml`, `manifest-0.1.0.toml`) keep loading, and what
//! changed since is said with what to do (docs/compatibility.md).

use devplug_test_support as support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use devplug_standins::proto::deviceplugin as pb;
use sha2::{Digest, Sha256};
use support::binary::{Devplug, discover_backend, run, run_args};
use support::fixtures::Machine;
use support::kubelet::Kubelet;

const T: Duration = Duration::from_secs(60);
const RESOURCE: &str = "compat.devplug.io/widget";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_owned()
}

/// sha256 of every file of each frozen contract, as released. A change to a frozen folder breaks
/// every backend built against it: make a new `since_vX.Y.Z` folder instead.
const FROZEN: &[(&str, &[(&str, &str)])] = &[
    (
        "since_v0.1.0",
        &[
            ("backend.wit", "613d3e2d46abb2c5ebd0e40f559a849fca0366ad4e1ce21ab211677e1feef3b2"),
            ("host.wit", "d72cb28745e93f2a7ec8cc3b127df3d6196172c3d9b7b27b8e82a8baf2377a65"),
            ("types.wit", "7e51c802eee9211c94724b9c7913966b325f6490c540779c1cd750335c499ede"),
        ],
    ),
    (
        "since_v0.2.0",
        &[
            ("backend.wit", "ace51cef970857e3074e5efe5a069a82b1290fc21c13d27dd1f6c1810b868ad0"),
            ("host.wit", "567fc319a2f6142f94aa855d600366658dc64ef4b33bfc05aa3b911aecb09da4"),
            ("types.wit", "8547cce50ab56ad49bb7f7719f49c41af6f2bcc103912030ec6599cc84b8a514"),
        ],
    ),
    (
        "since_v0.3.0",
        &[
            ("backend.wit", "22349dac458000e2e01db5daac44bff9e46f662cf8da6673a67b205d248e79af"),
            ("dra.wit", "efe96ff4e5e17f627886310962bb894a52eb06bbd58f689d517a2d41747969db"),
            ("host.wit", "3f6aab6c14e2258bb251a1fd7a5627fecfa9cdafe43470aa6d2621a068a771c1"),
            ("types.wit", "47360b67290296443cbfe7fe1aedd1812b413cfe3156e798debcabf8c97f848b"),
        ],
    ),
];

#[test]
fn frozen_wit_folders_never_change() {
    for (folder, files) in FROZEN {
        let dir = repo().join("wit").join(folder);
        let mut present: Vec<String> =
            std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        present.sort();
        let expected: Vec<&str> = files.iter().map(|(f, _)| *f).collect();
        assert_eq!(present, expected, "{folder}: files added or removed");
        for (file, sha) in *files {
            let got = hex::encode(Sha256::digest(std::fs::read(dir.join(file)).unwrap()));
            assert_eq!(&got, sha, "wit/{folder}/{file} changed; frozen contracts never change (add a new version)");
        }
    }
}

/// Every `wit/since_v*` folder is listed as frozen above and is a version the host loads.
#[test]
fn every_wit_folder_is_frozen_and_loaded() {
    for e in std::fs::read_dir(repo().join("wit")).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(version) = name.strip_prefix("since_v") else { continue };
        assert!(FROZEN.iter().any(|(f, _)| *f == name), "{name} has no frozen hashes in tests/compat.rs");
        for f in std::fs::read_dir(e.path()).unwrap().flatten() {
            let text = std::fs::read_to_string(f.path()).unwrap();
            assert!(
                text.contains(&format!("package devplug:backend@{version};")),
                "{} must declare package devplug:backend@{version}",
                f.path().display()
            );
        }
        assert!(devplug::runtime::bindings::SUPPORTED.contains(&version), "WIT {version} is frozen but not loaded");
    }
}

/// A machine with one PCI function and two widget nodes, what the compat backend looks at.
fn machine() -> Machine {
    let m = Machine::new();
    m.pci("0000:00:00.0", "0000:00:01.0", &[("vendor", "0x1af4")])
        .link("sys/devices/pci0000:00/0000:00:00.0/0000:00:01.0/driver", "../../../../bus/pci/drivers/virtio-pci")
        .node("widget0", 'c', 240, 0)
        .node("widget1", 'c', 240, 1);
    m
}

/// The checked-in component (or a rewrite of it) as `compat.wasm` with its manifest.
fn backends_dir(bytes: &[u8]) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("compat.wasm"), bytes).unwrap();
    std::fs::write(
        d.path().join("compat.toml"),
        "name = \"compat\"\n[requests]\nsysfs = [\"bus/pci/devices/0000:00:01.0\", \"bus/pci/devices/0000:00:01.0/*\", \"devices/**\"]\ndev = [\"widget*\"]\nresources = [\"compat.devplug.io/*\"]\nenv = [\"COMPAT_*\"]\n",
    )
    .unwrap();
    d
}

fn compat_bytes() -> Vec<u8> {
    std::fs::read(repo().join("tests/compat/v0.1.0.wasm")).unwrap()
}

fn discover(bytes: &[u8]) -> serde_json::Value {
    let (m, dir, cache) = (machine(), backends_dir(bytes), tempfile::tempdir().unwrap());
    let (code, out, err) = discover_backend(&dir.path().join("compat.wasm"), &m, cache.path());
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {err}"));
    // The compat backends probe a procfs path their manifest does not ask for: a refusal, which
    // `discover` reports (and exits non-zero for), never an error.
    assert!(v["errors"].as_array().is_some_and(Vec::is_empty), "{err}");
    assert!(code == 0 || !v["refused"].as_array().is_none_or(Vec::is_empty), "{err}");
    v
}

#[test]
fn a_0_1_0_backend_discovers_through_every_0_1_0_import() {
    let v = discover(&compat_bytes());
    assert_eq!(v["backends"][0]["wit_version"], "0.1.0", "{v}");
    let devices = v["resources"][0]["devices"].as_array().unwrap();
    let ids: Vec<&str> = devices.iter().map(|d| d["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["widget0", "widget1"]);
    let a = &devices[1]["attributes"];
    // sysfs.read, list-dir, read-link, canonical and devfs.stat/glob all answered.
    assert_eq!(a["vendor"], "0x1af4", "{a}");
    assert_eq!(a["entries"], "2", "{a}");
    assert_eq!(a["driver"], "virtio-pci", "{a}");
    assert_eq!(a["real"], "devices/pci0000:00/0000:00:00.0/0000:00:01.0", "{a}");
    assert_eq!(a["node"], "240:1", "{a}");
}

/// The checked-in 0.2.0 component (built once against the frozen 0.2.0 contract) discovers
/// through every 0.1.0 import and what 0.2.0 added, in this host, and is served by the 0.2.0
/// bindings (not the newest).
#[test]
fn a_0_2_0_backend_discovers_through_the_0_2_0_imports() {
    let v = discover(&std::fs::read(repo().join("tests/compat/v0.2.0.wasm")).unwrap());
    assert_eq!(v["backends"][0]["wit_version"], "0.2.0", "{v}");
    let devices = v["resources"][0]["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 2, "{v}");
    let a = &devices[1]["attributes"];
    assert_eq!(a["vendor"], "0x1af4", "{a}");
    assert_eq!(a["batched"], "1", "read-many answered each path (the function has no `device` file): {a}");
    assert_eq!(a["node"], "240:1", "{a}");
}

#[test]
fn a_0_1_patch_release_is_served_by_the_0_1_0_bindings() {
    let v = discover(&support::wasm::with_wit_version(compat_bytes(), "0.1.0", "0.1.9"));
    assert_eq!(v["backends"][0]["wit_version"], "0.1.0", "{v}");
    assert_eq!(v["resources"][0]["devices"].as_array().unwrap().len(), 2, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_0_1_0_backend_serves_kubelet_in_this_host() {
    let (m, dir) = (machine(), backends_dir(&compat_bytes()));
    let kdir = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::start(kdir.path()).await;
    let d = Devplug::spawn(&run_args(kdir.path(), dir.path(), &m));
    let list = kubelet.wait_devices(RESOURCE, T, |l| l.len() == 2).await.unwrap_or_else(|e| panic!("{e}\n{}", d.log()));
    assert!(list.iter().all(|dev| dev.health == "Healthy"), "{list:?}");
    let plugin = kubelet.plugin(RESOURCE).await.unwrap();
    assert!(plugin.options.get_preferred_allocation_available);
    let preferred = plugin
        .client
        .clone()
        .get_preferred_allocation(pb::PreferredAllocationRequest {
            container_requests: vec![pb::ContainerPreferredAllocationRequest {
                available_device_i_ds: vec!["widget0".into(), "widget1".into()],
                must_include_device_i_ds: vec![],
                allocation_size: 1,
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(preferred.container_responses[0].device_i_ds, ["widget1"], "the backend's own choice");
    let resp = plugin
        .client
        .clone()
        .allocate(pb::AllocateRequest {
            container_requests: vec![pb::ContainerAllocateRequest { devices_ids: vec!["widget1".into()] }],
        })
        .await
        .unwrap()
        .into_inner();
    let c = &resp.container_responses[0];
    assert_eq!(c.envs.get("COMPAT_WIDGETS").map(String::as_str), Some("widget1"), "{c:?}");
    assert_eq!(c.devices[0].container_path, "/dev/widget1", "{c:?}");
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

/// `devplug discover` with `extra` arguments on fixture machine `m`: (resources, stderr, whether
/// every backend loaded and answered).
fn discover_with(m: &Machine, extra: &[&str]) -> (serde_json::Value, String, bool) {
    let cache = tempfile::tempdir().unwrap();
    let mut args = vec!["discover", "--format", "json", "--dev-fixtures"];
    let (sys, dev, proc, cache) = (s(&m.sys()), s(&m.dev()), s(&m.root().join("proc")), s(cache.path()));
    args.extend(["--sysfs-root", &sys, "--dev-root", &dev, "--proc-root", &proc, "--cache-dir", &cache]);
    args.extend(extra);
    let (code, out, err) = run(&args);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}\n{err}"));
    (v["resources"].clone(), err, code == 0)
}

fn devices_of<'a>(resources: &'a serde_json::Value, name: &str) -> Vec<&'a str> {
    let r = resources.as_array().unwrap().iter().find(|r| r["name"] == name);
    r.map(|r| r["devices"].as_array().unwrap().iter().map(|d| d["id"].as_str().unwrap()).collect()).unwrap_or_default()
}

/// A 0.1.0 config narrowed the embedded generic backend with `grant = { dev = ["kvm"] }`, when a
/// grant had no `resources`. It still parses, and the backend still serves its resource (an
/// embedded backend's names default to what its manifest requests), with a WARN saying how to
/// choose them.
#[test]
fn a_0_1_0_config_still_loads_and_its_grants_still_serve() {
    let file = repo().join("tests/compat/config-0.1.0.toml");
    let cfg = devplug::config::Config::from_file(&file).unwrap();
    assert_eq!(cfg.poll_interval, Duration::from_secs(5));
    assert!(cfg.backends["generic"].grant_resources_unstated);
    let m = Machine::generic_box();
    let (resources, err, ok) = discover_with(&m, &["--config", &s(&file)]);
    assert!(ok, "{err}");
    assert_eq!(devices_of(&resources, "devplug.io/kvm"), ["kvm"], "{resources}\n{err}");
    assert!(err.contains("has no `resources`") && err.contains("add `resources = [...]`"), "{err}");
}

/// The compat backend with its manifest as 0.1.0 wrote it (no `[requests] resources`): it loads,
/// the WARN names the missing key and the line to add, `devplug inspect` says the same, and it
/// serves the names the operator grants explicitly, and none without.
#[test]
fn a_0_1_0_manifest_loads_and_says_what_to_add() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = dir.path().join("compat.wasm");
    std::fs::write(&wasm, compat_bytes()).unwrap();
    std::fs::copy(repo().join("tests/compat/manifest-0.1.0.toml"), dir.path().join("compat.toml")).unwrap();
    let m = machine();
    let line = "resources = [\"<your-domain>/*\"]";

    let (resources, err, ok) = discover_with(&m, &["--backend", &s(&wasm)]);
    assert_eq!(devices_of(&resources, RESOURCE), Vec::<&str>::new(), "no name requested, none granted: {resources}");
    assert!(err.contains("has no `resources` under [requests]") && err.contains(line), "{err}");
    assert!(
        !ok && err.contains("does not request it ([requests] resources)"),
        "the refusal is an error, and says why: {err}"
    );

    let config = dir.path().join("devplug.toml");
    std::fs::write(
        &config,
        "[backends.compat]\ngrant = { sysfs = [\"**\"], dev = [\"widget*\"], resources = [\"compat.devplug.io/*\"] }\n",
    )
    .unwrap();
    let (resources, err, ok) = discover_with(&m, &["--backend", &s(&wasm), "--config", &s(&config)]);
    assert!(ok, "{err}");
    assert_eq!(devices_of(&resources, RESOURCE), ["widget0", "widget1"], "the operator's grant serves: {resources}");

    let (code, out, err) = run(&["inspect", &s(&wasm), "--format", "json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["warnings"][0].as_str().unwrap().contains(line), "{v}");
}
