//! `proxy-ssl-*`: upstream TLS from an Ingress, as Higress's
//! `upstreamtls.go` reads it, in the DestinationRule of each host it
//! routes to, with the `credentialName` stock istiod reads.

use super::ingress_tests::{run, warnings_of};
use super::*;

fn ingress(name: &str, dest: &str, annotations: &[(&str, &str)]) -> String {
    let mut yaml = format!(
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: {name}\n  namespace: shop\n  \
         annotations:\n    higress.io/destination: \"{dest}\"\n"
    );
    for (k, v) in annotations {
        yaml.push_str(&format!("    {k}: {}\n", serde_json::to_string(v).unwrap()));
    }
    yaml.push_str(&format!(
        "spec:\n  ingressClassName: higress\n  rules:\n    - host: {name}.example.com\n      http:\n        paths:\n          \
         - {{path: /, pathType: Prefix, backend: {{resource: {{apiGroup: networking.higress.io, kind: McpBridge, \
         name: default}}}}}}\n---\n"
    ));
    yaml
}

/// The `tls` of the DestinationRule for `host`, as JSON (`null` without).
fn tls_of(t: &IngressTranslation, host: &str) -> serde_json::Value {
    t.objects
        .iter()
        .find_map(|o| match &o.spec {
            Spec::DestinationRule(d) if d.host == host => Some(serde_json::to_value(&d.traffic_policy).unwrap()),
            _ => None,
        })
        .map(|p| p["tls"].clone())
        .unwrap_or(serde_json::Value::Null)
}

const NGINX: &str = "nginx.ingress.kubernetes.io/";

fn nginx(key: &str) -> String {
    format!("{NGINX}{key}")
}

#[test]
fn proxy_ssl_secret_makes_mutual_tls_with_the_credential_stock_istiod_reads() {
    let (proto, secret, verify, name, server_name) = (
        nginx("backend-protocol"),
        nginx("proxy-ssl-secret"),
        nginx("proxy-ssl-verify"),
        nginx("proxy-ssl-name"),
        nginx("proxy-ssl-server-name"),
    );
    let yaml = [
        // The Ingress's own namespace; verified; an SNI.
        ingress(
            "mtls",
            "a.dc1.consul:443",
            &[
                (&proto, "HTTPS"),
                (&secret, "other-tls"),
                (&verify, "on"),
                (&name, "backend.internal"),
                (&server_name, "on"),
            ],
        ),
        // The gateway's namespace, under higress.io/; gRPC over mutual TLS.
        ingress(
            "gateway-ns",
            "b.dc1.consul:443",
            &[("higress.io/backend-protocol", "GRPCS"), ("higress.io/proxy-ssl-secret", "higress-system/wildcard-tls")],
        ),
        // No Secret: SIMPLE, unverified, as Higress; the verify and the name
        // without server-name are reported.
        ingress("simple", "c.dc1.consul:443", &[(&proto, "HTTPS"), (&verify, "on"), (&name, "backend.internal")]),
    ]
    .concat();
    let t = run(&yaml);

    assert_eq!(
        tls_of(&t, "a.dc1.consul"),
        serde_json::json!({"mode": "MUTUAL", "sni": "backend.internal", "credentialName": "kubernetes-gateway://shop/other-tls"})
    );
    assert_eq!(
        warnings_of(&t, "mtls"),
        [(
            "standalone_only".to_owned(),
            "annotation nginx.ingress.kubernetes.io/proxy-ssl-secret: Secret shop/other-tls is not in the gateway's \
             namespace higress-system; stock istiod serves a DestinationRule's credentialName only from there, so \
             through istiod the backend gets no client certificate (copy the Secret into higress-system)"
                .to_owned()
        )]
    );

    assert_eq!(
        tls_of(&t, "b.dc1.consul"),
        serde_json::json!({"mode": "MUTUAL", "insecureSkipVerify": true, "credentialName": "wildcard-tls"})
    );
    assert!(warnings_of(&t, "gateway-ns").is_empty(), "{:#?}", t.warnings);

    assert_eq!(tls_of(&t, "c.dc1.consul"), serde_json::json!({"mode": "SIMPLE", "insecureSkipVerify": true}));
    let simple: Vec<String> = warnings_of(&t, "simple").into_iter().map(|(_, d)| d).collect();
    assert_eq!(
        simple,
        [
            "annotation nginx.ingress.kubernetes.io/proxy-ssl-name has no effect without proxy-ssl-server-name: on",
            "annotation nginx.ingress.kubernetes.io/proxy-ssl-verify: on needs the CA (ca.crt) of a proxy-ssl-secret; \
             the backend is not verified",
        ]
    );
    assert_eq!(t.ignored_annotations, 0, "no proxy-ssl-* key is ignored any more");
}

