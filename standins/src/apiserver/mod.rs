//! A kube-apiserver stand-in for what devplug's DRA side uses: Node GET, ResourceSlice list
//! (field selectors `spec.nodeName`, `spec.driver`), create, replace, delete and delete
//! collection, ResourceClaim GET and its `status.devices` by server-side apply. It enforces what
//! the real server enforces on these paths: a bearer token (random for each stand-in; or a
//! ServiceAccount's, bound to a node, held to RBAC rules, the granular claim status rule and a
//! slice policy's effect as [`authz`] says), the ResourceSlice validation of kube-apiserver 1.36 ([`validation`], ported from upstream's;
//! decode errors are 400, invalid objects 422 with every cause's field path; agreement with the
//! recorded server is tested case by case), `AlreadyExists` on a second create, optimistic
//! concurrency (`resourceVersion`) on replace, and Status objects as errors. What it stores is
//! what the real server stores, not what it was sent: the server's defaults are applied
//! ([`server_defaults`]: a taint's `timeAdded`, empty lists and maps dropped as Go's
//! `omitempty` drops them, `creationTimestamp`, `generation`), so a client that compares what
//! it sent with what it reads back sees the same differences it would see against a real one.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};

use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

pub mod authz;
pub mod field;
pub mod formats;
pub mod validation;

use authz::{Attributes, Identity};

#[derive(Default)]
pub struct Store {
    /// The admin's bearer token (the kubeconfig it writes carries it).
    token: String,
    /// Tokens of ServiceAccounts minted with [`ApiServer::service_account_token`].
    accounts: BTreeMap<String, Identity>,
    /// What ServiceAccounts may do (RBAC), and the slice policy in force, if any.
    rules: Vec<authz::Rule>,
    slice_policy: Option<authz::SlicePolicy>,
    pub nodes: BTreeMap<String, Value>,
    pub slices: BTreeMap<String, Value>,
    pub claims: BTreeMap<(String, String), Value>,
    /// Which field manager applied which `status.devices` entries of each claim.
    status_owners: BTreeMap<(String, String), BTreeMap<String, Vec<Value>>>,
    version: u64,
    /// Every request: "METHOD path".
    pub log: Vec<String>,
    /// ResourceSlice watch events ("ADDED", "MODIFIED", "DELETED", the object) for watchers.
    events: Option<tokio::sync::broadcast::Sender<(String, Value)>>,
    /// The last events by resource version, as the server's watch cache keeps them: a watch
    /// from a resource version replays what came after it, or answers `410 Gone` when that
    /// version is older than what is kept.
    history: std::collections::VecDeque<(u64, String, Value)>,
    /// The newest version no longer in `history`.
    forgotten: u64,
    /// Slice writes (create or replace) to let through before one is refused as a quota
    /// admission plugin refuses it (`403 Forbidden`, "exceeded quota"); then writes pass again.
    refuse_after: Option<usize>,
}

/// Events the stand-in's watch cache keeps.
const HISTORY: usize = 1000;

impl Store {
    /// The refusal of a write, if this is the one [`ApiServer::refuse_write_after`] asked for.
    fn quota(&mut self, name: &str) -> Result<(), (StatusCode, Json<Value>)> {
        match self.refuse_after {
            Some(0) => {
                self.refuse_after = None;
                Err(status(
                    StatusCode::FORBIDDEN,
                    "Forbidden",
                    format!("resourceslices.resource.k8s.io {name:?} is forbidden: exceeded quota: slices"),
                    vec![],
                ))
            }
            Some(n) => {
                self.refuse_after = Some(n - 1);
                Ok(())
            }
            None => Ok(()),
        }
    }

    fn next_version(&mut self) -> String {
        self.version += 1;
        self.version.to_string()
    }

    fn emit(&mut self, kind: &str, slice: &Value) {
        let mut slice = slice.clone();
        // A deletion is a change of its own, with a new resource version (as the server's).
        if kind == "DELETED" {
            let rv = self.next_version();
            slice["metadata"]["resourceVersion"] = json!(rv);
        }
        let rv: u64 =
            slice["metadata"]["resourceVersion"].as_str().and_then(|v| v.parse().ok()).unwrap_or(self.version);
        self.history.push_back((rv, kind.to_owned(), slice.clone()));
        if self.history.len() > HISTORY
            && let Some((old, _, _)) = self.history.pop_front()
        {
            self.forgotten = old;
        }
        if let Some(tx) = &self.events {
            let _ = tx.send((kind.to_owned(), slice));
        }
    }
}

type Shared = Arc<Mutex<Store>>;

/// The store, even if a handler panicked while holding it (a stand-in serving `devplug try`
/// keeps answering).
fn lock(s: &Shared) -> std::sync::MutexGuard<'_, Store> {
    s.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// 32 random bytes as hex: the stand-in's token.
