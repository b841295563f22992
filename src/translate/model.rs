//! The one typed model of the Istio objects meshbridge writes: ServiceEntry,
//! DestinationRule, Gateway, VirtualService and EnvoyFilter, reduced to the
//! fields meshbridge sets, in Istio's JSON field names (the protobuf JSON
//! mapping: camelCase, enums as strings, unset fields left out).
//!
//! Translation builds these and the standalone gateway reads them as they
//! are. MCP encodes them through the generated prost messages
//! ([`super::pb`]); JSON exists only at the edges: `/debug/configz` and the
//! snapshot tests.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use super::shared::{Labels, PortMap, Shared};

/// Namespace of the objects made from registries, as in Higress.
pub const NAMESPACE: &str = "mcp";
pub const LABEL_REGISTRY_TYPE: &str = "higress-registry-type";
pub const LABEL_REGISTRY_NAME: &str = "higress-registry-name";
/// On every registry endpoint (ServiceEntry endpoints, and what the
/// standalone gateway's subsets match): the name of the registry that
/// reported it, so that subsets and metrics can tell registries apart.
pub const LABEL_ENDPOINT_REGISTRY: &str = "meshbridge.io/registry";
/// On the endpoints of a host whose registries have different
/// `meshbridgeMigration.priority` values: the registry's priority.
pub const LABEL_PRIORITY: &str = "meshbridge.io/priority";
/// On the endpoints of a Kubernetes Service with several ports (see
/// `kube::services`): the Service port the endpoint serves, since a pod may
/// serve each on its own target port. Endpoints without it serve every
/// port, on their own port.
pub const LABEL_SERVICE_PORT: &str = "meshbridge.io/service-port";
const V1: &str = "networking.istio.io/v1";
const V1ALPHA3: &str = "networking.istio.io/v1alpha3";
const SECURITY_V1: &str = "security.istio.io/v1";

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ObjectMeta {
    pub name: String,
    pub namespace: String,
    #[serde(default, skip_serializing_if = "Shared::is_empty")]
    pub labels: Labels,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// When what the object comes from was created, in Unix seconds: the
    /// `creationTimestamp` of its oldest Ingress. Its MCP `create_time`
    /// (istiod lets the oldest of conflicting objects win), the same on
    /// every replica and across restarts; `None` (a registry's objects, or
    /// Ingresses without one) is the Unix epoch. Never in the object's body.
    #[serde(skip)]
    pub created: Option<i64>,
}

/// An Istio object: its metadata and its typed spec, which fixes its kind.
#[derive(Debug, Clone, PartialEq)]
pub struct IstioObject {
    pub metadata: ObjectMeta,
    pub spec: Spec,
}

/// The spec of each kind meshbridge writes.
#[derive(Debug, Clone, PartialEq)]
pub enum Spec {
    ServiceEntry(ServiceEntrySpec),
    DestinationRule(DestinationRuleSpec),
    Gateway(GatewaySpec),
    VirtualService(VirtualServiceSpec),
    EnvoyFilter(EnvoyFilterSpec),
    AuthorizationPolicy(AuthorizationPolicySpec),
}

