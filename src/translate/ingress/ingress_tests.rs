//! Snapshot tests of the Ingress translation: Ingress YAML, read by the real
//! config loader, to the exact Istio objects and warnings.

use std::collections::BTreeSet;

use super::*;
use crate::config::ingress_docs as docs;

pub(super) fn opts() -> IngressOptions {
    IngressOptions {
        ingress_class: Some(DEFAULT_INGRESS_CLASS.into()),
        gateway_namespace: "higress-system".into(),
        gateway_name: "higress-gateway".into(),
        known_secrets: BTreeSet::from([
            ("shop".to_owned(), "shop-tls".to_owned()),
            ("shop".to_owned(), "other-tls".to_owned()),
            ("higress-system".to_owned(), "wildcard-tls".to_owned()),
        ]),
        known_ca_secrets: BTreeSet::from([
            ("shop".to_owned(), "shop-tls".to_owned()),
            ("shop".to_owned(), "shop-tls-cacert".to_owned()),
            ("shop".to_owned(), "clients-ca".to_owned()),
        ]),
        service_hosts: Default::default(),
    }
}

pub(super) fn run(yaml: &str) -> IngressTranslation {
    translate(&docs(yaml), &opts())
}

/// The (reason, detail) of each warning about Ingress `shop/{ingress}`.
pub(super) fn warnings_of(t: &IngressTranslation, ingress: &str) -> Vec<(String, String)> {
    t.warnings
        .iter()
        .filter(|w| w.object == format!("Ingress shop/{ingress}"))
        .map(|w| (w.reason.as_str().to_owned(), w.detail.clone()))
        .collect()
}

/// Route names of every VirtualService, in order: what a test about which
/// Ingresses count needs to see, without the whole objects.
fn route_names(t: &IngressTranslation) -> Vec<String> {
    t.objects
        .iter()
        .filter(|o| o.kind() == "VirtualService")
        .flat_map(|o| o.spec.to_json()["http"].as_array().cloned().unwrap_or_default())
        .map(|r| r["name"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[test]
fn paths_exact_prefix_and_implementation_specific() {
    let t = run(r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: shop, namespace: shop}
spec:
  ingressClassName: higress
  rules:
    - host: shop.example.com
      http:
        paths:
          - {path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}
          - {path: /api/, pathType: Prefix, backend: {service: {name: api, port: {number: 8080}}}}
          - {path: /checkout, pathType: Exact, backend: {service: {name: checkout, port: {number: 80}}}}
          - {path: /static, pathType: ImplementationSpecific, backend: {service: {name: cdn, port: {number: 80}}}}
          - {path: /api/v2, pathType: Prefix, backend: {service: {name: api-v2, port: {number: 8080}}}}
          - {path: /, pathType: Exact, backend: {service: {name: home, port: {number: 80}}}}
          - {path: /legacy, backend: {service: {name: legacy, port: {number: 80}}}}
          - {path: relative, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}
          - {path: /re, pathType: Regex, backend: {service: {name: web, port: {number: 80}}}}
"#);
    insta::assert_json_snapshot!(t);
}

#[test]
fn hosts_exact_wildcard_and_none() {
    let t = run(r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: hosts, namespace: shop}
spec:
  rules:
    - host: shop.example.com
      http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: shop, port: {number: 80}}}}]}
    - host: "*.example.com"
      http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: wild, port: {number: 80}}}}]}
    - http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: any, port: {number: 80}}}}]}
    - host: API.Example.COM
      http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: api, port: {number: 80}}}}]}
    - host: "bad_host!"
      http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: nope, port: {number: 80}}}}]}
    - host: tls-only.example.com
"#);
    insta::assert_json_snapshot!(t);
}

#[test]
fn tls_known_and_unknown_secrets() {
    let t = run(r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: shop, namespace: shop, creationTimestamp: "2024-01-01T00:00:00Z"}
spec:
  tls:
    - {hosts: [shop.example.com, www.example.com], secretName: shop-tls}
    - {hosts: [admin.example.com], secretName: missing-tls}
    - {hosts: [nosecret.example.com]}
  rules:
    - host: shop.example.com
      http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: shop, port: {number: 80}}}}]}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: later, namespace: shop, creationTimestamp: "2024-02-01T00:00:00Z"}
spec:
  tls:
    - {hosts: [www.example.com, blog.example.com], secretName: other-tls}
    - {hosts: [shop.example.com], secretName: shop-tls}
  rules:
    - host: blog.example.com
      http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: blog, port: {number: 80}}}}]}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: wildcard, namespace: higress-system}
spec:
  tls:
    - secretName: wildcard-tls
  rules:
    - http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: fallback, port: {number: 80}}}}]}
"#);
    insta::assert_json_snapshot!(t);
}

