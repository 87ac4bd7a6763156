//! `chaos`: the backend devplug's own tests use to prove the sandbox and the runtime.
//!
//! Config is `key=value` words (split at ASCII whitespace only, so a value may carry U+2028): `mode=ok|churn|flip|tick|escape|spin-init|spin-discover|trap-init|
//! trap-discover|hog-discover|fail-discover` (`churn`: every discover drops or restores the last
//! device, so the device list changes on each poll; `flip`: every device changes health on every
//! discover; `tick`: every device's attribute `tick` counts discovers, nothing else changes), `devices=N` (default 4), `resource=NAME`, `version=V`,
//! `names=a,b,c` (device IDs instead of `widget-N`), `sick=a,b` (these devices are Unhealthy),
//! `note=TEXT` (every device carries attribute `note` = TEXT: a description DRA may refuse),
//! `nodes=a,b` (device N gets `/dev/<Nth name>` instead of `/dev/null`), `exclusive` (its
//! devices do not declare `shared-node`: another backend naming their nodes conflicts),
//! `grab=a,b` (every `allocate` and `prepare` answer hands out `/dev/a`, `/dev/b`: another
//! backend's device nodes, say), `common=a,b` (the resource's common edits hand them out),
//! `init-ms=N` (every `init` takes N ms more: a backend that loads slowly).
//! For DRA (WIT 0.3.0): `describe=typed` (typed attributes, a `memory` capacity, each device
//! drawing 16Gi from a 64Gi counter set `chaos-memory`), `describe=stranger` (describes a device
//! discover did not list), `describe=bomb` (thirty 64-byte attributes per device); `prepare=whole` (prepare answers `CHAOS_CLAIM`, `CHAOS_CLAIM_DEVICES`
//! and `CHAOS_PARAMS` in env; a claim of an `evil-KIND` device gets that attack; unprepare of a
//! claim whose UID contains `stuck` fails).
//! In every mode, `allocate` misbehaves by device ID: an ID starting with `trap` panics, `spin`
//! loops forever, `hog` allocates 1 GiB; any other ID gets `CHAOS_IDS=<ids>` in its env.
//! `mode=escape` makes `discover` try every way out of the sandbox it knows and report each attempt
//! as a device attribute `attempt:<what>` = `refused: ...` or `ESCAPED: ...`.
//!
//! Hostile modes, one per attack class the sandbox must contain:
//! - `mode=sleep-init|sleep-discover`, and allocate IDs starting `sleep`: block in a WASI sleep
//!   (a host call, which epoch deadlines alone cannot interrupt) for a minute;
//! - `evil=KIND` (see [`evil_edits`]): every device, and allocate IDs `evil-KIND`, hand containers
//!   something outside the backend's grants (host nodes, mounts, loader env, CDI annotations);
//! - `mode=glob-bomb`: `devfs.glob` with patterns built to panic or stall the host's glob code;
//! - `mode=path-flood`: forty distinct 1 MiB refused paths (the host's memory and log);
//! - `mode=big-path-flood`: eight distinct 16 MiB refused paths per discover (memory the host
//!   must give back);
//! - `mode=list-flood|read-flood`: batched calls that make the host list `devices/big` 256
//!   times or read the 64 KiB `devices/blob` 4,096 times in one discover (the host's work done
//!   on the backend's behalf); the device reports how many answers came and the first refusal;
//! - `mode=forge-log`: messages with a newline and a line that looks like the host's own;
//! - `mode=log-flood`: thirty thousand lines through `log`, stdout and stderr;
//! - `mode=huge-error`: a 30 MB error string;
//! - `devices=N` with a large N: more devices than the host accepts;
//! - `mode=learn-stars`: asks for paths literally named `**`, `*` and `x[1]` (all NotFound), and
//!   globs `/dev` with `*`: what `--learn-requests` records must be what was used, never a
//!   wildcard at a tree's root.

use devplug_sdk::{
    Backend, BackendError, ContainerEdits, Device, Health, Info, Resource, ResourceInfo, Sys, dra, edits,
};

