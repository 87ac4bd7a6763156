//! Hot-swapping backends in a running `devplug run`: new versions arriving every way files really
//! arrive, under steady Allocate load, with no failed or wrong answer; broken new versions that
//! never displace a working one; a removed backend's resource retired and restored.

use devplug_test_support as support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use support::binary::{Devplug, run_args};
use support::daemon::{WIDGET, chaos_build as build, chaos_manifest as manifest, chaos_paths};
use support::fixtures::Machine;
use support::kubelet::Kubelet;
use support::load::{alloc, start_load};

const T: Duration = Duration::from_secs(30);

/// The component with its `devplug:backend` WIT version rewritten to 9.3.0: a backend built
/// against a WIT version this host does not know.
fn wrong_wit() -> Vec<u8> {
    support::wasm::with_wit_version(std::fs::read(chaos_paths().0).unwrap(), "0.3.0", "9.3.0")
}

/// How a new version lands in the directory.
#[derive(Clone, Copy, Debug)]
enum Arrival {
    /// Truncate and write the existing files, in two chunks.
    InPlace,
    /// Write hidden temp files, rename them over.
    Rename,
    /// `cp` from elsewhere (truncate + write through the existing name).
    Copy,
    /// Delete, then create.
    DeleteCreate,
    /// A ConfigMap volume update: a new timestamped dir, `..data` swapped to it by rename.
    ConfigMap,
}

const ARRIVALS: [Arrival; 5] =
    [Arrival::InPlace, Arrival::Rename, Arrival::Copy, Arrival::DeleteCreate, Arrival::ConfigMap];

fn land(dir: &Path, how: Arrival, wasm: &[u8], toml: &str, k: u32) {
    use std::io::Write;
    let files = [("chaos.toml", toml.as_bytes()), ("chaos.wasm", wasm)];
    match how {
        Arrival::InPlace => {
            for (name, bytes) in files {
                let mut f =
                    std::fs::OpenOptions::new().write(true).create(true).truncate(true).open(dir.join(name)).unwrap();
                let half = bytes.len() / 2;
                f.write_all(&bytes[..half]).unwrap();
                f.flush().unwrap();
                f.write_all(&bytes[half..]).unwrap();
            }
        }
        Arrival::Rename => {
            // Both written first, then renamed back to back, as a deploy tool would.
            for (name, bytes) in files {
                std::fs::write(dir.join(format!(".{name}.tmp")), bytes).unwrap();
            }
            for (name, _) in files {
                std::fs::rename(dir.join(format!(".{name}.tmp")), dir.join(name)).unwrap();
            }
        }
        Arrival::Copy => {
            let staging = tempfile::tempdir().unwrap();
            for (name, bytes) in files {
                std::fs::write(staging.path().join(name), bytes).unwrap();
                std::fs::copy(staging.path().join(name), dir.join(name)).unwrap();
            }
        }
        Arrival::DeleteCreate => {
            for (name, bytes) in files {
                let _ = std::fs::remove_file(dir.join(name));
                std::fs::write(dir.join(name), bytes).unwrap();
            }
        }
        Arrival::ConfigMap => {
            let ts = format!("..2026_11_22_{k:02}");
            std::fs::create_dir(dir.join(&ts)).unwrap();
            for (name, bytes) in files {
                std::fs::write(dir.join(&ts).join(name), bytes).unwrap();
            }
            let tmp = dir.join("..data_tmp");
            std::os::unix::fs::symlink(&ts, &tmp).unwrap();
            std::fs::rename(&tmp, dir.join("..data")).unwrap();
            for (name, _) in files {
                let link = dir.join(name);
                let target = PathBuf::from("..data").join(name);
                if std::fs::read_link(&link).ok() != Some(target.clone()) {
                    let tmp = dir.join(format!("{name}.lnk"));
                    std::os::unix::fs::symlink(&target, &tmp).unwrap();
                    std::fs::rename(&tmp, &link).unwrap();
                }
            }
            // Kubelet removes the old timestamped dirs after the swap.
            for e in std::fs::read_dir(dir).unwrap().flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if n.starts_with("..2026") && n != ts {
                    std::fs::remove_dir_all(e.path()).unwrap();
                }
            }
        }
    }
}

/// `devplug run` on `backends`, with its log collected.
fn spawn(kubelet_dir: &Path, backends: &Path, m: &Machine, cache: &Path, extra_config: &str) -> Devplug {
    let cfg = backends.parent().unwrap().join(format!("devplug-{}.toml", std::process::id()));
    std::fs::write(&cfg, format!("[limits]\ndiscover_timeout = \"500ms\"\n{extra_config}")).unwrap();
    let mut args = run_args(kubelet_dir, backends, m);
    let s = |p: &Path| p.display().to_string();
    args.extend(["--config".into(), s(&cfg), "--poll-interval".into(), "1s".into(), "--cache-dir".into(), s(cache)]);
    Devplug::spawn(&args)
}

