//! Kubernetes naming rules that Pilot relies on but never reports, and the
//! object names given to service hosts. A leaf: every part of translation
//! may use it.

use crate::resources::content_hash;

/// RFC 1123 names, shared with the registries crate.
pub use meshbridge_registries::names::{is_dns1123_label, is_dns1123_subdomain};

/// `[prefix/]name`: prefix a DNS subdomain, name 1–63 alphanumerics with
/// `-_.` inside.
pub fn is_label_key(k: &str) -> bool {
    let (prefix, name) = match k.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    prefix.is_none_or(is_dns1123_subdomain) && !name.is_empty() && is_label_value(name)
}

/// Empty, or up to 63 alphanumerics with `-_.` inside.
pub fn is_label_value(v: &str) -> bool {
    v.len() <= 63
        && v.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && v.bytes().next().is_none_or(|b| b.is_ascii_alphanumeric())
        && v.bytes().last().is_none_or(|b| b.is_ascii_alphanumeric())
}

/// A Kubernetes object name for a service host. Hosts such as Dubbo's
/// `providers:com.example.Greeter:1.0.0:.zookeeper` are not valid names, and
/// Pilot drops invalid objects without a word; such hosts are lowercased,
/// every other character becomes `-`, and a hash of the host keeps two
/// hosts that sanitise alike apart.
/// The mesh host of Kubernetes Service `name` in `namespace`, as Istio
/// names it (Ingress backends, mirror targets, the gateway's Service
/// endpoints).
pub fn service_host(namespace: &str, name: &str) -> String {
    format!("{name}.{namespace}.svc.cluster.local")
}

pub fn object_name(host: &str) -> String {
    if is_dns1123_subdomain(host) {
        return host.to_string();
    }
    let mut name: String = host
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '.' || c == '-' { c.to_ascii_lowercase() } else { '-' })
        .collect();
    name = name.split('.').map(|l| l.trim_matches('-')).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(".");
    name.truncate(200);
    let name = name.trim_end_matches(['-', '.']);
    let hash = short_hash(host);
    if name.is_empty() { format!("host-{hash}") } else { format!("{name}-{hash}") }
}

/// The first 8 hex digits of the content hash: enough to keep names apart.
pub fn short_hash(s: &str) -> String {
    content_hash(s.as_bytes())[..8].to_owned()
}

/// Lowercase letters, digits and `-`, at most 200 characters (room for a
/// hash suffix within Kubernetes' 253).
pub fn sanitize(s: &str) -> String {
    let mapped: String =
        s.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).collect();
    let trimmed = mapped.trim_matches('-');
    match trimmed {
        "" => "host".into(),
        t if t.len() > 200 => format!("{}-{}", t[..191].trim_end_matches('-'), short_hash(s)),
        t => t.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_hosts_get_valid_distinct_names() {
        assert_eq!(object_name("web.dc1.consul"), "web.dc1.consul");
        let a = object_name("providers:com.example.Greeter:1.0.0:.zookeeper");
        let b = object_name("providers:com.example.Greeter:1.0.0:g.zookeeper");
        assert!(a.starts_with("providers-com.example.greeter-1.0.0.zookeeper-"), "{a}");
        assert!(is_dns1123_subdomain(&a) && is_dns1123_subdomain(&b), "{a} {b}");
        assert_ne!(a, b);
        assert!(is_dns1123_subdomain(&object_name("Bad_Host.dc1.consul")));
        assert!(is_dns1123_subdomain(&object_name(":::")));
    }

    #[test]
    fn label_rules() {
        assert!(is_label_key("higress-registry-type"));
        assert!(is_label_key("app.kubernetes.io/name"));
        assert!(!is_label_key("bad key"));
        assert!(!is_label_key("-x"));
        assert!(is_label_value(""));
        assert!(!is_label_value(&"a".repeat(64)));
        assert!(!is_label_value("x/y"));
    }
}
