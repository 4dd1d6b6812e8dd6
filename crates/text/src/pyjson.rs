//! Python's `json.dumps` and `repr(float)` for template values, so `tojson` and `{{ x }}` print
//! exactly what transformers' jinja2 prints.
//!
//! transformers replaces jinja's `tojson` with `json.dumps(x, ensure_ascii=False, indent=None,
//! separators=None, sort_keys=False)` (utils/chat_template_utils.py `_cached_compile_jinja_template`);
//! minijinja's own `tojson` escapes `<>&'` and cannot sort keys, hence this module.

use std::fmt::Write;

use minijinja::value::{Value, ValueKind};
use minijinja::{Error, ErrorKind};

/// `json.dumps` options that templates pass to `tojson`.
pub struct DumpOptions {
    pub ensure_ascii: bool,
    /// `None`: one line; `Some(s)`: newline and `s` per level (an int indent is that many spaces).
    pub indent: Option<String>,
    pub item_sep: String,
    pub key_sep: String,
    pub sort_keys: bool,
}

impl Default for DumpOptions {
    fn default() -> Self {
        Self {
            ensure_ascii: false,
            indent: None,
            item_sep: ", ".into(),
            key_sep: ": ".into(),
            sort_keys: false,
        }
    }
}

pub fn dumps(v: &Value, opts: &DumpOptions) -> Result<String, Error> {
    let mut out = String::new();
    write_value(&mut out, v, opts, 0)?;
    Ok(out)
}

fn write_value(out: &mut String, v: &Value, opts: &DumpOptions, level: usize) -> Result<(), Error> {
    match v.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(out, v)?,
        ValueKind::String => write_str(out, v.as_str().unwrap_or_default(), opts.ensure_ascii),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            write_container(out, opts, level, '[', ']', &items, |out, item, level| {
                write_value(out, item, opts, level)
            })?;
        }
        ValueKind::Map => {
            let mut pairs: Vec<(String, Value)> = Vec::new();
            for key in v.try_iter()? {
                let item = v.get_item(&key)?;
                pairs.push((key_string(&key)?, item));
            }
            if opts.sort_keys {
                pairs.sort_by(|a, b| a.0.cmp(&b.0));
            }
            write_container(
                out,
                opts,
                level,
                '{',
                '}',
                &pairs,
                |out, (k, item), level| {
                    write_str(out, k, opts.ensure_ascii);
                    out.push_str(&opts.key_sep);
                    write_value(out, item, opts, level)
                },
            )?;
        }
        kind => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: a value of type {kind} is not JSON serializable"),
            ));
        }
    }
    Ok(())
}

fn write_container<T>(
    out: &mut String,
    opts: &DumpOptions,
    level: usize,
    open: char,
    close: char,
    items: &[T],
    mut each: impl FnMut(&mut String, &T, usize) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if items.is_empty() {
        out.push(close);
        return Ok(());
    }
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(&opts.item_sep);
        }
        if let Some(ind) = &opts.indent {
            out.push('\n');
            out.push_str(&ind.repeat(level + 1));
        }
        each(out, item, level + 1)?;
    }
    if let Some(ind) = &opts.indent {
        out.push('\n');
        out.push_str(&ind.repeat(level));
    }
    out.push(close);
    Ok(())
}

/// Python converts non-string keys: ints and floats by repr, True/False/None as JSON words.
fn key_string(k: &Value) -> Result<String, Error> {
    Ok(match k.kind() {
        ValueKind::String => k.as_str().unwrap_or_default().to_string(),
        ValueKind::None => "null".into(),
        ValueKind::Bool => (if k.is_true() { "true" } else { "false" }).into(),
        ValueKind::Number => {
            let mut s = String::new();
            write_number(&mut s, k)?;
            s
        }
        kind => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: keys must be str, int, float, bool or None, not {kind}"),
            ));
        }
    })
}

fn write_number(out: &mut String, v: &Value) -> Result<(), Error> {
    if v.is_integer() {
        let i = i128::try_from(v.clone())?;
        let _ = write!(out, "{i}");
    } else {
        let f = f64::try_from(v.clone())?;
        // json.dumps writes the non-finite floats as JavaScript words.
        if f.is_nan() {
            out.push_str("NaN");
        } else if f.is_infinite() {
            out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
        } else {
            out.push_str(&float_repr(f));
        }
    }
    Ok(())
}

/// Python's `repr(float)`: the shortest digits that round-trip, positional for decimal
/// exponents -4..16, scientific (`1e-05`, `1.5e+16`) outside.
pub fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf".into() } else { "-inf".into() };
    }
    // Rust's `{:e}` gives the same shortest round-trip digits: "d.ddde<exp>".
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let sign = if f.is_sign_negative() { "-" } else { "" };
    if !(-4..16).contains(&exp) {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let esign = if exp < 0 { '-' } else { '+' };
        return format!("{sign}{first}{frac}e{esign}{:02}", exp.abs());
    }
    let body = if exp < 0 {
        format!("0.{}{}", "0".repeat((-exp - 1) as usize), digits)
    } else {
        let int_len = exp as usize + 1;
        if digits.len() <= int_len {
            format!("{}{}.0", digits, "0".repeat(int_len - digits.len()))
        } else {
            format!("{}.{}", &digits[..int_len], &digits[int_len..])
        }
    };
    format!("{sign}{body}")
}

/// A JSON string as Python's encoder writes it (`c_encode_basestring[_ascii]`).
fn write_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && (c as u32) > 0x7e => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use minijinja::value::Serde;

    #[test]
    fn floats_print_like_python_repr() {
        for (f, want) in [
            (0.25, "0.25"),
            (3.0, "3.0"),
            (-0.0, "-0.0"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (123456.789, "123456.789"),
            (1.5e300, "1.5e+300"),
            (0.1 + 0.2, "0.30000000000000004"),
            (2.5e-7, "2.5e-07"),
            (1e22, "1e+22"),
            (-12.5, "-12.5"),
        ] {
            assert_eq!(float_repr(f), want, "{f}");
        }
    }

    #[test]
    fn dumps_like_python() {
        let v = Value::from(Serde(
            serde_json::json!({"b": [1, 2.5, null, true, "x\"<&>'\n\u{1}é😀"], "a": {}, "c": []}),
        ));
        assert_eq!(
            dumps(&v, &DumpOptions::default()).unwrap(),
            r#"{"b": [1, 2.5, null, true, "x\"<&>'\n\u0001é😀"], "a": {}, "c": []}"#
        );
        let opts = DumpOptions {
            ensure_ascii: true,
            sort_keys: true,
            ..DumpOptions::default()
        };
        assert_eq!(
            dumps(&v, &opts).unwrap(),
            r#"{"a": {}, "b": [1, 2.5, null, true, "x\"<&>'\n\u0001\u00e9\ud83d\ude00"], "c": []}"#
        );
        let opts = DumpOptions {
            indent: Some("  ".into()),
            item_sep: ",".into(),
            ..DumpOptions::default()
        };
        assert_eq!(
            dumps(
                &Value::from(Serde(serde_json::json!({"a": [1], "b": {}}))),
                &opts
            )
            .unwrap(),
            "{\n  \"a\": [\n    1\n  ],\n  \"b\": {}\n}"
        );
    }
}
