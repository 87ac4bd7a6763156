//! What the clients of devplug's plugin sockets may hold, in bytes and in connections, and how
//! kubelet still gets through when a hostile local client holds all it may.
//!
//! - **Request bytes**: every request body under way, on every plugin socket of the process, is
//!   counted as its frames arrive, against one budget of [`REQUEST_BYTES`]. A frame that would
//!   pass the budget makes the largest holder give way: its request fails with
//!   `RESOURCE_EXHAUSTED` and what it held is freed. Kubelet's requests are small and arrive
//!   whole (its largest, a `GetPreferredAllocation` over 8,192 devices, is ~1.1 MiB), so a client
//!   hoarding unfinished messages is the one that goes.
//! - **Connections**: each socket's connections are known here with whether they have a request
//!   under way whose body has arrived (kubelet's ListAndWatch, a call being answered). When the
//!   socket's cap is full, a new connection takes the place of the one that has been without
//!   such a request longest (idle, or only holding requests whose bodies never came), which is
//!   closed; and a connection idle for [`IDLE_TIMEOUT`] is closed whatever the load. A gRPC client
//!   (kubelet's) dials again on its next call.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame};

use crate::sync::Locked;

/// The request bytes all plugin sockets' clients may have the host hold at once: 16 MiB, room
/// for fourteen of kubelet's largest requests under way together (it makes one call at a time per
/// plugin).
pub(crate) const REQUEST_BYTES: usize = 16 << 20;

/// A connection with no request under way this long is closed (grpc-go dials again on the next
/// call; kubelet's Device Plugin connection always holds its ListAndWatch).
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(600);

/// The process's one budget of request bytes.
pub(crate) static BYTES: LazyLock<Arc<ByteBudget>> = LazyLock::new(|| ByteBudget::new(REQUEST_BYTES));

/// Request bytes held for bodies under way, and who holds them.
pub struct ByteBudget {
    limit: usize,
    state: Mutex<Holders>,
}

#[derive(Default)]
struct Holders {
    held: usize,
    /// Of `held`, what bodies told to give way still hold (freed when they go).
    leaving: usize,
    next: u64,
    by_id: HashMap<u64, Holder>,
}

#[derive(Default)]
struct Holder {
    bytes: usize,
    evicted: bool,
    waker: Option<Waker>,
}

/// A body that must give way: what it is told.
fn over_budget(limit: usize) -> tonic::Status {
    tonic::Status::resource_exhausted(format!(
        "devplug: the request bytes its plugin sockets' clients hold together passed {} MiB, and this request held the most; send requests whole, as kubelet does",
        limit >> 20
    ))
}

impl ByteBudget {
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(ByteBudget { limit, state: Mutex::default() })
    }

    /// Bytes held now for bodies under way.
    pub fn held(&self) -> usize {
        self.state.locked().held
    }

    fn open(&self) -> u64 {
        let mut st = self.state.locked();
        st.next += 1;
        let id = st.next;
        st.by_id.insert(id, Holder::default());
        id
    }

    /// `n` more bytes for body `id`; `false` when it is the one to give way (it holds the most).
    fn charge(&self, id: u64, n: usize) -> bool {
        let mut st = self.state.locked();
        let Some(h) = st.by_id.get_mut(&id) else { return false };
        h.bytes += n;
        let evicted = h.evicted;
        st.held += n;
        if evicted {
            // Told to go between its check and this frame: what it adds leaves with it.
            st.leaving += n;
            return false;
        }
        while st.held.saturating_sub(st.leaving) > self.limit {
            let Some((&largest, _)) = st.by_id.iter().filter(|(_, h)| !h.evicted).max_by_key(|(_, h)| h.bytes) else {
                break;
            };
            if largest == id {
                return false;
            }
            let Some(h) = st.by_id.get_mut(&largest) else { break };
            h.evicted = true;
            let (bytes, waker) = (h.bytes, h.waker.take());
            st.leaving += bytes;
            if let Some(w) = waker {
                w.wake();
            }
        }
        true
    }

    /// Whether body `id` was told to give way; if not, `waker` is woken when it is.
    fn evicted(&self, id: u64, waker: &Waker) -> bool {
        let mut st = self.state.locked();
        match st.by_id.get_mut(&id) {
            Some(h) if h.evicted => true,
            Some(h) => {
                h.waker = Some(waker.clone());
                false
            }
            None => true,
        }
    }

    fn close(&self, id: u64) {
        let mut st = self.state.locked();
        if let Some(h) = st.by_id.remove(&id) {
            st.held = st.held.saturating_sub(h.bytes);
            if h.evicted {
                st.leaving = st.leaving.saturating_sub(h.bytes);
            }
        }
    }
}

