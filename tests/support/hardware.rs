//! The generator of the sysfs fixtures under `tests/fixtures/sysfs/<machine>/`: real machines'
//! PCI topology written the way the kernel lays it out, so the backends are tested against the
//! shapes they meet in production rather than against hand-made trees.
//!
//! What it reproduces: the real device directory under `devices/pciDDDD:BB/<bridges>/<function>`
//! with `bus/pci/devices/<addr>` pointing at it; `driver`, `iommu_group` and `subsystem` links
//! relative to the device directory; `bus/pci/drivers/<drv>/<addr>` back-links; attributes with
//! the kernel's formats (`0x10de`, `0x030200`, `-1`, `aer_dev_fatal` tables); SR-IOV `virtfnN` /
//! `physfn`; per-device class directories (`net/<if>`, `drm/renderD128`, `infiniband/mlx5_0`,
//! `infiniband_verbs/uverbs0`) with `class/<class>/<name>` links; DFL FPGA regions. Device nodes
//! under `dev/` are files holding `c MAJOR:MINOR`, since git cannot store nodes.
//!
//! The committed trees are checked against this generator by `tests/hardware.rs`;
//! `DEVPLUG_BLESS=1 cargo test --test hardware` rewrites them (and the golden files).

use std::collections::BTreeMap;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

/// Every committed fixture machine, by directory name.
pub const MACHINES: &[&str] = &[
    "dgx-h100",
    "dgx-a100-mig",
    "amd-mi300x",
    "amd-mi300x-cpx",
    "intel-gpu-max",
    "cx6dx-sriov",
    "e810-sriov",
    "alveo-u250",
    "intel-dfl",
    "plain",
];

/// Writes one machine: `<root>/sys` and `<root>/dev`.
pub struct Tree {
    root: PathBuf,
    iommu_next: u32,
}

/// A PCI function to create.
pub struct Func<'a> {
    /// Root complex and bridges above the function, e.g. `["pci0000:15", "0000:15:01.0"]`.
    pub parents: Vec<String>,
    pub addr: &'a str,
    pub vendor: u16,
    pub device: u16,
    pub class: u32,
    pub numa: i32,
    pub driver: Option<&'a str>,
}

impl Tree {
    pub fn new(root: &Path) -> Self {
        std::fs::create_dir_all(root.join("sys")).expect("sys");
        std::fs::create_dir_all(root.join("dev")).expect("dev");
        Tree { root: root.to_owned(), iommu_next: 10 }
    }

    pub fn file(&self, rel: &str, content: &str) {
        let p = self.root.join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, content).expect("write");
    }

    /// A write-only attribute (mode 0200), such as a driver's `bind`: readable by root alone,
    /// and never by a backend that honours the mode.
    pub fn control(&self, rel: &str) {
        self.file(rel, "");
        std::fs::set_permissions(self.root.join(rel), std::fs::Permissions::from_mode(0o200)).expect("chmod");
    }

    pub fn dir(&self, rel: &str) {
        std::fs::create_dir_all(self.root.join(rel)).expect("mkdir");
    }

    /// A symlink at `rel` whose target is `to` (both relative to the machine root), stored as
    /// the kernel stores it: relative to the link's directory.
    pub fn link(&self, rel: &str, to: &str) {
        let p = self.root.join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        let _ = std::fs::remove_file(&p);
        symlink(relative(rel, to), p).expect("symlink");
    }

    /// A device node descriptor.
    pub fn node(&self, rel: &str, major: u32, minor: u32) {
        self.file(&format!("dev/{rel}"), &format!("c {major}:{minor}\n"));
    }

    /// A PCI function; returns its real directory (relative to the machine root).
    pub fn pci(&mut self, f: Func) -> String {
        let dir = format!("sys/devices/{}/{}", f.parents.join("/"), f.addr);
        // Bridges on the way down exist as functions too.
        for i in 1..f.parents.len() {
            let bdir = format!("sys/devices/{}", f.parents[..=i].join("/"));
            if !self.root.join(&bdir).join("class").exists() {
                self.attrs(&bdir, 0x8086, 0x347a, 0x060400, -1);
                self.link(&format!("sys/bus/pci/devices/{}", f.parents[i]), &bdir);
            }
        }
        self.attrs(&dir, f.vendor, f.device, f.class, f.numa);
        self.link(&format!("sys/bus/pci/devices/{}", f.addr), &dir);
        self.file(&format!("{dir}/aer_dev_fatal"), &aer("TOTAL_ERR_FATAL", 0));
        self.file(&format!("{dir}/aer_dev_nonfatal"), &aer("TOTAL_ERR_NONFATAL", 0));
        if let Some(drv) = f.driver {
            self.bind(&dir, f.addr, drv);
        }
        let group = self.iommu_next;
        self.iommu_next += 1;
        self.link(&format!("{dir}/iommu_group"), &format!("sys/kernel/iommu_groups/{group}"));
        self.link(&format!("sys/kernel/iommu_groups/{group}/devices/{}", f.addr), &dir);
        dir
    }

    fn attrs(&self, dir: &str, vendor: u16, device: u16, class: u32, numa: i32) {
        self.file(&format!("{dir}/vendor"), &format!("0x{vendor:04x}\n"));
        self.file(&format!("{dir}/device"), &format!("0x{device:04x}\n"));
        self.file(&format!("{dir}/class"), &format!("0x{class:06x}\n"));
        self.file(&format!("{dir}/numa_node"), &format!("{numa}\n"));
        self.file(&format!("{dir}/enable"), "1\n");
        self.link(&format!("{dir}/subsystem"), "sys/bus/pci");
    }

    /// `dir` (the function `addr`) bound to `driver`: the links both ways, and the driver
    /// directory's write-only control files (`bind`, `unbind`, `uevent` from
    /// `drivers/base/bus.c`; `new_id`, `remove_id` from `drivers/pci/pci-driver.c`; all 0200).
    pub fn bind(&self, dir: &str, addr: &str, driver: &str) {
        self.link(&format!("{dir}/driver"), &format!("sys/bus/pci/drivers/{driver}"));
        self.link(&format!("sys/bus/pci/drivers/{driver}/{addr}"), dir);
        for control in ["bind", "unbind", "uevent", "new_id", "remove_id"] {
            self.control(&format!("sys/bus/pci/drivers/{driver}/{control}"));
        }
    }

    /// A class device below a PCI function (`net/ens1f0np0`) with its `class/<c>/<name>` link.
    pub fn class_dev(&self, dev_dir: &str, class: &str, name: &str, attrs: &[(&str, &str)]) -> String {
        let dir = format!("{dev_dir}/{class}/{name}");
        self.dir(&dir);
        for (k, v) in attrs {
            self.file(&format!("{dir}/{k}"), &format!("{v}\n"));
        }
        self.link(&format!("{dir}/device"), dev_dir);
        self.link(&format!("sys/class/{class}/{name}"), &dir);
        dir
    }

    /// A netdev with the attributes the NIC backend reads. `speed` is what the driver reports
    /// in Mb/s (-1 when it cannot tell, as virtio_net without VIRTIO_NET_F_SPEED_DUPLEX); the
    /// kernel's `speed_show` (net/core/net-sysfs.c) answers only while the link is up, so a
    /// down link has no readable `speed` here.
    pub fn netdev(&self, dev_dir: &str, name: &str, mac: &str, link_type: u32, up: bool, speed: i32) {
        let (link_type, speed) = (link_type.to_string(), speed.to_string());
        let mut attrs = vec![
            ("address", mac),
            ("type", link_type.as_str()),
            ("operstate", if up { "up" } else { "down" }),
            ("carrier", if up { "1" } else { "0" }),
            ("mtu", "1500"),
        ];
        if up {
            attrs.push(("speed", speed.as_str()));
        }
        self.class_dev(dev_dir, "net", name, &attrs);
    }
}

