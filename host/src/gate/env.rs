//! Environment variables, by allow-list. A key a backend sets in a container is a plain name;
//! a value carries no NUL. What an operator (or an embedded backend's manifest, which stands in
//! for its grant) may grant is an exact key or a vendor prefix glob: `NVIDIA_*` admits
//! `NVIDIA_VISIBLE_DEVICES` and nothing outside `NVIDIA_`. A bare `*`, any other wildcard, or a
//! prefix too short to name a vendor (`A_*`, `HF_*`, `LD_*`) is refused where the grant is
//! loaded, with what to write instead: such a glob admitted `LUA_INIT`, `ERL_AFLAGS`,
//! `PIP_INDEX_URL` and every other key that makes a program run code or fetch from elsewhere, and
//! no list of those keys is ever complete.

use super::Refused;

/// Longest env key devplug passes on.
pub const MAX_KEY: usize = 256;
/// Shortest vendor prefix a glob grant may name, before its `_` (`AMD_*`, `NVIDIA_*`).
pub const MIN_PREFIX: usize = 3;

/// An env key a container may be given: `[A-Za-z_][A-Za-z0-9_]*`, at most [`MAX_KEY`] bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
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
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvValue(String);

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

/// One entry of an env grant: an exact key, or a vendor prefix ending in `_*`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EnvGrant {
    Exact(EnvKey),
    /// The prefix, `_` included (`NVIDIA_`).
    Prefix(String),
}

impl EnvGrant {
    /// The grant entry `pattern`, or why it is refused and what to write instead.
    pub fn new(pattern: &str) -> Result<EnvGrant, Refused> {
        if let Ok(key) = EnvKey::new(pattern) {
            return Ok(EnvGrant::Exact(key));
        }
        let instead = "name the keys (env = [\"VENDOR_VISIBLE_DEVICES\"]) or one vendor prefix of at least 3 characters (env = [\"VENDOR_*\"])";
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

    /// Whether this entry admits `key`.
    pub fn admits(&self, key: &EnvKey) -> bool {
        match self {
            EnvGrant::Exact(k) => k == key,
            EnvGrant::Prefix(p) => key.as_str().len() > p.len() && key.as_str().starts_with(p.as_str()),
        }
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
        for outside in ["NVIDIA_", "NVIDIAX", "LUA_INIT", "ERL_AFLAGS", "PIP_INDEX_URL", "HF_ENDPOINT"] {
            assert!(!g.admits(&EnvKey::new(outside).unwrap()), "{outside}");
        }
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
        fn no_grant_admits_a_key_outside_the_prefix_it_names(pattern in "[A-Z_*?]{0,12}", key in "[A-Z_]{1,16}") {
            if let (Ok(g), Ok(k)) = (EnvGrant::new(&pattern), EnvKey::new(&key)) && g.admits(&k) {
                match g {
                    EnvGrant::Exact(e) => prop_assert_eq!(e.as_str(), key.as_str()),
                    EnvGrant::Prefix(p) => {
                        prop_assert!(key.starts_with(&p) && p.split('_').next().unwrap().len() >= MIN_PREFIX);
                    }
                }
            }
        }
    }
}
