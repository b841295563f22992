//! `auth-tls-secret`: the HTTPS servers of the Gateway for the hosts whose
//! Ingresses ask for client certificates, what istiod gets (`MUTUAL` where
//! it finds the CA) and what only the standalone gateway reads
//! (`client_ca`), and the warnings, each naming the Ingress and the key.

use super::ingress_tests::{run, warnings_of};
use super::*;

/// An Ingress `name` in `shop` on `host` with TLS from `secret` (none when
/// empty), created on day `day`.
fn ingress(name: &str, day: u32, host: &str, secret: &str, annotations: &[(&str, &str)]) -> String {
    let mut yaml = format!(
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: {name}\n  namespace: shop\n  \
         creationTimestamp: \"2026-01-{day:02}T00:00:00Z\"\n  annotations:\n    higress.io/destination: a.dc1.consul:80\n"
    );
    for (k, v) in annotations {
        yaml.push_str(&format!("    {k}: {}\n", serde_json::to_string(v).unwrap()));
    }
    yaml.push_str("spec:\n  ingressClassName: higress\n");
    if !secret.is_empty() {
        yaml.push_str(&format!("  tls:\n    - {{hosts: [{host}], secretName: {secret}}}\n"));
    }
    yaml.push_str(&format!(
        "  rules:\n    - host: {host}\n      http:\n        paths:\n          \
         - {{path: /{name}, pathType: Prefix, backend: {{resource: {{apiGroup: networking.higress.io, kind: McpBridge, \
         name: default}}}}}}\n---\n"
    ));
    yaml
}

const KEY: &str = "higress.io/auth-tls-secret";
const NGINX_KEY: &str = "nginx.ingress.kubernetes.io/auth-tls-secret";

/// The HTTPS servers of the Gateway.
fn https_servers(t: &IngressTranslation) -> Vec<Server> {
    t.objects
        .iter()
        .find_map(|o| match &o.spec {
            Spec::Gateway(g) => Some(g.servers.iter().filter(|s| s.tls.is_some()).cloned().collect()),
            _ => None,
        })
        .unwrap_or_default()
}

/// The server that serves `host`: (name, mode, credentialName, client CA).
fn server_of(t: &IngressTranslation, host: &str) -> (String, &'static str, String, Option<(String, String)>) {
    let s = https_servers(t).into_iter().find(|s| s.hosts.iter().any(|h| h == host)).expect("a server for the host");
    let tls = s.tls.unwrap();
    (s.port.name, tls.mode.unwrap().as_str(), tls.credential_name, tls.client_ca)
}

fn pair(ns: &str, name: &str) -> Option<(String, String)> {
    Some((ns.to_owned(), name.to_owned()))
}

#[test]
fn a_ca_istiod_finds_makes_the_hosts_server_mutual() {
    let yaml = [
        // `{cert}-cacert`, no namespace: the Ingress's.
        ingress("beside", 1, "beside.example.com", "shop-tls", &[(KEY, "shop-tls-cacert")]),
        // The certificate's own Secret, under the nginx prefix.
        ingress("own", 2, "own.example.com", "shop-tls", &[(NGINX_KEY, "shop/shop-tls")]),
        // Not asking, same certificate: a server of its own, unchanged.
        ingress("plain", 3, "plain.example.com", "shop-tls", &[]),
    ]
    .concat();
    let t = run(&yaml);
    for name in ["beside", "own", "plain"] {
        assert_eq!(warnings_of(&t, name), vec![], "{name}: {:#?}", t.warnings);
    }
    let credential = "kubernetes-gateway://shop/shop-tls".to_owned();
    assert_eq!(
        server_of(&t, "plain.example.com"),
        ("https-443-ingress-shop-shop-tls".into(), "SIMPLE", credential.clone(), None)
    );
    let (beside, mode, cred, ca) = server_of(&t, "beside.example.com");
    assert_eq!((mode, &cred, ca), ("MUTUAL", &credential, pair("shop", "shop-tls-cacert")));
    let (own, mode, cred, ca) = server_of(&t, "own.example.com");
    assert_eq!((mode, &cred, ca), ("MUTUAL", &credential, pair("shop", "shop-tls")));
    // One server per CA, each name unique.
    for name in [&beside, &own] {
        assert!(name.starts_with("https-443-ingress-shop-shop-tls-mtls"), "{name}");
    }
    assert_ne!(beside, own);
    assert_eq!(https_servers(&t).len(), 3);
    // The CA is not Istio's field: istiod's JSON has no trace of it.
    let gw = t.objects.iter().find(|o| o.kind() == "Gateway").unwrap();
    assert!(!gw.spec.to_json().to_string().contains("cacert"), "{}", gw.spec.to_json());
}