#[test]
fn mcp_bridge_destinations_with_weights_and_subsets() {
    let t = run(r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: orders
  namespace: higress-system
  annotations:
    higress.io/destination: |
      80% orders.DEFAULT-GROUP.public.nacos:8080 v1
      20% orders.DEFAULT-GROUP.public.nacos:8080 v2
spec:
  ingressClassName: higress
  rules:
    - host: shop.example.com
      http:
        paths:
          - path: /orders
            pathType: Prefix
            backend: {resource: {apiGroup: networking.higress.io, kind: McpBridge, name: default}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: users
  namespace: higress-system
  annotations:
    higress.io/destination: users.dc1.consul
spec:
  ingressClassName: higress
  rules:
    - host: shop.example.com
      http:
        paths:
          - path: /users
            pathType: Prefix
            backend: {resource: {apiGroup: networking.higress.io, kind: McpBridge, name: default}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: canary
  namespace: default
  annotations:
    higress.io/destination: "100% orders.DEFAULT-GROUP.public.nacos:8080 v3"
spec:
  ingressClassName: higress
  rules:
    - host: canary.example.com
      http:
        paths:
          - path: /
            pathType: Prefix
            backend: {resource: {apiGroup: networking.higress.io, kind: McpBridge, name: default}}
"#);
    insta::assert_json_snapshot!(t);
}

#[test]
fn malformed_destination_leaves_the_path_out_with_a_warning() {
    let t = run(r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: bad-weights
  namespace: higress-system
  annotations:
    higress.io/destination: |
      80% orders.DEFAULT-GROUP.public.nacos:8080 v1
      30% orders.DEFAULT-GROUP.public.nacos:8080 v2
spec:
  rules:
    - host: shop.example.com
      http:
        paths:
          - path: /orders
            pathType: Prefix
            backend: {resource: {apiGroup: networking.higress.io, kind: McpBridge, name: default}}
          - path: /web
            pathType: Prefix
            backend: {service: {name: web, port: {number: 80}}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: bad-port
  namespace: higress-system
  annotations:
    higress.io/destination: "orders.nacos:http"
spec:
  rules:
    - host: shop.example.com
      http:
        paths:
          - path: /bad-port
            pathType: Prefix
            backend: {resource: {apiGroup: networking.higress.io, kind: McpBridge, name: default}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: no-annotation, namespace: higress-system}
spec:
  rules:
    - host: shop.example.com
      http:
        paths:
          - path: /missing
            pathType: Prefix
            backend: {resource: {apiGroup: networking.higress.io, kind: McpBridge, name: default}}
          - path: /other-resource
            pathType: Prefix
            backend: {resource: {apiGroup: example.com, kind: Bucket, name: assets}}
"#);
    insta::assert_json_snapshot!(t);
}

#[test]
fn service_backends() {
    let t = run(r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: services, namespace: shop}
spec:
  rules:
    - host: shop.example.com
      http:
        paths:
          - {path: /number, pathType: Prefix, backend: {service: {name: web, port: {number: 8080}}}}
          - {path: /named, pathType: Prefix, backend: {service: {name: web, port: {name: http}}}}
          - {path: /zero, pathType: Prefix, backend: {service: {name: web, port: {number: 0}}}}
          - {path: /huge, pathType: Prefix, backend: {service: {name: web, port: {number: 70000}}}}
          - {path: /no-port, pathType: Prefix, backend: {service: {name: web}}}
          - {path: /bad-name, pathType: Prefix, backend: {service: {name: Web_Svc, port: {number: 80}}}}
          - {path: /no-backend, pathType: Prefix}
"#);
    insta::assert_json_snapshot!(t);
}

#[test]
fn default_backend() {
    let t = run(r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: first, namespace: shop, creationTimestamp: "2024-01-01T00:00:00Z"}
spec:
  defaultBackend: {service: {name: fallback, port: {number: 80}}}
  rules:
    - host: shop.example.com
      http: {paths: [{path: /api, pathType: Prefix, backend: {service: {name: api, port: {number: 80}}}}]}
    - host: home.example.com
      http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: home, port: {number: 80}}}}]}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: second, namespace: shop, creationTimestamp: "2024-02-01T00:00:00Z"}
spec:
  defaultBackend: {service: {name: other-fallback, port: {number: 80}}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: registry-default
  namespace: higress-system
  creationTimestamp: "2024-03-01T00:00:00Z"
  annotations:
    higress.io/destination: "catalog.public.nacos:8080"
spec:
  defaultBackend: {resource: {apiGroup: networking.higress.io, kind: McpBridge, name: default}}
  rules:
    - host: catalog.example.com
      http: {paths: [{path: /items, pathType: Exact, backend: {resource: {apiGroup: networking.higress.io, kind: McpBridge, name: default}}}]}
"#);
    insta::assert_json_snapshot!(t);
}

#[test]
fn rewrite_target_and_rewrite_path() {
    let t = run(r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: target
  namespace: shop
  annotations:
    higress.io/rewrite-target: /backend
spec:
  rules:
    - host: shop.example.com
      http:
        paths:
          - {path: /api/, pathType: Prefix, backend: {service: {name: api, port: {number: 80}}}}
          - {path: /v1.0/exact, pathType: Exact, backend: {service: {name: api, port: {number: 80}}}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: nginx-target
  namespace: shop
  annotations:
    nginx.ingress.kubernetes.io/rewrite-target: /
    nginx.ingress.kubernetes.io/ignore-path-case: "true"
spec:
  rules:
    - host: shop.example.com
      http:
        paths:
          - {path: /Static, pathType: Prefix, backend: {service: {name: cdn, port: {number: 80}}}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: path
  namespace: shop
  annotations:
    higress.io/rewrite-path: /v2
    higress.io/rewrite-target: /ignored-when-rewrite-path-is-set
spec:
  rules:
    - host: shop.example.com
      http:
        paths:
          - {path: /old, pathType: Prefix, backend: {service: {name: api, port: {number: 80}}}}
          - {path: /old-exact, pathType: Exact, backend: {service: {name: api, port: {number: 80}}}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: captures
  namespace: shop
  annotations:
    nginx.ingress.kubernetes.io/rewrite-target: /$2
spec:
  rules:
    - host: shop.example.com
      http:
        paths:
          - {path: "/something(/|$)(.*)", pathType: ImplementationSpecific, backend: {service: {name: api, port: {number: 80}}}}
"#);
    insta::assert_json_snapshot!(t);
}

#[test]
fn ignore_path_case() {
    let t = run(r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: insensitive
  namespace: shop
  annotations:
    higress.io/ignore-path-case: "true"
spec:
  rules:
    - host: shop.example.com
      http:
        paths:
          - {path: /Docs, pathType: Prefix, backend: {service: {name: docs, port: {number: 80}}}}
          - {path: /FAQ, pathType: Exact, backend: {service: {name: docs, port: {number: 80}}}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: sensitive
  namespace: shop
  annotations:
    nginx.ingress.kubernetes.io/ignore-path-case: "false"
spec:
  rules:
    - host: shop.example.com
      http:
        paths:
          - {path: /Blog, pathType: Prefix, backend: {service: {name: blog, port: {number: 80}}}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: unquoted-and-unparseable
  namespace: shop
  annotations:
    higress.io/ignore-path-case: yes please
spec:
  rules:
    - host: shop.example.com
      http:
        paths:
          - {path: /Shop, pathType: Prefix, backend: {service: {name: shop, port: {number: 80}}}}
"#);
    insta::assert_json_snapshot!(t);
}

const CLASSES: &str = r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: spec-higress, namespace: shop}
spec:
  ingressClassName: higress
  rules: [{host: a.example.com, http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: a, port: {number: 80}}}}]}}]
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: spec-nginx, namespace: shop}
spec:
  ingressClassName: nginx
  rules: [{host: b.example.com, http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: b, port: {number: 80}}}}]}}]
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: legacy-higress-over-spec-nginx
  namespace: shop
  annotations: {kubernetes.io/ingress.class: higress}