/// What a request learns of its connection (tonic puts it in the request's extensions).
#[derive(Clone)]
pub struct ConnInfo {
    pub uds: <tokio::net::UnixStream as tonic::transport::server::Connected>::ConnectInfo,
    pub conn: Arc<Conn>,
}

/// One connection's standing, shared by its stream (which closes it when told) and its
/// requests (which say when they start and end).
pub struct Conn {
    /// Requests under way (until their answer is sent or dropped).
    in_flight: AtomicUsize,
    /// Of those, the ones whose body has not all come yet.
    unfinished: AtomicUsize,
    /// When `in_flight - unfinished` last became zero, in ms since [`epoch`].
    quiet_since: AtomicU64,
    closing: AtomicBool,
    waker: futures::task::AtomicWaker,
}

/// Tokio's clock (the timers' own, so a test with paused time sees the same time they do).
fn epoch() -> tokio::time::Instant {
    static START: LazyLock<tokio::time::Instant> = LazyLock::new(tokio::time::Instant::now);
    *START
}

fn now_ms() -> u64 {
    epoch().elapsed().as_millis() as u64
}

impl Conn {
    fn new() -> Arc<Self> {
        Arc::new(Conn {
            in_flight: AtomicUsize::new(0),
            unfinished: AtomicUsize::new(0),
            quiet_since: AtomicU64::new(now_ms()),
            closing: AtomicBool::new(false),
            waker: futures::task::AtomicWaker::new(),
        })
    }

    /// How long it has had no request under way with its body in (`None`: it has one).
    pub(crate) fn quiet_for(&self) -> Option<Duration> {
        let served = self.in_flight.load(Ordering::Acquire).saturating_sub(self.unfinished.load(Ordering::Acquire));
        (served == 0).then(|| Duration::from_millis(now_ms().saturating_sub(self.quiet_since.load(Ordering::Acquire))))
    }

    /// Whether it was told to close; `waker` is woken when it is.
    pub fn closing(&self, waker: &Waker) -> bool {
        self.waker.register(waker);
        self.closing.load(Ordering::Acquire)
    }

    fn close(&self) {
        self.closing.store(true, Ordering::Release);
        self.waker.wake();
    }

    fn mark_quiet_if_now(&self) {
        if self.quiet_for().is_some() {
            self.quiet_since.store(now_ms(), Ordering::Release);
        }
    }
}

/// One socket's connections.
#[derive(Default)]
pub struct Connections {
    live: Mutex<Vec<Weak<Conn>>>,
}

impl Connections {
    /// A new connection's standing.
    pub(crate) fn admit(&self) -> Arc<Conn> {
        let conn = Conn::new();
        let mut live = self.live.locked();
        live.retain(|c| c.strong_count() > 0);
        live.push(Arc::downgrade(&conn));
        conn
    }

    /// Tell the connection quiet longest to close; whether there was one.
    pub(crate) fn close_quietest(&self) -> bool {
        let live = self.live.locked();
        let quietest = live
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|c| !c.closing.load(Ordering::Acquire))
            .filter_map(|c| c.quiet_for().map(|q| (q, c)))
            .max_by_key(|(q, _)| *q);
        match quietest {
            Some((_, c)) => {
                c.close();
                true
            }
            None => false,
        }
    }
}

/// The tower layer that counts every request of a connection and charges its body to
/// [`BYTES`] (`Server::builder().layer`).
#[derive(Clone)]
pub struct Track {
    pub budget: Arc<ByteBudget>,
}

impl<S> tower::Layer<S> for Track {
    type Service = Tracked<S>;
    fn layer(&self, inner: S) -> Tracked<S> {
        Tracked { inner, budget: self.budget.clone() }
    }
}

#[derive(Clone)]
pub struct Tracked<S> {
    inner: S,
    budget: Arc<ByteBudget>,
}

/// A request under way on a connection: counted from its headers to its answer's end.
struct InFlight(Arc<Conn>);

impl InFlight {
    fn start(conn: Arc<Conn>) -> Self {
        conn.in_flight.fetch_add(1, Ordering::AcqRel);
        conn.unfinished.fetch_add(1, Ordering::AcqRel);
        InFlight(conn)
    }
}

/// A request being served on `conn` (its body in) while the guard lives: what a ListAndWatch
/// holds (tests of the connection's stream).
#[cfg(test)]
pub(crate) fn serving(conn: &Arc<Conn>) -> impl Drop + use<> {
    let guard = InFlight::start(conn.clone());
    conn.unfinished.fetch_sub(1, Ordering::AcqRel);
    guard
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.0.mark_quiet_if_now();
    }
}

