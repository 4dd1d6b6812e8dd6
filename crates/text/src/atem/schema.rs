//! Whether a tool parameter's JSON schema admits a string: such values are taken verbatim from
//! the ATEM text, all others are parsed as JSON.
//!
//! A port of llama.cpp common/json-schema.cpp (`build_node` and `may_be_string_impl`), which the
//! Muse Glimmer parser (common/parsers/muse-glimmer.cpp) calls per parameter.

use serde_json::Value;

const MAX_DEPTH: usize = 32;

/// Schema nodes the questions of one request's tools may visit together. A request's schema is
/// the client's: references that fan out (`anyOf` of the same `$ref`, nested) would otherwise
/// cost branches^depth visits, so once the budget is spent every answer is "not a string", as
/// for a cycle.
pub const VISIT_BUDGET: usize = 200_000;

/// `schema` may validate a string. `root` is the document `$ref`s point into (the tool's
/// `parameters`). Cycles (a reference to a target already on the path, as llama.cpp's
/// `may_be_string_impl` keeps them), unresolvable references, and a spent `budget` (schema
/// nodes left to visit, shared by a request's questions) count as "not a string".
pub fn may_be_string(schema: &Value, root: &Value, budget: &mut usize) -> bool {
    let mut walk = Walk {
        root,
        path: Vec::new(),
        left: *budget,
    };
    let found = walk.check(schema, 0);
    *budget = walk.left;
    found
}

struct Walk<'a> {
    root: &'a Value,
    /// The `$ref` targets on the path from the question's schema to here.
    path: Vec<*const Value>,
    /// Nodes left to visit.
    left: usize,
}

impl<'a> Walk<'a> {
    /// Takes `n` visits from the budget; false once it is spent.
    fn spend(&mut self, n: usize) -> bool {
        if self.left < n {
            self.left = 0;
            return false;
        }
        self.left -= n;
        true
    }

    fn check(&mut self, schema: &'a Value, depth: usize) -> bool {
        self.check_as(schema, depth, None)
    }

    /// `schema`, its `type` taken as `ty` where that is given: one member of a type array, as
    /// llama.cpp's `{"anyOf": [{"type": "a", ...}, {"type": "b", ...}]}` (without copying the
    /// schema for each).
    fn check_as(&mut self, schema: &'a Value, depth: usize, ty: Option<&'a Value>) -> bool {
        if depth > MAX_DEPTH || !self.spend(1) {
            return false;
        }
        let Some(s) = schema.as_object() else {
            return false;
        };
        if let Some(r) = s.get("$ref") {
            // A pointer is read part by part: its length is work too.
            let Some(t) = r
                .as_str()
                .filter(|r| self.spend(r.len() / 16))
                .and_then(|r| resolve(r, self.root))
            else {
                return false;
            };
            let key: *const Value = t;
            if self.path.contains(&key) {
                return false;
            }
            self.path.push(key);
            let found = self.check(t, depth + 1);
            self.path.pop();
            return found;
        }
        if let Some(alts) = s.get("oneOf").or_else(|| s.get("anyOf")) {
            return alts
                .as_array()
                .is_some_and(|a| a.iter().any(|c| self.check(c, depth + 1)));
        }
        let ty = ty.or_else(|| s.get("type"));
        if let Some(Value::Array(types)) = ty {
            return types
                .iter()
                .any(|t| self.check_as(schema, depth + 1, Some(t)));
        }
        if let Some(c) = s.get("const") {
            return c.is_string();
        }
        if let Some(e) = s.get("enum") {
            return e
                .as_array()
                .is_some_and(|a| self.spend(a.len() / 16) && a.iter().any(Value::is_string));
        }
        let has_properties = s.contains_key("properties")
            || s.get("additionalProperties")
                .is_some_and(|a| *a != Value::Bool(true));
        match ty.and_then(Value::as_str) {
            None => {
                if has_properties {
                    false
                } else if let Some(all) = s.get("allOf") {
                    self.all_of(all, depth)
                } else if s.contains_key("items") || s.contains_key("prefixItems") {
                    false
                } else {
                    ["pattern", "minLength", "maxLength", "format"]
                        .iter()
                        .any(|k| s.contains_key(*k))
                }
            }
            Some("string") => s.get("allOf").is_none_or(|all| self.all_of(all, depth)),
            Some("object") if !has_properties => {
                s.get("allOf").is_some_and(|all| self.all_of(all, depth))
            }
            Some(_) => false,
        }
    }

    /// Every child that constrains anything must allow a string, and one must.
    fn all_of(&mut self, all: &'a Value, depth: usize) -> bool {
        let Some(children) = all.as_array() else {
            return false;
        };
        let mut any_string = false;
        for c in children {
            if !self.spend(1) {
                return false;
            }
            if is_any(c) {
                continue;
            }
            if !self.check(c, depth + 1) {
                return false;
            }
            any_string = true;
        }
        any_string
    }
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
            assert_eq!(
                may_be_string(&schema, &root, &mut VISIT_BUDGET.clone()),
                want,
                "{schema}"
            );
        }
    }

    /// References that fan out (each `anyOf` of four references to itself) are cut at the
    /// cycle, and a wide acyclic fan-out (4^12 paths) at the request's visit budget: both answer
    /// at once.
    #[test]
    fn fanning_references_answer_at_once() {
        let t0 = std::time::Instant::now();
        let root = json!({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"$ref": "#/$defs/a"},
            {"$ref": "#/$defs/a"}, {"$ref": "#/$defs/a"}]}}});
        let mut budget = VISIT_BUDGET;
        assert!(!may_be_string(
            &json!({"$ref": "#/$defs/a"}),
            &root,
            &mut budget
        ));
        let mut defs = serde_json::Map::new();
        for i in 0..12 {
            let next = format!("#/$defs/d{}", i + 1);
            defs.insert(
                format!("d{i}"),
                json!({"anyOf": [{"$ref": next}, {"$ref": next}, {"$ref": next}, {"$ref": next}]}),
            );
        }
        defs.insert("d12".into(), json!({"type": "number"}));
        let root = json!({"$defs": defs});
        assert!(!may_be_string(
            &json!({"$ref": "#/$defs/d0"}),
            &root,
            &mut budget
        ));
        assert_eq!(budget, 0, "the acyclic fan-out spends the budget");
        // A string at the end of one short path is still found.
        let root = json!({"$defs": {"s": {"anyOf": [{"$ref": "#/$defs/s"}, {"type": "string"}]}}});
        assert!(may_be_string(
            &json!({"$ref": "#/$defs/s"}),
            &root,
            &mut VISIT_BUDGET.clone()
        ));
        assert!(t0.elapsed().as_secs() < 5, "{:?}", t0.elapsed());
    }
}
