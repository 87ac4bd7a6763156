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
    /// The checkpoint in `dir` (created if missing). A damaged file (truncated, garbled, an
    /// entry of the wrong shape) never stops the driver: every claim that can still be read is
    /// kept, what was dropped is named in an ERROR, the damaged file is kept beside it as
    /// `dra-claims.json.damaged` for inspection, and the salvaged set is written in its place.
    /// Only a file from a newer devplug is refused (its claims may mean something else).
    pub fn open(dir: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?;
        let path = dir.join(FILE);
        let me = |saved| Checkpoint { dir: dir.to_owned(), saved: Mutex::new(saved), boot: boot_id() };
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(me(Saved { version: FORMAT, ..Saved::default() }));
            }
            Err(e) => anyhow::bail!("{}: {e}", path.display()),
        };
        let Salvaged { saved, dropped } = salvage(&bytes);
        anyhow::ensure!(
            saved.version <= FORMAT,
            "{}: checkpoint format {} is newer than this devplug reads ({FORMAT}); run the newer devplug, or move the file away to start afresh",
            path.display(),
            saved.version
        );
        let cp = me(Saved { version: FORMAT, ..saved });
        if let Some(dropped) = dropped {
            let aside = dir.join(format!("{FILE}.damaged"));
            let kept = cp.saved.locked().claims.len();
            tracing::error!(
                checkpoint = %path.display(),
                kept,
                "the DRA checkpoint is damaged: {dropped}; kept the {kept} claims that could be read, the file as it was is in {}. \
                 A dropped claim is prepared again when kubelet asks, and its old CDI spec stays until then",
                aside.display()
            );
            if let Err(e) = std::fs::copy(&path, &aside) {
                tracing::warn!("could not keep the damaged checkpoint as {}: {e}", aside.display());
            }
            cp.write(&cp.saved.locked()).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        }
        Ok(cp)
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

    /// The directory the checkpoint is in (the driver's own).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// How many claims are recorded as prepared.
    pub fn count(&self) -> usize {
        self.saved.locked().claims.len()
    }

    fn write(&self, saved: &Saved) -> std::io::Result<()> {
        let bytes = serde_json::to_vec_pretty(saved).map_err(std::io::Error::other)?;
        crate::durable::write_file(&self.dir, &self.dir.join(FILE), &bytes, ".dra-claims-", 0o600)
    }
}

/// What could be read of a checkpoint file, and what could not (`None`: it was whole).
struct Salvaged {
    saved: Saved,
    dropped: Option<String>,
}