/// Uncorrectable error kinds, as the kernel lists them in `aer_dev_fatal` and `aer_dev_nonfatal`.
const UNCORRECTABLE: [&str; 18] = [
    "Undefined",
    "DLP",
    "SDES",
    "TLP",
    "FCP",
    "CmpltTO",
    "CmpltAbrt",
    "UnxCmplt",
    "RxOF",
    "MalfTLP",
    "ECRC",
    "UnsupReq",
    "ACSViol",
    "UncorrIntErr",
    "BlockedTLP",
    "AtomicOpBlocked",
    "TLPBlockedErr",
    "PoisonTLPBlocked",
];
/// An `aer_dev_fatal`/`aer_dev_nonfatal` table: one `NAME COUNT` line per error kind (any
/// `total` counted as malformed TLPs), then the total line under its own label.
pub fn aer(total_label: &str, total: u64) -> String {
    let mut s = String::new();
    for (i, n) in UNCORRECTABLE.iter().enumerate() {
        s.push_str(&format!("{n} {}\n", if i == 9 { total } else { 0 }));
    }
    s.push_str(&format!("{total_label} {total}\n"));
    s
}

/// `from` and `to` relative to the same root → the relative target a symlink at `from` needs.
fn relative(from: &str, to: &str) -> String {
    let from_dir: Vec<&str> = from.split('/').collect();
    let from_dir = &from_dir[..from_dir.len() - 1];
    let to: Vec<&str> = to.split('/').collect();
    let common = from_dir.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut parts: Vec<&str> = vec![".."; from_dir.len() - common];
    parts.extend(&to[common..]);
    parts.join("/")
}

pub fn chain(rc: &str, bridges: &[&str]) -> Vec<String> {
    std::iter::once(rc.to_owned()).chain(bridges.iter().map(|b| (*b).to_owned())).collect()
}

/// Write machine `name` into `root`.
pub fn build(name: &str, root: &Path) {
    let mut t = Tree::new(root);
    match name {
        "dgx-h100" => dgx_h100(&mut t),
        "dgx-a100-mig" => dgx_a100_mig(&mut t),
        "amd-mi300x" => amd_mi300x(&mut t),
        "amd-mi300x-cpx" => amd_mi300x_in(&mut t, "CPX", "NPS4"),
        "intel-gpu-max" => intel_gpu_max(&mut t),
        "cx6dx-sriov" => cx6dx(&mut t, 1, 8),
        "e810-sriov" => e810(&mut t),
        "alveo-u250" => alveo_u250(&mut t),
        "intel-dfl" => intel_dfl(&mut t),
        "plain" => plain(&mut t),
        other => panic!("no fixture machine {other:?}"),
    }
}

/// The machine for the discover benchmark: the DGX's 8 GPUs plus 4 ConnectX PFs with 64 VFs each.
pub fn build_big(root: &Path) {
    let mut t = Tree::new(root);
    dgx_h100(&mut t);
    cx6dx(&mut t, 4, 64);
}

/// Every box has a BMC VGA (ASPEED) and the usual nodes: GPU backends must skip the former.
fn base(t: &mut Tree) {
    let dir = t.pci(Func {
        parents: chain("pci0000:00", &["0000:00:1c.0", "0000:02:00.0"]),
        addr: "0000:03:00.0",
        vendor: 0x1a03,
        device: 0x2000,
        class: 0x030000,
        numa: 0,
        driver: Some("ast"),
    });
    t.class_dev(&dir, "drm", "card0", &[]);
    t.node("dri/card0", 226, 0);
    t.node("null", 1, 3);
    t.node("kvm", 10, 232);
    t.node("fuse", 10, 229);
}

/// DGX H100-like: 8× H100 SXM (10de:2330, 3D controller) on two NUMA nodes, two GPUs behind each
/// of four PCIe switches.
fn dgx_h100(t: &mut Tree) {
    base(t);
    let buses = [0x18u32, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb];
    for (i, bus) in buses.iter().enumerate() {
        let pair = i / 2;
        let first = buses[pair * 2];
        let rc = format!("pci0000:{:02x}", first - 4);
        let rp = format!("0000:{:02x}:01.0", first - 4);
        let up = format!("0000:{:02x}:00.0", first - 3);
        let down = format!("0000:{:02x}:{:02x}.0", first - 2, i % 2);
        let addr = format!("0000:{bus:02x}:00.0");
        t.pci(Func {
            parents: chain(&rc, &[&rp, &up, &down]),
            addr: &addr,
            vendor: 0x10de,
            device: 0x2330,
            class: 0x030200,
            numa: (i / 4) as i32,
            driver: Some("nvidia"),
        });
        t.node(&format!("nvidia{i}"), 195, i as u32);
        t.file(&format!("proc/driver/nvidia/gpus/{addr}/information"), &nvidia_information(&addr, i as u32, 0));
        nvidia_gpu_caps(t, i as u32);
    }
    nvidia_caps(t);
    t.file("proc/driver/nvidia/version", "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.124.06  Release Build  (dvs-builder@U16-I3-B03-4-3)  Thu Feb 20 02:03:29 UTC 2025\nGCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)\n");
    t.node("nvidiactl", 195, 255);
    t.node("nvidia-modeset", 195, 254);
    t.node("nvidia-uvm", 510, 0);
    t.node("nvidia-uvm-tools", 510, 1);
}

