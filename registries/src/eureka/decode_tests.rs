use serde_json::{Value, json};

use super::*;
use crate::spec::RegistryKind;

fn spec() -> RegistrySpec {
    RegistrySpec::new(RegistryKind::Eureka, "eu", "127.0.0.1", 8761)
}

fn inst(app: &str, id: &str, ip: &str, port: u16, status: &str) -> Value {
    json!({
        "instanceId": id, "hostName": format!("{id}.local"), "app": app, "ipAddr": ip,
        "status": status, "overriddenstatus": "UNKNOWN",
        "port": {"$": port, "@enabled": "true"}, "securePort": {"$": 443, "@enabled": "false"},
        "countryId": 1,
        "dataCenterInfo": {"@class": "com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo", "name": "MyOwn"},
        "metadata": {"@class": "java.util.Collections$EmptyMap"},
    })
}

fn body(apps: Value, hashcode: &str) -> Vec<u8> {
    json!({"applications": {"versions__delta": "1", "apps__hashcode": hashcode, "application": apps}})
        .to_string()
        .into_bytes()
}

fn with(mut v: Value, extra: Value) -> Value {
    if let (Some(m), Value::Object(extra)) = (v.as_object_mut(), extra) {
        m.extend(extra);
    }
    v
}

#[test]
fn full_answer_decodes() {
    let b = body(
        json!([
            {"name": "ORDERS", "instance": [inst("ORDERS", "o1", "10.0.0.1", 8080, "UP"), inst("ORDERS", "o2", "10.0.0.2", 8081, "DOWN")]},
            // The legacy single-object forms, and an app named only by its element.
            {"name": "Pay_Api", "instance": with(inst("", "p1", "10.0.1.1", 9000, "up"), json!({"app": null}))},
        ]),
        "DOWN_1_UP_2_",
    );
    let apps = decode_apps(&b).unwrap();
    assert_eq!(apps.hashcode.as_deref(), Some("DOWN_1_UP_2_"));
    let ids: Vec<(&str, &str, &str)> = apps.instances().map(|i| (i.app.as_str(), i.id.as_str(), i.status)).collect();
    assert_eq!(ids, vec![("ORDERS", "o1", "UP"), ("ORDERS", "o2", "DOWN"), ("PAY_API", "p1", "UP")]);
    let o1 = apps.instances().next().unwrap();
    assert_eq!(o1.port, Some(PortInfo { number: 8080, enabled: true }));
    assert_eq!(o1.secure_port, Some(PortInfo { number: 443, enabled: false }));
    assert!(o1.metadata.is_empty(), "@class is the codec's empty-map marker");
    assert_eq!(Registry::from_full(apps.groups).reconcile_hash_code(), "DOWN_1_UP_2_");

    let single = json!({"applications": {"apps__hashcode": "UP_1_",
        "application": {"name": "A", "instance": inst("A", "a1", "10.0.0.9", 80, "UP")}}});
    assert_eq!(decode_apps(single.to_string().as_bytes()).unwrap().len(), 1);
    let empty = json!({"applications": {"versions__delta": "1", "apps__hashcode": "", "application": []}});
    assert!(decode_apps(empty.to_string().as_bytes()).unwrap().len() == 0);
}

