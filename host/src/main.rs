//! The `devplug` binary.

use clap::Parser;
use devplug::cli::{
    self, CdiCommand, CdiGenerateArgs, Cli, Command, DiscoverArgs, DraCommand, Format, InspectArgs, NewBackendArgs,
    NewCommand, PackArgs, StatusArgs,
};
use devplug::observe;

/// `devplug try` (the `try` room: `try` is a keyword, so the module has another name).
#[cfg(feature = "try")]
#[path = "try/mod.rs"]
mod try_node;

fn main() -> std::process::ExitCode {
    // First: a compile worker is this executable started by itself, and does nothing else.
    if let Some(worker_exit) = devplug::runtime::compile_worker::serve_or_register() {
        return worker_exit;
    }
    devplug::daemon::tune_allocator();
    let cli = Cli::parse();
    observe::init_logging(cli.log_format);
    if std::env::args().any(|a| a == "--backends" || a.starts_with("--backends=")) {
        tracing::warn!(
            "--backends is now spelled --backends-dir (as the config's backends_dir); the old spelling still works"
        );
    }
    if !matches!(cli.command, Command::Run(_) | Command::Try(_)) {
        // A one-shot command whose reader went away (`devplug discover | head`) ends quietly,
        // as Unix tools do, instead of panicking in `println!`. The daemon, and `try` which runs
        // it, keep Rust's default (SIGPIPE ignored): nothing they write may kill them.
        // SAFETY: SIG_DFL installs no handler code, so nothing can run in signal context.
        let _ = unsafe {
            nix::sys::signal::signal(nix::sys::signal::Signal::SIGPIPE, nix::sys::signal::SigHandler::SigDfl)
        };
    }
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("devplug: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let outcome = rt.block_on(dispatch(cli.command));
    // A backend call cut off at shutdown may still sit on a blocking thread until its own
    // deadline: exit now rather than wait for it.
    rt.shutdown_timeout(std::time::Duration::from_millis(100));
    match outcome {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            let backend = e.downcast_ref::<observe::Backend>().map(|b| b.0.clone());
            observe::say_about(tracing::Level::ERROR, backend.as_deref(), &format!("{e:#}"));
            std::process::ExitCode::FAILURE
        }
    }
}

/// Each command: run it, print its answer, and fail (exit non-zero) when it did not do all of it.
async fn dispatch(cmd: Command) -> anyhow::Result<()> {
    match cmd {
        Command::Run(args) => {
            anyhow::ensure!(!args.kubelet_only, "--kubelet-only is for `devplug try`: `run` is the devplug itself");
            devplug::daemon::run(args.config()?, shutdown_signal()).await
        }
        #[cfg(feature = "try")]
        Command::Try(args) => try_node::run(&args, shutdown_signal()).await,
        #[cfg(not(feature = "try"))]
        Command::Try(_) => anyhow::bail!(
            "this devplug is the node build, without `try` (it links no kubelet, API-server or scheduler stand-in); \
             run `try` from the vendor build: `cargo install --path host` (default features) or `cargo run -- try`"
        ),
        Command::Config(_) => {
            print!("{}", devplug::config::REFERENCE);
            Ok(())
        }
        Command::Discover(args) => discover(args).await,
        Command::Cdi(CdiCommand::Generate(args)) => cdi_generate(args).await,
        Command::Dra(DraCommand::Deviceclasses(args)) => print_json(&cli::device_classes(args).await?),
        Command::Dra(DraCommand::Slices(args)) => print_json(&cli::dra_slices(args).await?),
        Command::Dra(DraCommand::Release(args)) => {
            let marker =
                devplug::dra::plugin::claims::request_release(&args.dra_plugins_dir.join(&args.driver), &args.uid)?;
            println!(
                "release of claim {} asked ({}); if the claim is stuck (its backend's unprepare failed), devplug drops it at kubelet's next unprepare; a claim that is not stuck is unprepared by its backend and the request is ignored (devplug logs a WARN)",
                args.uid,
                marker.display()
            );
            Ok(())
        }
        Command::Pack(args) => pack(&args),
        Command::Push(args) => print_json(&cli::push(args).await?),
        Command::Pull(args) => print_json(&cli::pull(args).await?),
        Command::Sign(args) => print_json(&cli::sign(args).await?),
        Command::Precompile(args) => print_json(&cli::precompile(args).await?),
        Command::Status(args) => status(&args).await,
        Command::New(NewCommand::Backend(args)) => new_backend(&args),
        Command::Allocate(args) => print_json(&cli::allocate(args).await?),
        Command::Inspect(args) => inspect(&args),
    }
}