/// A temp root with a kubelet dir, an empty backends dir and a compile cache dir.
fn dirs() -> (tempfile::TempDir, PathBuf, PathBuf, PathBuf) {
    let root = tempfile::tempdir().unwrap();
    let (kdir, backends, cache) = (root.path().join("k"), root.path().join("backends"), root.path().join("cache"));
    std::fs::create_dir_all(&backends).unwrap();
    (root, kdir, backends, cache)
}

fn patch(v: &str) -> u32 {
    v.rsplit('.').next().and_then(|p| p.parse().ok()).unwrap_or(u32::MAX)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_swaps_under_allocate_load_every_arrival_pattern_no_failed_answer() {
    let (_root, kdir, backends, cache) = dirs();
    let m = Machine::generic_box();
    land(&backends, Arrival::Rename, &build(0), &manifest(0, "ok"), 0);
    let kubelet = Kubelet::start(&kdir).await;
    let d = spawn(&kdir, &backends, &m, &cache, "");
    let plugin = kubelet.wait_registered(WIDGET, 1, T).await.unwrap();
    kubelet.wait_devices(WIDGET, T, |l| l.len() == 4).await.unwrap();

    let load = start_load(&plugin);
    let started = Instant::now();
    let mut took: BTreeMap<String, Vec<Duration>> = BTreeMap::new();
    for k in 1..=20u32 {
        let how = ARRIVALS[(k as usize - 1) % ARRIVALS.len()];
        let t0 = Instant::now();
        land(&backends, how, &build(k), &manifest(k, "ok"), k);
        // The stream shows the new version's list: 4 + k devices.
        let want = 4 + k as usize;
        kubelet
            .wait_devices(WIDGET, T, |l| l.len() == want)
            .await
            .unwrap_or_else(|e| panic!("swap {k} ({how:?}): {e}\n{}", d.log()));
        took.entry(format!("{how:?}")).or_default().push(t0.elapsed());
    }
    // The last version serves the load before it stops.
    let deadline = Instant::now() + T;
    let mut last = String::new();
    while Instant::now() < deadline {
        let r = plugin.client.clone().allocate(alloc("widget-0")).await.unwrap();
        last = r.get_ref().container_responses[0].envs["CHAOS_VERSION"].clone();
        if last == "1.0.20" {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(last, "1.0.20");
    load.stop.store(true, Ordering::Relaxed);
    let elapsed = started.elapsed();
    for t in load.tasks {
        let versions = t.await.unwrap().unwrap_or_else(|e| panic!("{e}\n{}", d.log()));
        let patches: Vec<u32> = versions.iter().map(|v| patch(v)).collect();
        assert!(patches.windows(2).all(|w| w[0] < w[1]), "versions went backwards: {versions:?}");
    }
    let calls = load.calls.load(Ordering::Relaxed);
    let rate = calls as f64 / elapsed.as_secs_f64();
    assert!(rate >= 200.0, "the load was only {rate:.0} Allocate/s; the test needs ≥ 200 to mean anything");
    assert_eq!(kubelet.registrations(), 1, "no swap re-registers the resource:\n{}", d.log());
    for (how, ts) in &took {
        eprintln!("{how}: landing → new list on the stream {ts:?}");
    }
    eprintln!("{calls} Allocate calls ({rate:.0}/s), none failed or wrong, across 20 swaps");
}

/// Land a bad version, wait for the log line about it, and check the old one still serves.
async fn refused(
    d: &Devplug,
    plugin: &support::kubelet::Plugin,
    kubelet: &Kubelet,
    backends: &Path,
    wasm: &[u8],
    toml: &str,
    why: &str,
) {
    let before = d.log().matches("backend refused").count();
    land(backends, Arrival::Rename, wasm, toml, 0);
    let deadline = Instant::now() + T;
    // A version lands as two renames (manifest, then component). If the watcher reconciles
    // between them, the pair in between (new manifest, previous component) is a version of its
    // own and is refused too: look for this landing's reason among the new refusals.
    let fresh = loop {
        let log = d.log();
        let lines: Vec<&str> = log.lines().filter(|l| l.contains("backend refused")).collect();
        if let Some(line) = lines.iter().skip(before).find(|l| l.contains(why)) {
            break (*line).to_owned();
        }
        assert!(Instant::now() < deadline, "no refusal logged for {why}:\n{log}");
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(fresh.contains("chaos.wasm"), "the log names the file: {fresh}");
    assert!(fresh.contains(why), "the log says why ({why}): {fresh}");
    assert!(fresh.contains("the old version keeps serving"), "{fresh}");
    let r = plugin.client.clone().allocate(alloc("widget-1")).await.unwrap();
    assert_eq!(r.get_ref().container_responses[0].envs["CHAOS_VERSION"], "1.0.1", "after {why}");
    let list = kubelet.wait_devices(WIDGET, T, |l| l.len() == 5).await.unwrap();
    assert!(list.iter().all(|dev| dev.health == "Healthy"), "after {why}: {list:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_new_versions_never_displace_the_working_one_and_removal_retires_the_resource() {
    let (_root, kdir, backends, cache) = dirs();
    let m = Machine::generic_box();
    let (good, good_toml) = (build(1), manifest(1, "ok"));
    land(&backends, Arrival::Rename, &good, &good_toml, 1);
    let kubelet = Kubelet::start(&kdir).await;
    let d = spawn(&kdir, &backends, &m, &cache, "");
    let plugin = kubelet.wait_registered(WIDGET, 1, T).await.unwrap();
    kubelet.wait_devices(WIDGET, T, |l| l.len() == 5).await.unwrap();

    refused(&d, &plugin, &kubelet, &backends, &good[..good.len() / 2], &good_toml, "truncated").await;
    refused(&d, &plugin, &kubelet, &backends, b"MZ\x90\x00 certainly not wasm", &good_toml, "not a Wasm file").await;
    refused(&d, &plugin, &kubelet, &backends, &wrong_wit(), &good_toml, "devplug:backend@9.3.0").await;
    refused(&d, &plugin, &kubelet, &backends, &build(2), &manifest(2, "trap-init"), "init failed").await;
    refused(
        &d,
        &plugin,
        &kubelet,
        &backends,
        &build(3),
        &manifest(3, "spin-discover"),
        "discover of the new version failed",
    )
    .await;
    // Each bad version was tried once: one log line each, not one per event or poll (at most
    // one more per landing, for the pair in between two renames).
    let refusals = d.log().matches("backend refused").count();
    assert!((5..=9).contains(&refusals), "{refusals} refusals:\n{}", d.log());
    assert_eq!(kubelet.registrations(), 1);

    // A file deleted and written again, however long after the watch saw it go (within the
    // removal grace), is a change: the backend serves on, no re-registration, no empty list.
    let socket = kdir.join("devplug-test.devplug.io_widget.sock");
    assert!(socket.exists());
    let wasm = std::fs::read(backends.join("chaos.wasm")).unwrap();
    let gone_before = d.log().matches("backend's source went").count();
    std::fs::remove_file(backends.join("chaos.wasm")).unwrap();
    let deadline = Instant::now() + T;
    while d.log().matches("backend's source went").count() == gone_before {
        assert!(Instant::now() < deadline, "the deletion was not seen:\n{}", d.log());
        tokio::task::yield_now().await;
    }
    std::fs::write(backends.join("chaos.wasm"), &wasm).unwrap();
    assert!(!d.log().contains("backend removed from the directory: unloaded"), "{}", d.log());
    assert!(!kubelet.plugin(WIDGET).await.unwrap().devices.borrow().is_empty());
    assert_eq!(kubelet.registrations(), 1, "no re-registration:\n{}", d.log());

    // Removing the backend: kubelet gets an empty list, then the socket goes.
    let mut stream = kubelet.plugin(WIDGET).await.unwrap().devices;
    std::fs::remove_file(backends.join("chaos.wasm")).unwrap();
    let emptied = tokio::time::timeout(T, async {
        loop {
            if stream.borrow_and_update().is_empty() {
                return;
            }
            if stream.changed().await.is_err() {
                return;
            }
        }
    })
    .await;
    assert!(emptied.is_ok(), "no empty list before the resource went away");
    assert!(stream.borrow().is_empty(), "the last list kubelet saw is empty: {:?}", stream.borrow());
    let deadline = Instant::now() + T;
    while socket.exists() {
        assert!(Instant::now() < deadline, "socket still there:\n{}", d.log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Only this removal unloaded it: the delete-and-write above never did, even after its grace.
    assert_eq!(d.log().matches("backend removed from the directory: unloaded").count(), 1, "{}", d.log());
    assert_eq!(kubelet.registrations(), 1);
    // Restoring it serves and registers again.
    land(&backends, Arrival::Rename, &good, &good_toml, 1);
    kubelet.wait_registered(WIDGET, 2, T).await.unwrap();
    kubelet.wait_devices(WIDGET, T, |l| l.len() == 5).await.unwrap();
    assert!(socket.exists());
}
