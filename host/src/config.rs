//! `devplug run` settings: a TOML file (`--config`) with command-line flags on top.
//!
//! The file format is the top of the host: it is made of each layer's own settings types
//! (`kubelet::Strategy`, `backends::BackendSettings`, `oci::RegistrySettings`, ...) and only the
//! daemon and the CLI read it; the layers below never see a `Config`.
//!
//! ```toml
//! kubelet_dir = "/var/lib/kubelet/device-plugins"
//! registration = "auto"            # auto | kubelet-socket | plugin-watcher
//! backends_dir = "/backends"
//! poll_interval = "5s"
//! default_grant = "none"           # what a backend from the dir gets with no [backends.X.grant]
//! cdi_dir = "/var/run/cdi"          # CDI spec files; write_cdi = false turns them off
//! uevents = true                    # kernel uevents trigger subscribed backends' discover
//! allocate = ["device-specs"]       # device-specs | cdi-cri | cdi-annotations, several at once
//!
//! [resources."nvidia.com/gpu"]
//! allocate = ["cdi-cri"]            # per resource, overrides the default
//! write_cdi = true                  # false: no spec for this resource (NVIDIA's toolkit has one)
//!
//! [limits]
//! discover_timeout = "2s"
//! call_timeout = "250ms"
//! memory_mb = 64
//!
//! [backends.generic]
//! replace_embedded = false          # may generic.wasm in backends_dir replace the embedded one?
//! config = '''
//! [[resource]]
//! name = "devplug.io/kvm"
//! paths = ["kvm"]
//! '''
//! grant = { dev = ["kvm"], resources = ["devplug.io/*"] }
//!
//! [backends.acme]
//! image = "registry.example.com/acme/devplug-backend:1.2"   # followed; @sha256:… pins
//!
//! [registry]                          # see oci::settings
//! poll = "1m"
//! public_key = "/etc/devplug/cosign.pub"
//! ```
//!
//! A grant has the manifest's request kinds: `sysfs`, `dev`, `mounts` (absolute host paths),
//! `resources` and `annotations`; a backend gets requested ∩ granted of each.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::backends::{BackendSettings, Catalog, DefaultGrant};
use crate::kubelet::{RegistrationMode, Strategy};

/// Per-resource settings.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResourceSettings {
    /// How Allocate answers reach the runtime; `None` → the top-level `allocate`.
    pub allocate: Option<Vec<Strategy>>,
    /// `false`: write no CDI spec for this resource, e.g. where NVIDIA's toolkit already keeps
    /// one of the same kind (two specs naming one device conflict); `None` → `write_cdi`.
    pub write_cdi: Option<bool>,
    /// Which kubelet API serves the resource on this node: the Device Plugin API (the default)
    /// or DRA. Never both: kubelet would count the devices twice.
    #[serde(default)]
    pub api: Api,
    /// Device nodes (globs relative to `/dev`, as `grant.dev` writes them) this resource keeps
    /// when another backend's devices name them too: the other side's devices naming them are
    /// withheld, everything else of both backends stays (`["**"]`: every node it names).
    #[serde(default)]
    pub owns: Vec<String>,
}

/// The kubelet API a resource is served through.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Api {
    /// `v1beta1.DevicePlugin`: a socket per resource, `ListAndWatch` and `Allocate`.
    #[default]
    DevicePlugin,
    /// Dynamic Resource Allocation: ResourceSlices and the backend's driver's kubelet plugin.
    Dra,
}

/// `[dra]`: how devplug reaches the API server and kubelet's DRA side.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DraSettings {
    /// A kubeconfig file; `None` → the in-cluster service account (or `$KUBECONFIG`).
    pub kubeconfig: Option<PathBuf>,
    /// This node's name; `None` → `$NODE_NAME` (the downward API), else the host name.
    pub node_name: Option<String>,
    /// Kubelet's plugins dir: each driver's `dra.sock` and claim checkpoint live in `DIR/DRIVER/`
    /// (`None` → `plugins` beside `kubelet_dir`).
    pub plugins_dir: Option<PathBuf>,
    /// How often the published slices are compared with the API server's (kubelet deletes a
    /// node's slices when it starts; they are put back at the latest after this long).
    #[serde(with = "humantime_serde")]
    pub resync: Duration,
    /// Which prepared devices get a `status.devices` entry in their claim: `network` (devices
    /// with an interface name), `all`, or `off`.
    pub claim_status: crate::dra::plugin::status::StatusPolicy,
}

