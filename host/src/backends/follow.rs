//! Following the backends' references: at start the cached version of each is served at once,
//! then every `registry.poll` each followed tag is resolved again; a new digest is pulled,
//! checked (blob digests, the manifest, the signature policy) and cached, and becomes that
//! backend's source. A digest that fails any step is remembered and not pulled again; the
//! version serving stays. What each reference is doing is kept for `/status` and `/metrics`.

use crate::sync::Locked;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use oci_client::Reference;
use p256::ecdsa::VerifyingKey;
use serde::Serialize;

use super::{BackendSettings, BackendSource};
use crate::oci::artifact::{self, Pulled};
use crate::oci::cache::Cache;
use crate::oci::settings::RegistrySettings;
use crate::oci::signature::{self, SignatureState};

/// One reference as `devplug status` shows it.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
#[serde(default)]
pub struct SourceStatus {
    pub backend: String,
    pub reference: String,
    /// Pinned by digest (never re-resolved) rather than a followed tag.
    pub pinned: bool,
    /// The digest of the version offered to the host.
    pub digest: Option<String>,
    pub signature: SignatureState,
    /// The version offered came from the node's cache (the registry has not answered since start).
    pub from_cache: bool,
    /// Unix seconds of the last successful look at the registry.
    pub last_check: Option<u64>,
    /// Looks at the registry so far, successful or not.
    pub checks: u64,
    /// Why the last look, pull or verification failed (cleared by the next good look).
    pub last_error: Option<String>,
    /// Looks that failed in a row (logged once when the failure starts or changes, counted
    /// here after that).
    pub failing_checks: u64,
    /// Why the host refused the version on offer (its init or first discover failed); stays
    /// until another version is offered.
    pub swap_error: Option<String>,
    /// With `registry.operator_key`: `signed` when the version on offer came with native code
    /// the operator's key signed, else why it is compiled on the node.
    pub native: Option<String>,
}

/// The statuses, shared with the HTTP endpoints and the swap path.
#[derive(Default)]
pub struct Statuses(Mutex<BTreeMap<String, SourceStatus>>);

impl Statuses {
    pub fn all(&self) -> Vec<SourceStatus> {
        self.0.locked().values().cloned().collect()
    }

    fn update(&self, backend: &str, f: impl FnOnce(&mut SourceStatus)) {
        if let Some(s) = self.0.locked().get_mut(backend) {
            f(s);
        }
    }

    /// The registry answered, with a version that is refused (`why`).
    fn looked_and_refused(&self, backend: &str, digest: &str, why: &str) {
        self.update(backend, |s| {
            s.last_check = Some(now());
            s.last_error = Some(format!("{digest} refused: {why}"));
        });
    }

    /// The host refused the version offered (its init or first discover failed).
    pub fn refused(&self, backend: &str, why: &str) {
        self.update(backend, |s| s.swap_error = Some(format!("not swapped in: {why}")));
    }
}

struct Entry {
    backend: String,
    reference: Reference,
    text: String,
    current: Option<BackendSource>,
    /// Digests that failed a check for good (a blob that does not match its digest, a manifest
    /// that does not parse), with why: not pulled again.
    refused: BTreeMap<String, String>,
    /// Digests whose signature did not verify, with why, so each is logged once. Not final: the
    /// signature is looked at again every poll, since signing usually follows the push (cosign
    /// pushes the `.sig` after the image) and a missing signature may arrive.
    unsigned: BTreeMap<String, String>,
}

/// What a node needs to take native code from the registry: the operator's key and the
/// fingerprint of the engine the code must be for.
struct NativeTrust {
    key: VerifyingKey,
    fingerprint: String,
}

pub struct Follower {
    settings: RegistrySettings,
    fetcher: crate::oci::fetch::Fetcher,
    key: Option<VerifyingKey>,
    native: Option<NativeTrust>,
    cache: Option<Cache>,
    entries: Vec<Entry>,
    statuses: Arc<Statuses>,
}

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

