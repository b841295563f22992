//! Property-test fuzz targets of the binary crate: the YAML config loader
//! and its validation, the Ingress translator and its annotation parser, and
//! the SotW and delta ADS stream handlers fed arbitrary request sequences.
//! cargo-fuzz needs a nightly toolchain, which cannot be installed here, so
//! these run on stable under proptest (see RELIABILITY.md, "Fuzzing and bad
//! input", for the long runs and `fuzz/runner.rs` for the knobs).

#[path = "../fuzz/runner.rs"]
mod runner;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use envoy_types::pb::google::rpc::Status;
use meshbridge::cache::{Cache, RegistryKey};
use meshbridge::config::{ConfigState, IngressDoc, parse_documents};
use meshbridge::translate::envoy::{CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE};
use meshbridge::translate::ingress::{IngressOptions, parse_destination, translate};
use meshbridge::translate::mcp::MCP_RESOURCE_TYPE;
use meshbridge::translate::{ConfigSet, config_set};
use meshbridge::xds::Clients;
use meshbridge::xds::delta::DeltaStream;
use meshbridge::xds::sotw::SotwStream;
use meshbridge_registries::{Endpoint, Protocol, RegistryKind, Service, ServicePort, Update};
use proptest::prelude::*;
use serde_json::{Map, Value, json};

/// A credential value planted in generated documents: it must never show in
/// an error or a `Debug` of the result.
const MARKER: &str = "s3cr3t-Fuzz-Marker";
/// No error or warning line may be longer than this, whatever the input
/// (values from files are truncated before they are echoed).
const MAX_MESSAGE: usize = 4096;

fn root() -> PathBuf {
    runner::repo_root(env!("CARGO_MANIFEST_DIR"))
}

// ---------------------------------------------------------------- strategies

/// Short strings with the characters that matter to parsers.
fn word() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9.-]{0,12}",
        "[ -~]{0,16}",
        any::<String>(),
        Just(String::new()),
        Just("higress-system".to_owned()),
        Just("127.0.0.1".to_owned()),
        Just("a.b.c:80".to_owned()),
        // Long values exercise every "echo a value" path.
        (1usize..20_000).prop_map(|n| "x".repeat(n)),
    ]
}

/// Any JSON value, a few levels deep.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Value::from),
        (0u32..70_000).prop_map(Value::from),
        word().prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(word(), inner, 0..6).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// An object whose keys come from `fields` (sometimes others), each with a
