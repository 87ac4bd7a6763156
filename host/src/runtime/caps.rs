//! Capabilities as globs: what a backend's manifest requests, what the operator grants, and the
//! [`Rule`] of each kind (requested ∩ granted) that the [`super::jail::Jail`] and
//! [`super::vet`] enforce. Patterns are bounded so compiling one can neither panic nor take long.

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use serde::{Deserialize, Serialize};

/// What a backend may read and what it may hand to containers, as globs: `*` stays within one
/// component, `**` crosses them, `{a,b}` and `[0-9]` work as in a shell. The same shape is a
/// manifest's `[requests]` and an operator's `grant`; a backend gets the intersection.
///
/// In `sysfs`, `dev` and `procfs` a pattern ending in `/` (`bus/pci/drivers/vfio-pci/`) asks for
/// a directory's entry *names* only: the backend may list it and sees every name, but opens no
/// entry the other patterns do not cover (a driver directory's write-only `bind` and `new_id`
/// show up as names, nothing more). Without it a listing shows only the entries granted whole.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Globs {
    /// Paths under `/sys` it may read, relative (`bus/pci/devices/*/vendor`).
    #[serde(default)]
    pub sysfs: Vec<String>,
    /// Nodes under `/dev` it may stat and hand to containers, relative (`nvidia*`).
    #[serde(default)]
    pub dev: Vec<String>,
    /// Paths under `/proc` it may read, relative (`driver/nvidia/capabilities/**`); WIT 0.2.0
    /// and later. Driver state the kernel keeps nowhere else; grant narrowly.
    #[serde(default)]
    pub procfs: Vec<String>,
    /// Host paths it may bind-mount into containers, absolute (`/usr/lib/firmware/**`);
    /// read-only unless also in `writable_mounts`.
    #[serde(default)]
    pub mounts: Vec<String>,
    /// Container paths its mounts may land on, absolute (`/usr/local/vendor/**`).
    #[serde(default)]
    pub mount_targets: Vec<String>,
    /// Host paths it may mount read-write, absolute; everything else is mounted read-only.
    #[serde(default)]
    pub writable_mounts: Vec<String>,
    /// Env keys it may set in containers (`NVIDIA_*`). Keys that make a loader, shell or runtime
    /// run code (`LD_*`, `CUDA_INJECTION*`, `OPENSSL_*`, …) stay refused unless the operator's
    /// grant names that exact key.
    #[serde(default)]
    pub env: Vec<String>,
    /// Extended resource names it may serve (`nvidia.com/*`).
    #[serde(default)]
    pub resources: Vec<String>,
    /// Annotation keys it may set on containers (`example.com/*`); `cdi.k8s.io/*` never.
    #[serde(default)]
    pub annotations: Vec<String>,
    /// Kernel uevent subsystems (`pci`, `net`, `drm`, …) whose events make the host call its
    /// `discover` at once rather than at the next poll.
    #[serde(default)]
    pub uevents: Vec<String>,
}

/// Longest glob a manifest or a backend's `devfs.glob` may use, and how many wildcards it may
/// hold: a pattern is compiled to a regex, and pathological ones (a 100,000-star pattern) make
/// the regex compiler fail or take seconds.
const MAX_GLOB_LEN: usize = 512;
const MAX_GLOB_WILDCARDS: usize = 16;

/// The wildcards of `pattern` that cost the matcher: each `*`, `[` and `{`, and each run of `?`
/// as one (`????:??:??.?`, a PCI address, is a fixed width of any characters, not nine choices).
fn wildcards(pattern: &str) -> usize {
    let mut n = 0;
    let mut prev = '\0';
    for c in pattern.chars() {
        if matches!(c, '*' | '[' | '{') || (c == '?' && prev != '?') {
            n += 1;
        }
        prev = c;
    }
    n
}