spec:
  ingressClassName: nginx
  rules: [{host: c.example.com, http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: c, port: {number: 80}}}}]}}]
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: legacy-nginx-over-spec-higress
  namespace: shop
  annotations: {kubernetes.io/ingress.class: nginx}
spec:
  ingressClassName: higress
  rules: [{host: d.example.com, http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: d, port: {number: 80}}}}]}}]
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: no-class
  namespace: shop
  annotations: {higress.io/cors-allow-origin: "*"}
spec:
  rules: [{host: e.example.com, http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: e, port: {number: 80}}}}]}}]
"#;

#[test]
fn class_filtering() {
    let ingresses = docs(CLASSES);
    let with = |class: Option<&str>| {
        let t = translate(&ingresses, &IngressOptions { ingress_class: class.map(Into::into), ..opts() });
        (route_names(&t), t.ignored_annotations)
    };
    insta::assert_json_snapshot!(serde_json::json!({
        "higress (default: also takes Ingresses without a class)": with(Some("higress")),
        "nginx": with(Some("nginx")),
        "empty option: all": with(Some("")),
        "no option: all": with(None),
    }));
}

#[test]
fn conflicts_older_wins_with_a_warning() {
    let t = run(r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: a-newer, namespace: shop, creationTimestamp: "2024-02-01T00:00:00Z"}
spec:
  rules:
    - host: shop.example.com
      http:
        paths:
          - {path: /x, pathType: Prefix, backend: {service: {name: newer, port: {number: 80}}}}
          - {path: /y/, pathType: Prefix, backend: {service: {name: newer, port: {number: 80}}}}
          - {path: /x, pathType: Exact, backend: {service: {name: newer, port: {number: 80}}}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: b-older, namespace: shop, creationTimestamp: "2024-01-01T00:00:00+00:00"}
spec:
  rules:
    - host: shop.example.com
      http:
        paths:
          - {path: /x/, pathType: Prefix, backend: {service: {name: older, port: {number: 80}}}}
          - {path: /y, pathType: Prefix, backend: {service: {name: older, port: {number: 80}}}}
          - {path: /y, pathType: Prefix, backend: {service: {name: older-duplicate, port: {number: 80}}}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: c-same-time, namespace: alpha, creationTimestamp: "2024-01-01T01:00:00+01:00"}
spec:
  rules:
    - host: shop.example.com
      http:
        paths:
          - {path: /z, pathType: Prefix, backend: {service: {name: alpha, port: {number: 80}}}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: c-same-time, namespace: beta, creationTimestamp: "2024-01-01T00:00:00Z"}
spec:
  rules:
    - host: shop.example.com
      http:
        paths:
          - {path: /z, pathType: Prefix, backend: {service: {name: beta, port: {number: 80}}}}
"#);
    insta::assert_json_snapshot!(t);
}

#[test]
fn unreadable_ingresses_are_reported() {
    let t = run(r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: wrong-type, namespace: shop}
spec:
  rules: "not a list"
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: bad-time, namespace: shop, creationTimestamp: yesterday}
spec:
  tls:
  rules:
    - host: shop.example.com
      http:
        paths:
          - {path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: empty, namespace: shop}
spec: {}
"#);
    insta::assert_json_snapshot!(t);
}

