//! `chaos`: the backend devplug's own tests use to prove the sandbox and the runtime.
//!
//! Config is `key=value` words: `mode=ok|churn|escape|spin-init|spin-discover|trap-init|
//! trap-discover|hog-discover|fail-discover` (`churn`: every discover drops or restores the last
//! device, so the device list changes on each poll), `devices=N` (default 4), `resource=NAME`, `version=V`,
//! `names=a,b,c` (device IDs instead of `widget-N`), `sick=a,b` (these devices are Unhealthy).
//! In every mode, `allocate` misbehaves by device ID: an ID starting with `trap` panics, `spin`
//! loops forever, `hog` allocates 1 GiB; any other ID gets `CHAOS_IDS=<ids>` in its env.
//! `mode=escape` makes `discover` try every way out of the sandbox it knows and report each attempt
//! as a device attribute `attempt:<what>` = `refused: ...` or `ESCAPED: ...`.

use devplug_sdk::{Backend, BackendError, ContainerEdits, Device, Health, Info, Resource, ResourceInfo, Sys, edits};

pub struct Chaos {
    mode: String,
    devices: u32,
    resource: String,
    version: String,
    names: Vec<String>,
    polls: std::cell::Cell<u32>,
    sick: Vec<String>,
}

impl Chaos {
    /// In `churn` mode, whether this discover leaves the last device out (every other one).
    fn churned(&self) -> bool {
        let n = self.polls.get();
        self.polls.set(n.wrapping_add(1));
        self.mode == "churn" && self.devices > 0 && n % 2 == 1
    }
}

impl Backend for Chaos {
    fn init(config: &str, _sys: &dyn Sys) -> Result<(Self, Info), BackendError> {
        let mut me = Chaos {
            mode: "ok".into(),
            devices: 4,
            resource: "test.devplug.io/widget".into(),
            version: "1.0.0".into(),
            names: Vec::new(),
            polls: Default::default(),
            sick: Vec::new(),
        };
        for word in config.split_whitespace() {
            match word.split_once('=') {
                Some(("mode", v)) => me.mode = v.into(),
                Some(("devices", v)) => me.devices = v.parse().map_err(|_| devplug_sdk::invalid_config(word))?,
                Some(("resource", v)) => me.resource = v.into(),
                Some(("version", v)) => me.version = v.into(),
                Some(("names", v)) => me.names = v.split(',').map(str::to_owned).collect(),
                Some(("sick", v)) => me.sick = v.split(',').map(str::to_owned).collect(),
                _ => return Err(devplug_sdk::invalid_config(format!("unknown setting {word:?}"))),
            }
        }
        match me.mode.as_str() {
            "spin-init" => spin(),
            "trap-init" => panic!("chaos: trapping in init as asked"),
            _ => {}
        }
        let info = Info {
            name: "chaos".into(),
            version: me.version.clone(),
            resources: vec![ResourceInfo {
                name: me.resource.clone(),
                preferred_allocation: true,
                pre_start_required: true,
            }],
        };
        Ok((me, info))
    }

    fn discover(&self, sys: &dyn Sys) -> Result<Vec<Resource>, BackendError> {
        let devices = match self.mode.as_str() {
            "spin-discover" => spin(),
            "trap-discover" => panic!("chaos: trapping in discover as asked"),
            "hog-discover" => hog(),
            "fail-discover" => return Err(BackendError::Other("chaos: failing discover as asked".into())),
            "escape" => vec![Device {
                id: "escapee".into(),
                health: Health::Healthy,
                numa_nodes: vec![],
                attributes: escape_attempts(sys),
                edits: edits::empty(),
            }],
            _ => (0..self.devices - u32::from(self.churned()))
                .map(|i| (i, self.names.get(i as usize).cloned().unwrap_or_else(|| format!("widget-{i}"))))
                .map(|(i, id)| Device {
                    health: if self.sick.contains(&id) { Health::Unhealthy } else { Health::Healthy },
                    id,
                    numa_nodes: vec![i % 2],
                    attributes: vec![("index".into(), i.to_string())],
                    edits: ContainerEdits {
                        device_nodes: vec![edits::dev_node("null")],
                        ..edits::env("CHAOS_DEVICE", &format!("widget-{i}"))
                    },
                })
                .collect(),
        };
        Ok(vec![Resource { name: self.resource.clone(), devices, common_edits: edits::empty() }])
    }

    fn preferred_allocation(
        &self,
        _sys: &dyn Sys,
        _resource: &str,
        available: &[String],
        must_include: &[String],
        size: u32,
    ) -> Result<Vec<String>, BackendError> {
        // Prefer the highest-numbered devices, so tests can tell this answer from the host's
        // fallback (which takes the first ones).
        let mut out: Vec<String> = must_include.to_vec();
        for id in available.iter().rev() {
            if out.len() >= size as usize {
                break;
            }
            if !out.contains(id) {
                out.push(id.clone());
            }
        }
        Ok(out)
    }