impl<S, ResBody> tower::Service<http::Request<tonic::body::Body>> for Tracked<S>
where
    S: tower::Service<http::Request<tonic::body::Body>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<tonic::codegen::StdError>,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn std::future::Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let conn = req.extensions().get::<ConnInfo>().map(|i| i.conn.clone());
        let guard = conn.map(InFlight::start).map(Arc::new);
        let (budget, body_guard) = (self.budget.clone(), guard.clone());
        let req = req.map(|inner| {
            let id = budget.open();
            tonic::body::Body::new(Budgeted { inner, budget, id, guard: body_guard, done: false })
        });
        let answer = self.inner.call(req);
        Box::pin(async move {
            let res = answer.await?;
            Ok(res
                .map(|inner| tonic::body::Body::new(Answering { inner: tonic::body::Body::new(inner), _guard: guard })))
        })
    }
}

/// A request body, charged to the budget as its frames come.
struct Budgeted {
    inner: tonic::body::Body,
    budget: Arc<ByteBudget>,
    id: u64,
    guard: Option<Arc<InFlight>>,
    done: bool,
}

impl Budgeted {
    /// Its body is all in (or never will be): the request no longer counts as unfinished.
    fn finish(&mut self) {
        if !std::mem::replace(&mut self.done, true)
            && let Some(g) = &self.guard
        {
            g.0.unfinished.fetch_sub(1, Ordering::AcqRel);
            g.0.mark_quiet_if_now();
        }
    }
}

impl Body for Budgeted {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        let this = &mut *self;
        if this.budget.evicted(this.id, cx.waker()) {
            this.finish();
            return Poll::Ready(Some(Err(over_budget(this.budget.limit))));
        }
        let frame = std::task::ready!(Pin::new(&mut this.inner).poll_frame(cx));
        match &frame {
            Some(Ok(f)) => {
                if let Some(data) = f.data_ref()
                    && !this.budget.charge(this.id, data.len())
                {
                    this.finish();
                    return Poll::Ready(Some(Err(over_budget(this.budget.limit))));
                }
                if f.is_trailers() {
                    this.finish();
                }
            }
            Some(Err(_)) | None => this.finish(),
        }
        if this.inner.is_end_stream() {
            this.finish();
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Budgeted {
    fn drop(&mut self) {
        self.finish();
        self.budget.close(self.id);
    }
}

/// An answer body; the request counts as under way until it is sent or dropped.
struct Answering {
    inner: tonic::body::Body,
    _guard: Option<Arc<InFlight>>,
}

impl Body for Answering {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The largest holder gives way when a frame would pass the budget; a body that is itself
    /// the largest is refused; what a body held is freed when it goes.
    #[test]
    fn the_largest_holder_gives_way_and_what_it_held_is_freed() {
        let b = ByteBudget::new(100);
        let (hoard, kubelet, other) = (b.open(), b.open(), b.open());
        assert!(b.charge(hoard, 90));
        assert!(b.charge(kubelet, 5));
        // 20 more would make 115: the hoard (90) is told to go, kubelet's request carries on.
        assert!(b.charge(other, 20));
        let waker = futures::task::noop_waker();
        assert!(b.evicted(hoard, &waker));
        assert!(!b.evicted(kubelet, &waker) && !b.evicted(other, &waker));
        b.close(hoard);
        assert_eq!(b.held(), 25);
        // A body that holds the most is refused its own frame.
        assert!(!b.charge(other, 90), "110 of 100, and it is the largest");
        b.close(other);
        b.close(kubelet);
        assert_eq!(b.held(), 0);
    }

    /// The connection quiet longest is told to close; one serving a request is not.
    #[test]
    fn the_quietest_connection_makes_room_and_a_served_one_stays() {
        let conns = Connections::default();
        let serving = conns.admit();
        let _guard = InFlight::start(serving.clone());
        serving.unfinished.fetch_sub(1, Ordering::AcqRel);
        let idle = conns.admit();
        let waker = futures::task::noop_waker();
        assert!(conns.close_quietest());
        assert!(idle.closing(&waker) && !serving.closing(&waker));
        assert!(!conns.close_quietest(), "only a serving connection is left");
        // A request whose body never came does not protect its connection.
        let hoarder = conns.admit();
        let _waiting = InFlight::start(hoarder.clone());
        assert!(conns.close_quietest());
        assert!(hoarder.closing(&waker));
    }
}
