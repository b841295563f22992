//! `registryTls` (meshbridge only) and the plain-HTTP credentials warning.

use meshbridge_registries::RegistryKind;

use super::build::{Builder, Built};
use super::parse_documents;

const BRIDGE: &str = "McpBridge higress-system/default";
/// A self-signed CA certificate (made once with the openssl CLI; only its
/// shape matters here: the e2e tests make their own CAs and servers).
const CA: &str = include_str!("testdata/test-ca.pem");

fn build(registries: &str, secret_data: &str) -> Built {
    let mut text = format!(
        "apiVersion: networking.higress.io/v1\nkind: McpBridge\n\
         metadata: {{name: default, namespace: higress-system}}\nspec:\n  registries:\n{registries}"
    );
    if !secret_data.is_empty() {
        text.push_str(&format!(
            "---\napiVersion: v1\nkind: Secret\nmetadata: {{name: reg-auth, namespace: higress-system}}\n\
             stringData:\n{secret_data}"
        ));
    }
    let docs = parse_documents("test.yaml", &text).expect("parses");
    Builder::default().build_full(&docs)
}

fn ca_data() -> String {
    let indented: String = CA.lines().map(|l| format!("    {l}\n")).collect();
    format!("  consulToken: tok-5e3f\n  ca.crt: |\n{indented}")
}

#[test]
fn no_registry_tls_means_plain_http_as_in_higress() {
    let built = build("    - {type: consul, name: c, domain: 127.0.0.1, port: 8500}\n", "");
    assert_eq!(built.desired.errors, Vec::<String>::new());
    assert_eq!(built.desired.registries[0].tls, None);
    // Higress's own `protocol`/`sni` are about the services: no TLS to Consul.
    let built = build("    - {type: consul, name: c, domain: 127.0.0.1, port: 8500, protocol: https, sni: x.io}\n", "");
    assert_eq!(built.desired.registries[0].tls, None);
    // Explicitly off, with leftovers: off, and a warning.
    let built = build(
        "    - {type: consul, name: c, domain: 127.0.0.1, port: 8500, registryTls: {enabled: false, serverName: a}}\n",
        "",
    );
    assert_eq!(built.desired.registries[0].tls, None);
    assert!(built.warnings.iter().any(|w| w.contains("registryTls: enabled is false")), "{:?}", built.warnings);
}

#[test]
fn registry_tls_with_a_ca_from_the_auth_secret() {
    let entry = "    - type: consul\n      name: c\n      domain: 10.0.0.5\n      port: 8501\n      \
                 authSecretName: reg-auth\n      registryTls: {enabled: true, caKey: ca.crt, serverName: consul.internal}\n";
    let built = build(entry, &ca_data());
    assert_eq!(built.desired.errors, Vec::<String>::new());
    let tls = built.desired.registries[0].tls.clone().expect("tls on");
    assert_eq!(tls.ca_pem.as_deref(), Some(CA));
    assert_eq!(tls.server_name.as_deref(), Some("consul.internal"));
    assert!(!built.warnings.iter().any(|w| w.contains("plain HTTP")), "{:?}", built.warnings);
    // Debug shows the bundle's size, not its text.
    let debug = format!("{:?}", built.desired.registries[0]);
    assert!(!debug.contains("BEGIN CERTIFICATE") && !debug.contains("tok-5e3f"), "{debug}");

    // Default roots: no caKey, no Secret needed.
    let built =
        build("    - {type: eureka, name: e, domain: eureka.example, port: 8761, registryTls: {enabled: true}}\n", "");
    assert_eq!(built.desired.errors, Vec::<String>::new());
    assert_eq!(built.desired.registries[0].tls.as_ref().map(|t| t.ca_pem.is_none()), Some(true));
}

