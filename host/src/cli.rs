//! The command line: `devplug run | discover | inspect`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

use crate::backends::Manifest;
use crate::backends::{BackendSource, Registry};
use crate::config::{Config, DefaultGrant};
use crate::kubelet::RegistrationMode;
use crate::observe::LogFormat;
use crate::runtime::bindings::exported_version;
use crate::runtime::state::Roots;
use crate::runtime::{Runtime, RuntimeConfig};

#[derive(Parser, Debug)]
#[command(name = "devplug", version, about = "Kubernetes device plugins as sandboxed WebAssembly backends")]
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
    /// Run each backend's discover once and print what it found.
    Discover(DiscoverArgs),
    /// Show a backend component's WIT version, imports, exports, capabilities and size.
    Inspect(InspectArgs),
    /// What Allocate would answer for these device IDs (the container's view), without kubelet.
    Allocate(AllocateArgs),
    /// CDI spec files.
    #[command(subcommand)]
    Cdi(CdiCommand),
    /// Pack backends into an OCI image (layout dir or oci-archive tar) for an image volume.
    Pack(PackArgs),
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
    pub lang: crate::scaffold::Lang,
    /// Where to create it (default: ./NAME).
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    /// The running devplug's --metrics-addr.
    #[arg(long, default_value = "127.0.0.1:9400")]
    pub addr: String,
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
}

