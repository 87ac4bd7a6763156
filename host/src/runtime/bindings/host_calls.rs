//! The host side of the backend's imports (`sysfs`, `devfs`, `procfs`, `log`), implemented once
//! for every WIT version: each version's module only forwards its generated trait methods here.
//! The types are the ones unchanged since 0.1.0 ([`super::wit`]).

use super::wit::FsError;
use crate::gate::clip;
use crate::runtime::jail::{self, Cost, Jail, MAX_BATCH, NodeStat, OpenDirs};
use crate::runtime::limits::Meter;
use crate::runtime::state::{HostState, Sandbox};

/// Directory entries a single `devfs.glob` may look at.
const GLOB_BUDGET: usize = 100_000;
/// Nodes a single `devfs.glob` may return.
const MAX_GLOB_RESULTS: usize = 4096;
/// Characters of one guest log message kept.
const MAX_LOG_MESSAGE: usize = 1024;

/// The answer of one capability call: the outer error traps the backend, the inner one is
/// returned to it.
pub type Answer<T> = wasmtime::Result<Result<T, FsError>>;

pub(crate) fn fs_error(e: jail::FsError) -> FsError {
    match e {
        jail::FsError::NotFound => FsError::NotFound,
        jail::FsError::Denied(s) => FsError::Denied(clip(&s).into_owned()),
        jail::FsError::InvalidPath(s) => FsError::InvalidPath(clip(&s).into_owned()),
        jail::FsError::Io(s) => FsError::Io(clip(&s).into_owned()),
    }
}

/// Which of the backend's views a call reads.
#[derive(Clone, Copy)]
pub enum View {
    Sysfs,
    Procfs,
}

impl HostState {
    fn jail(&self, view: View) -> &Jail {
        match view {
            View::Sysfs => &self.sandbox.sysfs,
            View::Procfs => &self.sandbox.procfs,
        }
    }

    /// Run a capability call: charged to the call's [`Meter`] (the path it sent and the answer;
    /// nothing is done once the meter is spent), a refusal is logged once per path, and a panic
    /// inside the host (a devplug bug a backend found) becomes a trap of this backend, counted as
    /// its fault, instead of unwinding through wasmtime.
    fn checked<T: Cost>(
        &mut self,
        call: &str,
        path: &str,
        f: impl FnOnce(&HostState) -> Result<T, jail::FsError>,
    ) -> Answer<T> {
        self.meter.charge(path.len());
        if let Err(why) = self.meter.check() {
            return Ok(Err(FsError::Io(why)));
        }
        let r = host_call(&self.sandbox, call, || f(self))?;
        self.meter.charge(r.cost());
        Ok(self.answer(call, path, r))
    }

    /// The jail a call (`sysfs.read`, `devfs.stat`, `procfs.list-dir`) looks through.
    fn view_of(&self, call: &str) -> Option<&Jail> {
        match call.split('.').next() {
            Some("sysfs") => Some(&self.sandbox.sysfs),
            Some("procfs") => Some(&self.sandbox.procfs),
            Some("devfs") => Some(&self.sandbox.dev),
            _ => None,
        }
    }

    /// A jail's answer as the backend sees it, a refusal logged once per path. A learning run
    /// records only calls that returned data (a read that read, a listing that listed): a path
    /// the backend merely asked for (`**`, NotFound) is no evidence it needs anything.
    fn answer<T>(&self, call: &str, path: &str, r: Result<T, jail::FsError>) -> Result<T, FsError> {
        match &r {
            Err(e @ (jail::FsError::Denied(_) | jail::FsError::InvalidPath(_))) => {
                // A malformed path is a fault of the backend's wherever it runs; a denied one
                // lost it something only where the path exists.
                let present =
                    !matches!(e, jail::FsError::Denied(_)) || self.view_of(call).is_some_and(|j| j.present(path));
                self.sandbox.refusals.refused(&self.sandbox, call, path, e, present);
            }
            Ok(_) => {
                if let Some(learned) = &self.sandbox.learn {
                    learned.record(call, path);
                }
            }
            Err(_) => {}
        }
        r.map_err(fs_error)
    }

    pub fn read(&mut self, view: View, call: &str, path: &str) -> Answer<String> {
        self.checked(call, path, |s| s.jail(view).read(path))
    }

    pub fn list_dir(&mut self, view: View, call: &str, path: &str) -> Answer<Vec<String>> {
        let r = self.checked(call, path, |s| s.jail(view).list(path));
        self.report_hidden(view, call);
        r
    }

    pub fn read_link(&mut self, path: &str) -> Answer<String> {
        self.checked("sysfs.read-link", path, |s| s.sandbox.sysfs.read_link(path))
    }

    pub fn canonical(&mut self, path: &str) -> Answer<String> {
        self.checked("sysfs.canonical", path, |s| s.sandbox.sysfs.resolve(path, true).map(|r| r.canonical))
    }