impl Default for DraSettings {
    fn default() -> Self {
        DraSettings {
            kubeconfig: None,
            node_name: None,
            plugins_dir: None,
            resync: Duration::from_secs(30),
            claim_status: Default::default(),
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    #[serde(with = "humantime_serde")]
    pub discover_timeout: Duration,
    #[serde(with = "humantime_serde")]
    pub call_timeout: Duration,
    pub memory_mb: usize,
    pub breaker_threshold: u32,
    /// The memory one compile of a component may use, in MiB (its worker's `RLIMIT_DATA`).
    pub compile_memory_mb: u64,
    /// CPU seconds one compile may use, plus [`Limits::compile_cpu_secs_per_mib`] per MiB of
    /// component (the worker's `RLIMIT_CPU`).
    pub compile_cpu_secs: u64,
    pub compile_cpu_secs_per_mib: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            discover_timeout: Duration::from_secs(2),
            call_timeout: Duration::from_millis(250),
            memory_mb: 64,
            breaker_threshold: 3,
            compile_memory_mb: crate::runtime::compile_worker::DEFAULT_BUDGET.memory_bytes >> 20,
            compile_cpu_secs: crate::runtime::compile_worker::DEFAULT_BUDGET.cpu_base_secs,
            compile_cpu_secs_per_mib: crate::runtime::compile_worker::DEFAULT_BUDGET.cpu_secs_per_mib,
        }
    }
}

/// Every key with its default and one line of doc: `devplug config --defaults`, and the source
/// of docs/config.md (tests keep the file, the command and [`Config::default`] equal).
pub const REFERENCE: &str = include_str!("config_reference.toml");

/// docs/config.md, made from [`REFERENCE`].
pub fn reference_page() -> String {
    format!(
        "# Configuration reference\n\nGenerated from `host/src/config_reference.toml` (also printed by `devplug config --defaults`);\n\
         edit that file, not this one. `devplug run --config devplug.toml`; flags override the file.\n\n```toml\n{REFERENCE}```\n"
    )
}