/// The DGX H100 with its compute-fabric NICs (not in [`MACHINES`]; the cross-driver claim's
/// machine): beside each GPU, below a downstream port of the same PCIe switch, a single-port
/// ConnectX-7 (15b3:1021, `mlx5_core`, in Ethernet mode) with its netdev and RDMA device, as NVIDIA's DGX H100
/// user guide pairs them (`nvidia-smi topo -m`: each GPU `PIX` to its NIC, one switch per two
/// GPUs). The NIC's sysfs is the same driver's as the ConnectX-6 Dx fixture's ([`mlx5_pf`]).
pub fn build_dgx_h100_with_nics(root: &Path) {
    let mut t = Tree::new(root);
    dgx_h100(&mut t);
    t.node("infiniband/rdma_cm", 10, 58);
    let buses = [0x18u32, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb];
    for (i, bus) in buses.iter().enumerate() {
        let first = buses[(i / 2) * 2];
        let rc = format!("pci0000:{:02x}", first - 4);
        let rp = format!("0000:{:02x}:01.0", first - 4);
        let up = format!("0000:{:02x}:00.0", first - 3);
        let down = format!("0000:{:02x}:{:02x}.0", first - 2, 2 + i % 2);
        let addr = format!("0000:{:02x}:00.0", bus + 1);
        let parents = chain(&rc, &[&rp, &up, &down]);
        let n = i as u32;
        let ifname = format!("enp{}s0np0", bus + 1);
        let dir =
            mlx5_pf(&mut t, parents, &addr, 0x1021, (i / 4) as i32, &ifname, &format!("94:6d:ae:00:00:{i:02x}"), n, n);
        t.file(&format!("{dir}/sriov_numvfs"), "0\n");
    }
}

/// An EC2 p5.48xlarge as its guest sees it (not in [`MACHINES`]; the coexistence and RDMA-health
/// tests' machine): the DGX's 8 H100 behind four PCIe switches and, on each GPU's switch, four
/// Elastic Fabric Adapters (`1d0f:efa2`, the third generation's ID in `efa_main.c`'s
/// `efa_pci_tbl`), plus the ENA primary interface (`1d0f:ec20`, `ena`). An EFA has no netdev:
/// the `efa` driver registers only an RDMA device (`ib_register_device(..., "efa_%d", ...)`),
/// one port whose attributes the IB core writes (`drivers/infiniband/core/sysfs.c`: `state` as
/// `"%d: %s"`, `phys_state`, `link_layer`; `efa_query_port` reports ACTIVE / LinkUp, and no link
/// layer, which prints `Unknown`) and its `uverbsN` (major 231, minors from 192).
pub fn build_p5_efa(root: &Path) {
    let mut t = Tree::new(root);
    dgx_h100(&mut t);
    t.node("infiniband/rdma_cm", 10, 58);
    let ena = t.pci(Func {
        parents: chain("pci0000:00", &["0000:00:05.0"]),
        addr: "0000:01:00.0",
        vendor: 0x1d0f,
        device: 0xec20,
        class: 0x020000,
        numa: 0,
        driver: Some("ena"),
    });
    t.netdev(&ena, "ens32", "0a:00:00:00:00:01", 1, true, 100_000);
    let buses = [0x18u32, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb];
    for (i, bus) in buses.iter().enumerate() {
        let first = buses[(i / 2) * 2];
        let rc = format!("pci0000:{:02x}", first - 4);
        let rp = format!("0000:{:02x}:01.0", first - 4);
        let up = format!("0000:{:02x}:00.0", first - 3);
        for k in 0..4u32 {
            let n = i as u32 * 4 + k;
            let down_port = format!("0000:{:02x}:{:02x}.0", first - 2, 2 + (i as u32 % 2) * 4 + k);
            let addr = format!("0000:{:02x}:00.0", bus + 1 + k);
            let dir = t.pci(Func {
                parents: chain(&rc, &[&rp, &up, &down_port]),
                addr: &addr,
                vendor: 0x1d0f,
                device: 0xefa2,
                class: 0x020000,
                numa: (i / 4) as i32,
                driver: Some("efa"),
            });
            let ib = format!("efa_{n}");
            let ibdir = t.class_dev(&dir, "infiniband", &ib, &[("node_type", "1: CA")]);
            rdma_port(&t, &ibdir, 1, "4: ACTIVE", "5: LinkUp", "Unknown");
            t.class_dev(&dir, "infiniband_verbs", &format!("uverbs{n}"), &[("ibdev", &ib)]);
            t.node(&format!("infiniband/uverbs{n}"), 231, 192 + n);
        }
    }
}

/// An RDMA port's attributes as the IB core writes them (`drivers/infiniband/core/sysfs.c`:
/// `state_show` prints `"%d: %s"` of `ib_port_state`, `phys_state_show` `"%d: %s"` of the
/// physical state, `link_layer_show` one word).
fn rdma_port(t: &Tree, ibdir: &str, port: u32, state: &str, phys: &str, link_layer: &str) {
    t.file(&format!("{ibdir}/ports/{port}/state"), &format!("{state}\n"));
    t.file(&format!("{ibdir}/ports/{port}/phys_state"), &format!("{phys}\n"));
    t.file(&format!("{ibdir}/ports/{port}/link_layer"), &format!("{link_layer}\n"));
}

/// Three single-port ConnectX-7 (15b3:1021, `mlx5_core`) in InfiniBand mode without IPoIB (not
/// in [`MACHINES`]): no netdev, only the RDMA device `mlx5_N` whose port state the subnet
/// manager sets (`mlx5_ib` answers `query_port` from the port's PortInfo MAD). `mlx5_0` is
/// ACTIVE; `mlx5_1` has link but no subnet manager has configured it (`2: INIT`, `5: LinkUp`);
/// `mlx5_2` has no cable (`1: DOWN`, `3: Disabled`).
pub fn build_ib_hcas(root: &Path) {
    let mut t = Tree::new(root);
    base(&mut t);
    t.node("infiniband/rdma_cm", 10, 58);
    let ports = [("4: ACTIVE", "5: LinkUp"), ("2: INIT", "5: LinkUp"), ("1: DOWN", "3: Disabled")];
    for (n, (state, phys)) in ports.into_iter().enumerate() {
        let n = n as u32;
        let bus = 0x41 + n * 4;
        let addr = format!("0000:{bus:02x}:00.0");
        let dir = t.pci(Func {
            parents: chain(&format!("pci0000:{:02x}", bus - 1), &[&format!("0000:{:02x}:00.0", bus - 1)]),
            addr: &addr,
            vendor: 0x15b3,
            device: 0x1021,
            class: 0x020700,
            numa: 0,
            driver: Some("mlx5_core"),
        });
        let ib = format!("mlx5_{n}");
        let ibdir = t.class_dev(&dir, "infiniband", &ib, &[("node_type", "1: CA")]);
        rdma_port(&t, &ibdir, 1, state, phys, "InfiniBand");
        t.class_dev(&dir, "infiniband_verbs", &format!("uverbs{n}"), &[("ibdev", &ib)]);
        t.node(&format!("infiniband/uverbs{n}"), 231, 192 + n);
    }
}

