//! The docs cannot point nowhere.
//!
//! mdBook with mdbook-linkcheck is the usual way to check a book's links,
//! but installing it compiles for minutes on a cold CI machine; this test
//! does the part we need in milliseconds. It reads README.md, the other
//! top-level `*.md` files, `docs/README.md` and every page under
//! `docs/src/`, and fails on:
//!
//! - a relative link whose target file or folder does not exist;
//! - a `#anchor` that matches no heading of its target (GitHub's slugs,
//!   which mdBook's ids equal for the headings we write);
//! - a page under `docs/src/` that `SUMMARY.md` does not list (mdBook would
//!   leave it out of the book);
//! - a `--flag` shown for `meshbridge run` (in a command line, or in a code
//!   span of its own such as `` `--drain 5s` ``) that no clap definition in
//!   `src/` declares;
//! - a `run` flag or an McpBridge field (`REGISTRY_FIELDS`, `PROXY_FIELDS`)
//!   that the configuration reference does not mention.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Component, Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every Markdown file checked, relative to the repository root.
fn markdown_files() -> Vec<PathBuf> {
    let root = root();
    let mut files: Vec<PathBuf> = fs::read_dir(&root)
        .expect("read the repository root")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "md") && p.is_file())
        .collect();
    if root.join("docs/README.md").is_file() {
        files.push(root.join("docs/README.md"));
    }
    collect(&root.join("docs/src"), "md", &mut files);
    files.sort();
    files.into_iter().map(|p| p.strip_prefix(&root).expect("under the root").to_path_buf()).collect()
}

fn collect(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect(&path, ext, out);
        } else if path.extension().is_some_and(|e| e == ext) {
            out.push(path);
        }
    }
}

/// A Markdown file split into what the checks need: its prose lines (code
/// spans still in them, fenced blocks left out), its fenced code lines, and
/// its headings' anchors.
struct Page {
    prose: Vec<(usize, String)>,
    code: Vec<(usize, String)>,
    anchors: BTreeSet<String>,
}

fn page(text: &str) -> Page {
    let mut page = Page { prose: Vec::new(), code: Vec::new(), anchors: BTreeSet::new() };
    let mut fence: Option<&str> = None;
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|m| trimmed.starts_with(m));
        match (fence, marker) {
            (None, Some(m)) => fence = Some(m),
            (Some(open), Some(m)) if open == m && trimmed.trim_end() == m => fence = None,
            (Some(_), _) => page.code.push((i + 1, line.to_string())),
            (None, None) => {
                if let Some(title) = heading(trimmed) {
                    let base = slug(title);
                    let n = seen.entry(base.clone()).or_insert(0);
                    page.anchors.insert(if *n == 0 { base.clone() } else { format!("{base}-{n}") });
                    *n += 1;
                }
                page.prose.push((i + 1, line.to_string()));
            }
        }
    }
    page
}

/// The text of an ATX heading (`## Title`), if the line is one.
fn heading(line: &str) -> Option<&str> {
    let hashes = line.bytes().take_while(|b| *b == b'#').count();
    if !(1..=6).contains(&hashes) {
        return None;
    }
    let rest = &line[hashes..];
    if !rest.is_empty() && !rest.starts_with(' ') {
        return None;
    }
    Some(rest.trim().trim_end_matches('#').trim())
}

/// GitHub's heading anchor: the rendered text lowercased, everything but
/// letters, digits, `-`, `_` and spaces dropped, spaces turned into `-`.
fn slug(title: &str) -> String {
    let text = link_texts(title);
    text.chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .flat_map(char::to_lowercase)
        .collect()
}

