//! `default-backend` and `custom-http-errors` on the standalone gateway:
//! aggregate clusters, the custom response policy, the fallback route.

use envoy_types::pb::envoy::config::route::v3::{Route, header_matcher::HeaderMatchSpecifier};
use envoy_types::pb::envoy::extensions::clusters::aggregate::v3::ClusterConfig;
use envoy_types::pb::envoy::extensions::filters::http::custom_response::v3::CustomResponse;
use envoy_types::pb::envoy::extensions::http::custom_response::redirect_policy::v3::{
    RedirectPolicy, redirect_policy::RedirectActionSpecifier,
};
use envoy_types::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern;
use envoy_types::pb::xds::r#type::matcher::v3::matcher::{MatcherType, matcher_list::predicate, on_match::OnMatch};

use super::*;
use crate::translate::model::{DefaultBackend, Destination, PortSelector};

const WEB: &str = "outbound|8080||web.dc1.consul";
const API: &str = "outbound|9090||api.dc1.consul";

/// A VirtualService whose first route (`errs`, to web) has `backend` as
/// its default backend, replacing answers with `codes`; its second
/// (`plain`) has none.
fn with_default_backend(backend: &str, port: Option<u32>, codes: &[u16], first_to: (&str, u16)) -> IstioObject {
    let mut object = vs(
        "errs",
        &["e.example.com"],
        json!([
            {"name": "errs", "match": [{"uri": {"prefix": "/errs"}}], "route": [dest(first_to.0, first_to.1)]},
            {"name": "plain", "route": [dest("web.dc1.consul", 8080)]}
        ]),
    );
    let Spec::VirtualService(spec) = &mut object.spec else { panic!() };
    let destination = Destination {
        host: backend.into(),
        subset: None,
        port: port.map(|number| PortSelector { number }),
        port_name: None,
    };
    let headers = vec![("X-Namespace".to_owned(), "shop".to_owned())];
    spec.http[0].default_backend = Some(DefaultBackend { destination, codes: codes.to_vec(), headers });
    object
}

fn cluster_of(route: &Route) -> String {
    match &route.action {
        Some(route::Action::Route(ra)) => match ra.cluster_specifier.as_ref().unwrap() {
            ClusterSpecifier::Cluster(c) => c.clone(),
            other => panic!("one cluster expected: {other:?}"),
        },
        other => panic!("a route action expected: {other:?}"),
    }
}

fn custom_response(route: &Route) -> Option<CustomResponse> {
    route.typed_per_filter_config.get("envoy.filters.http.custom_response").map(|a| {
        assert_eq!(a.type_url, "type.googleapis.com/envoy.extensions.filters.http.custom_response.v3.CustomResponse");
        CustomResponse::decode(a.value.as_slice()).unwrap()
    })
}