/// value that is either plausible or arbitrary.
/// A field name and how to make a plausible value for it.
type Field = (&'static str, fn() -> BoxedStrategy<Value>);

fn shaped(fields: &'static [Field]) -> impl Strategy<Value = Value> {
    let entries: Vec<BoxedStrategy<Option<(String, Value)>>> = fields
        .iter()
        .map(|(key, plausible)| {
            prop_oneof![
                2 => Just(None),
                4 => plausible().prop_map(move |v| Some(((*key).to_owned(), v))),
                1 => json_value().prop_map(move |v| Some(((*key).to_owned(), v))),
            ]
            .boxed()
        })
        .collect();
    (entries, prop::collection::vec((word(), json_value()), 0..2)).prop_map(|(known, extra)| {
        let mut m = Map::new();
        for (k, v) in known.into_iter().flatten().chain(extra) {
            m.insert(k, v);
        }
        Value::Object(m)
    })
}

fn s(strategy: impl Strategy<Value = String> + 'static) -> BoxedStrategy<Value> {
    strategy.prop_map(Value::from).boxed()
}
fn port() -> BoxedStrategy<Value> {
    prop_oneof![(0i64..70_000).prop_map(Value::from), "[0-9]{1,6}".prop_map(Value::from)].boxed()
}
fn registry_type() -> BoxedStrategy<Value> {
    s(prop_oneof![
        Just("nacos2".to_owned()),
        Just("nacos".to_owned()),
        Just("consul".to_owned()),
        Just("zookeeper".to_owned()),
        Just("eureka".to_owned()),
        Just("static".to_owned()),
        Just("dns".to_owned()),
        word(),
    ])
}
fn domain() -> BoxedStrategy<Value> {
    s(prop_oneof![
        Just("127.0.0.1".to_owned()),
        Just("consul.local".to_owned()),
        Just("1.2.3.4:80,5.6.7.8:81".to_owned()),
        Just("http://x".to_owned()),
        Just("a b".to_owned()),
        word(),
    ])
}
fn duration() -> BoxedStrategy<Value> {
    prop_oneof![(0i64..100_000).prop_map(Value::from), s("[0-9]{0,4}(ms|s|m|h|x)?")].boxed()
}
fn names() -> BoxedStrategy<Value> {
    prop::collection::vec(word(), 0..3).prop_map(|v| json!(v)).boxed()
}
fn name() -> BoxedStrategy<Value> {
    s(prop_oneof![3 => "[a-z][a-z0-9-]{0,8}", 1 => word()])
}
fn marker() -> BoxedStrategy<Value> {
    Just(Value::from(MARKER)).boxed()
}

static REGISTRY_FIELDS: &[Field] = &[
    ("type", registry_type),
    ("name", name),
    ("domain", domain),
    ("port", port),
    ("protocol", name),
    ("sni", name),
    ("proxyName", name),
    ("authSecretName", name),
    ("nacosAccessKey", marker),
    ("nacosSecretKey", marker),
    ("nacosGroups", names),
    ("nacosNamespaceId", name),
    ("nacosAddressServer", domain),
    ("nacosRefreshInterval", duration),
    ("consulRefreshInterval", duration),
    ("consulServiceTag", name),
    ("consulDatacenter", name),
    ("zkServicesPath", names),
    ("ecdhCurves", names),
    ("vport", json_value_boxed),
];
static PROXY_FIELDS: &[Field] = &[
    ("name", name),
    ("serverAddress", domain),
    ("serverPort", port),
    ("listenerPort", port),
    ("connectTimeout", duration),
    ("type", name),
];

fn json_value_boxed() -> BoxedStrategy<Value> {
    json_value().boxed()
}

fn metadata() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => (name(), prop_oneof![Just(json!("higress-system")), name()])
            .prop_map(|(n, ns)| json!({"name": n, "namespace": ns})),
        1 => json_value(),
    ]
}

/// A Kubernetes-looking document of one of our kinds, often wrong.
fn document() -> impl Strategy<Value = Value> {
    let bridge = (
        metadata(),
        prop::collection::vec(shaped(REGISTRY_FIELDS), 0..4),
        prop::collection::vec(shaped(PROXY_FIELDS), 0..2),
        json_value(),
    )
        .prop_map(|(meta, registries, proxies, odd)| {
            let mut spec = json!({"registries": registries, "proxies": proxies});
            if odd.is_object() {
                spec["extra"] = odd;
            }
            json!({"apiVersion": "networking.higress.io/v1", "kind": "McpBridge", "metadata": meta, "spec": spec})
        });
    let value = prop_oneof![word(), Just(MARKER.to_owned())];
    let secret = (metadata(), prop::collection::btree_map(word(), value, 0..4), any::<bool>()).prop_map(
        |(meta, data, string_data)| {
            let data: Map<String, Value> = data
                .into_iter()
                .map(|(k, v)| {
                    let v = if string_data { v } else { base64_ish(&v) };
                    (k, Value::from(v))
                })
                .collect();
            let field = if string_data { "stringData" } else { "data" };
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": meta, field: data,
                   "type": "kubernetes.io/tls"})
        },
    );
    prop_oneof![
        3 => bridge,
        1 => secret,
        2 => ingress(),
        1 => (word(), metadata(), json_value())
            .prop_map(|(kind, meta, spec)| json!({"kind": kind, "metadata": meta, "spec": spec})),
        1 => json_value(),
    ]
}

