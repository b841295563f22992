//! Snapshot tests of the route policy annotations (redirects, timeout and
//! retries, header control and upstream-vhost, CORS): Ingress YAML to the
//! exact VirtualServices and warnings, each of which Pilot's schema takes.

use super::ingress_tests::{run, shop_ingress};
use super::*;

/// Every object encodes against Istio's schema, as MCP sends it.
fn assert_valid_for_pilot(t: &IngressTranslation) {
    for o in &t.objects {
        if let Err(w) = crate::translate::mcp::resource(o, 0) {
            panic!("{w}");
        }
    }
}

fn http_routes(t: &IngressTranslation) -> Vec<serde_json::Value> {
    t.objects
        .iter()
        .filter(|o| o.kind() == "VirtualService")
        .flat_map(|o| o.spec.to_json()["http"].as_array().cloned().unwrap_or_default())
        .collect()
}

fn route<'a>(routes: &'a [serde_json::Value], name: &str) -> &'a serde_json::Value {
    routes.iter().find(|r| r["name"] == name).unwrap_or_else(|| panic!("no route {name}: {routes:#?}"))
}

#[test]
fn redirects_ssl_permanent_temporal_and_app_root() {
    let t = run(&[
        shop_ingress(
            "secure",
            1,
            &[("nginx.ingress.kubernetes.io/force-ssl-redirect", "true"), ("higress.io/app-root", "/shop")],
            &[("/shop", "Prefix", "web")],
        ),
        shop_ingress(
            "moved",
            2,
            &[
                ("nginx.ingress.kubernetes.io/permanent-redirect", "https://new.example.com/catalog"),
                ("nginx.ingress.kubernetes.io/permanent-redirect-code", "308"),
                ("higress.io/rewrite-path", "/ignored"),
                ("higress.io/timeout", "5"),
            ],
            &[("/old", "Exact", "web")],
        ),
        shop_ingress(
            "sale",
            3,
            &[
                ("higress.io/temporal-redirect", "http://sale.example.com"),
                ("higress.io/permanent-redirect", "https://never.example.com/"),
                // Another app-root on the same host: the older one stands.
                ("higress.io/app-root", "/sale"),
            ],
            &[("/sale", "Prefix", "web")],
        ),
        // A canary by header of the redirected path redirects too, as its
        // routes copy the main route.
        shop_ingress(
            "secure-canary",
            4,
            &[("higress.io/canary", "true"), ("higress.io/canary-by-header", "x-canary")],
            &[("/shop", "Prefix", "web-canary")],
        ),
    ]
    .join("---\n"));
    assert_eq!(
        t.warnings.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["Ingress shop/sale: app-root /sale on host shop.example.com conflicts with /shop of shop/secure; ignored"]
    );
    assert_eq!(t.ignored_annotations, 0);
    assert_valid_for_pilot(&t);
    let routes = http_routes(&t);
    let names: Vec<&str> = routes.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "shop-secure-app-root",
            "shop-moved-0",
            "shop-secure-0-ssl-redirect",
            "shop-secure-canary-0-canary-header",
            "shop-secure-0",
            "shop-sale-0"
        ]
    );
    // The redirect route carries no destination, rewrite or timeout.
    let moved = route(&routes, "shop-moved-0");
    assert!(moved.get("route").is_none_or(|r| r.as_array().is_some_and(Vec::is_empty)), "{moved}");
    assert!(moved.get("rewrite").is_none() && moved.get("timeout").is_none(), "{moved}");
    insta::assert_json_snapshot!(t);
}

#[test]
fn timeout_and_retries() {
    let t = run(&[
        shop_ingress(
            "api",
            1,
            &[
                ("higress.io/timeout", "5"),
                ("nginx.ingress.kubernetes.io/proxy-next-upstream-tries", "2"),
                ("nginx.ingress.kubernetes.io/proxy-next-upstream-timeout", "1"),
                ("nginx.ingress.kubernetes.io/proxy-next-upstream", "error timeout http_503"),
            ],
            &[("/api", "Prefix", "api")],
        ),
        shop_ingress("no-retry", 2, &[("higress.io/proxy-next-upstream", "off")], &[("/pay", "Exact", "pay")]),
    ]
    .join("---\n"));
    assert_eq!(t.warnings, vec![]);
    assert_valid_for_pilot(&t);
    insta::assert_json_snapshot!(t);
}