#[test]
fn bad_proxy_ssl_values_are_reported_and_the_rest_stands() {
    let (proto, secret, verify, server_name) = (
        nginx("backend-protocol"),
        nginx("proxy-ssl-secret"),
        nginx("proxy-ssl-verify"),
        nginx("proxy-ssl-server-name"),
    );
    let yaml = [
        // A malformed name and a non on/off value: SIMPLE TLS, unverified.
        ingress(
            "bad",
            "a.dc1.consul:443",
            &[(&proto, "HTTPS"), (&secret, "a/b/c"), (&verify, "yes"), (&server_name, "ON")],
        ),
        // A Secret that does not exist: the rule still names it (fail
        // closed), and a warning says so.
        ingress("missing", "b.dc1.consul:443", &[(&proto, "HTTPS"), (&secret, "higress-system/nope")]),
        // Without TLS to the backend (no protocol, so HTTP), as Higress:
        // nothing, but reported here.
        ingress("plain", "c.dc1.consul:80", &[(&secret, "other-tls"), (&verify, "on")]),
        // A routed host of its own is not disturbed.
        ingress("fine", "d.dc1.consul:80", &[]),
    ]
    .concat();
    let t = run(&yaml);

    assert_eq!(tls_of(&t, "a.dc1.consul"), serde_json::json!({"mode": "SIMPLE", "insecureSkipVerify": true}));
    let bad: Vec<String> = warnings_of(&t, "bad").into_iter().map(|(_, d)| d).collect();
    assert_eq!(
        bad,
        [
            "annotation nginx.ingress.kubernetes.io/proxy-ssl-verify: \"yes\" is not on or off; taken as off",
            "annotation nginx.ingress.kubernetes.io/proxy-ssl-server-name: \"ON\" is not on or off; taken as off",
            "annotation nginx.ingress.kubernetes.io/proxy-ssl-secret: \"a/b/c\" is not [namespace/]name of a Secret; \
             no client certificate",
        ]
    );

    assert_eq!(
        tls_of(&t, "b.dc1.consul"),
        serde_json::json!({"mode": "MUTUAL", "insecureSkipVerify": true, "credentialName": "nope"})
    );
    assert_eq!(
        warnings_of(&t, "missing"),
        [(
            "missing_secret".to_owned(),
            "annotation nginx.ingress.kubernetes.io/proxy-ssl-secret: no Secret higress-system/nope with tls.crt and \
             tls.key; connections to the backend present no client certificate and fail"
                .to_owned()
        )]
    );

    assert_eq!(tls_of(&t, "c.dc1.consul"), serde_json::Value::Null);
    let plain: Vec<String> = warnings_of(&t, "plain").into_iter().map(|(_, d)| d).collect();
    assert_eq!(plain.len(), 2, "{plain:#?}");
    assert!(plain[0].starts_with("annotation nginx.ingress.kubernetes.io/proxy-ssl-secret has no effect without TLS"));

    assert!(warnings_of(&t, "fine").is_empty());
    let routed: Vec<&str> =
        t.objects.iter().filter(|o| o.kind() == "VirtualService").map(|o| o.metadata.name.as_str()).collect();
    assert_eq!(routed.len(), 4, "every Ingress routes: {routed:?}");
}
