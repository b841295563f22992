//! Property-test fuzz targets of the registry decoders: Consul, Eureka and
//! Nacos JSON answers and the ZooKeeper Dubbo URL and Curator readers, each
//! fed arbitrary bytes and arbitrary-but-shaped JSON. Properties: no panic,
//! a clean error or a result that holds the decoder's promises (routable
//! endpoints, valid labels, ports never 0). See `fuzz/runner.rs` for the
//! knobs and RELIABILITY.md for the long runs.

#[path = "../../fuzz/runner.rs"]
mod runner;

use std::collections::BTreeMap;
use std::path::PathBuf;

use proptest::prelude::*;
use serde_json::{Map, Value, json};

use crate::labels::{is_valid_label_key, is_valid_label_value};
use crate::{Endpoint, RegistryKind, RegistrySpec, Service, consul, eureka, nacos, zookeeper};

fn root() -> PathBuf {
    runner::repo_root(env!("CARGO_MANIFEST_DIR"))
}

fn word() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-zA-Z0-9._-]{0,10}",
        "[ -~]{0,12}",
        any::<String>(),
        Just(String::new()),
        Just("UP".to_owned()),
        Just("10.0.0.1".to_owned()),
        Just("::1".to_owned()),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Value::from),
        (-2i64..70_000).prop_map(Value::from),
        word().prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 20, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map(word(), inner, 0..5).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// `plausible` most of the time, any JSON value sometimes, or absent.
fn field(plausible: impl Strategy<Value = Value> + 'static) -> BoxedStrategy<Option<Value>> {
    prop_oneof![1 => Just(None), 5 => plausible.prop_map(Some), 1 => json_value().prop_map(Some)].boxed()
}

fn object(fields: Vec<(&'static str, BoxedStrategy<Option<Value>>)>) -> impl Strategy<Value = Value> {
    let (keys, values): (Vec<_>, Vec<_>) = fields.into_iter().unzip();
    values.prop_map(move |values| {
        let m: Map<String, Value> = keys.iter().zip(values).filter_map(|(k, v)| Some(((*k).to_owned(), v?))).collect();
        Value::Object(m)
    })
}

fn metadata() -> impl Strategy<Value = Value> {
    prop::collection::btree_map(
        prop_oneof!["[a-z][a-z0-9._/-]{0,12}", word()],
        prop_oneof![word().prop_map(Value::from), json_value()],
        0..4,
    )
    .prop_map(|m| json!(m))
}

fn ip() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!("10.0.0.1")),
        Just(json!("fe80::1")),
        Just(json!("svc.local")),
        Just(json!("")),
        Just(json!(" ")),
        word().prop_map(Value::from)
    ]
}

fn port() -> impl Strategy<Value = Value> {
    prop_oneof![
        (-1i64..70_000).prop_map(Value::from),
        Just(json!(0)),
        Just(json!(65535)),
        any::<i64>().prop_map(Value::from)
    ]
}

/// Either arbitrary bytes or the JSON text of `shaped`, sometimes cut short.
fn body(shaped: impl Strategy<Value = Value> + 'static) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        1 => prop::collection::vec(any::<u8>(), 0..256),
        4 => shaped.prop_map(|v| serde_json::to_vec(&v).unwrap_or_default()),
        1 => (json_value(), any::<prop::sample::Index>()).prop_map(|(v, cut)| {
            let bytes = serde_json::to_vec(&v).unwrap_or_default();
            bytes[..cut.index(bytes.len() + 1)].to_vec()
        }),
    ]
}

/// What every decoder promises of the endpoints it returns.
fn check_endpoints(eps: &[Endpoint]) -> Result<(), TestCaseError> {
    for e in eps {
        prop_assert!(!e.address.trim().is_empty(), "an endpoint without an address: {e:?}");
        check_endpoint_rest(e)?;
    }
    Ok(())
}

/// Consul's decoder drops only empty addresses: a blank one (" ") passes
/// and is left to name resolution, which fails on it (found by this target;
/// see RELIABILITY.md).
fn check_consul_endpoints(eps: &[Endpoint]) -> Result<(), TestCaseError> {
    for e in eps {
        prop_assert!(!e.address.is_empty(), "an endpoint without an address: {e:?}");
        check_endpoint_rest(e)?;
    }
    Ok(())
}

