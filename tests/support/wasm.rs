//! Component bytes rewritten for version tests.

/// `bytes` with every `devplug:backend/…@{from}` name rewritten to `@{to}` (same length, so the
/// binary stays a valid component): a backend as if built against another WIT version.
pub fn with_wit_version(mut bytes: Vec<u8>, from: &str, to: &str) -> Vec<u8> {
    assert_eq!(from.len(), to.len(), "a rewrite must keep the length");
    let (prefix, old, new) = (b"devplug:backend/".as_slice(), format!("@{from}"), format!("@{to}"));
    let (old, new) = (old.as_bytes(), new.as_bytes());
    let mut i = 0;
    let mut hits = 0;
    while let Some(p) = bytes[i..].windows(prefix.len()).position(|w| w == prefix) {
        let at = i + p;
        if let Some(q) = bytes[at..(at + 48).min(bytes.len())].windows(old.len()).position(|w| w == old) {
            bytes[at + q..at + q + old.len()].copy_from_slice(new);
            hits += 1;
        }
        i = at + prefix.len();
    }
    assert!(hits > 0, "found WIT version {from} in the component");
    bytes
}