pub struct Chaos {
    mode: String,
    devices: u32,
    resource: String,
    version: String,
    names: Vec<String>,
    polls: std::cell::Cell<u32>,
    sick: Vec<String>,
    evil: Option<String>,
    note: Option<String>,
    describe: String,
    prepare: bool,
    nodes: Vec<String>,
    /// Devices without `shared-node`: their nodes are this backend's alone.
    exclusive: bool,
    /// Nodes every allocate/prepare answer hands out.
    grab: Vec<String>,
    /// Nodes the resource's common edits hand out.
    common: Vec<String>,
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
            evil: None,
            note: None,
            describe: String::new(),
            prepare: false,
            nodes: Vec::new(),
            exclusive: false,
            grab: Vec::new(),
            common: Vec::new(),
        };
        for word in config.split_ascii_whitespace() {
            match word.split_once('=') {
                Some(("mode", v)) => me.mode = v.into(),
                Some(("devices", v)) => me.devices = v.parse().map_err(|_| devplug_sdk::invalid_config(word))?,
                Some(("resource", v)) => me.resource = v.into(),
                Some(("version", v)) => me.version = v.into(),
                Some(("names", v)) => me.names = v.split(',').map(str::to_owned).collect(),
                Some(("sick", v)) => me.sick = v.split(',').map(str::to_owned).collect(),
                Some(("evil", v)) => me.evil = Some(v.into()),
                Some(("note", v)) => me.note = Some(v.into()),
                Some(("describe", v)) => me.describe = v.into(),
                Some(("prepare", v)) => me.prepare = v == "whole",
                Some(("nodes", v)) => me.nodes = v.split(',').map(str::to_owned).collect(),
                Some(("grab", v)) => me.grab = v.split(',').map(str::to_owned).collect(),
                Some(("common", v)) => me.common = v.split(',').map(str::to_owned).collect(),
                Some(("init-ms", v)) => {
                    let ms = v.parse().map_err(|_| devplug_sdk::invalid_config(word))?;
                    std::thread::sleep(std::time::Duration::from_millis(ms));
                }
                None if word == "exclusive" => me.exclusive = true,
                _ => return Err(devplug_sdk::invalid_config(format!("unknown setting {word:?}"))),
            }
        }
        match me.mode.as_str() {
            "spin-init" => spin(),
            "sleep-init" => nap(),
            "trap-init" => panic!("chaos: trapping in init as asked"),
            _ => {}
        }
        let resource = ResourceInfo::plain(me.resource.clone()).with_preferred_allocation().with_pre_start();
        let info = Info::new("chaos", &me.version, [resource]);
        Ok((me, info))
    }

    fn discover(&self, sys: &dyn Sys) -> Result<Vec<Resource>, BackendError> {
        let devices = match self.mode.as_str() {
            "spin-discover" => spin(),
            "sleep-discover" => nap(),
            "glob-bomb" => glob_bomb(sys),
            "path-flood" => path_flood(sys, 40, 1 << 20),
            "big-path-flood" => path_flood(sys, 8, 16 << 20),
            "list-flood" => host_work_flood(8, || {
                sys.list_many(&vec!["devices/big".to_owned(); 32]).into_iter().map(|r| r.map(drop)).collect()
            }),
            "read-flood" => host_work_flood(16, || {
                sys.read_many(&vec!["devices/blob".to_owned(); 256]).into_iter().map(|r| r.map(drop)).collect()
            }),
            "forge-log" => forge_log(),
            "learn-stars" => learn_stars(sys),
            "log-flood" => log_flood(),
            "huge-error" => return Err(BackendError::Other("x".repeat(30 << 20))),
            "trap-discover" => panic!("chaos: trapping in discover as asked"),
            "hog-discover" => hog(),
            "fail-discover" => return Err(BackendError::Other("chaos: failing discover as asked".into())),
            // One device per 48 attempts: the host takes at most 64 attributes per device.
            "escape" => escape_attempts(sys)
                .chunks(48)
                .enumerate()
                .map(|(i, attempts)| Device {
                    id: format!("escapee-{i}"),
                    health: Health::Healthy,
                    numa_nodes: vec![],
                    attributes: attempts.to_vec(),
                    edits: edits::empty(),
                })
                .collect(),
            _ => {
                let churned = self.churned();
                // `flip`: every device changes health on every discover.
                let flipped = self.mode == "flip" && self.polls.get().is_multiple_of(2);
                (0..self.devices - u32::from(churned))
                    .map(|i| (i, self.names.get(i as usize).cloned().unwrap_or_else(|| format!("widget-{i}"))))
                    .map(|(i, id)| Device {
                        health: if self.sick.contains(&id) || flipped { Health::Unhealthy } else { Health::Healthy },
                        id,
                        numa_nodes: vec![i % 2],
                        attributes: std::iter::once(("index".into(), i.to_string()))
                            .chain(self.note.iter().map(|n| ("note".into(), n.clone())))
                            .chain((self.mode == "tick").then(|| ("tick".into(), self.polls.get().to_string())))
                            .chain((!self.exclusive).then(|| ("shared-node".into(), "true".into())))
                            .collect(),
                        edits: {
                            let mut e = ContainerEdits {
                                device_nodes: vec![edits::dev_node(
                                    self.nodes.get(i as usize).map_or("null", String::as_str),
                                )],
                                ..edits::env("CHAOS_DEVICE", &format!("widget-{i}"))
                            };
                            if let Some(kind) = &self.evil {
                                edits::merge(&mut e, evil_edits(kind));
                            }
                            e
                        },
                    })
                    .collect()
            }
        };
        let common_edits = edits::nodes(self.common.iter().map(String::as_str));
        Ok(vec![Resource { name: self.resource.clone(), devices, common_edits }])
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
            } else if id.starts_with("sleep") {
                nap();
            } else if let Some(kind) = id.strip_prefix("evil-") {
                return Ok(evil_edits(kind));
            } else if id.starts_with("hog") {
                hog();
            } else if id.starts_with("fail") {
                return Err(BackendError::Other(format!("chaos: refusing {id}")));
            }
        }
        let mut e = edits::env("CHAOS_IDS", &ids.join(","));
        e.env.push(("CHAOS_VERSION".into(), self.version.clone()));
        edits::merge(&mut e, edits::nodes(self.grab.iter().map(String::as_str)));
        Ok(e)
    }

    fn describe(&self, sys: &dyn Sys) -> Result<dra::PoolDescription, BackendError> {
        let ids: Vec<String> = match self.describe.as_str() {
            "typed" => self.discover(sys)?.into_iter().flat_map(|r| r.devices).map(|d| d.id).collect(),
            "stranger" => vec!["nobody-listed-me".into()],
            // Every device with thirty attributes at the API server's 64-byte limit: about 18 MiB
            // for 8,192 devices, each string legal, the whole past the host's 8 MiB per answer.
            "bomb" => {
                let ids: Vec<String> = self.discover(sys)?.into_iter().flat_map(|r| r.devices).map(|d| d.id).collect();
                let devices = ids
                    .iter()
                    .map(|id| dra::DeviceDescription {
                        attributes: (0..30)
                            .map(|a| (format!("a{a:02}"), dra::AttributeValue::Text(format!("{a:064}"))))
                            .collect(),
                        ..dra::describe(&self.resource, id)
                    })
                    .collect();
                return Ok(dra::PoolDescription { counter_sets: vec![], devices });
            }
            _ => return Ok(dra::PoolDescription { counter_sets: vec![], devices: vec![] }),
        };
        let q = |name: &str, value: &str| dra::Counter { name: name.into(), value: value.into() };
        let devices = ids
            .iter()
            .enumerate()
            .map(|(i, id)| dra::DeviceDescription {
                attributes: vec![
                    ("index".into(), dra::AttributeValue::Integer(i as i64)),
                    ("model".into(), dra::AttributeValue::Text("chaos-widget".into())),
                    ("firmware".into(), dra::AttributeValue::Version("1.2.3".into())),
                    ("sick".into(), dra::AttributeValue::Flag(self.sick.contains(id))),
                ],
                capacity: vec![("memory".into(), "16Gi".into())],
                consumes_counters: vec![dra::CounterUse {
                    counter_set: "chaos-memory".into(),
                    counters: vec![q("memory", "16Gi")],
                }],
                ..dra::describe(&self.resource, id)
            })
            .collect();
        let counter_sets = vec![dra::CounterSet { name: "chaos-memory".into(), counters: vec![q("memory", "64Gi")] }];
        Ok(dra::PoolDescription { counter_sets, devices })
    }

    fn prepare(
        &self,
        _sys: &dyn Sys,
        claim_uid: &str,
        devices: &[dra::ClaimDevice],
        config: &[String],
    ) -> Result<ContainerEdits, BackendError> {
        if !self.prepare {
            return Err(BackendError::Unsupported);
        }
        if let Some(kind) = devices.iter().find_map(|d| d.id.strip_prefix("evil-")) {
            return Ok(evil_edits(kind));
        }
        let mut e = edits::env("CHAOS_CLAIM", claim_uid);
        let ids: Vec<String> = devices.iter().map(|d| format!("{}:{}", d.request, d.id)).collect();
        e.env.push(("CHAOS_CLAIM_DEVICES".into(), ids.join(",")));
        e.env.push(("CHAOS_PARAMS".into(), config.join(";")));
        edits::merge(&mut e, edits::nodes(self.grab.iter().map(String::as_str)));
        Ok(e)
    }

    fn unprepare(&self, _sys: &dyn Sys, claim_uid: &str) -> Result<(), BackendError> {
        if claim_uid.contains("stuck") {
            return Err(BackendError::Other(format!("chaos: cannot unprepare {claim_uid}")));
        }
        Ok(())
    }
}

