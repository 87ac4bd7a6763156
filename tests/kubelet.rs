//! The kubelet side, end to end: devplug's daemon serving the chaos backend to the kubelet
//! stand-in over real Unix sockets — registration, ListAndWatch, Allocate, PreferredAllocation,
//! PreStart, kubelet restarts in both registration modes, and the upstream wire format.

use devplug_test_support as support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use devplug::kubelet::{Endpoints, KubeletPaths, RegistrationMode, ResourceHandle, Stage};
use devplug::model::{Resource, ResourceOptions};
use devplug_standins::proto::deviceplugin as pb;
use prost::Message;
use support::daemon::{Daemon, WIDGET, chaos_dir, config};
use support::fixtures::Machine;
use support::kubelet::Kubelet;

const T: Duration = Duration::from_secs(20);

fn ids(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn alloc_req(containers: &[&[&str]]) -> pb::AllocateRequest {
    pb::AllocateRequest {
        container_requests: containers.iter().map(|c| pb::ContainerAllocateRequest { devices_ids: ids(c) }).collect(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn register_list_allocate_prefer_prestart_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let (m, backends) = (Machine::generic_box(), chaos_dir());
    let kubelet = Kubelet::start(dir.path()).await;
    let daemon = Daemon::start(config(dir.path(), &m, backends.path(), "devices=4"));

    let plugin = kubelet.wait_registered(WIDGET, 1, T).await.unwrap();
    assert_eq!(plugin.endpoint, dir.path().join("devplug-test.devplug.io_widget.sock"));
    assert!(plugin.options.pre_start_required && plugin.options.get_preferred_allocation_available);
    let devices = kubelet.wait_devices(WIDGET, T, |d| d.len() == 4).await.unwrap();
    assert!(devices.iter().all(|d| d.health == "Healthy"));
    assert_eq!(devices[1].id, "widget-1");
    assert_eq!(devices[1].topology.as_ref().unwrap().nodes[0].id, 1, "NUMA node from the backend");

    let mut c = plugin.client.clone();
    let opts = c.get_device_plugin_options(pb::Empty {}).await.unwrap().into_inner();
    assert!(opts.pre_start_required);

    let resp = c.allocate(alloc_req(&[&["widget-0"], &["widget-1", "widget-2"]])).await.unwrap().into_inner();
    assert_eq!(resp.container_responses.len(), 2, "one answer per container");
    let (a, b) = (&resp.container_responses[0], &resp.container_responses[1]);
    assert_eq!(a.envs["CHAOS_IDS"], "widget-0");
    assert_eq!(b.envs["CHAOS_IDS"], "widget-1,widget-2", "answers in request order");
    assert_eq!(b.envs["CHAOS_DEVICE"], "widget-2", "per-device edits are merged in");
    assert_eq!(a.devices.len(), 1);
    assert_eq!((a.devices[0].container_path.as_str(), a.devices[0].permissions.as_str()), ("/dev/null", "rw"));

    let pref = c
        .get_preferred_allocation(pb::PreferredAllocationRequest {
            container_requests: vec![pb::ContainerPreferredAllocationRequest {
                available_device_i_ds: ids(&["widget-0", "widget-1", "widget-2", "widget-3"]),
                must_include_device_i_ds: ids(&["widget-1"]),
                allocation_size: 2,
            }],
        })
        .await
        .unwrap()
        .into_inner();
    // chaos prefers the highest IDs, so this is the backend's answer, not the host's fallback.
    assert_eq!(pref.container_responses[0].device_i_ds, ids(&["widget-1", "widget-3"]));

    c.pre_start_container(pb::PreStartContainerRequest { devices_ids: ids(&["widget-0"]) }).await.unwrap();
    let err = c.pre_start_container(pb::PreStartContainerRequest { devices_ids: ids(&["nope"]) }).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);

    daemon.stop().await.unwrap();
    assert!(!plugin.endpoint.exists(), "socket removed on clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocate_answers_bad_and_huge_requests_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let (m, backends) = (Machine::generic_box(), chaos_dir());
    let kubelet = Kubelet::start(dir.path()).await;
    let daemon = Daemon::start(config(dir.path(), &m, backends.path(), "devices=4"));
    let plugin = kubelet.wait_registered(WIDGET, 1, T).await.unwrap();
    let mut c = plugin.client.clone();

    let err = c.allocate(alloc_req(&[&["widget-0"], &["widget-9", "ghost"]])).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("widget-9, ghost") && err.message().contains(WIDGET), "{}", err.message());

    let err = c.allocate(alloc_req(&[&["widget-0", "widget-0"]])).await.unwrap_err();
    assert!(err.message().contains("twice"), "{}", err.message());

    let empty = c.allocate(pb::AllocateRequest { container_requests: vec![] }).await.unwrap().into_inner();
    assert!(empty.container_responses.is_empty());
    let err = c.allocate(alloc_req(&[&[]])).await.unwrap_err();
    assert!(err.message().contains("names no devices"), "{}", err.message());

    let names: Vec<String> = (0..1000).map(|i| format!("widget-{}", i % 4)).collect();
    let big = pb::AllocateRequest {
        container_requests: names
            .iter()
            .map(|n| pb::ContainerAllocateRequest { devices_ids: vec![n.clone()] })
            .collect(),
    };
    let resp = c.allocate(big).await.unwrap().into_inner();
    assert_eq!(resp.container_responses.len(), 1000);
    for (r, n) in resp.container_responses.iter().zip(&names) {
        assert_eq!(&r.envs["CHAOS_IDS"], n);
    }
    daemon.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trapping_allocate_is_unavailable_and_the_next_one_works() {
    let dir = tempfile::tempdir().unwrap();
    let (m, backends) = (Machine::generic_box(), chaos_dir());
    let kubelet = Kubelet::start(dir.path()).await;
    let daemon = Daemon::start(config(dir.path(), &m, backends.path(), "devices=2 names=ok-0,trap-1"));
    let plugin = kubelet.wait_registered(WIDGET, 1, T).await.unwrap();
    let mut c = plugin.client.clone();
    let err = c.allocate(alloc_req(&[&["trap-1"]])).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable);
    assert!(err.message().contains("trapped"), "{}", err.message());
    let ok = c.allocate(alloc_req(&[&["ok-0"]])).await.unwrap().into_inner();
    assert_eq!(ok.container_responses[0].envs["CHAOS_IDS"], "ok-0");
    daemon.stop().await.unwrap();
}

fn sockets_in(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(dir).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_kubelet_restarts_fifty_reregistrations() {
    let dir = tempfile::tempdir().unwrap();
    let (m, backends) = (Machine::generic_box(), chaos_dir());
    let mut kubelet = Kubelet::start(dir.path()).await;
    let daemon = Daemon::start(config(dir.path(), &m, backends.path(), "devices=2"));
    kubelet.wait_registered(WIDGET, 1, T).await.unwrap();
    kubelet.wait_devices(WIDGET, T, |d| d.len() == 2).await.unwrap();
    let tasks_before = tokio::runtime::Handle::current().metrics().num_alive_tasks();
    let mut slowest = Duration::ZERO;
    for i in 1..=50u64 {
        kubelet.restart().await;
        let t0 = Instant::now();
        kubelet.wait_registered(WIDGET, 1 + i, T).await.unwrap_or_else(|e| panic!("restart {i}: {e}"));
        slowest = slowest.max(t0.elapsed());
        // The new registration serves a working stream, not just a Register call.
        kubelet.wait_devices(WIDGET, T, |d| d.len() == 2).await.unwrap();
    }
    // Settle: any duplicate re-registration would land now.
    let c = kubelet.plugin(WIDGET).await.unwrap().client;
    let _ = c.clone().get_device_plugin_options(pb::Empty {}).await.unwrap();
    assert_eq!(kubelet.registrations(), 51, "exactly one re-registration per restart");
    assert_eq!(sockets_in(dir.path()), ["devplug-test.devplug.io_widget.sock", "kubelet.sock"], "no leaked sockets");
    // Old streams and connections wind down asynchronously once their peer is gone, so wait
    // (bounded) for the count to settle; a real leak is one task or more per restart and never settles.
    let alive = || tokio::runtime::Handle::current().metrics().num_alive_tasks();
    let deadline = Instant::now() + T;
    while alive() > tasks_before + 4 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let tasks_after = alive();
    assert!(tasks_after <= tasks_before + 4, "tasks leaked: {tasks_before} before, {tasks_after} after 50 restarts");
    eprintln!("slowest re-registration after a kubelet restart: {slowest:?}");
    daemon.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_kubelet_restarts_through_the_plugin_watcher() {
    let root = tempfile::tempdir().unwrap();
    let (dp, reg) = (root.path().join("device-plugins"), root.path().join("plugins_registry"));
    let (m, backends) = (Machine::generic_box(), chaos_dir());
    let mut kubelet = Kubelet::start_with_watcher(&dp, &reg).await;
    let mut cfg = config(&dp, &m, backends.path(), "devices=2");
    cfg.registration = RegistrationMode::Auto; // the registry dir exists: auto picks the watcher
    let daemon = Daemon::start(cfg);
    let plugin = kubelet.wait_registered(WIDGET, 1, T).await.unwrap();
    assert!(plugin.endpoint.starts_with(&reg), "served from plugins_registry: {}", plugin.endpoint.display());
    for i in 1..=50u64 {
        kubelet.restart().await;
        kubelet.wait_registered(WIDGET, 1 + i, T).await.unwrap_or_else(|e| panic!("restart {i}: {e}"));
        kubelet.wait_devices(WIDGET, T, |d| d.len() == 2).await.unwrap();
    }
    assert_eq!(kubelet.registrations(), 51);
    assert_eq!(sockets_in(&reg), ["devplug-test.devplug.io_widget.sock"]);
    daemon.stop().await.unwrap();
    assert!(sockets_in(&reg).is_empty(), "socket removed on shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_refusals_are_logged_and_retried_with_backoff() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::start(dir.path()).await;

    // The stand-in refuses what kubelet refuses.
    let ch = devplug::kubelet::uds::connect(&dir.path().join("kubelet.sock"), T).await.unwrap();
    let mut raw = pb::registration_client::RegistrationClient::new(ch);
    for (version, endpoint, why) in
        [("v1alpha", "x.sock", "unsupported API version"), ("v1beta1", "../x.sock", "not a file in")]
    {
        let req = pb::RegisterRequest {
            version: version.into(),
            endpoint: endpoint.into(),
            resource_name: "a.io/b".into(),
            options: None,
        };
        let err = raw.register(req).await.unwrap_err();
        assert!(err.message().contains(why), "{version} {endpoint}: {}", err.message());
    }

    // devplug with a name kubelet refuses: it retries, backing off, and never spins.
    let paths =
        KubeletPaths { device_plugin_dir: dir.path().to_owned(), plugins_registry_dir: dir.path().join("none") };
    let endpoints = Endpoints::new(paths, RegistrationMode::KubeletSocket).unwrap();
    let (_tx, rx) =
        tokio::sync::watch::channel(Arc::new(Resource { name: "Example.com/gpu".into(), ..Default::default() }));
    let t0 = Instant::now();
    endpoints
        .add(ResourceHandle {
            name: "Example.com/gpu".into(),
            options: ResourceOptions::default(),
            devices: rx,
            port: devplug::model::port::Port::new(
                "b",
                "Example.com/gpu",
                Arc::new(devplug::model::calls::FixedCalls::default()),
                Default::default(),
            ),
            delivery: Default::default(),
            metrics: None,
        })
        .await;
    let before = kubelet.refusals().len();
    kubelet.wait_for(T, "three refusals", |k| k.refusals().len() >= before + 3).await.unwrap();
    // Waits of 200 ms then 400 ms separate the first three attempts.
    assert!(t0.elapsed() >= Duration::from_millis(600), "retried too fast: {:?}", t0.elapsed());
    assert!(kubelet.refusals().last().unwrap().contains("invalid extended resource name"));
    let states = endpoints.states().await;
    assert!(
        matches!(&states[0].1, Stage::Refused(why) if why.contains("invalid extended resource name")),
        "{states:?}"
    );
    endpoints.shutdown().await;
}

#[test]
fn wire_format_matches_upstream_field_numbers() {
    // RegisterRequest{version=1, endpoint=2, resource_name=3, options=4{pre_start_required=1,
    // get_preferred_allocation_available=2}}, encoded by hand.
    let mut hand = vec![0x0a, 7];
    hand.extend_from_slice(b"v1beta1");
    hand.extend_from_slice(&[0x12, 6]);
    hand.extend_from_slice(b"x.sock");
    hand.extend_from_slice(&[0x1a, 6]);
    hand.extend_from_slice(b"a.io/b");
    hand.extend_from_slice(&[0x22, 4, 0x08, 1, 0x10, 1]);
    let ours = pb::RegisterRequest {
        version: "v1beta1".into(),
        endpoint: "x.sock".into(),
        resource_name: "a.io/b".into(),
        options: Some(pb::DevicePluginOptions { pre_start_required: true, get_preferred_allocation_available: true }),
    };
    assert_eq!(ours.encode_to_vec(), hand);

    // Mount{container_path=1, host_path=2, read_only=3}: the seed sketch had these swapped.
    let m = pb::Mount::decode(&[0x0a, 2, b'/', b'c', 0x12, 2, b'/', b'h', 0x18, 1][..]).unwrap();
    assert_eq!((m.container_path.as_str(), m.host_path.as_str(), m.read_only), ("/c", "/h", true));

    // Device{ID=1, health=2, topology=3{nodes=1{ID=1}}}.
    let mut d = vec![0x0a, 2, b'g', b'0', 0x12, 7];
    d.extend_from_slice(b"Healthy");
    d.extend_from_slice(&[0x1a, 4, 0x0a, 2, 0x08, 1]);
    let dev = pb::Device::decode(&d[..]).unwrap();
    assert_eq!((dev.id.as_str(), dev.health.as_str(), dev.topology.unwrap().nodes[0].id), ("g0", "Healthy", 1));

    // ContainerAllocateResponse.cdi_devices = 5, CDIDevice.name = 1.
    let car = pb::ContainerAllocateResponse {
        cdi_devices: vec![pb::CdiDevice { name: "v.com/c=x".into() }],
        ..Default::default()
    };
    let mut want = vec![0x2a, 11, 0x0a, 9];
    want.extend_from_slice(b"v.com/c=x");
    assert_eq!(car.encode_to_vec(), want);

    // gRPC service paths kubelet dials.
    assert_eq!(pb::device_plugin_server::SERVICE_NAME, "v1beta1.DevicePlugin");
    assert_eq!(pb::registration_server::SERVICE_NAME, "v1beta1.Registration");
    assert_eq!(
        devplug::proto::pluginregistration::registration_server::SERVICE_NAME,
        "pluginregistration.Registration"
    );
    assert_eq!(devplug::proto::podresources::pod_resources_lister_server::SERVICE_NAME, "v1.PodResourcesLister");
}

/// Issue 18's scenario, the way a node sees it: devplug (the real binary) serves three resources;
/// kubelet dies (its streams close, its socket file stays, dead), starts again 30 ms later, wipes
/// the plugin sockets and listens on a new `kubelet.sock`, and dials each plugin back inside
/// `Register`. A hundred times: every restart must cost exactly one Register per resource, none
/// failing, and each ListAndWatch must resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_kubelet_restarts_cost_one_clean_registration_per_resource_each() {
    use support::binary::{Devplug, run_args};
    let root = tempfile::tempdir().unwrap();
    let (kdir, backends) = (root.path().join("device-plugins"), root.path().join("backends"));
    std::fs::create_dir_all(&backends).unwrap();
    let resources = support::daemon::three_resources(&backends);
    let m = Machine::generic_box();
    let mut kubelet = Kubelet::start(&kdir).await;
    let cache = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("wasm-cache");
    let mut args = run_args(&kdir, &backends, &m);
    args.extend(["--cache-dir".into(), cache.display().to_string()]);
    let mut d = Devplug::spawn(&args);
    kubelet.wait_for(T, "three registrations", |k| k.registrations() == 3).await.unwrap();
    const RESTARTS: u64 = 100;
    let mut resumed = Vec::new();
    for i in 1..=RESTARTS {
        let took = kubelet
            .restart_and_wait(Duration::from_millis(30), &resources, 3 * (i + 1), 2, T)
            .await
            .unwrap_or_else(|e| panic!("restart {i}: {e}\n{}", d.log()));
        resumed.push(took);
    }
    // Any duplicate Register of the last restart would have landed by the time each resource's
    // server answered a call.
    for r in &resources {
        let mut c = kubelet.plugin(r).await.unwrap().client;
        c.get_device_plugin_options(pb::Empty {}).await.unwrap();
    }
    assert_eq!(kubelet.registrations(), 3 * (RESTARTS + 1), "exactly one Register per resource per restart");
    assert!(kubelet.refusals().is_empty(), "kubelet refused: {:?}", kubelet.refusals());
    // Kubelet's blocking dial rides out a moment without the socket (as the real one does);
    // said here, so a run that needed it shows why it took a second longer.
    for retried in kubelet.dial_retries() {
        eprintln!("kubelet's dial was tried again: {retried}");
    }
    // devplug logs a registration after kubelet answered it: the last lines may still be on
    // their way (bounded wait for them, then exact counts).
    let logged = |d: &Devplug| d.log().matches("registered with kubelet").count() as u64;
    let t0 = std::time::Instant::now();
    while logged(&d) < 3 * (RESTARTS + 1) && t0.elapsed() < T {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let log = d.log();
    assert_eq!(log.matches("registration failed").count(), 0, "{log}");
    assert_eq!(log.matches("registered with kubelet").count() as u64, 3 * (RESTARTS + 1));
    resumed.sort();
    eprintln!(
        "{RESTARTS} restarts, new kubelet.sock → all three ListAndWatch streams resumed: p50 {:?}, p99 {:?}, max {:?}",
        resumed[resumed.len() / 2],
        resumed[resumed.len() * 99 / 100],
        resumed[resumed.len() - 1]
    );
    d.terminate(T).unwrap();
}

/// The same hundred restarts with three resources through kubelet's plugin watcher: devplug's
/// sockets in `plugins_registry` survive the restart, kubelet finds them again by itself, and
/// each resource is registered exactly once per restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_kubelet_restarts_through_the_plugin_watcher_with_three_resources() {
    use support::binary::{Devplug, run_args};
    let root = tempfile::tempdir().unwrap();
    let (kdir, reg, backends) =
        (root.path().join("device-plugins"), root.path().join("plugins_registry"), root.path().join("backends"));
    std::fs::create_dir_all(&backends).unwrap();
    let resources = support::daemon::three_resources(&backends);
    let m = Machine::generic_box();
    let mut kubelet = Kubelet::start_with_watcher(&kdir, &reg).await;
    let cache = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("wasm-cache");
    let mut args = run_args(&kdir, &backends, &m);
    let mode = args.iter().position(|a| a == "--registration").unwrap() + 1;
    args[mode] = "auto".into(); // the registry dir exists: auto picks the watcher
    args.extend(["--cache-dir".into(), cache.display().to_string()]);
    let mut d = Devplug::spawn(&args);
    kubelet.wait_for(T, "three registrations", |k| k.registrations() == 3).await.unwrap();
    const RESTARTS: u64 = 100;
    for i in 1..=RESTARTS {
        kubelet
            .restart_and_wait(Duration::from_millis(30), &resources, 3 * (i + 1), 2, T)
            .await
            .unwrap_or_else(|e| panic!("restart {i}: {e}\n{}", d.log()));
    }
    for r in &resources {
        let mut c = kubelet.plugin(r).await.unwrap().client;
        c.get_device_plugin_options(pb::Empty {}).await.unwrap();
    }
    assert_eq!(kubelet.registrations(), 3 * (RESTARTS + 1), "exactly one registration per resource per restart");
    assert!(kubelet.refusals().is_empty(), "kubelet refused: {:?}", kubelet.refusals());
    let mut socks: Vec<String> =
        std::fs::read_dir(&reg).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    socks.sort();
    assert_eq!(socks.len(), 3, "one socket per resource in plugins_registry: {socks:?}");
    d.terminate(T).unwrap();
}
