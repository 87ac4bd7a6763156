//! The node's cache of verified backends, by content: `<cache>/oci/sha256/<manifest digest>/`
//! holds `component.wasm` and `manifest.toml`; `<cache>/oci/refs/<backend>.json` names the digest
//! last verified for that backend's reference. Only verified content is written, each file
//! atomically, so a restart with the registry down serves what was last accepted, never a
//! half-written or unverified blob. Every directory is devplug's alone (`StateDir`: `0700`,
//! checked, files opened without following links).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::artifact::Pulled;
use crate::durable::StateDir;

/// What the cache says about one backend's reference.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CachedRef {
    pub reference: String,
    pub digest: String,
    /// Unix seconds of the pull.
    pub pulled_at: u64,
}

pub struct Cache {
    root: PathBuf,
}

impl Cache {
    pub fn new(cache_dir: &Path) -> Cache {
        Cache { root: cache_dir.join("oci") }
    }

    fn blob_path(&self, digest: &str) -> PathBuf {
        self.root.join(digest.replace(':', "/"))
    }

    /// The directory of one digest (`sha256:<64 hex>` only: a digest is a registry's word).
    fn blob_dir(&self, digest: &str) -> anyhow::Result<StateDir> {
        let hex = digest
            .strip_prefix("sha256:")
            .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
            .ok_or_else(|| anyhow::anyhow!("{:?} is not a sha256 digest", crate::gate::clip(digest)))?;
        Ok(StateDir::open(&self.root)?.subdir("sha256")?.subdir(hex)?)
    }

    /// An unnamed file in the cache's own directory (gone when closed), for a download too large
    /// to hold in memory before it is checked.
    pub(crate) fn scratch(&self) -> anyhow::Result<std::fs::File> {
        Ok(StateDir::open(&self.root)?.unnamed()?)
    }

    fn refs(&self) -> anyhow::Result<StateDir> {
        Ok(StateDir::open(&self.root)?.subdir("refs")?)
    }

    /// Remember `pulled` as `backend`'s verified version of `reference`.
    pub fn store(&self, backend: &str, reference: &str, pulled: &Pulled) -> anyhow::Result<()> {
        let dir = self.blob_dir(&pulled.digest)?;
        dir.write("component.wasm", &pulled.component, true)?;
        dir.write("manifest.toml", pulled.manifest.as_bytes(), true)?;
        dir.write("layout", pulled.layout.as_bytes(), true)?;
        dir.write("component.sha256", hex::encode(Sha256::digest(&pulled.component)).as_bytes(), true)?;
        self.point(backend, reference, &pulled.digest)
    }

    /// Record that `backend`'s `reference` now means `digest`, whose version is already stored
    /// (a tag moved back to a version this node has): nothing is written again but the ref.
    pub fn point(&self, backend: &str, reference: &str, digest: &str) -> anyhow::Result<()> {
        let entry = CachedRef {
            reference: reference.to_owned(),
            digest: digest.to_owned(),
            pulled_at: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
        };
        self.refs()?.write(&format!("{backend}.json"), &serde_json::to_vec_pretty(&entry)?, true)?;
        Ok(())
    }

    pub(crate) fn load_digest(&self, digest: &str) -> Option<Pulled> {
        let dir = self.blob_dir(digest).ok()?;
        let text = |name: &str| dir.read(name).ok().flatten().and_then(|b| String::from_utf8(b).ok());
        let sum = text("component.sha256")?;
        let component = dir.read("component.wasm").ok()??;
        if hex::encode(Sha256::digest(&component)) != sum.trim() {
            return None;
        }
        let manifest = text("manifest.toml")?;
        let layout = match text("layout")?.as_str() {
            "devplug-pack" => "devplug-pack",
            _ => "wasm-artifact",
        };
        Some(Pulled { digest: digest.to_owned(), component, manifest, layout, name: None })
    }

    /// `backend`'s last verified version of `reference`, if the cache has it whole.
    pub fn load(&self, backend: &str, reference: &str) -> anyhow::Result<Option<(CachedRef, Pulled)>> {
        let refs = self.refs()?;
        let name = format!("{backend}.json");
        let file = refs.shown(&name);
        let Some(text) = refs.read(&name)? else { return Ok(None) };
        let entry: CachedRef = serde_json::from_slice(&text).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
        if entry.reference != reference {
            // The operator pointed the backend elsewhere: what is cached is not what is asked for.
            return Ok(None);
        }
        let mut pulled = self.load_digest(&entry.digest).ok_or_else(|| {
            anyhow::anyhow!(
                "{}: cached version is missing or does not match its checksum (disk corruption?); it will be pulled again",
                self.blob_path(&entry.digest).display()
            )
        })?;
        pulled.name = Some(backend.to_owned());
        Ok(Some((entry, pulled)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_versions_come_back_and_corruption_is_caught() {
        let d = tempfile::tempdir().unwrap();
        let c = Cache::new(d.path());
        let p = Pulled {
            digest: format!("sha256:{}", "ab".repeat(32)),
            component: b"\0asm-ish".to_vec(),
            manifest: "name = \"x\"\n".into(),
            layout: "wasm-artifact",
            name: None,
        };
        c.store("x", "r.io/x:1", &p).unwrap();
        let (entry, back) = c.load("x", "r.io/x:1").unwrap().unwrap();
        assert_eq!((entry.digest.as_str(), back.component.as_slice()), (p.digest.as_str(), p.component.as_slice()));
        assert!(c.load("x", "r.io/x:2").unwrap().is_none(), "another reference is not served from cache");
        assert!(c.load("y", "r.io/x:1").unwrap().is_none());
        assert_eq!(c.load_digest(&p.digest).unwrap().component, p.component);
        assert!(c.load_digest(&format!("sha256:{}", "cd".repeat(32))).is_none());
        // The tag moves to another version and back: pointing at a stored version is enough.
        let q = Pulled { digest: format!("sha256:{}", "ef".repeat(32)), component: b"\0asm-2".to_vec(), ..p.clone() };
        c.store("x", "r.io/x:1", &q).unwrap();
        assert_eq!(c.load("x", "r.io/x:1").unwrap().unwrap().0.digest, q.digest);
        c.point("x", "r.io/x:1", &p.digest).unwrap();
        assert_eq!(c.load("x", "r.io/x:1").unwrap().unwrap().1.component, p.component);
        std::fs::write(d.path().join("oci/sha256").join("ab".repeat(32)).join("component.wasm"), b"evil").unwrap();
        assert!(c.load("x", "r.io/x:1").unwrap_err().to_string().contains("checksum"));
        assert!(c.load_digest(&p.digest).is_none(), "a damaged entry is pulled again");
    }
}