/// Mostly valid base64 (of `v`), sometimes `v` itself.
fn base64_ish(v: &str) -> String {
    use base64::Engine as _;
    if v.len() % 3 == 1 { v.to_owned() } else { base64::engine::general_purpose::STANDARD.encode(v) }
}

fn annotations() -> impl Strategy<Value = Value> {
    let key = prop_oneof![
        Just("higress.io/destination".to_owned()),
        Just("higress.io/rewrite-target".to_owned()),
        Just("nginx.ingress.kubernetes.io/rewrite-target".to_owned()),
        Just("higress.io/ignore-path-case".to_owned()),
        Just("nginx.ingress.kubernetes.io/use-regex".to_owned()),
        Just("higress.io/ssl-redirect".to_owned()),
        Just("nginx.ingress.kubernetes.io/permanent-redirect".to_owned()),
        Just("higress.io/app-root".to_owned()),
        Just("higress.io/timeout".to_owned()),
        Just("higress.io/proxy-next-upstream".to_owned()),
        Just("higress.io/request-header-control-add".to_owned()),
        Just("nginx.ingress.kubernetes.io/upstream-vhost".to_owned()),
        Just("higress.io/enable-cors".to_owned()),
        Just("higress.io/cors-allow-origin".to_owned()),
        Just("higress.io/auth-tls-secret".to_owned()),
        Just("nginx.ingress.kubernetes.io/auth-tls-secret".to_owned()),
        Just("kubernetes.io/ingress.class".to_owned()),
        "higress\\.io/[a-z-]{1,12}",
        word(),
    ];
    let value = prop_oneof![
        destination_text(),
        Just("true".to_owned()),
        Just("/$1".to_owned()),
        Just("https://a.example/x".to_owned()),
        Just("5".to_owned()),
        Just("x-a 1\nx-b".to_owned()),
        Just("default/tls".to_owned()),
        Just("tls-cacert".to_owned()),
        word(),
    ];
    prop::collection::btree_map(key, value, 0..4).prop_map(|m| json!(m))
}

fn destination_text() -> impl Strategy<Value = String> {
    let line = (
        prop::option::of(prop_oneof!["[0-9]{1,3}", word()]),
        prop_oneof!["[a-z][a-z0-9.-]{0,20}", word()],
        prop::option::of(prop_oneof!["[0-9]{1,6}", word()]),
        prop::option::of(prop_oneof!["[a-z0-9-]{1,8}", word()]),
    )
        .prop_map(|(w, host, port, subset)| {
            let mut l = String::new();
            if let Some(w) = w {
                l.push_str(&format!("{w}% "));
            }
            l.push_str(&host);
            if let Some(p) = port {
                l.push_str(&format!(":{p}"));
            }
            if let Some(s) = subset {
                l.push_str(&format!(" {s}"));
            }
            l
        });
    prop_oneof![prop::collection::vec(line, 0..4).prop_map(|l| l.join("\n")), word()]
}

