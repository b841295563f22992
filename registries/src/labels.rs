//! Which registry metadata may become endpoint labels: only what Kubernetes
//! accepts as a label, so that Istio never rejects an object for it. Every
//! watcher that turns metadata into labels uses these rules.

use std::collections::BTreeMap;

use crate::names::is_dns1123_subdomain;

/// Keep the pairs that are valid Kubernetes labels; return them and how many
/// were dropped.
pub(crate) fn keep_valid<K, V>(pairs: impl IntoIterator<Item = (K, V)>) -> (BTreeMap<String, String>, usize)
where
    K: AsRef<str> + Into<String>,
    V: AsRef<str> + Into<String>,
{
    let mut labels = BTreeMap::new();
    let mut dropped = 0;
    for (key, value) in pairs {
        if is_valid_label_key(key.as_ref()) && is_valid_label_value(value.as_ref()) {
            labels.insert(key.into(), value.into());
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
    prefix.is_none_or(is_dns1123_subdomain) && is_label_name(name)
}

/// A Kubernetes label value: empty, or a name as in [`is_valid_label_key`].
pub(crate) fn is_valid_label_value(value: &str) -> bool {
    value.is_empty() || is_label_name(value)
}

/// Not empty, at most 63 characters, alphanumerics, `-`, `_` and `.`,
/// starting and ending alphanumeric.
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
        for bad in ["", "_x", "x-", "a/b/c", "/x", "Upper.Com/x", "has space", "@class", long.as_str()] {
            assert!(!is_valid_label_key(bad), "{bad}");
        }
        assert!(is_valid_label_value(""));
        assert!(is_valid_label_value("v1.2_3-rc"));
        for bad in ["a b", "a,b", "-a", long.as_str()] {
            assert!(!is_valid_label_value(bad), "{bad}");
        }
    }

    #[test]
    fn keep_valid_counts_what_it_drops() {
        let (labels, dropped) = keep_valid([("app", "demo"), ("methods", "a,b"), ("", "x"), ("side", "")]);
        assert_eq!(labels.len(), 2);
        assert_eq!(labels["side"], "");
        assert_eq!(dropped, 2);
        // Owned pairs (a metadata map) are moved, not copied.
        let meta = BTreeMap::from([("version".to_string(), "v1".to_string()), ("_private".into(), "x".into())]);
        assert_eq!(keep_valid(meta), (BTreeMap::from([("version".to_string(), "v1".to_string())]), 1));
    }
}
