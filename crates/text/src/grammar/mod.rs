//! Constrained generation: GBNF grammars and JSON schemas, as llama.cpp b11434 reads, converts and
//! matches them, and the grammar of a Muse Glimmer chat answer that must be JSON.
//!
//! - [`gbnf`]: the grammar text, its rules and the pushdown matcher over code points.
//! - [`schema`]: JSON schema to GBNF (`json-schema-to-grammar.cpp`), byte for byte.
//! - [`tokens`]: the grammar over a vocabulary's tokens (which may come next; taking one).

pub mod gbnf;
pub mod schema;
pub mod tokens;

pub use gbnf::{Grammar, GrammarState};
pub use schema::{GrammarBuilder, format_literal, is_object_schema, schema_to_gbnf};
pub use tokens::{Constraint, GrammarVocab, MaskCache, Trigger, mask_allows};

use serde_json::Value;

use crate::error::Result;

/// What the chat template's generation prompt ends with, and a Muse Glimmer answer's grammar
/// begins with: it is matched before anything is generated (llama.cpp's `generation_prompt`,
/// fed to the grammar sampler as prefill tokens, common/sampling.cpp).
pub const GENERATION_PROMPT: &str = "<|start|>assistant";

/// The grammar of a Muse Glimmer chat answer whose final message must satisfy `schema`, as
/// llama.cpp b11434 builds it for a response format (common/parsers/muse-glimmer.cpp,
/// `has_response_format`, not lazy): reasoning messages first, any number, each
/// `<|start|>assistant to=self<|message|>...<|eom|>`, then the answer,
/// `<|start|>assistant[ to=user]<|message|>` and the JSON, bare or fenced as ```` ```json ````
/// (with the schema converter's white space around it). The answer ends where the JSON does: an
/// end-of-generation token (`<|eot|>`) is the only thing that may follow.
pub fn chat_response_gbnf(schema: &Value) -> Result<String> {
    let mut b = GrammarBuilder::default();
    let json = b.add_schema("response-format-schema", schema)?;
    let until = until_rules(&mut b, "until-eom", "<|eom|>", false);
    let start = b.add_rule("start", &format_literal(GENERATION_PROMPT));
    let analysis = b.add_rule(
        "analysis",
        &format!(
            "{} {until} {}",
            format_literal(" to=self<|message|>"),
            format_literal("<|eom|>")
        ),
    );
    let response = b.add_rule(
        "response-format",
        &format!(
            "{}? {} ( {} space {json} space {} | {json} )",
            format_literal(" to=user"),
            format_literal("<|message|>"),
            format_literal("```json"),
            format_literal("```")
        ),
    );
    b.add_rule(
        "root",
        &format!("( {start} {analysis} )* {start} {response}"),
    );
    b.finish()
}

/// A tool a chat answer must call: its name and its `parameters` schema.
pub struct ToolSpec<'a> {
    pub name: &'a str,
    pub parameters: &'a Value,
}

