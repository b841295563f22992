//! Client certificates on the standalone gateway's HTTPS listener (an
//! Ingress's `auth-tls-secret`): the chain of a server that asks requires
//! one and verifies it against the CA inline, routes by a
//! RouteConfiguration of its own, and its hosts are in no other chain's
//! routes; without a CA the server is left out, with a warning.

use envoy_types::pb::envoy::config::listener::v3::FilterChain;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::common_tls_context::ValidationContextType;

use super::*;
use crate::model::CaSecret;
use crate::translate::model::Spec;

const CA: &str = "-----BEGIN CERTIFICATE-----\nCLIENTCA\n-----END CERTIFICATE-----\n";
const BESIDE_CA: &str = "-----BEGIN CERTIFICATE-----\nBESIDECA\n-----END CERTIFICATE-----\n";

fn ca(namespace: &str, name: &str, pem: &str) -> CaSecret {
    CaSecret { namespace: namespace.into(), name: name.into(), ca_cert_pem: pem.into() }
}

/// An HTTPS server: its hosts, `tls.mode`, and client CA Secret.
type HttpsServer<'a> = (&'a [&'a str], &'a str, Option<(&'a str, &'a str)>);

/// HTTPS servers, all with the certificate `web-cert`, and one HTTP server
/// on every host.
fn gateway_of(servers: &[HttpsServer<'_>]) -> IstioObject {
    let mut list = vec![json!({"port": {"number": 80, "protocol": "HTTP", "name": "http-80"}, "hosts": ["*"]})];
    for (i, (hosts, mode, _)) in servers.iter().enumerate() {
        list.push(json!({"port": {"number": 443, "protocol": "HTTPS", "name": format!("https-{i}")}, "hosts": hosts,
            "tls": {"mode": mode, "credentialName": "web-cert"}}));
    }
    let mut gw = obj("Gateway", GW_NS, "gw", json!({ "servers": list }));
    let Spec::Gateway(spec) = &mut gw.spec else { unreachable!("a Gateway") };
    for (i, (_, _, client_ca)) in servers.iter().enumerate() {
        let tls = spec.servers[i + 1].tls.as_mut().expect("tls");
        tls.client_ca = client_ca.map(|(ns, name)| (ns.to_owned(), name.to_owned()));
    }
    gw
}

fn chains(out: &GatewayOutput) -> Vec<FilterChain> {
    let https = out.listeners.iter().find(|r| r.name.starts_with("https.")).expect("an HTTPS listener");
    decode::<Listener>(https).filter_chains
}

fn tls_context(chain: &FilterChain) -> DownstreamTlsContext {
    match chain.transport_socket.as_ref().and_then(|t| t.config_type.as_ref()) {
        Some(transport_socket::ConfigType::TypedConfig(any)) => {
            DownstreamTlsContext::decode(any.value.as_slice()).unwrap()
        }
        None => panic!("chain {} has no TLS", chain.name),
    }
}

fn rds_name(chain: &FilterChain) -> String {
    let Some(filter::ConfigType::TypedConfig(any)) = &chain.filters[0].config_type else { panic!("an HCM") };
    match HttpConnectionManager::decode(any.value.as_slice()).unwrap().route_specifier {
        Some(RouteSpecifier::Rds(rds)) => rds.route_config_name,
        other => panic!("{other:?}"),
    }
}

fn chain_for<'c>(chains: &'c [FilterChain], sni: &str) -> &'c FilterChain {
    chains
        .iter()
        .find(|c| c.filter_chain_match.as_ref().is_some_and(|m| m.server_names.iter().any(|n| n == sni)))
        .unwrap_or_else(|| panic!("no chain for {sni}"))
}

fn virtual_hosts(out: &GatewayOutput, name: &str) -> Vec<String> {
    route_config(out, name).virtual_hosts.into_iter().map(|v| v.name).collect()
}

fn trusted_ca(ctx: &DownstreamTlsContext) -> String {
    match ctx.common_tls_context.as_ref().and_then(|c| c.validation_context_type.as_ref()) {
        Some(ValidationContextType::ValidationContext(v)) => format!("{:?}", v.trusted_ca),
        other => panic!("no inline validation context: {other:?}"),
    }
}

