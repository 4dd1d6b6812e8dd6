//! The cost of one guess's lookup over a long sequence with no earlier match (the worst case):
//! `cargo run --release -p muser-engine --example draft_cost`.
use muser_engine::speculative::NgramDraft;

fn main() {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let tokens: Vec<u32> = (0..32_768)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 202_048) as u32
        })
        .collect();
    let d = NgramDraft::new(2, 8).unwrap();
    let t = std::time::Instant::now();
    let reps = 1000;
    let mut found = 0;
    for _ in 0..reps {
        found += d.draft(std::hint::black_box(&tokens)).len();
    }
    println!(
        "{} tokens: {:.1} us a lookup ({found} guessed)",
        tokens.len(),
        t.elapsed().as_secs_f64() * 1e6 / reps as f64
    );
}
