//! Whether a tool parameter's JSON schema admits a string: such values are taken verbatim from
//! the ATEM text, all others are parsed as JSON.
//!
//! A port of llama.cpp common/json-schema.cpp (`build_node` and `may_be_string_impl`), which the
//! Muse Glimmer parser (common/parsers/muse-glimmer.cpp) calls per parameter.

use serde_json::Value;

const MAX_DEPTH: usize = 32;

/// `schema` may validate a string. `root` is the document `$ref`s point into (the tool's
/// `parameters`). Cycles and unresolvable references count as "not a string", as in llama.cpp.
pub fn may_be_string(schema: &Value, root: &Value) -> bool {
    check(schema, root, 0)
}

fn check(schema: &Value, root: &Value, depth: usize) -> bool {
    let Some(s) = schema.as_object() else {
        return false;
    };
    if depth > MAX_DEPTH {
        return false;
    }
    if let Some(r) = s.get("$ref") {
        return r
            .as_str()
            .and_then(|r| resolve(r, root))
            .is_some_and(|t| check(t, root, depth + 1));
    }
    if let Some(alts) = s.get("oneOf").or_else(|| s.get("anyOf")) {
        return alts
            .as_array()
            .is_some_and(|a| a.iter().any(|c| check(c, root, depth + 1)));
    }
    // {"type": ["a", "b"], ...} is {"anyOf": [{"type": "a", ...}, {"type": "b", ...}]}.
    if let Some(Value::Array(types)) = s.get("type") {
        return types.iter().any(|t| {
            let mut alt = s.clone();
            alt.insert("type".into(), t.clone());
            check(&Value::Object(alt), root, depth + 1)
        });
    }
    if let Some(c) = s.get("const") {
        return c.is_string();
    }
    if let Some(e) = s.get("enum") {
        return e.as_array().is_some_and(|a| a.iter().any(Value::is_string));
    }
    let has_properties = s.contains_key("properties")
        || s.get("additionalProperties")
            .is_some_and(|a| *a != Value::Bool(true));
    match s.get("type").and_then(Value::as_str) {
        None => {
            if has_properties {
                false
            } else if let Some(all) = s.get("allOf") {
                all_of(all, root, depth)
            } else if s.contains_key("items") || s.contains_key("prefixItems") {
                false
            } else {
                ["pattern", "minLength", "maxLength", "format"]
                    .iter()
                    .any(|k| s.contains_key(*k))
            }
        }
        Some("string") => s.get("allOf").is_none_or(|all| all_of(all, root, depth)),
        Some("object") if !has_properties => {
            s.get("allOf").is_some_and(|all| all_of(all, root, depth))
        }
        Some(_) => false,
    }
}

/// Every child that constrains anything must allow a string, and one must.
fn all_of(all: &Value, root: &Value, depth: usize) -> bool {
    let Some(children) = all.as_array() else {
        return false;
    };
    let mut any_string = false;
    for c in children {
        if is_any(c) {
            continue;
        }
        if !check(c, root, depth + 1) {
            return false;
        }
        any_string = true;
    }
    any_string
}

/// A schema that llama.cpp builds as "any": no keyword that constrains the kind of value.
fn is_any(schema: &Value) -> bool {
    let Some(s) = schema.as_object() else {
        return true;
    };
    const KEYS: [&str; 14] = [
        "$ref",
        "oneOf",
        "anyOf",
        "allOf",
        "type",
        "const",
        "enum",
        "properties",
        "items",
        "prefixItems",
        "pattern",
        "minLength",
        "maxLength",
        "format",
    ];
    !KEYS.iter().any(|k| s.contains_key(*k))
        && s.get("additionalProperties")
            .is_none_or(|a| *a == Value::Bool(true))
}

/// A local JSON pointer ("#/$defs/x").
fn resolve<'a>(r: &str, root: &'a Value) -> Option<&'a Value> {
    let path = r.strip_prefix('#')?;
    if path.is_empty() {
        return Some(root);
    }
    root.pointer(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn string_like_schemas() {
        let root = json!({"$defs": {"s": {"type": "string"}, "n": {"type": "number"}, "loop": {"$ref": "#/$defs/loop"}}});
        for (schema, want) in [
            (json!({"type": "string"}), true),
            (json!({"type": "integer"}), false),
            (json!({"type": ["integer", "null"]}), false),
            (json!({"type": ["string", "null"]}), true),
            (json!({"enum": ["a", "b"]}), true),
            (json!({"enum": [1, 2]}), false),
            (json!({"const": "x"}), true),
            (
                json!({"anyOf": [{"type": "number"}, {"type": "string"}]}),
                true,
            ),
            (
                json!({"oneOf": [{"type": "number"}, {"type": "boolean"}]}),
                false,
            ),
            (json!({}), false),
            (json!({"description": "anything"}), false),
            (json!({"format": "date"}), true),
            (json!({"type": "object", "properties": {}}), false),
            (json!({"type": "array", "items": {"type": "string"}}), false),
            (json!({"$ref": "#/$defs/s"}), true),
            (json!({"$ref": "#/$defs/n"}), false),
            (json!({"$ref": "#/$defs/loop"}), false),
            (json!({"$ref": "#/nowhere"}), false),
            (
                json!({"allOf": [{"type": "string"}, {"description": "x"}]}),
                true,
            ),
            (
                json!({"allOf": [{"type": "string"}, {"type": "number"}]}),
                false,
            ),
            (json!({"type": "string", "allOf": [{"minLength": 1}]}), true),
            (json!(true), false),
        ] {
            assert_eq!(may_be_string(&schema, &root), want, "{schema}");
        }
    }
}