#[test]
fn field_quirks() {
    let raw = json!({
        "hostName": "h1", "app": "x", "ipAddr": "10.0.0.1", "status": "bogus",
        "overriddenStatus": "out_of_service", "overriddenstatus": "UNKNOWN",
        "port": {"$": "8080", "@enabled": true}, "securePort": {"$": 8443},
        "metadata": {"version": "v1", "weight": 3, "on": true, "nested": {"a": 1}, "bad key": "x"},
        "actionType": "MODIFIED",
    });
    let i = instance_of(raw.as_object().unwrap(), "X").unwrap();
    assert_eq!(i.id, "h1", "hostName when there is no instanceId");
    assert_eq!((i.app.as_str(), i.status), ("X", "UNKNOWN"));
    assert!(!i.serves(), "an unknown status is not UP, whatever the override says");
    assert_eq!(i.port, Some(PortInfo { number: 8080, enabled: true }));
    assert_eq!(i.secure_port, Some(PortInfo { number: 8443, enabled: false }), "secure port off by default");
    assert_eq!(i.action, Some(Action::Modified));
    let meta: Vec<(&str, &str)> = i.metadata.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert_eq!(meta, vec![("bad key", "x"), ("on", "true"), ("version", "v1"), ("weight", "3")]);

    let bare = json!({"instanceId": "i", "app": "x", "port": 81});
    let i = instance_of(bare.as_object().unwrap(), "X").unwrap();
    assert_eq!(i.status, "UP", "InstanceInfo defaults");
    assert_eq!(i.port, Some(PortInfo { number: 81, enabled: true }));
    assert!(instance_of(json!({"app": "x"}).as_object().unwrap(), "X").is_none(), "no id");
}

#[test]
fn garbage_is_an_error_not_a_panic() {
    for b in ["", "{", "null", "[]", "{}", r#"{"applications": 1}"#, r#"{"applications": {"application": [1]}}"#] {
        assert!(decode_apps(b.as_bytes()).is_err(), "{b:?}");
    }
}

fn instances(values: Vec<Value>) -> Vec<Instance> {
    values.iter().map(|v| instance_of(v.as_object().unwrap(), "").unwrap()).collect()
}

fn action(v: Value, action: &str) -> Value {
    with(v, json!({"actionType": action}))
}

#[test]
fn delta_adds_modifies_and_deletes() {
    let mut reg = Registry::from_full(vec![instances(vec![
        inst("A", "a1", "10.0.0.1", 80, "UP"),
        inst("A", "a2", "10.0.0.2", 80, "UP"),
        inst("B", "b1", "10.0.1.1", 80, "UP"),
    ])]);
    assert_eq!(reg.reconcile_hash_code(), "UP_3_");
    reg.apply_delta(&instances(vec![
        action(inst("C", "c1", "10.0.2.1", 80, "STARTING"), "ADDED"),
        action(inst("A", "a1", "10.0.0.1", 80, "DOWN"), "MODIFIED"),
        action(inst("B", "b1", "10.0.1.1", 80, "UP"), "DELETED"),
        // No action type: ignored, as `updateDelta` does.
        inst("D", "d1", "10.0.3.1", 80, "UP"),
        // Deleting what we do not have is harmless.
        action(inst("E", "e1", "10.0.4.1", 80, "UP"), "DELETED"),
    ]));
    let apps: Vec<&str> = reg.apps.keys().map(String::as_str).collect();
    assert_eq!(apps, vec!["A", "C"], "B lost its last instance");
    assert_eq!(reg.apps["A"]["a1"].status, "DOWN");
    assert_eq!(reg.reconcile_hash_code(), "DOWN_1_STARTING_1_UP_1_");
    assert_eq!(Registry::default().reconcile_hash_code(), "");
}

/// The hashcode by a walk of every instance, as Eureka computes it.
fn walked_hash_code(reg: &Registry) -> String {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for i in reg.apps.values().flat_map(|a| a.values()) {
        *counts.entry(i.status).or_default() += 1;
    }
    counts.iter().map(|(status, n)| format!("{status}_{n}_")).collect()
}

