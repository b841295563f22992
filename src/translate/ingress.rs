//! Kubernetes Ingress → Istio `Gateway`, `VirtualService`s and
//! `DestinationRule`s, the way Higress converts them
//! (`pkg/ingress/kube/ingressv1/controller.go`), as one pure function.
//!
//! - **Class.** `kubernetes.io/ingress.class` wins over
//!   `spec.ingressClassName`. An empty option takes every Ingress. The option
//!   `higress` (Higress's default class) also takes Ingresses with no class;
//!   any other option only takes Ingresses that name it.
//! - **Gateway.** One, `{gateway_namespace}/{gateway_name}`, selecting
//!   Higress's gateway pods: `higress: {gateway_namespace}-{gateway_name}`
//!   (Higress's `--gatewaySelectorKey`/`--gatewaySelectorValue` defaults,
//!   `higress` / `higress-system-higress-gateway`). An HTTP server on 80 for
//!   every routed host, and an HTTPS server on 443 per TLS Secret (and per
//!   client CA, see below). A Secret
//!   in the gateway's namespace is named plainly in `credentialName`, one
//!   elsewhere (an Ingress's Secret lives in the Ingress's namespace) as
//!   `kubernetes-gateway://{namespace}/{name}`: Istio's own cross-namespace
//!   form, which `translate::gateway` reads too (it does not read
//!   `kubernetes://`). Whether the gateway may read that Secret is Pilot's
//!   call. A Secret not in `known_secrets` leaves its server out.
//! - **Routes.** One VirtualService per host, in the gateway namespace. A
//!   `Prefix` path (and `ImplementationSpecific`, as in Higress) matches by
//!   path element: `/foo` becomes `exact: /foo` plus `prefix: /foo/`; `/`
//!   stays `prefix: /`. With `use-regex`, `full-path-regex` or a
//!   `rewrite-target` (Higress's rule), a path is a `regex` instead
//!   (`PATH.*` or `PATH$`). Order (Higress `SortHTTPRoutes`): Exact, then
//!   Prefix, then regex, longer paths first, then the `/` catch-all, then
//!   the default backend.
//!   The same (host, type, path) from two Ingresses: the older one wins
//!   (`creationTimestamp`, missing counts as oldest as in Higress, then
//!   namespace/name) and the other is reported.
//! - **Backends.** A Service becomes `{name}.{namespace}.svc.cluster.local`.
//!   A Service port given by name cannot be resolved without the Service, so
//!   the destination has no port (Istio then uses the Service's only port)
//!   and a warning says so. The McpBridge resource backend takes its
//!   destinations from `higress.io/destination`; subsets get a
//!   DestinationRule whose subset `v1` selects endpoints labelled
//!   `version: v1` (Higress generates no subsets itself; this is the Istio
//!   convention, and registry instance metadata become endpoint labels).
//! - **defaultBackend.** As in Higress: a catch-all route, last, on `*` and
//!   on every host of the same Ingress that has no `/` Prefix path.
//! - **Canary.** An Ingress with `canary: "true"` makes no routes, servers
//!   or default backend of its own: each of its paths attaches to the
//!   non-canary route of the same host, path and type (see [`canary`]).
//! - **Policy.** Redirects, timeout, retries, header control,
//!   `upstream-vhost` and CORS set fields of each route of the Ingress (an
//!   HTTPS redirect and `app-root` add routes of their own; see [`policy`]).
//!   `default-backend` and `custom-http-errors` set a route field only the
//!   standalone gateway reads (see [`fallback`]). The local rate limit is a
//!   route field too, which istiod's gateway gets as an EnvoyFilter
//!   patching the route by name (see [`limit`]).
//! - **Client certificates.** `auth-tls-secret` puts the Ingress's TLS
//!   hosts on an HTTPS server that asks for them: `MUTUAL` where istiod
//!   finds the CA, and the CA Secret for the standalone gateway (see
//!   [`downstream`]).

mod annotations;
mod canary;
mod downstream;
mod fallback;
mod limit;
mod policy;
mod syntax;
mod traffic;
mod upstream;

#[cfg(test)]
mod downstream_tests;
#[cfg(test)]
mod fallback_tests;
#[cfg(test)]
mod ingress_tests;
#[cfg(test)]
mod limit_tests;
#[cfg(test)]
mod policy_route_tests;
#[cfg(test)]
mod upstream_tls_tests;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;

use meshbridge_registries::clip;
use serde::Serialize;

use self::annotations::{Conditions, DESTINATION, IngressAnnotations, RegexPath, RewriteRule};
use self::policy::RoutePolicy;
use self::traffic::MirrorTarget;
use super::model::{
    AuthorizationAction, AuthorizationPolicySpec, AuthorizationRule, DefaultBackend, Destination, DestinationRuleSpec,
    GatewaySpec, HttpMatch, HttpRoute, IstioObject, Percent, PortSelector, RegexRewrite, Rewrite, RouteDestination,
    RuleFrom, RuleOperation, RuleSource, RuleTo, Server, ServerPort, SourceRanges, Spec, StringMatch, Subset,
    TrafficPolicy, VirtualServiceSpec, WorkloadSelector,
};
use super::names::{sanitize, short_hash};
use super::warning::{Reason, Warning};
use crate::model::IngressDoc;
use crate::model::ingress::{Backend, CLASS_ANNOTATION, HttpPath, Ingress};

pub use self::annotations::{DestinationError, McpDestination, parse_destination};

/// Higress's default ingress class, which also takes class-less Ingresses.
pub const DEFAULT_INGRESS_CLASS: &str = "higress";
const HTTP_PORT: u32 = 80;
const HTTPS_PORT: u32 = 443;

/// Why an Ingress backend cannot be routed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// `service.name` is not a DNS-1123 label (shown clipped).
    #[error("backend service name {0:?} is not a valid Service name")]
    ServiceName(String),
    /// `service.port.number` outside 1–65535.
    #[error("backend service port {0} is not from 1 to 65535")]
    PortRange(i64),
    /// Neither `service.port.number` nor `service.port.name`.
    #[error("backend service {0} has no port")]
    NoPort(String),
    /// Neither `service` nor `resource`.
    #[error("backend has neither service nor resource")]
    Empty,
    /// A `resource` backend other than the McpBridge named `default`.
    #[error(
        "backend resource {group}/{kind} {name:?} is not supported (only networking.higress.io/McpBridge \"default\")"
    )]
    Resource { group: String, kind: String, name: String },
    /// An McpBridge backend without `higress.io/destination`.
    #[error("an McpBridge backend needs annotation {DESTINATION}")]
    NoDestination,
    /// `higress.io/destination` does not parse.
    #[error("annotation {DESTINATION}: {0}")]
    Destination(DestinationError),
}

