//! The API server connection every DRA driver of this node shares.

use std::path::Path;

/// A client for the API server: from `kubeconfig`, else the in-cluster service account (or
/// `$KUBECONFIG`, as kubectl reads it).
pub async fn connect(kubeconfig: Option<&Path>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| anyhow::anyhow!("kubeconfig {}: {e}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| anyhow::anyhow!("kubeconfig {}: {e}", path.display()))?
        }
        None => kube::Config::infer().await.map_err(|e| {
            anyhow::anyhow!("no API server: {e} (run in a pod with a service account, or pass --kubeconfig)")
        })?,
    };
    crate::tls::install_crypto();
    kube::Client::try_from(config).map_err(|e| anyhow::anyhow!("API client: {e}"))
}