#[test]
fn header_control_and_upstream_vhost() {
    let t = run(&[
        shop_ingress(
            "web",
            1,
            &[
                ("higress.io/request-header-control-add", "x-env staging"),
                ("higress.io/request-header-control-update", "x-user-agent meshbridge"),
                ("higress.io/request-header-control-remove", "x-debug"),
                ("higress.io/response-header-control-update", "x-served-by gateway"),
                ("higress.io/response-header-control-remove", "x-powered-by"),
                ("nginx.ingress.kubernetes.io/upstream-vhost", "web.internal"),
                ("higress.io/rewrite-path", "/v2"),
            ],
            &[("/web", "Prefix", "web")],
        ),
        // A canary keeps its own header control, not the main route's.
        shop_ingress(
            "web-canary",
            2,
            &[
                ("higress.io/canary", "true"),
                ("higress.io/canary-by-header", "x-canary"),
                ("higress.io/response-header-control-add", "x-canary yes"),
            ],
            &[("/web", "Prefix", "web-canary")],
        ),
    ]
    .join("---\n"));
    assert_eq!(t.warnings, vec![]);
    assert_valid_for_pilot(&t);
    let routes = http_routes(&t);
    let canary = route(&routes, "shop-web-canary-0-canary-header");
    assert_eq!(canary["headers"], serde_json::json!({"response": {"add": {"x-canary": "yes"}}}));
    assert_eq!(canary["rewrite"]["authority"], "web.internal");
    insta::assert_json_snapshot!(t);
}

#[test]
fn cors() {
    let t = run(&[
        shop_ingress(
            "cors-default",
            1,
            &[("nginx.ingress.kubernetes.io/enable-cors", "true")],
            &[("/default", "Prefix", "web")],
        ),
        shop_ingress(
            "cors-set",
            2,
            &[
                ("higress.io/enable-cors", "true"),
                ("higress.io/cors-allow-origin", "https://app.example.com,https://*.example.org"),
                ("higress.io/cors-allow-methods", "GET, POST"),
                ("higress.io/cors-allow-headers", "x-token"),
                ("higress.io/cors-expose-headers", "x-request-id"),
                ("higress.io/cors-allow-credentials", "false"),
                ("higress.io/cors-max-age", "60"),
            ],
            &[("/set", "Prefix", "web")],
        ),
    ]
    .join("---\n"));
    assert_eq!(t.warnings, vec![]);
    assert_valid_for_pilot(&t);
    insta::assert_json_snapshot!(t);
}

/// Each bad value is an `invalid_ingress` warning naming the Ingress and
/// the annotation, and the Ingress's routes still apply with the rest.
#[test]
fn bad_values_are_reported_and_the_ingress_still_routes() {
    let t = run(&shop_ingress(
        "bad",
        1,
        &[
            ("higress.io/permanent-redirect", "https://new.example.com/"),
            ("higress.io/permanent-redirect-code", "304"),
            ("higress.io/timeout", "-5"),
            ("nginx.ingress.kubernetes.io/proxy-next-upstream-tries", "many"),
            ("higress.io/request-header-control-add", "x-ok 1\nbroken"),
            ("higress.io/enable-cors", "true"),
            ("higress.io/cors-max-age", "forever"),
            ("nginx.ingress.kubernetes.io/ssl-redirect", "sure"),
        ],
        &[("/bad", "Prefix", "web")],
    ));
    assert!(t.warnings.iter().all(|w| w.reason == Reason::InvalidIngress), "{:?}", t.warnings);
    let warnings: Vec<String> = t.warnings.iter().map(ToString::to_string).collect();
    assert_eq!(
        warnings,
        [
            r#"Ingress shop/bad: annotation nginx.ingress.kubernetes.io/ssl-redirect: "sure" is not a boolean; taken as false"#,
            r#"Ingress shop/bad: annotation higress.io/permanent-redirect-code: "304" is not a redirect code Envoy can send (301, 302, 303, 307 or 308); 301 used"#,
            r#"Ingress shop/bad: annotation higress.io/timeout: "-5" is not a whole number of seconds (0 or more); no timeout set"#,
            r#"Ingress shop/bad: annotation nginx.ingress.kubernetes.io/proxy-next-upstream-tries: "many" is not a whole number of tries (0 or more); 3 used"#,
            r#"Ingress shop/bad: annotation higress.io/request-header-control-add: line 2: "broken" is not a header name and a value; line left out"#,
            r#"Ingress shop/bad: annotation higress.io/cors-max-age: "forever" is not a whole number of seconds (0 or more); 1728000 used"#,
        ]
    );
    assert_valid_for_pilot(&t);
    let routes = http_routes(&t);
    let bad = route(&routes, "shop-bad-0");
    assert_eq!(bad["redirect"]["redirectCode"], 301);
    assert_eq!(bad["headers"]["request"]["add"]["x-ok"], "1");
    assert_eq!(bad["corsPolicy"]["maxAge"], "1728000s");
}