impl Spec {
    pub fn kind(&self) -> &'static str {
        match self {
            Spec::ServiceEntry(_) => "ServiceEntry",
            Spec::DestinationRule(_) => "DestinationRule",
            Spec::Gateway(_) => "Gateway",
            Spec::VirtualService(_) => "VirtualService",
            Spec::EnvoyFilter(_) => "EnvoyFilter",
            Spec::AuthorizationPolicy(_) => "AuthorizationPolicy",
        }
    }

    /// Istio's `apiVersion` for the kind (EnvoyFilter exists only in
    /// `v1alpha3`).
    pub fn api_version(&self) -> &'static str {
        match self {
            Spec::EnvoyFilter(_) => V1ALPHA3,
            Spec::AuthorizationPolicy(_) => SECURITY_V1,
            _ => V1,
        }
    }

    /// The spec in its JSON form. Plain structs of strings, numbers, maps
    /// and JSON values: serialisation cannot fail.
    pub fn to_json(&self) -> serde_json::Value {
        let v = match self {
            Spec::ServiceEntry(s) => serde_json::to_value(s),
            Spec::DestinationRule(s) => serde_json::to_value(s),
            Spec::Gateway(s) => serde_json::to_value(s),
            Spec::VirtualService(s) => serde_json::to_value(s),
            Spec::EnvoyFilter(s) => serde_json::to_value(s),
            Spec::AuthorizationPolicy(s) => serde_json::to_value(s),
        };
        v.unwrap_or_default()
    }

    /// Read a spec of `kind` from its JSON form (tests and fixtures).
    pub fn from_json(kind: &str, spec: serde_json::Value) -> Result<Spec, SpecError> {
        let e = |source: serde_json::Error| SpecError::Invalid { kind: kind.to_string(), source };
        Ok(match kind {
            "ServiceEntry" => Spec::ServiceEntry(serde_json::from_value(spec).map_err(e)?),
            "DestinationRule" => Spec::DestinationRule(serde_json::from_value(spec).map_err(e)?),
            "Gateway" => Spec::Gateway(serde_json::from_value(spec).map_err(e)?),
            "VirtualService" => Spec::VirtualService(serde_json::from_value(spec).map_err(e)?),
            "EnvoyFilter" => Spec::EnvoyFilter(serde_json::from_value(spec).map_err(e)?),
            "AuthorizationPolicy" => Spec::AuthorizationPolicy(serde_json::from_value(spec).map_err(e)?),
            other => return Err(SpecError::UnknownKind(other.to_string())),
        })
    }
}

/// Why [`Spec::from_json`] could not read a spec.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// Not one of the kinds the model has.
    #[error("unknown kind {0:?}")]
    UnknownKind(String),
    /// The JSON does not have the shape of that kind's spec.
    #[error("{kind}: {source}")]
    Invalid { kind: String, source: serde_json::Error },
}

impl IstioObject {
    pub fn new(name: impl Into<String>, namespace: impl Into<String>, spec: Spec) -> IstioObject {
        IstioObject {
            metadata: ObjectMeta { name: name.into(), namespace: namespace.into(), ..Default::default() },
            spec,
        }
    }

    pub fn kind(&self) -> &'static str {
        self.spec.kind()
    }

    pub fn api_version(&self) -> &'static str {
        self.spec.api_version()
    }

    /// `namespace/name`, the MCP resource name.
    pub fn key(&self) -> String {
        format!("{}/{}", self.metadata.namespace, self.metadata.name)
    }

    /// The Kubernetes JSON form (`kubectl get … -o json`).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": self.api_version(),
            "kind": self.kind(),
            "metadata": self.metadata,
            "spec": self.spec.to_json(),
        })
    }
}

/// Serialised in the Kubernetes JSON form, spec keys sorted.
impl Serialize for IstioObject {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.to_json().serialize(s)
    }
}

// ---- ServiceEntry ---------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServiceEntrySpec {
    pub hosts: Vec<String>,
    pub ports: Vec<Port>,
    pub location: Location,
    pub resolution: Resolution,
    pub endpoints: Vec<WorkloadEntry>,
}

/// `ServiceEntry.Location`; the discriminants are the proto's numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Location {
    MeshExternal = 0,
    MeshInternal = 1,
}

/// `ServiceEntry.Resolution`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Resolution {
    None = 0,
    Static = 1,
    Dns = 2,
    DnsRoundRobin = 3,
    DynamicDns = 4,
}

/// `ServicePort`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Port {
    pub number: u32,
    pub protocol: String,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkloadEntry {
    pub address: String,
    /// Port name → the endpoint's own port.
    pub ports: PortMap,
    #[serde(default, skip_serializing_if = "Shared::is_empty")]
    pub labels: Labels,
    pub weight: u32,
}

// ---- DestinationRule ------------------------------------------------------

/// Subsets and upstream policy (load balancing, HTTP/2, TLS) from Ingress
/// annotations, TLS origination from registries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DestinationRuleSpec {
    pub host: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic_policy: Option<TrafficPolicy>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subsets: Vec<Subset>,
}

