//! Native code compiled once for a whole cluster (`devplug precompile`) instead of on every node:
//! the engine fingerprint such code is made for and looked up by, and the compile that makes it.
//! Trusting it is the operator's signature ([`crate::oci::native`]): wasmtime's
//! `Component::deserialize` is sound only for bytes the embedder trusts, so code from anywhere
//! else is never loaded. Loading it is [`super::Runtime::compile_signed`].

use std::hash::Hasher;

use sha2::{Digest, Sha256};

use super::compile_worker::{self, CompileBudget, CompileError, Job, Slot};

/// Feeds what `Hash` writes into sha256: wasmtime's compatibility hash is a `Hash` impl (the
/// engine's version, target, compiler and CPU flags, tunables and features), and `DefaultHasher`
/// is not promised to be the same in another build, while this must be the same on a
/// `devplug precompile` machine and on every node.
struct Sha256Hasher(Sha256);

impl Hasher for Sha256Hasher {
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    fn finish(&self) -> u64 {
        0
    }
}

/// The fingerprint of the engine native code for this build's target is compiled for: sha256
/// (hex) of wasmtime's compatibility hash of the portable engine
/// ([`super::engine_config::portable_engine_config`]: devplug's engine settings at the target's
/// portable CPU baseline). Two builds agree on it exactly when one's code loads into the other's
/// engine on any CPU of the target.
pub fn fingerprint() -> anyhow::Result<String> {
    let config = super::engine_config::portable_engine_config(env!("DEVPLUG_BUILD_TARGET"))?;
    let engine = wasmtime::Engine::new(&config)?;
    let mut h = Sha256Hasher(Sha256::new());
    b"devplug-native-v1\0".iter().for_each(|b| h.write_u8(*b));
    std::hash::Hash::hash(&engine.precompile_compatibility_hash(), &mut h);
    Ok(hex::encode(h.0.finalize()))
}

/// The target native code is compiled for (this build's own).
pub fn target() -> &'static str {
    env!("DEVPLUG_BUILD_TARGET")
}

/// Compile `component` into portable native code for this build's target, in a compile worker
/// under `budget` (the component is an outsider's), or in this process where there is no worker
/// (a test binary). Blocking.
pub fn precompile(
    worker: Option<&std::path::Path>,
    component: &[u8],
    budget: &CompileBudget,
) -> Result<Vec<u8>, CompileError> {
    super::engine::check_header(component).map_err(|e| CompileError::Invalid(e.to_string()))?;
    let Some(exe) = worker else {
        let config = super::engine_config::portable_engine_config(target())
            .map_err(|e| CompileError::Worker(format!("{e:#}")))?;
        let engine = wasmtime::Engine::new(&config).map_err(|e| CompileError::Worker(format!("{e:#}")))?;
        return engine.precompile_component(component).map_err(|e| CompileError::Invalid(format!("{e:#}")));
    };
    let job = Job { tier: super::Tier::Optimized, serial: false, idle: false, portable: true };
    compile_worker::compile(exe, &Slot::default(), job, component, budget).map(|n| n.code)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same engine settings give the same fingerprint; another setting (code that would not
    /// load) another one.
    #[test]
    fn the_fingerprint_follows_the_engine_settings() {
        let a = fingerprint().unwrap();
        assert_eq!(a, fingerprint().unwrap());
        assert_eq!(a.len(), 64);
        let mut other = super::super::engine_config::portable_engine_config(target()).unwrap();
        other.epoch_interruption(false);
        let engine = wasmtime::Engine::new(&other).unwrap();
        let mut h = Sha256Hasher(Sha256::new());
        b"devplug-native-v1\0".iter().for_each(|b| h.write_u8(*b));
        std::hash::Hash::hash(&engine.precompile_compatibility_hash(), &mut h);
        assert_ne!(a, hex::encode(h.0.finalize()));
    }
}