/// An Ingress object, in its JSON form.
fn ingress() -> impl Strategy<Value = Value> {
    let backend = prop_oneof![
        4 => (name(), prop_oneof![port().prop_map(|p| json!({"number": p})), name().prop_map(|n| json!({"name": n}))])
            .prop_map(|(n, p)| json!({"service": {"name": n, "port": p}})),
        1 => json_value().prop_map(|v| json!({"resource": v})),
        1 => json_value(),
    ];
    let path = (
        prop_oneof![Just(json!("/")), Just(json!("/api")), s("/[a-z(){}.*$^/]{0,10}"), json_value()],
        prop_oneof![Just(json!("Prefix")), Just(json!("Exact")), Just(json!("ImplementationSpecific")), json_value()],
        backend,
    )
        .prop_map(|(p, t, b)| json!({"path": p, "pathType": t, "backend": b}));
    let rule = (prop_oneof![s("[a-z*][a-z0-9.-]{0,12}"), json_value()], prop::collection::vec(path, 0..3))
        .prop_map(|(host, paths)| json!({"host": host, "http": {"paths": paths}}));
    let tls = (prop::collection::vec(word(), 0..2), name())
        .prop_map(|(hosts, secret)| json!({"hosts": hosts, "secretName": secret}));
    (
        name(),
        prop_oneof![Just(json!("default")), name()],
        annotations(),
        prop::option::of(prop_oneof![Just(json!("higress")), name()]),
        prop::collection::vec(rule, 0..3),
        prop::collection::vec(tls, 0..2),
        prop::option::of(json_value()),
    )
        .prop_map(|(name, ns, ann, class, rules, tls, odd)| {
            let mut spec = json!({"rules": rules, "tls": tls});
            if let Some(c) = class {
                spec["ingressClassName"] = c;
            }
            if let Some(odd) = odd {
                spec["defaultBackend"] = odd;
            }
            json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
                "metadata": {"name": name, "namespace": ns, "annotations": ann}, "spec": spec})
        })
}

/// The document the config loader makes of an Ingress object.
fn ingress_doc(object: &Value) -> IngressDoc {
    IngressDoc::from_json(
        object["metadata"]["namespace"].as_str().unwrap_or("default").to_owned(),
        object["metadata"]["name"].as_str().unwrap_or_default().to_owned(),
        object,
    )
}

/// YAML text: documents as JSON or block YAML, separators, and noise.
fn config_text() -> impl Strategy<Value = String> {
    let chunk = prop_oneof![
        4 => document().prop_map(|d| serde_json::to_string(&d).unwrap_or_default()),
        4 => document().prop_map(|d| yaml_block(&d, 0)),
        1 => Just("---".to_owned()),
        1 => Just("...".to_owned()),
        1 => Just("&a [*a]".to_owned()),
        1 => Just("key: !!binary AAAA".to_owned()),
        1 => "[ -~\t\n]{0,40}",
        1 => any::<String>(),
    ];
    prop::collection::vec(chunk, 0..5).prop_map(|c| c.join("\n---\n"))
}

/// A value as block YAML (keys and strings quoted as JSON, which YAML reads).
fn yaml_block(v: &Value, indent: usize) -> String {
    let pad = " ".repeat(indent);
    match v {
        Value::Object(m) if !m.is_empty() => m
            .iter()
            .map(|(k, v)| match v {
                Value::Object(o) if !o.is_empty() => format!("{pad}{}:\n{}", json!(k), yaml_block(v, indent + 2)),
                Value::Array(a) if !a.is_empty() => format!("{pad}{}:\n{}", json!(k), yaml_block(v, indent + 2)),
                _ => format!("{pad}{}: {}", json!(k), v),
            })
            .collect::<Vec<_>>()
            .join("\n"),
        Value::Array(a) if !a.is_empty() => a
            .iter()
            .map(|v| match v {
                Value::Object(o) if !o.is_empty() => {
                    let inner = yaml_block(v, indent + 2);
                    format!("{pad}- {}", inner.trim_start())
                }
                _ => format!("{pad}- {v}"),
            })
            .collect::<Vec<_>>()
            .join("\n"),
        _ => format!("{pad}{v}"),
    }
}

// --------------------------------------------------------------- properties