/// Read `bytes` as a checkpoint, keeping every claim entry that can be read: entries are read one
/// by one, so a file cut short keeps the claims before the cut, and an entry of the wrong shape
/// costs only itself.
fn salvage(bytes: &[u8]) -> Salvaged {
    use serde::de::{DeserializeSeed, Deserializer as _, MapAccess, Visitor};

    #[derive(Default)]
    struct Found {
        version: Option<u32>,
        claims: BTreeMap<String, (ClaimRef, Vec<PreparedDevice>)>,
        boots: BTreeMap<String, String>,
        bad_entries: Vec<String>,
    }
    struct Top<'a>(&'a mut Found);
    struct Entries<'a, T>(&'a mut BTreeMap<String, T>, &'a mut Vec<String>);

    impl<'de, T: serde::de::DeserializeOwned> Visitor<'de> for Entries<'_, T> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a map by claim UID")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            while let Some(uid) = map.next_key::<String>()? {
                let value: serde_json::Value = map.next_value()?;
                match serde_json::from_value::<T>(value) {
                    Ok(v) => {
                        self.0.insert(uid, v);
                    }
                    Err(e) => self.1.push(format!("claim {}: {e}", crate::untrusted::clip(&uid))),
                }
            }
            Ok(())
        }
    }
    impl<'de, T: serde::de::DeserializeOwned> DeserializeSeed<'de> for Entries<'_, T> {
        type Value = ();
        fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_map(self)
        }
    }
    impl<'de> Visitor<'de> for Top<'_> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a devplug DRA checkpoint")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            while let Some(key) = map.next_key::<String>()? {
                match key.as_str() {
                    "version" => self.0.version = Some(map.next_value()?),
                    "claims" => map.next_value_seed(Entries(&mut self.0.claims, &mut self.0.bad_entries))?,
                    "boots" => map.next_value_seed(Entries(&mut self.0.boots, &mut self.0.bad_entries))?,
                    _ => drop(map.next_value::<serde::de::IgnoredAny>()?),
                }
            }
            Ok(())
        }
    }

    let mut found = Found::default();
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let parsed = de.deserialize_map(Top(&mut found)).and_then(|()| de.end());
    let mut problems = found.bad_entries;
    if let Err(e) = parsed {
        problems.insert(0, format!("it is not whole JSON ({e}): everything after that point is lost"));
    }
    if found.version.is_none() {
        problems.push("it names no format version".into());
    }
    // A boot recorded for a claim that was not read means nothing; a claim without one counts
    // as this boot's (as in files of devplug 0.2).
    found.boots.retain(|uid, _| found.claims.contains_key(uid));
    let saved = Saved { version: found.version.unwrap_or(FORMAT), claims: found.claims, boots: found.boots };
    Salvaged { saved, dropped: (!problems.is_empty()).then(|| problems.join("; ")) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(uid: &str) -> (ClaimRef, Vec<PreparedDevice>) {
        let c = ClaimRef { namespace: "ml".into(), uid: uid.into(), name: format!("c-{uid}") };
        let d = PreparedDevice {
            request_names: vec!["gpu".into()],
            pool_name: "node-a".into(),
            device_name: format!("gpu-{uid}"),
            cdi_device_ids: vec![format!("devplug.io/claim={uid}-gpu")],
        };
        (c, vec![d])
    }

    /// A file with claims `a` and `b`, in the format devplug writes.
    fn two_claims() -> Vec<u8> {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::open_in_boot(dir.path(), "boot-1").unwrap();
        for uid in ["a", "b"] {
            let (c, d) = claim(uid);
            cp.put(&c, &d).unwrap();
        }
        std::fs::read(dir.path().join(FILE)).unwrap()
    }

    fn open_with(bytes: &[u8]) -> (tempfile::TempDir, Checkpoint) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE), bytes).unwrap();
        let cp = Checkpoint::open(dir.path()).expect("a damaged checkpoint still opens");
        (dir, cp)
    }

    #[test]
    fn a_whole_file_is_read_as_it_was_written() {
        let bytes = two_claims();
        let s = salvage(&bytes);
        assert!(s.dropped.is_none(), "{:?}", s.dropped);
        assert_eq!(s.saved.claims.len(), 2);
        assert_eq!(s.saved.boots["a"], "boot-1");
    }

    #[test]
    fn a_file_cut_inside_the_second_claim_keeps_the_first() {
        let bytes = two_claims();
        let text = String::from_utf8(bytes.clone()).unwrap();
        let cut = text.find("gpu-b").expect("claim b's device is in the file");
        let (dir, cp) = open_with(&bytes[..cut]);
        assert_eq!(cp.get("a"), Some(claim("a")), "the intact claim is kept");
        assert!(cp.get("b").is_none());
        assert!(dir.path().join("dra-claims.json.damaged").exists(), "the damaged file is kept for inspection");
        // The salvaged set is on disk now: opening again finds it whole.
        let again = salvage(&std::fs::read(dir.path().join(FILE)).unwrap());
        assert!(again.dropped.is_none(), "{:?}", again.dropped);
        assert_eq!(again.saved.claims.len(), 1);
    }

    #[test]
    fn an_entry_of_the_wrong_shape_costs_only_itself() {
        let mut v: serde_json::Value = serde_json::from_slice(&two_claims()).unwrap();
        v["claims"]["a"] = serde_json::json!("not a claim");
        let s = salvage(&serde_json::to_vec(&v).unwrap());
        assert_eq!(s.saved.claims.keys().collect::<Vec<_>>(), ["b"]);
        assert!(s.dropped.unwrap().contains("claim a"), "the dropped claim is named");
    }

    #[test]
    fn garbage_an_empty_file_and_a_missing_version_open_empty_and_say_so() {
        for (bytes, says) in [
            (&b"\x00\x01 not json"[..], "not whole JSON"),
            (&b""[..], "not whole JSON"),
            (&br#"{"claims":{}}"#[..], "no format version"),
            (&br#"[1,2,3]"#[..], "not whole JSON"),
        ] {
            let s = salvage(bytes);
            assert!(s.dropped.as_deref().is_some_and(|d| d.contains(says)), "{bytes:?}: {:?}", s.dropped);
            let (_dir, cp) = open_with(bytes);
            assert_eq!(cp.count(), 0);
        }
    }

    #[test]
    fn a_newer_format_is_refused_with_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE), br#"{"version":7,"claims":{}}"#).unwrap();
        let e = Checkpoint::open(dir.path()).err().unwrap().to_string();
        assert!(e.contains("newer") && e.contains("move the file away"), "{e}");
    }
}
