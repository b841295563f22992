//! YAML text to [`Document`]s. Anything that makes a document unreadable as
//! a whole (bad YAML, no `kind`, a Secret that does not decode) fails the
//! file; problems inside one registry or proxy entry are left to `validate`.

use std::collections::BTreeMap;

use base64::Engine;
use meshbridge_registries::Secret;
use serde_json::{Map, Value};
use serde_saphyr::MessageFormatter;
use tracing::{debug, warn};

use super::model::{Document, IngressDoc, McpBridgeDoc, RawEntry, SecretDoc};
use super::types::ConfigError;
use super::validate::FieldError;

pub(crate) const MCPBRIDGE_API_VERSION: &str = "networking.higress.io/v1";
const SECRET_API_VERSION: &str = "v1";
const INGRESS_API_VERSION: &str = "networking.k8s.io/v1";
/// Kubernetes puts objects without a namespace into `default`.
const DEFAULT_NAMESPACE: &str = "default";

/// Parse one file of (possibly multi-document) YAML. `file` names the file in
/// errors. Kinds other than McpBridge, Secret and Ingress are skipped.
pub fn parse_documents(file: &str, text: &str) -> Result<Vec<Document>, ConfigError> {
    let starts = document_start_lines(text);
    let values: Vec<Value> = serde_saphyr::from_multiple(text).map_err(|e| {
        let line = e.location().map(|l| l.line()).filter(|&l| l > 0);
        // Only the message: the default rendering quotes source lines, which
        // may hold Secret data.
        let reason =
            serde_saphyr::UserMessageFormatter.format_message(e.without_snippet()).replace(char::is_control, " ");
        ConfigError::Yaml {
            file: file.to_owned(),
            document: line.and_then(|l| document_of_line(&starts, l)),
            line,
            reason,
        }
    })?;
    // from_multiple skips empty documents; so does document_start_lines. If
    // the two still disagree, we do not know which line a document starts on.
    let lines_known = starts.len() == values.len();
    let mut docs = Vec::new();
    for (i, value) in values.into_iter().enumerate() {
        let fail = |reason: FieldError| ConfigError::Document {
            file: file.to_owned(),
            document: i + 1,
            line: lines_known.then(|| starts[i]),
            reason: reason.to_string(),
        };
        // A `List` (what `kubectl get -o yaml` prints for several objects):
        // its items, each read as a document would be.
        if let Some(items) = list_items(&value) {
            for (j, item) in items.iter().enumerate() {
                let at = |e: FieldError| {
                    let field =
                        if e.field.is_empty() { format!("items[{j}]") } else { format!("items[{j}].{}", e.field) };
                    FieldError::new(field, e.reason)
                };
                if let Some(doc) = parse_document(file, i + 1, item.clone()).map_err(at).map_err(fail)? {
                    docs.push(doc);
                }
            }
            continue;
        }
        if let Some(doc) = parse_document(file, i + 1, value).map_err(fail)? {
            docs.push(doc);
        }
    }
    Ok(docs)
}

/// The items of a `v1` `List` (`kind: List`, or `IngressList` and the like
/// that `kubectl get -o yaml` prints for one kind), if `value` is one.
fn list_items(value: &Value) -> Option<&Vec<Value>> {
    let kind = value.get("kind")?.as_str()?;
    if kind != "List" && !kind.ends_with("List") {
        return None;
    }
    value.get("items")?.as_array()
}

/// One object already decoded, as the Kubernetes API hands it over: the
/// same checks and shapes as a YAML document, so both sources build the
/// same [`Document`]s. `None` for kinds and versions we do not read.
/// `source` names the object in logs; the error names the field.
pub fn parse_object(source: &str, value: Value) -> Result<Option<Document>, FieldError> {
    parse_document(source, 1, value)
}

