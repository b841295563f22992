//! A gateway Envoy and where its config comes from, so one scenario's
//! requests and checks run on both paths meshbridge serves:
//!
//! - [`Via::Standalone`]: meshbridge's own ADS (listeners, routes, clusters,
//!   endpoints) to the Envoy, listening on a free port;
//! - [`Via::Istiod`]: meshbridge's MCP to a REAL istiod (with a real API
//!   server), and istiod's xDS to a stock Envoy as the Ingress Gateway
//!   ([`Istiod::gateway_envoy`]).
//!
//! Either way the Envoy answers on loopback at its `listen_port`.

use std::path::Path;

use meshbridge::run::{App, RunArgs};

use crate::apiserver::ApiServer;
use crate::envoy::{AdsMode, Envoy};
use crate::istiod::{Istiod, Options, Version};
use crate::process::free_port;
use crate::traffic::start_gateway;

/// Where the gateway Envoy's config comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    Standalone,
    /// This istiod build.
    Istiod(Version),
}

/// meshbridge on a config directory, and a gateway Envoy fed as `via` says.
pub struct Gateway {
    pub via: Via,
    pub app: App,
    pub envoy: Envoy,
    /// Through istiod: the API server and istiod, alive as long as this.
    pub istiod: Option<(ApiServer, Istiod)>,
}

impl Gateway {
    /// Start meshbridge on `dir` (already written), then the rest of the
    /// path and the Envoy. Needs `source e2e/env.sh envoy`, and for
    /// [`Via::Istiod`] `kubetools kube-apiserver` and the istiod build
    /// (`istiod` or `istiod-1.27`) too.
    pub async fn start(dir: &Path, via: Via) -> anyhow::Result<Gateway> {
        match via {
            Via::Standalone => {
                let port = free_port();
                let app = start_gateway(dir, port).await?;
                let envoy = Envoy::start_gateway(app.xds_addr, AdsMode::Sotw, port).await?;
                Ok(Gateway { via, app, envoy, istiod: None })
            }
            Via::Istiod(version) => {
                let app = App::start(RunArgs::loopback(dir)).await?;
                let api = ApiServer::start().await?;
                let options =
                    Options { version, upstream_envoy: true, stock_gateway_listeners: true, secure_xds: false };
                let istiod = Istiod::start(&api, app.xds_addr, options).await?;
                let envoy = istiod.gateway_envoy(&api).await?;
                Ok(Gateway { via, app, envoy, istiod: Some((api, istiod)) })
            }
        }
    }

    /// istiod's log tail, for failure messages (empty on the standalone path).
    pub fn istiod_log(&self) -> String {
        self.istiod.as_ref().map(|(_, i)| i.log_tail(4000)).unwrap_or_default()
    }
}
