//! The claims this node has prepared, on disk: a prepare that was answered is never answered
//! differently, across a devplug restart or a crash at any instant (the file is replaced
//! atomically: the old set or the new one, never a torn file).
//!
//! Each claim also records the boot it was prepared in (`/proc/sys/kernel/random/boot_id`):
//! the checkpoint lives under `/var/lib/kubelet` and survives a reboot, the claim's CDI spec in
//! `/var/run/cdi` (tmpfs) does not, and kubelet prepares every claim again after one. A claim
//! from an earlier boot is prepared again rather than answered from the record.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::sync::Locked;

/// A ResourceClaim as kubelet names it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimRef {
    pub namespace: String,
    pub uid: String,
    pub name: String,
}

/// One device of a prepared claim, as kubelet is told about it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedDevice {
    pub request_names: Vec<String>,
    pub pool_name: String,
    pub device_name: String,
    pub cdi_device_ids: Vec<String>,
}

/// The file's format; `version` says which, so a later format can read this one.
#[derive(Default, Serialize, Deserialize)]
struct Saved {
    version: u32,
    /// By claim UID.
    claims: BTreeMap<String, (ClaimRef, Vec<PreparedDevice>)>,
    /// The boot each claim was prepared in, by claim UID (absent in files of devplug 0.2).
    #[serde(default)]
    boots: BTreeMap<String, String>,
}

/// This machine's boot: `/proc/sys/kernel/random/boot_id` (empty where it cannot be read).
pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id").map(|s| s.trim().to_owned()).unwrap_or_default()
}

const FORMAT: u32 = 1;
/// The checkpoint's file name in its directory.
pub const FILE: &str = "dra-claims.json";

/// Prepared claims, kept in memory and in `DIR/dra-claims.json`.
pub struct Checkpoint {
    dir: PathBuf,
    saved: Mutex<Saved>,
    /// The boot this process runs in.
    boot: String,
}

impl Checkpoint {
    /// The checkpoint in `dir` (created if missing). A file that does not parse is an error
    /// naming it: prepared claims are never dropped silently.
    pub fn open(dir: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?;
        let path = dir.join(FILE);
        let saved = match std::fs::read(&path) {
            Ok(bytes) => {
                let s: Saved = serde_json::from_slice(&bytes).map_err(|e| {
                    anyhow::anyhow!(
                        "{}: not a devplug DRA checkpoint ({e}); move it away to start afresh",
                        path.display()
                    )
                })?;
                anyhow::ensure!(
                    s.version == FORMAT,
                    "{}: checkpoint format {} is newer than this devplug reads ({FORMAT})",
                    path.display(),
                    s.version
                );
                s
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Saved { version: FORMAT, ..Saved::default() },
            Err(e) => anyhow::bail!("{}: {e}", path.display()),
        };
        Ok(Checkpoint { dir: dir.to_owned(), saved: Mutex::new(saved), boot: boot_id() })
    }

    /// The same, as if this process ran in boot `boot` (tests of what a reboot does).
    pub fn open_in_boot(dir: &Path, boot: &str) -> anyhow::Result<Self> {
        Ok(Checkpoint { boot: boot.to_owned(), ..Self::open(dir)? })
    }

    /// Whether claim `uid` was prepared in an earlier boot than this one (a claim recorded
    /// without its boot, by devplug 0.2, counts as this boot's).
    pub fn from_earlier_boot(&self, uid: &str) -> bool {
        self.saved.locked().boots.get(uid).is_some_and(|b| *b != self.boot)
    }

    /// The devices claim `uid` was prepared with, if it was.
    pub fn get(&self, uid: &str) -> Option<(ClaimRef, Vec<PreparedDevice>)> {
        self.saved.locked().claims.get(uid).cloned()
    }

    /// Every prepared claim's UID.
    pub fn uids(&self) -> Vec<String> {
        self.saved.locked().claims.keys().cloned().collect()
    }

    /// Remember `claim` as prepared with `devices`, on disk before this returns.
    pub fn put(&self, claim: &ClaimRef, devices: &[PreparedDevice]) -> std::io::Result<()> {
        let mut saved = self.saved.locked();
        saved.claims.insert(claim.uid.clone(), (claim.clone(), devices.to_vec()));
        saved.boots.insert(claim.uid.clone(), self.boot.clone());
        self.write(&saved)
    }

    /// Forget claim `uid`, on disk before this returns; whether it was there.
    pub fn remove(&self, uid: &str) -> std::io::Result<bool> {
        let mut saved = self.saved.locked();
        let was = saved.claims.remove(uid).is_some();
        saved.boots.remove(uid);
        if was {
            self.write(&saved)?;
        }
        Ok(was)
    }

    fn write(&self, saved: &Saved) -> std::io::Result<()> {
        let bytes = serde_json::to_vec_pretty(saved).map_err(std::io::Error::other)?;
        crate::durable::write_file(&self.dir, &self.dir.join(FILE), &bytes, ".dra-claims-", 0o600)
    }
}