/// What the translation needs besides the Ingresses.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IngressOptions {
    /// `None` or `""`: every Ingress. The caller picks the default
    /// ([`DEFAULT_INGRESS_CLASS`]).
    pub ingress_class: Option<String>,
    /// e.g. `higress-system`; also where the VirtualServices and
    /// DestinationRules go.
    pub gateway_namespace: String,
    /// e.g. `higress-gateway`.
    pub gateway_name: String,
    /// (namespace, name) of the TLS Secrets that exist.
    pub known_secrets: BTreeSet<(String, String)>,
    /// (namespace, name) of the Secrets with CA certificates
    /// (`auth-tls-secret`).
    pub known_ca_secrets: BTreeSet<(String, String)>,
    /// Registry service hosts by their ASCII-lowercase form: a
    /// `higress.io/destination` host names a service ignoring case (DNS
    /// names are case-insensitive, and Consul and Eureka hosts are
    /// lowercased), and routes use the service's own spelling.
    /// A persistent map, so handing the current one over costs nothing.
    pub service_hosts: imbl::OrdMap<String, String>,
}

/// The translated Ingresses.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct IngressTranslation {
    /// Gateways, VirtualServices and DestinationRules, sorted by
    /// (kind, namespace, name).
    pub objects: Vec<IstioObject>,
    /// Everything left out, and why, in the order found.
    pub warnings: Vec<Warning>,
    /// `higress.io/*` and `nginx.ingress.kubernetes.io/*` annotations that
    /// were not understood, over all Ingresses of our class.
    pub ignored_annotations: u64,
    /// Registry service names looked up outside route destinations (mirror
    /// targets), lowercase, found or not: when one appears or goes, the
    /// translation must run again.
    #[serde(skip)]
    pub looked_up: BTreeSet<String>,
}

/// Translate the Ingresses of our class.
pub fn translate(ingresses: &[IngressDoc], opts: &IngressOptions) -> IngressTranslation {
    let mut t = Translator {
        opts,
        hosts: BTreeMap::new(),
        tls_hosts: BTreeMap::new(),
        policies: BTreeMap::new(),
        warnings: Vec::new(),
        ignored_annotations: 0,
        looked_up: BTreeSet::new(),
        authorization: Vec::new(),
        ranged: Vec::new(),
    };
    let mut ours = Vec::new();
    for doc in ingresses {
        let id = format!("{}/{}", doc.namespace, doc.name);
        let ingress = match &doc.ingress {
            Ok(i) => i.clone(),
            Err(e) => {
                t.warnings.push(Warning::new(
                    format!("Ingress {id}"),
                    Reason::InvalidIngress,
                    format!("{e}; left out"),
                ));
                continue;
            }
        };
        if !class_matches(&ingress, opts.ingress_class.as_deref()) {
            continue;
        }
        let created = match ingress.metadata.created() {
            None => None,
            Some(Ok(t)) => Some(t),
            Some(Err(e)) => {
                t.warnings.push(Warning::new(format!("Ingress {id}"), Reason::InvalidIngress, e.to_string()));
                None
            }
        };
        let mut ann = IngressAnnotations::read(&ingress.metadata, &doc.namespace);
        t.client_certificate(&id, &mut ann);
        for key in &ann.ignored {
            t.ignored_annotations += 1;
            t.warnings.push(Warning::new(
                format!("Ingress {id}"),
                Reason::IgnoredAnnotation,
                format!("annotation {key} is not implemented; the Ingress is served without it"),
            ));
        }
        ours.push(Parsed { id, namespace: doc.namespace.clone(), name: doc.name.clone(), created, ingress, ann });
    }
    // Oldest first, so that the first claim on a path is the one that stands.
    ours.sort_by(|a, b| (a.created, &a.namespace, &a.name).cmp(&(b.created, &b.namespace, &b.name)));

    for ing in &ours {
        t.warnings.extend(
            ing.ann
                .warnings
                .iter()
                .map(|w| Warning::new(format!("Ingress {}", ing.id), Reason::InvalidIngress, w.clone())),
        );
        if let Some(fallback) = &ing.ann.policy.default_backend {
            t.warnings.push(Warning::new(
                format!("Ingress {}", ing.id),
                Reason::StandaloneOnly,
                format!(
                    "{} / custom-http-errors are served by the standalone gateway only: stock Istio's \
                     VirtualService has no field for them (Higress's fork has fallbackClusters and \
                     internalActiveRedirect), so a gateway fed by istiod neither falls back nor replaces answers",
                    fallback.key
                ),
            ));
        }
        if ing.ingress.spec.rules.is_empty() && ing.ingress.spec.default_backend.is_none() {
            t.warnings.push(Warning::new(
                format!("Ingress {}", ing.id),
                Reason::InvalidIngress,
                "neither rules nor defaultBackend; nothing to route",
            ));
        }
        if let Some(ca) = &ing.ann.client_ca {
            let has_tls = !ing.ingress.spec.tls.is_empty();
            downstream::check_unused(&ing.id, ca, ing.ann.canary.is_some(), has_tls, &mut t.warnings);
        }
        if ing.ann.canary.is_none() {
            t.tls(ing);
            t.rules(ing);
            if let Some(ranges) = &ing.ann.policy.source_ranges {
                t.source_range_policy(ing, ranges);
            }
        }
    }
    // After every path is known, as Higress does: a host's own `/` path
    // takes precedence over any Ingress's defaultBackend.
    for ing in ours.iter().filter(|i| i.ann.canary.is_none()) {
        t.default_backend(ing);
    }
    // Canaries last, oldest first, as Higress applies them.
    let mut weights = Vec::new();
    for ing in &ours {
        if let Some(rules) = &ing.ann.canary {
            t.canary(ing, rules, &mut weights);
        }
    }
    t.apply_canary_weights(weights);
    t.finish()
}

/// An Ingress of our class, read.
struct Parsed {
    /// `namespace/name`, for messages.
    id: String,
    namespace: String,
    name: String,
    created: Option<Timestamp>,
    ingress: Arc<Ingress>,
    ann: IngressAnnotations,
}

