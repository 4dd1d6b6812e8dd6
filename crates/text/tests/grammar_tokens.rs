//! The grammar over real vocabularies' tokens: a Muse Glimmer JSON answer, token by token. The
//! mask and the one-token check agree on every token at every step; the tokens of a valid answer
//! are each allowed and an end of generation only where the JSON is whole; a random walk over
//! the allowed tokens never reaches a state with nothing allowed, and where it ends the answer
//! parses as the schema says; a character cut between two byte tokens is allowed only where a
//! string may hold it.

use std::sync::Arc;

use muser_text::grammar::{
    Constraint, GENERATION_PROMPT, Grammar, GrammarVocab, chat_response_gbnf, mask_allows,
};
use muser_text::{Tokenizer, ToolCallParser};
use serde_json::{Value, json};

fn data(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn grammar(schema: &Value) -> Arc<Grammar> {
    let text = chat_response_gbnf(schema).unwrap();
    Arc::new(Grammar::parse(&text, "root").unwrap_or_else(|e| panic!("{e}\n{text}")))
}

fn constraint(g: &Arc<Grammar>) -> Constraint {
    let mut c = Constraint::new(g.clone());
    c.prefill(GENERATION_PROMPT.as_bytes()).unwrap();
    c
}

/// Every token: the mask's bit and the one-token check agree.
fn check_agree(c: &mut Constraint, v: &GrammarVocab, at: &str) -> Vec<u32> {
    let mask = c.allowed(v).unwrap();
    let mut allowed = Vec::new();
    for id in 0..v.len() as u32 {
        let m = mask_allows(&mask, id);
        assert_eq!(
            m,
            c.allows(v, id).unwrap(),
            "token {id} at {at:?}: mask {m}"
        );
        if m {
            allowed.push(id);
        }
    }
    allowed
}

const SCHEMA: &str = r#"{"type": "object", "properties": {"ok": {"type": "boolean"},
    "n": {"type": "integer", "minimum": 0, "maximum": 99}, "tags": {"type": "array",
    "items": {"type": "string"}, "maxItems": 2}}, "required": ["ok", "n"],
    "additionalProperties": false}"#;

#[test]
fn a_valid_answer_is_allowed_token_by_token() {
    for vocab in ["glimmer-mini.gguf", "fixture.gguf"] {
        let tok = Tokenizer::from_gguf_file(data(vocab)).unwrap();
        let v = GrammarVocab::new(&tok);
        let g = grammar(&serde_json::from_str(SCHEMA).unwrap());
        for answer in [
            " to=self<|message|>Let me think <|eo about it.<|eom|><|start|>assistant to=user<|message|>{\"ok\": true, \"n\": 42, \"tags\": [\"a\", \"é\"]}",
            "<|message|>```json\n{\"ok\": false, \"n\": 7}\n```",
            "<|message|>{\n  \"ok\": true,\n  \"n\": 0\n}",
        ] {
            let ids = tok.encode(answer, false, true).unwrap();
            let mut c = constraint(&g);
            let mut bytes = Vec::new();
            for &id in &ids {
                let text = String::from_utf8_lossy(&bytes).into_owned();
                let allowed = check_agree(&mut c, &v, &text);
                assert!(
                    allowed.contains(&id),
                    "{vocab}: token {id} refused after {text:?}"
                );
                assert!(
                    !c.is_complete(),
                    "{vocab}: complete before the answer ends, after {text:?}"
                );
                c.accept(&v, id).unwrap();
                bytes.extend_from_slice(tok.piece(id, false).unwrap());
            }
            let text = String::from_utf8(bytes).unwrap();
            assert_eq!(text, answer);
            assert!(c.is_complete(), "{vocab}: {answer:?} is not complete");
            // Only an end of generation may follow.
            let allowed = check_agree(&mut c, &v, &text);
            let mut eog = tok.eog_ids();
            eog.sort_unstable();
            assert_eq!(allowed, eog, "{vocab}: after {text:?}");
        }
    }
}

