//! kube-scheduler's structured-parameters allocator (k8s.io/dynamic-resource-allocation/structured,
//! `allocator_stable.go` and, for shared devices, the incubating channel's consumable capacity)
//! for one claim on one node. Its rules, in upstream's order:
//! - pools are the node's (`nodeName`, or `allNodes`) at their newest generation, and only
//!   complete, valid ones (every slice of that generation is there, no device name twice); a
//!   request for `All` devices while a pool is incomplete is an error, not a wait; pools are
//!   tried by driver and name (upstream's order is a Go map's, so any order is upstream's),
//!   a pool's slices by name;
//! - a device serves a request when its class's selectors and then the request's all match
//!   (CEL, [`super::cel`]; a runtime error fails the allocation, naming class or claim, selector
//!   and device), it is not in use (by another claim, or this one, unless it allows multiple
//!   allocations), its `NoSchedule`/`NoExecute` taints are tolerated, the counters it consumes
//!   fit what its pool's counter sets have left, and the claim's constraints still hold;
//! - requests are served in order, a `firstAvailable` request by its first subrequest that
//!   works; the first complete solution wins (a depth-first search over devices in pool and
//!   slice order), or none does: the claim is unschedulable on this node.
//!
//! Left out, as nothing devplug publishes needs them: per-device node selection, binding
//! conditions, admin access (refused by [`super::claim::validate`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::resource::v1::{
    DeviceClass, DeviceConstraint, DeviceSelector, DeviceToleration, ResourceClaimSpec,
};
use kube_quantity::ParsedQuantity;
use serde_json::{Value as Json, json};

use super::cel::{Selector, Selectors};

mod explain;

/// How many device choices (each device looked at for a request counts) the search may make
/// before it gives up, as the scheduler's filter gives up when its context times out: a claim no
/// node can serve must not hang `try`. Counting only the choices taken let an unsatisfiable
/// claim over 8,192 devices run for minutes far below the cap.
pub const MAX_STEPS: usize = 2_000_000;

/// The time one claim's search may take: kube-scheduler bounds its DRA filter the same way
/// (`DRASchedulerFilterTimeout`, 10 s by default); `try` answers a person at a terminal, so a
/// second. Past it the claim is unschedulable, "timed out", with what was found until then.
pub const TIME_BUDGET: std::time::Duration = std::time::Duration::from_secs(1);

/// Why a claim was not allocated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    /// No combination of this node's devices serves the claim: the scheduler's
    /// "cannot allocate all claims", with what each request found.
    #[error("cannot allocate all claims on node {node}: {why}")]
    Unschedulable { node: String, why: String },
    /// The allocation itself failed (a selector's runtime error, an unknown class, an
    /// incomplete pool for `All`).
    #[error("{0}")]
    Failed(String),
    /// The search ran out of its time or steps (turned into `Unschedulable` before it leaves
    /// [`allocate`]).
    #[error("timed out")]
    TimedOut,
}

/// One device a slice publishes, with its place.
struct Candidate<'a> {
    driver: &'a str,
    pool: &'a str,
    node_local: bool,
    device: &'a Json,
}

impl Candidate<'_> {
    fn id(&self) -> String {
        format!("{}/{}/{}", self.driver, self.pool, self.device["name"].as_str().unwrap_or(""))
    }
}

/// A pool's counter sets: set → counter → value.
type CounterSets = BTreeMap<String, BTreeMap<String, ParsedQuantity>>;

/// The node's complete pools: their devices in order and their counter sets.
struct Pools<'a> {
    devices: Vec<Candidate<'a>>,
    /// By (driver, pool).
    counters: BTreeMap<(&'a str, &'a str), CounterSets>,
    incomplete: Vec<String>,
}

fn quantity(v: &Json) -> Option<ParsedQuantity> {
    ParsedQuantity::try_from(v.as_str()?).ok()
}

fn gather<'a>(node: &str, slices: &'a [Json]) -> Pools<'a> {
    let mut by_pool: BTreeMap<(&str, &str), Vec<&Json>> = BTreeMap::new();
    for s in slices {
        let spec = &s["spec"];
        if spec["nodeName"] != node && spec["allNodes"] != true {
            continue;
        }
        let (Some(driver), Some(pool)) = (spec["driver"].as_str(), spec["pool"]["name"].as_str()) else { continue };
        by_pool.entry((driver, pool)).or_default().push(s);
    }
    let mut pools = Pools { devices: Vec::new(), counters: BTreeMap::new(), incomplete: Vec::new() };
    for ((driver, pool), mut slices) in by_pool {
        let newest = slices.iter().filter_map(|s| s["spec"]["pool"]["generation"].as_i64()).max();
        slices.retain(|s| s["spec"]["pool"]["generation"].as_i64() == newest);
        slices.sort_by_key(|s| s["metadata"]["name"].as_str().unwrap_or("").to_owned());
        let count = slices.first().and_then(|s| s["spec"]["pool"]["resourceSliceCount"].as_u64());
        if count != Some(slices.len() as u64) {
            pools.incomplete.push(format!("{driver}/{pool}"));
            continue;
        }
        // A device name twice in a pool makes the pool invalid (`poolIsInvalid`): nothing of it
        // is allocated.
        let mut names = BTreeSet::new();
        let all = slices.iter().flat_map(|s| s["spec"]["devices"].as_array().into_iter().flatten());
        if !all.map(|d| d["name"].as_str().unwrap_or("")).all(|n| names.insert(n)) {
            pools.incomplete.push(format!("{driver}/{pool} (invalid: a device name is there twice)"));
            continue;
        }
        for s in slices {
            for set in s["spec"]["sharedCounters"].as_array().into_iter().flatten() {
                let counters = set["counters"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .filter_map(|(k, v)| Some((k.clone(), quantity(&v["value"])?)))
                    .collect();
                let name = set["name"].as_str().unwrap_or("").to_owned();
                pools.counters.entry((driver, pool)).or_default().insert(name, counters);
            }
            let node_local = s["spec"]["nodeName"] == node;
            for device in s["spec"]["devices"].as_array().into_iter().flatten() {
                pools.devices.push(Candidate { driver, pool, node_local, device });
            }
        }
    }
    pools
}

