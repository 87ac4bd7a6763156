//! Kernel uevents, for real: writing `change` to a real device's `uevent` file in this machine's
//! `/sys` makes the kernel emit a real uevent; devplug must run the discover of the backend
//! subscribed to that subsystem at once (its poll is an hour away), and only of that backend.
//! Link changes, which are no uevents, arrive through rtnetlink: devplug in a network namespace of
//! its own sees its loopback interface go up and down.

use devplug_test_support as support;

use std::path::Path;
use std::time::{Duration, Instant};

use support::binary::{Devplug, run_args};
use support::daemon::chaos_paths;
use support::fixtures::Machine;
use support::kubelet::Kubelet;

const T: Duration = Duration::from_secs(30);
/// The loopback interface: in every network namespace, and harmless to announce again.
const LO_UEVENT: &str = "/sys/devices/virtual/net/lo/uevent";

/// `NAME.wasm` (chaos in churn mode: every discover changes the list) serving `resource`, with
/// `extra` manifest lines.
fn churner(dir: &Path, name: &str, resource: &str, extra: &str) {
    let (wasm, manifest) = chaos_paths();
    let requests = std::fs::read_to_string(manifest).unwrap().replace("name = \"chaos\"\n", "");
    std::fs::copy(wasm, dir.join(format!("{name}.wasm"))).unwrap();
    let toml = format!("config = \"mode=churn devices=3 resource={resource}\"\n{requests}{extra}");
    std::fs::write(dir.join(format!("{name}.toml")), toml).unwrap();
}

/// `devplug run` (through `wrapper`, if any) serving churners (name, resource, manifest lines),
/// polling only hourly, on a fixture machine, to a kubelet stand-in; the first value keeps the
/// directories and the machine alive.
async fn serve_churners(
    churners: &[(&str, &str, &str)],
    wrapper: &[&str],
) -> ((tempfile::TempDir, Machine), Kubelet, Devplug) {
    let root = tempfile::tempdir().unwrap();
    let (kdir, backends) = (root.path().join("kubelet"), root.path().join("backends"));
    std::fs::create_dir_all(&backends).unwrap();
    for (name, resource, extra) in churners {
        churner(&backends, name, resource, extra);
    }
    let kubelet = Kubelet::start(&kdir).await;
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("wasm-cache");
    let machine = Machine::generic_box();
    let mut args = run_args(&kdir, &backends, &machine);
    args.extend(["--cache-dir".into(), cache.display().to_string(), "--poll-interval".into(), "1h".into()]);
    let d = Devplug::spawn_via(wrapper, &args);
    ((root, machine), kubelet, d)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kernel_uevent_runs_the_subscribed_backends_discover_at_once() {
    // A test that cannot trigger a uevent checks nothing: it fails, it never passes quietly.
    if let Err(e) = std::fs::OpenOptions::new().write(true).open(LO_UEVENT) {
        panic!(
            "this test needs root and a writable /sys to trigger a kernel uevent ({LO_UEVENT}: {e}); CI runs as root"
        );
    }
    let (_root, kubelet, d) = serve_churners(
        &[("evented", "test.devplug.io/evented", "uevents = [\"net\"]\n"), ("quiet", "test.devplug.io/quiet", "")],
        &[],
    )
    .await;
    let evented =
        kubelet.wait_plugin("test.devplug.io/evented", T).await.unwrap_or_else(|e| panic!("{e}\n{}", d.log()));
    let quiet = kubelet.wait_plugin("test.devplug.io/quiet", T).await.unwrap();
    // Both first lists delivered before counting anything.
    for r in ["test.devplug.io/evented", "test.devplug.io/quiet"] {
        kubelet.wait_devices(r, T, |l| !l.is_empty()).await.unwrap();
    }
    let quiet_before = quiet.updates.load(std::sync::atomic::Ordering::SeqCst);
    assert!(quiet_before >= 1);
    let mut lists = evented.devices.clone();
    lists.borrow_and_update();
    let mut took = Vec::new();
    for i in 0..20 {
        let t0 = Instant::now();
        std::fs::write(LO_UEVENT, "change").unwrap();
        tokio::time::timeout(T, lists.changed())
            .await
            .unwrap_or_else(|_| panic!("event {i}: no discover followed the uevent\n{}", d.log()))
            .unwrap();
        took.push(t0.elapsed());
    }
    assert_eq!(
        quiet.updates.load(std::sync::atomic::Ordering::SeqCst),
        quiet_before,
        "a backend that did not subscribe to net was polled"
    );
    took.sort();
    eprintln!("uevent → new list on the ListAndWatch stream: p50 {:?}, max {:?} (20 events)", took[10], took[19]);
}

/// A uevent storm (issue 24): one `change` every 2 ms for 2 s, with the subscribed backend's
/// list changing on every discover. Discovers are debounced per backend and ListAndWatch sends
/// coalesced per resource, so kubelet gets at most one list per 100 ms, not one per uevent
/// (before: 2,730 lists in 6 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_uevent_storm_reaches_kubelet_as_at_most_ten_lists_a_second() {
    if let Err(e) = std::fs::OpenOptions::new().write(true).open(LO_UEVENT) {
        panic!(
            "this test needs root and a writable /sys to trigger a kernel uevent ({LO_UEVENT}: {e}); CI runs as root"
        );
    }
    let (_root, kubelet, d) =
        serve_churners(&[("evented", "test.devplug.io/evented", "uevents = [\"net\"]\n")], &[]).await;
    let evented =
        kubelet.wait_plugin("test.devplug.io/evented", T).await.unwrap_or_else(|e| panic!("{e}\n{}", d.log()));
    kubelet.wait_devices("test.devplug.io/evented", T, |l| !l.is_empty()).await.unwrap();
    let before = evented.updates.load(std::sync::atomic::Ordering::SeqCst);
    let t0 = Instant::now();
    let mut events = 0u32;
    while t0.elapsed() < Duration::from_secs(2) {
        std::fs::write(LO_UEVENT, "change").unwrap();
        events += 1;
        std::thread::sleep(Duration::from_millis(2));
    }
    let took = t0.elapsed();
    let lists = evented.updates.load(std::sync::atomic::Ordering::SeqCst) - before;
    eprintln!("uevent storm: {events} uevents in {took:?} → {lists} ListAndWatch lists");
    let most = took.as_millis() as u64 / 100 + 3;
    assert!(lists <= most, "{lists} lists for {events} uevents in {took:?} (at most {most})\n{}", d.log());
    assert!(lists >= 2, "the storm's changes still reach kubelet: {lists}");
}