#[test]
fn what_breaks_the_format_is_refused() {
    let tok = Tokenizer::from_gguf_file(data("glimmer-mini.gguf")).unwrap();
    let v = GrammarVocab::new(&tok);
    let g = grammar(&serde_json::from_str(SCHEMA).unwrap());
    // Some token of `next` is refused after `prefix` (by the check and by the mask alike).
    let refused = |prefix: &str, next: &str| {
        let mut c = constraint(&g);
        for id in tok.encode(prefix, false, true).unwrap() {
            c.accept(&v, id).unwrap();
        }
        for id in tok.encode(next, false, true).unwrap() {
            let ok = c.allows(&v, id).unwrap();
            assert_eq!(ok, mask_allows(&c.allowed(&v).unwrap(), id));
            if !ok {
                return;
            }
            c.accept(&v, id).unwrap();
        }
        panic!("{next:?} allowed after {prefix:?}");
    };
    refused("", "Hello");
    refused("<|message|>", "Sure");
    refused("<|message|>{", "\"name");
    refused("<|message|>{\"ok\": true, ", "\"tags");
    refused("<|message|>{\"ok\": tr", "ee");
    refused(" to=self<|message|>hmm<|eom|>", "<|message|>");
    refused("<|message|>{\"ok\": true, \"n\": 99", "9");
    // An end of generation before the JSON is whole.
    let mut c = constraint(&g);
    for id in tok.encode("<|message|>{\"ok\": true", false, true).unwrap() {
        c.accept(&v, id).unwrap();
    }
    for id in tok.eog_ids() {
        assert!(!c.allows(&v, id).unwrap());
        assert!(c.accept(&v, id).is_err());
    }
}

/// A character of two bytes, each its own token (the byte-level vocabulary's): inside a string
/// the first is allowed, and then the second; outside a string neither.
#[test]
fn a_character_cut_between_tokens_continues() {
    let tok = Tokenizer::from_gguf_file(data("fixture.gguf")).unwrap();
    let v = GrammarVocab::new(&tok);
    let g = grammar(&json!({"type": "object"}));
    // The byte tokens of 'é' (0xC3 0xA9): the tokens whose pieces are those single bytes.
    let byte_token = |b: u8| {
        (0..tok.n_vocab() as u32)
            .find(|&id| tok.piece(id, false).unwrap() == [b])
            .unwrap()
    };
    let (lead, cont) = (byte_token(0xC3), byte_token(0xA9));
    let mut c = constraint(&g);
    for id in tok.encode("<|message|>{", false, true).unwrap() {
        c.accept(&v, id).unwrap();
    }
    assert!(!c.allows(&v, lead).unwrap(), "a character outside a string");
    for id in tok.encode("\"", false, true).unwrap() {
        c.accept(&v, id).unwrap();
    }
    assert!(c.allows(&v, lead).unwrap());
    c.accept(&v, lead).unwrap();
    // Only continuation bytes that end a character [^"\\\x7F\x00-\x1F] allows may come now.
    let allowed = check_agree(&mut c, &v, "{\"\\xC3");
    assert!(allowed.contains(&cont));
    assert!(
        allowed
            .iter()
            .all(|&id| { tok.piece(id, false).unwrap()[0] & 0xC0 == 0x80 })
    );
    c.accept(&v, cont).unwrap();
    for id in tok.encode("\": 1}", false, true).unwrap() {
        assert!(c.allows(&v, id).unwrap());
        c.accept(&v, id).unwrap();
    }
    assert!(c.is_complete());
}

