//! What a component is, without running it: its WIT version, imports, exports and manifest
//! (`devplug inspect`), and the check `devplug pack` makes before packing one.

use std::path::Path;

use crate::backends::Manifest;
use crate::runtime::bindings::{exported_version, supports};
use crate::runtime::{Runtime, RuntimeConfig};

/// Check that `bytes` is a backend component of a WIT version this host loads; returns it.
pub(crate) fn inspect_bytes(bytes: &[u8]) -> anyhow::Result<String> {
    let runtime = Runtime::new(super::cache::one_shot(RuntimeConfig::default(), None, false))?;
    let compiled = runtime.compile(bytes)?;
    let version = exported_version(compiled.component.engine(), &compiled.component)
        .ok_or_else(|| anyhow::anyhow!("it does not export devplug:backend/backend"))?;
    anyhow::ensure!(
        supports(&version),
        "built against devplug:backend@{version}, which this host does not load (it loads {})",
        crate::runtime::bindings::SUPPORTED.join(", ")
    );
    Ok(version)
}

/// What a manifest gets wrong that loading it does not refuse: no `resources` (old manifests),
/// requests no grant can hold.
pub fn warnings(m: &Manifest) -> Vec<String> {
    let old = m.resources_unstated.then(|| Manifest::MISSING_RESOURCES.to_owned());
    old.into_iter().chain(m.never_granted()).collect()
}

/// `devplug inspect FILE`: a component file with its manifest, or, when no such file exists and
/// FILE names an embedded first-party backend (`gpu`, `nic`, `fpga`, `generic`), that one.
pub fn inspect(path: &Path, manifest: Option<&Path>) -> anyhow::Result<serde_json::Value> {
    let embedded = crate::backends::embedded::FIRST_PARTY
        .iter()
        .find(|(name, _, _)| !path.exists() && path.as_os_str() == *name && manifest.is_none());
    let (bytes, shown, manifest_path, manifest_text) = match embedded {
        Some((name, bytes, text)) => (bytes.to_vec(), format!("embedded:{name}"), None, Some((*text).to_owned())),
        None => {
            let bytes = std::fs::read(path).map_err(|e| {
                let names: Vec<&str> = crate::backends::embedded::FIRST_PARTY.iter().map(|(n, _, _)| *n).collect();
                anyhow::anyhow!(
                    "{}: {e} (an embedded backend is inspected by its name: {})",
                    path.display(),
                    names.join(", ")
                )
            })?;
            let manifest_path = crate::backends::manifest_for(path, manifest);
            let text = match &manifest_path {
                Some(p) => Some(std::fs::read_to_string(p).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?),
                None => None,
            };
            (bytes, path.display().to_string(), manifest_path.map(|p| p.display().to_string()), text)
        }
    };
    let runtime = Runtime::new(super::cache::one_shot(RuntimeConfig::default(), None, false))?;
    let compiled = runtime.compile(&bytes).map_err(|e| anyhow::anyhow!("{shown}: {e}"))?;
    let component = compiled.component;
    let ty = component.component_type();
    let engine = component.engine();
    let imports: Vec<String> = ty.imports(engine).map(|(n, _)| n.to_owned()).collect();
    let exports: Vec<String> = ty.exports(engine).map(|(n, _)| n.to_owned()).collect();
    let where_manifest = manifest_path.clone().unwrap_or_else(|| shown.clone());
    let manifest = match &manifest_text {
        Some(t) => Some(Manifest::parse(t).map_err(|e| anyhow::anyhow!("{where_manifest}: {e}"))?),
        None => None,
    };
    Ok(serde_json::json!({
        "file": shown,
        "size": bytes.len(),
        "sha256": compiled.digest,
        "wit_version": exported_version(engine, &component),
        "supported": exported_version(engine, &component).is_some_and(|v| supports(&v)),
        "exports": exports,
        "imports": imports,
        "manifest": manifest.as_ref().map(|m| serde_json::json!({"name": m.name, "requests": m.requests})),
        "warnings": manifest.as_ref().map(warnings).unwrap_or_default(),
        "manifest_file": manifest_path,
    }))
}
