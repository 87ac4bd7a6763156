//! Extended resource names as kubelet checks them, and the characters names derived from them
//! may hold. Backends declare resource names; the registry refuses one kubelet would refuse.

/// Why kubelet would refuse `name` as an extended resource name, if it would.
///
/// Kubelet accepts `domain/name` where the domain is a DNS subdomain outside `kubernetes.io`
/// and `requests.<name>` is a valid qualified name (name part: at most 63 characters,
/// alphanumeric at both ends, `-_.` inside).
pub(crate) fn resource_name_problem(name: &str) -> Option<String> {
    let Some((domain, short)) = name.split_once('/') else {
        return Some(format!("{name:?} has no domain: use an extended resource name like example.com/{name}"));
    };
    if domain == "kubernetes.io" || domain.ends_with(".kubernetes.io") {
        return Some(format!("{name:?} is in the kubernetes.io domain, which is reserved for native resources"));
    }
    if domain.is_empty() || domain.len() > 253 {
        return Some(format!("{name:?}: domain must be 1 to 253 characters"));
    }
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if !domain.split('.').all(label_ok) {
        return Some(format!("{name:?}: domain {domain:?} is not a lowercase DNS subdomain"));
    }
    // Kubelet validates "requests." + name as a qualified name, so the name part gets the rule.
    let ok_char = is_name_char;
    let ends_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if short.is_empty()
        || short.len() > 63
        || !short.chars().all(ok_char)
        || !ends_ok(short.chars().next())
        || !ends_ok(short.chars().last())
    {
        return Some(format!(
            "{name:?}: the part after '/' must be 1 to 63 characters of [A-Za-z0-9-_.], alphanumeric at both ends"
        ));
    }
    None
}

/// A character kubelet allows in the name part of a qualified name: `[A-Za-z0-9._-]`.
pub(crate) fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "-_.".contains(c)
}

/// `s` with every character outside `[A-Za-z0-9._-]` replaced by `_` (`nvidia.com/gpu` →
/// `nvidia.com_gpu`), for file names and keys derived from resource names.
pub(crate) fn name_chars(s: &str) -> String {
    s.chars().map(|c| if is_name_char(c) { c } else { '_' }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubelet_rules() {
        for ok in ["nvidia.com/gpu", "devplug.io/kvm", "gpu.intel.com/i915", "a.b/c_d.e-f"] {
            assert_eq!(resource_name_problem(ok), None, "{ok}");
        }
        for bad in [
            "gpu",
            "kubernetes.io/gpu",
            "node.kubernetes.io/x",
            "Nvidia.com/gpu",
            "nvidia.com/",
            "nvidia.com/-gpu",
            "nvidia.com/gpu/x",
            "/gpu",
            "nvidia..com/gpu",
        ] {
            assert!(resource_name_problem(bad).is_some(), "{bad}");
        }
        assert!(resource_name_problem(&format!("a.io/{}", "x".repeat(64))).is_some());
    }
}
