//! What `devplug try` prints (every registration, device list and pool as it changes) and its
//! Device Plugin commands (`list`, `allocate`), asked as kubelet asks.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use devplug_standins::apiserver;
use devplug_standins::kubelet::{Kubelet, Plugin};
use devplug_standins::proto::deviceplugin as pb;

/// Every change of a DRA pool on this node: its driver and device names.
pub(super) async fn print_pools(api: Arc<apiserver::ApiServer>, node: String) {
    let mut last: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut ticks = tokio::time::interval(Duration::from_millis(100));
    loop {
        ticks.tick().await;
        let drivers: std::collections::BTreeSet<String> =
            api.slices(&node, None).values().filter_map(|s| s["spec"]["driver"].as_str().map(str::to_owned)).collect();
        for driver in drivers {
            let names: Vec<String> = api.devices(&node, &driver).into_keys().collect();
            if !names.is_empty() && last.get(&driver) != Some(&names) {
                say!("DRA driver {driver}: {} devices published: {}", names.len(), names.join(" "));
                last.insert(driver, names);
            }
        }
    }
}

/// Every registration and every new device list, as they happen.
pub(super) async fn print_changes(kubelet: Arc<Kubelet>) {
    let mut seen: BTreeMap<String, u64> = BTreeMap::new();
    let mut ticks = tokio::time::interval(Duration::from_millis(100));
    loop {
        ticks.tick().await;
        for p in kubelet.plugins().await {
            let updates = p.updates.load(Ordering::SeqCst);
            match seen.insert(p.resource.clone(), updates) {
                None => {
                    say!(
                        "registered {} (preferred allocation: {}, pre-start: {})",
                        p.resource,
                        yes(p.options.get_preferred_allocation_available),
                        yes(p.options.pre_start_required)
                    );
                    print_devices(&p);
                }
                Some(before) if before != updates => print_devices(&p),
                Some(_) => {}
            }
        }
    }
}

fn yes(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

fn print_devices(p: &Plugin) {
    let list = p.devices.borrow().clone();
    let healthy = list.iter().filter(|d| d.health == "Healthy").count();
    let ids: Vec<String> = list
        .iter()
        .map(|d| if d.health == "Healthy" { d.id.clone() } else { format!("{} (Unhealthy)", d.id) })
        .collect();
    say!("{}: {} devices, {healthy} healthy: {}", p.resource, list.len(), ids.join(" "));
}

pub(super) async fn list(kubelet: &Kubelet) {
    let plugins = kubelet.plugins().await;
    if plugins.is_empty() {
        say!("nothing registered yet");
    }
    for p in plugins {
        print_devices(&p);
    }
}

/// `RESOURCE ID...` or `RESOURCE COUNT`, asked as kubelet asks: one container.
/// `dra`: the resources served through DRA, which kubelet never sees through the Device Plugin API.
pub(super) async fn allocate(kubelet: &Kubelet, words: &[&str], dra: &[String]) -> anyhow::Result<serde_json::Value> {
    let [resource, rest @ ..] = words else { anyhow::bail!("allocate RESOURCE ID...|COUNT") };
    anyhow::ensure!(!rest.is_empty(), "allocate RESOURCE ID...|COUNT");
    if dra.iter().any(|r| r == resource) {
        anyhow::bail!(
            "{resource} is served through DRA here (api = \"dra\"), not the Device Plugin API: ask for it with `claim FILE` or `claim DRIVER DEVICE...`"
        );
    }
    let Some(p) = kubelet.plugin(resource).await else {
        let registered: Vec<String> = kubelet.plugins().await.into_iter().map(|p| p.resource).collect();
        anyhow::bail!("{resource} is not registered with this kubelet (registered: {})", registered.join(", "));
    };
    let mut client = p.client.clone();
    let ids: Vec<String> = match rest {
        [count] if count.parse::<usize>().is_ok() => {
            let n: usize = count.parse()?;
            let healthy: Vec<String> =
                p.devices.borrow().iter().filter(|d| d.health == "Healthy").map(|d| d.id.clone()).collect();
            anyhow::ensure!(healthy.len() >= n, "{resource} has {} healthy devices, {n} asked for", healthy.len());
            if p.options.get_preferred_allocation_available {
                let req = pb::PreferredAllocationRequest {
                    container_requests: vec![pb::ContainerPreferredAllocationRequest {
                        available_device_i_ds: healthy.clone(),
                        must_include_device_i_ds: vec![],
                        allocation_size: n as i32,
                    }],
                };
                let resp = client.get_preferred_allocation(req).await?.into_inner();
                resp.container_responses.into_iter().next().map(|c| c.device_i_ds).unwrap_or_default()
            } else {
                healthy.into_iter().take(n).collect()
            }
        }
        ids => ids.iter().map(|s| (*s).to_owned()).collect(),
    };
    let req =
        pb::AllocateRequest { container_requests: vec![pb::ContainerAllocateRequest { devices_ids: ids.clone() }] };
    let c = client.allocate(req).await?.into_inner().container_responses.into_iter().next().unwrap_or_default();
    Ok(serde_json::json!({
        "resource": resource,
        "allocated": ids,
        "envs": c.envs.into_iter().collect::<BTreeMap<_, _>>(),
        "devices": c.devices.iter().map(|d| serde_json::json!({
            "host_path": d.host_path, "container_path": d.container_path, "permissions": d.permissions,
        })).collect::<Vec<_>>(),
        "mounts": c.mounts.iter().map(|m| serde_json::json!({
            "host_path": m.host_path, "container_path": m.container_path, "read_only": m.read_only,
        })).collect::<Vec<_>>(),
        "annotations": c.annotations.into_iter().collect::<BTreeMap<_, _>>(),
        "cdi_devices": c.cdi_devices.iter().map(|d| d.name.clone()).collect::<Vec<_>>(),
    }))
}
