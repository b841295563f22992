//! Selective watch: which of a registry's services a watcher reads.
//!
//! By default a watcher reads every service (Higress's behaviour). An
//! McpBridge registry entry may opt in to reading only some
//! ([`WatchSpec`], the meshbridge-only field `meshbridgeWatch`):
//!
//! - `mode: referenced`: the services whose host some route names (the
//!   binary computes the set from its Ingresses and sends every new one down
//!   a `watch` channel, so the selection changes without a restart);
//! - `include: [regex…]`: the services whose host matches one of the
//!   regular expressions (anchored at both ends);
//! - both: the union.
//!
//! A watcher asks [`Selection::wants`] with the host it gives the service,
//! before it reads the service's instances, and waits on
//! [`Selector::changed`] to pick up a new referenced set. Hosts are matched
//! ignoring ASCII case, as routes name them.

use std::collections::BTreeSet;
use std::sync::Arc;

use regex::RegexSet;
use tokio::sync::watch;

use crate::watcher::RegistryError;

/// How a registry entry selects its services (validated config).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WatchSpec {
    pub mode: WatchMode,
    /// Regular expressions over service hosts, matched whole.
    pub include: Vec<String>,
}

/// `meshbridgeWatch.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WatchMode {
    /// Every service, or with `include` only the matching ones.
    #[default]
    All,
    /// The services routes reference, plus those `include` matches.
    Referenced,
}

impl WatchMode {
    pub fn parse(s: &str) -> Option<WatchMode> {
        match s {
            "all" => Some(WatchMode::All),
            "referenced" => Some(WatchMode::Referenced),
            _ => None,
        }
    }
}

/// Hosts routes reference, ASCII-lowercased.
pub type Referenced = Arc<BTreeSet<String>>;

/// Compile `include` into one set, each pattern anchored (matched against
/// the whole host). The error names the index of the first bad pattern.
pub fn compile_include(include: &[String]) -> Result<RegexSet, (usize, String)> {
    for (i, p) in include.iter().enumerate() {
        // Alone first: `a)|(b` would otherwise escape the anchoring group.
        if let Err(e) = regex::Regex::new(p).and_then(|_| regex::Regex::new(&format!("^(?:{p})$"))) {
            return Err((i, e.to_string()));
        }
    }
    RegexSet::new(include.iter().map(|p| format!("^(?:{p})$"))).map_err(|e| (0, e.to_string()))
}

/// One view of the selection, cheap to ask many times.
#[derive(Clone)]
pub struct Selection {
    mode: WatchMode,
    include: Option<Arc<RegexSet>>,
    referenced: Referenced,
}

impl Selection {
    /// Every service.
    pub fn all() -> Selection {
        Selection { mode: WatchMode::All, include: None, referenced: Referenced::default() }
    }

    /// Whether every service is selected, so a watcher need not ask.
    pub fn is_all(&self) -> bool {
        self.mode == WatchMode::All && self.include.is_none()
    }

    /// Whether the service with this host is read and served.
    pub fn wants(&self, host: &str) -> bool {
        if self.is_all() {
            return true;
        }
        if self.mode == WatchMode::Referenced {
            let found = if host.bytes().any(|b| b.is_ascii_uppercase()) {
                self.referenced.contains(&host.to_ascii_lowercase())
            } else {
                self.referenced.contains(host)
            };
            if found {
                return true;
            }
        }
        self.include.as_ref().is_some_and(|set| set.is_match(host))
    }

    /// Whether some referenced host starts with `prefix` (ASCII case
    /// ignored): for registries that know a service's host only in part
    /// before reading it (Dubbo interfaces, whose version and group come
    /// from the providers).
    pub fn may_want_prefix(&self, prefix: &str) -> bool {
        if self.is_all() || self.include.is_some() {
            return true;
        }
        let prefix = prefix.to_ascii_lowercase();
        self.referenced.range(prefix.clone()..).next().is_some_and(|h| h.starts_with(&prefix))
    }
}

/// A watcher's live selection: the static part from its spec and the
/// referenced hosts, which change while it runs.
pub struct Selector {
    mode: WatchMode,
    include: Option<Arc<RegexSet>>,
    referenced: Option<watch::Receiver<Referenced>>,
}

impl Selector {
    /// Every service, always (no `meshbridgeWatch`).
    pub fn all() -> Selector {
        Selector { mode: WatchMode::All, include: None, referenced: None }
    }

