//! The Ingress model: creation times, the API object against its JSON
//! form, lenient annotations, and the `higress.io/destination` parser
//! (malformed input above all).

use serde_json::json;

use super::*;

fn created(ts: &str) -> Option<Result<Timestamp, String>> {
    let ingress = parse(&json!({"metadata": {"creationTimestamp": ts}})).expect("an Ingress");
    ingress.metadata.created().map(|r| r.map_err(|e| e.0.clone()))
}

fn secs(ts: &str) -> (i64, i32) {
    let t = created(ts).expect("a time").expect("RFC 3339");
    (t.as_second(), t.subsec_nanosecond())
}

#[test]
fn creation_timestamps_parse_and_compare_across_offsets() {
    assert_eq!(secs("1970-01-01T00:00:00Z"), (0, 0));
    assert_eq!(secs("2024-02-29T12:00:00Z"), (1_709_208_000, 0));
    assert_eq!(secs("2024-02-29T14:00:00+02:00"), secs("2024-02-29T12:00:00Z"));
    assert_eq!(secs("2024-02-29T12:00:00.5Z"), (1_709_208_000, 500_000_000));
    assert!(secs("2024-01-01T00:00:00Z") < secs("2024-01-01T00:00:01Z"));
    for bad in [
        "",
        "2024-01-01",
        "2024-13-01T00:00:00Z",
        "2024-01-01T00:00:00",
        "2024-01-01T00:00:00.Z",
        "x".repeat(30).as_str(),
        "2024-01-01T00:00:00+0200",
        "2024-01-01T00:00:00Z[Europe/Paris]",
        "٢٠٢٤-01-01T00:00:00Z",
    ] {
        assert_eq!(created(bad), Some(Err(bad.to_owned())), "{bad}");
    }
    assert_eq!(parse(&json!({"metadata": {}})).expect("an Ingress").metadata.created(), None);
}

#[test]
fn the_api_object_and_its_json_form_give_the_same_ingress() {
    let object = json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"name": "shop", "namespace": "shop", "creationTimestamp": "2024-02-29T12:00:00Z",
            "annotations": {"higress.io/destination": "80% web.dc1.consul:8080 v1\n20% web.dc1.consul:8080 v2",
                            "nginx.ingress.kubernetes.io/ssl-redirect": "false"}},
        "spec": {"ingressClassName": "higress",
            "defaultBackend": {"service": {"name": "fallback", "port": {"name": "http"}}},
            "tls": [{"hosts": ["shop.example.com"], "secretName": "shop-tls"}],
            "rules": [{"host": "shop.example.com", "http": {"paths": [
                {"path": "/", "pathType": "Prefix", "backend": {"resource": {
                    "apiGroup": "networking.higress.io", "kind": "McpBridge", "name": "default"}}},
                {"path": "/api", "pathType": "Exact", "backend": {"service": {"name": "api", "port": {"number": 8080}}}},
            ]}}, {"http": {"paths": []}}]},
    });
    let api: k8s::Ingress = serde_json::from_value(object.clone()).expect("a valid Ingress");
    let from_json = parse(&object).expect("an Ingress");
    assert_eq!(from_api(&api, None), from_json);
    let dest = from_json.metadata.destination().expect("annotated").as_ref().expect("valid");
    assert_eq!(
        dest.iter().map(|d| (d.weight, d.subset.as_deref())).collect::<Vec<_>>(),
        [(80, Some("v1")), (20, Some("v2"))]
    );
    let classed = from_api(&api, Some("other"));
    assert_eq!(classed.spec.ingress_class_name.as_deref(), Some("other"));
}

#[test]
fn scalar_and_null_annotations_read_as_text() {
    let ingress =
        parse(&json!({"metadata": {"annotations": {"a": true, "b": 3, "c": null, "d": "x"}}})).expect("an Ingress");
    let m = &ingress.metadata;
    assert_eq!(
        (m.annotation("a"), m.annotation("b"), m.annotation("c"), m.annotation("d")),
        (Some("true"), Some("3"), Some(""), Some("x"))
    );
    let err = parse(&json!({"spec": {"rules": "not a list"}})).expect_err("rules must be a list");
    assert_eq!(err.path, "spec.rules");
}

fn d(weight: u32, host: &str, port: Option<u16>, subset: Option<&str>) -> McpDestination {
    McpDestination { weight, host: host.into(), port, subset: subset.map(Into::into) }
}

#[test]
fn single_destination_without_weight_is_100() {
    assert_eq!(
        parse_destination("orders.DEFAULT-GROUP.public.nacos:8080"),
        Ok(vec![d(100, "orders.DEFAULT-GROUP.public.nacos", Some(8080), None)])
    );
    assert_eq!(parse_destination("web.dns"), Ok(vec![d(100, "web.dns", None, None)]));
    assert_eq!(parse_destination("  100%   web.dns:80   v1  "), Ok(vec![d(100, "web.dns", Some(80), Some("v1"))]));
}

