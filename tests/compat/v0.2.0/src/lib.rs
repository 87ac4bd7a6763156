//! The compatibility backend of `devplug:backend@0.2.0`: the 0.1.0 one (`../v0.1.0`) built against
//! the frozen 0.2.0 contract and checked in as bytes, so every later host proves it still loads
//! what 0.2.0 vendors shipped. Besides every 0.1.0 import it uses what 0.2.0 added once
//! (`sysfs.read-many`, `procfs.read`).
//!
//! Serves `compat.devplug.io/widget`: one device per `widget*` node under `/dev`, each tagged
//! with the vendor ID of PCI function `0000:00:01.0`.

wit_bindgen::generate!({
    path: "../../../wit/since_v0.2.0",
    world: "devplug-backend",
    generate_all,
});

use devplug::backend::types::*;
use devplug::backend::{devfs, log, procfs, sysfs};
use exports::devplug::backend::backend::Guest;

const RESOURCE: &str = "compat.devplug.io/widget";
const PCI: &str = "bus/pci/devices/0000:00:01.0";

struct Compat;

fn edits() -> ContainerEdits {
    ContainerEdits { device_nodes: vec![], mounts: vec![], env: vec![], annotations: vec![] }
}

impl Guest for Compat {
    fn init(_config: String) -> Result<Info, BackendError> {
        log::log(log::Level::Info, "compat backend (WIT 0.2.0) starting");
        Ok(Info {
            name: "compat".into(),
            version: "0.2.0".into(),
            resources: vec![ResourceInfo { name: RESOURCE.into(), preferred_allocation: true, pre_start_required: false }],
        })
    }

    fn discover() -> Result<Vec<Resource>, BackendError> {
        let vendor = sysfs::read(&format!("{PCI}/vendor")).map_err(BackendError::Host)?;
        let entries = sysfs::list_dir(PCI).map_err(BackendError::Host)?;
        let driver = sysfs::read_link(&format!("{PCI}/driver")).ok().and_then(|t| t.rsplit('/').next().map(str::to_owned));
        let real = sysfs::canonical(PCI).map_err(BackendError::Host)?;
        let batch = sysfs::read_many(&[format!("{PCI}/vendor"), format!("{PCI}/device")]);
        let batched = batch.iter().filter(|r| r.is_ok()).count();
        let uptime = procfs::read("uptime").is_ok();
        let devices = devfs::glob("widget*")
            .map_err(BackendError::Host)?
            .into_iter()
            .filter(|n| matches!(n.kind, devfs::NodeKind::Character))
            .map(|n| {
                let st = devfs::stat(&n.path);
                Device {
                    id: n.path.clone(),
                    health: if st.is_ok() { Health::Healthy } else { Health::Unhealthy },
                    numa_nodes: vec![],
                    attributes: vec![
                        ("vendor".into(), vendor.clone()),
                        ("entries".into(), entries.len().to_string()),
                        ("driver".into(), driver.clone().unwrap_or_default()),
                        ("real".into(), real.clone()),
                        ("node".into(), format!("{}:{}", n.major, n.minor)),
                        ("batched".into(), batched.to_string()),
                        ("procfs".into(), uptime.to_string()),
                    ],
                    edits: ContainerEdits {
                        device_nodes: vec![DeviceNode {
                            container_path: format!("/dev/{}", n.path),
                            host_path: String::new(),
                            permissions: String::new(),
                        }],
                        ..edits()
                    },
                }
            })
            .collect();
        Ok(vec![Resource { name: RESOURCE.into(), devices, common_edits: edits() }])
    }

    fn preferred_allocation(
        _resource: String,
        available: Vec<String>,
        must_include: Vec<String>,
        size: u32,
    ) -> Result<Vec<String>, BackendError> {
        // Highest IDs first, so a test can tell this answer from the host's own choice.
        let mut pick = must_include.clone();
        let mut rest: Vec<String> = available.into_iter().filter(|a| !must_include.contains(a)).collect();
        rest.sort();
        while pick.len() < size as usize {
            match rest.pop() {
                Some(id) => pick.push(id),
                None => break,
            }
        }
        Ok(pick)
    }

    fn allocate(resource: String, ids: Vec<String>) -> Result<ContainerEdits, BackendError> {
        if resource != RESOURCE {
            return Err(BackendError::UnknownResource(resource));
        }
        Ok(ContainerEdits { env: vec![("COMPAT_WIDGETS_V2".into(), ids.join(","))], ..edits() })
    }

    fn pre_start(_resource: String, _ids: Vec<String>) -> Result<(), BackendError> {
        Ok(())
    }
}

export!(Compat);
