//! The gRPC client against a real rnacos (`MESHBRIDGE_RNACOS_BIN`, see
//! `e2e/env.sh`): connect, list, read, subscribe, a push, a reconnect after
//! the server restarts. Without the variable (or with a path that does not
//! exist) they fail and name it: `e2e/test.sh` sources rnacos, so CI always
//! runs them.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::*;
use crate::nacos::decode::DEFAULT_GROUP;
use crate::spec::{RegistryKind, RegistrySpec};

struct Rnacos {
    child: Option<Child>,
    http: u16,
    dir: std::path::PathBuf,
    bin: String,
}

impl Drop for Rnacos {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_pair() -> u16 {
    loop {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        if port < 64000 && std::net::TcpListener::bind(("127.0.0.1", port + 1000)).is_ok() {
            return port;
        }
    }
}

/// The rnacos binary `e2e/setup.sh` installed, as `e2e`'s `binary_from_env`
/// finds it (that crate depends on this one, so it cannot be used here).
fn rnacos_bin() -> String {
    const VAR: &str = "MESHBRIDGE_RNACOS_BIN";
    let Ok(bin) = std::env::var(VAR) else {
        panic!("{VAR} is not set: run `source e2e/env.sh rnacos` (it installs the server)");
    };
    assert!(std::path::Path::new(&bin).exists(), "{VAR}={bin} does not exist: run e2e/setup.sh");
    bin
}

impl Rnacos {
    async fn start() -> Rnacos {
        let bin = rnacos_bin();
        let http = free_pair();
        let dir = std::env::temp_dir().join(format!("meshbridge-grpc-test-{}-{http}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut r = Rnacos { child: None, http, dir, bin };
        r.spawn().await;
        r
    }

    async fn spawn(&mut self) {
        let data = self.dir.join("data").display().to_string();
        let env_file = self.dir.join("rnacos.env");
        std::fs::write(&env_file, "").unwrap();
        let child = Command::new(&self.bin)
            .arg("-e")
            .arg(&env_file)
            .current_dir(&self.dir)
            .env("RNACOS_HTTP_PORT", self.http.to_string())
            .env("RNACOS_GRPC_PORT", (self.http + 1000).to_string())
            .env("RNACOS_HTTP_CONSOLE_PORT", "0")
            .env("RNACOS_SDK_HOST", "127.0.0.1")
            .env("RNACOS_CONSOLE_HOST", "127.0.0.1")
            .env("RNACOS_RAFT_NODE_ADDR", format!("127.0.0.1:{}", self.http + 1000))
            .env("RNACOS_DATA_DIR", &data)
            .env("RNACOS_CONFIG_DB_DIR", &data)
            .env("RNACOS_NAMING_PERPETUAL_INSTANCE_PROBE_INTERVAL_SECOND", "0")
            .env("RNACOS_ENABLE_METRICS", "false")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("rnacos starts");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        let url = format!("http://127.0.0.1:{}/nacos/v1/ns/service/list?pageNo=1&pageSize=1", self.http);
        while Instant::now() < deadline {
            if let Ok(r) = reqwest::get(&url).await
                && r.status().is_success()
                && std::net::TcpStream::connect(("127.0.0.1", self.http + 1000)).is_ok()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("rnacos did not start");
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn server(&self) -> String {
        format!("127.0.0.1:{}", self.http)
    }

    async fn register(&self, service: &str, ip: &str) {
        let url = format!(
            "http://127.0.0.1:{}/nacos/v1/ns/instance?serviceName={service}&ip={ip}&port=8080&ephemeral=false",
            self.http
        );
        let r = reqwest::Client::new().post(url).send().await.unwrap();
        assert!(r.status().is_success(), "register: {}", r.status());
    }
}

async fn client(nacos: &Rnacos) -> GrpcApi {
    let spec = RegistrySpec::new(RegistryKind::Nacos2, "n", "127.0.0.1", nacos.http);
    let auth = Arc::new(Auth::new(&spec, reqwest::Client::new()).unwrap());
    GrpcApi::connect("n", vec![nacos.server()], "public", auth, None).await.expect("connects")
}

async fn eventually<F: std::future::Future<Output = bool>>(what: &str, mut f: impl FnMut() -> F) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{what}: not within 20 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_reads_subscribes_and_receives_pushes_from_rnacos() {
    let nacos = Rnacos::start().await;
    nacos.register("web", "10.0.0.1").await;
    nacos.register("api", "10.0.0.9").await;
    let api = client(&nacos).await;
    let mut names = api.list_services(DEFAULT_GROUP).await.unwrap();
    names.sort();
    assert_eq!(names, ["api", "web"]);
    api.probe(DEFAULT_GROUP).await.unwrap();
    let web = ServiceKey::new(DEFAULT_GROUP, "web");
    let instances = api.instances(&web).await.unwrap();
    assert_eq!(instances.iter().map(|i| i.ip.as_str()).collect::<Vec<_>>(), ["10.0.0.1"]);

    // The subscribe answer carries the instances: queued as the hint.
    let pushed = Arc::new(Pushed::default());
    api.subscribe(&web, pushed.clone()).await.unwrap();
    let (key, hint) = tokio::time::timeout(Duration::from_secs(5), pushed.next()).await.unwrap();
    assert_eq!(key, web);
    assert_eq!(hint.unwrap().len(), 1);

    // A change is pushed over the bi-stream with its instances.
    nacos.register("web", "10.0.0.2").await;
    let (key, hint) = tokio::time::timeout(Duration::from_secs(10), pushed.next()).await.expect("push arrives");
    assert_eq!(key, web);
    let mut ips: Vec<String> = hint.expect("push carries instances").into_iter().map(|i| i.ip).collect();
    ips.sort();
    assert_eq!(ips, ["10.0.0.1", "10.0.0.2"]);

    // A service not subscribed to is not queued.
    nacos.register("api", "10.0.0.10").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    api.unsubscribe(&web).await;
    nacos.register("web", "10.0.0.3").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        tokio::time::timeout(Duration::from_millis(300), pushed.next()).await.is_err(),
        "nothing queued for unsubscribed services"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnects_after_a_restart_and_subscribes_again() {
    let mut nacos = Rnacos::start().await;
    nacos.register("web", "10.0.0.1").await;
    let api = client(&nacos).await;
    let web = ServiceKey::new(DEFAULT_GROUP, "web");
    let pushed = Arc::new(Pushed::default());
    api.subscribe(&web, pushed.clone()).await.unwrap();
    let _ = pushed.next().await;

    nacos.stop();
    let err = api.probe(DEFAULT_GROUP).await.unwrap_err();
    assert!(matches!(err, RegistryError::Unreachable { .. }), "{err:?}");
    nacos.spawn().await;
    let back = Instant::now();
    // Persistent instances are kept across a restart; the new connection
    // is subscribed again and the service queued for a read.
    tokio::time::timeout(Duration::from_secs(10), api.reachable_again()).await.expect("reconnects promptly");
    eprintln!("reconnected {:?} after the server was back", back.elapsed());
    let (key, _) = tokio::time::timeout(Duration::from_secs(10), pushed.next()).await.expect("resubscribed");
    assert_eq!(key, web);
    api.probe(DEFAULT_GROUP).await.unwrap();
    nacos.register("web", "10.0.0.2").await;
    eventually("push after reconnect", || {
        let pushed = pushed.clone();
        async move {
            // rnacos may answer the resubscription before it has loaded its
            // persistent instances again: only the new one is sure to show.
            let got = tokio::time::timeout(Duration::from_millis(200), pushed.next()).await;
            matches!(got, Ok((_, Some(h))) if h.iter().any(|i| i.ip == "10.0.0.2"))
        }
    })
    .await;
    assert!(api.connected_to().is_some());
}
