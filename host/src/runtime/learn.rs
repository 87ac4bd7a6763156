//! What a backend touched, for `devplug discover --learn-requests`: every path it read, listed,
//! resolved, stat'ed or globbed through its capability calls, as it asked for them. The command
//! turns this into the narrowest `[requests]` that allows exactly that, with [`general`] making
//! machine-specific parts of a path wildcards (also for the grant a refusal suggests).

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::sync::Locked;

/// Capability calls seen: (call, path as asked) → how many times.
#[derive(Default)]
pub struct Learned(Mutex<BTreeMap<(String, String), u64>>);

/// Distinct (call, path) pairs remembered: a backend cannot make the recorder grow without bound.
const MAX_LEARNED: usize = 100_000;

impl Learned {
    pub fn record(&self, call: &str, path: &str) {
        let mut seen = self.0.locked();
        let key = (call.to_owned(), path.to_owned());
        if seen.len() < MAX_LEARNED || seen.contains_key(&key) {
            *seen.entry(key).or_default() += 1;
        }
    }

    /// Everything seen, by (call, path).
    pub fn seen(&self) -> BTreeMap<(String, String), u64> {
        self.0.locked().clone()
    }
}

/// A PCI address as the kernel names a function (`0000:3b:00.0`).
fn is_pci(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && s.chars().all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.')
}

/// A PCI root complex's directory (`pci0000:3a`).
fn is_root_complex(s: &str) -> bool {
    s.starts_with("pci") && s.len() == 10 && s[3..].chars().all(|x| x.is_ascii_hexdigit() || x == ':')
}

/// A PCI function's name as a pattern: matches any `dddd:bb:dd.f` and no control file or class
/// directory beside it (`bind`, `net`, `driver`).
pub(crate) const PCI_FUNCTION: &str = "????:??:??.?";

/// `path` with the parts that differ between machines as wildcards, each as narrow as the
/// instances it stands for: a root complex and the chain of bridges and functions below it
/// (`devices/pci0000:3a/0000:3a:00.0/0000:3b:00.1`) become `pci*/**/????:??:??.?`, since a
/// device sits below as many bridges and switch ports as the machine has
/// (`drivers/pci/probe.c` nests each bus under its bridge); any other PCI address
/// (`bus/pci/devices/0000:3b:00.0`) becomes `????:??:??.?`; numbered instances (`card1`,
/// `mlx5_0`, `virtfn3`, `gpu0`, `amdgpu_xcp.12`) `NAME[0-9]*`, and a component that is only a
/// number (`topology/nodes/12`) `[0-9]*`. A trailing `/` (a directory's names) stays.
pub(crate) fn general(path: &str) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut parts = path.split('/').peekable();
    while let Some(c) = parts.next() {
        if is_root_complex(c) {
            out.push("pci*".into());
            let mut chain = false;
            while parts.next_if(|p| is_pci(p)).is_some() {
                chain = true;
            }
            if chain {
                out.push("**".into());
                out.push(PCI_FUNCTION.into());
            }
            continue;
        }
        if is_pci(c) {
            out.push(PCI_FUNCTION.into());
            continue;
        }
        let digits = c.len() - c.trim_end_matches(|x: char| x.is_ascii_digit()).len();
        let stem = &c[..c.len() - digits];
        if digits > 0 && stem.chars().any(|x| x.is_ascii_alphabetic()) {
            out.push(format!("{}[0-9]*", escape_glob(stem)));
            continue;
        }
        // A directory that is only a number is an instance the kernel counted out: KFD's
        // `topology/nodes/N` (one per CPU and per GPU partition, `kfd_topology.c`), its
        // `mem_banks/N`, `io_links/N`, an IOMMU group. Never at the start of a path: there it
        // would be a procfs PID.
        if digits > 0 && digits == c.len() && !out.is_empty() {
            out.push("[0-9]*".into());
            continue;
        }
        out.push(escape_glob(c));
    }
    out.join("/")
}

/// `name` as a glob that matches only itself: a path component named `*`, `x[1]` or `{a,b}`
/// (a backend chose it) must not become a wildcard in the manifest it is learned into.
pub(crate) fn escape_glob(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '{' | '}' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Whether `pattern` is a wildcard at the root of a tree (`*`, `**`, `*/x`, `**/vendor`): a
/// learned request never is, whatever a backend touched.
pub(crate) fn at_root(pattern: &str) -> bool {
    let first = pattern.split('/').next().unwrap_or_default();
    first.is_empty() || first.chars().all(|c| c == '*')
}
