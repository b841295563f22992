//! Tests of the config module as a whole: YAML in, `Desired` out.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use meshbridge_registries::{RegistryKind, RegistrySpec, Secret};
use tokio::sync::watch;

use super::build::{Builder, Built};
use super::*;

const FULL: &str = include_str!("testdata/higress-full.yaml");
const BRIDGE: &str = "McpBridge higress-system/default";

/// Values in `FULL` that must never be printed.
const SECRET_VALUES: [&str; 4] = ["s3cr3t-consul-token", "n4c0s-p4ss", "ak-plaintext-value", "sk-plaintext-value"];

fn build_text(text: &str) -> Built {
    let docs = parse_documents("test.yaml", text).expect("parses");
    Builder::default().build_full(&docs)
}

/// An McpBridge `higress-system/default` with the given `registries:` items
/// (YAML, indented by 4) and optional `proxies:` items.
fn bridge(registries: &str, proxies: &str) -> String {
    let mut s = String::from(
        "apiVersion: networking.higress.io/v1\nkind: McpBridge\n\
         metadata: {name: default, namespace: higress-system}\nspec:\n  registries:\n",
    );
    s.push_str(registries);
    if !proxies.is_empty() {
        s.push_str("  proxies:\n");
        s.push_str(proxies);
    }
    s
}

fn consul(name: &str) -> RegistrySpec {
    RegistrySpec::new(RegistryKind::Consul, name, "127.0.0.1", 8500)
}

fn names(d: &Desired) -> Vec<String> {
    d.registries.iter().map(|r| format!("{}/{}", r.kind, r.name)).collect()
}

#[test]
fn full_higress_yaml() {
    let built = build_text(FULL);
    let d = &built.desired;
    assert_eq!(d.errors, Vec::<String>::new());

    let mut nacos = RegistrySpec::new(RegistryKind::Nacos2, "my-nacos", "192.168.0.10", 8848);
    nacos.nacos_namespace_id = Some("d8ac64f3-xxxx-xxxx-xxxx-47a814ecf358".into());
    nacos.nacos_groups = vec!["DEFAULT_GROUP".into(), "shop".into()];
    nacos.nacos_refresh_interval = Some(Duration::from_secs(15));
    nacos.nacos_access_key = Some(Secret::new("ak-plaintext-value"));
    nacos.nacos_secret_key = Some(Secret::new("sk-plaintext-value"));
    nacos.vport_default = Some(8080);
    // vport names are service hosts, matched ignoring case (Higress).
    let host = "checkout.default-group.d8ac64f3-xxxx-xxxx-xxxx-47a814ecf358.nacos";
    nacos.vport_services = BTreeMap::from([(host.to_owned(), 9090)]);
    nacos.auth = BTreeMap::from([
        ("nacosPassword".to_owned(), Secret::new("n4c0s-p4ss")),
        ("nacosUsername".to_owned(), Secret::new("nacos")),
    ]);

    let mut consul = consul("consul-local");
    consul.consul_datacenter = Some("dc1".into());
    consul.consul_service_tag = Some("web".into());
    consul.consul_refresh_interval = Some(Duration::from_secs(30));
    consul.proxy_name = Some("egress".into());
    consul.auth = BTreeMap::from([("consulToken".to_owned(), Secret::new("s3cr3t-consul-token"))]);

    let mut zk = RegistrySpec::new(RegistryKind::Zookeeper, "zk", "zk.example.com", 2181);
    zk.zk_services_path = vec!["/dubbo".into(), "/services".into()];

    assert_eq!(d.registries, vec![nacos, consul, zk]);
    assert_eq!(
        d.proxies,
        vec![ProxySpec {
            name: "egress".into(),
            server_address: "10.0.0.1".into(),
            server_port: 3128,
            listener_port: Some(50001),
            connect_timeout: Some(Duration::from_millis(500)),
        }]
    );
    assert_eq!(d.ingresses.len(), 1);
    assert_eq!((d.ingresses[0].namespace.as_str(), d.ingresses[0].name.as_str()), ("default", "shop"));
    let ingress = d.ingresses[0].ingress.as_ref().expect("a readable Ingress");
    assert_eq!(ingress.spec.ingress_class_name.as_deref(), Some("higress"));

    assert_eq!(
        built.warnings,
        vec![
            format!("{BRIDGE}: spec.registries[0].enableMCPServer: MCP server fields are not supported, ignored"),
            format!("{BRIDGE}: spec.registries[0].mcpServerBaseUrl: MCP server fields are not supported, ignored"),
            // Higress YAML keeps its meaning (plain HTTP), and says what that costs.
            format!(
                "{BRIDGE}: spec.registries[0]: registry \"my-nacos\" sends nacosPassword and nacosSecretKey over \
                 plain HTTP to a non-loopback address; set registryTls.enabled: true for https"
            ),
        ]
    );
}