pub(crate) fn compile_glob(pattern: &str) -> Result<globset::Glob, String> {
    let shown = crate::gate::clip(pattern);
    if pattern.len() > MAX_GLOB_LEN {
        return Err(format!("glob {shown} is longer than {MAX_GLOB_LEN} bytes"));
    }
    if wildcards(pattern) > MAX_GLOB_WILDCARDS {
        return Err(format!("glob {shown} has more than {MAX_GLOB_WILDCARDS} wildcards"));
    }
    if pattern.contains('\0') {
        return Err(format!("glob {shown} contains NUL"));
    }
    if pattern.starts_with('/') || pattern.split('/').any(|c| c == "..") {
        return Err(format!("glob {shown} must be relative and contain no '..'"));
    }
    // globset panics on some patterns its own parser accepted; a pattern is outsider input.
    let built = std::panic::catch_unwind(|| {
        GlobBuilder::new(pattern).literal_separator(true).build().inspect(|g| {
            let _ = g.compile_matcher();
        })
    });
    match built {
        Ok(Ok(g)) => Ok(g),
        Ok(Err(e)) => Err(format!("glob {shown}: {e}")),
        Err(_) => Err(format!("glob {shown} cannot be compiled")),
    }
}

fn glob_set<'a>(patterns: impl Iterator<Item = &'a str>) -> Result<GlobSet, String> {
    let mut b = GlobSetBuilder::new();
    for p in patterns {
        b.add(compile_glob(p)?);
    }
    b.build().map_err(|e| e.to_string())
}

/// What a path is opened for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Its contents: read, stat, resolve, follow; a directory's entries as far as each is granted.
    Contents,
    /// A directory's entry names, nothing inside them (a `DIR/` pattern, see [`Globs`]).
    Names,
}

/// The patterns of one list, split by what they grant: whole paths, and directories' names
/// (the `DIR/` form, kept without its `/`).
struct Split<'a> {
    whole: Vec<&'a str>,
    names: Vec<&'a str>,
}

fn split(patterns: &[String]) -> Split<'_> {
    let (names, whole): (Vec<&str>, Vec<&str>) = patterns.iter().map(String::as_str).partition(|p| p.ends_with('/'));
    Split { whole, names: names.into_iter().map(|p| p.trim_end_matches('/')).collect() }
}

/// One root's effective rule: allowed = requested ∩ granted.
#[derive(Clone, Debug)]
pub struct Rule {
    requested: GlobSet,
    granted: GlobSet,
    /// Directories whose names the manifest asks for (`DIR/`), and those the operator grants so:
    /// a grant of the path itself (`bus/pci/**`) grants its names too.
    requested_names: GlobSet,
    granted_names: GlobSet,
    /// The manifest key this rule comes from (`sysfs`, `dev`), for refusal messages.
    key: &'static str,
}

impl Rule {
    pub fn new(requested: &[String], granted: &[String]) -> Result<Self, String> {
        let (r, g) = (split(requested), split(granted));
        Ok(Rule {
            requested: glob_set(r.whole.into_iter())?,
            granted: glob_set(g.whole.into_iter())?,
            requested_names: glob_set(r.names.into_iter())?,
            granted_names: glob_set(g.names.into_iter())?,
            key: "sysfs/dev",
        })
    }

    /// The manifest key this rule comes from, for refusal messages.
    pub(crate) fn key(&self) -> &'static str {
        self.key
    }

    /// The same rule, named after its manifest key.
    fn keyed(mut self, key: &'static str) -> Self {
        self.key = key;
        self
    }

    pub fn allows(&self, rel: &str) -> bool {
        self.requested.is_match(rel) && self.granted.is_match(rel)
    }

    /// Whether every entry name of directory `rel` may be shown: it may be listed, and one side
    /// says `rel/` (the manifest asks for its names, or the operator grants them so). Otherwise
    /// a listing shows the entries granted whole.
    pub(crate) fn lists_all(&self, rel: &str) -> bool {
        self.admits(rel, Access::Names) && (self.requested_names.is_match(rel) || self.granted_names.is_match(rel))
    }

    /// Whether `rel` may be opened for `access`. For its names, either side may say so as a
    /// whole path or as `DIR/` (a manifest asking for `DIR` may list it where the operator
    /// granted `DIR/`); which entries the listing then shows is [`Rule::lists_all`]'s question.
    pub fn admits(&self, rel: &str, access: Access) -> bool {
        match access {
            Access::Contents => self.allows(rel),
            Access::Names => {
                (self.requested.is_match(rel) || self.requested_names.is_match(rel))
                    && (self.granted.is_match(rel) || self.granted_names.is_match(rel))
            }
        }
    }

    /// Whether the backend asked for `rel` at all (to tell "not requested" from "not granted").
    pub fn requested(&self, rel: &str) -> bool {
        self.requested.is_match(rel)
    }

    /// Whether the backend asked for `rel` for `access`.
    pub(crate) fn requested_for(&self, rel: &str, access: Access) -> bool {
        self.requested(rel) || (access == Access::Names && self.requested_names.is_match(rel))
    }
}