/// Higress's `shouldProcessIngressWithClass`, without IngressClass objects
/// (an IngressClass is matched by the name the Ingress gives, which is the
/// same test).
fn class_matches(ingress: &Ingress, wanted: Option<&str>) -> bool {
    let wanted = wanted.unwrap_or("");
    if wanted.is_empty() {
        return true;
    }
    let class = ingress.metadata.annotation(CLASS_ANNOTATION).or(ingress.spec.ingress_class_name.as_deref());
    match class {
        None | Some("") => wanted == DEFAULT_INGRESS_CLASS,
        Some(c) => c == wanted,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum PathKind {
    Exact,
    Prefix,
    /// `use-regex`, `full-path-regex` or a `rewrite-target` made the path
    /// a regex.
    Regex(RegexPath),
}

/// Where a route stands among the routes of one path: its HTTPS redirect,
/// a canary's header rules, then its cookie rules, then the path's own
/// (maybe weighted) route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Rank {
    /// A host's `app-root` redirect of `/`: before every route of the host.
    AppRoot,
    /// The HTTPS redirect of a route, for plain HTTP requests only.
    SslRedirect,
    Header,
    Cookie,
    Main,
}

/// Where a route of a host sits: the path type, the path, and the
/// request conditions of the Ingress ([`Conditions`]): two Ingresses on one
/// path with different conditions make two routes.
type PathKey = (PathKind, String, Conditions);

/// A route for one host, before ordering.
struct Candidate {
    /// `None` for the default backend.
    path: Option<PathKey>,
    rank: Rank,
    route: HttpRoute,
}

impl Candidate {
    /// Higress's order: Exact, then Prefix, then regex paths, each longer
    /// first; then the `/` catch-all; then the default backend. Ties keep insertion order
    /// (older Ingress first), as the sort is stable.
    /// Within a path, the routes with more request conditions first (a
    /// method, then more headers, then more query parameters); within
    /// those, canary header rules, then cookie rules, then the path's own
    /// route.
    #[allow(clippy::type_complexity)]
    fn order(&self) -> (u8, std::cmp::Reverse<usize>, std::cmp::Reverse<(bool, usize, usize)>, Rank) {
        use std::cmp::Reverse;
        if self.rank == Rank::AppRoot {
            return (0, Reverse(usize::MAX), Reverse((true, usize::MAX, usize::MAX)), self.rank);
        }
        let specific = Reverse(self.path.as_ref().map(|(_, _, c)| c.specificity()).unwrap_or_default());
        match &self.path {
            Some((PathKind::Exact, p, _)) => (0, Reverse(p.len()), specific, self.rank),
            Some((PathKind::Prefix, p, _)) if p != "/" => (1, Reverse(p.len()), specific, self.rank),
            Some((PathKind::Regex(_), p, _)) => (2, Reverse(p.len()), specific, self.rank),
            Some((PathKind::Prefix, _, _)) => (3, Reverse(0), specific, self.rank),
            None => (4, Reverse(0), specific, self.rank),
        }
    }
}

#[derive(Default)]
struct HostRoutes {
    /// The `creationTimestamp` (seconds) of the first Ingress to route this
    /// host, the oldest (Ingresses come oldest first); inside, `None` when
    /// it has none. Set once.
    created: Option<Option<i64>>,
    routes: Vec<Candidate>,
    /// (type, path, conditions) → the Ingress that holds it.
    owners: BTreeMap<PathKey, String>,
    /// The Ingress whose defaultBackend this host uses.
    default_owner: Option<String>,
    /// `app-root`: (the Ingress that set it, its route name, the path).
    app_root: Option<(String, String, String)>,
}

struct Translator<'a> {
    opts: &'a IngressOptions,
    hosts: BTreeMap<String, HostRoutes>,
    /// TLS host → its Secret, and the Ingresses serving it (each asking
    /// for client certificates or not).
    tls_hosts: BTreeMap<String, downstream::TlsHost>,
    /// Destination host → the upstream policy of the first Ingress (oldest)
    /// that routes to it with one, and that Ingress.
    policies: BTreeMap<String, (TrafficPolicy, String)>,
    warnings: Vec<Warning>,
    ignored_annotations: u64,
    looked_up: BTreeSet<String>,
    /// One AuthorizationPolicy per Ingress with source ranges.
    authorization: Vec<IstioObject>,
    /// The (host, type, path) routes the Ingress being translated made,
    /// when it has source ranges: what its AuthorizationPolicy covers.
    ranged: Vec<(String, PathKind, String)>,
}

