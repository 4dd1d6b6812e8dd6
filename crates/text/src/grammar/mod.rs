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
pub use schema::{GrammarBuilder, format_literal, schema_to_gbnf};
pub use tokens::{Constraint, GrammarVocab, mask_allows};

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
    let until = until_rules(&mut b, "until-eom", "<|eom|>");
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

/// The grammar of any text that does not hold `delim` (llama.cpp's `gbnf_excluding_grammar` for
/// one string: the states of its matching automaton, each accepting, no character that would
/// complete it): rules `prefix`, `prefix-01`, ...; the name of the first.
fn until_rules(b: &mut GrammarBuilder, prefix: &str, delim: &str) -> String {
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
        let mut specific = Vec::new();
        for &c in &alphabet {
            let to = next(q, c);
            if to == d.len() {
                specific.push(c);
            } else if to != 0 {
                buckets.entry(to).or_default().push(c);
                specific.push(c);
            }
        }
        let mut rhs = String::from("|");
        for (to, chars) in &buckets {
            rhs.push_str(&format!(" {} {} |", class(chars, false), name(*to)));
        }
        rhs.push_str(&format!(" {} {}", class(&specific, true), name(0)));
        b.add_rule(&name(q), &rhs);
    }
    name(0)
}