/// Run `ip ARGS` in the network namespace of process `pid`.
fn ip_in(pid: i32, args: &[&str]) {
    let st = std::process::Command::new("nsenter")
        .arg(format!("--net=/proc/{pid}/ns/net"))
        .arg("ip")
        .args(args)
        .status()
        .unwrap();
    assert!(st.success(), "ip {args:?} in devplug's namespace failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_going_down_or_up_runs_the_net_subscribers_discover_at_once() {
    // A network namespace of devplug's own: its `lo` can be toggled without touching the machine.
    let can = std::process::Command::new("unshare").args(["--net", "true"]).status().is_ok_and(|s| s.success());
    assert!(can, "this test needs root and `unshare --net` to make a network namespace of its own; CI runs as root");
    let (_root, kubelet, d) =
        serve_churners(&[("linked", "test.devplug.io/linked", "uevents = [\"net\"]\n")], &["unshare", "--net", "--"])
            .await;
    let linked = kubelet.wait_plugin("test.devplug.io/linked", T).await.unwrap_or_else(|e| panic!("{e}\n{}", d.log()));
    kubelet.wait_devices("test.devplug.io/linked", T, |l| !l.is_empty()).await.unwrap();
    let mut lists = linked.devices.clone();
    lists.borrow_and_update();
    let mut took = Vec::new();
    for i in 0..10 {
        let state = if i % 2 == 0 { "up" } else { "down" };
        let t0 = Instant::now();
        ip_in(d.pid(), &["link", "set", "lo", state]);
        tokio::time::timeout(T, lists.changed())
            .await
            .unwrap_or_else(|_| panic!("change {i} (lo {state}): no discover followed\n{}", d.log()))
            .unwrap();
        took.push(t0.elapsed());
    }
    took.sort();
    eprintln!(
        "link up/down → new list on the ListAndWatch stream (including `nsenter ip`): p50 {:?}, max {:?} (10 changes)",
        took[5], took[9]
    );
}