#[test]
fn unknown_annotations_are_counted_not_applied() {
    let t = run(r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: annotated
  namespace: shop
  annotations:
    nginx.ingress.kubernetes.io/proxy-body-size: 8m
    nginx.ingress.kubernetes.io/configuration-snippet: "more_set_headers x: y"
    nginx.ingress.kubernetes.io/auth-type: basic
    nginx.ingress.kubernetes.io/ignore-path-case: "false"
    higress.io/rewrite-path: ""
    kubernetes.io/ingress.class: higress
    example.com/owner: team-a
spec:
  rules:
    - host: shop.example.com
      http:
        paths:
          - {path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: not-ours
  namespace: shop
  annotations:
    higress.io/cors-allow-origin: "*"
spec:
  ingressClassName: nginx
"#);
    assert_eq!(t.ignored_annotations, 3, "{t:#?}");
    assert!(t.warnings.iter().all(|w| w.reason == Reason::IgnoredAnnotation));
    let warned: Vec<String> = t.warnings.iter().map(ToString::to_string).collect();
    assert_eq!(
        warned,
        [
            "Ingress shop/annotated: annotation nginx.ingress.kubernetes.io/auth-type is not \
             implemented; the Ingress is served without it",
            "Ingress shop/annotated: annotation nginx.ingress.kubernetes.io/configuration-snippet is \
             not implemented; the Ingress is served without it",
            "Ingress shop/annotated: annotation nginx.ingress.kubernetes.io/proxy-body-size is \
             not implemented; the Ingress is served without it",
        ],
        "one warning per ignored annotation, naming the Ingress and the key; none for other prefixes or Ingresses"
    );
    let vs = t.objects.iter().find(|o| o.kind() == "VirtualService").expect("a VirtualService");
    assert!(vs.spec.to_json()["http"][0].get("rewrite").is_none(), "an empty rewrite-path rewrites nothing");
}

#[test]
fn nothing_in_nothing_out() {
    assert_eq!(translate(&[], &opts()), IngressTranslation::default());
    let not_ours =
        docs("apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: x}\nspec: {ingressClassName: nginx}\n");
    assert_eq!(translate(&not_ours, &opts()), IngressTranslation::default());
}

#[test]
fn output_does_not_depend_on_input_order() {
    let mut ingresses = docs(CLASSES);
    ingresses.extend(docs(
        r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: z, namespace: shop}
spec:
  tls: [{hosts: [a.example.com], secretName: shop-tls}]
  defaultBackend: {service: {name: z, port: {number: 80}}}
  rules: [{host: a.example.com, http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: z, port: {number: 80}}}}]}}]
"#,
    ));
    let forward = translate(&ingresses, &IngressOptions { ingress_class: None, ..opts() });
    ingresses.reverse();
    let backward = translate(&ingresses, &IngressOptions { ingress_class: None, ..opts() });
    assert_eq!(forward, backward);
    assert!(
        forward.warnings.iter().any(|w| w.to_string().contains("conflicts with shop/spec-higress")),
        "{:?}",
        forward.warnings
    );
}

#[test]
fn object_names_from_hosts() {
    let names = object_names(["shop.example.com", "*.example.com", "*", "a-b.example.com", "a.b-example.com"]);
    assert_eq!(names["shop.example.com"], "shop-example-com");
    assert_eq!(names["*.example.com"], "wildcard-example-com");
    assert_eq!(names["*"], "wildcard");
    // Collide once sanitised: both get a hash of their own host.
    assert_ne!(names["a-b.example.com"], names["a.b-example.com"]);
    assert!(names["a-b.example.com"].starts_with("a-b-example-com-"));
    let long = format!("{}.nacos", "x".repeat(300));
    let name = &object_names([long.as_str()])[long.as_str()];
    assert!(name.len() <= 200 && name.starts_with("xxx"), "{name}");
    assert_eq!(
        object_names(["orders.DEFAULT_GROUP.public.nacos"])["orders.DEFAULT_GROUP.public.nacos"],
        "orders-default-group-public-nacos"
    );
}

#[test]
fn hosts_are_normalised_and_checked() {
    assert_eq!(normalize_host("Shop.Example.COM").as_deref(), Some("shop.example.com"));
    assert_eq!(normalize_host("*.example.com").as_deref(), Some("*.example.com"));
    assert_eq!(normalize_host("*").as_deref(), Some("*"));
    for bad in ["", "*.", "a..b", "-a.com", "a-.com", "a_b.com", "*.*.com", "a.*.com", "10.0.0.1:80", "é.com"] {
        assert_eq!(normalize_host(bad), None, "{bad}");
    }
}

/// An Ingress in namespace `shop`, created on 2026-01-`day`, with
/// `annotations`, routing each (path, pathType, Service on port 80) on
/// shop.example.com.
pub(super) fn shop_ingress(name: &str, day: u32, annotations: &[(&str, &str)], paths: &[(&str, &str, &str)]) -> String {
    let quote = |v: &str| serde_json::to_string(v).unwrap();
    let mut yaml = format!(
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: {name}\n  namespace: shop\n  \
         creationTimestamp: \"2026-01-{day:02}T00:00:00Z\"\n  annotations:\n"
    );
    for (k, v) in annotations {
        yaml.push_str(&format!("    {k}: {}\n", quote(v)));
    }
    yaml.push_str("spec:\n  ingressClassName: higress\n  rules:\n");
    if !paths.is_empty() {
        yaml.push_str("    - host: shop.example.com\n      http:\n        paths:\n");
    }
    for (path, kind, service) in paths {
        yaml.push_str(&format!(
            "          - {{path: {}, pathType: {kind}, backend: {{service: {{name: {service}, port: {{number: 80}}}}}}}}\n",
            quote(path)
        ));
    }
    yaml
}

/// The main Ingresses every canary test attaches to: `/api` (Prefix,
/// rewritten) and `/login` (Exact) on shop.example.com, then `canaries`.
fn run_canary(canaries: &[String]) -> IngressTranslation {
    let mut docs = vec![
        shop_ingress("web", 1, &[("higress.io/rewrite-path", "/v1")], &[("/api", "Prefix", "web")]),
        shop_ingress("login", 1, &[], &[("/login", "Exact", "login")]),
    ];
    docs.extend(canaries.iter().cloned());
    run(&docs.join("---\n"))
}