impl Translator<'_> {
    /// The source ranges of an Ingress for istiod: an AuthorizationPolicy
    /// on the gateway's pods that DENYs, on the Ingress's hosts and paths,
    /// a client outside the allowed blocks (when there are any) and one in
    /// the denied blocks. The client is the peer address (`remoteIpBlocks`:
    /// the gateway trusts no X-Forwarded-For), as on the standalone
    /// gateway. A regex path has no AuthorizationPolicy form: said, and left
    /// open through istiod.
    fn source_range_policy(&mut self, ing: &Parsed, ranges: &SourceRanges) {
        // The paths the Ingress routes (a path another Ingress holds is
        // that one's), by host: Exact as it is, Prefix `/p` as `/p` and
        // `/p/*`, `/` as any path.
        let mut by_host: BTreeMap<String, (Vec<String>, bool)> = BTreeMap::new();
        for (host, kind, origin) in std::mem::take(&mut self.ranged) {
            let (paths, everything) = by_host.entry(host).or_default();
            match kind {
                PathKind::Exact => paths.push(origin),
                PathKind::Prefix if origin == "/" => *everything = true,
                PathKind::Prefix => {
                    let below = format!("{origin}/*");
                    paths.push(origin);
                    paths.push(below);
                }
                // Not recorded: `path` says they stay standalone-only.
                PathKind::Regex(_) => {}
            }
        }
        let to: Vec<RuleTo> = by_host
            .into_iter()
            .map(|(host, (paths, everything))| {
                let hosts = if host == "*" { Vec::new() } else { vec![host] };
                let paths = if everything { Vec::new() } else { paths };
                RuleTo { operation: RuleOperation { hosts, paths } }
            })
            .collect();
        if to.is_empty() {
            return;
        }
        let blocks = |list: &[super::model::Cidr]| -> Vec<String> {
            list.iter().map(|c| format!("{}/{}", c.address, c.prefix_len)).collect()
        };
        let mut rules = Vec::new();
        if let Some(allow) = &ranges.allow {
            // An empty allow list lets no one in: a rule with no source.
            let from = if allow.is_empty() {
                Vec::new()
            } else {
                vec![RuleFrom { source: RuleSource { not_remote_ip_blocks: blocks(allow), ..Default::default() } }]
            };
            rules.push(AuthorizationRule { from, to: to.clone() });
        }
        if !ranges.deny.is_empty() {
            let source = RuleSource { remote_ip_blocks: blocks(&ranges.deny), ..Default::default() };
            rules.push(AuthorizationRule { from: vec![RuleFrom { source }], to });
        }
        if rules.is_empty() {
            return;
        }
        let ns = &self.opts.gateway_namespace;
        let spec = AuthorizationPolicySpec {
            selector: WorkloadSelector { match_labels: self.gateway_selector() },
            action: AuthorizationAction::Deny,
            rules,
        };
        let name = format!("{}-{}-source-range", ing.namespace, ing.name);
        let mut policy = IstioObject::new(name, ns, Spec::AuthorizationPolicy(spec));
        policy.metadata.created = ing.created.map(|t| t.as_second());
        self.authorization.push(policy);
    }

    /// The labels of Higress's gateway pods, which the Gateway and the
    /// AuthorizationPolicies select.
    fn gateway_selector(&self) -> BTreeMap<String, String> {
        let value = format!("{}-{}", self.opts.gateway_namespace, self.opts.gateway_name);
        BTreeMap::from([("higress".to_owned(), value)])
    }

    fn tls(&mut self, ing: &Parsed) {
        for (i, tls) in ing.ingress.spec.tls.iter().enumerate() {
            let Some(secret) = tls.secret_name.as_deref().filter(|s| !s.is_empty()) else {
                self.warnings.push(Warning::new(
                    format!("Ingress {}", ing.id),
                    Reason::InvalidIngress,
                    format!("spec.tls[{i}] has no secretName; ignored"),
                ));
                continue;
            };
            let key = (ing.namespace.clone(), secret.to_owned());
            // Higress: a TLS entry without hosts covers every host.
            let hosts: Vec<String> = if tls.hosts.is_empty() { vec!["*".into()] } else { tls.hosts.clone() };
            if !self.opts.known_secrets.contains(&key) {
                self.warnings.push(Warning::new(
                    format!("Ingress {}", ing.id),
                    Reason::MissingSecret,
                    format!("TLS Secret {}/{secret} not found; HTTPS for {} left out", ing.namespace, hosts.join(", ")),
                ));
                continue;
            }
            for raw in hosts {
                let Some(host) = normalize_host(&raw) else {
                    self.warnings.push(Warning::new(
                        format!("Ingress {}", ing.id),
                        Reason::InvalidIngress,
                        format!("spec.tls[{i}]: {:?} is not a valid host; ignored", clip(&raw)),
                    ));
                    continue;
                };
                let claimed = self
                    .tls_hosts
                    .entry(host.clone())
                    .or_insert_with(|| downstream::TlsHost::new(key.clone(), ing.id.clone()));
                if claimed.secret != key {
                    let ((ns, s), owner) = (&claimed.secret, &claimed.owner);
                    self.warnings.push(Warning::new(
                        format!("Ingress {}", ing.id),
                        Reason::IngressConflict,
                        format!("TLS host {host} already uses Secret {ns}/{s} (Ingress {owner}); ignored"),
                    ));
                    continue;
                }
                claimed.claim(&host, &ing.id, ing.ann.client_ca.as_ref(), &mut self.warnings);
            }
        }
    }

    fn rules(&mut self, ing: &Parsed) {
        self.each_path(ing, |t, host, index, path| t.path(ing, host, index, path));
        if let Some(root) = &ing.ann.policy.app_root {
            self.app_root(ing, root);
        }
    }

    /// `app-root` on every host the Ingress has paths for. Higress keeps
    /// the last Ingress's; like a path, the oldest one's stands here and a
    /// different one is reported.
    fn app_root(&mut self, ing: &Parsed, root: &str) {
        let mut hosts = BTreeSet::new();
        for rule in ing.ingress.spec.rules.iter().filter(|r| r.http.as_ref().is_some_and(|h| !h.paths.is_empty())) {
            match rule.host.as_deref() {
                None | Some("") => {
                    hosts.insert("*".to_owned());
                }
                Some(h) => hosts.extend(normalize_host(h)),
            }
        }
        for host in hosts {
            let routes = self.hosts.entry(host.clone()).or_default();
            routes.created.get_or_insert(ing.created.map(|t| t.as_second()));
            match &routes.app_root {
                Some((_, _, path)) if path == root => {}
                Some((owner, _, path)) => self.warnings.push(Warning::new(
                    format!("Ingress {}", ing.id),
                    Reason::IngressConflict,
                    format!("app-root {} on host {host} conflicts with {} of {owner}; ignored", clip(root), clip(path)),
                )),
                None => {
                    let name = format!("{}-{}-app-root", ing.namespace, ing.name);
                    routes.app_root = Some((ing.id.clone(), name, root.to_owned()));
                }
            }
        }
    }

    /// Call `f` with (host, index, path) for every path of the Ingress on a
    /// valid host. The index counts every path, kept or not, so a route's
    /// name does not change when an earlier path is fixed or broken.
    fn each_path(&mut self, ing: &Parsed, mut f: impl FnMut(&mut Self, &str, usize, &HttpPath)) {
        let mut index = 0;
        for rule in &ing.ingress.spec.rules {
            let Some(http) = &rule.http else { continue };
            let raw_host = rule.host.as_deref().unwrap_or("");
            let host = if raw_host.is_empty() { Some("*".to_owned()) } else { normalize_host(raw_host) };
            let Some(host) = host else {
                self.warnings.push(Warning::new(
                    format!("Ingress {}", ing.id),
                    Reason::InvalidIngress,
                    format!("host {:?} is not a valid host name; rule left out", clip(raw_host)),
                ));
                index += http.paths.len();
                continue;
            };
            for path in &http.paths {
                f(self, &host, index, path);
                index += 1;
            }
        }
    }

    /// The (type, path, conditions) a path is known by, or `None` with a
    /// warning.
    fn path_key(&mut self, ing: &Parsed, host: &str, p: &HttpPath) -> Option<PathKey> {
        let raw = p.path.as_deref().filter(|p| !p.is_empty()).unwrap_or("/");
        let left_out = |why: String| path_left_out(ing, raw, host, why);
        if !raw.starts_with('/') {
            self.warnings.push(left_out("a path must start with '/'".into()));
            return None;
        }
        let kind = match (ing.ann.regex_path(raw), p.path_type.as_deref()) {
            // A regex whatever the pathType, as in Higress.
            (Some(regex), _) => match path_regex(regex, raw, ing.ann.ignore_path_case) {
                Ok(_) => PathKind::Regex(regex),
                Err(why) => {
                    self.warnings.push(left_out(why.to_string()));
                    return None;
                }
            },
            // Higress defaults a missing pathType to Prefix, as ingress-nginx does.
            (None, None | Some("Prefix" | "ImplementationSpecific")) => PathKind::Prefix,
            (None, Some("Exact")) => PathKind::Exact,
            (None, Some(other)) => {
                self.warnings.push(left_out(format!("unknown pathType {:?}", clip(other))));
                return None;
            }
        };
        // Higress trims one trailing '/' from a Prefix path: `/foo/` and
        // `/foo` are the same path.
        let origin = match kind {
            PathKind::Prefix if raw != "/" => raw.strip_suffix('/').unwrap_or(raw),
            _ => raw,
        };
        Some((kind, origin.to_owned(), ing.ann.conditions.clone()))
    }

    fn path(&mut self, ing: &Parsed, host: &str, index: usize, p: &HttpPath) {
        let Some(key) = self.path_key(ing, host, p) else { return };
        let raw = p.path.as_deref().filter(|p| !p.is_empty()).unwrap_or("/");
        let left_out = |why: String| path_left_out(ing, raw, host, why);
        let (kind, origin) = (key.0, key.1.clone());
        let origin = origin.as_str();
        let route = match self.destinations(ing, &p.backend) {
            Ok(route) => route,
            Err(why) => return self.warnings.push(left_out(why.to_string())),
        };
        let rewrite = ing.ann.rewrite.as_ref();
        if let (PathKind::Regex(regex), Some(RewriteRule::Target(target))) = (kind, rewrite) {
            let groups = path_regex(regex, origin, false).unwrap_or_default();
            if let Err(why) = check_substitution(target, groups) {
                return self.warnings.push(left_out(why.to_string()));
            }
        }
        let mirror = self.mirror_of(ing);
        let fallback = self.default_backend_of(ing);
        let routes = self.hosts.entry(host.to_owned()).or_default();
        routes.created.get_or_insert(ing.created.map(|t| t.as_second()));
        if let Some(owner) = routes.owners.get(&key) {
            self.warnings.push(Warning::new(
                format!("Ingress {}", ing.id),
                Reason::IngressConflict,
                format!("path {raw} on host {host} conflicts with {owner}; ignored"),
            ));
            return;
        }
        routes.owners.insert(key.clone(), ing.id.clone());
        let ignore_uri_case = ing.ann.ignore_path_case;
        let m = |uri| {
            let mut m = HttpMatch { uri: Some(uri), ignore_uri_case, ..Default::default() };
            ing.ann.conditions.apply(&mut m);
            m
        };
        let matches = match kind {
            PathKind::Exact => vec![m(StringMatch::Exact(origin.into()))],
            PathKind::Prefix if origin == "/" => vec![m(StringMatch::Prefix("/".into()))],
            PathKind::Prefix => {
                vec![m(StringMatch::Exact(origin.into())), m(StringMatch::Prefix(format!("{origin}/")))]
            }
            PathKind::Regex(regex) => vec![m(StringMatch::Regex(regex_pattern(regex, origin, ignore_uri_case)))],
        };
        let rewrite = rewrite.map(|r| rewrite_for(r, &matches, ignore_uri_case));
        let name = format!("{}-{}-{index}", ing.namespace, ing.name);
        let mut route = HttpRoute { name, matches, route, rewrite, ..Default::default() };
        let policy = &ing.ann.policy;
        policy.apply(&mut route);
        // A redirect answers itself: nothing goes upstream to copy.
        if let Some((to, share)) = mirror.filter(|_| route.redirect.is_none()) {
            route.mirror = Some(to);
            route.mirror_percentage = share;
        }
        if route.redirect.is_none() {
            route.default_backend = fallback.map(|(destination, codes)| DefaultBackend {
                destination,
                codes,
                headers: error_headers(ing, &p.backend, &route.route),
            });
        }
        if policy.ssl_redirect && policy.redirect.is_none() {
            let route = RoutePolicy::https_redirect_of(&route);
            routes.routes.push(Candidate { path: Some(key.clone()), rank: Rank::SslRedirect, route });
        }
        routes.routes.push(Candidate { path: Some(key), rank: Rank::Main, route });
        if policy.source_ranges.is_some() {
            if let PathKind::Regex(_) = kind {
                self.warnings.push(Warning::new(
                    format!("Ingress {}", ing.id),
                    Reason::StandaloneOnly,
                    format!(
                        "path {raw}: a regex path has no AuthorizationPolicy form, so its source ranges are \
                         enforced by the standalone gateway only"
                    ),
                ));
            } else {
                self.ranged.push((host.to_owned(), kind, origin.to_owned()));
            }
        }
    }

    fn default_backend(&mut self, ing: &Parsed) {
        let Some(backend) = &ing.ingress.spec.default_backend else { return };
        let route = match self.destinations(ing, backend) {
            Ok(route) => route,
            Err(why) => {
                return self.warnings.push(Warning::new(
                    format!("Ingress {}", ing.id),
                    Reason::InvalidIngress,
                    format!("defaultBackend left out: {why}"),
                ));
            }
        };
        let mut hosts = BTreeSet::from(["*".to_owned()]);
        for rule in &ing.ingress.spec.rules {
            match rule.host.as_deref() {
                None | Some("") => {}
                Some(h) => hosts.extend(normalize_host(h)),
            }
        }
        for host in hosts {
            let routes = self.hosts.entry(host.clone()).or_default();
            routes.created.get_or_insert(ing.created.map(|t| t.as_second()));
            // Only a `/` route without conditions catches every request.
            if routes.owners.contains_key(&(PathKind::Prefix, "/".to_owned(), Conditions::default())) {
                continue;
            }
            if let Some(owner) = &routes.default_owner {
                self.warnings.push(Warning::new(
                    format!("Ingress {}", ing.id),
                    Reason::IngressConflict,
                    format!("defaultBackend on host {host} conflicts with {owner}; ignored"),
                ));
                continue;
            }
            routes.default_owner = Some(ing.id.clone());
            let name = format!("{}-{}-default", ing.namespace, ing.name);
            routes.routes.push(Candidate {
                path: None,
                rank: Rank::Main,
                route: HttpRoute { name, route: route.clone(), ..Default::default() },
            });
        }
    }

    /// The registry service a destination host names, spelt as the service
    /// is; an unknown host is kept as written.
    fn service_host(&self, host: &str) -> String {
        let hosts = &self.opts.service_hosts;
        hosts.get(host).or_else(|| hosts.get(&host.to_ascii_lowercase())).cloned().unwrap_or_else(|| host.to_string())
    }

    /// Where the Ingress's mirror annotations send copies, with the host
    /// looked up; a registry service that does not exist is reported (once)
    /// and leaves the mirror out.
    fn mirror_of(&mut self, ing: &Parsed) -> Option<(Destination, Option<Percent>)> {
        let m = ing.ann.policy.mirror.as_ref()?;
        let destination = self.target_destination(ing, &m.key, &m.target, "mirror left out")?;
        let share = m.percentage.map(|p| Percent { value: p.into() });
        Some((destination, share))
    }

    /// The Ingress's `default-backend`, with the host looked up, and the
    /// codes whose answers it replaces.
    fn default_backend_of(&mut self, ing: &Parsed) -> Option<(Destination, Vec<u16>)> {
        let f = ing.ann.policy.default_backend.as_ref()?;
        let destination = self.target_destination(ing, &f.key, &f.target, "no default backend")?;
        Some((destination, f.codes.clone()))
    }

    /// The destination an annotation (`key`) names: a Kubernetes Service in
    /// the Ingress's namespace by default, a host as written, or a registry
    /// service, which must exist (one that does not is reported once, with
    /// `then`).
    fn target_destination(
        &mut self,
        ing: &Parsed,
        key: &str,
        target: &MirrorTarget,
        then: &str,
    ) -> Option<Destination> {
        let (host, port) = match target {
            MirrorTarget::Fqdn { host, port } => (host.clone(), Some(*port)),
            MirrorTarget::Service { namespace, name, port } => {
                let namespace = namespace.as_deref().unwrap_or(&ing.namespace);
                (super::names::service_host(namespace, name), *port)
            }
            MirrorTarget::Registry { name, port } => {
                self.looked_up.insert(name.to_ascii_lowercase());
                let hosts = &self.opts.service_hosts;
                match hosts.get(name.as_str()).or_else(|| hosts.get(&name.to_ascii_lowercase())) {
                    Some(host) => (host.clone(), *port),
                    None => {
                        let w = Warning::new(
                            format!("Ingress {}", ing.id),
                            Reason::InvalidIngress,
                            format!("annotation {key}: no registry service {:?}; {then}", clip(name)),
                        );
                        if !self.warnings.contains(&w) {
                            self.warnings.push(w);
                        }
                        return None;
                    }
                }
            }
        };
        let port = port.map(|n| PortSelector { number: n.into() });
        Some(Destination { host, subset: None, port, port_name: None })
    }

    /// Name `proxy-ssl-secret`'s Secret in the `MUTUAL` policy as stock
    /// istiod reads a DestinationRule's `credentialName`: plainly when it
    /// is in the gateway's namespace (the proxy's, where Istio looks), else
    /// as `kubernetes-gateway://{namespace}/{name}`, which the standalone
    /// gateway reads but stock istiod serves only to a Gateway allowed that
    /// Secret (Higress's fork reads its own `kubernetes-ingress://` names).
    fn client_certificate(&mut self, id: &str, ann: &mut IngressAnnotations) {
        let Some(secret) = &ann.client_secret else { return };
        let Some(tls) = ann.upstream.as_mut().and_then(|p| p.tls.as_mut()) else { return };
        let (key, ns, name) = (&secret.key, &secret.namespace, &secret.name);
        let gateway_ns = &self.opts.gateway_namespace;
        tls.credential_name =
            Some(if ns == gateway_ns { name.clone() } else { format!("kubernetes-gateway://{ns}/{name}") });
        if !self.opts.known_secrets.contains(&(ns.clone(), name.clone())) {
            self.warnings.push(Warning::new(
                format!("Ingress {id}"),
                Reason::MissingSecret,
                format!(
                    "annotation {key}: no Secret {ns}/{name} with tls.crt and tls.key; connections to the backend \
                     present no client certificate and fail"
                ),
            ));
        }
        if ns != gateway_ns {
            self.warnings.push(Warning::new(
                format!("Ingress {id}"),
                Reason::StandaloneOnly,
                format!(
                    "annotation {key}: Secret {ns}/{name} is not in the gateway's namespace {gateway_ns}; stock istiod \
                     serves a DestinationRule's credentialName only from there, so through istiod the backend gets \
                     no client certificate (copy the Secret into {gateway_ns})"
                ),
            ));
        }
    }

    /// Where a backend sends traffic, or why it cannot be routed; the
    /// Ingress's upstream policy is noted for each destination host.
    fn destinations(&mut self, ing: &Parsed, backend: &Backend) -> Result<Vec<RouteDestination>, BackendError> {
        let route = self.destinations_of(ing, backend)?;
        if let Some(policy) = &ing.ann.upstream {
            for d in &route {
                let host = &d.destination.host;
                match self.policies.get(host) {
                    None => {
                        self.policies.insert(host.clone(), (policy.clone(), ing.id.clone()));
                    }
                    Some((p, owner)) if p != policy && *owner != ing.id => self.warnings.push(Warning::new(
                        format!("Ingress {}", ing.id),
                        Reason::IngressConflict,
                        format!("upstream policy for {host} conflicts with {owner}'s; ignored"),
                    )),
                    Some(_) => {}
                }
            }
        }
        Ok(route)
    }

    fn destinations_of(&mut self, ing: &Parsed, backend: &Backend) -> Result<Vec<RouteDestination>, BackendError> {
        if let Some(svc) = &backend.service {
            if !annotations::valid_dns_label(&svc.name) {
                return Err(BackendError::ServiceName(clip(&svc.name).to_string()));
            }
            let port_name = svc.port.name.as_deref().filter(|n| !n.is_empty());
            let port = match (svc.port.number, port_name) {
                (Some(n @ 1..=65535), _) => Some(PortSelector { number: n as u32 }),
                (Some(n), _) => return Err(BackendError::PortRange(n)),
                (None, Some(name)) => {
                    self.warnings.push(Warning::new(
                        format!("Ingress {}", ing.id),
                        Reason::InvalidIngress,
                        format!(
                            "backend service {} port {name:?} is named; the route to istiod has no port, so \
                         istiod uses the Service's only port (the standalone gateway looks the name up)",
                            svc.name
                        ),
                    ));
                    None
                }
                (None, None) => return Err(BackendError::NoPort(svc.name.clone())),
            };
            let host = super::names::service_host(&ing.namespace, &svc.name);
            let port_name = port.is_none().then(|| port_name.map(str::to_owned)).flatten();
            let destination = Destination { host, subset: None, port, port_name };
            return Ok(vec![RouteDestination { destination, weight: None, headers: None }]);
        }
        let Some(resource) = &backend.resource else {
            return Err(BackendError::Empty);
        };
        if !resource.is_mcp_bridge() {
            return Err(BackendError::Resource {
                group: resource.api_group.clone().unwrap_or_default(),
                kind: resource.kind.clone(),
                name: resource.name.clone(),
            });
        }
        let list = match &ing.ann.destination {
            None => return Err(BackendError::NoDestination),
            Some(Err(e)) => return Err(BackendError::Destination(e.clone())),
            Some(Ok(list)) => list,
        };
        let single = list.len() == 1;
        Ok(list
            .iter()
            .map(|d| RouteDestination {
                destination: Destination {
                    host: self.service_host(&d.host),
                    subset: d.subset.clone(),
                    port: d.port.map(|p| PortSelector { number: p.into() }),
                    port_name: None,
                },
                weight: (!single).then_some(d.weight),
                headers: None,
            })
            .collect())
    }

    fn finish(mut self) -> IngressTranslation {
        let ns = self.opts.gateway_namespace.clone();
        let gateway_ref = format!("{ns}/{}", self.opts.gateway_name);
        let mut objects = Vec::new();

        let routed: Vec<String> =
            self.hosts.iter().filter(|(_, r)| !r.routes.is_empty()).map(|(h, _)| h.clone()).collect();
        // Higress puts a host's app-root redirect before all its routes.
        for host in &routed {
            let routes = self.hosts.get_mut(host).expect("routed host");
            if let Some((_, name, path)) = routes.app_root.take() {
                let matches = vec![HttpMatch { uri: Some(StringMatch::Exact("/".into())), ..Default::default() }];
                let redirect = Some(RoutePolicy::app_root_redirect(&path));
                let route = HttpRoute { name, matches, redirect, ..Default::default() };
                routes.routes.insert(0, Candidate { path: None, rank: Rank::AppRoot, route });
            }
        }
        let vs_names = object_names(routed.iter().map(String::as_str));
        // Each VirtualService is as old as its host's oldest Ingress; the
        // objects every host shares (the Gateway, the DestinationRules) as
        // the oldest of all (no time counts as oldest, as in the ordering).
        let created: BTreeMap<&str, Option<i64>> =
            routed.iter().map(|h| (h.as_str(), self.hosts[h.as_str()].created.flatten())).collect();
        let oldest = created.values().copied().min().flatten();
        let mut subsets: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for host in &routed {
            let mut routes = std::mem::take(&mut self.hosts.get_mut(host).expect("routed host").routes);
            routes.sort_by_key(Candidate::order);
            for d in routes.iter().flat_map(|c| &c.route.route) {
                if let Some(s) = &d.destination.subset {
                    subsets.entry(d.destination.host.clone()).or_default().insert(s.clone());
                }
            }
            let spec = VirtualServiceSpec {
                hosts: vec![host.clone()],
                gateways: vec![gateway_ref.clone()],
                http: routes.into_iter().map(|c| c.route).collect(),
            };
            let mut vs = IstioObject::new(&vs_names[host.as_str()], &ns, Spec::VirtualService(spec));
            vs.metadata.created = created[host.as_str()];
            objects.push(vs);
        }
        // The routes' local rate limits, for istiod's gateway.
        let selector = self.gateway_selector();
        objects.extend(limit::envoy_filter(&objects, &self.opts.gateway_name, &ns, selector, &mut self.warnings));

        // A DestinationRule for each host with subsets or an upstream policy.
        let mut policies = std::mem::take(&mut self.policies);
        let dr_hosts: BTreeSet<String> = subsets.keys().chain(policies.keys()).cloned().collect();
        let dr_names = object_names(dr_hosts.iter().map(String::as_str));
        for host in &dr_hosts {
            let names = subsets.get(host).into_iter().flatten();
            let spec = DestinationRuleSpec {
                host: host.clone(),
                traffic_policy: policies.remove(host).map(|(p, _)| p),
                subsets: names
                    .map(|n| Subset { name: n.clone(), labels: BTreeMap::from([("version".into(), n.clone())]) })
                    .collect(),
            };
            let mut dr = IstioObject::new(&dr_names[host.as_str()], &ns, Spec::DestinationRule(spec));
            dr.metadata.created = oldest;
            objects.push(dr);
        }

        objects.append(&mut self.authorization);

        let mut servers = Vec::new();
        if !routed.is_empty() {
            let name = format!("http-{HTTP_PORT}-ingress");
            servers.push(Server {
                port: ServerPort { number: HTTP_PORT, protocol: "HTTP".into(), name },
                hosts: routed,
                tls: None,
            });
        }
        servers.extend(downstream::https_servers(
            std::mem::take(&mut self.tls_hosts),
            HTTPS_PORT,
            &ns,
            &self.opts.known_ca_secrets,
            &mut self.warnings,
        ));
        if !servers.is_empty() {
            let selector = self.gateway_selector();
            let mut gateway =
                IstioObject::new(&self.opts.gateway_name, &ns, Spec::Gateway(GatewaySpec { selector, servers }));
            gateway.metadata.created = oldest;
            objects.push(gateway);
        }

        objects.sort_by(|a, b| {
            (a.kind(), &a.metadata.namespace, &a.metadata.name).cmp(&(
                b.kind(),
                &b.metadata.namespace,
                &b.metadata.name,
            ))
        });
        IngressTranslation {
            objects,
            warnings: self.warnings,
            ignored_annotations: self.ignored_annotations,
            looked_up: self.looked_up,
        }
    }
}