#[test]
fn bad_registries_have_exact_messages() {
    let cases: &[(&str, &str)] = &[
        (
            "    - {type: etcd, name: e, domain: h, port: 1}\n",
            "spec.registries[0].type: unknown registry type \"etcd\" (expected one of nacos, nacos2, nacos3, consul, zookeeper, eureka, static, dns)",
        ),
        ("    - {name: e, domain: h, port: 1}\n", "spec.registries[0].type: required"),
        ("    - {type: consul, name: c, domain: h, port: 0}\n", "spec.registries[0].port: must be 1..65535"),
        ("    - {type: consul, name: c, domain: h, port: 65536}\n", "spec.registries[0].port: must be 1..65535"),
        ("    - {type: consul, name: c, domain: h}\n", "spec.registries[0].port: must be 1..65535"),
        (
            "    - {type: consul, name: c, domain: h, port: \"abc\"}\n",
            "spec.registries[0].port: invalid type: string \"abc\", expected u32",
        ),
        ("    - {type: consul, domain: h, port: 1}\n", "spec.registries[0].name: required"),
        (
            "    - {type: consul, name: My_Consul, domain: h, port: 1}\n",
            "spec.registries[0].name: \"My_Consul\" is not a DNS label (lowercase letters, digits and '-', starting and ending with a letter or digit, at most 63 characters)",
        ),
        ("    - {type: consul, name: c, port: 8500}\n", "spec.registries[0].domain: required"),
        ("    - {type: nacos2, name: nc, port: 8848}\n", "spec.registries[0].domain: required (or nacosAddressServer)"),
        (
            "    - {type: nacos, name: nc, domain: h, port: 1, nacosRefreshInterval: \"5s\"}\n",
            "spec.registries[0].nacosRefreshInterval: invalid value: string \"5s\", expected an integer (a number or a numeric string)",
        ),
        (
            "    - {type: consul, name: c, domain: h, port: 1, authSecretName: nope}\n",
            "spec.registries[0].authSecretName: secret \"nope\" not found",
        ),
        (
            "    - {type: consul, name: c, domain: h, port: 1, vport: {services: [{name: a, value: 0}]}}\n",
            "spec.registries[0].vport.services[0].value: must be 1..65535",
        ),
        (
            "    - {type: consul, name: c, domain: h, port: 1, vport: {services: [{name: a, value: x}]}}\n",
            "spec.registries[0].vport.services[0].value: invalid type: string \"x\", expected u32",
        ),
        (
            "    - {type: consul, name: c, domain: h, port: 1, vport: {default: 70000}}\n",
            "spec.registries[0].vport.default: must be 1..65535",
        ),
        (
            "    - {type: static, name: s, domain: \"10.0.0.1:80,backend:81\"}\n",
            "spec.registries[0].domain: \"backend:81\" is not an IP:port endpoint",
        ),
        ("    - {type: dns, name: d, domain: api.example.com}\n", "spec.registries[0].port: must be 1..65535"),
        (
            "    - {type: dns, name: d, domain: \"api.example.com,bad host\", port: 443}\n",
            "spec.registries[0].domain: \"bad host\" is not a DNS name",
        ),
        ("    - just-a-string\n", "spec.registries[0]: must be a mapping"),
    ];
    for (registry, want) in cases {
        let d = build_text(&bridge(registry, "")).desired;
        assert_eq!(d.errors, vec![format!("{BRIDGE}: {want}")], "for {registry}");
        assert_eq!(d.registries, vec![], "for {registry}");
    }
}

#[test]
fn duplicate_registries_reject_the_later_one() {
    let text = bridge(
        "    - {type: consul, name: c, domain: 127.0.0.1, port: 8500}\n\
         \x20   - {type: consul, name: c, domain: 10.0.0.1, port: 8500}\n\
         \x20   - {type: nacos, name: c, domain: 127.0.0.1, port: 8848}\n",
        "",
    );
    let other = "\n---\napiVersion: networking.higress.io/v1\nkind: McpBridge\n\
                 metadata: {name: other, namespace: team}\nspec:\n  registries:\n\
                 \x20   - {type: nacos, name: c, domain: 127.0.0.1, port: 8848}\n";
    let d = build_text(&(text + other)).desired;
    assert_eq!(
        d.errors,
        vec![
            format!(
                "{BRIDGE}: spec.registries[1].name: duplicate registry consul/c (already defined by {BRIDGE} spec.registries[0])"
            ),
            format!(
                "McpBridge team/other: spec.registries[0].name: duplicate registry nacos/c (already defined by {BRIDGE} spec.registries[2])"
            ),
            format!(
                "{BRIDGE}: spec.registries[2].name: registry nacos/c is also defined by McpBridge team/other spec.registries[0], which is ignored"
            ),
        ]
    );
    assert_eq!(names(&d), ["nacos/c", "consul/c"]);
    assert_eq!(d.registries[1].domain, "127.0.0.1");
}

#[test]
fn one_bad_registry_leaves_the_others() {
    let text = bridge(
        "    - {type: consul, name: a, domain: 127.0.0.1, port: 8500}\n\
         \x20   - {type: consul, name: b, domain: 127.0.0.1, port: \"abc\"}\n\
         \x20   - {type: bogus, name: c, domain: 127.0.0.1, port: 1}\n\
         \x20   - {type: eureka, name: d, domain: eureka.local, port: 8761}\n",
        "",
    );
    let d = build_text(&text).desired;
    assert_eq!(names(&d), ["consul/a", "eureka/d"]);
    assert_eq!(d.errors.len(), 2, "{:?}", d.errors);
}

#[test]
fn intervals_are_nanoseconds_and_clamped_to_higress_floor() {
    // As Higress's console writes them: seconds in a nanosecond field.
    let text = bridge(
        "    - {type: consul, name: a, domain: h, port: 1, consulRefreshInterval: 15}\n\
         \x20   - {type: nacos, name: b, domain: h, port: 1, nacosRefreshInterval: \"2500000000\"}\n\
         \x20   - {type: consul, name: c, domain: h, port: 1, consulRefreshInterval: 0}\n\
         \x20   - {type: consul, name: d, domain: h, port: 1, consulRefreshInterval: -1}\n\
         \x20   - {type: nacos2, name: e, domain: h, port: 1, nacosRefreshInterval: 30000000000}\n",
        "",
    );
    let built = build_text(&text);
    let d = &built.desired;
    assert_eq!(d.errors, Vec::<String>::new());
    let ten = Some(Duration::from_secs(10));
    let by_name = |d: &Desired, name: &str| d.registries.iter().find(|r| r.name == name).cloned().unwrap();
    let interval = |r: RegistrySpec| r.consul_refresh_interval.or(r.nacos_refresh_interval);
    assert_eq!(interval(by_name(d, "a")), ten, "15ns: clamped like Higress");
    assert_eq!(interval(by_name(d, "b")), ten, "2.5s is below Higress's 10s floor");
    assert_eq!(interval(by_name(d, "c")), None, "0 is unset: the watcher's default");
    assert_eq!(interval(by_name(d, "d")), ten, "negative: clamped like Higress");
    assert_eq!(interval(by_name(d, "e")), Some(Duration::from_secs(30)));
    let below = |i: usize, field: &str, n: &str| {
        format!(
            "{BRIDGE}: spec.registries[{i}].{field}: {n}ns is below the minimum of 10s, using 10s (the value is in nanoseconds)"
        )
    };
    assert_eq!(
        built.warnings,
        vec![
            below(0, "consulRefreshInterval", "15"),
            below(1, "nacosRefreshInterval", "2500000000"),
            below(3, "consulRefreshInterval", "-1"),
        ]
    );

    // meshbridge's --min-refresh-interval lowers the floor (for tests).
    let docs = parse_documents("test.yaml", &text).unwrap();
    let fast = Builder::with_min_refresh_interval(Duration::from_millis(500)).build_full(&docs);
    assert_eq!(interval(by_name(&fast.desired, "b")), Some(Duration::from_millis(2500)));
    assert_eq!(interval(by_name(&fast.desired, "a")), Some(Duration::from_millis(500)));
}

