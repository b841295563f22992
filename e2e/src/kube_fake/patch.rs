//! The fake's JSON patch (RFC 6902) and merge (RFC 7386, and apply).

use axum::response::Response;
use serde_json::{Map, Value};

use super::status;

/// RFC 6902 JSON patch: `test`, `add`, `replace`, `remove`. A failed `test`
/// is a 422, as the API server answers.
// The error is the answer to send.
#[allow(clippy::result_large_err)]
pub(super) fn json_patch_into(target: &mut Value, ops: &Value) -> Result<(), Response> {
    let invalid = |m: String| status(422, "Invalid", m);
    for op in ops.as_array().ok_or_else(|| invalid("a JSON patch is a list".into()))? {
        let path = op["path"].as_str().ok_or_else(|| invalid("op without path".into()))?;
        let (parent, last) = path.rsplit_once('/').ok_or_else(|| invalid(format!("bad path {path}")))?;
        let last = last.replace("~1", "/").replace("~0", "~");
        match op["op"].as_str() {
            Some("test") => {
                if target.pointer(path) != Some(&op["value"]) {
                    return Err(invalid(format!("testing value {path} failed")));
                }
            }
            Some(kind @ ("add" | "replace" | "remove")) => {
                let parent = target.pointer_mut(parent).ok_or_else(|| invalid(format!("missing parent of {path}")))?;
                match (parent, kind) {
                    (Value::Object(m), "remove") => {
                        m.remove(&last);
                    }
                    (Value::Object(m), _) => {
                        m.insert(last, op["value"].clone());
                    }
                    (Value::Array(a), kind) => {
                        let i = if last == "-" { a.len() } else { last.parse().unwrap_or(usize::MAX) };
                        match kind {
                            "add" if i <= a.len() => a.insert(i, op["value"].clone()),
                            "replace" if i < a.len() => a[i] = op["value"].clone(),
                            "remove" if i < a.len() => {
                                a.remove(i);
                            }
                            _ => return Err(invalid(format!("index out of range: {path}"))),
                        }
                    }
                    _ => return Err(invalid(format!("{path}: parent is not a container"))),
                }
            }
            other => return Err(invalid(format!("unsupported op {other:?}"))),
        }
    }
    Ok(())
}

/// RFC 7386 merge (`nulls_delete`), or the fake's apply merge.
pub(super) fn merge_into(target: &mut Value, patch: &Value, nulls_delete: bool) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let map = target.as_object_mut().expect("object");
    for (k, v) in patch {
        if v.is_null() && nulls_delete {
            map.remove(k);
        } else if v.is_object() {
            merge_into(map.entry(k.clone()).or_insert(Value::Null), v, nulls_delete);
        } else {
            map.insert(k.clone(), v.clone());
        }
    }
}
