//! Canary Ingresses: `canary: "true"` plus `canary-by-header` (with
//! `-value` or `-pattern`), `canary-by-cookie` and `canary-weight` (out of
//! `canary-weight-total`), under `higress.io/` or
//! `nginx.ingress.kubernetes.io/`.
//!
//! As in Higress (`ApplyCanaryIngress`, `ApplyByHeader`, `ApplyByWeight`),
//! a canary Ingress makes no route of its own. Each of its paths finds the
//! non-canary route with the same host, path type and path; without one the
//! path is ignored, here with a warning (Higress only logs at debug). The
//! canary's routes copy that route's matches and rewrite and send to the
//! canary's backend:
//!
//! - **Header.** `H: always` → canary; with `canary-by-header-value: V`,
//!   `H: V` → canary instead; with `canary-by-header-pattern: P`, a value in
//!   which the RE2 regex `P` finds a match → canary (Istio's `regex` must
//!   match the whole value, so it becomes `.*(?:P).*`, as Higress's
//!   `.*P.*`). Higress's value rule also takes `always`; ingress-nginx's
//!   does not, and neither does this one.
//! - **Cookie.** Istio has no cookie match, so, as Higress does, a regex
//!   over the `cookie` header: `C=always` → canary.
//! - **Weight.** The main route's destinations and the canary's share the
//!   traffic `total − W` to `W`, written as whole percentages (Higress
//!   normalises to 100 as well).
//!
//! Precedence is header, then cookie, then weight: the header routes come
//! first, then the cookie routes, then the main route. Higress keeps only
//! the highest rule an Ingress has; this keeps every valid one, as
//! ingress-nginx does, so `H: never` (and `C=never` before a weight) has to
//! send to the main service explicitly, through a route of its own that
//! copies the main route.

use std::collections::BTreeMap;

use super::annotations::{Canary, CanaryWeight, HeaderRule};
use super::{Candidate, Parsed, PathKey, Rank, Translator, regex_escape};
use crate::translate::model::{Headers, HttpRoute, RouteDestination, StringMatch};
use crate::translate::warning::{Reason, Warning};

/// A `canary-weight` to apply once every header and cookie route is made,
/// so that a `never` route copies the main route's destinations before any
/// canary joins them.
pub(super) struct PendingWeight {
    id: String,
    host: String,
    key: PathKey,
    canary: Vec<RouteDestination>,
    /// The canary's own header control.
    headers: Option<Headers>,
    weight: CanaryWeight,
}

impl Translator<'_> {
    /// Attach every path of the canary Ingress `ing` to its main route.
    pub(super) fn canary(&mut self, ing: &Parsed, rules: &Canary, weights: &mut Vec<PendingWeight>) {
        let warn = |reason, detail: String| Warning::new(format!("Ingress {}", ing.id), reason, detail);
        if ing.ingress.spec.default_backend.is_some() {
            let detail = "canary Ingress: defaultBackend ignored (only paths attach to a main route)".to_owned();
            self.warnings.push(warn(Reason::InvalidIngress, detail));
        }
        let p = &ing.ann.policy;
        let copied = [
            ("redirects", p.redirect.is_some() || p.ssl_redirect || p.app_root.is_some()),
            ("timeout", p.timeout.is_some()),
            ("retries", p.retries.is_some()),
            ("upstream-vhost", p.authority.is_some()),
            ("CORS", p.cors.is_some()),
            ("mirror", p.mirror.is_some()),
            ("source ranges", p.source_ranges.is_some()),
            ("rate limit", p.rate_limit.is_some()),
            ("default-backend", p.default_backend.is_some()),
        ];
        let ignored: Vec<&str> = copied.iter().filter(|(_, set)| *set).map(|(what, _)| *what).collect();
        if !ignored.is_empty() {
            let detail = format!(
                "canary Ingress: {} ignored (its routes take the main route's; only header control is its own)",
                ignored.join(", ")
            );
            self.warnings.push(warn(Reason::InvalidIngress, detail));
        }
        self.each_path(ing, |t, host, index, p| {
            let Some(key) = t.path_key(ing, host, p) else { return };
            let raw = p.path.as_deref().filter(|p| !p.is_empty()).unwrap_or("/");
            let canary = match t.destinations(ing, &p.backend) {
                Ok(d) => d,
                Err(why) => {
                    let detail = format!("canary path {raw} on host {host} left out: {why}");
                    return t.warnings.push(warn(Reason::InvalidIngress, detail));
                }
            };
            let routes = t.hosts.entry(host.to_owned()).or_default();
            let main = routes.routes.iter().find(|c| c.rank == Rank::Main && c.path.as_ref() == Some(&key));
            let Some(main) = main.map(|c| c.route.clone()) else {
                let detail = format!(
                    "canary path {raw} on host {host} has no non-canary route with the same host, path and \
                     pathType; ignored"
                );
                return t.warnings.push(warn(Reason::InvalidIngress, detail));
            };
            let name = |rule: &str| format!("{}-{}-{index}-canary-{rule}", ing.namespace, ing.name);
            // Higress: a canary's routes copy the main route, all but its
            // header control, which is the canary's own.
            let to_canary = (canary.as_slice(), ing.ann.policy.headers.as_ref());
            let to_main = (main.route.as_slice(), main.headers.as_ref());
            let mut add = |rank, rule: &str, header: &str, value: StringMatch, (to, headers): Target<'_>| {
                let route = routed(&main, name(rule), header, value, to, headers);
                routes.routes.push(Candidate { path: Some(key.clone()), rank, route });
            };
            let later_rules = rules.cookie.is_some() || rules.weight.is_some_and(|w| w.weight > 0);
            if let Some(h) = &rules.header {
                let always = match &h.rule {
                    HeaderRule::AlwaysNever => StringMatch::Exact("always".into()),
                    HeaderRule::Value(v) => StringMatch::Exact(v.clone()),
                    HeaderRule::Pattern(p) => StringMatch::Regex(format!(".*(?:{p}).*")),
                };
                add(Rank::Header, "header", &h.name, always, to_canary);
                if h.rule == HeaderRule::AlwaysNever && later_rules {
                    add(Rank::Header, "header-never", &h.name, StringMatch::Exact("never".into()), to_main);
                }
            }
            if let Some(c) = &rules.cookie {
                add(Rank::Cookie, "cookie", "cookie", cookie_regex(c, "always"), to_canary);
                if rules.weight.is_some_and(|w| w.weight > 0) {
                    add(Rank::Cookie, "cookie-never", "cookie", cookie_regex(c, "never"), to_main);
                }
            }
            if let Some(weight) = rules.weight {
                let headers = ing.ann.policy.headers.clone();
                weights.push(PendingWeight { id: ing.id.clone(), host: host.to_owned(), key, canary, headers, weight });
            }
        });
    }

    /// Split each main route with its canary's weight; a second canary
    /// weight on the same route is a conflict, and the older one stands.
    pub(super) fn apply_canary_weights(&mut self, weights: Vec<PendingWeight>) {
        let mut split: BTreeMap<(String, PathKey), String> = BTreeMap::new();
        for w in weights {
            let at = (w.host.clone(), w.key.clone());
            if let Some(owner) = split.get(&at) {
                self.warnings.push(Warning::new(
                    format!("Ingress {}", w.id),
                    Reason::IngressConflict,
                    format!("canary weight on path {} of host {} conflicts with {owner}; ignored", w.key.1, w.host),
                ));
                continue;
            }
            let Some(main) = self
                .hosts
                .get_mut(&w.host)
                .and_then(|r| r.routes.iter_mut().find(|c| c.rank == Rank::Main && c.path.as_ref() == Some(&w.key)))
            else {
                continue;
            };
            // A redirect answers every request of the route: nothing to split.
            if main.route.redirect.is_some() {
                continue;
            }
            // Higress (`ApplyByWeight`): each side keeps its own header
            // control on its destination; a main route with several
            // destinations keeps its own on the route, for both sides.
            let main = &mut main.route;
            let mut own = main.route.clone();
            if let [only] = own.as_mut_slice() {
                only.headers = main.headers.take();
            }
            let canary: Vec<RouteDestination> =
                w.canary.iter().map(|d| RouteDestination { headers: w.headers.clone(), ..d.clone() }).collect();
            main.route = weighted(&own, &canary, w.weight);
            split.insert(at, w.id);
        }
    }
}