impl Follower {
    /// A follower for every enabled backend with an `image`, or `None` when there is none;
    /// verified versions are cached in `cache_dir`.
    pub fn new(
        backends: &BTreeMap<String, BackendSettings>,
        registry: &RegistrySettings,
        cache_dir: Option<&std::path::Path>,
    ) -> anyhow::Result<Option<Follower>> {
        let mut entries = Vec::new();
        let statuses = Arc::new(Statuses::default());
        for (name, b) in backends {
            let Some(image) = &b.image else { continue };
            if !b.enabled {
                continue;
            }
            let reference: Reference =
                image.parse().map_err(|e| anyhow::anyhow!("backends.{name}.image {image:?}: {e}"))?;
            statuses.0.locked().insert(
                name.clone(),
                SourceStatus {
                    backend: name.clone(),
                    reference: image.clone(),
                    pinned: reference.digest().is_some(),
                    digest: None,
                    signature: SignatureState::NotRequired,
                    from_cache: false,
                    last_check: None,
                    checks: 0,
                    last_error: None,
                    failing_checks: 0,
                    swap_error: None,
                    native: None,
                },
            );
            entries.push(Entry {
                backend: name.clone(),
                reference,
                text: image.clone(),
                current: None,
                refused: BTreeMap::new(),
                unsigned: BTreeMap::new(),
            });
        }
        if entries.is_empty() {
            return Ok(None);
        }
        let settings = registry.clone();
        let key = settings.public_key.as_deref().map(signature::load_public_key).transpose()?;
        let native = match settings.operator_key.as_deref() {
            Some(path) => Some(NativeTrust {
                key: signature::load_public_key(path).map_err(|e| anyhow::anyhow!("registry.operator_key: {e:#}"))?,
                fingerprint: crate::runtime::native::fingerprint()?,
            }),
            None => None,
        };
        let fetcher = settings.fetcher()?;
        let cache = cache_dir.map(Cache::new);
        Ok(Some(Follower { settings, fetcher, key, native, cache, entries, statuses }))
    }

    pub fn statuses(&self) -> Arc<Statuses> {
        self.statuses.clone()
    }

    /// The version of every reference on offer.
    pub fn sources(&self) -> Vec<BackendSource> {
        self.entries.iter().filter_map(|e| e.current.clone()).collect()
    }

    /// Serve what the cache has, then look at the registry once.
    pub async fn start(&mut self) {
        for i in 0..self.entries.len() {
            let Some(cache) = &self.cache else { break };
            let e = &self.entries[i];
            match cache.load(&e.backend, &e.text) {
                Ok(Some((_, pulled))) => {
                    let state = if self.key.is_some() { SignatureState::Verified } else { SignatureState::NotRequired };
                    if let Err(why) = self.offer(i, pulled, state, true) {
                        tracing::warn!(backend = %self.entries[i].backend, "cached version unusable: {why}");
                    }
                }
                Ok(None) => {}
                Err(err) => tracing::warn!(backend = %e.backend, "cache: {err:#}"),
            }
        }
        self.check_all().await;
    }

    /// Look at every reference once; true when any offered version changed.
    pub(crate) async fn check_all(&mut self) -> bool {
        let mut changed = false;
        for i in 0..self.entries.len() {
            let e = &self.entries[i];
            let span = tracing::info_span!("registry", backend = %e.backend, reference = %e.text);
            let timeout = self.settings.timeout;
            let outcome = tokio::time::timeout(timeout, self.check(i)).await;
            let _g = span.enter();
            match outcome {
                Ok(Ok(c)) => changed |= c,
                Ok(Err(err)) => self.failed(i, format!("{err:#}")),
                Err(_) => self.failed(i, format!("the registry took longer than {timeout:?}")),
            }
            self.statuses.update(&self.entries[i].backend, |s| s.checks += 1);
        }
        changed
    }

    fn failed(&mut self, i: usize, why: String) {
        let e = &self.entries[i];
        let serving = match &e.current {
            Some(s) => format!("serving {}", origin_digest(s)),
            None => "nothing to serve yet".to_owned(),
        };
        let (from_cache, same) = self
            .statuses
            .0
            .locked()
            .get(&e.backend)
            .map_or((false, false), |s| (s.from_cache, s.last_error.as_deref() == Some(why.as_str())));
        // An outage is logged when it starts or its reason changes; the repeats are counted.
        if !same {
            let note = if from_cache { " from the node's cache" } else { "" };
            tracing::warn!(backend = %e.backend, reference = %e.text, "registry check failed ({serving}{note}): {why}; logged again only if the reason changes");
        }
        self.statuses.update(&e.backend, |s| {
            s.last_error = Some(why);
            s.failing_checks += 1;
        });
    }