#[test]
fn unknown_fields_warn_and_are_ignored() {
    let text = bridge(
        "    - {type: consul, name: a, domain: h, port: 1, consulTokn: x, allowMcpServers: [a], nacosTimeout: 3000, ecdhCurves: [P-384]}\n",
        "",
    )
    .replace("spec:\n", "spec:\n  futureField: 1\n");
    let built = build_text(&text);
    assert_eq!(built.desired.errors, Vec::<String>::new());
    assert_eq!(names(&built.desired), ["consul/a"]);
    assert_eq!(
        built.warnings,
        vec![
            format!("{BRIDGE}: spec.registries[0].allowMcpServers: MCP server fields are not supported, ignored"),
            format!("{BRIDGE}: spec.registries[0].consulTokn: unknown field, ignored"),
        ]
    );
}

#[test]
fn static_and_dns_registries() {
    let text = bridge(
        "    - {type: static, name: s, domain: \"10.0.0.1:8080, 10.0.0.2:8081\"}\n\
         \x20   - {type: static, name: t, domain: \"10.0.0.3:80\", port: 8080, protocol: https, sni: t.example.com}\n\
         \x20   - {type: dns, name: d, domain: \"a.example.com,b.example.com\", port: 443}\n\
         \x20   - {type: nacos2, name: nc, nacosAddressServer: \"http://addr.example.com:8080\"}\n",
        "",
    );
    let d = build_text(&text).desired;
    assert_eq!(d.errors, Vec::<String>::new());
    let by_name = |n: &str| d.registries.iter().find(|r| r.name == n).unwrap();
    assert_eq!(by_name("s").port, 80, "static without port uses Higress's 80");
    assert_eq!(by_name("s").domain, "10.0.0.1:8080, 10.0.0.2:8081");
    assert_eq!(by_name("t").port, 8080);
    assert_eq!(by_name("t").protocol.as_deref(), Some("https"));
    assert_eq!(by_name("t").sni.as_deref(), Some("t.example.com"));
    assert_eq!(by_name("d").port, 443);
    assert_eq!(by_name("nc").nacos_address_server.as_deref(), Some("http://addr.example.com:8080"));
}

#[test]
fn proxies_are_validated() {
    let proxies = "    - {type: http, name: ok, serverAddress: proxy.local, serverPort: 3128}\n\
                   \x20   - {type: socks5, name: s, serverAddress: x, serverPort: 1080}\n\
                   \x20   - {type: http, name: p, serverAddress: x, serverPort: 0, listenerPort: 70000}\n\
                   \x20   - {type: http, name: ok, serverAddress: other.local, serverPort: 3128}\n\
                   \x20   - {type: http, name: url, serverAddress: \"http://proxy.local\", serverPort: 3128}\n\
                   \x20   - {type: http, name: ip, serverAddress: 10.0.0.300, serverPort: 3128}\n\
                   \x20   - {type: http, name: v6, serverAddress: \"fd00::1\", serverPort: 3128}\n";
    let text = bridge(
        "    - {type: consul, name: a, domain: h, port: 1, proxyName: ok}\n\
         \x20   - {type: consul, name: b, domain: h, port: 1, proxyName: p}\n\
         \x20   - {type: consul, name: c, domain: h, port: 1, proxyName: nope}\n",
        proxies,
    );
    let d = build_text(&text).desired;
    assert_eq!(
        d.errors,
        vec![
            format!("{BRIDGE}: spec.proxies[1].type: unknown proxy type \"socks5\" (expected http)"),
            format!("{BRIDGE}: spec.proxies[2].serverPort: must be 1..65535"),
            format!("{BRIDGE}: spec.proxies[2].listenerPort: must be 1..65535"),
            format!(
                "{BRIDGE}: spec.proxies[3].name: duplicate proxy \"ok\" (already defined by {BRIDGE} spec.proxies[0])"
            ),
            format!(
                "{BRIDGE}: spec.proxies[4].serverAddress: \"http://proxy.local\" is not an IP address or DNS name \
                 (the port goes in serverPort)"
            ),
            format!(
                "{BRIDGE}: spec.proxies[5].serverAddress: \"10.0.0.300\" is not an IP address or DNS name \
                 (the port goes in serverPort)"
            ),
            format!(
                "{BRIDGE}: spec.registries[1].proxyName: proxy \"p\" is not usable (see its spec.proxies error); \
                 routing its services directly"
            ),
            format!(
                "{BRIDGE}: spec.registries[2].proxyName: proxy \"nope\" not found in spec.proxies; \
                 routing its services directly"
            ),
        ]
    );
    let proxies: Vec<(&str, &str)> = d.proxies.iter().map(|p| (p.name.as_str(), p.server_address.as_str())).collect();
    assert_eq!(proxies, [("ok", "proxy.local"), ("v6", "fd00::1")]);
    assert_eq!(
        d.proxies[0],
        ProxySpec {
            name: "ok".into(),
            server_address: "proxy.local".into(),
            server_port: 3128,
            listener_port: None,
            connect_timeout: None,
        }
    );
    // A bad proxy never takes its registries down: they stay, routed directly.
    assert_eq!(names(&d), ["consul/a", "consul/b", "consul/c"]);
    let proxy_names: Vec<Option<&str>> = d.registries.iter().map(|r| r.proxy_name.as_deref()).collect();
    assert_eq!(proxy_names, [Some("ok"), None, None]);
}

