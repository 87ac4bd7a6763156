//! A backend before it is loaded: its bytes, its manifest and where it came from.

use std::path::{Path, PathBuf};

use crate::runtime::caps::Manifest;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// Compiled into this binary.
    Embedded,
    /// A `.wasm` file (with an optional `NAME.toml` manifest beside it).
    File(PathBuf),
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Embedded => f.write_str("embedded"),
            Origin::File(p) => write!(f, "{}", p.display()),
        }
    }
}

#[derive(Clone, Debug)]
pub struct BackendSource {
    pub name: String,
    pub bytes: Vec<u8>,
    pub manifest: Manifest,
    pub origin: Origin,
}

impl BackendSource {
    /// The embedded first-party backends.
    pub fn embedded() -> Vec<BackendSource> {
        super::embedded::FIRST_PARTY
            .iter()
            .map(|(name, bytes, manifest)| BackendSource {
                name: (*name).to_owned(),
                bytes: bytes.to_vec(),
                manifest: Manifest::parse(manifest).expect("first-party manifests are valid"),
                origin: Origin::Embedded,
            })
            .collect()
    }

    /// `path` and its manifest (`NAME.toml` beside `NAME.wasm`; none means no capabilities).
    pub fn from_file(path: &Path) -> anyhow::Result<BackendSource> {
        let bytes = std::fs::read(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        let manifest_path = path.with_extension("toml");
        let manifest = match std::fs::read_to_string(&manifest_path) {
            Ok(text) => Manifest::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", manifest_path.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Manifest::default(),
            Err(e) => anyhow::bail!("{}: {e}", manifest_path.display()),
        };
        let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("backend").to_owned();
        Ok(BackendSource {
            name: manifest.name.clone().unwrap_or(stem),
            bytes,
            manifest,
            origin: Origin::File(path.to_owned()),
        })
    }
}

/// Every `*.wasm` in `dir`, sorted by file name. Files that cannot be read are reported, not fatal.
pub fn load_dir(dir: &Path) -> (Vec<BackendSource>, Vec<anyhow::Error>) {
    let mut out = Vec::new();
    let mut errors = Vec::new();
    let mut paths: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(rd) => {
            rd.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|x| x == "wasm")).collect()
        }
        Err(e) => {
            errors.push(anyhow::anyhow!("backends dir {}: {e}", dir.display()));
            return (out, errors);
        }
    };
    paths.sort();
    for p in paths {
        match BackendSource::from_file(&p) {
            Ok(s) => out.push(s),
            Err(e) => errors.push(e),
        }
    }
    (out, errors)
}
