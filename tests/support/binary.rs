//! Running the real `devplug` binary in tests: its stderr is collected so tests can wait for log
//! lines, and it gets SIGTERM (then SIGKILL) when the test is done with it.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The `devplug` binary under test.
pub const BIN: super::paths::Bin = super::paths::Bin;

pub struct Devplug {
    child: Child,
    log: Arc<(Mutex<String>, Condvar)>,
}

impl Devplug {
    pub fn spawn<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Self {
        Self::spawn_via(&[], args)
    }

    /// `devplug ARGS` started through `wrapper` (e.g. `unshare --net --`), which must exec it in
    /// its own process (so [`Devplug::pid`] is devplug's).
    pub fn spawn_via<S: AsRef<std::ffi::OsStr>>(wrapper: &[&str], args: &[S]) -> Self {
        let mut cmd = match wrapper.split_first() {
            Some((program, rest)) => {
                let mut c = Command::new(program);
                c.args(rest).arg(BIN);
                c
            }
            None => Command::new(BIN),
        };
        let mut child = cmd
            .args(args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn devplug");
        let log = Arc::new((Mutex::new(String::new()), Condvar::new()));
        let stderr = child.stderr.take().expect("stderr");
        let l = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let (m, cv) = &*l;
                if let Ok(mut s) = m.lock() {
                    s.push_str(&line);
                    s.push('\n');
                }
                cv.notify_all();
            }
        });
        Devplug { child, log }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn log(&self) -> String {
        self.log.0.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Block until the log contains `needle` (bounded by `timeout`).
    /// The address `/healthz`, `/readyz` and `/metrics` are served on (from its log line).
    pub fn metrics_addr(&self) -> String {
        self.wait_log("serving /healthz", Duration::from_secs(30)).expect("the HTTP endpoints came up");
        let log = self.log();
        let line = log.lines().find(|l| l.contains("serving /healthz")).expect("the log line");
        line.split("addr=").nth(1).and_then(|a| a.split_whitespace().next()).expect("an address").to_owned()
    }

    pub fn wait_log(&self, needle: &str, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        let (m, cv) = &*self.log;
        let mut s = m.lock().map_err(|_| anyhow::anyhow!("log lock"))?;
        while !s.contains(needle) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                anyhow::bail!("timed out waiting for {needle:?} in devplug's log:\n{s}");
            }
            s = cv.wait_timeout(s, left).map_err(|_| anyhow::anyhow!("log lock"))?.0;
        }
        Ok(())
    }

    /// Wait (bounded) for the process to end by itself or by someone else's signal.
    pub fn wait_exit(&mut self, timeout: Duration) -> anyhow::Result<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.child.try_wait()? {
                return Ok(st);
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                anyhow::bail!("devplug still running after {timeout:?}; log:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// SIGKILL (no chance to clean up) and reap.
    pub fn kill(&mut self) -> std::io::Result<ExitStatus> {
        self.child.kill()?;
        self.child.wait()
    }

    /// SIGTERM, then wait (bounded) for the exit status.
    pub fn terminate(&mut self, timeout: Duration) -> anyhow::Result<ExitStatus> {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), nix::sys::signal::Signal::SIGTERM)?;
        self.wait_exit(timeout).map_err(|e| anyhow::anyhow!("after SIGTERM: {e}"))
    }
}

