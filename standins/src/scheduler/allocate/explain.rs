//! Why a claim could not be allocated on a node, per request: how many devices match its class
//! and selectors, how many of those are in use, tainted (each named with its taint) or out of
//! counters, and, for each of the claim's constraints, every attribute value's usable devices
//! per request against the count asked: `pci0000:59: efa 3 usable of 4 asked, gpu 1 of 1`.
//! Upstream's scheduler says only that the node cannot allocate the claim; this is what a person
//! needs to change the claim or the node, bounded so a node of thousands of devices still says
//! it in a few lines.

use std::collections::BTreeMap;

use super::{Search, attribute, tolerated};

/// Attribute values a constraint's explanation shows (the closest to holding first).
const VALUES_SHOWN: usize = 8;
/// Tainted devices named per request.
const TAINTED_SHOWN: usize = 8;

/// Why device `d` cannot serve a request that matches it.
pub(super) enum Blocked {
    InUse,
    /// The first taint the request does not tolerate, as `key=value:Effect`.
    Tainted(String),
    Counters,
}

impl Search<'_> {
    /// Whether device `d` is held back from the request (alternative `alternative`): in use by
    /// another claim or by this one, tainted against it, or its counters spent.
    pub(super) fn blocked(&self, request: usize, alternative: usize, d: usize) -> Option<Blocked> {
        let c = &self.pools.devices[d];
        let alt = &self.requests[request][alternative];
        let shared = c.device["allowMultipleAllocations"] == true;
        if !shared && (self.in_use.exclusive.contains(&c.id()) || self.picks.iter().any(|p| p.device == d)) {
            return Some(Blocked::InUse);
        }
        if shared && self.picks.iter().any(|p| p.device == d && p.request == request) {
            return Some(Blocked::InUse);
        }
        for taint in c.device["taints"].as_array().into_iter().flatten() {
            let blocking = matches!(taint["effect"].as_str(), Some("NoSchedule" | "NoExecute"));
            if blocking && !tolerated(taint, alt.tolerations) {
                let text = |k: &str| taint[k].as_str().unwrap_or("").escape_debug().to_string();
                return Some(Blocked::Tainted(format!("{}={}:{}", text("key"), text("value"), text("effect"))));
            }
        }
        if !self.counters_fit(d) {
            return Some(Blocked::Counters);
        }
        None
    }

    /// Per request, what it found; then per constraint, where it could not hold.
    pub(super) fn explain(&mut self) -> String {
        let mut lines = Vec::new();
        if !self.pools.incomplete.is_empty() {
            lines.push(format!("pools still being published: {}", self.pools.incomplete.join(", ")));
        }
        // (request, alternative) → the devices it could have now.
        let mut usable: BTreeMap<(usize, usize), Vec<usize>> = BTreeMap::new();
        for r in 0..self.requests.len() {
            for a in 0..self.requests[r].len() {
                let (mut matching, mut in_use, mut counters) = (0, 0, 0);
                let mut tainted = Vec::new();
                let mut free = Vec::new();
                for d in 0..self.pools.devices.len() {
                    if !self.selectable(r, a, d).unwrap_or(false) {
                        continue;
                    }
                    matching += 1;
                    match self.blocked(r, a, d) {
                        None if self.available(r, a, d).is_some() => free.push(d),
                        // A shared device whose capacity is spent.
                        None => counters += 1,
                        Some(Blocked::InUse) => in_use += 1,
                        Some(Blocked::Tainted(t)) => tainted.push((self.pools.devices[d].id(), t)),
                        Some(Blocked::Counters) => counters += 1,
                    }
                }
                let alt = &self.requests[r][a];
                let wanted = if alt.all { "all".to_owned() } else { alt.count.to_string() };
                let class = alt.class.metadata.name.as_deref().unwrap_or("");
                let mut line = format!(
                    "request {} wants {wanted} of class {class}: {matching} of the node's {} devices match its class and selectors, {} usable: {in_use} in use, {} tainted, {counters} out of counters or capacity",
                    alt.name,
                    self.pools.devices.len(),
                    free.len(),
                    tainted.len(),
                );
                if !tainted.is_empty() {
                    let named: Vec<String> =
                        tainted.iter().take(TAINTED_SHOWN).map(|(id, t)| format!("{id} ({t})")).collect();
                    let more = tainted.len().saturating_sub(TAINTED_SHOWN);
                    let more = if more > 0 { format!(" and {more} more") } else { String::new() };
                    line.push_str(&format!(
                        " (tainted: {}{more}; a toleration of the taint admits them)",
                        named.join(", ")
                    ));
                }
                lines.push(line);
                usable.insert((r, a), free);
            }
        }
        for c in self.constraints {
            lines.push(self.constraint_shortfall(c, &usable));
        }
        lines.join("; ")
    }

    /// One constraint: for `matchAttribute`, each value's usable devices per request it applies
    /// to against the count asked, the values closest to holding first; for
    /// `distinctAttribute`, the distinct values usable per request against the count asked.
    fn constraint_shortfall(
        &self,
        c: &k8s_openapi::api::resource::v1::DeviceConstraint,
        usable: &BTreeMap<(usize, usize), Vec<usize>>,
    ) -> String {
        let (kind, name) = match (&c.match_attribute, &c.distinct_attribute) {
            (Some(a), _) => ("matchAttribute", a.as_str()),
            (None, Some(a)) => ("distinctAttribute", a.as_str()),
            _ => return "and an unknown kind of constraint must hold".to_owned(),
        };
        let applies = |alt: &str| {
            let base = alt.split_once('/').map_or(alt, |(b, _)| b);
            c.requests.as_ref().is_none_or(|r| r.is_empty() || r.iter().any(|x| x == base || x == alt))
        };
        // The alternatives it applies to (the first of a firstAvailable request that has devices).
        let mut asked: Vec<(&str, usize, &Vec<usize>)> = Vec::new();
        for ((r, a), free) in usable {
            let alt = &self.requests[*r][*a];
            if applies(&alt.name) && !alt.all {
                asked.push((alt.name.as_str(), alt.count, free));
            }
        }
        let value_of = |d: usize| {
            let dev = &self.pools.devices[d];
            attribute(dev.device, dev.driver, name).map(shown)
        };
        if kind == "distinctAttribute" {
            let parts: Vec<String> = asked
                .iter()
                .map(|(alt, count, free)| {
                    let values: std::collections::BTreeSet<String> = free.iter().filter_map(|d| value_of(*d)).collect();
                    format!("{alt} {} distinct values of {count} asked", values.len())
                })
                .collect();
            return format!("{kind} {name}: {}", parts.join(", "));
        }
        // value → usable count per request (in `asked`'s order).
        let mut groups: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        let mut lacking: Vec<(&str, usize)> = Vec::new();
        for (i, (alt, _, free)) in asked.iter().enumerate() {
            let mut without = 0;
            for d in free.iter() {
                match value_of(*d) {
                    Some(v) => groups.entry(v).or_insert_with(|| vec![0; asked.len()])[i] += 1,
                    None => without += 1,
                }
            }
            if without > 0 {
                lacking.push((alt, without));
            }
        }
        let short = |counts: &Vec<usize>| -> usize {
            asked.iter().zip(counts).map(|((_, want, _), have)| want.saturating_sub(*have)).sum()
        };
        let mut ranked: Vec<(&String, &Vec<usize>)> = groups.iter().collect();
        ranked.sort_by_key(|(v, counts)| (short(counts), (*v).clone()));
        let mut parts: Vec<String> = ranked
            .iter()
            .take(VALUES_SHOWN)
            .map(|(value, counts)| {
                let per: Vec<String> = asked
                    .iter()
                    .zip(counts.iter())
                    .enumerate()
                    .map(|(i, ((alt, want, _), have))| {
                        if i == 0 {
                            format!("{alt} {have} usable of {want} asked")
                        } else {
                            format!("{alt} {have} of {want}")
                        }
                    })
                    .collect();
                format!("{value}: {}", per.join(", "))
            })
            .collect();
        if groups.len() > VALUES_SHOWN {
            parts.push(format!("{} values more", groups.len() - VALUES_SHOWN));
        }
        if groups.is_empty() {
            parts.push("no usable device has it".to_owned());
        }
        for (alt, n) in lacking {
            parts.push(format!("{n} usable devices of {alt} lack it"));
        }
        format!("{kind} {name} must hold: {}", parts.join("; "))
    }
}

/// An attribute's value as shown: the typed value alone (`"pci0000:59"`, `7`, `true`), strings
/// quoted and escaped so nothing a driver published moves the reader's cursor.
fn shown(v: &serde_json::Value) -> String {
    let inner = ["string", "int", "bool", "version"].iter().find_map(|k| v.get(*k)).unwrap_or(v);
    match inner.as_str() {
        Some(s) => format!("{s:?}"),
        None => inner.to_string(),
    }
}
