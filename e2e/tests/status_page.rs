//! The status page in a real browser: Debian's headless Chromium
//! (`e2e/setup.sh chromium`) renders `/` and a service's page of a
//! meshbridge running the standalone example, takes a screenshot (its path
//! is printed), and every request it would send anywhere but loopback goes
//! to a listener of the test's own (its proxy), which must see none from the
//! page. Chromium's own background calls (component updates, account and
//! time checks, to the Google hosts in [`CHROMIUM_OWN`]) are not the page's
//! and are left out; a canary page that does load from elsewhere shows the
//! listener catches what a page asks for.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use meshbridge::run::{AdminArgs, App, RunArgs};
use meshbridge_e2e::process::binary_from_env;

/// Counts the connections made to it: Chromium's proxy for everything that
/// is not loopback.
async fn recorder() -> (String, Arc<std::sync::Mutex<Vec<String>>>) {
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let requests = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let requests = requests.clone();
            tokio::spawn(async move {
                let mut head = [0u8; 512];
                let n =
                    tokio::time::timeout(Duration::from_secs(2), sock.read(&mut head)).await.ok().and_then(Result::ok);
                let line = String::from_utf8_lossy(&head[..n.unwrap_or(0)]).lines().next().unwrap_or("").to_owned();
                requests.lock().unwrap().push(line);
            });
        }
    });
    (format!("http://{addr}"), seen)
}

/// Hosts Chromium calls on its own, whatever the page: not the page's.
const CHROMIUM_OWN: [&str; 4] =
    ["update.googleapis.com", "accounts.google.com", "clients2.google.com", "optimizationguide-pa.googleapis.com"];

/// The requests the recorder saw, less Chromium's own.
fn from_pages(seen: &std::sync::Mutex<Vec<String>>) -> Vec<String> {
    seen.lock().unwrap().iter().filter(|l| !CHROMIUM_OWN.iter().any(|h| l.contains(h))).cloned().collect()
}

/// A loopback page that loads an image from elsewhere: what the recorder
/// must catch.
async fn canary() -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let mut head = [0u8; 2048];
            let _ = sock.read(&mut head).await;
            let body = "<!DOCTYPE html><html><body><img src=\"http://status-page-canary.example/x.png\"></body></html>";
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = sock.write_all(answer.as_bytes()).await;
        }
    });
    format!("http://{addr}/")
}

/// Run Chromium on `url` with `extra` (a screenshot or a DOM dump); its stdout.
async fn chromium(bin: &Path, profile: &Path, proxy: &str, url: &str, extra: &[String]) -> String {
    let mut cmd = tokio::process::Command::new(bin);
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-default-apps",
        "--disable-sync",
        "--window-size=1280,900",
    ])
    .arg(format!("--user-data-dir={}", profile.display()))
    // Loopback is reached directly (Chromium's implicit bypass); anything
    // else would go to the recorder.
    .arg(format!("--proxy-server={proxy}"))
    .args(extra)
    .arg(url)
    .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output()).await.expect("chromium ran").unwrap();
    assert!(out.status.success(), "chromium: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_renders_in_chromium_and_loads_nothing_from_elsewhere() {
    let bin = binary_from_env("MESHBRIDGE_CHROMIUM_BIN").unwrap();
    let config = tempfile::tempdir().unwrap();
    let example = meshbridge_e2e::apiserver::repo().join("deploy/examples/standalone");
    for entry in std::fs::read_dir(&example).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, config.path().join(path.file_name().unwrap())).unwrap();
    }
    let app = App::start_with(RunArgs::loopback(config.path()), AdminArgs::default()).await.unwrap();
    let base = format!("http://{}", app.admin_addr);
    let (proxy, seen) = recorder().await;
    let profile = tempfile::tempdir().unwrap();

    let dom = chromium(&bin, profile.path(), &proxy, &format!("{base}/"), &["--dump-dom".into()]).await;
    assert!(dom.contains("<h1>meshbridge"), "{dom}");
    assert!(dom.contains("<a href=\"/ui/registries/static/local-echo\">local-echo</a>"), "{dom}");
    assert!(dom.contains("Registries") && dom.contains("xDS clients (0)"), "{dom}");

    let service = format!("{base}/ui/registries/static/local-echo/services/local-echo.static");
    let dom = chromium(&bin, profile.path(), &proxy, &service, &["--dump-dom".into()]).await;
    assert!(dom.contains("<code>127.0.0.1</code>"), "the endpoint:\n{dom}");
    assert!(dom.contains("outbound|80||local-echo.static"), "its cluster:\n{dom}");

    let shots = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("status-page");
    std::fs::create_dir_all(&shots).unwrap();
    for (name, url) in [("index", format!("{base}/")), ("service", service)] {
        let file = shots.join(format!("{name}.png"));
        let _ = std::fs::remove_file(&file);
        chromium(&bin, profile.path(), &proxy, &url, &[format!("--screenshot={}", file.display())]).await;
        let png = std::fs::read(&file).expect("a screenshot");
        assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "{name}: {} bytes", png.len());
        println!("FIGURE status_page screenshot {name}: {} ({} bytes)", file.display(), png.len());
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let from_pages_seen = from_pages(&seen);
    assert!(
        from_pages_seen.is_empty(),
        "the status page made Chromium send requests beyond loopback: {from_pages_seen:?}"
    );

    // The check can fail: a page that loads from elsewhere is caught.
    let canary = canary().await;
    chromium(&bin, profile.path(), &proxy, &canary, &["--dump-dom".into()]).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let caught = from_pages(&seen);
    assert!(
        caught.iter().any(|l| l.contains("status-page-canary.example")),
        "the canary's load was missed: {caught:?}"
    );
    app.stop().await;
}
