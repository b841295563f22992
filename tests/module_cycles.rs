//! No import cycle between the files of `src/` and `registries/src/`, and
//! no stringly-typed error in translation.
//!
//! The check reads every non-test source file, collects the paths it uses
//! (`crate::…`, `super::…`, `self::…`, and paths through its own child
//! modules, in `use` items and inline), resolves each to the file that
//! defines the item (following `pub use` re-exports), and fails listing
//! every strongly connected group of files. Test code (`#[cfg(test)]`
//! modules and `*_tests.rs` files) is left out: tests may reach anywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Cycles let through, by the folder all their files are under. Empty:
/// every cycle fails, parent ⇄ child ones included (a parent that defines
/// what its children use moves it into a leaf module: `config/types.rs`,
/// `registries/src/watcher.rs`, `translate/proxy/types.rs`, …).
const ALLOWED_PREFIXES: [&str; 0] = [];

/// One crate's files by module path (`["xds", "sotw"]` → `src/xds/sotw.rs`).
struct Crate {
    files: BTreeMap<Vec<String>, PathBuf>,
    /// Non-test source of each file, comments and test modules removed.
    code: BTreeMap<Vec<String>, String>,
}

fn module_path(root: &Path, file: &Path) -> Option<Vec<String>> {
    let rel = file.strip_prefix(root).ok()?.with_extension("");
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    match parts.last().map(String::as_str) {
        Some("lib") if parts.len() == 1 => parts.clear(),
        Some("main") if parts.len() == 1 => return None,
        Some("mod") => {
            parts.pop();
        }
        Some(name) if name.ends_with("_tests") => return None,
        _ => {}
    }
    Some(parts)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Drop `//` comments (doc links name paths too, but are no dependency)
/// and `#[cfg(test)]` items, by brace matching.
fn strip(src: &str) -> String {
    let mut out = String::new();
    for line in src.lines() {
        let code = match line.find("//") {
            Some(i) if !line[..i].contains('"') => &line[..i],
            _ => line,
        };
        out.push_str(code);
        out.push('\n');
    }
    while let Some(at) = out.find("#[cfg(test)]") {
        let rest = &out[at..];
        let semi = rest.find(';').unwrap_or(rest.len());
        let brace = rest.find('{').unwrap_or(rest.len());
        let end = if semi < brace {
            at + semi + 1
        } else {
            let mut depth = 0;
            let mut end = out.len();
            for (i, c) in rest.char_indices().skip(brace) {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            end = at + i + 1;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            end
        };
        out.replace_range(at..end, "");
    }
    out
}

fn load(root: &Path) -> Crate {
    let mut files = Vec::new();
    rust_files(root, &mut files);
    let mut krate = Crate { files: BTreeMap::new(), code: BTreeMap::new() };
    for f in files {
        if let Some(m) = module_path(root, &f) {
            krate.code.insert(m.clone(), strip(&std::fs::read_to_string(&f).unwrap()));
            krate.files.insert(m, f);
        }
    }
    krate
}

/// Expand a `use` tree (`a::{b, c::{d, e}}` → `a::b`, `a::c::d`, `a::c::e`);
/// renames (`as`) are dropped.
fn expand(tree: &str) -> Vec<String> {
    let tree: String = tree.replace(" as ", "@").chars().filter(|c| !c.is_whitespace()).collect();
    expand_tree(&tree)
}

fn expand_tree(tree: &str) -> Vec<String> {
    let Some(open) = tree.find('{') else {
        return vec![tree.split('@').next().unwrap_or(tree).to_string()];
    };
    let prefix = &tree[..open];
    let inner = &tree[open + 1..tree.len().saturating_sub(1)];
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts.into_iter().filter(|p| !p.is_empty()).flat_map(expand_tree).map(|p| format!("{prefix}{p}")).collect()
}

/// Every `use` path of a file (expanded) and every inline path.
fn paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest_of_code = String::new();
    let mut rest = code;
    while let Some(i) = rest.find("use ") {
        let before = rest[..i].chars().last();
        rest_of_code.push_str(&rest[..i]);
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            rest_of_code.push_str("use ");
            rest = &rest[i + 4..];
            continue;
        }
        rest = &rest[i + 4..];
        let end = rest.find(';').unwrap_or(rest.len());
        out.extend(expand(&rest[..end]));
        rest = &rest[end..];
    }
    rest_of_code.push_str(rest);
    // Inline paths: `ident::ident…` not preceded by `::` or an identifier.
    let code = rest_of_code.as_str();
    let bytes = code.as_bytes();
    let is_ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut i = 0;
    while i < bytes.len() {
        if is_ident(bytes[i]) && (i == 0 || !is_ident(bytes[i - 1]) && !code[..i].ends_with("::")) {
            let mut j = i;
            while j < bytes.len() && (is_ident(bytes[j]) || code[j..].starts_with("::")) {
                j += if code[j..].starts_with("::") { 2 } else { 1 };
            }
            let path = code[i..j].trim_end_matches("::");
            if path.contains("::") {
                out.push(path.to_string());
            }
            i = j.max(i + 1);
        } else {
            i += 1;
        }
    }
    out
}