fn check_endpoint_rest(e: &Endpoint) -> Result<(), TestCaseError> {
    {
        prop_assert!(e.port != 0, "an endpoint on port 0: {e:?}");
        prop_assert!(e.weight >= 1, "an endpoint with weight 0: {e:?}");
        check_labels(&e.labels)?;
    }
    Ok(())
}

fn check_labels(labels: &BTreeMap<String, String>) -> Result<(), TestCaseError> {
    for (k, v) in labels {
        prop_assert!(is_valid_label_key(k) && is_valid_label_value(v), "invalid label {k:?}={v:?}");
    }
    Ok(())
}

fn check_service(svc: &Service) -> Result<(), TestCaseError> {
    prop_assert!(!svc.host.is_empty());
    prop_assert!(svc.ports.iter().all(|p| p.number != 0), "a service port 0: {svc:?}");
    check_endpoints(&svc.endpoints)
}

fn replay(target: &str, check: impl Fn(&[u8]) -> Result<(), TestCaseError>) {
    for (name, bytes) in runner::corpus(&root(), target) {
        if let Err(e) = check(&bytes) {
            panic!("corpus {target}/{name}: {e}");
        }
    }
}

// ------------------------------------------------------------------- Consul

fn consul_catalog() -> impl Strategy<Value = Value> {
    let tags = prop_oneof![prop::collection::vec(word(), 0..3).prop_map(|t| json!(t)), Just(Value::Null), json_value()];
    prop::collection::btree_map(prop_oneof![Just("consul".to_owned()), word()], tags, 0..5).prop_map(|m| json!(m))
}

fn consul_health() -> impl Strategy<Value = Value> {
    let node = object(vec![("Address", field(ip()))]);
    let weights = object(vec![("Passing", field(any::<i64>().prop_map(Value::from))), ("Warning", field(port()))]);
    let service = object(vec![
        ("Address", field(ip())),
        ("Port", field(port())),
        ("Weights", field(weights)),
        ("Meta", field(metadata())),
        ("Tags", field(prop::collection::vec(word(), 0..2).prop_map(|t| json!(t)))),
    ]);
    let entry = object(vec![("Node", field(node)), ("Service", field(service)), ("Checks", field(json_value()))]);
    prop::collection::vec(entry, 0..5).prop_map(Value::Array)
}

fn check_consul_catalog(body: &[u8]) -> Result<(), TestCaseError> {
    if let Ok(catalog) = consul::decode::decode_catalog(body) {
        for tag in [None, Some("V1"), Some("")] {
            let selected = consul::decode::select_services(&catalog, tag);
            prop_assert!(!selected.contains("consul"), "Consul itself selected");
            prop_assert!(selected.iter().all(|s| catalog.contains_key(s)));
        }
        for name in catalog.keys() {
            prop_assert!(!consul::decode::host_name(name, "dc1").is_empty());
        }
    }
    Ok(())
}

fn check_consul_health(body: &[u8]) -> Result<(), TestCaseError> {
    if let Ok(instances) = consul::decode::decode_health(body) {
        let eps = instances.endpoints;
        check_consul_endpoints(&eps)?;
        let spec = RegistrySpec::new(RegistryKind::Consul, "c", "127.0.0.1", 8500);
        let naming = consul::decode::Naming::new(&spec, "dc1");
        let svc = naming.service("Svc_1", eps, None);
        prop_assert!(svc.ports.iter().all(|p| p.number != 0), "a service port 0: {svc:?}");
        check_consul_endpoints(&svc.endpoints)?;
    }
    Ok(())
}

#[test]
fn fuzz_consul_catalog() {
    runner::fuzz(&root(), "consul_catalog", 500, body(consul_catalog()), |b| check_consul_catalog(&b));
    replay("consul_catalog", check_consul_catalog);
}

#[test]
fn fuzz_consul_health() {
    runner::fuzz(&root(), "consul_health", 500, body(consul_health()), |b| check_consul_health(&b));
    replay("consul_health", check_consul_health);
}

// ------------------------------------------------------------------- Eureka