#[test]
fn canary_header_cookie_and_weight_in_precedence_order() {
    let t = run_canary(&[shop_ingress(
        "web-canary",
        2,
        &[
            ("nginx.ingress.kubernetes.io/canary", "true"),
            ("nginx.ingress.kubernetes.io/canary-by-header", "X-Canary"),
            ("nginx.ingress.kubernetes.io/canary-by-cookie", "beta_user"),
            ("nginx.ingress.kubernetes.io/canary-weight", "30"),
        ],
        &[("/api/", "Prefix", "web-canary")],
    )]);
    assert_eq!(t.warnings, vec![]);
    assert_eq!(t.ignored_annotations, 0);
    // Header matches fit Istio's schema, so they reach Pilot over MCP.
    for o in &t.objects {
        if let Err(w) = crate::translate::mcp::resource(o, 0) {
            panic!("{w}");
        }
    }
    insta::assert_json_snapshot!(t);
}

#[test]
fn canary_header_alone_has_no_never_route() {
    // The issue's reproduction: the header alone, with the higress.io prefix.
    let t = run_canary(&[shop_ingress(
        "web-canary",
        2,
        &[("higress.io/canary", "true"), ("higress.io/canary-by-header", "x-canary")],
        &[("/api", "Prefix", "web-canary")],
    )]);
    assert_eq!(t.warnings, vec![]);
    assert_eq!(
        route_names(&t),
        ["shop-login-0", "shop-web-canary-0-canary-header", "shop-web-0"].map(String::from),
        "Exact paths first; the header route just before the main route of its path"
    );
    let vs = t.objects.iter().find(|o| o.kind() == "VirtualService").unwrap().spec.to_json();
    let canary = &vs["http"][1];
    assert_eq!(canary["match"][0]["headers"], serde_json::json!({"x-canary": {"exact": "always"}}));
    assert_eq!(canary["match"][1]["uri"], serde_json::json!({"prefix": "/api/"}));
    assert_eq!(canary["route"][0]["destination"]["host"], "web-canary.shop.svc.cluster.local");
    // Inherited from the main route, as in Higress.
    assert_eq!(canary["rewrite"], serde_json::json!({"uri": "/v1/"}));
}

#[test]
fn canary_header_value_pattern_and_weight_total() {
    let t = run_canary(&[
        shop_ingress(
            "by-value",
            2,
            &[
                ("higress.io/canary", "true"),
                ("higress.io/canary-by-header", "x-region"),
                ("higress.io/canary-by-header-value", "eu-west"),
                ("higress.io/canary-by-header-pattern", "ignored-when-value-is-set"),
            ],
            &[("/login", "Exact", "login-eu")],
        ),
        shop_ingress(
            "by-pattern",
            3,
            &[
                ("nginx.ingress.kubernetes.io/canary", "true"),
                ("nginx.ingress.kubernetes.io/canary-by-header", "x-user"),
                ("nginx.ingress.kubernetes.io/canary-by-header-pattern", "^(alice|bob)$"),
                ("nginx.ingress.kubernetes.io/canary-weight", "1"),
                ("nginx.ingress.kubernetes.io/canary-weight-total", "3"),
            ],
            &[("/api", "Prefix", "web-canary")],
        ),
    ]);
    assert_eq!(t.warnings, vec![]);
    insta::assert_json_snapshot!(t);
}

#[test]
fn canary_weight_splits_weighted_destinations_on_both_sides() {
    let doc = |name: &str, annotations: &str, path: &str| {
        format!(
            "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: {name}, namespace: higress-system, \
             creationTimestamp: \"2026-01-02T00:00:00Z\", annotations: {annotations}}}\nspec: {{rules: [{{host: \
             shop.example.com, http: {{paths: [{{path: {path}, pathType: Prefix, backend: {{resource: \
             {{apiGroup: networking.higress.io, kind: McpBridge, name: default}}}}}}]}}}}]}}\n"
        )
    };
    let main = doc(
        "orders",
        r#"{higress.io/destination: "80% orders.DEFAULT-GROUP.public.nacos:8080 v1\n20% orders.DEFAULT-GROUP.public.nacos:8080 v2"}"#,
        "/orders",
    );
    let canary = doc(
        "orders-canary",
        r#"{higress.io/canary: "true", higress.io/canary-weight: "25", higress.io/destination: "50% orders.DEFAULT-GROUP.public.nacos:8080 v3\n50% orders-next.DEFAULT-GROUP.public.nacos:8080"}"#,
        "/orders/",
    );
    let t = run(&format!("{main}---\n{canary}"));
    assert_eq!(t.warnings, vec![]);
    let vs = t.objects.iter().find(|o| o.kind() == "VirtualService").unwrap().spec.to_json();
    let weights: Vec<(String, u64)> = vs["http"][0]["route"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            let dest = &d["destination"];
            let name = format!("{} {}", dest["host"].as_str().unwrap(), dest["subset"].as_str().unwrap_or("-"));
            (name, d["weight"].as_u64().unwrap())
        })
        .collect();
    assert_eq!(
        weights,
        [
            ("orders.DEFAULT-GROUP.public.nacos v1", 60),
            ("orders.DEFAULT-GROUP.public.nacos v2", 15),
            ("orders.DEFAULT-GROUP.public.nacos v3", 13),
            ("orders-next.DEFAULT-GROUP.public.nacos -", 12),
        ]
        .map(|(n, w)| (n.to_owned(), w))
    );
    // The canary's subset gets its DestinationRule like any other.
    let dr = t.objects.iter().find(|o| o.kind() == "DestinationRule").unwrap().spec.to_json();
    assert_eq!(dr["subsets"].as_array().unwrap().len(), 3);
}