#[test]
fn a_server_asking_for_client_certificates_requires_and_verifies_them_on_its_own_routes() {
    let hosts = ["web.example.com", "api.example.com", "mutual.example.com", "gone.example.com", "a.wild.example.com"];
    let objects = [
        gateway_of(&[
            (&["web.example.com"], "SIMPLE", None),
            // The standalone gateway's CA, whatever istiod's mode.
            (&["api.example.com"], "SIMPLE", Some(("shop", "clients-ca"))),
            // MUTUAL alone: the CA where istiod looks, `{credential}-cacert`.
            (&["mutual.example.com"], "MUTUAL", None),
            // A CA that is not there.
            (&["gone.example.com"], "MUTUAL", Some(("shop", "nope"))),
            // A wildcard: every name it covers is guarded.
            (&["*.wild.example.com"], "SIMPLE", Some(("shop", "clients-ca"))),
            // A catch-all, which must not carry the guarded hosts' routes.
            (&["*"], "SIMPLE", None),
        ]),
        vs("all", &hosts, json!([{"route": [dest("web.dc1.consul", 8080)]}])),
    ];
    let cas = [ca("shop", "clients-ca", CA), ca(GW_NS, "web-cert-cacert", BESIDE_CA), ca(GW_NS, "web-cert", CA)];
    let out = envoy_gateway(&objects, &lookup(services()), &[tls(GW_NS, "web-cert")], &cas, &opts());
    assert_routes_resolve(&out);
    let warnings = texts(&out.warnings);
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    assert!(
        warnings[0].starts_with("Gateway higress-system/gw servers[4]: client certificates are required")
            && warnings[0].contains("Secret shop/nope"),
        "{warnings:#?}"
    );
    assert!(out.warnings[0].reason == Reason::MissingSecret);

    let chains = chains(&out);
    assert_eq!(chains.len(), 5, "no chain for the server without a CA");
    let web = tls_context(chain_for(&chains, "web.example.com"));
    assert_eq!(web.require_client_certificate, None);
    assert_eq!(web.common_tls_context.as_ref().unwrap().validation_context_type, None);
    assert_eq!(rds_name(chain_for(&chains, "web.example.com")), "https.10443");

    let api_chain = chain_for(&chains, "api.example.com");
    let api = tls_context(api_chain);
    assert_eq!(api.require_client_certificate.map(|b| b.value), Some(true));
    assert!(trusted_ca(&api).contains("CLIENTCA"));
    assert_eq!(rds_name(api_chain), "https.10443.higress-system/gw.2");
    assert_eq!(virtual_hosts(&out, "https.10443.higress-system/gw.2"), ["api.example.com"]);

    let mutual_chain = chain_for(&chains, "mutual.example.com");
    let mutual = tls_context(mutual_chain);
    assert_eq!(mutual.require_client_certificate.map(|b| b.value), Some(true));
    assert!(trusted_ca(&mutual).contains("BESIDECA"), "{{credential}}-cacert before the credential's own");
    assert_eq!(virtual_hosts(&out, &rds_name(mutual_chain)), ["mutual.example.com"]);

    // The shared routes (the plain and the catch-all chains): no guarded host.
    let shared = virtual_hosts(&out, "https.10443");
    assert_eq!(shared, ["web.example.com"], "a Host header cannot reach a guarded host over another SNI");
    let route_names: Vec<&str> = out.routes.iter().map(|r| &*r.name).collect();
    assert!(!route_names.iter().any(|n| n.ends_with("gw.4")), "no routes for the server left out: {route_names:?}");
    let wild = rds_name(chain_for(&chains, "*.wild.example.com"));
    assert_eq!(virtual_hosts(&out, &wild), ["a.wild.example.com"]);
    // Only the certificate's key is served; the CAs are public and inline.
    let names: Vec<&str> = out.secrets.iter().map(|r| &*r.name).collect();
    assert_eq!(names, [format!("{GW_NS}/web-cert")]);
}

#[test]
fn mutual_falls_back_to_the_credentials_own_ca_and_other_modes_stay_unservable() {
    let objects = [
        gateway_of(&[(&["mutual.example.com"], "MUTUAL", None), (&["o.example.com"], "OPTIONAL_MUTUAL", None)]),
        vs("all", &["mutual.example.com", "o.example.com"], json!([{"route": [dest("web.dc1.consul", 8080)]}])),
    ];
    // No `web-cert-cacert`: the credential's own CA; a CA without PEM is none.
    let cas = [ca(GW_NS, "web-cert", CA), ca(GW_NS, "web-cert-cacert", "not pem")];
    let out = envoy_gateway(&objects, &lookup(services()), &[tls(GW_NS, "web-cert")], &cas, &opts());
    let chains = chains(&out);
    assert_eq!(chains.len(), 1);
    assert!(trusted_ca(&tls_context(&chains[0])).contains("CLIENTCA"));
    let warnings = texts(&out.warnings);
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    assert!(warnings[0].contains("tls.mode OPTIONAL_MUTUAL is not supported"), "{warnings:#?}");
}