fn eureka_apps() -> impl Strategy<Value = Value> {
    let port_info = prop_oneof![
        (port(), prop_oneof![Just(json!("true")), Just(json!(false)), json_value()])
            .prop_map(|(n, e)| json!({"$": n, "@enabled": e})),
        port(),
    ];
    let status = prop_oneof![
        Just(json!("UP")),
        Just(json!("DOWN")),
        Just(json!("OUT_OF_SERVICE")),
        Just(json!("UNKNOWN")),
        word().prop_map(Value::from)
    ];
    let instance = object(vec![
        ("instanceId", field(word().prop_map(Value::from))),
        ("hostName", field(ip())),
        ("app", field(word().prop_map(Value::from))),
        ("ipAddr", field(ip())),
        ("status", field(status.clone())),
        ("overriddenstatus", field(status.clone())),
        ("overriddenStatus", field(status)),
        ("port", field(port_info.clone())),
        ("securePort", field(port_info)),
        ("metadata", field(metadata())),
        (
            "actionType",
            field(prop_oneof![Just(json!("ADDED")), Just(json!("MODIFIED")), Just(json!("DELETED")), json_value()]),
        ),
    ])
    .boxed();
    let instances = prop_oneof![
        prop::collection::vec(instance.clone(), 0..4).prop_map(Value::Array),
        instance.clone(),
        Just(Value::Null)
    ];
    let app = object(vec![("name", field(word().prop_map(Value::from))), ("instance", field(instances))]).boxed();
    let apps = prop_oneof![prop::collection::vec(app.clone(), 0..4).prop_map(Value::Array), app];
    object(vec![
        ("versions__delta", field(word().prop_map(Value::from))),
        ("apps__hashcode", field(word().prop_map(Value::from))),
        ("application", field(apps)),
    ])
    .prop_map(|a| json!({"applications": a}))
}

fn check_eureka(full: &[u8], delta: &[u8]) -> Result<(), TestCaseError> {
    let Ok(full) = eureka::decode::decode_apps(full) else { return Ok(()) };
    let mut reg = eureka::decode::Registry::from_full(full.groups);
    let _ = reg.reconcile_hash_code();
    let naming = eureka::decode::Naming::new(&RegistrySpec::new(RegistryKind::Eureka, "e", "127.0.0.1", 8761));
    let first = naming.services(&reg, &BTreeMap::new(), &crate::Selection::all());
    for svc in first.values() {
        check_service(svc)?;
    }
    if let Ok(delta) = eureka::decode::decode_apps(delta) {
        reg.apply_delta(delta.instances());
        let hash = reg.reconcile_hash_code();
        prop_assert!(hash.is_empty() || hash.ends_with('_'), "odd hashcode {hash:?}");
        for svc in naming.services(&reg, &first, &crate::Selection::all()).values() {
            check_service(svc)?;
        }
    }
    Ok(())
}

#[test]
fn fuzz_eureka_apps() {
    runner::fuzz(&root(), "eureka_apps", 400, (body(eureka_apps()), body(eureka_apps())), |(full, delta)| {
        check_eureka(&full, &delta)
    });
    replay("eureka_apps", |b| check_eureka(b, b));
}

// -------------------------------------------------------------------- Nacos

fn nacos_service_list() -> impl Strategy<Value = Value> {
    object(vec![
        ("count", field(any::<i64>().prop_map(Value::from))),
        ("doms", field(prop::collection::vec(word(), 0..4).prop_map(|d| json!(d)))),
    ])
}

fn nacos_instance_list() -> impl Strategy<Value = Value> {
    let instance = object(vec![
        ("ip", field(ip())),
        ("port", field(port())),
        (
            "weight",
            field(prop_oneof![any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Value::from), port()]),
        ),
        ("healthy", field(any::<bool>().prop_map(Value::from))),
        ("enabled", field(prop_oneof![any::<bool>().prop_map(Value::from), Just(Value::Null)])),
        ("metadata", field(metadata())),
        ("clusterName", field(word().prop_map(Value::from))),
    ]);
    object(vec![
        ("hosts", field(prop::collection::vec(instance, 0..5).prop_map(Value::Array))),
        ("name", field(word().prop_map(Value::from))),
    ])
}

fn check_nacos_list(body: &[u8]) -> Result<(), TestCaseError> {
    if let Ok(list) = nacos::decode::decode_service_list(body) {
        for name in &list.doms {
            let _ = nacos::decode::is_watched(name);
        }
    }
    Ok(())
}

