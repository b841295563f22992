//! Time in text, one grammar each: RFC 3339 timestamps (UTC) for the admin
//! API's JSON and Kubernetes status, and durations for every flag.

use std::time::{Duration, SystemTime};

use k8s_openapi::jiff::Timestamp;
use serde::Serializer;

/// `2024-05-01T12:34:56.789Z`: milliseconds. Times before 1970 print as
/// the epoch.
pub fn rfc3339(t: SystemTime) -> String {
    timestamp(t).strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
}

/// `2024-05-01T12:34:56Z`: whole seconds, as Kubernetes' `Time` is.
pub fn rfc3339_secs(t: SystemTime) -> String {
    timestamp(t).strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn timestamp(t: SystemTime) -> Timestamp {
    Timestamp::try_from(t).ok().filter(|ts| *ts >= Timestamp::UNIX_EPOCH).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// For `#[serde(serialize_with)]` on a `SystemTime`.
pub fn rfc3339_ser<S: Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&rfc3339(*t))
}

/// For `#[serde(serialize_with)]` on an `Option<SystemTime>`: `null` or a string.
pub fn opt_rfc3339<S: Serializer>(t: &Option<SystemTime>, s: S) -> Result<S::Ok, S::Error> {
    match t {
        Some(t) => s.serialize_str(&rfc3339(*t)),
        None => s.serialize_none(),
    }
}

/// A duration that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("{0:?}: expected a duration such as 500ms, 30s, 5m, 1h or 1m30s")]
    Syntax(String),
    #[error("{text:?}: unknown unit {unit:?}; use ns, us, ms, s, m or h")]
    Unit { text: String, unit: String },
    #[error("{0:?}: out of range")]
    Range(String),
}

/// The one duration grammar of every flag and variable: Go's
/// (`time.ParseDuration`, as Kubernetes and Istio flags take them), a
/// sequence of decimal numbers each with a unit (`ns`, `us`/`µs`, `ms`, `s`,
/// `m`, `h`: `250ms`, `1.5h`, `1m30s`), or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let s = text.trim();
    let syntax = || DurationError::Syntax(s.to_string());
    if s.is_empty() {
        return Err(syntax());
    }
    if let Ok(secs) = s.parse::<f64>() {
        return Duration::try_from_secs_f64(secs).map_err(|_| DurationError::Range(s.to_string()));
    }
    let mut total = 0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let num_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let (num, tail) = rest.split_at(num_len);
        let n: f64 = num.parse().map_err(|_| syntax())?;
        let unit_len = tail.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let scale = match unit {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "" => return Err(syntax()),
            _ => return Err(DurationError::Unit { text: s.to_string(), unit: unit.to_string() }),
        };
        total += n * scale;
        rest = tail;
    }
    Duration::try_from_secs_f64(total).map_err(|_| DurationError::Range(s.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    fn at(secs: u64, millis: u64) -> String {
        rfc3339(UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_millis(millis))
    }

    #[test]
    fn formats_known_instants() {
        assert_eq!(at(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(at(951_782_400, 5), "2000-02-29T00:00:00.005Z"); // leap day
        assert_eq!(at(1_700_000_000, 123), "2023-11-14T22:13:20.123Z");
        assert_eq!(at(4_107_542_399, 999), "2100-02-28T23:59:59.999Z"); // 2100 is not leap
        assert_eq!(at(4_107_542_400, 0), "2100-03-01T00:00:00.000Z");
        assert_eq!(rfc3339_secs(UNIX_EPOCH + Duration::from_millis(1_700_000_000_999)), "2023-11-14T22:13:20Z");
        assert_eq!(rfc3339(UNIX_EPOCH - Duration::from_secs(5)), "1970-01-01T00:00:00.000Z");
    }

    #[test]
    fn one_duration_grammar() {
        let ok = |s: &str| parse_duration(s).unwrap();
        assert_eq!(ok("30s"), Duration::from_secs(30));
        assert_eq!(ok("250ms"), Duration::from_millis(250));
        assert_eq!(ok("5m"), Duration::from_secs(300));
        assert_eq!(ok("1h"), Duration::from_secs(3600));
        assert_eq!(ok("1.5h"), Duration::from_secs(5400));
        assert_eq!(ok("1m30s"), Duration::from_secs(90));
        assert_eq!(ok("2h45m10s"), Duration::from_secs(9910));
        assert_eq!(ok("100us"), Duration::from_micros(100));
        assert_eq!(ok("15"), Duration::from_secs(15));
        assert_eq!(ok("0"), Duration::ZERO);
        assert_eq!(ok(" 10s "), Duration::from_secs(10));
        for bad in ["", "s", "5 parsecs", "1d", "10x", "1m30", "-5s", "1e999", "."] {
            assert!(parse_duration(bad).is_err(), "{bad:?} parsed");
        }
        assert_eq!(
            parse_duration("1d").unwrap_err().to_string(),
            "\"1d\": unknown unit \"d\"; use ns, us, ms, s, m or h"
        );
    }
}
