//! Higress's local rate limit (`route-limit-rps`, `-rpm`,
//! `-burst-multiplier`) through istiod. Stock Istio's VirtualService has no
//! field for it (Higress's fork adds `routeHTTPFilters`), so the gateway
//! gets it as one EnvoyFilter on the gateway's pods, the way Istio's own
//! local rate limit guide writes it:
//!
//! - `HTTP_FILTER`: Envoy's local rate limit filter in every HTTP
//!   connection manager of the gateway, just before the router (after
//!   Istio's CORS filter, so a preflight takes no token), with no token
//!   bucket of its own: it passes every request unless a route turns it on;
//! - `HTTP_ROUTE`, one per limited route: the route's bucket as the
//!   filter's per-route config, MERGEd into every Envoy route of that name.
//!   Istio names an Envoy route after its VirtualService `http[].name`, in
//!   every route configuration (HTTP and HTTPS) and virtual host; a Prefix
//!   path's two matches are two Envoy routes of one name, each with a
//!   bucket of its own, as on the standalone gateway.
//!
//! The bucket is the standalone gateway's ([`local_rate_limit`]),
//! in the JSON form Envoy's config dump writes. Patches go in route-name
//! order, so the same Ingresses give the same bytes.
//!
//! Route names are `{namespace}-{ingress}-{index}` (and suffixes), which
//! two Ingresses can share (`a-b/c` and `a/b-c`). A name that routes with
//! different limits share would put one limit on all of them through
//! istiod: it gets no patch, and a `standalone_only` warning says so.

use std::collections::BTreeMap;

use envoy_types::util::pack_any;
use serde_json::{Value, json};

use meshbridge_proto::EncodeError;

use crate::translate::gateway::{
    HCM_FILTER, LOCAL_RATE_LIMIT_FILTER, ROUTER_FILTER, inert_local_rate_limit, local_rate_limit,
};
use crate::translate::model::{
    ApplyTo, EnvoyConfigObjectPatch, EnvoyFilterSelector, EnvoyFilterSpec, FilterChainMatch, FilterMatch, IstioObject,
    ListenerMatch, LocalRateLimit, Operation, Patch, PatchContext, PatchMatch, RouteConfigurationMatch, RouteMatch,
    Spec, SubFilterMatch, VirtualHostMatch,
};
use crate::translate::warning::{Reason, Warning};

/// The EnvoyFilter's name: `{gateway}-local-rate-limit`.
pub fn filter_name(gateway_name: &str) -> String {
    format!("{gateway_name}-local-rate-limit")
}

