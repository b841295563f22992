//! Unit tests of the mirror annotations' parser, malformed input above all.

use std::collections::BTreeMap;

use super::*;

/// `read` over `annotations` (full keys), as `IngressAnnotations` calls
/// the group readers, and the warnings it gave.
pub(in crate::translate::ingress) fn read_with<T>(
    annotations: &[(&str, &str)],
    read: impl FnOnce(&mut Lookup<'_>, &mut Vec<String>) -> T,
) -> (T, Vec<String>) {
    let map: BTreeMap<String, String> = annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let mut get = |key: &str, both: bool| -> Option<(String, String)> {
        let keys = if both {
            vec![format!("higress.io/{key}"), format!("nginx.ingress.kubernetes.io/{key}")]
        } else {
            vec![key.to_owned()]
        };
        keys.into_iter().find_map(|k| map.get(&k).map(|v| (k, v.clone())))
    };
    let mut warnings = Vec::new();
    let out = read(&mut get, &mut warnings);
    (out, warnings)
}

fn mirror(annotations: &[(&str, &str)]) -> (Option<Mirror>, Vec<String>) {
    read_with(annotations, read_mirror)
}

fn target(m: &(Option<Mirror>, Vec<String>)) -> Option<(&MirrorTarget, Option<u32>)> {
    m.0.as_ref().map(|m| (&m.target, m.percentage))
}

#[test]
fn service_forms_under_either_prefix() {
    let svc = |namespace: Option<&str>, name: &str, port| MirrorTarget::Service {
        namespace: namespace.map(str::to_owned),
        name: name.to_owned(),
        port,
    };
    let cases = [
        ("higress.io/mirror-target-service", "shadow", svc(None, "shadow", None)),
        ("nginx.ingress.kubernetes.io/mirror-target-service", "shadow:8080", svc(None, "shadow", Some(8080))),
        ("higress.io/mirror-target-service", "test/shadow:80", svc(Some("test"), "shadow", Some(80))),
        (
            "higress.io/mirror-target-service",
            "shadow.static:80",
            MirrorTarget::Registry { name: "shadow.static".into(), port: Some(80) },
        ),
    ];
    for (key, value, want) in cases {
        let got = mirror(&[(key, value)]);
        assert_eq!(target(&got), Some((&want, None)), "{key}: {value}");
        assert_eq!(got.0.unwrap().key, key);
        assert!(got.1.is_empty(), "{:?}", got.1);
    }
}

#[test]
fn fqdn_comes_first_with_port_80_by_default() {
    let got = mirror(&[
        ("higress.io/mirror-target-service", "shadow"),
        ("higress.io/mirror-target-fqdn", "Shadow.Example.com"),
    ]);
    let want = MirrorTarget::Fqdn { host: "shadow.example.com".into(), port: 80 };
    assert_eq!(target(&got), Some((&want, None)));
    let got = mirror(&[("higress.io/mirror-target-fqdn", "a.example"), ("higress.io/mirror-target-fqdn-port", "9000")]);
    assert_eq!(target(&got), Some((&MirrorTarget::Fqdn { host: "a.example".into(), port: 9000 }, None)));
}

#[test]
fn percentage_below_100_is_kept_and_100_is_all() {
    let key = "higress.io/mirror-target-service";
    let with = |p| mirror(&[(key, "shadow"), ("nginx.ingress.kubernetes.io/mirror-percentage", p)]);
    assert_eq!(with("25").0.unwrap().percentage, Some(25));
    assert_eq!(with(" 0 ").0.unwrap().percentage, Some(0));
    assert_eq!(with("100").0.unwrap().percentage, None);
    // A percentage alone mirrors nothing.
    assert_eq!(mirror(&[("higress.io/mirror-percentage", "50")]), (None, vec![]));
}

#[test]
fn bad_values_are_reported_and_leave_the_mirror_out() {
    let service = "higress.io/mirror-target-service";
    let cases: [(&[(&str, &str)], &str); 8] = [
        (
            &[(service, "shadow"), ("higress.io/mirror-percentage", "150")],
            "annotation higress.io/mirror-percentage: \"150\" is not a whole percentage from 0 to 100; mirror left out",
        ),
        (
            &[(service, "shadow"), ("higress.io/mirror-percentage", "-5")],
            "annotation higress.io/mirror-percentage: \"-5\" is not a whole percentage from 0 to 100; mirror left out",
        ),
        (
            &[(service, "shadow"), ("higress.io/mirror-percentage", "12.5")],
            "annotation higress.io/mirror-percentage: \"12.5\" is not a whole percentage from 0 to 100; mirror left out",
        ),
        (
            &[(service, "shadow:0")],
            "annotation higress.io/mirror-target-service: \"shadow:0\" has no port 1 to 65535 after ':'; mirror left out",
        ),
        (
            &[(service, "shadow:http")],
            "annotation higress.io/mirror-target-service: \"shadow:http\" has no port 1 to 65535 after ':'; mirror left out",
        ),
        (
            &[(service, "Bad_Name")],
            "annotation higress.io/mirror-target-service: \"Bad_Name\" is not [namespace/]service[:port] nor a registry service; mirror left out",
        ),
        (
            &[(service, "a/b/c")],
            "annotation higress.io/mirror-target-service: \"a/b/c\" is not [namespace/]service[:port] nor a registry service; mirror left out",
        ),
        (
            &[("higress.io/mirror-target-fqdn", "a..example")],
            "annotation higress.io/mirror-target-fqdn: \"a..example\" is not a host name; mirror left out",
        ),
    ];
    for (annotations, want) in cases {
        assert_eq!(mirror(annotations), (None, vec![want.to_owned()]), "{annotations:?}");
    }
    let bad_port =
        mirror(&[("higress.io/mirror-target-fqdn", "a.example"), ("higress.io/mirror-target-fqdn-port", "70000")]);
    assert_eq!(
        bad_port.1,
        ["annotation higress.io/mirror-target-fqdn-port: \"70000\" is not a port (1 to 65535); mirror left out"]
    );
}

fn ranges(annotations: &[(&str, &str)]) -> (Option<SourceRanges>, Vec<String>) {
    read_with(annotations, read_source_ranges)
}

fn cidr_of(address: &str, prefix_len: u8) -> Cidr {
    Cidr { address: address.parse().unwrap(), prefix_len }
}

#[test]
fn source_ranges_cidrs_and_bare_addresses_under_either_prefix() {
    assert_eq!(ranges(&[]), (None, vec![]));
    let (r, w) = ranges(&[
        ("nginx.ingress.kubernetes.io/whitelist-source-range", "10.0.0.0/8, 127.0.0.1 ,2001:db8::/32"),
        ("higress.io/denylist-source-range", "10.1.2.3/32"),
    ]);
    assert!(w.is_empty(), "{w:?}");
    let want = SourceRanges {
        allow: Some(vec![cidr_of("10.0.0.0", 8), cidr_of("127.0.0.1", 32), cidr_of("2001:db8::", 32)]),
        deny: vec![cidr_of("10.1.2.3", 32)],
    };
    assert_eq!(r, Some(want));
    let (r, _) = ranges(&[("higress.io/denylist-source-range", "::1")]);
    assert_eq!(r, Some(SourceRanges { allow: None, deny: vec![cidr_of("::1", 128)] }));
}

#[test]
fn bad_source_ranges_are_left_out_and_an_empty_allow_list_denies_all() {
    let key = "higress.io/whitelist-source-range";
    let (r, w) = ranges(&[(key, "10.0.0.0/33, 127.0.0.1/32, 1.2.3/8, 10.0.0.0/, ::1/129, 10.0.0.0/-1")]);
    assert_eq!(r, Some(SourceRanges { allow: Some(vec![cidr_of("127.0.0.1", 32)]), deny: vec![] }));
    let bad = ["10.0.0.0/33", "1.2.3/8", "10.0.0.0/", "::1/129", "10.0.0.0/-1"];
    let want: Vec<String> =
        bad.iter().map(|b| format!("annotation {key}: {b:?} is not an address or CIDR; left out")).collect();
    assert_eq!(w, want);
    let (r, w) = ranges(&[(key, "everyone")]);
    assert_eq!(r, Some(SourceRanges { allow: Some(vec![]), deny: vec![] }));
    assert_eq!(w.last().unwrap(), &format!("annotation {key}: no usable address; every client is denied"));
}
