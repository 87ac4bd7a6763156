//! A private podman for end-to-end tests: its own containers.conf (runc, cgroupfs, small
//! ulimits: this machine's podman 4.3.1 fails with crun on the hybrid cgroup layout and with its
//! default 1048576 ulimits without CAP_SYS_RESOURCE) and its own vfs storage, plus a tiny image
//! imported from busybox-static, so nothing comes from a registry.
//!
//! Podman reads CDI specs only from `/etc/cdi` and `/var/run/cdi`, so tests that use it write
//! there, under kinds no one else uses, and remove what they wrote.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

pub const IMAGE: &str = "localhost/devplug-e2e:latest";

pub struct Podman {
    dir: tempfile::TempDir,
}

/// Where a program is on PATH.
fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

impl Podman {
    /// Set up podman or panic saying exactly what is missing: a test that needs a container
    /// engine must never pass without one.
    // No `Default`: making one checks the tools and creates a private store.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Podman {
        for (bin, pkg) in [("podman", "podman"), ("runc", "runc"), ("busybox", "busybox-static")] {
            assert!(
                which(bin).is_some(),
                "PODMAN E2E CANNOT RUN: `{bin}` is not installed. ./scripts/test installs it (Debian package {pkg})."
            );
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        std::fs::write(
            root.join("containers.conf"),
            "[containers]\ndefault_ulimits = [\"nofile=1024:1024\", \"nproc=1024:1024\"]\n\
             [engine]\nruntime = \"runc\"\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\n",
        )
        .expect("containers.conf");
        std::fs::write(
            root.join("storage.conf"),
            format!(
                "[storage]\ndriver = \"vfs\"\nrunroot = \"{}\"\ngraphroot = \"{}\"\n",
                root.join("run").display(),
                root.join("graph").display()
            ),
        )
        .expect("storage.conf");
        let p = Podman { dir };
        p.import_busybox();
        p
    }

    fn command(&self) -> Command {
        self.tool("podman")
    }

    /// `podman` or `buildah`, on this private configuration and storage.
    pub fn tool(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        c.env("CONTAINERS_CONF", self.dir.path().join("containers.conf"))
            .env("CONTAINERS_STORAGE_CONF", self.dir.path().join("storage.conf"))
            .stdin(Stdio::null());
        c
    }

    /// A one-binary rootfs (busybox-static and its applet links), imported as IMAGE.
    fn import_busybox(&self) {
        let rootfs = self.dir.path().join("rootfs");
        let bin = rootfs.join("bin");
        std::fs::create_dir_all(&bin).expect("rootfs");
        std::fs::copy(which("busybox").expect("busybox"), bin.join("busybox")).expect("copy busybox");
        for applet in ["sh", "cat", "cp", "stat", "echo", "ls", "test", "sleep"] {
            std::os::unix::fs::symlink("busybox", bin.join(applet)).expect("applet link");
        }
        let tar = self.dir.path().join("rootfs.tar");
        let st = Command::new("tar").arg("-C").arg(&rootfs).arg("-cf").arg(&tar).arg(".").status().expect("tar");
        assert!(st.success(), "tar of the rootfs failed");
        let out = self.command().arg("import").arg(&tar).arg(IMAGE).output().expect("podman import");
        assert!(out.status.success(), "PODMAN E2E CANNOT RUN: podman import failed:\n{}", text(&out));
    }

    /// `podman run --rm --network none [--device D]... IMAGE sh -c SCRIPT`.
    pub fn run(&self, devices: &[String], script: &str) -> Output {
        let mut c = self.command();
        c.args(["run", "--rm", "--network", "none"]);
        for d in devices {
            c.arg("--device").arg(d);
        }
        c.args([IMAGE, "/bin/sh", "-c", script]);
        c.output().expect("podman run")
    }

    /// Run a `podman`/`buildah` command to success, or panic with its output; returns stdout.
    pub fn ok(&self, program: &str, args: &[&str]) -> String {
        let out = self.tool(program).args(args).output().unwrap_or_else(|e| panic!("{program}: {e}"));
        assert!(out.status.success(), "{program} {}:\n{}", args.join(" "), text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }
}

/// stdout and stderr of a finished command, for messages.
pub fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The one directory podman 4.3 reads CDI specs from that tests may write to.
pub const SYSTEM_CDI_DIR: &str = "/var/run/cdi";

/// Exclusive use of the machine's `/var/run/cdi` for one test, leaving it as it was found.
///
/// Holds a lock across test processes (so two podman tests never share the directory), remembers
/// every `devplug-*.json` that was there before (a devplug under test sweeps stale specs of its
/// own naming on start, and a stale file of someone else's must survive the test), and on drop,
/// which also runs when the test panics, removes what the test wrote and puts back what was there.
pub struct SystemCdi {
    _lock: nix::fcntl::Flock<std::fs::File>,
    created_dir: bool,
    before: Vec<(PathBuf, Vec<u8>)>,
}

impl SystemCdi {
    pub fn take() -> SystemCdi {
        let lock_path = super::paths::target_tmpdir().join("system-cdi.lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .unwrap_or_else(|e| panic!("{}: {e}", lock_path.display()));
        let lock = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
            .unwrap_or_else(|(_, e)| panic!("locking {}: {e}", lock_path.display()));
        let dir = Path::new(SYSTEM_CDI_DIR);
        let created_dir = !dir.exists();
        std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{SYSTEM_CDI_DIR}: {e}"));
        let before = Self::ours(dir).into_iter().filter_map(|p| std::fs::read(&p).ok().map(|b| (p, b))).collect();
        SystemCdi { _lock: lock, created_dir, before }
    }

    /// Files in `dir` named the way devplug names its specs.
    fn ours(dir: &Path) -> Vec<PathBuf> {
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("devplug-"))
            .map(|e| e.path())
            .collect()
    }

    pub fn dir(&self) -> &Path {
        Path::new(SYSTEM_CDI_DIR)
    }
}

impl Drop for SystemCdi {
    fn drop(&mut self) {
        let dir = Path::new(SYSTEM_CDI_DIR);
        for p in Self::ours(dir) {
            if !self.before.iter().any(|(b, _)| *b == p) {
                let _ = std::fs::remove_file(&p);
            }
        }
        for (p, bytes) in &self.before {
            if std::fs::read(p).ok().as_deref() != Some(bytes.as_slice()) {
                let _ = std::fs::write(p, bytes);
            }
        }
        if self.created_dir {
            let _ = std::fs::remove_dir(dir);
        }
    }
}
