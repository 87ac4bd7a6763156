//! Allocate load through the kubelet stand-in while backends change underneath: four clients
//! calling back to back on the four devices every chaos version has, each checking every answer.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use devplug_standins::proto::deviceplugin as pb;

pub struct Load {
    pub stop: Arc<AtomicBool>,
    pub calls: Arc<AtomicU64>,
    pub tasks: Vec<tokio::task::JoinHandle<Result<Vec<String>, String>>>,
}

/// Four clients calling Allocate back to back on the four devices every version has, each
/// checking every answer: right IDs, and a backend version that never goes backwards.
pub fn start_load(plugin: &super::kubelet::Plugin) -> Load {
    let stop = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicU64::new(0));
    let tasks = (0..4)
        .map(|i| {
            let (stop, calls, mut client) = (stop.clone(), calls.clone(), plugin.client.clone());
            tokio::spawn(async move {
                let id = format!("widget-{i}");
                let mut versions: Vec<String> = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let resp = client.allocate(alloc(&id)).await.map_err(|e| format!("Allocate {id} failed: {e}"))?;
                    let envs = &resp.get_ref().container_responses[0].envs;
                    if envs.get("CHAOS_IDS") != Some(&id) {
                        return Err(format!("wrong answer for {id}: {envs:?}"));
                    }
                    let v = envs.get("CHAOS_VERSION").cloned().unwrap_or_default();
                    if versions.last() != Some(&v) {
                        versions.push(v);
                    }
                    calls.fetch_add(1, Ordering::Relaxed);
                }
                Ok(versions)
            })
        })
        .collect();
    Load { stop, calls, tasks }
}

pub fn alloc(id: &str) -> pb::AllocateRequest {
    pb::AllocateRequest { container_requests: vec![pb::ContainerAllocateRequest { devices_ids: vec![id.to_owned()] }] }
}
