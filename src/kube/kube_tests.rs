use super::parse_duration;
use std::time::Duration;

#[test]
fn durations() {
    assert_eq!(parse_duration("15s"), Ok(Duration::from_secs(15)));
    assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
    assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
    assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
    assert!(parse_duration("3h").is_err());
    assert!(parse_duration("x").is_err());
}
