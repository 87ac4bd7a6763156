//! The pool as the API server holds it, kept by the writer's watch (as upstream's
//! `resourceslice` controller keeps it with an informer): one LIST when the watch starts, then
//! its events. devplug's own writes are recorded as they are answered, so their echoes wake
//! nothing and a LIST asked before a write cannot undo it.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::ResourceSlice;

/// The pool as the server holds it, kept by [`PoolWriter::watch`].
#[derive(Default)]
pub struct PoolView(std::sync::Mutex<ViewState>, tokio::sync::Notify);

/// How long a first sync waits for the watch's first LIST before asking the server itself (as
/// upstream's controller waits for its informer's cache to sync): in step, the two LISTs are one.
pub(super) const FIRST_LIST_PATIENCE: std::time::Duration = std::time::Duration::from_secs(5);

#[derive(Default)]
struct ViewState {
    slices: BTreeMap<String, ResourceSlice>,
    /// Filled by a LIST and kept by the watch since: the view can be trusted.
    synced: bool,
    /// A watch keeps this view, and LISTs it has tried so far (answered or failed).
    watching: bool,
    lists: u64,
    /// Resource versions devplug's own writes returned: their watch events are echoes.
    ours: std::collections::HashSet<String>,
    /// devplug's writes so far, and by slice name the last one (the slice as written, or `None`
    /// for a delete): a LIST asked before a write may answer after it, and must not undo it.
    writes: u64,
    recent: BTreeMap<String, (u64, Option<ResourceSlice>)>,
}

impl PoolView {
    fn state(&self) -> std::sync::MutexGuard<'_, ViewState> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The pool, if the view is in step with the server.
    pub(super) fn snapshot(&self) -> Option<BTreeMap<String, ResourceSlice>> {
        let st = self.state();
        st.synced.then(|| st.slices.clone())
    }

    /// A watch keeps this view from now on (its first LIST is coming).
    pub(super) fn watched(&self) {
        self.state().watching = true;
    }

