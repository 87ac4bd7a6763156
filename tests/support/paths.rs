//! Where things are for a test: the `devplug` binary, the workspace, the target's scratch
//! directory. Cargo hands a package's own integration tests and benches these as
//! `CARGO_BIN_EXE_devplug` and `CARGO_TARGET_TMPDIR` (the first also at run time, which is what
//! this crate reads); a bench binary run by hand finds the binary beside its own `deps/`.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::LazyLock;

static DEVPLUG: LazyLock<PathBuf> = LazyLock::new(|| {
    if let Some(bin) = std::env::var_os("CARGO_BIN_EXE_devplug") {
        return PathBuf::from(bin);
    }
    // target/<profile>/deps/<test>-<hash> → target/<profile>/devplug
    let exe = std::env::current_exe().expect("the test's own path");
    let profile = exe.parent().and_then(Path::parent).expect("a test binary under target/<profile>/deps");
    profile.join("devplug")
});

/// The `devplug` binary under test (`Command::new(BIN)`, `.arg(BIN)`, `PathBuf::from(BIN)`).
#[derive(Clone, Copy, Debug)]
pub struct Bin;

impl Bin {
    pub fn path(self) -> &'static Path {
        &DEVPLUG
    }
}

impl AsRef<OsStr> for Bin {
    fn as_ref(&self) -> &OsStr {
        DEVPLUG.as_os_str()
    }
}

impl AsRef<Path> for Bin {
    fn as_ref(&self) -> &Path {
        &DEVPLUG
    }
}

impl From<Bin> for PathBuf {
    fn from(_: Bin) -> PathBuf {
        DEVPLUG.clone()
    }
}

/// The repository's root.
pub fn repo() -> PathBuf {
    // This crate is tests/support/.
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("the workspace")
}

/// The target directory's scratch space (Cargo's `CARGO_TARGET_TMPDIR`: `target/tmp`), made if
/// missing: what outlives one test on purpose (caches, kept logs, the machine-wide CDI lock).
pub fn target_tmpdir() -> PathBuf {
    let target = DEVPLUG.parent().and_then(Path::parent).expect("the binary under target/<profile>");
    let tmp = target.join("tmp");
    std::fs::create_dir_all(&tmp).expect("the target's tmp directory");
    tmp
}
