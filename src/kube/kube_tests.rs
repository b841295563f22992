use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::networking::v1::Ingress;
use serde_json::json;

use super::ports::pins;
use super::status::{bridge_status, errors_of};
use super::watch::{Observed, ObservedBridge, selected};
use crate::config::{Desired, ProxySpec, build_desired, parse_documents};

fn ingress(annotation: Option<&str>, class_name: Option<&str>) -> Ingress {
    let mut v = json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
                       "metadata": {"name": "i", "namespace": "n", "annotations": {}}, "spec": {}});
    if let Some(a) = annotation {
        v["metadata"]["annotations"]["kubernetes.io/ingress.class"] = json!(a);
    }
    if let Some(c) = class_name {
        v["spec"]["ingressClassName"] = json!(c);
    }
    serde_json::from_value(v).unwrap()
}

#[test]
fn ingress_class_selection() {
    // The annotation wins over ingressClassName, as in Higress.
    assert_eq!(selected(&ingress(Some("mesh"), Some("other")), "mesh", false), Some(false));
    assert_eq!(selected(&ingress(Some("other"), Some("mesh")), "mesh", false), None);
    assert_eq!(selected(&ingress(None, Some("mesh")), "mesh", false), Some(false));
    // No class: `higress` takes it; another class only as the default
    // IngressClass, and then the class must be filled in.
    assert_eq!(selected(&ingress(None, None), "higress", false), Some(false));
    assert_eq!(selected(&ingress(None, None), "mesh", false), None);
    assert_eq!(selected(&ingress(None, None), "mesh", true), Some(true));
    // An empty class takes everything.
    assert_eq!(selected(&ingress(Some("x"), None), "", false), Some(false));
}

#[test]
fn errors_are_attributed_to_their_mcpbridge() {
    let errors = vec![
        "McpBridge ns/a: spec.registries[0].port: must be 1..65535".to_owned(),
        "McpBridge ns/ab: spec.registries[1].name: duplicate".to_owned(),
        "Secret ns/a: data.x: not valid base64".to_owned(),
    ];
    assert_eq!(errors_of(&errors, "ns/a"), vec!["spec.registries[0].port: must be 1..65535"]);
    assert_eq!(errors_of(&errors, "ns/ab"), vec!["spec.registries[1].name: duplicate"]);
}

fn observed_bridge(registries: serde_json::Value, proxies: serde_json::Value) -> ObservedBridge {
    ObservedBridge {
        namespace: "ns".into(),
        name: "b".into(),
        generation: Some(3),
        resource_version: Some("7".into()),
        registries: registries.as_array().cloned().unwrap_or_default(),
        proxies: proxies.as_array().cloned().unwrap_or_default(),
        status: None,
    }
}

#[test]
fn status_names_shared_services_and_their_conflicts() {
    use crate::cache::{RegistryKey, RegistryReport, RegistryStatus};
    use meshbridge_registries::{RegistryKind, RegistrySpec};
    let bridge =
        observed_bridge(json!([{"type": "nacos", "name": "old"}, {"type": "nacos2", "name": "new"}]), json!([]));
    let specs =
        [RegistrySpec::new(RegistryKind::Nacos, "old", "h", 1), RegistrySpec::new(RegistryKind::Nacos2, "new", "h", 1)];
    let desired = Desired { registries: specs.to_vec(), ..Default::default() };
    let conflict = "host web.DEFAULT-GROUP.shop.nacos: registries nacos/old and nacos2/new disagree on the protocol of port 8080 (HTTP vs GRPC)";
    let report = |kind, name: &str, shared, conflicts: &[&str]| RegistryReport {
        key: RegistryKey::new(kind, name),
        endpoint: "h:1".into(),
        status: RegistryStatus { healthy: true, ready: true, ..Default::default() },
        services: 3,
        endpoints: 6,
        shared_services: shared,
        conflicts: conflicts.iter().map(|c| c.to_string()).collect(),
    };
    let reports = [report(RegistryKind::Nacos, "old", 2, &[conflict]), report(RegistryKind::Nacos2, "new", 0, &[])];
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let status = bridge_status(&bridge, &desired, &reports, None, t0);
    assert_eq!(status["registries"][0]["sharedServices"], json!(2));
    assert_eq!(status["registries"][0]["conflicts"], json!([conflict]));
    let alone = status["registries"][1].as_object().unwrap();
    assert!(!alone.contains_key("sharedServices") && !alone.contains_key("conflicts"), "{alone:?}");
}

