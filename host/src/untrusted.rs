//! Text that came from a backend (a path it asked for, an error it returned, a panic message, a
//! log line) is outsider input: before it reaches a log line, an error, `/status` or kubelet it is
//! clipped, so a backend cannot make the host store or print megabytes, and its control
//! characters are escaped (`\n` stays the two characters `\` `n`), so one message of a backend
//! is always one log record: it cannot end the host's line and forge one of its own.

use std::borrow::Cow;

/// Characters of outsider text kept in logs, errors and status.
pub const CLIP: usize = 256;

/// `text` if it is short; else its first [`CLIP`] characters, its length and a short sha256, so
/// two different long strings still read differently.
pub fn clip(text: &str) -> Cow<'_, str> {
    clip_to(text, CLIP)
}

/// [`clip`] with another length (panic messages get more room).
pub fn clip_to(text: &str, keep: usize) -> Cow<'_, str> {
    let clipped = match text.char_indices().nth(keep) {
        None => Cow::Borrowed(text),
        Some((cut, _)) => {
            use sha2::{Digest, Sha256};
            let digest = hex::encode(&Sha256::digest(text.as_bytes())[..4]);
            Cow::Owned(format!("{}… ({} bytes, sha256 {digest}…)", &text[..cut], text.len()))
        }
    };
    if !clipped.chars().any(char::is_control) {
        return clipped;
    }
    let mut out = String::with_capacity(clipped.len() + 8);
    for c in clipped.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_text_is_cut_and_stays_distinguishable() {
        assert_eq!(clip("short"), "short");
        let a = clip(&"a".repeat(10_000)).into_owned();
        let b = clip(&format!("{}b", "a".repeat(9_999))).into_owned();
        assert!(a.len() < CLIP + 64, "{a}");
        assert!(a.contains("10000 bytes"), "{a}");
        assert_ne!(a, b, "the hash tells them apart");
        // Multi-byte characters are cut on a boundary, not through one.
        assert!(clip(&"é".repeat(1000)).starts_with("éé"));
    }

    #[test]
    fn control_characters_are_escaped_so_one_message_stays_one_line() {
        let forged = "ok\n2026-11-25T00:00:00Z  INFO devplug: backend loaded\r\u{1b}[2K\tx";
        let shown = clip(forged);
        assert!(!shown.chars().any(char::is_control), "{shown:?}");
        assert_eq!(shown, "ok\\n2026-11-25T00:00:00Z  INFO devplug: backend loaded\\r\\u{1b}[2K\\tx");
        assert!(matches!(clip("plain text"), Cow::Borrowed(_)));
    }
}
