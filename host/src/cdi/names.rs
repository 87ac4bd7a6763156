//! CDI names: a resource's `vendor/class` kind and its devices' names, by the rules of the CDI
//! parser (`pkg/parser` in cncf-tags/container-device-interface), and the spec file's name.

use sha2::{Digest, Sha256};

/// A resource's CDI kind: `nvidia.com/gpu` → vendor `nvidia.com`, class `gpu`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kind {
    pub vendor: String,
    pub class: String,
}

impl Kind {
    /// The kind for an extended resource name, or why CDI would refuse it.
    pub fn for_resource(resource: &str) -> Result<Kind, String> {
        let (vendor, class) =
            resource.split_once('/').ok_or_else(|| format!("{resource:?} has no vendor part for a CDI kind"))?;
        for (what, part) in [("vendor", vendor), ("class", class)] {
            if let Some(why) = vendor_or_class_problem(part) {
                return Err(format!("{resource:?}: CDI {what} {part:?} {why}"));
            }
        }
        Ok(Kind { vendor: vendor.to_owned(), class: class.to_owned() })
    }

    /// `vendor/class`, the spec's `kind`.
    pub fn kind(&self) -> String {
        format!("{}/{}", self.vendor, self.class)
    }

    /// `vendor/class=name`, what a runtime is asked for.
    pub fn qualified(&self, device_id: &str) -> String {
        format!("{}/{}={}", self.vendor, self.class, device_name(device_id))
    }

    /// The spec file devplug owns for this kind: `devplug-nvidia.com_gpu.json`.
    pub fn file_name(&self) -> String {
        format!("{OWNED_PREFIX}{}_{}.json", self.vendor, self.class)
    }
}

/// Every spec file devplug writes starts with this; files without it are never touched.
pub const OWNED_PREFIX: &str = "devplug-";

fn vendor_or_class_problem(name: &str) -> Option<&'static str> {
    let b = name.as_bytes();
    match (b.first(), b.last()) {
        (None, _) | (_, None) => Some("is empty"),
        (Some(f), _) if !f.is_ascii_alphabetic() => Some("must start with a letter"),
        (_, Some(l)) if !l.is_ascii_alphanumeric() => Some("must end with a letter or digit"),
        _ if !b.iter().all(|c| c.is_ascii_alphanumeric() || b"_-.".contains(c)) => {
            Some("may hold only letters, digits, '_', '-' and '.'")
        }
        _ => None,
    }
}

/// A device's CDI name: the device ID itself when CDI accepts it (IDs already use only
/// `[A-Za-z0-9._:-]`), otherwise the ID trimmed to alphanumeric ends plus a short hash of the
/// whole ID, so two IDs never share a name and the name never changes between runs.
pub fn device_name(id: &str) -> String {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || "_-.:".contains(c);
    let alnum_ends = id.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && id.chars().last().is_some_and(|c| c.is_ascii_alphanumeric());
    if alnum_ends && id.chars().all(ok_char) {
        return id.to_owned();
    }
    let cleaned: String = id.chars().map(|c| if ok_char(c) { c } else { '-' }).collect();
    let core = cleaned.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    let hash = hex::encode(&Sha256::digest(id.as_bytes())[..4]);
    if core.is_empty() { format!("d{hash}") } else { format!("{core}-{hash}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_follow_the_cdi_parser() {
        let k = Kind::for_resource("nvidia.com/gpu").unwrap();
        assert_eq!((k.kind(), k.file_name()), ("nvidia.com/gpu".into(), "devplug-nvidia.com_gpu.json".into()));
        assert_eq!(k.qualified("0000:17:00.0"), "nvidia.com/gpu=0000:17:00.0");
        assert!(Kind::for_resource("example.com/9lives").unwrap_err().contains("start with a letter"));
        assert!(Kind::for_resource("gpu").unwrap_err().contains("no vendor"));
        assert!(Kind::for_resource("example.com/a_").unwrap_err().contains("end with"));
    }

    #[test]
    fn device_names_are_the_id_when_valid_and_stable_and_distinct_otherwise() {
        assert_eq!(device_name("0000:17:00.0"), "0000:17:00.0");
        assert_eq!(device_name("kvm-3"), "kvm-3");
        let a = device_name("-a-");
        let b = device_name("a");
        let c = device_name("_a_");
        assert!(a.starts_with("a-") && a != b && a != c, "{a} {b} {c}");
        assert_eq!(device_name("-a-"), a, "stable");
        assert!(device_name("--").starts_with('d'));
        for n in [a, c, device_name("--")] {
            assert!(
                n.chars().next().unwrap().is_ascii_alphanumeric() && n.chars().last().unwrap().is_ascii_alphanumeric()
            );
        }
    }
}
