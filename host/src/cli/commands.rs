//! The one-shot commands that load backends on a machine (or a fixture tree) without serving
//! kubelet: `discover`, `allocate`, `cdi generate`, `dra deviceclasses`, `dra slices`. Backends come from the binary, `--backend`
//! files, and the registry references of `--config` (`[backends.NAME] image`).

use std::path::PathBuf;
use std::sync::Arc;

use super::{AllocateArgs, CdiGenerateArgs, DeviceClassesArgs, DiscoverArgs, SlicesArgs, SourceArgs};
use crate::backends::{BackendSource, Loaded};
use crate::config::Config;
use crate::runtime::Runtime;

/// Which resources a one-shot command treats as served through DRA (their backends are asked
/// to `describe`, and devices listed for DRA only are kept).
enum DraView {
    /// As `run` would with the config (`api = "dra"`).
    Configured,
    /// These resources.
    Only(Vec<String>),
    /// Every resource.
    All,
}

/// Load the chosen backends and run one discover. Load errors are returned, not raised: one
/// broken backend does not hide what the others see.
/// One backend's failure in a one-shot command: whose, and what (the message names it too).
#[derive(Clone, Debug, serde::Serialize)]
pub struct Failure {
    pub backend: Option<String>,
    pub message: String,
}

impl Failure {
    fn of(backend: &str, message: String) -> Failure {
        Failure { backend: Some(backend.to_owned()), message }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

fn messages(failures: &[Failure]) -> String {
    failures.iter().map(|f| f.message.as_str()).collect::<Vec<_>>().join("\n")
}

async fn load_once(args: SourceArgs) -> anyhow::Result<(Arc<Loaded>, Vec<Failure>)> {
    let (loaded, errors, _) = load_and_poll(args).await?;
    Ok((loaded, errors))
}

/// [`load_once`], also handing back the resources that have devices, ready to answer calls.
async fn load_and_poll(
    args: SourceArgs,
) -> anyhow::Result<(Arc<Loaded>, Vec<Failure>, Vec<crate::backends::ReadyResource>)> {
    load_and_poll_as(args, DraView::Configured).await
}

/// [`load_and_poll`] with the DRA resources chosen by `dra`.
async fn load_and_poll_as(
    args: SourceArgs,
    dra: DraView,
) -> anyhow::Result<(Arc<Loaded>, Vec<Failure>, Vec<crate::backends::ReadyResource>)> {
    let cfg = args.load_config()?;
    // The command's flag, else the config's dir, else the cache every command shares.
    let explicit = args.cache_dir.as_deref().or(cfg.cache_dir.as_deref());
    let runtime = Runtime::new(super::cache::one_shot(cfg.runtime_config(), explicit, args.no_cache))?;
    let roots = args.roots(&cfg);
    let loaded = Loaded::new(runtime, roots, cfg.backends.clone(), cfg.default_grant).with_decisions(cfg.decisions()?);
    let loaded = Arc::new(match dra {
        DraView::Configured => loaded.with_dra_resources(cfg.dra_resources()),
        DraView::Only(names) => loaded.with_dra_resources(names),
        DraView::All => loaded.with_all_dra(),
    });
    let mut errors = Vec::new();
    // Backends the config takes from a registry: pulled and verified as `run` would (or taken
    // from its cache), so an operator sees what they would serve on this node.
    let mut pulled = Vec::new();
    if let Some(mut follower) = crate::backends::Follower::new(&cfg.backends, &cfg.registry, cfg.cache_dir.as_deref())?
    {
        follower.start().await;
        for s in follower.statuses().all() {
            if let Some(e) = s.last_error.filter(|_| s.digest.is_none()) {
                errors.push(Failure::of(&s.backend, format!("{} ({}): {e}", s.backend, s.reference)));
            }
        }
        pulled = follower.sources();
    }
    // Without --backend files: exactly what `run` loads with this config (embedded unless
    // `embedded = false` or --no-embedded, its backends_dir, its registry images). With them:
    // those files, plus the embedded ones when --embedded asks.
    let mut dir = if args.backends.is_empty() { cfg.backends_dir.as_deref() } else { None };
    if let Some(d) = dir.filter(|d| !d.exists()) {
        // The node's config names the dir its DaemonSet mounts; run elsewhere, it is not there.
        tracing::warn!("backends_dir {} is not on this machine: its backends are left out", d.display());
        dir = None;
    }
    let catalog = crate::backends::Catalog {
        embedded: !args.no_embedded && (args.backends.is_empty() && cfg.embedded || args.embedded),
        dir,
        settings: &cfg.backends,
    };
    let (mut sources, problems) = crate::backends::sources(&catalog, &pulled);
    errors.extend(problems.into_iter().map(|message| Failure { backend: None, message }));
    anyhow::ensure!(args.manifest.is_none() || args.backends.len() == 1, "--manifest goes with exactly one --backend");
    for path in &args.backends {
        let manifest = crate::backends::manifest_for(path, args.manifest.as_deref());
        if manifest.is_none() {
            tracing::warn!(backend = %path.display(), "no manifest found (NAME.toml or devplug.toml beside it, or --manifest): it gets no capabilities");
        }
        match BackendSource::from_file_with(path, manifest.as_deref()) {
            Ok(s) => sources.push(s),
            Err(e) => {
                let name = path.file_stem().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                errors.push(Failure::of(&name, format!("{e:#}")));
            }
        }
    }
    for src in sources {
        // `[backends.NAME] enabled = false` holds here as in `run`.
        if !loaded.enabled(&src.name) {
            continue;
        }
        let (origin, name) = (src.origin.to_string(), src.name.clone());
        let r = loaded.clone();
        match tokio::task::spawn_blocking(move || r.load(src)).await? {
            Ok(()) => {}
            Err(e) => errors.push(Failure::of(&name, format!("{origin}: {e}"))),
        }
    }
    let report = loaded.poll_once().await;
    Ok((loaded, errors, report.ready))
}

/// `devplug allocate`: load, discover once, and answer an Allocate for `ids` the way `run`
/// answers kubelet with the default strategy (device specs, mounts, env, annotations: the
/// resource's common edits, each device's, and what the backend's `allocate` adds).
pub async fn allocate(args: AllocateArgs) -> anyhow::Result<serde_json::Value> {
    let (loaded, errors, ready) = load_and_poll(args.source).await?;
    if let Some(first) = errors.first() {
        let e = anyhow::anyhow!("{}", messages(&errors));
        return Err(match &first.backend {
            Some(b) => e.context(crate::observe::Backend(b.clone())),
            None => e,
        });
    }
    let names: Vec<&str> = ready.iter().map(|h| h.name.as_str()).collect();
    // Without --resource: the one resource served, or the one whose devices the IDs name.
    let naming: Vec<&crate::backends::ReadyResource> = ready
        .iter()
        .filter(|h| {
            let list = h.devices.borrow();
            !args.ids.is_empty() && args.ids.iter().all(|id| list.device(id).is_some())
        })
        .collect();
    let handle = match &args.resource {
        Some(r) => ready.iter().find(|h| h.name == *r),
        None if ready.len() == 1 => ready.first(),
        None if naming.len() == 1 => naming.first().copied(),
        None => anyhow::bail!(
            "the backends serve {}, and the IDs do not name devices of exactly one of them: say which with --resource",
            names.join(", ")
        ),
    }
    .ok_or_else(|| anyhow::anyhow!("no resource {:?} with devices (serving: {})", args.resource, names.join(", ")))?;
    let snapshot = handle.devices.borrow().clone();
    let unknown: Vec<&String> = args.ids.iter().filter(|id| snapshot.device(id).is_none()).collect();
    anyhow::ensure!(unknown.is_empty(), "{}: unknown device IDs {unknown:?}", handle.name);
    // Through the port's node gate, as `run` answers; then the default strategy (device specs),
    // as `run` answers without an `allocate` setting.
    let admitted = handle.port.allocate(&snapshot, &args.ids).await.map_err(|e| {
        anyhow::anyhow!("{}: {e}", handle.name).context(crate::observe::Backend(handle.backend.clone()))
    })?;
    let answer = crate::kubelet::Delivery::default().answer(&snapshot, &args.ids, &admitted);
    drop(loaded);
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
pub async fn cdi_generate(args: CdiGenerateArgs) -> anyhow::Result<(Vec<PathBuf>, Vec<Failure>)> {
    let (loaded, mut errors) = load_once(args.source).await?;
    let specs = crate::cdi::SpecDir::open(&args.out)?;
    let mut written = Vec::new();
    for r in loaded.snapshot() {
        match specs.sync(&r) {
            Ok(true) => written.extend(crate::cdi::Kind::for_resource(&r.name).map(|k| args.out.join(k.file_name()))),
            Ok(false) => {}
            Err(e) => errors.push(Failure { backend: None, message: format!("{}: {e}", r.name) }),
        }
    }
    Ok((written, errors))
}

/// `devplug discover`: load, discover once, print. Errors in one backend do not stop the others.
pub async fn discover(args: DiscoverArgs) -> anyhow::Result<serde_json::Value> {
    let (loaded, mut errors) = load_once(args.source).await?;
    // A backend that loaded but whose discover failed (or was refused) is an error too: a
    // vendor's CI must see it.
    for b in loaded.summaries() {
        if let Some(e) = &b.last_error {
            errors.push(Failure::of(&b.name, format!("{}: discover: {e}", b.name)));
        }
    }
    // A contest is one failure per pair of resources; one the config settled is not a failure.
    for c in loaded.contests().iter().filter(|c| !c.decided()) {
        errors.push(Failure { backend: None, message: c.to_string() });
    }
    let resources: Vec<serde_json::Value> = loaded
        .snapshot()
        .iter()
        .map(|r| {
            let mut out = serde_json::json!({
                "name": r.name,
                "devices": r.devices.iter().map(|d| {
                    let mut v = serde_json::json!({
                        "id": d.id,
                        "health": d.health.as_str(),
                        "numa_nodes": d.numa_nodes,
                        "attributes": d.attributes.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(),
                        "edits": d.edits,
                    });
                    // What a WIT 0.3.0 backend describes for DRA (resources the config serves
                    // through it; `devplug dra slices` shows the slices themselves).
                    if let Some(x) = r.described.get(&d.id) {
                        v["dra"] = serde_json::json!(x);
                    }
                    // What the host's gates made of the attributes it derives from.
                    if !d.vetted.is_empty() {
                        v["vetted"] = serde_json::json!(d.vetted);
                    }
                    v
                }).collect::<Vec<_>>(),
                "common_edits": r.common_edits,
            });
            if !r.counter_sets.is_empty() {
                out["counter_sets"] = serde_json::json!(r.counter_sets);
            }
            out
        })
        .collect();
    // Every access a backend was refused, with the grant that would allow it: a refused read or
    // a listing's hidden entry is why a device goes missing or Unhealthy.
    let refused: Vec<serde_json::Value> = loaded
        .summaries()
        .iter()
        .flat_map(|b| {
            b.denied
                .iter()
                .map(|d| {
                    serde_json::json!({ "backend": b.name, "call": d.call, "path": d.path, "grant": d.grant, "present": d.present })
                })
        })
        .collect();
    Ok(serde_json::json!({
        "backends": loaded.summaries(),
        "resources": resources,
        "errors": errors.iter().map(|f| f.message.as_str()).collect::<Vec<_>>(),
        "failures": errors.iter().map(|f| serde_json::json!({ "backend": f.backend, "error": f.message })).collect::<Vec<_>>(),
        "refused": refused,
        "contests": loaded.contests(),
    }))
}

/// `discover`'s refusals grouped by the grant line that allows them, in first-seen order: ten
/// numbered directories one wildcard allows are one piece of advice, not ten.
pub fn refusals_by_grant(refused: &[serde_json::Value]) -> Vec<(String, String, Vec<String>)> {
    let mut groups: Vec<(String, String, Vec<String>)> = Vec::new();
    for r in refused {
        let s = |k: &str| r[k].as_str().unwrap_or_default().to_owned();
        let (backend, grant) = (s("backend"), s("grant"));
        let access = format!("{} {}", s("call"), s("path"));
        match groups.iter_mut().find(|(b, g, _)| *b == backend && *g == grant) {
            Some((_, _, list)) => list.push(access),
            None => groups.push((backend, grant, vec![access])),
        }
    }
    groups
}

/// `devplug dra slices`: the DeviceClasses and ResourceSlices this node would publish, one
/// List, built by the code `run` publishes with (one pool per driver, named after the node)
/// and checked with the API server's rules. Load errors and a pool that breaks a rule fail the
/// command, naming backend, device and field.
pub async fn dra_slices(args: SlicesArgs) -> anyhow::Result<serde_json::Value> {
    let cfg = args.source.load_config()?;
    let configured = cfg.dra_resources();
    let view = if !args.resources.is_empty() {
        DraView::Only(args.resources.clone())
    } else if !configured.is_empty() {
        DraView::Only(configured)
    } else {
        crate::observe::say(
            tracing::Level::INFO,
            "the config serves no resource through DRA (api = \"dra\"): showing every resource as DRA would publish it",
        );
        DraView::All
    };
    let wanted = match &view {
        DraView::Only(names) => Some(names.clone()),
        _ => None,
    };
    let node = crate::dra::node::node_name(args.node_name.as_deref())?;
    let sysfs = args.source.roots(&cfg).sys;
    let (loaded, errors, ready) = load_and_poll_as(args.source, view).await?;
    anyhow::ensure!(errors.is_empty(), "{}", messages(&errors));
    let mut by_driver: std::collections::BTreeMap<String, (String, Vec<crate::model::Resource>)> = Default::default();
    let mut classes = Vec::new();
    for r in ready.iter().filter(|r| wanted.as_ref().is_none_or(|w| w.contains(&r.name))) {
        let driver = cfg.dra_driver(&r.backend);
        classes.push(serde_json::to_value(crate::dra::publish::classes::device_class(&r.name, &driver))?);
        let resource = r.devices.borrow().as_ref().clone();
        by_driver.entry(driver).or_insert_with(|| (r.backend.clone(), Vec::new())).1.push(resource);
    }
    if let Some(w) = &wanted {
        let missing: Vec<&String> = w.iter().filter(|n| !ready.iter().any(|r| &r.name == *n)).collect();
        anyhow::ensure!(
            missing.is_empty(),
            "no backend serves {} with devices on this machine (serving: {})",
            missing.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", "),
            ready.iter().map(|r| r.name.as_str()).collect::<Vec<_>>().join(", ")
        );
    }
    let mut items = classes;
    for (driver, (backend, resources)) in by_driver {
        let id = crate::dra::pool_id::PoolId::new(&driver, &node);
        let pool = crate::dra::publish::pool_on(Some(&sysfs), &backend, &id, &resources)
            .map_err(|e| anyhow::anyhow!("driver {driver}: nothing of its pool would be published: {e}"))?;
        // As its first write would publish it.
        for slice in pool.at(1) {
            items.push(serde_json::to_value(slice)?);
        }
    }
    drop(loaded);
    Ok(crate::dra::publish::classes::list(items))
}

/// `devplug dra deviceclasses`: the backends are loaded (as `discover` does) to learn which one
/// serves each resource the config puts on DRA, and so its driver. A resource configured for DRA
/// that no backend serves here is an error naming it: its class would select nothing.
pub async fn device_classes(args: DeviceClassesArgs) -> anyhow::Result<serde_json::Value> {
    let cfg = match &args.source.config {
        Some(p) => Config::from_file(p)?,
        None => Config::default(),
    };
    let wanted = cfg.dra_resources();
    anyhow::ensure!(
        !wanted.is_empty(),
        "the config serves no resource through DRA: add api = \"dra\" to a [resources.\"NAME\"] table"
    );
    let (loaded, errors, ready) = load_and_poll(args.source).await?;
    for e in &errors {
        tracing::warn!("{e}");
    }
    // Classes are cluster-wide and follow from the config: a resource whose devices this
    // machine lacks still has its class, from the backend that declares it.
    let summaries = loaded.summaries();
    let mut classes = Vec::new();
    for name in &wanted {
        let backend = ready.iter().find(|r| &r.name == name).map(|r| r.backend.clone()).or_else(|| {
            summaries.iter().find(|b| b.loaded && b.resources.iter().any(|r| r == name)).map(|b| b.name.clone())
        });
        let Some(backend) = backend else {
            anyhow::bail!(
                "resource {name} is configured api = \"dra\", but no loaded backend declares it (see `devplug discover`)"
            );
        };
        classes
            .push(serde_json::to_value(crate::dra::publish::classes::device_class(name, &cfg.dra_driver(&backend)))?);
        let (now, before) =
            (crate::dra::publish::classes::class_name(name), crate::dra::publish::classes::class_name_before_0_3(name));
        if now != before {
            tracing::warn!(
                "{name}: its DeviceClass is now {now} (devplug 0.2 named it {before}, which can be a vendor driver's); \
                 after applying, delete the old one if devplug made it: \
                 kubectl delete deviceclass -l app.kubernetes.io/managed-by=devplug --field-selector metadata.name={before}"
            );
        }
    }
    Ok(crate::dra::publish::classes::list(classes))
}
