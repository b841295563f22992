//! Spring Cloud Zookeeper instances: Curator `ServiceInstance` JSON in the
//! data of `{root}/{service}/{id}`, e.g.
//!
//! ```json
//! {"name": "orders", "id": "5f0c…", "address": "10.0.0.7", "port": 8080, "sslPort": null,
//!  "payload": {"@class": "org.springframework.cloud.zookeeper.discovery.ZookeeperInstance",
//!              "metadata": {"protocol": "grpc", "zone": "a"}},
//!  "registrationTimeUTC": 1700000000000, "serviceType": "DYNAMIC"}
//! ```
//!
//! Pure: bytes in, instance or a reason out. Read leniently (unknown fields
//! ignored, `payload` optional); nothing here may panic, whatever the bytes.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::labels;
use crate::model::{Endpoint, Protocol};
use crate::shared::intern;

/// One instance, ready for the mesh.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Instance {
    /// Address may still be a host name; the reader resolves it.
    pub endpoint: Endpoint,
    /// `payload.metadata.protocol`, when it names a protocol we know. An
    /// instance reachable only on `sslPort` says HTTPS unless it names one.
    pub protocol: Option<Protocol>,
    /// The mesh must talk TLS to it: it is reached on `sslPort`, or its
    /// protocol is `https` or `grpcs`.
    pub tls: bool,
    /// Metadata entries left out of the labels.
    pub dropped_labels: usize,
    /// False when Spring Cloud marks it out of traffic:
    /// `payload.metadata.instance_status` present and not `UP` (e.g.
    /// `OUT_OF_SERVICE`, set through the service-registry endpoint).
    pub serving: bool,
}

/// Why an instance node was skipped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum InstanceError {
    /// The data is not a JSON object.
    #[error("not a JSON object: {0}")]
    Json(String),
    /// `address` is missing, empty or not a string.
    #[error("no address")]
    Address,
    /// Neither `port` nor `sslPort` is a number in 1..65535.
    #[error("no valid port or sslPort")]
    Port,
}

/// Read one instance node's data.
pub(crate) fn parse_instance(data: &[u8]) -> Result<Instance, InstanceError> {
    // serde_json limits nesting depth, so hostile input cannot blow the stack.
    let json: Value = serde_json::from_slice(data).map_err(|e| InstanceError::Json(e.to_string()))?;
    let obj = json.as_object().ok_or_else(|| InstanceError::Json("not an object".into()))?;
    let address = obj.get("address").and_then(Value::as_str).filter(|a| !a.trim().is_empty());
    let address = address.ok_or(InstanceError::Address)?.trim().to_string();
    // Curator writes null for an unset port. A port that is set but unusable
    // is an error, not a reason to fall back to the other one.
    let port = |key: &str| match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => {
            v.as_u64().and_then(|p| u16::try_from(p).ok()).filter(|p| *p != 0).map(Some).ok_or(InstanceError::Port)
        }
    };
    let (port, ssl) = match (port("port")?, port("sslPort")?) {
        (Some(p), _) => (p, false),
        (None, Some(p)) => (p, true),
        (None, None) => return Err(InstanceError::Port),
    };
    let metadata = obj.get("payload").and_then(|p| p.get("metadata")).and_then(Value::as_object);
    let mut non_string = 0;
    let pairs: Vec<(&str, &str)> = metadata
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| match v.as_str() {
            Some(v) => Some((k.as_str(), v)),
            None => {
                non_string += 1;
                None
            }
        })
        .collect();
    let named = pairs.iter().find(|(k, _)| *k == "protocol").map(|(_, v)| *v);
    let status = metadata.and_then(|m| m.get(STATUS_KEY));
    let serving = status.is_none_or(|s| s.as_str().is_some_and(|s| s.trim().eq_ignore_ascii_case("UP")));
    let protocol = named.and_then(Protocol::parse).or(ssl.then_some(Protocol::Https));
    let tls = ssl || named.is_some_and(is_tls_protocol);
    let (labels, invalid): (BTreeMap<String, String>, usize) = labels::keep_valid(pairs);
    Ok(Instance {
        endpoint: Endpoint { address, port, weight: 1, labels: intern(labels) },
        protocol,
        tls,
        dropped_labels: invalid + non_string,
        serving,
    })
}

/// Spring Cloud Zookeeper's status key in the instance metadata.
const STATUS_KEY: &str = "instance_status";