fn random_token() -> String {
    let mut bytes = [0u8; 32];
    // No randomness from the OS is a broken machine; a token of zeros would still not be a
    // fixed, published one... but refuse to pretend: every request is then refused.
    if getrandom::fill(&mut bytes).is_err() {
        return String::new();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What kube-apiserver 1.36 does to a ResourceSlice it stores, beyond validation: every
/// `DeviceTaint` without `timeAdded` gets the current time ("Added automatically during create
/// or update if not set", the recorded OpenAPI document); fields that are empty or null are
/// not stored (Go's `omitempty` on every optional list, map and pointer of `resource/v1`), so
/// `"devices": []` comes back without `devices`; `metadata.creationTimestamp` and
/// `metadata.generation` are set (the generation bumped when the spec changes).
pub fn server_defaults(slice: &mut Value, old: Option<&Value>) {
    fn prune(v: &mut Value) {
        match v {
            Value::Object(m) => {
                for child in m.values_mut() {
                    prune(child);
                }
                m.retain(|_, c| {
                    !(c.is_null()
                        || c.as_array().is_some_and(Vec::is_empty)
                        || c.as_object().is_some_and(|o| o.is_empty()))
                });
            }
            Value::Array(a) => a.iter_mut().for_each(prune),
            _ => {}
        }
    }
    let now = "2026-11-25T12:00:00Z";
    for d in slice["spec"]["devices"].as_array_mut().into_iter().flatten() {
        for t in d["taints"].as_array_mut().into_iter().flatten() {
            if t.get("timeAdded").is_none_or(Value::is_null) {
                t["timeAdded"] = json!(now);
            }
        }
    }
    prune(&mut slice["spec"]);
    let generation = match old {
        None => 1,
        Some(o) if o["spec"] == slice["spec"] => o["metadata"]["generation"].as_i64().unwrap_or(1),
        Some(o) => o["metadata"]["generation"].as_i64().unwrap_or(1) + 1,
    };
    slice["metadata"]["generation"] = json!(generation);
    slice["metadata"]["creationTimestamp"] = old.map_or(json!(now), |o| o["metadata"]["creationTimestamp"].clone());
}

/// The running stand-in.
pub struct ApiServer {
    pub addr: SocketAddr,
    pub store: Shared,
    stop: CancellationToken,
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn status(code: StatusCode, reason: &str, message: String, causes: Vec<Value>) -> (StatusCode, Json<Value>) {
    let mut s = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code.as_u16(),
    });
    if !causes.is_empty() {
        s["details"] = json!({ "group": "resource.k8s.io", "kind": "resourceslices", "causes": causes });
    }
    (code, Json(s))
}

/// An error answer: a status code and a Status object.
type Failure = (StatusCode, Json<Value>);
type Reply = Result<(StatusCode, Json<Value>), Failure>;

/// Who sent the request (`401` for no or an unknown token), and whether RBAC lets them do
/// `verb` on `resource[/subresource]` (`403` in upstream's words when not).
fn authorized(
    s: &Shared,
    h: &HeaderMap,
    verb: &str,
    what: (&str, &str, &str),
    namespace: &str,
    name: &str,
) -> Result<Identity, Failure> {
    let st = lock(s);
    let sent = h.get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    let id = match sent {
        Some(t) if !st.token.is_empty() && t == st.token => Identity::Admin,
        Some(t) => match st.accounts.get(t) {
            Some(id) => id.clone(),
            None => return Err(status(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized".into(), vec![])),
        },
        None => return Err(status(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized".into(), vec![])),
    };
    let (group, resource, subresource) = what;
    authz::check(&id, &st.rules, &Attributes { verb, group, resource, subresource, namespace, name })?;
    Ok(id)
}

const SLICES: (&str, &str, &str) = ("resource.k8s.io", "resourceslices", "");

/// The slice policy's verdict on `id` doing `operation` to `new` over `old`.
fn admitted(
    s: &Shared,
    id: &Identity,
    operation: &str,
    new: Option<&Value>,
    old: Option<&Value>,
) -> Result<(), Failure> {
    match &lock(s).slice_policy {
        Some(p) => p.judge(id, operation, new, old),
        None => Ok(()),
    }
}

/// The server's verdict on a slice created (`old` = `None`) or replacing `old`: decode errors
/// 400, validation 422 with every cause (as the recorded server).
fn validate(slice: &mut Value, old: Option<&Value>) -> Result<(), Failure> {
    match validation::resource_slice(slice, old) {
        Ok(()) => Ok(()),
        Err(validation::Refusal::Decode(why)) => Err(status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            format!("ResourceSlice in version \"v1\" cannot be handled as a ResourceSlice: {why}"),
            vec![],
        )),
        Err(validation::Refusal::Invalid(errs)) => Err(invalid_slice(slice, &errs.0)),
    }
}

/// The 422 Status of an invalid slice: `details.causes` one per error, the message Go's
/// aggregate of them (one error bare, several in brackets).
pub fn invalid_slice(slice: &Value, errs: &[field::FieldError]) -> Failure {
    let name = slice["metadata"]["name"].as_str().unwrap_or("");
    let causes: Vec<Value> =
        errs.iter().map(|e| json!({ "reason": e.kind.reason(), "message": e.body(), "field": e.field })).collect();
    let listed: Vec<String> = errs.iter().map(ToString::to_string).collect();
    let all = if listed.len() == 1 { listed[0].clone() } else { format!("[{}]", listed.join(", ")) };
    let message = format!("ResourceSlice.resource.k8s.io {} is invalid: {all}", field::quote(name));
    status(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", message, causes)
}

/// `fieldSelector` as the server reads it for ResourceSlices; other fields are refused.
fn selector(q: &BTreeMap<String, String>) -> Result<Vec<(String, String)>, Failure> {
    let Some(sel) = q.get("fieldSelector").filter(|s| !s.is_empty()) else { return Ok(vec![]) };
    sel.split(',')
        .map(|term| {
            let (k, v) = term.split_once('=').unwrap_or((term, ""));
            if !["spec.nodeName", "spec.driver", "spec.pool.name", "metadata.name"].contains(&k) {
                return Err(status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    format!("\"{k}\" is not a known field selector: only \"metadata.name\", \"spec.driver\", \"spec.nodeName\", \"spec.pool.name\""),
                    vec![],
                ));
            }
            Ok((k.to_owned(), v.to_owned()))
        })
        .collect()
}

fn matches(slice: &Value, sel: &[(String, String)]) -> bool {
    sel.iter().all(|(k, v)| {
        let got = match k.as_str() {
            "spec.nodeName" => &slice["spec"]["nodeName"],
            "spec.driver" => &slice["spec"]["driver"],
            "spec.pool.name" => &slice["spec"]["pool"]["name"],
            _ => &slice["metadata"]["name"],
        };
        got.as_str().unwrap_or("") == v
    })
}

async fn get_node(State(s): State<Shared>, h: HeaderMap, UrlPath(name): UrlPath<String>) -> Reply {
    authorized(&s, &h, "get", ("", "nodes", ""), "", &name)?;
    let mut st = lock(&s);
    st.log.push(format!("GET node {name}"));
    match st.nodes.get(&name) {
        Some(n) => Ok((StatusCode::OK, Json(n.clone()))),
        None => Err(status(StatusCode::NOT_FOUND, "NotFound", format!("nodes {name:?} not found"), vec![])),
    }
}

async fn list_or_watch(
    State(s): State<Shared>,
    h: HeaderMap,
    Query(q): Query<BTreeMap<String, String>>,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    if q.get("watch").map(String::as_str) != Some("true") {
        return list_slices(State(s), h, Query(q)).await.into_response();
    }
    if let Err(e) = authorized(&s, &h, "watch", SLICES, "", "") {
        return e.into_response();
    }
    let sel = match selector(&q) {
        Ok(sel) => sel,
        Err(e) => return e.into_response(),
    };
    // Without a resourceVersion, or "0": the current objects as ADDED, then every change. From
    // a resourceVersion N: every change after N (replayed from the watch cache), then the live
    // ones; `410 Gone` when N is older than the cache keeps.
    let (initial, rx) = {
        let mut st = lock(&s);
        st.log.push(format!("WATCH resourceslices {}", q.get("fieldSelector").cloned().unwrap_or_default()));
        let from = q.get("resourceVersion").filter(|v| v.as_str() != "0");
        let initial: Vec<(String, Value)> = match from.map(|v| v.parse::<u64>()) {
            None => st.slices.values().filter(|v| matches(v, &sel)).map(|v| ("ADDED".to_owned(), v.clone())).collect(),
            Some(Ok(n)) if n >= st.forgotten => st
                .history
                .iter()
                .filter(|(rv, _, v)| *rv > n && matches(v, &sel))
                .map(|(_, k, v)| (k.clone(), v.clone()))
                .collect(),
            Some(Ok(n)) => {
                let gone = json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 410, "reason": "Expired",
                                   "message": format!("too old resource version: {n} ({})", st.forgotten + 1) });
                vec![("ERROR".to_owned(), gone)]
            }
            Some(Err(_)) => {
                return status(StatusCode::BAD_REQUEST, "BadRequest", "invalid resourceVersion".into(), vec![])
                    .into_response();
            }
        };
        (initial, st.events.as_ref().expect("events").subscribe())
    };
    let line = |(kind, object): (String, Value)| {
        let mut b = serde_json::to_vec(&json!({ "type": kind, "object": object })).expect("JSON");
        b.push(b'\n');
        Ok::<_, std::convert::Infallible>(bytes::Bytes::from(b))
    };
    let live = futures::stream::unfold((rx, sel), |(mut rx, sel)| async move {
        loop {
            match rx.recv().await {
                Ok((kind, object)) if matches(&object, &sel) => return Some(((kind, object), (rx, sel))),
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(_) => return None,
            }
        }
    });
    let body = futures::StreamExt::map(futures::StreamExt::chain(futures::stream::iter(initial), live), line);
    axum::response::Response::builder()
        .header("content-type", "application/json")
        .body(axum::body::Body::from_stream(body))
        .expect("a response")
}

async fn list_slices(State(s): State<Shared>, h: HeaderMap, Query(q): Query<BTreeMap<String, String>>) -> Reply {
    authorized(&s, &h, "list", SLICES, "", "")?;
    let sel = selector(&q)?;
    let mut st = lock(&s);
    st.log.push(format!("LIST resourceslices {}", q.get("fieldSelector").cloned().unwrap_or_default()));
    let items: Vec<Value> = st.slices.values().filter(|v| matches(v, &sel)).cloned().collect();
    let rv = st.version.to_string();
    Ok((
        StatusCode::OK,
        Json(
            json!({ "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList", "metadata": { "resourceVersion": rv }, "items": items }),
        ),
    ))
}

async fn create_slice(State(s): State<Shared>, h: HeaderMap, Json(mut slice): Json<Value>) -> Reply {
    let id = authorized(&s, &h, "create", SLICES, "", "")?;
    validate(&mut slice, None)?;
    admitted(&s, &id, "CREATE", Some(&slice), None)?;
    if slice["metadata"]["name"].as_str().is_none_or(str::is_empty)
        && let Some(prefix) = slice["metadata"]["generateName"].as_str()
    {
        // The server's `SimpleNameGenerator`: the prefix and five random characters.
        let suffix: String = random_token().chars().take(5).collect();
        slice["metadata"]["name"] = json!(format!("{prefix}{suffix}"));
    }
    let name = slice["metadata"]["name"].as_str().unwrap_or("").to_owned();
    let mut st = lock(&s);
    st.log.push(format!("POST resourceslice {name}"));
    st.quota(&name)?;
    if st.slices.contains_key(&name) {
        return Err(status(
            StatusCode::CONFLICT,
            "AlreadyExists",
            format!("resourceslices.resource.k8s.io {name:?} already exists"),
            vec![],
        ));
    }
    let rv = st.next_version();
    server_defaults(&mut slice, None);
    slice["metadata"]["resourceVersion"] = json!(rv);
    slice["metadata"]["uid"] = json!(format!("slice-uid-{rv}"));
    st.slices.insert(name, slice.clone());
    st.emit("ADDED", &slice);
    Ok((StatusCode::CREATED, Json(slice)))
}

async fn get_slice(State(s): State<Shared>, h: HeaderMap, UrlPath(name): UrlPath<String>) -> Reply {
    authorized(&s, &h, "get", SLICES, "", &name)?;
    let st = lock(&s);
    match st.slices.get(&name) {
        Some(v) => Ok((StatusCode::OK, Json(v.clone()))),
        None => Err(status(StatusCode::NOT_FOUND, "NotFound", format!("resourceslices {name:?} not found"), vec![])),
    }
}

async fn replace_slice(
    State(s): State<Shared>,
    h: HeaderMap,
    UrlPath(name): UrlPath<String>,
    Json(mut slice): Json<Value>,
) -> Reply {
    let id = authorized(&s, &h, "update", SLICES, "", &name)?;
    let old = lock(&s).slices.get(&name).cloned();
    if let Some(old) = &old {
        validate(&mut slice, Some(old))?;
        admitted(&s, &id, "UPDATE", Some(&slice), Some(old))?;
    }
    let mut st = lock(&s);
    st.log.push(format!("PUT resourceslice {name}"));
    st.quota(&name)?;
    let Some(old) = st.slices.get(&name) else {
        return Err(status(StatusCode::NOT_FOUND, "NotFound", format!("resourceslices {name:?} not found"), vec![]));
    };
    if slice["metadata"]["resourceVersion"] != old["metadata"]["resourceVersion"] {
        return Err(status(
            StatusCode::CONFLICT,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on resourceslices.resource.k8s.io {name:?}: the object has been modified; please apply your changes to the latest version and try again"
            ),
            vec![],
        ));
    }
    slice["metadata"]["uid"] = old["metadata"]["uid"].clone();
    let old = old.clone();
    server_defaults(&mut slice, Some(&old));
    let rv = st.next_version();
    slice["metadata"]["resourceVersion"] = json!(rv);
    st.slices.insert(name, slice.clone());
    st.emit("MODIFIED", &slice);
    Ok((StatusCode::OK, Json(slice)))
}

async fn delete_slice(State(s): State<Shared>, h: HeaderMap, UrlPath(name): UrlPath<String>) -> Reply {
    let id = authorized(&s, &h, "delete", SLICES, "", &name)?;
    let old = lock(&s).slices.get(&name).cloned();
    if let Some(old) = old {
        admitted(&s, &id, "DELETE", None, Some(&old))?;
    }
    let mut st = lock(&s);
    st.log.push(format!("DELETE resourceslice {name}"));
    match st.slices.remove(&name) {
        Some(v) => {
            st.emit("DELETED", &v);
            Ok((StatusCode::OK, Json(v)))
        }
        None => Err(status(StatusCode::NOT_FOUND, "NotFound", format!("resourceslices {name:?} not found"), vec![])),
    }
}

async fn delete_slices(State(s): State<Shared>, h: HeaderMap, Query(q): Query<BTreeMap<String, String>>) -> Reply {
    let id = authorized(&s, &h, "deletecollection", SLICES, "", "")?;
    let sel = selector(&q)?;
    // Admission sees each object of a collection delete as a DELETE of it.
    let doomed: Vec<Value> = lock(&s).slices.values().filter(|v| matches(v, &sel)).cloned().collect();
    for old in &doomed {
        admitted(&s, &id, "DELETE", None, Some(old))?;
    }
    let mut st = lock(&s);
    st.log.push(format!("DELETECOLLECTION resourceslices {}", q.get("fieldSelector").cloned().unwrap_or_default()));
    let gone: Vec<Value> = st.slices.values().filter(|v| matches(v, &sel)).cloned().collect();
    st.slices.retain(|_, v| !matches(v, &sel));
    for v in &gone {
        st.emit("DELETED", v);
    }
    Ok((
        StatusCode::OK,
        Json(json!({ "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList", "metadata": {}, "items": gone })),
    ))
}

async fn get_claim(State(s): State<Shared>, h: HeaderMap, UrlPath((ns, name)): UrlPath<(String, String)>) -> Reply {
    authorized(&s, &h, "get", ("resource.k8s.io", "resourceclaims", ""), &ns, &name)?;
    let mut st = lock(&s);
    st.log.push(format!("GET resourceclaim {ns}/{name}"));
    match st.claims.get(&(ns.clone(), name.clone())) {
        Some(v) => Ok((StatusCode::OK, Json(v.clone()))),
        None => Err(status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("resourceclaims.resource.k8s.io {name:?} not found"),
            vec![],
        )),
    }
}