    fn allocate(&self, _sys: &dyn Sys, _resource: &str, ids: &[String]) -> Result<ContainerEdits, BackendError> {
        for id in ids {
            if id.starts_with("trap") {
                panic!("chaos: trapping in allocate for {id}");
            } else if id.starts_with("spin") {
                spin();
            } else if id.starts_with("hog") {
                hog();
            } else if id.starts_with("fail") {
                return Err(BackendError::Other(format!("chaos: refusing {id}")));
            }
        }
        let mut e = edits::env("CHAOS_IDS", &ids.join(","));
        e.env.push(("CHAOS_VERSION".into(), self.version.clone()));
        Ok(e)
    }
}

fn spin() -> ! {
    let mut x: u64 = 0;
    loop {
        x = std::hint::black_box(x.wrapping_add(1));
    }
}

fn hog() -> Vec<Device> {
    // Touch every page so the memory is really asked for, one 1 MiB chunk at a time.
    let mut chunks: Vec<Vec<u8>> = Vec::new();
    for _ in 0..1024 {
        chunks.push(vec![1u8; 1 << 20]);
    }
    std::hint::black_box(&chunks);
    Vec::new()
}

/// Every way out we know; each must come back refused.
fn escape_attempts(sys: &dyn Sys) -> Vec<(String, String)> {
    fn verdict<T: std::fmt::Debug, E: std::fmt::Debug>(r: Result<T, E>) -> String {
        match r {
            Ok(v) => format!("ESCAPED: {v:?}"),
            Err(e) => format!("refused: {e:?}"),
        }
    }
    let mut out: Vec<(String, String)> = Vec::new();
    let mut attempt = |what: &str, result: String| out.push((format!("attempt:{what}"), result));

    for path in [
        "../../etc/passwd",
        "/etc/passwd",
        "bus/pci/devices/../../../etc/passwd",
        "bus/pci/devices/0000:00:01.0/../../../../etc/passwd",
        "../proc/self/environ",
        "bus/pci/devices/0000:00:01.0/abs-link",
        "bus/pci/devices/0000:00:01.0/rel-escape",
        "bus/pci/devices/0000:00:01.0/ungranted-link",
        "bus/pci/devices/0000:00:01.0/abs-dir/passwd",
        "escape-link/passwd",
        "class/secret/token",
        "bus/pci/devices/0000:00:01.0/vendor\0/etc/passwd",
    ] {
        attempt(&format!("sysfs.read {path}"), verdict(sys.read(path)));
    }
    for path in ["/", "..", "class/secret", "bus/pci/devices/0000:00:01.0/abs-dir", "escape-link"] {
        attempt(&format!("sysfs.list {path}"), verdict(sys.list(path)));
    }
    attempt("sysfs.canonical abs-link", verdict(sys.canonical("bus/pci/devices/0000:00:01.0/abs-link")));
    attempt("sysfs.read-link class/secret/link", verdict(sys.read_link("class/secret/link")));
    for path in ["../etc/passwd", "/etc/passwd", "/proc/self/environ", "kvm", "sda"] {
        attempt(&format!("devfs.stat {path}"), verdict(sys.dev_stat(path)));
    }
    for pattern in ["../*", "/etc/*", "**/../*", "sd*"] {
        // An empty list is a refusal too: nothing outside the grant was shown.
        let r =
            sys.dev_glob(pattern).and_then(|v| if v.is_empty() { Err(devplug_sdk::FsError::NotFound) } else { Ok(v) });
        attempt(&format!("devfs.glob {pattern}"), verdict(r));
    }
    attempt("wasi.read /etc/passwd", verdict(std::fs::read_to_string("/etc/passwd")));
    attempt("wasi.read proc/self/environ", verdict(std::fs::read("proc/self/environ")));
    attempt("wasi.read_dir /", verdict(std::fs::read_dir("/").map(|d| d.count())));
    attempt("wasi.read_dir .", verdict(std::fs::read_dir(".").map(|d| d.count())));
    attempt("wasi.write /tmp/devplug-escape", verdict(std::fs::write("/tmp/devplug-escape", b"x")));
    attempt("wasi.tcp 127.0.0.1:1", verdict(std::net::TcpStream::connect("127.0.0.1:1")));
    attempt("wasi.udp bind", verdict(std::net::UdpSocket::bind("127.0.0.1:0")));
    attempt("wasi.dns localhost", verdict(std::net::ToSocketAddrs::to_socket_addrs("localhost:80").map(|a| a.count())));
    let vars: Vec<(String, String)> = std::env::vars().collect();
    attempt("wasi.env", verdict(if vars.is_empty() { Err("empty") } else { Ok(vars) }));
    let args: Vec<String> = std::env::args().collect();
    attempt("wasi.args", verdict(if args.is_empty() { Err("empty") } else { Ok(args) }));
    out
}

devplug_sdk::backend!(Chaos);
