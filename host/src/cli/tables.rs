//! Command output for people: JSON answers as aligned tables. Every cell is outsider text (a
//! backend's version, IDs and attributes, a registry's error) and goes through
//! [`clip`]: cut to a bounded length, control characters escaped, so nothing a backend says
//! can move the terminal's cursor, ring its bell or rewrite the lines above.

use crate::backends::BackendSummary;
use crate::backends::SourceStatus;
use crate::dra::plugin::claims::ClaimState;
use crate::dra::plugin::claims::ClaimStatus;
use crate::gate::{clip, clip_to};
use crate::kubelet::podresources::Assignment;
use crate::observe::status::{RegistrationStatus, ResourceDevices, ResourceStatus, Status};
use crate::runtime::Tier;

/// A JSON value as one clipped table cell.
fn cell(x: &serde_json::Value) -> String {
    match x.as_str() {
        Some(s) => clip(s).into_owned(),
        None if x.is_null() => "?".to_owned(),
        None => clip(&x.to_string()).into_owned(),
    }
}

/// Which code a backend runs: `optimized`, or `baseline` (with `, optimising` while its
/// optimised compile is pending).
fn code(b: &BackendSummary) -> String {
    let tier = match b.compiler {
        Tier::Optimized => "optimized",
        Tier::Baseline => "baseline",
    };
    if b.optimizing { format!("{tier}, optimising") } else { tier.to_owned() }
}

/// A backend's LAST ERROR cell: its discover error, else that it withholds devices for a
/// contest (told whole below the table).
fn last_error(b: &BackendSummary) -> String {
    if let Some(e) = &b.last_error {
        return clip(e).into_owned();
    }
    match b.conflicts.len() {
        0 => String::new(),
        1 => "device nodes shared with another backend's resource (see below)".to_owned(),
        n => format!("device nodes shared with {n} other resources (see below)"),
    }
}

/// A cell of outsider text: clipped and escaped.
fn text(s: &str) -> String {
    clip(s).into_owned()
}

/// `devplug status` as a table for people: one section per part of the document, each only
/// when it has rows (the allocations say when none are known).
pub fn status_table(v: &Status) -> String {
    let mut out = resources_table(&v.resources);
    for section in
        [registrations_table(&v.registrations), backends_table(v), sources_table(&v.sources), claims_table(&v.claims)]
            .into_iter()
            .flatten()
    {
        out.push('\n');
        out.push_str(&section);
    }
    out.push_str(&allocations_table(&v.allocations));
    out
}

fn resources_table(resources: &[ResourceStatus]) -> String {
    let mut rows = vec![["RESOURCE", "HEALTHY", "UNHEALTHY", "WITHHELD", "KUBELET"].map(str::to_owned).to_vec()];
    for r in resources {
        rows.push(vec![
            text(&r.name),
            r.healthy.to_string(),
            r.unhealthy.to_string(),
            r.withheld.to_string(),
            text(&r.endpoint),
        ]);
    }
    table(&rows, &[false, true, true, true, false])
}

/// Each registration, and why kubelet is late where it is.
fn registrations_table(registrations: &[RegistrationStatus]) -> Option<String> {
    use std::fmt::Write;
    if registrations.is_empty() {
        return None;
    }
    let mut rows = vec![["REGISTRATION", "MODE", "STATE", "SOCKET"].map(str::to_owned).to_vec()];
    for r in registrations {
        rows.push(vec![text(&r.subject), text(&r.mode), text(&r.state), text(&r.socket)]);
    }
    let mut out = table(&rows, &[false, false, false, false]);
    for why in registrations.iter().filter_map(|r| r.overdue.as_deref()) {
        let _ = writeln!(out, "! {}", clip(why));
    }
    Some(out)
}

