//! A backend's log lines: its rate budget (its `log` calls, stdout, stderr and the host's lines
//! about it together) and its stdout/stderr, logged line by line under its name, the last stderr
//! lines kept for a trap's message ([`LastWords`]), with the exception a JavaScript or Python
//! runtime printed before it aborted, and where it was raised, put first.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

use crate::sync::Locked;

/// Lines a backend may log in a burst, and per second after that (its `log` calls, stdout,
/// stderr and the host's refusal lines about it together).
const LOG_BURST: f64 = 200.0;
const LOG_PER_SECOND: f64 = 20.0;

/// A per-backend token bucket for log lines. What it drops is counted, and said once the
/// backend is below its rate again, so an operator learns that lines are missing.
pub struct LogBudget {
    bucket: Mutex<(f64, Instant, u64)>,
    pub dropped: AtomicU64,
}

impl Default for LogBudget {
    fn default() -> Self {
        LogBudget { bucket: Mutex::new((LOG_BURST, Instant::now(), 0)), dropped: AtomicU64::new(0) }
    }
}

impl LogBudget {
    /// Whether one more line of `backend` may be logged now.
    pub(crate) fn admit(&self, backend: &str) -> bool {
        let mut b = self.bucket.locked();
        let (tokens, last, unreported) = &mut *b;
        let now = Instant::now();
        *tokens = (*tokens + now.duration_since(*last).as_secs_f64() * LOG_PER_SECOND).min(LOG_BURST);
        *last = now;
        if *tokens < 1.0 {
            *unreported += 1;
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        *tokens -= 1.0;
        if *unreported > 0 {
            tracing::warn!(
                backend,
                dropped = *unreported,
                "log lines of this backend were dropped: it logs faster than its rate limit"
            );
            *unreported = 0;
        }
        true
    }
}

/// Guest stdout/stderr, logged line by line with the backend's name.
pub(super) struct GuestOutput {
    pub backend: Arc<str>,
    pub log: Arc<LogBudget>,
    pub stream: &'static str,
    pub tail: Option<Arc<Mutex<LastWords>>>,
}

impl IsTerminal for GuestOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for GuestOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.logger())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.logger())
    }
}

impl GuestOutput {
    fn logger(&self) -> LineLogger {
        LineLogger {
            backend: self.backend.clone(),
            log: self.log.clone(),
            stream: self.stream,
            tail: self.tail.clone(),
            buf: Vec::new(),
        }
    }
}

/// Stderr lines kept for a trap's message.
const LAST_WORDS: usize = 3;

/// What a guest said on stderr in the current call, for the message of a trap that ends it: its
/// last lines, and an uncaught exception as the language runtimes print one before aborting —
/// componentize-js (StarlingMonkey) prints `SyntaxError: …`, then `Stack:` and frames
/// `function@file.js:line:col`, then its abort noise; componentize-py prints a traceback whose
/// `File "app.py", line 12, in discover` lines come before the exception's own line.
#[derive(Default)]
pub struct LastWords {
    lines: VecDeque<String>,
    /// The last exception line (`TypeError: …`, `ValueError: …`).
    thrown: Option<String>,
    /// Where it was raised: the JS stack's first frame, or the traceback's last `File` line.
    at: Option<String>,
    /// The previous line was JS's `Stack:`: the next one is the frame that threw.
    stack_next: bool,
}

impl LastWords {
    fn push(&mut self, line: &str) {
        let line = line.trim();
        if self.stack_next {
            self.stack_next = false;
            if line.contains('@') {
                self.at = Some(line.to_owned());
            }
        }
        if line == "Stack:" {
            self.stack_next = true;
        } else if line.starts_with("File \"") && line.contains("\", line ") {
            self.at = Some(line.to_owned());
        } else if is_exception(line) {
            self.thrown = Some(line.to_owned());
        } else if let Some(inner) = received(line).filter(|inner| is_exception(inner)) {
            self.thrown = Some(inner.to_owned());
        }
        if self.lines.len() == LAST_WORDS {
            self.lines.pop_front();
        }
        self.lines.push_back(line.to_owned());
    }

    /// The exception and where it was raised, when the guest printed one.
    pub fn exception(&self) -> Option<String> {
        let thrown = self.thrown.as_ref()?;
        Some(match &self.at {
            Some(at) => format!("{thrown} (at {at})"),
            None => thrown.clone(),
        })
    }

    /// The last lines, joined.
    pub fn joined(&self) -> String {
        self.lines.iter().cloned().collect::<Vec<_>>().join(" | ")
    }

    pub fn clear(&mut self) {
        *self = LastWords::default();
    }
}

/// What componentize-js's bindings say they were handed where a result's error variant was
/// due: a backend that throws a plain `Error` (or lets `JSON.parse` throw) from an export
/// returning `result<_, backend-error>` is reported as ``invalid variant tag value `undefined`
/// (received `SyntaxError: JSON.parse: …`) specified for `BackendError` ``: the exception is
/// the text between `` (received ` `` and the next `` `) ``.
fn received(line: &str) -> Option<&str> {
    let (_, rest) = line.split_once("(received `")?;
    Some(rest.split_once("`)").map_or(rest, |(inner, _)| inner).trim())
}

/// Whether `line` is how a JavaScript or Python runtime states an uncaught exception: a
/// dotted name ending in `Error`, `Exception`, `Exit` or `Interrupt`, alone or before `: ` (JS
/// may say `Uncaught ` first).
fn is_exception(line: &str) -> bool {
    let line = line.strip_prefix("Uncaught ").unwrap_or(line);
    let name = line.split_once(": ").map_or(line, |(n, _)| n);
    let plain = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.');
    plain && ["Error", "Exception", "Exit", "Interrupt"].iter().any(|k| name.ends_with(k))
}

