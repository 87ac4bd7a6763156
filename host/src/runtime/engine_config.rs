//! The wasmtime configuration of every devplug engine. Shared, through `#[path]`, with the build
//! script that precompiles the embedded backends: a precompiled artifact loads only into an
//! engine configured the same way, so both must come from this one function.

/// The engine configuration: the component model, epoch interruption for deadlines, and
/// optimised code.
pub(crate) fn engine_config() -> wasmtime::Config {
    let mut c = wasmtime::Config::new();
    c.wasm_component_model(true);
    c.epoch_interruption(true);
    c.cranelift_opt_level(wasmtime::OptLevel::Speed);
    c
}

/// The baseline engine's configuration: [`engine_config`] compiled by Winch, wasmtime's
/// single-pass compiler (tier 1 on x86_64): a Python backend's 18 MB compile in about 2 s on
/// two cores instead of 11, into code that runs slower. `None` where Winch does not compile
/// (not x86_64): every component is then compiled optimised.
#[allow(dead_code)] // build.rs, which includes this file, precompiles optimised code only
pub(crate) fn baseline_engine_config() -> Option<wasmtime::Config> {
    if !cfg!(target_arch = "x86_64") {
        return None;
    }
    let mut c = engine_config();
    c.strategy(wasmtime::Strategy::Winch);
    Some(c)
}

/// CPU features the embedded backends are precompiled for on x86_64: x86-64-v2 (every x86 server
/// CPU since about 2009), so a binary built on one machine runs its precompiled code on any other.
/// A CPU without them makes the artifact fail the engine's compatibility check, and the host
/// compiles instead.
pub(crate) const X86_64_BASELINE: &[&str] = &["has_sse3", "has_ssse3", "has_sse41", "has_sse42", "has_popcnt"];

/// [`engine_config`] for precompiling for `triple` at the portable baseline, not the build
/// machine's own CPU.
#[allow(dead_code)] // used by build.rs, which includes this file
pub(crate) fn portable_engine_config(triple: &str) -> wasmtime::Result<wasmtime::Config> {
    let mut c = engine_config();
    c.target(triple)?;
    if triple.starts_with("x86_64") {
        for flag in X86_64_BASELINE {
            // SAFETY: these flags only say which instructions the generated code may use; the
            // engine that loads the artifact checks the CPU has them before running any of it.
            unsafe {
                c.cranelift_flag_enable(flag);
            }
        }
    }
    Ok(c)
}