#[test]
fn status_names_entry_errors_and_keeps_transition_times() {
    let bridge = observed_bridge(
        json!([{"type": "consul", "name": "c", "port": 0}, {"type": "static", "name": "s"}]),
        json!([]),
    );
    let desired = Desired {
        errors: vec!["McpBridge ns/b: spec.registries[0].port: must be 1..65535".into()],
        ..Default::default()
    };
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let first = bridge_status(&bridge, &desired, &[], None, t0);
    assert_eq!(first["observedGeneration"], json!(3));
    assert_eq!(first["registries"][0]["message"], json!("spec.registries[0].port: must be 1..65535"));
    assert_eq!(first["registries"][1]["message"], json!("not running"));
    assert_eq!(first["errors"], json!(["spec.registries[0].port: must be 1..65535"]));
    assert_eq!(first["conditions"][0]["lastTransitionTime"], json!("2023-11-14T22:13:20Z"));
    // Same content later: same status, so nothing to write.
    let later = bridge_status(&bridge, &desired, &[], Some(&first), t0 + Duration::from_secs(60));
    assert_eq!(later, first);
}

#[test]
fn only_unpinned_proxies_of_one_mcpbridge_are_pinned() {
    let proxy = |name: &str, port: Option<u16>| ProxySpec {
        name: name.into(),
        server_address: "10.0.0.1".into(),
        server_port: 3128,
        listener_port: port,
        connect_timeout: None,
    };
    let bridge = observed_bridge(
        json!([]),
        json!([{"name": "free", "serverAddress": "10.0.0.1"}, {"name": "pinned", "listenerPort": 50500}]),
    );
    let desired = Desired { proxies: vec![proxy("free", None), proxy("pinned", Some(50500))], ..Default::default() };
    let observed = Observed { bridges: vec![bridge.clone()], desired: Arc::new(desired) };
    let out = pins(&observed, &BTreeSet::from([80, 443]));
    assert_eq!(out.len(), 1);
    let port = out[0].1[0]["listenerPort"].as_u64().unwrap();
    assert!((50001..=50999).contains(&port) && port != 50500, "{port}");
    assert_eq!(out[0].1[0]["serverAddress"], "10.0.0.1");
    assert_eq!(out[0].1[1], json!({"name": "pinned", "listenerPort": 50500}));

    // Declared by two McpBridges: a clash, left alone.
    let twice = Observed { bridges: vec![bridge.clone(), bridge], desired: observed.desired.clone() };
    assert!(pins(&twice, &BTreeSet::new()).is_empty());
}

#[test]
fn dubbo_spring_example_loads_without_errors() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/examples/dubbo-spring");
    let mut docs = Vec::new();
    for file in ["mcpbridge.yaml", "ingress.yaml"] {
        let text = std::fs::read_to_string(format!("{dir}/{file}")).unwrap();
        docs.extend(parse_documents(file, &text).unwrap());
    }
    let desired = build_desired(&docs);
    assert_eq!(desired.errors, Vec::<String>::new());
    let names: Vec<_> = desired.registries.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["spring-nacos", "dubbo-zk"]);
    assert!(desired.registries[0].auth.contains_key("nacosPassword"));
    // greeter-spring, greeter-spring-canary, greeter-dubbo (apps.yaml holds
    // only the apps' own objects, which meshbridge does not read).
    assert_eq!(desired.ingresses.len(), 3);
}