/// The request headers ingress-nginx gives its default backend with an
/// error answer, besides `X-Code` and `X-Format` (which depend on the
/// answer and the request): the Ingress, and the service and port the
/// path routes to (a Kubernetes Service by its name, a registry service by
/// its host); an empty one is left out.
fn error_headers(ing: &Parsed, backend: &Backend, route: &[RouteDestination]) -> Vec<(String, String)> {
    let (service, port) = match (&backend.service, route.first()) {
        (Some(svc), _) => (svc.name.clone(), svc.port.number.map(|n| n.to_string()).or(svc.port.name.clone())),
        (None, Some(d)) => (d.destination.host.clone(), d.destination.port.map(|p| p.number.to_string())),
        (None, None) => (String::new(), None),
    };
    [
        ("X-Namespace", ing.namespace.clone()),
        ("X-Ingress-Name", ing.name.clone()),
        ("X-Service-Name", service),
        ("X-Service-Port", port.unwrap_or_default()),
    ]
    .into_iter()
    .filter(|(_, v)| !v.is_empty())
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// A path that cannot be routed, and why.
fn path_left_out(ing: &Parsed, raw: &str, host: &str, why: String) -> Warning {
    Warning::new(
        format!("Ingress {}", ing.id),
        Reason::InvalidIngress,
        format!("path {raw} on host {host} left out: {why}"),
    )
}

/// The rewrite of one route. `rewrite-path` follows Higress: the matched
/// prefix is replaced, and the replacement gets a trailing `/` when a match
/// is a `prefix` ending in `/` (so `/foo/x` → `/bar/x`, not `/barx`).
/// `rewrite-target` follows Higress too, a regex substitution of the
/// Ingress path (its `uriRegex`). Three changes, none of which alters a
/// rewrite Higress gets right: the pattern is anchored at the start, so a
/// later repeat of the path in the URI is left alone; it is case-insensitive
/// when the match is, so every request the route takes is rewritten; and for
/// a Prefix path and a target ending in `/` it takes the `/` after the path
/// too, so `rewrite-target: /` on `/static` sends `/static/x` as `/x`, where
/// Higress sends `//x`.
fn rewrite_for(rule: &RewriteRule, matches: &[HttpMatch], ignore_case: bool) -> Rewrite {
    match rule {
        RewriteRule::Path(path) => {
            let mut uri = path.clone();
            let prefix_dir = matches.iter().any(|m| matches!(&m.uri, Some(StringMatch::Prefix(p)) if p.ends_with('/')));
            if prefix_dir && !uri.ends_with('/') {
                uri.push('/');
            }
            Rewrite { uri: Some(uri), authority: None, uri_regex_rewrite: None }
        }
        RewriteRule::Target(target) => {
            // Higress takes the first match's value: the exact path for
            // Exact and for Prefix (its exact twin comes first), `/` for `/`.
            // A regex path's own regex is the pattern (it matches the whole
            // request path from its start), captures and all, as in Higress.
            let pattern = match matches.first().and_then(|m| m.uri.as_ref()) {
                Some(StringMatch::Regex(regex)) => regex.clone(),
                first => {
                    let first = match first {
                        Some(StringMatch::Exact(p) | StringMatch::Prefix(p)) => p.as_str(),
                        _ => "/",
                    };
                    let flags = if ignore_case { "(?i)" } else { "" };
                    let is_dir_prefix =
                        matches.iter().any(|m| matches!(&m.uri, Some(StringMatch::Prefix(p)) if p.len() > 1));
                    let slash = if is_dir_prefix && target.ends_with('/') { "/?" } else { "" };
                    format!("{flags}^{}{slash}", regex_escape(first))
                }
            };
            Rewrite {
                uri: None,
                authority: None,
                uri_regex_rewrite: Some(RegexRewrite { pattern, rewrite: target.clone() }),
            }
        }
    }
}

/// The regex a regex path matches request paths with (Higress:
/// `PATH.*` for `use-regex`, `PATH$` for `full-path-regex`); `(?i)` first
/// with `ignore-path-case`, which Envoy does not apply to regex matches.
fn regex_pattern(regex: RegexPath, path: &str, ignore_case: bool) -> String {
    let flags = if ignore_case { "(?i)" } else { "" };
    match regex {
        RegexPath::Prefix => format!("{flags}{path}.*"),
        RegexPath::Full => format!("{flags}{path}$"),
    }
}

/// Why a regex path, or the rewrite of one, cannot be routed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum RegexPathError {
    /// The path (with its suffix) does not parse as RE2; the parser's
    /// reason.
    #[error("not a valid RE2 regex ({0})")]
    NotRe2(String),
    /// `\N` with N above the path's capture groups; `target` is clipped.
    #[error("rewrite-target {target:?} refers to capture {n}, and the path has {groups} capture groups")]
    NoSuchCapture { target: String, n: usize, groups: usize },
    /// A backslash before something other than a digit or a backslash.
    #[error("rewrite-target {target:?}: a backslash must come before a digit")]
    Backslash { target: String },
}

