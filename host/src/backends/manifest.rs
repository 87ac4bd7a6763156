//! A backend's manifest: `NAME.toml` beside `NAME.wasm`, saying what the backend requests (see
//! [`crate::runtime::caps::Globs`]) and the config `init` gets when the operator gives none.

use serde::{Deserialize, Serialize};

use crate::runtime::caps::{Capabilities, Globs};

/// `NAME.toml` beside `NAME.wasm`: what the backend needs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// The backend's name. Optional: a backend is named by its file (`NAME.wasm`), and a name here
    /// must agree with it.
    pub name: Option<String>,
    #[serde(default)]
    pub requests: Globs,
    /// The config `init` gets when the operator gives none (vendors ship their defaults here).
    pub config: Option<String>,
}

impl Manifest {
    pub fn parse(text: &str) -> Result<Self, String> {
        let m: Manifest = toml::from_str(text).map_err(|e| e.to_string())?;
        Capabilities::new(&m.requests, &m.requests)?;
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifests_parse_and_reject_escaping_globs() {
        let m = Manifest::parse("name = \"gpu\"\n[requests]\nsysfs = [\"bus/pci/devices/*\"]\ndev = [\"nvidia*\"]\n")
            .unwrap();
        assert_eq!(m.requests.dev, ["nvidia*"]);
        assert!(Manifest::parse("[requests]\nsysfs = [\"../x\"]\n").unwrap_err().contains(".."));
        assert!(Manifest::parse("[requests]\nsysfs = [\"/x\"]\n").is_err());
        assert!(Manifest::parse("[requests]\nnetwork = true\n").is_err());
    }
}