/// Every backend, then each contest once (it concerns two backends, and its remedy is the
/// point of it, so it is never clipped short) and each backend's first refusals.
fn backends_table(v: &Status) -> Option<String> {
    use std::fmt::Write;
    let mut rows = vec![
        ["BACKEND", "VERSION", "COMPONENT SHA256", "CODE", "BREAKER", "TRAPS", "TIMEOUTS", "DENIED", "LAST ERROR"]
            .map(str::to_owned)
            .to_vec(),
    ];
    let mut lines: Vec<String> =
        v.contests.iter().flatten().map(|c| format!("! {}", clip_to(&c.to_string(), 2048))).collect();
    for b in &v.backends {
        let digest: String = text(&b.digest).chars().take(12).collect();
        let breaker = match (b.loaded, b.breaker_open) {
            (false, _) => "NOT LOADED",
            (true, true) => "OPEN",
            (true, false) => "closed",
        };
        rows.push(vec![
            text(&b.name),
            if b.loaded { text(&b.version) } else { "-".to_owned() },
            digest,
            if b.loaded { code(b) } else { "-".to_owned() },
            breaker.to_owned(),
            b.stats.traps.to_string(),
            b.stats.timeouts.to_string(),
            b.stats.denied.to_string(),
            last_error(b),
        ]);
        // An older devplug lists contests per backend only, one line per node.
        if v.contests.is_none() {
            for c in &b.conflicts {
                lines.push(format!("! {}: {}", clip(&b.name), clip_to(c, 512)));
            }
        }
        // The first refusals of each backend, with the grant that would allow them.
        for d in b.denied.iter().take(3) {
            lines.push(format!(
                "! {} was refused {} {}: {}",
                clip(&b.name),
                clip(&d.call),
                clip(&d.path),
                clip(&d.grant)
            ));
        }
    }
    let mut out = table(&rows, &[false, false, false, false, false, true, true, true, false]);
    for line in lines {
        let _ = writeln!(out, "{line}");
    }
    Some(out)
}

/// Each backend followed from a registry, with the error that matters (a refused swap before
/// a failed look).
fn sources_table(sources: &[SourceStatus]) -> Option<String> {
    if sources.is_empty() {
        return None;
    }
    let mut rows = vec![
        ["BACKEND", "REFERENCE", "MANIFEST DIGEST", "SIGNATURE", "FROM", "CHECKS", "LAST ERROR"]
            .map(str::to_owned)
            .to_vec(),
    ];
    for s in sources {
        let digest: String =
            text(s.digest.as_deref().unwrap_or("?")).trim_start_matches("sha256:").chars().take(12).collect();
        let error = s.swap_error.as_deref().or(s.last_error.as_deref()).map(text).unwrap_or_default();
        rows.push(vec![
            text(&s.backend),
            text(&s.reference),
            digest,
            s.signature.label().to_owned(),
            if s.from_cache { "cache" } else { "registry" }.to_owned(),
            s.checks.to_string(),
            error,
        ]);
    }
    Some(table(&rows, &[false, false, false, false, false, true, false]))
}

/// Each claim this node holds, and what to do about stuck ones.
fn claims_table(claims: &[ClaimStatus]) -> Option<String> {
    use std::fmt::Write;
    if claims.is_empty() {
        return None;
    }
    let mut rows = vec![["DRA DRIVER", "CLAIM", "UID", "STATE", "RETRIES", "ERROR"].map(str::to_owned).to_vec()];
    for c in claims {
        rows.push(vec![
            text(&c.driver),
            format!("{}/{}", text(&c.namespace), text(&c.name)),
            text(&c.uid),
            match c.state {
                ClaimState::Prepared => "prepared",
                ClaimState::Stuck => "stuck",
            }
            .to_owned(),
            c.retries.map_or_else(String::new, |n| n.to_string()),
            c.error.as_deref().map(text).unwrap_or_default(),
        ]);
    }
    let mut out = table(&rows, &[false, false, false, false, true, false]);
    if claims.iter().any(|c| c.state == ClaimState::Stuck) {
        let _ = writeln!(
            out,
            "! stuck claims keep their devices: fix the backend and restart devplug, or `devplug dra release --driver DRIVER UID`"
        );
    }
    Some(out)
}

/// Which container holds which device, or that none is known.
fn allocations_table(allocations: &[Assignment]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    if allocations.is_empty() {
        let _ = writeln!(out, "\nno allocations known (pod resources API off, or nothing allocated)");
        return out;
    }
    let _ = writeln!(out, "\n{:<40} {:<16} NAMESPACE/POD/CONTAINER", "RESOURCE", "DEVICE");
    for a in allocations {
        let _ = writeln!(
            out,
            "{:<40} {:<16} {}/{}/{}",
            text(&a.resource),
            text(&a.device),
            text(&a.namespace),
            text(&a.pod),
            text(&a.container)
        );
    }
    out
}