impl DestinationRuleSpec {
    /// Fill what this rule leaves unset from `fallback`: how a registry
    /// rule completes one written for an Ingress without overriding it.
    pub fn fill_unset(&mut self, fallback: &DestinationRuleSpec) {
        match (&mut self.traffic_policy, &fallback.traffic_policy) {
            (None, Some(f)) => self.traffic_policy = Some(f.clone()),
            (Some(p), Some(f)) if p.port_level_settings.is_empty() => {
                // In Istio a port's settings replace the rule's, not add to
                // them: each registry port keeps this rule's load balancing
                // and pool beside the registry's TLS. This rule's mutual
                // TLS (a client certificate the backend asks for) replaces
                // the registry's, whose SNI it keeps when it has none.
                let (lb, pool) = (p.load_balancer.clone(), p.connection_pool.clone());
                let mutual = p.tls.clone().filter(|t| t.mode == ClientTlsMode::Mutual);
                p.port_level_settings = f
                    .port_level_settings
                    .iter()
                    .map(|port| PortTrafficPolicy {
                        load_balancer: port.load_balancer.clone().or_else(|| lb.clone()),
                        connection_pool: port.connection_pool.clone().or_else(|| pool.clone()),
                        tls: match &mutual {
                            Some(t) => {
                                ClientTlsSettings { sni: t.sni.clone().or_else(|| port.tls.sni.clone()), ..t.clone() }
                            }
                            None => port.tls.clone(),
                        },
                        ..port.clone()
                    })
                    .collect();
            }
            _ => {}
        }
        // Registry failover (meshbridgeMigration priority) stays in force
        // under a rule of the Ingress's own.
        if let (Some(p), Some(f)) = (&mut self.traffic_policy, &fallback.traffic_policy) {
            if p.failover_priority.is_empty() {
                p.failover_priority = f.failover_priority.clone();
            }
            if p.outlier_detection.is_none() {
                p.outlier_detection = f.outlier_detection.clone();
            }
        }
        if self.subsets.is_empty() {
            self.subsets = fallback.subsets.clone();
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TrafficPolicy {
    #[serde(default)]
    pub load_balancer: Option<LoadBalancerSettings>,
    #[serde(default)]
    pub connection_pool: Option<ConnectionPoolSettings>,
    #[serde(default)]
    pub tls: Option<ClientTlsSettings>,
    #[serde(default)]
    pub port_level_settings: Vec<PortTrafficPolicy>,
    /// `loadBalancer.localityLbSetting.failoverPriority` (with `enabled`):
    /// registry failover by the endpoints' [`LABEL_PRIORITY`]. In the JSON
    /// form it sits inside `loadBalancer`, as in Istio's.
    #[serde(skip)]
    pub failover_priority: Vec<String>,
    #[serde(default)]
    pub outlier_detection: Option<OutlierDetection>,
}

impl Serialize for TrafficPolicy {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Locality<'a> {
            enabled: bool,
            failover_priority: &'a [String],
        }
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Lb<'a> {
            #[serde(flatten)]
            policy: Option<&'a LoadBalancerSettings>,
            #[serde(skip_serializing_if = "Option::is_none")]
            locality_lb_setting: Option<Locality<'a>>,
        }
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Json<'a> {
            #[serde(skip_serializing_if = "Option::is_none")]
            load_balancer: Option<Lb<'a>>,
            #[serde(skip_serializing_if = "Option::is_none")]
            connection_pool: Option<&'a ConnectionPoolSettings>,
            #[serde(skip_serializing_if = "Option::is_none")]
            tls: Option<&'a ClientTlsSettings>,
            #[serde(skip_serializing_if = "<[_]>::is_empty")]
            port_level_settings: &'a [PortTrafficPolicy],
            #[serde(skip_serializing_if = "Option::is_none")]
            outlier_detection: Option<&'a OutlierDetection>,
        }
        let locality = (!self.failover_priority.is_empty())
            .then(|| Locality { enabled: true, failover_priority: &self.failover_priority });
        let load_balancer = (self.load_balancer.is_some() || locality.is_some())
            .then_some(Lb { policy: self.load_balancer.as_ref(), locality_lb_setting: locality });
        Json {
            load_balancer,
            connection_pool: self.connection_pool.as_ref(),
            tls: self.tls.as_ref(),
            port_level_settings: &self.port_level_settings,
            outlier_detection: self.outlier_detection.as_ref(),
        }
        .serialize(s)
    }
}

/// `OutlierDetection`: the fields registry failover sets. Istio applies a
/// `localityLbSetting` failover only to a cluster that has one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutlierDetection {
    #[serde(rename = "consecutive5xxErrors")]
    pub consecutive_5xx_errors: u32,
    pub interval: ProtoDuration,
    pub base_ejection_time: ProtoDuration,
    pub max_ejection_percent: i32,
}

