//! The DRA kubelet plugin service (`DRAPlugin`, versions `v1` and `v1beta1` on one socket):
//! `NodePrepareResources` and `NodeUnprepareResources` as kubelet expects them. One entry per
//! claim in every answer (a claim's failure is its entry's error, never the RPC's); a claim
//! prepared once is answered the same way again from the [`Checkpoint`], also after a restart;
//! unpreparing a claim this node does not hold succeeds (kubelet may repeat it). A claim to
//! prepare afresh is read from the API server here, as upstream's `kubeletplugin` does, and
//! handed to the driver's [`ClaimPreparer`] as its checked [`Allocation`].
//!
//! The claims of one call are prepared concurrently, each under a lock of its own (a claim is
//! never prepared and unprepared at once; unrelated claims never wait for each other), and
//! recorded together: one checkpoint write per call. The record comes before the claim's CDI
//! spec is written, so a crash at any point leaves no spec without its record; a record without
//! its spec is prepared again when kubelet asks (`ClaimPreparer::intact`). What a claim's
//! preparing decided travels as a [`PreparedClaim`] from `prepare` to `commit`, never parked.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::service::Routes;

use super::checkpoint::{Checkpoint, ClaimRef, PreparedDevice};
use super::claim_api::{Allocation, ClaimApi};
use super::claims::ClaimBoard;
use crate::dra::error::DraError;
use crate::proto::dra::{v1, v1beta1};

/// What preparing a claim decided, before anything is written: the devices kubelet is told,
/// and what the node gets once the claim is recorded (its CDI spec, its devices' status).
#[derive(Debug, Default)]
pub struct PreparedClaim {
    pub devices: Vec<PreparedDevice>,
    pub spec: Option<crate::cdi::Spec>,
    pub status: Vec<k8s_openapi::api::resource::v1::AllocatedDeviceStatus>,
}

impl PreparedClaim {
    /// A claim whose preparing leaves nothing on the node but kubelet's answer.
    pub fn devices(devices: Vec<PreparedDevice>) -> Self {
        PreparedClaim { devices, ..Default::default() }
    }
}

/// What preparing a claim means for this node: the backend decides the devices' CDI edits for
/// the claim's allocation, the host writes them. Unpreparing undoes that.
#[async_trait::async_trait]
pub trait ClaimPreparer: Send + Sync + 'static {
    /// Decide the devices and edits of `claim`, allocated `allocation` (every driver's: take
    /// this driver's part); nothing is written yet (see [`ClaimPreparer::commit`]).
    async fn prepare(&self, claim: &ClaimRef, allocation: &Allocation) -> Result<PreparedClaim, DraError>;
    /// Write what `prepare` decided for `claim` (its CDI spec), once the claim is recorded.
    fn commit(&self, _claim: &ClaimRef, _prepared: PreparedClaim) -> Result<(), DraError> {
        Ok(())
    }
    /// Whether what `prepare` left on the node for `claim` is still there (its CDI spec).
    fn intact(&self, claim: &ClaimRef) -> bool;
    /// Undo `prepare` of `claim`: its backend's part, then its CDI spec (the claim's UID is all
    /// the backend is told; its devices are in the spec devplug wrote).
    async fn unprepare(&self, claim: &ClaimRef) -> Result<(), DraError>;
    /// Drop what `prepare` left on the node for `claim` without the backend (the operator
    /// released a claim its backend could not unprepare).
    fn release(&self, _claim: &ClaimRef) -> Result<(), DraError> {
        Ok(())
    }
}

/// One claim's outcome: answered from the record, or prepared afresh (to be recorded, then
/// committed).
enum Outcome {
    Recorded(Vec<PreparedDevice>),
    Fresh(PreparedClaim),
}

/// Claim locks per plugin.
const LOCKS: usize = 64;

/// One driver's plugin: its preparer and checkpoint.
pub struct DraPlugin {
    preparer: Arc<dyn ClaimPreparer>,
    /// Where claims to prepare afresh are read.
    api: Arc<dyn ClaimApi>,
    checkpoint: Checkpoint,
    /// Kubelet may call prepare and unprepare concurrently: a claim's UID picks one of these
    /// locks, so one claim is handled at a time and unrelated claims rarely share one.
    locks: Vec<Arc<tokio::sync::Mutex<()>>>,
    /// The driver's name, and where its claims show.
    driver: String,
    board: Arc<ClaimBoard>,
}

