//! {{name}}: a devplug backend. It serves `{{resource}}`: one device per node under /dev that
//! matches the globs in its config (`paths = ["..."]`), healthy while the node is there; for DRA
//! it describes each device with typed attributes (its node's major and minor numbers).
//!
//! Build: `cargo build --release --target wasm32-wasip2`
//! Test:  `cargo test` (natively, against `tests/fixture/`)
//! Try:   `devplug discover --backend target/wasm32-wasip2/release/{{crate}}.wasm --manifest devplug.toml \
//!         --sysfs-root tests/fixture/sys --dev-root tests/fixture/dev --dev-fixtures`

use devplug_sdk::{
    Backend, BackendError, Device, Health, Info, NodeKind, Resource, ResourceInfo, Sys, dra, edits, invalid_config,
};

const RESOURCE: &str = "{{resource}}";

pub struct Plugin {
    paths: Vec<String>,
}

impl Backend for Plugin {
    fn init(config: &str, _sys: &dyn Sys) -> Result<(Self, Info), BackendError> {
        let mut paths = vec!["{{name}}*".to_owned()];
        for line in config.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
            let Some(list) = line.strip_prefix("paths").map(str::trim).and_then(|l| l.strip_prefix('=')) else {
                return Err(invalid_config(format!("unknown setting: {line}")));
            };
            paths = list
                .trim()
                .trim_matches(|c| c == '[' || c == ']')
                .split(',')
                .map(|p| p.trim().trim_matches('"').to_owned())
                .filter(|p| !p.is_empty())
                .collect();
        }
        let info = Info::new("{{name}}", env!("CARGO_PKG_VERSION"), [ResourceInfo::plain(RESOURCE)]);
        Ok((Plugin { paths }, info))
    }

    fn discover(&self, sys: &dyn Sys) -> Result<Vec<Resource>, BackendError> {
        let mut devices = Vec::new();
        for pattern in &self.paths {
            for node in sys.dev_glob(pattern).unwrap_or_default() {
                if node.kind == NodeKind::Character {
                    devices.push(Device {
                        id: node.path.replace('/', "_"),
                        health: Health::Healthy,
                        numa_nodes: Vec::new(),
                        attributes: vec![("node".into(), format!("{}:{}", node.major, node.minor))],
                        edits: edits::nodes([node.path.as_str()]),
                    });
                }
            }
        }
        Ok(vec![Resource { name: RESOURCE.into(), devices, common_edits: edits::empty() }])
    }

    /// For DRA (WIT 0.3.0): typed facts beyond discover's strings, here each node's numbers.
    /// Capacities and shared counter sets go here too (see the SDK's `dra` module).
    fn describe(&self, sys: &dyn Sys) -> Result<dra::PoolDescription, BackendError> {
        let mut devices = Vec::new();
        for r in self.discover(sys)? {
            for d in &r.devices {
                let Some(node) = d.edits.device_nodes.first() else { continue };
                let Ok(n) = sys.dev_stat(node.container_path.trim_start_matches("/dev/")) else { continue };
                let attributes = vec![
                    ("major".into(), dra::AttributeValue::Integer(n.major.into())),
                    ("minor".into(), dra::AttributeValue::Integer(n.minor.into())),
                ];
                devices.push(dra::DeviceDescription { attributes, ..dra::describe(&r.name, &d.id) });
            }
        }
        Ok(dra::PoolDescription { counter_sets: Vec::new(), devices })
    }
}

devplug_sdk::backend!(Plugin);

#[cfg(test)]
mod tests {
    use super::*;
    use devplug_sdk::FixtureSys;

    #[test]
    fn finds_the_fixture_nodes() {
        let sys = FixtureSys::machine(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixture"));
        let (b, info) = Plugin::init("", &sys).unwrap();
        assert_eq!(info.resources[0].name, RESOURCE);
        let res = b.discover(&sys).unwrap();
        let ids: Vec<&str> = res[0].devices.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, ["{{name}}0", "{{name}}1"]);
        assert!(matches!(Plugin::init("colour = blue", &sys), Err(BackendError::InvalidConfig(_))));
        let pool = b.describe(&sys).unwrap();
        assert_eq!(pool.devices[0].attributes[0], ("major".to_owned(), dra::AttributeValue::Integer(240)));
    }
}