fn spin() -> ! {
    let mut x: u64 = 0;
    loop {
        x = std::hint::black_box(x.wrapping_add(1));
    }
}

/// Block in the host (a WASI monotonic-clock poll) for a minute.
fn nap() -> ! {
    eprintln!("chaos: napping for a minute");
    std::thread::sleep(std::time::Duration::from_secs(60));
    panic!("chaos: woke up after a minute; the host should have cut this call off long before")
}

/// Edits outside any grant a test gives chaos (it is granted `/dev/null` and `/dev/zero` only).
fn evil_edits(kind: &str) -> ContainerEdits {
    use devplug_sdk::{DeviceNode, Mount};
    let node = |container: &str, host: &str| ContainerEdits {
        device_nodes: vec![DeviceNode {
            container_path: container.into(),
            host_path: host.into(),
            permissions: "rw".into(),
        }],
        ..edits::empty()
    };
    let mount_as = |host: &str, container: &str, read_only: bool| ContainerEdits {
        mounts: vec![Mount { host_path: host.into(), container_path: container.into(), read_only }],
        ..edits::empty()
    };
    let mount = |host: &str, container: &str| mount_as(host, container, true);
    let annotation = |k: &str, v: &str| ContainerEdits { annotations: vec![(k.into(), v.into())], ..edits::empty() };
    match kind {
        "dev-sda" => node("/dev/sda", ""),
        "dev-mem" => node("/dev/mem", ""),
        "innocent-mem" => node("/dev/innocent", "/dev/mem"),
        "shm-planted" => node("/dev/x", "/dev/shm/planted"),
        "mount-root" => mount("/", "/host"),
        "mount-containerd" => mount("/var/run/containerd/containerd.sock", "/run/containerd.sock"),
        "mount-kubelet" => mount("/var/lib/kubelet", "/kubelet"),
        "mount-proc" => mount("/proc", "/host-proc"),
        "mount-ld-preload" => mount("/opt/chaos/lib", "/etc/ld.so.preload"),
        "mount-libc" => mount("/opt/chaos/lib", "/usr/lib/x86_64-linux-gnu/libc.so.6"),
        "mount-shell" => mount("/opt/chaos/lib", "/bin/sh"),
        "mount-passwd" => mount("/opt/chaos/lib", "/etc/passwd"),
        "mount-sa-token" => mount("/opt/chaos/lib", "/var/run/secrets/kubernetes.io/serviceaccount"),
        "mount-rw" => mount_as("/opt/chaos/state", "/var/lib/chaos", false),
        "env-ld-preload" => edits::env("LD_PRELOAD", "/tmp/evil.so"),
        "env-cuda-injection" => edits::env("CUDA_INJECTION64_PATH", "/opt/chaos/lib/inject.so"),
        "env-openssl" => edits::env("OPENSSL_CONF", "/opt/chaos/openssl.cnf"),
        "env-glibc-tunables" => edits::env("GLIBC_TUNABLES", "glibc.malloc.check=3"),
        "env-unrequested" => edits::env("OTHER_DEVICES", "0"),
        "annotation-cdi" => annotation("cdi.k8s.io/x", "nvidia.com/gpu=all"),
        "annotation-other" => annotation("other.io/x", "y"),
        // Another device's node (with `nodes=null,zero`, the second device's).
        "steal-zero" => node("/dev/zero", ""),
        other if other.starts_with("hook-") => {
            let key = other[5..].parse::<usize>().ok().and_then(|i| HOOK_KEYS.get(i)).expect("chaos: hook-N, N < 25");
            edits::env(key, "/opt/chaos/lib/inject.so")
        }
        other => panic!("chaos: unknown evil kind {other:?}"),
    }
}

