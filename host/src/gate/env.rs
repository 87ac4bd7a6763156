//! Environment variables, by allow-list. A key a backend sets in a container is a plain name;
//! a value carries no NUL. What an operator (or an embedded backend's manifest, which stands in
//! for its grant) may grant is an exact key or a vendor prefix glob: `NVIDIA_*` admits
//! `NVIDIA_VISIBLE_DEVICES` and nothing outside `NVIDIA_`; numbered keys of one stem are granted
//! as `STEM#`: `QAT#` admits `QAT0` … `QAT9999` (the stem and 1–4 digits) and nothing else,
//! as Intel's QAT plugin names them. A bare `*`, any other wildcard, or a
//! prefix too short to name a vendor (`A_*`, `HF_*`, `LD_*`) is refused where the grant is
//! loaded, with what to write instead: such a glob admitted `LUA_INIT`, `ERL_AFLAGS`,
//! `PIP_INDEX_URL` and every other key that makes a program run code or fetch from elsewhere, and
//! no list of those keys is ever complete.

use super::Refused;

/// Longest env key devplug passes on.
pub(crate) const MAX_KEY: usize = 256;
/// Shortest vendor prefix a glob grant may name, before its `_` (`AMD_*`, `NVIDIA_*`); also the
/// shortest stem of a numbered grant (`QAT#`).
pub(crate) const MIN_PREFIX: usize = 3;
/// Most digits a numbered grant's keys carry after their stem.
pub(crate) const MAX_DIGITS: usize = 4;

/// An env key a container may be given: `[A-Za-z_][A-Za-z0-9_]*`, at most [`MAX_KEY`] bytes.
/// The only key type a container's environment holds (`model::ContainerEdits::env`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(transparent)]
pub struct EnvKey(String);