/// Higress's `ApplyByWeight`: a canary by weight shares its main route,
/// and each side keeps its own header control on its destination.
#[test]
fn canary_weight_keeps_each_sides_header_control_on_its_destination() {
    let t = run(&[
        shop_ingress(
            "web",
            1,
            &[("higress.io/response-header-control-add", "x-side main"), ("higress.io/timeout", "3")],
            &[("/web", "Prefix", "web")],
        ),
        shop_ingress(
            "web-canary",
            2,
            &[
                ("higress.io/canary", "true"),
                ("higress.io/canary-weight", "25"),
                ("higress.io/response-header-control-add", "x-side canary"),
            ],
            &[("/web", "Prefix", "web-canary")],
        ),
    ]
    .join("---\n"));
    assert_eq!(t.warnings, vec![]);
    assert_valid_for_pilot(&t);
    let routes = http_routes(&t);
    let main = route(&routes, "shop-web-0");
    assert!(main.get("headers").is_none(), "{main}");
    assert_eq!(main["timeout"], "3s");
    let side = |i: usize| main["route"][i]["headers"]["response"]["add"]["x-side"].clone();
    assert_eq!((side(0), side(1)), (serde_json::json!("main"), serde_json::json!("canary")));
    assert_eq!((main["route"][0]["weight"].clone(), main["route"][1]["weight"].clone()), (75.into(), 25.into()));
}

/// A canary's own policy annotations other than header control do nothing
/// (its routes take the main route's, as in Higress), and it is said.
#[test]
fn a_canarys_own_policy_is_reported_as_ignored() {
    let t = run(&[
        shop_ingress("web", 1, &[("higress.io/timeout", "3")], &[("/web", "Prefix", "web")]),
        shop_ingress(
            "web-canary",
            2,
            &[
                ("higress.io/canary", "true"),
                ("higress.io/canary-by-header", "x-canary"),
                ("higress.io/timeout", "9"),
                ("higress.io/ssl-redirect", "true"),
                ("higress.io/enable-cors", "true"),
                ("higress.io/response-header-control-add", "x-canary yes"),
            ],
            &[("/web", "Prefix", "web-canary")],
        ),
    ]
    .join("---\n"));
    assert_eq!(
        t.warnings.iter().map(ToString::to_string).collect::<Vec<_>>(),
        [
            "Ingress shop/web-canary: canary Ingress: redirects, timeout, CORS ignored (its routes take the main route's; \
          only header control is its own)"
        ]
    );
    let routes = http_routes(&t);
    let canary = route(&routes, "shop-web-canary-0-canary-header");
    assert_eq!((canary["timeout"].as_str(), canary.get("corsPolicy")), (Some("3s"), None), "{canary}");
    assert_eq!(canary["headers"]["response"]["add"]["x-canary"], "yes", "{canary}");
    assert!(routes.iter().all(|r| r.get("redirect").is_none()), "{routes:#?}");
}

#[test]
fn mirror_to_a_service_a_registry_service_or_a_host_with_its_share() {
    let mut opts = super::ingress_tests::opts();
    opts.service_hosts.insert("shadow.static".into(), "shadow.static".into());
    let yaml = [
        shop_ingress(
            "kube",
            1,
            &[("higress.io/mirror-target-service", "test/shadow:8080"), ("higress.io/mirror-percentage", "25")],
            &[("/kube", "Exact", "web")],
        ),
        shop_ingress(
            "registry",
            2,
            &[("nginx.ingress.kubernetes.io/mirror-target-service", "shadow.static:80")],
            &[("/registry", "Exact", "web")],
        ),
        shop_ingress(
            "fqdn",
            3,
            &[("higress.io/mirror-target-fqdn", "shadow.example.com")],
            &[("/fqdn", "Exact", "web")],
        ),
        // Unknown: reported once for its two paths, which still route.
        shop_ingress(
            "unknown",
            4,
            &[("higress.io/mirror-target-service", "nowhere.static")],
            &[("/u1", "Exact", "web"), ("/u2", "Exact", "web")],
        ),
        // A redirect copies nothing.
        shop_ingress(
            "moved",
            5,
            &[("higress.io/mirror-target-service", "shadow"), ("higress.io/permanent-redirect", "https://b.example/")],
            &[("/moved", "Exact", "web")],
        ),
    ]
    .join("---\n");
    let t = translate(&crate::config::ingress_docs(&yaml), &opts);
    assert_valid_for_pilot(&t);
    let routes = http_routes(&t);
    let kube = route(&routes, "shop-kube-0");
    assert_eq!(kube["mirror"], serde_json::json!({"host": "shadow.test.svc.cluster.local", "port": {"number": 8080}}));
    assert_eq!(kube["mirrorPercentage"], serde_json::json!({"value": 25.0}));
    let registry = route(&routes, "shop-registry-0");
    assert_eq!(registry["mirror"], serde_json::json!({"host": "shadow.static", "port": {"number": 80}}));
    assert!(registry.get("mirrorPercentage").is_none(), "{registry}");
    assert_eq!(
        route(&routes, "shop-fqdn-0")["mirror"],
        serde_json::json!({"host": "shadow.example.com", "port": {"number": 80}})
    );
    for name in ["shop-unknown-0", "shop-unknown-1", "shop-moved-0"] {
        assert!(route(&routes, name).get("mirror").is_none(), "{name}");
    }
    let unknown: Vec<_> = t.warnings.iter().filter(|w| w.object == "Ingress shop/unknown").collect();
    assert_eq!(unknown.len(), 1, "{:?}", t.warnings);
    assert_eq!(
        unknown[0].detail,
        "annotation higress.io/mirror-target-service: no registry service \"nowhere.static\"; mirror left out"
    );
    assert_eq!(unknown[0].reason, Reason::InvalidIngress);
}

