//! Dubbo providers as they sit in ZooKeeper: one node per provider under
//! `/dubbo/{interface}/providers`, named by the provider's URL, encoded once
//! with Java's `URLEncoder` (form encoding: `+` is a space), e.g.
//! `dubbo%3A%2F%2F10.0.0.1%3A20880%2Fcom.foo.Greeter%3Fversion%3D1.0.0%26weight%3D5`.
//!
//! Pure: node name in, endpoint or a reason out. Nothing here may panic,
//! whatever the node name (see the property tests below).

use std::collections::HashMap;
use std::net::Ipv6Addr;

use percent_encoding::percent_decode_str;

use crate::labels;
use crate::model::Endpoint;
use crate::shared::intern;

/// The only scheme Higress reads under `/dubbo` (its parser cuts the
/// `providers/dubbo://` prefix); `tri://` or `rest://` providers are skipped.
const SCHEME: &str = "dubbo";
/// Higress's stand-in for a provider that states no version.
const NO_VERSION: &str = "0.0.0";
/// Every Dubbo endpoint carries this label, whatever its URL says (Higress
/// sets `protocol=dubbo` after copying the query).
const PROTOCOL_LABEL: (&str, &str) = ("protocol", "dubbo");

/// A provider URL taken apart: `scheme://[user@]host:port/path?query`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProviderUrl {
    pub scheme: String,
    /// An IP literal (IPv6 without brackets) or a host name.
    pub host: String,
    pub port: u16,
    /// Usually the interface name; not used for naming (the ZooKeeper path is).
    pub path: String,
    /// Query parameters in URL order. Values are not decoded a second time.
    pub params: Vec<(String, String)>,
}

/// Why a provider node was skipped. Messages never quote the node: it may
/// carry credentials in its user-info part.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum UrlError {
    /// The node name is not form-encoded UTF-8.
    #[error("not percent-encoded UTF-8")]
    Encoding,
    /// No `scheme://`.
    #[error("not a URL (no scheme://)")]
    NoScheme,
    /// A scheme other than `dubbo`.
    #[error("scheme {0:?} is not dubbo")]
    Scheme(String),
    /// Nothing before the port.
    #[error("no host")]
    NoHost,
    /// A bracketed host that is not an IPv6 address, or an unbracketed one.
    #[error("bad IPv6 address")]
    Ipv6,
    /// No port, or not 1..65535.
    #[error("no valid port")]
    Port,
}

/// Decode and take apart one provider node name.
pub(crate) fn parse_url(node: &str) -> Result<ProviderUrl, UrlError> {
    let plus_as_space = node.replace('+', " ");
    let url = percent_decode_str(&plus_as_space).decode_utf8().map_err(|_| UrlError::Encoding)?;
    let url = url.split_once('#').map_or(&*url, |(before, _)| before);
    let (scheme, rest) = url.split_once("://").ok_or(UrlError::NoScheme)?;
    if !is_scheme(scheme) {
        return Err(UrlError::NoScheme);
    }
    if !scheme.eq_ignore_ascii_case(SCHEME) {
        return Err(UrlError::Scheme(scheme.chars().take(16).collect()));
    }
    let (before_query, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (authority, path) = before_query.split_once('/').unwrap_or((before_query, ""));
    // User info may hold a password: drop it here, it goes nowhere.
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
    let (host, port) = split_host_port(host_port)?;
    let params = query
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| kv.split_once('=').unwrap_or((kv, "")))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Ok(ProviderUrl { scheme: scheme.to_string(), host, port, path: path.to_string(), params })
}

fn is_scheme(s: &str) -> bool {
    let mut bytes = s.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_alphabetic())
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'))
}

fn split_host_port(s: &str) -> Result<(String, u16), UrlError> {
    let (host, port) = if let Some(bracketed) = s.strip_prefix('[') {
        let (ip, after) = bracketed.split_once(']').ok_or(UrlError::Ipv6)?;
        let ip: Ipv6Addr = ip.parse().map_err(|_| UrlError::Ipv6)?;
        (ip.to_string(), after.strip_prefix(':').ok_or(UrlError::Port)?)
    } else {
        let (host, port) = s.rsplit_once(':').ok_or(UrlError::Port)?;
        if host.contains(':') {
            return Err(UrlError::Ipv6);
        }
        (host.to_string(), port)
    };
    if host.is_empty() {
        return Err(UrlError::NoHost);
    }
    let port = port
        .bytes()
        .all(|b| b.is_ascii_digit())
        .then(|| port.parse::<u16>().ok())
        .flatten()
        .filter(|p| *p != 0)
        .ok_or(UrlError::Port)?;
    Ok((host, port))
}