/// Random walks over the allowed tokens (an end of generation taken when allowed, one in four
/// times): no state the walk reaches has nothing allowed, and an answer that ends is JSON of the
/// schema once the ATEM parser has read it.
#[test]
fn random_walks_end_in_answers_of_the_schema() {
    let tok = Tokenizer::from_gguf_file(data("glimmer-mini.gguf")).unwrap();
    let v = GrammarVocab::new(&tok);
    let schema: Value = serde_json::from_str(SCHEMA).unwrap();
    let g = grammar(&schema);
    let mut rng = 0x2545F4914F6CDD1Du64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut ended = 0;
    for walk in 0..40 {
        let mut c = constraint(&g);
        let mut ids = Vec::new();
        for _ in 0..400 {
            let mask = c.allowed(&v).unwrap();
            let allowed: Vec<u32> = (0..v.len() as u32)
                .filter(|&id| mask_allows(&mask, id))
                .collect();
            assert!(
                !allowed.is_empty(),
                "walk {walk}: nothing allowed after {ids:?}"
            );
            let eog: Vec<u32> = allowed.iter().copied().filter(|&i| v.is_eog(i)).collect();
            // Prefer the structural tokens over long strings: a short token one time in two.
            let id = if !eog.is_empty() && next() % 4 != 0 {
                eog[0]
            } else {
                let short: Vec<u32> = allowed
                    .iter()
                    .copied()
                    .filter(|&i| !v.is_eog(i) && tok.piece(i, false).unwrap().len() <= 2)
                    .collect();
                let pool = if !short.is_empty() && next() % 2 == 0 {
                    &short
                } else {
                    &allowed
                };
                pool[(next() % pool.len() as u64) as usize]
            };
            if v.is_eog(id) {
                break;
            }
            c.accept(&v, id).unwrap();
            ids.push(id);
        }
        if !c.is_complete() {
            continue;
        }
        ended += 1;
        let text = tok.decode(&ids, false).unwrap();
        let msg = ToolCallParser::new(&[]).parse(&text);
        let content = msg.content.trim();
        let content = content
            .strip_prefix("```json")
            .and_then(|s| s.strip_suffix("```"))
            .unwrap_or(content)
            .trim();
        let answer: Value = serde_json::from_str(content)
            .unwrap_or_else(|e| panic!("walk {walk}: {e}: {content:?} from {text:?}"));
        let o = answer.as_object().unwrap();
        assert!(o["ok"].is_boolean(), "{answer}");
        let n = o["n"].as_i64().unwrap();
        assert!((0..=99).contains(&n), "{answer}");
        assert!(o.keys().all(|k| ["ok", "n", "tags"].contains(&k.as_str())));
        if let Some(t) = o.get("tags") {
            let t = t.as_array().unwrap();
            assert!(t.len() <= 2 && t.iter().all(Value::is_string), "{answer}");
        }
    }
    assert!(ended >= 5, "only {ended} of 40 walks ended");
}

/// The forced tool call's grammar (`tool_choice`): the ATEM call the template writes is allowed
/// token by token and parses to the call; a tool not offered, a parameter it does not have, or
/// a value outside its schema is refused.
#[test]
fn forced_tool_calls_follow_the_atem_format() {
    use muser_text::grammar::{ToolSpec, chat_tool_calls_gbnf};
    let tok = Tokenizer::from_gguf_file(data("glimmer-mini.gguf")).unwrap();
    let v = GrammarVocab::new(&tok);
    let params = json!({"type": "object", "properties": {"city": {"type": "string"},
        "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city"]});
    let tools = [ToolSpec {
        name: "get_weather",
        parameters: &params,
    }];
    let text = chat_tool_calls_gbnf(&tools, true, false).unwrap();
    let g = Arc::new(Grammar::parse(&text, "root").unwrap_or_else(|e| panic!("{e}\n{text}")));
    let call = " to=get_weather<|message|><atem:function_calls>\n<atem:invoke name=\"get_weather\">\n<atem:parameter name=\"city\">Paris, \"FR\"</atem:parameter>\n<atem:parameter name=\"days\">3</atem:parameter>\n</atem:invoke>\n</atem:function_calls>";
    let mut c = constraint(&g);
    for id in tok.encode(call, false, true).unwrap() {
        assert!(c.allows(&v, id).unwrap());
        assert!(mask_allows(&c.allowed(&v).unwrap(), id));
        c.accept(&v, id).unwrap();
    }
    assert!(c.is_complete());
    // Another call may follow (parallel), or the end.
    let eom = tok.token_id("<|eom|>").unwrap();
    assert!(c.allows(&v, eom).unwrap() && c.allows(&v, tok.eot().unwrap()).unwrap());
    let tool_json =
        json!([{"type": "function", "function": {"name": "get_weather", "parameters": params}}]);
    let parsed = ToolCallParser::from_json(Some(&tool_json))
        .unwrap()
        .parse(call);
    assert_eq!(parsed.tool_calls.len(), 1);
    let args: Value = serde_json::from_str(&parsed.tool_calls[0].function.arguments).unwrap();
    assert_eq!(args, json!({"city": "Paris, \"FR\"", "days": 3}));
    // Refused: another tool, another parameter, a value past its maximum, plain text.
    for bad in [
        " to=x<|message|><atem:function_calls>\n<atem:invoke name=\"get_time\">",
        " to=x<|message|><atem:function_calls><atem:invoke name=\"get_weather\"><atem:parameter name=\"town\">",
        " to=x<|message|><atem:function_calls><atem:invoke name=\"get_weather\"><atem:parameter name=\"days\">9",
        "<|message|>Sure, let me check.",
    ] {
        let mut c = constraint(&g);
        let ok = tok
            .encode(bad, false, true)
            .unwrap()
            .into_iter()
            .all(|id| c.allows(&v, id).unwrap() && c.accept(&v, id).is_ok());
        assert!(!ok, "{bad:?} allowed");
    }
    // Without parallel calls, the end is the only way on.
    let text = chat_tool_calls_gbnf(&tools, false, false).unwrap();
    let g = Arc::new(Grammar::parse(&text, "root").unwrap());
    let mut c = constraint(&g);
    for id in tok.encode(call, false, true).unwrap() {
        c.accept(&v, id).unwrap();
    }
    assert!(!c.allows(&v, eom).unwrap() && c.allows(&v, tok.eot().unwrap()).unwrap());
}