#[test]
fn kube_flags_parse_and_exclude_the_config_dir() {
    use clap::{CommandFactory, Parser};

    use crate::run::{Cli, Command};
    Cli::command().debug_assert();
    let cli = Cli::try_parse_from([
        "meshbridge",
        "run",
        "--kube",
        "--all-mcpbridges",
        "--watch-namespace",
        "apps",
        "--leader-elect",
        "--leader-lease-duration",
        "20s",
    ])
    .unwrap();
    let Command::Run(run) = cli.command else { panic!("not run") };
    assert!(run.kube.kube && run.kube.all_mcpbridges);
    assert_eq!(run.kube.watch_namespace.as_deref(), Some("apps"));
    assert_eq!(run.kube.leader_elect, Some(true));
    assert_eq!(run.kube.leader_lease_duration, Duration::from_secs(20));
    assert_eq!(run.kube.namespace, "higress-system");
    assert!(Cli::try_parse_from(["meshbridge", "run", "--kube", "--config-dir", "/tmp"]).is_err());
    assert!(Cli::try_parse_from(["meshbridge", "run", "--mcpbridge-selector", "a=b", "--all-mcpbridges"]).is_err());
}

fn bridge_object(rv: &str, registries: serde_json::Value) -> Arc<kube::api::DynamicObject> {
    Arc::new(
        serde_json::from_value(json!({
            "apiVersion": "networking.higress.io/v1", "kind": "McpBridge",
            "metadata": {"name": "default", "namespace": "ns", "uid": "u-1", "resourceVersion": rv, "generation": 1},
            "spec": {"registries": registries},
        }))
        .unwrap(),
    )
}

fn ingress_object(i: usize, rv: &str) -> Arc<Ingress> {
    Arc::new(
        serde_json::from_value(json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": format!("i{i}"), "namespace": "apps", "uid": format!("u-i{i}"), "resourceVersion": rv,
                         "annotations": {"higress.io/destination": "web.static:80"}},
            "spec": {"ingressClassName": "higress", "rules": [{"host": format!("h{i}.example.com"), "http": {"paths": [
                {"path": "/", "pathType": "Prefix", "backend": {"resource":
                    {"apiGroup": "networking.higress.io", "kind": "McpBridge", "name": "default"}}}]}}]},
        }))
        .unwrap(),
    )
}

#[test]
fn assembler_keeps_an_objects_last_good_version() {
    use super::watch::Assembler;
    let mut a = Assembler::new("higress".into());
    let good = json!([{"type": "static", "name": "web", "domain": "10.0.0.1:80", "port": 80}]);
    let first = a.build(vec![bridge_object("1", good)], vec![ingress_object(0, "1")], &[], vec![]);
    assert_eq!(first.desired.errors, Vec::<String>::new());
    assert_eq!((first.desired.registries.len(), first.desired.ingresses.len()), (1, 1));

    // A version that does not parse keeps the last good one in force.
    let broken = a.build(vec![bridge_object("2", json!({"not": "a list"}))], vec![], &[], vec![]);
    assert_eq!(broken.desired.registries, first.desired.registries);
    assert_eq!(
        broken.desired.errors,
        vec!["McpBridge ns/default: spec.registries: must be a list; keeping last good config of this object"]
    );
    assert_eq!(broken.desired.ingresses.len(), 0, "a deleted Ingress is gone");
    // Deleted, then back broken: nothing to fall back on.
    a.build(vec![], vec![], &[], vec![]);
    let again = a.build(vec![bridge_object("3", json!({"not": "a list"}))], vec![], &[], vec![]);
    assert!(again.desired.registries.is_empty());
    assert!(again.desired.errors[0].ends_with("; object ignored"), "{:?}", again.desired.errors);
}

/// Cost of a rebuild follows the change: the first build parses every
/// object, and an edit of one Ingress parses that one, whether 50 or 5,000
/// others are unchanged (an unchanged uid and resourceVersion is not
/// serialized or parsed again). Counted, not timed. The Builder still walks
/// every document to assemble `Desired`; that walk is not what this checks.
#[test]
fn assembler_rebuild_cost_follows_the_change() {
    use super::watch::Assembler;
    /// Parses for (the first build, a rebuild after editing one Ingress,
    /// a rebuild with nothing changed), with `n` Ingresses.
    fn parses(n: usize) -> (usize, usize, usize) {
        let mut a = Assembler::new("higress".into());
        let bridge =
            bridge_object("1", json!([{"type": "static", "name": "web", "domain": "10.0.0.1:80", "port": 80}]));
        let mut ingresses: Vec<_> = (0..n).map(|i| ingress_object(i, "1")).collect();
        let first = a.build(vec![bridge.clone()], ingresses.clone(), &[], vec![]);
        assert_eq!(first.desired.ingresses.len(), n);
        let full = std::mem::take(&mut a.parses);
        ingresses[7] = ingress_object(7, "2");
        let second = a.build(vec![bridge.clone()], ingresses.clone(), &[], vec![]);
        assert_eq!(second.desired.ingresses.len(), n);
        let one = std::mem::take(&mut a.parses);
        a.build(vec![bridge], ingresses, &[], vec![]);
        (full, one, a.parses)
    }
    let (small, large) = (parses(50), parses(5_000));
    assert_eq!(small, (51, 1, 0), "50 Ingresses and a McpBridge");
    assert_eq!(large, (5_001, 1, 0), "5,000 Ingresses and a McpBridge");
}

