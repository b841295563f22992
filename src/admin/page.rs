//! The status page: `/` on the admin port, HTML rendered here, for a person
//! in a browser, as Consul's, Nacos's and Envoy's admin pages are.
//!
//! Read-only, no JavaScript and no asset from anywhere (the
//! `Content-Security-Policy` forbids loading any), every value escaped.
//! It shows what the JSON endpoints show: `/v1/registries` (per registry,
//! and a service's endpoints), `/debug/xdsz` (which client holds which
//! version of each type, ACKed or NACKed) and `/v1/config` (warnings and
//! errors). It answers under the admin token like every other path.

use std::fmt::Write as _;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::AdminState;
use super::registries::{health_source, public_endpoint};
use crate::translate::envoy::{CLUSTER_TYPE, ENDPOINT_TYPE, cluster_name};
use crate::xds::clients::ClientStatus;

/// Nothing may be loaded: styles are inline, there is no script or image.
const CSP: &str = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'";

const STYLE: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}\
table{border-collapse:collapse;margin:.5em 0 1.5em}th,td{border:1px solid #ccc;padding:.25em .6em;text-align:left;\
vertical-align:top}th{background:#f2f2f2}.bad{color:#b00;font-weight:600}.ok{color:#070}.muted{color:#777}\
code{font-size:13px}h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.2em}";

/// HTML-escape `s` for text and attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Percent-encode one path segment (everything but RFC 3986's unreserved).
fn seg(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

fn page(title: &str, body: &str) -> Response {
    let html = format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title><style>{STYLE}</style></head>\
         <body>{body}</body></html>\n",
        esc(title)
    );
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        html,
    )
        .into_response()
}

fn not_found(what: &str) -> Response {
    let body = format!("<h1>Not found</h1><p>{}</p><p><a href=\"/\">Back to the status page</a></p>", esc(what));
    let mut r = page("meshbridge: not found", &body);
    *r.status_mut() = StatusCode::NOT_FOUND;
    r
}

fn yes_no(v: bool, good_when: bool) -> String {
    let class = if v == good_when { "ok" } else { "bad" };
    format!("<span class=\"{class}\">{}</span>", if v { "yes" } else { "no" })
}

fn opt(v: Option<&str>) -> String {
    match v {
        Some(v) => esc(v),
        None => "<span class=\"muted\">–</span>".into(),
    }
}

/// `GET /`: registries, config warnings and errors, xDS clients.
pub async fn index(State(s): State<AdminState>) -> Response {
    let set = s.config.borrow().clone();
    let mut b = String::new();
    let ready = crate::startup::missing(&s.cache).is_empty() && !set.readiness.incomplete;
    let _ = write!(
        b,
        "<h1>meshbridge {}</h1><p>Config revision {} · ready: {} · draining: {} · \
         <a href=\"/v1/registries\">JSON</a> · <a href=\"/metrics\">metrics</a></p>",
        esc(env!("CARGO_PKG_VERSION")),
        set.revision,
        yes_no(ready, true),
        yes_no(s.clients.is_draining(), false),
    );

    b.push_str(
        "<h2>Registries</h2><table><tr><th>name</th><th>type</th><th>endpoint</th><th>healthy</th><th>stale</th>\
                <th>services</th><th>endpoints</th><th>repairs</th><th>last error</th></tr>",
    );
    for r in s.cache.registries() {
        let st = &r.status;
        let repairs: u64 = st.repairs.values().sum();
        let href = format!("/ui/registries/{}/{}", seg(r.key.kind.as_str()), seg(&r.key.name));
        let _ = write!(
            b,
            "<tr><td><a href=\"{href}\">{}</a></td><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{}</td><td>{repairs}</td><td>{}</td></tr>",
            esc(&r.key.name),
            esc(r.key.kind.as_str()),
            esc(&public_endpoint(&r.endpoint)),
            yes_no(st.healthy, true),
            yes_no(st.stale, false),
            r.services,
            r.endpoints,
            opt(st.last_error.as_deref()),
        );
    }
    b.push_str("</table>");

    let errors = &set.config.errors;
    let _ = write!(b, "<h2>Config errors ({})</h2>", errors.len());
    if !errors.is_empty() {
        b.push_str("<ul>");
        for e in errors.iter() {
            let _ = write!(b, "<li class=\"bad\">{}</li>", esc(e));
        }
        b.push_str("</ul>");
    }
    let warnings: Vec<_> = set.warnings().collect();
    let _ = write!(b, "<h2>Translation warnings ({})</h2>", warnings.len());
    if !warnings.is_empty() {
        b.push_str("<table><tr><th>object</th><th>reason</th><th>detail</th></tr>");
        for w in warnings {
            let _ = write!(
                b,
                "<tr><td>{}</td><td><code>{}</code></td><td>{}</td></tr>",
                esc(&w.object),
                esc(w.reason.as_str()),
                esc(&w.detail)
            );
        }
        b.push_str("</table>");
    }

    let clients = s.clients.snapshot();
    let _ = write!(b, "<h2>xDS clients ({})</h2>", clients.len());
    clients_table(&mut b, &clients);
    page("meshbridge status", &b)
}