#[test]
fn canary_bad_values_are_reported_and_only_their_rule_dropped() {
    let canary = |day, name, annotations: &[(&str, &str)], path: &[(&str, &str, &str)]| {
        shop_ingress(name, day, annotations, path)
    };
    let t = run_canary(&[
        canary(
            2,
            "bad-regex",
            &[
                ("higress.io/canary", "true"),
                ("higress.io/canary-by-header", "x-user"),
                ("higress.io/canary-by-header-pattern", "(alice"),
                ("higress.io/canary-by-cookie", "beta"),
                ("higress.io/canary-weight", "150"),
            ],
            &[("/api", "Prefix", "web-canary")],
        ),
        canary(
            3,
            "bad-numbers",
            &[
                ("nginx.ingress.kubernetes.io/canary", "true"),
                ("nginx.ingress.kubernetes.io/canary-by-header", "bad header"),
                ("nginx.ingress.kubernetes.io/canary-weight", "-5"),
            ],
            &[("/login", "Exact", "login-canary")],
        ),
        canary(4, "more-bad-numbers", &[("higress.io/canary", "yes"), ("higress.io/canary-weight", "ten")], &[]),
        canary(
            5,
            "bad-total",
            &[
                ("higress.io/canary", "true"),
                ("higress.io/canary-weight", "10"),
                ("higress.io/canary-weight-total", "0"),
                ("higress.io/canary-by-header-value", "orphan"),
            ],
            &[("/login", "Exact", "login-canary")],
        ),
        canary(
            6,
            "non-numeric",
            &[("higress.io/canary", "true"), ("higress.io/canary-weight", "ten")],
            &[("/login", "Exact", "login-canary")],
        ),
    ]);
    // The cookie rule of bad-regex survives its bad header and weight; the
    // others have no rule left, so their canaries take nothing.
    insta::assert_json_snapshot!(t);
}

#[test]
fn canary_without_a_main_route_is_ignored_with_a_warning() {
    let t = run_canary(&[r#"apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: orphan
  namespace: shop
  annotations:
    higress.io/canary: "true"
    higress.io/canary-by-header: x-canary
spec:
  tls:
    - {hosts: [other.example.com], secretName: shop-tls}
  defaultBackend: {service: {name: orphan, port: {number: 80}}}
  rules:
    - host: other.example.com
      http:
        paths:
          - {path: /api, pathType: Prefix, backend: {service: {name: orphan, port: {number: 80}}}}
    - host: shop.example.com
      http:
        paths:
          - {path: /api, pathType: Exact, backend: {service: {name: orphan, port: {number: 80}}}}
          - {path: /login, pathType: Prefix, backend: {service: {name: orphan, port: {number: 80}}}}
"#
    .to_owned()]);
    assert_eq!(
        t.warnings.iter().map(ToString::to_string).collect::<Vec<_>>(),
        [
            "Ingress shop/orphan: canary Ingress: defaultBackend ignored (only paths attach to a main route)",
            "Ingress shop/orphan: canary path /api on host other.example.com has no non-canary route with the same \
             host, path and pathType; ignored",
            "Ingress shop/orphan: canary path /api on host shop.example.com has no non-canary route with the same \
             host, path and pathType; ignored",
            "Ingress shop/orphan: canary path /login on host shop.example.com has no non-canary route with the same \
             host, path and pathType; ignored",
        ]
    );
    // No routes, hosts, servers or TLS of its own.
    assert_eq!(route_names(&t), ["shop-login-0", "shop-web-0"].map(String::from));
    let gw = t.objects.iter().find(|o| o.kind() == "Gateway").unwrap().spec.to_json();
    assert_eq!(gw["servers"].as_array().unwrap().len(), 1, "{gw}");
    assert_eq!(gw["servers"][0]["hosts"], serde_json::json!(["shop.example.com"]));
}

#[test]
fn a_second_canary_weight_on_one_route_conflicts_and_the_older_stands() {
    let weighted = |name: &str, day, weight| {
        let annotations = [("higress.io/canary", "true"), ("higress.io/canary-weight", weight)];
        shop_ingress(name, day, &annotations, &[("/api", "Prefix", name)])
    };
    let t = run_canary(&[weighted("newer", 3, "50"), weighted("older", 2, "10")]);
    assert_eq!(
        t.warnings.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["Ingress shop/newer: canary weight on path /api of host shop.example.com conflicts with shop/older; ignored"]
    );
    assert_eq!(t.warnings[0].reason, Reason::IngressConflict);
    let vs = t.objects.iter().find(|o| o.kind() == "VirtualService").unwrap().spec.to_json();
    let main = &vs["http"][1];
    assert_eq!(main["name"], "shop-web-0");
    let split: Vec<(&str, u64)> = main["route"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (d["destination"]["host"].as_str().unwrap(), d["weight"].as_u64().unwrap()))
        .collect();
    assert_eq!(split, [("web.shop.svc.cluster.local", 90), ("older.shop.svc.cluster.local", 10)]);
}

/// The DestinationRule of each host an Ingress routes to, and its traffic
/// policy: (host, policy JSON), sorted by host.
fn rule_policies(t: &IngressTranslation) -> Vec<(String, serde_json::Value)> {
    t.objects
        .iter()
        .filter_map(|o| match &o.spec {
            Spec::DestinationRule(d) => Some((d.host.clone(), serde_json::to_value(&d.traffic_policy).unwrap())),
            _ => None,
        })
        .collect()
}