fn check_nacos_instances(body: &[u8]) -> Result<(), TestCaseError> {
    if let Ok(instances) = nacos::decode::decode_instance_list(body) {
        let n = instances.len();
        let decoded = nacos::decode::endpoints(instances);
        prop_assert!(decoded.endpoints.len() + decoded.skipped <= n);
        check_endpoints(&decoded.endpoints)?;
        let naming = nacos::decode::Naming::new(&RegistrySpec::new(RegistryKind::Nacos2, "n", "127.0.0.1", 8848));
        let key = nacos::decode::ServiceKey::new("DEFAULT_GROUP", "svc");
        check_service(&naming.service(&key, decoded, None))?;
    }
    Ok(())
}

#[test]
fn fuzz_nacos_service_list() {
    runner::fuzz(&root(), "nacos_service_list", 500, body(nacos_service_list()), |b| check_nacos_list(&b));
    replay("nacos_service_list", check_nacos_list);
}

#[test]
fn fuzz_nacos_instance_list() {
    runner::fuzz(&root(), "nacos_instance_list", 500, body(nacos_instance_list()), |b| check_nacos_instances(&b));
    replay("nacos_instance_list", check_nacos_instances);
}

// ---------------------------------------------------------------- ZooKeeper

/// Provider node names: Dubbo URLs, form-encoded as Dubbo writes them,
/// with the parts that matter often wrong.
fn dubbo_node() -> impl Strategy<Value = String> {
    let url = (
        prop_oneof![Just("dubbo".to_owned()), Just("tri".to_owned()), "[a-z+.-]{0,6}"],
        prop_oneof![Just("10.0.0.1".to_owned()), Just("[fe80::1]".to_owned()), Just("fe80::1".to_owned()), word()],
        prop_oneof!["[0-9]{0,6}", word()],
        prop::collection::vec((word(), word()), 0..5),
    )
        .prop_map(|(scheme, host, port, params)| {
            let query: Vec<String> = params.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let url = format!("{scheme}://{host}:{port}/com.example.Api?{}", query.join("&"));
            percent_encoding::utf8_percent_encode(&url, percent_encoding::NON_ALPHANUMERIC).to_string()
        });
    prop_oneof![3 => url, 1 => word(), 1 => "(%[0-9A-Fa-f]{0,2}|[a-z:/?&=+#])*"]
}

fn check_dubbo(node: &str) -> Result<(), TestCaseError> {
    let _ = zookeeper::dubbo::redact(node);
    match zookeeper::dubbo::provider("com.example.Api", node) {
        Ok(p) => {
            check_endpoints(std::slice::from_ref(&p.endpoint))?;
            prop_assert!(p.host.starts_with("providers:com.example.Api:"));
        }
        Err(e) => prop_assert!(!e.to_string().is_empty()),
    }
    Ok(())
}

#[test]
fn fuzz_dubbo_url() {
    runner::fuzz(&root(), "dubbo_url", 1000, dubbo_node(), |node| check_dubbo(&node));
    replay("dubbo_url", |b| check_dubbo(&String::from_utf8_lossy(b)));
}

fn curator_instance() -> impl Strategy<Value = Value> {
    let payload = object(vec![
        ("@class", field(word().prop_map(Value::from))),
        ("metadata", field(metadata())),
        ("id", field(word().prop_map(Value::from))),
    ]);
    object(vec![
        ("name", field(word().prop_map(Value::from))),
        ("id", field(word().prop_map(Value::from))),
        ("address", field(ip())),
        ("port", field(prop_oneof![port(), Just(Value::Null)])),
        ("sslPort", field(prop_oneof![port(), Just(Value::Null)])),
        ("payload", field(payload)),
        ("serviceType", field(word().prop_map(Value::from))),
    ])
}

fn check_curator(data: &[u8]) -> Result<(), TestCaseError> {
    match zookeeper::spring::parse_instance(data) {
        Ok(i) => {
            check_endpoints(std::slice::from_ref(&i.endpoint))?;
        }
        Err(e) => prop_assert!(!e.to_string().is_empty()),
    }
    Ok(())
}

#[test]
fn fuzz_curator_instance() {
    runner::fuzz(&root(), "curator_instance", 1000, body(curator_instance()), |b| check_curator(&b));
    replay("curator_instance", check_curator);
}