impl OutlierDetection {
    /// What registry failover asks for: Envoy's defaults (5 errors in a
    /// row, checked every 10 s, ejected for 30 s), except that every
    /// endpoint of a level may be ejected, so that a level whose instances
    /// all fail hands its traffic to the next.
    pub fn for_failover() -> OutlierDetection {
        OutlierDetection {
            consecutive_5xx_errors: 5,
            interval: ProtoDuration::from_secs(10),
            base_ejection_time: ProtoDuration::from_secs(30),
            max_ejection_percent: 100,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PortTrafficPolicy {
    pub port: PortSelector,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_balancer: Option<LoadBalancerSettings>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection_pool: Option<ConnectionPoolSettings>,
    pub tls: ClientTlsSettings,
}

/// `LoadBalancerSettings`: its `lbPolicy` oneof.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum LoadBalancerSettings {
    Simple(SimpleLb),
    ConsistentHash(ConsistentHash),
}

/// `LoadBalancerSettings.SimpleLB`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum SimpleLb {
    Unspecified = 0,
    LeastConn = 1,
    Random = 2,
    Passthrough = 3,
    RoundRobin = 4,
    LeastRequest = 5,
}

/// `ConsistentHashLB`, reduced to its `hashKey` oneof (the ring is
/// Istio's default).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ConsistentHash {
    HttpHeaderName(String),
    HttpCookie(HttpCookie),
    UseSourceIp(bool),
    HttpQueryParameterName(String),
}

/// `ConsistentHashLB.HTTPCookie`: Envoy generates the cookie when a
/// request has none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpCookie {
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub path: String,
    /// `0s` makes a session cookie.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<ProtoDuration>,
}

/// `ConnectionPoolSettings`, reduced to the HTTP/2 upgrade.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectionPoolSettings {
    pub http: HttpPoolSettings,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpPoolSettings {
    pub h2_upgrade_policy: H2UpgradePolicy,
}

/// `ConnectionPoolSettings.HTTPSettings.H2UpgradePolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum H2UpgradePolicy {
    Default = 0,
    DoNotUpgrade = 1,
    Upgrade = 2,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientTlsSettings {
    /// `SIMPLE`: TLS to the upstream, no client certificate; `MUTUAL`: with
    /// the client certificate of `credential_name`.
    pub mode: ClientTlsMode,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sni: Option<String>,
    /// `google.protobuf.BoolValue`: `true` when the upstream certificate is
    /// not checked (Higress's `backend-protocol: HTTPS`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub insecure_skip_verify: Option<bool>,
    /// `MUTUAL`: the Secret with the client certificate (`tls.crt`,
    /// `tls.key`) and, to verify the upstream, its CA (`ca.crt`): a name in
    /// the gateway's namespace, or `kubernetes-gateway://{namespace}/{name}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential_name: Option<String>,
}

/// `ClientTLSSettings.TLSmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ClientTlsMode {
    Disable = 0,
    Simple = 1,
    Mutual = 2,
    IstioMutual = 3,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Subset {
    pub name: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// `PortSelector`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PortSelector {
    pub number: u32,
}

// ---- Gateway --------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GatewaySpec {
    #[serde(default)]
    pub selector: BTreeMap<String, String>,
    pub servers: Vec<Server>,
}

/// `Gateway.spec.servers[]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Server {
    pub port: ServerPort,
    pub hosts: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<ServerTls>,
}

/// `Port` of a Gateway server. Istio requires port names to be unique
/// among a Gateway's servers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServerPort {
    pub number: u32,
    /// `HTTP`, `HTTPS`, `HTTP2`, `GRPC`, …
    pub protocol: String,
    #[serde(default)]
    pub name: String,
}

/// `ServerTLSSettings`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServerTls {
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub https_redirect: bool,
    /// `SIMPLE` for Ingress TLS (terminated at the gateway); Istio's
    /// default, when unset, is `PASSTHROUGH`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<ServerTlsMode>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub credential_name: String,
    /// The Secret (namespace, name) whose CA certificates client
    /// certificates are verified against (`auth-tls-secret`). The
    /// standalone gateway's: it requires and verifies client certificates
    /// for this server's hosts whatever `mode` says, and `mode` says what
    /// istiod does (`MUTUAL` only where stock istiod finds this CA from
    /// `credentialName`). Not an Istio field: neither serialized nor
    /// encoded.
    #[serde(skip)]
    pub client_ca: Option<(String, String)>,
}

