//! Name rules shared by the watchers and the binary: RFC 1123 labels and
//! subdomains (what Kubernetes checks object names and label-key prefixes
//! against), host names, and the Higress rule for turning registry names
//! into host parts. One definition, so every part of meshbridge agrees on
//! what a valid name is.

/// An RFC 1123 label as Kubernetes checks it: 1 to 63 lowercase letters,
/// digits and `-`, starting and ending with a letter or digit.
pub fn is_dns1123_label(s: &str) -> bool {
    let ok = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = s.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(&first), Some(&last)) => {
            bytes.len() <= 63 && ok(first) && ok(last) && bytes.iter().all(|&b| ok(b) || b == b'-')
        }
        _ => false,
    }
}

/// An RFC 1123 subdomain as Kubernetes checks it: at most 253 characters
/// of dot-separated [`is_dns1123_label`]s.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns1123_label)
}

/// A host name as DNS takes it: labels of letters (any case), digits and
/// `-`, not starting or ending with `-`, with an optional final dot.
pub fn is_host_name(s: &str) -> bool {
    let s = s.strip_suffix('.').unwrap_or(s);
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

/// Replace characters that are not valid in a DNS label the way Higress does
/// when it builds host names (`_` becomes `-`).
pub fn host_part(s: &str) -> String {
    s.replace('_', "-")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_subdomains() {
        for good in ["a", "web-1", "0", &"a".repeat(63)] {
            assert!(is_dns1123_label(good), "{good}");
        }
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", &"a".repeat(64)] {
            assert!(!is_dns1123_label(bad), "{bad}");
        }
        assert!(is_dns1123_subdomain("example.com"));
        assert!(is_dns1123_subdomain("a.b-c.d"));
        for bad in ["", "a..b", ".a", "a.", "Example.com", &format!("{}.a", "a".repeat(253))] {
            assert!(!is_dns1123_subdomain(bad), "{bad}");
        }
    }

    #[test]
    fn host_names() {
        assert!(is_host_name("Consul.service.DC1"));
        assert!(is_host_name("localhost."));
        assert!(is_host_name("10.0.0.1"));
        for bad in ["", ".", "a..b", "-a.b", "a_b", "a b", &"a".repeat(64)] {
            assert!(!is_host_name(bad), "{bad}");
        }
        assert_eq!(host_part("pay_api"), "pay-api");
    }
}
