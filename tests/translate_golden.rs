//! Golden files: what `meshbridge translate` prints for each example config
//! directory, as a user would run it: the Istio objects (`{name}.yaml`) and
//! the standalone gateway's Envoy config (`{name}.envoy.json`). A change to
//! translation shows up here as a diff. After an intended change, rewrite the
//! files with `MESHBRIDGE_BLESS=1 cargo test --test translate_golden` and
//! review the diff.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The example directories that hold config.
fn examples() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root().join("deploy/examples"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.is_dir() && std::fs::read_dir(p).unwrap().any(|f| f.unwrap().path().extension() == Some("yaml".as_ref()))
        })
        .collect();
    dirs.sort();
    dirs
}

fn translate(dir: &Path, extra: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_meshbridge"))
        .arg("translate")
        .arg(dir.strip_prefix(root()).unwrap())
        .args(extra)
        .current_dir(root())
        .env_remove("MESHBRIDGE_INGRESS_CLASS")
        .output()
        .expect("run meshbridge translate");
    assert!(out.status.success(), "{}: {}", dir.display(), String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// Each example against `tests/golden/{name}{suffix}`, translated with
/// `extra` flags; `routed` must appear in each output.
fn golden(suffix: &str, extra: &[&str], routed: &str) {
    let bless = std::env::var_os("MESHBRIDGE_BLESS").is_some();
    let examples = examples();
    assert!(examples.len() >= 4, "{examples:?}");
    let mut differ = Vec::new();
    for dir in examples {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let golden = root().join("tests/golden").join(format!("{name}{suffix}"));
        let got = translate(&dir, extra);
        assert!(got.contains(routed), "{name}: no route translated:\n{got}");
        if bless {
            std::fs::create_dir_all(golden.parent().unwrap()).unwrap();
            std::fs::write(&golden, &got).unwrap();
            continue;
        }
        let want = std::fs::read_to_string(&golden)
            .unwrap_or_else(|e| panic!("{}: {e}; write it with MESHBRIDGE_BLESS=1", golden.display()));
        if got != want {
            let first = got
                .lines()
                .zip(want.lines())
                .position(|(g, w)| g != w)
                .unwrap_or(got.lines().count().min(want.lines().count()));
            differ.push(format!(
                "{name}: differs from {} from line {}: got {:?}, want {:?}",
                golden.strip_prefix(root()).unwrap().display(),
                first + 1,
                got.lines().nth(first),
                want.lines().nth(first)
            ));
        }
    }
    assert!(differ.is_empty(), "{}\n(MESHBRIDGE_BLESS=1 rewrites the files)", differ.join("\n"));
}

#[test]
fn each_example_translates_to_its_golden_file() {
    golden(".yaml", &[], "kind: VirtualService");
}

/// `--envoy`: the standalone gateway's Envoy config, as a config dump.
#[test]
fn each_example_translates_to_its_golden_envoy_config() {
    golden(".envoy.json", &["--envoy"], "\"virtual_hosts\"");
}