/// A PCIe server without switches (not in [`MACHINES`]; the learned-requests test's "other
/// topology"): 2× H100 PCIe (10de:2331), each in the slot of a root port of its own root
/// complex, `pci0000:BB/0000:BB:01.0/0000:CC:00.0` — the devices of a bridge's secondary bus
/// are its children (`drivers/pci/probe.c`, `pci_scan_bridge_extend` → `pci_add_new_bus` with
/// the bridge as the new bus's parent device), so a GPU here is two levels shallower than on
/// the DGX, whose GPUs sit below a switch's upstream and downstream ports.
pub fn build_flat_h100(root: &Path) {
    let mut t = Tree::new(root);
    base(&mut t);
    for (i, (rc, bus)) in [(0x16u32, 0x17u32), (0x96, 0x97)].into_iter().enumerate() {
        let addr = format!("0000:{bus:02x}:00.0");
        t.pci(Func {
            parents: chain(&format!("pci0000:{rc:02x}"), &[&format!("0000:{rc:02x}:01.0")]),
            addr: &addr,
            vendor: 0x10de,
            device: 0x2331,
            class: 0x030200,
            numa: i as i32,
            driver: Some("nvidia"),
        });
        t.node(&format!("nvidia{i}"), 195, i as u32);
        t.file(&format!("proc/driver/nvidia/gpus/{addr}/information"), &nvidia_information(&addr, i as u32, 0));
        nvidia_gpu_caps(&t, i as u32);
    }
    nvidia_caps(&t);
    t.file("proc/driver/nvidia/version", "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.124.06  Release Build  (dvs-builder@U16-I3-B03-4-3)  Thu Feb 20 02:03:29 UTC 2025\n");
    t.node("nvidiactl", 195, 255);
    t.node("nvidia-uvm", 510, 0);
    t.node("nvidia-uvm-tools", 510, 1);
}

/// DGX A100-like, 8× A100 SXM4 80GB (10de:20b2) with three of them in MIG mode, in a mixed
/// geometry as `nvidia-smi mig -cgi` leaves it (GPU instance IDs as the driver assigns them):
/// GPU 0: 3g.40gb (GI 1) + 2g.20gb (GI 5) + 1g.10gb (GI 13, 14); GPU 1: 2× 3g.40gb (GI 1, 2);
/// GPU 2: 7× 1g.10gb (GI 7..13). GPUs 3–7 are whole, and have their (empty)
/// `capabilities/gpuN/mig` directory all the same, as the driver makes one for every GPU. Each
/// live GPU and compute instance has its
/// `/proc/driver/nvidia/capabilities/gpuN/mig/giG[/ciC]/access` and its `/dev/nvidia-caps` node,
/// with the minors of the driver's fixed table (`/proc/driver/nvidia-caps/mig-minors`: `config`
/// 1, `monitor` 2, then 9 per GPU instance slot, 15 slots per GPU).
fn dgx_a100_mig(t: &mut Tree) {
    base(t);
    let buses = [0x07u32, 0x0f, 0x47, 0x4e, 0x87, 0x90, 0xb7, 0xbd];
    let geometry: [&[u32]; 3] = [&[1, 5, 13, 14], &[1, 2], &[7, 8, 9, 10, 11, 12, 13]];
    for (i, bus) in buses.iter().enumerate() {
        let pair = i / 2;
        let first = buses[pair * 2];
        let rc = format!("pci0000:{:02x}", first - 4);
        let up = format!("0000:{:02x}:00.0", first - 3);
        let down = format!("0000:{:02x}:{:02x}.0", first - 2, i % 2);
        let addr = format!("0000:{bus:02x}:00.0");
        t.pci(Func {
            parents: chain(&rc, &[&format!("0000:{:02x}:01.1", first - 4), &up, &down]),
            addr: &addr,
            vendor: 0x10de,
            device: 0x20b2,
            class: 0x030200,
            numa: (i / 4) as i32,
            driver: Some("nvidia"),
        });
        let minor = i as u32;
        t.node(&format!("nvidia{minor}"), 195, minor);
        t.file(
            &format!("proc/driver/nvidia/gpus/{addr}/information"),
            &nvidia_information_of("NVIDIA A100-SXM4-80GB", "92.00.45.00.03", &addr, minor, 0),
        );
        nvidia_gpu_caps(t, minor);
        if let Some(gis) = geometry.get(i) {
            mig_geometry(t, minor, gis);
        }
    }
    nvidia_caps(t);
    for minor in [1, 2] {
        t.node(&format!("nvidia-caps/nvidia-cap{minor}"), CAPS_MAJOR, minor);
    }
    t.file("proc/driver/nvidia/version", "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.127.08  Mon Oct 28 15:46:28 UTC 2024\nGCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)\n");
    t.node("nvidiactl", 195, 255);
    t.node("nvidia-uvm", 510, 0);
    t.node("nvidia-uvm-tools", 510, 1);
}

/// What the NVIDIA driver registers once, MIG in use or not (`kernel-open/nvidia/nv-caps.c`,
/// open-gpu-kernel-modules): the `mig/config` and `mig/monitor` capabilities, and
/// `/proc/driver/nvidia-caps/{mig,nvlink}-minors`, the fixed minor table every capability gets
/// at module load (`nv_cap_tables_init`: one counter over the nvlink table, then the two MIG
/// entries, then 32 GPUs × 15 GPU-instance slots × (`access` + 8 compute instances)).
fn nvidia_caps(t: &Tree) {
    for (name, minor) in [("config", 1), ("monitor", 2)] {
        t.file(&format!("proc/driver/nvidia/capabilities/mig/{name}"), &caps_access(minor));
    }
    let mut lines = String::from("config 1\nmonitor 2\n");
    let mut minor = 3;
    for gpu in 0..32 {
        for gi in 0..15 {
            lines.push_str(&format!("gpu{gpu}/gi{gi}/access {minor}\n"));
            minor += 1;
            for ci in 0..8 {
                lines.push_str(&format!("gpu{gpu}/gi{gi}/ci{ci}/access {minor}\n"));
                minor += 1;
            }
        }
    }
    t.file("proc/driver/nvidia-caps/mig-minors", &lines);
    t.file("proc/driver/nvidia-caps/nvlink-minors", "fabric-mgmt 0\n");
}

