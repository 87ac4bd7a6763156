//! String formats as `k8s.io/apimachinery/pkg/util/validation` (v1.36.2) checks them, with its
//! messages: DNS-1123 labels and subdomains, C identifiers, label keys (qualified names) and
//! label values, semantic versions (`resource/validation`'s `semverRe`), quantities
//! (`api/resource.ParseQuantity`).

use std::sync::LazyLock;

use regex::Regex;

const DNS1123_LABEL_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character";
const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";
const C_IDENTIFIER_FMT: &str = "[A-Za-z_][A-Za-z0-9_]*";
const C_IDENTIFIER_MSG: &str = "a valid C identifier must start with alphabetic character or '_', followed by a string of alphanumeric characters or '_'";
const LABEL_KEY_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const LABEL_KEY_MSG: &str =
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";

pub const DNS1123_LABEL_MAX: usize = 63;
pub const DNS1123_SUBDOMAIN_MAX: usize = 253;

fn re(pattern: &str) -> Regex {
    Regex::new(&format!("^(?:{pattern})$")).unwrap_or_else(|e| unreachable!("a fixed pattern: {e}"))
}

static LABEL: LazyLock<Regex> = LazyLock::new(|| re(DNS1123_LABEL_FMT));
static SUBDOMAIN: LazyLock<Regex> = LazyLock::new(|| re(&subdomain_fmt()));
static C_IDENTIFIER: LazyLock<Regex> = LazyLock::new(|| re(C_IDENTIFIER_FMT));
static LABEL_KEY: LazyLock<Regex> = LazyLock::new(|| re(LABEL_KEY_FMT));
static LABEL_VALUE: LazyLock<Regex> = LazyLock::new(|| re(&format!("({LABEL_KEY_FMT})?")));
static SEMVER: LazyLock<Regex> = LazyLock::new(|| {
    let num = r"(0|[1-9]\d*)";
    let pre = r"(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)";
    let build = r"[0-9a-zA-Z-]+";
    re(&format!(r"{num}\.{num}\.{num}(-{pre}(\.{pre})*)?(\+{build}(\.{build})*)?"))
});

fn subdomain_fmt() -> String {
    format!("{DNS1123_LABEL_FMT}(\\.{DNS1123_LABEL_FMT})*")
}

pub fn max_len_error(n: usize) -> String {
    format!("must be no more than {n} characters")
}

pub fn regex_error(msg: &str, fmt: &str, examples: &[&str]) -> String {
    if examples.is_empty() {
        return format!("{msg} (regex used for validation is '{fmt}')");
    }
    let mut out = format!("{msg} (e.g. ");
    for (i, e) in examples.iter().enumerate() {
        if i > 0 {
            out.push_str(" or ");
        }
        out.push_str(&format!("'{e}', "));
    }
    out.push_str(&format!("regex used for validation is '{fmt}')"));
    out
}

pub fn dns1123_label(v: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if v.len() > DNS1123_LABEL_MAX {
        errs.push(max_len_error(DNS1123_LABEL_MAX));
    }
    if !LABEL.is_match(v) {
        if SUBDOMAIN.is_match(v) {
            errs.push("must not contain dots".to_owned());
        } else {
            errs.push(regex_error(DNS1123_LABEL_MSG, DNS1123_LABEL_FMT, &["my-name", "123-abc"]));
        }
    }
    errs
}

pub fn dns1123_subdomain(v: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if v.len() > DNS1123_SUBDOMAIN_MAX {
        errs.push(max_len_error(DNS1123_SUBDOMAIN_MAX));
    }
    if !SUBDOMAIN.is_match(v) {
        errs.push(regex_error(DNS1123_SUBDOMAIN_MSG, &subdomain_fmt(), &["example.com"]));
    }
    errs
}

pub fn c_identifier(v: &str) -> Vec<String> {
    if C_IDENTIFIER.is_match(v) {
        vec![]
    } else {
        vec![regex_error(C_IDENTIFIER_MSG, C_IDENTIFIER_FMT, &["my_name", "MY_NAME", "MyName"])]
    }
}

/// `IsQualifiedName` / `IsLabelKey`: an optional DNS subdomain prefix and `/`, then a name.
pub fn qualified_name(v: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = v.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".to_owned());
            } else {
                errs.extend(dns1123_subdomain(prefix).into_iter().map(|m| format!("prefix part {m}")));
            }
            *name
        }
        _ => {
            errs.push(format!(
                "a valid label key {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                regex_error(LABEL_KEY_MSG, LABEL_KEY_FMT, &["MyName", "my.name", "123-abc"])
            ));
            return errs;
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".to_owned());
    } else if name.len() > 63 {
        errs.push(format!("name part {}", max_len_error(63)));
    }
    if !LABEL_KEY.is_match(name) {
        errs.push(format!(
            "name part {}",
            regex_error(LABEL_KEY_MSG, LABEL_KEY_FMT, &["MyName", "my.name", "123-abc"])
        ));
    }
    errs
}

