//! `default-backend` and `custom-http-errors`: read under both prefixes
//! into a route field no Istio object carries, a `standalone_only`
//! warning for istiod, and bad values reported by annotation.

use super::ingress_tests::{opts, shop_ingress};
use super::*;
use crate::config::ingress_docs as docs;
use crate::translate::model::{DefaultBackend, Destination, PortSelector};

/// Each VirtualService route's default backend, by route name, and every
/// warning as `reason: detail`.
fn fallbacks(yaml: &[String]) -> (BTreeMap<String, Option<DefaultBackend>>, Vec<String>) {
    let mut opts = opts();
    opts.service_hosts.insert("errors.static".into(), "errors.static".into());
    let t = translate(&docs(&yaml.join("---\n")), &opts);
    for o in &t.objects {
        if let Err(w) = crate::translate::mcp::resource(o, 0) {
            panic!("{w}");
        }
        assert!(!o.spec.to_json().to_string().to_lowercase().contains("default"), "an Istio field was made up");
    }
    let routes = t
        .objects
        .iter()
        .filter_map(|o| match &o.spec {
            Spec::VirtualService(vs) => Some(vs.http.iter()),
            _ => None,
        })
        .flatten()
        .map(|r| (r.name.clone(), r.default_backend.clone()))
        .collect();
    (routes, t.warnings.iter().map(|w| format!("{}: {}: {}", w.reason, w.object, w.detail)).collect())
}

fn backend(host: &str, port: Option<u32>, codes: &[u16], ingress: &str) -> Option<DefaultBackend> {
    let destination = Destination {
        host: host.into(),
        subset: None,
        port: port.map(|number| PortSelector { number }),
        port_name: None,
    };
    let headers =
        [("X-Namespace", "shop"), ("X-Ingress-Name", ingress), ("X-Service-Name", "web"), ("X-Service-Port", "80")];
    let headers = headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    Some(DefaultBackend { destination, codes: codes.to_vec(), headers })
}

/// ingress-nginx's form (a Service in the Ingress's namespace) and
/// Higress's (`namespace/name`), a port, a registry service; the codes
/// sorted, each once; one `standalone_only` warning per Ingress.
#[test]
fn default_backends_and_their_codes_reach_the_routes_for_the_standalone_gateway() {
    let (routes, warnings) = fallbacks(&[
        shop_ingress(
            "nginx",
            1,
            &[
                ("nginx.ingress.kubernetes.io/default-backend", "errors"),
                ("nginx.ingress.kubernetes.io/custom-http-errors", "503, 404,503"),
            ],
            &[("/nginx", "Exact", "web")],
        ),
        shop_ingress(
            "higress",
            2,
            &[("higress.io/default-backend", "ops/errors:8080"), ("higress.io/custom-http-errors", "502")],
            &[("/higress", "Exact", "web")],
        ),
        shop_ingress(
            "registry",
            3,
            &[("higress.io/default-backend", "errors.static:80")],
            &[("/registry", "Exact", "web")],
        ),
        shop_ingress("plain", 4, &[], &[("/plain", "Exact", "web")]),
        // A redirect answers itself: nothing to fall back from.
        shop_ingress(
            "moved",
            5,
            &[("higress.io/default-backend", "errors"), ("higress.io/permanent-redirect", "https://b.example/")],
            &[("/moved", "Exact", "web")],
        ),
    ]);
    assert_eq!(routes["shop-nginx-0"], backend("errors.shop.svc.cluster.local", None, &[404, 503], "nginx"));
    assert_eq!(routes["shop-higress-0"], backend("errors.ops.svc.cluster.local", Some(8080), &[502], "higress"));
    assert_eq!(routes["shop-registry-0"], backend("errors.static", Some(80), &[], "registry"));
    assert_eq!((&routes["shop-plain-0"], &routes["shop-moved-0"]), (&None, &None));
    let standalone: Vec<&String> = warnings.iter().filter(|w| w.starts_with("standalone_only")).collect();
    assert_eq!(standalone.len(), 4, "{warnings:#?}");
    assert!(
        standalone[0].starts_with(
            "standalone_only: Ingress shop/nginx: nginx.ingress.kubernetes.io/default-backend / custom-http-errors \
             are served by the standalone gateway only"
        ),
        "{standalone:?}"
    );
    assert_eq!(warnings.len(), 4, "{warnings:#?}");
}