/// `[text](target)` rendered as `text`.
fn link_texts(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(start) = rest.find('[') {
        out.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        match after.find("](").and_then(|close| after[close..].find(')').map(|end| (close, close + end))) {
            Some((close, end)) => {
                out.push_str(&after[..close]);
                rest = &after[end + 1..];
            }
            None => {
                out.push('[');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// A line with its code spans blanked out, so that `` `[a](b)` `` is not a link.
fn without_code_spans(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
            out.push(' ');
        } else {
            out.push(if in_code { ' ' } else { c });
        }
    }
    out
}

/// The code spans of a line.
fn code_spans(line: &str) -> Vec<&str> {
    line.split('`').skip(1).step_by(2).collect()
}

/// Targets of inline links `[text](target)` and definitions `[id]: target`.
fn link_targets(line: &str) -> Vec<String> {
    let line = without_code_spans(line);
    let mut targets = Vec::new();
    if let Some(rest) = line.trim_start().strip_prefix('[')
        && let Some((_, def)) = rest.split_once("]:")
    {
        targets.extend(def.split_whitespace().next().map(str::to_string));
    }
    let mut rest = line.as_str();
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let end = after.find(')').unwrap_or(after.len());
        let target = after[..end].split_whitespace().next().unwrap_or("");
        targets.push(target.trim_start_matches('<').trim_end_matches('>').to_string());
        rest = &after[end..];
    }
    targets
}

fn is_external(target: &str) -> bool {
    target.contains("://") || target.starts_with("mailto:") || target.starts_with('/')
}

/// `a/../b` without touching the file system.
fn normalise(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

#[test]
fn relative_links_and_anchors_resolve() {
    let root = root();
    let files = markdown_files();
    assert!(files.iter().any(|f| f.starts_with("docs/src")), "no pages under docs/src");
    let mut pages: BTreeMap<PathBuf, Page> = BTreeMap::new();
    let mut broken = Vec::new();
    for file in &files {
        let text = fs::read_to_string(root.join(file)).expect("read a page");
        pages.insert(file.clone(), page(&text));
    }
    for file in &files {
        for (line_no, line) in &pages[file].prose {
            for target in link_targets(line) {
                if target.is_empty() || is_external(&target) {
                    continue;
                }
                let (path, anchor) = match target.split_once('#') {
                    Some((p, a)) => (p, Some(a)),
                    None => (target.as_str(), None),
                };
                let resolved = if path.is_empty() {
                    file.clone()
                } else {
                    normalise(&file.parent().unwrap_or(Path::new("")).join(path))
                };
                let at = format!("{}:{line_no}", file.display());
                if !root.join(&resolved).exists() {
                    broken.push(format!("{at}: {target}: no file {}", resolved.display()));
                    continue;
                }
                let Some(anchor) = anchor else { continue };
                if resolved.extension().is_none_or(|e| e != "md") {
                    continue;
                }
                let anchors = match pages.get(&resolved) {
                    Some(p) => p.anchors.clone(),
                    None => page(&fs::read_to_string(root.join(&resolved)).expect("read a link target")).anchors,
                };
                if !anchors.contains(anchor) {
                    broken.push(format!("{at}: {target}: no heading with anchor #{anchor} in {}", resolved.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn every_docs_page_is_in_the_summary() {
    let src = root().join("docs/src");
    let summary = fs::read_to_string(src.join("SUMMARY.md")).expect("docs/src/SUMMARY.md");
    let listed: BTreeSet<PathBuf> = summary
        .lines()
        .flat_map(link_targets)
        .filter(|t| !is_external(t))
        .map(|t| normalise(Path::new(t.split('#').next().unwrap_or(""))))
        .collect();
    let mut pages = Vec::new();
    collect(&src, "md", &mut pages);
    let missing: Vec<String> = pages
        .iter()
        .map(|p| p.strip_prefix(&src).expect("under docs/src").to_path_buf())
        .filter(|p| p != Path::new("SUMMARY.md") && !listed.contains(p))
        .map(|p| p.display().to_string())
        .collect();
    assert!(missing.is_empty(), "pages under docs/src that SUMMARY.md does not list: {missing:?}");
}

/// Every long flag of every subcommand, and the global ones, as clap
/// declares them.
fn declared_flags() -> BTreeSet<String> {
    let cli = <meshbridge::run::Cli as clap::CommandFactory>::command();
    let mut flags = BTreeSet::from(["help".to_string(), "version".to_string()]);
    let commands = std::iter::once(&cli).chain(cli.get_subcommands());
    for command in commands {
        flags.extend(command.get_arguments().filter_map(|a| a.get_long()).map(str::to_owned));
    }
    flags
}

/// `--name` tokens in a piece of text.
fn flags_in(text: &str) -> Vec<String> {
    text.match_indices("--")
        .filter(|(at, _)| *at == 0 || !text[..*at].ends_with(|c: char| c.is_alphanumeric() || c == '-'))
        .map(|(at, _)| {
            text[at + 2..].chars().take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-').collect()
        })
        .filter(|f: &String| !f.is_empty() && f.starts_with(|c: char| c.is_ascii_lowercase()))
        .collect()
}

/// Whether a line is a meshbridge command line (not cargo's, envoy's, …).
fn runs_meshbridge(line: &str) -> bool {
    line.contains("meshbridge run") || line.contains("cargo run -- run") || line.trim_start().starts_with("[--")
}

#[test]
fn every_flag_shown_exists_and_every_flag_is_documented() {
    let root = root();
    let declared = declared_flags();
    assert!(declared.contains("config-dir") && declared.contains("xds-max-streams"), "{declared:?}");
    let mut unknown = Vec::new();
    for file in markdown_files().iter().filter(|f| f.starts_with("docs/src") || *f == Path::new("README.md")) {
        let page = page(&fs::read_to_string(root.join(file)).expect("read a page"));
        let mut check = |line_no: usize, text: &str| {
            for flag in flags_in(text) {
                // `--xds-tls-*` stands for every flag it starts.
                let known = match flag.strip_suffix('-') {
                    Some(prefix) => declared.iter().any(|d| d.starts_with(prefix)),
                    None => declared.contains(&flag),
                };
                if !known {
                    unknown.push(format!("{}:{line_no}: --{flag}", file.display()));
                }
            }
        };
        // A continuation line of a command block counts as the command's.
        let mut in_command = false;
        for (line_no, line) in &page.code {
            in_command = runs_meshbridge(line) || (in_command && line.starts_with(char::is_whitespace));
            if in_command {
                check(*line_no, line);
            }
        }
        for (line_no, line) in &page.prose {
            for span in code_spans(line) {
                if span.starts_with("--") || runs_meshbridge(span) {
                    check(*line_no, span);
                }
            }
        }
    }
    assert!(unknown.is_empty(), "flags the docs show that no clap definition declares:\n{}", unknown.join("\n"));
}

/// Each subcommand's reference page: a table row per flag, whose
/// environment and default cells are what clap declares.
const REFERENCE_PAGES: [(&str, &str); 2] =
    [("run", "docs/src/reference/run-flags.md"), ("check", "docs/src/reference/check.md")];

/// The cells of the table row that documents `--flag`: the first row whose
/// first cell starts `` `--flag`` followed by a space, `` ` `` or `[`.
fn flag_row<'p>(page: &'p str, flag: &str) -> Option<Vec<&'p str>> {
    let start = format!("| `--{flag}");
    page.lines()
        .find(|l| l.strip_prefix(&start).is_some_and(|rest| rest.starts_with([' ', '`', '['])))
        .map(|l| l.trim_matches('|').split(" | ").map(str::trim).collect())
}

/// Every flag of `run` and `check` (and the global ones, on the `run`
/// page) has a row on its reference page, and the row's environment
/// variable and default are clap's: a changed default or a renamed
/// variable fails here.
#[test]
fn flag_reference_pages_match_clap() {
    let mut cli = <meshbridge::run::Cli as clap::CommandFactory>::command();
    // Building fills in implied defaults (`false` for a switch).
    cli.build();
    let mut problems = Vec::new();
    for (name, file) in REFERENCE_PAGES {
        let page = fs::read_to_string(root().join(file)).expect("a reference page");
        let command = cli.find_subcommand(name).unwrap_or_else(|| panic!("no subcommand {name}"));
        // Built, each subcommand holds the global flags too: they are
        // documented on the `run` page.
        let args = command.get_arguments().filter(|a| name == "run" || !a.is_global_set());
        for arg in args {
            let Some(flag) = arg.get_long() else { continue };
            if ["help", "version"].contains(&flag) || arg.is_hide_set() {
                continue;
            }
            let Some(row) = flag_row(&page, flag) else {
                problems.push(format!("{file}: no row for --{flag}"));
                continue;
            };
            let [_, env, default, ..] = row[..] else {
                problems.push(format!("{file}: the row of --{flag} has fewer than four cells"));
                continue;
            };
            let want_env = arg.get_env().map(|e| format!("`{}`", e.to_string_lossy())).unwrap_or("—".into());
            if env != want_env {
                problems.push(format!("{file}: --{flag}: environment {env}, clap says {want_env}"));
            }
            let defaults: Vec<String> =
                arg.get_default_values().iter().map(|v| v.to_string_lossy().into_owned()).collect();
            // A flag that takes no value defaults to off; clap says "false".
            let want_default = match defaults.join(",").as_str() {
                "" => None,
                "false" if !arg.get_action().takes_values() => Some("off".to_owned()),
                d => Some(format!("`{d}`")),
            };
            if let Some(want) = want_default
                && !default.starts_with(&want)
            {
                problems.push(format!("{file}: --{flag}: default {default:?}, clap says {want}"));
            }
        }
    }
    assert!(problems.is_empty(), "the flag reference differs from clap:\n{}", problems.join("\n"));
}

/// The string literals of a `const NAME: &[&str] = &[...]` in a source file.
fn const_list(source: &str, name: &str) -> Vec<String> {
    let start = source.find(&format!("const {name}:")).unwrap_or_else(|| panic!("const {name} not found"));
    let body = &source[start..];
    let eq = body.find('=').expect("a value");
    let open = eq + body[eq..].find("&[").expect("a slice literal") + 2;
    let close = open + body[open..].find(']').expect("its end");
    body[open..close].split('"').skip(1).step_by(2).map(str::to_string).collect()
}

#[test]
fn every_mcpbridge_field_is_in_the_reference() {
    let root = root();
    let model = fs::read_to_string(root.join("src/config/model.rs")).expect("src/config/model.rs");
    let reference = fs::read_to_string(root.join("docs/src/reference/mcpbridge.md")).expect("the McpBridge reference");
    let mut missing = Vec::new();
    for list in ["REGISTRY_FIELDS", "REGISTRY_IGNORED_FIELDS", "PROXY_FIELDS"] {
        let fields = const_list(&model, list);
        assert!(!fields.is_empty(), "{list} is empty");
        missing.extend(
            fields.into_iter().filter(|f| !reference.contains(&format!("`{f}`"))).map(|f| format!("{list}: {f}")),
        );
    }
    assert!(missing.is_empty(), "fields missing from docs/src/reference/mcpbridge.md: {missing:?}");
}

#[test]
fn slugs_follow_github() {
    assert_eq!(slug("Restarts, outages and shutdown"), "restarts-outages-and-shutdown");
    assert_eq!(slug("`/v1/registries` fields"), "v1registries-fields");
    assert_eq!(slug("Selective watch (meshbridge only)"), "selective-watch-meshbridge-only");
    assert_eq!(slug("[Kubernetes](kubernetes.md) and Helm"), "kubernetes-and-helm");
    let p = page("# A\n```\n# not a heading\n```\n## A\n");
    assert_eq!(p.anchors, BTreeSet::from(["a".to_string(), "a-1".to_string()]));
    assert_eq!(link_targets("see [x](a.md#b) and `[y](nope.md)` [z]( c.md )"), ["a.md#b", "c.md"]);
    assert_eq!(flags_in("run --config-dir D [--drain 5s] a--b"), ["config-dir", "drain"]);
}

/// The type the reference gives a field, as the CRD's schema names it.
fn schema_type(cell: &str) -> Option<&'static str> {
    let cell = cell.trim();
    [
        ("string", "string"),
        ("integer", "integer"),
        ("int64", "integer"),
        ("list of", "array"),
        ("boolean", "boolean"),
        ("`{", "object"),
    ]
    .into_iter()
    .find(|(prefix, _)| cell.starts_with(prefix))
    .map(|(_, t)| t)
}

/// The McpBridge reference gives each `spec.registries[]` and
/// `spec.proxies[]` field the type our CRD declares.
#[test]
fn mcpbridge_reference_types_match_the_crd() {
    let crd: serde_json::Value =
        serde_saphyr::from_str(&fs::read_to_string(root().join("deploy/kubernetes/crd-mcpbridge.yaml")).unwrap())
            .expect("the CRD parses");
    let v1 = crd["spec"]["versions"].as_array().unwrap().iter().find(|v| v["name"] == "v1").expect("v1");
    let spec = &v1["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
    let page = fs::read_to_string(root().join("docs/src/reference/mcpbridge.md")).unwrap();
    let mut problems = Vec::new();
    let mut checked = 0;
    for (list, heading) in [("registries", "## `spec.registries[]`"), ("proxies", "## `spec.proxies[]`")] {
        let section = page.split(heading).nth(1).expect("the section").split("\n## ").next().unwrap();
        // The section's first table is its fields'.
        let rows = section.lines().skip_while(|l| !l.starts_with("| field")).skip(2).take_while(|l| l.starts_with('|'));
        let properties = &spec[list]["items"]["properties"];
        for row in rows {
            let cells: Vec<&str> = row.trim_matches('|').split(" | ").map(str::trim).collect();
            let Some(&ty) = cells.get(2) else { continue };
            for field in cells[0].split(", ").map(|f| f.trim_matches('`')) {
                let Some(declared) = properties[field]["type"].as_str() else {
                    problems.push(format!("spec.{list}[].{field}: in the reference, not in the CRD"));
                    continue;
                };
                checked += 1;
                match schema_type(ty) {
                    Some(t) if t == declared => {}
                    documented => problems.push(format!(
                        "spec.{list}[].{field}: the reference says {ty:?} ({documented:?}), the CRD says {declared}"
                    )),
                }
            }
        }
    }
    assert!(checked >= 30, "only {checked} fields checked: has the reference's layout changed?");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Every test file the annotation table of `compatibility.md` names exists
/// in `e2e/tests/`, and each path of every
/// row names a test or says "gap".
#[test]
fn the_annotation_table_names_tests_that_exist() {
    let text = std::fs::read_to_string(root().join("docs/src/compatibility.md")).unwrap();
    let table = text.split("## Ingress annotations").nth(1).expect("an Ingress annotations section");
    let rows: Vec<&str> = table.lines().filter(|l| l.starts_with("| `")).collect();
    assert!(rows.len() >= 10, "the table has {} rows", rows.len());
    for row in rows {
        let cells: Vec<&str> = row.split(" | ").skip(1).collect();
        assert_eq!(cells.len(), 2, "two paths per row: {row}");
        for cell in cells {
            let files: Vec<&str> = code_spans(cell).into_iter().filter(|s| s.ends_with(".rs")).collect();
            assert!(!files.is_empty() || cell.contains("gap") || cell.contains("configuration only"), "{row}");
            for file in files {
                let path = root().join("e2e/tests").join(file);
                assert!(path.is_file(), "{file} (in {row}) is not in e2e/tests");
            }
        }
    }
}