/// One way to serve a request: the request itself, or one of its `firstAvailable` subrequests.
struct Alternative<'a> {
    /// As the result names it: `gpu`, or `gpu/small` for a subrequest.
    name: String,
    class: &'a DeviceClass,
    class_selectors: Vec<Selector>,
    selectors: Vec<Selector>,
    all: bool,
    count: usize,
    tolerations: &'a [DeviceToleration],
    capacity: BTreeMap<String, ParsedQuantity>,
}

/// A device picked for a request.
struct Pick {
    request: usize,
    alternative: usize,
    device: usize,
    /// What a shared device's allocation consumes of each of its capacities.
    consumed: Option<BTreeMap<String, ParsedQuantity>>,
}

/// The devices other claims hold: exclusive ones (by `driver/pool/device`), and what shared
/// ones and counter sets have given away.
#[derive(Default)]
struct InUse {
    exclusive: BTreeSet<String>,
    capacity: HashMap<(String, String), ParsedQuantity>,
}

struct Search<'a> {
    node: &'a str,
    claim: &'a str,
    pools: Pools<'a>,
    requests: Vec<Vec<Alternative<'a>>>,
    constraints: &'a [DeviceConstraint],
    in_use: InUse,
    /// Every pick of other claims and this one, for counters: (device index, pick).
    held: Vec<usize>,
    picks: Vec<Pick>,
    chosen: Vec<usize>,
    matches: HashMap<(usize, usize, usize), bool>,
    steps: usize,
    deadline: std::time::Instant,
}

fn selectors(s: &Selectors, list: &[DeviceSelector], whose: &str) -> Result<Vec<Selector>, AllocError> {
    list.iter()
        .enumerate()
        .map(|(i, sel)| {
            let expression = sel.cel.as_ref().map(|c| c.expression.as_str()).unwrap_or("");
            s.compile(expression).map_err(|e| AllocError::Failed(format!("{whose}: selector #{i}: CEL {e}")))
        })
        .collect()
}

/// The deadline of a search started now: [`TIME_BUDGET`] away.
pub fn deadline() -> std::time::Instant {
    std::time::Instant::now() + TIME_BUDGET
}

