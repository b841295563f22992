//! A DestinationRule's `MUTUAL` TLS (an Ingress's `proxy-ssl-*`) on the
//! standalone gateway: the client certificate by SDS, the CA inline, and a
//! missing or unusable Secret answered 503 with a warning.

use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    Secret as SdsSecret, UpstreamTlsContext, common_tls_context::ValidationContextType, secret,
};

use super::*;

const CA: &str = "-----BEGIN CERTIFICATE-----\nTESTCA\n-----END CERTIFICATE-----\n";

fn mutual_rule(host: &str, tls: Value) -> IstioObject {
    obj("DestinationRule", GW_NS, &format!("{host}-dr"), json!({"host": host, "trafficPolicy": {"tls": tls}}))
}

fn with_ca(mut t: GatewayTls) -> GatewayTls {
    t.ca_cert_pem = Some(CA.into());
    t
}

fn cluster(out: &GatewayOutput, name: &str) -> Cluster {
    let r = out.clusters.iter().find(|r| &*r.name == name).unwrap_or_else(|| panic!("no cluster {name}"));
    decode(r)
}

fn upstream_tls(c: &Cluster) -> UpstreamTlsContext {
    let socket = c.transport_socket.as_ref().expect("a TLS transport socket");
    match socket.config_type.as_ref().unwrap() {
        transport_socket::ConfigType::TypedConfig(any) => UpstreamTlsContext::decode(any.value.as_slice()).unwrap(),
    }
}

#[test]
fn mutual_tls_presents_the_secret_by_sds_and_verifies_with_its_ca() {
    let objects = [
        http_gateway(),
        vs("web", &["web.example.com"], json!([{"route": [dest("web.dc1.consul", 8080)]}])),
        vs("api", &["api.example.com"], json!([{"route": [dest("api.dc1.consul", 9090)]}])),
        // Verified, with an SNI; the Secret in the gateway's namespace.
        mutual_rule("web.dc1.consul", json!({"mode": "MUTUAL", "credentialName": "client", "sni": "web.internal"})),
        // Not verified, a Secret elsewhere named as Istio's cross-namespace form.
        mutual_rule(
            "api.dc1.consul",
            json!({"mode": "MUTUAL", "credentialName": "kubernetes-gateway://shop/api-client", "insecureSkipVerify": true}),
        ),
    ];
    let secrets = [with_ca(tls(GW_NS, "client")), tls("shop", "api-client")];
    let out = gateway(&objects, &secrets);
    assert_routes_resolve(&out);
    assert!(out.warnings.is_empty(), "{:#?}", texts(&out.warnings));

    let web = upstream_tls(&cluster(&out, "outbound|8080|_policy|web.dc1.consul"));
    assert_eq!(web.sni, "web.internal");
    let common = web.common_tls_context.unwrap();
    let sds: Vec<&str> = common.tls_certificate_sds_secret_configs.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(sds, [format!("{GW_NS}/client")], "the key goes by SDS, never in the cluster");
    match common.validation_context_type {
        Some(ValidationContextType::ValidationContext(v)) => {
            assert!(format!("{:?}", v.trusted_ca).contains("TESTCA"), "{v:?}")
        }
        other => panic!("verified against the Secret's ca.crt, got {other:?}"),
    }

    let api = upstream_tls(&cluster(&out, "outbound|9090|_policy|api.dc1.consul"));
    let common = api.common_tls_context.unwrap();
    assert_eq!(common.tls_certificate_sds_secret_configs[0].name, "shop/api-client");
    assert_eq!(common.validation_context_type, None, "insecureSkipVerify: nothing checked");
    assert_eq!(common.alpn_protocols, ["h2"], "a gRPC service keeps HTTP/2 over TLS");

    // Both certificates are served by SDS, with their keys; no cluster has one.
    let names: Vec<&str> = out.secrets.iter().map(|r| &*r.name).collect();
    assert_eq!(names, ["higress-system/client", "shop/api-client"]);
    let served: SdsSecret = decode(&out.secrets[0]);
    assert!(matches!(served.r#type, Some(secret::Type::TlsCertificate(_))));
    for c in &out.clusters {
        assert!(!format!("{:?}", c.body).contains("TESTKEY"), "a key in cluster {}", c.name);
    }
}

#[test]
fn mutual_tls_without_a_usable_secret_answers_503_and_warns() {
    let objects = [
        http_gateway(),
        vs("web", &["web.example.com"], json!([{"route": [dest("web.dc1.consul", 8080)]}])),
        vs("api", &["api.example.com"], json!([{"route": [dest("api.dc1.consul", 9090)]}])),
        mutual_rule("web.dc1.consul", json!({"mode": "MUTUAL", "credentialName": "nope", "insecureSkipVerify": true})),
        // Verification asked for, and the Secret has no ca.crt.
        mutual_rule("api.dc1.consul", json!({"mode": "MUTUAL", "credentialName": "client"})),
    ];
    let out = gateway(&objects, &[tls(GW_NS, "client")]);
    let warnings = texts(&out.warnings);
    assert_eq!(warnings.len(), 2, "{warnings:#?}");
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("host web.dc1.consul: no client certificate for mutual TLS: credentialName \"nope\"")
                && w.contains("answering 503")),
        "{warnings:#?}"
    );
    assert!(
        warnings.iter().any(|w| w.contains(
            "host api.dc1.consul: no client certificate for mutual TLS: secret higress-system/client has no PEM ca.crt"
        )),
        "{warnings:#?}"
    );
    assert!(out.clusters.is_empty() && out.secrets.is_empty(), "no cluster and no key for a broken rule");
    assert!(!warnings.concat().contains("TESTKEY"));
}
