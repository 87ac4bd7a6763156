//! The kubelet stand-in's pod resources API (`/v1.PodResourcesLister` on its own socket): tests
//! record which container got which devices (after Allocate, as kubelet does), devplug lists them.
//! Like kubelet, it lists only pods that hold something and answers `List` over a Unix socket.

use std::path::Path;
use std::sync::{Arc, Mutex};

use super::uds;
use devplug::proto::podresources as pr;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

/// (namespace, pod, container, resource, device IDs)
type Held = Arc<Mutex<Vec<(String, String, String, String, Vec<String>)>>>;

/// The test's handle; dropping it stops the server.
pub struct PodResources {
    held: Held,
    _stop: tokio_util::sync::DropGuard,
}

struct Lister {
    held: Held,
}

impl PodResources {
    /// Serve on `socket` until dropped.
    pub fn serve(socket: &Path) -> PodResources {
        std::fs::create_dir_all(socket.parent().expect("socket dir")).expect("mkdir");
        let held = Held::default();
        let stop = CancellationToken::new();
        let listener = uds::bind(socket).expect("bind pod resources socket");
        let svc = Lister { held: held.clone() };
        let me = PodResources { held, _stop: stop.clone().drop_guard() };
        tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(pr::pod_resources_lister_server::PodResourcesListerServer::new(svc))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), stop.cancelled_owned())
                .await;
        });
        me
    }

    /// Kubelet admitted a container holding these devices.
    pub fn assign(&self, namespace: &str, pod: &str, container: &str, resource: &str, ids: &[&str]) {
        let ids = ids.iter().map(|s| (*s).to_owned()).collect();
        if let Ok(mut h) = self.held.lock() {
            h.push((namespace.into(), pod.into(), container.into(), resource.into(), ids));
        }
    }
}

#[tonic::async_trait]
impl pr::pod_resources_lister_server::PodResourcesLister for Lister {
    async fn list(
        &self,
        _: Request<pr::ListPodResourcesRequest>,
    ) -> Result<Response<pr::ListPodResourcesResponse>, Status> {
        let held = self.held.lock().map_err(|_| Status::internal("lock"))?.clone();
        let mut pods: Vec<pr::PodResources> = Vec::new();
        for (ns, pod, container, resource, ids) in held {
            let idx = match pods.iter().position(|p| p.name == pod && p.namespace == ns) {
                Some(i) => i,
                None => {
                    pods.push(pr::PodResources { name: pod.clone(), namespace: ns.clone(), containers: vec![] });
                    pods.len() - 1
                }
            };
            pods[idx].containers.push(pr::ContainerResources {
                name: container,
                devices: vec![pr::ContainerDevices { resource_name: resource, device_ids: ids, topology: None }],
                cpu_ids: vec![],
            });
        }
        Ok(Response::new(pr::ListPodResourcesResponse { pod_resources: pods }))
    }

    async fn get_allocatable_resources(
        &self,
        _: Request<pr::AllocatableResourcesRequest>,
    ) -> Result<Response<pr::AllocatableResourcesResponse>, Status> {
        Ok(Response::new(pr::AllocatableResourcesResponse::default()))
    }

    async fn get(
        &self,
        req: Request<pr::GetPodResourcesRequest>,
    ) -> Result<Response<pr::GetPodResourcesResponse>, Status> {
        let r = req.into_inner();
        Err(Status::not_found(format!("pod {}/{} not found", r.pod_namespace, r.pod_name)))
    }
}