/// The names a file re-exports (`pub use a::b::Name;`) → the path.
fn reexports(code: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut rest = code;
    while let Some(i) = rest.find("pub use ") {
        rest = &rest[i + 8..];
        let end = rest.find(';').unwrap_or(rest.len());
        for p in expand(&rest[..end]) {
            if let Some(name) = p.rsplit("::").next().filter(|n| *n != "*") {
                out.insert(name.to_string(), p.clone());
            }
        }
        rest = &rest[end..];
    }
    out
}

impl Crate {
    /// The file defining what `path` names, seen from module `from`.
    fn resolve(&self, from: &[String], path: &str, depth: usize) -> Option<Vec<String>> {
        let segs: Vec<&str> = path.split("::").collect();
        let (mut module, rest): (Vec<String>, &[&str]) = match segs[0] {
            "crate" => (Vec::new(), &segs[1..]),
            "self" => (from.to_vec(), &segs[1..]),
            "super" => {
                let mut m = from.to_vec();
                let mut k = 0;
                while segs.get(k) == Some(&"super") {
                    m.pop();
                    k += 1;
                }
                (m, &segs[k..])
            }
            child => {
                // A path through one of this module's own children.
                let mut m = from.to_vec();
                m.push(child.to_string());
                if !self.files.contains_key(&m) {
                    return None;
                }
                (m, &segs[1..])
            }
        };
        for (k, seg) in rest.iter().enumerate() {
            let mut next = module.clone();
            next.push(seg.to_string());
            if self.files.contains_key(&next) {
                module = next;
                continue;
            }
            // An item of `module`: follow a re-export to its definition.
            if depth < 8
                && let Some(target) = self.code.get(&module).and_then(|c| reexports(c).remove(*seg))
            {
                let tail: Vec<&str> = rest[k + 1..].to_vec();
                let full = if tail.is_empty() { target } else { format!("{target}::{}", tail.join("::")) };
                return self.resolve(&module, &full, depth + 1).or(Some(module));
            }
            return Some(module);
        }
        Some(module)
    }

    fn edges(&self) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
        let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
        for (module, code) in &self.code {
            let out = edges.entry(module.clone()).or_default();
            for p in paths(code) {
                if let Some(target) = self.resolve(module, &p, 0)
                    && &target != module
                {
                    out.insert(target);
                }
            }
        }
        edges
    }
}

/// Strongly connected groups of more than one file (Tarjan).
fn cycles(edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<Vec<Vec<String>>> {
    struct State<'a> {
        edges: &'a BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        index: BTreeMap<&'a Vec<String>, usize>,
        low: BTreeMap<&'a Vec<String>, usize>,
        stack: Vec<&'a Vec<String>>,
        on_stack: BTreeSet<&'a Vec<String>>,
        out: Vec<Vec<Vec<String>>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a Vec<String>) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on_stack.insert(v);
        let edges = s.edges;
        for w in edges.get(v).into_iter().flatten() {
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut group = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                group.push(w.clone());
                if w == v {
                    break;
                }
            }
            if group.len() > 1 {
                group.sort();
                s.out.push(group);
            }
        }
    }
    let mut s = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out
}

