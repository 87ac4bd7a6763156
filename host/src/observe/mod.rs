//! Observability: log setup, metrics, and the HTTP endpoint with `/healthz`, `/readyz`,
//! `/metrics` and `/status` (its document typed in `status.rs`).

mod http;
mod metrics;
pub mod status;

pub use http::{Heartbeat, Probes, STALLED_AFTER, Standby, serve, serve_status};
pub use metrics::Metrics;

/// Log output format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// The format [`init_logging`] chose, for [`say`].
static FORMAT: std::sync::OnceLock<LogFormat> = std::sync::OnceLock::new();

/// A one-shot command's message for the person or the log collector on stderr, in the log
/// format: `devplug: TEXT` in text mode, one JSON object per line in JSON mode, so a collector
/// reading `--log-format json` never meets a line it cannot parse.
pub fn say(level: tracing::Level, text: &str) {
    say_about(level, None, text)
}

/// [`say`] for a message that carries a backend's words: in JSON mode the backend is a field
/// of its own (`"backend"`), so a collector can tell whose words they are without parsing text.
pub fn say_about(level: tracing::Level, backend: Option<&str>, text: &str) {
    let text = crate::gate::clip_to(text, 4096);
    match FORMAT.get().copied().unwrap_or_default() {
        LogFormat::Text => eprintln!("devplug: {text}"),
        LogFormat::Json => {
            let mut line = serde_json::json!({
                "timestamp": humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string(),
                "level": level.as_str(),
                "message": text,
                "target": "devplug",
            });
            if let Some(b) = backend {
                line["backend"] = serde_json::json!(crate::gate::clip_to(b, 64));
            }
            eprintln!("{line}");
        }
    }
}

/// Context on an error a backend's words caused (`err.context(Backend(name))`): the one-shot
/// commands' last record names the backend in a field ([`say_about`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Backend(pub String);

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "backend {}", self.0)
    }
}

/// Install the global `tracing` subscriber. `RUST_LOG` filters (default `info`).
pub fn init_logging(format: LogFormat) {
    let _ = FORMAT.set(format);
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