    async fn check(&mut self, i: usize) -> anyhow::Result<bool> {
        let e = &self.entries[i];
        let auth = self.settings.auth_for(&e.reference)?;
        let current = e.current.as_ref().map(origin_digest);
        if e.reference.digest().is_some() && current.is_some() {
            // Pinned and already here: a digest never changes.
            self.statuses.update(&e.backend, |s| s.last_check = Some(now()));
            return Ok(false);
        }
        let digest = artifact::resolve(&self.fetcher, &auth, &e.reference).await?;
        if current.as_deref() == Some(digest.as_str()) {
            let backend = e.backend.clone();
            self.statuses.update(&e.backend, |s| {
                if s.last_error.take().is_some() {
                    tracing::info!(backend = %backend, failed = s.failing_checks, "registry check works again");
                }
                s.failing_checks = 0;
                s.last_check = Some(now());
                s.from_cache = false;
            });
            return Ok(false);
        }
        if let Some(why) = e.refused.get(&digest) {
            self.statuses.looked_and_refused(&e.backend, &digest, why);
            return Ok(false);
        }
        let pinned = artifact::pinned(&e.reference, &digest);
        let state = signature::verify(&self.fetcher, &auth, &pinned, &digest, self.key.as_ref()).await?;
        if !state.accepted() {
            let why = format!("{state} (registry.public_key requires a valid signature)");
            let e = &mut self.entries[i];
            if e.unsigned.get(&digest) != Some(&why) {
                tracing::error!(backend = %e.backend, reference = %e.text, %digest, "refused: {why}; the version serving stays (the signature is looked for again every poll)");
                e.unsigned.insert(digest.clone(), why.clone());
            }
            self.statuses.looked_and_refused(&e.backend, &digest, &why);
            return Ok(false);
        }
        // Verified content already on the node (a tag moved back) is not downloaded again.
        let cached = self.cache.as_ref().and_then(|c| c.load_digest(&digest));
        let was_cached = cached.is_some();
        let fetched = match cached {
            Some(p) => Ok(p),
            None => artifact::pull(&self.fetcher, &auth, &pinned, &e.backend).await,
        };
        let pulled = match fetched {
            Ok(p) => p,
            Err(err) => {
                // A blob that does not match its digest is the artifact's fault, not the network's:
                // remember it. Anything else (a timeout, a 500) is tried again next poll.
                if artifact::is_digest_mismatch(&err) {
                    self.refuse(i, &digest, &format!("{err:#}"), state);
                    return Ok(false);
                }
                return Err(err);
            }
        };
        let backend = self.entries[i].backend.clone();
        let serving_key = self.entries[i].current.as_ref().map(|s| s.key.clone());
        let signed = self.signed_native(i, &auth, &pinned, &pulled).await;
        if let Err(why) = self.offer(i, pulled.clone(), state.clone(), false) {
            self.refuse(i, &digest, &why, state);
            return Ok(false);
        }
        if let Some(e) = self.entries[i].current.as_mut() {
            e.signed = signed;
        }
        let reference = &self.entries[i].text;
        let stored = match &self.cache {
            Some(cache) if was_cached => cache.point(&backend, reference, &digest),
            Some(cache) => cache.store(&backend, reference, &pulled),
            None => Ok(()),
        };
        if let Err(err) = stored {
            tracing::warn!(backend = %backend, "could not cache {digest}: {err:#}; a restart without the registry will not have it");
        }
        // Pushed again with the same component and manifest (another tool's manifest, new
        // annotations): a new digest, the same backend. Nothing to swap, and not news.
        if serving_key.is_some() && serving_key == self.entries[i].current.as_ref().map(|s| s.key.clone()) {
            tracing::info!(backend = %backend, %digest, "the reference now resolves to a new digest holding the serving version's component and manifest; nothing changes");
            return Ok(false);
        }
        if was_cached {
            // The tag points at a version this node pulled and verified before (moved back): no
            // download, and not new.
            tracing::info!(backend = %backend, %digest, layout = pulled.layout, signature = state.label(), "the tag points at a version already in the node's cache; loading it");
        } else {
            tracing::info!(backend = %backend, %digest, layout = pulled.layout, signature = state.label(), "pulled a new version");
        }
        Ok(true)
    }

