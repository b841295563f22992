//! The Gateways, VirtualServices and DestinationRules the gateway
//! translation reads, picked out of the typed Istio objects, each list
//! sorted by `namespace/name` whatever order they came in.

use crate::translate::model::{DestinationRuleSpec, GatewaySpec, IstioObject, Spec, VirtualServiceSpec};
use crate::translate::warning::{Reason, Warning};

/// An object's spec with its identity.
#[derive(Debug)]
pub struct Named<'a, T> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub spec: &'a T,
}

impl<T> Named<'_, T> {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

#[derive(Debug, Default)]
pub struct Specs<'a> {
    pub gateways: Vec<Named<'a, GatewaySpec>>,
    pub virtual_services: Vec<Named<'a, VirtualServiceSpec>>,
    pub destination_rules: Vec<Named<'a, DestinationRuleSpec>>,
}

impl<'a> Specs<'a> {
    pub fn gateway(&self, namespace: &str, name: &str) -> Option<&Named<'a, GatewaySpec>> {
        self.gateways.iter().find(|g| g.namespace == namespace && g.name == name)
    }
}

/// Pick the objects out; anything else is not ours and is skipped.
pub fn collect<'a>(objects: impl IntoIterator<Item = &'a IstioObject>, warnings: &mut Vec<Warning>) -> Specs<'a> {
    let mut specs = Specs::default();
    for obj in objects {
        let (namespace, name) = (obj.metadata.namespace.as_str(), obj.metadata.name.as_str());
        match &obj.spec {
            Spec::Gateway(spec) => specs.gateways.push(Named { namespace, name, spec }),
            Spec::VirtualService(spec) => specs.virtual_services.push(Named { namespace, name, spec }),
            Spec::DestinationRule(spec) => specs.destination_rules.push(Named { namespace, name, spec }),
            // The source ranges an AuthorizationPolicy carries for istiod
            // reach the standalone gateway as route fields.
            Spec::ServiceEntry(_) | Spec::EnvoyFilter(_) | Spec::AuthorizationPolicy(_) => {}
        }
    }
    dedup(&mut specs.gateways, "Gateway", warnings);
    dedup(&mut specs.virtual_services, "VirtualService", warnings);
    dedup(&mut specs.destination_rules, "DestinationRule", warnings);
    specs
}

/// Sort by key; of two objects with the same key keep the first given.
fn dedup<T>(list: &mut Vec<Named<'_, T>>, kind: &str, warnings: &mut Vec<Warning>) {
    // A stable sort keeps the input order among equal keys.
    list.sort_by(|a, b| (a.namespace, a.name).cmp(&(b.namespace, b.name)));
    list.dedup_by(|later, earlier| {
        let same = later.namespace == earlier.namespace && later.name == earlier.name;
        if same {
            warnings.push(Warning::new(
                format!("{kind} {}", later.key()),
                Reason::Unservable,
                "given twice; the first is used",
            ));
        }
        same
    });
}