    /// The pool once the watch's first LIST has filled the view, waiting for it at most
    /// `patience`; at once when no watch keeps the view, or it has listed before (a view made
    /// stale since is not waited for: the caller LISTs).
    pub(super) async fn first_list(&self, patience: std::time::Duration) -> Option<BTreeMap<String, ResourceSlice>> {
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            let listed = self.1.notified();
            let mut listed = std::pin::pin!(listed);
            listed.as_mut().enable();
            {
                let st = self.state();
                if st.synced {
                    return Some(st.slices.clone());
                }
                if !st.watching || st.lists > 0 {
                    return None;
                }
            }
            if tokio::time::timeout_at(deadline, listed).await.is_err() {
                return self.snapshot();
            }
        }
    }

    /// The watch's LIST failed: nobody waits for it (the writer asks the server itself).
    pub(super) fn list_failed(&self) {
        self.state().lists += 1;
        self.1.notify_waiters();
    }

    /// Where devplug's writes stand before a LIST is asked (see [`PoolView::reset`]).
    pub(super) fn mark(&self) -> u64 {
        self.state().writes
    }

    /// What a LIST asked at `mark` returned: the whole pool, except that devplug's own writes
    /// made after `mark` stand (the LIST may not have seen them; their echoes come later).
    pub(super) fn reset(&self, items: Vec<ResourceSlice>, mark: u64) {
        let mut st = self.state();
        st.slices = items.into_iter().filter_map(|s| Some((s.metadata.name.clone()?, s))).collect();
        let later: Vec<(String, Option<ResourceSlice>)> =
            st.recent.iter().filter(|(_, (at, _))| *at > mark).map(|(n, (_, s))| (n.clone(), s.clone())).collect();
        // Echoes still to come are of those later writes only.
        let pending: std::collections::HashSet<String> =
            later.iter().filter_map(|(_, s)| s.as_ref()?.metadata.resource_version.clone()).collect();
        for (name, slice) in later {
            match slice {
                Some(s) => st.slices.insert(name, s),
                None => st.slices.remove(&name),
            };
        }
        st.recent.clear();
        st.ours = pending;
        st.synced = true;
        st.lists += 1;
        drop(st);
        self.1.notify_waiters();
    }

    /// Not to be trusted until the next LIST (a write found it stale).
    pub(super) fn invalidate(&self) {
        self.state().synced = false;
    }

    /// A slice devplug wrote, as the server answered.
    pub(super) fn wrote(&self, slice: ResourceSlice) {
        let mut st = self.state();
        if let Some(rv) = slice.metadata.resource_version.clone() {
            st.ours.insert(rv);
        }
        if let Some(name) = slice.metadata.name.clone() {
            st.writes += 1;
            let at = st.writes;
            st.recent.insert(name.clone(), (at, Some(slice.clone())));
            st.slices.insert(name, slice);
        }
    }

    /// A slice devplug deleted.
    pub(super) fn removed(&self, name: &str) {
        let mut st = self.state();
        st.writes += 1;
        let at = st.writes;
        st.recent.insert(name.to_owned(), (at, None));
        st.slices.remove(name);
    }

    /// A slice the watch saw deleted.
    pub(super) fn deleted(&self, name: &str) {
        self.state().slices.remove(name);
    }

    /// A watch event's slice, added or modified; whether it is someone else's change (not the
    /// echo of devplug's own write).
    pub(super) fn seen(&self, slice: ResourceSlice) -> bool {
        let mut st = self.state();
        let echo = slice.metadata.resource_version.as_ref().is_some_and(|rv| st.ours.remove(rv));
        if let Some(name) = slice.metadata.name.clone() {
            st.slices.insert(name, slice);
        }
        !echo
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A LIST asked before devplug's own create and answered after it must not undo it (the
    /// next sync would create the slice again and meet `AlreadyExists`); one asked after it
    /// stands as the server answered.
    #[test]
    fn a_list_older_than_devplugs_own_write_does_not_undo_it() {
        let view = PoolView::default();
        let mut slice: ResourceSlice = serde_json::from_value(serde_json::json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": { "name": "s-0" },
            "spec": { "driver": "d.io", "nodeName": "n", "pool": { "name": "n", "generation": 1, "resourceSliceCount": 1 } },
        }))
        .unwrap();
        slice.metadata.resource_version = Some("7".into());
        let before = view.mark();
        view.wrote(slice.clone());
        view.reset(vec![], before);
        assert!(view.snapshot().unwrap().contains_key("s-0"), "the create stands");
        assert!(!view.seen(slice.clone()), "its echo is still an echo");
        let after = view.mark();
        view.reset(vec![], after);
        assert!(view.snapshot().unwrap().is_empty(), "a LIST after the write is the server's word");
        view.reset(vec![slice.clone()], view.mark());
        let before = view.mark();
        view.removed("s-0");
        view.reset(vec![slice], before);
        assert!(view.snapshot().unwrap().is_empty(), "a delete stands too");
    }

    /// The first sync waits for the watch's first LIST (one LIST, not two racing), but not
    /// without a watch, not after the LIST failed, and not past its patience.
    #[tokio::test(start_paused = true)]
    async fn a_first_sync_waits_for_the_watchs_first_list_only() {
        let patience = std::time::Duration::from_secs(5);
        let unwatched = PoolView::default();
        assert!(unwatched.first_list(patience).await.is_none(), "no watch: at once");
        let view = std::sync::Arc::new(PoolView::default());
        view.watched();
        let waiter = tokio::spawn({
            let view = view.clone();
            async move { view.first_list(patience).await }
        });
        tokio::task::yield_now().await;
        view.reset(vec![], view.mark());
        assert!(waiter.await.unwrap().is_some(), "the watch's LIST answers the wait");
        let failing = std::sync::Arc::new(PoolView::default());
        failing.watched();
        let waiter = tokio::spawn({
            let failing = failing.clone();
            async move { failing.first_list(patience).await }
        });
        tokio::task::yield_now().await;
        failing.list_failed();
        assert!(waiter.await.unwrap().is_none(), "a failed LIST ends the wait");
        let slow = PoolView::default();
        slow.watched();
        let t0 = tokio::time::Instant::now();
        assert!(slow.first_list(patience).await.is_none());
        assert_eq!(t0.elapsed(), patience, "bounded by its patience (a paused clock)");
    }
}