fn print_json(v: &impl serde::Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

async fn discover(args: DiscoverArgs) -> anyhow::Result<()> {
    if let Some(name) = args.learn_requests.clone() {
        // Backend calls block (each under its own deadline): off the async threads.
        let text = tokio::task::spawn_blocking(move || cli::learn_requests(&args.source, &name, &args.merge)).await??;
        print!("{text}");
        return Ok(());
    }
    let (format, strict) = (args.format, args.strict);
    let v = cli::discover(args).await?;
    match format {
        Format::Json => print_json(&v)?,
        Format::Table => print!("{}", cli::discover_table(&v)),
    }
    // Say every failure on stderr, whatever the format, and exit non-zero: a vendor's CI runs
    // this to catch a broken backend.
    let errors: Vec<String> =
        v["errors"].as_array().into_iter().flatten().filter_map(|e| e.as_str().map(str::to_owned)).collect();
    for f in v["failures"].as_array().into_iter().flatten() {
        observe::say_about(tracing::Level::ERROR, f["backend"].as_str(), f["error"].as_str().unwrap_or_default());
    }
    // What a manifest asks that no grant can hold: a warning, a failure with --strict.
    let mut warned = 0;
    for b in v["backends"].as_array().into_iter().flatten() {
        for w in b["warnings"].as_array().into_iter().flatten().filter_map(|w| w.as_str()) {
            let name = b["name"].as_str().unwrap_or_default();
            let level = if strict { tracing::Level::ERROR } else { tracing::Level::WARN };
            observe::say_about(level, Some(name), &format!("backend {name}'s manifest: {w}"));
            warned += 1;
        }
    }
    anyhow::ensure!(!strict || warned == 0, "{warned} manifest warning(s), failing as --strict asks");
    // A refused access is why a device goes missing or Unhealthy: said with its grant, and a
    // failure, so a vendor's CI sees it.
    let refused = v["refused"].as_array().cloned().unwrap_or_default();
    // A refused look at a path this machine does not have lost nothing here (the backend
    // would have been told NotFound): said, but not a failure.
    let (refused, absent): (Vec<_>, Vec<_>) =
        refused.into_iter().partition(|r| r["present"] != serde_json::Value::Bool(false));
    for (backend, grant, accesses) in cli::refusals_by_grant(&refused) {
        let more = match accesses.len() {
            1 => String::new(),
            n => format!(" and {} more the same grant allows", n - 1),
        };
        observe::say_about(
            tracing::Level::WARN,
            Some(&backend),
            &format!("backend {backend} was refused {}{more}: to allow it, {grant}", accesses[0]),
        );
    }
    for r in &absent {
        let s = |k: &str| r[k].as_str().unwrap_or_default().to_owned();
        observe::say_about(
            tracing::Level::INFO,
            Some(&s("backend")),
            &format!(
                "backend {} was refused {} {}, which this machine does not have (nothing lost here; where it exists: {})",
                s("backend"),
                s("call"),
                s("path"),
                s("grant")
            ),
        );
    }
    anyhow::ensure!(
        errors.is_empty(),
        "{} backend error(s): a backend failed to load, to discover, or was refused",
        errors.len()
    );
    anyhow::ensure!(
        refused.is_empty(),
        "{} access(es) of the machine refused (above, each with the grant that allows it): grant them, or fix the backend's paths",
        refused.len()
    );
    Ok(())
}

async fn cdi_generate(args: CdiGenerateArgs) -> anyhow::Result<()> {
    let (written, errors) = cli::cdi_generate(args).await?;
    for f in &written {
        println!("{}", f.display());
    }
    for e in &errors {
        observe::say_about(tracing::Level::ERROR, e.backend.as_deref(), &e.message);
    }
    anyhow::ensure!(errors.is_empty(), "some specs were not written (see above)");
    Ok(())
}

fn pack(args: &PackArgs) -> anyhow::Result<()> {
    let contents = devplug::cli::pack::Contents::collect(&args.files)?;
    let layout = devplug::cli::pack::layout(&contents, &args.tag, &args.arch)?;
    match (&args.out, &args.tar) {
        (Some(dir), _) => layout.write_dir(dir)?,
        (None, Some(file)) => layout.write_tar(file)?,
        (None, None) => anyhow::bail!("give --out DIR or --tar FILE"),
    }
    let names: Vec<&str> = contents.files.iter().map(|(n, _)| n.as_str()).collect();
    println!("{} {}", layout.manifest_digest, names.join(" "));
    Ok(())
}

async fn status(args: &StatusArgs) -> anyhow::Result<()> {
    if args.devices {
        let resources = cli::all_devices(&args.addr).await?;
        return match args.format {
            Format::Json => print_json(&serde_json::json!({ "resources": resources })),
            Format::Table => {
                print!("{}", cli::devices_table(&resources));
                Ok(())
            }
        };
    }
    let v = cli::http_json(&args.addr, "/status").await?;
    match args.format {
        Format::Json => print_json(&v),
        Format::Table => {
            let status = serde_json::from_value(v).map_err(|e| {
                anyhow::anyhow!("devplug status: the daemon's /status did not read as a status document ({e}); `--format json` prints it as it came")
            })?;
            print!("{}", cli::status_table(&status));
            Ok(())
        }
    }
}

/// Scaffold a backend and print the next steps from its README's first shell block.
fn new_backend(args: &NewBackendArgs) -> anyhow::Result<()> {
    let dir = args.dir.clone().unwrap_or_else(|| args.name.clone().into());
    devplug::cli::scaffold::new_backend(&args.name, args.lang, &dir)?;
    let readme = std::fs::read_to_string(dir.join("README.md"))?;
    let steps: Vec<String> = readme
        .lines()
        .skip_while(|l| !l.starts_with("```sh"))
        .skip(1)
        .take_while(|l| !l.starts_with("```"))
        .map(|l| format!("  {l}"))
        .collect();
    println!("created {} ({:?}); next:\n", dir.display(), args.lang);
    println!("{}", steps.join("\n"));
    Ok(())
}

fn inspect(args: &InspectArgs) -> anyhow::Result<()> {
    let v = cli::inspect(&args.file, args.manifest.as_deref())?;
    match args.format {
        Format::Json => print_json(&v)?,
        Format::Table => {
            for (k, val) in v.as_object().into_iter().flatten() {
                println!("{k:<12} {val}");
            }
        }
    }
    Ok(())
}

/// SIGTERM (kubelet stopping the pod) or SIGINT. The handlers are installed now, before any
/// socket or spec file exists: a signal during startup must still mean a clean exit.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    async move {
        match (term, int) {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            }
            (Ok(mut term), Err(_)) => {
                term.recv().await;
            }
            (Err(_), Ok(mut int)) => {
                int.recv().await;
            }
            (Err(e), Err(_)) => {
                tracing::error!("cannot watch for SIGTERM/SIGINT ({e}); stop devplug with SIGKILL");
                std::future::pending::<()>().await
            }
        }
    }
}