/// Kubernetes mode reads `registryTls.caKey` from the `authSecretName`
/// Secret's (base64) `data`, as the directory mode reads it from YAML.
#[test]
fn assembler_reads_the_registry_ca_from_a_secret() {
    use super::watch::Assembler;
    use base64::Engine;
    use k8s_openapi::api::core::v1::Secret;
    let ca = include_str!("../config/testdata/test-ca.pem");
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let secret: Arc<Secret> = Arc::new(
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "consul-auth", "namespace": "ns", "uid": "u-s", "resourceVersion": "1"},
            "data": {"consulToken": b64("tok-k8s-31"), "ca.crt": b64(ca)},
        }))
        .unwrap(),
    );
    let registries = json!([{"type": "consul", "name": "c", "domain": "consul.example", "port": 8501,
        "authSecretName": "consul-auth", "registryTls": {"enabled": true, "caKey": "ca.crt"}}]);
    let mut a = Assembler::new("higress".into());
    let built = a.build(vec![bridge_object("1", registries)], vec![], &[], vec![secret]);
    assert_eq!(built.desired.errors, Vec::<String>::new());
    let tls = built.desired.registries[0].tls.as_ref().expect("registryTls on");
    assert_eq!(tls.ca_pem.as_deref(), Some(ca));
}

/// `spec` of a CRD file.
fn crd_spec(yaml: &str) -> serde_json::Value {
    let crd: serde_json::Value = serde_saphyr::from_str(yaml).expect("CRD YAML");
    crd["spec"].clone()
}

const OUR_CRD: &str = include_str!("../../deploy/kubernetes/crd-mcpbridge.yaml");
const HIGRESS_CRD: &str = include_str!("../../e2e/fixtures/higress-crd-mcpbridge.yaml");

