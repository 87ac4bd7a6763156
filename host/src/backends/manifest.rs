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
    /// The manifest has no `[requests] resources` key: written before devplug 0.2.0 made
    /// resource names a capability (see [`Manifest::MISSING_RESOURCES`]).
    #[serde(skip)]
    pub resources_unstated: bool,
}

impl Manifest {
    /// What to tell the vendor and operator of a manifest without `[requests] resources`.
    pub(crate) const MISSING_RESOURCES: &str = "the manifest has no `resources` under [requests] (manifests written before devplug 0.2.0): \
         since 0.2.0 a backend serves only the resource names its manifest requests and the operator grants. \
         Add the line `resources = [\"<your-domain>/*\"]` under [requests] of the manifest (the domain of the names \
         its init declares, e.g. \"example.com/*\"); until then it serves only the names the operator grants \
         explicitly in [backends.NAME.grant] resources";

    /// The requests no grant can hold as written, each with what to write instead: an operator's
    /// grant of them is refused when the config loads, and `default_grant = "requested"` drops
    /// them, so the backend would learn it only at its first Allocate. (`*` stays: it asks for
    /// whatever keys the operator grants.)
    pub(crate) fn never_granted(&self) -> Vec<String> {
        use crate::gate::EnvGrant;
        self.requests
            .env
            .iter()
            .filter(|p| p.as_str() != "*")
            .filter_map(|p| match EnvGrant::request(p) {
                None => Some(format!(
                    "[requests] env {:?} matches no key (a request names KEY, VENDOR_*, STEM# or *): it is never granted",
                    crate::gate::clip(p)
                )),
                Some(_) => EnvGrant::new(p).err().map(|e| format!("[requests] env: no grant can hold it as written: {e}")),
            })
            .collect()
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        let mut m: Manifest = toml::from_str(text).map_err(|e| crate::gate::toml_error(text, &e))?;
        Capabilities::new(&m.requests, &m.requests)?;
        let raw: toml::Table = text.parse().map_err(|e: toml::de::Error| crate::gate::toml_error(text, &e))?;
        m.resources_unstated = raw.get("requests").and_then(|r| r.get("resources")).is_none();
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

    /// Issue 52 (5): `env = ["QAT*"]` passed every pre-flight check and was refused at the first
    /// Allocate. Requests no grant can hold are named, with what to write.
    #[test]
    fn requests_no_grant_can_hold_are_named_with_what_to_write() {
        let m =
            Manifest::parse("[requests]\nenv = [\"QAT*\", \"QAT[0-9]\", \"QAT#\", \"ACME_*\", \"MY_KEY\", \"*\"]\n")
                .unwrap();
        let w = m.never_granted();
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(w[0].contains("\"QAT*\"") && w[0].contains("QAT#"), "{}", w[0]);
        assert!(w[1].contains("\"QAT[0-9]\"") && w[1].contains("matches no key"), "{}", w[1]);
    }

    #[test]
    fn a_manifest_without_resources_is_told_apart_from_one_that_requests_none() {
        assert!(Manifest::parse("[requests]\ndev = [\"kvm\"]\n").unwrap().resources_unstated);
        assert!(Manifest::parse("name = \"x\"\n").unwrap().resources_unstated);
        assert!(!Manifest::parse("[requests]\nresources = []\n").unwrap().resources_unstated);
        assert!(!Manifest::parse("[requests]\nresources = [\"a.io/*\"]\n").unwrap().resources_unstated);
    }
}