#[test]
fn a_ca_elsewhere_is_the_standalone_gateways_only() {
    let t = run(&ingress("elsewhere", 1, "a.example.com", "shop-tls", &[(KEY, "clients-ca")]));
    assert_eq!(server_of(&t, "a.example.com").1, "SIMPLE", "istiod cannot find that CA");
    assert_eq!(server_of(&t, "a.example.com").3, pair("shop", "clients-ca"));
    let w = warnings_of(&t, "elsewhere");
    assert_eq!(w.len(), 1, "{w:#?}");
    assert_eq!(w[0].0, "standalone_only");
    assert!(w[0].1.starts_with(&format!("annotation {KEY}: CA Secret shop/clients-ca is neither")), "{}", w[0].1);
    assert!(w[0].1.contains("a.example.com"), "{}", w[0].1);
}

#[test]
fn a_missing_ca_still_asks_for_certificates_and_is_reported() {
    // `other-tls-cacert` does not exist: the host stays closed to clients
    // without a certificate rather than open.
    let t = run(&ingress("missing", 1, "m.example.com", "other-tls", &[(KEY, "other-tls-cacert")]));
    assert_eq!(server_of(&t, "m.example.com").1, "MUTUAL");
    let w = warnings_of(&t, "missing");
    assert_eq!(w.len(), 1, "{w:#?}");
    assert_eq!(w[0].0, "missing_secret");
    assert!(w[0].1.starts_with(&format!("annotation {KEY}: no Secret shop/other-tls-cacert")), "{}", w[0].1);
}

#[test]
fn bad_values_name_the_ingress_and_the_key_and_ask_for_nothing() {
    let yaml = [
        ingress("slashes", 1, "s.example.com", "shop-tls", &[(KEY, "a/b/c")]),
        ingress("empty", 2, "e.example.com", "shop-tls", &[(NGINX_KEY, "  ")]),
        ingress("upper", 3, "u.example.com", "shop-tls", &[(KEY, "Shop/CA")]),
        ingress("long", 4, "l.example.com", "shop-tls", &[(KEY, &"x".repeat(400))]),
    ]
    .concat();
    let t = run(&yaml);
    for (name, key, host) in [
        ("slashes", KEY, "s.example.com"),
        ("empty", NGINX_KEY, "e.example.com"),
        ("upper", KEY, "u.example.com"),
        ("long", KEY, "l.example.com"),
    ] {
        let w = warnings_of(&t, name);
        assert_eq!(w.len(), 1, "{name}: {w:#?}");
        assert_eq!(w[0].0, "invalid_ingress", "{name}");
        assert!(w[0].1.starts_with(&format!("annotation {key}")), "{name}: {}", w[0].1);
        assert!(w[0].1.len() < 400, "the value is clipped: {}", w[0].1);
        assert_eq!(server_of(&t, host).3, None, "{name}");
    }
}

