//! Where each claim this node holds stands, for `/status` and `/metrics`: prepared, or stuck
//! because its backend could not unprepare it. A stuck claim keeps its CDI spec and checkpoint
//! entry (the backend may still hold something for it); kubelet's retries are answered with the
//! backend's error without calling the backend again (the WIT promises `unprepare` at most once
//! per prepare, and once more after a restart); the operator ends it with
//! `devplug dra release`, which leaves a marker the driver acts on at kubelet's next retry.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::Serialize;

use super::checkpoint::ClaimRef;
use crate::sync::Locked;

/// Where a claim stands on this node.
#[derive(Clone, Copy, Debug, Default, Serialize, serde::Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ClaimState {
    #[default]
    Prepared,
    /// Its backend's unprepare failed: it keeps its devices until released.
    Stuck,
}

/// One claim's state.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct ClaimStatus {
    pub driver: String,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub state: ClaimState,
    /// Why it is stuck: the backend's error, clipped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Kubelet's unprepare calls answered since it got stuck.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retries: Option<u64>,
}

/// Every driver's claims on this node.
#[derive(Default)]
pub struct ClaimBoard {
    claims: Mutex<BTreeMap<(String, String), ClaimStatus>>,
    /// Failed prepares and unprepares, by (driver, error class).
    errors: Mutex<BTreeMap<(String, &'static str), u64>>,
}

impl ClaimBoard {
    /// A prepare or unprepare of `driver` failed with `e`.
    pub fn failed(&self, driver: &str, e: &crate::dra::error::DraError) {
        *self.errors.locked().entry((driver.to_owned(), e.class().as_str())).or_default() += 1;
    }

    /// Failures so far, by (driver, class): `dra_claim_errors_total`.
    pub fn errors(&self) -> BTreeMap<(String, &'static str), u64> {
        self.errors.locked().clone()
    }

    pub fn prepared(&self, driver: &str, claim: &ClaimRef) {
        let status = ClaimStatus {
            driver: driver.to_owned(),
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            uid: claim.uid.clone(),
            state: ClaimState::Prepared,
            error: None,
            retries: None,
        };
        self.claims.locked().insert((driver.to_owned(), claim.uid.clone()), status);
    }

    /// `claim` could not be unprepared: `error` says why.
    pub fn stuck(&self, driver: &str, claim: &ClaimRef, error: &str) {
        self.prepared(driver, claim);
        if let Some(s) = self.claims.locked().get_mut(&(driver.to_owned(), claim.uid.clone())) {
            s.state = ClaimState::Stuck;
            s.error = Some(crate::gate::clip(error).into_owned());
            s.retries = Some(0);
        }
    }

    /// The error claim `uid` is stuck with, counting one more retry; `None` if it is not stuck.
    pub fn retry(&self, driver: &str, uid: &str) -> Option<String> {
        let mut claims = self.claims.locked();
        let s = claims.get_mut(&(driver.to_owned(), uid.to_owned())).filter(|s| s.state == ClaimState::Stuck)?;
        *s.retries.get_or_insert(0) += 1;
        s.error.clone()
    }

    pub fn gone(&self, driver: &str, uid: &str) {
        self.claims.locked().remove(&(driver.to_owned(), uid.to_owned()));
    }

    /// Every claim, by driver and UID.
    pub fn all(&self) -> Vec<ClaimStatus> {
        self.claims.locked().values().cloned().collect()
    }

    /// How many claims are in `state`, by driver.
    pub fn counts(&self, state: ClaimState) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for s in self.claims.locked().values().filter(|s| s.state == state) {
            *out.entry(s.driver.clone()).or_default() += 1;
        }
        out
    }
}

/// The directory of release markers, inside the driver's state directory.
pub(crate) const RELEASE_DIR: &str = "release";

/// Ask the driver whose state is in `driver_dir` to release claim `uid`: if it is stuck (its
/// backend's unprepare failed), its kept CDI spec and checkpoint entry are dropped at kubelet's
/// next unprepare of it, without the backend. A healthy claim is unprepared by its backend as
/// usual, and the marker is dropped with a WARN. The marker is a `0600` file in a `0700`
/// directory of devplug's user, opened without following links.
pub fn request_release(driver_dir: &Path, uid: &str) -> anyhow::Result<PathBuf> {
    anyhow::ensure!(
        !uid.is_empty() && uid.len() <= 128 && uid.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'),
        "{:?} is not a claim UID (letters, digits and '-')",
        crate::gate::clip(uid)
    );
    anyhow::ensure!(
        driver_dir.join(super::checkpoint::FILE).exists() || driver_dir.join(super::checkpoint::JOURNAL).exists(),
        "{} holds no DRA checkpoint: is the driver name right, and --dra-plugins-dir where devplug keeps its drivers?",
        driver_dir.display()
    );
    let dir = crate::durable::StateDir::open(driver_dir)?.subdir(RELEASE_DIR)?;
    dir.touch(uid)?;
    Ok(dir.shown(uid))
}