/// Each code its own redirect policy: `/` on the same host, with the
/// header that routes it and ingress-nginx's headers.
fn policies(config: &CustomResponse) -> Vec<(String, RedirectPolicy)> {
    let Some(MatcherType::MatcherList(list)) = &config.custom_response_matcher.as_ref().unwrap().matcher_type else {
        panic!("a matcher list expected")
    };
    list.matchers
        .iter()
        .map(|m| {
            let Some(predicate::MatchType::SinglePredicate(p)) = &m.predicate.as_ref().unwrap().match_type else {
                panic!()
            };
            let input = p.input.as_ref().unwrap().typed_config.as_ref().unwrap();
            assert_eq!(input.type_url, "type.googleapis.com/envoy.type.matcher.v3.HttpResponseStatusCodeMatchInput");
            let Some(predicate::single_predicate::Matcher::ValueMatch(v)) = &p.matcher else { panic!() };
            let Some(envoy_types::pb::xds::r#type::matcher::v3::string_matcher::MatchPattern::Exact(code)) =
                &v.match_pattern
            else {
                panic!()
            };
            let Some(OnMatch::Action(action)) = &m.on_match.as_ref().unwrap().on_match else { panic!() };
            let any = action.typed_config.as_ref().unwrap();
            assert_eq!(
                any.type_url,
                "type.googleapis.com/envoy.extensions.http.custom_response.redirect_policy.v3.RedirectPolicy"
            );
            (code.clone(), RedirectPolicy::decode(any.value.as_slice()).unwrap())
        })
        .collect()
}

/// The route's cluster becomes the aggregate of it and the default
/// backend's (the backend's first port, none being given); the listed
/// codes become redirect policies; the virtual host's first route takes
/// their second requests to the default backend; the route without a
/// default backend is untouched.
#[test]
fn a_default_backend_is_an_aggregate_cluster_and_a_custom_response_policy() {
    let out =
        run(&[http_gateway(), with_default_backend("api.dc1.consul", None, &[404, 503], ("web.dc1.consul", 8080))]);
    assert_eq!(texts(&out.warnings), Vec::<String>::new());
    // `meshbridge translate --envoy` reads every message, nested ones too.
    for r in out.clusters.iter().chain(&out.routes).chain(&out.listeners) {
        let json = meshbridge_proto::envoy::to_json(r.body.type_url(), &r.body.value())
            .unwrap_or_else(|e| panic!("{}: {e}", r.name));
        assert!(json.to_string().contains("envoy"), "{json}");
    }
    let aggregate = format!("default-backend|{WEB}|{API}");
    let cluster: Cluster = decode(out.clusters.iter().find(|c| *c.name == aggregate).expect("the aggregate cluster"));
    let Some(envoy_types::pb::envoy::config::cluster::v3::cluster::ClusterDiscoveryType::ClusterType(t)) =
        &cluster.cluster_discovery_type
    else {
        panic!("a custom cluster type expected")
    };
    assert_eq!(t.name, "envoy.clusters.aggregate");
    let members = ClusterConfig::decode(t.typed_config.as_ref().unwrap().value.as_slice()).unwrap();
    assert_eq!(members.clusters, [WEB, API], "the route's own first, then the default backend");
    assert!(out.load_assignments.iter().all(|a| *a.name != aggregate), "an aggregate has no endpoints of its own");

    let routes = vhost(&out, "http.10080", "e.example.com").routes;
    let names: Vec<&str> = routes.iter().map(|r| r.name.as_str()).collect();
    let fallback = format!("x-meshbridge-default-backend|{API}");
    assert_eq!(names, [fallback.as_str(), "errs", "plain"]);
    let first = &routes[0];
    let m = first.r#match.as_ref().unwrap();
    assert_eq!(m.path_specifier, Some(PathSpecifier::Path("/".into())));
    let Some(HeaderMatchSpecifier::StringMatch(s)) = &m.headers[0].header_match_specifier else { panic!() };
    assert_eq!(
        (m.headers[0].name.as_str(), &s.match_pattern),
        ("x-meshbridge-default-backend", &Some(MatchPattern::Exact(API.into())))
    );
    assert_eq!(cluster_of(first), API);

    assert_eq!(cluster_of(&routes[1]), aggregate);
    assert_eq!(cluster_of(&routes[2]), WEB);
    assert!(custom_response(&routes[2]).is_none());
    let policies = policies(&custom_response(&routes[1]).expect("the route's custom response"));
    assert_eq!(policies.iter().map(|(c, _)| c.as_str()).collect::<Vec<_>>(), ["404", "503"]);
    for (code, p) in &policies {
        let Some(RedirectActionSpecifier::RedirectAction(r)) = &p.redirect_action_specifier else { panic!() };
        assert_eq!(r.host_redirect, "", "the same host");
        assert!(format!("{:?}", r.path_rewrite_specifier).contains("PathRedirect(\"/\")"), "{r:?}");
        assert_eq!(p.status_code, None, "Envoy keeps the original code");
        let headers: Vec<(&str, &str)> = p
            .request_headers_to_add
            .iter()
            .map(|h| h.header.as_ref().unwrap())
            .map(|h| (h.key.as_str(), h.value.as_str()))
            .collect();
        assert_eq!(
            headers,
            [
                ("x-meshbridge-default-backend", API),
                ("X-Code", code.as_str()),
                ("X-Format", "%REQ(accept)%"),
                ("X-Namespace", "shop")
            ]
        );
    }
}

/// Without `custom-http-errors` the default backend only catches a
/// service with no endpoint: no policy, no fallback route. A port given
/// is the port used.
#[test]
fn a_default_backend_without_codes_is_only_the_aggregate() {
    let out = run(&[http_gateway(), with_default_backend("web.dc1.consul", Some(8080), &[], ("api.dc1.consul", 9090))]);
    assert_eq!(texts(&out.warnings), Vec::<String>::new());
    let routes = vhost(&out, "http.10080", "e.example.com").routes;
    assert_eq!(routes.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(), ["errs", "plain"]);
    assert_eq!(cluster_of(&routes[0]), format!("default-backend|{API}|{WEB}"));
    assert!(routes.iter().all(|r| custom_response(r).is_none()));
}

/// A route whose own service has no cluster goes to the default backend
/// (ingress-nginx's "no endpoints"), and says so; a default backend with
/// no cluster is reported and left out, the route kept as it was.
#[test]
fn a_missing_service_or_default_backend_is_reported() {
    let out = run(&[http_gateway(), with_default_backend("api.dc1.consul", None, &[503], ("gone.dc1.consul", 8080))]);
    let routes = vhost(&out, "http.10080", "e.example.com").routes;
    let errs = routes.iter().find(|r| r.name == "errs").unwrap();
    assert_eq!(cluster_of(errs), API);
    assert!(custom_response(errs).is_none(), "the default backend's own answers are not replaced");
    assert_eq!(
        texts(&out.warnings),
        ["VirtualService default/errs: http[0] (errs): host gone.dc1.consul has no cluster in the \
          standalone gateway (not a registry service); the default backend answers"]
    );

    let out =
        run(&[http_gateway(), with_default_backend("nothing.dc1.consul", None, &[503], ("web.dc1.consul", 8080))]);
    let routes = vhost(&out, "http.10080", "e.example.com").routes;
    assert_eq!(routes.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(), ["errs", "plain"]);
    assert_eq!(cluster_of(&routes[0]), WEB);
    assert!(custom_response(&routes[0]).is_none());
    assert_eq!(
        texts(&out.warnings),
        ["VirtualService default/errs: http[0] (errs): default backend: host nothing.dc1.consul has no \
          cluster in the standalone gateway (not a registry service); left out"]
    );
}