/// A delta names the apps it changed; entries that repeat what is held
/// (the server's queue keeps three minutes of changes, so the same entries
/// come again round after round) change nothing and name nothing.
#[test]
fn a_delta_names_the_apps_it_changed_and_repeats_change_nothing() {
    let mut reg = Registry::from_full(vec![instances(vec![
        inst("A", "a1", "10.0.0.1", 80, "UP"),
        inst("B", "b1", "10.0.1.1", 80, "UP"),
        inst("C", "c1", "10.0.2.1", 80, "UP"),
    ])]);
    let delta = instances(vec![
        action(inst("A", "a1", "10.0.0.1", 80, "UP"), "ADDED"),
        action(inst("B", "b1", "10.0.1.1", 80, "DOWN"), "MODIFIED"),
        action(inst("C", "c1", "10.0.2.1", 80, "UP"), "DELETED"),
        action(inst("D", "d1", "10.0.3.1", 80, "UP"), "ADDED"),
    ]);
    let changed = reg.apply_delta(&delta);
    assert_eq!(changed, BTreeSet::from(["B".into(), "C".into(), "D".into()]), "A's entry repeats what is held");
    assert_eq!(reg.reconcile_hash_code(), walked_hash_code(&reg));
    let before = reg.clone();
    assert!(reg.apply_delta(&delta).is_empty(), "the same delta again");
    assert_eq!(reg, before);

    // Kept counts agree with a walk through any mix of operations.
    let mut seed = 7u64;
    for round in 0..200 {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let app = ["A", "B", "C"][(seed >> 33) as usize % 3];
        let id = format!("{}{}", app.to_lowercase(), (seed >> 40) % 4);
        let status = ["UP", "DOWN", "STARTING"][(seed >> 50) as usize % 3];
        let kind = ["ADDED", "MODIFIED", "DELETED"][(seed >> 20) as usize % 3];
        reg.apply_delta(&instances(vec![action(inst(app, &id, "10.0.0.9", 80, status), kind)]));
        assert_eq!(reg.reconcile_hash_code(), walked_hash_code(&reg), "round {round}");
    }
}

#[test]
fn unknown_and_nested_fields_are_skipped_unread() {
    let b = body(
        json!([{"name": "A", "instance": [with(inst("A", "a1", "10.0.0.1", 80, "UP"), json!({
            "leaseInfo": {"renewalIntervalInSecs": 30, "durationInSecs": 90},
            "dataCenterInfo": {"@class": "com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo", "name": "MyOwn"},
            "lastUpdatedTimestamp": 1700000000000u64, "isCoordinatingDiscoveryServer": false,
            "port": [8080], "securePort": null, "metadata": ["not", "a", "map"],
        }))]}]),
        "UP_1_",
    );
    let apps = decode_apps(&b).unwrap();
    assert_eq!(apps.len(), 1);
    let i = apps.instances().next().unwrap();
    assert_eq!((i.id.as_str(), i.ip_addr.as_deref()), ("a1", Some("10.0.0.1")));
    assert_eq!((i.port, i.secure_port), (None, None), "a port that is an array or null is no port");
    assert!(i.metadata.is_empty());
    assert_eq!(decode_apps(&b).unwrap().digest, apps.digest, "the same bytes, the same digest");
}

#[test]
fn hashcode_counts_status_not_overrides_in_treemap_order() {
    let reg = Registry::from_full(vec![instances(vec![
        inst("A", "a1", "10.0.0.1", 80, "UP"),
        with(inst("A", "a2", "10.0.0.2", 80, "UP"), json!({"overriddenstatus": "OUT_OF_SERVICE"})),
        inst("B", "b1", "10.0.0.3", 80, "OUT_OF_SERVICE"),
        inst("B", "b2", "10.0.0.4", 80, "DOWN"),
        inst("B", "b3", "10.0.0.5", 80, "UNKNOWN"),
    ])]);
    assert_eq!(reg.reconcile_hash_code(), "DOWN_1_OUT_OF_SERVICE_1_UNKNOWN_1_UP_2_");
}

fn naming(spec: &RegistrySpec, reg: &Registry) -> BTreeMap<String, Service> {
    Naming::new(spec).services(reg, &BTreeMap::new(), &Selection::all())
}

