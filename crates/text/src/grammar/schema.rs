//! JSON schemas to GBNF, as llama.cpp b11434 converts them: the schema read into the same tree
//! (`common/json-schema.cpp`: `$ref` into the same document, `anyOf`/`oneOf`, `allOf`, type
//! lists, `const`, `enum`, objects, arrays and tuples, strings with a length, a format or a
//! pattern, integers with bounds), then the same rules written under the same names
//! (`common/json-schema-to-grammar.cpp`), so that the grammar text is the anchor's byte for byte
//! (tests/grammar_golden.rs holds the anchor's own cases). Keywords the anchor ignores
//! (`description`, `minimum` on a number, ...) are ignored here too; an unsupported `pattern`
//! becomes any string, as there (a warning, not an error).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde_json::Value;

use crate::error::{Result, TextError};

/// `SPACE_RULE`.
pub const SPACE_RULE: &str = r#"| " " | "\n"{1,2} [ \t]{0,20}"#;

/// `PRIMITIVE_RULES`: (name, content, dependencies).
const PRIMITIVES: &[(&str, &str, &[&str])] = &[
    ("boolean", r#"("true" | "false")"#, &[]),
    ("decimal-part", "[0-9]{1,16}", &[]),
    ("integral-part", "[0] | [1-9] [0-9]{0,15}", &[]),
    (
        "number",
        r#"("-"? integral-part) ("." decimal-part)? ([eE] [-+]? integral-part)?"#,
        &["integral-part", "decimal-part"],
    ),
    ("integer", r#"("-"? integral-part)"#, &["integral-part"]),
    (
        "value",
        "object | array | string | number | boolean | null",
        &["object", "array", "string", "number", "boolean", "null"],
    ),
    (
        "object",
        r#""{" space ( string ":" space value ("," space string ":" space value)* )? space "}""#,
        &["string", "value"],
    ),
    (
        "array",
        r#""[" space ( value ("," space value)* )? space "]""#,
        &["value"],
    ),
    (
        "uuid",
        r#""\"" [0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12} "\"""#,
        &[],
    ),
    (
        "char",
        r#"[^"\\\x7F\x00-\x1F] | [\\] (["\\bfnrt] | "u" [0-9a-fA-F]{4})"#,
        &[],
    ),
    ("string", r#""\"" char* "\"""#, &["char"]),
    ("null", r#""null""#, &[]),
];

/// `STRING_FORMAT_RULES`.
const STRING_FORMATS: &[(&str, &str, &[&str])] = &[
    (
        "date",
        r#"[0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [1-2] [0-9] | "3" [0-1] )"#,
        &[],
    ),
    (
        "time",
        r#"([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{3} )? ( "Z" | ( "+" | "-" ) ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )"#,
        &[],
    ),
    ("date-time", r#"date "T" time"#, &["date", "time"]),
    ("date-string", r#""\"" date "\"""#, &["date"]),
    ("time-string", r#""\"" time "\"""#, &["time"]),
    ("date-time-string", r#""\"" date-time "\"""#, &["date-time"]),
];

fn builtin(name: &str) -> Option<(&'static str, &'static [&'static str])> {
    PRIMITIVES
        .iter()
        .chain(STRING_FORMATS)
        .find(|(n, _, _)| *n == name)
        .map(|&(_, c, d)| (c, d))
}

fn is_reserved_name(name: &str) -> bool {
    name == "root" || builtin(name).is_some()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    None,
    Date,
    Time,
    DateTime,
    Uuid,
}

/// `common_chat_schema`: the schema as the converter walks it.
#[derive(Clone, Debug)]
enum Node {
    Any,
    Ref(String),
    AnyOf(Vec<Node>),
    AllOf(Vec<Node>),
    Const(Value),
    Enum(Vec<Value>),
    Null,
    Boolean,
    Number,
    Integer {
        min: i64,
        max: i64,
    },
    String {
        pattern: Option<String>,
        format: Format,
        min_length: i64,
        max_length: i64,
    },
    Array {
        items: Box<Node>,
        min_items: i64,
        max_items: i64,
    },
    Tuple(Vec<Node>),
    Object {
        properties: Vec<(String, Node, bool)>,
        additional: Option<Box<Node>>,
    },
}

fn schema_error(path: &str, msg: &str) -> TextError {
    TextError::Grammar(format!("JSON schema error at {path}: {msg}"))
}

/// Schema nodes nested deeper than this (through `$ref`s too) are refused: each level is a
/// recursion of the reader and of the converter (llama.cpp has no bound, and a chain of `$ref`s
/// overflows its stack).
pub const MAX_SCHEMA_DEPTH: usize = 128;

/// Schema nodes one conversion may read (a type list reads the schema once per type); a
/// grammar of several schemas (a chat's tools, each parameter's schema read in its tool's
/// document) reads at most this many in all.
pub const MAX_SCHEMA_NODES: usize = 100_000;

/// Longest property name, in bytes. A property's rule is named after the properties above it
/// (llama.cpp's names, `{name}-{prop}`), and `_not_strings` walks each name's characters
/// recursively: a name of 200,000 characters overflowed a thread's stack. No real schema comes
/// near this.
pub const MAX_PROPERTY_NAME_BYTES: usize = 1024;

/// Most bytes of rules (names and bodies) a conversion writes: nested properties' names repeat
/// those above them, so a schema of a few megabytes could write gigabytes. (12,000 optional
/// properties write about 2 MB.)
pub const MAX_GRAMMAR_OUTPUT_BYTES: usize = 8 << 20;

/// `common_chat_schema_builder`: the tree and the targets of its `$ref`s.
struct Builder<'a> {
    root: &'a Value,
    /// Each `$ref` once (a cycle back to one stops at its reserved entry).
    refs: BTreeMap<String, Option<Node>>,
    depth: usize,
    nodes: usize,
}

impl<'a> Builder<'a> {
    fn new(root: &'a Value) -> Self {
        Builder {
            root,
            refs: BTreeMap::new(),
            depth: 0,
            nodes: 0,
        }
    }
}

impl<'a> Builder<'a> {
    fn get_count(schema: &Value, key: &str, path: &str, def: i64) -> Result<i64> {
        let Some(v) = schema.get(key) else {
            return Ok(def);
        };
        match json_int(v) {
            Some(i) if i >= 0 => Ok(i.min(i32::MAX as i64)),
            _ => Err(schema_error(
                path,
                &format!("{key} must be a non-negative integer"),
            )),
        }
    }

    fn get_bound(schema: &Value, key: &str, path: &str, round_up: bool) -> Result<i64> {
        let v = &schema[key];
        if let Some(i) = json_int(v) {
            return Ok(i);
        }
        let Some(d) = v.as_f64() else {
            return Err(schema_error(path, &format!("{key} must be a number")));
        };
        Ok(if round_up { d.ceil() } else { d.floor() } as i64)
    }

    fn get_format(schema: &Value, path: &str) -> Result<Format> {
        let Some(v) = schema.get("format") else {
            return Ok(Format::None);
        };
        let Some(f) = v.as_str() else {
            return Err(schema_error(path, "format must be a string"));
        };
        Ok(match f {
            "date" => Format::Date,
            "time" => Format::Time,
            "date-time" => Format::DateTime,
            "uuid" => Format::Uuid,
            _ if f.len() == 5
                && f.starts_with("uuid")
                && (b'1'..=b'5').contains(&f.as_bytes()[4]) =>
            {
                Format::Uuid
            }
            _ => Format::None,
        })
    }

    fn resolve_ref(&self, r: &str, path: &str) -> Result<&'a Value> {
        let mut target = self.root;
        // `string_split(ref.substr(1), "/")`, the first piece (empty) skipped.
        let pieces: Vec<&str> = r[1..].split('/').collect();
        for sel in pieces.iter().skip(1) {
            if let Some(t) = target.as_object().and_then(|o| o.get(*sel)) {
                target = t;
            } else if let Some(a) = target.as_array() {
                let idx = stoull_prefix(sel).unwrap_or(a.len() as u64);
                match a.get(idx as usize) {
                    Some(t) => target = t,
                    None => {
                        return Err(schema_error(
                            path,
                            &format!("cannot resolve $ref {r}, {sel} is out of range"),
                        ));
                    }
                }
            } else {
                return Err(schema_error(
                    path,
                    &format!("cannot resolve $ref {r}, {sel} not found"),
                ));
            }
        }
        Ok(target)
    }

    fn build_ref(&mut self, v: &'a Value, path: &str) -> Result<Node> {
        let Some(r) = v.as_str() else {
            return Err(schema_error(path, "$ref must be a string"));
        };
        if !r.starts_with("#/") {
            return Err(schema_error(
                path,
                &format!(
                    "unsupported $ref {r}, only references into the same document are supported"
                ),
            ));
        }
        if !self.refs.contains_key(r) {
            self.refs.insert(r.to_string(), None);
            let target = self.resolve_ref(r, path)?;
            let node = self.build_node(target, r)?;
            self.refs.insert(r.to_string(), Some(node));
        }
        Ok(Node::Ref(r.to_string()))
    }

    fn build_alternatives(&mut self, alts: &'a Value, path: &str) -> Result<Vec<Node>> {
        let Some(a) = alts.as_array() else {
            return Err(schema_error(path, "must be an array of schemas"));
        };
        if a.is_empty() {
            return Err(schema_error(path, "must not be empty"));
        }
        a.iter()
            .enumerate()
            .map(|(i, alt)| self.build_node(alt, &format!("{path}/{i}")))
            .collect()
    }

    fn build_object(&mut self, schema: &'a Value, path: &str) -> Result<Node> {
        let mut required = BTreeSet::new();
        if let Some(r) = schema.get("required").and_then(Value::as_array) {
            required.extend(r.iter().filter_map(Value::as_str).map(str::to_string));
        }
        let mut properties = Vec::new();
        if let Some(p) = schema.get("properties") {
            let Some(p) = p.as_object() else {
                return Err(schema_error(path, "properties must be an object"));
            };
            for (name, prop) in p {
                if name.len() > MAX_PROPERTY_NAME_BYTES {
                    return Err(schema_error(
                        path,
                        &format!(
                            "a property name of {} bytes (at most {MAX_PROPERTY_NAME_BYTES})",
                            name.len()
                        ),
                    ));
                }
                let node = self.build_node(prop, &format!("{path}/properties/{name}"))?;
                properties.push((name.clone(), node, required.contains(name)));
            }
        }
        let additional = match schema.get("additionalProperties") {
            Some(Value::Bool(true)) => Some(Box::new(Node::Any)),
            Some(Value::Bool(false)) => None,
            Some(a @ Value::Object(_)) => Some(Box::new(
                self.build_node(a, &format!("{path}/additionalProperties"))?,
            )),
            Some(_) => {
                return Err(schema_error(
                    path,
                    "additionalProperties must be a boolean or a schema",
                ));
            }
            // {"type": "object"} on its own accepts any object.
            None if schema.get("properties").is_none() => Some(Box::new(Node::Any)),
            None => None,
        };
        Ok(Node::Object {
            properties,
            additional,
        })
    }

    fn build_array(&mut self, schema: &'a Value, path: &str) -> Result<Node> {
        let items = if let Some((key, items)) = schema
            .get("items")
            .map(|i| ("items", i))
            .or_else(|| schema.get("prefixItems").map(|i| ("prefixItems", i)))
        {
            if let Some(a) = items.as_array() {
                let mut tuple = Vec::with_capacity(a.len());
                for (i, item) in a.iter().enumerate() {
                    tuple.push(self.build_node(item, &format!("{path}/{key}/{i}"))?);
                }
                return Ok(Node::Tuple(tuple));
            }
            self.build_node(items, &format!("{path}/{key}"))?
        } else {
            Node::Any
        };
        Ok(Node::Array {
            items: Box::new(items),
            min_items: Self::get_count(schema, "minItems", path, 0)?,
            max_items: Self::get_count(schema, "maxItems", path, -1)?,
        })
    }

    fn build_string(schema: &Value, path: &str) -> Result<Node> {
        let pattern = match schema.get("pattern") {
            None => None,
            Some(Value::String(p)) => Some(p.clone()),
            Some(_) => return Err(schema_error(path, "pattern must be a string")),
        };
        Ok(Node::String {
            pattern,
            format: Self::get_format(schema, path)?,
            min_length: Self::get_count(schema, "minLength", path, 0)?,
            max_length: Self::get_count(schema, "maxLength", path, -1)?,
        })
    }

    fn build_integer(schema: &Value, path: &str) -> Result<Node> {
        let mut min = i64::MIN;
        let mut max = i64::MAX;
        if schema.get("minimum").is_some() {
            min = Self::get_bound(schema, "minimum", path, true)?;
        } else if schema.get("exclusiveMinimum").is_some() {
            min = Self::get_bound(schema, "exclusiveMinimum", path, false)?.saturating_add(1);
        }
        if schema.get("maximum").is_some() {
            max = Self::get_bound(schema, "maximum", path, false)?;
        } else if schema.get("exclusiveMaximum").is_some() {
            max = Self::get_bound(schema, "exclusiveMaximum", path, true)?.saturating_sub(1);
        }
        Ok(Node::Integer { min, max })
    }

    fn build_node(&mut self, schema: &'a Value, path: &str) -> Result<Node> {
        self.build_node_as(schema, path, None)
    }

    /// `build_node`, the schema's `type` taken as `ty` where that is given: one member of a type
    /// list, as llama.cpp's copy of the schema with that type (without the copy).
    fn build_node_as(
        &mut self,
        schema: &'a Value,
        path: &str,
        ty: Option<&'a Value>,
    ) -> Result<Node> {
        self.nodes += 1;
        if self.nodes > MAX_SCHEMA_NODES {
            return Err(schema_error(
                path,
                &format!("the schema reads as more than {MAX_SCHEMA_NODES} nodes"),
            ));
        }
        if self.depth >= MAX_SCHEMA_DEPTH {
            return Err(schema_error(
                path,
                &format!("schemas nested deeper than {MAX_SCHEMA_DEPTH} (through $ref too)"),
            ));
        }
        self.depth += 1;
        let r = self.build_node_inner(schema, path, ty);
        self.depth -= 1;
        r
    }

    fn build_node_inner(
        &mut self,
        schema: &'a Value,
        path: &str,
        ty: Option<&'a Value>,
    ) -> Result<Node> {
        let Some(obj) = schema.as_object() else {
            return Err(schema_error(path, "schema must be an object"));
        };
        if let Some(r) = obj.get("$ref") {
            return self.build_ref(r, path);
        }
        if let Some((key, alts)) = obj
            .get("oneOf")
            .map(|a| ("oneOf", a))
            .or_else(|| obj.get("anyOf").map(|a| ("anyOf", a)))
        {
            return Ok(Node::AnyOf(
                self.build_alternatives(alts, &format!("{path}/{key}"))?,
            ));
        }
        let ty: &Value = ty.or_else(|| obj.get("type")).unwrap_or(&Value::Null);
        if let Value::Array(types) = ty {
            if types.is_empty() {
                return Err(schema_error(path, "type must not be empty"));
            }
            let mut alts = Vec::with_capacity(types.len());
            for (i, t) in types.iter().enumerate() {
                alts.push(self.build_node_as(schema, &format!("{path}/type/{i}"), Some(t))?);
            }
            return Ok(Node::AnyOf(alts));
        }
        if let Some(c) = obj.get("const") {
            return Ok(Node::Const(c.clone()));
        }
        if let Some(e) = obj.get("enum") {
            return match e.as_array() {
                Some(values) if !values.is_empty() => Ok(Node::Enum(values.clone())),
                _ => Err(schema_error(path, "enum must be a non-empty array")),
            };
        }
        if !ty.is_null() && !ty.is_string() {
            return Err(schema_error(
                path,
                "type must be a string or an array of strings",
            ));
        }
        let type_name = ty.as_str().unwrap_or("");
        let has_properties = obj.contains_key("properties")
            || obj
                .get("additionalProperties")
                .is_some_and(|a| *a != Value::Bool(true));
        match type_name {
            "" => {
                if has_properties {
                    return self.build_object(schema, path);
                }
                if let Some(all) = obj.get("allOf") {
                    return Ok(Node::AllOf(
                        self.build_alternatives(all, &format!("{path}/allOf"))?,
                    ));
                }
                if obj.contains_key("items") || obj.contains_key("prefixItems") {
                    return self.build_array(schema, path);
                }
                if obj.contains_key("pattern")
                    || obj.contains_key("minLength")
                    || obj.contains_key("maxLength")
                    || Self::get_format(schema, path)? != Format::None
                {
                    return Self::build_string(schema, path);
                }
                Ok(Node::Any)
            }
            "object" => {
                if !has_properties && let Some(all) = obj.get("allOf") {
                    return Ok(Node::AllOf(
                        self.build_alternatives(all, &format!("{path}/allOf"))?,
                    ));
                }
                self.build_object(schema, path)
            }
            "string" => {
                if let Some(all) = obj.get("allOf") {
                    return Ok(Node::AllOf(
                        self.build_alternatives(all, &format!("{path}/allOf"))?,
                    ));
                }
                Self::build_string(schema, path)
            }
            "array" => self.build_array(schema, path),
            "integer" => Self::build_integer(schema, path),
            "number" => Ok(Node::Number),
            "boolean" => Ok(Node::Boolean),
            "null" => Ok(Node::Null),
            other => Err(schema_error(path, &format!("unrecognized type {other}"))),
        }
    }
}

/// nlohmann's `is_number_integer` then `get<int64_t>`: an integer (a u64 above i64's range
/// wraps, as the cast does).
fn json_int(v: &Value) -> Option<i64> {
    v.as_i64().or_else(|| v.as_u64().map(|u| u as i64))
}

/// `std::stoull` of a string: its leading digits (after white space), or None where there are
/// none or they overflow.
fn stoull_prefix(s: &str) -> Option<u64> {
    let t = s.trim_start();
    let t = t.strip_prefix('+').unwrap_or(t);
    let digits: String = t.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// `std::stoi`: leading white space, a sign, digits; what follows is ignored. None where it
/// throws (no digits, out of int's range).
fn stoi(s: &str) -> Option<i32> {
    let t = s.trim_start_matches([' ', '\t', '\n', '\r', '\x0b', '\x0c']);
    let (neg, t) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let digits: String = t.chars().take_while(char::is_ascii_digit).collect();
    if digits.is_empty() {
        return None;
    }
    let v: i64 = digits.parse().ok()?;
    let v = if neg { -v } else { v };
    i32::try_from(v).ok()
}

/// nlohmann's `dump()` of a value (compact, keys in document order, non-ASCII as is, control
/// characters as `\u00xx`, doubles in its shortest form with an exponent `e+NN` / `e-NN`).
pub(crate) fn dump(v: &Value) -> String {
    let mut out = String::new();
    dump_into(v, &mut out);
    out
}

fn dump_into(v: &Value, out: &mut String) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                out.push_str(&i.to_string());
            } else if let Some(u) = n.as_u64() {
                out.push_str(&u.to_string());
            } else {
                out.push_str(&dump_double(n.as_f64().unwrap_or(f64::NAN)));
            }
        }
        Value::String(s) => dump_string(s, out),
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                dump_into(x, out);
            }
            out.push(']');
        }
        Value::Object(o) => {
            out.push('{');
            for (i, (k, x)) in o.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                dump_string(k, out);
                out.push(':');
                dump_into(x, out);
            }
            out.push('}');
        }
    }
}

fn dump_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// nlohmann's `to_chars` layout of a double's shortest digits: fixed for decimal exponents from
/// -4 to 15, else `d.ddde+NN`; always a `.0` or a fraction in fixed form.
fn dump_double(x: f64) -> String {
    if !x.is_finite() {
        return "null".to_string();
    }
    if x == 0.0 {
        return if x.is_sign_negative() { "-0.0" } else { "0.0" }.to_string();
    }
    // The shortest round-trip digits and exponent, from Rust's `{:e}` (shortest as grisu2's).
    let e = format!("{:e}", x.abs());
    let (mant, exp) = e.split_once('e').unwrap_or((&e, "0"));
    let digits: String = mant.chars().filter(char::is_ascii_digit).collect();
    let exp: i32 = exp.parse().unwrap_or(0);
    let n = digits.len() as i32;
    // k: the position of the decimal point after the first digit, as in nlohmann (value =
    // 0.d1d2... x 10^k).
    let k = exp + 1;
    let sign = if x < 0.0 { "-" } else { "" };
    const MIN_EXP: i32 = -4;
    const MAX_EXP: i32 = 15;
    let body = if n <= k && k <= MAX_EXP {
        format!("{digits}{}.0", "0".repeat((k - n) as usize))
    } else if 0 < k && k <= MAX_EXP {
        format!("{}.{}", &digits[..k as usize], &digits[k as usize..])
    } else if MIN_EXP < k && k <= 0 {
        format!("0.{}{digits}", "0".repeat((-k) as usize))
    } else {
        let e = k - 1;
        let mant = if n == 1 {
            digits.clone()
        } else {
            format!("{}.{}", &digits[..1], &digits[1..])
        };
        let (s, a) = if e < 0 { ('-', -e) } else { ('+', e) };
        format!("{mant}e{s}{a:02}")
    };
    format!("{sign}{body}")
}

/// `format_literal`: a GBNF string literal of `s` (`\r`, `\n`, `"`, `\` escaped).
pub fn format_literal(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '\r' => out.push_str("\\r"),
            '\n' => out.push_str("\\n"),
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `gbnf_escape_length`: the length of a GBNF escape at `pos` of `p`, 0 if none is there.
fn gbnf_escape_length(p: &[u8], pos: usize) -> usize {
    if pos + 1 >= p.len() || p[pos] != b'\\' {
        return 0;
    }
    let n_hex = match p[pos + 1] {
        b'x' => 2,
        b'u' => 4,
        b'U' => 8,
        b't' | b'r' | b'n' | b'\\' | b'"' | b'[' | b']' | b'-' => return 2,
        _ => return 0,
    };
    if pos + 2 + n_hex > p.len() {
        return 0;
    }
    if p[pos + 2..pos + 2 + n_hex]
        .iter()
        .all(u8::is_ascii_hexdigit)
    {
        2 + n_hex
    } else {
        0
    }
}

/// `build_repetition`.
fn build_repetition(item: &str, min: i64, max: i64, sep: &str) -> String {
    let has_max = max != i32::MAX as i64;
    if max == 0 {
        return String::new();
    }
    if min == 0 && max == 1 {
        return format!("{item}?");
    }
    if sep.is_empty() {
        if min == 1 && !has_max {
            return format!("{item}+");
        }
        if min == 0 && !has_max {
            return format!("{item}*");
        }
        return format!(
            "{item}{{{min},{}}}",
            if has_max {
                max.to_string()
            } else {
                String::new()
            }
        );
    }
    let result = format!(
        "{item} {}",
        build_repetition(
            &format!("({sep} {item})"),
            if min == 0 { 0 } else { min - 1 },
            if has_max { max - 1 } else { max },
            ""
        )
    );
    if min == 0 {
        format!("({result})?")
    } else {
        result
    }
}

/// `build_min_max_int`: integers from `min` to `max` (`i64::MIN` / `i64::MAX`: unbounded).
fn build_min_max_int(min: i64, max: i64, out: &mut String, decimals_left: i64, top_level: bool) {
    let has_min = min != i64::MIN;
    let has_max = max != i64::MAX;
    fn digit_range(out: &mut String, from: u8, to: u8) {
        out.push('[');
        out.push(from as char);
        if from != to {
            out.push('-');
            out.push(to as char);
        }
        out.push(']');
    }
    fn more_digits(out: &mut String, min_digits: i64, max_digits: i64) {
        out.push_str("[0-9]");
        if min_digits == max_digits && min_digits == 1 {
            return;
        }
        out.push('{');
        out.push_str(&min_digits.to_string());
        if max_digits != min_digits {
            out.push(',');
            if max_digits != i32::MAX as i64 {
                out.push_str(&max_digits.to_string());
            }
        }
        out.push('}');
    }
    fn uniform_range(out: &mut String, from: &[u8], to: &[u8]) {
        let mut i = 0;
        while i < from.len() && i < to.len() && from[i] == to[i] {
            i += 1;
        }
        if i > 0 {
            out.push('"');
            out.push_str(&String::from_utf8_lossy(&from[..i]));
            out.push('"');
        }
        if i < from.len() && i < to.len() {
            if i > 0 {
                out.push(' ');
            }
            let sub_len = from.len() - i - 1;
            if sub_len > 0 {
                let from_sub = &from[i + 1..];
                let to_sub = &to[i + 1..];
                let zeros = vec![b'0'; sub_len];
                let nines = vec![b'9'; sub_len];
                let mut to_reached = false;
                out.push('(');
                if from_sub == zeros.as_slice() {
                    digit_range(out, from[i], to[i] - 1);
                    out.push(' ');
                    more_digits(out, sub_len as i64, sub_len as i64);
                } else {
                    out.push('[');
                    out.push(from[i] as char);
                    out.push_str("] ");
                    out.push('(');
                    uniform_range(out, from_sub, &nines);
                    out.push(')');
                    if from[i] < to[i] - 1 {
                        out.push_str(" | ");
                        if to_sub == nines.as_slice() {
                            digit_range(out, from[i] + 1, to[i]);
                            to_reached = true;
                        } else {
                            digit_range(out, from[i] + 1, to[i] - 1);
                        }
                        out.push(' ');
                        more_digits(out, sub_len as i64, sub_len as i64);
                    }
                }
                if !to_reached {
                    out.push_str(" | ");
                    digit_range(out, to[i], to[i]);
                    out.push(' ');
                    uniform_range(out, &zeros, to_sub);
                }
                out.push(')');
            } else {
                out.push('[');
                out.push(from[i] as char);
                out.push('-');
                out.push(to[i] as char);
                out.push(']');
            }
        }
    }

    let mut min_value = min;
    if has_min && has_max {
        if min_value < 0 && max < 0 {
            out.push_str("\"-\" (");
            build_min_max_int(
                max.saturating_neg(),
                min_value.saturating_neg(),
                out,
                decimals_left,
                true,
            );
            out.push(')');
            return;
        }
        if min_value < 0 {
            out.push_str("\"-\" (");
            build_min_max_int(0, min_value.saturating_neg(), out, decimals_left, true);
            out.push_str(") | ");
            min_value = 0;
        }
        let mut min_s = min_value.to_string().into_bytes();
        let max_s = max.to_string().into_bytes();
        let (min_digits, max_digits) = (min_s.len(), max_s.len());
        for digits in min_digits..max_digits {
            uniform_range(out, &min_s, &vec![b'9'; digits]);
            min_s = format!("1{}", "0".repeat(digits)).into_bytes();
            out.push_str(" | ");
        }
        uniform_range(out, &min_s, &max_s);
        return;
    }
    let less_decimals = (decimals_left - 1).max(1);
    if has_min {
        if min_value < 0 {
            out.push_str("\"-\" (");
            build_min_max_int(
                i64::MIN,
                min_value.saturating_neg(),
                out,
                decimals_left,
                false,
            );
            out.push_str(") | [0] | [1-9] ");
            more_digits(out, 0, decimals_left - 1);
        } else if min_value == 0 {
            if top_level {
                out.push_str("[0] | [1-9] ");
                more_digits(out, 0, less_decimals);
            } else {
                more_digits(out, 1, decimals_left);
            }
        } else if min_value <= 9 {
            let c = b'0' + min_value as u8;
            let range_start = if top_level { b'1' } else { b'0' };
            if c > range_start {
                digit_range(out, range_start, c - 1);
                out.push(' ');
                more_digits(out, 1, less_decimals);
                out.push_str(" | ");
            }
            digit_range(out, c, b'9');
            out.push(' ');
            more_digits(out, 0, less_decimals);
        } else {
            let min_s = min_value.to_string();
            let len = min_s.len() as i64;
            let c = min_s.as_bytes()[0];
            if c > b'1' {
                digit_range(out, if top_level { b'1' } else { b'0' }, c - 1);
                out.push(' ');
                more_digits(out, len, less_decimals);
                out.push_str(" | ");
            }
            digit_range(out, c, c);
            out.push_str(" (");
            let rest: i64 = min_s[1..].parse().unwrap_or(0);
            build_min_max_int(rest, i64::MAX, out, less_decimals, false);
            out.push(')');
            if c < b'9' {
                out.push_str(" | ");
                digit_range(out, c + 1, b'9');
                out.push(' ');
                more_digits(out, len - 1, less_decimals);
            }
        }
        return;
    }
    if has_max {
        if max >= 0 {
            if top_level {
                out.push_str("\"-\" [1-9] ");
                more_digits(out, 0, less_decimals);
                out.push_str(" | ");
            }
            build_min_max_int(0, max, out, decimals_left, true);
        } else {
            out.push_str("\"-\" (");
            build_min_max_int(max.saturating_neg(), i64::MAX, out, decimals_left, false);
            out.push(')');
        }
        return;
    }
    // Neither bound: the caller does not come here (the integer primitive).
    out.push_str("integer");
}

/// A pattern the converter cannot express (a warning: the property becomes any string), or a
/// pattern that is no regular expression at all (an error).
enum PatternError {
    Unsupported(String),
    Invalid(String),
}

/// `MAX_PATTERN_DEPTH`.
const MAX_PATTERN_DEPTH: i32 = 100;

/// `common_chat_schema_converter`.
struct Converter {
    dotall: bool,
    rules: BTreeMap<String, String>,
    refs: BTreeMap<String, Option<Node>>,
    refs_being_resolved: BTreeSet<String>,
    errors: Vec<String>,
    warnings: Vec<String>,
    /// `visit`s under way (a chain of `$ref`s nests them).
    depth: usize,
    /// Bytes of the rules written (`MAX_GRAMMAR_OUTPUT_BYTES`), and whether one did not fit.
    bytes: usize,
    over_budget: bool,
    /// While a pattern converts: the rules it added, removed again if it cannot (llama.cpp
    /// copies every rule before each pattern and puts them back).
    log: Option<Vec<String>>,
    /// Before the name of a `$ref`'s rule: empty (llama.cpp's names) for one document, a
    /// document's own for a grammar of several (a tool's `#/$defs/x` is not another tool's).
    ref_prefix: String,
}

/// `INVALID_RULE_CHARS_RE` replaced by "-": every run of characters outside [a-zA-Z0-9-].
fn rule_name_escape(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut in_run = false;
    for c in name.chars() {
        if c.is_ascii_alphanumeric() || c == '-' {
            out.push(c);
            in_run = false;
        } else if !in_run {
            out.push('-');
            in_run = true;
        }
    }
    out
}

impl Converter {
    fn new(dotall: bool) -> Self {
        let mut rules = BTreeMap::new();
        rules.insert("space".to_string(), SPACE_RULE.to_string());
        Converter {
            dotall,
            rules,
            refs: BTreeMap::new(),
            refs_being_resolved: BTreeSet::new(),
            errors: Vec::new(),
            warnings: Vec::new(),
            depth: 0,
            bytes: SPACE_RULE.len() + "space".len(),
            over_budget: false,
            log: None,
            ref_prefix: String::new(),
        }
    }

    fn add_rule(&mut self, name: &str, rule: &str) -> String {
        let esc = rule_name_escape(name);
        if self.rules.get(&esc).is_none_or(|r| r == rule) {
            if !self.rules.contains_key(&esc) && self.within_budget(&esc, rule) {
                self.rules.insert(esc.clone(), rule.to_string());
                if let Some(log) = &mut self.log {
                    log.push(esc.clone());
                }
            }
            return esc;
        }
        let mut i = 0;
        while self
            .rules
            .get(&format!("{esc}{i}"))
            .is_some_and(|r| r != rule)
        {
            i += 1;
        }
        let key = format!("{esc}{i}");
        if !self.rules.contains_key(&key) && self.within_budget(&key, rule) {
            self.rules.insert(key.clone(), rule.to_string());
            if let Some(log) = &mut self.log {
                log.push(key.clone());
            }
        }
        key
    }

    /// Whether a new rule fits `MAX_GRAMMAR_OUTPUT_BYTES` (counted if it does); past it nothing
    /// more is written and the conversion fails (`check`).
    fn within_budget(&mut self, name: &str, rule: &str) -> bool {
        let n = name.len() + rule.len();
        if self.bytes + n > MAX_GRAMMAR_OUTPUT_BYTES {
            if !self.over_budget {
                self.over_budget = true;
                self.errors.push(format!(
                    "the grammar would be more than {MAX_GRAMMAR_OUTPUT_BYTES} bytes of rules"
                ));
            }
            return false;
        }
        self.bytes += n;
        true
    }

    fn add_primitive(&mut self, name: &str, prim: &str) -> String {
        let Some((content, deps)) = builtin(prim) else {
            self.errors.push(format!("Rule {prim} not known"));
            return String::new();
        };
        let n = self.add_rule(name, content);
        for dep in deps {
            if builtin(dep).is_none() {
                self.errors.push(format!("Rule {dep} not known"));
                continue;
            }
            if !self.rules.contains_key(*dep) {
                self.add_primitive(dep, dep);
            }
        }
        n
    }

    fn generate_union_rule(&mut self, name: &str, alts: &[Node]) -> String {
        let mut rules = Vec::with_capacity(alts.len());
        for (i, alt) in alts.iter().enumerate() {
            let sub = if name.is_empty() {
                format!("alternative-{i}")
            } else {
                format!("{name}-{i}")
            };
            rules.push(self.visit(alt, &sub));
        }
        rules.join(" | ")
    }

    fn visit_pattern(&mut self, pattern: &str, name: &str) -> String {
        self.log = Some(Vec::new());
        let r = self.pattern_to_rule(pattern, name);
        let added = self.log.take().unwrap_or_default();
        let undo = |c: &mut Converter| {
            for k in &added {
                if let Some(r) = c.rules.remove(k) {
                    c.bytes -= k.len() + r.len();
                }
            }
        };
        match r {
            Ok(r) => r,
            Err(PatternError::Unsupported(why)) => {
                undo(self);
                self.warnings.push(format!(
                    "pattern {pattern} is not supported ({why}), accepting any string"
                ));
                let s = self.add_primitive("string", "string");
                self.add_rule(name, &s)
            }
            Err(PatternError::Invalid(why)) => {
                undo(self);
                self.errors
                    .push(format!("Invalid pattern {pattern}: {why}"));
                String::new()
            }
        }
    }

    fn pattern_to_rule(
        &mut self,
        pattern: &str,
        name: &str,
    ) -> std::result::Result<String, PatternError> {
        let pb = pattern.as_bytes();
        if pb.len() < 2 || pb[0] != b'^' || pb[pb.len() - 1] != b'$' {
            return Err(PatternError::Unsupported(
                "not anchored with '^' and '$'".into(),
            ));
        }
        let sub: Vec<u8> = pb[1..pb.len() - 1].to_vec();
        let mut st = PatternState {
            sub: &sub,
            i: 0,
            paren_depth: 0,
            sub_rule_ids: HashMap::new(),
            name,
        };
        let (r, lit) = st.transform(self)?;
        let rule = to_rule(&r, lit);
        if st.paren_depth != 0 {
            return Err(PatternError::Invalid("unbalanced parentheses".into()));
        }
        Ok(self.add_rule(name, &format!("\"\\\"\" ({rule}) \"\\\"\"")))
    }

    /// `_not_strings`: a JSON string that is none of `strings`.
    fn not_strings(&mut self, strings: &[String]) -> String {
        let trie = Trie::new(strings);
        let char_rule = self.add_primitive("char", "char");
        let mut out = String::from("[\"] ( ");
        fn visit(trie: &Trie, idx: usize, char_rule: &str, out: &mut String) {
            let node = &trie.nodes[idx];
            let mut rejects = String::new();
            let mut first = true;
            for (&cpt, &child) in &node.children {
                let c = char::from_u32(cpt).unwrap_or('\u{FFFD}');
                rejects.push(c);
                if first {
                    first = false;
                } else {
                    out.push_str(" | ");
                }
                out.push('[');
                out.push(c);
                out.push(']');
                if !trie.nodes[child].children.is_empty() {
                    out.push_str(" (");
                    visit(trie, child, char_rule, out);
                    out.push(')');
                } else {
                    out.push(' ');
                    out.push_str(char_rule);
                    out.push('+');
                }
            }
            if !node.children.is_empty() {
                out.push_str(" | [^\"");
                out.push_str(&rejects);
                out.push_str("] ");
                out.push_str(char_rule);
                out.push('*');
            }
        }
        visit(&trie, 0, &char_rule, &mut out);
        out.push_str(" )");
        if !trie.nodes[0].terminal {
            out.push('?');
        }
        out.push_str(" [\"]");
        out
    }

    fn resolve_ref(&mut self, r: &str) -> String {
        let frag = match r.find('#') {
            Some(i) => &r[i + 1..],
            None => r,
        };
        let mut ref_name = format!("{}ref{}", self.ref_prefix, rule_name_escape(frag));
        if !self.rules.contains_key(&ref_name) && !self.refs_being_resolved.contains(r) {
            let Some(Some(target)) = self.refs.get(r).cloned() else {
                self.errors.push(format!("Unresolved $ref {r}"));
                return String::new();
            };
            self.refs_being_resolved.insert(r.to_string());
            ref_name = self.visit(&target, &ref_name);
            self.refs_being_resolved.remove(r);
        }
        ref_name
    }

    fn build_object_rule(
        &mut self,
        properties: &[(String, Node)],
        required: &BTreeSet<String>,
        name: &str,
        additional: Option<&Node>,
    ) -> String {
        let dash = if name.is_empty() { "" } else { "-" };
        let mut required_props = Vec::new();
        let mut optional_props = Vec::new();
        let mut kv_rule_names: HashMap<String, String> = HashMap::new();
        let mut prop_names = Vec::new();
        for (prop_name, prop_schema) in properties {
            let prop_rule = self.visit(prop_schema, &format!("{name}{dash}{prop_name}"));
            let kv = self.add_rule(
                &format!("{name}{dash}{prop_name}-kv"),
                &format!(
                    "{} space \":\" space {prop_rule}",
                    format_literal(&dump(&Value::String(prop_name.clone())))
                ),
            );
            kv_rule_names.insert(prop_name.clone(), kv);
            if required.contains(prop_name) {
                required_props.push(prop_name.clone());
            } else {
                optional_props.push(prop_name.clone());
            }
            prop_names.push(prop_name.clone());
        }
        if let Some(add) = additional {
            let sub_name = format!("{name}{dash}additional");
            let value_rule = if matches!(add, Node::Any) {
                self.add_primitive("value", "value")
            } else {
                self.visit(add, &format!("{sub_name}-value"))
            };
            let key_rule = if prop_names.is_empty() {
                self.add_primitive("string", "string")
            } else {
                let ns = self.not_strings(&prop_names);
                self.add_rule(&format!("{sub_name}-k"), &ns)
            };
            let kv = self.add_rule(
                &format!("{sub_name}-kv"),
                &format!("{key_rule} \":\" space {value_rule}"),
            );
            kv_rule_names.insert("*".to_string(), kv);
            optional_props.push("*".to_string());
        }
        if required_props.is_empty() && optional_props.is_empty() {
            return "\"{\" space \"}\"".to_string();
        }
        let mut rule = String::from("\"{\" space ");
        for (i, p) in required_props.iter().enumerate() {
            if i > 0 {
                rule.push_str(" \",\" space ");
            }
            rule.push_str(&kv_rule_names[p]);
        }
        if !optional_props.is_empty() {
            rule.push_str(" (");
            if !required_props.is_empty() {
                rule.push_str(" \",\" space ( ");
            }
            // `get_recursive_refs` of every suffix, each rest rule written once, from the last
            // (the recursion's order, so the same names), instead of once per suffix.
            let n = optional_props.len();
            let dash = if name.is_empty() { "" } else { "-" };
            let mut rest: Vec<Option<String>> = vec![None; n + 1];
            for j in (1..n).rev() {
                let k = &optional_props[j];
                let mut body = format!(
                    "( \",\" space {} ){}",
                    kv_rule_names[k],
                    if k == "*" { "*" } else { "?" }
                );
                if let Some(r) = &rest[j + 1] {
                    body.push(' ');
                    body.push_str(r);
                }
                let prev = &optional_props[j - 1];
                rest[j] = Some(self.add_rule(&format!("{name}{dash}{prev}-rest"), &body));
            }
            for i in 0..n {
                if i > 0 {
                    rule.push_str(" | ");
                }
                let k = &optional_props[i];
                rule.push_str(&kv_rule_names[k]);
                if k == "*" {
                    rule.push_str(&format!(" ( \",\" space {} )*", kv_rule_names[k]));
                }
                if let Some(r) = &rest[i + 1] {
                    rule.push(' ');
                    rule.push_str(r);
                }
            }
            if !required_props.is_empty() {
                rule.push_str(" )");
            }
            rule.push_str(" )?");
        }
        rule.push_str(" space \"}\"");
        rule
    }

    fn generate_constant_rule(v: &Value) -> String {
        format_literal(&dump(v))
    }

    fn visit_primitive(&mut self, rule_name: &str, ty: &str) -> String {
        self.add_primitive(if rule_name == "root" { "root" } else { ty }, ty)
    }

    fn visit_all_of(&mut self, children: &[Node], name: &str, rule_name: &str) -> String {
        let mut required = BTreeSet::new();
        let mut properties: Vec<(String, Node)> = Vec::new();
        // `std::map<std::string, size_t>`: each enum literal, how many children give it.
        let mut enum_values: BTreeMap<String, usize> = BTreeMap::new();
        // The `$ref`s being followed: one that leads back to itself is refused (llama.cpp follows
        // it until its stack overflows).
        let mut following: Vec<String> = Vec::new();
        #[allow(clippy::too_many_arguments)]
        fn add_component(
            c: &Converter,
            comp: &Node,
            is_required: bool,
            required: &mut BTreeSet<String>,
            properties: &mut Vec<(String, Node)>,
            enum_values: &mut BTreeMap<String, usize>,
            following: &mut Vec<String>,
            cycle: &mut Option<String>,
        ) {
            match comp {
                Node::Ref(r) => {
                    if following.contains(r) {
                        cycle.get_or_insert_with(|| r.clone());
                        return;
                    }
                    if let Some(Some(target)) = c.refs.get(r) {
                        following.push(r.clone());
                        add_component(
                            c,
                            target,
                            is_required,
                            required,
                            properties,
                            enum_values,
                            following,
                            cycle,
                        );
                        following.pop();
                    }
                }
                Node::Object { properties: p, .. } => {
                    for (n, s, _) in p {
                        properties.push((n.clone(), s.clone()));
                        if is_required {
                            required.insert(n.clone());
                        }
                    }
                }
                Node::Enum(values) => {
                    for v in values {
                        *enum_values
                            .entry(Converter::generate_constant_rule(v))
                            .or_insert(0) += 1;
                    }
                }
                _ => {}
            }
        }
        let mut cycle: Option<String> = None;
        for child in children {
            if let Node::AnyOf(alts) = child {
                for alt in alts {
                    add_component(
                        self,
                        alt,
                        false,
                        &mut required,
                        &mut properties,
                        &mut enum_values,
                        &mut following,
                        &mut cycle,
                    );
                }
            } else {
                add_component(
                    self,
                    child,
                    true,
                    &mut required,
                    &mut properties,
                    &mut enum_values,
                    &mut following,
                    &mut cycle,
                );
            }
        }
        if let Some(r) = cycle {
            self.errors
                .push(format!("allOf refers back to itself through $ref {r}"));
            return self.add_rule(rule_name, "space");
        }
        if !enum_values.is_empty() {
            let both: Vec<&String> = enum_values
                .iter()
                .filter(|(_, n)| **n == children.len())
                .map(|(k, _)| k)
                .collect();
            if !both.is_empty() {
                let body = format!(
                    "({})",
                    both.iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join(" | ")
                );
                return self.add_rule(rule_name, &body);
            }
        }
        let r = self.build_object_rule(&properties, &required, name, None);
        self.add_rule(rule_name, &r)
    }

    fn visit(&mut self, schema: &Node, name: &str) -> String {
        if self.depth >= MAX_SCHEMA_DEPTH {
            self.errors.push(format!(
                "schemas nested deeper than {MAX_SCHEMA_DEPTH} (through $ref too)"
            ));
            return String::new();
        }
        self.depth += 1;
        let r = self.visit_inner(schema, name);
        self.depth -= 1;
        r
    }

    fn visit_inner(&mut self, schema: &Node, name: &str) -> String {
        let rule_name = if is_reserved_name(name) {
            format!("{name}-")
        } else if name.is_empty() {
            "root".to_string()
        } else {
            name.to_string()
        };
        let sub_name = if name.is_empty() {
            String::new()
        } else {
            format!("{name}-")
        };
        match schema {
            Node::Ref(r) => {
                let body = self.resolve_ref(r);
                self.add_rule(&rule_name, &body)
            }
            Node::AnyOf(alts) => {
                let body = self.generate_union_rule(name, alts);
                self.add_rule(&rule_name, &body)
            }
            Node::AllOf(children) => self.visit_all_of(children, name, &rule_name),
            Node::Const(v) => self.add_rule(&rule_name, &Self::generate_constant_rule(v)),
            Node::Enum(values) => {
                let alts: Vec<String> = values.iter().map(Self::generate_constant_rule).collect();
                self.add_rule(&rule_name, &format!("({})", alts.join(" | ")))
            }
            Node::Object {
                properties,
                additional,
            } => {
                if properties.is_empty() && matches!(additional.as_deref(), Some(Node::Any)) {
                    let o = self.add_primitive("object", "object");
                    return self.add_rule(&rule_name, &o);
                }
                let props: Vec<(String, Node)> = properties
                    .iter()
                    .map(|(n, s, _)| (n.clone(), s.clone()))
                    .collect();
                let required: BTreeSet<String> = properties
                    .iter()
                    .filter(|(_, _, r)| *r)
                    .map(|(n, _, _)| n.clone())
                    .collect();
                let body = self.build_object_rule(&props, &required, name, additional.as_deref());
                self.add_rule(&rule_name, &body)
            }
            Node::Tuple(items) => {
                let mut rule = String::from("\"[\" space ");
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        rule.push_str(" \",\" space ");
                    }
                    let r = self.visit(item, &format!("{sub_name}tuple-{i}"));
                    rule.push_str(&r);
                }
                rule.push_str(" space \"]\"");
                self.add_rule(&rule_name, &rule)
            }
            Node::Array {
                items,
                min_items,
                max_items,
            } => {
                if matches!(**items, Node::Any) && *min_items == 0 && *max_items < 0 {
                    return self.visit_primitive(&rule_name, "array");
                }
                let item_rule = self.visit(items, &format!("{sub_name}item"));
                let max = if *max_items < 0 {
                    i32::MAX as i64
                } else {
                    *max_items
                };
                let body = format!(
                    "\"[\" space {} space \"]\"",
                    build_repetition(&item_rule, *min_items, max, "\",\" space")
                );
                self.add_rule(&rule_name, &body)
            }
            Node::String {
                pattern,
                format,
                min_length,
                max_length,
            } => {
                if let Some(p) = pattern.as_deref().filter(|p| !p.is_empty()) {
                    return self.visit_pattern(p, &rule_name);
                }
                match format {
                    Format::Uuid => return self.visit_primitive(&rule_name, "uuid"),
                    Format::Date | Format::Time | Format::DateTime => {
                        let prim = match format {
                            Format::Date => "date-string",
                            Format::Time => "time-string",
                            _ => "date-time-string",
                        };
                        let p = self.add_primitive(prim, prim);
                        return self.add_rule(&rule_name, &p);
                    }
                    Format::None => {}
                }
                if *min_length > 0 || *max_length >= 0 {
                    let char_rule = self.add_primitive("char", "char");
                    let max = if *max_length < 0 {
                        i32::MAX as i64
                    } else {
                        *max_length
                    };
                    let body = format!(
                        "\"\\\"\" {} \"\\\"\"",
                        build_repetition(&char_rule, *min_length, max, "")
                    );
                    return self.add_rule(&rule_name, &body);
                }
                self.visit_primitive(&rule_name, "string")
            }
            Node::Integer { min, max } => {
                if *min == i64::MIN && *max == i64::MAX {
                    return self.visit_primitive(&rule_name, "integer");
                }
                let mut out = String::from("(");
                build_min_max_int(*min, *max, &mut out, 16, true);
                out.push(')');
                self.add_rule(&rule_name, &out)
            }
            Node::Number => self.visit_primitive(&rule_name, "number"),
            Node::Boolean => self.visit_primitive(&rule_name, "boolean"),
            Node::Null => self.visit_primitive(&rule_name, "null"),
            Node::Any => {
                let v = self.add_primitive("value", "value");
                self.add_rule(&rule_name, &v)
            }
        }
    }

    fn format_grammar(&self) -> String {
        let mut s = String::new();
        for (k, v) in &self.rules {
            s.push_str(k);
            s.push_str(" ::= ");
            s.push_str(v);
            s.push('\n');
        }
        s
    }
}