/// Check a regex path as RE2 would parse it (Envoy rejects the whole
/// route table for one bad regex): its capture groups, or why not.
fn path_regex(regex: RegexPath, path: &str, ignore_case: bool) -> Result<usize, RegexPathError> {
    let pattern = regex_pattern(regex, path, ignore_case);
    match regex_syntax::Parser::new().parse(&pattern) {
        Ok(hir) => Ok(hir.properties().explicit_captures_len()),
        Err(e) => {
            let e = e.to_string();
            let why = e.lines().last().unwrap_or_default().trim_start_matches("error: ").to_owned();
            Err(RegexPathError::NotRe2(why))
        }
    }
}

/// Check an RE2 substitution against a regex with `groups` capture groups:
/// `\N` names one of them, `\\` is a backslash, and nothing else follows a
/// backslash.
fn check_substitution(target: &str, groups: usize) -> Result<(), RegexPathError> {
    let mut chars = target.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            continue;
        }
        match chars.next() {
            Some('\\') => {}
            Some(d) if d.is_ascii_digit() => {
                let n = d.to_digit(10).unwrap_or_default() as usize;
                if n > groups {
                    return Err(RegexPathError::NoSuchCapture { target: clip(target).into_owned(), n, groups });
                }
            }
            _ => return Err(RegexPathError::Backslash { target: clip(target).into_owned() }),
        }
    }
    Ok(())
}

