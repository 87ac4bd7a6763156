//! What the rollout benches share (a new version of a large backend reaching a node): the same
//! code under a new digest, a process's memory from `/proc`, and busy shells on the cores.

use std::process::{Child, Command, Stdio};

/// `bytes` with a custom section appended: the same code under a new digest (a version the node
/// never saw, nothing cached for it).
pub fn new_version(bytes: &[u8], n: u8) -> Vec<u8> {
    let mut v = bytes.to_vec();
    let name = b"devplug-bench";
    v.extend_from_slice(&[0x00, (1 + name.len() + 1) as u8, name.len() as u8]);
    v.extend_from_slice(name);
    v.push(n);
    v
}

/// Field `key` (`VmRSS:`, `VmHWM:`) of `/proc/PID/status`, in KiB (0 when unreadable).
pub fn kib(pid: i32, key: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Reset `pid`'s peak RSS (VmHWM) to its RSS now.
pub fn reset_peak(pid: i32) -> std::io::Result<()> {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5")
}

/// Busy shells, killed when dropped (also when the bench fails).
pub struct Hogs(Vec<Child>);

impl Drop for Hogs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `n` busy shells.
pub fn hogs(n: usize) -> Hogs {
    let spawn = || Command::new("sh").args(["-c", "while :; do :; done"]).stdout(Stdio::null()).spawn();
    Hogs((0..n).map(|_| spawn().expect("a CPU hog")).collect())
}