#[test]
fn registry_tls_errors_name_object_and_field() {
    let cases: [(&str, &str, &str); 7] = [
        (
            "    - {type: zookeeper, name: z, domain: zk, port: 2181, registryTls: {enabled: true}}\n",
            "",
            "spec.registries[0].registryTls.enabled: TLS is not supported for zookeeper registries",
        ),
        (
            "    - {type: consul, name: c, domain: c.io, port: 8501, registryTls: {enabled: true, caKey: ca.crt}}\n",
            "",
            "spec.registries[0].registryTls.caKey: needs authSecretName: the CA bundle is read from that Secret",
        ),
        (
            "    - {type: consul, name: c, domain: c.io, port: 8501, authSecretName: reg-auth, registryTls: {enabled: true, caKey: ca.pem}}\n",
            "  consulToken: tok-5e3f\n",
            "spec.registries[0].registryTls.caKey: key \"ca.pem\" not found in secret \"reg-auth\"",
        ),
        (
            "    - {type: consul, name: c, domain: c.io, port: 8501, authSecretName: reg-auth, registryTls: {enabled: true, caKey: consulToken}}\n",
            "  consulToken: tok-5e3f\n",
            "spec.registries[0].registryTls.caKey: secret \"reg-auth\" key \"consulToken\": no PEM certificate",
        ),
        (
            "    - {type: nacos, name: nn, domain: n.io, port: 8848, registryTls: {enabled: true, serverName: 'a b'}}\n",
            "",
            "spec.registries[0].registryTls.serverName: \"a b\": not a DNS name or IP address",
        ),
        (
            "    - {type: nacos2, name: nn, domain: '', port: 8848, nacosAddressServer: 'http://as.io', registryTls: {enabled: true}}\n",
            "",
            "spec.registries[0].nacosAddressServer: an http:// URL while registryTls is enabled",
        ),
        (
            "    - {type: consul, name: c, domain: c.io, port: 8501, registryTls: {enabled: true, insecure: true}}\n",
            "",
            "spec.registries[0].registryTls.insecure: unknown field `insecure`",
        ),
    ];
    for (entry, secret, want) in cases {
        let built = build(entry, secret);
        let errors = built.desired.errors.join("\n");
        assert!(errors.starts_with(&format!("{BRIDGE}: {want}")), "{entry}\nwant {want}\ngot {errors}");
        assert!(!errors.contains("tok-5e3f"), "{errors}");
        assert!(built.desired.registries.is_empty());
    }
}

#[test]
fn credentials_over_plain_http_to_a_remote_host_warn_without_the_value() {
    let secret = "  consulToken: tok-5e3f\n  nacosUsername: nacos\n  nacosPassword: pw-9a1c\n";
    let warned = |entry: &str| {
        let built = build(entry, secret);
        assert_eq!(built.desired.errors, Vec::<String>::new(), "{entry}");
        let text = built.warnings.join("\n");
        assert!(!text.contains("tok-5e3f") && !text.contains("pw-9a1c"), "{text}");
        built.warnings.into_iter().find(|w| w.contains("plain HTTP"))
    };
    let w =
        warned("    - {type: consul, name: remote, domain: consul.example, port: 8500, authSecretName: reg-auth}\n");
    assert_eq!(
        w.as_deref(),
        Some(
            "McpBridge higress-system/default: spec.registries[0]: registry \"remote\" sends consulToken over plain \
             HTTP to a non-loopback address; set registryTls.enabled: true for https"
        )
    );
    let w =
        warned("    - {type: nacos2, name: nn, domain: '10.0.0.1,127.0.0.1', port: 8848, authSecretName: reg-auth}\n");
    assert!(w.is_some_and(|w| w.contains("sends nacosPassword over plain HTTP")));
    let w =
        warned("    - {type: nacos, name: nn, domain: n.io, port: 8848, nacosAccessKey: ak1, nacosSecretKey: sk1}\n");
    assert!(w.is_some_and(|w| w.contains("sends nacosSecretKey")), "AK/SK signatures");
    // Loopback, TLS on, or no credentials: no warning.
    assert_eq!(
        warned("    - {type: consul, name: l, domain: localhost, port: 8500, authSecretName: reg-auth}\n"),
        None
    );
    assert_eq!(
        warned("    - {type: nacos, name: l, domain: '[::1]:8848', port: 8848, authSecretName: reg-auth}\n"),
        None
    );
    assert_eq!(
        warned(
            "    - {type: consul, name: t, domain: c.io, port: 8501, authSecretName: reg-auth, registryTls: {enabled: true}}\n"
        ),
        None
    );
    assert_eq!(warned("    - {type: consul, name: nn, domain: c.io, port: 8500}\n"), None);
    // A token in the Secret that this registry type does not send: no warning.
    assert_eq!(warned("    - {type: eureka, name: e, domain: e.io, port: 8761, authSecretName: reg-auth}\n"), None);
    let _ = RegistryKind::Consul;
}