fn parse_document(file: &str, index: usize, value: Value) -> Result<Option<Document>, FieldError> {
    let Value::Object(mut obj) = value else {
        return Err(FieldError::new("", "not a mapping"));
    };
    let kind = match obj.get("kind") {
        Some(Value::String(k)) if !k.is_empty() => k.clone(),
        Some(_) => return Err(FieldError::new("kind", "must be a string")),
        None => return Err(FieldError::new("kind", "required")),
    };
    let api_version = match obj.get("apiVersion") {
        Some(Value::String(v)) => v.clone(),
        Some(_) => return Err(FieldError::new("apiVersion", "must be a string")),
        None => String::new(),
    };
    let expected = match kind.as_str() {
        "McpBridge" => MCPBRIDGE_API_VERSION,
        "Secret" => SECRET_API_VERSION,
        "Ingress" => INGRESS_API_VERSION,
        _ => {
            debug!(file, document = index, kind, "ignoring document of unhandled kind");
            return Ok(None);
        }
    };
    if api_version != expected {
        warn!(file, document = index, kind, api_version, expected, "ignoring document with unsupported apiVersion");
        return Ok(None);
    }
    let (namespace, name) = metadata(&obj)?;
    let doc = match kind.as_str() {
        "McpBridge" => Document::McpBridge(mcpbridge(namespace, name, obj.remove("spec"))?),
        "Secret" => Document::Secret(secret(namespace, name, &obj)?),
        _ => Document::Ingress(IngressDoc::from_json(namespace, name, &Value::Object(obj))),
    };
    Ok(Some(doc))
}

fn metadata(obj: &Map<String, Value>) -> Result<(String, String), FieldError> {
    let Some(Value::Object(meta)) = obj.get("metadata") else {
        return Err(FieldError::new("metadata.name", "required"));
    };
    let name = match meta.get("name") {
        Some(Value::String(n)) if !n.is_empty() => n.clone(),
        Some(Value::String(_)) | None | Some(Value::Null) => {
            return Err(FieldError::new("metadata.name", "required"));
        }
        Some(_) => return Err(FieldError::new("metadata.name", "must be a string")),
    };
    let namespace = match meta.get("namespace") {
        Some(Value::String(n)) if !n.is_empty() => n.clone(),
        Some(Value::String(_)) | None | Some(Value::Null) => DEFAULT_NAMESPACE.to_owned(),
        Some(_) => return Err(FieldError::new("metadata.namespace", "must be a string")),
    };
    Ok((namespace, name))
}

fn mcpbridge(namespace: String, name: String, spec: Option<Value>) -> Result<McpBridgeDoc, FieldError> {
    let mut spec = match spec {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m,
        Some(_) => return Err(FieldError::new("spec", "must be a mapping")),
    };
    let mut list = |field: &str| match spec.remove(field) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(entries)) => Ok(entries.into_iter().map(RawEntry).collect()),
        Some(_) => Err(FieldError::new(format!("spec.{field}"), "must be a list")),
    };
    let registries = list("registries")?;
    let proxies = list("proxies")?;
    for field in spec.keys() {
        warn!(mcpbridge = %format!("{namespace}/{name}"), field = %format!("spec.{field}"), "unknown field, ignored");
    }
    Ok(McpBridgeDoc { namespace, name, registries, proxies })
}

/// Decode `data` (base64) and `stringData` (plain; wins over `data`, as the
/// API server merges them). Errors name the key, never the value.
fn secret(namespace: String, name: String, obj: &Map<String, Value>) -> Result<SecretDoc, FieldError> {
    let mut data = BTreeMap::new();
    for (field, base64) in [("data", true), ("stringData", false)] {
        let entries = match obj.get(field) {
            None | Some(Value::Null) => continue,
            Some(Value::Object(m)) => m,
            Some(_) => return Err(FieldError::new(field, "must be a mapping")),
        };
        for (key, value) in entries {
            let Value::String(text) = value else {
                return Err(FieldError::new(format!("{field}.{key}"), "must be a string"));
            };
            let text = if base64 {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(text.trim())
                    .map_err(|_| FieldError::new(format!("{field}.{key}"), "not valid base64"))?;
                String::from_utf8(bytes).map_err(|_| FieldError::new(format!("{field}.{key}"), "not valid UTF-8"))?
            } else {
                text.clone()
            };
            data.insert(key.clone(), Secret::new(text));
        }
    }
    Ok(SecretDoc { namespace, name, data })
}