/// GET `path` from devplug's HTTP listener at `addr`; (status code, body).
pub async fn http_get(addr: &str, path: &str) -> anyhow::Result<(u16, String)> {
    use http_body_util::BodyExt;
    let stream = tokio::time::timeout(std::time::Duration::from_secs(5), tokio::net::TcpStream::connect(addr))
        .await
        .map_err(|_| anyhow::anyhow!("{addr}: connect timed out"))?
        .map_err(|e| anyhow::anyhow!("cannot reach devplug at {addr} (its --metrics-addr): {e}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let req = hyper::Request::get(path)
        .header(hyper::header::HOST, addr)
        .body(http_body_util::Empty::<bytes::Bytes>::new())?;
    let resp = sender.send_request(req).await?;
    let code = resp.status().as_u16();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((code, String::from_utf8_lossy(&body).into_owned()))
}

/// `devplug status` as a table for people.
pub fn status_table(v: &serde_json::Value) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let str_of = |x: &serde_json::Value| x.as_str().map(str::to_owned).unwrap_or_else(|| x.to_string());
    let mut rows = vec![["RESOURCE", "HEALTHY", "UNHEALTHY", "KUBELET"].map(str::to_owned).to_vec()];
    for r in v["resources"].as_array().into_iter().flatten() {
        rows.push(vec![str_of(&r["name"]), str_of(&r["healthy"]), str_of(&r["unhealthy"]), str_of(&r["endpoint"])]);
    }
    out.push_str(&table(&rows, &[false, true, true, false]));
    let mut rows = vec![
        ["BACKEND", "VERSION", "DIGEST", "BREAKER", "TRAPS", "TIMEOUTS", "LAST ERROR"].map(str::to_owned).to_vec(),
    ];
    for b in v["backends"].as_array().into_iter().flatten() {
        let digest: String = str_of(&b["digest"]).chars().take(12).collect();
        let breaker = if b["breaker_open"].as_bool() == Some(true) { "OPEN" } else { "closed" };
        rows.push(vec![
            str_of(&b["name"]),
            str_of(&b["version"]),
            digest,
            breaker.to_owned(),
            str_of(&b["stats"]["traps"]),
            str_of(&b["stats"]["timeouts"]),
            b["last_error"].as_str().unwrap_or("").to_owned(),
        ]);
    }
    let _ = writeln!(out);
    out.push_str(&table(&rows, &[false, false, false, false, true, true, false]));
    let allocs = v["allocations"].as_array().cloned().unwrap_or_default();
    if allocs.is_empty() {
        let _ = writeln!(out, "\nno allocations known (pod resources API off, or nothing allocated)");
    } else {
        let _ = writeln!(out, "\n{:<40} {:<16} NAMESPACE/POD/CONTAINER", "RESOURCE", "DEVICE");
        for a in allocs {
            let _ = writeln!(
                out,
                "{:<40} {:<16} {}/{}/{}",
                str_of(&a["resource"]),
                str_of(&a["device"]),
                str_of(&a["namespace"]),
                str_of(&a["pod"]),
                str_of(&a["container"])
            );
        }
    }
    out
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
    #[arg(long, default_value_t = crate::pack::host_arch().to_owned())]
    pub arch: String,
    /// BACKEND.wasm files, each optionally followed by its manifest (.toml); a NAME.toml beside
    /// NAME.wasm is taken along.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
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
    /// How to register with kubelet.
    #[arg(long, value_enum)]
    pub registration: Option<RegistrationMode>,
    /// Directory of backend .wasm files (with NAME.toml manifests).
    #[arg(long = "backends")]
    pub backends_dir: Option<PathBuf>,
    /// Do not load the first-party backends built into the binary.
    #[arg(long)]
    pub no_embedded: bool,
    /// Do not listen to kernel uevents (backends then see changes at polls only).
    #[arg(long)]
    pub no_uevents: bool,
    /// Where /sys is (a fixture tree in tests).
    #[arg(long)]
    pub sysfs_root: Option<PathBuf>,
    /// Where /dev is (a fixture tree in tests).
    #[arg(long)]
    pub dev_root: Option<PathBuf>,
    /// Where /proc is (a fixture tree in tests).
    #[arg(long)]
    pub proc_root: Option<PathBuf>,
    /// Where CDI spec files go.
    #[arg(long)]
    pub cdi_dir: Option<PathBuf>,
    /// Read `c MAJOR:MINOR` files under --dev-root as device nodes (fixture trees only).
    #[arg(long)]
    pub dev_fixtures: bool,
    /// Address for /healthz and /readyz.
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
        set!(
            kubelet_dir,
            registration,
            sysfs_root,
            dev_root,
            proc_root,
            cdi_dir,
            metrics_addr,
            poll_interval,
            default_grant
        );
        if self.plugins_registry_dir.is_some() {
            c.plugins_registry_dir = self.plugins_registry_dir.clone();
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
    #[arg(long)]
    pub embedded: bool,
    /// The manifest of a single --backend, when it is not NAME.toml beside the .wasm.
    #[arg(long, requires = "backends")]
    pub manifest: Option<PathBuf>,
    /// Config file for backend settings and grants (without it, backends get what they request).
    #[arg(long)]
    pub config: Option<PathBuf>,
    #[arg(long, default_value = "/sys")]
    pub sysfs_root: PathBuf,
    #[arg(long, default_value = "/dev")]
    pub dev_root: PathBuf,
    #[arg(long, default_value = "/proc")]
    pub proc_root: PathBuf,
    /// Read `c MAJOR:MINOR` files under --dev-root as device nodes (fixture trees only).
    #[arg(long)]
    pub dev_fixtures: bool,
    /// Cache compiled backends here (as `run --cache-dir`); repeated runs then skip compiling.
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
pub struct DiscoverArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
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
    /// The resource (needed when the backends serve more than one).
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

/// Load the chosen backends and run one discover. Load errors are returned, not raised: one
/// broken backend does not hide what the others see.
async fn load_once(args: SourceArgs) -> anyhow::Result<(Arc<Registry>, Vec<String>)> {
    let (registry, errors, _) = load_and_poll(args).await?;
    Ok((registry, errors))
}

/// [`load_once`], also handing back the resources that have devices, ready to answer calls.
async fn load_and_poll(
    args: SourceArgs,
) -> anyhow::Result<(Arc<Registry>, Vec<String>, Vec<crate::kubelet::ResourceHandle>)> {
    let cfg = match &args.config {
        Some(p) => Config::from_file(p)?,
        None => Config { default_grant: DefaultGrant::Requested, ..Config::default() },
    };
    let mut rc = cfg.runtime_config();
    if args.cache_dir.is_some() {
        rc.cache_dir = args.cache_dir.clone();
    }
    let runtime = Runtime::new(rc)?;
    let roots = Roots {
        sys: args.sysfs_root,
        dev: args.dev_root,
        proc: args.proc_root,
        dev_fixtures: args.dev_fixtures || cfg.dev_fixtures,
    };
    let registry = Arc::new(Registry::new(runtime, roots, cfg.backends.clone(), cfg.default_grant));
    let mut sources = Vec::new();
    if args.backends.is_empty() || args.embedded {
        sources.extend(BackendSource::embedded());
    }
    let mut errors = Vec::new();
    anyhow::ensure!(args.manifest.is_none() || args.backends.len() == 1, "--manifest goes with exactly one --backend");
    for path in &args.backends {
        let manifest = crate::backends::manifest_for(path, args.manifest.as_deref());
        if manifest.is_none() {
            tracing::warn!(backend = %path.display(), "no manifest found (NAME.toml or devplug.toml beside it, or --manifest): it gets no capabilities");
        }
        match BackendSource::from_file_with(path, manifest.as_deref()) {
            Ok(s) => sources.push(s),
            Err(e) => errors.push(format!("{e:#}")),
        }
    }
    for src in sources {
        let origin = src.origin.to_string();
        let r = registry.clone();
        match tokio::task::spawn_blocking(move || r.load(src)).await? {
            Ok(()) => {}
            Err(e) => errors.push(format!("{origin}: {e}")),
        }
    }
    let report = registry.poll_once().await;
    Ok((registry, errors, report.ready))
}

/// `devplug allocate`: load, discover once, and answer an Allocate for `ids` the way `run`
/// answers kubelet with the default strategy (device specs, mounts, env, annotations: the
/// resource's common edits, each device's, and what the backend's `allocate` adds).
pub async fn allocate(args: AllocateArgs) -> anyhow::Result<serde_json::Value> {
    let (registry, errors, ready) = load_and_poll(args.source).await?;
    anyhow::ensure!(errors.is_empty(), "{}", errors.join("\n"));
    let names: Vec<&str> = ready.iter().map(|h| h.name.as_str()).collect();
    let handle = match &args.resource {
        Some(r) => ready.iter().find(|h| h.name == *r),
        None if ready.len() == 1 => ready.first(),
        None => anyhow::bail!("the backends serve {}: say which with --resource", names.join(", ")),
    }
    .ok_or_else(|| anyhow::anyhow!("no resource {:?} with devices (serving: {})", args.resource, names.join(", ")))?;
    let snapshot = handle.devices.borrow().clone();
    let unknown: Vec<&String> = args.ids.iter().filter(|id| snapshot.device(id).is_none()).collect();
    anyhow::ensure!(unknown.is_empty(), "{}: unknown device IDs {unknown:?}", handle.name);
    let extra = handle.ops.allocate(args.ids.clone()).await.map_err(|e| anyhow::anyhow!("{}: {e}", handle.name))?;
    let answer = handle.delivery.answer(&snapshot, &args.ids, &extra);
    drop(registry);
    Ok(serde_json::json!({
        "resource": handle.name,
        "ids": args.ids,
        "devices": answer.devices.iter().map(|d| serde_json::json!({
            "container_path": d.container_path, "host_path": d.host_path, "permissions": d.permissions,
        })).collect::<Vec<_>>(),
        "mounts": answer.mounts.iter().map(|m| serde_json::json!({
            "container_path": m.container_path, "host_path": m.host_path, "read_only": m.read_only,
        })).collect::<Vec<_>>(),
        "envs": answer.envs,
        "annotations": answer.annotations,
    }))
}

/// `devplug cdi generate`: the spec files `run` would write, written once into `out`.
/// Returns the files written and the load errors.
pub async fn cdi_generate(args: CdiGenerateArgs) -> anyhow::Result<(Vec<PathBuf>, Vec<String>)> {
    let (registry, mut errors) = load_once(args.source).await?;
    let specs = crate::cdi::SpecDir::open(&args.out)?;
    let mut written = Vec::new();
    for r in registry.snapshot() {
        match specs.sync(&r) {
            Ok(true) => written.extend(crate::cdi::Kind::for_resource(&r.name).map(|k| args.out.join(k.file_name()))),
            Ok(false) => {}
            Err(e) => errors.push(format!("{}: {e}", r.name)),
        }
    }
    Ok((written, errors))
}

/// `devplug discover`: load, discover once, print. Errors in one backend do not stop the others.
pub async fn discover(args: DiscoverArgs) -> anyhow::Result<serde_json::Value> {
    let (registry, mut errors) = load_once(args.source).await?;
    // A backend that loaded but whose discover failed (or was refused) is an error too: a
    // vendor's CI must see it.
    for b in registry.summaries() {
        if let Some(e) = &b.last_error {
            errors.push(format!("{}: discover: {e}", b.name));
        }
    }
    let resources: Vec<serde_json::Value> = registry
        .snapshot()
        .iter()
        .map(|r| {
            serde_json::json!({
                "name": r.name,
                "devices": r.devices.iter().map(|d| serde_json::json!({
                    "id": d.id,
                    "health": d.health.as_str(),
                    "numa_nodes": d.numa_nodes,
                    "attributes": d.attributes.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(),
                    "edits": d.edits,
                })).collect::<Vec<_>>(),
                "common_edits": r.common_edits,
            })
        })
        .collect();
    Ok(serde_json::json!({ "backends": registry.summaries(), "resources": resources, "errors": errors }))
}

/// Rows as columns as wide as their widest cell (`right` aligns numbers), two spaces apart.
fn table(rows: &[Vec<String>], right: &[bool]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let width: Vec<usize> =
        (0..cols).map(|c| rows.iter().filter_map(|r| r.get(c)).map(|x| x.chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for r in rows {
        let cells: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(c, x)| {
                let last = c + 1 == r.len();
                match (right.get(c).copied().unwrap_or(false), last) {
                    (true, _) => format!("{x:>w$}", w = width[c]),
                    (false, true) => x.clone(),
                    (false, false) => format!("{x:<w$}", w = width[c]),
                }
            })
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// Render `discover`'s JSON as a table for people.
pub fn discover_table(v: &serde_json::Value) -> String {
    let mut out = String::new();
    for b in v["backends"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "backend {} {} (wit {}, {}){}\n",
            b["name"].as_str().unwrap_or("?"),
            b["version"].as_str().unwrap_or("?"),
            b["wit_version"].as_str().unwrap_or("?"),
            b["origin"].as_str().unwrap_or("?"),
            if b["breaker_open"].as_bool() == Some(true) { " BREAKER OPEN" } else { "" }
        ));
    }
    out.push_str(&format!("{:<28} {:<40} {:<10} {}\n", "RESOURCE", "DEVICE", "HEALTH", "NUMA"));
    for r in v["resources"].as_array().into_iter().flatten() {
        let devices = r["devices"].as_array().cloned().unwrap_or_default();
        if devices.is_empty() {
            out.push_str(&format!("{:<28} {:<40} {:<10}\n", r["name"].as_str().unwrap_or("?"), "(none)", "-"));
        }
        for d in devices {
            let numa: Vec<String> = d["numa_nodes"].as_array().into_iter().flatten().map(|n| n.to_string()).collect();
            out.push_str(&format!(
                "{:<28} {:<40} {:<10} {}\n",
                r["name"].as_str().unwrap_or("?"),
                d["id"].as_str().unwrap_or("?"),
                d["health"].as_str().unwrap_or("?"),
                if numa.is_empty() { "-".into() } else { numa.join(",") }
            ));
        }
    }
    for e in v["errors"].as_array().into_iter().flatten() {
        out.push_str(&format!("error: {}\n", e.as_str().unwrap_or("?")));
    }
    out
}

/// `devplug inspect`: what a component is, without running it.
/// Check that `bytes` is a backend component of a WIT version this host loads; returns it.
pub fn inspect_bytes(bytes: &[u8]) -> anyhow::Result<String> {
    let runtime = Runtime::new(RuntimeConfig::default())?;
    let compiled = runtime.compile(bytes)?;
    let version = exported_version(runtime.engine(), &compiled.component)
        .ok_or_else(|| anyhow::anyhow!("it does not export devplug:backend/backend"))?;
    anyhow::ensure!(
        crate::runtime::bindings::SUPPORTED.contains(&version.as_str()),
        "built against devplug:backend@{version}, which this host does not load (it loads {})",
        crate::runtime::bindings::SUPPORTED.join(", ")
    );
    Ok(version)
}

pub fn inspect(path: &Path, manifest: Option<&Path>) -> anyhow::Result<serde_json::Value> {
    let bytes = std::fs::read(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let runtime = Runtime::new(RuntimeConfig::default())?;
    let compiled = runtime.compile(&bytes).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let component = compiled.component;
    let ty = component.component_type();
    let engine = runtime.engine();
    let imports: Vec<String> = ty.imports(engine).map(|(n, _)| n.to_owned()).collect();
    let exports: Vec<String> = ty.exports(engine).map(|(n, _)| n.to_owned()).collect();
    let manifest_path = crate::backends::manifest_for(path, manifest);
    let manifest = match &manifest_path {
        Some(p) => {
            let t = std::fs::read_to_string(p).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
            Some(Manifest::parse(&t).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?)
        }
        None => None,
    };
    Ok(serde_json::json!({
        "file": path.display().to_string(),
        "size": bytes.len(),
        "sha256": compiled.digest,
        "wit_version": exported_version(engine, &component),
        "supported": exported_version(engine, &component).is_some_and(|v| crate::runtime::bindings::SUPPORTED.contains(&v.as_str())),
        "exports": exports,
        "imports": imports,
        "manifest": manifest.as_ref().map(|m| serde_json::json!({"name": m.name, "requests": m.requests})),
        "manifest_file": manifest_path.map(|p| p.display().to_string()),
    }))
}