/// Grammars whose token check takes exponential time in the token's length (a rejected token is
/// tried along every reading, 2^22 here, as llama.cpp's candidate filter does): the check and the
/// mask say the grammar is too ambiguous to follow, quickly, and agree.
#[test]
fn exponential_token_checks_end_at_the_budget() {
    use muser_text::{TokenType, Vocab};
    let g = muser_gguf::Gguf::open(data("glimmer-mini.gguf")).unwrap();
    let mut vocab = Vocab::from_gguf(&g).unwrap();
    vocab.tokens.push("x".repeat(40));
    vocab.types.push(TokenType::Normal);
    let tok = Tokenizer::from_vocab(vocab).unwrap();
    let long = tok.n_vocab() as u32 - 1;
    let v = GrammarVocab::new(&tok);
    let g = Arc::new(Grammar::parse("root ::= ([ -~] | [ -~]){0,22}", "root").unwrap());
    let t = std::time::Instant::now();
    let mut c = Constraint::new(g);
    let check = c.allows(&v, long);
    assert!(check.is_err(), "{check:?}");
    assert!(c.allowed(&v).is_err());
    // A token the grammar takes is still checked in no time.
    let x = tok.token_id("x").unwrap();
    assert!(c.allows(&v, x).unwrap());
    assert!(t.elapsed().as_secs() < 20, "took {:?}", t.elapsed());
}

/// Two tools whose parameters' `$ref`s have the same name: each call takes its own tool's
/// definition (llama.cpp names both rules after the reference, so the second takes the first's).
#[test]
fn each_tools_references_are_its_own() {
    use muser_text::grammar::{ToolSpec, chat_tool_calls_gbnf};
    let tok = Tokenizer::from_gguf_file(data("glimmer-mini.gguf")).unwrap();
    let v = GrammarVocab::new(&tok);
    let a = json!({"type": "object", "properties": {"x": {"$ref": "#/$defs/X"}}, "$defs": {"X": {"type": "integer"}}});
    let b = json!({"type": "object", "properties": {"x": {"$ref": "#/$defs/X"}}, "$defs": {"X": {"type": "boolean"}}});
    let tools = [
        ToolSpec {
            name: "a",
            parameters: &a,
        },
        ToolSpec {
            name: "b",
            parameters: &b,
        },
    ];
    let text = chat_tool_calls_gbnf(&tools, false, false).unwrap();
    let g = Arc::new(Grammar::parse(&text, "root").unwrap());
    let call = |name: &str, value: &str| {
        let t = format!(
            " to={name}<|message|><atem:function_calls><atem:invoke name=\"{name}\"><atem:parameter name=\"x\">{value}</atem:parameter></atem:invoke></atem:function_calls>"
        );
        let mut c = constraint(&g);
        for id in tok.encode(&t, false, true).unwrap() {
            if !c.allows(&v, id).unwrap() {
                return false;
            }
            c.accept(&v, id).unwrap();
        }
        c.is_complete()
    };
    assert!(call("a", "12") && !call("a", "true"));
    assert!(call("b", "true") && !call("b", "12"));
    // A tool whose parameters do not read as a schema fails the grammar, as in llama.cpp.
    let bad = json!({"type": "object", "properties": {"y": {"type": "strin"}}});
    let e = chat_tool_calls_gbnf(
        &[ToolSpec {
            name: "c",
            parameters: &bad,
        }],
        true,
        false,
    )
    .unwrap_err();
    assert!(e.to_string().contains("unrecognized type strin"), "{e}");
}