fn messages(t: &IngressTranslation) -> Vec<String> {
    t.warnings.iter().map(ToString::to_string).collect()
}

#[test]
fn upstream_annotations_make_each_destination_host_a_traffic_policy() {
    let ingress = |name: &str, dest: &str, annotations: &str| {
        format!(
            "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: {name}\n  namespace: shop\n  \
             annotations:\n    higress.io/destination: \"{dest}\"\n{annotations}spec:\n  ingressClassName: higress\n  \
             rules:\n    - host: {name}.example.com\n      http:\n        paths:\n          - path: /\n            \
             pathType: Prefix\n            backend: {{resource: {{apiGroup: networking.higress.io, kind: McpBridge, \
             name: default}}}}\n---\n"
        )
    };
    let yaml = [
        // Cookie affinity wins over the hash and the balancer, as in Higress.
        ingress(
            "cookie",
            "a.dc1.consul:80",
            "    nginx.ingress.kubernetes.io/affinity: cookie\n    nginx.ingress.kubernetes.io/session-cookie-name: \
             route\n    nginx.ingress.kubernetes.io/session-cookie-max-age: \"3600\"\n    \
             higress.io/upstream-hash-by: $host\n    higress.io/load-balance: random\n",
        ),
        ingress("header", "b.dc1.consul:80", "    higress.io/upstream-hash-by: $http_x_user_id\n"),
        ingress("source", "c.dc1.consul:80", "    nginx.ingress.kubernetes.io/upstream-hash-by: $remote_addr\n"),
        ingress("query", "d.dc1.consul:80", "    nginx.ingress.kubernetes.io/upstream-hash-by: $arg_id\n"),
        ingress("balance", "e.dc1.consul:80", "    nginx.ingress.kubernetes.io/load-balance: least_conn\n"),
        ingress(
            "grpcs",
            "f.dc1.consul:80",
            "    nginx.ingress.kubernetes.io/backend-protocol: GRPCS\n    higress.io/load-balance: round_robin\n",
        ),
        ingress("h2", "g.dc1.consul:80", "    nginx.ingress.kubernetes.io/backend-protocol: http2\n"),
        ingress("plain", "h.dc1.consul:80", "    nginx.ingress.kubernetes.io/backend-protocol: HTTP\n"),
        // Bad values: each dropped with a warning naming the annotation.
        ingress(
            "bad",
            "i.dc1.consul:80",
            "    nginx.ingress.kubernetes.io/load-balance: ewma\n    nginx.ingress.kubernetes.io/backend-protocol: \
             AJP\n",
        ),
        ingress("badhash", "j.dc1.consul:80", "    nginx.ingress.kubernetes.io/upstream-hash-by: $request_body\n"),
        // A second Ingress asking another policy of the same host: ignored.
        ingress("zlater", "a.dc1.consul:80", "    higress.io/load-balance: random\n"),
    ]
    .concat();
    let t = run(&yaml);
    insta::assert_json_snapshot!(rule_policies(&t));
    let warnings = messages(&t);
    for want in [
        "Ingress shop/bad: annotation nginx.ingress.kubernetes.io/load-balance: \"ewma\" is not a supported load balancer",
        "Ingress shop/bad: annotation nginx.ingress.kubernetes.io/backend-protocol: \"AJP\" is not a supported protocol",
        "Ingress shop/badhash: annotation nginx.ingress.kubernetes.io/upstream-hash-by: \"$request_body\" is not a supported key",
        "Ingress shop/zlater: upstream policy for a.dc1.consul conflicts with shop/cookie's; ignored",
    ] {
        assert!(warnings.iter().any(|w| w.starts_with(want)), "missing {want:?} in {warnings:#?}");
    }
    assert_eq!(warnings.len(), 4, "{warnings:#?}");
    // The routes are there whatever the policy.
    assert_eq!(route_names(&t).len(), 11);
}

/// Higress's request conditions: Ingresses on one host and path with
/// different headers, query parameters or methods are each a route (no
/// conflict), the more specific first, then the one without conditions.
#[test]
fn request_conditions_make_routes_of_their_own() {
    let ingress = |name: &str, day: u32, annotations: &str| {
        format!(
            "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: {name}\n  namespace: shop\n  \
             creationTimestamp: \"2024-01-{day:02}T00:00:00Z\"\n  annotations: {{{annotations}}}\nspec:\n  rules:\n    \
             - host: shop.example.com\n      http:\n        paths:\n          \
             - {{path: /, pathType: Prefix, backend: {{service: {{name: {name}, port: {{number: 80}}}}}}}}\n"
        )
    };
    let yaml = [
        ingress("plain", 1, ""),
        ingress("model-a", 2, "higress.io/exact-match-header-X-Model: a"),
        ingress(
            "model-b-post",
            3,
            "higress.io/exact-match-header-x-model: b, higress.io/match-method: \"post get Post BREW\", \
             higress.io/regex-match-query-v: \"2|3\"",
        ),
        ingress("beta", 4, "higress.io/prefix-match-header-x-user: beta-"),
        ingress("bad", 5, "higress.io/regex-match-header-x-bad: \"(a\""),
    ]
    .join("---\n");
    let t = run(&yaml);
    let warned: BTreeSet<String> = t.warnings.iter().map(ToString::to_string).collect();
    let want = BTreeSet::from([
        "Ingress shop/model-b-post: annotation higress.io/match-method: \"BREW\" is not an HTTP method; left out"
            .to_owned(),
        "Ingress shop/bad: annotation higress.io/regex-match-header-x-bad: \"(a\" is not a valid RE2 regex \
         (unclosed group); left out"
            .to_owned(),
        // Without its one condition, `bad`'s path is `plain`'s, which is
        // older and keeps it.
        "Ingress shop/bad: path / on host shop.example.com conflicts with shop/plain; ignored".to_owned(),
    ]);
    assert_eq!(warned, want, "no conflict between different conditions; one warning per bad value");
    // The method first, then more headers; the plain route last.
    let vs = t.objects.iter().find(|o| o.kind() == "VirtualService").expect("a VirtualService").spec.to_json();
    let http = vs["http"].as_array().unwrap();
    let names: Vec<&str> = http.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["shop-model-b-post-0", "shop-model-a-0", "shop-beta-0", "shop-plain-0"], "{vs:#}");
    let b = &http[0]["match"][0];
    assert_eq!(b["method"], serde_json::json!({"regex": "POST|GET"}), "{b}");
    assert_eq!(b["headers"]["x-model"], serde_json::json!({"exact": "b"}), "{b}");
    assert_eq!(b["queryParams"]["v"], serde_json::json!({"regex": "2|3"}), "{b}");
    assert_eq!(http[1]["match"][0]["headers"]["x-model"], serde_json::json!({"exact": "a"}), "the name is lowercased");
    assert_eq!(http[2]["match"][0]["headers"]["x-user"], serde_json::json!({"prefix": "beta-"}));
    assert!(http[3]["match"][0].get("headers").is_none(), "{:#}", http[3]);
    assert_eq!(t.ignored_annotations, 0);
}