impl Drop for Devplug {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `devplug run` against a kubelet dir (socket registration), only the backends in `backends`
/// (granted what they request), a fixture machine, the machine's own CDI dir (`M/cdi`: never the
/// host's `/var/run/cdi`, which other tests and the machine's runtime share) and a free metrics
/// port; add the rest.
pub fn run_args(
    kubelet_dir: &std::path::Path,
    backends: &std::path::Path,
    machine: &super::fixtures::Machine,
) -> Vec<String> {
    let mut args = machine_run_args(kubelet_dir, machine.root(), &machine.root().join("cdi"));
    let backends = backends.display().to_string();
    args.extend(["--no-embedded", "--backends-dir", &backends, "--default-grant", "requested"].map(str::to_owned));
    args
}

/// `devplug run` with its embedded backends on machine tree `machine` (`M/sys`, `M/dev`,
/// `M/proc`, fixture nodes), serving `kubelet_dir`, its CDI specs in `kubelet_dir/cdi`; add the
/// rest.
pub fn embedded_run_args(kubelet_dir: &std::path::Path, machine: &std::path::Path) -> Vec<String> {
    machine_run_args(kubelet_dir, machine, &kubelet_dir.join("cdi"))
}

/// `devplug run` by socket registration into `kubelet_dir`, on machine tree `machine`, CDI specs
/// in `cdi`, a free metrics port.
fn machine_run_args(kubelet_dir: &std::path::Path, machine: &std::path::Path, cdi: &std::path::Path) -> Vec<String> {
    let s = |p: &std::path::Path| p.display().to_string();
    [
        "run",
        "--kubelet-dir",
        &s(kubelet_dir),
        "--registration",
        "kubelet-socket",
        "--sysfs-root",
        &s(&machine.join("sys")),
        "--dev-root",
        &s(&machine.join("dev")),
        "--proc-root",
        &s(&machine.join("proc")),
        "--dev-fixtures",
        "--cdi-dir",
        &s(cdi),
        "--metrics-addr",
        "127.0.0.1:0",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// `devplug <command> --sysfs-root M/sys --dev-root M/dev --proc-root M/proc --cache-dir CACHE <extra>` on a machine
/// tree `m`, which must succeed; returns stdout.
pub fn on_machine(command: &[&str], m: &std::path::Path, cache: &std::path::Path, extra: &[&str]) -> String {
    let (code, out, err) = run_on_machine(command, m, cache, extra);
    assert_eq!(code, 0, "devplug {}: {err}", command.join(" "));
    out
}

/// [`on_machine`] whatever the exit code: (exit code, stdout, stderr).
pub fn run_on_machine(
    command: &[&str],
    m: &std::path::Path,
    cache: &std::path::Path,
    extra: &[&str],
) -> (i32, String, String) {
    let s = |p: std::path::PathBuf| p.display().to_string();
    let mut args: Vec<String> = command.iter().map(|a| (*a).to_owned()).collect();
    args.extend([
        "--sysfs-root".into(),
        s(m.join("sys")),
        "--dev-root".into(),
        s(m.join("dev")),
        "--proc-root".into(),
        s(m.join("proc")),
        "--dev-fixtures".into(),
    ]);
    args.extend(["--cache-dir".into(), s(cache.to_owned())]);
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    run(&refs)
}

/// `devplug try` serving a copy of the chaos backend on machine `m`, its backends directory
/// given with `flag` (`--backends-dir`, or the old `--backends`), plus `extra` arguments.
pub fn try_chaos(m: &super::fixtures::Machine, flag: &str, extra: &[&str]) -> (tempfile::TempDir, Interactive) {
    try_chaos_with(m, flag, None, extra)
}

/// [`try_chaos`] with the chaos backend's `config` (`devices=2048`) in its manifest.
pub fn try_chaos_with(
    m: &super::fixtures::Machine,
    flag: &str,
    config: Option<&str>,
    extra: &[&str],
) -> (tempfile::TempDir, Interactive) {
    let (wasm, manifest) = super::daemon::chaos_paths();
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::copy(&wasm, dir.path().join("chaos.wasm")).expect("copy chaos.wasm");
    let text = std::fs::read_to_string(&manifest).expect("read chaos.toml");
    let text = match config {
        Some(c) => format!("config = {c:?}\n{text}"),
        None => text,
    };
    std::fs::write(dir.path().join("chaos.toml"), text).expect("write chaos.toml");
    let (sys, dev) = (m.sys().display().to_string(), m.dev().display().to_string());
    let bdir = dir.path().display().to_string();
    let mut args = vec![
        "try",
        "--no-embedded",
        flag,
        &bdir,
        "--default-grant",
        "requested",
        "--sysfs-root",
        &sys,
        "--dev-root",
        &dev,
    ];
    args.push("--dev-fixtures");
    args.extend(extra);
    let t = Interactive::spawn(&args);
    (dir, t)
}

/// Run `devplug ARGS` to completion; (exit code, stdout, stderr).
pub fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN).args(args).env("RUST_LOG", "warn").output().expect("run devplug");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `devplug discover --backend WASM` on fixture machine `m` (fixture nodes on, compile cache
/// `cache`), JSON out: (exit code, stdout, stderr).
pub fn discover_backend(
    wasm: &std::path::Path,
    m: &super::fixtures::Machine,
    cache: &std::path::Path,
) -> (i32, String, String) {
    let s = |p: &std::path::Path| p.display().to_string();
    run(&[
        "discover",
        "--backend",
        &s(wasm),
        "--sysfs-root",
        &s(&m.sys()),
        "--dev-root",
        &s(&m.dev()),
        "--proc-root",
        &s(&m.root().join("proc")),
        "--dev-fixtures",
        "--cache-dir",
        &s(cache),
        "--format",
        "json",
    ])
}

/// `devplug ARGS` driven on stdin as a person drives `devplug try`: lines are sent, stdout is
/// read line by line until an expected line comes (bounded).
pub struct Interactive {
    child: Child,
    stdin: std::process::ChildStdin,
    lines: std::sync::mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Interactive {
    pub fn spawn(args: &[&str]) -> Interactive {
        let mut child = Command::new(BIN)
            .args(args)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn devplug");
        let (tx, lines) = std::sync::mpsc::channel::<String>();
        let out = child.stdout.take().expect("stdout");
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take().expect("stdin");
        Interactive { child, stdin, lines, seen: Vec::new() }
    }

    /// The process's ID.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Send one line.
    pub fn send(&mut self, line: &str) {
        use std::io::Write;
        writeln!(self.stdin, "{line}").expect("write to devplug's stdin");
    }

    /// The lines printed from now until one containing `what` (that one included).
    pub fn wait_for(&mut self, what: &str) -> Vec<String> {
        let from = self.seen.len();
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|_| panic!("no {what:?} in the output:\n{}", self.seen.join("\n")));
            self.seen.push(line.clone());
            if line.contains(what) {
                return self.seen[from..].to_vec();
            }
        }
    }

    /// Send `quit` and wait (bounded) for a successful exit.
    pub fn quit(mut self) {
        self.send("quit");
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(st) = self.child.try_wait().expect("try_wait") {
                break st;
            }
            assert!(Instant::now() < deadline, "devplug did not end after quit");
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(status.success(), "{status:?}");
    }
}

impl Drop for Interactive {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