#[test]
fn listener_port_clashes_reject_the_later_proxy() {
    let proxies = "    - {type: http, name: a, serverAddress: 10.0.0.1, serverPort: 3128, listenerPort: 50001}\n\
                   \x20   - {type: http, name: b, serverAddress: 10.0.0.2, serverPort: 3128, listenerPort: 50001}\n\
                   \x20   - {type: http, name: c, serverAddress: 10.0.0.3, serverPort: 3128}\n";
    let text = bridge("    - {type: dns, name: d, domain: api.example.com, port: 443, proxyName: b}\n", proxies);
    let other = "\n---\napiVersion: networking.higress.io/v1\nkind: McpBridge\n\
                 metadata: {name: other, namespace: team}\nspec:\n  proxies:\n\
                 \x20   - {type: http, name: e, serverAddress: 10.0.0.5, serverPort: 3128, listenerPort: 50001}\n";
    let d = build_text(&(text + other)).desired;
    assert_eq!(
        d.errors,
        vec![
            format!("{BRIDGE}: spec.proxies[1].listenerPort: 50001 already used by proxy \"a\""),
            format!(
                "{BRIDGE}: spec.registries[0].proxyName: proxy \"b\" is not usable (see its spec.proxies error); \
                 routing its services directly"
            ),
            "McpBridge team/other: spec.proxies[0].listenerPort: 50001 already used by proxy \"a\"".to_string(),
        ]
    );
    let proxies: Vec<&str> = d.proxies.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(proxies, ["a", "c"]);
    assert_eq!(names(&d), ["dns/d"]);
    assert_eq!(d.registries[0].proxy_name, None);
}

#[test]
fn auth_secret_lookup_prefers_the_bridge_namespace() {
    let secret = |ns: &str, token: &str| {
        format!(
            "---\napiVersion: v1\nkind: Secret\nmetadata: {{name: auth, namespace: {ns}}}\nstringData: {{consulToken: {token}}}\n"
        )
    };
    let registry = bridge("    - {type: consul, name: a, domain: h, port: 1, authSecretName: auth}\n", "");
    let token = |text: String| {
        let d = build_text(&text).desired;
        (d.registries.first().map(|r| r.auth["consulToken"].expose().to_owned()), d.errors)
    };

    let (t, errors) = token(registry.clone() + &secret("other", "o") + &secret("higress-system", "mine"));
    assert_eq!((t.as_deref(), errors.len()), (Some("mine"), 0));

    let (t, errors) = token(registry.clone() + &secret("other", "o"));
    assert_eq!((t.as_deref(), errors.len()), (Some("o"), 0));

    let (t, errors) = token(registry + &secret("x", "tok-x") + &secret("z", "tok-z"));
    assert_eq!(t, None);
    assert_eq!(
        errors,
        vec![format!(
            "{BRIDGE}: spec.registries[0].authSecretName: secret \"auth\" not found in namespace \"higress-system\" and ambiguous elsewhere (namespaces x, z)"
        )]
    );
}

#[test]
fn duplicate_objects_keep_the_first() {
    let text = bridge("    - {type: consul, name: a, domain: h, port: 1}\n", "");
    let twice = format!("{text}---\n{}", text.replace("name: a", "name: b"));
    let d = build_text(&twice).desired;
    assert_eq!(names(&d), ["consul/a"]);
    assert_eq!(d.errors, vec![format!("{BRIDGE}: defined more than once, ignoring all but the first")]);
}

#[test]
fn secrets_never_printed() {
    let docs = parse_documents("full.yaml", FULL).unwrap();
    let mut builder = Builder::default();
    let built = builder.build_full(&docs);
    // An invalid edit with credentials in it, kept at its last good spec.
    let broken =
        FULL.replace("port: 8848", "port: 0").replace("nacosAccessKey: ak-plaintext-value", "nacosAccessKey: 12345");
    let broken_docs = parse_documents("full.yaml", &broken).unwrap();
    let rebuilt = builder.build_full(&broken_docs);
    assert_eq!(rebuilt.desired.registries, built.desired.registries);
    assert_eq!(
        rebuilt.desired.errors,
        vec![format!("{BRIDGE}: spec.registries[0].nacosAccessKey: must be a string (keeping last good config)")]
    );
    let printed = format!(
        "{docs:?}\n{broken_docs:?}\n{:?}\n{:?}\n{:?}\n{:?}\n{builder:?}",
        built.desired, built.warnings, rebuilt.desired, rebuilt.warnings
    );
    for value in SECRET_VALUES.iter().chain(&["12345"]) {
        assert!(!printed.contains(value), "{value} leaked");
    }
    // ...while the values are there for the watcher that needs them.
    assert_eq!(built.desired.registries[1].auth["consulToken"].expose(), "s3cr3t-consul-token");
}

#[test]
fn registry_last_good_is_kept_then_dropped() {
    let good = bridge(
        "    - {type: consul, name: a, domain: 127.0.0.1, port: 8500}\n\
         \x20   - {type: consul, name: b, domain: 127.0.0.1, port: 8501}\n",
        "",
    );
    let mut state = ConfigState::new();
    state.set_file("f.yaml", good.clone());
    let d = state.desired();
    assert_eq!((names(&d), d.errors.len()), (vec!["consul/a".into(), "consul/b".into()], 0));

    // b breaks: its last good spec stays, and a new broken c is absent.
    let bad = good.replace("port: 8501", "port: 0") + "    - {type: consul, name: c, domain: h, port: 0}\n";
    state.set_file("f.yaml", bad);
    let d = state.desired();
    assert_eq!(names(&d), ["consul/a", "consul/b"]);
    assert_eq!(d.registries[1].port, 8501);
    assert_eq!(
        d.errors,
        vec![
            format!("{BRIDGE}: spec.registries[1].port: must be 1..65535 (keeping last good config)"),
            format!("{BRIDGE}: spec.registries[2].port: must be 1..65535"),
        ]
    );

    // b removed from the file: its last good spec goes too, and does not
    // come back if b reappears broken.
    let only_a = bridge("    - {type: consul, name: a, domain: 127.0.0.1, port: 8500}\n", "");
    state.set_file("f.yaml", only_a.clone());
    assert_eq!(names(&state.desired()), ["consul/a"]);
    state.set_file("f.yaml", only_a + "    - {type: consul, name: b, domain: h, port: 0}\n");
    assert_eq!(names(&state.desired()), ["consul/a"]);
}

