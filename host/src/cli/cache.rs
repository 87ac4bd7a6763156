//! The compile cache every command shares, so `discover`, `allocate`, `try`, `push`, `pack`,
//! `inspect` and a project's test script compile a backend once between them: `--cache-dir`,
//! else `$DEVPLUG_CACHE_DIR`, else the user's cache directory (`$XDG_CACHE_HOME/devplug`,
//! `~/.cache/devplug`). `--no-cache` (or `DEVPLUG_CACHE_DIR=""`) compiles without it.

use std::path::{Path, PathBuf};

use crate::runtime::RuntimeConfig;

/// Where compiled backends are kept: `explicit`, else `$DEVPLUG_CACHE_DIR` (empty: nowhere),
/// else the user's cache directory; `None` when there is none.
pub fn dir(explicit: Option<&Path>) -> Option<PathBuf> {
    if let Some(p) = explicit {
        return Some(p.to_owned());
    }
    match std::env::var_os("DEVPLUG_CACHE_DIR") {
        Some(v) if v.is_empty() => None,
        Some(v) => Some(PathBuf::from(v)),
        None => dirs::cache_dir().map(|d| d.join("devplug")),
    }
}

/// `base` for a one-shot command: the shared cache (unless `no_cache`), and no background
/// compile that the command would end before.
pub(crate) fn one_shot(mut base: RuntimeConfig, explicit: Option<&Path>, no_cache: bool) -> RuntimeConfig {
    base.cache_dir = if no_cache { None } else { dir(explicit).map(|d| crate::durable::StateDir::own_place(&d)) };
    base.optimize_in_background = false;
    base
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_wins_and_no_cache_means_none() {
        let flag = Path::new("/tmp/x");
        assert_eq!(dir(Some(flag)).as_deref(), Some(flag));
        let rc = one_shot(RuntimeConfig::default(), Some(flag), true);
        assert_eq!(rc.cache_dir, None);
        assert!(!rc.optimize_in_background);
        assert_eq!(one_shot(RuntimeConfig::default(), Some(flag), false).cache_dir.as_deref(), Some(flag));
    }
}