/// What the driver registers for every GPU it attaches, MIG mode or not
/// (`src/nvidia/arch/nvalloc/unix/src/os.c`, `osRmCapRegisterGpu`): the directory
/// `capabilities/gpu<minor>/mig`, empty until a GPU instance is created. Git cannot hold an
/// empty directory, so the committed trees lack it for whole GPUs; the tests serve freshly
/// generated trees (see `tests/hardware.rs`).
pub fn nvidia_gpu_caps(t: &Tree, minor: u32) {
    t.dir(&format!("proc/driver/nvidia/capabilities/gpu{minor}/mig"));
}

/// GPU `minor` in MIG mode with one compute instance in each of GPU instances `gis`
/// (`osRmCapRegisterSmcPartition` adds `gi<G>`, `osRmCapRegisterSmcExecutionPartition` its
/// `ci<C>`): the driver's `/proc` capabilities and the `/dev/nvidia-caps` nodes, minors as
/// `mig-minors` lists them.
pub fn mig_geometry(t: &Tree, minor: u32, gis: &[u32]) {
    let base = format!("proc/driver/nvidia/capabilities/gpu{minor}/mig");
    for gi in gis {
        let gi_minor = 3 + minor * 135 + gi * 9;
        t.file(&format!("{base}/gi{gi}/access"), &caps_access(gi_minor));
        t.node(&format!("nvidia-caps/nvidia-cap{gi_minor}"), CAPS_MAJOR, gi_minor);
        t.file(&format!("{base}/gi{gi}/ci0/access"), &caps_access(gi_minor + 1));
        t.node(&format!("nvidia-caps/nvidia-cap{}", gi_minor + 1), CAPS_MAJOR, gi_minor + 1);
    }
}

/// The (dynamic) major of `/dev/nvidia-caps` nodes on the fixture machines.
const CAPS_MAJOR: u32 = 237;

