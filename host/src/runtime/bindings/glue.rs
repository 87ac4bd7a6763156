//! What every version module has in common, written once: forwarding its generated import traits
//! to [`super::host_calls`] and its exports to [`super::answers`]. A version module is its
//! `bindgen!` call plus these macros, plus whatever that version added.

/// The `devfs` and `log` imports, the `sysfs` calls of 0.1.0 (plus any `$extra` methods a version
/// added to `sysfs`), and the calls into the guest's `backend` export.
macro_rules! version_glue {
    (sysfs: { $($extra:item)* }) => {
        use $crate::runtime::bindings::GuestResult;
        use $crate::runtime::bindings::answers;
        use $crate::runtime::bindings::host_calls::{Answer, View};
        use $crate::runtime::jail::{NodeStat, NodeType};
        use $crate::runtime::state::HostState;

        /// Link this version's imports.
        pub(crate) fn add_to_linker(linker: &mut wasmtime::component::Linker<HostState>) -> wasmtime::Result<()> {
            DevplugBackend::add_to_linker::<HostState, wasmtime::component::HasSelf<HostState>>(linker, |s| s)
        }

        impl self::devplug::backend::sysfs::Host for HostState {
            async fn read(&mut self, path: String) -> Answer<String> {
                HostState::read(self, View::Sysfs, "sysfs.read", &path)
            }
            async fn list_dir(&mut self, path: String) -> Answer<Vec<String>> {
                HostState::list_dir(self, View::Sysfs, "sysfs.list-dir", &path)
            }
            async fn read_link(&mut self, path: String) -> Answer<String> {
                HostState::read_link(self, &path)
            }
            async fn canonical(&mut self, path: String) -> Answer<String> {
                HostState::canonical(self, &path)
            }
            $($extra)*
        }

        fn node(path: String, st: NodeStat) -> self::devplug::backend::devfs::Node {
            use self::devplug::backend::devfs::{Node, NodeKind};
            let kind = match st.kind {
                NodeType::Char => NodeKind::Character,
                NodeType::Block => NodeKind::Block,
                NodeType::Directory => NodeKind::Directory,
                NodeType::Other => NodeKind::Other,
            };
            Node { path, kind, major: st.major, minor: st.minor }
        }

        impl self::devplug::backend::devfs::Host for HostState {
            async fn stat(&mut self, path: String) -> Answer<self::devplug::backend::devfs::Node> {
                Ok(self.dev_stat(&path)?.map(|st| node(path, st)))
            }
            async fn glob(&mut self, pattern: String) -> Answer<Vec<self::devplug::backend::devfs::Node>> {
                Ok(self.dev_glob(&pattern)?.map(|v| v.into_iter().map(|(p, st)| node(p, st)).collect()))
            }
        }

        impl self::devplug::backend::log::Host for HostState {
            async fn log(&mut self, level: self::devplug::backend::log::Level, message: String) -> wasmtime::Result<()> {
                use self::devplug::backend::log::Level;
                let level = match level {
                    Level::Trace => tracing::Level::TRACE,
                    Level::Debug => tracing::Level::DEBUG,
                    Level::Info => tracing::Level::INFO,
                    Level::Warn => tracing::Level::WARN,
                    Level::Error => tracing::Level::ERROR,
                };
                self.guest_log(level, &message);
                Ok(())
            }
        }

        pub async fn init(
            b: &DevplugBackend,
            store: &mut wasmtime::Store<HostState>,
            config: &str,
        ) -> wasmtime::Result<GuestResult<$crate::model::BackendInfo>> {
            let r = b.devplug_backend_backend().call_init(store, config).await?;
            Ok(r.map_err(answers::backend_error).map(answers::info))
        }

        pub async fn discover(
            b: &DevplugBackend,
            store: &mut wasmtime::Store<HostState>,
        ) -> wasmtime::Result<GuestResult<Vec<$crate::model::Resource>>> {
            let r = b.devplug_backend_backend().call_discover(store).await?;
            Ok(r.map_err(answers::backend_error).map(|rs| rs.into_iter().map(answers::resource).collect()))
        }

        pub async fn preferred_allocation(
            b: &DevplugBackend,
            store: &mut wasmtime::Store<HostState>,
            res: &str,
            available: &[String],
            must_include: &[String],
            size: u32,
        ) -> wasmtime::Result<GuestResult<Vec<String>>> {
            let g = b.devplug_backend_backend();
            Ok(g.call_preferred_allocation(store, res, available, must_include, size).await?.map_err(answers::backend_error))
        }

        pub async fn allocate(
            b: &DevplugBackend,
            store: &mut wasmtime::Store<HostState>,
            res: &str,
            ids: &[String],
        ) -> wasmtime::Result<GuestResult<$crate::model::ContainerEdits>> {
            let r = b.devplug_backend_backend().call_allocate(store, res, ids).await?;
            Ok(r.map_err(answers::backend_error).map(answers::edits))
        }

        pub async fn pre_start(
            b: &DevplugBackend,
            store: &mut wasmtime::Store<HostState>,
            res: &str,
            ids: &[String],
        ) -> wasmtime::Result<GuestResult<()>> {
            Ok(b.devplug_backend_backend().call_pre_start(store, res, ids).await?.map_err(answers::backend_error))
        }
    };
}

pub(super) use version_glue;

/// [`version_glue`] for 0.2.0 and every later version: the batched `sysfs` reads and the
/// `procfs` view that 0.2.0 added.
macro_rules! since_0_2_0_glue {
    () => {
        super::glue::version_glue!(sysfs: {
            async fn read_many(&mut self, paths: Vec<String>) -> wasmtime::Result<Vec<Result<String, super::wit::FsError>>> {
                self.many("sysfs.read-many", &paths, $crate::runtime::jail::Jail::read_many)
            }
            async fn read_link_many(
                &mut self,
                paths: Vec<String>,
            ) -> wasmtime::Result<Vec<Result<String, super::wit::FsError>>> {
                self.many("sysfs.read-link-many", &paths, $crate::runtime::jail::Jail::read_link_many)
            }
            async fn list_dir_many(
                &mut self,
                paths: Vec<String>,
            ) -> wasmtime::Result<Vec<Result<Vec<String>, super::wit::FsError>>> {
                self.many("sysfs.list-dir-many", &paths, $crate::runtime::jail::Jail::list_many)
            }
        });

        impl self::devplug::backend::procfs::Host for HostState {
            async fn read(&mut self, path: String) -> Answer<String> {
                HostState::read(self, View::Procfs, "procfs.read", &path)
            }
            async fn list_dir(&mut self, path: String) -> Answer<Vec<String>> {
                HostState::list_dir(self, View::Procfs, "procfs.list-dir", &path)
            }
        }
    };
}

pub(super) use since_0_2_0_glue;
