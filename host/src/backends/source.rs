//! A backend before it is loaded: its bytes, its manifest and where it came from.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use super::manifest::Manifest;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// Compiled into this binary.
    Embedded,
    /// A `.wasm` file (with an optional `NAME.toml` manifest beside it).
    File(PathBuf),
    /// Pulled from a registry: the reference as configured and the digest it resolved to.
    Registry { reference: String, digest: String },
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Embedded => f.write_str("embedded"),
            Origin::File(p) => write!(f, "{}", p.display()),
            Origin::Registry { reference, digest } => write!(f, "{reference}@{digest}"),
        }
    }
}

#[derive(Clone, Debug)]
pub struct BackendSource {
    pub name: String,
    /// The component: borrowed from the binary for the embedded backends (no heap copy of what
    /// the binary already holds), owned when read from a file.
    pub bytes: Cow<'static, [u8]>,
    pub manifest: Manifest,
    pub origin: Origin,
    /// The version in the file name (`gpu-1.3.0.wasm`), if it has one.
    pub file_version: Option<semver::Version>,
    /// Identifies the content (component bytes and manifest text): a change means a new version.
    pub key: String,
    /// Native code of the component signed by the operator's key, when the registry had some:
    /// loaded instead of compiling.
    pub signed: SignedNative,
}

/// A registry version's operator-signed native code ([`crate::oci::native`]), handed to the
/// first load of the version and let go there: it is tens of MB, and once loaded the compile
/// cache holds it, so the sources the follower keeps do not. A later load of the same version
/// without it reads the compile cache (or compiles).
#[derive(Clone, Default)]
pub struct SignedNative(std::sync::Arc<std::sync::Mutex<Option<crate::durable::Spooled>>>);

impl SignedNative {
    pub fn new(code: crate::durable::Spooled) -> Self {
        SignedNative(std::sync::Arc::new(std::sync::Mutex::new(Some(code))))
    }

    /// The code, once.
    pub fn take(&self) -> Option<crate::durable::Spooled> {
        use crate::sync::Locked;
        self.0.locked().take()
    }
}

impl std::fmt::Debug for SignedNative {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use crate::sync::Locked;
        let len = self.0.locked().as_ref().map(crate::durable::Spooled::len);
        write!(f, "SignedNative({len:?} bytes)")
    }
}

/// `sha256(bytes) + sha256(manifest)`, short.
fn source_key(bytes: &[u8], manifest_text: &str) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(Sha256::digest(bytes));
    h.update(Sha256::digest(manifest_text.as_bytes()));
    hex::encode(&h.finalize()[..16])
}

/// `gpu-1.3.0` → (`gpu`, 1.3.0); a stem without a trailing semver is a name as it is.
pub fn split_version(stem: &str) -> (&str, Option<semver::Version>) {
    stem.match_indices('-')
        .map(|(i, _)| i)
        .find_map(|i| semver::Version::parse(&stem[i + 1..]).ok().map(|v| (&stem[..i], Some(v))))
        .unwrap_or((stem, None))
}

impl BackendSource {
    /// The embedded first-party backends.
    pub fn embedded() -> Vec<BackendSource> {
        super::embedded::FIRST_PARTY
            .iter()
            .map(|(name, bytes, manifest)| BackendSource {
                name: (*name).to_owned(),
                bytes: Cow::Borrowed(*bytes),
                manifest: Manifest::parse(manifest).expect("first-party manifests are valid"),
                origin: Origin::Embedded,
                file_version: None,
                key: source_key(bytes, manifest),
                signed: SignedNative::default(),
            })
            .collect()
    }

    /// `path` and its manifest (`NAME.toml` beside `NAME.wasm`; none means no capabilities).
    /// The backend's name is the file stem without a trailing version (`gpu-1.3.0.wasm` is
    /// version 1.3.0 of `gpu`): the operator's config and grants are keyed by what the operator
    /// sees in the directory, so a manifest that names another backend is refused rather than
    /// believed.
    pub fn from_file(path: &Path) -> anyhow::Result<BackendSource> {
        Self::from_file_with(path, None)
    }

