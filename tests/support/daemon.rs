//! Running devplug's daemon in-process (`devplug::daemon::run`) against a kubelet stand-in, with the
//! chaos test backend in a backends dir.

use std::path::{Path, PathBuf};
use std::time::Duration;

use devplug::backends::{BackendSettings, DefaultGrant};
use devplug::config::Config;
use devplug::kubelet::RegistrationMode;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::fixtures::Machine;

pub const WIDGET: &str = "test.devplug.io/widget";

/// The chaos component and its manifest.
pub fn chaos_paths() -> (PathBuf, PathBuf) {
    let (wasm, manifest) = devplug::backends::embedded::test_program("chaos").expect("chaos test program");
    (PathBuf::from(wasm), PathBuf::from(manifest))
}

/// A backends dir holding `chaos.wasm` + `chaos.toml`.
pub fn chaos_dir() -> tempfile::TempDir {
    let d = tempfile::tempdir().expect("tempdir");
    let (wasm, manifest) = chaos_paths();
    std::fs::copy(wasm, d.path().join("chaos.wasm")).expect("copy chaos");
    std::fs::copy(manifest, d.path().join("chaos.toml")).expect("copy manifest");
    d
}

/// The chaos component with a custom section naming `build`: a distinct file (new digest) that
/// behaves the same, as a rebuilt backend would.
pub fn chaos_build(n: u32) -> Vec<u8> {
    let mut bytes = std::fs::read(chaos_paths().0).unwrap();
    let name = b"devplug-test-build";
    let payload = n.to_le_bytes();
    let body_len = 1 + name.len() + payload.len();
    assert!(body_len < 128 && name.len() < 128, "one-byte LEB128 lengths");
    bytes.extend_from_slice(&[0x00, body_len as u8, name.len() as u8]);
    bytes.extend_from_slice(name);
    bytes.extend_from_slice(&payload);
    bytes
}

/// The chaos manifest with a default config: version `1.0.k` with `4 + k` devices.
pub fn chaos_manifest(k: u32, mode: &str) -> String {
    let orig = std::fs::read_to_string(chaos_paths().1).unwrap();
    format!("config = \"mode={mode} devices={} version=1.0.{k}\"\n{orig}", 4 + k)
}

/// A daemon config for tests: socket registration, fast polls, only the given backends.
pub fn config(kubelet_dir: &Path, machine: &Machine, backends: &Path, chaos_config: &str) -> Config {
    let mut c = Config {
        kubelet_dir: kubelet_dir.to_owned(),
        registration: RegistrationMode::KubeletSocket,
        backends_dir: Some(backends.to_owned()),
        embedded: false,
        sysfs_root: machine.sys(),
        dev_root: machine.dev(),
        dev_fixtures: true,
        metrics_addr: "127.0.0.1:0".parse().expect("addr"),
        poll_interval: Duration::from_millis(100),
        default_grant: DefaultGrant::Requested,
        write_cdi: false,
        ..Config::default()
    };
    c.backends.insert("chaos".into(), BackendSettings { config: chaos_config.into(), ..Default::default() });
    c
}

pub struct Daemon {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<anyhow::Result<()>>,
}

impl Daemon {
    pub fn start(cfg: Config) -> Self {
        let (tx, rx) = oneshot::channel();
        let task = tokio::spawn(devplug::daemon::run(cfg, async move {
            let _ = rx.await;
        }));
        Daemon { stop: Some(tx), task }
    }

    pub async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        tokio::time::timeout(Duration::from_secs(10), &mut self.task).await??
    }
}

/// A test that panics drops its daemon without `stop`: abort it, so it writes nothing (a CDI
/// spec in a shared directory, say) after the test's own cleanup guards have run.
impl Drop for Daemon {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Three chaos backends `w1..w3` in `dir`, serving `test.devplug.io/w1..w3` with 2 devices
/// each; returns the resource names.
pub fn three_resources(dir: &Path) -> Vec<String> {
    let (wasm, manifest) = chaos_paths();
    let requests = std::fs::read_to_string(manifest).expect("manifest").replace("name = \"chaos\"\n", "");
    let names: Vec<String> = (1..=3).map(|i| format!("test.devplug.io/w{i}")).collect();
    for (i, r) in names.iter().enumerate() {
        std::fs::copy(&wasm, dir.join(format!("w{}.wasm", i + 1))).expect("copy chaos");
        std::fs::write(
            dir.join(format!("w{}.toml", i + 1)),
            format!("config = \"resource={r} devices=2\"\n{requests}"),
        )
        .expect("write manifest");
    }
    names
}
