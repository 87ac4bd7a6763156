//! The CDI spec directory: devplug's own spec files in it, written so a reader (or a crash at
//! any instant) only ever sees a whole old file or a whole new one.
//!
//! A spec is written to a temp file in the same directory (named `.devplug-*.tmp`, which no CDI
//! reader loads), fsynced, renamed over the target and the directory fsynced. Files devplug owns
//! are named `devplug-<vendor>_<class>.json`; nothing else in the directory is ever touched.

use crate::sync::Locked;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::names::{Kind, OWNED_PREFIX};
use super::spec::{self, Spec};
use crate::model::Resource;

const TEMP_PREFIX: &str = ".devplug-";

/// A claim spec's file name: one per claim and driver, since one claim can hold devices of
/// several of devplug's drivers (a GPU and the NIC under its PCIe root), each preparing and
/// unpreparing its own part. Claim UIDs come from kubelet and driver names from the config;
/// anything but a UUID's characters, or a driver that is not a DNS subdomain's, is refused
/// rather than becoming a path.
fn claim_file(uid: &str, driver: &str) -> Result<String, CdiError> {
    if uid.is_empty() || uid.len() > 64 || !uid.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
        return Err(CdiError::Name(format!("claim UID {uid:?} is not a UID")));
    }
    let driver_ok = !driver.is_empty()
        && driver.len() <= 63
        && driver.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && !driver.starts_with('.');
    if !driver_ok {
        return Err(CdiError::Name(format!("driver {driver:?} is not a driver name")));
    }
    Ok(format!("{OWNED_PREFIX}claim-{uid}-{driver}.json"))
}

/// The one file per claim devplug 0.3 and older wrote (`devplug-claim-<uid>.json`), removed with
/// the claim's new files so an upgrade leaves none behind.
fn claim_file_before_0_4(uid: &str) -> String {
    format!("{OWNED_PREFIX}claim-{uid}.json")
}

/// Why a spec could not be written.
#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    #[error("{0}")]
    Name(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CdiError + '_ {
    move |source| CdiError::Io { path: path.to_owned(), source }
}

/// What was last written for a resource.
struct Written {
    file: PathBuf,
    spec: Spec,
}

/// devplug's files in one CDI directory.
pub struct SpecDir {
    dir: PathBuf,
    written: Mutex<BTreeMap<String, Written>>,
}

impl SpecDir {
    /// Use `dir` (created if missing). Temp files a killed
    /// devplug left behind are removed; they were never visible as specs.
    pub fn open(dir: &Path) -> Result<SpecDir, CdiError> {
        fs::create_dir_all(dir).map_err(io(dir))?;
        for entry in fs::read_dir(dir).map_err(io(dir))?.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(TEMP_PREFIX) && name.ends_with(".tmp") {
                let _ = fs::remove_file(entry.path());
            }
        }
        Ok(SpecDir { dir: dir.to_owned(), written: Mutex::new(BTreeMap::new()) })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Bring the resource's spec file up to date. Returns whether the file was (re)written.
    /// A resource with no devices has no spec (CDI readers refuse a spec without devices).
    pub fn sync(&self, resource: &Resource) -> Result<bool, CdiError> {
        let kind = Kind::for_resource(&resource.name).map_err(CdiError::Name)?;
        if resource.devices.is_empty() {
            self.remove(&resource.name);
            return Ok(false);
        }
        let spec = spec::build(resource, &kind);
        let file = self.dir.join(kind.file_name());
        let mut written = self.written.locked();
        if let Some(w) = written.get(&resource.name)
            && w.spec == spec
            && w.file.exists()
        {
            return Ok(false);
        }
        write_atomically(&self.dir, &file, &spec)?;
        written.insert(resource.name.clone(), Written { file, spec });
        Ok(true)
    }

    /// Whether the spec on disk has an entry of every name in `names`. Only checks: specs are
    /// written before a device list is published (see `Loaded::with_publish_hook`), never on
    /// the Allocate path.
    pub fn covers(&self, resource: &str, names: &[String]) -> bool {
        self.written
            .locked()
            .get(resource)
            .is_some_and(|w| w.file.exists() && names.iter().all(|n| w.spec.devices.iter().any(|d| &d.name == n)))
    }

    /// Remove the resource's spec file, if devplug wrote one.
    pub fn remove(&self, resource: &str) {
        let gone = self.written.locked().remove(resource);
        if let Some(w) = gone {
            let _ = fs::remove_file(&w.file);
            crate::durable::sync_dir(&self.dir);
        }
    }

    /// Remove every spec this process wrote (clean exit).
    pub(crate) fn remove_all(&self) {
        let all: Vec<String> = self.written.locked().keys().cloned().collect();
        for r in all {
            self.remove(&r);
        }
    }