/// Our CRD declares every field the config code reads (so the API server
/// prunes none of them), and nothing the code does not know.
#[test]
fn our_crd_schema_matches_the_fields_the_code_reads() {
    use crate::config::{PROXY_FIELDS, REGISTRY_FIELDS, REGISTRY_IGNORED_FIELDS};
    let spec = crd_spec(OUR_CRD);
    assert_eq!(super::pruned_fields(&spec), Some(vec![]), "fields the code reads but the CRD would prune");
    let schema = &spec["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
    let props = |list: &str| -> Vec<String> {
        schema[list]["items"]["properties"].as_object().unwrap().keys().cloned().collect()
    };
    for field in props("registries") {
        assert!(
            REGISTRY_FIELDS.contains(&field.as_str()) || REGISTRY_IGNORED_FIELDS.contains(&field.as_str()),
            "the CRD declares spec.registries[].{field}, which the config code does not know"
        );
    }
    for field in props("proxies") {
        assert!(PROXY_FIELDS.contains(&field.as_str()), "the CRD declares spec.proxies[].{field}, unknown to the code");
    }
    // Types as the code reads them: int64 (a number or a numeric string)
    // for the intervals and nacosTimeout, a list of names for ecdhCurves.
    let entry = &schema["registries"]["items"]["properties"];
    for field in ["nacosRefreshInterval", "consulRefreshInterval", "nacosTimeout"] {
        assert_eq!(
            (entry[field]["type"].as_str(), entry[field]["format"].as_str()),
            (Some("integer"), Some("int64")),
            "{field}"
        );
    }
    assert_eq!(entry["ecdhCurves"]["type"], "array");
    assert_eq!(entry["ecdhCurves"]["items"]["type"], "string");
    assert_eq!(entry["port"]["type"], "integer");
}

/// Higress's CRD (the fixture written from its published schema) prunes
/// meshbridge's additions, and only those.
#[test]
fn higress_crd_prunes_what_meshbridge_adds() {
    let pruned = super::pruned_fields(&crd_spec(HIGRESS_CRD)).unwrap();
    assert_eq!(
        pruned,
        [
            "spec.registries[].nacosTimeout",
            "spec.registries[].ecdhCurves",
            "spec.registries[].meshbridgeWatch",
            "spec.registries[].meshbridgeMigration",
            "spec.registries[].registryTls",
        ]
    );
    // What `meshbridge check` warns of.
    assert_eq!(pruned, super::HIGRESS_CRD_PRUNES);
}

#[test]
fn pruning_follows_preserve_unknown_fields_and_missing_lists() {
    let spec = |schema: serde_json::Value| json!({"versions": [{"name": "v1", "schema": {"openAPIV3Schema": schema}}]});
    let keeps_all = spec(json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}));
    assert_eq!(super::pruned_fields(&keeps_all), Some(vec![]));
    let no_spec = spec(json!({"type": "object", "properties": {"status": {"type": "object"}}}));
    assert_eq!(super::pruned_fields(&no_spec), Some(vec!["spec".to_owned()]));
    let free_entries = spec(json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {
        "registries": {"type": "array", "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}}));
    assert_eq!(super::pruned_fields(&free_entries), Some(vec!["spec.proxies".to_owned()]));
    let tls_without_server_name = crd_spec(&OUR_CRD.replacen(
        "                          serverName:\n",
        "                          serverNameX:\n",
        1,
    ));
    assert_eq!(
        super::pruned_fields(&tls_without_server_name),
        Some(vec!["spec.registries[].registryTls.serverName".to_owned()])
    );
    assert_eq!(super::pruned_fields(&json!({"versions": [{"name": "v2"}]})), None);
}

#[test]
fn fields_condition_names_what_is_pruned() {
    use super::CrdFields;
    let status = json!({"observedGeneration": 3, "conditions": []});
    let pruned = CrdFields::Pruned(vec!["spec.registries[].registryTls".into()]);
    let s = super::with_fields_condition(status.clone(), &pruned, None, SystemTime::UNIX_EPOCH);
    let c = &s["conditions"][0];
    assert_eq!(
        (c["type"].as_str(), c["status"].as_str(), c["reason"].as_str()),
        (Some("FieldsPreserved"), Some("False"), Some("PrunedByCRD"))
    );
    assert!(c["message"].as_str().unwrap().contains("spec.registries[].registryTls"), "{c}");
    assert_eq!(c["observedGeneration"], 3);
    let s = super::with_fields_condition(status, &CrdFields::Complete, None, SystemTime::UNIX_EPOCH);
    assert_eq!(s["conditions"][0]["status"], "True");
}

/// A `proxy-ssl-secret` or `auth-tls-secret` is a referenced Secret (read
/// by name), in the Ingress's namespace unless it names one; a malformed
/// one is none.
#[test]
fn proxy_ssl_and_auth_tls_secrets_are_referenced() {
    let with = |value: &str, key: &str| {
        let mut i = ingress(None, Some("higress"));
        i.metadata.annotations.get_or_insert_default().insert(key.into(), value.into());
        Arc::new(i)
    };
    let a = super::watch::Assembler::new("higress".into());
    let ingresses = [
        with("client", "nginx.ingress.kubernetes.io/proxy-ssl-secret"),
        with("higress-system/gw-client", "higress.io/proxy-ssl-secret"),
        with("a/b/c", "higress.io/proxy-ssl-secret"),
        with("clients-ca", "higress.io/auth-tls-secret"),
        with("pki/root", "nginx.ingress.kubernetes.io/auth-tls-secret"),
    ];
    let refs = a.referenced(&[], &ingresses, &[]);
    let want: BTreeSet<(String, String)> =
        [("n", "client"), ("higress-system", "gw-client"), ("n", "clients-ca"), ("pki", "root")]
            .iter()
            .map(|(n, s)| (n.to_string(), s.to_string()))
            .collect();
    assert_eq!(refs, want);
}