/// An `access` file of the driver's capabilities: the minor of its `/dev/nvidia-caps` node and
/// the node's mode (0444).
fn caps_access(minor: u32) -> String {
    format!("DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
}

/// `/proc/driver/nvidia/gpus/<addr>/information` as the driver (570.x) writes it for an H100
/// SXM, with a UUID derived from the address and `seed`.
pub fn nvidia_information(addr: &str, minor: u32, seed: u32) -> String {
    nvidia_information_of("NVIDIA H100 80GB HBM3", "96.00.99.00.01", addr, minor, seed)
}

/// The `information` file of a GPU of `model` with video BIOS `vbios`.
fn nvidia_information_of(model: &str, vbios: &str, addr: &str, minor: u32, seed: u32) -> String {
    let bus = u32::from_str_radix(&addr[5..7], 16).unwrap_or(0);
    let uuid = format!(
        "GPU-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        0x5f3a_1c00u32.wrapping_add(bus << 8).wrapping_add(seed),
        0x2b10 + minor,
        0x8c4e,
        0x9a70 + bus,
        0x1e2d_3c4b_5a00u64 + u64::from(bus)
    );
    format!(
        "Model: \t\t {model}\nIRQ:   \t\t {irq}\nGPU UUID: \t {uuid}\nVideo BIOS: \t {vbios}\nBus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\nBus Location: \t {addr}\nDevice Minor: \t {minor}\nGPU Firmware: \t 570.124.06\nGPU Excluded:\t No\n",
        irq = 250 + minor
    )
}

/// AMD Instinct MI300X box in SPX/NPS1 (the factory default): 8× 1002:74a1 (processing
/// accelerator) on amdgpu, `/dev/kfd`, KFD's topology, and per GPU the 7 spare XCP render
/// devices amdgpu makes at probe whatever the mode (see [`amd_mi300x_in`]).
fn amd_mi300x(t: &mut Tree) {
    amd_mi300x_in(t, "SPX", "NPS1");
}

/// XCPs (compute partitions) an MI300X's 8 XCDs make in each compute mode
/// (`amdgpu_gfx.c` `amdgpu_gfx_compute_mode_desc`, `aqua_vanjaram.c`).
fn mi300x_partitions(compute: &str) -> u32 {
    match compute {
        "SPX" => 1,
        "DPX" => 2,
        "QPX" => 4,
        "CPX" => 8,
        other => panic!("no MI300X compute mode {other}"),
    }
}

/// The MI300X box with every GPU in `compute` mode (SPX, DPX, QPX, CPX) and `memory` mode
/// (NPS1, NPS4). What each fact follows (Linux `drivers/gpu/drm/`):
/// - the PCI function's `current_compute_partition`, `available_compute_partition`,
///   `current_memory_partition`, `available_memory_partition` (`amd/amdgpu/amdgpu_gfx.c`,
///   `amdgpu_gmc.c`: `sysfs_emit("%s\n")`);
/// - per GPU, after its own DRM device, 7 more DRM devices on platform devices
///   `amdgpu_xcp.N` (`amd/amdxcp/amdgpu_xcp_drv.c`: `platform_device_register_simple("amdgpu_xcp",
///   pdev_num++)`, `DRIVER_GEM | DRIVER_RENDER`), made at probe in every mode (`amdgpu_xcp.c`
///   `amdgpu_xcp_dev_alloc`, XCP 0 shares the GPU's own device). Probes are sequential, so
///   each GPU takes 8 card and 8 render minors in a row (`drm_drv.c` `drm_minor_alloc`); the
///   BMC holds card0, so the 65th primary minor spills into the extended range from 192
///   (`DRM_EXTENDED_MINOR_LIMIT`);
/// - KFD's topology under `devices/virtual/kfd/kfd/topology` (`amdkfd/kfd_chardev.c` creates
///   the `kfd` class device, `kfd_topology.c` the tree): one node per NUMA node's CPUs, then
///   one per active partition, numbered in order (`kfd_build_sysfs_node_tree`), each with
///   `gpu_id`, `name`, `properties` (`name value` lines, `node_show`) and
///   `mem_banks/0/properties`; a partition's `drm_render_minor` is its XCP's render minor,
///   `location_id` and `domain` its GPU's (`kfd_topology_add_device`).
fn amd_mi300x_in(t: &mut Tree, compute: &str, memory: &str) {
    base(t);
    let parts = mi300x_partitions(compute);
    let nps: u64 = memory.trim_start_matches("NPS").parse().expect("NPSn");
    // KFD: a CPU node per NUMA node first (CRAT order), then the GPUs' partitions.
    let kfd = "sys/devices/virtual/kfd/kfd";
    t.link("sys/class/kfd/kfd", kfd);
    t.file(&format!("{kfd}/dev"), "234:0\n");
    t.file(&format!("{kfd}/topology/generation_id"), "1\n");
    t.file(&format!("{kfd}/topology/system_properties"), "platform_oem 0\nplatform_id 0\nplatform_rev 0\n");
    let mut node = 0u32;
    for numa in 0..2u32 {
        let dir = format!("{kfd}/topology/nodes/{node}");
        t.file(&format!("{dir}/gpu_id"), "0\n");
        t.file(&format!("{dir}/name"), "\n");
        t.file(&format!("{dir}/properties"), &kfd_properties(96, 0, 96 * numa, 0, 0, 0, 0, 0));
        t.file(&format!("{dir}/mem_banks/0/properties"), &kfd_mem(0, 768 << 30));
        node += 1;
    }
    let mut xcp_dev = 0u32;
    for i in 0..8u32 {
        let bus = 0x05 + i * 0x20;
        let rc = format!("pci0000:{:02x}", bus - 3);
        let addr = format!("0000:{bus:02x}:00.0");
        let dir = t.pci(Func {
            parents: chain(&rc, &[&format!("0000:{:02x}:01.1", bus - 3), &format!("0000:{:02x}:00.0", bus - 2)]),
            addr: &addr,
            vendor: 0x1002,
            device: 0x74a1,
            class: 0x120000,
            numa: (i / 4) as i32,
            driver: Some("amdgpu"),
        });
        for (k, v) in [
            ("current_compute_partition", compute),
            ("available_compute_partition", "SPX, DPX, QPX, CPX"),
            ("current_memory_partition", memory),
            ("available_memory_partition", "NPS1, NPS4"),
        ] {
            t.file(&format!("{dir}/{k}"), &format!("{v}\n"));
        }
        // Minors in probe order: the GPU's own device, then its 7 XCP devices.
        let card = |k: u32| match 1 + 8 * i + k {
            m if m < 64 => m,
            m => 192 + (m - 64),
        };
        let render = |k: u32| 128 + 8 * i + k;
        t.class_dev(&dir, "drm", &format!("card{}", card(0)), &[]);
        t.class_dev(&dir, "drm", &format!("renderD{}", render(0)), &[]);
        t.node(&format!("dri/card{}", card(0)), 226, card(0));
        t.node(&format!("dri/renderD{}", render(0)), 226, render(0));
        for k in 1..8u32 {
            let pdev = format!("sys/devices/platform/amdgpu_xcp.{xcp_dev}");
            t.link(&format!("{pdev}/subsystem"), "sys/bus/platform");
            t.link(&format!("sys/bus/platform/devices/amdgpu_xcp.{xcp_dev}"), &pdev);
            t.class_dev(&pdev, "drm", &format!("card{}", card(k)), &[]);
            t.class_dev(&pdev, "drm", &format!("renderD{}", render(k)), &[]);
            t.node(&format!("dri/card{}", card(k)), 226, card(k));
            t.node(&format!("dri/renderD{}", render(k)), 226, render(k));
            xcp_dev += 1;
        }
        // The active partitions in KFD: 304 CUs and 192 GiB split evenly (NPS splits the
        // memory; partitions on one memory partition share it).
        let location = bus << 8; // PCI_DEVID(bus, devfn 0)
        for p in 0..parts {
            let dir = format!("{kfd}/topology/nodes/{node}");
            let gpu_id = 0x1000 + ((bus * 0x35 + p * 0x101) & 0xefff);
            t.file(&format!("{dir}/gpu_id"), &format!("{gpu_id}\n"));
            t.file(&format!("{dir}/name"), "ip discovery\n");
            let cus = 304 / parts;
            let unique = 0x5a1c_0000_0000_0000u64 | (u64::from(i) << 8) | u64::from(p);
            t.file(
                &format!("{dir}/properties"),
                &kfd_properties(0, cus * 4, 0, 8 / parts, location, render(p), unique, 0x4d49_3330_3058),
            );
            let mem = (192u64 << 30) / nps.max(1);
            t.file(&format!("{dir}/mem_banks/0/properties"), &kfd_mem(1, mem));
            node += 1;
        }
    }
    t.node("kfd", 234, 0);
}

/// A KFD node's `properties` as `node_show` prints them (`kfd_topology.c`), CPU or GPU.
#[allow(clippy::too_many_arguments)]
fn kfd_properties(
    cpu_cores: u32,
    simd: u32,
    cpu_base: u32,
    num_xcc: u32,
    location: u32,
    render_minor: u32,
    unique_id: u64,
    hive: u64,
) -> String {
    let gpu = simd > 0;
    let g = |v: u64| if gpu { v } else { 0 };
    let lines: Vec<(&str, u64)> = vec![
        ("cpu_cores_count", u64::from(cpu_cores)),
        ("simd_count", u64::from(simd)),
        ("mem_banks_count", 1),
        ("caches_count", g(0)),
        ("io_links_count", if gpu { 1 } else { 0 }),
        ("p2p_links_count", 0),
        ("cpu_core_id_base", u64::from(cpu_base)),
        ("simd_id_base", g(0x8000_0000)),
        ("max_waves_per_simd", g(8)),
        ("lds_size_in_kb", g(64)),
        ("gds_size_in_kb", 0),
        ("num_gws", g(64)),
        ("wave_front_size", g(64)),
        ("array_count", g(u64::from(num_xcc) * 4)),
        ("simd_arrays_per_engine", g(1)),
        ("cu_per_simd_array", g(10)),
        ("simd_per_cu", g(4)),
        ("max_slots_scratch_cu", g(32)),
        ("gfx_target_version", g(90402)),
        ("vendor_id", g(0x1002)),
        ("device_id", g(0x74a1)),
        ("location_id", u64::from(location)),
        ("domain", 0),
        ("drm_render_minor", u64::from(render_minor)),
        ("hive_id", g(hive)),
        ("num_sdma_engines", g(2)),
        ("num_sdma_xgmi_engines", g(14)),
        ("num_sdma_queues_per_engine", g(8)),
        ("num_cp_queues", g(24)),
        ("max_engine_clk_fcompute", g(2100)),
        ("local_mem_size", 0),
        ("fw_version", g(177)),
        ("capability", g(0x2db8_2280)),
        ("debug_prop", g(0x1495)),
        ("sdma_fw_version", g(22)),
        ("unique_id", unique_id),
        ("num_xcc", g(u64::from(num_xcc))),
        ("max_engine_clk_ccompute", 3700),
    ];
    lines.iter().map(|(k, v)| format!("{k} {v}\n")).collect()
}

/// A KFD memory bank's `properties` (`kfd_topology.c` `mem_show`): heap type 0 is system
/// memory, 1 the GPU's frame buffer (`HSA_MEM_HEAP_TYPE_FB_PUBLIC`).
fn kfd_mem(heap: u32, bytes: u64) -> String {
    let (width, clk) = if heap == 0 { (64, 2400) } else { (8192, 1300) };
    format!("heap_type {heap}\nsize_in_bytes {bytes}\nflags 0\nwidth {width}\nmem_clk_max {clk}\n")
}

/// Intel Data Center GPU Max 1550 box: 4× 8086:0bd5, three on i915 and one moved to xe.
fn intel_gpu_max(t: &mut Tree) {
    base(t);
    for i in 0..4u32 {
        let bus = 0x29 + i * 0x20;
        let addr = format!("0000:{bus:02x}:00.0");
        let dir = t.pci(Func {
            parents: chain(
                &format!("pci0000:{:02x}", bus - 3),
                &[
                    &format!("0000:{:02x}:01.0", bus - 3),
                    &format!("0000:{:02x}:00.0", bus - 2),
                    &format!("0000:{:02x}:01.0", bus - 1),
                ],
            ),
            addr: &addr,
            vendor: 0x8086,
            device: 0x0bd5,
            class: 0x038000,
            numa: (i / 2) as i32,
            driver: Some(if i == 3 { "xe" } else { "i915" }),
        });
        t.class_dev(&dir, "drm", &format!("card{}", i + 1), &[]);
        t.class_dev(&dir, "drm", &format!("renderD{}", 128 + i), &[]);
        t.node(&format!("dri/card{}", i + 1), 226, i + 1);
        t.node(&format!("dri/renderD{}", 128 + i), 226, 128 + i);
    }
}

/// ConnectX-6 Dx (15b3:101d) dual-port cards; port 0 of each card has `vfs` VFs (15b3:101e):
/// the first half on mlx5_core (netdev + RDMA), the rest on vfio-pci. RoCE: link type ether.
fn cx6dx(t: &mut Tree, cards: u32, vfs: u32) {
    if t.root.join("sys/devices/pci0000:00").exists() {
        // Sharing a root with another generator (the benchmark machine): skip the base.
    } else {
        base(t);
    }
    t.node("infiniband/rdma_cm", 10, 58);
    t.node("vfio/vfio", 10, 196);
    let mut verbs = 0u32;
    let mut ibdev = 0u32;
    for card in 0..cards {
        // One card at the real slot; the benchmark's many cards on buses clear of the GPUs'.
        let bus = if cards == 1 { 0x3b } else { 0x41 + card * 4 };
        let rc = format!("pci0000:{:02x}", bus - 1);
        let rp = format!("0000:{:02x}:00.0", bus - 1);
        let numa = (card % 2) as i32;
        let mut pfs = Vec::new();
        for port in 0..2u32 {
            let addr = format!("0000:{bus:02x}:00.{port}");
            let ifname = format!("ens{}f{port}np{port}", card + 1);
            let mac = format!("b8:ce:f6:{card:02x}:00:{port:02x}");
            let dir = mlx5_pf(t, chain(&rc, &[&rp]), &addr, 0x101d, numa, &ifname, &mac, ibdev, verbs);
            ibdev += 1;
            verbs += 1;
            t.file(&format!("{dir}/sriov_numvfs"), &format!("{}\n", if port == 0 { vfs } else { 0 }));
            pfs.push((addr, dir, ifname));
        }
        let (_, pf_dir, pf_if) = &pfs[0];
        for v in 0..vfs {
            // VFs follow the PFs: function 2 onwards, eight functions per device number.
            let n = v + 2;
            let addr = format!("0000:{bus:02x}:{:02x}.{}", n / 8, n % 8);
            let vfio = v >= vfs / 2;
            let dir = t.pci(Func {
                parents: chain(&rc, &[&rp]),
                addr: &addr,
                vendor: 0x15b3,
                device: 0x101e,
                class: 0x020000,
                numa,
                driver: Some(if vfio { "vfio-pci" } else { "mlx5_core" }),
            });
            t.link(&format!("{dir}/physfn"), pf_dir);
            t.link(&format!("{pf_dir}/virtfn{v}"), &dir);
            if vfio {
                let group = std::fs::read_link(t.root.join(&dir).join("iommu_group")).expect("group");
                let group = group.file_name().expect("group name").to_string_lossy().into_owned();
                t.node(&format!("vfio/{group}"), 244, group.parse().unwrap_or(0));
            } else {
                t.netdev(&dir, &format!("{pf_if}v{v}"), &format!("02:00:{card:02x}:00:{v:02x}:01"), 1, true, 100_000);
                t.class_dev(&dir, "infiniband", &format!("mlx5_{ibdev}"), &[("node_type", "1: CA")]);
                t.class_dev(
                    &dir,
                    "infiniband_verbs",
                    &format!("uverbs{verbs}"),
                    &[("ibdev", &format!("mlx5_{ibdev}"))],
                );
                t.node(&format!("infiniband/uverbs{verbs}"), 231, 192 + verbs);
                ibdev += 1;
                verbs += 1;
            }
        }
    }
}

/// A ConnectX PF bound to `mlx5_core` (PCI ID `15b3:device`): its Ethernet netdev, its RDMA
/// device `mlx5_<ibdev>` (`drivers/infiniband/hw/mlx5`) with `uverbs<verbs>` and its node
/// (major 231, minors from 192: `drivers/infiniband/core/uverbs_main.c`), and 127 VFs possible.
#[allow(clippy::too_many_arguments)]
fn mlx5_pf(
    t: &mut Tree,
    parents: Vec<String>,
    addr: &str,
    device: u16,
    numa: i32,
    ifname: &str,
    mac: &str,
    ibdev: u32,
    verbs: u32,
) -> String {
    let dir = t.pci(Func { parents, addr, vendor: 0x15b3, device, class: 0x020000, numa, driver: Some("mlx5_core") });
    t.netdev(&dir, ifname, mac, 1, true, 100_000);
    t.class_dev(&dir, "infiniband", &format!("mlx5_{ibdev}"), &[("node_type", "1: CA")]);
    t.class_dev(&dir, "infiniband_verbs", &format!("uverbs{verbs}"), &[("ibdev", &format!("mlx5_{ibdev}"))]);
    t.node(&format!("infiniband/uverbs{verbs}"), 231, 192 + verbs);
    t.file(&format!("{dir}/sriov_totalvfs"), "127\n");
    dir
}

/// Intel E810-C (8086:1593, ice) with 4 iavf VFs (8086:1889) on NUMA node 1.
fn e810(t: &mut Tree) {
    base(t);
    let parents = chain("pci0000:ae", &["0000:ae:00.0"]);
    let pf_dir = t.pci(Func {
        parents: parents.clone(),
        addr: "0000:af:00.0",
        vendor: 0x8086,
        device: 0x1593,
        class: 0x020000,
        numa: 1,
        driver: Some("ice"),
    });
    t.netdev(&pf_dir, "ens2f0", "40:a6:b7:21:00:00", 1, true, 100_000);
    t.file(&format!("{pf_dir}/sriov_totalvfs"), "128\n");
    t.file(&format!("{pf_dir}/sriov_numvfs"), "4\n");
    for v in 0..4u32 {
        let addr = format!("0000:af:01.{v}");
        let dir = t.pci(Func {
            parents: parents.clone(),
            addr: &addr,
            vendor: 0x8086,
            device: 0x1889,
            class: 0x020000,
            numa: 1,
            driver: Some("iavf"),
        });
        t.link(&format!("{dir}/physfn"), &pf_dir);
        t.link(&format!("{pf_dir}/virtfn{v}"), &dir);
        t.netdev(&dir, &format!("ens2f0v{v}"), &format!("02:00:00:00:00:{v:02x}"), 1, true, 100_000);
    }
}

/// AMD/Xilinx Alveo U250 after XRT 2018.3+: management PF (10ee:5004, xclmgmt, `mgmt_pf`,
/// `instance`) and user PF (10ee:5005, xocl, `user_pf`, `rom.u.N/VBNV`, `drm/renderD*`).
fn alveo_u250(t: &mut Tree) {
    base(t);
    let parents = chain("pci0000:d7", &["0000:d7:00.0"]);
    let mgmt = t.pci(Func {
        parents: parents.clone(),
        addr: "0000:d8:00.0",
        vendor: 0x10ee,
        device: 0x5004,
        class: 0x120000,
        numa: 1,
        driver: Some("xclmgmt"),
    });
    t.file(&format!("{mgmt}/mgmt_pf"), "\n");
    t.file(&format!("{mgmt}/instance"), "55296\n");
    t.node("xclmgmt55296", 239, 0);
    let user = t.pci(Func {
        parents,
        addr: "0000:d8:00.1",
        vendor: 0x10ee,
        device: 0x5005,
        class: 0x120000,
        numa: 1,
        driver: Some("xocl"),
    });
    t.file(&format!("{user}/user_pf"), "\n");
    t.file(&format!("{user}/rom.u.55297/VBNV"), "xilinx_u250_gen3x16_xdma_shell_4_1\n");
    t.file(&format!("{user}/rom.u.55297/timestamp"), "1599634287\n");
    t.file(&format!("{user}/xmc.u.55297/serial_num"), "21320733400G\n");
    t.class_dev(&user, "drm", "renderD128", &[]);
    t.node("dri/renderD128", 226, 128);
}

/// Intel PAC D5005 (8086:0b2b) on dfl-pci: FPGA region with an FME (whose PR sub-region carries
/// the interface ID, `compat_id`) and one port with a loaded AFU (`afu_id`).
fn intel_dfl(t: &mut Tree) {
    base(t);
    let dir = t.pci(Func {
        parents: chain("pci0000:3a", &["0000:3a:00.0"]),
        addr: "0000:3b:00.0",
        vendor: 0x8086,
        device: 0x0b2b,
        class: 0x120000,
        numa: 0,
        driver: Some("dfl-pci"),
    });
    let region = format!("{dir}/fpga_region/region0");
    t.dir(&region);
    t.link("sys/class/fpga_region/region0", &region);
    let fme = format!("{region}/dfl-fme.0");
    t.file(&format!("{fme}/ports_num"), "1\n");
    t.file(&format!("{fme}/bitstream_id"), "0x23000410010309\n");
    let pr = format!("{fme}/dfl-fme-region.1/fpga_region/region1");
    t.file(&format!("{pr}/compat_id"), "9346116d5e4f59a3a0d4a5a9e1ef4a9c\n");
    t.link("sys/class/fpga_region/region1", &pr);
    let port = format!("{region}/dfl-port.0");
    t.file(&format!("{port}/afu_id"), "d8424dc4a4a3c413f89e433683f9040b\n");
    t.file(&format!("{port}/id"), "0\n");
    t.link(&format!("{port}/driver"), "sys/bus/dfl/drivers/dfl-afu");
    t.node("dfl-fme.0", 240, 0);
    t.node("dfl-port.0", 241, 0);
}

/// A cloud VM: a virtio NIC (its netdev hangs off `virtio0`, not the PCI function) and nothing
/// any GPU/NIC/FPGA backend serves.
fn plain(t: &mut Tree) {
    t.node("null", 1, 3);
    t.node("kvm", 10, 232);
    t.node("net/tun", 10, 200);
    let dir = t.pci(Func {
        parents: vec!["pci0000:00".into()],
        addr: "0000:00:03.0",
        vendor: 0x1af4,
        device: 0x1041,
        class: 0x020000,
        numa: -1,
        driver: Some("virtio-pci"),
    });
    t.netdev(&format!("{dir}/virtio0"), "eth0", "52:54:00:12:34:56", 1, true, -1);
}

/// Every file and link under `root`, as (relative path → content or `-> target`), for comparing
/// a committed tree with a freshly generated one (directories only through what they hold).
pub fn snapshot(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_owned()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let p = e.path();
            let rel = p.strip_prefix(root).expect("under root").to_string_lossy().into_owned();
            let ft = e.file_type().expect("file type");
            if ft.is_symlink() {
                out.insert(rel, format!("-> {}", std::fs::read_link(&p).expect("link").display()));
            } else if ft.is_dir() {
                // Directories are not compared: git holds a directory only through the files
                // below it (a `gpuN/mig` chain with no file in it vanishes from a clone), and
                // every file's path already names its directories.
                stack.push(p);
            } else {
                // A control file (0200) is empty; only root could read it to find out.
                let write_only = e.metadata().is_ok_and(|m| m.len() == 0 && m.permissions().mode() & 0o444 == 0);
                let text = if write_only { Ok(String::new()) } else { std::fs::read_to_string(&p) };
                out.insert(rel, text.unwrap_or_else(|_| "<binary>".into()));
            }
        }
    }
    out
}