/// Everything `devplug run` needs.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub kubelet_dir: PathBuf,
    pub plugins_registry_dir: Option<PathBuf>,
    pub registration: RegistrationMode,
    /// How long kubelet may take to complete a registration before an ERROR and a failing
    /// `/readyz` (and, with `registration = "auto"`, the fall back to `kubelet.sock`).
    #[serde(with = "humantime_serde")]
    pub registration_timeout: Duration,
    pub backends_dir: Option<PathBuf>,
    /// Load the first-party backends built into the binary.
    pub embedded: bool,
    pub sysfs_root: PathBuf,
    pub dev_root: PathBuf,
    /// Where `/proc` is, for backends granted `procfs` paths (a fixture tree in tests).
    pub proc_root: PathBuf,
    /// Treat `c MAJOR:MINOR` files under `dev_root` as device nodes: fixture trees only. Never on
    /// a real `/dev`, where a planted file would pose as any device.
    pub dev_fixtures: bool,
    pub cdi_dir: PathBuf,
    /// Write CDI spec files at all (needed by the `cdi-*` strategies).
    pub write_cdi: bool,
    /// Listen to kernel uevents, so subscribed backends discover at once (see
    /// [`crate::backends::uevents`]); the poll stays as a safety net.
    pub uevents: bool,
    /// Default Allocate strategies (see [`crate::kubelet::answer`]).
    pub allocate: Vec<Strategy>,
    pub resources: BTreeMap<String, ResourceSettings>,
    pub metrics_addr: SocketAddr,
    /// Kubelet's pod resources socket (default: `pod-resources/kubelet.sock` beside the
    /// device-plugins dir); absent → no pod attribution, logged once.
    pub pod_resources_socket: Option<PathBuf>,
    #[serde(with = "humantime_serde")]
    pub pod_resources_interval: Duration,
    pub cache_dir: Option<PathBuf>,
    /// The most compiled code `cache_dir` keeps, in MiB (least recently used goes first).
    pub cache_max_mb: u64,
    /// Components at least this large (MiB) with no optimised code cached are served from
    /// baseline code first, their optimised code compiled after at idle priority and swapped
    /// in (0: every component).
    pub baseline_from_mb: u64,
    #[serde(with = "humantime_serde")]
    pub poll_interval: Duration,
    pub default_grant: DefaultGrant,
    pub limits: Limits,
    pub backends: BTreeMap<String, BackendSettings>,
    /// How backends with an `image` are pulled, verified and followed.
    pub registry: crate::oci::RegistrySettings,
    pub dra: DraSettings,
    /// The lock one devplug per node holds while it serves (see `daemon/handover.rs`); default
    /// `<plugins dir>/devplug/instance.lock`.
    pub instance_lock: Option<PathBuf>,
    /// The Unix socket `/status` is served on for `devplug status` (`0600`, devplug's user
    /// only); default `<plugins dir>/devplug/status.sock`.
    pub status_socket: Option<PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            kubelet_dir: PathBuf::from("/var/lib/kubelet/device-plugins"),
            plugins_registry_dir: None,
            registration: RegistrationMode::Auto,
            registration_timeout: crate::kubelet::PATIENCE,
            backends_dir: None,
            embedded: true,
            sysfs_root: PathBuf::from("/sys"),
            dev_root: PathBuf::from("/dev"),
            proc_root: PathBuf::from("/proc"),
            dev_fixtures: false,
            cdi_dir: PathBuf::from("/var/run/cdi"),
            write_cdi: true,
            uevents: true,
            allocate: vec![Strategy::DeviceSpecs],
            resources: BTreeMap::new(),
            metrics_addr: SocketAddr::from(([127, 0, 0, 1], 9400)),
            pod_resources_socket: None,
            pod_resources_interval: Duration::from_secs(10),
            cache_dir: None,
            cache_max_mb: crate::runtime::CACHE_MAX_BYTES >> 20,
            baseline_from_mb: (crate::runtime::BASELINE_FROM >> 20) as u64,
            poll_interval: Duration::from_secs(5),
            default_grant: DefaultGrant::None,
            limits: Limits::default(),
            backends: BTreeMap::new(),
            registry: crate::oci::RegistrySettings::default(),
            dra: DraSettings::default(),
            instance_lock: None,
            status_socket: None,
        }
    }
}