#[test]
fn weighted_destinations_with_subsets_and_blank_lines() {
    let value = "80% orders.DEFAULT-GROUP.public.nacos:8080 v1\n\n20% orders.DEFAULT-GROUP.public.nacos:8080 v2\n";
    assert_eq!(
        parse_destination(value),
        Ok(vec![
            d(80, "orders.DEFAULT-GROUP.public.nacos", Some(8080), Some("v1")),
            d(20, "orders.DEFAULT-GROUP.public.nacos", Some(8080), Some("v2")),
        ])
    );
    // CRLF and a zero weight are fine.
    assert_eq!(
        parse_destination("100% a.consul:1\r\n0% b.consul:2"),
        Ok(vec![d(100, "a.consul", Some(1), None), d(0, "b.consul", Some(2), None)])
    );
}

#[test]
fn malformed_destinations_are_rejected_with_the_line() {
    use DestinationError::*;
    let cases: &[(&str, DestinationError)] = &[
        ("", Empty),
        ("  \n\t\n", Empty),
        ("80% a.nacos:8080\n30% b.nacos:8080", WeightSum { sum: 110 }),
        ("50% a.nacos:8080", WeightSum { sum: 50 }),
        ("a.nacos\nb.nacos", WeightSum { sum: 200 }),
        ("abc% a.nacos", BadWeight { line: 1, weight: "abc%".into() }),
        ("101% a.nacos", BadWeight { line: 1, weight: "101%".into() }),
        ("-5% a.nacos", BadWeight { line: 1, weight: "-5%".into() }),
        ("+5% a.nacos", BadWeight { line: 1, weight: "+5%".into() }),
        ("%", BadWeight { line: 1, weight: "%".into() }),
        ("50% a.nacos\n50%", NoHost { line: 2 }),
        ("a.nacos:http", BadPort { line: 1, port: "http".into() }),
        ("a.nacos:0", BadPort { line: 1, port: "0".into() }),
        ("a.nacos:65536", BadPort { line: 1, port: "65536".into() }),
        ("a.nacos:", BadPort { line: 1, port: "".into() }),
        ("a.nacos:+80", BadPort { line: 1, port: "+80".into() }),
        ("[::1]:80", BadHost { line: 1, host: "[::1]".into() }),
        (":80", BadHost { line: 1, host: "".into() }),
        ("a..nacos", BadHost { line: 1, host: "a..nacos".into() }),
        ("a/b.nacos", BadHost { line: 1, host: "a/b.nacos".into() }),
        ("a.nacos:80 V1", BadSubset { line: 1, subset: "V1".into() }),
        ("a.nacos:80 v_1", BadSubset { line: 1, subset: "v_1".into() }),
        ("a.nacos:80 v1 extra", Extra { line: 1, extra: "extra".into() }),
        ("\u{1F600}", BadHost { line: 1, host: "\u{1F600}".into() }),
    ];
    for (input, want) in cases {
        assert_eq!(parse_destination(input).as_ref(), Err(want), "input {input:?}");
    }
}

#[test]
fn errors_read_well() {
    let e = parse_destination("80% a.nacos:8080 v1\n30% b.nacos:99999").unwrap_err();
    assert_eq!(e.to_string(), "line 2: port \"99999\" is not a number from 1 to 65535");
    assert_eq!(parse_destination("60% a\n30% b").unwrap_err().to_string(), "weights add up to 90, not 100");
}

/// No input makes the parser panic, and whatever it accepts is well formed.
/// (`proptest` is not a dev-dependency of this crate, so a fixed-seed
/// generator over an alphabet biased to the format's own characters.)
#[test]
fn arbitrary_input_never_panics() {
    const ALPHABET: &[&str] = &[
        "%",
        "% ",
        " ",
        "\n",
        "\r\n",
        "\t",
        ":",
        ".",
        "-",
        "_",
        "0",
        "1",
        "5",
        "9",
        "10",
        "50",
        "100",
        "65535",
        "99999",
        "a",
        "v1",
        "Z",
        "nacos",
        "é",
        "\u{1F600}",
        "\0",
        "+",
        "/",
        "[",
        "]",
    ];
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..20_000 {
        let len = (next() % 24) as usize;
        let input: String = (0..len).map(|_| ALPHABET[(next() % ALPHABET.len() as u64) as usize]).collect();
        if let Ok(list) = parse_destination(&input) {
            assert!(!list.is_empty(), "{input:?}");
            assert_eq!(list.iter().map(|d| u64::from(d.weight)).sum::<u64>(), 100, "{input:?}");
            for d in &list {
                assert!(valid_registry_host(&d.host), "{input:?}");
                assert!(d.port != Some(0), "{input:?}");
                assert!(d.subset.as_deref().is_none_or(valid_dns_label), "{input:?}");
            }
        }
    }
}