impl EnvKey {
    pub fn new(s: &str) -> Result<EnvKey, Refused> {
        let plain = s.len() <= MAX_KEY
            && s.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !plain {
            return Err(Refused::new("env key", s, "not a plain name ([A-Za-z_][A-Za-z0-9_]*, at most 256 bytes)"));
        }
        Ok(EnvKey(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// An env value a container may be given: no NUL (the kernel's `envp` ends a string there, so
/// what follows would be lost or read as another variable).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(transparent)]
pub struct EnvValue(String);

impl std::fmt::Display for EnvKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl EnvValue {
    pub fn new(s: &str) -> Result<EnvValue, Refused> {
        if s.contains('\0') {
            return Err(Refused::new("env value", s, "no NUL byte"));
        }
        Ok(EnvValue(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// One entry of an env grant: an exact key, or a vendor prefix ending in `_*`; and, in what a
/// manifest requests (embedded manifests stand in for their grant), any prefix or every key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EnvGrant {
    Exact(EnvKey),
    /// The prefix, `_` included (`NVIDIA_`).
    Prefix(String),
    /// `STEM#`: the stem followed by 1 to [`MAX_DIGITS`] decimal digits (`QAT0`, `QAT31`).
    Numbered(String),
    /// `*`: only in a request ([`EnvGrant::request`]); an operator's grant never holds it.
    Any,
}

impl EnvGrant {
    /// The grant entry `pattern`, or why it is refused and what to write instead.
    pub fn new(pattern: &str) -> Result<EnvGrant, Refused> {
        if let Ok(key) = EnvKey::new(pattern) {
            return Ok(EnvGrant::Exact(key));
        }
        let instead = "name the keys (env = [\"VENDOR_VISIBLE_DEVICES\"]), one vendor prefix of at least 3 characters (env = [\"VENDOR_*\"]) or numbered keys of one stem (env = [\"QAT#\"] for QAT0, QAT1, …)";
        if let Some(stem) = pattern.strip_suffix('#') {
            return numbered(stem).ok_or_else(|| {
                Refused::owned(
                    "env grant",
                    pattern,
                    format!("a numbered grant is a plain name of at least {MIN_PREFIX} characters and `#`: {instead}"),
                )
            });
        }
        let Some(prefix) = pattern.strip_suffix('*') else {
            return Err(Refused::owned("env grant", pattern, format!("not a plain key: {instead}")));
        };
        let first_word = prefix.split('_').next().unwrap_or_default();
        let shape = prefix.ends_with('_')
            && prefix.starts_with(|c: char| c.is_ascii_alphabetic())
            && prefix.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !shape || first_word.len() < MIN_PREFIX {
            return Err(Refused::owned(
                "env grant",
                pattern,
                format!(
                    "a glob admits keys only inside a vendor prefix; {:?} would admit code-running keys such as LUA_INIT, ERL_AFLAGS or PIP_INDEX_URL: {instead}",
                    super::clip(pattern)
                ),
            ));
        }
        Ok(EnvGrant::Prefix(prefix.to_owned()))
    }

    /// A manifest's request `pattern`: what a grant may hold, or `*`, or any `NAME*` prefix (a
    /// request asks; the grant decides). `None` for a pattern no grant could ever match.
    pub fn request(pattern: &str) -> Option<EnvGrant> {
        if pattern == "*" {
            return Some(EnvGrant::Any);
        }
        if let Ok(key) = EnvKey::new(pattern) {
            return Some(EnvGrant::Exact(key));
        }
        if let Some(stem) = pattern.strip_suffix('#') {
            return numbered(stem);
        }
        let prefix = pattern.strip_suffix('*')?;
        EnvKey::new(prefix).ok().map(|_| EnvGrant::Prefix(prefix.to_owned()))
    }

    /// Whether this entry admits `key`: the one env matcher (requests, grants, answers).
    pub fn admits(&self, key: &EnvKey) -> bool {
        match self {
            EnvGrant::Exact(k) => k == key,
            EnvGrant::Prefix(p) => key.as_str().len() > p.len() && key.as_str().starts_with(p.as_str()),
            EnvGrant::Numbered(stem) => key.as_str().strip_prefix(stem.as_str()).is_some_and(|digits| {
                (1..=MAX_DIGITS).contains(&digits.len()) && digits.bytes().all(|b| b.is_ascii_digit())
            }),
            EnvGrant::Any => true,
        }
    }
}

/// The numbered grant of `stem` (`QAT` of `QAT#`), if it is a plain name long enough to be a
/// vendor's.
fn numbered(stem: &str) -> Option<EnvGrant> {
    let key = EnvKey::new(stem).ok()?;
    (key.as_str().len() >= MIN_PREFIX).then(|| EnvGrant::Numbered(key.as_str().to_owned()))
}

/// A backend's env rule: a key passes when its manifest requested it and its grant admits it,
/// both by [`EnvGrant::admits`]; a key that makes programs load code passes only when the grant
/// names it exactly ([`EnvRule::named`]).
#[derive(Clone, Debug, Default)]
pub struct EnvRule {
    requested: Vec<EnvGrant>,
    granted: Vec<EnvGrant>,
}

impl EnvRule {
    /// The rule of `requested` ∩ `granted`; patterns no grant could match are left out (the
    /// operator's grants were refused at config load already, `EnvGrant::new`).
    pub fn new(requested: &[String], granted: &[String]) -> EnvRule {
        let parse = |list: &[String]| list.iter().filter_map(|p| EnvGrant::request(p)).collect();
        EnvRule { requested: parse(requested), granted: parse(granted) }
    }

    pub fn allows(&self, key: &EnvKey) -> bool {
        self.requested(key) && self.granted.iter().any(|g| g.admits(key))
    }

    /// Whether the manifest asked for `key` (to tell "not requested" from "not granted").
    pub fn requested(&self, key: &EnvKey) -> bool {
        self.requested.iter().any(|g| g.admits(key))
    }

    /// Whether the grant names `key` exactly.
    pub fn named(&self, key: &EnvKey) -> bool {
        self.granted.iter().any(|g| matches!(g, EnvGrant::Exact(k) if k == key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_glob_grant_names_a_vendor_prefix() {
        for ok in ["NVIDIA_*", "PCIDEVICE_*", "AMD_*", "CHAOS_*", "ACME_GPU_*", "MY_KEY", "NVIDIA_VISIBLE_DEVICES"] {
            assert!(EnvGrant::new(ok).is_ok(), "{ok}");
        }
        for bad in ["*", "A_*", "HF_*", "LD_*", "NVIDIA*", "NVIDIA_?", "NV[I]DIA_*", "*_DEVICES", "_*", "1ABC_*", "**"]
        {
            let e = EnvGrant::new(bad).unwrap_err().to_string();
            assert!(e.contains("VENDOR_*"), "{bad}: {e}");
        }
        let g = EnvGrant::new("NVIDIA_*").unwrap();
        assert!(g.admits(&EnvKey::new("NVIDIA_VISIBLE_DEVICES").unwrap()));
        assert!(EnvGrant::new("*").is_err() && EnvGrant::request("*") == Some(EnvGrant::Any));
        for outside in ["NVIDIA_", "NVIDIAX", "LUA_INIT", "ERL_AFLAGS", "PIP_INDEX_URL", "HF_ENDPOINT"] {
            assert!(!g.admits(&EnvKey::new(outside).unwrap()), "{outside}");
        }
    }

    /// Issue 49: the rule and the grant's own check are one matcher: `NVIDIA_*` admits no key
    /// `NVIDIA_` in either (globset matched it, `admits` did not).
    #[test]
    fn the_rule_matches_as_the_grant_does() {
        let k = |s: &str| EnvKey::new(s).unwrap();
        let rule = EnvRule::new(&["NVIDIA_*".into(), "QAT[0-9]".into()], &["NVIDIA_*".into()]);
        assert!(rule.allows(&k("NVIDIA_VISIBLE_DEVICES")));
        assert!(!rule.allows(&k("NVIDIA_")) && !rule.requested(&k("NVIDIA_")));
        assert!(!rule.requested(&k("QAT1")), "a pattern no grant could match is no request");
        let any = EnvRule::new(&["*".into()], &["VK_LAYER_PATH".into(), "ACME_*".into()]);
        assert!(any.allows(&k("ACME_X")) && any.named(&k("VK_LAYER_PATH")) && !any.named(&k("ACME_X")));
        assert!(!any.allows(&k("LD_PRELOAD")));
    }

    /// Issue 52: numbered keys of one stem (Intel's `QAT0`…`QAT31`) are one grant, `QAT#`,
    /// that admits the stem and digits only; what it refuses says what to write.
    #[test]
    fn a_numbered_grant_admits_its_stem_and_digits_only() {
        let k = |s: &str| EnvKey::new(s).unwrap();
        let g = EnvGrant::new("QAT#").unwrap();
        for ok in ["QAT0", "QAT31", "QAT9999"] {
            assert!(g.admits(&k(ok)), "{ok}");
        }
        for no in ["QAT", "QAT10000", "QATX", "QAT1_X", "QAT_1", "QATS0", "XQAT1", "LD_PRELOAD"] {
            assert!(!g.admits(&k(no)), "{no}");
        }
        for bad in ["Q#", "QA#", "#", "1AB#", "QAT-#", "QAT##", "QAT*#"] {
            let e = EnvGrant::new(bad).unwrap_err().to_string();
            assert!(e.contains("QAT#"), "{bad}: {e}");
        }
        let rule = EnvRule::new(&["QAT#".into()], &["QAT#".into()]);
        assert!(rule.allows(&k("QAT7")) && !rule.allows(&k("QATX")) && !rule.named(&k("QAT7")));
        let unrequested = EnvRule::new(&["NVIDIA_*".into()], &["QAT#".into()]);
        assert!(!unrequested.allows(&k("QAT7")), "a grant alone is not a request");
    }

    proptest! {
        #[test]
        fn no_input_yields_a_key_a_container_runtime_would_mangle(s in any::<String>()) {
            if let Ok(k) = EnvKey::new(&s) {
                prop_assert!(!k.as_str().is_empty() && k.as_str().len() <= MAX_KEY);
                prop_assert!(!k.as_str().contains(['=', '\0']));
                prop_assert!(!k.as_str().starts_with(|c: char| c.is_ascii_digit()));
            }
            if let Ok(v) = EnvValue::new(&s) {
                prop_assert!(!v.as_str().contains('\0'));
            }
        }

        /// Whatever the grant pattern, what it admits stays inside one vendor's prefix.
        #[test]
        fn no_grant_admits_a_key_outside_the_prefix_it_names(pattern in "[A-Z_*?#]{0,12}", key in "[A-Z_0-9]{1,16}") {
            if let (Ok(g), Ok(k)) = (EnvGrant::new(&pattern), EnvKey::new(&key)) && g.admits(&k) {
                match g {
                    EnvGrant::Exact(e) => prop_assert_eq!(e.as_str(), key.as_str()),
                    EnvGrant::Prefix(p) => {
                        prop_assert!(key.starts_with(&p) && p.split('_').next().unwrap().len() >= MIN_PREFIX);
                    }
                    EnvGrant::Numbered(stem) => {
                        let digits = &key[stem.len()..];
                        prop_assert!(key.starts_with(&stem) && !digits.is_empty());
                        prop_assert!(digits.len() <= MAX_DIGITS && digits.bytes().all(|b| b.is_ascii_digit()));
                    }
                    EnvGrant::Any => prop_assert!(false, "a grant never admits every key"),
                }
            }
        }
    }
}