#[test]
fn registry_last_good_matches_type_when_names_are_shared() {
    let good = bridge(
        "    - {type: consul, name: c, domain: 127.0.0.1, port: 8500}\n\
         \x20   - {type: nacos, name: c, domain: 127.0.0.1, port: 8848}\n",
        "",
    );
    let mut builder = Builder::default();
    let docs = |text: &str| parse_documents("f.yaml", text).unwrap();
    assert_eq!(names(&builder.build(&docs(&good))), ["nacos/c", "consul/c"]);

    // The consul entry breaks: its own last good spec stays, not the nacos one.
    let d = builder.build(&docs(&good.replace("port: 8500", "port: 0")));
    assert_eq!(names(&d), ["nacos/c", "consul/c"]);
    assert_eq!(d.errors.len(), 1, "{:?}", d.errors);

    // A typo in the type of a name used once keeps that name's spec.
    let only = bridge("    - {type: consul, name: c, domain: 127.0.0.1, port: 8500}\n", "");
    builder.build(&docs(&only));
    let d = builder.build(&docs(&only.replace("type: consul", "type: consull")));
    assert_eq!(names(&d), ["consul/c"]);
    assert!(d.errors[0].ends_with("(keeping last good config)"), "{:?}", d.errors);
}

#[test]
fn malformed_file_keeps_its_last_good_documents() {
    let mut state = ConfigState::new();
    assert!(state.set_file("a.yaml", bridge("    - {type: consul, name: a, domain: h, port: 1}\n", "")));
    assert!(!state.set_file("a.yaml", bridge("    - {type: consul, name: a, domain: h, port: 1}\n", "")));
    state.set_file("b.yaml", "key: [unclosed\n".into());
    let d = state.desired();
    assert_eq!(names(&d), ["consul/a"]);
    assert_eq!(d.errors, vec!["b.yaml: document 1, line 1: unclosed bracket '['; file ignored"]);

    state.set_file("a.yaml", "apiVersion: v1\nkind: Secret\nmetadata: {name: x}\n---\n  bad: [\n".into());
    let d = state.desired();
    assert_eq!(names(&d), ["consul/a"]);
    assert_eq!(
        d.errors,
        vec![
            "a.yaml: document 2, line 5: unclosed bracket '['; keeping last good config of this file",
            "b.yaml: document 1, line 1: unclosed bracket '['; file ignored",
        ]
    );

    state.remove_file("a.yaml");
    assert_eq!(names(&state.desired()), Vec::<String>::new());
}

fn example(name: &str) -> Desired {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/examples").join(name);
    let mut state = ConfigState::new();
    let mut files = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            state.set_file(&path.display().to_string(), std::fs::read_to_string(&path).unwrap());
            files += 1;
        }
    }
    assert!(files > 0);
    state.desired()
}

#[test]
fn the_examples_load_cleanly() {
    let quick = example("standalone");
    assert_eq!(quick.errors, Vec::<String>::new());
    // The quick start needs nothing else running: no registry but static.
    assert_eq!(names(&quick), ["static/local-echo"]);
    assert_eq!(quick.ingresses.len(), 1);

    let with_consul = example("standalone-consul");
    assert_eq!(with_consul.errors, Vec::<String>::new());
    assert_eq!(names(&with_consul), ["consul/consul-local", "static/local-echo"]);
    let mut want = consul("consul-local");
    want.consul_refresh_interval = Some(Duration::from_secs(30));
    assert!(with_consul.registries.contains(&want), "{:?}", with_consul.registries);

    let migration = example("eureka-to-nacos");
    assert_eq!(migration.errors, Vec::<String>::new());
    assert_eq!(migration.ingresses.len(), 1);
}

#[tokio::test]
async fn standalone_example_dir_source() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy/examples/standalone");
    let (_source, rx) = DirSource::start(dir).await.unwrap();
    let d = rx.borrow().clone();
    assert_eq!(d.errors, Vec::<String>::new());
    assert_eq!(names(&d), ["static/local-echo"]);
}

/// Wait (at most 10s) for the channel to publish a `Desired` matching `ok`.
async fn wait_for(rx: &mut watch::Receiver<Arc<Desired>>, what: &str, ok: impl Fn(&Desired) -> bool) -> Arc<Desired> {
    let wait = rx.wait_for(|d| ok(d));
    let result = tokio::time::timeout(Duration::from_secs(10), wait).await.map(|r| r.map(|d| d.clone()));
    match result {
        Ok(Ok(d)) => d,
        Ok(Err(_)) => panic!("source stopped while waiting for {what}"),
        Err(_) => panic!("timed out waiting for {what}; last: {:?}", *rx.borrow()),
    }
}

#[tokio::test]
async fn dir_source_follows_edits() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("bridge.yaml");
    let good = bridge("    - {type: consul, name: a, domain: 127.0.0.1, port: 8500}\n", "");
    std::fs::write(&file, &good).unwrap();
    std::fs::write(tmp.path().join("notes.txt"), "not yaml: [").unwrap();
    std::fs::write(tmp.path().join(".hidden.yaml"), "not yaml: [").unwrap();

    let (source, mut rx) = DirSource::start(tmp.path().to_owned()).await.unwrap();
    assert_eq!(source.dir(), tmp.path());
    assert_eq!(names(&rx.borrow_and_update()), ["consul/a"]);
    assert_eq!(rx.borrow().errors, Vec::<String>::new());

    // Edit: a second registry appears.
    std::fs::write(&file, good.clone() + "    - {type: consul, name: b, domain: 127.0.0.1, port: 8501}\n").unwrap();
    wait_for(&mut rx, "registry b", |d| names(d) == ["consul/a", "consul/b"]).await;

    // Malformed: the file's last good documents stay, the error is reported.
    std::fs::write(&file, "spec: [oops\n").unwrap();
    let d = wait_for(&mut rx, "parse error", |d| !d.errors.is_empty()).await;
    assert_eq!(names(&d), ["consul/a", "consul/b"]);
    assert!(d.errors[0].ends_with("keeping last good config of this file"), "{:?}", d.errors);
    assert!(d.errors[0].starts_with(&file.display().to_string()), "{:?}", d.errors);

    // A second file, written by rename as editors and kubectl cp do.
    let staged = tmp.path().join("second.yaml.tmp");
    std::fs::write(
        &staged,
        bridge("    - {type: zookeeper, name: z, domain: zk, port: 2181}\n", "")
            .replace("name: default", "name: second"),
    )
    .unwrap();
    std::fs::rename(&staged, tmp.path().join("second.yml")).unwrap();
    wait_for(&mut rx, "second file", |d| names(d).contains(&"zookeeper/z".to_owned())).await;

    // Deleting the broken file removes its documents and its error.
    std::fs::remove_file(&file).unwrap();
    let d = wait_for(&mut rx, "file removal", |d| names(d) == ["zookeeper/z"]).await;
    assert_eq!(d.errors, Vec::<String>::new());
}