/// `ServerTLSSettings.TLSmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ServerTlsMode {
    Passthrough = 0,
    Simple = 1,
    Mutual = 2,
    AutoPassthrough = 3,
    IstioMutual = 4,
    OptionalMutual = 5,
}

impl ServerTlsMode {
    /// The proto's (and the JSON's) name.
    pub fn as_str(self) -> &'static str {
        match self {
            ServerTlsMode::Passthrough => "PASSTHROUGH",
            ServerTlsMode::Simple => "SIMPLE",
            ServerTlsMode::Mutual => "MUTUAL",
            ServerTlsMode::AutoPassthrough => "AUTO_PASSTHROUGH",
            ServerTlsMode::IstioMutual => "ISTIO_MUTUAL",
            ServerTlsMode::OptionalMutual => "OPTIONAL_MUTUAL",
        }
    }
}

// ---- VirtualService -------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VirtualServiceSpec {
    pub hosts: Vec<String>,
    #[serde(default)]
    pub gateways: Vec<String>,
    #[serde(default)]
    pub http: Vec<HttpRoute>,
}

/// `HTTPRoute`. A route without `match` matches every request (the default
/// backend); Istio wants it last. A route with a `redirect` has no `route`
/// and no `rewrite` (Istio's validation rejects either beside it).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpRoute {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(rename = "match", default, skip_serializing_if = "Vec::is_empty")]
    pub matches: Vec<HttpMatch>,
    #[serde(default)]
    pub route: Vec<RouteDestination>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redirect: Option<Redirect>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rewrite: Option<Rewrite>,
    /// The whole request, retries included; unset, Istio sets none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<ProtoDuration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries: Option<Retry>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cors_policy: Option<CorsPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<Headers>,
    /// A copy of each request goes here too (its answer is dropped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror: Option<Destination>,
    /// The share of requests `mirror` gets; unset, Istio mirrors all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror_percentage: Option<Percent>,
    /// `whitelist-source-range` / `denylist-source-range`. Not an Istio
    /// field (a VirtualService has none): only the standalone gateway reads
    /// it; it is neither serialized nor encoded for istiod.
    #[serde(skip)]
    pub source_ranges: Option<SourceRanges>,
    /// Higress's `route-limit-rps` / `-rpm`. Not an Istio field either:
    /// neither serialized nor encoded; the standalone gateway reads it, and
    /// istiod gets it as an EnvoyFilter on the route's `name`
    /// (`ingress/limit.rs`).
    #[serde(skip)]
    pub local_rate_limit: Option<LocalRateLimit>,
    /// `default-backend` with `custom-http-errors`. Higress writes them
    /// into fields of its own fork of Istio (`fallbackClusters`,
    /// `internalActiveRedirect`): the standalone gateway's only, neither
    /// serialized nor encoded.
    #[serde(skip)]
    pub default_backend: Option<DefaultBackend>,
}

/// Where a route's requests go when its service has no endpoint, and
/// whose answer replaces an upstream answer with one of `codes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DefaultBackend {
    /// With no port: the service's first (lowest) port, as Higress takes
    /// a Service's first port.
    pub destination: Destination,
    /// From 400 to 599, ascending, each once; empty: no answer is replaced.
    pub codes: Vec<u16>,
    /// Request headers the default backend gets with a replaced answer
    /// (besides `X-Code` and `X-Format`), as ingress-nginx sends them:
    /// `X-Namespace`, `X-Ingress-Name`, `X-Service-Name`, `X-Service-Port`.
    pub headers: Vec<(String, String)>,
}

/// A token bucket per gateway instance, as Higress's local rate limit:
/// `tokens_per_fill` every `fill_interval_secs`, at most `max_tokens` kept;
/// a request with no token gets a 429.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalRateLimit {
    pub max_tokens: u32,
    pub tokens_per_fill: u32,
    pub fill_interval_secs: u32,
}

/// Which client addresses a route serves: none in `deny`, and when `allow`
/// is set, only those in it (an empty `allow` serves no one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceRanges {
    pub allow: Option<Vec<Cidr>>,
    pub deny: Vec<Cidr>,
}

/// An address block: `address/prefix_len`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cidr {
    pub address: std::net::IpAddr,
    pub prefix_len: u8,
}