fn check_config_text(text: &str) -> Result<(), TestCaseError> {
    match parse_documents("fuzz.yaml", text) {
        Ok(docs) => {
            let mut builder = meshbridge::config::Builder::default();
            let desired = builder.build(docs.iter());
            check_messages(desired.errors.iter())?;
            prop_assert!(!format!("{desired:?}").contains(MARKER), "a credential leaked into Desired's Debug");
            // Deterministic: the same documents build the same result.
            let again = meshbridge::config::Builder::default().build(docs.iter());
            prop_assert_eq!(&desired, &again);
        }
        Err(e) => {
            let msg = e.to_string();
            prop_assert!(msg.starts_with("fuzz.yaml"), "error does not name the file: {msg}");
            check_messages(std::iter::once(&msg))?;
        }
    }
    // The last-good bookkeeping: a broken edit after this text keeps it.
    let mut state = ConfigState::new();
    state.set_file("fuzz.yaml", text.to_owned());
    let first = state.desired();
    state.set_file("fuzz.yaml", "kind: [".to_owned());
    let broken = state.desired();
    prop_assert_eq!(&first.registries, &broken.registries, "a broken edit lost the last good registries");
    prop_assert_eq!(&first.ingresses, &broken.ingresses);
    check_messages(broken.errors.iter())?;
    Ok(())
}

fn check_messages<'a>(messages: impl Iterator<Item = &'a String>) -> Result<(), TestCaseError> {
    for m in messages {
        prop_assert!(!m.trim().is_empty(), "empty error message");
        prop_assert!(!m.contains(MARKER), "a credential leaked into an error: {m}");
        prop_assert!(
            m.len() <= MAX_MESSAGE,
            "a {}-byte error message: {}…",
            m.len(),
            m.chars().take(200).collect::<String>()
        );
    }
    Ok(())
}

#[test]
fn fuzz_config_text() {
    runner::fuzz(&root(), "config_text", 100, config_text(), |text| check_config_text(&text));
}

#[test]
fn fuzz_config_arbitrary_text() {
    runner::fuzz(&root(), "config_arbitrary_text", 300, any::<String>(), |text| check_config_text(&text));
}

#[test]
fn fuzz_config_corpus() {
    for (name, bytes) in runner::corpus(&root(), "config") {
        let text = String::from_utf8_lossy(&bytes);
        if let Err(e) = check_config_text(&text) {
            panic!("corpus config/{name}: {e}");
        }
    }
}

fn check_ingresses(ingresses: &[IngressDoc], class: Option<String>) -> Result<(), TestCaseError> {
    let opts = IngressOptions {
        ingress_class: class,
        gateway_namespace: "higress-system".into(),
        gateway_name: "higress-gateway".into(),
        known_secrets: [("default".to_owned(), "tls".to_owned())].into_iter().collect(),
        known_ca_secrets: [("default".to_owned(), "tls".to_owned())].into_iter().collect(),
        service_hosts: [("svc.dc1.consul".to_owned(), "svc.dc1.consul".to_owned())].into_iter().collect(),
    };
    let out = translate(ingresses, &opts);
    let messages: Vec<String> = out.warnings.iter().map(ToString::to_string).collect();
    check_messages(messages.iter())?;
    for w in &out.warnings {
        prop_assert!(!w.object.is_empty() || ingresses.is_empty(), "a warning names no object: {w}");
    }
    let mut seen = HashSet::new();
    for o in &out.objects {
        let key = serde_json::to_string(o).unwrap_or_default();
        prop_assert!(seen.insert(key), "an object was emitted twice");
    }
    prop_assert_eq!(&out, &translate(ingresses, &opts), "translation is not deterministic");
    Ok(())
}

#[test]
fn fuzz_ingress_translate() {
    let strategy =
        (prop::collection::vec(ingress(), 0..4), prop::option::of(prop_oneof![Just("higress".to_owned()), word()]));
    runner::fuzz(&root(), "ingress", 300, strategy, |(ingresses, class)| {
        let docs: Vec<IngressDoc> = ingresses.iter().map(ingress_doc).collect();
        check_ingresses(&docs, class)
    });
}

#[test]
fn fuzz_ingress_corpus() {
    for (name, bytes) in runner::corpus(&root(), "ingress") {
        let object: Value = serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("ingress/{name}: {e}"));
        if let Err(e) = check_ingresses(&[ingress_doc(&object)], None) {
            panic!("corpus ingress/{name}: {e}");
        }
    }
}