impl DraPlugin {
    /// The plugin of `driver`, reading claims from `api`, whose claims show on `board` (every
    /// recorded claim as prepared).
    pub fn new(
        driver: &str,
        preparer: Arc<dyn ClaimPreparer>,
        api: Arc<dyn ClaimApi>,
        checkpoint: Checkpoint,
        board: Arc<ClaimBoard>,
    ) -> Self {
        for uid in checkpoint.uids() {
            if let Some((claim, _)) = checkpoint.get(&uid) {
                board.prepared(driver, &claim);
            }
        }
        let locks = (0..LOCKS).map(|_| Arc::new(tokio::sync::Mutex::new(()))).collect();
        DraPlugin { preparer, api, checkpoint, locks, driver: driver.to_owned(), board }
    }

    /// The locks of `claims`, taken in one order (so two calls never wait on each other).
    async fn lock(&self, claims: &[ClaimRef]) -> Vec<tokio::sync::OwnedMutexGuard<()>> {
        use std::hash::{Hash, Hasher};
        let mut picked: Vec<usize> = claims
            .iter()
            .map(|c| {
                let mut h = std::collections::hash_map::DefaultHasher::new();
                c.uid.hash(&mut h);
                (h.finish() % LOCKS as u64) as usize
            })
            .collect();
        picked.sort_unstable();
        picked.dedup();
        let mut guards = Vec::with_capacity(picked.len());
        for i in picked {
            guards.push(self.locks[i].clone().lock_owned().await);
        }
        guards
    }

    /// One claim: from the record, or prepared afresh.
    async fn prepare_one(&self, claim: &ClaimRef) -> Result<Outcome, DraError> {
        // A claim prepared before is answered from the record, unless what it left on the node
        // is gone (a reboot empties /var/run/cdi): then it is prepared again, and answers the
        // same CDI IDs (they are made from the claim's UID and devices).
        let recorded = self.checkpoint.get(&claim.uid).filter(|_| {
            let lost = self.checkpoint.from_earlier_boot(&claim.uid) || !self.preparer.intact(claim);
            if lost {
                tracing::info!(driver = %self.driver, claim = %format!("{}/{}", claim.namespace, claim.name), uid = %claim.uid, "prepared before a reboot (or its CDI spec is gone): preparing it again");
            }
            !lost
        });
        match recorded {
            Some((_, devices)) => Ok(Outcome::Recorded(devices)),
            None => {
                let found = self.api.get(&claim.namespace, &claim.name).await?;
                let allocation = super::claim_api::allocation(claim, found)?;
                self.preparer.prepare(claim, &allocation).await.map(Outcome::Fresh)
            }
        }
    }

    /// The release markers' directory when the operator asked (`devplug dra release`) to drop
    /// claim `uid`. A link or anything but devplug's own file there is refused (and left).
    fn release_marker(&self, uid: &str) -> Option<crate::durable::StateDir> {
        // Most nodes never see a release: no directory to create or open on every unprepare.
        if !self.checkpoint.state().exists(super::claims::RELEASE_DIR) {
            return None;
        }
        let dir = match self.checkpoint.state().subdir(super::claims::RELEASE_DIR) {
            Ok(dir) => dir,
            Err(e) => {
                tracing::error!(driver = %self.driver, "release markers not read: {e}");
                return None;
            }
        };
        if !dir.exists(uid) {
            return None;
        }
        match dir.read(uid) {
            Ok(_) => Some(dir),
            Err(e) => {
                tracing::error!(driver = %self.driver, uid, "release marker refused: {e}");
                None
            }
        }
    }

    fn drop_marker(&self, dir: &crate::durable::StateDir, uid: &str) {
        if let Err(e) = dir.remove(uid) {
            tracing::warn!(driver = %self.driver, uid, "could not remove the release marker {}: {e}", dir.shown(uid).display());
        }
    }

