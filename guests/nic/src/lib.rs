//! The NIC backend: network functions (PCI class `02xx`) grouped into resource pools by
//! selectors, the SR-IOV network device plugin's model.
//!
//! Each pool selects functions by vendor, device ID, driver, PF interface name, link type, RDMA
//! capability and kind (VF/PF); a function belongs to the **first** pool that selects it. What a
//! container gets depends on how the function is bound:
//! - `vfio-pci`: `/dev/vfio/<iommu group>` (+ `/dev/vfio/vfio` once per container);
//! - a kernel netdev: nothing in `/dev`; its interface name and PCI address go in the env
//!   (`NETDEVICE_<POOL>`, `PCIDEVICE_<POOL>`) for the CNI to move into the pod;
//! - RDMA-capable: `/dev/infiniband/uverbsN` (+ `/dev/infiniband/rdma_cm`).
//!
//! Health: Unhealthy without a driver, after fatal AER errors, or when the link is down (the
//! function's own carrier, or its PF's for a VF without a netdev; for a function with an RDMA
//! device and no netdev at all, an EFA or an InfiniBand HCA without IPoIB, its RDMA ports'
//! `state`: none ACTIVE is down).
//!
//! Config (TOML). Without one, three pools serve every VF: `devplug.io/sriov_vfio`,
//! `devplug.io/sriov_rdma`, `devplug.io/sriov_netdev`.
//! ```toml
//! [[pool]]
//! name = "example.com/cx6_rdma"
//! vendors = ["15b3"]          # hex, as in sysfs
//! devices = ["101e"]
//! drivers = ["mlx5_core"]
//! pf_names = ["ens1f0np0"]    # the VF's PF netdev (a PF's own name for functions = "pf")
//! link_types = ["ether"]      # ether | infiniband
//! rdma = true                 # only RDMA-capable (false: only without RDMA)
//! functions = "vf"            # vf (default) | pf | any
//! ```

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

use devplug_sdk::pci::{PciCache, PciDevice, is_pci_address};
use devplug_sdk::sys::{each, last_component};
use devplug_sdk::topology::pack_pci;
use devplug_sdk::{
    Backend, BackendError, ContainerEdits, Device, Info, Resource, ResourceInfo, Sys, edits, invalid_config,
};
use serde::Deserialize;

const DEFAULT_CONFIG: &str = r#"
[[pool]]
name = "devplug.io/sriov_vfio"
drivers = ["vfio-pci"]

[[pool]]
name = "devplug.io/sriov_rdma"
rdma = true