    /// The selection `spec` asks for, with the referenced hosts read from
    /// `referenced` (used only in `referenced` mode).
    pub fn new(
        registry: &str,
        spec: Option<&WatchSpec>,
        referenced: watch::Receiver<Referenced>,
    ) -> Result<Selector, RegistryError> {
        let Some(spec) = spec else { return Ok(Selector::all()) };
        let include = if spec.include.is_empty() {
            None
        } else {
            let set = compile_include(&spec.include).map_err(|(i, reason)| RegistryError::Config {
                registry: registry.to_string(),
                field: format!("meshbridgeWatch.include[{i}]"),
                reason,
            })?;
            Some(Arc::new(set))
        };
        let referenced = (spec.mode == WatchMode::Referenced).then_some(referenced);
        Ok(Selector { mode: spec.mode, include, referenced })
    }

    /// The selection now; marks it seen, so [`changed`](Self::changed)
    /// waits for the next one.
    pub fn current(&mut self) -> Selection {
        let referenced = match &mut self.referenced {
            Some(rx) => rx.borrow_and_update().clone(),
            None => Referenced::default(),
        };
        Selection { mode: self.mode, include: self.include.clone(), referenced }
    }

    /// Wait until the referenced set changes (forever when it cannot).
    pub async fn changed(&mut self) {
        match &mut self.referenced {
            Some(rx) => {
                if rx.changed().await.is_err() {
                    // The binary dropped the sender: the watcher is stopping.
                    std::future::pending::<()>().await;
                }
            }
            None => std::future::pending::<()>().await,
        }
    }

    /// Whether this selector never changes and selects everything.
    pub fn is_all(&self) -> bool {
        self.mode == WatchMode::All && self.include.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn referenced(hosts: &[&str]) -> (watch::Sender<Referenced>, watch::Receiver<Referenced>) {
        watch::channel(Arc::new(hosts.iter().map(|h| h.to_string()).collect()))
    }

    #[test]
    fn no_spec_selects_everything() {
        let (_tx, rx) = referenced(&[]);
        let mut sel = Selector::new("r", None, rx).unwrap();
        assert!(sel.is_all());
        assert!(sel.current().wants("anything.dc1.consul"));
    }

    #[test]
    fn referenced_hosts_ignore_case_and_include_adds() {
        let (tx, rx) = referenced(&["web.default-group.public.nacos"]);
        let spec = WatchSpec { mode: WatchMode::Referenced, include: vec!["pay-.*\\.dc1\\.consul".into()] };
        let mut sel = Selector::new("r", Some(&spec), rx).unwrap();
        let now = sel.current();
        assert!(now.wants("web.DEFAULT-GROUP.public.nacos"));
        assert!(now.wants("pay-api.dc1.consul"));
        assert!(!now.wants("xpay-api.dc1.consul"), "anchored at the start");
        assert!(!now.wants("pay-api.dc1.consul.evil"), "anchored at the end");
        assert!(!now.wants("api.dc1.consul"));
        tx.send(Arc::new(["api.dc1.consul".to_string()].into())).unwrap();
        assert!(sel.current().wants("api.dc1.consul"));
        assert!(!sel.current().wants("web.DEFAULT-GROUP.public.nacos"));
    }

    #[test]
    fn all_mode_with_include_is_a_name_filter() {
        let (_tx, rx) = referenced(&["api.dc1.consul"]);
        let spec = WatchSpec { mode: WatchMode::All, include: vec!["web|shop".into()] };
        let now = Selector::new("r", Some(&spec), rx).unwrap().current();
        assert!(!now.is_all());
        assert!(now.wants("web") && now.wants("shop"));
        assert!(!now.wants("api.dc1.consul"), "references count only in referenced mode");
    }

    #[test]
    fn prefixes_for_partly_known_hosts() {
        let (_tx, rx) = referenced(&["providers:com.foo.greeter:1.0.0:.dubbo"]);
        let spec = WatchSpec { mode: WatchMode::Referenced, include: vec![] };
        let now = Selector::new("r", Some(&spec), rx).unwrap().current();
        assert!(now.may_want_prefix("providers:com.foo.Greeter:"));
        assert!(!now.may_want_prefix("providers:com.foo.Other:"));
    }

    #[test]
    fn a_bad_pattern_is_named() {
        let (_tx, rx) = referenced(&[]);
        let spec = WatchSpec { mode: WatchMode::All, include: vec!["ok".into(), "(".into()] };
        let err = Selector::new("r", Some(&spec), rx).err().unwrap();
        assert!(err.to_string().starts_with("r: meshbridgeWatch.include[1]: "), "{err}");
    }

    #[tokio::test]
    async fn changed_wakes_on_a_new_referenced_set() {
        let (tx, rx) = referenced(&[]);
        let spec = WatchSpec { mode: WatchMode::Referenced, include: vec![] };
        let mut sel = Selector::new("r", Some(&spec), rx).unwrap();
        let _ = sel.current();
        tx.send(Arc::new(["a".to_string()].into())).unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(1), sel.changed()).await.unwrap();
        assert!(sel.current().wants("a"));
    }
}
