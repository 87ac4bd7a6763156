//! Kubelet-path benchmark (a bench binary, not criterion, because it reports percentiles):
//! Allocate round-trip latency over the Unix socket through the whole host (gRPC, ID checks,
//! backend call on the blocking pool, response), and the time from a kubelet restart (dir wiped,
//! new `kubelet.sock`) to devplug's re-registration. Numbers go in docs/BENCHMARKS.md.

use devplug_test_support as support;

use std::time::{Duration, Instant};

use devplug_standins::proto::deviceplugin as pb;
use support::daemon::{Daemon, WIDGET, chaos_dir, config};
use support::fixtures::Machine;
use support::kubelet::Kubelet;
use support::stats::report;

fn main() -> anyhow::Result<()> {
    // `cargo bench` passes --bench; a plain `cargo test` run of benches passes nothing useful.
    let quick = std::env::args().any(|a| a == "--quick");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async {
        let dir = tempfile::tempdir()?;
        let (m, backends) = (Machine::generic_box(), chaos_dir());
        let mut kubelet = Kubelet::start(dir.path()).await;
        let daemon = Daemon::start(config(dir.path(), &m, backends.path(), "devices=8"));
        let plugin = kubelet.wait_registered(WIDGET, 1, Duration::from_secs(30)).await?;
        // Kubelet is another process: drive Allocate from a thread with its own runtime and
        // connection, so the client does not share (and steal) the daemon's two workers.
        let socket = dir.path().join(plugin.endpoint.clone());
        let n = if quick { 500 } else { 20_000 };
        let lat = std::thread::spawn(move || -> anyhow::Result<Vec<Duration>> {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            rt.block_on(async move {
                let channel = devplug::kubelet::uds::connect(&socket, Duration::from_secs(10)).await?;
                let mut client = pb::device_plugin_client::DevicePluginClient::new(channel);
                let req = || pb::AllocateRequest {
                    container_requests: vec![pb::ContainerAllocateRequest { devices_ids: vec!["widget-3".into()] }],
                };
                for _ in 0..200 {
                    client.allocate(req()).await?;
                }
                let mut lat = Vec::with_capacity(n);
                for _ in 0..n {
                    let t = Instant::now();
                    client.allocate(req()).await?;
                    lat.push(t.elapsed());
                }
                Ok(lat)
            })
        })
        .join()
        .map_err(|_| anyhow::anyhow!("client thread panicked"))??;
        report("allocate round trip (1 device, over UDS)", lat);

        // What the `:authority` front (plugin_socket/authority.rs) adds per connection: kubelet
        // 1.36's recorded registration connection (two header blocks, re-encoded) through it.
        let recorded = std::fs::read(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../tests/fixtures/k8s/kubelet-1.36-plugin-registration.client.bin"),
        )?;
        let mut front = Vec::new();
        for _ in 0..if quick { 1_000 } else { 20_000 } {
            let t = Instant::now();
            let mut r = devplug::plugin_socket::authority::Rewriter::default();
            r.feed(std::hint::black_box(&recorded))?;
            std::hint::black_box(r.ready().len());
            front.push(t.elapsed());
        }
        report("authority front: kubelet's registration connection (426 bytes, 2 header blocks)", front);

        let mut rereg = Vec::new();
        for i in 1..=if quick { 10 } else { 100 } {
            let t = Instant::now();
            kubelet.restart().await;
            kubelet.wait_registered(WIDGET, 1 + i, Duration::from_secs(5)).await?;
            rereg.push(t.elapsed());
        }
        report("kubelet restart -> re-registered", rereg);
        daemon.stop().await?;

        // Issue 18's scenario: three resources; kubelet dies leaving its socket, comes back 30 ms
        // later, wipes the dir, listens anew and dials each plugin back inside Register. Timed
        // from the new kubelet.sock to every ListAndWatch delivering its list again.
        let root = tempfile::tempdir()?;
        let (kdir, bdir) = (root.path().join("device-plugins"), root.path().join("backends"));
        std::fs::create_dir_all(&bdir)?;
        let names = support::daemon::three_resources(&bdir);
        let restarts = if quick { 10 } else { 100 };
        let mut cfg = config(&kdir, &m, &bdir, "");
        cfg.backends.clear();
        let kubelet = Kubelet::start(&kdir).await;
        let resumed = restarts_resumed(kubelet, cfg.clone(), &names, restarts).await?;
        report("3 resources: new kubelet.sock -> all ListAndWatch resumed", resumed);

        // The same through kubelet's plugin watcher (devplug's sockets in plugins_registry).
        let (kdir2, reg) = (root.path().join("device-plugins-2"), root.path().join("plugins_registry"));
        let kubelet = Kubelet::start_with_watcher(&kdir2, &reg).await;
        cfg.kubelet_dir = kdir2;
        cfg.registration = devplug::kubelet::RegistrationMode::PluginWatcher;
        cfg.plugins_registry_dir = Some(reg);
        let resumed = restarts_resumed(kubelet, cfg, &names, restarts).await?;
        report("3 resources, plugin watcher: kubelet back -> all ListAndWatch resumed", resumed);
        Ok(())
    })
}

/// Issue 18's scenario: kubelet dies (streams close, its socket stays), comes back 30 ms later,
/// wipes the plugin sockets and listens anew. Timed from the new kubelet to every resource's
/// ListAndWatch delivering its list again; exactly one registration per resource per restart.
async fn restarts_resumed(
    mut kubelet: Kubelet,
    cfg: devplug::config::Config,
    names: &[String],
    restarts: u64,
) -> anyhow::Result<Vec<Duration>> {
    let n = names.len() as u64;
    let daemon = Daemon::start(cfg);
    kubelet.wait_for(Duration::from_secs(30), "first registrations", |k| k.registrations() == n).await?;
    let mut resumed = Vec::new();
    for i in 1..=restarts {
        resumed.push(
            kubelet.restart_and_wait(Duration::from_millis(30), names, n * (i + 1), 2, Duration::from_secs(15)).await?,
        );
    }
    anyhow::ensure!(
        kubelet.registrations() == n * (restarts + 1),
        "more than one registration per resource per restart"
    );
    daemon.stop().await?;
    Ok(resumed)
}