/// The grammar of a Muse Glimmer chat answer that must call one of `tools`, as llama.cpp b11434
/// builds it (common/parsers/muse-glimmer.cpp): reasoning messages first, then a message to a
/// recipient (` to=` and any text up to `<|message|>`) holding `<atem:function_calls>` and one
/// `<atem:invoke>` of a tool, its parameters in any order, each `<atem:parameter name="...">` and
/// a value: text up to and with the first `</atem:parameter>` where the parameter's schema may be
/// a string, else JSON of its schema and the closing tag; with `parallel`, more such messages
/// after `<|eom|>`. Parameters are read only from a `parameters` that is an object schema, as the
/// anchor reads them.
///
/// Not `lazy` (`tool_choice: "required"` or a named function): the whole answer, from the
/// generation prompt on. `lazy` (`tool_choice: "auto"`): the call alone, from its ` to=` on (the
/// anchor's root is its trigger rule, `tool-call`); it constrains the text only once
/// [`tool_call_trigger`] finds a call begun, until then the answer is free.
pub fn chat_tool_calls_gbnf(tools: &[ToolSpec], parallel: bool, lazy: bool) -> Result<String> {
    let mut b = GrammarBuilder::default();
    let lit = format_literal;
    let start = b.add_rule("start", &lit(GENERATION_PROMPT));
    let until_message = until_rules(&mut b, "until-message", "<|message|>", false);
    let string_value = until_rules(&mut b, "ac-parameter", "</atem:parameter>", true);
    let mut budget = crate::atem::schema::VISIT_BUDGET;
    let mut choices = Vec::with_capacity(tools.len());
    for t in tools {
        let mut args = Vec::new();
        // The anchor reads them as a schema first: one that does not read is refused.
        if is_object_schema(t.parameters)?
            && let Some(props) = t.parameters.get("properties").and_then(Value::as_object)
        {
            for (pname, pschema) in props {
                let value =
                    if crate::atem::schema::may_be_string(pschema, t.parameters, &mut budget) {
                        string_value.clone()
                    } else {
                        let r = b.add_schema_in(
                            &format!("tool-{}-arg-{pname}-schema", t.name),
                            t.parameters,
                            pschema,
                            &format!("tool-{}-", t.name),
                        )?;
                        format!("{r} {}", lit("</atem:parameter>"))
                    };
                args.push(format!(
                    "{} {value}",
                    lit(&format!("<atem:parameter name=\"{pname}\">"))
                ));
            }
        }
        let args = if args.is_empty() {
            String::new()
        } else {
            format!("( ( {} ) space )*", args.join(" | "))
        };
        let body = format!(
            "{} {until_message} {} space {} space {args} {} space {}",
            lit(" to="),
            lit("<|message|><atem:function_calls>"),
            lit(&format!("<atem:invoke name=\"{}\">", t.name)),
            lit("</atem:invoke>"),
            lit("</atem:function_calls>"),
        );
        choices.push(b.add_rule(&format!("tool-{}", t.name), &body));
    }
    let choice = b.add_rule("tool-choice", &choices.join(" | "));
    let calls = if parallel {
        format!("{choice} ( {} {start} {choice} )*", lit("<|eom|>"))
    } else {
        choice
    };
    let calls = b.add_rule("tool-call", &calls);
    if lazy {
        b.add_rule("root", &calls);
    } else {
        let until_eom = until_rules(&mut b, "until-eom", "<|eom|>", false);
        let analysis = b.add_rule(
            "analysis",
            &format!(
                "{} {until_eom} {}",
                lit(" to=self<|message|>"),
                lit("<|eom|>")
            ),
        );
        b.add_rule("root", &format!("( {start} {analysis} )* {start} {calls}"));
    }
    b.finish()
}

/// Where a tool call begins in the text generated so far, for the lazy grammar of
/// [`chat_tool_calls_gbnf`]: the start of the first capture of llama.cpp b11434's trigger
/// pattern for the model, searched as `std::regex_search` searches (the leftmost match, its
/// alternatives in order), None before one is there. The pattern (common/parsers/muse-glimmer.cpp,
/// `COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN`):
///
/// `(?:^|<\|start\|>assistant)( to=(?!self<\|message\|>)(?!user<\|message\|>)[^<]*?<\|message\|>)`
///
/// that is, at the text's start or after `<|start|>assistant`: ` to=`, a recipient that is not
/// `self` or `user` holding no `<`, then `<|message|>`. (`[^<]*?` can end only at the first `<`
/// after ` to=`, which must begin `<|message|>`: lazy or greedy, the match is the same.) The
/// grammar is fed the text from the returned offset on (`llama_grammar_accept_impl`).
pub fn tool_call_trigger(text: &[u8]) -> Option<usize> {
    tool_call_trigger_from(text, &mut 0)
}

