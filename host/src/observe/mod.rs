//! Observability: log setup, metrics, and the HTTP endpoint with `/healthz`, `/readyz`,
//! `/metrics` and `/status`.

mod http;
mod metrics;

pub use http::{Heartbeat, Probes, STALLED_AFTER, serve};
pub use metrics::Metrics;

/// Log output format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Install the global `tracing` subscriber. `RUST_LOG` filters (default `info`).
pub fn init_logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours only for a person at a terminal: log collectors get plain text.
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}
