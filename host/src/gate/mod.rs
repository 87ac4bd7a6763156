//! The gates: a value an outsider produced (a backend's answer, a registry's bytes, an API
//! object, a local client's bytes) reaches a destination only as the type that destination's
//! gate returns, and each gate is an allow-list of what the destination takes:
//!
//! | destination | type | rule |
//! |---|---|---|
//! | a log line, an error, `/status`, a health message, a CLI cell | [`clip`] / [`clip_to`] | control and bidi characters escaped, *then* clipped: the stated length holds for what is written |
//! | a claim's `networkData.interfaceName` | [`IfName`] | the kernel's `dev_valid_name()`, printable ASCII |
//! | a slice's device, counter and set names | [`DnsLabel`] | RFC 1123 label |
//! | object and driver names | [`DnsSubdomain`] | RFC 1123 subdomain |
//! | attribute and capacity names | [`QualifiedName`] | `[subdomain/]C-identifier` |
//! | a CDI spec's device names, `cdi_devices` | [`CdiName`] | the CDI parser's device-name rule |
//! | a container's environment | [`EnvKey`], [`EnvValue`] | plain key; value without NUL |
//! | an env grant | [`EnvGrant`] | an exact key or a vendor prefix `VENDOR_*`; one matcher ([`EnvRule`]) for requests, grants and answers |
//! | `pciBusID`, `pcieRoot` | [`PciAddress`] | well formed, granted to the backend, present in sysfs |
//!
//! Paths under a granted root have their own gate, the backend's `runtime::jail::Jail`
//! (`openat2(RESOLVE_BENEATH)`, both names checked). docs/security.md has the same table with
//! the test of each.

mod env;
mod names;
mod pci;
mod text;

pub use env::{EnvGrant, EnvKey, EnvRule, EnvValue};
pub use names::{
    CdiName, DnsLabel, DnsSubdomain, IfName, MAX_ATTRIBUTE_NAME, QualifiedName, cdi_name_char, label_key_problem,
    label_problem, label_value_problem, qualified_name_problem, subdomain_problem, subdomain_problem_unbounded,
};
pub use pci::{PciAddress, PciLookup, is_bus_id};
pub use text::{CLIP, MAX_WIRE_ERROR, clip, clip_to};

/// A value a gate refused: what it was meant to be, the value (escaped and clipped), and the rule.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{what} {value:?} refused: {rule}")]
pub struct Refused {
    pub what: &'static str,
    pub value: String,
    pub rule: String,
}

impl Refused {
    fn new(what: &'static str, value: &str, rule: &'static str) -> Refused {
        Refused::owned(what, value, rule.to_owned())
    }

    fn owned(what: &'static str, value: &str, rule: String) -> Refused {
        Refused { what, value: clip(value).into_owned(), rule }
    }
}

/// A TOML error on one line, where it is and what is wrong (`toml`'s own text spans several
/// lines with a drawing of the place, which a log line or the CLI's error shows as literal `\n`).
pub(crate) fn toml_error(text: &str, e: &toml::de::Error) -> String {
    let message = e.message().trim_end_matches('\n').replace('\n', "; ");
    match e.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            let start = before.rfind('\n').map_or(0, |i| i + 1);
            let shown = text[start..].lines().next().unwrap_or("").trim();
            format!("line {line}, column {column}: {message} (at `{}`)", clip_to(shown, 120))
        }
        None => message,
    }
}