#[test]
fn source_ranges_reach_the_routes_but_not_the_virtual_service_istiod_gets() {
    let t = run(&shop_ingress(
        "office",
        1,
        &[
            ("nginx.ingress.kubernetes.io/whitelist-source-range", "10.0.0.0/8"),
            ("nginx.ingress.kubernetes.io/ssl-redirect", "true"),
        ],
        &[("/office", "Exact", "web")],
    ));
    assert_valid_for_pilot(&t);
    let want = crate::translate::model::SourceRanges {
        allow: Some(vec![crate::translate::model::Cidr { address: "10.0.0.0".parse().unwrap(), prefix_len: 8 }]),
        deny: vec![],
    };
    let vs = t.objects.iter().find(|o| o.kind() == "VirtualService").unwrap();
    let Spec::VirtualService(spec) = &vs.spec else { panic!() };
    let ranged: Vec<(&str, bool)> =
        spec.http.iter().map(|r| (r.name.as_str(), r.source_ranges.as_ref() == Some(&want))).collect();
    assert_eq!(ranged, [("shop-office-0-ssl-redirect", true), ("shop-office-0", true)]);
    assert!(!vs.spec.to_json().to_string().contains("10.0.0.0"), "an Istio field was made up");
    // For istiod: an AuthorizationPolicy on the gateway, denying clients
    // outside the range on the Ingress's host and path.
    assert_eq!(t.warnings, Vec::new());
    let policy = t.objects.iter().find(|o| o.kind() == "AuthorizationPolicy").expect("an AuthorizationPolicy");
    assert_eq!(policy.key(), "higress-system/shop-office-source-range");
    assert_eq!(policy.api_version(), "security.istio.io/v1");
    assert_eq!(
        policy.spec.to_json(),
        serde_json::json!({
            "selector": {"matchLabels": {"higress": "higress-system-higress-gateway"}},
            "action": "DENY",
            "rules": [{
                "from": [{"source": {"notRemoteIpBlocks": ["10.0.0.0/8"]}}],
                "to": [{"operation": {"hosts": ["shop.example.com"], "paths": ["/office"]}}]
            }]
        })
    );
}

