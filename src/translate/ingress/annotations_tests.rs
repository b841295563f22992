//! Unit tests of the annotation parsers, malformed input above all.

use super::*;

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