#[test]
fn the_oldest_ingress_asking_decides_for_a_shared_host() {
    let host = "shared.example.com";
    let yaml = [
        ingress("first", 1, host, "shop-tls", &[]),
        ingress("asks", 2, host, "shop-tls", &[(KEY, "shop-tls-cacert")]),
        ingress("other-ca", 3, host, "shop-tls", &[(KEY, "shop/shop-tls")]),
    ]
    .concat();
    let t = run(&yaml);
    // As in Higress, the host asks: the certificate is the connection's.
    assert_eq!(server_of(&t, host).1, "MUTUAL");
    assert_eq!(server_of(&t, host).3, pair("shop", "shop-tls-cacert"));
    let first = warnings_of(&t, "first");
    assert_eq!(first.len(), 1, "{first:#?}");
    assert_eq!(first[0].0, "ingress_conflict");
    assert!(first[0].1.contains("Ingress shop/asks requires client certificates"), "{}", first[0].1);
    let other = warnings_of(&t, "other-ca");
    assert_eq!(other.len(), 1, "{other:#?}");
    assert_eq!(other[0].0, "ingress_conflict");
    assert!(other[0].1.starts_with(&format!("annotation {KEY}: TLS host {host} already verifies")), "{}", other[0].1);
    assert_eq!(warnings_of(&t, "asks"), vec![]);
}

#[test]
fn without_tls_or_on_a_canary_it_does_nothing_and_says_so() {
    let canary = [("higress.io/canary", "true"), ("higress.io/canary-weight", "10"), (KEY, "shop-tls-cacert")];
    let yaml = [
        ingress("no-tls", 1, "n.example.com", "", &[(KEY, "shop-tls-cacert")]),
        ingress("main", 2, "c.example.com", "shop-tls", &[]),
        ingress("main-canary", 3, "c.example.com", "shop-tls", &canary).replace("/main-canary", "/main"),
    ]
    .concat();
    let t = run(&yaml);
    let w = warnings_of(&t, "no-tls");
    assert_eq!(w.len(), 1, "{w:#?}");
    assert_eq!(w[0].0, "invalid_ingress");
    assert!(w[0].1.starts_with(&format!("annotation {KEY}: the Ingress has no spec.tls")), "{}", w[0].1);
    let w = warnings_of(&t, "main-canary");
    assert_eq!(w.len(), 1, "{w:#?}");
    assert!(w[0].1.contains("a canary Ingress makes no HTTPS server"), "{}", w[0].1);
    assert_eq!(server_of(&t, "c.example.com").1, "SIMPLE");
}

#[test]
fn ingress_nginx_keys_higress_does_not_read_stay_ignored() {
    let t = run(&ingress(
        "depth",
        1,
        "d.example.com",
        "shop-tls",
        &[(KEY, "shop-tls-cacert"), ("nginx.ingress.kubernetes.io/auth-tls-verify-depth", "2")],
    ));
    let w = warnings_of(&t, "depth");
    assert_eq!(w.len(), 1, "{w:#?}");
    assert_eq!(w[0].0, "ignored_annotation");
    assert!(w[0].1.starts_with("annotation nginx.ingress.kubernetes.io/auth-tls-verify-depth"), "{}", w[0].1);
    assert_eq!(t.ignored_annotations, 1);
    assert_eq!(server_of(&t, "d.example.com").1, "MUTUAL");
}

#[test]
fn server_names_that_collide_keep_the_suffix_they_had() {
    // `shop/a-b` and `shop-a/b` both sanitize to `shop-a-b`: the second
    // gets the hash of its Secret, as before client CAs existed.
    let yaml = [
        ingress("one", 1, "one.example.com", "a-b", &[]),
        ingress("two", 2, "two.example.com", "b", &[]).replace("namespace: shop", "namespace: shop-a"),
    ]
    .concat();
    let known = [("shop", "a-b"), ("shop-a", "b")].map(|(n, s)| (n.to_owned(), s.to_owned()));
    let opts = IngressOptions { known_secrets: known.into_iter().collect(), ..super::ingress_tests::opts() };
    let t = translate(&crate::config::ingress_docs(&yaml), &opts);
    assert_eq!(server_of(&t, "one.example.com").0, "https-443-ingress-shop-a-b");
    assert_eq!(server_of(&t, "two.example.com").0, format!("https-443-ingress-shop-a-b-{}", short_hash("shop-a/b")));
}
