//! The `pluginregistration.Registration` service that kubelet's plugin watcher calls on a socket
//! in `plugins_registry` (device plugins in watcher mode, DRA drivers always), and the record of
//! what kubelet did with it.
//!
//! Kubelet's watcher sees the socket appear, asks `GetInfo`, validates the answer with the
//! handler of its `type`, and reports through `NotifyRegistrationStatus` on the same connection.
//! Each step lands in a [`RegistrationState`] that `/readyz`, `/status` and the log read: a
//! registration that kubelet never completes is an ERROR naming the socket, not silence.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tonic::{Request, Response, Status};

use crate::proto::pluginregistration as pr;
use crate::sync::Locked;

/// Where a registration stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Not serving yet (starting, or kubelet's directory is not there).
    Starting,
    /// The socket is served; kubelet has not called yet.
    Serving,
    /// Kubelet asked `GetInfo`; its verdict has not come.
    InfoAsked,
    Registered,
    /// Kubelet refused, with its reason.
    Refused(String),
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stage::Starting => f.write_str("Starting"),
            Stage::Serving => f.write_str("WaitingForKubelet"),
            Stage::InfoAsked => f.write_str("InfoAsked"),
            Stage::Registered => f.write_str("Registered"),
            Stage::Refused(why) => write!(f, "Refused: {}", crate::gate::clip_to(why, 512)),
        }
    }
}

/// How kubelet finds a registration: the two ways a device plugin registers (DRA drivers
/// always use the watcher). Shown in `/status` and in the log as [`Mode::as_str`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `Register` on `kubelet.sock` in the device-plugins directory.
    KubeletSocket,
    /// A socket in `plugins_registry` that kubelet's plugin watcher finds by itself.
    PluginWatcher,
}

impl Mode {
    /// The form `/status` shows (a wire format: keep it stable).
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::KubeletSocket => "kubelet-socket",
            Mode::PluginWatcher => "plugin-watcher",
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What kubelet did with one registration socket.
#[derive(Clone, Debug)]
pub struct RegistrationState {
    /// What registers: `resource nvidia.com/gpu`, `DRA driver gpu.devplug.io`.
    pub subject: String,
    pub mode: Mode,
    pub socket: PathBuf,
    pub stage: Stage,
    /// When the stage last changed.
    pub since: Instant,
    pub info_asked: u64,
    pub registered: u64,
}

/// One registration as `/status` shows it (and `devplug status` reads it).
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct RegistrationStatus {
    pub subject: String,
    /// [`Mode::as_str`].
    pub mode: String,
    pub socket: String,
    pub state: String,
    pub for_seconds: u64,
    pub info_asked: u64,
    pub registered: u64,
    /// Why kubelet is late, once it is.
    pub overdue: Option<String>,
}

impl RegistrationState {
    pub fn new(subject: String, mode: Mode, socket: PathBuf) -> Self {
        RegistrationState {
            subject,
            mode,
            socket,
            stage: Stage::Starting,
            since: Instant::now(),
            info_asked: 0,
            registered: 0,
        }
    }

    /// Move to `stage` (a repeated stage keeps its `since`).
    pub(crate) fn enter(&mut self, stage: Stage) {
        if self.stage != stage {
            self.stage = stage;
            self.since = Instant::now();
        }
    }

    /// Why kubelet has not completed this registration although `after` has passed since the
    /// socket was served, if so: the socket, the mode, and what to check.
    pub(crate) fn overdue(&self, after: Duration) -> Option<String> {
        if !matches!(self.stage, Stage::Serving | Stage::InfoAsked) || self.since.elapsed() < after {
            return None;
        }
        let what = match (self.mode, &self.stage) {
            (_, Stage::InfoAsked) => {
                "kubelet asked GetInfo but never reported NotifyRegistrationStatus: check kubelet's log for this plugin (its handler may have failed to dial the endpoint)"
            }
            (Mode::PluginWatcher, _) => {
                "kubelet's plugin watcher never called: check that this directory is kubelet's plugins_registry (--root-dir) and is mounted into the pod, and that kubelet runs"
            }
            _ => {
                "kubelet never answered: check that kubelet runs and its device-plugins directory is mounted into the pod"
            }
        };
        Some(format!(
            "{}: {} {} not registered {:.0?} after {} was served: {what}",
            self.subject,
            self.mode,
            match self.stage {
                Stage::InfoAsked => "asked but",
                _ => "still",
            },
            self.since.elapsed(),
            self.socket.display()
        ))
    }
}

/// Log one ERROR when `state` stays unregistered for `after` after it was served or GetInfo was
/// asked (once per such stage, however often the state is touched), until the sender is gone.
pub(crate) async fn alarm(mut state: watch::Receiver<RegistrationState>, after: Duration) {
    let mut told: Option<Instant> = None;
    loop {
        let since = {
            let s = state.borrow_and_update();
            matches!(s.stage, Stage::Serving | Stage::InfoAsked).then_some(s.since).filter(|t| Some(*t) != told)
        };
        let deadline = since.map(|s| s + after);
        tokio::select! {
            changed = state.changed() => if changed.is_err() { return },
            _ = async { match deadline { Some(d) => tokio::time::sleep_until(d).await, None => std::future::pending().await } } => {
                let why = state.borrow().overdue(after);
                if let Some(why) = why {
                    tracing::error!(socket = %state.borrow().socket.display(), "{why}");
                }
                told = since;
            }
        }
    }
}

/// Every registration of this process, by subject, for `/readyz` and `/status`.
pub struct Board {
    entries: Mutex<std::collections::BTreeMap<String, watch::Receiver<RegistrationState>>>,
    /// How long kubelet may take before a registration is overdue.
    pub patience: Duration,
}

impl Board {
    pub fn new(patience: Duration) -> Self {
        Board { entries: Mutex::default(), patience }
    }