/// Per client and type: what was sent, ACKed and NACKed.
fn clients_table(b: &mut String, clients: &[ClientStatus]) {
    if clients.is_empty() {
        b.push_str("<p class=\"muted\">No client is connected.</p>");
        return;
    }
    b.push_str(
        "<table><tr><th>client</th><th>peer</th><th>mode</th><th>type</th><th>sent</th><th>ACKed</th>\
                <th>NACKed</th></tr>",
    );
    for c in clients {
        for (url, t) in &c.types {
            let short = url.rsplit('.').next().unwrap_or(url);
            let acked = match (&t.last_ack, &t.last_sent_version) {
                (Some(a), Some(s)) if a == s => format!("<span class=\"ok\">{}</span>", esc(a)),
                (Some(a), _) => esc(a),
                (None, _) => opt(None),
            };
            let nacked = match (&t.last_nack, &t.last_nack_detail) {
                (Some(v), detail) => format!("<span class=\"bad\">{}</span> {}", esc(v), opt(detail.as_deref())),
                (None, _) => opt(None),
            };
            let _ = write!(
                b,
                "<tr><td>{}</td><td><code>{}</code></td><td>{}</td><td title=\"{}\">{}</td><td>{}</td><td>{acked}</td>\
                 <td>{nacked}</td></tr>",
                esc(&c.node_id),
                esc(&c.peer),
                esc(c.mode),
                esc(url),
                esc(short),
                opt(t.last_sent_version.as_deref()),
            );
        }
    }
    b.push_str("</table>");
}

/// The registry of type `kind` called `name`, if there is one.
fn registry_report(s: &AdminState, kind: &str, name: &str) -> Option<crate::cache::RegistryReport> {
    s.cache.registries().into_iter().find(|r| r.key.kind.as_str() == kind && r.key.name == name)
}

/// `GET /ui/registries/{type}/{name}`: one registry's services.
pub async fn registry(State(s): State<AdminState>, p: Result<Path<(String, String)>, PathRejection>) -> Response {
    let Ok(Path((kind, name))) = p else { return not_found("bad path") };
    let Some(report) = registry_report(&s, &kind, &name) else {
        return not_found(&format!("no registry {kind}/{name}"));
    };
    let services = s.cache.registry(&report.key).map(|(_, svcs)| svcs).unwrap_or_default();
    let mut b = String::new();
    let _ = write!(
        b,
        "<p><a href=\"/\">Status</a></p><h1>Registry {} ({})</h1><p>Endpoint <code>{}</code> · healthy: {} · \
         stale: {} · {} services, {} endpoints · last error: {}</p>",
        esc(&name),
        esc(&kind),
        esc(&public_endpoint(&report.endpoint)),
        yes_no(report.status.healthy, true),
        yes_no(report.status.stale, false),
        report.services,
        report.endpoints,
        opt(report.status.last_error.as_deref()),
    );
    b.push_str("<h2>Repairs</h2><table><tr>");
    for kind in meshbridge_registries::RepairKind::ALL {
        let _ = write!(b, "<th>{}</th>", esc(kind.as_str()));
    }
    b.push_str("</tr><tr>");
    for kind in meshbridge_registries::RepairKind::ALL {
        let _ = write!(b, "<td>{}</td>", report.status.repairs.get(kind.as_str()).copied().unwrap_or(0));
    }
    b.push_str("</tr></table><h2>Services</h2><table><tr><th>host</th><th>ports</th><th>endpoints</th></tr>");
    for svc in services.values() {
        let ports: Vec<String> = svc.ports.iter().map(|p| format!("{} {}", p.number, p.protocol)).collect();
        let _ = write!(
            b,
            "<tr><td><a href=\"/ui/registries/{}/{}/services/{}\">{}</a></td><td>{}</td><td>{}</td></tr>",
            seg(&kind),
            seg(&name),
            seg(&svc.host),
            esc(&svc.host),
            esc(&ports.join(", ")),
            svc.endpoints.len()
        );
    }
    b.push_str("</table>");
    page(&format!("meshbridge: registry {name}"), &b)
}