/// [`tool_call_trigger`] resumed: `from` holds where the search may start (positions before it
/// begin no match in this text or any that extends it) and is moved on; the text only grows
/// between calls. Each call looks at the text from `from` on, so text generated without a
/// call begun is read about once.
pub fn tool_call_trigger_from(text: &[u8], from: &mut usize) -> Option<usize> {
    const START: &[u8] = b"<|start|>assistant";
    const MESSAGE: &[u8] = b"<|message|>";
    #[derive(PartialEq)]
    enum Seen {
        Yes,
        No,
        /// Not yet: the text ends inside what would decide it.
        More,
    }
    let lit = |at: usize, s: &[u8]| -> Seen {
        let t = text.get(at..).unwrap_or_default();
        if t.starts_with(s) {
            Seen::Yes
        } else if s.starts_with(t) {
            Seen::More
        } else {
            Seen::No
        }
    };
    // The capture at g: ` to=`, not `self<|message|>` or `user<|message|>`, no `<` up to
    // `<|message|>`.
    let group = |g: usize| -> Seen {
        match lit(g, b" to=") {
            Seen::Yes => {}
            other => return other,
        }
        let r = g + 4;
        for not in [&b"self<|message|>"[..], b"user<|message|>"] {
            match lit(r, not) {
                Seen::Yes => return Seen::No,
                Seen::More => return Seen::More,
                Seen::No => {}
            }
        }
        match text[r..].iter().position(|&c| c == b'<') {
            None => Seen::More,
            Some(lt) => lit(r + lt, MESSAGE),
        }
    };
    let mut first_more = None;
    let mut p = *from;
    while p < text.len() {
        let mut more = false;
        if p == 0 {
            match group(0) {
                Seen::Yes => return Some(0),
                Seen::More => more = true,
                Seen::No => {}
            }
        }
        match lit(p, START) {
            Seen::Yes => match group(p + START.len()) {
                Seen::Yes => return Some(p + START.len()),
                Seen::More => more = true,
                Seen::No => {}
            },
            Seen::More => more = true,
            Seen::No => {}
        }
        if more && first_more.is_none() {
            first_more = Some(p);
        }
        // The next position that may begin a match: a `<` (or the text's start, done).
        p = match text[p + 1..].iter().position(|&c| c == b'<') {
            Some(i) => p + 1 + i,
            None => text.len(),
        };
    }
    *from = first_more.unwrap_or(text.len());
    None
}

/// Rules `prefix`, `prefix-01`, ... for the text around `delim` (the states of its matching
/// automaton, llama.cpp's `gbnf_ac_grammar` for one string); the name of the first. Without
/// `including`, any text that does not hold `delim` (`gbnf_excluding_grammar`: every state may
/// end, no character completes it); with it, any text up to and with its first `delim`
/// (`gbnf_including_grammar`: only the completing character ends).
fn until_rules(b: &mut GrammarBuilder, prefix: &str, delim: &str, including: bool) -> String {
    let d: Vec<char> = delim.chars().collect();
    let name = |q: usize| {
        if q == 0 {
            prefix.to_string()
        } else {
            format!("{prefix}-{q:02}")
        }
    };
    // The longest prefix of `d` that ends `d[..q]` followed by c.
    let next = |q: usize, c: char| -> usize {
        let mut s: Vec<char> = d[..q].to_vec();
        s.push(c);
        (0..=s.len().min(d.len()))
            .rev()
            .find(|&k| s[s.len() - k..] == d[..k])
            .unwrap_or(0)
    };
    let mut alphabet: Vec<char> = d.clone();
    alphabet.sort_unstable();
    alphabet.dedup();
    let class = |chars: &[char], negate: bool| {
        let mut s = String::from(if negate { "[^" } else { "[" });
        for &c in chars {
            match c {
                '-' | ']' | '[' | '\\' => {
                    s.push('\\');
                    s.push(c);
                }
                '\n' => s.push_str("\\n"),
                '\t' => s.push_str("\\t"),
                '\r' => s.push_str("\\r"),
                c if (' '..='~').contains(&c) => s.push(c),
                c => s.push_str(&format!("\\U{:08X}", c as u32)),
            }
        }
        s.push(']');
        s
    };
    for q in 0..d.len() {
        let mut buckets: std::collections::BTreeMap<usize, Vec<char>> = Default::default();
        let (mut specific, mut completing) = (Vec::new(), Vec::new());
        for &c in &alphabet {
            let to = next(q, c);
            if to == d.len() {
                completing.push(c);
                specific.push(c);
            } else if to != 0 {
                buckets.entry(to).or_default().push(c);
                specific.push(c);
            }
        }
        let mut alts = Vec::new();
        if including && !completing.is_empty() {
            alts.push(class(&completing, false));
        }
        for (to, chars) in &buckets {
            alts.push(format!("{} {}", class(chars, false), name(*to)));
        }
        alts.push(format!("{} {}", class(&specific, true), name(0)));
        let rhs = if including {
            alts.join(" | ")
        } else {
            format!("| {}", alts.join(" | "))
        };
        b.add_rule(&name(q), &rhs);
    }
    name(0)
}
