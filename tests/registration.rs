//! Registration as a real kubelet 1.36 does it: the bytes its plugin watcher sent on a real node
//! (tests/fixtures/k8s/kubelet-1.36-plugin-registration.client.bin, replayed unchanged) get
//! GetInfo and NotifyRegistrationStatus answered on devplug's device-plugin watcher socket and
//! on a DRA driver's registration socket; the kubelet stand-in dials with the same `:authority`
//! and refuses a server that cannot take it; a registration kubelet never completes is an ERROR
//! and a failing `/readyz` naming the socket; `auto` falls back to `kubelet.sock` when the
//! watcher never calls.

use devplug_test_support as support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use devplug_standins::proto::pluginregistration as pr;
use prost::Message;
use support::binary::{Devplug, run_args};
use support::daemon::{WIDGET, chaos_dir};
use support::fixtures::Machine;
use support::h2wire::{Answer, Conn, grpc_go_authority};

const T: Duration = Duration::from_secs(30);

fn recorded() -> Vec<u8> {
    std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/k8s/kubelet-1.36-plugin-registration.client.bin"),
    )
    .expect("the recorded kubelet bytes")
}

/// Write kubelet's recorded registration connection to `socket` as it came, and read the
/// answers to its two streams (GetInfo, NotifyRegistrationStatus). The preface and kubelet's
/// SETTINGS go first; the rest once the server's SETTINGS is there, as on the recorded
/// connection (its next frame is the ACK of the server's SETTINGS: sent before them, it is a
/// protocol error).
async fn replay(socket: &Path) -> (Answer, Answer) {
    let bytes = recorded();
    let first = support::h2wire::PREFACE.len() + 9;
    let mut conn = Conn::dial(socket).await.expect("dial");
    conn.write(&bytes[..first]).await.expect("write the preface");
    assert!(conn.server_settings().await.expect("read"), "the server closed before its SETTINGS");
    conn.write(&bytes[first..]).await.expect("write the recording");
    let mut answers = conn.answers(&[1, 3], T).await.expect("answers to streams 1 and 3");
    let notify = answers.remove(1);
    (answers.remove(0), notify)
}

