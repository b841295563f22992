use clap::Parser;

use super::*;

fn cmd(extra: &[&str]) -> CheckCommand {
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        check: CheckCommand,
    }
    let args = ["check", "-"].iter().chain(extra);
    Cli::try_parse_from(args).expect("flags parse").check
}

fn report(yaml: &str, extra: &[&str]) -> Report {
    let mut state = ConfigState::new();
    state.set_file("test.yaml", yaml.to_owned());
    check_state("test.yaml".into(), state, &cmd(extra))
}

const BRIDGE: &str = "apiVersion: networking.higress.io/v1
kind: McpBridge
metadata: {name: default, namespace: higress-system}
spec:
  registries:
";

fn ingress(backend: &str) -> String {
    format!(
        "---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: web
  namespace: shop
  annotations: {{higress.io/destination: shop.DEFAULT-GROUP.public.nacos}}
spec:
  ingressClassName: higress
  rules:
  - host: shop.example.com
    http:
      paths:
      - {{path: /, pathType: Prefix, backend: {backend}}}
"
    )
}

#[test]
fn a_bad_entry_is_an_error_naming_object_and_field_and_the_rest_is_still_read() {
    let yaml = format!(
        "{BRIDGE}  - {{type: nacos2, name: bad, domain: 127.0.0.1, port: 99999}}
  - {{type: consul, name: good, domain: 127.0.0.1, port: 8500}}
"
    );
    let r = report(&yaml, &[]);
    assert_eq!(r.errors.len(), 1, "{r:?}");
    assert!(r.errors[0].starts_with("McpBridge higress-system/default: spec.registries[0].port"), "{r:?}");
    assert_eq!((r.mcp_bridges, r.registries), (1, 1));
    assert!(r.failed(false));
}

#[test]
fn unknown_fields_warn_as_the_server_logs_them() {
    let yaml = format!("{BRIDGE}  - {{type: consul, name: c, domain: 127.0.0.1, port: 8500, colour: red}}\n");
    let r = report(&yaml, &[]);
    assert!(r.errors.is_empty(), "{r:?}");
    assert_eq!(
        r.warnings,
        [Problem {
            object: "McpBridge higress-system/default".into(),
            reason: "config",
            detail: "spec.registries[0].colour: unknown field, ignored".into(),
        }]
    );
    assert!(!r.failed(false));
    assert!(r.failed(true), "--strict fails on warnings");
}

#[test]
fn each_field_higress_crd_prunes_is_a_warning_and_only_those() {
    let fields: Vec<&str> =
        crate::kube::HIGRESS_CRD_PRUNES.iter().map(|p| p.strip_prefix("spec.registries[].").unwrap()).collect();
    let yaml = format!(
        "{BRIDGE}  - {{type: nacos2, name: n1, domain: 127.0.0.1, port: 8848, nacosTimeout: 3000, ecdhCurves: [X25519], \
         meshbridgeWatch: {{services: [a]}}, meshbridgeMigration: {{weight: 10}}, registryTls: {{enabled: false}}}}
  - {{type: nacos2, name: n2, domain: 127.0.0.1, port: 8848}}
"
    );
    let r = report(&yaml, &[]);
    let pruned: Vec<&str> =
        r.warnings.iter().filter(|w| w.reason == "pruned_by_higress_crd").map(|w| &*w.detail).collect();
    assert_eq!(pruned.len(), fields.len(), "{r:#?}");
    for (detail, field) in pruned.iter().zip(&fields) {
        assert!(detail.starts_with(&format!("spec.registries[0].{field}: ")), "{detail}");
    }
}

#[test]
fn a_registry_host_is_not_a_warning_offline_but_a_service_backend_is() {
    let bridge = format!("{BRIDGE}  - {{type: nacos2, name: nacos, domain: 127.0.0.1, port: 8848}}\n");
    let to_registry = ingress("{resource: {apiGroup: networking.higress.io, kind: McpBridge, name: default}}");
    let r = report(&format!("{bridge}{to_registry}"), &[]);
    assert!(r.warnings.is_empty() && r.errors.is_empty(), "{r:#?}");

    let to_service = ingress("{service: {name: web, port: {number: 8080}}}");
    let r = report(&format!("{bridge}{to_service}"), &[]);
    assert_eq!(r.warnings.len(), 1, "{r:#?}");
    assert_eq!(r.warnings[0].reason, "no_cluster");
    assert!(r.warnings[0].detail.contains("web.shop.svc.cluster.local is a Kubernetes Service"), "{r:#?}");
    // In Kubernetes mode the Service's endpoints are read from the cluster.
    let r = report(&format!("{bridge}{to_service}"), &["--kube"]);
    assert!(r.warnings.is_empty(), "{r:#?}");
}

#[test]
fn translation_warnings_are_the_servers() {
    let yaml = format!(
        "{BRIDGE}  - {{type: nacos2, name: nacos, domain: 127.0.0.1, port: 8848}}\n{}",
        ingress("{resource: {apiGroup: networking.higress.io, kind: McpBridge, name: default}}")
            .replace("annotations: {", "annotations: {nginx.ingress.kubernetes.io/auth-tls-verify-depth: \"2\", ")
    );
    let r = report(&yaml, &[]);
    assert_eq!(r.warnings.len(), 1, "{r:#?}");
    assert_eq!(r.warnings[0].object, "Ingress shop/web");
    assert_eq!(r.warnings[0].reason, "ignored_annotation");
    // Another ingress class is not ours: nothing to say about it.
    let r = report(&yaml, &["--ingress-class", "nginx"]);
    assert!(r.warnings.is_empty(), "{r:#?}");
}

#[test]
fn a_file_that_does_not_parse_is_an_error_with_its_line() {
    let r = report("kind: McpBridge\nspec: [\n", &[]);
    assert_eq!(r.errors.len(), 1, "{r:?}");
    assert!(r.errors[0].contains("test.yaml"), "{r:?}");
}
