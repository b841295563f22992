//! Unit tests of the annotation parsers, malformed input above all.

use super::*;

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

#[test]
fn go_booleans() {
    for t in ["1", "t", "T", "true", "TRUE", "True"] {
        assert_eq!(parse_bool(t), Some(true));
    }
    for f in ["0", "f", "F", "false", "FALSE", "False"] {
        assert_eq!(parse_bool(f), Some(false));
    }
    for x in ["", "yes", "on", "tRUE", " true"] {
        assert_eq!(parse_bool(x), None);
    }
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

/// `read_canary` on `higress.io/` keys: `canary`, `-by-header`, `-value`,
/// `-pattern`, `-by-cookie`, `-weight`, `-weight-total`.
fn canary(values: [Option<&str>; 7]) -> (Option<Canary>, Vec<String>) {
    let found: Vec<_> =
        CANARY_KEYS.iter().zip(values).map(|(k, v)| v.map(|v| (format!("{HIGRESS}{k}"), v.to_owned()))).collect();
    let mut warnings = Vec::new();
    (read_canary(&found, &mut warnings), warnings)
}

fn weight(weight: u32, total: u32) -> Option<CanaryWeight> {
    Some(CanaryWeight { weight, total })
}

#[test]
fn canary_only_when_true() {
    assert_eq!(canary([None, Some("x"), None, None, None, Some("5"), None]), (None, vec![]));
    assert_eq!(canary([Some("false"), Some("x"), None, None, None, Some("500"), None]), (None, vec![]));
    assert_eq!(canary([Some("True"), None, None, None, None, None, None]), (Some(Canary::default()), vec![]));
    let (c, w) = canary([Some("on"), Some("x"), None, None, None, None, None]);
    assert_eq!((c, w), (None, vec![r#"annotation higress.io/canary: "on" is not a boolean; taken as false"#.into()]));
}

#[test]
fn canary_header_rules_value_before_pattern() {
    let header = |rule| Some(CanaryHeader { name: "x-canary".into(), rule });
    let (c, w) = canary([Some("true"), Some(" X-Canary "), None, None, None, None, None]);
    assert_eq!((c.unwrap().header, w), (header(HeaderRule::AlwaysNever), vec![]));
    // The value wins, and the pattern beside it is not even read.
    let (c, w) = canary([Some("true"), Some("x-canary"), Some("eu"), Some("("), None, None, None]);
    assert_eq!((c.unwrap().header, w), (header(HeaderRule::Value("eu".into())), vec![]));
    let (c, w) = canary([Some("true"), Some("x-canary"), Some(""), Some("^(a|b)$"), None, None, None]);
    assert_eq!((c.unwrap().header, w), (header(HeaderRule::Pattern("^(a|b)$".into())), vec![]));
    let (c, w) = canary([Some("true"), Some("x-canary"), None, Some("a(?=b)"), Some("beta"), None, None]);
    let c = c.unwrap();
    assert_eq!((c.header, c.cookie.as_deref()), (None, Some("beta")));
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(w[0].starts_with(r#"annotation higress.io/canary-by-header-pattern: "a(?=b)" is not a valid RE2 regex ("#));
    let (c, w) = canary([Some("true"), Some("x:canary"), None, None, Some("a=b"), None, None]);
    assert_eq!(c, Some(Canary::default()));
    assert_eq!(
        w,
        [
            r#"annotation higress.io/canary-by-header: "x:canary" is not a header name; header rule dropped"#,
            r#"annotation higress.io/canary-by-cookie: "a=b" is not a cookie name; cookie rule dropped"#,
        ]
    );
}

#[test]
fn canary_weights_in_range_of_their_total() {
    let w = |weight: &str, total: Option<&str>| {
        let (c, warnings) = canary([Some("true"), None, None, None, None, Some(weight), total]);
        (c.unwrap().weight, warnings)
    };
    assert_eq!(w("0", None), (weight(0, 100), vec![]));
    assert_eq!(w(" 100 ", None), (weight(100, 100), vec![]));
    assert_eq!(w("999", Some("1000")), (weight(999, 1000), vec![]));
    for (bad, total) in [("101", None), ("4", Some("3"))] {
        let (c, warnings) = w(bad, total);
        assert_eq!(c, None);
        assert!(warnings[0].contains("is more than the total of"), "{warnings:?}");
    }
    for bad in ["-1", "+5", "ten", "1.5", ""] {
        let (c, warnings) = w(bad, None);
        assert_eq!(c, None, "{bad}");
        assert_eq!(warnings.len(), 1, "{bad}");
        assert!(warnings[0].starts_with("annotation higress.io/canary-weight: "), "{warnings:?}");
    }
    for bad in ["0", "-100", "x"] {
        let (c, warnings) = w("10", Some(bad));
        assert_eq!(c, None, "{bad}");
        assert!(warnings[0].starts_with("annotation higress.io/canary-weight-total: "), "{warnings:?}");
    }
}