    /// With an operator key, the native code the registry holds for `pulled` and this node's
    /// engine, verified; else nothing, and (when a key is set) one line saying why the node
    /// compiles it. Recorded in the source's status either way.
    async fn signed_native(
        &self,
        i: usize,
        auth: &oci_client::secrets::RegistryAuth,
        pinned: &Reference,
        pulled: &Pulled,
    ) -> crate::backends::source::SignedNative {
        let Some(trust) = &self.native else { return Default::default() };
        let e = &self.entries[i];
        let component = format!("sha256:{}", hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&pulled.component)));
        let wanted = crate::oci::native::Wanted {
            subject: &pulled.digest,
            component: &component,
            fingerprint: &trust.fingerprint,
        };
        // Into an unnamed file of the node's cache when there is one: tens of MB never held in
        // memory on their way to the compile cache.
        let scratch = self.cache.as_ref().and_then(|c| {
            c.scratch().inspect_err(|err| tracing::warn!(backend = %e.backend, "no scratch file in the cache for native code ({err:#}); reading it into memory")).ok()
        });
        let found = crate::oci::native::fetch(&self.fetcher, auth, pinned, wanted, &trust.key, scratch).await;
        let (said, code) = match found {
            Ok(code) => {
                tracing::info!(backend = %e.backend, digest = %pulled.digest, bytes = code.len(), "operator-signed native code found; it is loaded, not compiled");
                ("signed".to_owned(), crate::backends::source::SignedNative::new(code))
            }
            Err(why @ crate::oci::native::NoNative::Missing { .. }) => {
                tracing::info!(backend = %e.backend, digest = %pulled.digest, "{why}; compiling it on this node");
                (why.to_string(), Default::default())
            }
            Err(why) => {
                tracing::warn!(backend = %e.backend, digest = %pulled.digest, "{why}; compiling it on this node");
                (why.to_string(), Default::default())
            }
        };
        self.statuses.update(&e.backend, |s| s.native = Some(said));
        code
    }

    fn refuse(&mut self, i: usize, digest: &str, why: &str, state: SignatureState) {
        let e = &mut self.entries[i];
        tracing::error!(backend = %e.backend, reference = %e.text, %digest, "refused: {why}; the version serving stays");
        e.refused.insert(digest.to_owned(), why.to_owned());
        self.statuses.looked_and_refused(&e.backend, digest, why);
        self.statuses.update(&e.backend, |s| {
            if s.digest.is_none() {
                s.signature = state;
            }
        });
    }

    /// Make `pulled` the version offered for entry `i`.
    fn offer(&mut self, i: usize, pulled: Pulled, state: SignatureState, from_cache: bool) -> Result<(), String> {
        let e = &mut self.entries[i];
        let digest = pulled.digest.clone();
        let src = BackendSource::from_registry(&e.backend, &e.text, pulled).map_err(|err| format!("{err:#}"))?;
        e.current = Some(src);
        if from_cache {
            tracing::info!(backend = %e.backend, reference = %e.text, %digest, "running from cache until the registry answers");
        }
        self.statuses.update(&e.backend, |s| {
            s.digest = Some(digest);
            s.signature = state;
            s.from_cache = from_cache;
            s.swap_error = None;
            if !from_cache {
                s.last_check = Some(now());
                s.last_error = None;
                s.failing_checks = 0;
            }
        });
        Ok(())
    }

    /// Check every `poll` until the receiver is gone, sending the sources whenever they change.
    pub fn spawn(mut self, tx: tokio::sync::watch::Sender<Vec<BackendSource>>) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let poll: Duration = self.settings.poll;
            loop {
                tokio::select! {
                    _ = tx.closed() => return,
                    _ = tokio::time::sleep(poll) => {}
                }
                if self.check_all().await && tx.send(self.sources()).is_err() {
                    return;
                }
            }
        })
    }
}

fn origin_digest(s: &BackendSource) -> String {
    match &s.origin {
        super::Origin::Registry { digest, .. } => digest.clone(),
        _ => String::new(),
    }
}
