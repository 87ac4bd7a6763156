//! The FPGA backend: AMD/Xilinx Alveo cards and Intel DFL (OPAE) cards.
//!
//! **Alveo** (XRT ≥ 2018.3): each card is a management PF (`mgmt_pf`, driver `xclmgmt`, node
//! `/dev/xclmgmt<instance>`) and a user PF (`user_pf`, driver `xocl`, its `drm/renderD*`). One
//! device per card, ID the user PF's address; the resource is named after the loaded shell and
//! its timestamp, as Xilinx's plugin does: `xilinx.com/fpga-<VBNV>-<timestamp>`, so pods ask for
//! the shell they were built for.
//!
//! **Intel DFL**: every `class/fpga_region/regionN` holding ports (`dfl-port.M`) is a card. Each
//! port with its loaded AFU is one device (ID `<card address>-port<M>`, node `/dev/dfl-port.M`);
//! the resource is named from the region's interface ID (the FME PR region's `compat_id`) and the
//! AFU ID: `fpga.intel.com/af-<interface id, 8 hex>-<afu id>`, the shape of Intel's `af` mode.
//! A port whose `afu_id` is all `f` has no usable AFU and is Unhealthy.
//!
//! Resource names depend on what is programmed, so `init` declares the names found then; a card
//! reprogrammed to a new shell or AFU shows up after the backend is reloaded (hot-swap or
//! restart), which matches how reprogramming is done: drained.
//!
//! Config (TOML, optional): `families = ["xilinx", "dfl"]`.