impl Config {
    /// Read a config file; errors name the file and what is wrong in it.
    pub fn from_file(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("config {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| anyhow::anyhow!("config {}: {e}", path.display()))
    }

    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let mut cfg: Config = toml::from_str(text).map_err(|e| anyhow::anyhow!(crate::gate::toml_error(text, &e)))?;
        let raw: toml::Table = text.parse().map_err(|e| anyhow::anyhow!(crate::gate::toml_error(text, &e)))?;
        for (name, b) in cfg.backends.iter_mut() {
            let grant = raw.get("backends").and_then(|t| t.get(name)).and_then(|t| t.get("grant"));
            b.grant_resources_unstated = grant.is_some_and(|g| g.get("resources").is_none());
            // Env grants by allow-list: exact keys or one vendor's prefix (`crate::gate::EnvGrant`).
            for pattern in b.grant.iter().flat_map(|g| &g.env) {
                crate::gate::EnvGrant::new(pattern).map_err(|e| anyhow::anyhow!("backends.{name}.grant.env: {e}"))?;
            }
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// The rules a config must keep, whichever way it was made: checked after a file is read
    /// and again after the command line's flags are applied to it (`RunArgs::config`), so a
    /// flag cannot give what the file could not.
    pub fn validate(&self) -> anyhow::Result<()> {
        let cfg = self;
        anyhow::ensure!(cfg.poll_interval >= Duration::from_millis(100), "poll_interval must be at least 100ms");
        anyhow::ensure!(cfg.limits.memory_mb >= 1, "limits.memory_mb must be at least 1");
        // Below this not even a 100 KB Rust backend compiles (the worker itself, and wasmtime's
        // engine, take about 20 MiB).
        anyhow::ensure!(
            cfg.limits.compile_memory_mb >= 64,
            "limits.compile_memory_mb must be at least 64 (the default, 384, compiles an 18 MB Python backend)"
        );
        anyhow::ensure!(cfg.limits.compile_cpu_secs >= 1, "limits.compile_cpu_secs must be at least 1");
        anyhow::ensure!(
            !cfg.allocate.is_empty(),
            "allocate needs at least one strategy (device-specs, cdi-cri, cdi-annotations)"
        );
        for (name, r) in &cfg.resources {
            anyhow::ensure!(
                r.allocate.as_ref().is_none_or(|a| !a.is_empty()),
                "resources.{name:?}.allocate needs at least one strategy (device-specs, cdi-cri, cdi-annotations)"
            );
            anyhow::ensure!(
                cfg.writes_cdi(name) || !cfg.strategies(name).iter().any(|s| s.is_cdi()),
                "resources.{name:?}: a cdi-* allocate strategy needs its CDI spec; drop write_cdi = false or use allocate = [\"device-specs\"]"
            );
        }
        anyhow::ensure!(
            cfg.write_cdi || !cfg.all_strategies().any(Strategy::is_cdi),
            "a cdi-* allocate strategy needs write_cdi = true"
        );
        if let Some(name) = cfg.dra_resources().first() {
            anyhow::ensure!(
                cfg.write_cdi,
                "resources.{name:?}: api = \"dra\" hands devices to the runtime through CDI; it needs write_cdi = true"
            );
        }
        cfg.decisions()?;
        anyhow::ensure!(cfg.dra.resync >= Duration::from_secs(1), "dra.resync must be at least 1s");
        for (name, b) in &cfg.backends {
            if let Some(d) = &b.dra_driver
                && let Some(why) = crate::dra::publish::rules::subdomain_problem(d)
            {
                anyhow::bail!("backends.{name}.dra_driver {d:?} is not a DNS subdomain: {why}");
            }
        }
        for (name, b) in &cfg.backends {
            if let Some(image) = &b.image {
                image
                    .parse::<oci_client::Reference>()
                    .map_err(|e| anyhow::anyhow!("backends.{name}.image {image:?} is not an image reference: {e}"))?;
            }
        }
        cfg.registry.validate().map_err(|e| anyhow::anyhow!("[registry]: {e:#}"))?;
        Ok(())
    }

    /// The pod resources socket.
    pub fn pod_resources_socket(&self) -> PathBuf {
        self.pod_resources_socket
            .clone()
            .unwrap_or_else(|| self.kubelet_dir.parent().unwrap_or(Path::new("/")).join("pod-resources/kubelet.sock"))
    }

    /// Whether devplug writes a CDI spec for `resource`.
    pub(crate) fn writes_cdi(&self, resource: &str) -> bool {
        // A resource served through DRA hands its devices out through its claims' own specs: a
        // spec of the resource's would name devices no container is given that way.
        self.write_cdi
            && self.api(resource) != Api::Dra
            && self.resources.get(resource).and_then(|r| r.write_cdi) != Some(false)
    }

    /// Allocate strategies for `resource`.
    pub(crate) fn strategies(&self, resource: &str) -> Vec<Strategy> {
        self.resources.get(resource).and_then(|r| r.allocate.clone()).unwrap_or_else(|| self.allocate.clone())
    }

    fn all_strategies(&self) -> impl Iterator<Item = Strategy> + '_ {
        self.allocate.iter().chain(self.resources.values().filter_map(|r| r.allocate.as_ref()).flatten()).copied()
    }

    /// The kubelet API that serves `resource`.
    pub fn api(&self, resource: &str) -> Api {
        self.resources.get(resource).map(|r| r.api).unwrap_or_default()
    }

    /// The resources served through DRA, in name order: [`Config::api`] decides, nothing else.
    pub fn dra_resources(&self) -> Vec<String> {
        self.resources.keys().filter(|n| self.api(n) == Api::Dra).cloned().collect()
    }

    /// Every resource's `owns`, compiled: who keeps a device node two backends name.
    pub(crate) fn decisions(&self) -> anyhow::Result<crate::model::owns::Decisions> {
        let mut rules = Vec::new();
        for (name, r) in self.resources.iter().filter(|(_, r)| !r.owns.is_empty()) {
            let mut set = globset::GlobSetBuilder::new();
            for p in &r.owns {
                let glob = crate::runtime::caps::compile_glob(p).map_err(|e| {
                    anyhow::anyhow!(
                        "resources.{name:?}.owns: {e} (write device nodes as grant.dev does: \"infiniband/uverbs*\")"
                    )
                })?;
                set.add(glob);
            }
            let set = set.build().map_err(|e| anyhow::anyhow!("resources.{name:?}.owns: {e}"))?;
            rules.push((name.clone(), set));
        }
        Ok(crate::model::owns::Decisions::new(rules))
    }

    /// Whether any resource is served through DRA (then devplug needs the API server).
    pub fn uses_dra(&self) -> bool {
        !self.dra_resources().is_empty()
    }

    /// Kubelet's plugins dir (`plugins` beside the device-plugins dir unless set).
    pub fn dra_plugins_dir(&self) -> PathBuf {
        self.dra.plugins_dir.clone().unwrap_or_else(|| {
            self.kubelet_dir.parent().map(|p| p.join("plugins")).unwrap_or_else(|| PathBuf::from("plugins"))
        })
    }

    /// The status socket's path: `status_socket`, else `devplug/status.sock` in the plugins dir.
    pub fn status_socket(&self) -> PathBuf {
        self.status_socket.clone().unwrap_or_else(|| self.dra_plugins_dir().join("devplug").join("status.sock"))
    }

    /// The instance lock's path: `instance_lock`, else `devplug/instance.lock` in the plugins dir.
    pub(crate) fn instance_lock(&self) -> PathBuf {
        self.instance_lock.clone().unwrap_or_else(|| self.dra_plugins_dir().join("devplug").join("instance.lock"))
    }

    /// The DRA driver name of backend `backend`: its `dra_driver`, else `BACKEND.devplug.io`.
    pub fn dra_driver(&self, backend: &str) -> String {
        self.backends
            .get(backend)
            .and_then(|b| b.dra_driver.clone())
            .unwrap_or_else(|| format!("{}.devplug.io", crate::dra::publish::pool::device_name(backend)))
    }

    /// `plugins_registry` beside the device-plugins dir unless set.
    pub fn plugins_registry_dir(&self) -> PathBuf {
        self.plugins_registry_dir.clone().unwrap_or_else(|| {
            self.kubelet_dir
                .parent()
                .map(|p| p.join("plugins_registry"))
                .unwrap_or_else(|| PathBuf::from("plugins_registry"))
        })
    }

    /// Where the backends come from and what the operator said about each.
    pub fn catalog(&self) -> Catalog<'_> {
        Catalog { embedded: self.embedded, dir: self.backends_dir.as_deref(), settings: &self.backends }
    }