/// The EnvoyFilter for the limited routes of `virtual_services` (all of
/// them: a route name is matched across the whole gateway), in
/// `namespace`, on the pods `selector` picks; `None` when no route is
/// limited. Its creation time is that of the oldest VirtualService with a
/// limited route.
pub fn envoy_filter(
    virtual_services: &[IstioObject],
    gateway_name: &str,
    namespace: &str,
    selector: BTreeMap<String, String>,
    warnings: &mut Vec<Warning>,
) -> Option<IstioObject> {
    // Route name → its limit (`None`: none), or `Err` once two routes of
    // that name disagree; and the VirtualService that first had it.
    let mut by_name: BTreeMap<&str, (Result<Option<LocalRateLimit>, ()>, &IstioObject)> = BTreeMap::new();
    for vs in virtual_services {
        let Spec::VirtualService(spec) = &vs.spec else { continue };
        for route in &spec.http {
            let limit = route.local_rate_limit;
            by_name
                .entry(route.name.as_str())
                .and_modify(|(seen, _)| {
                    if *seen != Ok(limit) {
                        *seen = Err(());
                    }
                })
                .or_insert((Ok(limit), vs));
        }
    }
    let mut limited = Vec::new();
    let mut created: Option<Option<i64>> = None;
    for (name, (limit, vs)) in by_name {
        match limit {
            Ok(None) => {}
            // An unnamed route cannot be matched alone (Istio reads an
            // empty name as "any route"); ours are always named.
            Ok(Some(_)) if name.is_empty() => warnings.push(unmatched(vs, "an unnamed route")),
            Ok(Some(limit)) => {
                limited.push((name, limit));
                let t = vs.metadata.created;
                created = Some(created.map_or(t, |c| c.min(t)));
            }
            Err(()) => {
                warnings.push(unmatched(vs, &format!("route {name}, a name other routes with another limit share,")))
            }
        }
    }
    if limited.is_empty() {
        return None;
    }
    let name = filter_name(gateway_name);
    let patches: Result<Vec<_>, _> = std::iter::once(http_filter())
        .chain(limited.into_iter().map(|(route, limit)| route_patch(route, &limit)))
        .collect();
    let config_patches = match patches {
        Ok(p) => p,
        // Only if the Envoy descriptors lacked the filter's message, which
        // a unit test rules out.
        Err(e) => {
            warnings.push(Warning::new(
                format!("EnvoyFilter {namespace}/{name}"),
                Reason::InvalidObject,
                format!("the local rate limit has no JSON form ({e}); left out"),
            ));
            return None;
        }
    };
    let spec = EnvoyFilterSpec { workload_selector: Some(EnvoyFilterSelector { labels: selector }), config_patches };
    let mut object = IstioObject::new(name, namespace, Spec::EnvoyFilter(spec));
    object.metadata.created = created.flatten();
    Some(object)
}

fn unmatched(vs: &IstioObject, what: &str) -> Warning {
    Warning::new(
        format!("VirtualService {}/{}", vs.metadata.namespace, vs.metadata.name),
        Reason::StandaloneOnly,
        format!(
            "{what} has a local rate limit that only the standalone gateway enforces: istiod's gateway is \
             patched by route name"
        ),
    )
}

/// An Envoy message as the JSON of a `typed_config`, `@type` included.
fn typed_config<M: prost::Name + prost::Message>(message: M) -> Result<Value, EncodeError> {
    let any = pack_any(message);
    meshbridge_proto::envoy::to_json(&any.type_url, &any.value)
}

fn gateway_match() -> PatchMatch {
    PatchMatch { context: PatchContext::Gateway, ..Default::default() }
}

/// The filter, inert, inserted before the router of every HTTP connection
/// manager of the gateway.
fn http_filter() -> Result<EnvoyConfigObjectPatch, EncodeError> {
    let filter =
        FilterMatch { name: HCM_FILTER.into(), sub_filter: Some(SubFilterMatch { name: ROUTER_FILTER.into() }) };
    let typed = typed_config(inert_local_rate_limit())?;
    Ok(EnvoyConfigObjectPatch {
        apply_to: ApplyTo::HttpFilter,
        matches: PatchMatch {
            listener: Some(ListenerMatch { filter_chain: FilterChainMatch { filter } }),
            ..gateway_match()
        },
        patch: Patch {
            operation: Operation::InsertBefore,
            value: Some(json!({ "name": LOCAL_RATE_LIMIT_FILTER, "typed_config": typed })),
        },
    })
}

/// The route's bucket, merged into each Envoy route named `name`.
fn route_patch(name: &str, limit: &LocalRateLimit) -> Result<EnvoyConfigObjectPatch, EncodeError> {
    let config = typed_config(local_rate_limit(limit))?;
    Ok(EnvoyConfigObjectPatch {
        apply_to: ApplyTo::HttpRoute,
        matches: PatchMatch {
            route_configuration: Some(RouteConfigurationMatch {
                vhost: VirtualHostMatch { route: RouteMatch { name: name.to_owned() } },
            }),
            ..gateway_match()
        },
        patch: Patch {
            operation: Operation::Merge,
            value: Some(json!({ "typed_per_filter_config": { LOCAL_RATE_LIMIT_FILTER: config } })),
        },
    })
}
