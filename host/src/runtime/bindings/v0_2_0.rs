//! `devplug:backend@0.2.0` (`wit/since_v0.2.0`): 0.1.0 plus batched `sysfs` reads
//! (`read-many`, `read-link-many`, `list-dir-many`) and a read-only `procfs` view. `types` is
//! unchanged, so it is 0.1.0's Rust types ([`super::wit`]) and the answers convert the same way.

use super::host_calls::View as ProcView;
use crate::runtime::jail::Jail;

/// This module's WIT package version.
pub const VERSION: &str = "0.2.0";

wasmtime::component::bindgen!({
    path: "../wit/since_v0.2.0",
    world: "devplug-backend",
    imports: { default: async | trappable },
    exports: { default: async },
    with: { "devplug:backend/types": super::wit_interface },
});

super::glue::version_glue!(sysfs: {
    async fn read_many(&mut self, paths: Vec<String>) -> wasmtime::Result<Vec<Result<String, super::wit::FsError>>> {
        self.many("sysfs.read-many", &paths, Jail::read_many)
    }
    async fn read_link_many(
        &mut self,
        paths: Vec<String>,
    ) -> wasmtime::Result<Vec<Result<String, super::wit::FsError>>> {
        self.many("sysfs.read-link-many", &paths, Jail::read_link_many)
    }
    async fn list_dir_many(
        &mut self,
        paths: Vec<String>,
    ) -> wasmtime::Result<Vec<Result<Vec<String>, super::wit::FsError>>> {
        self.many("sysfs.list-dir-many", &paths, Jail::list_many)
    }
});

impl self::devplug::backend::procfs::Host for HostState {
    async fn read(&mut self, path: String) -> Answer<String> {
        HostState::read(self, ProcView::Procfs, "procfs.read", &path)
    }
    async fn list_dir(&mut self, path: String) -> Answer<Vec<String>> {
        HostState::list_dir(self, ProcView::Procfs, "procfs.list-dir", &path)
    }
}