/// Allocate claim `namespace/name` (`spec`) on `node` from `slices` (every ResourceSlice the
/// API server has), given the DeviceClasses by name and the allocation results of the claims
/// already allocated (`status.allocation.devices.results` entries), giving up at `deadline`
/// (normally [`deadline()`]). The answer is the claim's `status.allocation`.
#[allow(clippy::too_many_arguments)]
pub fn allocate(
    deadline: std::time::Instant,
    cel: &Selectors,
    node: &str,
    slices: &[Json],
    classes: &BTreeMap<String, DeviceClass>,
    allocated: &[Json],
    namespace: &str,
    name: &str,
    spec: &ResourceClaimSpec,
) -> Result<Json, AllocError> {
    let claim = format!("{namespace}/{name}");
    let pools = gather(node, slices);
    let devices = spec.devices.as_ref();
    let mut requests = Vec::new();
    for r in devices.and_then(|d| d.requests.as_deref()).unwrap_or_default() {
        let mut alternatives = Vec::new();
        let subs: Vec<_> = match (&r.exactly, &r.first_available) {
            (Some(e), _) => vec![(
                r.name.clone(),
                &e.device_class_name,
                e.selectors.as_deref().unwrap_or_default(),
                e.allocation_mode.as_deref(),
                e.count,
                e.tolerations.as_deref().unwrap_or_default(),
                e.capacity.as_ref().and_then(|c| c.requests.as_ref()),
            )],
            (None, Some(subs)) => subs
                .iter()
                .map(|s| {
                    (
                        format!("{}/{}", r.name, s.name),
                        &s.device_class_name,
                        s.selectors.as_deref().unwrap_or_default(),
                        s.allocation_mode.as_deref(),
                        s.count,
                        s.tolerations.as_deref().unwrap_or_default(),
                        s.capacity.as_ref().and_then(|c| c.requests.as_ref()),
                    )
                })
                .collect(),
            (None, None) => {
                return Err(AllocError::Failed(format!(
                    "claim {claim}, request {}: missing device class name (unsupported request type?)",
                    r.name
                )));
            }
        };
        for (alt_name, class_name, sels, mode, count, tolerations, capacity) in subs {
            let class = classes.get(class_name).ok_or_else(|| {
                // Only a class of the same kind (its first label, `gpu` of
                // `gpu.nvidia.com.devplug.io`, close to the one asked): a GPU class is no
                // suggestion for an EFA request, however alike the rest of the names.
                let kind = |n: &str| n.split('.').next().unwrap_or("").to_owned();
                let asked = kind(class_name);
                let closest = classes
                    .keys()
                    .filter(|k| strsim::levenshtein(&kind(k), &asked) <= asked.len() / 3)
                    .map(|k| (strsim::levenshtein(k, class_name), k))
                    .min()
                    .filter(|(d, _)| *d <= class_name.len() / 2)
                    .map(|(_, k)| format!("; did you mean {k}?"))
                    .unwrap_or_default();
                AllocError::Failed(format!(
                    "claim {claim}, request {alt_name}: could not retrieve device class {class_name}: deviceclass.resource.k8s.io {class_name:?} not found (classes here: {}){closest}",
                    classes.keys().cloned().collect::<Vec<_>>().join(", ")
                ))
            })?;
            let class_sels = class.spec.selectors.as_deref().unwrap_or_default();
            let mut cap = BTreeMap::new();
            for (k, q) in capacity.into_iter().flatten() {
                let v = ParsedQuantity::try_from(q.0.as_str()).map_err(|_| {
                    AllocError::Failed(format!(
                        "claim {claim}, request {alt_name}: capacity {k}: invalid quantity {:?}",
                        q.0
                    ))
                })?;
                cap.insert(k.clone(), v);
            }
            alternatives.push(Alternative {
                name: alt_name,
                class,
                class_selectors: selectors(cel, class_sels, &format!("class {class_name}"))?,
                selectors: selectors(cel, sels, &format!("claim {claim}"))?,
                all: mode == Some("All"),
                count: count.unwrap_or(1).max(0) as usize,
                tolerations,
                capacity: cap,
            });
        }
        requests.push(alternatives);
    }
    let mut in_use = InUse::default();
    let mut held = Vec::new();
    for r in allocated {
        let id = format!(
            "{}/{}/{}",
            r["driver"].as_str().unwrap_or(""),
            r["pool"].as_str().unwrap_or(""),
            r["device"].as_str().unwrap_or("")
        );
        if let Some(i) = pools.devices.iter().position(|c| c.id() == id) {
            held.push(i);
        }
        match r["consumedCapacity"].as_object() {
            Some(consumed) if r["shareID"].is_string() => {
                for (k, v) in consumed {
                    if let Some(q) = quantity(v) {
                        *in_use.capacity.entry((id.clone(), k.clone())).or_default() += q;
                    }
                }
            }
            _ if r["shareID"].is_string() => {}
            _ => {
                in_use.exclusive.insert(id);
            }
        }
    }
    let constraints = devices.and_then(|d| d.constraints.as_deref()).unwrap_or_default();
    let mut search = Search {
        node,
        claim: &claim,
        pools,
        requests,
        constraints,
        in_use,
        held,
        picks: Vec::new(),
        chosen: Vec::new(),
        matches: HashMap::new(),
        steps: 0,
        deadline,
    };
    match search.solve(0) {
        Ok(true) => Ok(search.result(spec)),
        Ok(false) => Err(AllocError::Unschedulable { node: node.to_owned(), why: search.explain() }),
        Err(AllocError::TimedOut) => {
            let tried = search.steps;
            let found = search.explain();
            Err(AllocError::Unschedulable {
                node: node.to_owned(),
                why: format!(
                    "timed out after {tried} device choices ({TIME_BUDGET:?} at most, as the scheduler's filter times out): {found}; narrow the selectors or the counts"
                ),
            })
        }
        Err(e) => Err(e),
    }
}

/// Whether `tolerations` tolerate `taint` (core/v1 toleration matching, for devices).
fn tolerated(taint: &Json, tolerations: &[DeviceToleration]) -> bool {
    tolerations.iter().any(|t| {
        let key_ok = match t.key.as_deref() {
            None | Some("") => t.operator.as_deref() == Some("Exists"),
            Some(k) => taint["key"] == k,
        };
        let value_ok = match t.operator.as_deref() {
            Some("Exists") => true,
            _ => taint["value"].as_str().unwrap_or("") == t.value.as_deref().unwrap_or(""),
        };
        let effect_ok = t.effect.as_deref().is_none_or(|e| e.is_empty() || taint["effect"] == e);
        key_ok && value_ok && effect_ok
    })
}

/// The attribute `name` (fully qualified) of a device of `driver`: under its own name, or, in
/// the driver's domain, under the name without it.
fn attribute<'a>(device: &'a Json, driver: &str, name: &str) -> Option<&'a Json> {
    let attrs = &device["attributes"];
    if let Some(v) = attrs.get(name) {
        return Some(v);
    }
    let (domain, id) = name.split_once('/')?;
    if domain != driver {
        return None;
    }
    attrs.get(id)
}