[[pool]]
name = "devplug.io/sriov_netdev"
"#;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default)]
    pool: Vec<Pool>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Functions {
    #[default]
    Vf,
    Pf,
    Any,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Pool {
    name: String,
    #[serde(default)]
    vendors: Vec<String>,
    #[serde(default)]
    devices: Vec<String>,
    #[serde(default)]
    drivers: Vec<String>,
    #[serde(default)]
    pf_names: Vec<String>,
    #[serde(default)]
    link_types: Vec<String>,
    rdma: Option<bool>,
    #[serde(default)]
    functions: Functions,
}

/// One network function and what the selectors and edits need of it.
#[derive(Clone)]
struct Nic {
    pci: PciDevice,
    pf: Option<PciDevice>,
    /// Interface name and its sysfs directory.
    netdev: Option<(String, String)>,
    /// The PF's interface name and sysfs directory, for a VF.
    pf_link: Option<(String, String)>,
    pf_netdev: Option<String>,
    link_type: Option<&'static str>,
    verbs: Vec<String>,
    ib_device: Option<String>,
    /// IOMMU group, for functions bound to vfio-pci.
    iommu: Option<String>,
}

impl Nic {
    /// Read the functions in `fresh`, each kind of fact for all of them in one host call. `all`
    /// is every network function by address, so a VF's PF is looked up rather than read again.
    fn read_all(sys: &dyn Sys, fresh: &[&PciDevice], all: &Table) -> Vec<Nic> {
        let netdev = |p: &PciDevice| all.get(p.address.as_str()).and_then(|(_, n)| n.clone());
        // A function bound to vfio-pci has no kernel children to look for.
        let kernel = |p: &PciDevice| p.driver.as_deref().is_some_and(|d| d != "vfio-pci");
        let vfio = |p: &PciDevice| p.driver.as_deref() == Some("vfio-pci");
        let link_name = |r: Option<Result<String, _>>| r.and_then(|r| r.ok()).and_then(|t| last_component(&t));
        let physfns = each(fresh, |p| Some(p.attr("physfn")), |paths| sys.read_link_many(paths));
        let types = each(fresh, |p| netdev(p).map(|(_, dir)| format!("{dir}/type")), |paths| sys.read_many(paths));
        let verbs = each(fresh, |p| kernel(p).then(|| p.attr("infiniband_verbs")), |paths| sys.list_many(paths));
        let ibs = each(fresh, |p| kernel(p).then(|| p.attr("infiniband")), |paths| sys.list_many(paths));
        let groups = each(fresh, |p| vfio(p).then(|| p.attr("iommu_group")), |paths| sys.read_link_many(paths));
        let facts = physfns.into_iter().zip(types).zip(verbs).zip(ibs).zip(groups);
        fresh
            .iter()
            .zip(facts)
            .map(|(pci, ((((physfn, link_type), verbs), ib), group))| {
                let pf_entry = link_name(physfn).filter(|a| is_pci_address(a)).and_then(|a| all.get(a.as_str()));
                let pf = pf_entry.map(|(p, _)| (*p).clone());
                let pf_link = pf_entry.and_then(|(_, n)| n.clone());
                let netdev = netdev(pci);
                let pf_netdev = match &pf {
                    Some(_) => pf_link.as_ref().map(|(n, _)| n.clone()),
                    None => netdev.as_ref().map(|(n, _)| n.clone()),
                };
                let link_type = link_type.and_then(|r| r.ok()).map(|t| match t.trim() {
                    "32" => "infiniband",
                    "1" => "ether",
                    _ => "other",
                });
                Nic {
                    pci: (*pci).clone(),
                    pf,
                    netdev,
                    pf_link,
                    pf_netdev,
                    link_type,
                    verbs: verbs.and_then(|r| r.ok()).unwrap_or_default(),
                    ib_device: ib.and_then(|r| r.ok()).and_then(|l| l.into_iter().next()),
                    iommu: link_name(group),
                }
            })
            .collect()
    }

    fn vfio(&self) -> bool {
        self.pci.driver.as_deref() == Some("vfio-pci")
    }

    fn rdma(&self) -> bool {
        !self.verbs.is_empty()
    }

    fn selected_by(&self, p: &Pool) -> bool {
        let hex = |v: u16| format!("{v:04x}");
        let any = |list: &[String], v: &str| list.is_empty() || list.iter().any(|x| x.eq_ignore_ascii_case(v));
        let kind_ok = match p.functions {
            Functions::Vf => self.pf.is_some(),
            Functions::Pf => self.pf.is_none(),
            Functions::Any => true,
        };
        kind_ok
            && any(&p.vendors, &hex(self.pci.vendor))
            && any(&p.devices, &hex(self.pci.device))
            && any(&p.drivers, self.pci.driver.as_deref().unwrap_or(""))
            && any(&p.pf_names, self.pf_netdev.as_deref().unwrap_or(""))
            && any(&p.link_types, self.link_type.unwrap_or(""))
            && p.rdma.is_none_or(|want| want == self.rdma())
    }

    /// The sysfs directory whose `carrier` tells whether this function can carry traffic: its
    /// own interface's, or for a VF without one its PF's. `None`: no link to watch.
    fn carrier_dir(&self) -> Option<&(String, String)> {
        self.netdev.as_ref().or(self.pf_link.as_ref())
    }

    fn nodes(&self) -> Vec<String> {
        let mut nodes = Vec::new();
        if self.vfio()
            && let Some(g) = &self.iommu
        {
            nodes.push(format!("vfio/{g}"));
        }
        nodes.extend(self.verbs.iter().map(|v| format!("infiniband/{v}")));
        nodes
    }
}

/// Why each function cannot carry traffic, if it cannot: PCI health (no driver, fatal AER), then
/// its link: the carrier of its interface (or its PF's), or for an RDMA-only function (an EFA,
/// an InfiniBand HCA without IPoIB: no interface at all) the state of its RDMA ports. A few host
/// calls for all of them: their AER counters, the carrier of each distinct link (every VF of a
/// PF asks about the same one), the RDMA-only functions' port lists and their states.
fn problems<'a>(sys: &dyn Sys, nics: impl Iterator<Item = &'a Nic>) -> Vec<Option<String>> {
    let nics: Vec<&Nic> = nics.collect();
    let pcis: Vec<PciDevice> = nics.iter().map(|n| n.pci.clone()).collect();
    let sick = PciDevice::sickness_many(sys, &pcis, |_| true);
    let dirs: Vec<String> = nics
        .iter()
        .filter_map(|n| n.carrier_dir())
        .map(|(_, d)| d.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let carriers: Vec<String> = dirs.iter().map(|d| format!("{d}/carrier")).collect();
    // `carrier` alone: it reads 0 whenever operstate is down.
    let up: BTreeMap<&String, bool> =
        dirs.iter().zip(sys.read_many(&carriers)).map(|(d, c)| (d, c.is_ok_and(|c| c.trim() == "1"))).collect();
    let ports = rdma_ports(sys, &nics);
    nics.iter()
        .zip(sick)
        .zip(ports)
        .map(|((n, sick), ports)| {
            sick.or_else(|| match n.carrier_dir() {
                Some((ifname, dir)) => {
                    (!up.get(dir).copied().unwrap_or(false)).then(|| format!("link down on {ifname}"))
                }
                None => ports,
            })
        })
        .collect()
}

/// For each function with an RDMA device and no interface to watch: why none of its ports can
/// carry traffic, if none can. The IB core prints a port's `state` as `"%d: %s"`
/// (`drivers/infiniband/core/sysfs.c`, `state_show`): 4 ACTIVE and 5 ACTIVE_DEFER carry
/// traffic; 1 DOWN, 2 INIT (link up, no subnet manager yet) and 3 ARMED do not. A port whose
/// state cannot be read counts as down: the kernel always has it.
fn rdma_ports(sys: &dyn Sys, nics: &[&Nic]) -> Vec<Option<String>> {
    let dir = |n: &Nic| -> Option<String> {
        let ib = n.ib_device.as_ref()?;
        n.carrier_dir().is_none().then(|| n.pci.attr(&format!("infiniband/{ib}/ports")))
    };
    let dirs: Vec<Option<String>> = nics.iter().map(|n| dir(n)).collect();
    let listed = each(&dirs, |d| d.clone(), |paths| sys.list_many(paths));
    let mut states: Vec<String> = Vec::new();
    let ports: Vec<Vec<(String, usize)>> = dirs
        .iter()
        .zip(listed)
        .map(|(d, l)| {
            let (Some(d), Some(Ok(names))) = (d, l) else { return Vec::new() };
            names
                .into_iter()
                .map(|p| {
                    states.push(format!("{d}/{p}/state"));
                    (p, states.len() - 1)
                })
                .collect()
        })
        .collect();
    let read: Vec<Option<String>> =
        sys.read_many(&states).into_iter().map(|r| r.ok().map(|s| s.trim().to_owned())).collect();
    nics.iter()
        .zip(dirs.iter().zip(ports))
        .map(|(n, (d, ports))| {
            d.as_ref()?;
            let ib = n.ib_device.as_deref().unwrap_or("?");
            if ports.is_empty() {
                return Some(format!("RDMA device {ib} has no ports"));
            }
            let active = |s: &str| matches!(s.split(':').next().map(str::trim), Some("4" | "5"));
            if ports.iter().any(|(_, i)| read[*i].as_deref().is_some_and(active)) {
                return None;
            }
            let (p, i) = &ports[0];
            let state = read[*i].clone().unwrap_or_else(|| "unreadable".into());
            Some(format!("RDMA port {p} of {ib} is {state}"))
        })
        .collect()
}

/// A function's network interface: under `net/`, or for virtio under `virtioN/net/`.
fn netdev_of(sys: &dyn Sys, pci: &PciDevice) -> Option<(String, String)> {
    let first = |dir: String| sys.list(&dir).ok()?.into_iter().next().map(|n| (n.clone(), format!("{dir}/{n}")));
    if let Some(found) = first(pci.attr("net")) {
        return Some(found);
    }
    if pci.driver.as_deref() != Some("virtio-pci") {
        return None;
    }
    let children = sys.list(&pci.path()).unwrap_or_default();
    children.into_iter().filter(|e| e.starts_with("virtio")).find_map(|e| first(pci.attr(&format!("{e}/net"))))
}

pub struct NicBackend {
    pools: Vec<Pool>,
    pci: PciCache,
    known: RefCell<Known>,
}

type Key = (String, Option<String>);

/// What does not change while a function stays bound to the same driver, kept between polls:
/// a steady-state discover then reads only health (driver link, AER, carrier).
#[derive(Default)]
struct Known {
    netdevs: BTreeMap<Key, Option<(String, String)>>,
    nics: BTreeMap<Key, Nic>,
}

impl NicBackend {
    fn all(&self, sys: &dyn Sys) -> Vec<Nic> {
        let funcs = self.pci.list(sys, |_, class| (class >> 16) as u8 == 0x02).unwrap_or_default();
        let key = |p: &PciDevice| (p.address.clone(), p.driver.clone());
        let mut known = self.known.borrow_mut();
        // Sets and maps, not scans: with hundreds of VFs a per-poll O(n²) shows up in the numbers.
        let live: BTreeSet<Key> = funcs.iter().map(key).collect();
        known.netdevs.retain(|k, _| live.contains(k));
        known.nics.retain(|k, _| live.contains(k));
        if funcs.iter().any(|p| !known.nics.contains_key(&key(p))) {
            // Interfaces of functions not seen before: their `net/` directories in one call.
            let unseen: Vec<&PciDevice> = funcs.iter().filter(|p| !known.netdevs.contains_key(&key(p))).collect();
            let kernel = |p: &PciDevice| p.driver.as_deref() != Some("vfio-pci");
            let nets = each(&unseen, |p| kernel(p).then(|| p.attr("net")), |paths| sys.list_many(paths));
            for (p, net) in unseen.iter().zip(nets) {
                let first = net.and_then(|r| r.ok()).and_then(|l| l.into_iter().next());
                let found = match first {
                    Some(n) => Some((n.clone(), format!("{}/{n}", p.attr("net")))),
                    // virtio keeps its interface one level down (`virtioN/net/`).
                    None if p.driver.as_deref() == Some("virtio-pci") => netdev_of(sys, p),
                    None => None,
                };
                known.netdevs.insert(key(p), found);
            }
            let table: Table = funcs
                .iter()
                .map(|p| (p.address.as_str(), (p, known.netdevs.get(&key(p)).cloned().flatten())))
                .collect();
            let fresh: Vec<&PciDevice> = funcs.iter().filter(|p| !known.nics.contains_key(&key(p))).collect();
            let nics = Nic::read_all(sys, &fresh, &table);
            known.nics.extend(fresh.iter().map(|p| key(p)).zip(nics));
        }
        funcs.iter().filter_map(|p| known.nics.get(&key(p)).cloned()).collect()
    }
}

/// Every network function by address, with its interface (name, sysfs dir) when it has one.
type Table<'a> = BTreeMap<&'a str, (&'a PciDevice, Option<(String, String)>)>;

/// `devplug.io/sriov_netdev` → `DEVPLUG_IO_SRIOV_NETDEV`, as the SR-IOV plugin names its env.
fn env_suffix(resource: &str) -> String {
    resource.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' }).collect()
}

impl Backend for NicBackend {
    fn init(config: &str, _sys: &dyn Sys) -> Result<(Self, Info), BackendError> {
        let text = if config.trim().is_empty() { DEFAULT_CONFIG } else { config };
        let cfg: Config = toml::from_str(text).map_err(invalid_config)?;
        for (i, p) in cfg.pool.iter().enumerate() {
            if !p.name.contains('/') {
                return Err(invalid_config(format!("pool {i}: name {:?} is not an extended resource name", p.name)));
            }
            if cfg.pool[..i].iter().any(|q| q.name == p.name) {
                return Err(invalid_config(format!("pool {:?} is defined twice", p.name)));
            }
            for (field, list, len) in [("vendors", &p.vendors, 4), ("devices", &p.devices, 4)] {
                if let Some(bad) = list.iter().find(|v| v.len() != len || u16::from_str_radix(v, 16).is_err()) {
                    return Err(invalid_config(format!(
                        "pool {:?}: {field} entry {bad:?} is not 4 hex digits",
                        p.name
                    )));
                }
            }
            if let Some(bad) = p.link_types.iter().find(|t| !["ether", "infiniband"].contains(&t.as_str())) {
                return Err(invalid_config(format!("pool {:?}: link type {bad:?} (ether or infiniband)", p.name)));
            }
        }
        let resources = cfg.pool.iter().map(|p| ResourceInfo::plain(p.name.clone()).with_preferred_allocation());
        let info = Info::new("nic", env!("CARGO_PKG_VERSION"), resources);
        Ok((NicBackend { pools: cfg.pool, pci: PciCache::default(), known: RefCell::default() }, info))
    }

    fn discover(&self, sys: &dyn Sys) -> Result<Vec<Resource>, BackendError> {
        let mut pools: Vec<Resource> = self
            .pools
            .iter()
            .map(|p| Resource { name: p.name.clone(), devices: Vec::new(), common_edits: edits::empty() })
            .collect();
        let (mut vfio, mut rdma) = (vec![false; pools.len()], vec![false; pools.len()]);
        let selected: Vec<(usize, Nic)> = self
            .all(sys)
            .into_iter()
            .filter_map(|nic| self.pools.iter().position(|p| nic.selected_by(p)).map(|i| (i, nic)))
            .collect();
        let problems = problems(sys, selected.iter().map(|(_, n)| n));
        for ((i, nic), problem) in selected.into_iter().zip(problems) {
            vfio[i] |= nic.vfio();
            rdma[i] |= nic.rdma();
            let mut attributes = vec![
                ("pci".to_owned(), nic.pci.address.clone()),
                ("model".to_owned(), nic.pci.vendor_device()),
                ("driver".to_owned(), nic.pci.driver.clone().unwrap_or_else(|| "none".into())),
            ];
            let mut more = |k: &str, v: &Option<String>| {
                if let Some(v) = v {
                    attributes.push((k.to_owned(), v.clone()));
                }
            };
            more("netdev", &nic.netdev.as_ref().map(|(n, _)| n.clone()));
            more("pf", &nic.pf.as_ref().map(|p| p.address.clone()));
            more("pf-netdev", &nic.pf_netdev);
            more("rdma", &nic.ib_device);
            let nodes = nic.nodes();
            pools[i].devices.push(
                Device::new(&nic.pci.address)
                    .numa(nic.pci.numa_node)
                    .attrs(attributes)
                    .edits(edits::nodes(nodes.iter().map(String::as_str)))
                    .problem(problem.as_deref()),
            );
        }
        for (i, r) in pools.iter_mut().enumerate() {
            let shared: Vec<&str> = [(vfio[i], "vfio/vfio"), (rdma[i], "infiniband/rdma_cm")]
                .into_iter()
                .filter(|(on, _)| *on)
                .map(|(_, n)| n)
                .collect();
            r.common_edits = edits::nodes(shared.into_iter().filter(|n| sys.dev_stat(n).is_ok()));
        }
        Ok(pools)
    }

    fn preferred_allocation(
        &self,
        sys: &dyn Sys,
        _resource: &str,
        available: &[String],
        must_include: &[String],
        size: u32,
    ) -> Result<Vec<String>, BackendError> {
        // Same NUMA node first, then VFs of the same PF (one physical port, one switch).
        Ok(pack_pci(sys, available, must_include, size, |d| d.physfn(sys).or(Some(d.address.clone()))))
    }

    fn allocate(&self, sys: &dyn Sys, resource: &str, ids: &[String]) -> Result<ContainerEdits, BackendError> {
        if !self.pools.iter().any(|p| p.name == resource) {
            return Err(BackendError::UnknownResource(resource.to_owned()));
        }
        let mut netdevs = Vec::new();
        for id in ids {
            let pci = PciDevice::read(sys, id).map_err(|_| BackendError::UnknownDevice(id.clone()))?;
            if let Some((n, _)) = netdev_of(sys, &pci) {
                netdevs.push(n);
            }
        }
        let suffix = env_suffix(resource);
        let mut e = edits::env(&format!("PCIDEVICE_{suffix}"), &ids.join(","));
        if !netdevs.is_empty() {
            edits::merge(&mut e, edits::env(&format!("NETDEVICE_{suffix}"), &netdevs.join(",")));
        }
        Ok(e)
    }

    /// For DRA: whether each function is an SR-IOV VF and has an RDMA device, as flags a
    /// DeviceClass can select on (`device.attributes["nic.devplug.io"].sriov_vf`).
    fn describe(&self, sys: &dyn Sys) -> Result<devplug_sdk::dra::PoolDescription, BackendError> {
        use devplug_sdk::dra::{self, AttributeValue};
        let mut devices = Vec::new();
        let found = self.discover(sys)?;
        // The link's speed (Mb/s) and MTU of each function with a netdev, in one host call:
        // the kernel's `speed` (net/core/net-sysfs.c, `speed_show`) reads only while the link
        // is running and says -1 when it cannot tell, so only a positive speed is published.
        // The interface directories discover just found (virtio's is a level down).
        let known: BTreeMap<String, String> = self
            .known
            .borrow()
            .netdevs
            .iter()
            .filter_map(|((addr, _), found)| found.as_ref().map(|(_, dir)| (addr.clone(), dir.clone())))
            .collect();
        let netdev = |d: &devplug_sdk::Device| known.get(&d.id).cloned();
        let dirs: Vec<String> = found.iter().flat_map(|r| r.devices.iter().filter_map(netdev)).collect();
        let paths: Vec<String> = dirs.iter().flat_map(|d| [format!("{d}/speed"), format!("{d}/mtu")]).collect();
        let read: BTreeMap<&String, Option<i64>> = paths
            .iter()
            .zip(sys.read_many(&paths))
            .map(|(p, v)| (p, v.ok().and_then(|v| v.trim().parse::<i64>().ok()).filter(|n| *n > 0)))
            .collect();
        for r in &found {
            for d in &r.devices {
                let has = |k: &str| d.attributes.iter().any(|(key, _)| key == k);
                let mut attributes = vec![
                    ("sriov_vf".into(), AttributeValue::Flag(has("pf"))),
                    ("rdma_capable".into(), AttributeValue::Flag(has("rdma"))),
                ];
                if let Some(dir) = netdev(d) {
                    for (file, name) in [("speed", "link_speed_mbps"), ("mtu", "mtu")] {
                        if let Some(Some(n)) = read.get(&format!("{dir}/{file}")) {
                            attributes.push((name.into(), AttributeValue::Integer(*n)));
                        }
                    }
                }
                devices.push(dra::DeviceDescription { attributes, ..dra::describe(&r.name, &d.id) });
            }
        }
        Ok(dra::PoolDescription { counter_sets: Vec::new(), devices })
    }
}

devplug_sdk::backend!(NicBackend);

#[cfg(test)]
mod tests {
    use super::*;
    use devplug_sdk::FixtureSys;

    fn fixture(name: &str) -> FixtureSys {
        FixtureSys::repo_machine(name)
    }

    /// Issue 60 (7): a TOML mistake in the backend's config reached the operator as one line
    /// with literal `\n`s and `toml`'s drawing of the place; it is now one line of words.
    #[test]
    fn a_config_toml_error_is_one_line() {
        let Err(BackendError::InvalidConfig(e)) = NicBackend::init("[[pool]\nname = 1\n", &fixture("plain")) else {
            panic!("a TOML error")
        };
        assert!(!e.contains('\n') && !e.contains(" | "), "{e}");
        assert!(e.contains("line 1"), "where it is: {e}");
    }

    fn pool<'a>(res: &'a [Resource], name: &str) -> &'a Resource {
        res.iter().find(|r| r.name == name).unwrap()
    }

    /// DRA: link speed and MTU typed, from the netdev the kernel lists under each function;
    /// virtio_net's `-1` (it cannot tell) is left out rather than published.
    #[test]
    fn links_are_described_with_their_speed_where_the_driver_knows_it() {
        use devplug_sdk::dra::AttributeValue::{Flag, Integer};
        let sys = fixture("cx6dx-sriov");
        let (b, _) = NicBackend::init("", &sys).unwrap();
        let with_netdev: Vec<String> = b
            .discover(&sys)
            .unwrap()
            .iter()
            .flat_map(|r| r.devices.iter())
            .filter(|d| d.attributes.iter().any(|(k, _)| k == "netdev"))
            .map(|d| d.id.clone())
            .collect();
        let pool = b.describe(&sys).unwrap();
        let vfs = pool.devices.iter().filter(|d| with_netdev.contains(&d.id));
        let vf = vfs.into_iter().find(|d| d.attributes.contains(&("sriov_vf".into(), Flag(true)))).unwrap();
        assert!(vf.attributes.contains(&("link_speed_mbps".into(), Integer(100_000))), "{:?}", vf.attributes);
        assert!(vf.attributes.contains(&("mtu".into(), Integer(1500))), "{:?}", vf.attributes);
        let vfio = pool.devices.iter().filter(|d| !with_netdev.contains(&d.id));
        assert!(vfio.into_iter().all(|d| !d.attributes.iter().any(|(k, _)| k == "mtu")), "no netdev, no link facts");
        let sys = fixture("plain");
        let cfg = "[[pool]]\nname = \"x.io/virtio\"\ndrivers = [\"virtio-pci\"]\nfunctions = \"any\"\n";
        let (b, _) = NicBackend::init(cfg, &sys).unwrap();
        let pool = b.describe(&sys).unwrap();
        assert!(!pool.devices.is_empty());
        let eth0 = &pool.devices[0].attributes;
        assert!(eth0.contains(&("mtu".into(), Integer(1500))), "its netdev was read: {eth0:?}");
        assert!(!eth0.iter().any(|(k, _)| k == "link_speed_mbps"), "{eth0:?}");
    }

    #[test]
    fn default_pools_split_cx6_vfs_by_binding_and_rdma() {
        let sys = fixture("cx6dx-sriov");
        let (b, info) = NicBackend::init("", &sys).unwrap();
        assert_eq!(info.resources.len(), 3);
        let res = b.discover(&sys).unwrap();
        let vfio = pool(&res, "devplug.io/sriov_vfio");
        let rdma = pool(&res, "devplug.io/sriov_rdma");
        assert_eq!(vfio.devices.len(), 4);
        assert_eq!(rdma.devices.len(), 4);
        assert!(pool(&res, "devplug.io/sriov_netdev").devices.is_empty(), "mlx5 VFs are all RDMA-capable");
        assert!(vfio.devices[0].edits.device_nodes[0].container_path.starts_with("/dev/vfio/"));
        assert_eq!(vfio.common_edits.device_nodes[0].container_path, "/dev/vfio/vfio");
        assert_eq!(rdma.common_edits.device_nodes[0].container_path, "/dev/infiniband/rdma_cm");
        assert!(rdma.devices[0].edits.device_nodes[0].container_path.starts_with("/dev/infiniband/uverbs"));
    }

    #[test]
    fn vfs_are_described_as_vfs_and_rdma_functions_as_rdma_capable() {
        use devplug_sdk::dra::AttributeValue;
        let sys = fixture("cx6dx-sriov");
        let (b, _) = NicBackend::init("", &sys).unwrap();
        let d = b.describe(&sys).unwrap();
        let flag = |resource: &str, k: &str| -> Vec<bool> {
            d.devices
                .iter()
                .filter(|x| x.resource == resource)
                .map(|x| {
                    x.attributes.iter().find(|(n, _)| n == k).map(|(_, v)| v == &AttributeValue::Flag(true)).unwrap()
                })
                .collect()
        };
        assert_eq!(flag("devplug.io/sriov_rdma", "sriov_vf"), [true; 4]);
        assert_eq!(flag("devplug.io/sriov_rdma", "rdma_capable"), [true; 4]);
        assert_eq!(flag("devplug.io/sriov_vfio", "rdma_capable"), [false; 4], "a vfio-bound VF has no RDMA device");
    }

    #[test]
    fn e810_iavf_vfs_land_in_the_netdev_pool_with_interface_names_in_env() {
        let sys = fixture("e810-sriov");
        let (b, _) = NicBackend::init("", &sys).unwrap();
        let res = b.discover(&sys).unwrap();
        let net = pool(&res, "devplug.io/sriov_netdev");
        assert_eq!(net.devices.len(), 4);
        assert_eq!(net.devices[0].numa_nodes, [1]);
        let e = b.allocate(&sys, &net.name, &[net.devices[1].id.clone()]).unwrap();
        assert_eq!(
            e.env,
            [
                ("PCIDEVICE_DEVPLUG_IO_SRIOV_NETDEV".to_owned(), "0000:af:01.1".to_owned()),
                ("NETDEVICE_DEVPLUG_IO_SRIOV_NETDEV".to_owned(), "ens2f0v1".to_owned()),
            ]
        );
    }

    #[test]
    fn selectors_pick_by_pf_name_driver_and_kind() {
        let sys = fixture("cx6dx-sriov");
        let cfg = r#"
            [[pool]]
            name = "x.io/pf"
            functions = "pf"
            pf_names = ["ens1f1np1"]
            [[pool]]
            name = "x.io/mlx"
            vendors = ["15b3"]
            drivers = ["mlx5_core"]
        "#;
        let (b, _) = NicBackend::init(cfg, &sys).unwrap();
        let res = b.discover(&sys).unwrap();
        assert_eq!(pool(&res, "x.io/pf").devices.iter().map(|d| d.id.as_str()).collect::<Vec<_>>(), ["0000:3b:00.1"]);
        assert_eq!(pool(&res, "x.io/mlx").devices.len(), 4);
    }

    #[test]
    fn bad_pools_are_refused_with_the_reason() {
        let sys = fixture("plain");
        for (cfg, needle) in [
            ("[[pool]]\nname = \"nodomain\"\n", "extended resource name"),
            ("[[pool]]\nname = \"a.io/b\"\nvendors = [\"15b\"]\n", "4 hex digits"),
            ("[[pool]]\nname = \"a.io/b\"\nlink_types = [\"wifi\"]\n", "link type"),
            ("[[pool]]\nname = \"a.io/b\"\n[[pool]]\nname = \"a.io/b\"\n", "twice"),
            ("[[pool]]\nname = \"a.io/b\"\ncolour = 1\n", "colour"),
        ] {
            match NicBackend::init(cfg, &sys) {
                Err(BackendError::InvalidConfig(m)) => assert!(m.contains(needle), "{m}"),
                _ => panic!("accepted {cfg:?}"),
            }
        }
    }

    #[test]
    fn virtio_nic_of_a_plain_vm_is_not_a_vf() {
        let sys = fixture("plain");
        let (b, _) = NicBackend::init("", &sys).unwrap();
        assert!(b.discover(&sys).unwrap().iter().all(|r| r.devices.is_empty()));
    }
}