fn to_rule(s: &str, is_literal: bool) -> String {
    if is_literal {
        format!("\"{s}\"")
    } else {
        s.to_string()
    }
}

/// `_pattern_to_rule`'s walk over the pattern between `^` and `$`.
struct PatternState<'a> {
    sub: &'a [u8],
    i: usize,
    paren_depth: i32,
    sub_rule_ids: HashMap<String, String>,
    name: &'a str,
}

/// The regex characters that are not literal (`NON_LITERAL_SET`).
fn is_non_literal(c: u8) -> bool {
    b"|.()[]{}*+?^$".contains(&c)
}

impl PatternState<'_> {
    fn get_dot(&self, conv: &mut Converter) -> String {
        let rule = if conv.dotall {
            "[\\U00000000-\\U0010FFFF]"
        } else {
            "[^\\x0A\\x0D]"
        };
        conv.add_rule("dot", rule)
    }

    fn transform(
        &mut self,
        conv: &mut Converter,
    ) -> std::result::Result<(String, bool), PatternError> {
        let mut seq: Vec<(String, bool)> = Vec::new();
        let length = self.sub.len();
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        let join_seq = |seq: &[(String, bool)]| -> (String, bool) {
            let mut ret: Vec<(String, bool)> = Vec::new();
            let mut literal = String::new();
            for (s, lit) in seq {
                if *lit {
                    literal.push_str(s);
                } else {
                    if !literal.is_empty() {
                        ret.push((std::mem::take(&mut literal), true));
                    }
                    ret.push((s.clone(), false));
                }
            }
            if !literal.is_empty() {
                ret.push((literal, true));
            }
            let parts: Vec<String> = ret.iter().map(|(s, l)| to_rule(s, *l)).collect();
            (parts.join(" "), false)
        };
        while self.i < length {
            let c = self.sub[self.i];
            if c == b'.' {
                seq.push((self.get_dot(conv), false));
                self.i += 1;
            } else if c == b'(' {
                self.i += 1;
                if self.i < length && self.sub[self.i] == b'?' {
                    if self.i + 1 < length && self.sub[self.i + 1] == b':' {
                        self.i += 2;
                    } else {
                        return Err(PatternError::Unsupported("unsupported group syntax".into()));
                    }
                }
                self.paren_depth += 1;
                if self.paren_depth > MAX_PATTERN_DEPTH {
                    return Err(PatternError::Unsupported("pattern nesting too deep".into()));
                }
                let (r, l) = self.transform(conv)?;
                seq.push((format!("({})", to_rule(&r, l)), false));
            } else if c == b')' {
                self.i += 1;
                if self.paren_depth == 0 {
                    return Err(PatternError::Invalid("unbalanced parentheses".into()));
                }
                self.paren_depth -= 1;
                return Ok(join_seq(&seq));
            } else if c == b'^' || c == b'$' {
                return Err(PatternError::Unsupported(
                    "anchor inside the pattern".into(),
                ));
            } else if c == b'[' {
                let mut sq = vec![c];
                self.i += 1;
                while self.i < length && self.sub[self.i] != b']' {
                    if self.sub[self.i] == b'\\' {
                        let n = gbnf_escape_length(self.sub, self.i);
                        if n == 0 {
                            let end = (self.i + 2).min(length);
                            return Err(PatternError::Unsupported(format!(
                                "unsupported escape in character class: {}",
                                text(&self.sub[self.i..end])
                            )));
                        }
                        sq.extend_from_slice(&self.sub[self.i..self.i + n]);
                        self.i += n;
                    } else {
                        sq.push(self.sub[self.i]);
                        self.i += 1;
                    }
                }
                if self.i >= length {
                    return Err(PatternError::Invalid("unterminated character class".into()));
                }
                sq.push(b']');
                self.i += 1;
                seq.push((text(&sq), false));
            } else if c == b'|' {
                seq.push(("|".into(), false));
                self.i += 1;
            } else if c == b'*' || c == b'+' || c == b'?' {
                let Some(last) = seq.last_mut() else {
                    return Err(PatternError::Invalid("nothing to repeat".into()));
                };
                *last = (format!("{}{}", to_rule(&last.0, last.1), c as char), false);
                self.i += 1;
            } else if c == b'{' {
                let mut curly = vec![c];
                self.i += 1;
                while self.i < length && self.sub[self.i] != b'}' {
                    curly.push(self.sub[self.i]);
                    self.i += 1;
                }
                if self.i >= length {
                    return Err(PatternError::Unsupported(
                        "unterminated curly brackets".into(),
                    ));
                }
                curly.push(b'}');
                self.i += 1;
                let inner = text(&curly[1..curly.len() - 1]);
                let nums = string_split(&inner, ",");
                if nums.len() != 1 && nums.len() != 2 {
                    return Err(PatternError::Unsupported(
                        "wrong number of values in curly brackets".into(),
                    ));
                }
                let bad = || PatternError::Unsupported("invalid number in curly brackets".into());
                let (min_times, max_times) = if nums.len() == 1 {
                    let v = stoi(&nums[0]).ok_or_else(bad)? as i64;
                    (v, v)
                } else {
                    let min = if nums[0].is_empty() {
                        0
                    } else {
                        stoi(&nums[0]).ok_or_else(bad)? as i64
                    };
                    let max = if nums[1].is_empty() {
                        i32::MAX as i64
                    } else {
                        stoi(&nums[1]).ok_or_else(bad)? as i64
                    };
                    (min, max)
                };
                let Some(last) = seq.last().cloned() else {
                    return Err(PatternError::Invalid("nothing to repeat".into()));
                };
                let (mut sub, sub_is_literal) = last;
                if !sub_is_literal {
                    let n = self.sub_rule_ids.len();
                    let id = match self.sub_rule_ids.get(&sub) {
                        Some(id) => id.clone(),
                        None => {
                            // `sub_rule_ids[sub]` is inserted before its size is read.
                            let id = conv.add_rule(&format!("{}-{}", self.name, n + 1), &sub);
                            self.sub_rule_ids.insert(sub.clone(), id.clone());
                            id
                        }
                    };
                    sub = id;
                }
                let item = if sub_is_literal {
                    format!("\"{sub}\"")
                } else {
                    sub
                };
                let last = seq.len() - 1;
                seq[last] = (build_repetition(&item, min_times, max_times, ""), false);
            } else {
                let mut literal = String::new();
                let mut lit_bytes: Vec<u8> = Vec::new();
                while self.i < length {
                    let b = self.sub[self.i];
                    if b == b'\\' {
                        if self.i == length - 1 {
                            return Err(PatternError::Invalid("trailing backslash".into()));
                        }
                        let next = self.sub[self.i + 1];
                        if b"^$.[]()|{}*+?".contains(&next) {
                            self.i += 1;
                            lit_bytes.push(self.sub[self.i]);
                            self.i += 1;
                        } else {
                            let n = gbnf_escape_length(self.sub, self.i);
                            if n == 0 {
                                return Err(PatternError::Unsupported(format!(
                                    "unsupported escape: {}",
                                    text(&self.sub[self.i..self.i + 2])
                                )));
                            }
                            lit_bytes.extend_from_slice(&self.sub[self.i..self.i + n]);
                            self.i += n;
                        }
                    } else if b == b'"' {
                        lit_bytes.extend_from_slice(b"\\\"");
                        self.i += 1;
                    } else {
                        // A character, whole: its UTF-8 bytes (llama.cpp's loop takes bytes, so a
                        // quantifier after é repeats its last byte alone).
                        let n = match b {
                            0xF0..=0xFF => 4,
                            0xE0..=0xEF => 3,
                            0xC0..=0xDF => 2,
                            _ => 1,
                        }
                        .min(length - self.i);
                        let next = self.sub.get(self.i + n).copied();
                        if !is_non_literal(b)
                            && (next.is_none()
                                || lit_bytes.is_empty()
                                || next == Some(b'.')
                                || next.is_some_and(|c| !is_non_literal(c)))
                        {
                            lit_bytes.extend_from_slice(&self.sub[self.i..self.i + n]);
                            self.i += n;
                        } else {
                            break;
                        }
                    }
                }
                literal.push_str(&text(&lit_bytes));
                if literal.is_empty() {
                    return Err(PatternError::Unsupported(format!(
                        "unsupported character: {}",
                        c as char
                    )));
                }
                seq.push((literal, true));
            }
        }
        Ok(join_seq(&seq))
    }
}