    /// Unprepare one held claim (its record is forgotten by the caller): the backend once;
    /// after it failed, its error again until the operator releases the claim or devplug
    /// restarts.
    async fn unprepare_one(&self, held: &ClaimRef) -> Result<(), DraError> {
        let shown = format!("{}/{}", held.namespace, held.name);
        let stuck = self.board.retry(&self.driver, &held.uid);
        let asked = self.release_marker(&held.uid);
        if let (Some(dir), Some(_)) = (&asked, &stuck) {
            self.drop_marker(dir, &held.uid);
            self.preparer.release(held)?;
            tracing::warn!(driver = %self.driver, claim = %shown, uid = %held.uid, "claim released by the operator: its CDI spec and record are gone, the backend was not asked again");
            return Ok(());
        }
        if asked.is_some() {
            // A claim that is not stuck is its backend's to unprepare; the release stands only
            // if that fails.
            tracing::warn!(driver = %self.driver, claim = %shown, uid = %held.uid, "devplug dra release asked for a claim that is not stuck: its backend unprepares it; the release applies only if that fails");
        }
        if let Some(error) = stuck {
            return Err(DraError::Stuck { error, driver: self.driver.clone(), uid: held.uid.clone() });
        }
        match self.preparer.unprepare(held).await {
            Ok(()) => {
                if let Some(dir) = &asked {
                    self.drop_marker(dir, &held.uid);
                }
                Ok(())
            }
            Err(e) => {
                tracing::error!(
                    driver = %self.driver,
                    claim = %shown,
                    uid = %held.uid,
                    "claim could not be unprepared: {}. Its CDI spec and record stay; kubelet's retries get this error without the backend being asked again. Fix the backend and restart devplug, or release the claim: devplug dra release --driver {} {}",
                    crate::gate::clip(&e.report()),
                    self.driver,
                    held.uid
                );
                self.board.stuck(&self.driver, held, &crate::gate::clip(&e.report()));
                Err(e)
            }
        }
    }

    /// Prepare each claim (or answer from the checkpoint); by claim UID.
    pub async fn prepare(&self, claims: Vec<ClaimRef>) -> BTreeMap<String, Result<Vec<PreparedDevice>, DraError>> {
        let _held = self.lock(&claims).await;
        let outcomes = futures::future::join_all(claims.iter().map(|c| self.prepare_one(c))).await;
        // Everything prepared afresh in this call is recorded at once: one write.
        let fresh: Vec<(ClaimRef, Vec<PreparedDevice>)> = claims
            .iter()
            .zip(&outcomes)
            .filter_map(|(c, o)| match o {
                Ok(Outcome::Fresh(p)) => Some((c.clone(), p.devices.clone())),
                _ => None,
            })
            .collect();
        let recorded = if fresh.is_empty() {
            Ok(())
        } else {
            tracing::debug_span!("dra.checkpoint").in_scope(|| self.checkpoint.put_many(&fresh)).map_err(Arc::new)
        };
        let mut out = BTreeMap::new();
        for (claim, outcome) in claims.into_iter().zip(outcomes) {
            let answer = match (outcome, &recorded) {
                (Ok(Outcome::Recorded(devices)), _) => Ok(devices),
                (Ok(Outcome::Fresh(prepared)), Ok(())) => {
                    let devices = prepared.devices.clone();
                    self.preparer.commit(&claim, prepared).map(|()| {
                        self.board.prepared(&self.driver, &claim);
                        devices
                    })
                }
                // What was decided is dropped unwritten: no spec without its record.
                (Ok(Outcome::Fresh(_)), Err(e)) => Err(DraError::Checkpoint { doing: "prepared", source: e.clone() }),
                (Err(e), _) => Err(e),
            };
            if let Err(e) = &answer {
                self.board.failed(&self.driver, e);
                tracing::warn!(driver = %self.driver, claim = %format!("{}/{}", claim.namespace, claim.name), uid = %claim.uid, class = e.class().as_str(), "prepare failed: {}", crate::gate::clip(&e.report()));
            }
            out.insert(claim.uid.clone(), answer);
        }
        out
    }

