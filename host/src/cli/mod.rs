//! The command line: every subcommand's arguments (clap), and where each command's work lives:
//! [`commands`] (discover, allocate, cdi generate on a fixture or this machine), [`tables`]
//! (output for people), [`http`] (talking to a running devplug for `status`), [`registry`]
//! (`push`, `pull`, `sign`), [`inspect`] (what a `.wasm` is and asks for, shared with `pack`),
//! [`pack`] (backends → an OCI image layout) and [`scaffold`] (`devplug new`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

use crate::backends::DefaultGrant;
use crate::config::Config;
use crate::kubelet::RegistrationMode;
use crate::observe::LogFormat;

/// `devplug --version`: the release and the WIT versions of backends it loads, so an operator can
/// tell before upgrading whether a vendor's backend still fits.
pub static VERSION: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let wit: Vec<String> =
        crate::runtime::bindings::SUPPORTED.iter().map(|v| format!("{v} (semver-compatible)")).collect();
    format!("{} (loads backends built against WIT devplug:backend {})", env!("CARGO_PKG_VERSION"), wit.join(", "))
});

#[derive(Parser, Debug)]
#[command(
    name = "devplug",
    version = VERSION.as_str(),
    about = "Kubernetes device plugins as sandboxed WebAssembly backends"
)]
pub struct Cli {
    /// Log format.
    #[arg(long, global = true, value_enum, default_value = "text")]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Serve every backend's resources to kubelet (the DaemonSet's job).
    Run(RunArgs),
    /// Print every config key with its default and one line of doc (docs/config.md).
    Config(ConfigArgs),
    /// Try devplug without a cluster: `run` against a local kubelet (the same rules the test
    /// suite's kubelet enforces) that prints each registration and device list, and takes
    /// commands on stdin: `allocate RESOURCE ID...|COUNT`, `list`, `quit`; with `--dra RESOURCE`
    /// (node `--node-name`, default `local`) also `slices`, `claim FILE` (the ResourceClaims of a
    /// YAML/JSON file, allocated as kube-scheduler does: CEL selectors, several requests,
    /// constraints across drivers; then prepared as kubelet does), `claim DRIVER DEVICE...`
    /// (those devices, by DRA name or device ID) and `unprepare CLAIM`. With `--kubelet-only`
    /// and a `run`'s `--kubelet-dir`, it is that devplug's kubelet.
    Try(RunArgs),
    /// Run each backend's discover once and print what it found.
    Discover(DiscoverArgs),
    /// Show a backend component's WIT version, imports, exports, capabilities and size.
    Inspect(InspectArgs),
    /// What Allocate would answer for these device IDs (the container's view), without kubelet.
    Allocate(AllocateArgs),
    /// CDI spec files.
    #[command(subcommand)]
    Cdi(CdiCommand),
    /// Dynamic Resource Allocation.
    #[command(subcommand)]
    Dra(DraCommand),
    /// Pack backends into an OCI image (layout dir or oci-archive tar) for an image volume.
    Pack(PackArgs),
    /// Publish a backend to a registry as a Wasm OCI artifact (its manifest in an annotation).
    Push(PushArgs),
    /// What a registry reference resolves to, whether its signature verifies, and what it holds.
    Pull(PullArgs),
    /// Sign a pushed backend the way `cosign sign --key` does (ECDSA P-256, PKCS#8 PEM key).
    Sign(SignArgs),
    /// Compile a backend in a registry once for every node of this devplug's engine and attach
    /// the native code to it, signed with the operator's key (nodes with `registry.operator_key`
    /// load it instead of compiling).
    Precompile(PrecompileArgs),
    /// Ask a running devplug (its --metrics-addr) what it serves, in a table.
    Status(StatusArgs),
    /// Start a new project.
    #[command(subcommand)]
    New(NewCommand),
}

#[derive(Subcommand, Debug)]
pub enum NewCommand {
    /// A backend project (Rust against the SDK, Python with componentize-py, JavaScript with
    /// componentize-js), with a fixture and a test.
    Backend(NewBackendArgs),
}