/// Env keys that make a loader, driver stack, library or tool load code or files, none of them
/// in a fixed list of the host's: a grant of `env = ["*"]` must still not let them through.
pub const HOOK_KEYS: [&str; 25] = [
    "VK_LAYER_PATH",
    "VK_ICD_FILENAMES",
    "VK_ADD_DRIVER_FILES",
    "OCL_ICD_FILENAMES",
    "OCL_ICD_VENDORS",
    "HSA_TOOLS_LIB",
    "NCCL_NET_PLUGIN",
    "NCCL_TUNER_PLUGIN",
    "LESSOPEN",
    "LESSCLOSE",
    "GST_PLUGIN_PATH",
    "__EGL_VENDOR_LIBRARY_FILENAMES",
    "LIBGL_DRIVERS_PATH",
    "LIBVA_DRIVERS_PATH",
    "GBM_BACKENDS_PATH",
    "MESA_LOADER_DRIVER_OVERRIDE",
    "__GLX_VENDOR_LIBRARY_NAME",
    "FI_PROVIDER_PATH",
    "HWLOC_PLUGINS_PATH",
    "OMPI_MCA_plm_rsh_agent",
    "GIT_SSH_COMMAND",
    "EDITOR",
    "HTTPS_PROXY",
    "SSL_CERT_FILE",
    "GDK_PIXBUF_MODULE_FILE",
];