impl Search<'_> {
    /// One device choice; the search's budget, in steps and in time.
    fn step(&mut self) -> Result<(), AllocError> {
        self.steps += 1;
        if self.steps > MAX_STEPS {
            return Err(AllocError::TimedOut);
        }
        self.in_time()
    }

    /// The deadline, read where the time goes: before every choice and every selector run (one
    /// selector the estimate admits may take milliseconds; reading the clock once per 1,024
    /// choices let a claim run 18 s past its second).
    fn in_time(&self) -> Result<(), AllocError> {
        if std::time::Instant::now() > self.deadline { Err(AllocError::TimedOut) } else { Ok(()) }
    }

    fn solve(&mut self, request: usize) -> Result<bool, AllocError> {
        if request == self.requests.len() {
            return Ok(true);
        }
        for alternative in 0..self.requests[request].len() {
            let all = if self.requests[request][alternative].all {
                if let Some(p) = self.pools.incomplete.first() {
                    return Err(AllocError::Failed(format!(
                        "claim {}, request {}: asks for all devices, but resource pool {p} is currently being updated",
                        self.claim, self.requests[request][alternative].name
                    )));
                }
                let mut all = Vec::new();
                for d in 0..self.pools.devices.len() {
                    if self.selectable(request, alternative, d)? {
                        all.push(d);
                    }
                }
                if all.is_empty() {
                    continue;
                }
                Some(all)
            } else {
                None
            };
            if self.pick(request, alternative, all.as_deref(), 0, 0)? {
                self.chosen.push(alternative);
                return Ok(true);
            }
        }
        Ok(false)
    }

    fn pick(
        &mut self,
        request: usize,
        alternative: usize,
        all: Option<&[usize]>,
        k: usize,
        start: usize,
    ) -> Result<bool, AllocError> {
        self.step()?;
        let wanted = all.map_or(self.requests[request][alternative].count, <[usize]>::len);
        if k == wanted {
            if self.solve(request + 1)? {
                return Ok(true);
            }
            return Ok(false);
        }
        if let Some(all) = all {
            let d = all[k];
            let Some(consumed) = self.available(request, alternative, d) else { return Ok(false) };
            if !self.constraints_hold(request, alternative, d) {
                return Err(AllocError::Failed(format!(
                    "claim {}, request {}: cannot add device {} because a claim constraint would not be satisfied",
                    self.claim,
                    self.requests[request][alternative].name,
                    self.pools.devices[d].id()
                )));
            }
            self.picks.push(Pick { request, alternative, device: d, consumed });
            if self.pick(request, alternative, Some(all), k + 1, 0)? {
                return Ok(true);
            }
            self.picks.pop();
            return Ok(false);
        }
        for d in start..self.pools.devices.len() {
            self.step()?;
            if !self.selectable(request, alternative, d)? {
                continue;
            }
            let Some(consumed) = self.available(request, alternative, d) else { continue };
            if !self.constraints_hold(request, alternative, d) {
                continue;
            }
            self.picks.push(Pick { request, alternative, device: d, consumed });
            if self.pick(request, alternative, None, k + 1, d + 1)? {
                return Ok(true);
            }
            self.picks.pop();
        }
        Ok(false)
    }

    /// Whether device `d` matches the class's and the request's selectors (cached).
    fn selectable(&mut self, request: usize, alternative: usize, d: usize) -> Result<bool, AllocError> {
        if let Some(m) = self.matches.get(&(request, alternative, d)) {
            return Ok(*m);
        }
        let c = &self.pools.devices[d];
        let alt = &self.requests[request][alternative];
        let class = alt.class.metadata.name.as_deref().unwrap_or("");
        let mut result = true;
        for (whose, list) in
            [(format!("class {class}"), &alt.class_selectors), (format!("claim {}", self.claim), &alt.selectors)]
        {
            for (i, s) in list.iter().enumerate() {
                self.in_time()?;
                match s.matches(c.driver, c.device) {
                    Ok(true) => {}
                    Ok(false) => result = false,
                    Err(e) => {
                        return Err(AllocError::Failed(format!(
                            "{whose}: selector #{i} on device {}: CEL runtime error: {e}",
                            c.id()
                        )));
                    }
                }
                if !result {
                    break;
                }
            }
            if !result {
                break;
            }
        }
        self.matches.insert((request, alternative, d), result);
        Ok(result)
    }

    /// `Some(what it consumes of a shared device's capacities)` when device `d` can be
    /// allocated for the request now: not in use, taints tolerated, counters and capacity left.
    #[allow(clippy::option_option)]
    fn available(
        &self,
        request: usize,
        alternative: usize,
        d: usize,
    ) -> Option<Option<BTreeMap<String, ParsedQuantity>>> {
        if self.blocked(request, alternative, d).is_some() {
            return None;
        }
        let c = &self.pools.devices[d];
        let alt = &self.requests[request][alternative];
        let shared = c.device["allowMultipleAllocations"] == true;
        let id = c.id();
        if !shared {
            return Some(None);
        }
        let mut consumed = BTreeMap::new();
        for (k, cap) in c.device["capacity"].as_object().into_iter().flatten() {
            let total = quantity(&cap["value"])?;
            let want = alt
                .capacity
                .get(k)
                .cloned()
                .or_else(|| quantity(&cap["requestPolicy"]["default"]))
                .unwrap_or_else(|| total.clone());
            let mut used = self.in_use.capacity.get(&(id.clone(), k.clone())).cloned().unwrap_or_default();
            for p in self.picks.iter().filter(|p| p.device == d) {
                if let Some(q) = p.consumed.as_ref().and_then(|m| m.get(k)) {
                    used += q.clone();
                }
            }
            if used + want.clone() > total {
                return None;
            }
            consumed.insert(k.clone(), want);
        }
        Some(Some(consumed))
    }

    /// Whether the counters device `d` consumes fit what its pool's sets have left, after
    /// other claims' devices and this claim's picks.
    fn counters_fit(&self, d: usize) -> bool {
        let c = &self.pools.devices[d];
        let Some(consumes) = c.device["consumesCounters"].as_array() else { return true };
        let sets = self.pools.counters.get(&(c.driver, c.pool));
        let holders: Vec<usize> = self.held.iter().copied().chain(self.picks.iter().map(|p| p.device)).collect();
        for consumption in consumes {
            let set = consumption["counterSet"].as_str().unwrap_or("");
            for (counter, need) in consumption["counters"].as_object().into_iter().flatten() {
                let (Some(total), Some(need)) =
                    (sets.and_then(|s| s.get(set)).and_then(|s| s.get(counter)), quantity(&need["value"]))
                else {
                    return false;
                };
                let mut used = need;
                for h in &holders {
                    let other = &self.pools.devices[*h];
                    if (other.driver, other.pool) != (c.driver, c.pool) {
                        continue;
                    }
                    for oc in other.device["consumesCounters"].as_array().into_iter().flatten() {
                        if oc["counterSet"] == set
                            && let Some(q) = quantity(&oc["counters"][counter]["value"])
                        {
                            used += q;
                        }
                    }
                }
                if used > *total {
                    return false;
                }
            }
        }
        true
    }

    /// Whether adding device `d` for the request keeps every constraint of the claim.
    fn constraints_hold(&self, request: usize, alternative: usize, d: usize) -> bool {
        let name = &self.requests[request][alternative].name;
        let applies = |c: &DeviceConstraint, name: &str| {
            let base = name.split_once('/').map_or(name, |(b, _)| b);
            c.requests.as_ref().is_none_or(|r| r.is_empty() || r.iter().any(|x| x == base || x == name))
        };
        let c = &self.pools.devices[d];
        for constraint in self.constraints {
            if !applies(constraint, name) {
                continue;
            }
            let (attr_name, distinct) = match (&constraint.match_attribute, &constraint.distinct_attribute) {
                (Some(a), _) => (a, false),
                (None, Some(a)) => (a, true),
                (None, None) => return false,
            };
            let Some(value) = attribute(c.device, c.driver, attr_name) else { return false };
            let others = self
                .picks
                .iter()
                .filter(|p| applies(constraint, &self.requests[p.request][p.alternative].name))
                .map(|p| &self.pools.devices[p.device])
                .map(|o| attribute(o.device, o.driver, attr_name));
            for other in others {
                let same = other == Some(value);
                if distinct == same {
                    return false;
                }
            }
        }
        true
    }

    /// The claim's `status.allocation`.
    fn result(&self, spec: &ResourceClaimSpec) -> Json {
        let mut results = Vec::new();
        for p in &self.picks {
            let c = &self.pools.devices[p.device];
            let mut r = json!({
                "request": self.requests[p.request][p.alternative].name,
                "driver": c.driver,
                "pool": c.pool,
                "device": c.device["name"],
            });
            if let Some(consumed) = &p.consumed {
                r["shareID"] = json!(share_id());
                if !consumed.is_empty() {
                    r["consumedCapacity"] = consumed.iter().map(|(k, q)| (k.clone(), json!(q.to_string()))).collect();
                }
            }
            results.push(r);
        }
        // Class configuration once per class, then the claim's for the requests it names.
        let mut config: Vec<Json> = Vec::new();
        let mut by_class: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        let chosen: Vec<&Alternative> =
            self.chosen.iter().rev().enumerate().map(|(r, a)| &self.requests[r][*a]).collect();
        for alt in &chosen {
            let class = alt.class.metadata.name.clone().unwrap_or_default();
            if let Some(at) = by_class.get(&class) {
                for i in at {
                    if let Some(list) = config[*i]["requests"].as_array_mut() {
                        list.push(json!(alt.name));
                    }
                }
                continue;
            }
            let mut at = Vec::new();
            for c in alt.class.spec.config.iter().flatten() {
                at.push(config.len());
                config.push(json!({ "source": "FromClass", "requests": [alt.name], "opaque": c.opaque }));
            }
            by_class.insert(class, at);
        }
        let names: Vec<&str> = chosen.iter().map(|a| a.name.as_str()).collect();
        for c in spec.devices.as_ref().and_then(|d| d.config.as_deref()).unwrap_or_default() {
            let requests = c.requests.clone().unwrap_or_default();
            let applies = requests.is_empty()
                || requests
                    .iter()
                    .any(|r| names.iter().any(|n| n == r || n.split_once('/').is_some_and(|(b, _)| b == r)));
            if applies {
                config.push(json!({ "source": "FromClaim", "requests": requests, "opaque": c.opaque }));
            }
        }
        let all_requests = spec.devices.as_ref().and_then(|d| d.requests.as_ref()).map_or(0, Vec::len);
        for c in &mut config {
            let n = c["requests"].as_array().map_or(0, Vec::len);
            if (n == 0 || n == all_requests)
                && let Some(o) = c.as_object_mut()
            {
                o.remove("requests");
            }
        }
        let mut allocation = json!({ "devices": { "results": results } });
        if !config.is_empty() {
            allocation["devices"]["config"] = json!(config);
        }
        if self.picks.iter().any(|p| self.pools.devices[p.device].node_local) {
            allocation["nodeSelector"] = node_selector(self.node);
        }
        allocation
    }
}