/// `Percent`: a share from 0 to 100.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Percent {
    pub value: f64,
}

/// `HTTPMatchRequest`, reduced to the URI and request headers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpMatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uri: Option<StringMatch>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ignore_uri_case: bool,
    /// Header name (lowercase, as Istio requires) → how its value must
    /// match; every entry must hold. Istio's `regex` is RE2 and must match
    /// the whole value.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, StringMatch>,
    /// The request's scheme (`http`, `https`): what an HTTPS redirect of
    /// one route matches, so that HTTPS requests go on to the route itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<StringMatch>,
    /// The request's method (Higress's `match-method`: a regex of the
    /// methods, `GET|POST`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<StringMatch>,
    /// Query parameter name → how its value must match; every entry must
    /// hold.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub query_params: BTreeMap<String, StringMatch>,
}

/// `StringMatch`: a oneof, so exactly one key in JSON.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum StringMatch {
    Exact(String),
    Prefix(String),
    Regex(String),
}

/// `HTTPRouteDestination`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RouteDestination {
    pub destination: Destination,
    /// Left out for a single destination (Istio then sends it everything).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    /// Header operations for the requests sent to this destination only
    /// (a canary's own header control, beside a weight).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<Headers>,
}

/// `Destination`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Destination {
    pub host: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subset: Option<String>,
    /// `None`: Istio uses the service's only port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<PortSelector>,
    /// An Ingress backend's port given by name (`port.name`), for the
    /// standalone gateway to find among a Kubernetes Service's ports.
    /// Istio's `Destination` has no such field: never sent.
    #[serde(skip)]
    pub port_name: Option<String>,
}

/// `HTTPRewrite`: `uri` replaces the matched prefix (or the whole path for
/// an exact match); `uriRegexRewrite` substitutes a regex match.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rewrite {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uri: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authority: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uri_regex_rewrite: Option<RegexRewrite>,
}

/// `RegexRewrite`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RegexRewrite {
    #[serde(rename = "match")]
    pub pattern: String,
    pub rewrite: String,
}

/// `HTTPRedirect`: the parts of the URL to replace; those unset keep the
/// request's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Redirect {
    /// The path (and only the path).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uri: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authority: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
    /// Unset: 301. Istio's gateway (and Envoy) send 301, 302, 303, 307 and
    /// 308 only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redirect_code: Option<u32>,
}

/// `HTTPRetry`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Retry {
    /// Retries after the first try; 0 turns retries off.
    #[serde(default)]
    pub attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_try_timeout: Option<ProtoDuration>,
    /// Envoy's `retry_on` conditions, comma-separated; a bare status code
    /// (`502`) is one of `retriable-status-codes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_on: Option<String>,
}

/// `Headers`: operations on the request before it goes upstream and on the
/// response before it goes back.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Headers {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<HeaderOperations>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<HeaderOperations>,
}

/// `Headers.HeaderOperations`. Header names are lowercase.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct HeaderOperations {
    /// Overwrite (or add) the header.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub set: BTreeMap<String, String>,
    /// Append a value (or add the header).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub add: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remove: Vec<String>,
}

/// `CorsPolicy`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CorsPolicy {
    /// An origin is allowed when one of these matches the whole `Origin`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_origins: Vec<StringMatch>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_methods: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_headers: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub expose_headers: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age: Option<ProtoDuration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_credentials: Option<bool>,
}

/// A `google.protobuf.Duration`, in its JSON form a decimal number of
/// seconds ending in `s` (`"5s"`, `"0.250s"`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct ProtoDuration(pub std::time::Duration);

impl ProtoDuration {
    pub fn from_secs(secs: u64) -> ProtoDuration {
        ProtoDuration(std::time::Duration::from_secs(secs))
    }
}

impl Serialize for ProtoDuration {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (secs, nanos) = (self.0.as_secs(), self.0.subsec_nanos());
        let text = if nanos == 0 {
            format!("{secs}s")
        } else {
            let frac = format!("{nanos:09}");
            format!("{secs}.{}s", frac.trim_end_matches('0'))
        };
        s.serialize_str(&text)
    }
}