fn check_destination(text: &str) -> Result<(), TestCaseError> {
    match parse_destination(text) {
        Ok(dests) => {
            prop_assert!(!dests.is_empty());
            for d in &dests {
                prop_assert!(!d.host.is_empty() && d.weight <= 100, "{d:?}");
                prop_assert!(d.port != Some(0));
            }
        }
        Err(e) => check_messages(std::iter::once(&e.to_string()))?,
    }
    Ok(())
}

#[test]
fn fuzz_parse_destination() {
    runner::fuzz(&root(), "destination", 2000, prop_oneof![destination_text(), any::<String>()], |t| {
        check_destination(&t)
    });
}

#[test]
fn fuzz_destination_corpus() {
    for (name, bytes) in runner::corpus(&root(), "destination") {
        if let Err(e) = check_destination(&String::from_utf8_lossy(&bytes)) {
            panic!("corpus destination/{name}: {e}");
        }
    }
}

// ----------------------------------------------------------------- xDS

const SECRET_TYPE: &str = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";
const SERVICE_ENTRY: &str = "networking.istio.io/v1alpha3/ServiceEntry";

fn service(host: &str, addrs: &[&str]) -> Service {
    let eps = addrs
        .iter()
        .map(|a| Endpoint { address: (*a).to_owned(), port: 9000, weight: 1, labels: Default::default() })
        .collect();
    Service::new(host, vec![ServicePort { number: 8080, protocol: Protocol::Http, name: "http-8080".into() }], eps)
}

/// Two small config sets the stream switches between (built once).
fn config_sets() -> &'static [Arc<ConfigSet>; 2] {
    static SETS: std::sync::OnceLock<[Arc<ConfigSet>; 2]> = std::sync::OnceLock::new();
    SETS.get_or_init(build_config_sets)
}

fn build_config_sets() -> [Arc<ConfigSet>; 2] {
    let build = |services: Vec<Service>| {
        let cache = Cache::new();
        cache.attach(&RegistryKey::new(RegistryKind::Consul, "fuzz")).update(Update::Snapshot(services));
        Arc::new(config_set(&cache.view()))
    };
    [
        build(vec![service("a.dc1.consul", &["10.0.0.1"]), service("b.dc1.consul", &["10.0.0.2"])]),
        build(vec![service("a.dc1.consul", &["10.0.0.1", "10.0.0.3"]), service("c.dc1.consul", &["10.0.0.4"])]),
    ]
}

fn type_url() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => Just(CLUSTER_TYPE.to_owned()),
        3 => Just(ENDPOINT_TYPE.to_owned()),
        2 => Just(LISTENER_TYPE.to_owned()),
        2 => Just(ROUTE_TYPE.to_owned()),
        1 => Just(SECRET_TYPE.to_owned()),
        1 => Just(SERVICE_ENTRY.to_owned()),
        1 => Just("networking.istio.io/v1alpha3/DestinationRule".to_owned()),
        1 => word(),
    ]
}

fn resource_name() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => Just("outbound|8080||a.dc1.consul".to_owned()),
        2 => Just("outbound|8080||b.dc1.consul".to_owned()),
        2 => Just("outbound|8080||c.dc1.consul".to_owned()),
        1 => Just("*".to_owned()),
        1 => word(),
    ]
}

/// Which nonce a request carries: none, the latest sent for its type, an
/// older one from this stream, or one we never sent.
#[derive(Debug, Clone)]
enum NonceChoice {
    Empty,
    Latest,
    Older(usize),
    Foreign(String),
}

fn nonce_choice() -> impl Strategy<Value = NonceChoice> {
    prop_oneof![
        2 => Just(NonceChoice::Empty),
        5 => Just(NonceChoice::Latest),
        1 => any::<usize>().prop_map(NonceChoice::Older),
        1 => word().prop_map(NonceChoice::Foreign),
    ]
}

