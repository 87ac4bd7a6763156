//! This node's DRA side: the API server connection and one [`Driver`] per backend driver name,
//! started when its first resource arrives and stopped when its last one goes (pool deleted,
//! sockets removed) or devplug stops (sockets removed, the pool left for the next devplug).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::driver::{Driver, DriverSetup};
use super::served::ServedResource;
use crate::cdi::SpecDir;

/// Where this node's DRA side reaches kubelet and the API server.
pub struct NodeSettings<'a> {
    pub kubeconfig: Option<&'a Path>,
    pub node_name: Option<&'a str>,
    pub registry_dir: PathBuf,
    pub plugins_dir: PathBuf,
    pub resync: Duration,
    /// Which prepared devices get a claim status entry.
    pub claim_status: super::plugin::status::StatusPolicy,
    /// Where each driver's registration with kubelet shows.
    pub board: Arc<crate::plugin_socket::registration::Board>,
    /// How long kubelet may take to register a driver before an ERROR.
    pub patience: Duration,
    /// Where every driver's claims show.
    pub claims: Arc<super::plugin::claims::ClaimBoard>,
    /// This machine's sysfs (PCIe roots for the standard attributes).
    pub sysfs_root: PathBuf,
}

/// The DRA drivers of this node.
pub struct DraNode {
    setup: DriverSetup,
    drivers: tokio::sync::Mutex<BTreeMap<String, Driver>>,
}

/// This node's name for DRA: `given` (`--node-name`, `$NODE_NAME`), else the host name; held
/// to the API server's rule for a Node's name (the one check every command makes).
pub fn node_name(given: Option<&str>) -> anyhow::Result<String> {
    let node = match given {
        Some(n) => n.to_owned(),
        None => nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .ok_or_else(|| anyhow::anyhow!("no node name: set NODE_NAME (the downward API) or --node-name"))?,
    };
    check_node_name(&node)?;
    Ok(node)
}

/// `node` as a Node's name the API server takes (a DNS subdomain), or why not and what to do.
pub fn check_node_name(node: &str) -> anyhow::Result<()> {
    match super::publish::rules::subdomain_problem(node) {
        Some(why) => anyhow::bail!("node name {node:?} is not a DNS subdomain ({why}): set NODE_NAME or --node-name"),
        None => Ok(()),
    }
}

impl DraNode {
    /// Connect to the API server. Errors say what is missing (no kubeconfig, no node name).
    pub async fn connect(s: NodeSettings<'_>, specs: Arc<SpecDir>) -> anyhow::Result<DraNode> {
        let node = node_name(s.node_name)?;
        let client = super::client::connect(s.kubeconfig).await?;
        let setup = DriverSetup {
            driver: String::new(),
            node,
            client,
            specs,
            registry_dir: s.registry_dir,
            plugins_dir: s.plugins_dir,
            resync: s.resync,
            claim_status: s.claim_status,
            board: s.board,
            patience: s.patience,
            claims: s.claims,
            sysfs_root: s.sysfs_root,
        };
        Ok(DraNode { setup, drivers: tokio::sync::Mutex::default() })
    }

    pub fn node(&self) -> &str {
        &self.setup.node
    }

    /// Serve `r` through `driver` (started on first use). One driver belongs to one backend: a
    /// second backend configured with the same driver name is refused, naming both.
    pub async fn add(&self, driver: &str, r: ServedResource) -> anyhow::Result<()> {
        let mut drivers = self.drivers.lock().await;
        if let Some(d) = drivers.get(driver) {
            if let Some(other) = d.backend().filter(|b| *b != r.backend) {
                anyhow::bail!(
                    "DRA driver {driver} already serves backend {other}; give backend {} its own dra_driver",
                    r.backend
                );
            }
            d.add(r);
            return Ok(());
        }
        let d = Driver::start(DriverSetup { driver: driver.to_owned(), ..self.setup.clone() })?;
        d.add(r);
        drivers.insert(driver.to_owned(), d);
        Ok(())
    }

    /// Stop serving `resource`; its driver stops when it serves nothing else.
    pub async fn remove(&self, resource: &str) {
        let mut drivers = self.drivers.lock().await;
        let Some(name) = drivers.iter().find(|(_, d)| d.serves(resource)).map(|(n, _)| n.clone()) else { return };
        let empty = drivers.get(&name).is_some_and(|d| d.remove(resource));
        if empty && let Some(d) = drivers.remove(&name) {
            d.stop(true).await;
        }
    }

    /// Stop every driver (devplug stops): sockets removed, pools left in place, so the node's
    /// devices stay schedulable while the next devplug starts.
    pub async fn shutdown(&self) {
        let drivers = std::mem::take(&mut *self.drivers.lock().await);
        futures::future::join_all(drivers.into_values().map(|d| d.stop(false))).await;
    }
}
