//! A node serving the chaos test backend's `test.devplug.io/widget` through DRA, in-process: the
//! API-server stand-in (Node `node-a`), the kubelet stand-in with DRA's handler in its plugin
//! watcher, and the daemon's config, ready to adjust and start. devplug's kubeconfig is the
//! chart's ServiceAccount's, bound to the node, with only what the chart grants.

use std::sync::Arc;

use devplug::config::{Api, Config, ResourceSettings};

use super::apiserver::ApiServer;
use super::daemon::{WIDGET, chaos_dir, config};
use super::fixtures::Machine;
use super::kubelet::Kubelet;
use super::kubelet_dra::{DraKubelet, KNOWN_1_34};

pub const NODE: &str = "node-a";
/// The chaos backend's DRA driver.
pub const DRIVER: &str = "chaos.devplug.io";

pub struct ChaosNode {
    /// Kubelet's dirs, the kubeconfig, the CDI dir (`cdi`), the plugins dir.
    pub root: tempfile::TempDir,
    /// `chaos.wasm` and `chaos.toml`.
    pub backends: tempfile::TempDir,
    pub api: Arc<ApiServer>,
    pub kubelet: Kubelet,
    pub dra: Arc<DraKubelet>,
    pub cfg: Config,
    /// devplug's token on the stand-in: the chart's ServiceAccount, bound to [`NODE`].
    pub token: String,
}

/// Chaos with `chaos_config` (and `manifest_extra` lines in its manifest) on `m`.
pub async fn chaos_node(m: &Machine, chaos_config: &str, manifest_extra: &str) -> ChaosNode {
    let root = tempfile::tempdir().expect("tempdir");
    let backends = chaos_dir();
    if !manifest_extra.is_empty() {
        let toml = backends.path().join("chaos.toml");
        let text = std::fs::read_to_string(&toml).expect("chaos.toml");
        std::fs::write(&toml, format!("{text}{manifest_extra}")).expect("chaos.toml");
    }
    let api = Arc::new(ApiServer::start(&[NODE]).await);
    // devplug runs as the chart's ServiceAccount with a token bound to its node, held to what
    // the chart grants (RBAC and its slice policy), as in a cluster.
    let token = super::chart::least_privilege(&api, &["dra.resources.test\\.devplug\\.io/widget=chaos"], NODE);
    let kubeconfig = root.path().join("kubeconfig");
    std::fs::write(&kubeconfig, api.kubeconfig_with(&token)).expect("kubeconfig");
    let (kdir, registry) = (root.path().join("device-plugins"), root.path().join("plugins_registry"));
    let kubelet = Kubelet::start_with_watcher(&kdir, &registry).await;
    let dra = DraKubelet::new(KNOWN_1_34, NODE, api.clone());
    kubelet.handle("DRAPlugin", dra.clone());
    let mut cfg = config(&kdir, m, backends.path(), chaos_config);
    cfg.registration = devplug::kubelet::RegistrationMode::PluginWatcher;
    cfg.plugins_registry_dir = Some(registry);
    cfg.write_cdi = true;
    cfg.cdi_dir = root.path().join("cdi");
    cfg.resources.insert(WIDGET.into(), ResourceSettings { api: Api::Dra, ..Default::default() });
    cfg.dra.kubeconfig = Some(kubeconfig);
    cfg.dra.node_name = Some(NODE.into());
    cfg.dra.plugins_dir = Some(root.path().join("plugins"));
    ChaosNode { root, backends, api, kubelet, dra, cfg, token }
}