/// 1-based first line of every non-empty document, in order. A document is
/// whatever lies between `---` lines; one holding only comments and blank
/// lines is empty, as it is to the YAML parser.
fn document_start_lines(text: &str) -> Vec<u64> {
    let mut starts = Vec::new();
    let mut current: Option<u64> = None;
    let mut has_content = false;
    for (i, line) in text.lines().enumerate() {
        let lineno = i as u64 + 1;
        if is_separator(line) {
            if has_content {
                starts.extend(current);
            }
            current = Some(lineno);
            // `--- {a: 1}` puts content on the separator line itself.
            has_content = !is_blank(&line[3..]);
            continue;
        }
        if current.is_none() {
            current = Some(lineno);
        }
        if !is_blank(line) && line.trim_end() != "..." {
            has_content = true;
        }
    }
    if has_content {
        starts.extend(current);
    }
    starts
}

fn is_separator(line: &str) -> bool {
    line.starts_with("---") && line[3..].chars().next().is_none_or(char::is_whitespace)
}

fn is_blank(line: &str) -> bool {
    let t = line.trim_start();
    t.is_empty() || t.starts_with('#')
}

/// The 1-based index of the document containing `line`, if any started before.
fn document_of_line(starts: &[u64], line: u64) -> Option<usize> {
    let n = starts.iter().take_while(|&&s| s <= line).count();
    (n > 0).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn document_lines() {
        let text = "# head\n---\na: 1\n---\n---\n# only a comment\n---\nb: 2\nc: 3\n";
        assert_eq!(document_start_lines(text), vec![2, 7]);
        assert_eq!(document_start_lines("a: 1\n---\nb: 2\n"), vec![1, 2]);
        assert_eq!(document_of_line(&[1, 5], 6), Some(2));
        assert_eq!(document_of_line(&[3], 1), None);
    }

    #[test]
    fn yaml_error_names_file_document_and_line() {
        let text = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\nkind: Secret\nstringData:\n  pw: \"hunter2\n  x: [1,\n";
        let err = parse_documents("bad.yaml", text).unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("bad.yaml: document 2, line 8: "), "{msg}");
        assert!(!msg.contains("hunter2"), "{msg}");
    }

    #[test]
    fn secret_data_and_string_data() {
        let text = "apiVersion: v1\nkind: Secret\nmetadata: {name: s, namespace: ns}\n\
                    data:\n  consulToken: dG9rZW4=\n  nacosUsername: aWdub3JlZA==\n\
                    stringData:\n  nacosUsername: nacos\n";
        let docs = parse_documents("s.yaml", text).unwrap();
        let [Document::Secret(s)] = docs.as_slice() else { panic!("{docs:?}") };
        assert_eq!((s.namespace.as_str(), s.name.as_str()), ("ns", "s"));
        assert_eq!(s.data["consulToken"].expose(), "token");
        assert_eq!(s.data["nacosUsername"].expose(), "nacos");
    }

    #[test]
    fn secret_errors_do_not_echo_values() {
        let text = "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\ndata:\n  consulToken: \"not*base64!\"\n";
        let msg = parse_documents("s.yaml", text).unwrap_err().to_string();
        assert_eq!(msg, "s.yaml: document 1, line 1: data.consulToken: not valid base64");
        let text = "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\nstringData:\n  consulToken: 12345\n";
        let msg = parse_documents("s.yaml", text).unwrap_err().to_string();
        assert_eq!(msg, "s.yaml: document 1, line 1: stringData.consulToken: must be a string");
    }

    #[test]
    fn envelope_errors() {
        let cases = [
            ("- a\n- b\n", "f: document 1, line 1: not a mapping"),
            ("apiVersion: v1\nmetadata: {name: x}\n", "f: document 1, line 1: kind: required"),
            (
                "apiVersion: networking.higress.io/v1\nkind: McpBridge\nmetadata: {namespace: x}\n",
                "f: document 1, line 1: metadata.name: required",
            ),
            (
                "apiVersion: networking.higress.io/v1\nkind: McpBridge\nmetadata: {name: x}\nspec:\n  registries: {}\n",
                "f: document 1, line 1: spec.registries: must be a list",
            ),
        ];
        for (text, want) in cases {
            assert_eq!(parse_documents("f", text).unwrap_err().to_string(), want);
        }
    }

    #[test]
    fn other_kinds_and_versions_are_skipped() {
        let text = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\n\
                    apiVersion: networking.higress.io/v1alpha1\nkind: McpBridge\nmetadata: {name: b}\n";
        assert_eq!(parse_documents("f", text).unwrap(), vec![]);
    }
}