/// Longest line kept before it is logged anyway.
const MAX_LINE: usize = 1024;

struct LineLogger {
    backend: Arc<str>,
    log: Arc<LogBudget>,
    stream: &'static str,
    tail: Option<Arc<Mutex<LastWords>>>,
    buf: Vec<u8>,
}

impl LineLogger {
    fn push(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if b == b'\n' || self.buf.len() >= MAX_LINE {
                self.emit();
                if b == b'\n' {
                    continue;
                }
            }
            self.buf.push(b);
        }
    }

    fn emit(&mut self) {
        let line = String::from_utf8_lossy(&self.buf);
        if let Some(tail) = &self.tail
            && !line.trim().is_empty()
            && !line.starts_with("note: run with")
        {
            tail.locked().push(&crate::gate::clip_to(line.trim(), 512));
        }
        if self.log.admit(&self.backend) {
            let line = crate::gate::clip_to(&line, MAX_LINE);
            tracing::info!(backend = &*self.backend, stream = self.stream, "{line}");
        }
        self.buf.clear();
    }
}

impl Drop for LineLogger {
    fn drop(&mut self) {
        if !self.buf.is_empty() {
            self.emit();
        }
    }
}

#[async_trait::async_trait]
impl Pollable for LineLogger {
    async fn ready(&mut self) {}
}

impl OutputStream for LineLogger {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.push(&bytes);
        Ok(())
    }
    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }
    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(MAX_LINE)
    }
}

impl tokio::io::AsyncWrite for LineLogger {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        self.get_mut().push(buf);
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a guest writes to stdout or stderr reaches the log one line per record, its control
    /// characters escaped (a `\r` or an escape sequence cannot rewrite the host's line).
    #[test]
    fn guest_output_lines_are_escaped_records() {
        let tail: Arc<Mutex<LastWords>> = Arc::default();
        let out = GuestOutput { backend: "x".into(), log: Arc::default(), stream: "stderr", tail: Some(tail.clone()) };
        let mut logger = out.logger();
        logger.push(b"one\rforged\x1b[2K\nsecond\n");
        assert_eq!(tail.locked().joined(), "one\\rforged\\u{1b}[2K | second");
    }

    /// Issue 52 (3): a JavaScript backend's exception was only in an INFO line above the trap,
    /// whose message ended in generated-code noise; Python's traceback likewise. The exception
    /// and where it was raised are found in what the runtimes print.
    #[test]
    fn a_guest_runtimes_exception_and_its_place_are_found() {
        let words = |text: &str| {
            let mut w = LastWords::default();
            text.lines().for_each(|l| w.push(l));
            w
        };
        let js = words(
            "SyntaxError: JSON.parse: unexpected character at line 1 column 1 of the JSON data\nStack:\n  \
             discover@backend.js:42:17\n  export_backend_0_3_0$discover@initializer.js:1895:17\n\
             Redirecting call to abort() to mozalloc_abort",
        );
        assert_eq!(
            js.exception().as_deref(),
            Some(
                "SyntaxError: JSON.parse: unexpected character at line 1 column 1 of the JSON data (at discover@backend.js:42:17)"
            )
        );
        let py = words(
            "Traceback (most recent call last):\n  File \"/app.py\", line 30, in discover\n    \
             return json.loads(text)\n  File \"/usr/lib/json/__init__.py\", line 346, in loads\n\
             json.decoder.JSONDecodeError: Expecting value: line 1 column 1 (char 0)",
        );
        assert_eq!(
            py.exception().as_deref(),
            Some(
                "json.decoder.JSONDecodeError: Expecting value: line 1 column 1 (char 0) (at File \"/usr/lib/json/__init__.py\", line 346, in loads)"
            )
        );
        // Issue 62: what a real componentize-js 0.23 component prints when its export throws
        // where a `backend-error` was due (the exception inside the bindings' complaint).
        let bindings = words(
            "invalid variant tag value `undefined` (received `SyntaxError: JSON.parse: unexpected character at line 1 column 1 of the JSON data`) specified for `BackendError`\n\
             Stack:\n  export_backend_0_3_0$discover@initializer.js:1895:17\nRedirecting call to abort() to mozalloc_abort",
        );
        assert_eq!(
            bindings.exception().as_deref(),
            Some(
                "SyntaxError: JSON.parse: unexpected character at line 1 column 1 of the JSON data (at export_backend_0_3_0$discover@initializer.js:1895:17)"
            )
        );
        assert_eq!(
            words("invalid variant tag value `undefined` (received `42`) specified for `BackendError`").exception(),
            None
        );
        assert_eq!(words("thread 'main' panicked at src/lib.rs:3:5:\nboom").exception(), None);
        for not in ["Error handling is hard", "ERROR: x", "see: Error", "my error: x", "a.b-c.Error: x"] {
            assert!(!is_exception(not), "{not}");
        }
        for yes in ["TypeError: x is undefined", "Uncaught RangeError: too big", "KeyboardInterrupt", "SystemExit: 1"] {
            assert!(is_exception(yes), "{yes}");
        }
    }

    #[test]
    fn the_log_budget_admits_a_burst_then_drops_and_counts() {
        let b = LogBudget::default();
        let admitted = (0..10_000).filter(|_| b.admit("x")).count();
        assert!((200..=260).contains(&admitted), "{admitted}");
        assert!(b.dropped.load(Ordering::Relaxed) >= 9_000);
    }
}