fn eps(s: &Service) -> Vec<String> {
    s.endpoints.iter().map(|e| format!("{}:{}", e.address, e.port)).collect()
}

#[test]
fn only_up_instances_count_and_the_status_decides_not_the_override() {
    let reg = Registry::from_full(vec![instances(vec![
        with(inst("ORDERS", "o1", "10.0.0.1", 8081, "UP"), json!({"metadata": {"version": "v1", "zone": "a b"}})),
        inst("ORDERS", "o2", "10.0.0.2", 8080, "DOWN"),
        inst("ORDERS", "o3", "10.0.0.3", 8080, "OUT_OF_SERVICE"),
        // As a real server answers: the override is already in `status`
        // (OUT_OF_SERVICE), or lost to the instance's own DOWN.
        with(inst("ORDERS", "o4", "10.0.0.4", 8080, "OUT_OF_SERVICE"), json!({"overriddenStatus": "OUT_OF_SERVICE"})),
        with(inst("ORDERS", "o5", "10.0.0.5", 8082, "DOWN"), json!({"overriddenStatus": "UP"})),
        with(inst("ORDERS", "o7", "10.0.0.7", 8083, "UP"), json!({"overriddenStatus": "UP"})),
        inst("ORDERS", "o6", "not-an-ip", 8080, "UP"),
        inst("Pay_Api", "p1", "::ffff:10.0.0.9", 9000, "DOWN"),
    ])]);
    let services = naming(&spec(), &reg);
    let hosts: Vec<&str> = services.keys().map(String::as_str).collect();
    assert_eq!(hosts, vec!["orders.eureka", "pay-api.eureka"]);
    let orders = &services["orders.eureka"];
    assert_eq!(eps(orders), vec!["10.0.0.1:8081", "10.0.0.7:8083"]);
    assert_eq!(orders.ports, vec![ServicePort { number: 8081, protocol: Protocol::Http, name: "http-8081".into() }]);
    let labels: Vec<&str> = orders.endpoints[0].labels.keys().map(String::as_str).collect();
    assert_eq!(labels, vec!["version"]);
    assert_eq!(orders.tls, None);
    // An app with no UP instance is there, empty: Eureka said so.
    let pay = &services["pay-api.eureka"];
    assert!(pay.endpoints.is_empty() && pay.ports.is_empty());
    let last = BTreeMap::from([("pay-api.eureka".to_string(), orders.clone())]);
    let again = Naming::new(&spec()).services(&reg, &last, &Selection::all());
    assert_eq!(again["pay-api.eureka"].ports[0].number, 8081, "an empty app keeps its last port");
}

fn secure(v: Value, port: u16) -> Value {
    with(v, json!({"securePort": {"$": port, "@enabled": "true"}}))
}

#[test]
fn secure_ports_vports_and_protocols() {
    let reg = Registry::from_full(vec![instances(vec![
        secure(inst("S", "s1", "10.0.0.1", 8080, "UP"), 8443),
        secure(inst("S", "s2", "10.0.0.2", 8080, "UP"), 8444),
        inst("S", "s3", "10.0.0.3", 8080, "DOWN"),
        // Mixed: plain ports; s5 has only a secure port and is left out.
        secure(inst("M", "m1", "10.0.1.1", 8080, "UP"), 8443),
        with(inst("M", "m2", "10.0.1.2", 8081, "UP"), json!({"port": {"$": 8081, "@enabled": "false"}})),
        inst("M", "m3", "10.0.1.3", 8082, "UP"),
    ])]);
    let mut spec = spec();
    spec.sni = Some("s.example.com".into());
    let services = naming(&spec, &reg);
    let s = &services["s.eureka"];
    assert_eq!(eps(s), vec!["10.0.0.1:8443", "10.0.0.2:8444"]);
    assert_eq!(s.ports[0].name, "https-8443");
    assert_eq!(s.tls, Some(Tls { sni: Some("s.example.com".into()) }));
    let m = &services["m.eureka"];
    assert_eq!(eps(m), vec!["10.0.1.1:8080", "10.0.1.3:8082"]);
    assert_eq!((m.ports[0].name.as_str(), m.tls.as_ref()), ("http-8080", None));

    spec.protocol = Some("grpcs".into());
    spec.vport_services.insert("s.eureka".into(), 443);
    spec.vport_default = Some(80);
    let services = naming(&spec, &reg);
    assert_eq!(services["s.eureka"].ports[0].name, "grpc-443", "vport names match hosts ignoring case");
    assert_eq!(services["m.eureka"].ports[0].name, "grpc-80");
    assert!(services["m.eureka"].tls.is_some(), "grpcs asks for TLS whatever the ports say");
}