/// The effective capabilities of one backend.
#[derive(Clone, Debug)]
pub struct Capabilities {
    pub sysfs: Rule,
    pub dev: Rule,
    pub procfs: Rule,
    /// Host paths, matched without their leading `/`.
    pub mounts: Rule,
    /// Container paths, matched without their leading `/`.
    pub mount_targets: Rule,
    /// Host paths that may be mounted read-write, matched without their leading `/`.
    pub writable_mounts: Rule,
    /// Env keys, by the env gate's own matcher (`EnvGrant::admits`); the keys the grant names
    /// literally are the only way a code-loading key passes (`EnvRule::named`).
    pub env: crate::gate::EnvRule,
    pub resources: Rule,
    pub annotations: Rule,
    pub uevents: Rule,
}

impl Capabilities {
    pub fn new(requested: &Globs, granted: &Globs) -> Result<Self, String> {
        Ok(Capabilities {
            sysfs: Rule::new(&requested.sysfs, &granted.sysfs)?.keyed("sysfs"),
            dev: Rule::new(&requested.dev, &granted.dev)?.keyed("dev"),
            procfs: Rule::new(&requested.procfs, &granted.procfs)?.keyed("procfs"),
            mounts: Rule::new(&absolute_globs(&requested.mounts)?, &absolute_globs(&granted.mounts)?)?,
            mount_targets: Rule::new(
                &absolute_globs(&requested.mount_targets)?,
                &absolute_globs(&granted.mount_targets)?,
            )?,
            writable_mounts: Rule::new(
                &absolute_globs(&requested.writable_mounts)?,
                &absolute_globs(&granted.writable_mounts)?,
            )?,
            env: crate::gate::EnvRule::new(&requested.env, &granted.env),
            resources: Rule::new(&requested.resources, &granted.resources)?,
            annotations: Rule::new(&requested.annotations, &granted.annotations)?,
            uevents: Rule::new(&requested.uevents, &granted.uevents)?,
        })
    }
}

/// Mount globs are host paths: absolute in the manifest, matched relative to `/`.
fn absolute_globs(patterns: &[String]) -> Result<Vec<String>, String> {
    patterns
        .iter()
        .map(|p| {
            p.strip_prefix('/')
                .filter(|rest| !rest.starts_with('/'))
                .map(str::to_owned)
                .ok_or_else(|| format!("mount glob {p:?} must be an absolute host path"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{Access, Rule, compile_glob, wildcards};

    #[test]
    fn a_run_of_question_marks_is_one_wildcard_and_every_star_counts() {
        assert_eq!(wildcards("devices/pci*/**/????:??:??.?/net"), 7);
        assert!(compile_glob(&"?".repeat(100)).is_ok());
        assert!(compile_glob(&"*a".repeat(17)).unwrap_err().contains("wildcards"));
        assert!(compile_glob(&"?a".repeat(17)).unwrap_err().contains("wildcards"));
    }

    #[test]
    fn a_trailing_slash_asks_for_names_only() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let r = Rule::new(&s(&["bus/pci/drivers/*/", "class/net"]), &s(&["bus/**", "class/**"])).unwrap();
        assert!(r.lists_all("bus/pci/drivers/vfio-pci"));
        assert!(!r.allows("bus/pci/drivers/vfio-pci"), "the names, not the path");
        assert!(r.admits("bus/pci/drivers/vfio-pci", Access::Names));
        assert!(!r.admits("bus/pci/drivers/vfio-pci", Access::Contents));
        assert!(!r.admits("bus/pci/drivers/vfio-pci/bind", Access::Names));
        assert!(!r.lists_all("class/net"), "a whole path lists only what is granted whole");
        assert!(r.admits("class/net", Access::Names));
        let not_granted = Rule::new(&s(&["bus/pci/drivers/*/"]), &s(&["class/**"])).unwrap();
        assert!(!not_granted.admits("bus/pci/drivers/vfio-pci", Access::Names));
        // A manifest asking for the path, an operator granting its names: every name, as both
        // allow; the entries' contents not.
        let old = Rule::new(&s(&["bus/pci/devices", "bus/pci/devices/*"]), &s(&["bus/pci/devices/"])).unwrap();
        assert!(old.lists_all("bus/pci/devices"));
        assert!(!old.allows("bus/pci/devices/0000:3b:00.0"));
    }
}