/// Protocol names that mean the endpoint itself speaks TLS.
pub(crate) fn is_tls_protocol(name: &str) -> bool {
    name.eq_ignore_ascii_case("https") || name.eq_ignore_ascii_case("grpcs")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const CURATOR: &str = r#"{"name":"orders","id":"5f0c2d1e","address":"10.0.0.7","port":8080,"sslPort":null,
        "payload":{"@class":"org.springframework.cloud.zookeeper.discovery.ZookeeperInstance","id":"orders-1",
                   "name":"orders","metadata":{"instance_status":"UP","zone":"a","note":"has space","n":1}},
        "registrationTimeUTC":1700000000000,"serviceType":"DYNAMIC",
        "uriSpec":{"parts":[{"value":"scheme","variable":true}]}}"#;

    #[test]
    fn instances_out_of_service_are_not_serving() {
        let with = |status: &str| {
            let json = format!(
                r#"{{"address":"10.0.0.7","port":8080,"payload":{{"metadata":{{"instance_status":{status}}}}}}}"#
            );
            parse_instance(json.as_bytes()).unwrap().serving
        };
        assert!(with(r#""UP""#));
        assert!(with(r#""up""#), "case does not matter");
        assert!(!with(r#""OUT_OF_SERVICE""#));
        assert!(!with(r#""DOWN""#));
        assert!(!with(r#""STARTING""#), "anything but UP");
        assert!(!with("null"), "present but not a status");
        assert!(parse_instance(br#"{"address":"10.0.0.7","port":8080}"#).unwrap().serving, "no status: serving");
        assert!(parse_instance(CURATOR.as_bytes()).unwrap().serving);
    }

    #[test]
    fn a_real_curator_instance() {
        let i = parse_instance(CURATOR.as_bytes()).unwrap();
        assert_eq!((i.endpoint.address.as_str(), i.endpoint.port, i.endpoint.weight), ("10.0.0.7", 8080, 1));
        assert_eq!(i.protocol, None, "no protocol in metadata: the service default applies");
        let want = BTreeMap::from([("instance_status".into(), "UP".into()), ("zone".into(), "a".into())]);
        assert_eq!(*i.endpoint.labels, want);
        assert_eq!(i.dropped_labels, 2, "a value with a space and a number");
    }

    #[test]
    fn protocol_and_ports() {
        let i = |s: &str| parse_instance(s.as_bytes());
        let grpc = i(r#"{"address":"h","port":9090,"payload":{"metadata":{"protocol":"GRPC"}}}"#).unwrap();
        assert_eq!(grpc.protocol, Some(Protocol::Grpc));
        assert_eq!(grpc.endpoint.labels["protocol"], "GRPC");
        let unknown = i(r#"{"address":"h","port":1,"payload":{"metadata":{"protocol":"carrier-pigeon"}}}"#).unwrap();
        assert_eq!(unknown.protocol, None);
        assert!(!grpc.tls);
        let ssl = i(r#"{"address":"h","port":null,"sslPort":8443}"#).unwrap();
        assert_eq!((ssl.endpoint.port, ssl.protocol, ssl.tls), (8443, Some(Protocol::Https), true));
        let both = i(r#"{"address":"h","port":80,"sslPort":443,"payload":null}"#).unwrap();
        assert_eq!((both.endpoint.port, both.protocol, both.tls), (80, None, false));
        let grpcs = i(r#"{"address":"h","port":443,"payload":{"metadata":{"protocol":"grpcs"}}}"#).unwrap();
        assert_eq!((grpcs.protocol, grpcs.tls), (Some(Protocol::Grpc), true));
    }

    #[test]
    fn malformed_instances_are_errors() {
        let cases: [(&[u8], InstanceError); 11] = [
            (b"", InstanceError::Json(String::new())),
            (b"{not json", InstanceError::Json(String::new())),
            (b"[1,2]", InstanceError::Json(String::new())),
            (b"\xff\xfe", InstanceError::Json(String::new())),
            (br#"{"port":80}"#, InstanceError::Address),
            (br#"{"address":"","port":80}"#, InstanceError::Address),
            (br#"{"address":7,"port":80}"#, InstanceError::Address),
            (br#"{"address":"h"}"#, InstanceError::Port),
            (br#"{"address":"h","port":0}"#, InstanceError::Port),
            (br#"{"address":"h","port":70000,"sslPort":443}"#, InstanceError::Port),
            (br#"{"address":"h","port":"80"}"#, InstanceError::Port),
        ];
        for (data, want) in cases {
            let got = parse_instance(data).unwrap_err();
            let same = matches!((&got, &want), (InstanceError::Json(_), InstanceError::Json(_))) || got == want;
            assert!(same, "{:?}: got {got:?}, want {want:?}", String::from_utf8_lossy(data));
        }
        let deep = "[".repeat(100_000);
        assert!(parse_instance(deep.as_bytes()).is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn any_bytes_parse_or_err(data in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = parse_instance(&data);
        }

        #[test]
        fn json_like_strings_parse_or_err(data in r#"\{("(address|port|sslPort|payload|metadata|protocol)":("[a-z0-9.]{0,6}"|-?[0-9]{1,7}|null|\{|\[|\}|\]|true),?){0,8}\}?"#) {
            let _ = parse_instance(data.as_bytes());
        }

        #[test]
        fn well_formed_instances_round_trip(
            address in "[a-z0-9.:-]{1,20}",
            port in 1u16..,
            metadata in proptest::collection::btree_map("[a-z][a-z0-9_.-]{0,10}[a-z0-9]", "[a-zA-Z0-9]{0,10}", 0..6),
        ) {
            let json = serde_json::json!({"name": "svc", "address": address, "port": port,
                                          "payload": {"metadata": metadata}});
            let i = parse_instance(json.to_string().as_bytes()).unwrap();
            prop_assert_eq!(i.endpoint.address, address);
            prop_assert_eq!(i.endpoint.port, port);
            prop_assert_eq!(&*i.endpoint.labels, &metadata);
            prop_assert_eq!(i.dropped_labels, 0);
        }
    }
}