pub fn label_value(v: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if v.len() > 63 {
        errs.push(max_len_error(63));
    }
    if !LABEL_VALUE.is_match(v) {
        errs.push(regex_error(LABEL_VALUE_MSG, &format!("({LABEL_KEY_FMT})?"), &["MyValue", "my_value", "12345"]));
    }
    errs
}

pub fn semver(v: &str) -> bool {
    SEMVER.is_match(v)
}

/// The message of a quantity that does not parse (`resource.ErrFormatWrong`), which fails the
/// decoding of the whole object.
pub const QUANTITY_FORMAT: &str =
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";

/// A quantity's value in nano-units (saturating), or `None` when `ParseQuantity` refuses it:
/// an optional sign, digits with at most one `.`, then one suffix: a binary (`Ki`…`Ei`) or
/// decimal (`n u m k M G T P E`, or none) one, or an exponent (`e`/`E` and an integer).
pub fn quantity(q: &str) -> Option<i128> {
    let (negative, rest) = match q.as_bytes().first() {
        Some(b'-') => (true, &q[1..]),
        Some(b'+') => (false, &q[1..]),
        _ => (false, q),
    };
    let split = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
    let (number, suffix) = rest.split_at(split);
    if number.is_empty() || number == "." || number.matches('.').count() > 1 {
        return None;
    }
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    let nanos = |mul: i128, exp10: i32| -> i128 {
        let digits: String = format!("{whole}{frac}");
        let mut v: i128 = 0;
        for d in digits.bytes() {
            v = v.saturating_mul(10).saturating_add(i128::from(d - b'0'));
        }
        let mut scale = exp10 + 9 - frac.len() as i32;
        v = v.saturating_mul(mul);
        while scale > 0 {
            v = v.saturating_mul(10);
            scale -= 1;
        }
        while scale < 0 {
            v /= 10;
            scale += 1;
        }
        v
    };
    let value = match suffix {
        "" => nanos(1, 0),
        "n" => nanos(1, -9),
        "u" => nanos(1, -6),
        "m" => nanos(1, -3),
        "k" => nanos(1, 3),
        "M" => nanos(1, 6),
        "G" => nanos(1, 9),
        "T" => nanos(1, 12),
        "P" => nanos(1, 15),
        "E" => nanos(1, 18),
        "Ki" => nanos(1 << 10, 0),
        "Mi" => nanos(1 << 20, 0),
        "Gi" => nanos(1 << 30, 0),
        "Ti" => nanos(1 << 40, 0),
        "Pi" => nanos(1 << 50, 0),
        "Ei" => nanos(1 << 60, 0),
        s if s.starts_with(['e', 'E']) => {
            let exp: i32 = s[1..].parse().ok()?;
            nanos(1, exp.clamp(-40, 40))
        }
        _ => return None,
    };
    Some(if negative { -value } else { value })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_parse_as_the_server_parses_them() {
        assert_eq!(quantity("1"), Some(1_000_000_000));
        assert_eq!(quantity("80Gi"), Some(80 * (1 << 30) * 1_000_000_000));
        assert_eq!(quantity("500m"), Some(500_000_000));
        assert_eq!(quantity("1.5k"), Some(1_500_000_000_000));
        assert_eq!(quantity("1e3"), Some(1_000_000_000_000));
        for bad in ["lots", "", "1.2.3", "1Q", "Gi", "1 Gi", "1e"] {
            assert_eq!(quantity(bad), None, "{bad}");
        }
    }

    #[test]
    fn names_follow_the_server() {
        assert!(dns1123_label("gpu-0").is_empty());
        assert_eq!(dns1123_label("gpu.0"), vec!["must not contain dots"]);
        assert_eq!(dns1123_label(&"a".repeat(64)), vec!["must be no more than 63 characters"]);
        assert!(!dns1123_label("GPU").is_empty());
        assert!(dns1123_subdomain("a.b-c").is_empty());
        assert!(c_identifier("x_1").is_empty() && !c_identifier("1x").is_empty());
        assert!(qualified_name("example.com/Key_1").is_empty());
        assert!(!qualified_name("a/b/c").is_empty());
        assert!(semver("1.2.3-rc.1+b5") && !semver("550.54"));
    }
}