#[test]
fn only_selected_apps_become_services() {
    let reg = Registry::from_full(vec![instances(vec![
        inst("ORDERS", "o1", "10.0.0.1", 8081, "UP"),
        inst("PAY", "p1", "10.0.0.2", 8080, "UP"),
        inst("CART", "c1", "10.0.0.3", 8080, "UP"),
    ])]);
    let (_tx, rx) = tokio::sync::watch::channel(std::sync::Arc::new(["orders.eureka".to_string()].into()));
    let spec_all = crate::WatchSpec { mode: crate::WatchMode::Referenced, include: vec!["c.*".into()] };
    let selection = crate::Selector::new("e", Some(&spec_all), rx).unwrap().current();
    let services = Naming::new(&spec()).services(&reg, &BTreeMap::new(), &selection);
    let hosts: Vec<&str> = services.keys().map(String::as_str).collect();
    assert_eq!(hosts, ["cart.eureka", "orders.eureka"]);
    assert_eq!(reg.reconcile_hash_code(), "UP_3_", "the copy keeps every app for the delta hashcode");
}

/// A full answer's groups become the copy that putting its instances one
/// at a time, in the answer's order, would give: an id listed twice keeps
/// its last listing, an app split over two `application` elements or named
/// differently by its instances is merged, and each app's instances are
/// held sorted by id whatever order they came in.
#[test]
fn a_full_answer_becomes_the_copy_that_one_put_at_a_time_gives() {
    let b = body(
        json!([
            {"name": "A", "instance": [
                inst("A", "a3", "10.0.0.3", 80, "UP"),
                inst("A", "a1", "10.0.0.1", 80, "UP"),
                inst("A", "a3", "10.0.0.4", 81, "DOWN"),
                inst("A", "a2", "10.0.0.2", 80, "STARTING"),
            ]},
            {"name": "B", "instance": [inst("B", "b1", "10.0.1.1", 80, "UP"), inst("A", "a0", "10.0.0.9", 80, "UP")]},
            {"name": "A", "instance": [inst("A", "a1", "10.0.0.5", 82, "OUT_OF_SERVICE")]},
            {"name": "C", "instance": []},
        ]),
        "",
    );
    let apps = decode_apps(&b).unwrap();
    let mut one_by_one = Registry::default();
    for i in apps.instances() {
        one_by_one.put(Instance { action: None, ..i.clone() });
    }
    let reg = Registry::from_full(apps.groups);
    assert_eq!(reg, one_by_one);
    let ids: Vec<(&str, &str, u16)> = reg
        .apps
        .iter()
        .flat_map(|(app, a)| a.values().map(move |i| (app.as_str(), i.id.as_str(), i.port.unwrap().number)))
        .collect();
    assert_eq!(ids, vec![("A", "a0", 80), ("A", "a1", 82), ("A", "a2", 80), ("A", "a3", 81), ("B", "b1", 80)]);
    assert_eq!(reg.reconcile_hash_code(), "DOWN_1_OUT_OF_SERVICE_1_STARTING_1_UP_2_");
    assert_eq!(reg.reconcile_hash_code(), walked_hash_code(&reg));
}