/// Wait until a `*.sock` appears in `dir` (with `suffix`), bounded.
async fn socket_in(dir: &Path, suffix: &str) -> PathBuf {
    let end = tokio::time::Instant::now() + T;
    loop {
        let found = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .find(|p| p.to_string_lossy().ends_with(suffix));
        if let Some(p) = found {
            return p;
        }
        assert!(tokio::time::Instant::now() < end, "no {suffix} in {}", dir.display());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[test]
fn the_stand_in_encodes_the_authority_as_kubelet_did() {
    assert_eq!(
        grpc_go_authority(Path::new("/var/lib/kubelet/plugins_registry/test-driver.cdi.k8s.io-reg.sock")),
        "%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Ftest-driver.cdi.k8s.io-reg.sock",
        "the value in the recording (tests/fixtures/k8s/README.md)"
    );
}

/// A node's kubelet dirs (`device-plugins`, `plugins_registry`, both made) and the chaos backend.
struct Node {
    _root: tempfile::TempDir,
    kdir: PathBuf,
    registry: PathBuf,
    backends: tempfile::TempDir,
    machine: Machine,
}

fn node() -> Node {
    let root = tempfile::tempdir().unwrap();
    let (kdir, registry) = (root.path().join("device-plugins"), root.path().join("plugins_registry"));
    std::fs::create_dir_all(&registry).unwrap();
    Node { _root: root, kdir, registry, backends: chaos_dir(), machine: Machine::generic_box() }
}

/// `devplug run` on `n` in registration `mode`, with a 1 s `registration_timeout`.
fn spawn(n: &Node, mode: &str) -> Devplug {
    let cfg = n.registry.with_file_name("devplug.toml");
    std::fs::write(&cfg, "registration_timeout = \"1s\"\n").unwrap();
    let mut args = run_args(&n.kdir, n.backends.path(), &n.machine);
    let at = args.iter().position(|a| a == "--registration").unwrap() + 1;
    args[at] = mode.into();
    for extra in ["--plugins-registry-dir", &n.registry.display().to_string(), "--config", &cfg.display().to_string()] {
        args.push(extra.to_owned());
    }
    Devplug::spawn(&args)
}

/// The address of `d`'s probes (from its log).
fn probes(d: &Devplug) -> String {
    d.wait_log("serving /healthz, /readyz, /metrics and /status", T).unwrap();
    let log = d.log();
    let line = log.lines().find(|l| l.contains("serving /healthz")).unwrap();
    line.split("addr=").nth(1).unwrap().split_whitespace().next().unwrap().to_owned()
}

/// `devplug run` in plugin-watcher mode with no watcher calling: after `registration_timeout`
/// an ERROR and a 503 from `/readyz` name the socket; kubelet's recorded bytes then get GetInfo
/// answered (a DevicePlugin, the resource, its endpoint) and the registration recorded, so
/// `/readyz` turns 200 and `/status` shows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelets_recorded_bytes_register_devplugs_device_plugin_watcher_socket() {
    let n = node();
    let registry = n.registry.clone();
    let d = spawn(&n, "plugin-watcher");
    let addr = probes(&d);
    let socket = socket_in(&registry, ".sock").await;

    d.wait_log("plugin-watcher still not registered", T).unwrap();
    assert!(d.log().contains(&socket.display().to_string()), "the ERROR names the socket:\n{}", d.log());
    let (code, body) = devplug::cli::http_get(&addr, "/readyz").await.unwrap();
    assert_eq!(code, 503, "{body}");
    assert!(body.contains(&socket.display().to_string()) && body.contains("plugins_registry"), "{body}");

    let (info, notify) = replay(&socket).await;
    assert_eq!(info.reset, None, "GetInfo was reset: {info:?}");
    assert_eq!(info.grpc_status(), Some("0"), "{info:?}");
    let info = pr::PluginInfo::decode(info.message().expect("a PluginInfo")).unwrap();
    assert_eq!(info.r#type, "DevicePlugin");
    assert_eq!(info.name, WIDGET);
    assert_eq!(PathBuf::from(&info.endpoint), socket);
    assert_eq!(info.supported_versions, ["v1beta1"]);
    assert_eq!(notify.grpc_status(), Some("0"), "{notify:?}");

    let end = tokio::time::Instant::now() + T;
    loop {
        let (code, body) = devplug::cli::http_get(&addr, "/readyz").await.unwrap();
        if code == 200 {
            break;
        }
        assert!(tokio::time::Instant::now() < end, "readyz stayed {code}: {body}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_, status) = devplug::cli::http_get(&addr, "/status").await.unwrap();
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    let reg = &status["registrations"][0];
    assert_eq!(reg["subject"], format!("resource {WIDGET}"));
    assert_eq!((reg["mode"].as_str(), reg["state"].as_str()), (Some("plugin-watcher"), Some("Registered")));
    assert_eq!((reg["info_asked"].as_u64(), reg["registered"].as_u64()), (Some(1), Some(1)));
    drop(d);
}

/// A DRA driver's registration socket answers kubelet's recorded bytes: GetInfo says
/// DRAPlugin, the driver, its `dra.sock`, the DRAPlugin versions newest first and the health
/// services.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelets_recorded_bytes_register_a_dra_driver() {
    let m = Machine::generic_box();
    let node = support::dra_node::chaos_node(&m, "devices=2", "").await;
    let registry = node.cfg.plugins_registry_dir.clone().unwrap();
    let daemon = support::daemon::Daemon::start(node.cfg.clone());
    let socket = socket_in(&registry, "chaos.devplug.io-reg.sock").await;
    let (info, notify) = replay(&socket).await;
    assert_eq!(info.reset, None, "GetInfo was reset: {info:?}");
    assert_eq!(info.grpc_status(), Some("0"), "{info:?}");
    let info = pr::PluginInfo::decode(info.message().expect("a PluginInfo")).unwrap();
    assert_eq!((info.r#type.as_str(), info.name.as_str()), ("DRAPlugin", "chaos.devplug.io"));
    assert!(info.endpoint.ends_with("plugins/chaos.devplug.io/dra.sock"), "{}", info.endpoint);
    assert_eq!(
        info.supported_versions,
        ["v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"]
    );
    assert_eq!(notify.grpc_status(), Some("0"), "{notify:?}");
    // The stand-in's own watcher (kubelet's authority too) registered it as well.
    node.dra.wait_plugin("chaos.devplug.io", T).await;
    daemon.stop().await.unwrap();
}

/// A plain tonic server (no front) on a watcher socket: h2 resets kubelet's GetInfo, so the
/// stand-in, dialing as kubelet does, never registers it — the stand-in is as strict as kubelet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stand_in_cannot_register_a_server_that_refuses_kubelets_authority() {
    struct Plain;
    #[tonic::async_trait]
    impl pr::registration_server::Registration for Plain {
        async fn get_info(
            &self,
            _: tonic::Request<pr::InfoRequest>,
        ) -> Result<tonic::Response<pr::PluginInfo>, tonic::Status> {
            Ok(tonic::Response::new(pr::PluginInfo {
                r#type: "DevicePlugin".into(),
                name: "example.com/plain".into(),
                endpoint: String::new(),
                supported_versions: vec!["v1beta1".into()],
            }))
        }
        async fn notify_registration_status(
            &self,
            _: tonic::Request<pr::RegistrationStatus>,
        ) -> Result<tonic::Response<pr::RegistrationStatusResponse>, tonic::Status> {
            Ok(tonic::Response::new(pr::RegistrationStatusResponse {}))
        }
    }
    let root = tempfile::tempdir().unwrap();
    let registry = root.path().join("plugins_registry");
    std::fs::create_dir_all(&registry).unwrap();
    let socket = registry.join("plain.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(pr::registration_server::RegistrationServer::new(Plain))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    let (info, _) = replay(&socket).await;
    assert!(info.grpc_status().is_none() && info.data.is_empty(), "h2 takes kubelet's authority now? {info:?}");
    let kubelet = support::kubelet::Kubelet::start_with_watcher(&root.path().join("device-plugins"), &registry).await;
    // The watcher's attempts are bounded (50, 20 ms apart): all are made and all fail.
    kubelet
        .wait_for(Duration::from_secs(5), "a registration", |k| k.registrations() > 0)
        .await
        .expect_err("registered through a server h2 refuses kubelet's authority on");
    server.abort();
}

/// `registration = "auto"` picks the plugin watcher where `plugins_registry` exists; when the
/// watcher never calls within `registration_timeout` and `kubelet.sock` is there, devplug
/// registers through it instead, and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_falls_back_to_kubelet_sock_when_the_watcher_never_calls() {
    let n = node();
    let (kdir, registry) = (n.kdir.clone(), n.registry.clone());
    let kubelet = support::kubelet::Kubelet::start(&kdir).await;
    let d = spawn(&n, "auto");
    d.wait_log("serving for kubelet's plugin watcher", T).unwrap();
    let plugin = kubelet.wait_registered(WIDGET, 1, T).await.unwrap();
    assert!(plugin.endpoint.starts_with(&kdir), "served from the device-plugins dir: {}", plugin.endpoint.display());
    assert!(d.log().contains("registering through kubelet.sock instead"), "{}", d.log());
    assert!(std::fs::read_dir(&registry).unwrap().next().is_none(), "the watcher socket is gone");
    drop(d);
}

/// A DaemonSet rolling update with `maxSurge`: a second devplug starts on a node while the
/// first serves. It stands by (ready, so the controller goes on, serving nothing), and takes
/// over the moment the first has stopped; kubelet sees one registration at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_devplugs_on_one_node_serve_one_at_a_time() {
    let n = node();
    let kubelet = support::kubelet::Kubelet::start(&n.kdir).await;
    let mut old = spawn(&n, "kubelet-socket");
    kubelet.wait_registered(WIDGET, 1, T).await.unwrap();
    let new = spawn(&n, "kubelet-socket");
    let addr = probes(&new);
    new.wait_log("standing by until it exits", T).unwrap();
    let (code, body) = devplug::cli::http_get(&addr, "/readyz").await.unwrap();
    assert_eq!(code, 200, "standing by is ready, or a maxSurge update never deletes the old pod: {body}");
    assert!(body.contains("standby"), "{body}");
    assert!(!new.log().contains("backends loaded"), "nothing loaded while standing by:\n{}", new.log());
    assert_eq!(kubelet.registrations(), 1, "the standing-by devplug registered nothing");

    // Issue 62: what needs nothing exclusive is done before the lock, so the take-over is
    // loads from memory: the standby compiled its backend while the old one served.
    let standing = new.log();
    let lines: Vec<&str> = standing.lines().collect();
    let at =
        |what: &str| lines.iter().position(|l| l.contains(what)).unwrap_or_else(|| panic!("no {what:?}:\n{standing}"));
    let compiled = at("backend compiled ahead of its load");
    assert!(lines[compiled].contains("backend=chaos"), "{}", lines[compiled]);
    assert!(compiled < at("standing by until it exits"), "compiled before standing by:\n{standing}");

    old.terminate(T).unwrap();
    new.wait_log("taking over", T).unwrap();
    let plugin = kubelet.wait_registered(WIDGET, 2, T).await.unwrap();
    assert!(plugin.endpoint.starts_with(&n.kdir));
    kubelet.wait_devices(WIDGET, T, |l| !l.is_empty()).await.unwrap();
    drop(new);
}
