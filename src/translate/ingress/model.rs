//! The parts of a `networking.k8s.io/v1` Ingress the translation reads, as
//! lenient serde shapes: unknown fields are ignored and `null` reads as empty
//! (YAML `tls:` with nothing after it), so only a field of the wrong type
//! makes an Ingress unreadable.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// The legacy class annotation, still honoured before `spec.ingressClassName`
/// (as Higress and ingress-nginx do).
pub const CLASS_ANNOTATION: &str = "kubernetes.io/ingress.class";

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Ingress {
    pub metadata: Metadata,
    pub spec: Spec,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Metadata {
    #[serde(deserialize_with = "nullable")]
    annotations: BTreeMap<String, Value>,
    pub creation_timestamp: Option<String>,
}

impl Metadata {
    /// An annotation as text. Kubernetes only allows strings, but a
    /// hand-written file may say `ignore-path-case: true` unquoted.
    pub fn annotation(&self, key: &str) -> Option<String> {
        self.annotations.get(key).map(|v| match v {
            Value::String(s) => s.clone(),
            Value::Null => String::new(),
            other => other.to_string(),
        })
    }

    pub fn annotation_keys(&self) -> impl Iterator<Item = &str> {
        self.annotations.keys().map(String::as_str)
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Spec {
    pub ingress_class_name: Option<String>,
    pub default_backend: Option<Backend>,
    #[serde(deserialize_with = "nullable")]
    pub tls: Vec<Tls>,
    #[serde(deserialize_with = "nullable")]
    pub rules: Vec<Rule>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Tls {
    #[serde(deserialize_with = "nullable")]
    pub hosts: Vec<String>,
    pub secret_name: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Rule {
    pub host: Option<String>,
    pub http: Option<HttpRuleValue>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct HttpRuleValue {
    #[serde(deserialize_with = "nullable")]
    pub paths: Vec<HttpPath>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct HttpPath {
    pub path: Option<String>,
    pub path_type: Option<String>,
    pub backend: Backend,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Backend {
    pub service: Option<ServiceBackend>,
    pub resource: Option<ResourceBackend>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ServiceBackend {
    pub name: String,
    pub port: ServiceBackendPort,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ServiceBackendPort {
    /// Wide, so that an out-of-range number is reported as such rather than
    /// as a type error.
    pub number: Option<i64>,
    pub name: Option<String>,
}

/// A `TypedLocalObjectReference`.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ResourceBackend {
    pub api_group: Option<String>,
    pub kind: String,
    pub name: String,
}

impl ResourceBackend {
    /// Higress's check (`common.ValidateBackendResource`): only the McpBridge
    /// named `default` of `networking.higress.io` routes to registry services.
    pub fn is_mcp_bridge(&self) -> bool {
        self.api_group.as_deref() == Some("networking.higress.io") && self.kind == "McpBridge" && self.name == "default"
    }
}

/// An Ingress object that does not have the shape of one.
#[derive(Debug, thiserror::Error)]
#[error("{}{source}", field_prefix(.path))]
pub struct InvalidIngress {
    /// The field that does not fit (`.` for the object itself).
    pub path: String,
    source: serde_json::Error,
}

fn field_prefix(path: &str) -> String {
    if path == "." { String::new() } else { format!("{path}: ") }
}

/// Read an Ingress object; the error names the field that does not fit.
pub fn parse(object: &Value) -> Result<Ingress, InvalidIngress> {
    serde_path_to_error::deserialize(object).map_err(|e| {
        let path = e.path().to_string();
        InvalidIngress { path, source: e.into_inner() }
    })
}

fn nullable<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// An RFC 3339 time (what Kubernetes writes in `creationTimestamp`) as
/// (seconds, nanoseconds) since the Unix epoch, comparable across offsets.
/// `None` if it does not parse.
pub fn parse_timestamp(s: &str) -> Option<(i64, u32)> {
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let part = b.get(r)?;
        if part.is_empty() || !part.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(part).ok()?.parse().ok()
    };
    let sep = |i: usize, c: &[u8]| b.get(i).is_some_and(|x| c.contains(x));
    if !(sep(4, b"-") && sep(7, b"-") && sep(10, b"Tt ") && sep(13, b":") && sep(16, b":")) {
        return None;
    }
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let mut i = 19;
    let mut nanos = 0u32;
    if sep(i, b".") {
        let start = i + 1;
        i = start;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        let digits = &s[start..i];
        if digits.is_empty() {
            return None;
        }
        // Nanosecond precision; further digits cannot change the order of
        // timestamps Kubernetes writes (whole seconds).
        let kept = &digits[..digits.len().min(9)];
        nanos = kept.parse::<u32>().ok()? * 10u32.pow(9 - kept.len() as u32);
    }
    let offset = match b.get(i) {
        Some(b'Z' | b'z') if i + 1 == b.len() => 0,
        Some(sign @ (b'+' | b'-')) if i + 6 == b.len() && sep(i + 3, b":") => {
            let (h, m) = (num(i + 1..i + 3)?, num(i + 4..i + 6)?);
            if h > 23 || m > 59 {
                return None;
            }
            let o = h * 3600 + m * 60;
            if *sign == b'+' { o } else { -o }
        }
        _ => return None,
    };
    let days = days_from_civil(year, month, day);
    Some((days * 86_400 + hour * 3600 + minute * 60 + second - offset, nanos))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
/// `days_from_civil`).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_parse_and_compare_across_offsets() {
        assert_eq!(parse_timestamp("1970-01-01T00:00:00Z"), Some((0, 0)));
        assert_eq!(parse_timestamp("2024-02-29T12:00:00Z"), Some((1_709_208_000, 0)));
        assert_eq!(parse_timestamp("2024-02-29T14:00:00+02:00"), parse_timestamp("2024-02-29T12:00:00Z"));
        assert_eq!(parse_timestamp("2024-02-29T12:00:00.5Z"), Some((1_709_208_000, 500_000_000)));
        assert!(parse_timestamp("2024-01-01T00:00:00Z") < parse_timestamp("2024-01-01T00:00:01Z"));
        for bad in [
            "",
            "2024-01-01",
            "2024-13-01T00:00:00Z",
            "2024-01-01T00:00:00",
            "2024-01-01T00:00:00.Z",
            "x".repeat(30).as_str(),
            "2024-01-01T00:00:00+0200",
            "٢٠٢٤-01-01T00:00:00Z",
        ] {
            assert_eq!(parse_timestamp(bad), None, "{bad}");
        }
    }
}