#[test]
fn no_import_cycle_between_files() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut failures = Vec::new();
    let mut allowed = Vec::new();
    for dir in ["src", "registries/src"] {
        let krate = load(&workspace.join(dir));
        let edges = krate.edges();
        assert!(edges.len() > 5, "{dir}: no files read");
        for group in cycles(&edges) {
            let files: Vec<String> =
                group.iter().map(|m| krate.files[m].strip_prefix(workspace).unwrap().display().to_string()).collect();
            let arrows: Vec<String> = group
                .iter()
                .flat_map(|a| edges[a].iter().filter(|b| group.contains(b)).map(move |b| (a, b)))
                .map(|(a, b)| format!("{} → {}", krate.files[a].display(), krate.files[b].display()))
                .collect();
            let line = format!("{}\n    {}", files.join(", "), arrows.join("\n    "));
            if ALLOWED_PREFIXES.iter().any(|p| files.iter().all(|f| f.starts_with(p))) {
                allowed.push(line);
            } else {
                failures.push(line);
            }
        }
    }
    for a in &allowed {
        println!("allowed for now (see ALLOWED_PREFIXES): {a}");
    }
    assert!(failures.is_empty(), "import cycles between files:\n{}", failures.join("\n"));
}

#[test]
fn the_checker_sees_use_trees_reexports_and_cycles() {
    assert_eq!(expand("crate::a::{b, c::{d, e as f}}"), ["crate::a::b", "crate::a::c::d", "crate::a::c::e"]);
    let code = strip(
        "use super::X; // crate::z::Y\n#[cfg(test)]\nmod tests { use crate::q::R; }\nfn f() { crate::w::V::new() }",
    );
    let found = paths(&code);
    assert!(found.contains(&"super::X".into()) && found.contains(&"crate::w::V::new".into()), "{found:?}");
    assert!(!found.iter().any(|p| p.contains("crate::q") || p.contains("crate::z")), "{found:?}");
    let m = |s: &str| s.split('/').filter(|p| !p.is_empty()).map(String::from).collect::<Vec<_>>();
    let krate = Crate {
        files: [m(""), m("a"), m("a/b"), m("c")].into_iter().map(|k| (k, PathBuf::new())).collect(),
        code: [(m("a"), "pub use b::Thing;".to_string())].into(),
    };
    assert_eq!(krate.resolve(&m("c"), "crate::a::Thing", 0), Some(m("a/b")), "re-export followed");
    assert_eq!(krate.resolve(&m("a/b"), "super::Other", 0), Some(m("a")));
    let edges = [(m("a"), [m("c")].into()), (m("c"), [m("a")].into()), (m("a/b"), BTreeSet::new())].into();
    assert_eq!(cycles(&edges), vec![vec![m("a"), m("c")]]);
}

/// The last type argument of each `Result<…>` in `code`, as written.
fn result_errors(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (at, _) in code.match_indices("Result<") {
        let args = &code[at + "Result<".len()..];
        let (mut depth, mut last_comma, mut end) = (0usize, None, None);
        for (i, c) in args.char_indices() {
            match c {
                '<' | '(' | '[' => depth += 1,
                '>' | ')' | ']' if depth == 0 => {
                    end = Some(i);
                    break;
                }
                '>' | ')' | ']' => depth -= 1,
                ',' if depth == 0 => last_comma = Some(i),
                _ => {}
            }
        }
        if let (Some(comma), Some(end)) = (last_comma, end) {
            out.push(args[comma + 1..end].split_whitespace().collect::<Vec<_>>().join(" "));
        }
    }
    out
}

