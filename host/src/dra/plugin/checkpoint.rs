//! The claims this node has prepared, on disk: a prepare that was answered is never answered
//! differently, across a devplug restart or a crash at any instant.
//!
//! Two files in the driver's directory: `dra-claims.json`, a snapshot (replaced atomically),
//! and `dra-claims.journal`, the changes since (one JSON record a line, [`super::journal`]). A
//! call's prepared claims are one journal append (a `write`, no flush: see the journal for why
//! a flush would buy nothing); the snapshot is rewritten (and
//! the journal emptied) only when the journal has grown past a few times the claims it
//! describes. Reading replays the journal over the snapshot; damage to either costs only the
//! records it touched.
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
    /// The allocation's share of a device several claims hold at once (`shareID`, KEP-5075):
    /// kubelet matches the answer to the claim's allocation by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
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
pub(crate) fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id").map(|s| s.trim().to_owned()).unwrap_or_default()
}

const FORMAT: u32 = 1;
/// The checkpoint's snapshot file name in its directory.
pub const FILE: &str = "dra-claims.json";
/// The journal of changes since the snapshot.
pub(crate) const JOURNAL: &str = "dra-claims.journal";
/// The journal is folded into the snapshot (at a removal) once it holds more records than this,
/// or four times the claims prepared, whichever is more.
const COMPACT_AT: usize = 256;

/// One change, as the journal records it.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Change {
    Put { claim: ClaimRef, devices: Vec<PreparedDevice>, boot: String },
    Remove { uid: String },
}

/// Prepared claims, kept in memory and on disk (snapshot + journal).
pub struct Checkpoint {
    dir: PathBuf,
    /// The same directory, opened once: every file of the checkpoint is opened relative to it.
    state: crate::durable::StateDir,
    saved: Mutex<Saved>,
    journal: super::journal::Journal,
    /// The boot this process runs in.
    boot: String,
}

impl Checkpoint {
    /// The checkpoint in `dir` (created if missing). A damaged snapshot or journal (truncated,
    /// garbled, a record of the wrong shape) never stops the driver: every claim that can still
    /// be read is kept, what was dropped is named in an ERROR, the damaged snapshot is kept
    /// beside it as `dra-claims.json.damaged` for inspection, and the salvaged set is written in
    /// its place. Only a file from a newer devplug is refused (its claims may mean something
    /// else).
    pub fn open(dir: &Path) -> anyhow::Result<Self> {
        let state = crate::durable::StateDir::open(dir)?;
        let path = dir.join(FILE);
        let (saved, mut dropped, damaged_snapshot) = match state.read(FILE)? {
            Some(bytes) => {
                let Salvaged { saved, dropped } = salvage(&bytes);
                let damaged = dropped.is_some();
                (saved, dropped.into_iter().collect::<Vec<_>>(), damaged)
            }
            None => (Saved { version: FORMAT, ..Saved::default() }, Vec::new(), false),
        };
        anyhow::ensure!(
            saved.version <= FORMAT,
            "{}: checkpoint format {} is newer than this devplug reads ({FORMAT}); run the newer devplug, or move the file away to start afresh",
            path.display(),
            saved.version
        );
        let mut saved = Saved { version: FORMAT, ..saved };
        let (journal, replayed) = super::journal::Journal::open(&state, JOURNAL)?;
        dropped.extend(replayed.problems);
        for record in replayed.records {
            match serde_json::from_value::<Change>(record) {
                Ok(change) => apply(&mut saved, change),
                Err(e) => dropped.push(format!("{}: a record of the wrong shape: {e}", journal.path().display())),
            }
        }
        let cp = Checkpoint { dir: dir.to_owned(), state, saved: Mutex::new(saved), journal, boot: boot_id() };
        if !dropped.is_empty() {
            let aside = dir.join(format!("{FILE}.damaged"));
            let kept = cp.count();
            tracing::error!(
                checkpoint = %path.display(),
                kept,
                "the DRA checkpoint is damaged: {}; kept the {kept} claims that could be read{}. \
                 A dropped claim is prepared again when kubelet asks, and its old CDI spec stays until then",
                dropped.join("; "),
                if damaged_snapshot { format!(", the snapshot as it was is in {}", aside.display()) } else { String::new() }
            );
            if damaged_snapshot && let Err(e) = cp.state.copy(FILE, &format!("{FILE}.damaged")) {
                tracing::warn!("could not keep the damaged checkpoint as {}: {e}", aside.display());
            }
            cp.compact().map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        }
        Ok(cp)
    }

