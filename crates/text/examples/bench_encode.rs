//! Encoding throughput: `cargo run --release -p muser-text --example bench_encode -- VOCAB.gguf TEXT [IDS.json]`.
//!
//! Prints MB/s for the whole text (best of 3). With IDS.json (transformers' ids for the same text,
//! from tests/tools/bench_encode.py) it also checks that the ids are identical.

use std::time::Instant;

use muser_text::Tokenizer;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(gguf), Some(text)) = (args.get(1), args.get(2)) else {
        return Err("usage: bench_encode VOCAB.gguf TEXT [IDS.json]".into());
    };
    let t0 = Instant::now();
    let tok = Tokenizer::from_gguf_file(gguf)?;
    let load = t0.elapsed();
    let text = std::fs::read_to_string(text)?;
    let mb = text.len() as f64 / 1e6;
    let mut best = f64::MAX;
    let mut ids = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        ids = tok.encode(&text, false, false)?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    println!(
        "vocab {} tokens, loaded in {:.3} s; text {mb:.2} MB -> {} tokens; encode best of 3: {best:.3} s = {:.2} MB/s",
        tok.n_vocab(),
        load.as_secs_f64(),
        ids.len(),
        mb / best,
    );
    // The same text in ~64 KB pieces (cut after the first newline past every 64 KiB, as
    // bench_encode.py does), one call each: the size of a long prompt.
    let mut parts = Vec::new();
    let mut start = 0;
    while start < text.len() {
        let from = (start + 65536).min(text.len());
        let end = text.as_bytes()[from..]
            .iter()
            .position(|&b| b == b'\n')
            .map_or(text.len(), |i| from + i + 1);
        parts.push(&text[start..end]);
        start = end;
    }
    let mut best = f64::MAX;
    let mut n = 0;
    for _ in 0..3 {
        let t = Instant::now();
        n = 0;
        for p in &parts {
            n += tok.encode(p, false, false)?.len();
        }
        best = best.min(t.elapsed().as_secs_f64());
    }
    println!(
        "{} pieces of ~64 KB, one encode call each: {n} tokens, best {best:.3} s = {:.2} MB/s",
        parts.len(),
        mb / best
    );
    if let Some(path) = args.get(3) {
        let want: Vec<u32> = serde_json::from_str(&std::fs::read_to_string(path)?)?;
        println!("ids identical to transformers: {}", want == ids);
        if want != ids {
            return Err("ids differ".into());
        }
    }
    Ok(())
}
