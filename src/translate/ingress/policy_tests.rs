//! Unit tests of the policy annotation parsers, malformed input above all.

use std::collections::BTreeMap;

use super::*;

/// `read` over `annotations` (full keys), as `IngressAnnotations` calls it.
fn policy(annotations: &[(&str, &str)]) -> (RoutePolicy, Vec<String>) {
    super::super::traffic::traffic_tests::read_with(annotations, |get, warnings| read(get, warnings))
}

fn secs(s: u64) -> Option<ProtoDuration> {
    Some(ProtoDuration::from_secs(s))
}

#[test]
fn nothing_set_is_no_policy() {
    assert_eq!(policy(&[]), (RoutePolicy::default(), vec![]));
    assert_eq!(
        policy(&[("higress.io/enable-cors", "false"), ("higress.io/ssl-redirect", "false")]).0,
        RoutePolicy::default()
    );
}

#[test]
fn ssl_redirects_under_either_prefix_and_name() {
    for key in [
        "higress.io/ssl-redirect",
        "nginx.ingress.kubernetes.io/ssl-redirect",
        "higress.io/force-ssl-redirect",
        "nginx.ingress.kubernetes.io/force-ssl-redirect",
    ] {
        let (p, w) = policy(&[(key, "true")]);
        assert!(p.ssl_redirect, "{key}");
        assert_eq!(w, Vec::<String>::new());
    }
    let (p, w) = policy(&[("nginx.ingress.kubernetes.io/ssl-redirect", "yes")]);
    assert!(!p.ssl_redirect);
    assert_eq!(w, [r#"annotation nginx.ingress.kubernetes.io/ssl-redirect: "yes" is not a boolean; taken as false"#]);
}

#[test]
fn temporal_redirect_wins_over_permanent_as_in_higress() {
    let (p, w) = policy(&[
        ("higress.io/temporal-redirect", "https://example.com/new?x=1"),
        ("higress.io/permanent-redirect", "https://other.example.com/"),
        ("higress.io/permanent-redirect-code", "308"),
    ]);
    let want = Redirect {
        uri: Some("/new".into()),
        authority: Some("example.com".into()),
        scheme: Some("https".into()),
        redirect_code: Some(302),
    };
    assert_eq!((p.redirect, w), (Some(want), vec![]));
    // A bad temporal URL falls through to the permanent one.
    let (p, w) = policy(&[
        ("nginx.ingress.kubernetes.io/temporal-redirect", "ftp://example.com/"),
        ("nginx.ingress.kubernetes.io/permanent-redirect", "http://example.com:8080"),
        ("nginx.ingress.kubernetes.io/permanent-redirect-code", "307"),
    ]);
    let r = p.redirect.unwrap();
    assert_eq!(
        (r.scheme.as_deref(), r.authority.as_deref(), r.uri, r.redirect_code),
        (Some("http"), Some("example.com:8080"), None, Some(307))
    );
    assert_eq!(
        w,
        [
            r#"annotation nginx.ingress.kubernetes.io/temporal-redirect: "ftp://example.com/" is not an http or https URL with a host; ignored"#
        ]
    );
}

#[test]
fn permanent_redirect_codes_envoy_cannot_send_become_301() {
    for (code, want, warned) in [
        ("301", 301, false),
        ("303", 303, false),
        ("300", 301, true),
        ("304", 301, true),
        ("999", 301, true),
        ("-301", 301, true),
        ("+308", 301, true),
        ("abc", 301, true),
    ] {
        let (p, w) = policy(&[
            ("higress.io/permanent-redirect", "https://a.example/b"),
            ("higress.io/permanent-redirect-code", code),
        ]);
        assert_eq!(p.redirect.unwrap().redirect_code, Some(want), "{code}");
        assert_eq!(w.len(), usize::from(warned), "{code}: {w:?}");
        if warned {
            assert!(
                w[0].starts_with("annotation higress.io/permanent-redirect-code: ") && w[0].ends_with("; 301 used"),
                "{w:?}"
            );
        }
    }
}

#[test]
fn redirect_urls() {
    let ok = |v: &str| redirect_url(v).unwrap();
    assert_eq!(ok("HTTPS://Example.com/a/b#frag").uri.as_deref(), Some("/a/b"));
    assert_eq!(ok("http://[::1]:8080/x").authority.as_deref(), Some("[::1]:8080"));
    assert_eq!(ok("https://example.com?q=1").uri, None);
    for bad in [
        "",
        "example.com/x",
        "https://",
        "https:///x",
        "https://exa mple.com/",
        "https://a.com:0/",
        "https://a.com:99999/",
        "https://a.com/b c",
        "mailto://x@y",
        "https://user@a.com/",
        "https://[zz]/",
    ] {
        assert_eq!(redirect_url(bad), Err(PolicyError::Url(bad.into())), "{bad:?}");
    }
}

#[test]
fn app_root_must_be_a_path() {
    assert_eq!(policy(&[("nginx.ingress.kubernetes.io/app-root", "/app1")]).0.app_root.as_deref(), Some("/app1"));
    let (p, w) = policy(&[("higress.io/app-root", "app1")]);
    assert_eq!(p.app_root, None);
    assert_eq!(w, [r#"annotation higress.io/app-root: "app1" is not a path starting with '/'; ignored"#]);
}

#[test]
fn timeout_is_higress_only_whole_seconds() {
    assert_eq!(policy(&[("higress.io/timeout", "5")]).0.timeout, secs(5));
    assert_eq!(policy(&[("higress.io/timeout", "0")]), (RoutePolicy::default(), vec![]));
    // Not an ingress-nginx annotation: Higress does not read it there.
    assert_eq!(policy(&[("nginx.ingress.kubernetes.io/timeout", "5")]).0.timeout, None);
    for bad in ["-1", "1.5", "5s", "", "ten", "+5", "99999999999999999999"] {
        let (p, w) = policy(&[("higress.io/timeout", bad)]);
        assert_eq!(p.timeout, None, "{bad}");
        assert_eq!(
            w,
            [format!(
                "annotation higress.io/timeout: {bad:?} is not a whole number of seconds (0 or more); no timeout set"
            )]
        );
    }
}

#[test]
fn retries_default_to_three_on_5xx() {
    let r = |a: &[(&str, &str)]| policy(a).0.retries;
    let retry = |attempts, per_try: Option<ProtoDuration>, on: Option<&str>| {
        Some(Retry { attempts, per_try_timeout: per_try, retry_on: on.map(Into::into) })
    };
    assert_eq!(r(&[("higress.io/proxy-next-upstream-tries", "2")]), retry(2, None, Some("5xx")));
    assert_eq!(r(&[("nginx.ingress.kubernetes.io/proxy-next-upstream-timeout", "4")]), retry(3, secs(4), Some("5xx")));
    assert_eq!(
        r(&[("nginx.ingress.kubernetes.io/proxy-next-upstream", "error timeout http_502 http_503")]),
        retry(3, None, Some("5xx,retriable-status-codes,502,503"))
    );
    assert_eq!(
        r(&[("higress.io/proxy-next-upstream", "http_504,non_idempotent")]),
        retry(3, None, Some("retriable-status-codes,504"))
    );
    assert_eq!(
        r(&[("higress.io/proxy-next-upstream", "error, off"), ("higress.io/proxy-next-upstream-tries", "5")]),
        retry(0, None, None)
    );
}

#[test]
fn bad_retry_values_keep_the_defaults_with_a_warning() {
    let (p, w) = policy(&[
        ("higress.io/proxy-next-upstream-tries", "-1"),
        ("higress.io/proxy-next-upstream-timeout", "soon"),
        ("higress.io/proxy-next-upstream", "http_5xx bogus"),
    ]);
    assert_eq!(p.retries, Some(Retry { attempts: 3, per_try_timeout: None, retry_on: Some("5xx".into()) }));
    assert_eq!(
        w,
        [
            r#"annotation higress.io/proxy-next-upstream-tries: "-1" is not a whole number of tries (0 or more); 3 used"#,
            r#"annotation higress.io/proxy-next-upstream-timeout: "soon" is not a whole number of seconds (0 or more); no per-try timeout set"#,
            r#"annotation higress.io/proxy-next-upstream: "http_5xx" is not a condition of proxy-next-upstream (error, timeout, invalid_header, http_NNN, non_idempotent, off); left out"#,
            r#"annotation higress.io/proxy-next-upstream: "bogus" is not a condition of proxy-next-upstream (error, timeout, invalid_header, http_NNN, non_idempotent, off); left out"#,
        ]
    );
    assert_eq!(tries("2147483648"), Err(PolicyError::Tries("2147483648".into())));
    assert_eq!(tries(" 7 "), Ok(7));
}

#[test]
fn header_control_lines_and_removals() {
    let (p, w) = policy(&[
        ("higress.io/request-header-control-add", "X-Env  test\n\n'x-quoted' \"a b\"\n"),
        ("higress.io/request-header-control-update", "x-user-agent meshbridge"),
        ("higress.io/request-header-control-remove", "X-Debug, x-trace ,,"),
        ("higress.io/response-header-control-update", "server edge"),
        ("higress.io/response-header-control-remove", "x-powered-by"),
        // Not read under the nginx prefix, as in Higress.
        ("nginx.ingress.kubernetes.io/request-header-control-add", "x-nginx 1"),
    ]);
    assert_eq!(w, Vec::<String>::new());
    let h = p.headers.unwrap();
    let req = h.request.unwrap();
    assert_eq!(req.add, BTreeMap::from([("x-env".into(), "test".into()), ("x-quoted".into(), "a b".into())]));
    assert_eq!(req.set, BTreeMap::from([("x-user-agent".into(), "meshbridge".into())]));
    assert_eq!(req.remove, ["x-debug", "x-trace"]);
    let resp = h.response.unwrap();
    assert_eq!(
        (resp.add.len(), resp.set["server"].as_str(), resp.remove.as_slice()),
        (0, "edge", &["x-powered-by".to_owned()][..])
    );
}

#[test]
fn bad_header_lines_are_left_out_one_by_one() {
    let (p, w) = policy(&[
        ("higress.io/request-header-control-add", "x-ok 1\nlonely\nbad:name 2\nhost evil.example\nx-nul a\u{0}b"),
        ("higress.io/request-header-control-remove", "Host, x-fine, bad name"),
    ]);
    let req = p.headers.unwrap().request.unwrap();
    assert_eq!(req.add, BTreeMap::from([("x-ok".into(), "1".into())]));
    assert_eq!(req.remove, ["x-fine"]);
    assert_eq!(
        w,
        [
            r#"annotation higress.io/request-header-control-add: line 2: "lonely" is not a header name and a value; line left out"#,
            r#"annotation higress.io/request-header-control-add: "bad:name" is not a header name; line left out"#,
            r#"annotation higress.io/request-header-control-add: header "host" cannot be changed by header control (upstream-vhost sets the Host); line left out"#,
            "annotation higress.io/request-header-control-add: the value of header x-nul has a control character; line left out",
            r#"annotation higress.io/request-header-control-remove: header "Host" cannot be changed by header control (upstream-vhost sets the Host); left out"#,
            r#"annotation higress.io/request-header-control-remove: "bad name" is not a header name; left out"#,
        ]
    );
    // Nothing usable: no header operations at all.
    assert_eq!(policy(&[("higress.io/response-header-control-add", "novalue")]).0.headers, None);
}

#[test]
fn upstream_vhost_is_a_host_and_port() {
    assert_eq!(
        policy(&[("nginx.ingress.kubernetes.io/upstream-vhost", "api.internal")]).0.authority.as_deref(),
        Some("api.internal")
    );
    for ok in ["a.b:8080", "10.0.0.1", "[::1]", "[fe80::1]:443", "svc_name.ns"] {
        assert_eq!(authority(ok).as_deref(), Ok(ok), "{ok}");
    }
    for bad in ["$host", "a b", "a.b:", "a.b:0", "a.b:70000", "[::1", "[::1]x", ":80", "-a.b", "a/b"] {
        assert!(authority(bad).is_err(), "{bad}");
    }
    let (p, w) = policy(&[("higress.io/upstream-vhost", "$host")]);
    assert_eq!(
        (p.authority, w),
        (
            None,
            vec![
                r#"annotation higress.io/upstream-vhost: "$host" is not a host with an optional port; ignored"#
                    .to_owned()
            ]
        )
    );
}

#[test]
fn cors_defaults_as_in_higress() {
    let (p, w) = policy(&[("nginx.ingress.kubernetes.io/enable-cors", "true")]);
    assert_eq!(w, Vec::<String>::new());
    let c = p.cors.unwrap();
    assert_eq!(c.allow_origins, [StringMatch::Regex(".*".into())]);
    assert_eq!(c.allow_methods, ["GET", "PUT", "POST", "DELETE", "PATCH", "OPTIONS"]);
    assert_eq!(c.allow_headers.len(), 9);
    assert_eq!((c.expose_headers.len(), c.max_age, c.allow_credentials), (0, secs(1_728_000), Some(true)));
    // The rest of the family does nothing without enable-cors.
    assert_eq!(policy(&[("higress.io/cors-allow-origin", "https://a.example")]).0.cors, None);
}

#[test]
fn cors_values_and_bad_ones() {
    let (p, w) = policy(&[
        ("higress.io/enable-cors", "true"),
        (
            "higress.io/cors-allow-origin",
            "https://app.example.com, http://*.example.org:8080, example.net, https://a.*.com",
        ),
        ("higress.io/cors-allow-methods", "GET,POST, BAD METHOD"),
        ("higress.io/cors-allow-headers", "*, x-anything"),
        ("higress.io/cors-expose-headers", "x-request-id"),
        ("higress.io/cors-allow-credentials", "false"),
        ("higress.io/cors-max-age", "600"),
    ]);
    let c = p.cors.unwrap();
    assert_eq!(
        c.allow_origins,
        [
            StringMatch::Exact("https://app.example.com".into()),
            StringMatch::Regex(r"http://[^/]+\.example\.org:8080".into())
        ]
    );
    assert_eq!(
        (c.allow_methods, c.allow_headers, c.expose_headers),
        (vec!["GET".to_owned(), "POST".into()], vec!["*".to_owned()], vec!["x-request-id".to_owned()])
    );
    assert_eq!((c.max_age, c.allow_credentials), (secs(600), Some(false)));
    assert_eq!(
        w,
        [
            r#"annotation higress.io/cors-allow-methods: "BAD METHOD" is not a name; left out"#,
            r#"annotation higress.io/cors-allow-origin: origin "example.net" is not * or http[s]://host[:port] (the host may start with *.); left out"#,
            r#"annotation higress.io/cors-allow-origin: origin "https://a.*.com" is not * or http[s]://host[:port] (the host may start with *.); left out"#,
        ]
    );
    let (p, w) = policy(&[
        ("higress.io/enable-cors", "true"),
        ("higress.io/cors-allow-origin", "nope"),
        ("higress.io/cors-allow-credentials", "maybe"),
        ("higress.io/cors-max-age", "-1"),
    ]);
    let c = p.cors.unwrap();
    assert_eq!((c.allow_origins.len(), c.allow_credentials, c.max_age), (0, Some(true), secs(1_728_000)));
    assert_eq!(w.len(), 4, "{w:?}");
    assert!(w[1].ends_with("no origin is allowed"), "{w:?}");
    let (p, w) = policy(&[("higress.io/enable-cors", "on")]);
    assert_eq!(
        (p.cors, w),
        (None, vec![r#"annotation higress.io/enable-cors: "on" is not a boolean; taken as false"#.to_owned()])
    );
}

/// No input makes a parser panic.
#[test]
fn arbitrary_input_never_panics() {
    const ALPHABET: &[&str] = &[
        "http", "s", "://", ":", "/", "[", "]", "*", ".", ",", " ", "\n", "'", "\"", "0", "9", "-", "_", "a", "Z", "é",
        "\0", "%", "?", "#", "http_5",
    ];
    for input in super::super::syntax::random_inputs(ALPHABET, 0x2545_f491_4f6c_dd1d, 20_000, 15) {
        if let Ok(r) = redirect_url(&input) {
            assert!(r.authority.as_deref().is_some_and(|a| authority(a).is_ok()), "{input:?}");
        }
        let _ = (seconds(&input), tries(&input), redirect_code(&input), path(&input), authority(&input));
        let _ = (retry_on(&input), header_lines(&input, true), header_names(&input, false), name_list(&input));
        for o in origins(&input).0 {
            assert!(!matches!(o, StringMatch::Prefix(_)), "{input:?}");
        }
    }
}