    /// The same, as if this process ran in boot `boot` (tests of what a reboot does).
    #[cfg(test)]
    pub(crate) fn open_in_boot(dir: &Path, boot: &str) -> anyhow::Result<Self> {
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

    /// Remember each claim as prepared with its devices: one journal append, written before
    /// this returns.
    pub fn put_many(&self, claims: &[(ClaimRef, Vec<PreparedDevice>)]) -> std::io::Result<()> {
        let changes: Vec<Change> = claims
            .iter()
            .map(|(claim, devices)| Change::Put {
                claim: claim.clone(),
                devices: devices.clone(),
                boot: self.boot.clone(),
            })
            .collect();
        self.record(changes)
    }

    /// Forget these claims (one append); how many were there.
    pub fn remove_many(&self, uids: &[String]) -> std::io::Result<usize> {
        let held: Vec<Change> = {
            let saved = self.saved.locked();
            uids.iter().filter(|u| saved.claims.contains_key(*u)).map(|u| Change::Remove { uid: u.clone() }).collect()
        };
        let n = held.len();
        if n > 0 {
            self.record(held)?;
        }
        Ok(n)
    }

    /// On disk first, then in memory: a change that could not be recorded is not made.
    fn record(&self, changes: Vec<Change>) -> std::io::Result<()> {
        // Folding happens on the way out (a removal), never in a prepare: a prepare's cost is
        // its one append.
        let removal = changes.iter().any(|c| matches!(c, Change::Remove { .. }));
        self.journal.append(&changes)?;
        let claims = {
            let mut saved = self.saved.locked();
            for c in changes {
                apply(&mut saved, c);
            }
            saved.claims.len()
        };
        if removal
            && self.journal.lines() > COMPACT_AT.max(4 * claims)
            && let Err(e) = self.compact()
        {
            // The journal still holds everything; the next change tries again.
            tracing::warn!(checkpoint = %self.dir.join(FILE).display(), "could not fold the journal into the snapshot: {e}");
        }
        Ok(())
    }

    /// Write the snapshot of what is in memory, then empty the journal. A crash between the two
    /// replays a journal whose changes the snapshot already holds: the same set.
    fn compact(&self) -> std::io::Result<()> {
        let bytes = serde_json::to_vec_pretty(&*self.saved.locked()).map_err(std::io::Error::other)?;
        // Replaced atomically, not flushed, as the journal is written: flushing here put three
        // disk flushes into every ~128th unprepare (its p99 under load, docs/BENCHMARKS.md).
        self.state.write(FILE, &bytes, false)?;
        self.journal.reset()
    }

    /// The directory the checkpoint is in (the driver's own).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The same directory, opened once (the driver's other state lives beside the checkpoint).
    pub fn state(&self) -> &crate::durable::StateDir {
        &self.state
    }

    /// How many claims are recorded as prepared.
    pub fn count(&self) -> usize {
        self.saved.locked().claims.len()
    }
}

fn apply(saved: &mut Saved, change: Change) {
    match change {
        Change::Put { claim, devices, boot } => {
            saved.boots.insert(claim.uid.clone(), boot);
            saved.claims.insert(claim.uid.clone(), (claim, devices));
        }
        Change::Remove { uid } => {
            saved.claims.remove(&uid);
            saved.boots.remove(&uid);
        }
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
                    Err(e) => self.1.push(format!("claim {}: {e}", crate::gate::clip(&uid))),
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
            share_id: None,
        };
        (c, vec![d])
    }

    /// A snapshot with claims `a` and `b`, in the format devplug writes.
    fn two_claims() -> Vec<u8> {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::open_in_boot(dir.path(), "boot-1").unwrap();
        for uid in ["a", "b"] {
            let (c, d) = claim(uid);
            cp.put_many(&[(c.clone(), d)]).unwrap();
        }
        cp.compact().unwrap();
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

    /// A call's claims are one append, and no flush; the journal is folded into the snapshot as it grows; a
    /// record cut short at the journal's end (a crash mid-append) costs only itself; and what is
    /// read back after all that is exactly what was recorded.
    #[test]
    fn claims_are_journaled_one_write_a_batch_and_survive_compaction_and_a_torn_append() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::open(dir.path()).unwrap();
        let batch: Vec<_> = (0..8).map(|i| claim(&format!("c{i}"))).collect();
        cp.put_many(&batch).unwrap();
        assert_eq!(cp.journal.appends(), 1, "eight claims, one write");
        assert_eq!(cp.remove_many(&["c0".into(), "c1".into(), "nobody".into()]).unwrap(), 2);
        assert_eq!(cp.journal.appends(), 2);
        for i in 0..300 {
            let (c, d) = claim(&format!("x{i}"));
            cp.put_many(&[(c.clone(), d)]).unwrap();
            cp.remove_many(std::slice::from_ref(&c.uid)).unwrap();
        }
        assert!(cp.journal.lines() <= COMPACT_AT + 1, "folded into the snapshot: {}", cp.journal.lines());
        drop(cp);
        let mut f = std::fs::OpenOptions::new().append(true).open(dir.path().join(JOURNAL)).unwrap();
        std::io::Write::write_all(&mut f, br#"{"put":{"claim":{"namespace":"ml","uid":"torn""#).unwrap();
        drop(f);
        let again = Checkpoint::open(dir.path()).unwrap();
        let mut uids = again.uids();
        uids.sort();
        assert_eq!(uids, ["c2", "c3", "c4", "c5", "c6", "c7"]);
        assert_eq!(again.get("c5"), Some(claim("c5")));
    }
}