/// `string_split(s, delim)`: the pieces between delimiters, empty ones kept.
fn string_split(s: &str, delim: &str) -> Vec<String> {
    s.split(delim).map(str::to_string).collect()
}

/// `common_trie` over code points, children in code-point order.
struct Trie {
    nodes: Vec<TrieNode>,
}

#[derive(Default)]
struct TrieNode {
    children: BTreeMap<u32, usize>,
    terminal: bool,
}

impl Trie {
    fn new(words: &[String]) -> Self {
        let mut t = Trie {
            nodes: vec![TrieNode::default()],
        };
        for w in words {
            let mut n = 0;
            for c in w.chars() {
                let next = t.nodes.len();
                n = *t.nodes[n].children.entry(c as u32).or_insert(next);
                if n == next {
                    t.nodes.push(TrieNode::default());
                }
            }
            t.nodes[n].terminal = true;
        }
        t
    }
}

/// Whether a schema reads as an object schema (`common_chat_schema_object`: what llama.cpp's
/// `foreach_parameter` asks of a tool's `parameters` before it looks at their properties).
pub fn is_object_schema(schema: &Value) -> Result<bool> {
    let mut b = Builder::new(schema);
    Ok(matches!(b.build_node(schema, "#")?, Node::Object { .. }))
}