/// Constraints of one grammar sharing their masks: what one computed, another in the same state
/// takes, the same as its own would be; states that differ keep masks of their own.
#[test]
fn shared_masks_are_the_masks() {
    use muser_text::grammar::MaskCache;
    let tok = Tokenizer::from_gguf_file(data("glimmer-mini.gguf")).unwrap();
    let v = GrammarVocab::new(&tok);
    let g = grammar(&serde_json::from_str(SCHEMA).unwrap());
    let cache = Arc::new(MaskCache::default());
    let walk = |text: &str, shared: bool| -> Vec<Arc<[u64]>> {
        let mut c = if shared {
            Constraint::sharing(g.clone(), cache.clone())
        } else {
            Constraint::new(g.clone())
        };
        c.prefill(GENERATION_PROMPT.as_bytes()).unwrap();
        let mut masks = vec![c.allowed(&v).unwrap()];
        for id in tok.encode(text, false, true).unwrap() {
            c.accept(&v, id).unwrap();
            masks.push(c.allowed(&v).unwrap());
        }
        masks
    };
    let a = "<|message|>{\"ok\": true, \"n\": 4}";
    let b = "<|message|>{\"ok\": false, \"n\": 7, \"tags\": []}";
    let first = walk(a, true);
    assert_eq!(walk(a, true), first);
    assert_eq!(walk(a, false), first);
    assert_eq!(walk(b, true), walk(b, false));
}

/// A lazy tool-call grammar (`tool_choice: "auto"`): every token is free, an end of generation
/// too, until a call to a tool begins (` to=` a recipient other than self or user, then
/// `<|message|>`, at the start or after `<|start|>assistant`); from the trigger's ` to=` on the
/// call is constrained and must be whole before the end. A trigger inside a token's piece feeds
/// the grammar from there, and the rest of a piece that reaches past it too; a piece past the
/// trigger that the call cannot hold is refused.
#[test]
fn lazy_tool_calls_are_free_until_a_call_begins() {
    use muser_text::grammar::{MaskCache, ToolSpec, chat_tool_calls_gbnf, tool_call_trigger_from};
    use muser_text::{TokenType, Vocab};
    let g = muser_gguf::Gguf::open(data("glimmer-mini.gguf")).unwrap();
    let mut vocab = Vocab::from_gguf(&g).unwrap();
    // Pieces a trigger may cut: one the call begins in, one that reaches past the trigger.
    for t in [
        "Hmm.<|start|>assistant to=get",
        "_weather<|message|><atem:function_calls>\n",
        "_weather<|message|>oops",
    ] {
        vocab.tokens.push(t.into());
        vocab.types.push(TokenType::Normal);
    }
    let tok = Tokenizer::from_vocab(vocab).unwrap();
    let n = tok.n_vocab() as u32;
    let (cut, past, bad) = (n - 3, n - 2, n - 1);
    let v = GrammarVocab::new(&tok);
    let params = json!({"type": "object", "properties": {"city": {"type": "string"}}});
    let tools = [ToolSpec {
        name: "get_weather",
        parameters: &params,
    }];
    let text = chat_tool_calls_gbnf(&tools, false, true).unwrap();
    let g = Arc::new(Grammar::parse(&text, "root").unwrap_or_else(|e| panic!("{e}\n{text}")));
    let lazy = || {
        Constraint::lazy(
            g.clone(),
            Arc::new(MaskCache::default()),
            tool_call_trigger_from,
        )
    };
    let eot = tok.eot().unwrap();
    let free = |c: &mut Constraint| {
        assert!(!c.constrains());
        let mask = c.allowed(&v).unwrap();
        assert!((0..n).all(|id| mask_allows(&mask, id) && c.allows(&v, id).unwrap()));
    };
    let feed = |c: &mut Constraint, s: &str| {
        for id in tok.encode(s, false, true).unwrap() {
            assert!(c.allows(&v, id).unwrap(), "{id} in {s:?}");
            c.accept(&v, id).unwrap();
        }
    };
    let call_rest = "\n<atem:invoke name=\"get_weather\">\n<atem:parameter name=\"city\">Paris</atem:parameter>\n</atem:invoke>\n</atem:function_calls>";
    // Reasoning, a message to the user, a recipient named like them: all free.
    let mut c = lazy();
    for s in [
        " to=self<|message|>The user wants the weather.<|eom|>",
        "<|start|>assistant to=user<|message|>Let me look",
        " to=users (not a call: no start before it)",
    ] {
        free(&mut c);
        feed(&mut c, s);
    }
    free(&mut c);
    // The call begins: constrained from here.
    feed(
        &mut c,
        "<|eom|><|start|>assistant to=functions.get_weather<|message|>",
    );
    assert!(c.constrains());
    let plain = tok.encode("Sure", false, true).unwrap()[0];
    assert!(!c.allows(&v, plain).unwrap() && !c.allows(&v, eot).unwrap());
    feed(&mut c, "<atem:function_calls>");
    feed(&mut c, call_rest);
    assert!(c.is_complete() && c.allows(&v, eot).unwrap());
    let eom = tok.token_id("<|eom|>").unwrap();
    assert!(
        !c.allows(&v, eom).unwrap(),
        "one call only without parallel"
    );
    // At the start of the answer, in one token; and an end of generation before any call.
    let mut c = lazy();
    feed(&mut c, " to=get_weather<|message|>");
    assert!(c.constrains());
    let mut c = lazy();
    feed(&mut c, "<|message|>It is sunny.");
    assert!(!c.constrains() && c.allows(&v, eot).unwrap());
    c.accept(&v, eot).unwrap();
    // A trigger inside a piece, the next piece reaching past it.
    let mut c = lazy();
    c.accept(&v, cut).unwrap();
    assert!(!c.constrains(), "no <|message|> yet");
    c.accept(&v, past).unwrap();
    assert!(c.constrains());
    feed(&mut c, call_rest);
    assert!(c.is_complete());
    // Past the trigger, text the call cannot hold.
    let mut c = lazy();
    c.accept(&v, cut).unwrap();
    let e = c.accept(&v, bad).unwrap_err();
    assert!(e.to_string().contains("triggered"), "{e}");
}