/// A claim's `status.devices` by server-side apply, as kube-apiserver takes it: only an apply
/// patch (`application/apply-patch+yaml`, else 415), only with a `fieldManager` (else 400),
/// every entry an allocated device of the claim, at most 8 conditions each with the fields
/// `metav1.Condition` requires, `data` at most 10 KiB, `networkData` within its limits (else 422
/// naming the field); another manager's entry is taken over only with `force=true` (else 409).
/// The list is a map keyed by (driver, pool, device, shareID): an apply replaces the entries its
/// manager applied before.
async fn apply_claim_status(
    State(s): State<Shared>,
    h: HeaderMap,
    UrlPath((ns, name)): UrlPath<(String, String)>,
    Query(q): Query<BTreeMap<String, String>>,
    body: axum::body::Bytes,
) -> Reply {
    let id = authorized(&s, &h, "patch", ("resource.k8s.io", "resourceclaims", "status"), &ns, &name)?;
    let kind = h.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("");
    if kind.split(';').next().map(str::trim) != Some("application/apply-patch+yaml") {
        return Err(status(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (got {kind:?})"
            ),
            vec![],
        ));
    }
    let Some(manager) = q.get("fieldManager").filter(|m| !m.is_empty()).cloned() else {
        return Err(status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "fieldManager is required for apply requests".into(),
            vec![],
        ));
    };
    let force = q.get("force").is_some_and(|f| f == "true");
    let patch: Value = serde_json::from_slice(&body)
        .map_err(|e| status(StatusCode::BAD_REQUEST, "BadRequest", format!("error decoding patch: {e}"), vec![]))?;
    let invalid = |field: String, message: String| {
        status(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            format!("ResourceClaim.resource.k8s.io {name:?} is invalid: {field}: {message}"),
            vec![json!({ "field": field, "message": message })],
        )
    };
    if patch["apiVersion"] != "resource.k8s.io/v1"
        || patch["kind"] != "ResourceClaim"
        || patch["metadata"]["name"] != name.as_str()
    {
        return Err(status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "the apply patch names another object".into(),
            vec![],
        ));
    }
    let mut st = lock(&s);
    st.log.push(format!("APPLY resourceclaim/status {ns}/{name}"));
    let key = (ns.clone(), name.clone());
    let Some(claim) = st.claims.get(&key).cloned() else {
        return Err(status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("resourceclaims.resource.k8s.io {name:?} not found"),
            vec![],
        ));
    };
    let allocated: Vec<Value> = claim["status"]["allocation"]["devices"]["results"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| json!([r["driver"], r["pool"], r["device"], r["shareID"]]))
        .collect();
    let applied: Vec<Value> = patch["status"]["devices"].as_array().cloned().unwrap_or_default();
    let mut keys = Vec::new();
    for (i, d) in applied.iter().enumerate() {
        let at = format!("status.devices[{i}]");
        for f in ["driver", "pool", "device"] {
            if d[f].as_str().is_none_or(str::is_empty) {
                return Err(invalid(format!("{at}.{f}"), "Required value".into()));
            }
        }
        let k = json!([d["driver"], d["pool"], d["device"], d["shareID"]]);
        if !allocated.contains(&k) {
            return Err(invalid(at, format!("Invalid value: {k}: must be an allocated device in the claim")));
        }
        if keys.contains(&k) {
            return Err(invalid(at, format!("Duplicate value: {k}")));
        }
        keys.push(k);
        let conditions = d["conditions"].as_array().cloned().unwrap_or_default();
        if conditions.len() > 8 {
            return Err(invalid(
                format!("{at}.conditions"),
                format!("Too many: {}: must have at most 8 items", conditions.len()),
            ));
        }
        for (j, c) in conditions.iter().enumerate() {
            let cat = format!("{at}.conditions[{j}]");
            if c["type"].as_str().is_none_or(str::is_empty) {
                return Err(invalid(format!("{cat}.type"), "Required value".into()));
            }
            if !matches!(c["status"].as_str(), Some("True" | "False" | "Unknown")) {
                return Err(invalid(format!("{cat}.status"), format!("Unsupported value: {}", c["status"])));
            }
            let reason_ok = c["reason"].as_str().is_some_and(|r| {
                !r.is_empty()
                    && r.len() <= 1024
                    && r.starts_with(|ch: char| ch.is_ascii_alphabetic())
                    && r.chars().all(|ch| ch.is_ascii_alphanumeric() || "_,:".contains(ch))
                    && !r.ends_with([',', ':'])
            });
            if !reason_ok {
                return Err(invalid(format!("{cat}.reason"), format!("Invalid value: {}", c["reason"])));
            }
            if c["lastTransitionTime"].as_str().is_none_or(|t| humantime::parse_rfc3339(t).is_err()) {
                return Err(invalid(format!("{cat}.lastTransitionTime"), "Required value: must be set".into()));
            }
            if c["message"].as_str().is_some_and(|m| m.len() > 32768) {
                return Err(invalid(format!("{cat}.message"), "Too long: may not be more than 32768 bytes".into()));
            }
        }
        if d["data"].to_string().len() > 10 * 1024 && !d["data"].is_null() {
            return Err(invalid(format!("{at}.data"), "Too long: must have at most 10240 bytes".into()));
        }
        let net = &d["networkData"];
        if net["interfaceName"].as_str().is_some_and(|n| n.len() > 256) {
            return Err(invalid(
                format!("{at}.networkData.interfaceName"),
                "Too long: may not be more than 256 bytes".into(),
            ));
        }
        if net["hardwareAddress"].as_str().is_some_and(|n| n.len() > 128) {
            return Err(invalid(
                format!("{at}.networkData.hardwareAddress"),
                "Too long: may not be more than 128 bytes".into(),
            ));
        }
    }
    // Ownership: another manager's entry is taken over only by force.
    let owners_before = st.status_owners.get(&key).cloned();
    let owners = st.status_owners.entry(key.clone()).or_default();
    if !force
        && let Some((other, _)) = owners.iter().find(|(m, ks)| **m != manager && ks.iter().any(|k| keys.contains(k)))
    {
        return Err(status(
            StatusCode::CONFLICT,
            "Conflict",
            format!("Apply failed with 1 conflict: conflict with {other:?}: .status.devices"),
            vec![],
        ));
    }
    let before: Vec<Value> = owners.get(&manager).cloned().unwrap_or_default();
    for ks in owners.values_mut() {
        ks.retain(|k| !keys.contains(k));
    }
    owners.insert(manager, keys.clone());
    let still_owned: Vec<Value> = owners.values().flatten().cloned().collect();
    let entry_key = |d: &Value| json!([d["driver"], d["pool"], d["device"], d["shareID"]]);
    let old_devices: Vec<Value> = claim["status"]["devices"].as_array().cloned().unwrap_or_default();
    let mut devices = old_devices.clone();
    // Drop what this manager applied before and no longer applies (unless someone else owns it).
    devices.retain(|d| {
        let k = entry_key(d);
        let dropped = before.contains(&k) && !still_owned.contains(&k);
        !keys.contains(&k) && !dropped
    });
    devices.extend(applied);
    // The drivers whose entries this apply adds, changes or removes (upstream's
    // `getModifiedDrivers`) need the granular rule.
    let mut changed = std::collections::BTreeSet::new();
    for d in &devices {
        if !old_devices.iter().any(|o| entry_key(o) == entry_key(d) && o == d) {
            changed.insert(d["driver"].as_str().unwrap_or("").to_owned());
        }
    }
    for o in &old_devices {
        if !devices.iter().any(|d| entry_key(d) == entry_key(o)) {
            changed.insert(o["driver"].as_str().unwrap_or("").to_owned());
        }
    }
    let rules = st.rules.clone();
    if let Err(refused) = authz::device_status(&id, &rules, "patch", &claim, &changed) {
        match owners_before {
            Some(o) => st.status_owners.insert(key, o),
            None => st.status_owners.remove(&key),
        };
        return Err(refused);
    }
    let rv = st.next_version();
    let claim = st.claims.get_mut(&key).expect("looked up above");
    if devices.is_empty() {
        claim["status"].as_object_mut().map(|o| o.remove("devices"));
    } else {
        claim["status"]["devices"] = json!(devices);
    }
    claim["metadata"]["resourceVersion"] = json!(rv);
    Ok((StatusCode::OK, Json(claim.clone())))
}