#[derive(clap::Args, Debug)]
pub struct NewBackendArgs {
    /// The backend's name ([a-z0-9-]).
    pub name: String,
    #[arg(long, value_enum, default_value = "rust")]
    pub lang: scaffold::Lang,
    /// Where to create it (default: ./NAME).
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
pub struct ConfigArgs {
    /// Every key with its default (the only view so far).
    #[arg(long, default_value_t = true)]
    pub defaults: bool,
}

#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    /// Where the running devplug serves /status: its status socket (a path; the default is
    /// where `run` puts it), or a loopback --metrics-addr (`127.0.0.1:9400`).
    #[arg(long, default_value = "/var/lib/kubelet/plugins/devplug/status.sock")]
    pub addr: String,
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
    /// Every device served: health, NUMA nodes, attributes (CDI names among them), nodes.
    #[arg(long)]
    pub devices: bool,
}

#[derive(clap::Args, Debug)]
pub struct PackArgs {
    /// Write an OCI image layout into this directory.
    #[arg(long, conflicts_with = "tar", required_unless_present = "tar")]
    pub out: Option<PathBuf>,
    /// Write an oci-archive tar file instead.
    #[arg(long)]
    pub tar: Option<PathBuf>,
    /// The image's tag (`org.opencontainers.image.ref.name`).
    #[arg(long, default_value = "latest")]
    pub tag: String,
    /// Platform architecture to stamp (the node's; wasm itself runs anywhere).
    #[arg(long, default_value_t = pack::host_arch().to_owned())]
    pub arch: String,
    /// BACKEND.wasm files, each optionally followed by its manifest (.toml); a NAME.toml beside
    /// NAME.wasm is taken along.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
}

/// How to reach a registry: a config file's `[registry]`, with flags on top.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct RegistryArgs {
    /// A devplug config file whose `[registry]` section to use (auth, CA, plain HTTP, key).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Speak plain HTTP to this registry (`host:port`; repeatable). Never a fallback.
    #[arg(long = "plain-http")]
    pub plain_http: Vec<String>,
    /// A docker config.json with the registry's credentials.
    #[arg(long)]
    pub auth_file: Option<PathBuf>,
}

impl RegistryArgs {
    pub(crate) fn settings(&self) -> anyhow::Result<crate::oci::RegistrySettings> {
        let mut s = match &self.config {
            Some(p) => Config::from_file(p)?.registry,
            None => crate::oci::RegistrySettings::default(),
        };
        s.plain_http.extend(self.plain_http.iter().cloned());
        if self.auth_file.is_some() {
            s.auth_file = self.auth_file.clone();
        }
        Ok(s)
    }
}

#[derive(clap::Args, Debug)]
pub struct PushArgs {
    /// Where to push: `registry/repository:tag`.
    pub reference: String,
    /// The backend component (`NAME.wasm`; NAME is the backend's name).
    pub wasm: PathBuf,
    /// Its manifest (default: NAME.toml or devplug.toml beside it).
    #[arg(long)]
    pub manifest: Option<PathBuf>,
    /// Also sign what was pushed with this key (as `devplug sign`).
    #[arg(long)]
    pub sign_key: Option<PathBuf>,
    #[command(flatten)]
    pub registry: RegistryArgs,
}

#[derive(clap::Args, Debug)]
pub struct PullArgs {
    /// `registry/repository:tag` or `registry/repository@sha256:…`.
    pub reference: String,
    /// The backend's name, for an image holding several (default: the repository's last part).
    #[arg(long)]
    pub name: Option<String>,
    /// Verify the signature against this public key (cosign.pub); fail when it does not verify.
    #[arg(long)]
    pub public_key: Option<PathBuf>,
    /// Write NAME.wasm and NAME.toml into this directory.
    #[arg(long)]
    pub out: Option<PathBuf>,
    #[command(flatten)]
    pub registry: RegistryArgs,
}

#[derive(clap::Args, Debug)]
pub struct SignArgs {
    /// The pushed backend: `registry/repository:tag` or `@sha256:…`.
    pub reference: String,
    /// The private key: unencrypted PKCS#8 PEM, ECDSA P-256.
    #[arg(long)]
    pub key: PathBuf,
    #[command(flatten)]
    pub registry: RegistryArgs,
}