/// One step of a client's life on a stream.
#[derive(Debug, Clone)]
enum Step<R> {
    Request(R, NonceChoice),
    /// The config switched to set 0 or 1.
    Change(usize),
}

#[derive(Debug, Clone)]
struct SotwReq {
    type_url: String,
    names: Vec<String>,
    version: String,
    nack: Option<String>,
    node: Option<String>,
}

fn sotw_steps() -> impl Strategy<Value = Vec<Step<SotwReq>>> {
    let req = (
        type_url(),
        prop::collection::vec(resource_name(), 0..4),
        prop_oneof![Just(String::new()), word()],
        prop::option::weighted(0.2, word()),
        prop::option::weighted(0.2, word()),
    )
        .prop_map(|(type_url, names, version, nack, node)| SotwReq { type_url, names, version, nack, node });
    let step = prop_oneof![
        5 => (req, nonce_choice()).prop_map(|(r, n)| Step::Request(r, n)),
        1 => (0usize..2).prop_map(Step::Change),
    ];
    prop::collection::vec(step, 1..24)
}

/// Nonces sent per type, and every nonce sent on the stream.
#[derive(Default)]
struct Nonces {
    by_type: BTreeMap<String, Vec<String>>,
    all: BTreeSet<String>,
}

impl Nonces {
    fn pick(&self, type_url: &str, choice: &NonceChoice) -> String {
        let sent = self.by_type.get(type_url).map(Vec::as_slice).unwrap_or_default();
        match choice {
            NonceChoice::Empty => String::new(),
            NonceChoice::Latest => sent.last().cloned().unwrap_or_default(),
            NonceChoice::Older(i) if !sent.is_empty() => sent[i % sent.len()].clone(),
            NonceChoice::Older(_) => String::new(),
            NonceChoice::Foreign(s) => s.clone(),
        }
    }

    fn record(&mut self, type_url: &str, nonce: &str) -> Result<(), TestCaseError> {
        prop_assert!(!nonce.is_empty(), "a response without a nonce");
        prop_assert!(self.all.insert(nonce.to_owned()), "nonce {nonce} sent twice on one stream");
        self.by_type.entry(type_url.to_owned()).or_default().push(nonce.to_owned());
        Ok(())
    }
}

fn check_resource_type(resp_type: &str, any_type: &str) -> Result<(), TestCaseError> {
    // MCP collections carry `istio.mcp.v1alpha1.Resource`s; Envoy types
    // carry their own type.
    let ok = any_type == resp_type || (any_type == MCP_RESOURCE_TYPE && !resp_type.starts_with("type.googleapis.com/"));
    prop_assert!(ok, "a {any_type} resource in a {resp_type} response");
    Ok(())
}

fn run_sotw(steps: &[Step<SotwReq>]) -> Result<(), TestCaseError> {
    let sets = config_sets();
    let clients = Clients::new();
    let mut stream = SotwStream::new(clients.connect("fuzz", "sotw"));
    let mut current = 0;
    let mut nonces = Nonces::default();
    for step in steps {
        let (responses, asked) = match step {
            Step::Request(r, choice) => {
                let req = DiscoveryRequest {
                    version_info: r.version.clone(),
                    node: r.node.as_ref().map(|id| Node { id: id.clone(), ..Node::default() }),
                    resource_names: r.names.clone(),
                    type_url: r.type_url.clone(),
                    response_nonce: nonces.pick(&r.type_url, choice),
                    error_detail: r.nack.as_ref().map(|m| Status { code: 3, message: m.clone(), details: vec![] }),
                    ..DiscoveryRequest::default()
                };
                (stream.on_request(&req, &sets[current]), Some(r.type_url.clone()))
            }
            Step::Change(i) => {
                current = *i;
                (stream.on_change(&sets[current]), None)
            }
        };
        prop_assert!(asked.is_none() || responses.len() <= 1, "one request got {} responses", responses.len());
        for resp in &responses {
            if let Some(t) = &asked {
                prop_assert_eq!(&resp.type_url, t, "answered a different type");
            }
            nonces.record(&resp.type_url, &resp.nonce)?;
            prop_assert!(!resp.version_info.is_empty(), "a response without a version");
            for any in &resp.decoded().resources {
                check_resource_type(&resp.type_url, &any.type_url)?;
            }
        }
    }
    Ok(())
}