/// `use-regex`, `full-path-regex` and a `rewrite-target` with captures make
/// regex paths, as in Higress: `PATH.*` or `PATH$`, whatever the pathType,
/// ordered after Exact and Prefix paths and before `/`, the captures
/// rewritten as RE2 writes them. A path that is no RE2 regex, or a target
/// naming a capture the path does not have, is left out with a warning
/// (Envoy would reject the whole route table for it).
#[test]
fn regex_paths_and_rewrites_with_captures() {
    let t = run(r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: plain, namespace: shop}
spec:
  ingressClassName: higress
  rules:
    - host: shop.example.com
      http:
        paths:
          - {path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}
          - {path: /docs, pathType: Prefix, backend: {service: {name: docs, port: {number: 80}}}}
          - {path: /about, pathType: Exact, backend: {service: {name: web, port: {number: 80}}}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: captures
  namespace: shop
  annotations:
    nginx.ingress.kubernetes.io/rewrite-target: /$2
spec:
  ingressClassName: higress
  rules:
    - host: shop.example.com
      http:
        paths:
          - {path: "/something(/|$)(.*)", pathType: ImplementationSpecific, backend: {service: {name: api, port: {number: 80}}}}
          - {path: "/one(.*)", pathType: Prefix, backend: {service: {name: api, port: {number: 80}}}}
          - {path: "/broken(", pathType: Prefix, backend: {service: {name: api, port: {number: 80}}}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: regex
  namespace: shop
  annotations:
    higress.io/use-regex: "true"
    higress.io/ignore-path-case: "true"
spec:
  ingressClassName: higress
  rules:
    - host: shop.example.com
      http:
        paths:
          - {path: "/v[0-9]+/items", pathType: Exact, backend: {service: {name: items, port: {number: 80}}}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: full
  namespace: shop
  annotations:
    higress.io/full-path-regex: "true"
spec:
  ingressClassName: higress
  rules:
    - host: shop.example.com
      http:
        paths:
          - {path: "/img/[a-z]+\\.png", pathType: Prefix, backend: {service: {name: cdn, port: {number: 80}}}}
"#);
    let vs = t.objects.iter().find(|o| o.kind() == "VirtualService").expect("a VirtualService").spec.to_json();
    let routes = vs["http"].as_array().unwrap();
    let summary: Vec<(String, serde_json::Value, serde_json::Value)> = routes
        .iter()
        .map(|r| (r["name"].as_str().unwrap().to_owned(), r["match"][0]["uri"].clone(), r["rewrite"].clone()))
        .collect();
    let rewrite = |pattern: &str, to: &str| serde_json::json!({"uriRegexRewrite": {"match": pattern, "rewrite": to}});
    let uri = |kind: &str, value: &str| serde_json::json!({ kind: value });
    let null = serde_json::Value::Null;
    let want = [
        ("shop-plain-2", uri("exact", "/about"), null.clone()),
        ("shop-plain-1", uri("exact", "/docs"), null.clone()),
        // Regex paths, longer first.
        ("shop-captures-0", uri("regex", "/something(/|$)(.*).*"), rewrite("/something(/|$)(.*).*", "/\\2")),
        ("shop-full-0", uri("regex", "/img/[a-z]+\\.png$"), null.clone()),
        ("shop-regex-0", uri("regex", "(?i)/v[0-9]+/items.*"), null.clone()),
        ("shop-plain-0", uri("prefix", "/"), null),
    ];
    let want: Vec<(String, serde_json::Value, serde_json::Value)> =
        want.into_iter().map(|(n, u, r)| (n.to_owned(), u, r)).collect();
    assert_eq!(summary, want, "{vs:#}");
    let warned: Vec<String> = t.warnings.iter().map(ToString::to_string).collect();
    assert_eq!(
        warned,
        [
            "Ingress shop/captures: path /one(.*) on host shop.example.com left out: rewrite-target \"/\\\\2\" refers \
             to capture 2, and the path has 1 capture groups",
            "Ingress shop/captures: path /broken( on host shop.example.com left out: not a valid RE2 regex \
             (unclosed group)",
        ],
        "{warned:#?}"
    );
}