impl<'de> Deserialize<'de> for ProtoDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        let bad =
            || <D::Error as serde::de::Error>::custom(format!("{text:?} is not a duration like \"5s\" or \"0.5s\""));
        let number = text.strip_suffix('s').ok_or_else(bad)?;
        let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
        if whole.is_empty() || !whole.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        if frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let secs: u64 = whole.parse().map_err(|_| bad())?;
        let nanos: u32 = if frac.is_empty() { 0 } else { format!("{frac:0<9}").parse().map_err(|_| bad())? };
        Ok(ProtoDuration(std::time::Duration::new(secs, nanos)))
    }
}

// ---- AuthorizationPolicy --------------------------------------------------

/// `AuthorizationPolicy`, reduced to what meshbridge writes: a label
/// selector, an action, and rules of client address blocks and hosts and
/// paths.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuthorizationPolicySpec {
    pub selector: WorkloadSelector,
    pub action: AuthorizationAction,
    pub rules: Vec<AuthorizationRule>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadSelector {
    pub match_labels: BTreeMap<String, String>,
}

/// `AuthorizationPolicy.Action` (the two meshbridge writes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum AuthorizationAction {
    Allow = 0,
    Deny = 1,
}

/// A `Rule`: one of `from` and one of `to` must match (an empty list
/// matches anything).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuthorizationRule {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub from: Vec<RuleFrom>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub to: Vec<RuleTo>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RuleFrom {
    pub source: RuleSource,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuleSource {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remote_ip_blocks: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_remote_ip_blocks: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RuleTo {
    pub operation: RuleOperation,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct RuleOperation {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
}

// ---- EnvoyFilter ----------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvoyFilterSpec {
    /// The proxies it applies to, by their labels; unset, every proxy in
    /// its namespace (every proxy, in Istio's root namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_selector: Option<EnvoyFilterSelector>,
    pub config_patches: Vec<EnvoyConfigObjectPatch>,
}

/// `networking.v1alpha3.WorkloadSelector` (an EnvoyFilter's; an
/// AuthorizationPolicy's is [`WorkloadSelector`]).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct EnvoyFilterSelector {
    pub labels: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvoyConfigObjectPatch {
    pub apply_to: ApplyTo,
    #[serde(rename = "match")]
    pub matches: PatchMatch,
    pub patch: Patch,
}

/// `EnvoyConfigObjectMatch`, reduced to a context and one object: a
/// cluster by name, a listener's filter (and HTTP filter) by name, or a
/// route by name. Istio's `object_types` is a oneof: at most one of them
/// is set ([`super::pb`] refuses more).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PatchMatch {
    pub context: PatchContext,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listener: Option<ListenerMatch>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route_configuration: Option<RouteConfigurationMatch>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterMatch>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterMatch {
    pub name: String,
}

/// `ListenerMatch`, reduced to a filter of any filter chain.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListenerMatch {
    pub filter_chain: FilterChainMatch,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FilterChainMatch {
    pub filter: FilterMatch,
}

/// A network filter by name and, inside an HTTP connection manager, one of
/// its HTTP filters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FilterMatch {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sub_filter: Option<SubFilterMatch>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubFilterMatch {
    pub name: String,
}

/// `RouteConfigurationMatch`, reduced to a route by name in any virtual
/// host of any route configuration. Istio names an Envoy route after its
/// VirtualService `http[].name`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouteConfigurationMatch {
    pub vhost: VirtualHostMatch,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VirtualHostMatch {
    pub route: RouteMatch,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouteMatch {
    pub name: String,
}

/// `Patch`. Its `value` is a `google.protobuf.Struct` in Istio's API: Envoy
/// config in its JSON form, so a JSON value is its faithful type.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Patch {
    pub operation: Operation,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<serde_json::Value>,
}

/// `EnvoyFilter.ApplyTo`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ApplyTo {
    Listener = 1,
    FilterChain = 2,
    NetworkFilter = 3,
    HttpFilter = 4,
    RouteConfiguration = 5,
    VirtualHost = 6,
    HttpRoute = 7,
    Cluster = 8,
    ExtensionConfig = 9,
}

/// `EnvoyFilter.PatchContext`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum PatchContext {
    #[default]
    Any = 0,
    SidecarInbound = 1,
    SidecarOutbound = 2,
    Gateway = 3,
}

/// `EnvoyFilter.Patch.Operation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Operation {
    Merge = 1,
    Add = 2,
    Remove = 3,
    InsertBefore = 4,
    InsertAfter = 5,
    InsertFirst = 6,
    Replace = 7,
}