    /// Like [`from_file`](Self::from_file), with the manifest at `manifest` when given.
    pub(crate) fn from_file_with(path: &Path, manifest: Option<&Path>) -> anyhow::Result<BackendSource> {
        let bytes = std::fs::read(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        let manifest_path = manifest.map(Path::to_owned).unwrap_or_else(|| path.with_extension("toml"));
        let (manifest, text) = match std::fs::read_to_string(&manifest_path) {
            Ok(text) => {
                (Manifest::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", manifest_path.display()))?, text)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (Manifest::default(), String::new()),
            Err(e) => anyhow::bail!("{}: {e}", manifest_path.display()),
        };
        let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("backend");
        let (base, file_version) = split_version(stem);
        if let Some(claimed) = manifest.name.as_deref().filter(|n| *n != base) {
            anyhow::bail!(
                "{}: its manifest says name = {:?}, but the file makes it backend {base:?}; a manifest cannot take another backend's name (and grants): rename the file or fix the name",
                path.display(),
                crate::gate::clip(claimed)
            );
        }
        Ok(BackendSource {
            name: base.to_owned(),
            key: source_key(&bytes, &text),
            bytes: Cow::Owned(bytes),
            manifest,
            origin: Origin::File(path.to_owned()),
            file_version,
            signed: SignedNative::default(),
        })
    }
}

impl BackendSource {
    /// Backend `name` as pulled from `reference`. Its manifest, when it carries one, must parse
    /// and may not name another backend (the operator's config and grant are keyed by `name`).
    pub(crate) fn from_registry(
        name: &str,
        reference: &str,
        pulled: crate::oci::Pulled,
    ) -> anyhow::Result<BackendSource> {
        let manifest = if pulled.manifest.is_empty() {
            Manifest::default()
        } else {
            Manifest::parse(&pulled.manifest).map_err(|e| anyhow::anyhow!("{reference}: its manifest: {e}"))?
        };
        if let Some(claimed) = manifest.name.as_deref().filter(|n| *n != name) {
            anyhow::bail!(
                "{reference}: its manifest says name = {:?}, but the config serves it as backend {name:?}; a manifest cannot take another backend's name (and grants)",
                crate::gate::clip(claimed)
            );
        }
        Ok(BackendSource {
            name: name.to_owned(),
            key: source_key(&pulled.component, &pulled.manifest),
            bytes: Cow::Owned(pulled.component),
            manifest,
            origin: Origin::Registry { reference: reference.to_owned(), digest: pulled.digest },
            file_version: None,
            signed: SignedNative::default(),
        })
    }
}

/// The manifest a command-line tool uses for `wasm`: `explicit` when given, else `NAME.toml`
/// beside it, else `devplug.toml` beside it (the layout `devplug new` makes). `None` means the
/// backend gets no capabilities, which the caller should say.
pub fn manifest_for(wasm: &Path, explicit: Option<&Path>) -> Option<PathBuf> {
    if let Some(m) = explicit {
        return Some(m.to_owned());
    }
    let beside = wasm.with_extension("toml");
    let project = wasm.parent().map(|d| d.join("devplug.toml"));
    [Some(beside), project].into_iter().flatten().find(|p| p.is_file())
}

/// Every `*.wasm` in `dir` (hidden entries skipped: Kubernetes keeps a ConfigMap's real files
/// under `..data/`), one per backend name: of several versions of one backend
/// (`gpu-1.2.0.wasm`, `gpu-1.3.0.wasm`) the highest file version wins, and a versioned file wins
/// over an unversioned one. Files that cannot be read, and the versions passed over, are
/// reported, not fatal.
pub fn load_dir(dir: &Path) -> (Vec<BackendSource>, Vec<anyhow::Error>) {
    let mut errors = Vec::new();
    let mut paths: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "wasm"))
            .filter(|p| !p.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.')))
            .collect(),
        Err(e) => {
            errors.push(anyhow::anyhow!("backends dir {}: {e}", dir.display()));
            return (Vec::new(), errors);
        }
    };
    paths.sort();
    let mut by_name: std::collections::BTreeMap<String, BackendSource> = std::collections::BTreeMap::new();
    for p in paths {
        let src = match BackendSource::from_file(&p) {
            Ok(s) => s,
            Err(e) => {
                errors.push(e);
                continue;
            }
        };

        match by_name.get(&src.name) {
            Some(kept) if kept.file_version >= src.file_version => {
                errors.push(passed_over(&src, kept));
            }
            Some(kept) => {
                errors.push(passed_over(kept, &src));
                by_name.insert(src.name.clone(), src);
            }
            None => {
                by_name.insert(src.name.clone(), src);
            }
        }
    }
    for src in by_name.values() {
        if let Origin::File(p) = &src.origin
            && !p.with_extension("toml").exists()
        {
            errors.push(anyhow::anyhow!(
                "{}: no {} beside it, so it gets no capabilities (a manifest is NAME.toml beside NAME.wasm)",
                p.display(),
                p.with_extension("toml").file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
            ));
        }
    }
    (by_name.into_values().collect(), errors)
}

fn passed_over(old: &BackendSource, new: &BackendSource) -> anyhow::Error {
    let v = |s: &BackendSource| s.file_version.as_ref().map_or("unversioned".to_owned(), |v| v.to_string());
    anyhow::anyhow!(
        "{} ({}) not loaded: {} ({}) is a newer version of backend {:?}",
        old.origin,
        v(old),
        new.origin,
        v(new),
        new.name
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_come_from_the_file_stem() {
        assert_eq!(split_version("gpu-1.3.0"), ("gpu", Some(semver::Version::new(1, 3, 0))));
        assert_eq!(split_version("my-nic-2.0.0-rc.1").0, "my-nic");
        assert_eq!(split_version("intel-gpu"), ("intel-gpu", None));
        assert_eq!(split_version("gpu"), ("gpu", None));
    }

    #[test]
    fn the_highest_version_of_a_backend_wins_and_the_others_are_named() {
        let d = tempfile::tempdir().unwrap();
        for f in ["gpu-1.2.0.wasm", "gpu-1.10.0.wasm", "gpu.wasm", "nic.wasm", ".hidden.wasm"] {
            std::fs::write(d.path().join(f), f).unwrap();
        }
        let (srcs, errors) = load_dir(d.path());
        let picked: Vec<String> = srcs.iter().map(|s| s.origin.to_string()).collect();
        assert!(picked[0].ends_with("gpu-1.10.0.wasm") && picked[1].ends_with("nic.wasm"), "{picked:?}");
        assert_eq!(picked.len(), 2);
        let msgs: Vec<String> =
            errors.iter().map(|e| e.to_string()).filter(|m| !m.contains("no capabilities")).collect();
        assert_eq!(msgs.len(), 2, "{msgs:?}");
        let bare = errors.iter().filter(|e| e.to_string().contains("so it gets no capabilities")).count();
        assert_eq!(bare, 2, "each picked file without a manifest is named");
        assert!(msgs.iter().all(|m| m.contains("gpu-1.10.0.wasm (1.10.0) is a newer version")), "{msgs:?}");
    }
}