#[tokio::test]
async fn dir_source_rescans_without_events() {
    // With the watch's events possibly lost, the periodic re-scan still
    // catches changes: use a short period and a change notify may coalesce.
    let tmp = tempfile::tempdir().unwrap();
    let (_source, mut rx) =
        DirSource::start_with(tmp.path().to_owned(), Duration::from_millis(100), Builder::default()).await.unwrap();
    assert_eq!(**rx.borrow_and_update(), Desired::default());
    std::fs::write(tmp.path().join("a.yaml"), bridge("    - {type: consul, name: a, domain: h, port: 1}\n", ""))
        .unwrap();
    wait_for(&mut rx, "registry a", |d| names(d) == ["consul/a"]).await;
}

#[tokio::test]
async fn dir_source_needs_a_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("nope");
    let err = DirSource::start(missing.clone()).await.err().expect("error");
    assert!(matches!(err, ConfigError::Io { ref path, .. } if *path == missing), "{err}");
}

#[test]
fn vport_services_are_matched_to_hosts_ignoring_case() {
    // As the Higress console writes it: the service host, in any case.
    let text = bridge(
        "    - type: nacos2\n      name: nacos\n      domain: h\n      port: 8848\n      vport:\n        default: 8080\n        services:\n          - name: Orders.DEFAULT-GROUP.public.nacos\n            value: 9090\n          - name: users\n            value: 9091\n    - type: eureka\n      name: eureka\n      domain: h\n      port: 8761\n      vport:\n        services:\n          - name: ORDERS.eureka\n            value: 7070\n",
        "",
    );
    let built = build_text(&text);
    assert_eq!(built.desired.errors, Vec::<String>::new());
    let (nacos, eureka) = (&built.desired.registries[0], &built.desired.registries[1]);
    assert_eq!(nacos.vport_for("orders.DEFAULT-GROUP.public.nacos"), Some(9090));
    assert_eq!(nacos.vport_for("ORDERS.default-group.PUBLIC.nacos"), Some(9090));
    assert_eq!(nacos.vport_for("users.DEFAULT-GROUP.public.nacos"), Some(8080), "a bare name is not a host");
    assert_eq!(eureka.vport_for("orders.eureka"), Some(7070));
    assert_eq!(eureka.vport_for("billing.eureka"), None);
    assert_eq!(
        built.warnings,
        vec![format!(
            "{BRIDGE}: spec.registries[0].vport.services[1].name: \"users\" names no service host; vport names are hosts such as users.DEFAULT-GROUP.public.nacos"
        )]
    );

    // Two spellings of one host are one entry.
    let dup = bridge(
        "    - {type: consul, name: c, domain: h, port: 1, vport: {services: [{name: a.dc1.consul, value: 1}, {name: A.dc1.consul, value: 2}]}}\n",
        "",
    );
    let errors = build_text(&dup).desired.errors;
    assert!(errors[0].contains("vport.services[1].name: duplicate service \"A.dc1.consul\""), "{errors:?}");
}

#[test]
fn newer_higress_fields_nacos_timeout_and_ecdh_curves() {
    let text = bridge(
        "    - {type: nacos2, name: nc, domain: h, port: 8848, nacosTimeout: \"3000\"}\n\
         \x20   - {type: dns, name: partner, domain: api.example.com, port: 443, protocol: https, ecdhCurves: [P-384, \"P-256\", P-384]}\n\
         \x20   - {type: nacos, name: old, domain: h, port: 8848, nacosTimeout: -5}\n\
         \x20   - {type: dns, name: bad, domain: api.example.com, port: 443, ecdhCurves: [\"P 256\"]}\n",
        "",
    );
    let built = build_text(&text);
    let d = &built.desired;
    assert_eq!(d.errors.len(), 1, "{:?}", d.errors);
    let by_name = |name: &str| d.registries.iter().find(|r| r.name == name).unwrap();
    assert_eq!(by_name("nc").nacos_timeout, Some(Duration::from_secs(3)));
    assert_eq!(by_name("partner").ecdh_curves, ["P-384", "P-256"], "in order, once each");
    assert_eq!(by_name("old").nacos_timeout, None);
    assert_eq!(d.errors, vec![format!("{BRIDGE}: spec.registries[3].ecdhCurves[0]: \"P 256\" is not a curve name")]);
    assert_eq!(
        built.warnings,
        vec![format!("{BRIDGE}: spec.registries[2].nacosTimeout: must not be negative; using the default")]
    );
}

#[test]
fn duplicates_across_files_name_both_files_and_file_states_are_reported() {
    let a = bridge("    - {type: consul, name: a, domain: h, port: 1}\n", "");
    let mut state = ConfigState::new();
    state.set_file("10-first.yaml", a.clone());
    state.set_file("20-second.yaml", a.replace("name: a", "name: b"));
    state.set_file("30-broken.yaml", "kind: [".into());
    let d = state.desired();
    assert_eq!(names(&d), ["consul/a"]);
    let dup =
        format!("{BRIDGE}: defined more than once (10-first.yaml and 20-second.yaml), ignoring all but the first");
    assert!(d.errors.contains(&dup), "{:?}", d.errors);
    let files: Vec<(&str, &str)> = d.files.iter().map(|f| (f.name.as_str(), f.state)).collect();
    assert_eq!(files, [("10-first.yaml", "loaded"), ("20-second.yaml", "loaded"), ("30-broken.yaml", "ignored")]);
    assert!(d.files[2].error.as_deref().is_some_and(|e| e.contains("30-broken.yaml")), "{:?}", d.files[2]);

    // A file that breaks after loading keeps its last good version.
    state.set_file("10-first.yaml", "kind: [".into());
    let d = state.desired();
    assert_eq!(d.files[0].state, "lastGoodKept");
    assert_eq!(names(&d), ["consul/a"]);
}