/// Longest node name we log, in characters.
const MAX_LOGGED: usize = 300;

/// A provider node name fit for logs: decoded where possible, user info
/// (which may hold a password) masked, and cut to a sane length.
pub(crate) fn redact(node: &str) -> String {
    let decoded = percent_decode_str(&node.replace('+', " ")).decode_utf8_lossy().into_owned();
    let masked = match decoded.split_once("://") {
        Some((scheme, rest)) => {
            let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
            match rest[..end].rfind('@') {
                Some(at) => format!("{scheme}://***@{}", &rest[at + 1..]),
                None => decoded,
            }
        }
        None if decoded.contains('@') => "<not shown: has user info>".into(),
        None => decoded,
    };
    masked.chars().take(MAX_LOGGED).collect()
}

/// One provider, ready for the mesh.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Provider {
    /// Mesh host: `providers:{interface}:{version}:{group}.zookeeper`.
    pub host: String,
    /// Address may still be a host name; the reader resolves it.
    pub endpoint: Endpoint,
    /// Query parameters left out of the labels (not valid as Kubernetes
    /// labels, or given more than once).
    pub dropped_labels: usize,
    /// False for a provider Dubbo's admin has switched off: `enabled=false`
    /// or `disabled=true` in its URL.
    pub serving: bool,
}