    /// Write the spec of a DRA claim's devices of `driver`, prepared
    /// (`devplug-claim-<uid>-<driver>.json`). It is not one of the resources' specs: it lives as
    /// long as the claim is prepared, across devplug restarts, and only
    /// [`SpecDir::remove_claim`] removes it. Whole old or whole new file, never torn, but not
    /// flushed: a claim's spec is written again whenever it may have been lost (a reboot changes
    /// the boot ID its record holds; a missing spec is noticed), so its record's one flush is
    /// enough.
    pub(crate) fn write_claim_unflushed(&self, uid: &str, driver: &str, spec: &Spec) -> Result<PathBuf, CdiError> {
        let file = self.dir.join(claim_file(uid, driver)?);
        let mut bytes =
            serde_json::to_vec_pretty(spec).map_err(|e| CdiError::Io { path: file.clone(), source: e.into() })?;
        bytes.push(b'\n');
        crate::durable::write_file_unflushed(&self.dir, &file, &bytes, TEMP_PREFIX, 0o644).map_err(io(&file))?;
        Ok(file)
    }

    /// Whether the spec of claim `uid`'s devices of `driver` is on disk (a reboot empties
    /// `/var/run/cdi`).
    pub(crate) fn has_claim(&self, uid: &str, driver: &str) -> bool {
        claim_file(uid, driver).is_ok_and(|f| self.dir.join(f).is_file())
    }

    /// Remove the spec of a claim's devices of `driver`, and the one file an older devplug
    /// wrote for the claim (none there is fine: unprepare may be repeated).
    pub(crate) fn remove_claim(&self, uid: &str, driver: &str) -> Result<(), CdiError> {
        let file = self.dir.join(claim_file(uid, driver)?);
        for file in [file, self.dir.join(claim_file_before_0_4(uid))] {
            // Not flushed: a spec that comes back after a power cut belongs to a claim no
            // record holds, and kubelet never names it again.
            match fs::remove_file(&file) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(CdiError::Io { path: file, source: e }),
            }
        }
        Ok(())
    }

    /// Remove devplug's spec files for resources not in `live` (left by an earlier devplug that
    /// was killed). A file counts as devplug's only by its name and a kind matching that name.
    pub fn sweep(&self, live: &[String]) -> Vec<PathBuf> {
        let keep: Vec<String> = live.iter().filter_map(|r| Kind::for_resource(r).ok()).map(|k| k.file_name()).collect();
        let mut removed = Vec::new();
        let Ok(entries) = fs::read_dir(&self.dir) else { return removed };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.starts_with(OWNED_PREFIX) || !name.ends_with(".json") || keep.contains(&name) {
                continue;
            }
            // Never through a link, never a FIFO or an endless file: the CDI dir is shared.
            let ours = crate::durable::read_regular(&entry.path(), MAX_SPEC)
                .ok()
                .and_then(|b| serde_json::from_slice::<Spec>(&b).ok())
                .and_then(|s| Kind::for_resource(&s.kind).ok())
                .is_some_and(|k| k.file_name() == name);
            if ours && fs::remove_file(entry.path()).is_ok() {
                removed.push(entry.path());
            }
        }
        crate::durable::sync_dir(&self.dir);
        removed
    }
}

/// Largest spec file devplug reads back (its own are far smaller).
const MAX_SPEC: u64 = 16 << 20;

/// Temp file, write, fsync, chmod 0644, rename over `file`, fsync the directory.
fn write_atomically(dir: &Path, file: &Path, spec: &Spec) -> Result<(), CdiError> {
    let mut bytes =
        serde_json::to_vec_pretty(spec).map_err(|e| CdiError::Io { path: file.to_owned(), source: e.into() })?;
    bytes.push(b'\n');
    crate::durable::write_file(dir, file, &bytes, TEMP_PREFIX, 0o644).map_err(io(file))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One claim, two of devplug's drivers: each driver's spec is its own file, removing one
    /// leaves the other, and the one file an older devplug wrote for the claim goes with it.
    #[test]
    fn a_claim_has_a_spec_per_driver_and_names_stay_inside_the_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = SpecDir::open(tmp.path()).unwrap();
        let kind = Kind::for_resource("devplug.io/claim").unwrap();
        let spec = spec::build(&Resource { name: "devplug.io/claim".into(), ..Default::default() }, &kind);
        dir.write_claim_unflushed("uid-1", "gpu.devplug.io", &spec).unwrap();
        dir.write_claim_unflushed("uid-1", "nic.devplug.io", &spec).unwrap();
        std::fs::write(tmp.path().join("devplug-claim-uid-1.json"), b"{}").unwrap();
        assert!(dir.has_claim("uid-1", "gpu.devplug.io") && dir.has_claim("uid-1", "nic.devplug.io"));
        dir.remove_claim("uid-1", "gpu.devplug.io").unwrap();
        assert!(!dir.has_claim("uid-1", "gpu.devplug.io") && dir.has_claim("uid-1", "nic.devplug.io"));
        assert!(!tmp.path().join("devplug-claim-uid-1.json").exists(), "the 0.3 file goes with the claim");
        for (uid, driver) in [("../x", "gpu.devplug.io"), ("uid-1", "../../etc"), ("uid-1", "a/b"), ("uid-1", "")] {
            assert!(dir.write_claim_unflushed(uid, driver, &spec).is_err(), "{uid} {driver}");
        }
    }
}