#[test]
fn registry_domains_are_checked_per_type() {
    let good = [
        ("consul", "consul.service.dc1"),
        ("consul", "10.0.0.1"),
        ("consul", "::1"),
        ("consul", "[::1]"),
        ("consul", "consul_server"),
        ("zookeeper", "zk1, zk2,10.0.0.3"),
        ("nacos2", "n1:8848,n2,[::1]:8848,::1"),
        ("nacos", "nacos.local"),
        ("eureka", "e1:8761,e2"),
    ];
    for (kind, domain) in good {
        let d = build_text(&bridge(&format!("    - {{type: {kind}, name: r, domain: \"{domain}\", port: 1}}\n"), ""))
            .desired;
        assert_eq!(d.errors, Vec::<String>::new(), "{kind} {domain}");
        assert_eq!(d.registries.len(), 1, "{kind} {domain}");
    }
    let bad = [
        ("consul", "http://consul:8500", "\"http://consul:8500\" is not a host name or IP (the port goes in `port`)"),
        ("consul", "consul:8500", "\"consul:8500\" is not a host name or IP (the port goes in `port`)"),
        ("consul", "a,b", "\"a,b\": one host expected, not a list"),
        ("consul", "bad host", "\"bad host\" is not a host name or IP (the port goes in `port`)"),
        ("consul", "10.0.0.300", "\"10.0.0.300\" is not a host name or IP (the port goes in `port`)"),
        ("zookeeper", "zk1:2181", "\"zk1:2181\" is not a host name or IP (the port goes in `port`)"),
        ("zookeeper", ",", "\",\" names no host"),
        ("nacos2", "n1:0", "\"n1:0\" is not a host or host:port"),
        ("nacos", "http://n1", "\"http://n1\" is not a host or host:port"),
        ("eureka", "e1:8761/eureka", "\"e1:8761/eureka\" is not a host or host:port"),
        ("eureka", "fe80::1:99999", "\"fe80::1:99999\" is not a host or host:port"),
    ];
    for (kind, domain, want) in bad {
        let d = build_text(&bridge(&format!("    - {{type: {kind}, name: r, domain: \"{domain}\", port: 1}}\n"), ""))
            .desired;
        assert_eq!(d.errors, vec![format!("{BRIDGE}: spec.registries[0].domain: {want}")], "{kind} {domain}");
        assert!(d.registries.is_empty());
    }
}

#[test]
fn a_bad_domain_keeps_the_running_registry() {
    // As the Higress console writes an McpBridge; then the domain is edited
    // into a URL, which no watcher could use.
    let higress = |domain: &str| {
        format!(
            "apiVersion: networking.higress.io/v1\nkind: McpBridge\nmetadata:\n  name: default\n  namespace: higress-system\n\
             spec:\n  registries:\n  - domain: {domain}\n    name: my-consul\n    port: 8500\n    type: consul\n\
             \x20   consulRefreshInterval: 30000000000\n  - domain: 192.168.0.2\n    name: my-nacos\n    port: 8848\n    type: nacos2\n\
             \x20   nacosGroups:\n    - DEFAULT_GROUP\n"
        )
    };
    let mut state = ConfigState::new();
    state.set_file("bridge.yaml", higress("consul.local"));
    let before = state.desired();
    assert_eq!(before.errors, Vec::<String>::new());
    assert_eq!(names(&before), ["nacos2/my-nacos", "consul/my-consul"]);

    state.set_file("bridge.yaml", higress("\"http://consul.local:8500\""));
    let after = state.desired();
    assert_eq!(after.registries, before.registries, "the last good consul spec stays in force");
    assert_eq!(
        after.errors,
        vec![format!(
            "{BRIDGE}: spec.registries[0].domain: \"http://consul.local:8500\" is not a host name or IP \
             (the port goes in `port`) (keeping last good config)"
        )]
    );
}

#[test]
fn meshbridge_watch_is_optional_and_validated_with_field_paths() {
    use meshbridge_registries::{WatchMode, WatchSpec};
    let text = bridge(
        "    - {type: consul, name: a, domain: h, port: 1}\n\
         \x20   - {type: consul, name: b, domain: h, port: 1, meshbridgeWatch: {mode: referenced}}\n\
         \x20   - {type: consul, name: c, domain: h, port: 1, meshbridgeWatch: {include: ['pay-.*', 'web\\.dc1\\.consul']}}\n\
         \x20   - {type: consul, name: d, domain: h, port: 1, meshbridgeWatch: {mode: some}}\n\
         \x20   - {type: consul, name: e, domain: h, port: 1, meshbridgeWatch: {include: ['ok', '(']}}\n\
         \x20   - {type: consul, name: f, domain: h, port: 1, meshbridgeWatch: {include: 'x'}}\n\
         \x20   - {type: consul, name: g, domain: h, port: 1, meshbridgeWatch: referenced}\n\
         \x20   - {type: consul, name: h, domain: h, port: 1, meshbridgeWatch: {mode: all, include: [3], extra: 1}}\n",
        "",
    );
    let built = build_text(&text);
    let d = &built.desired;
    let spec = |name: &str| d.registries.iter().find(|r| r.name == name).unwrap().watch.clone();
    assert_eq!(spec("a"), None, "unset: every service, as in Higress");
    assert_eq!(spec("b"), Some(WatchSpec { mode: WatchMode::Referenced, include: vec![] }));
    assert_eq!(
        spec("c"),
        Some(WatchSpec { mode: WatchMode::All, include: vec!["pay-.*".into(), "web\\.dc1\\.consul".into()] })
    );
    assert_eq!(names(d), ["consul/a", "consul/b", "consul/c"]);
    let errors: Vec<&str> = d.errors.iter().map(|e| e.split_once(": ").unwrap().1).collect();
    assert_eq!(
        errors,
        [
            "spec.registries[3].meshbridgeWatch.mode: unknown mode \"some\" (expected all or referenced)",
            "spec.registries[4].meshbridgeWatch.include[1]: unclosed group",
            "spec.registries[5].meshbridgeWatch.include: must be a list of regular expressions",
            "spec.registries[6].meshbridgeWatch: must be an object with mode and include",
            "spec.registries[7].meshbridgeWatch.include[0]: must be a string (a regular expression)",
        ],
        "{:?}",
        d.errors
    );
    assert!(
        built.warnings.iter().any(|w| w.ends_with("spec.registries[7].meshbridgeWatch.extra: unknown field, ignored")),
        "{:?}",
        built.warnings
    );
}