/// Translation reports why with typed errors (thiserror enums), not strings:
/// callers match on them, and their text is written in one place.
#[test]
fn library_errors_are_typed() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut stringly = Vec::new();
    let mut read = 0;
    for root in ["src", "registries/src", "proto/src"] {
        let krate = load(&workspace.join(root));
        for (module, code) in &krate.code {
            if root == "src" && module.first().map(String::as_str) == Some("testing") {
                continue;
            }
            read += 1;
            for err in result_errors(code) {
                if matches!(err.as_str(), "String" | "&str" | "&'static str" | "Box<dyn std::error::Error>") {
                    stringly.push(format!("{}: Result<_, {err}>", krate.files[module].display()));
                }
            }
        }
    }
    assert!(read > 100, "library files not read: {read}");
    assert!(stringly.is_empty(), "untyped errors in library code:\n{}", stringly.join("\n"));
}

/// Issue 26: translation (pure) reads its inputs from `model`, the leaf the
/// cache and config share with it, and not from the modules that produce
/// them; and `model` imports nothing of the crate.
#[test]
fn translate_reads_its_inputs_from_the_leaf() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"));
    let krate = load(&workspace.join("src"));
    let mut wrong = Vec::new();
    for (module, code) in &krate.code {
        let first = module.first().map(String::as_str);
        for path in paths(code) {
            let reaches = |m: &str| path == format!("crate::{m}") || path.starts_with(&format!("crate::{m}::"));
            if first == Some("translate") && (reaches("cache") || reaches("config")) {
                wrong.push(format!("{}: {path}", krate.files[module].display()));
            }
            if first == Some("model") && path.starts_with("crate::") {
                wrong
                    .push(format!("{}: {path} (the leaf imports nothing of the crate)", krate.files[module].display()));
            }
        }
    }
    assert!(krate.code.contains_key(&vec!["model".to_string()]), "src/model.rs not read");
    assert!(wrong.is_empty(), "translate reaching past the leaf:\n{}", wrong.join("\n"));
}

/// Issue 26: inputs are parsed once, where they come in (an Ingress into
/// the leaf's `model::ingress`, its destination annotation included), so
/// the reconciler does not reach into translate, and translation reads
/// types, not JSON. JSON stays in translate only where Istio's API is
/// free-form itself (an EnvoyFilter patch value, a `google.protobuf.Struct`).
#[test]
fn translation_and_the_reconciler_read_types_not_json() {
    // The model and its encoding, and the two builders of EnvoyFilter patch
    // values: the proxies' and the local rate limit's.
    const JSON_ALLOWED: [&[&str]; 4] = [
        &["translate", "model"],
        &["translate", "pb"],
        &["translate", "proxy", "filters"],
        &["translate", "ingress", "limit"],
    ];
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"));
    let krate = load(&workspace.join("src"));
    let mut wrong = Vec::new();
    let mut translate_files = 0;
    for (module, code) in &krate.code {
        let file = krate.files[module].display();
        match module.first().map(String::as_str) {
            Some("reconcile") => {
                for path in
                    paths(code).into_iter().filter(|p| p == "crate::translate" || p.starts_with("crate::translate::"))
                {
                    wrong.push(format!("{file}: {path}"));
                }
            }
            Some("translate") => {
                translate_files += 1;
                let allowed = JSON_ALLOWED.iter().any(|m| module.iter().map(String::as_str).eq(m.iter().copied()));
                if !allowed && code.contains("serde_json") {
                    wrong.push(format!("{file}: serde_json outside the EnvoyFilter patch value"));
                }
            }
            _ => {}
        }
    }
    assert!(translate_files > 20, "translate files not read: {translate_files}");
    assert!(krate.code.contains_key(&vec!["reconcile".to_string()]), "src/reconcile.rs not read");
    assert!(wrong.is_empty(), "JSON or translate reached where types should be:\n{}", wrong.join("\n"));
}

#[test]
fn the_error_scan_finds_the_error_type() {
    assert_eq!(
        result_errors("fn f() -> Result<BTreeMap<String, String>, String> {} fn g(x: Result<(A, B), E<C, D>>)"),
        ["String", "E<C, D>"]
    );
    assert_eq!(result_errors("fn f() -> io::Result<u8>"), Vec::<String>::new());
}
