//! The documents of a claim file (YAML, several documents, or JSON; a `List` unrolled), as
//! kubectl reads them, with the work one file can cause bounded: YAML aliases let a 740 KB file
//! expand to gigabytes (each `*alias` is the whole anchored tree again), so every decoded value
//! is paid for from one budget per file, and past it the file is refused — as the API server's
//! YAML decoder (sigs.k8s.io/yaml over go-yaml) refuses "excessive aliasing".

use std::cell::Cell;
use std::fmt;

use serde::de::{DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value as Json};

/// Values (scalars, lists, maps) one claim file may decode to, aliases expanded. A claim is
/// about fifty; a file of a thousand claims stays far below.
pub const MAX_NODES: usize = 250_000;
/// String bytes one claim file may decode to, aliases expanded.
pub const MAX_STRING_BYTES: usize = 16 << 20;

/// Why a claim file could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DocumentError {
    #[error("document {document}: not YAML or JSON: {why}")]
    Syntax { document: usize, why: String },
    #[error(
        "document {document}: expands to more than {MAX_NODES} values or {MAX_STRING_BYTES} bytes of strings (YAML aliases repeat what they name; the API server refuses excessive aliasing too): write the claims out, or split the file"
    )]
    TooLarge { document: usize },
}

struct Budget {
    nodes: Cell<usize>,
    bytes: Cell<usize>,
    spent: Cell<bool>,
}

impl Budget {
    fn pay(&self, nodes: usize, bytes: usize) -> bool {
        let (n, b) = (self.nodes.get(), self.bytes.get());
        if n < nodes || b < bytes {
            self.spent.set(true);
            return false;
        }
        self.nodes.set(n - nodes);
        self.bytes.set(b - bytes);
        true
    }
}

/// Every document of `text`.
pub fn documents(text: &str) -> Result<Vec<Json>, DocumentError> {
    let budget = Budget { nodes: Cell::new(MAX_NODES), bytes: Cell::new(MAX_STRING_BYTES), spent: Cell::new(false) };
    let mut out = Vec::new();
    for (i, doc) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let document = i + 1;
        let v = Bounded(&budget).deserialize(doc).map_err(|e| {
            // The YAML library's own bound on alias jumps (100 per event) is the same refusal.
            if budget.spent.get() || e.to_string().contains("repetition limit exceeded") {
                DocumentError::TooLarge { document }
            } else {
                DocumentError::Syntax { document, why: e.to_string() }
            }
        })?;
        match v["kind"].as_str() {
            Some("List") => out.extend(v["items"].as_array().cloned().unwrap_or_default()),
            _ if v.is_null() => {}
            _ => out.push(v),
        }
    }
    Ok(out)
}

/// A JSON value built from any self-describing input, each part paid for from the budget.
#[derive(Clone, Copy)]
struct Bounded<'a>(&'a Budget);

impl<'de> DeserializeSeed<'de> for Bounded<'_> {
    type Value = Json;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Json, D::Error> {
        d.deserialize_any(self)
    }
}

impl Bounded<'_> {
    fn pay<E: serde::de::Error>(&self, bytes: usize) -> Result<(), E> {
        if self.0.pay(1, bytes) { Ok(()) } else { Err(E::custom("the file expands past its budget")) }
    }
}

impl<'de> Visitor<'de> for Bounded<'_> {
    type Value = Json;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML or JSON value")
    }

    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Json, E> {
        self.pay(0)?;
        Ok(Json::Bool(v))
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Json, E> {
        self.pay(0)?;
        Ok(Json::Number(v.into()))
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Json, E> {
        self.pay(0)?;
        Ok(Json::Number(v.into()))
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Json, E> {
        self.pay(0)?;
        Ok(Number::from_f64(v).map_or(Json::Null, Json::Number))
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Json, E> {
        self.pay(v.len())?;
        Ok(Json::String(v.to_owned()))
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Json, E> {
        self.pay(0)?;
        Ok(Json::Null)
    }

    fn visit_none<E: serde::de::Error>(self) -> Result<Json, E> {
        self.visit_unit()
    }

    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Json, D::Error> {
        d.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
        self.pay(0)?;
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(self)? {
            out.push(v);
        }
        Ok(Json::Array(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
        self.pay(0)?;
        let mut out = Map::new();
        while let Some(k) = map.next_key_seed(self)? {
            let key = match k {
                Json::String(s) => s,
                other => other.to_string(),
            };
            let v = map.next_value_seed(self)?;
            out.insert(key, v);
        }
        Ok(Json::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_lists_and_json_are_read() {
        let text = "kind: ResourceClaim\nmetadata: {name: a}\n---\nkind: List\nitems: [{kind: ResourceClaim}, {kind: DeviceClass}]\n---\n";
        let docs = documents(text).unwrap();
        assert_eq!(docs.len(), 3);
        assert_eq!(docs[0]["metadata"]["name"], "a");
        assert_eq!(documents("{\"kind\": \"ResourceClaim\", \"n\": 1.5}").unwrap()[0]["n"], 1.5);
        assert!(matches!(documents("a: [").unwrap_err(), DocumentError::Syntax { document: 1, .. }));
    }

    /// Issue 49: a "billion laughs" of YAML aliases stops at the budget, however small the file.
    #[test]
    fn alias_bombs_are_refused_at_the_budget() {
        let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..10 {
            let prev = i - 1;
            text.push_str(&format!("a{i}: &a{i} [*a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}]\n"));
        }
        assert!(text.len() < 1024, "{} bytes", text.len());
        let e = documents(&text).unwrap_err();
        assert_eq!(e, DocumentError::TooLarge { document: 1 });
        assert!(e.to_string().contains("aliases"), "{e}");
        // Long strings repeated by aliases count by their bytes.
        let big = format!("s: &s \"{}\"\nl: [{}]\n", "y".repeat(1 << 20), vec!["*s"; 20].join(", "));
        assert!(matches!(documents(&big).unwrap_err(), DocumentError::TooLarge { .. }));
        // A few aliases are fine.
        assert_eq!(documents("a: &a {k: v}\nb: *a\n").unwrap()[0]["b"]["k"], "v");
    }
}
