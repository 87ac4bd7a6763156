//! Free text an outsider wrote (a path it asked for, an error it returned, a panic message, a log
//! line, a health reason, an API server's message): before it reaches a log line, an error,
//! `/status`, kubelet or the API server, every character outside an allow-list of Unicode general
//! categories is escaped (`\n` becomes the two characters `\` `n`, U+2028 becomes `\u{2028}`), so
//! one message of a backend is always one log record and cannot rewrite a terminal or hide text,
//! and *then* it is clipped, so every stated length holds for what is actually written (escaping
//! can make text up to ten times longer: clipping first broke the promise).
//!
//! An allow-list, not a list of bad characters: letters, marks, numbers, punctuation, symbols and
//! the ASCII space pass; controls, format characters (bidi marks, U+061C, U+200B, U+FEFF, …),
//! every separator but U+0020 (U+2028/2029, NBSP, ideographic space), private-use, surrogate and
//! unassigned code points are escaped. A deny-list of controls and bidi overrides let U+2028 and
//! U+FEFF through (issue 49); the next Unicode version's new format character would have followed.

use std::borrow::Cow;

/// Characters of outsider text kept in logs, errors and status.
pub const CLIP: usize = 256;

/// Characters of the text itself a clipped text keeps at least before it carries its
/// length-and-hash suffix (shorter limits get a plain cut).
const MIN_KEPT: usize = 8;

/// Whether `c` must be escaped: everything but the printable general categories and the ASCII
/// space (see the module's doc).
fn needs_escape(c: char) -> bool {
    use unicode_general_category::{GeneralCategory as G, get_general_category};
    if c.is_ascii() {
        // The common case, without a table look-up: printable ASCII passes.
        return !(' '..='~').contains(&c);
    }
    !matches!(
        get_general_category(c),
        G::UppercaseLetter
            | G::LowercaseLetter
            | G::TitlecaseLetter
            | G::ModifierLetter
            | G::OtherLetter
            | G::NonspacingMark
            | G::SpacingMark
            | G::EnclosingMark
            | G::DecimalNumber
            | G::LetterNumber
            | G::OtherNumber
            | G::ConnectorPunctuation
            | G::DashPunctuation
            | G::OpenPunctuation
            | G::ClosePunctuation
            | G::InitialPunctuation
            | G::FinalPunctuation
            | G::OtherPunctuation
            | G::MathSymbol
            | G::CurrencySymbol
            | G::ModifierSymbol
            | G::OtherSymbol
    )
}

/// `text` escaped and clipped to [`CLIP`] characters (see [`clip_to`]).
pub fn clip(text: &str) -> Cow<'_, str> {
    clip_to(text, CLIP)
}

/// `text` with every control and bidi-override character escaped, then, if that is longer than
/// `keep` characters, its first characters, its length in bytes and a short sha256 (so two long
/// strings still read differently), the whole at most `keep` characters.
pub fn clip_to(text: &str, keep: usize) -> Cow<'_, str> {
    // Only the first `keep + 1` characters are ever looked at (a backend's text may be 16 MiB,
    // and this runs for every refusal it causes).
    let as_is = text.chars().take(keep.saturating_add(1)).enumerate().all(|(i, c)| i < keep && !needs_escape(c));
    if as_is {
        return Cow::Borrowed(text);
    }
    Cow::Owned(clipped(
        text.chars().map(|c| if needs_escape(c) { Piece::Escaped(c) } else { Piece::Plain(c) }),
        text,
        keep,
    ))
}

enum Piece {
    Plain(char),
    Escaped(char),
}

/// The suffix a clipped `text` ends with: its length and a short hash, so two long texts still
/// read differently.
fn suffix(text: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = hex::encode(&Sha256::digest(text.as_bytes())[..4]);
    format!("… ({} bytes, sha256 {digest}…)", text.len())
}