#[derive(clap::Args, Debug)]
pub struct PrecompileArgs {
    /// The pushed backend: `registry/repository:tag` or `@sha256:…`.
    pub reference: String,
    /// The operator's private key (unencrypted PKCS#8 PEM, ECDSA P-256): never the key that
    /// signs backends.
    #[arg(long)]
    pub key: PathBuf,
    /// Compile only a version whose signature this key (the backends' `cosign.pub`) verifies.
    #[arg(long)]
    pub public_key: Option<PathBuf>,
    /// Once the native code is attached, point this tag (same repository) at the version: the
    /// tag nodes follow then never names a version without its code.
    #[arg(long)]
    pub promote: Option<String>,
    /// The backend's name, for an image holding several (default: the repository's last part).
    #[arg(long)]
    pub name: Option<String>,
    /// The compile's memory bound, in MiB (the compile runs in a worker the kernel bounds).
    #[arg(long, default_value_t = 1024)]
    pub compile_memory_mb: u64,
    /// The compile's CPU seconds, plus `compile_cpu_secs_per_mib` per MiB of component.
    #[arg(long, default_value_t = crate::runtime::compile_worker::DEFAULT_BUDGET.cpu_base_secs)]
    pub compile_cpu_secs: u64,
    #[arg(long, default_value_t = crate::runtime::compile_worker::DEFAULT_BUDGET.cpu_secs_per_mib)]
    pub compile_cpu_secs_per_mib: u64,
    #[command(flatten)]
    pub registry: RegistryArgs,
}

#[derive(clap::Args, Debug, Default)]
pub struct RunArgs {
    /// TOML config file; flags override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Kubelet's device-plugins dir (kubelet.sock and our sockets).
    #[arg(long)]
    pub kubelet_dir: Option<PathBuf>,
    /// Kubelet's plugin-watcher dir (default: plugins_registry beside --kubelet-dir).
    #[arg(long)]
    pub plugins_registry_dir: Option<PathBuf>,
    /// Kubelet's pod resources socket (default: pod-resources/kubelet.sock beside --kubelet-dir).
    #[arg(long)]
    pub pod_resources_socket: Option<PathBuf>,
    /// How to register with kubelet.
    #[arg(long, value_enum)]
    pub registration: Option<RegistrationMode>,
    /// Directory of backend .wasm files (with NAME.toml manifests); the config's `backends_dir`.
    /// (`--backends DIR`, its spelling in releases up to 0.2.0, still works.)
    #[arg(long = "backends-dir", alias = "backends", value_name = "DIR")]
    pub backends_dir: Option<PathBuf>,
    /// Do not load the first-party backends built into the binary.
    #[arg(long)]
    pub no_embedded: bool,
    /// Do not listen to kernel uevents (backends then see changes at polls only).
    #[arg(long)]
    pub no_uevents: bool,
    #[command(flatten)]
    pub machine: MachineArgs,
    /// Where CDI spec files go.
    #[arg(long)]
    pub cdi_dir: Option<PathBuf>,
    /// Read `c MAJOR:MINOR` files under --dev-root as device nodes (fixture trees only).
    #[arg(long)]
    pub dev_fixtures: bool,
    /// Address for /healthz, /readyz, /metrics, /status and /status/devices.
    #[arg(long)]
    pub metrics_addr: Option<SocketAddr>,
    /// Directory for compiled backends (skips compilation on restart).
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// How often backends' discover runs (device health).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub poll_interval: Option<Duration>,
    /// What directory backends get when the config grants them nothing.
    #[arg(long, value_enum)]
    pub default_grant: Option<DefaultGrant>,
    /// The API server for resources served through DRA, outside a cluster (default: in-cluster).
    /// For `try` with `--dra`: where to write its local API server's kubeconfig.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Serve RESOURCE through DRA (as `[resources."RESOURCE"] api = "dra"`); repeat for more.
    /// `try` then brings a local API server and kubelet DRA side of its own.
    #[arg(long = "dra", value_name = "RESOURCE")]
    pub dra: Vec<String>,
    /// This node's name, for DRA (default: $NODE_NAME, else the host name).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// Kubelet's plugins dir, for DRA (default: plugins beside --kubelet-dir).
    #[arg(long)]
    pub dra_plugins_dir: Option<PathBuf>,
    /// `try` only: be the local kubelet (and API server, with --dra) and nothing else, for a
    /// devplug started on its own with the same --kubelet-dir.
    #[arg(long)]
    pub kubelet_only: bool,
}