impl ApiServer {
    /// The `status.devices` of claim `namespace/name`, as stored.
    pub fn claim_status_devices(&self, namespace: &str, name: &str) -> Vec<Value> {
        let st = lock(&self.store);
        st.claims
            .get(&(namespace.to_owned(), name.to_owned()))
            .and_then(|c| c["status"]["devices"].as_array().cloned())
            .unwrap_or_default()
    }

    /// Serve on a free localhost port, with these Nodes (each gets a UID); for tests, which
    /// cannot go on without it.
    pub async fn start(nodes: &[&str]) -> ApiServer {
        match Self::try_start(nodes).await {
            Ok(api) => api,
            Err(e) => panic!("start the API-server stand-in: {e}"),
        }
    }

    /// [`start`](Self::start), saying why it could not.
    pub async fn try_start(nodes: &[&str]) -> std::io::Result<ApiServer> {
        let store: Shared = Arc::default();
        lock(&store).token = random_token();
        lock(&store).events = Some(tokio::sync::broadcast::channel(1024).0);
        for n in nodes {
            lock(&store).nodes.insert(
                (*n).to_owned(),
                json!({ "apiVersion": "v1", "kind": "Node", "metadata": { "name": n, "uid": format!("node-uid-{n}"), "resourceVersion": "1" } }),
            );
        }
        let slices = "/apis/resource.k8s.io/v1/resourceslices";
        let app = Router::new()
            .route("/api/v1/nodes/{name}", get(get_node))
            .route(slices, get(list_or_watch).post(create_slice).delete(delete_slices))
            .route(&format!("{slices}/{{name}}"), get(get_slice).put(replace_slice).delete(delete_slice))
            .route("/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}", get(get_claim))
            .route(
                "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}/status",
                axum::routing::patch(apply_claim_status),
            )
            .with_state(store.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let stop = CancellationToken::new();
        let until = stop.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).with_graceful_shutdown(until.cancelled_owned()).await;
        });
        Ok(ApiServer { addr, store, stop })
    }

    /// The bearer token this stand-in accepts.
    pub fn token(&self) -> String {
        lock(&self.store).token.clone()
    }

    /// A token of ServiceAccount `namespace/name` bound to a Pod on `node` (a projected token,
    /// whose requests carry the node's name), or to no node; it may do what
    /// [`grant`](Self::grant) gave ServiceAccounts, no more.
    pub fn service_account_token(&self, namespace: &str, name: &str, node: Option<&str>) -> String {
        let token = random_token();
        let id =
            Identity::ServiceAccount { namespace: namespace.into(), name: name.into(), node: node.map(str::to_owned) };
        lock(&self.store).accounts.insert(token.clone(), id);
        token
    }

    /// Give ServiceAccounts these RBAC rules (a ClusterRole's `rules`, bound to them).
    pub fn grant(&self, rules: Vec<authz::Rule>) {
        lock(&self.store).rules = rules;
    }

    /// Enforce a slice policy as a ValidatingAdmissionPolicy and its `Deny` binding would.
    pub fn enforce(&self, policy: authz::SlicePolicy) {
        lock(&self.store).slice_policy = Some(policy);
    }

    /// A kubeconfig for this server and `token` (see [`service_account_token`](Self::service_account_token)).
    pub fn kubeconfig_with(&self, token: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: standin\n  cluster:\n    server: http://{}\nusers:\n- name: devplug\n  user:\n    token: {}\ncontexts:\n- name: standin\n  context:\n    cluster: standin\n    user: devplug\ncurrent-context: standin\n",
            self.addr, token
        )
    }

    /// Let `n` slice writes through, then refuse one (as a quota admission plugin would).
    pub fn refuse_write_after(&self, n: usize) {
        lock(&self.store).refuse_after = Some(n);
    }

    /// A kubeconfig for this server (its address and token).
    pub fn kubeconfig(&self) -> String {
        self.kubeconfig_with(&self.token())
    }

    /// [`kubeconfig`](Self::kubeconfig) written to `path`, for tests (which give it a
    /// private temporary directory; `devplug try` writes it through its own state files).
    pub fn write_kubeconfig(&self, path: &Path) {
        if let Err(e) = std::fs::write(path, self.kubeconfig()) {
            panic!("write kubeconfig {}: {e}", path.display());
        }
    }

    /// The slices of `node` (and `driver`, when given), by name.
    pub fn slices(&self, node: &str, driver: Option<&str>) -> BTreeMap<String, Value> {
        self.store
            .lock()
            .unwrap()
            .slices
            .iter()
            .filter(|(_, v)| v["spec"]["nodeName"] == node && driver.is_none_or(|d| v["spec"]["driver"] == d))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Every device of `node`'s pool of `driver`, by name, as the scheduler sees it: only once
    /// every slice of the newest generation is there (`resourceSliceCount` of them), else none.
    pub fn devices(&self, node: &str, driver: &str) -> BTreeMap<String, Value> {
        let slices = self.slices(node, Some(driver));
        let newest = slices.values().filter_map(|s| s["spec"]["pool"]["generation"].as_i64()).max();
        let current: Vec<&Value> =
            slices.values().filter(|s| s["spec"]["pool"]["generation"].as_i64() == newest).collect();
        let complete = current.first().and_then(|s| s["spec"]["pool"]["resourceSliceCount"].as_u64())
            == Some(current.len() as u64);
        current
            .into_iter()
            .filter(|_| complete)
            .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
            .filter_map(|d| Some((d["name"].as_str()?.to_owned(), d)))
            .collect()
    }

    /// What kubelet does at its start: delete every slice of `node` (watchers are told).
    pub fn wipe(&self, node: &str) -> usize {
        let mut st = lock(&self.store);
        let gone: Vec<Value> = st.slices.values().filter(|v| v["spec"]["nodeName"] == node).cloned().collect();
        st.slices.retain(|_, v| v["spec"]["nodeName"] != node);
        for v in &gone {
            st.emit("DELETED", v);
        }
        gone.len()
    }

    /// Store a claim allocated `devices` (request, driver, pool, device) — the scheduler's work.
    pub fn allocate_claim(&self, namespace: &str, name: &str, uid: &str, devices: &[(&str, &str, &str, &str)]) {
        self.allocate_claim_with_config(namespace, name, uid, devices, &[]);
    }

    /// [`allocate_claim`](Self::allocate_claim) of shares of devices several claims may hold
    /// (`allowMultipleAllocations`): each result carries the `shareID` the scheduler gives it
    /// (a UUID) and the share it consumed (`consumedCapacity`).
    pub fn allocate_shared_claim(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        devices: &[(&str, &str, &str, &str, &str)],
    ) {
        let plain: Vec<(&str, &str, &str, &str)> = devices.iter().map(|(r, d, p, n, _)| (*r, *d, *p, *n)).collect();
        self.allocate_claim(namespace, name, uid, &plain);
        let mut store = lock(&self.store);
        let claim = store.claims.get_mut(&(namespace.to_owned(), name.to_owned())).expect("just stored");
        for (result, (.., share)) in
            claim["status"]["allocation"]["devices"]["results"].as_array_mut().unwrap().iter_mut().zip(devices)
        {
            result["shareID"] = json!(share);
            result["consumedCapacity"] = json!({ "shares": "1" });
        }
    }

    /// Store claim `namespace/name` with its UID, its spec as the user wrote it and the
    /// allocation the scheduler made (`status.allocation`), as a scheduler's status update leaves
    /// it for kubelet and the drivers to read.
    pub fn put_claim(&self, namespace: &str, name: &str, uid: &str, spec: Value, allocation: Value) {
        let claim = json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": { "name": name, "namespace": namespace, "uid": uid, "resourceVersion": "1" },
            "spec": spec,
            "status": { "allocation": allocation },
        });
        lock(&self.store).claims.insert((namespace.to_owned(), name.to_owned()), claim);
    }

    /// Forget claim `namespace/name` (deleted once its pod is gone).
    pub fn delete_claim(&self, namespace: &str, name: &str) {
        lock(&self.store).claims.remove(&(namespace.to_owned(), name.to_owned()));
    }

    /// [`allocate_claim`](Self::allocate_claim) with opaque configuration: (driver, parameters).
    pub fn allocate_claim_with_config(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        devices: &[(&str, &str, &str, &str)],
        config: &[(&str, Value)],
    ) {
        let results: Vec<Value> = devices
            .iter()
            .map(|(request, driver, pool, device)| json!({ "request": request, "driver": driver, "pool": pool, "device": device }))
            .collect();
        let mut claim = json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": { "name": name, "namespace": namespace, "uid": uid, "resourceVersion": "1" },
            "spec": { "devices": { "requests": devices.iter().map(|(r, ..)| json!({ "name": r, "exactly": { "deviceClassName": "devplug" } })).collect::<Vec<_>>() } },
            "status": { "allocation": { "devices": {
                "results": results,
                "config": config.iter().map(|(driver, parameters)| json!({ "source": "FromClaim", "opaque": { "driver": driver, "parameters": parameters } })).collect::<Vec<_>>(),
            } } },
        });
        let mut st = lock(&self.store);
        // As kube-scheduler does for devices of a node-local pool: the allocation is for the
        // node the pool's slices name (what the granular status rule compares a token's node to).
        let node = devices.first().and_then(|(_, driver, pool, _)| {
            st.slices.values().find(|s| s["spec"]["driver"] == *driver && s["spec"]["pool"]["name"] == *pool)
        });
        if let Some(node) = node.and_then(|s| s["spec"]["nodeName"].as_str()) {
            claim["status"]["allocation"]["nodeSelector"] = json!({ "nodeSelectorTerms": [
                { "matchFields": [{ "key": "metadata.name", "operator": "In", "values": [node] }] }
            ] });
        }
        st.claims.insert((namespace.to_owned(), name.to_owned()), claim);
    }

    /// The requests seen, as "METHOD what".
    pub fn log(&self) -> Vec<String> {
        lock(&self.store).log.clone()
    }
}

impl ApiServer {
    /// `POST path` with `body` and the token, as any client would; (status, answer).
    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.send_as(&self.token(), "POST", path, "application/json", Some(body)).await
    }

    /// `method path` as the holder of `token`, with `content_type`; (status, answer).
    pub async fn send_as(
        &self,
        token: &str,
        method: &str,
        path: &str,
        content_type: &str,
        body: Option<&Value>,
    ) -> (u16, Value) {
        use http_body_util::{BodyExt, Full};
        let stream = tokio::net::TcpStream::connect(self.addr).await.expect("connect to the stand-in");
        let (mut send, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.expect("HTTP handshake");
        tokio::spawn(conn);
        let bytes = body.map(|b| serde_json::to_vec(b).expect("JSON")).unwrap_or_default();
        let req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", self.addr.to_string())
            .header("content-type", content_type)
            .header("authorization", format!("Bearer {token}"))
            .body(Full::new(bytes::Bytes::from(bytes)))
            .expect("request");
        let resp = send.send_request(req).await.expect("the stand-in answers");
        let code = resp.status().as_u16();
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }
}