use devplug_sdk::pci::PciDevice;
use devplug_sdk::{Backend, BackendError, Device, Info, Resource, ResourceInfo, Sys, edits, invalid_config};
use serde::Deserialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Family {
    Xilinx,
    Dfl,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Config {
    families: Option<Vec<Family>>,
}

/// Name parts of extended resources are at most 63 characters of `[A-Za-z0-9._-]`.
fn resource_name(domain: &str, name: &str) -> String {
    let mut n = devplug_sdk::id_chars(name);
    n.truncate(63);
    let n = n.trim_end_matches(['.', '_', '-']).to_owned();
    format!("{domain}/{n}")
}

/// One card found, as a device of a resource.
struct Found {
    resource: String,
    device: Device,
}

fn xilinx(sys: &dyn Sys) -> Vec<Found> {
    let funcs = PciDevice::list(sys, |v, _| v == 0x10ee).unwrap_or_default();
    let mut out = Vec::new();
    for user in funcs.iter().filter(|f| sys.read(&f.attr("user_pf")).is_ok()) {
        let entries = sys.list(&user.path()).unwrap_or_default();
        let rom = entries.iter().find(|e| e.starts_with("rom"));
        let read_rom = |attr: &str| rom.and_then(|r| sys.read(&user.attr(&format!("{r}/{attr}"))).ok());
        let (Some(vbnv), Some(ts)) = (read_rom("VBNV"), read_rom("timestamp")) else {
            devplug_sdk::log(
                devplug_sdk::Level::Warn,
                &format!("{}: user PF without a readable rom.*/VBNV and timestamp; skipped", user.address),
            );
            continue;
        };
        // The management PF is function 0 of the same slot (the user PF is function 1).
        let slot = &user.address[..user.address.len() - 1];
        let mgmt = funcs.iter().find(|f| f.address.starts_with(slot) && sys.read(&f.attr("mgmt_pf")).is_ok());
        let mut nodes: Vec<String> = user
            .class_dir(sys, "drm")
            .into_iter()
            .filter(|n| n.starts_with("renderD"))
            .map(|n| format!("dri/{n}"))
            .collect();
        let mut problem = user.sickness(sys, |d| d == "xocl");
        if let Some(m) = mgmt {
            if let Ok(inst) = sys.read(&m.attr("instance")) {
                nodes.push(format!("xclmgmt{}", inst.trim()));
            }
            if problem.is_none() {
                problem = m.sickness(sys, |d| d == "xclmgmt").map(|p| format!("management PF: {p}"));
            }
        }
        if problem.is_none() {
            problem = nodes.iter().find(|n| sys.dev_stat(n).is_err()).map(|n| format!("/dev/{n} is missing"));
        }
        let serial = entries
            .iter()
            .find(|e| e.starts_with("xmc"))
            .and_then(|x| sys.read(&user.attr(&format!("{x}/serial_num"))).ok());
        let mut attributes = vec![
            ("pci".to_owned(), user.address.clone()),
            ("shell".to_owned(), vbnv.trim().to_owned()),
            ("model".to_owned(), user.vendor_device()),
        ];
        if let Some(s) = serial {
            attributes.push(("serial".into(), s.trim().to_owned()));
        }
        out.push(Found {
            resource: resource_name("xilinx.com", &format!("fpga-{}-{}", vbnv.trim(), ts.trim())),
            device: Device::new(&user.address)
                .numa(user.numa_node)
                .attrs(attributes)
                .edits(edits::nodes(nodes.iter().map(String::as_str)))
                .problem(problem.as_deref()),
        });
    }
    out
}

fn dfl(sys: &dyn Sys) -> Vec<Found> {
    let mut out = Vec::new();
    for region in sys.list("class/fpga_region").unwrap_or_default() {
        let dir = format!("class/fpga_region/{region}");
        let entries = sys.list(&dir).unwrap_or_default();
        let ports: Vec<&String> = entries.iter().filter(|e| e.starts_with("dfl-port.")).collect();
        if ports.is_empty() {
            continue; // a PR sub-region of an FME, or a region without ports
        }
        let interface = entries
            .iter()
            .filter(|e| e.starts_with("dfl-fme."))
            .find_map(|fme| {
                let fdir = format!("{dir}/{fme}");
                sys.list(&fdir).unwrap_or_default().into_iter().filter(|e| e.starts_with("dfl-fme-region.")).find_map(
                    |pr| {
                        let prdir = format!("{fdir}/{pr}/fpga_region");
                        sys.list(&prdir)
                            .unwrap_or_default()
                            .into_iter()
                            .find_map(|r| sys.read(&format!("{prdir}/{r}/compat_id")).ok())
                    },
                )
            })
            .map(|s| s.trim().to_owned());
        let card = sys
            .canonical(&dir)
            .ok()
            .and_then(|c| c.split('/').rfind(|p| devplug_sdk::pci::is_pci_address(p)).map(str::to_owned));
        let numa = card.as_deref().and_then(|a| PciDevice::read(sys, a).ok()).and_then(|d| d.numa_node);
        for port in ports {
            let pdir = format!("{dir}/{port}");
            let afu = sys.read(&format!("{pdir}/afu_id")).map(|s| s.trim().to_owned());
            let n = port.trim_start_matches("dfl-port.");
            let id = match &card {
                Some(c) => format!("{c}-port{n}"),
                None => format!("{region}-port{n}"),
            };
            let (Ok(afu), Some(iface)) = (afu, interface.as_ref()) else {
                devplug_sdk::log(
                    devplug_sdk::Level::Warn,
                    &format!("{pdir}: no afu_id or no FME interface ID (compat_id); skipped"),
                );
                continue;
            };
            let mut problem = None;
            if afu.chars().all(|c| c == 'f' || c == 'F') {
                problem = Some("no AFU loaded (afu_id is all f)".to_owned());
            } else if sys.link_name(&format!("{pdir}/driver")).is_none() {
                problem = Some("port has no driver bound".to_owned());
            } else if sys.dev_stat(port).is_err() {
                problem = Some(format!("/dev/{port} is missing"));
            }
            let mut attributes = vec![("afu-id".to_owned(), afu.clone()), ("interface-id".to_owned(), iface.clone())];
            if let Some(c) = &card {
                attributes.push(("pci".into(), c.clone()));
            }
            let short: String = iface.chars().take(8).collect();
            out.push(Found {
                resource: resource_name("fpga.intel.com", &format!("af-{short}-{afu}")),
                device: Device::new(id)
                    .numa(numa)
                    .attrs(attributes)
                    .edits(edits::nodes([port.as_str()]))
                    .problem(problem.as_deref()),
            });
        }
    }
    out
}

pub struct Fpga {
    families: Vec<Family>,
    declared: Vec<String>,
}

impl Fpga {
    fn scan(&self, sys: &dyn Sys) -> Vec<Found> {
        let mut out = Vec::new();
        for f in &self.families {
            out.extend(match f {
                Family::Xilinx => xilinx(sys),
                Family::Dfl => dfl(sys),
            });
        }
        out
    }
}

impl Backend for Fpga {
    fn init(config: &str, sys: &dyn Sys) -> Result<(Self, Info), BackendError> {
        let cfg: Config = toml::from_str(config).map_err(invalid_config)?;
        let mut me =
            Fpga { families: cfg.families.unwrap_or_else(|| vec![Family::Xilinx, Family::Dfl]), declared: vec![] };
        let mut names: Vec<String> = me.scan(sys).into_iter().map(|f| f.resource).collect();
        names.sort();
        names.dedup();
        me.declared = names.clone();
        let resources = names.into_iter().map(ResourceInfo::plain);
        let info = Info::new("fpga", env!("CARGO_PKG_VERSION"), resources);
        Ok((me, info))
    }

    fn discover(&self, sys: &dyn Sys) -> Result<Vec<Resource>, BackendError> {
        let mut out: Vec<Resource> = self
            .declared
            .iter()
            .map(|n| Resource { name: n.clone(), devices: Vec::new(), common_edits: edits::empty() })
            .collect();
        for f in self.scan(sys) {
            match out.iter_mut().find(|r| r.name == f.resource) {
                Some(r) => r.devices.push(f.device),
                None => out.push(Resource { name: f.resource, devices: vec![f.device], common_edits: edits::empty() }),
            }
        }
        Ok(out)
    }

    /// Typed facts for DRA: a DFL port's number and whether an AFU is loaded; the card's
    /// serial number and a Xilinx shell as text (discover's names, as C identifiers).
    fn describe(&self, sys: &dyn Sys) -> Result<devplug_sdk::dra::PoolDescription, BackendError> {
        use devplug_sdk::dra::{self, AttributeValue};
        let mut devices = Vec::new();
        for r in self.discover(sys)? {
            for d in &r.devices {
                let attr = |k: &str| d.attributes.iter().find(|(key, _)| key == k).map(|(_, v)| v.as_str());
                let mut attributes = Vec::new();
                if let Some(n) = d.id.rsplit_once("-port").and_then(|(_, n)| n.parse::<i64>().ok()) {
                    attributes.push(("port".into(), AttributeValue::Integer(n)));
                }
                if let Some(afu) = attr("afu-id") {
                    attributes
                        .push(("afu_loaded".into(), AttributeValue::Flag(!afu.chars().all(|c| c == 'f' || c == 'F'))));
                }
                if let Some(shell) = attr("shell") {
                    attributes.push(("shell".into(), AttributeValue::Text(shell.chars().take(64).collect())));
                }
                devices.push(dra::DeviceDescription { attributes, ..dra::describe(&r.name, &d.id) });
            }
        }
        Ok(dra::PoolDescription { counter_sets: Vec::new(), devices })
    }
}

devplug_sdk::backend!(Fpga);

#[cfg(test)]
mod tests {
    use super::*;
    use devplug_sdk::{FixtureSys, Health};

    fn fixture(name: &str) -> FixtureSys {
        FixtureSys::repo_machine(name)
    }

    #[test]
    fn alveo_is_one_device_named_after_its_shell_with_both_nodes() {
        let sys = fixture("alveo-u250");
        let (b, info) = Fpga::init("", &sys).unwrap();
        assert_eq!(info.resources[0].name, "xilinx.com/fpga-xilinx_u250_gen3x16_xdma_shell_4_1-1599634287");
        let res = b.discover(&sys).unwrap();
        let d = &res[0].devices[0];
        assert_eq!(d.id, "0000:d8:00.1");
        let paths: Vec<&str> = d.edits.device_nodes.iter().map(|n| n.container_path.as_str()).collect();
        assert_eq!(paths, ["/dev/dri/renderD128", "/dev/xclmgmt55296"]);
        assert_eq!(d.health, Health::Healthy);
    }

    #[test]
    fn dfl_port_is_named_by_interface_and_afu() {
        let sys = fixture("intel-dfl");
        let (b, info) = Fpga::init("", &sys).unwrap();
        assert_eq!(info.resources.len(), 1, "the PR sub-region is not a card");
        assert_eq!(info.resources[0].name, "fpga.intel.com/af-9346116d-d8424dc4a4a3c413f89e433683f9040b");
        let res = b.discover(&sys).unwrap();
        assert_eq!(res[0].devices[0].id, "0000:3b:00.0-port0");
        assert_eq!(res[0].devices[0].edits.device_nodes[0].container_path, "/dev/dfl-port.0");
        let pool = b.describe(&sys).unwrap();
        use devplug_sdk::dra::AttributeValue::{Flag, Integer};
        let port = &pool.devices[0].attributes;
        assert!(
            port.contains(&("port".into(), Integer(0))) && port.contains(&("afu_loaded".into(), Flag(true))),
            "{port:?}"
        );
    }

    #[test]
    fn long_shell_names_are_cut_to_kubelets_limit() {
        let n = resource_name("xilinx.com", &format!("fpga-{}-1", "x".repeat(80)));
        assert_eq!(n.len(), "xilinx.com/".len() + 63);
    }
}