/// Bad values name the Ingress and the annotation; the routes still route,
/// a bad code leaves the others, and nothing else is disturbed.
#[test]
fn bad_default_backends_and_codes_are_reported_and_left_out() {
    let (routes, warnings) = fallbacks(&[
        shop_ingress(
            "codes",
            1,
            &[
                ("higress.io/default-backend", "errors"),
                ("higress.io/custom-http-errors", "404,abc,200,600,-1,99999999999999999999999,503"),
            ],
            &[("/codes", "Exact", "web")],
        ),
        shop_ingress(
            "form",
            2,
            &[("higress.io/default-backend", "Not A Service"), ("higress.io/custom-http-errors", "503")],
            &[("/form", "Exact", "web")],
        ),
        shop_ingress(
            "alone",
            3,
            &[("nginx.ingress.kubernetes.io/custom-http-errors", "503")],
            &[("/alone", "Exact", "web")],
        ),
        shop_ingress(
            "nowhere",
            4,
            &[("higress.io/default-backend", "nowhere.static")],
            &[("/nowhere", "Exact", "web")],
        ),
        shop_ingress("port", 5, &[("higress.io/default-backend", "errors:0")], &[("/port", "Exact", "web")]),
    ]);
    assert_eq!(routes["shop-codes-0"], backend("errors.shop.svc.cluster.local", None, &[404, 503], "codes"));
    for name in ["shop-form-0", "shop-alone-0", "shop-nowhere-0", "shop-port-0"] {
        assert_eq!(routes[name], None, "{name}");
    }
    let invalid: Vec<&str> = warnings.iter().filter_map(|w| w.strip_prefix("invalid_ingress: ")).collect();
    assert_eq!(
        invalid,
        [
            "Ingress shop/codes: annotation higress.io/custom-http-errors: \"abc\" is not a status code; left out",
            "Ingress shop/codes: annotation higress.io/custom-http-errors: 200 is not an error status from 400 to 599; left out",
            "Ingress shop/codes: annotation higress.io/custom-http-errors: 600 is not an error status from 400 to 599; left out",
            "Ingress shop/codes: annotation higress.io/custom-http-errors: \"-1\" is not a status code; left out",
            "Ingress shop/codes: annotation higress.io/custom-http-errors: \"99999999999999999999999\" is not a status code; left out",
            "Ingress shop/form: annotation higress.io/default-backend: \"Not A Service\" is not [namespace/]service[:port] nor a registry service; no default backend, and no answer is replaced",
            "Ingress shop/alone: annotation nginx.ingress.kubernetes.io/custom-http-errors: has no effect without default-backend; ignored",
            "Ingress shop/nowhere: annotation higress.io/default-backend: no registry service \"nowhere.static\"; no default backend",
            "Ingress shop/port: annotation higress.io/default-backend: \"errors:0\" has no port 1 to 65535 after ':'; ignored",
        ]
    );
    assert!(warnings.iter().all(|w| !w.starts_with("ignored_annotation")), "{warnings:#?}");
}

/// No value of either annotation makes the reader panic, and what it
/// keeps is always within the rules.
#[test]
fn arbitrary_input_never_panics() {
    use super::fallback::read_fallback;
    const ALPHABET: &[&str] =
        &["errors", "ns", "/", ":", "80", "0", ".", ",", " ", "4", "5", "9", "99999999999", "-", "é", "\0", "static"];
    let inputs: Vec<String> = super::syntax::random_inputs(ALPHABET, 0x9e37_79b9_7f4a_7c15, 5_000, 8).collect();
    for pair in inputs.chunks(2) {
        let [backend, codes] = pair else { continue };
        let mut get = |key: &str, _: bool| match key {
            "default-backend" => Some((format!("higress.io/{key}"), backend.clone())),
            "custom-http-errors" => Some((format!("higress.io/{key}"), codes.clone())),
            _ => None,
        };
        let mut warnings = Vec::new();
        if let Some(f) = read_fallback(&mut get, &mut warnings) {
            assert!(f.codes.iter().all(|c| (400..=599).contains(c)), "{codes:?}: {:?}", f.codes);
            assert!(f.codes.windows(2).all(|w| w[0] < w[1]), "{codes:?}: {:?}", f.codes);
        }
    }
}
