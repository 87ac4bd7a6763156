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
//!
//! Within the allowed categories, what shows nothing is escaped too (issue 58): every
//! `Default_Ignorable_Code_Point` (Unicode's derived property: Hangul fillers U+115F, U+1160,
//! U+3164, U+FFA0, the combining grapheme joiner U+034F, variation selectors, Khmer's inherent
//! vowels U+17B4/5, Mongolian's free variation selectors, tags) and the blank Braille pattern
//! U+2800; and a base character keeps at most [`MAX_MARKS`] combining marks, the rest escaped
//! (a letter under 200 marks is a smear over its neighbours, not text).

use std::borrow::Cow;

/// Characters of outsider text kept in logs, errors and status.
pub const CLIP: usize = 256;

/// Characters of an error kubelet gets from devplug and shows in a pod's events (a backend's
/// and the API server's words among them), on both APIs.
pub const MAX_WIRE_ERROR: usize = 1024;

/// Characters of the text itself a clipped text keeps at least before it carries its
/// length-and-hash suffix (shorter limits get a plain cut).
const MIN_KEPT: usize = 8;

/// Combining marks one base character keeps (Vietnamese and Indic text use two or three; Unicode's
/// Stream-Safe Text Format allows 30 non-starters in a row, text a person can read far fewer).
pub(crate) const MAX_MARKS: usize = 8;

/// `Default_Ignorable_Code_Point` (DerivedCoreProperties.txt, Unicode 16: stable in practice,
/// since the property is reserved ahead for whole blocks), plus U+2800 BRAILLE PATTERN BLANK,
/// which is a symbol but renders as nothing. Code points of the Cf and Cn categories here are
/// escaped by the category allow-list anyway; listed whole so the table reads as the property.
const INVISIBLE: &[(u32, u32)] = &[
    (0x00AD, 0x00AD),
    (0x034F, 0x034F),
    (0x061C, 0x061C),
    (0x115F, 0x1160),
    (0x17B4, 0x17B5),
    (0x180B, 0x180F),
    (0x200B, 0x200F),
    (0x202A, 0x202E),
    (0x2060, 0x206F),
    (0x2800, 0x2800),
    (0x3164, 0x3164),
    (0xFE00, 0xFE0F),
    (0xFEFF, 0xFEFF),
    (0xFFA0, 0xFFA0),
    (0xFFF0, 0xFFF8),
    (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A),
    (0xE0000, 0xE0FFF),
];

fn invisible(c: char) -> bool {
    let c = c as u32;
    INVISIBLE
        .binary_search_by(|&(lo, hi)| {
            if hi < c {
                std::cmp::Ordering::Less
            } else if lo > c {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        })
        .is_ok()
}

fn is_mark(c: char) -> bool {
    use unicode_general_category::{GeneralCategory as G, get_general_category};
    !c.is_ascii() && matches!(get_general_category(c), G::NonspacingMark | G::SpacingMark | G::EnclosingMark)
}

/// `text` as pieces to write: each character plain or escaped, marks past [`MAX_MARKS`] on one
/// base escaped.
fn pieces(text: &str) -> impl Iterator<Item = Piece> + '_ {
    let mut marks = 0usize;
    text.chars().map(move |c| {
        if is_mark(c) {
            marks += 1;
        } else {
            marks = 0;
        }
        if needs_escape(c) || marks > MAX_MARKS { Piece::Escaped(c) } else { Piece::Plain(c) }
    })
}

/// Whether `c` must be escaped: everything but the printable general categories and the ASCII
/// space, and within those what shows nothing (see the module's doc).
fn needs_escape(c: char) -> bool {
    use unicode_general_category::{GeneralCategory as G, get_general_category};
    if c.is_ascii() {
        // The common case, without a table look-up: printable ASCII passes.
        return !(' '..='~').contains(&c);
    }
    invisible(c)
        || !matches!(
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
    let as_is =
        pieces(text).take(keep.saturating_add(1)).enumerate().all(|(i, p)| i < keep && matches!(p, Piece::Plain(_)));
    if as_is {
        return Cow::Borrowed(text);
    }
    Cow::Owned(clipped(pieces(text), text, keep))
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

    /// Issue 58 (5): characters that show nothing reached the discover table and the logs raw.
    #[test]
    fn what_shows_nothing_is_escaped_and_marks_are_bounded() {
        for c in [
            '\u{3164}',
            '\u{115F}',
            '\u{FFA0}',
            '\u{2800}',
            '\u{034F}',
            '\u{FE0F}',
            '\u{E0100}',
            '\u{17B4}',
            '\u{180B}',
        ] {
            let shown = clip(&format!("a{c}b")).into_owned();
            assert_eq!(shown, format!("a{}b", c.escape_default()), "U+{:04X}", c as u32);
        }
        // Real text keeps its marks: Vietnamese (two on one letter), Hindi, Korean, emoji.
        for text in ["Tiếng Việt ệ", "हिन्दी", "한국어", "ǅ", "✓ café"] {
            assert_eq!(clip(text), text);
        }
        let zalgo = format!("e{}x", "\u{0301}".repeat(200));
        let shown = clip_to(&zalgo, 100_000).into_owned();
        assert!(shown.starts_with(&format!("e{}\\u{{301}}", "\u{0301}".repeat(MAX_MARKS))), "{shown}");
        assert!(shown.ends_with('x') && shown.matches('\u{0301}').count() == MAX_MARKS, "{shown}");
    }

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