/// A token as long as a vocabulary may hold (here 200,000 code points, each one a step of the
/// match) is checked without running the thread out of stack: the match keeps its own stack,
/// where llama.cpp's `llama_grammar_reject_candidates_for_stack` recurses once a code point. The
/// grammar takes it whole, and refuses it where one code point of it breaks the match.
#[test]
fn a_token_of_any_length_is_checked_without_recursion() {
    use muser_text::{TokenType, Vocab};
    let g = muser_gguf::Gguf::open(data("glimmer-mini.gguf")).unwrap();
    let mut vocab = Vocab::from_gguf(&g).unwrap();
    let n = 200_000;
    vocab.tokens.push("a".repeat(n));
    vocab.types.push(TokenType::Normal);
    vocab
        .tokens
        .push(format!("{}b{}", "a".repeat(n / 2), "a".repeat(n / 2)));
    vocab.types.push(TokenType::Normal);
    let tok = Tokenizer::from_vocab(vocab).unwrap();
    let (long, broken) = (tok.n_vocab() as u32 - 2, tok.n_vocab() as u32 - 1);
    let v = GrammarVocab::new(&tok);
    let g = Arc::new(Grammar::parse("root ::= [a]*", "root").unwrap());
    // In a thread of 2 MiB (a test thread's default, whatever RUST_MIN_STACK says), where a
    // recursion of a frame per code point would end the process.
    let run = move || {
        let mut c = Constraint::new(g);
        assert!(c.allows(&v, long).unwrap());
        assert!(!c.allows(&v, broken).unwrap());
        let mask = c.allowed(&v).unwrap();
        assert!(mask_allows(&mask, long));
        assert!(!mask_allows(&mask, broken));
        c.accept(&v, long).unwrap();
        assert!(c.allows(&v, long).unwrap());
    };
    std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(run)
        .unwrap()
        .join()
        .unwrap();
}