/// Patterns that once panicked or stalled the host's glob; each must come back as an error.
fn glob_bomb(sys: &dyn Sys) -> Vec<Device> {
    let patterns =
        ["*".repeat(100_000), "a".repeat(16 << 20), "{".repeat(10_000), "[[[[".into(), "**/**/**/**/**".into()];
    let attributes = patterns
        .iter()
        .enumerate()
        .map(|(i, p)| (format!("attempt:glob-{i}"), format!("{:?}", sys.dev_glob(p).map(|v| v.len()))))
        .collect();
    vec![Device { id: "bomb".into(), health: Health::Healthy, numa_nodes: vec![], attributes, edits: edits::empty() }]
}

/// Reads of paths named like wildcards (NotFound on any machine) and a `*` glob of `/dev`: the
/// device reports how many nodes the glob matched.
fn learn_stars(sys: &dyn Sys) -> Vec<Device> {
    for p in ["**", "*", "**/vendor", "class/*", "x[1]"] {
        let _ = sys.read(p);
        let _ = sys.list(p);
        let _ = sys.proc_read(p);
        let _ = sys.dev_stat(p);
    }
    let matched = sys.dev_glob("*").map(|v| v.len()).unwrap_or(0);
    let attributes = vec![("matched".into(), matched.to_string())];
    vec![Device { id: "stars".into(), health: Health::Healthy, numa_nodes: vec![], attributes, edits: edits::empty() }]
}

/// `count` distinct refused paths of `size` bytes: each is copied into the host before it is
/// refused, so the host must neither keep nor log them whole, and must give the memory back.
fn path_flood(sys: &dyn Sys, count: u32, size: usize) -> Vec<Device> {
    let mut refused = 0u32;
    for i in 0..count {
        let path = format!("class/secret/{i}-{}", "p".repeat(size));
        if sys.read(&path).is_err() {
            refused += 1;
        }
    }
    let attributes = vec![("refused".into(), refused.to_string())];
    vec![Device { id: "flood".into(), health: Health::Healthy, numa_nodes: vec![], attributes, edits: edits::empty() }]
}