/// The `nodeSelector` of an allocation from `node`'s own pools: that node, by name.
pub fn node_selector(node: &str) -> Json {
    json!({ "nodeSelectorTerms": [{ "matchFields": [
        { "key": "metadata.name", "operator": "In", "values": [node] }
    ] }] })
}

/// A random UUID (version 4), as the scheduler gives each share of a shared device.
pub fn share_id() -> String {
    let mut b = [0u8; 16];
    // Without randomness, a fixed pattern still makes a valid, if not unique, ID.
    let _ = getrandom::fill(&mut b);
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(name: &str, driver: &str, devices: Json) -> Json {
        json!({ "metadata": { "name": name }, "spec": {
            "driver": driver, "nodeName": "node-a",
            "pool": { "name": "node-a", "generation": 1, "resourceSliceCount": 1 },
            "devices": devices,
        } })
    }

    fn class(name: &str, driver: &str) -> (String, DeviceClass) {
        let c = json!({ "metadata": { "name": name }, "spec": { "selectors": [
            { "cel": { "expression": format!("device.driver == {driver:?}") } }
        ] } });
        (name.to_owned(), serde_json::from_value(c).unwrap())
    }

    fn spec(devices: Json) -> ResourceClaimSpec {
        serde_json::from_value(json!({ "devices": devices })).unwrap()
    }

    /// Four GPUs under two PCIe roots, two NICs, one per root.
    fn machine() -> (Vec<Json>, BTreeMap<String, DeviceClass>) {
        let gpu = |i: u32, root: &str, mem: &str| {
            json!({ "name": format!("gpu-{i}"), "attributes": {
                "resource.kubernetes.io/pcieRoot": { "string": root }, "index": { "int": i } },
                "capacity": { "memory": { "value": mem } } })
        };
        let nic = |i: u32, root: &str| json!({ "name": format!("nic-{i}"), "attributes": { "resource.kubernetes.io/pcieRoot": { "string": root } } });
        let slices = vec![
            slice(
                "gpu-slice",
                "gpu.example.io",
                json!([
                    gpu(0, "pci0000:00", "40Gi"),
                    gpu(1, "pci0000:00", "80Gi"),
                    gpu(2, "pci0000:80", "80Gi"),
                    gpu(3, "pci0000:80", "80Gi")
                ]),
            ),
            slice("nic-slice", "nic.example.io", json!([nic(0, "pci0000:80")])),
        ];
        let classes = [class("gpu", "gpu.example.io"), class("nic", "nic.example.io")].into_iter().collect();
        (slices, classes)
    }

    fn run(
        slices: &[Json],
        classes: &BTreeMap<String, DeviceClass>,
        in_use: &[Json],
        devices: Json,
    ) -> Result<Json, AllocError> {
        allocate(deadline(), &Selectors::new(), "node-a", slices, classes, in_use, "default", "c", &spec(devices))
    }

    fn picked(a: &Json) -> Vec<String> {
        a["devices"]["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| format!("{}:{}", r["request"].as_str().unwrap(), r["device"].as_str().unwrap()))
            .collect()
    }

    /// Issue 58: the deadline is read before every selector run, not once per 1,024 choices: a
    /// claim whose time is up runs no selector (on the old check, this few choices finished).
    #[test]
    fn a_search_past_its_deadline_runs_no_selector_more() {
        let (slices, classes) = machine();
        let devices = json!({ "requests": [{ "name": "g", "exactly": { "deviceClassName": "gpu",
            "selectors": [{ "cel": { "expression": "device.attributes[\"gpu.example.io\"].index >= 0" } }] } }] });
        let gone = std::time::Instant::now() - std::time::Duration::from_millis(1);
        let cel = Selectors::new();
        let run_by = |deadline| {
            allocate(deadline, &cel, "node-a", &slices, &classes, &[], "default", "c", &spec(devices.clone()))
        };
        let err = run_by(gone).expect_err("no time left");
        assert!(matches!(&err, AllocError::Unschedulable { why, .. } if why.contains("timed out after")), "{err:?}");
        let later = std::time::Instant::now() + std::time::Duration::from_secs(3600);
        assert!(run_by(later).is_ok(), "with time, the same claim is allocated");
    }

    #[test]
    fn match_attribute_across_drivers_picks_the_pair_under_one_root() {
        let (slices, classes) = machine();
        let a = run(
            &slices,
            &classes,
            &[],
            json!({
                "requests": [
                    { "name": "gpu", "exactly": { "deviceClassName": "gpu" } },
                    { "name": "nic", "exactly": { "deviceClassName": "nic" } },
                ],
                "constraints": [{ "matchAttribute": "resource.kubernetes.io/pcieRoot" }],
            }),
        )
        .unwrap();
        // gpu-0 comes first, but no NIC shares its root: the search backs up to gpu-2.
        assert_eq!(picked(&a), ["gpu:gpu-2", "nic:nic-0"]);
        assert_eq!(a["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"][0], "node-a");
    }

    /// Issue 52: a claim naming a class the node does not have is told the closest one.
    #[test]
    fn an_unknown_class_names_the_closest() {
        let (slices, classes) = machine();
        let e = run(
            &slices,
            &classes,
            &[],
            json!({ "requests": [{ "name": "g", "exactly": { "deviceClassName": "gpus" } }] }),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("\"gpus\" not found") && e.ends_with("did you mean gpu?"), "{e}");
        let far = run(
            &slices,
            &classes,
            &[],
            json!({ "requests": [{ "name": "g", "exactly": { "deviceClassName": "fpga-card" } }] }),
        )
        .unwrap_err()
        .to_string();
        assert!(!far.contains("did you mean"), "{far}");
    }

    /// Issue 60 (3): an EFA request naming a class not published was told "did you mean" the
    /// GPU class (the rest of the names alike); only a class of the same kind is suggested.
    #[test]
    fn only_a_class_of_the_same_kind_is_suggested() {
        let (slices, _) = machine();
        let classes: BTreeMap<String, DeviceClass> = [
            class("gpu.nvidia.com.devplug.io", "gpu.example.io"),
            class("efa.amazonaws.com.devplug.io", "nic.example.io"),
        ]
        .into_iter()
        .collect();
        let ask = |name: &str| {
            run(
                &slices,
                &classes,
                &[],
                json!({ "requests": [{ "name": "e", "exactly": { "deviceClassName": name } }] }),
            )
            .unwrap_err()
            .to_string()
        };
        let other_kind = ask("rdma.amazon.com.devplug.io");
        assert!(!other_kind.contains("did you mean"), "{other_kind}");
        let only_gpus: BTreeMap<String, DeviceClass> =
            [class("gpu.nvidia.com.devplug.io", "gpu.example.io")].into_iter().collect();
        let efa = run(
            &slices,
            &only_gpus,
            &[],
            json!({ "requests": [{ "name": "e", "exactly": { "deviceClassName": "efa.amazon.com.devplug.io" } }] }),
        )
        .unwrap_err()
        .to_string();
        assert!(!efa.contains("did you mean"), "a GPU class is no suggestion for an EFA request: {efa}");
        let efa = ask("efa.amazon.com.devplug.io");
        assert!(efa.ends_with("did you mean efa.amazonaws.com.devplug.io?"), "{efa}");
        let gpu = ask("gpus.nvidia.com.devplug.io");
        assert!(gpu.ends_with("did you mean gpu.nvidia.com.devplug.io?"), "{gpu}");
    }

    #[test]
    fn selectors_count_and_devices_in_use() {
        let (slices, classes) = machine();
        let want = json!({ "requests": [{ "name": "big", "exactly": { "deviceClassName": "gpu", "count": 2, "selectors": [
            { "cel": { "expression": "device.capacity[\"gpu.example.io\"].memory.compareTo(quantity(\"80Gi\")) >= 0" } }] } }] });
        assert_eq!(picked(&run(&slices, &classes, &[], want.clone()).unwrap()), ["big:gpu-1", "big:gpu-2"]);
        let held = [json!({ "driver": "gpu.example.io", "pool": "node-a", "device": "gpu-2", "request": "x" })];
        assert_eq!(picked(&run(&slices, &classes, &held, want.clone()).unwrap()), ["big:gpu-1", "big:gpu-3"]);
        let held = [held[0].clone(), json!({ "driver": "gpu.example.io", "pool": "node-a", "device": "gpu-1" })];
        match run(&slices, &classes, &held, want) {
            Err(AllocError::Unschedulable { why, .. }) => assert!(
                why.contains("request big wants 2 of class gpu: 3 of the node's 5 devices match its class and selectors, 1 usable: 2 in use, 0 tainted"),
                "{why}"
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn first_available_all_and_distinct() {
        let (slices, classes) = machine();
        let a = run(&slices, &classes, &[], json!({ "requests": [{ "name": "gpu", "firstAvailable": [
            { "name": "huge", "deviceClassName": "gpu", "selectors": [{ "cel": { "expression": "device.capacity[\"gpu.example.io\"].memory.isGreaterThan(quantity(\"100Gi\"))" } }] },
            { "name": "any", "deviceClassName": "gpu", "count": 3 },
        ] }] })).unwrap();
        assert_eq!(picked(&a), ["gpu/any:gpu-0", "gpu/any:gpu-1", "gpu/any:gpu-2"]);
        let a = run(&slices, &classes, &[], json!({ "requests": [{ "name": "all", "exactly": { "deviceClassName": "nic", "allocationMode": "All" } }] })).unwrap();
        assert_eq!(picked(&a), ["all:nic-0"]);
        let a = run(
            &slices,
            &classes,
            &[],
            json!({ "requests": [{ "name": "g", "exactly": { "deviceClassName": "gpu", "count": 2 } }],
            "constraints": [{ "distinctAttribute": "resource.kubernetes.io/pcieRoot" }] }),
        )
        .unwrap();
        assert_eq!(picked(&a), ["g:gpu-0", "g:gpu-2"]);
    }

    /// Issue 60 (5): an unsatisfiable claim said only that its constraints must hold. It now
    /// names, per value of the matched attribute, each request's usable devices against the
    /// count asked (the root closest to holding first), and the tainted devices with their taint.
    #[test]
    fn an_unsatisfiable_claim_names_the_shortfall_per_attribute_value_and_the_taints() {
        let (mut slices, classes) = machine();
        slices[0]["spec"]["devices"][2]["taints"] =
            json!([{ "key": "devplug.io/unhealthy", "value": "xid-79", "effect": "NoSchedule" }]);
        let claim = json!({
            "requests": [
                { "name": "gpu", "exactly": { "deviceClassName": "gpu", "count": 2 } },
                { "name": "nic", "exactly": { "deviceClassName": "nic" } },
            ],
            "constraints": [{ "matchAttribute": "resource.kubernetes.io/pcieRoot" }],
        });
        let Err(AllocError::Unschedulable { why, .. }) = run(&slices, &classes, &[], claim) else {
            panic!("no root has two usable GPUs and a NIC")
        };
        assert!(
            why.contains("request gpu wants 2 of class gpu: 4 of the node's 5 devices match its class and selectors, 3 usable: 0 in use, 1 tainted"),
            "{why}"
        );
        assert!(
            why.contains("(tainted: gpu.example.io/node-a/gpu-2 (devplug.io/unhealthy=xid-79:NoSchedule)"),
            "{why}"
        );
        let want = r#"matchAttribute resource.kubernetes.io/pcieRoot must hold: "pci0000:00": gpu 2 usable of 2 asked, nic 0 of 1; "pci0000:80": gpu 1 usable of 2 asked, nic 1 of 1"#;
        assert!(why.contains(want), "{why}");
    }

    #[test]
    fn taints_counters_and_runtime_errors() {
        let (mut slices, classes) = machine();
        slices[0]["spec"]["devices"][0]["taints"] =
            json!([{ "key": "devplug.io/unhealthy", "value": "xid-79", "effect": "NoSchedule" }]);
        let one = json!({ "requests": [{ "name": "g", "exactly": { "deviceClassName": "gpu" } }] });
        assert_eq!(picked(&run(&slices, &classes, &[], one).unwrap()), ["g:gpu-1"]);
        let tolerant = json!({ "requests": [{ "name": "g", "exactly": { "deviceClassName": "gpu", "tolerations": [{ "key": "devplug.io/unhealthy", "operator": "Exists" }] } }] });
        assert_eq!(picked(&run(&slices, &classes, &[], tolerant).unwrap()), ["g:gpu-0"]);

        // A GPU of 8 memory slices, offered whole and as two halves.
        let part = |name: &str, n: &str| json!({ "name": name, "consumesCounters": [{ "counterSet": "gpu-0", "counters": { "memory": { "value": n } } }] });
        let mut counters =
            slice("parts", "part.example.io", json!([part("whole", "8"), part("half-a", "4"), part("half-b", "4")]));
        counters["spec"]["pool"]["resourceSliceCount"] = json!(2);
        let mut sets = slice("sets", "part.example.io", json!(null));
        sets["spec"].as_object_mut().unwrap().remove("devices");
        sets["spec"]["pool"]["resourceSliceCount"] = json!(2);
        sets["spec"]["sharedCounters"] = json!([{ "name": "gpu-0", "counters": { "memory": { "value": "8" } } }]);
        let classes: BTreeMap<_, _> = [class("part", "part.example.io")].into_iter().collect();
        let slices = [counters, sets];
        let two = json!({ "requests": [{ "name": "p", "exactly": { "deviceClassName": "part", "count": 2 } }] });
        assert_eq!(
            picked(&run(&slices, &classes, &[], two.clone()).unwrap()),
            ["p:half-a", "p:half-b"],
            "whole leaves nothing for a second"
        );
        let whole_held = [json!({ "driver": "part.example.io", "pool": "node-a", "device": "whole" })];
        assert!(matches!(run(&slices, &classes, &whole_held, two), Err(AllocError::Unschedulable { .. })));

        let (slices, classes) = machine();
        let bad = json!({ "requests": [{ "name": "g", "exactly": { "deviceClassName": "gpu", "selectors": [{ "cel": { "expression": "device.attributes[\"gpu.example.io\"].model == \"x\"" } }] } }] });
        match run(&slices, &classes, &[], bad) {
            Err(AllocError::Failed(e)) => assert!(
                e.starts_with("claim default/c: selector #0 on device gpu.example.io/node-a/gpu-0: CEL runtime error"),
                "{e}"
            ),
            other => panic!("{other:?}"),
        }
        let unknown = json!({ "requests": [{ "name": "g", "exactly": { "deviceClassName": "tpu" } }] });
        assert!(
            matches!(run(&slices, &classes, &[], unknown), Err(AllocError::Failed(e)) if e.contains("could not retrieve device class tpu"))
        );
    }
}
