//! How long the grammar's token mask takes on a vocabulary of Muse Glimmer's size: glimmer-mini's
//! 4,019 tokens grown to 202,048 with pairs of its ordinary tokens (byte-level words of 2 to 20
//! bytes), a JSON-object answer's grammar, the mask at five states of an answer and the one-token
//! check. Prints milliseconds; run with `--release`.
//!
//!     cargo run --release -p muser-text --example grammar_mask

use std::sync::Arc;
use std::time::Instant;

use muser_text::grammar::{
    Constraint, GENERATION_PROMPT, Grammar, GrammarVocab, chat_response_gbnf,
};
use muser_text::{TokenType, Tokenizer, Vocab};

fn main() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/glimmer-mini.gguf");
    let g = muser_gguf::Gguf::open(&path).expect("glimmer-mini.gguf");
    let mut vocab = Vocab::from_gguf(&g).expect("vocab");
    let normal: Vec<String> = vocab
        .tokens
        .iter()
        .zip(&vocab.types)
        .filter(|(_, t)| **t == TokenType::Normal)
        .map(|(s, _)| s.clone())
        .collect();
    let mut seen: std::collections::HashSet<String> = vocab.tokens.iter().cloned().collect();
    let mut x = 88172645463325252u64;
    while vocab.tokens.len() < 202_048 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let a = &normal[(x % normal.len() as u64) as usize];
        let b = &normal[((x >> 32) % normal.len() as u64) as usize];
        let t = format!("{a}{b}");
        if seen.insert(t.clone()) {
            vocab.tokens.push(t);
            vocab.types.push(TokenType::Normal);
        }
    }
    let tok = Tokenizer::from_vocab(vocab).expect("tokenizer");
    let t = Instant::now();
    let v = GrammarVocab::new(&tok);
    println!(
        "vocabulary of {} tokens read for the grammar: {:.1} ms",
        v.len(),
        t.elapsed().as_secs_f64() * 1e3
    );
    let schema = serde_json::json!({"type": "object"});
    let gr = Arc::new(Grammar::parse(&chat_response_gbnf(&schema).unwrap(), "root").unwrap());
    for prefix in [
        "",
        "<|message|>",
        "<|message|>{",
        "<|message|>{\"na",
        "<|message|>{\"name\": ",
        " to=self<|message|>Let me see",
    ] {
        let mut c = Constraint::new(gr.clone());
        c.prefill(GENERATION_PROMPT.as_bytes()).unwrap();
        for id in tok.encode(prefix, false, true).unwrap() {
            c.accept(&v, id).unwrap();
        }
        let t = Instant::now();
        let m = c.allowed(&v).unwrap();
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let n: u32 = m.iter().map(|w| w.count_ones()).sum();
        let t = Instant::now();
        let k = (0..2000u32)
            .filter(|&id| c.allows(&v, id * 101 % v.len() as u32).unwrap_or(false))
            .count();
        let us = t.elapsed().as_secs_f64() * 1e6 / 2000.0;
        println!(
            "after {prefix:?}: mask {ms:.1} ms ({n} allowed), one-token check {us:.2} us ({k} of 2000 sampled allowed)"
        );
    }
}