    /// Every registration as `/status` shows it.
    pub fn statuses(&self) -> Vec<RegistrationStatus> {
        self.all()
            .iter()
            .map(|r| RegistrationStatus {
                subject: r.subject.clone(),
                mode: r.mode.as_str().to_owned(),
                socket: r.socket.display().to_string(),
                state: r.stage.to_string(),
                for_seconds: r.since.elapsed().as_secs(),
                info_asked: r.info_asked,
                registered: r.registered,
                overdue: r.overdue(self.patience),
            })
            .collect()
    }

    /// Show `state` (replacing an entry with the same subject).
    pub fn show(&self, state: watch::Receiver<RegistrationState>) {
        let subject = state.borrow().subject.clone();
        self.entries.locked().insert(subject, state);
    }

    /// Stop showing `subject`.
    pub fn hide(&self, subject: &str) {
        self.entries.locked().remove(subject);
    }

    /// Every registration now, by subject.
    pub fn all(&self) -> Vec<RegistrationState> {
        self.entries.locked().values().map(|s| s.borrow().clone()).collect()
    }
}

/// The service on one registration socket.
pub struct Registration {
    info: pr::PluginInfo,
    state: watch::Sender<RegistrationState>,
    /// Called after each report of success, with the count so far (first is 1).
    on_registered: Option<Arc<dyn Fn(u64) + Send + Sync>>,
}

impl Registration {
    pub fn new(info: pr::PluginInfo, state: watch::Sender<RegistrationState>) -> Self {
        Registration { info, state, on_registered: None }
    }

    pub(crate) fn on_registered(mut self, f: impl Fn(u64) + Send + Sync + 'static) -> Self {
        self.on_registered = Some(Arc::new(f));
        self
    }

    /// The tonic service.
    pub fn service(self) -> pr::registration_server::RegistrationServer<Self> {
        pr::registration_server::RegistrationServer::new(self)
            .max_decoding_message_size(super::serve::MAX_REGISTRATION_REQUEST)
    }
}

#[tonic::async_trait]
impl pr::registration_server::Registration for Registration {
    async fn get_info(&self, _: Request<pr::InfoRequest>) -> Result<Response<pr::PluginInfo>, Status> {
        self.state.send_modify(|s| {
            s.info_asked += 1;
            if s.stage != Stage::Registered {
                s.enter(Stage::InfoAsked);
            }
        });
        tracing::debug!(plugin = %self.info.name, "kubelet's plugin watcher asked GetInfo");
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        req: Request<pr::RegistrationStatus>,
    ) -> Result<Response<pr::RegistrationStatusResponse>, Status> {
        let s = req.into_inner();
        let subject = self.state.borrow().subject.clone();
        if s.plugin_registered {
            let mut count = 0;
            self.state.send_modify(|st| {
                st.registered += 1;
                count = st.registered;
                st.enter(Stage::Registered);
            });
            tracing::info!(plugin = %self.info.name, mode = %Mode::PluginWatcher, "{subject} registered with kubelet");
            if let Some(f) = &self.on_registered {
                f(count);
            }
        } else {
            let why = crate::gate::clip_to(&s.error, 1024);
            tracing::error!(plugin = %self.info.name, "kubelet refused {subject}: {why}");
            self.state.send_modify(|st| st.enter(Stage::Refused(s.error)));
        }
        Ok(Response::new(pr::RegistrationStatusResponse {}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_registration_kubelet_never_completes_is_overdue_naming_the_socket() {
        let mut s =
            RegistrationState::new("DRA driver x.devplug.io".into(), Mode::PluginWatcher, "/p/x-reg.sock".into());
        s.enter(Stage::Serving);
        assert_eq!(s.overdue(Duration::from_secs(30)), None);
        tokio::time::advance(Duration::from_secs(31)).await;
        let why = s.overdue(Duration::from_secs(30)).expect("overdue");
        assert!(
            why.contains("/p/x-reg.sock") && why.contains("plugin-watcher") && why.contains("plugins_registry"),
            "{why}"
        );
        s.enter(Stage::Registered);
        assert_eq!(s.overdue(Duration::from_secs(30)), None);
    }

    #[tokio::test(start_paused = true)]
    async fn the_alarm_fires_once_per_stage_however_often_the_state_is_touched() {
        let (tx, rx) =
            watch::channel(RegistrationState::new("resource a.io/b".into(), Mode::PluginWatcher, "/p/b.sock".into()));
        tx.send_modify(|s| s.enter(Stage::Serving));
        let alarm = tokio::spawn(alarm(rx, Duration::from_secs(30)));
        tokio::time::advance(Duration::from_secs(31)).await;
        tokio::task::yield_now().await;
        // Touching the state (a GetInfo count) without a new stage: no second alarm, no spin.
        for _ in 0..3 {
            tx.send_modify(|s| s.info_asked += 0);
            tokio::time::advance(Duration::from_secs(31)).await;
            tokio::task::yield_now().await;
        }
        assert!(!alarm.is_finished());
        drop(tx);
        tokio::time::timeout(Duration::from_secs(1), alarm).await.expect("the alarm ends with its sender").unwrap();
    }
}