/// `devplug status --devices` as a table: one row per device.
pub fn devices_table(resources: &[ResourceDevices]) -> String {
    let mut rows = vec![
        ["RESOURCE", "DEVICE", "HEALTH", "NUMA", "NODES (HOST:CONTAINER)", "ATTRIBUTES"].map(str::to_owned).to_vec(),
    ];
    for r in resources {
        for d in &r.devices {
            let numa: Vec<String> = d.numa_nodes.iter().map(u32::to_string).collect();
            let nodes: Vec<String> = d.nodes.iter().map(|n| text(n)).collect();
            let attrs: Vec<String> = d.attributes.iter().map(|(k, v)| format!("{}={}", text(k), text(v))).collect();
            rows.push(vec![
                text(&r.name),
                text(&d.id),
                text(&d.health),
                numa.join(","),
                nodes.join(","),
                attrs.join(" "),
            ]);
        }
    }
    table(&rows, &[false; 6])
}

/// Rows as columns as wide as their widest cell (`right` aligns numbers), two spaces apart.
fn table(rows: &[Vec<String>], right: &[bool]) -> String {
    let rows: Vec<Vec<String>> = rows.iter().map(|r| r.iter().map(|x| clip(x).into_owned()).collect()).collect();
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let width: Vec<usize> =
        (0..cols).map(|c| rows.iter().filter_map(|r| r.get(c)).map(|x| x.chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for r in rows {
        let cells: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(c, x)| {
                let last = c + 1 == r.len();
                match (right.get(c).copied().unwrap_or(false), last) {
                    (true, _) => format!("{x:>w$}", w = width[c]),
                    (false, true) => x.clone(),
                    (false, false) => format!("{x:<w$}", w = width[c]),
                }
            })
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// Render `discover`'s JSON as a table for people.
pub fn discover_table(v: &serde_json::Value) -> String {
    let mut out = String::new();
    for b in v["backends"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "backend {} {} (wit {}, {}){}\n",
            cell(&b["name"]),
            cell(&b["version"]),
            cell(&b["wit_version"]),
            cell(&b["origin"]),
            if b["breaker_open"].as_bool() == Some(true) { " BREAKER OPEN" } else { "" }
        ));
    }
    out.push_str(&format!("{:<28} {:<40} {:<10} {:<6} {}\n", "RESOURCE", "DEVICE", "HEALTH", "NUMA", "WHY"));
    for r in v["resources"].as_array().into_iter().flatten() {
        let devices = r["devices"].as_array().cloned().unwrap_or_default();
        if devices.is_empty() {
            out.push_str(&format!("{:<28} {:<40} {:<10}\n", cell(&r["name"]), "(none)", "-"));
        }
        for d in devices {
            let numa: Vec<String> = d["numa_nodes"].as_array().into_iter().flatten().map(|n| n.to_string()).collect();
            // Why a device is Unhealthy, as its backend says (the `unhealthy` attribute).
            let why = match (d["health"] == "Unhealthy", d["attributes"]["unhealthy"].as_str()) {
                (true, Some(w)) => clip(w).into_owned(),
                (true, None) => "(its backend gave no reason)".into(),
                (false, _) => String::new(),
            };
            let line = format!(
                "{:<28} {:<40} {:<10} {:<6} {}",
                cell(&r["name"]),
                cell(&d["id"]),
                cell(&d["health"]),
                if numa.is_empty() { "-".into() } else { numa.join(",") },
                why
            );
            out.push_str(line.trim_end());
            out.push('\n');
        }
    }
    for e in v["errors"].as_array().into_iter().flatten() {
        out.push_str(&format!("error: {}\n", cell(e)));
    }
    for r in v["refused"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "refused: {} {} {} — to allow it: {}\n",
            cell(&r["backend"]),
            cell(&r["call"]),
            cell(&r["path"]),
            cell(&r["grant"])
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `devplug status`'s table of `v`, read as the CLI reads `/status`.
    fn status_of(v: &serde_json::Value) -> String {
        status_table(&serde_json::from_value(v.clone()).expect("a /status document"))
    }

    /// Issue 51: which code a backend serves from, and a pending optimised compile, show.
    #[test]
    fn the_status_table_says_which_code_serves() {
        let v = serde_json::json!({ "resources": [], "backends": [
            { "name": "qat", "version": "1", "digest": "ab", "compiler": "baseline", "optimizing": true, "stats": {} },
            { "name": "gpu", "version": "1", "digest": "cd", "compiler": "optimized", "optimizing": false, "stats": {} },
        ]});
        let t = status_of(&v);
        assert!(t.lines().any(|l| l.starts_with("qat") && l.contains("baseline, optimising")), "{t}");
        assert!(t.lines().any(|l| l.starts_with("gpu") && l.contains("optimized") && !l.contains("optimising")), "{t}");
    }

    /// Issue 42: the table said Unhealthy without why; the backend's reason is its last column.
    #[test]
    fn an_unhealthy_device_shows_its_reason() {
        let v = serde_json::json!({
            "backends": [],
            "resources": [{ "name": "nvidia.com/gpu", "devices": [
                { "id": "0000:18:00.0", "health": "Unhealthy", "numa_nodes": [0], "attributes": { "unhealthy": "Xid 79: fallen off the bus" } },
                { "id": "0000:2a:00.0", "health": "Unhealthy", "numa_nodes": [0], "attributes": {} },
                { "id": "0000:3a:00.0", "health": "Healthy", "numa_nodes": [0], "attributes": { "unhealthy": "stale" } },
            ]}],
        });
        let t = discover_table(&v);
        let line = |id: &str| t.lines().find(|l| l.contains(id)).unwrap().to_owned();
        assert!(line("0000:18:00.0").ends_with("Xid 79: fallen off the bus"), "{t}");
        assert!(line("0000:2a:00.0").ends_with("(its backend gave no reason)"), "{t}");
        assert!(line("0000:3a:00.0").ends_with('0'), "a healthy device has no reason: {t}");
    }

    #[test]
    fn registry_sources_get_their_own_table_with_the_error_that_matters() {
        let v = serde_json::json!({
            "resources": [], "backends": [], "allocations": [],
            "sources": [{
                "backend": "acme", "reference": "r.io/acme:1", "digest": "sha256:0123456789abcdef",
                "signature": {"state": "verified"}, "from_cache": true, "checks": 7,
                "last_error": "connection refused", "swap_error": "not swapped in: init trapped",
            }],
        });
        let t = status_of(&v);
        let row = t.lines().find(|l| l.starts_with("acme")).unwrap();
        for want in ["r.io/acme:1", "0123456789ab", "verified", "cache", "7", "not swapped in"] {
            assert!(row.contains(want), "{want} missing: {row}");
        }
        let plain = serde_json::json!({ "resources": [], "backends": [], "allocations": [] });
        assert!(!status_of(&plain).contains("DRA DRIVER"), "no claims, no table");
        assert!(!status_of(&plain).contains("REFERENCE"), "no sources, no table");
    }

    /// What a hostile backend puts in its version and attributes reaches no terminal raw: no
    /// ESC, BEL or CR in any table, and a 1 MiB version is a short cell.
    #[test]
    fn outsider_text_is_clipped_and_escaped_in_every_table() {
        let evil = "1.0\u{1b}]0;owned\u{7}\u{1b}[2J\rforged";
        let v = serde_json::json!({
            "resources": [{ "name": "x.io/w", "healthy": 1, "unhealthy": 0, "endpoint": evil,
                "devices": [{ "id": "d0", "health": "Healthy", "numa_nodes": [0], "nodes": [evil],
                              "attributes": { "note": evil } }] }],
            "backends": [{ "name": "b", "version": "v".repeat(1 << 20), "digest": "", "stats": { "denied": 1 },
                           "last_error": evil, "wit_version": evil, "origin": evil,
                           "denied": [{ "call": evil, "path": evil, "grant": evil }] }],
            "refused": [{ "backend": evil, "call": evil, "path": evil, "grant": evil }],
            "allocations": [{ "resource": evil, "device": "d0", "namespace": "n", "pod": "p", "container": "c" }],
            "claims": [{ "driver": "d.io", "namespace": "n", "name": "c", "uid": "u", "state": "stuck",
                         "retries": 2, "error": evil }],
            "registrations": [{ "subject": evil, "mode": "m", "state": "s", "socket": "/x", "overdue": evil }],
            "errors": [evil],
        });
        for (what, text) in [
            ("status", status_of(&v)),
            (
                "devices",
                devices_table(&serde_json::from_value::<Vec<ResourceDevices>>(v["resources"].clone()).unwrap()),
            ),
            ("discover", discover_table(&v)),
        ] {
            assert!(!text.chars().any(|c| c.is_control() && c != '\n'), "{what}: {text:?}");
            assert!(text.len() < 8192, "{what}: {} bytes", text.len());
        }
        assert!(status_of(&v).contains("stuck"), "the stuck claim shows");
        assert!(status_of(&v).contains("! b was refused"), "a refusal shows with its grant");
        assert!(discover_table(&v).contains("refused: "), "and in discover's table");
    }
}