/// Escape RE2 metacharacters.
fn regex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if r"\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// A host as Istio wants it: lowercase; `*`, `*.example.com` or a DNS name.
/// `None` if it is none of those.
fn normalize_host(host: &str) -> Option<String> {
    let host = host.to_ascii_lowercase();
    if host == "*" {
        return Some(host);
    }
    let name = host.strip_prefix("*.").unwrap_or(&host);
    let labels_ok = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        });
    labels_ok.then_some(host)
}

/// Object names for hosts: `shop.example.com` → `shop-example-com`,
/// `*.example.com` → `wildcard-example-com`, `*` → `wildcard`. Hosts whose
/// names would collide (`a-b.com`, `a.b-com`; registry hosts differing in
/// case) each get a hash of the host appended, so names stay unique and
/// stable.
fn object_names<'h>(hosts: impl IntoIterator<Item = &'h str>) -> BTreeMap<&'h str, String> {
    let mut by_base: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for h in hosts {
        let base = match h.strip_prefix('*') {
            Some(rest) => sanitize(&format!("wildcard{rest}")),
            None => sanitize(h),
        };
        by_base.entry(base).or_default().push(h);
    }
    let mut out = BTreeMap::new();
    for (base, hosts) in by_base {
        let shared = hosts.len() > 1;
        for h in hosts {
            out.insert(h, if shared { format!("{base}-{}", short_hash(h)) } else { base.clone() });
        }
    }
    out
}
