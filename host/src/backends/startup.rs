//! Which backends to load at start and after every change of the backends directory or a
//! registry reference (the embedded first-party set, the directory's files, the pulled images),
//! and loading them.
//!
//! Rules: a directory backend replaces the embedded one of the same name only with the
//! operator's consent (`replace_embedded`; removing the file brings the embedded one back); of
//! several versions of one backend in the directory the highest file version wins; two backends
//! declaring one resource name: the one loaded first keeps it.

use std::collections::HashMap;
use std::sync::Arc;

use super::{BackendSource, Catalog, Loaded, load_dir};

/// The backends to load, and what is wrong in the directory. A directory backend replaces the
/// embedded one of the same name only where the operator allowed it
/// (`[backends.NAME] replace_embedded = true`), so a vendor can ship a newer first-party backend
/// without a new host, but no file takes a first-party backend's place (and grant) unasked.
///
/// `pulled` are the registry versions of the backends with an `image`: they take the place of a
/// directory file of the same name, and of an embedded backend under the same consent rule.
pub fn sources(catalog: &Catalog, pulled: &[BackendSource]) -> (Vec<BackendSource>, Vec<String>) {
    let embedded = if catalog.embedded { BackendSource::embedded() } else { Vec::new() };
    let mut problems = Vec::new();
    let mut out = embedded.clone();
    let mut found = Vec::new();
    if let Some(dir) = catalog.dir {
        let (files, errors) = load_dir(dir);
        problems.extend(errors.into_iter().map(|e| format!("{e:#}")));
        found = files;
    }
    // Directory files first, then images: an image takes a file's place.
    for src in found.into_iter().chain(pulled.iter().cloned()) {
        let consent = catalog.settings.get(&src.name).is_some_and(|s| s.replace_embedded);
        if embedded.iter().any(|e| e.name == src.name) && !consent {
            problems.push(format!(
                "{} not loaded: {:?} is an embedded backend; set [backends.{}] replace_embedded = true to let it be replaced",
                src.origin, src.name, src.name
            ));
            continue;
        }
        out.retain(|s| s.name != src.name);
        out.push(src);
    }
    (out, problems)
}

/// Compile every enabled source ahead of loading it, one at a time off the async workers:
/// what a devplug does before it holds the instance lock (see `daemon::handover`), so that a
/// standby's take-over costs loads from memory, not compiles.
pub async fn prepare_all(loaded: &Arc<Loaded>, sources: &[BackendSource]) {
    for src in sources {
        let (r, src) = (loaded.clone(), src.clone());
        let name = src.name.clone();
        if let Err(e) = tokio::task::spawn_blocking(move || r.prepare(&src)).await {
            tracing::error!(backend = %name, "backend compile panicked: {e}");
        }
    }
}

/// Load every enabled source at startup (a backend whose first discover fails is still loaded:
/// its device list fills in once discover works). Returns the sources that failed, by name and
/// key, so the same file is not retried until it changes.
pub async fn load_all(loaded: &Arc<Loaded>, sources: Vec<BackendSource>) -> HashMap<String, String> {
    let mut failed = HashMap::new();
    for src in sources {
        if !loaded.enabled(&src.name) {
            tracing::info!(backend = %src.name, "disabled in the config");
            continue;
        }
        let (name, origin, key) = (src.name.clone(), src.origin.clone(), src.key.clone());
        let r = loaded.clone();
        match tokio::task::spawn_blocking(move || r.load(src)).await {
            Ok(Ok(())) => continue,
            Ok(Err(e)) => {
                tracing::error!(backend = %name, file = %origin, "backend not loaded: {e}");
                loaded.note_failed(&name, &origin.to_string(), &e.to_string());
            }
            Err(e) => {
                tracing::error!(backend = %name, file = %origin, "backend load panicked: {e}");
                loaded.note_failed(&name, &origin.to_string(), &format!("its load panicked: {e}"));
            }
        }
        failed.insert(name, key);
    }
    failed
}