    /// Unprepare each claim this node holds (a claim it does not hold is already unprepared);
    /// the claims let go of are forgotten together (one write).
    pub async fn unprepare(&self, claims: Vec<ClaimRef>) -> BTreeMap<String, Result<(), DraError>> {
        let _held = self.lock(&claims).await;
        let outcomes = futures::future::join_all(claims.iter().map(|claim| async move {
            match self.checkpoint.get(&claim.uid) {
                None => Ok(false),
                Some((held, _)) => self.unprepare_one(&held).await.map(|()| true),
            }
        }))
        .await;
        let done: Vec<String> =
            claims.iter().zip(&outcomes).filter(|(_, o)| matches!(o, Ok(true))).map(|(c, _)| c.uid.clone()).collect();
        let forgotten = if done.is_empty() {
            Ok(0)
        } else {
            tracing::debug_span!("dra.checkpoint").in_scope(|| self.checkpoint.remove_many(&done)).map_err(Arc::new)
        };
        let mut out = BTreeMap::new();
        for (claim, outcome) in claims.into_iter().zip(outcomes) {
            let answer = match (outcome, &forgotten) {
                (Ok(true), Err(e)) => Err(DraError::Checkpoint { doing: "unprepared", source: e.clone() }),
                (Ok(true), Ok(_)) => {
                    self.board.gone(&self.driver, &claim.uid);
                    Ok(())
                }
                (Ok(false), _) => Ok(()),
                (Err(e), _) => Err(e),
            };
            if let Err(e) = &answer {
                self.board.failed(&self.driver, e);
            }
            out.insert(claim.uid.clone(), answer);
        }
        out
    }
}

/// The same service in each API version kubelet may speak: the generated types of `v1` and
/// `v1beta1` are distinct but alike, so one macro writes both.
impl From<PreparedDevice> for v1::Device {
    fn from(d: PreparedDevice) -> Self {
        v1::Device {
            request_names: d.request_names,
            pool_name: d.pool_name,
            device_name: d.device_name,
            cdi_device_ids: d.cdi_device_ids,
            share_id: d.share_id.unwrap_or_default(),
        }
    }
}

/// v1beta1 (kubelet 1.32–1.33) predates shared devices: no share ID to tell.
impl From<PreparedDevice> for v1beta1::Device {
    fn from(d: PreparedDevice) -> Self {
        v1beta1::Device {
            request_names: d.request_names,
            pool_name: d.pool_name,
            device_name: d.device_name,
            cdi_device_ids: d.cdi_device_ids,
        }
    }
}

macro_rules! version {
    ($wrapper:ident, $m:ident) => {
        /// The plugin as `$m.DRAPlugin`.
        #[derive(Clone)]
        pub struct $wrapper(pub Arc<DraPlugin>);

        impl $wrapper {
            fn refs(claims: Vec<$m::Claim>) -> Vec<ClaimRef> {
                claims.into_iter().map(|c| ClaimRef { namespace: c.namespace, uid: c.uid, name: c.name }).collect()
            }
        }

        #[tonic::async_trait]
        impl $m::dra_plugin_server::DraPlugin for $wrapper {
            async fn node_prepare_resources(
                &self,
                req: tonic::Request<$m::NodePrepareResourcesRequest>,
            ) -> Result<tonic::Response<$m::NodePrepareResourcesResponse>, tonic::Status> {
                let claims = Self::refs(req.into_inner().claims);
                let claims = self
                    .0
                    .prepare(claims)
                    .await
                    .into_iter()
                    .map(|(uid, r)| {
                        let entry = match r {
                            Ok(devices) => $m::NodePrepareResourceResponse {
                                devices: devices.into_iter().map($m::Device::from).collect(),
                                error: String::new(),
                            },
                            Err(e) => $m::NodePrepareResourceResponse { devices: vec![], error: kubelet_text(&e) },
                        };
                        (uid, entry)
                    })
                    .collect();
                Ok(tonic::Response::new($m::NodePrepareResourcesResponse { claims }))
            }

            async fn node_unprepare_resources(
                &self,
                req: tonic::Request<$m::NodeUnprepareResourcesRequest>,
            ) -> Result<tonic::Response<$m::NodeUnprepareResourcesResponse>, tonic::Status> {
                let claims = Self::refs(req.into_inner().claims);
                let claims = self
                    .0
                    .unprepare(claims)
                    .await
                    .into_iter()
                    .map(|(uid, r)| {
                        (
                            uid,
                            $m::NodeUnprepareResourceResponse {
                                error: r.err().map(|e| kubelet_text(&e)).unwrap_or_default(),
                            },
                        )
                    })
                    .collect();
                Ok(tonic::Response::new($m::NodeUnprepareResourcesResponse { claims }))
            }
        }
    };
}