/// `rounds` rounds of `batch` (each answer dropped before the next round, so the guest's own
/// memory stays small): how many answers came back and the first refusal.
fn host_work_flood(rounds: u32, batch: impl Fn() -> Vec<Result<(), devplug_sdk::FsError>>) -> Vec<Device> {
    let (mut ok, mut first_error) = (0usize, None);
    for _ in 0..rounds {
        for r in batch() {
            match r {
                Ok(()) => ok += 1,
                Err(e) => {
                    first_error.get_or_insert_with(|| format!("{e:?}"));
                }
            }
        }
    }
    let attributes = vec![("ok".into(), ok.to_string()), ("error".into(), first_error.unwrap_or_default())];
    vec![Device { id: "flood".into(), health: Health::Healthy, numa_nodes: vec![], attributes, edits: edits::empty() }]
}

/// The line a forger wants in the host's text log, after a newline of its own.
pub const FORGED: &str = "2026-01-01T00:00:00.000000Z  INFO devplug::daemon: FORGED backend swapped in";

/// One message through every channel, each trying to end the host's line and start a forged one.
fn forge_log() -> Vec<Device> {
    devplug_sdk::log(devplug_sdk::Level::Warn, &format!("via log\n{FORGED}"));
    devplug_sdk::log(devplug_sdk::Level::Warn, &format!("via log again\u{1b}[2K\r{FORGED}"));
    println!("via stdout\r{FORGED}");
    eprintln!("via stderr\u{1b}[2K\r{FORGED}");
    vec![Device {
        id: "forger".into(),
        health: Health::Healthy,
        numa_nodes: vec![],
        attributes: vec![],
        edits: edits::empty(),
    }]
}

/// Thirty thousand lines through every channel a backend has to the host's log.
fn log_flood() -> Vec<Device> {
    let line = "flood ".repeat(30);
    for i in 0..30_000u32 {
        match i % 3 {
            0 => println!("{i} {line}"),
            1 => eprintln!("{i} {line}"),
            _ => devplug_sdk::log(devplug_sdk::Level::Warn, &format!("{i} {line}")),
        }
    }
    vec![Device {
        id: "flood".into(),
        health: Health::Healthy,
        numa_nodes: vec![],
        attributes: vec![],
        edits: edits::empty(),
    }]
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

    let reads: Vec<String> = [
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
    ]
    .map(String::from)
    .into();
    for path in &reads {
        attempt(&format!("sysfs.read {path}"), verdict(sys.read(path)));
    }
    // The same paths in one batch (the host's fast path opens their parents once).
    for (path, r) in reads.iter().zip(sys.read_many(&reads)) {
        attempt(&format!("sysfs.read-many {path}"), verdict(r));
    }
    let lists: Vec<String> =
        ["/", "..", "class/secret", "bus/pci/devices/0000:00:01.0/abs-dir", "escape-link"].map(String::from).into();
    for path in &lists {
        attempt(&format!("sysfs.list {path}"), verdict(sys.list(path)));
    }
    for (path, r) in lists.iter().zip(sys.list_many(&lists)) {
        attempt(&format!("sysfs.list-many {path}"), verdict(r));
    }
    attempt("sysfs.canonical abs-link", verdict(sys.canonical("bus/pci/devices/0000:00:01.0/abs-link")));
    attempt("sysfs.read-link class/secret/link", verdict(sys.read_link("class/secret/link")));
    let links: Vec<String> =
        ["class/secret/link", "bus/pci/devices/0000:00:01.0/../../secret/link", "/etc/mtab"].map(String::from).into();
    for (path, r) in links.iter().zip(sys.read_link_many(&links)) {
        attempt(&format!("sysfs.read-link-many {path}"), verdict(r));
    }
    // /proc: what a grant of `self/**` and `driver/**` must still keep out (magic links, other
    // processes, links out of the root).
    for path in [
        "self/environ",
        "self/root/etc/passwd",
        "self/cwd/etc/passwd",
        "self/fd/0",
        "1/environ",
        "../etc/passwd",
        "/proc/self/environ",
        "driver/escape",
        "driver/abs-escape",
    ] {
        attempt(&format!("procfs.read {path}"), verdict(sys.proc_read(path)));
    }
    for path in ["self/root", "self/fd", "1", "driver/abs-dir"] {
        attempt(&format!("procfs.list {path}"), verdict(sys.proc_list(path)));
    }
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