impl RunArgs {
    /// The config file (or defaults) with these flags applied.
    pub fn config(&self) -> anyhow::Result<Config> {
        let mut c = match &self.config {
            Some(p) => Config::from_file(p)?,
            None => Config::default(),
        };
        macro_rules! set {
            ($($f:ident),*) => { $( if let Some(v) = &self.$f { c.$f = v.clone(); } )* };
        }
        set!(kubelet_dir, registration, cdi_dir, metrics_addr, poll_interval, default_grant);
        self.machine.apply(&mut c);
        if self.plugins_registry_dir.is_some() {
            c.plugins_registry_dir = self.plugins_registry_dir.clone();
        }
        if self.pod_resources_socket.is_some() {
            c.pod_resources_socket = self.pod_resources_socket.clone();
        }
        if self.backends_dir.is_some() {
            c.backends_dir = self.backends_dir.clone();
        }
        if self.cache_dir.is_some() {
            c.cache_dir = self.cache_dir.clone();
        }
        if self.no_embedded {
            c.embedded = false;
        }
        if self.dev_fixtures {
            c.dev_fixtures = true;
        }
        if self.no_uevents {
            c.uevents = false;
        }
        if self.kubeconfig.is_some() {
            c.dra.kubeconfig = self.kubeconfig.clone();
        }
        if self.node_name.is_some() {
            c.dra.node_name = self.node_name.clone();
        }
        if self.dra_plugins_dir.is_some() {
            c.dra.plugins_dir = self.dra_plugins_dir.clone();
        }
        for r in &self.dra {
            match c.resources.get_mut(r) {
                Some(settings) => settings.api = crate::config::Api::Dra,
                None => {
                    let settings =
                        crate::config::ResourceSettings { api: crate::config::Api::Dra, ..Default::default() };
                    c.resources.insert(r.clone(), settings);
                }
            }
        }
        // The flags are held to the config's rules: `--poll-interval 10ms` or `--dra R` with
        // `write_cdi = false` are refused as the same lines in the file would be.
        c.validate().map_err(|e| anyhow::anyhow!("the config with this command line's flags: {e}"))?;
        Ok(c)
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Format {
    #[default]
    Table,
    Json,
}

/// Which backends to load and what machine they look at (`discover`, `cdi generate`).
#[derive(clap::Args, Debug)]
pub struct SourceArgs {
    /// Backend .wasm files (default: the embedded first-party backends).
    #[arg(long = "backend")]
    pub backends: Vec<PathBuf>,
    /// Also load the embedded backends when --backend is given.
    #[arg(long, conflicts_with = "no_embedded")]
    pub embedded: bool,
    /// Do not load the embedded backends (as `run --no-embedded`): only --backend files and the
    /// config's registry backends.
    #[arg(long)]
    pub no_embedded: bool,
    /// The manifest of a single --backend, when it is not NAME.toml beside the .wasm.
    #[arg(long, requires = "backends")]
    pub manifest: Option<PathBuf>,
    /// Config file for backend settings and grants (without it, backends get what they request).
    #[arg(long)]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub machine: MachineArgs,
    /// Read `c MAJOR:MINOR` files under --dev-root as device nodes (fixture trees only; also on
    /// when the config says `dev_fixtures = true`).
    #[arg(long)]
    pub dev_fixtures: bool,
    /// Cache compiled backends here (default: $DEVPLUG_CACHE_DIR, else ~/.cache/devplug, shared
    /// by every command), so a backend compiles once.
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// Compile without the cache: every command compiles each backend again, as a node that
    /// has never seen it does (a large one from baseline code, as in a first load).
    #[arg(long, conflicts_with = "cache_dir")]
    pub no_cache: bool,
}

impl SourceArgs {
    /// The config these commands read (`--config`, else defaults in which every backend gets
    /// what it requests).
    pub(crate) fn load_config(&self) -> anyhow::Result<Config> {
        match &self.config {
            Some(p) => Config::from_file(p),
            None => Ok(Config { default_grant: crate::backends::DefaultGrant::Requested, ..Config::default() }),
        }
    }

    /// The machine as `run` with `cfg` would see it; a flag given here wins.
    pub fn roots(&self, cfg: &Config) -> crate::runtime::state::Roots {
        let mut cfg = cfg.clone();
        self.machine.apply(&mut cfg);
        crate::runtime::state::Roots { dev_fixtures: self.dev_fixtures || cfg.dev_fixtures, ..cfg.roots() }
    }
}

/// Where the machine's kernel views are (fixture trees in tests), for `run` and the one-shot
/// commands alike: unset, the config's `sysfs_root`, `dev_root` and `proc_root` (else `/sys`,
/// `/dev`, `/proc`).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct MachineArgs {
    /// Where sysfs is (default: the config's `sysfs_root`, else /sys).
    #[arg(long)]
    pub sysfs_root: Option<PathBuf>,
    /// Where /dev is (default: the config's `dev_root`, else /dev).
    #[arg(long)]
    pub dev_root: Option<PathBuf>,
    /// Where procfs is (default: the config's `proc_root`, else /proc).
    #[arg(long)]
    pub proc_root: Option<PathBuf>,
}

impl MachineArgs {
    /// The config with the roots given here in place of its own.
    fn apply(&self, c: &mut Config) {
        for (given, root) in [
            (&self.sysfs_root, &mut c.sysfs_root),
            (&self.dev_root, &mut c.dev_root),
            (&self.proc_root, &mut c.proc_root),
        ] {
            if let Some(p) = given {
                *root = p.clone();
            }
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct DiscoverArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    /// Instead of listing devices, run backend NAME with everything granted and print the
    /// narrowest `[requests]` that allows exactly what its init and discover touched.
    #[arg(long, value_name = "NAME")]
    pub learn_requests: Option<String>,
    /// With --learn-requests: add the `[requests]` learned before (on another machine, fixture
    /// or partition mode) from FILE, so one manifest covers them all. Repeatable.
    #[arg(long, value_name = "FILE", requires = "learn_requests")]
    pub merge: Vec<PathBuf>,
    /// Fail (exit 1) on every warning too: a manifest request no grant can hold as written.
    #[arg(long)]
    pub strict: bool,
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
}

#[derive(Subcommand, Debug)]
pub enum DraCommand {
    /// Print the DeviceClass of each resource the config serves through DRA (`api = "dra"`), as a
    /// List for `kubectl apply -f -`: it selects the resource's devices and names the resource as
    /// its extendedResourceName, so pods asking for it by name keep working.
    Deviceclasses(DeviceClassesArgs),
    /// Print the DeviceClasses and ResourceSlices this node would publish, built as `run` builds
    /// them and checked with the API server's rules, without a cluster: from the machine or a
    /// fixture tree (`--sysfs-root`, `--dev-root`, `--proc-root`, `--dev-fixtures`). A pool that
    /// breaks a rule is an error naming backend, device and field.
    Slices(SlicesArgs),
    /// Release a claim whose backend could not unprepare it (`devplug status` lists it as
    /// stuck): at kubelet's next unprepare of it, devplug drops its CDI spec and record without
    /// asking the backend again. Run on the node, as the user devplug runs as.
    Release(ReleaseArgs),
}

#[derive(clap::Args, Debug)]
pub struct ReleaseArgs {
    /// The DRA driver holding the claim (`devplug status` shows it).
    #[arg(long)]
    pub driver: String,
    /// Where devplug keeps its DRA drivers' state (its `dra.plugins_dir`).
    #[arg(long, default_value = "/var/lib/kubelet/plugins")]
    pub dra_plugins_dir: PathBuf,
    /// The claim's UID.
    pub uid: String,
}

#[derive(clap::Args, Debug)]
pub struct SlicesArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    /// The node the slices are for (default: $NODE_NAME, else this machine's host name).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// Preview these resources (default: the config's `api = "dra"` resources, else every
    /// resource the backends serve).
    #[arg(long = "resource", value_name = "NAME")]
    pub resources: Vec<String>,
}

#[derive(clap::Args, Debug)]
pub struct DeviceClassesArgs {
    #[command(flatten)]
    pub source: SourceArgs,
}

#[derive(Subcommand, Debug)]
pub enum CdiCommand {
    /// Write each resource's CDI spec once, as `run` would, without serving anything.
    Generate(CdiGenerateArgs),
}

#[derive(clap::Args, Debug)]
pub struct CdiGenerateArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    /// Directory for the spec files (created if missing).
    #[arg(long)]
    pub out: PathBuf,
}

#[derive(clap::Args, Debug)]
pub struct AllocateArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    /// The resource (needed only when the IDs name devices of more than one).
    #[arg(long)]
    pub resource: Option<String>,
    /// Device IDs one container gets.
    #[arg(required = true)]
    pub ids: Vec<String>,
}

#[derive(clap::Args, Debug)]
pub struct InspectArgs {
    pub file: PathBuf,
    /// The backend's manifest, when it is neither NAME.toml nor devplug.toml beside the file.
    #[arg(long)]
    pub manifest: Option<PathBuf>,
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
}

pub mod cache;
mod commands;
mod http;
pub mod inspect;
mod learn;
pub mod pack;
mod registry;
pub mod scaffold;
mod tables;

pub use commands::{allocate, cdi_generate, device_classes, discover, dra_slices, refusals_by_grant};
pub use http::{all_devices, http_get, http_json};
pub use inspect::inspect;
pub use learn::learn_requests;
pub use registry::{precompile, pull, push, sign};
pub use tables::{devices_table, discover_table, status_table};
