//! Names an outsider chose, gated for the destination that parses them: a kernel network
//! interface name (a claim's `networkData.interfaceName`, which `kubectl describe` prints), the
//! API server's DNS labels, subdomains and qualified names, and CDI device names (what a container
//! runtime looks up in a spec). A value of these types passed its destination's rule; nothing
//! else can be written there.

use super::Refused;

/// Longest network interface name the kernel takes: `IFNAMSIZ` (16) less its NUL.
pub(crate) const MAX_IFNAME: usize = 15;

/// A kernel network interface name, by `dev_valid_name()` in `net/core/dev.c` (non-empty,
/// shorter than `IFNAMSIZ`, not `.` or `..`, no `/`, `:` or whitespace), and printable ASCII on
/// top: the kernel takes any other byte, but a terminal must not get one from an API object.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct IfName(String);

impl IfName {
    pub fn new(s: &str) -> Result<IfName, Refused> {
        let refuse = |rule| Err(Refused::new("network interface name", s, rule));
        if s.is_empty() || s.len() > MAX_IFNAME {
            return refuse("1 to 15 bytes (IFNAMSIZ)");
        }
        if s == "." || s == ".." {
            return refuse("not `.` or `..`");
        }
        if !s.bytes().all(|b| b.is_ascii_graphic() && b != b'/' && b != b':') {
            return refuse("printable ASCII without '/', ':' or whitespace");
        }
        Ok(IfName(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A name type whose gate is one of the API server's rules below.
macro_rules! api_name {
    ($(#[$doc:meta])* $name:ident, $what:literal, $rule:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub struct $name(String);

        impl $name {
            pub fn new(s: &str) -> Result<$name, Refused> {
                match $rule(s) {
                    None => Ok($name(s.to_owned())),
                    Some(why) => Err(Refused::owned($what, s, why)),
                }
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }
    };
}

api_name!(
    /// A lowercase RFC 1123 label (at most 63 characters): device and counter names in slices.
    DnsLabel, "DNS label", label_problem
);
api_name!(
    /// A lowercase RFC 1123 subdomain (at most 253 characters): object names, driver names.
    DnsSubdomain, "DNS subdomain", subdomain_problem
);
api_name!(
    /// An attribute or capacity name: `[domain/]name`, the domain a subdomain of at most 63
    /// characters, the name a C identifier of at most [`MAX_ATTRIBUTE_NAME`] bytes.
    QualifiedName, "qualified name", qualified_name_problem
);

/// The name part of an attribute or capacity name (a C identifier), in bytes.
pub const MAX_ATTRIBUTE_NAME: usize = 32;

/// Longest CDI device name devplug writes.
pub(crate) const MAX_CDI_NAME: usize = 255;

/// A CDI device name as the CDI parser (`pkg/parser` in cncf-tags/container-device-interface)
/// takes it: letters, digits, `_`, `-`, `.`, `:`, starting and ending with a letter or digit.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct CdiName(String);

/// Whether `c` may be in a CDI device name (the one statement of the grammar's characters:
/// [`CdiName::new`], the CDI writer's names for device IDs and a claim's share names use it).
pub fn cdi_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "_-.:".contains(c)
}

impl CdiName {
    pub fn new(s: &str) -> Result<CdiName, Refused> {
        let ok_char = cdi_name_char;
        let ends = s.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
            && s.chars().last().is_some_and(|c| c.is_ascii_alphanumeric());
        if s.len() > MAX_CDI_NAME || !ends || !s.chars().all(ok_char) {
            return Err(Refused::new(
                "CDI device name",
                s,
                "1 to 255 of [A-Za-z0-9_.:-], starting and ending with a letter or digit",
            ));
        }
        Ok(CdiName(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

impl std::fmt::Display for CdiName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why `s` is not a lowercase RFC 1123 label, if it is not.
pub fn label_problem(s: &str) -> Option<String> {
    if s.len() > 63 {
        return Some("must be no more than 63 characters".into());
    }
    let ok = !s.is_empty()
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-');
    (!ok).then(|| "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character".into())
}

/// Why `s` is not a lowercase RFC 1123 subdomain (at most 253 characters), if it is not.
pub fn subdomain_problem(s: &str) -> Option<String> {
    if s.len() > 253 {
        return Some("must be no more than 253 characters".into());
    }
    subdomain_problem_unbounded(s)
}

/// [`subdomain_problem`] without the length rule (pool names are several joined by `/`).
pub fn subdomain_problem_unbounded(s: &str) -> Option<String> {
    let ok = !s.is_empty()
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        });
    (!ok).then(|| "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character".into())
}

/// Why `s` is not an attribute or capacity name, if it is not.
pub fn qualified_name_problem(s: &str) -> Option<String> {
    let (domain, name) = match s.split_once('/') {
        Some((d, n)) => (Some(d), n),
        None => (None, s),
    };
    if let Some(d) = domain {
        if d.len() > 63 {
            return Some(format!("{:?}: must be no more than 63 characters", super::clip(d)));
        }
        if let Some(why) = subdomain_problem(d) {
            return Some(format!("{:?}: {why}", super::clip(d)));
        }
    }
    if name.len() > MAX_ATTRIBUTE_NAME {
        return Some(format!("Too long: may not be more than {MAX_ATTRIBUTE_NAME} bytes"));
    }
    let c_ident = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    (!c_ident).then(|| format!("{:?}: a valid C identifier must start with alphabetic character or '_', followed by a string of alphanumeric characters or '_'", super::clip(name)))
}

/// Why `s` is not a label key as taints use it (`[prefix/]name`), if it is not.
pub fn label_key_problem(s: &str) -> Option<String> {
    let (prefix, name) = match s.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    if let Some(p) = prefix
        && let Some(why) = subdomain_problem(p)
    {
        return Some(format!("prefix part {why}"));
    }
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        && name.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && name.chars().last().is_some_and(|c| c.is_ascii_alphanumeric());
    (!ok).then(|| "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character".into())
}

/// Why `s` is not a label value (empty, or at most 63 alphanumerics, `-`, `_` and `.` that start
/// and end alphanumeric), if it is not.
pub fn label_value_problem(s: &str) -> Option<String> {
    if s.len() > 63 {
        return Some("must be no more than 63 characters".into());
    }
    let ok = s.is_empty()
        || (s.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            && s.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
            && s.chars().last().is_some_and(|c| c.is_ascii_alphanumeric()));
    (!ok).then(|| "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn interface_names_follow_dev_valid_name() {
        for ok in ["eth0", "ens1f0np0v0", "ib0", "enp65s0f1", "a.b", "x-y_z"] {
            assert!(IfName::new(ok).is_ok(), "{ok}");
        }
        // ESC, BEL and a newline reached `kubectl describe` through `netdev` before this gate.
        for bad in ["", ".", "..", "eth0:1", "a/b", "a b", "e\u{1b}[2J", "e\u{7}", "eth0\n", "0123456789abcdef", "é"] {
            assert!(IfName::new(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn cdi_names_follow_the_cdi_parser() {
        for ok in ["0", "gpu0", "GPU-6d8f", "0000:17:00.0", "a_b.c"] {
            assert!(CdiName::new(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-a", "a-", "a/b", "a=b", "a b", &"a".repeat(256)] {
            assert!(CdiName::new(bad).is_err(), "{bad:?}");
        }
    }

    fn is_label(s: &str) -> bool {
        (1..=63).contains(&s.len())
            && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !s.starts_with('-')
            && !s.ends_with('-')
    }

    proptest! {
        #[test]
        fn no_input_yields_an_interface_name_the_kernel_or_a_terminal_would_refuse(s in any::<String>()) {
            if let Ok(n) = IfName::new(&s) {
                let n = n.as_str();
                prop_assert!(!n.is_empty() && n.len() < 16 && n != "." && n != "..");
                prop_assert!(n.bytes().all(|b| (0x21..0x7f).contains(&b) && b != b'/' && b != b':'));
            }
        }

        #[test]
        fn no_input_yields_an_invalid_label_subdomain_or_qualified_name(s in "[a-zA-Z0-9._/:-]{0,80}|.{0,80}") {
            if let Ok(l) = DnsLabel::new(&s) {
                prop_assert!(is_label(l.as_str()));
            }
            if let Ok(d) = DnsSubdomain::new(&s) {
                prop_assert!(d.as_str().len() <= 253 && d.as_str().split('.').all(is_label));
            }
            if let Ok(q) = QualifiedName::new(&s) {
                let (domain, name) = q.as_str().rsplit_once('/').map_or((None, q.as_str()), |(d, n)| (Some(d), n));
                prop_assert!(domain.is_none_or(|d| d.len() <= 63 && d.split('.').all(is_label)));
                prop_assert!(name.len() <= MAX_ATTRIBUTE_NAME && !name.is_empty());
                prop_assert!(name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
                prop_assert!(!name.starts_with(|c: char| c.is_ascii_digit()));
            }
        }

        #[test]
        fn no_input_yields_a_cdi_name_the_parser_would_refuse(s in any::<String>()) {
            if let Ok(n) = CdiName::new(&s) {
                let n = n.as_str();
                prop_assert!(!n.is_empty() && n.len() <= MAX_CDI_NAME);
                prop_assert!(n.chars().all(|c| c.is_ascii_alphanumeric() || "_-.:".contains(c)));
                prop_assert!(n.starts_with(|c: char| c.is_ascii_alphanumeric()));
                prop_assert!(n.ends_with(|c: char| c.is_ascii_alphanumeric()));
            }
        }
    }
}