#[derive(Debug, Clone)]
struct DeltaReq {
    type_url: String,
    subscribe: Vec<String>,
    unsubscribe: Vec<String>,
    initial: BTreeMap<String, String>,
    nack: Option<String>,
}

fn delta_steps() -> impl Strategy<Value = Vec<Step<DeltaReq>>> {
    let req = (
        type_url(),
        prop::collection::vec(resource_name(), 0..4),
        prop::collection::vec(resource_name(), 0..2),
        prop::collection::btree_map(resource_name(), word(), 0..3),
        prop::option::weighted(0.2, word()),
    )
        .prop_map(|(type_url, subscribe, unsubscribe, initial, nack)| DeltaReq {
            type_url,
            subscribe,
            unsubscribe,
            initial,
            nack,
        });
    let step = prop_oneof![
        5 => (req, nonce_choice()).prop_map(|(r, n)| Step::Request(r, n)),
        1 => (0usize..2).prop_map(Step::Change),
    ];
    prop::collection::vec(step, 1..24)
}

fn run_delta(steps: &[Step<DeltaReq>]) -> Result<(), TestCaseError> {
    let sets = config_sets();
    let clients = Clients::new();
    let mut stream = DeltaStream::new(clients.connect("fuzz", "delta"));
    let mut current = 0;
    let mut nonces = Nonces::default();
    for step in steps {
        let (responses, asked) = match step {
            Step::Request(r, choice) => {
                let req = DeltaDiscoveryRequest {
                    type_url: r.type_url.clone(),
                    resource_names_subscribe: r.subscribe.clone(),
                    resource_names_unsubscribe: r.unsubscribe.clone(),
                    initial_resource_versions: r.initial.clone().into_iter().collect(),
                    response_nonce: nonces.pick(&r.type_url, choice),
                    error_detail: r.nack.as_ref().map(|m| Status { code: 3, message: m.clone(), details: vec![] }),
                    ..DeltaDiscoveryRequest::default()
                };
                (stream.on_request(&req, &sets[current]), Some(r.type_url.clone()))
            }
            Step::Change(i) => {
                current = *i;
                (stream.on_change(&sets[current]), None)
            }
        };
        prop_assert!(asked.is_none() || responses.len() <= 1, "one request got {} responses", responses.len());
        // As the client reads them: the wire form.
        for resp in responses.iter().map(|r| r.decoded()) {
            if let Some(t) = &asked {
                prop_assert_eq!(&resp.type_url, t, "answered a different type");
            }
            nonces.record(&resp.type_url, &resp.nonce)?;
            let mut names = HashSet::new();
            for r in &resp.resources {
                prop_assert!(names.insert(r.name.as_str()), "resource {} twice in one response", r.name);
                prop_assert!(!r.version.is_empty(), "resource {} without a version", r.name);
                if let Some(any) = &r.resource {
                    check_resource_type(&resp.type_url, &any.type_url)?;
                }
            }
            for removed in &resp.removed_resources {
                prop_assert!(!names.contains(removed.as_str()), "{removed} both sent and removed");
            }
        }
    }
    Ok(())
}

#[test]
fn fuzz_sotw_stream() {
    runner::fuzz(&root(), "sotw", 200, sotw_steps(), |steps| run_sotw(&steps));
}

#[test]
fn fuzz_delta_stream() {
    runner::fuzz(&root(), "delta", 200, delta_steps(), |steps| run_delta(&steps));
}
