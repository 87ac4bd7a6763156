//! Field errors as kube-apiserver words them (`k8s.io/apimachinery/pkg/util/validation/field`,
//! v1.36.2): the type's words, the bad value (strings quoted as Go's `%q`, numbers bare, other
//! values as JSON, `TooLong` without it) and the detail, so a Status the stand-in writes reads
//! as the real server's does.

use serde_json::Value;

/// The kinds of field error ResourceSlice validation produces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Required,
    Invalid,
    Duplicate,
    NotSupported,
    NotFound,
    Forbidden,
    TooLong,
    TooMany,
}

impl Kind {
    fn words(self) -> &'static str {
        match self {
            Kind::Required => "Required value",
            Kind::Invalid => "Invalid value",
            Kind::Duplicate => "Duplicate value",
            Kind::NotSupported => "Unsupported value",
            Kind::NotFound => "Not found",
            Kind::Forbidden => "Forbidden",
            Kind::TooLong => "Too long",
            Kind::TooMany => "Too many",
        }
    }

    /// The `reason` of a Status cause (`metav1.CauseType`).
    pub fn reason(self) -> &'static str {
        match self {
            Kind::Required => "FieldValueRequired",
            Kind::Invalid => "FieldValueInvalid",
            Kind::Duplicate => "FieldValueDuplicate",
            Kind::NotSupported => "FieldValueNotSupported",
            Kind::NotFound => "FieldValueNotFound",
            Kind::Forbidden => "FieldValueForbidden",
            Kind::TooLong => "FieldValueTooLong",
            Kind::TooMany => "FieldValueTooMany",
        }
    }
}

/// One field error.
#[derive(Clone, Debug, PartialEq)]
pub struct FieldError {
    pub field: String,
    pub kind: Kind,
    /// The value shown after the type's words, already rendered; `None` shows none.
    pub value: Option<String>,
    pub detail: String,
}

impl FieldError {
    /// What follows `field: ` in the server's message (`Error.ErrorBody`).
    pub fn body(&self) -> String {
        let mut s = self.kind.words().to_owned();
        if let Some(v) = &self.value {
            s.push_str(": ");
            s.push_str(v);
        }
        if !self.detail.is_empty() {
            s.push_str(": ");
            s.push_str(&self.detail);
        }
        s
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.body())
    }
}

/// A string as Go's `%q` prints it (close enough for the ASCII and printable Unicode the
/// corpus holds: `"`, `\` and control characters escaped).
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The error list being built, with the constructors of `field`.
#[derive(Default, Debug)]
pub struct Errors(pub Vec<FieldError>);

impl Errors {
    fn push(&mut self, field: &str, kind: Kind, value: Option<String>, detail: impl Into<String>) {
        self.0.push(FieldError { field: field.to_owned(), kind, value, detail: detail.into() });
    }
    pub fn required(&mut self, field: &str, detail: &str) {
        self.push(field, Kind::Required, None, detail);
    }
    pub fn invalid_str(&mut self, field: &str, value: &str, detail: impl Into<String>) {
        self.push(field, Kind::Invalid, Some(quote(value)), detail);
    }
    pub fn invalid_json(&mut self, field: &str, value: &Value, detail: impl Into<String>) {
        let shown = match value {
            Value::String(s) => quote(s),
            other => other.to_string(),
        };
        self.push(field, Kind::Invalid, Some(shown), detail);
    }
    pub fn invalid_raw(&mut self, field: &str, value: String, detail: impl Into<String>) {
        self.push(field, Kind::Invalid, Some(value), detail);
    }
    pub fn duplicate(&mut self, field: &str, value: &str) {
        self.push(field, Kind::Duplicate, Some(quote(value)), "");
    }
    pub fn not_supported(&mut self, field: &str, value: &str, supported: &[&str]) {
        let list: Vec<String> = supported.iter().map(|s| quote(s)).collect();
        self.push(field, Kind::NotSupported, Some(quote(value)), format!("supported values: {}", list.join(", ")));
    }
    pub fn not_found(&mut self, field: &str, value: &str) {
        self.push(field, Kind::NotFound, Some(quote(value)), "");
    }
    pub fn forbidden(&mut self, field: &str, detail: &str) {
        self.push(field, Kind::Forbidden, None, detail);
    }
    pub fn too_long(&mut self, field: &str, max: usize) {
        let unit = if max == 1 { "byte" } else { "bytes" };
        self.push(field, Kind::TooLong, None, format!("may not be more than {max} {unit}"));
    }
    pub fn too_many(&mut self, field: &str, n: usize, max: usize) {
        let unit = if max == 1 { "item" } else { "items" };
        self.push(field, Kind::TooMany, Some(n.to_string()), format!("must have at most {max} {unit}"));
    }
    /// Each message of a string check (`IsDNS1123Label` and friends) as `Invalid`.
    pub fn each_invalid(&mut self, field: &str, value: &str, msgs: Vec<String>) {
        for m in msgs {
            self.invalid_str(field, value, m);
        }
    }
}