/// `GET /ui/registries/{type}/{name}/services/{host}`: a service's
/// endpoints, its clusters' current versions, and what each client holds.
pub async fn service(
    State(s): State<AdminState>,
    p: Result<Path<(String, String, String)>, PathRejection>,
) -> Response {
    let Ok(Path((kind, name, host))) = p else { return not_found("bad path") };
    let Some(report) = registry_report(&s, &kind, &name) else {
        return not_found(&format!("no registry {kind}/{name}"));
    };
    let Some(svc) = s.cache.registry(&report.key).and_then(|(_, mut svcs)| svcs.remove(&host)) else {
        return not_found(&format!("registry {kind}/{name} has no service {host}"));
    };
    let mut b = String::new();
    let _ = write!(
        b,
        "<p><a href=\"/\">Status</a> › <a href=\"/ui/registries/{}/{}\">{}</a></p><h1>{}</h1>\
         <p>Health: {}</p><h2>Endpoints ({})</h2><table><tr><th>address</th><th>port</th><th>weight</th>\
         <th>labels</th></tr>",
        seg(&kind),
        seg(&name),
        esc(&name),
        esc(&svc.host),
        esc(health_source(report.key.kind)),
        svc.endpoints.len()
    );
    for ep in &svc.endpoints {
        let labels: Vec<String> = ep.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let _ = write!(
            b,
            "<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td><code>{}</code></td></tr>",
            esc(&ep.address),
            ep.port,
            ep.weight,
            esc(&labels.join(", "))
        );
    }
    b.push_str("</table>");

    let set = s.config.borrow().clone();
    b.push_str("<h2>In the served config</h2><table><tr><th>type</th><th>resource</th><th>version now</th></tr>");
    let mut current = Vec::new();
    for port in &svc.ports {
        let cluster = cluster_name(port.number, "", &svc.host);
        for url in [CLUSTER_TYPE, ENDPOINT_TYPE] {
            let version = set.envoy.get(url).and_then(|r| r.get(&cluster)).map(|r| r.version.to_string());
            let _ = write!(
                b,
                "<tr><td>{}</td><td><code>{}</code></td><td>{}</td></tr>",
                esc(url.rsplit('.').next().unwrap_or(url)),
                esc(&cluster),
                opt(version.as_deref())
            );
            current.push((url, cluster.clone(), version));
        }
    }
    b.push_str("</table><h2>What each xDS client holds</h2>");
    holders_table(&mut b, &s.clients.snapshot(), &current);
    page(&format!("meshbridge: {host}"), &b)
}

/// Per client and resource of `current` (type URL, name, version now):
/// the version the client holds (sent in the response it last ACKed) and
/// the one it last refused, if that response carried another.
fn holders_table(b: &mut String, clients: &[ClientStatus], current: &[(&str, String, Option<String>)]) {
    let rows: Vec<_> = clients
        .iter()
        .flat_map(|c| current.iter().filter_map(move |(url, name, now)| Some((c, *url, name, now, c.types.get(*url)?))))
        .collect();
    if rows.is_empty() {
        b.push_str("<p class=\"muted\">No connected client asked for these types.</p>");
        return;
    }
    b.push_str(
        "<table><tr><th>client</th><th>peer</th><th>mode</th><th>type</th><th>resource</th><th>holds (ACKed)</th>\
         <th>NACKed</th></tr>",
    );
    for (c, url, name, now, t) in rows {
        let held = t.acked.as_ref().and_then(|h| h.version(name));
        let holds = match (&held, now) {
            (Some(v), Some(now)) if **v == **now => format!("<span class=\"ok\">{}</span> (current)", esc(v)),
            (Some(v), _) => format!("{} (not current)", esc(v)),
            (None, _) if t.acked.is_some() => "<span class=\"muted\">not held</span>".to_string(),
            (None, _) => opt(None),
        };
        let refused = t.nacked.as_ref().and_then(|h| h.version(name)).filter(|v| held.as_ref() != Some(v));
        let nacked = match refused {
            Some(v) => format!("<span class=\"bad\">{}</span> {}", esc(&v), opt(t.last_nack_detail.as_deref())),
            None => opt(None),
        };
        let _ = write!(
            b,
            "<tr><td>{}</td><td><code>{}</code></td><td>{}</td><td title=\"{}\">{}</td><td><code>{}</code></td>\
             <td>{holds}</td><td>{nacked}</td></tr>",
            esc(&c.node_id),
            esc(&c.peer),
            esc(c.mode),
            esc(url),
            esc(url.rsplit('.').next().unwrap_or(url)),
            esc(name),
        );
    }
    b.push_str("</table>");
}
