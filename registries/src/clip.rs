//! Bounding text from clients, files and registries before it is echoed in a
//! log line or an error message: a 20 MB config value once made a 20 MB WARN
//! line. Values are cut to [`LOG_VALUE_MAX`] bytes (at a character boundary)
//! and marked with their full length; whole messages get a wider bound.

use std::borrow::Cow;

/// The most bytes of one echoed value.
pub const LOG_VALUE_MAX: usize = 256;
/// The most bytes of one whole error or warning message.
pub const LOG_MESSAGE_MAX: usize = 1024;

/// `s` cut to [`LOG_VALUE_MAX`] bytes, e.g. `xxxx…[20000000 bytes]`.
pub fn clip(s: &str) -> Cow<'_, str> {
    clip_to(s, LOG_VALUE_MAX)
}

/// `s` cut to at most `max` bytes plus a short marker giving its length.
pub fn clip_to(s: &str, max: usize) -> Cow<'_, str> {
    if s.len() <= max {
        return Cow::Borrowed(s);
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}…[{} bytes]", &s[..end], s.len()))
}

/// [`clip_to`] for an owned message: no copy when it is short enough.
pub fn clip_owned(s: String, max: usize) -> String {
    match clip_to(&s, max) {
        Cow::Borrowed(_) => s,
        Cow::Owned(clipped) => clipped,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_borrowed_unchanged() {
        assert!(matches!(clip("abc"), Cow::Borrowed("abc")));
        let exact = "x".repeat(LOG_VALUE_MAX);
        assert_eq!(clip(&exact), exact.as_str());
    }

    #[test]
    fn long_text_is_cut_and_marked_with_its_length() {
        let long = "x".repeat(20_000_000);
        let c = clip(&long);
        assert_eq!(c, format!("{}…[20000000 bytes]", "x".repeat(LOG_VALUE_MAX)));
        assert!(c.len() < LOG_VALUE_MAX + 32);
    }

    #[test]
    fn cut_respects_character_boundaries() {
        // 'é' is 2 bytes: 300 of them put byte 256 on a boundary, 255 not.
        let s = format!("a{}", "é".repeat(300));
        let c = clip(&s);
        assert!(c.starts_with('a') && c.ends_with(&format!("[{} bytes]", s.len())));
        assert_eq!(c.split('…').next().unwrap().len(), 255);
        for max in 0..8 {
            let c = clip_to("ééé", max);
            assert!(c.len() <= max + 16 || c == "ééé", "{max}: {c}");
        }
    }

    #[test]
    fn clip_owned_keeps_short_strings() {
        assert_eq!(clip_owned("short".into(), 10), "short");
        assert_eq!(clip_owned("0123456789abc".into(), 10), "0123456789…[13 bytes]");
    }
}
