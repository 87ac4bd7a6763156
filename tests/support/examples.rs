//! The example backends in other languages (`guests/examples`), built once by their own
//! `build.sh` and kept in the target dir while their sources are unchanged.

use std::path::PathBuf;
use std::process::Command;

use sha2::{Digest, Sha256};

fn repo() -> PathBuf {
    super::paths::repo()
}

/// The examples built by `guests/examples/build.sh`, reused while their sources are unchanged
/// (the builds are not bit-reproducible, and each new digest costs a compile).
pub fn built() -> PathBuf {
    let ex = repo().join("guests/examples");
    let mut h = Sha256::new();
    for f in [
        "build.sh",
        "python-serial/app.py",
        "python-serial/devplug.toml",
        "js-fusetun/backend.js",
        "js-fusetun/devplug.toml",
        "js-fusetun/package-lock.json",
    ] {
        h.update(std::fs::read(ex.join(f)).unwrap());
    }
    h.update(std::fs::read(repo().join("tests/requirements.txt")).unwrap());
    for e in std::fs::read_dir(repo().join("wit/since_v0.1.0")).unwrap().flatten() {
        h.update(std::fs::read(e.path()).unwrap());
    }
    let out = super::paths::target_tmpdir().join(format!("examples-{}", hex::encode(&h.finalize()[..8])));
    if out.join("py-serial.wasm").exists() && out.join("js-fusetun.wasm").exists() {
        return out;
    }
    let tools = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/devplug-tools/bin")).unwrap();
    let path = format!("{}:{}", tools.display(), std::env::var("PATH").unwrap_or_default());
    let st = Command::new(ex.join("build.sh")).arg(&out).env("PATH", path).output().unwrap();
    assert!(
        st.status.success(),
        "building the Python and JS examples failed (./scripts/test installs componentize-py and node):\n{}{}",
        String::from_utf8_lossy(&st.stdout),
        String::from_utf8_lossy(&st.stderr)
    );
    out
}