/// Writes `pieces` until `keep` characters; past that, cuts and appends the suffix within `keep`.
fn clipped(pieces: impl Iterator<Item = Piece>, text: &str, keep: usize) -> String {
    let mut out = String::new();
    let mut chars = 0;
    // Where the text is cut if a suffix is needed: the last piece boundary within `room` (the
    // suffix's length is known before its hash is: 8 hex digits).
    let suffix_len = "… ( bytes, sha256 12345678…)".chars().count() + text.len().to_string().len();
    let room = if keep >= suffix_len + MIN_KEPT { keep - suffix_len } else { keep };
    let mut cut = None;
    for piece in pieces {
        let before = out.len();
        match piece {
            Piece::Plain(c) => {
                out.push(c);
                chars += 1;
            }
            Piece::Escaped(c) => {
                for e in c.escape_default() {
                    out.push(e);
                    chars += 1;
                }
            }
        }
        if chars > room && cut.is_none() {
            cut = Some(before);
        }
        if chars > keep {
            out.truncate(cut.unwrap_or(before));
            if room < keep {
                out.push_str(&suffix(text));
            }
            return out;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn long_text_is_cut_and_stays_distinguishable() {
        assert_eq!(clip("short"), "short");
        let a = clip(&"a".repeat(10_000)).into_owned();
        let b = clip(&format!("{}b", "a".repeat(9_999))).into_owned();
        assert!(a.chars().count() <= CLIP, "{a}");
        assert!(a.contains("10000 bytes"), "{a}");
        assert_ne!(a, b, "the hash tells them apart");
        // Multi-byte characters are cut on a boundary, not through one.
        assert!(clip(&"é".repeat(1000)).starts_with("éé"));
    }

    #[test]
    fn control_characters_are_escaped_so_one_message_stays_one_line() {
        let forged = "ok\n2026-11-25T00:00:00Z  INFO devplug: backend loaded\r\u{1b}[2K\tx\u{202e}";
        let shown = clip(forged);
        assert!(!shown.chars().any(needs_escape), "{shown:?}");
        assert_eq!(shown, "ok\\n2026-11-25T00:00:00Z  INFO devplug: backend loaded\\r\\u{1b}[2K\\tx\\u{202e}");
        assert!(matches!(clip("plain text"), Cow::Borrowed(_)));
    }

    /// The stated length held only before escaping: 1,000 ESCs clipped to 1,024 characters and
    /// then escaped were 6,000 characters long.
    #[test]
    fn the_stated_length_holds_after_escaping() {
        let escapes = "\u{1b}".repeat(1000);
        let shown = clip_to(&escapes, 1024);
        assert!(shown.chars().count() <= 1024, "{} characters", shown.chars().count());
        assert!(shown.starts_with("\\u{1b}") && shown.contains("1000 bytes"), "{shown}");
        // An escape sequence is never cut in half.
        assert!(!shown.split('…').next().unwrap().ends_with('\\'));
    }

    /// Issue 49: format and separator characters a deny-list let through, each escaped now.
    #[test]
    fn format_separator_private_and_unassigned_characters_are_escaped() {
        for (c, shown) in [
            ('\u{061c}', "\\u{61c}"),
            ('\u{2028}', "\\u{2028}"),
            ('\u{2029}', "\\u{2029}"),
            ('\u{200b}', "\\u{200b}"),
            ('\u{feff}', "\\u{feff}"),
            ('\u{00a0}', "\\u{a0}"),
            ('\u{3000}', "\\u{3000}"),
            ('\u{e000}', "\\u{e000}"),
            ('\u{0378}', "\\u{378}"),
            ('\u{00ad}', "\\u{ad}"),
        ] {
            let text = format!("a{c}b");
            assert_eq!(clip(&text), format!("a{shown}b"), "U+{:04X}", c as u32);
        }
        // Letters, marks, numbers, punctuation and symbols of any script pass as they are.
        for kept in ["Grafikkarte für Rechenzentren", "ГПУ №3", "显卡 «A100»", "e\u{301}", "½ ≤ 2 €", "गुणक"]
        {
            assert_eq!(clip(kept), kept);
        }
    }

    proptest! {
        #[test]
        fn no_text_yields_a_control_character_or_more_than_keep(text in any::<String>(), keep in 1usize..2048) {
            let shown = clip_to(&text, keep);
            prop_assert!(shown.chars().count() <= keep, "{} > {keep}", shown.chars().count());
            prop_assert!(!shown.chars().any(needs_escape));
        }

        #[test]
        fn short_clean_text_passes_unchanged(text in "[ -~]{0,200}") {
            prop_assert_eq!(clip(&text), text.as_str());
        }
    }
}