/// The GBNF llama.cpp writes for a JSON schema (`json_schema_to_grammar`), its root rule `root`.
pub fn schema_to_gbnf(schema: &Value) -> Result<String> {
    let mut c = Converter::new(false);
    let root = schema_node(schema, &mut c)?;
    c.visit(&root, "");
    check(&c)?;
    Ok(c.format_grammar())
}

/// The schema read into its tree, its `$ref` targets handed to the converter.
fn schema_node(schema: &Value, c: &mut Converter) -> Result<Node> {
    let mut b = Builder::new(schema);
    let root = b.build_node(schema, "#")?;
    c.refs = b.refs;
    Ok(root)
}

fn check(c: &Converter) -> Result<()> {
    if !c.errors.is_empty() {
        return Err(TextError::Grammar(format!(
            "JSON schema conversion failed:\n{}",
            c.errors.join("\n")
        )));
    }
    Ok(())
}

/// Rules of a grammar being assembled around schemas (llama.cpp's `common_grammar_builder`:
/// `build_grammar` with `add_rule` and `add_schema`), written out sorted by name.
pub struct GrammarBuilder {
    c: Converter,
    /// Schema nodes read so far, by every schema added (`MAX_SCHEMA_NODES` in all).
    nodes: usize,
}

impl Default for GrammarBuilder {
    fn default() -> Self {
        GrammarBuilder {
            c: Converter::new(false),
            nodes: 0,
        }
    }
}

