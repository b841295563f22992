//! Which registry metadata may become endpoint labels: only what Kubernetes
//! accepts as a label, so that Istio never rejects an object for it.
//!
//! The same rules as `consul::decode` (which keeps them private); both should
//! move to one crate-level module.

use std::collections::BTreeMap;

/// Keep the pairs that are valid Kubernetes labels; return them and how many
/// were dropped.
pub(crate) fn keep_valid<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> (BTreeMap<String, String>, usize) {
    let mut labels = BTreeMap::new();
    let mut dropped = 0;
    for (key, value) in pairs {
        if is_valid_label_key(key) && is_valid_label_value(value) {
            labels.insert(key.to_string(), value.to_string());
        } else {
            dropped += 1;
        }
    }
    (labels, dropped)
}

/// A Kubernetes label key: an optional DNS-subdomain prefix and `/`, then a
/// name of at most 63 characters (alphanumerics, `-`, `_`, `.`, starting and
/// ending alphanumeric).
pub(crate) fn is_valid_label_key(key: &str) -> bool {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    let prefix_ok = prefix.is_none_or(|p| {
        p.len() <= 253
            && p.split('.').all(|part| {
                !part.is_empty()
                    && part.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !part.starts_with('-')
                    && !part.ends_with('-')
            })
    });
    prefix_ok && !name.is_empty() && is_label_name(name)
}

/// A Kubernetes label value: empty, or a name as in [`is_valid_label_key`].
pub(crate) fn is_valid_label_value(value: &str) -> bool {
    value.is_empty() || is_label_name(value)
}

fn is_label_name(s: &str) -> bool {
    let bytes = s.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            bytes.len() <= 63
                && first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && bytes.iter().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_rules() {
        for ok in ["a", "version", "app.kubernetes.io/name", "x_y-z.1", "example.com/A"] {
            assert!(is_valid_label_key(ok), "{ok}");
        }
        let long = "a".repeat(64);
        for bad in ["", "_x", "x-", "a/b/c", "/x", "Upper.Com/x", "has space", long.as_str()] {
            assert!(!is_valid_label_key(bad), "{bad}");
        }
        assert!(is_valid_label_value(""));
        assert!(is_valid_label_value("v1.2_3-rc"));
        assert!(!is_valid_label_value("a,b"));
        assert!(!is_valid_label_value(&long));
    }

    #[test]
    fn keep_valid_counts_what_it_drops() {
        let (labels, dropped) = keep_valid([("app", "demo"), ("methods", "a,b"), ("", "x"), ("side", "")]);
        assert_eq!(labels.len(), 2);
        assert_eq!(labels["side"], "");
        assert_eq!(dropped, 2);
    }
}