/// An allow and a deny list make two DENY rules (outside the first, or in
/// the second); a Prefix path covers itself and what is under it; a regex
/// path has no AuthorizationPolicy form, which is said.
#[test]
fn source_ranges_become_deny_rules_on_the_ingress_hosts_and_paths() {
    let mut yaml = shop_ingress(
        "mixed",
        1,
        &[
            ("higress.io/whitelist-source-range", "10.0.0.0/8"),
            ("higress.io/denylist-source-range", "10.9.0.0/16, 10.1.2.3"),
        ],
        &[("/api/", "Prefix", "web"), ("/login", "Exact", "web")],
    );
    yaml.push_str("---\n");
    yaml.push_str(&shop_ingress(
        "regex",
        2,
        &[("higress.io/whitelist-source-range", "10.0.0.0/8"), ("higress.io/use-regex", "true")],
        &[("/v[0-9]+", "Prefix", "web")],
    ));
    let t = run(&yaml);
    assert_valid_for_pilot(&t);
    let policies: Vec<_> = t.objects.iter().filter(|o| o.kind() == "AuthorizationPolicy").collect();
    assert_eq!(policies.len(), 1, "none for an Ingress with only regex paths: {policies:#?}");
    let to = serde_json::json!([{"operation": {"hosts": ["shop.example.com"], "paths": ["/api", "/api/*", "/login"]}}]);
    assert_eq!(
        policies[0].spec.to_json()["rules"],
        serde_json::json!([
            {"from": [{"source": {"notRemoteIpBlocks": ["10.0.0.0/8"]}}], "to": to},
            {"from": [{"source": {"remoteIpBlocks": ["10.9.0.0/16", "10.1.2.3/32"]}}], "to": to},
        ])
    );
    let standalone: Vec<String> =
        t.warnings.iter().filter(|w| w.reason == Reason::StandaloneOnly).map(ToString::to_string).collect();
    assert_eq!(
        standalone,
        ["Ingress shop/regex: path /v[0-9]+: a regex path has no AuthorizationPolicy form, so its source ranges are \
          enforced by the standalone gateway only"]
    );
}

/// Higress's local rate limit: `route-limit-rpm` wins over `-rps`, the
/// bucket holds the rate times the burst multiplier (5 by default), a
/// route field for the standalone gateway and an EnvoyFilter for istiod
/// (`limit_tests.rs`) with no warning, and bad numbers are reported and
/// left out.
#[test]
fn route_limits_become_token_buckets() {
    use crate::translate::model::LocalRateLimit;
    let limits = |annotations: &[(&str, &str)]| {
        let t = run(&shop_ingress("api", 1, annotations, &[("/api", "Prefix", "web")]));
        assert_valid_for_pilot(&t);
        let vs = t.objects.iter().find(|o| o.kind() == "VirtualService").unwrap();
        assert!(!vs.spec.to_json().to_string().contains("limit"), "an Istio field was made up");
        let Spec::VirtualService(spec) = &vs.spec else { panic!() };
        let warnings: Vec<String> = t.warnings.iter().map(|w| format!("{}: {}", w.reason, w.detail)).collect();
        (spec.http[0].local_rate_limit, warnings)
    };
    let bucket = |max_tokens, tokens_per_fill, fill_interval_secs| {
        Some(LocalRateLimit { max_tokens, tokens_per_fill, fill_interval_secs })
    };
    let (limit, warnings) = limits(&[("higress.io/route-limit-rps", "10")]);
    assert_eq!(limit, bucket(50, 10, 1));
    assert_eq!(warnings, Vec::<String>::new());
    let both = [
        ("higress.io/route-limit-rpm", "120"),
        ("higress.io/route-limit-rps", "10"),
        ("higress.io/route-limit-burst-multiplier", "2"),
    ];
    assert_eq!(limits(&both).0, bucket(240, 120, 60));
    // Under the nginx prefix Higress reads none of them.
    let (limit, warnings) = limits(&[("nginx.ingress.kubernetes.io/route-limit-rps", "10")]);
    assert_eq!(limit, None);
    assert!(warnings.iter().all(|w| w.starts_with("ignored_annotation")), "{warnings:?}");
    let (limit, warnings) =
        limits(&[("higress.io/route-limit-rps", "ten"), ("higress.io/route-limit-burst-multiplier", "0")]);
    assert_eq!(limit, None);
    assert!(warnings.iter().any(|w| w.contains("route-limit-rps: \"ten\" is not a whole number above 0; ignored")));
    assert!(warnings.iter().any(|w| w.contains("burst-multiplier: \"0\" is not a whole number above 0; 5 used")));
}

/// The policy covers the paths the Ingress routes: a path an older Ingress
/// holds keeps that Ingress's (open) route, and gets no DENY from the
/// newer one's ranges.
#[test]
fn source_ranges_cover_only_the_paths_their_ingress_routes() {
    let mut yaml = shop_ingress("open", 1, &[], &[("/shared", "Prefix", "web")]);
    yaml.push_str("---\n");
    yaml.push_str(&shop_ingress(
        "ranged",
        2,
        &[("higress.io/whitelist-source-range", "10.0.0.0/8")],
        &[("/shared", "Prefix", "web"), ("/own", "Exact", "web")],
    ));
    let t = run(&yaml);
    let policy = t.objects.iter().find(|o| o.kind() == "AuthorizationPolicy").expect("a policy");
    assert_eq!(
        policy.spec.to_json()["rules"][0]["to"],
        serde_json::json!([{"operation": {"hosts": ["shop.example.com"], "paths": ["/own"]}}])
    );
}