    /// Where backends see the machine.
    pub fn roots(&self) -> crate::runtime::state::Roots {
        crate::runtime::state::Roots {
            sys: self.sysfs_root.clone(),
            dev: self.dev_root.clone(),
            proc: self.proc_root.clone(),
            dev_fixtures: self.dev_fixtures,
        }
    }

    pub(crate) fn runtime_config(&self) -> crate::runtime::RuntimeConfig {
        crate::runtime::RuntimeConfig {
            discover_deadline: self.limits.discover_timeout,
            call_deadline: self.limits.call_timeout,
            memory_cap: self.limits.memory_mb << 20,
            breaker_threshold: self.limits.breaker_threshold.max(1),
            cache_dir: self.cache_dir.clone(),
            cache_max_bytes: self.cache_max_mb.saturating_mul(1 << 20),
            baseline_from: usize::try_from(self.baseline_from_mb.saturating_mul(1 << 20)).unwrap_or(usize::MAX),
            compile_budget: crate::runtime::compile_worker::CompileBudget {
                memory_bytes: self.limits.compile_memory_mb.saturating_mul(1 << 20),
                cpu_base_secs: self.limits.compile_cpu_secs,
                cpu_secs_per_mib: self.limits.compile_cpu_secs_per_mib,
            },
            precompiled: if self.embedded { crate::backends::embedded::PRECOMPILED } else { &[] },
            // Read (and refused when bad) by `validate`; unreadable here means no signed code.
            operator_key: self
                .registry
                .operator_key
                .as_deref()
                .and_then(|k| crate::oci::signature::load_public_key(k).ok())
                .map(|k| crate::oci::signature::key_id(&k)),
            ..crate::runtime::RuntimeConfig::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 60: a TOML error is one line naming where it is (it printed literal `\n`s with a
    /// drawing of the place).
    #[test]
    fn a_toml_error_is_one_line_with_its_place() {
        let e = Config::parse("poll_interval = \"5s\"\n[limits\nmemory_mb = 64\n").unwrap_err().to_string();
        assert!(e.starts_with("line 2, column "), "{e}");
        assert!(!e.contains('\n'), "{e:?}");
        let e = Config::parse("poll_interval = 5\n").unwrap_err().to_string();
        assert!(e.starts_with("line 1, column 17: ") && e.ends_with("(at `poll_interval = 5`)"), "{e:?}");
    }

    /// The field names a `Deserialize` struct asks for, caught from its `deserialize_struct`.
    fn fields<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
        struct Catch(Option<&'static [&'static str]>);
        #[derive(Debug)]
        struct Caught;
        impl std::fmt::Display for Caught {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("caught")
            }
        }
        impl std::error::Error for Caught {}
        impl serde::de::Error for Caught {
            fn custom<M: std::fmt::Display>(_: M) -> Self {
                Caught
            }
        }
        impl<'de> serde::Deserializer<'de> for &mut Catch {
            type Error = Caught;
            fn deserialize_any<V: serde::de::Visitor<'de>>(self, _: V) -> Result<V::Value, Caught> {
                Err(Caught)
            }
            fn deserialize_struct<V: serde::de::Visitor<'de>>(
                self,
                _: &'static str,
                fields: &'static [&'static str],
                _: V,
            ) -> Result<V::Value, Caught> {
                self.0 = Some(fields);
                Err(Caught)
            }
            serde::forward_to_deserialize_any! {
                bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
                unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
            }
        }
        let mut c = Catch(None);
        let _ = T::deserialize(&mut c);
        c.0.expect("a struct")
    }

    /// `devplug config --defaults` is the truth: parsed, it is `Config::default()`, and it names
    /// every key of every table, so a new key without a line there fails here.
    /// Issue 41: `env = ["*"]` admitted every code-running key through a glob; a grant is now
    /// exact keys or one vendor's prefix, refused at load with what to write instead.
    #[test]
    fn an_env_glob_that_is_not_a_vendor_prefix_is_refused_at_load() {
        for bad in ["*", "LD_*", "HF_*", "A*"] {
            let text = format!("[backends.vendor]\ngrant = {{ env = [\"{bad}\"] }}\n");
            let e = format!("{:#}", Config::parse(&text).unwrap_err());
            assert!(e.contains("backends.vendor.grant.env") && e.contains("VENDOR_*"), "{bad}: {e}");
        }
        let ok = Config::parse("[backends.vendor]\ngrant = { env = [\"NVIDIA_*\", \"MY_KEY\"] }\n").unwrap();
        assert_eq!(ok.backends["vendor"].grant.as_ref().unwrap().env, ["NVIDIA_*", "MY_KEY"]);
    }

    #[test]
    fn the_reference_is_the_defaults_and_names_every_key() {
        assert_eq!(format!("{:?}", Config::parse(REFERENCE).unwrap()), format!("{:?}", Config::default()));
        let named = |key: &str| {
            REFERENCE.lines().any(|l| l.trim_start_matches('#').trim_start().starts_with(&format!("{key} =")))
        };
        let tables = [
            ("", fields::<Config>()),
            ("limits", fields::<Limits>()),
            ("registry", fields::<crate::oci::RegistrySettings>()),
            ("resources.NAME", fields::<ResourceSettings>()),
            ("dra", fields::<DraSettings>()),
            ("backends.NAME", fields::<BackendSettings>()),
            ("backends.NAME.grant", fields::<crate::runtime::caps::Globs>()),
        ];
        let mut missing = Vec::new();
        for (table, keys) in tables {
            for k in keys {
                let is_table = ["limits", "registry", "resources", "backends", "grant", "dra"].contains(k);
                if !is_table && !named(k) {
                    missing.push(format!("{table}.{k}"));
                }
            }
        }
        assert!(missing.is_empty(), "keys with no line in config_reference.toml: {missing:?}");
    }

    #[test]
    fn claim_status_defaults_to_network_and_an_unknown_value_names_the_choices() {
        assert_eq!(Config::parse("").unwrap().dra.claim_status, crate::dra::plugin::status::StatusPolicy::Network);
        let all = Config::parse("[dra]\nclaim_status = \"all\"\n").unwrap();
        assert_eq!(all.dra.claim_status, crate::dra::plugin::status::StatusPolicy::All);
        let e = format!("{:#}", Config::parse("[dra]\nclaim_status = \"ready\"\n").unwrap_err());
        assert!(e.contains("claim_status") && e.contains("network") && e.contains("off"), "{e}");
    }

    #[test]
    fn parses_a_full_config() {
        let c = Config::parse(
            "kubelet_dir = \"/k\"\nregistration = \"plugin-watcher\"\npoll_interval = \"1s\"\n[limits]\ncall_timeout = \"100ms\"\n[backends.generic]\nconfig = \"x\"\ngrant = { dev = [\"kvm\"] }\n",
        )
        .unwrap();
        assert_eq!(c.kubelet_dir, PathBuf::from("/k"));
        assert_eq!(c.registration, RegistrationMode::PluginWatcher);
        assert_eq!(c.poll_interval, Duration::from_secs(1));
        assert_eq!(c.limits.call_timeout, Duration::from_millis(100));
        assert_eq!(c.backends["generic"].grant.as_ref().unwrap().dev, ["kvm"]);
        assert_eq!(c.plugins_registry_dir(), PathBuf::from("/plugins_registry"));
        let c = Config::parse(
            "allocate = [\"cdi-cri\", \"cdi-annotations\"]\n[resources.\"a.io/b\"]\nallocate = [\"device-specs\"]\n",
        )
        .unwrap();
        assert_eq!(c.strategies("x.io/y"), [Strategy::CdiCri, Strategy::CdiAnnotations]);
        assert_eq!(c.strategies("a.io/b"), [Strategy::DeviceSpecs]);
    }

    #[test]
    fn malformed_configs_say_what_is_wrong() {
        let e = Config::parse("kubelet_dirr = \"/k\"").unwrap_err().to_string();
        assert!(e.contains("kubelet_dirr"), "{e}");
        let e = Config::parse("poll_interval = \"1ms\"").unwrap_err().to_string();
        assert!(e.contains("poll_interval"), "{e}");
        let e = Config::parse("allocate = []").unwrap_err().to_string();
        assert!(e.contains("at least one strategy"), "{e}");
        let c = Config::parse("[resources.\"nvidia.com/gpu\"]\nwrite_cdi = false\n").unwrap();
        assert!(!c.writes_cdi("nvidia.com/gpu") && c.writes_cdi("amd.com/gpu"));
        let e = Config::parse("allocate = [\"cdi-cri\"]\n[resources.\"nvidia.com/gpu\"]\nwrite_cdi = false\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("nvidia.com/gpu") && e.contains("device-specs"), "{e}");
        let e = Config::parse("allocate = [\"cdi\"]").unwrap_err().to_string();
        assert!(e.contains("cdi-cri"), "{e}");
        let e = Config::parse("write_cdi = false\n[resources.\"a.io/b\"]\nallocate = [\"cdi-cri\"]")
            .unwrap_err()
            .to_string();
        assert!(e.contains("write_cdi"), "{e}");
        let e = Config::parse("poll_interval = \"soon\"").unwrap_err().to_string();
        assert!(e.contains("poll_interval") || e.contains("soon"), "{e}");
    }

    #[test]
    fn registry_settings_are_checked_with_the_key_that_is_wrong() {
        let e = Config::parse("[backends.acme]\nimage = \"r.io/Acme:1\"\n").unwrap_err().to_string();
        assert!(e.contains("backends.acme.image") && e.contains("not an image reference"), "{e}");
        let e = Config::parse("[registry]\npoll = \"10ms\"\n").unwrap_err().to_string();
        assert!(e.contains("registry.poll"), "{e}");
        let e = Config::parse("[registry]\npublic_key = \"/nonexistent/cosign.pub\"\n").unwrap_err().to_string();
        assert!(e.contains("/nonexistent/cosign.pub"), "{e}");
        let e = Config::parse("[registry]\nplain_http = \"x\"\n").unwrap_err().to_string();
        assert!(e.contains("plain_http"), "{e}");
        let c = Config::parse("[backends.acme]\nimage = \"r.io/acme@sha256:0123456789012345678901234567890123456789012345678901234567890123\"\n").unwrap();
        assert!(c.backends["acme"].image.is_some());
    }
}