#[test]
fn the_log_line_says_what_is_configured_without_secrets() {
    let d = &build_text(FULL).desired;
    let line = d.summary();
    assert!(line.starts_with(&format!("{} registries (", d.registries.len())), "{line}");
    assert!(line.contains("nacos2 \"my-nacos\" at 192.168.0.10:8848"), "{line}");
    assert!(!line.contains("plaintext-value"), "a secret in the log line: {line}");
    assert!(line.ends_with("0 problems"), "{line}");
    let empty = Desired::default();
    assert_eq!(empty.summary(), "0 registries, 0 proxies, 0 Ingresses, 0 problems");
    let many = Desired { registries: (0..6).map(|i| consul(&format!("c{i}"))).collect(), ..Desired::default() };
    assert!(many.summary().contains("and 2 more)"), "{}", many.summary());
}

#[test]
fn meshbridge_migration_is_optional_and_validated_with_field_paths() {
    use meshbridge_registries::Migration;
    let text = bridge(
        "    - {type: nacos, name: a, domain: h, port: 1}\n\
         \x20   - {type: nacos2, name: b, domain: h, port: 1, meshbridgeMigration: {weight: 20, priority: 1}}\n\
         \x20   - {type: nacos3, name: c, domain: h, port: 1, meshbridgeMigration: {weight: 0, extra: 1}}\n\
         \x20   - {type: consul, name: d, domain: h, port: 1, meshbridgeMigration: {weight: 101}}\n\
         \x20   - {type: consul, name: e, domain: h, port: 1, meshbridgeMigration: {priority: -1}}\n\
         \x20   - {type: consul, name: f, domain: h, port: 1, meshbridgeMigration: {weight: '50'}}\n\
         \x20   - {type: consul, name: g, domain: h, port: 1, meshbridgeMigration: 80}\n",
        "",
    );
    let built = build_text(&text);
    let d = &built.desired;
    let migration = |name: &str| d.registries.iter().find(|r| r.name == name).unwrap().migration;
    assert_eq!(migration("a"), Migration::default(), "unset: no share, priority 0");
    assert_eq!(migration("b"), Migration { weight: Some(20), priority: 1 });
    assert_eq!(migration("c"), Migration { weight: Some(0), priority: 0 });
    assert_eq!(names(d), ["nacos/a", "nacos2/b", "nacos3/c"]);
    let errors: Vec<&str> = d.errors.iter().map(|e| e.split_once(": ").unwrap().1).collect();
    assert_eq!(
        errors,
        [
            "spec.registries[3].meshbridgeMigration.weight: 101 is not a whole number from 0 to 100",
            "spec.registries[4].meshbridgeMigration.priority: -1 is not a whole number from 0 to 100",
            "spec.registries[5].meshbridgeMigration.weight: \"50\" is not a whole number from 0 to 100",
            "spec.registries[6].meshbridgeMigration: must be an object with weight and priority",
        ],
        "{:?}",
        d.errors
    );
    assert!(
        built
            .warnings
            .iter()
            .any(|w| w.ends_with("spec.registries[2].meshbridgeMigration.extra: unknown field, ignored")),
        "{:?}",
        built.warnings
    );
}

/// What `kubectl get -o yaml` prints for several objects, a `List`, is read
/// item by item; a bad item is named by its index.
#[test]
fn a_kubectl_list_is_read_item_by_item() {
    let list = "apiVersion: v1\nkind: List\nitems:\n\
                - apiVersion: networking.k8s.io/v1\n  kind: Ingress\n  metadata: {name: a, namespace: shop}\n  spec: {}\n\
                - apiVersion: v1\n  kind: ConfigMap\n  metadata: {name: skipped}\n\
                - apiVersion: networking.k8s.io/v1\n  kind: Ingress\n  metadata: {name: b, namespace: shop}\n  spec: {}\n";
    let docs = parse_documents("list.yaml", list).unwrap();
    let names: Vec<String> = docs
        .iter()
        .map(|d| match d {
            Document::Ingress(i) => format!("{}/{}", i.namespace, i.name),
            _ => "other".into(),
        })
        .collect();
    assert_eq!(names, ["shop/a", "shop/b"]);

    let typed = list.replace("kind: List", "kind: IngressList");
    assert_eq!(parse_documents("list.yaml", &typed).unwrap().len(), 2);

    let bad = "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Secret}\n";
    let err = parse_documents("list.yaml", bad).unwrap_err().to_string();
    assert!(err.contains("items[0].metadata"), "{err}");
}

/// A Secret with CA certificates, whatever else it holds, is a CA for
/// client certificates: `cacert` before `ca.crt`, as Istio reads them; a
/// certificate Secret without `ca.crt` is none.
#[test]
fn secrets_with_ca_certificates_are_client_cas() {
    let text = "apiVersion: v1\nkind: Secret\nmetadata: {name: only-ca, namespace: shop}\n\
                stringData: {ca.crt: ONLYCA}\n---\n\
                apiVersion: v1\nkind: Secret\nmetadata: {name: both, namespace: shop}\n\
                stringData: {cacert: FIRST, ca.crt: SECOND}\n---\n\
                apiVersion: v1\nkind: Secret\nmetadata: {name: cert, namespace: shop}\ntype: kubernetes.io/tls\n\
                stringData: {tls.crt: C, tls.key: K}\n";
    let d = build_text(text).desired;
    let cas: Vec<(&str, &str)> = d.ca_secrets.iter().map(|c| (c.name.as_str(), c.ca_cert_pem.as_str())).collect();
    assert_eq!(cas, [("both", "FIRST"), ("only-ca", "ONLYCA")]);
    assert_eq!(d.tls_secrets.len(), 1, "a CA alone is no certificate");
}
