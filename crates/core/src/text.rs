//! How allocsim shows a string it did not write (a file's field, a flag's value): every
//! front end and every error message goes through these two functions, so a hostile input can
//! neither flood a message nor drive the terminal that shows it.
//!
//! - [`quoted`] is for messages that quote input: Rust's debug quotes (control characters
//!   escaped), cut to a few hundred bytes with an ellipsis and the input's length.
//! - [`terminal_safe`] is for text on its way to a terminal: control characters other than
//!   newline and tab, and the Unicode controls that reorder or hide text, become `\u001b`
//!   escapes. That spelling is also a JSON escape of the same character, so the one function
//!   serves the JSON reports too: inside a JSON string it changes how the text is written, not
//!   what it says (and JSON has no raw control character anywhere else).

use std::borrow::Cow;

/// At most this many characters of an input are quoted by [`quoted`].
pub const QUOTED_CHARS: usize = 60;
/// ... and at most this many bytes once escaped (a character escapes to up to 10 bytes).
pub const QUOTED_BYTES: usize = 200;

/// `text` as a message quotes it: in Rust's debug quotes, cut after [`QUOTED_CHARS`]
/// characters or [`QUOTED_BYTES`] bytes of the quoted form, whichever comes first, then
/// `... (N bytes)` with the input's whole length. A 100 MB field makes a one-line message.
pub fn quoted(text: &str) -> String {
    let mut out = String::from("\"");
    for (n, c) in text.chars().enumerate() {
        // As `{:?}` of a str writes it: a single quote needs no escape inside double quotes.
        let escaped: String = if c == '\'' { "'".into() } else { c.escape_debug().collect() };
        if n == QUOTED_CHARS || out.len() + escaped.len() > QUOTED_BYTES {
            out.push_str(&format!("\"... ({} bytes)", text.len()));
            return out;
        }
        out.push_str(&escaped);
    }
    out.push('"');
    out
}

/// `text` itself when it is short and plain (a policy's name, a workload's spec as people
/// write them), else [`quoted`]: for messages that name what the user gave in passing.
pub fn excerpt(text: &str) -> Cow<'_, str> {
    let plain =
        text.chars().take(QUOTED_CHARS + 1).enumerate().all(|(n, c)| {
            n < QUOTED_CHARS && c.escape_debug().len() == 1 && !is_unsafe(c) && c != '"'
        });
    if plain {
        Cow::Borrowed(text)
    } else {
        Cow::Owned(quoted(text))
    }
}

/// Long lines of a message made by a library that quotes whole (clap's usage errors): each
/// line over [`QUOTED_BYTES`] bytes cut there, with an ellipsis and its length in bytes.
pub fn cut_lines(text: &str) -> Cow<'_, str> {
    if text.lines().all(|l| l.len() <= QUOTED_BYTES) {
        return Cow::Borrowed(text);
    }
    let mut out = String::new();
    for line in text.split_inclusive('\n') {
        let body = line.trim_end_matches('\n');
        if body.len() <= QUOTED_BYTES {
            out.push_str(line);
            continue;
        }
        let mut end = QUOTED_BYTES;
        while !body.is_char_boundary(end) {
            end -= 1;
        }
        out.push_str(&format!("{}... ({} bytes)", &body[..end], body.len()));
        out.push_str(&line[body.len()..]);
    }
    Cow::Owned(out)
}

/// Whether a terminal could take `c` as a command or as a change to how the text around it
/// shows: C0 controls but newline and tab, DEL, C1 controls (U+009B is CSI to some terminals),
/// the bidirectional overrides and isolates, and the line and paragraph separators.
fn is_unsafe(c: char) -> bool {
    (c.is_control() && c != '\n' && c != '\t')
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `text` with every character a terminal could act on ([`is_unsafe`]) written as `\uXXXX`;
/// borrowed when there is none, which is nearly always.
pub fn terminal_safe(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_unsafe) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if is_unsafe(c) {
            out.push_str(&format!("\\u{:04x}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::{cut_lines, excerpt, quoted, terminal_safe, QUOTED_BYTES};

    #[test]
    fn excerpts_are_plain_names_or_quotes() {
        assert_eq!(excerpt("pytorch"), "pytorch");
        assert_eq!(excerpt("bfc[max:1]"), "bfc[max:1]");
        assert_eq!(excerpt("a\u{1b}b"), "\"a\\u{1b}b\"");
        assert_eq!(excerpt(&"y".repeat(61)), format!("\"{}\"... (61 bytes)", "y".repeat(60)));
        assert_eq!(excerpt(&"y".repeat(60)), "y".repeat(60));
    }

    #[test]
    fn long_lines_are_cut() {
        assert_eq!(cut_lines("short\nlines\n"), "short\nlines\n");
        let long = format!("error: invalid value '{}' for x\n\nmore\n", "é".repeat(100_000));
        let cut = cut_lines(&long);
        let first = cut.lines().next().unwrap();
        assert!(
            first.len() <= QUOTED_BYTES + 20 && first.ends_with("... (200029 bytes)"),
            "{first}"
        );
        assert!(cut.ends_with("\n\nmore\n"), "{cut}");
    }

    #[test]
    fn quotes_are_cut_on_a_character_boundary() {
        assert_eq!(quoted("allocate"), "\"allocate\"");
        assert_eq!(quoted("it's \"x\"\n"), format!("{:?}", "it's \"x\"\n"));
        let long = "é".repeat(1000);
        let q = quoted(&long);
        assert_eq!(q, format!("\"{}\"... (2000 bytes)", "é".repeat(60)));
    }

    #[test]
    fn quotes_of_escapes_stay_short() {
        let hostile = "\u{1b}]0;title\u{7}".repeat(100_000);
        let q = quoted(&hostile);
        assert!(q.len() <= QUOTED_BYTES + 30, "{q}");
        assert!(q.starts_with("\"\\u{1b}]0;title\\u{7}") && q.ends_with("\"... (1000000 bytes)"));
        assert!(!q.contains('\u{1b}'));
    }

    #[test]
    fn terminals_see_escapes_not_controls() {
        assert!(matches!(terminal_safe("plain\ttext\n"), std::borrow::Cow::Borrowed(_)));
        assert_eq!(
            terminal_safe("a\u{1b}]0;pwned\u{7}b\r\u{9b}2J\u{7f}\u{202e}\u{2028}"),
            "a\\u001b]0;pwned\\u0007b\\u000d\\u009b2J\\u007f\\u202e\\u2028"
        );
    }

    /// Inside a JSON string the escape is the same character, so a JSON report stays valid
    /// and says the same.
    #[test]
    fn the_escapes_are_json_escapes() {
        let raw = "\"name\": \"x\u{9b}y\u{202e}z\"";
        assert_eq!(terminal_safe(raw), "\"name\": \"x\\u009by\\u202ez\"");
    }
}