impl GrammarBuilder {
    /// A rule of this name and body (a name taken by another body gets a number).
    pub fn add_rule(&mut self, name: &str, body: &str) -> String {
        self.c.add_rule(name, body)
    }

    /// The rules of a schema under `name` (`root`: as the whole grammar's), its rule's name.
    pub fn add_schema(&mut self, name: &str, schema: &Value) -> Result<String> {
        self.add_schema_in(name, schema, schema, "")
    }

    /// As `add_schema`, for a schema inside a document (a property's schema in a tool's
    /// `parameters`): its `$ref`s point into `doc`, and their rules are named after
    /// `ref_prefix` (a document's own, where a grammar holds several).
    pub fn add_schema_in(
        &mut self,
        name: &str,
        doc: &Value,
        schema: &Value,
        ref_prefix: &str,
    ) -> Result<String> {
        let mut b = Builder::new(doc);
        b.nodes = self.nodes;
        if ref_prefix.is_empty() {
            b.refs = std::mem::take(&mut self.c.refs);
        }
        let node = b.build_node(schema, "#");
        self.nodes = b.nodes;
        self.c.refs = b.refs;
        self.c.ref_prefix = ref_prefix.to_string();
        let r = self.c.visit(&node?, if name == "root" { "" } else { name });
        self.c.ref_prefix.clear();
        check(&self.c)?;
        Ok(r)
    }

    /// The grammar text.
    pub fn finish(self) -> Result<String> {
        check(&self.c)?;
        Ok(self.c.format_grammar())
    }

    /// Warnings the conversion gave (an unsupported pattern taken as any string).
    pub fn warnings(&self) -> &[String] {
        &self.c.warnings
    }
}
