//! Small machines built in a temp dir at test time: device-node descriptors (`c MAJOR:MINOR`,
//! since git cannot hold real nodes) and sysfs with the kernel's symlink layout.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

pub struct Machine {
    pub dir: tempfile::TempDir,
}

impl Machine {
    pub fn new() -> Self {
        let m = Machine { dir: tempfile::tempdir().expect("tempdir") };
        std::fs::create_dir_all(m.sys()).expect("sys");
        std::fs::create_dir_all(m.dev()).expect("dev");
        m
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    pub fn sys(&self) -> PathBuf {
        self.dir.path().join("sys")
    }

    pub fn dev(&self) -> PathBuf {
        self.dir.path().join("dev")
    }

    /// A device node descriptor under dev/.
    pub fn node(&self, rel: &str, kind: char, major: u32, minor: u32) -> &Self {
        self.file(&format!("dev/{rel}"), &format!("{kind} {major}:{minor}\n"))
    }

    pub fn file(&self, rel: &str, content: &str) -> &Self {
        let p = self.dir.path().join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, content).expect("write");
        self
    }

    pub fn link(&self, rel: &str, target: &str) -> &Self {
        let p = self.dir.path().join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        let _ = std::fs::remove_file(&p);
        symlink(target, p).expect("symlink");
        self
    }

    /// The usual generic-backend nodes.
    pub fn generic_box() -> Self {
        let m = Machine::new();
        m.node("kvm", 'c', 10, 232).node("fuse", 'c', 10, 229).node("net/tun", 'c', 10, 200).node("null", 'c', 1, 3);
        m
    }

    /// A PCI function as the kernel lays it out: the real directory under devices/ and the
    /// bus/pci/devices symlink to it.
    pub fn pci(&self, bridge: &str, addr: &str, attrs: &[(&str, &str)]) -> &Self {
        let dir = format!("sys/devices/pci0000:00/{bridge}/{addr}");
        for (k, v) in attrs {
            self.file(&format!("{dir}/{k}"), &format!("{v}\n"));
        }
        self.link(&format!("sys/bus/pci/devices/{addr}"), &format!("../../../devices/pci0000:00/{bridge}/{addr}"))
    }
}

impl Default for Machine {
    fn default() -> Self {
        Self::new()
    }
}