/// The provider node `node` of `interface`.
pub(crate) fn provider(interface: &str, node: &str) -> Result<Provider, UrlError> {
    let url = parse_url(node)?;
    let first = |key: &str| url.params.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
    // Higress: a `version` given (even empty) is used as is; absent is 0.0.0.
    // The group is empty when absent, and the colon before it stays.
    let version = first("version").unwrap_or(NO_VERSION);
    let group = first("group").unwrap_or("");
    let host = format!("providers:{interface}:{version}:{group}.{}", super::tree::HOST_SUFFIX);
    let is = |key: &str, value: &str| first(key).is_some_and(|v| v.trim().eq_ignore_ascii_case(value));
    let serving = !is("enabled", "false") && !is("disabled", "true");
    let weight = match first("weight").and_then(|w| w.trim().parse::<i64>().ok()) {
        Some(w) if w > 0 => u32::try_from(w).unwrap_or(u32::MAX),
        _ => 1,
    };
    // Only single-valued parameters are labels, as in Higress.
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (k, _) in &url.params {
        *seen.entry(k.as_str()).or_default() += 1;
    }
    let mut repeated = 0;
    let mut single = Vec::with_capacity(url.params.len());
    for (k, v) in url.params.iter().filter(|(k, _)| k != PROTOCOL_LABEL.0) {
        if seen.get(k.as_str()).copied().unwrap_or(0) > 1 {
            repeated += 1;
        } else {
            single.push((k.as_str(), v.as_str()));
        }
    }
    let (mut labels, invalid) = labels::keep_valid(single);
    labels.insert(PROTOCOL_LABEL.0.to_string(), PROTOCOL_LABEL.1.to_string());
    let endpoint = Endpoint { address: url.host, port: url.port, weight, labels: intern(labels) };
    Ok(Provider { host, endpoint, dropped_labels: invalid + repeated, serving })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What Java's `URLEncoder.encode(s, "UTF-8")` produces, which is how
    /// Dubbo names provider nodes.
    fn java_url_encode(s: &str) -> String {
        let mut out = String::new();
        for b in s.bytes() {
            match b {
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'.' | b'-' | b'_' | b'*' => out.push(b as char),
                b' ' => out.push('+'),
                _ => out.push_str(&format!("%{b:02X}")),
            }
        }
        out
    }

    const REAL: &str = "dubbo%3A%2F%2F192.168.1.5%3A20880%2Forg.apache.dubbo.demo.DemoService%3Fanyhost%3Dtrue\
        %26application%3Ddemo-provider%26deprecated%3Dfalse%26dubbo%3D2.0.2%26dynamic%3Dtrue%26generic%3Dfalse\
        %26interface%3Dorg.apache.dubbo.demo.DemoService%26methods%3DsayHello%2CsayHelloAsync%26pid%3D12345\
        %26release%3D2.7.8%26side%3Dprovider%26timestamp%3D1600000000000";

    #[test]
    fn disabled_providers_are_not_serving() {
        let serving = |q: &str| {
            provider("com.foo.Greeter", &java_url_encode(&format!("dubbo://10.0.0.1:20880/x?{q}"))).unwrap().serving
        };
        assert!(serving("version=1"));
        assert!(serving("enabled=true&disabled=false"));
        assert!(!serving("enabled=false"));
        assert!(!serving("disabled=true"));
        assert!(!serving("version=1&disabled=TRUE"), "case does not matter");
    }

    #[test]
    fn a_real_dubbo_2_7_node() {
        let url = parse_url(REAL).unwrap();
        assert_eq!((url.scheme.as_str(), url.host.as_str(), url.port), ("dubbo", "192.168.1.5", 20880));
        assert_eq!(url.path, "org.apache.dubbo.demo.DemoService");
        assert_eq!(url.params[7], ("methods".to_string(), "sayHello,sayHelloAsync".to_string()));

        let p = provider("org.apache.dubbo.demo.DemoService", REAL).unwrap();
        assert_eq!(p.host, "providers:org.apache.dubbo.demo.DemoService:0.0.0:.zookeeper");
        assert_eq!(p.endpoint.weight, 1);
        assert_eq!(p.endpoint.labels["protocol"], "dubbo");
        assert_eq!(p.endpoint.labels["application"], "demo-provider");
        assert_eq!(p.endpoint.labels["timestamp"], "1600000000000");
        assert!(!p.endpoint.labels.contains_key("methods"), "a comma is not a label value");
        assert_eq!(p.dropped_labels, 1);
    }

    #[test]
    fn host_follows_higress_version_and_group() {
        let host =
            |q: &str| provider("com.foo.Greeter", &java_url_encode(&format!("dubbo://10.0.0.1:1/x?{q}"))).unwrap().host;
        assert_eq!(host(""), "providers:com.foo.Greeter:0.0.0:.zookeeper");
        assert_eq!(host("version=1.0.0"), "providers:com.foo.Greeter:1.0.0:.zookeeper");
        assert_eq!(host("group=blue"), "providers:com.foo.Greeter:0.0.0:blue.zookeeper");
        assert_eq!(host("group=blue&version=2"), "providers:com.foo.Greeter:2:blue.zookeeper");
        // Present but empty is used as is, like Higress does.
        assert_eq!(host("version="), "providers:com.foo.Greeter::.zookeeper");
        assert_eq!(host("version=1&version=2"), "providers:com.foo.Greeter:1:.zookeeper", "first value");
    }

    #[test]
    fn weight_labels_and_protocol() {
        let p = |q: &str| provider("i", &java_url_encode(&format!("dubbo://10.0.0.1:20880/i?{q}"))).unwrap();
        assert_eq!(p("weight=7").endpoint.weight, 7);
        for w in ["weight=0", "weight=-3", "weight=x", "weight="] {
            assert_eq!(p(w).endpoint.weight, 1, "{w}");
        }
        assert_eq!(p("weight=99999999999").endpoint.weight, u32::MAX);
        let multi = p("tag=a&tag=b&side=provider&protocol=tri&flag");
        assert!(!multi.endpoint.labels.contains_key("tag"), "multi-valued parameters are not labels");
        assert_eq!(multi.endpoint.labels["side"], "provider");
        assert_eq!(multi.endpoint.labels["flag"], "");
        assert_eq!(multi.endpoint.labels["protocol"], "dubbo", "always dubbo, as in Higress");
        assert_eq!(multi.dropped_labels, 2);
    }

    #[test]
    fn authority_forms() {
        let url = |s: &str| parse_url(&java_url_encode(s));
        assert_eq!(url("dubbo://[fe80::1]:20880/i").unwrap().host, "fe80::1");
        assert_eq!(url("dubbo://admin:s3cret@10.0.0.1:20880/i").unwrap().host, "10.0.0.1");
        assert_eq!(url("DUBBO://provider.local:1").unwrap().host, "provider.local");
        assert_eq!(url("dubbo://10.0.0.1:20880?a=b").unwrap().params, vec![("a".into(), "b".into())]);
        assert_eq!(url("dubbo://10.0.0.1:20880/i#frag").unwrap().path, "i");
        // Spaces were `+`; a literal plus was %2B.
        let spaced = parse_url("dubbo%3A%2F%2F10.0.0.1%3A1%2Fi%3Fnote%3Da+b%2Bc").unwrap();
        assert_eq!(spaced.params, vec![("note".into(), "a b+c".into())]);
    }

    #[test]
    fn malformed_nodes_are_errors() {
        let cases = [
            ("%FF%FE", UrlError::Encoding),
            ("not-a-url", UrlError::NoScheme),
            ("://10.0.0.1:1", UrlError::NoScheme),
            ("tri://10.0.0.1:50051/i", UrlError::Scheme("tri".into())),
            ("dubbo://:20880/i", UrlError::NoHost),
            ("dubbo://10.0.0.1/i", UrlError::Port),
            ("dubbo://10.0.0.1:0/i", UrlError::Port),
            ("dubbo://10.0.0.1:65536/i", UrlError::Port),
            ("dubbo://10.0.0.1:+80/i", UrlError::Port),
            ("dubbo://10.0.0.1:/i", UrlError::Port),
            ("dubbo://fe80::1:20880/i", UrlError::Ipv6),
            ("dubbo://[not-v6]:20880/i", UrlError::Ipv6),
            ("dubbo://[::1]/i", UrlError::Port),
            ("dubbo://[::1", UrlError::Ipv6),
        ];
        for (node, want) in cases {
            let encoded = if node.starts_with('%') { node.to_string() } else { java_url_encode(node) };
            assert_eq!(parse_url(&encoded), Err(want), "{node}");
        }
        let secret = parse_url(&java_url_encode("dubbo://u:topsecret@[x]:1")).unwrap_err();
        assert!(!secret.to_string().contains("topsecret"));
    }

    #[test]
    fn redact_hides_user_info() {
        let node = java_url_encode("dubbo://admin:topsecret@10.0.0.1:20880/i?a=b");
        assert_eq!(redact(&node), "dubbo://***@10.0.0.1:20880/i?a=b");
        assert!(!redact(&java_url_encode("x:topsecret@h")).contains("topsecret"));
        assert_eq!(redact("%FFok").chars().count(), 3, "lossy, not an error");
        assert_eq!(redact(&"a".repeat(1000)).len(), MAX_LOGGED);
    }

    fn ip() -> impl Strategy<Value = (String, String)> {
        prop_oneof![
            any::<[u8; 4]>().prop_map(|o| {
                let s = std::net::Ipv4Addr::from(o).to_string();
                (s.clone(), s)
            }),
            any::<[u16; 8]>().prop_map(|s| {
                let ip = Ipv6Addr::from(s).to_string();
                (format!("[{ip}]"), ip)
            }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn any_string_parses_or_errs(node in any::<String>()) {
            let _ = parse_url(&node);
            let _ = provider("com.foo.Greeter", &node);
            let _ = redact(&node);
        }

        #[test]
        fn url_like_strings_parse_or_err(node in "(dubbo|tri|)(://)?(\\[[0-9a-f:]{0,12}\\]?|[a-z0-9.@:]{0,12})(:[0-9+-]{0,6})?(/[a-z./]{0,8})?(\\?[a-z=&%+,]{0,16})?") {
            let _ = parse_url(&node);
            let _ = provider("i", &java_url_encode(&node));
        }

        #[test]
        fn well_formed_urls_round_trip(
            (written, host) in ip(),
            port in 1u16..,
            path in "[a-zA-Z][a-zA-Z0-9_.]{0,30}",
            params in proptest::collection::btree_map("[a-z][a-z0-9._-]{0,10}", "[a-zA-Z0-9 ._,:/-]{0,12}", 0..8),
        ) {
            let query: Vec<String> = params.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let url = format!("dubbo://{written}:{port}/{path}?{}", query.join("&"));
            let parsed = parse_url(&java_url_encode(&url)).unwrap();
            prop_assert_eq!(parsed.host, host);
            prop_assert_eq!(parsed.port, port);
            prop_assert_eq!(parsed.path, path);
            let want: Vec<(String, String)> = params.into_iter().collect();
            prop_assert_eq!(parsed.params, want);
        }
    }
}