/// Where a canary's route sends, and the header control it has.
type Target<'a> = (&'a [RouteDestination], Option<&'a Headers>);

/// A copy of `main` that also requires `header` to match `value`, sends to
/// `to` (unless `main` redirects) and has `headers`.
fn routed(
    main: &HttpRoute,
    name: String,
    header: &str,
    value: StringMatch,
    to: &[RouteDestination],
    headers: Option<&Headers>,
) -> HttpRoute {
    let matches = main
        .matches
        .iter()
        .map(|m| {
            let mut m = m.clone();
            m.headers.insert(header.to_owned(), value.clone());
            m
        })
        .collect();
    let route = if main.redirect.is_some() { Vec::new() } else { to.to_vec() };
    HttpRoute { name, matches, route, headers: headers.cloned(), ..main.clone() }
}

/// A `cookie` header holding `name=value` as one of its cookies (Higress's
/// pattern, whose `^…$` Istio's whole-value match makes implicit).
fn cookie_regex(name: &str, value: &str) -> StringMatch {
    StringMatch::Regex(format!(r"(.*;\s*)?{}={value}(;.*)?", regex_escape(name)))
}

/// `main` and `canary` sharing the traffic `total − weight` to `weight`, as
/// whole percentages adding up to 100 (largest remainders round up). Each
/// side keeps its own split between its destinations.
fn weighted(main: &[RouteDestination], canary: &[RouteDestination], w: CanaryWeight) -> Vec<RouteDestination> {
    let total = f64::from(w.total);
    let main_share = f64::from(w.total - w.weight) / total;
    let canary_share = f64::from(w.weight) / total;
    let mut exact: Vec<(RouteDestination, f64)> = Vec::new();
    for (list, share) in [(main, main_share), (canary, canary_share)] {
        // Istio: one destination takes all; several without weights split evenly.
        let raw: Vec<f64> = if list.len() == 1 {
            vec![1.0]
        } else if list.iter().all(|d| d.weight.is_none()) {
            vec![1.0; list.len()]
        } else {
            list.iter().map(|d| f64::from(d.weight.unwrap_or(0))).collect()
        };
        let sum: f64 = raw.iter().sum();
        for (d, r) in list.iter().zip(raw) {
            let part = if sum > 0.0 { 100.0 * share * r / sum } else { 0.0 };
            exact.push((d.clone(), part));
        }
    }
    let mut whole: Vec<u32> = exact.iter().map(|(_, p)| p.floor() as u32).collect();
    let mut short = 100u32.saturating_sub(whole.iter().sum());
    let mut by_remainder: Vec<usize> = (0..exact.len()).collect();
    by_remainder.sort_by(|&a, &b| (exact[b].1 - exact[b].1.floor()).total_cmp(&(exact[a].1 - exact[a].1.floor())));
    for i in by_remainder.into_iter().filter(|&i| exact[i].1 > 0.0) {
        if short == 0 {
            break;
        }
        whole[i] += 1;
        short -= 1;
    }
    exact.into_iter().zip(whole).map(|((d, _), w)| RouteDestination { weight: Some(w), ..d }).collect()
}