/// A claim's error as kubelet gets it: the API server's and the backend's words in it pass the
/// text gate (escaped, clipped) here, where the text is written.
fn kubelet_text(e: &DraError) -> String {
    crate::gate::clip_to(&e.report(), crate::gate::MAX_WIRE_ERROR).into_owned()
}

version!(V1, v1);
version!(V1beta1, v1beta1);

/// Serve `plugin` in both versions on the Unix socket `path` (a stale socket there is replaced),
/// with the devices' health stream in both of its versions when given, until `stop`.
pub fn serve(
    plugin: Arc<DraPlugin>,
    health: Option<super::health::HealthService>,
    path: &Path,
    stop: CancellationToken,
) -> std::io::Result<JoinHandle<()>> {
    use crate::plugin_socket::serve::MAX_DRA_REQUEST as MAX;
    let mut routes =
        Routes::new(v1::dra_plugin_server::DraPluginServer::new(V1(plugin.clone())).max_decoding_message_size(MAX))
            .add_service(
                v1beta1::dra_plugin_server::DraPluginServer::new(V1beta1(plugin)).max_decoding_message_size(MAX),
            );
    if let Some(h) = health {
        routes = routes
            .add_service(super::health::V1alpha1(h.clone()).service())
            .add_service(super::health::V1(h).service());
    }
    crate::plugin_socket::serve(path, routes, stop, "DRA plugin server")
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

    use k8s_openapi::api::resource::v1::{AllocationResult, ResourceClaim, ResourceClaimStatus};

    use super::*;

    /// Every claim is in the API server, allocated, with the UID kubelet names.
    struct Allocated;
    #[async_trait::async_trait]
    impl ClaimApi for Allocated {
        async fn get(&self, _: &str, name: &str) -> Result<ResourceClaim, DraError> {
            let mut rc = ResourceClaim::default();
            rc.metadata.uid = Some(format!("uid-{name}"));
            rc.status =
                Some(ResourceClaimStatus { allocation: Some(AllocationResult::default()), ..Default::default() });
            Ok(rc)
        }
        async fn apply_status(
            &self,
            _: &str,
            _: &ClaimRef,
            _: &[k8s_openapi::api::resource::v1::AllocatedDeviceStatus],
        ) -> Result<(), super::super::claim_api::StatusRefused> {
            Ok(())
        }
    }

    /// Writes a claim "spec" file in `cdi` on prepare, as the real preparer does.
    struct SpecPreparer {
        cdi: std::path::PathBuf,
        prepares: AtomicU32,
        boom: AtomicBool,
    }
    #[async_trait::async_trait]
    impl ClaimPreparer for SpecPreparer {
        async fn prepare(&self, claim: &ClaimRef, _: &Allocation) -> Result<PreparedClaim, DraError> {
            assert!(!self.boom.load(Ordering::SeqCst), "prepared again although nothing was lost");
            self.prepares.fetch_add(1, Ordering::SeqCst);
            std::fs::write(self.cdi.join(&claim.uid), b"spec").unwrap();
            Ok(PreparedClaim::devices(vec![PreparedDevice {
                request_names: vec!["gpu".into()],
                pool_name: "node-a".into(),
                device_name: "gpu-0".into(),
                cdi_device_ids: vec![format!("devplug.io/claim={}-gpu-0", claim.uid)],
                share_id: None,
            }]))
        }
        fn intact(&self, claim: &ClaimRef) -> bool {
            self.cdi.join(&claim.uid).exists()
        }
        async fn unprepare(&self, _: &ClaimRef) -> Result<(), DraError> {
            Ok(())
        }
    }

    /// A reboot empties `/var/run/cdi` but not the checkpoint under `/var/lib/kubelet`: a claim
    /// recorded in another boot, or whose spec is gone, is prepared again (same CDI IDs) instead
    /// of answered from the record; a claim of this boot with its spec in place is answered from
    /// it.
    #[tokio::test]
    async fn a_claim_prepared_before_a_reboot_is_prepared_again() {
        let dir = tempfile::tempdir().unwrap();
        let (state, cdi) = (dir.path().join("state"), dir.path().join("cdi"));
        std::fs::create_dir_all(&cdi).unwrap();
        let preparer =
            Arc::new(SpecPreparer { cdi: cdi.clone(), prepares: AtomicU32::new(0), boom: AtomicBool::new(false) });
        let plugin = |boot: &str| {
            let checkpoint = Checkpoint::open_in_boot(&state, boot).unwrap();
            DraPlugin::new("gpu.devplug.io", preparer.clone(), Arc::new(Allocated), checkpoint, Arc::default())
        };
        let claim = ClaimRef { namespace: "ml".into(), uid: "uid-train".into(), name: "train".into() };
        let answer = plugin("boot-a").prepare(vec![claim.clone()]).await.remove("uid-train").unwrap().unwrap();
        // Same boot, spec in place: from the record.
        preparer.boom.store(true, Ordering::SeqCst);
        let same = plugin("boot-a").prepare(vec![claim.clone()]).await.remove("uid-train").unwrap().unwrap();
        assert_eq!(same, answer);
        preparer.boom.store(false, Ordering::SeqCst);
        // The machine reboots: /var/run/cdi is empty, the checkpoint is from boot-a.
        std::fs::remove_dir_all(&cdi).unwrap();
        std::fs::create_dir_all(&cdi).unwrap();
        let again = plugin("boot-b").prepare(vec![claim.clone()]).await.remove("uid-train").unwrap().unwrap();
        assert_eq!(again, answer, "the same CDI IDs");
        assert!(cdi.join("uid-train").exists(), "the spec is back");
        assert_eq!(preparer.prepares.load(Ordering::SeqCst), 2);
        // Recorded in boot-b now: answered from the record again.
        preparer.boom.store(true, Ordering::SeqCst);
        let later = plugin("boot-b");
        assert_eq!(later.prepare(vec![claim.clone()]).await.remove("uid-train").unwrap().unwrap(), answer);
        // A spec deleted under devplug in the same boot is written again too.
        preparer.boom.store(false, Ordering::SeqCst);
        std::fs::remove_file(cdi.join("uid-train")).unwrap();
        later.prepare(vec![claim]).await.remove("uid-train").unwrap().unwrap();
        assert!(cdi.join("uid-train").exists());
    }

    /// A claim the API server cannot give is its entry's error, of class `api`, counted on the
    /// board, and the preparer is not asked.
    #[tokio::test]
    async fn an_unreachable_api_server_fails_the_claim_with_its_cause() {
        struct Down;
        #[async_trait::async_trait]
        impl ClaimApi for Down {
            async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, DraError> {
                let status = kube::core::Status::failure("connection refused", "ServiceUnavailable").with_code(503);
                Err(DraError::Api {
                    doing: format!("reading ResourceClaim {namespace}/{name}"),
                    source: Arc::new(kube::Error::Api(status.boxed())),
                })
            }
            async fn apply_status(
                &self,
                _: &str,
                _: &ClaimRef,
                _: &[k8s_openapi::api::resource::v1::AllocatedDeviceStatus],
            ) -> Result<(), super::super::claim_api::StatusRefused> {
                Ok(())
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let preparer = Arc::new(SpecPreparer {
            cdi: dir.path().to_owned(),
            prepares: AtomicU32::new(0),
            boom: AtomicBool::new(true),
        });
        let board = Arc::new(ClaimBoard::default());
        let checkpoint = Checkpoint::open(&dir.path().join("state")).unwrap();
        let plugin = DraPlugin::new("gpu.devplug.io", preparer, Arc::new(Down), checkpoint, board.clone());
        let claim = ClaimRef { namespace: "ml".into(), uid: "uid-train".into(), name: "train".into() };
        let e = plugin.prepare(vec![claim]).await.remove("uid-train").unwrap().unwrap_err();
        assert_eq!(e.class(), crate::dra::error::ErrorClass::Api);
        let text = kubelet_text(&e);
        assert!(text.starts_with("reading ResourceClaim ml/train: ") && text.contains("connection refused"), "{text}");
        assert_eq!(board.errors()[&("gpu.devplug.io".to_owned(), "api")], 1);
    }
}