    /// A batched call: one answer per path, in order, each charged to the call's [`Meter`]; once
    /// it is spent the remaining paths get its error. More than [`MAX_BATCH`] paths is an error
    /// the backend gets back (for every path), not a trap.
    pub fn many<T>(
        &mut self,
        call: &str,
        paths: &[String],
        f: impl FnOnce(&Jail, &[String], &mut OpenDirs, &mut Meter) -> Vec<Result<T, jail::FsError>>,
    ) -> wasmtime::Result<Vec<Result<T, FsError>>> {
        if paths.len() > MAX_BATCH {
            let e = || FsError::Io(format!("{call} takes at most {MAX_BATCH} paths, got {}", paths.len()));
            return Ok(paths.iter().map(|_| Err(e())).collect());
        }
        self.meter.charge(paths.iter().map(String::cost).sum());
        let (jail, dirs, meter) = (&self.sandbox.sysfs, &mut self.open_dirs, &mut self.meter);
        let answers = host_call(&self.sandbox, call, || f(jail, paths, dirs, meter))?;
        let out = answers.into_iter().zip(paths).map(|(r, p)| self.answer(call, p, r)).collect();
        self.report_hidden(View::Sysfs, call);
        Ok(out)
    }

    /// Entries a listing left out because they are not granted are refusals too: each is
    /// logged once, like a refused read, and counted.
    fn report_hidden(&self, view: View, call: &str) {
        let (hidden, _) = self.jail(view).take_hidden();
        for path in hidden {
            let e = jail::FsError::Denied(format!("{path}: not granted (left out of the listing)"));
            self.sandbox.refusals.refused(&self.sandbox, call, &path, &e, true);
        }
    }

    pub(crate) fn dev_stat(&mut self, path: &str) -> Answer<NodeStat> {
        self.checked("devfs.stat", path, |s| s.sandbox.dev.stat_node(path))
    }

    pub(crate) fn dev_glob(&mut self, pattern: &str) -> Answer<Vec<(String, NodeStat)>> {
        let paths = match self.checked("devfs.glob", pattern, |s| s.sandbox.dev.glob(pattern, GLOB_BUDGET))? {
            Ok(p) => p,
            Err(e) => return Ok(Err(e)),
        };
        if paths.len() > MAX_GLOB_RESULTS {
            return Ok(Err(FsError::Io(format!("the pattern matches more than {MAX_GLOB_RESULTS} nodes"))));
        }
        // An entry that matched but resolves somewhere ungranted is left out (and logged once).
        let mut nodes = Vec::with_capacity(paths.len());
        for p in paths {
            match self.dev_stat(&p)? {
                Ok(n) => nodes.push((p, n)),
                Err(FsError::Io(why)) if self.meter.check().is_err() => return Ok(Err(FsError::Io(why))),
                Err(_) => {}
            }
        }
        Ok(Ok(nodes))
    }

    /// A guest log line, rate-limited per backend and clipped.
    pub fn guest_log(&self, level: tracing::Level, message: &str) {
        let backend = &*self.sandbox.backend;
        if !self.sandbox.log.admit(backend) {
            return;
        }
        let message = crate::gate::clip_to(message, MAX_LOG_MESSAGE);
        match level {
            tracing::Level::TRACE => tracing::trace!(backend, "{message}"),
            tracing::Level::DEBUG => tracing::debug!(backend, "{message}"),
            tracing::Level::INFO => tracing::info!(backend, "{message}"),
            tracing::Level::WARN => tracing::warn!(backend, "{message}"),
            tracing::Level::ERROR => tracing::error!(backend, "{message}"),
        }
    }
}

/// `f`, with a panic turned into an error that traps the calling backend.
fn host_call<T>(sandbox: &Sandbox, call: &str, f: impl FnOnce() -> T) -> wasmtime::Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".into());
        tracing::error!(backend = &*sandbox.backend, call, "host call panicked: {}", clip(&what));
        wasmtime::Error::msg(format!("host call {call} failed inside the host: {}", clip(&what)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::state::Roots;

    #[test]
    fn a_panic_in_a_host_call_becomes_an_error_not_an_unwind() {
        let caps = crate::runtime::caps::Capabilities::new(&Default::default(), &Default::default()).unwrap();
        let d = tempfile::tempdir().unwrap();
        let sb = Sandbox::new("x", &caps, &Roots::fixture(d.path()), 1 << 20);
        let e = host_call(&sb, "devfs.glob", || -> u32 { panic!("regex compilation shouldn't fail") }).unwrap_err();
        assert!(e.to_string().contains("devfs.glob failed inside the host"), "{e}");
        assert_eq!(host_call(&sb, "sysfs.read", || 7).unwrap(), 7);
    }

    #[test]
    fn a_batch_over_the_limit_is_refused_path_by_path_not_trapped() {
        let caps = crate::runtime::caps::Capabilities::new(&Default::default(), &Default::default()).unwrap();
        let d = tempfile::tempdir().unwrap();
        let mut state = HostState::new(Sandbox::new("x", &caps, &Roots::fixture(d.path()), 1 << 20));
        let paths = vec!["a".to_owned(); MAX_BATCH + 1];
        let answers = state.many("sysfs.read-many", &paths, Jail::read_many).unwrap();
        assert_eq!(answers.len(), MAX_BATCH + 1);
        assert!(matches!(&answers[0], Err(FsError::Io(m)) if m.contains("at most 4096")), "{:?}", answers[0]);
    }
}
