//! A deterministic, dependency-free fuzz run for CI: thousands of mutated GGUF images (flipped
//! bytes, boundary-valued length fields, insertions, deletions, truncations) must each parse
//! or fail cleanly, and accepted files must lend exactly their tensors' bytes. The corpus that
//! `cargo fuzz run gguf_reader` (fuzz/) builds is replayed too.

use muser_gguf::{Array, GgmlType, Gguf, GgufWriter, Value};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn seed_file() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.add("general.architecture", Value::String("muse-glimmer".into()))
        .unwrap();
    w.add("muse-glimmer.block_count", Value::U32(1)).unwrap();
    w.add_array(
        "tokenizer.ggml.tokens",
        Array::String((0..20).map(|i| format!("tok{i}")).collect()),
    )
    .unwrap();
    w.add_array(
        "muse-glimmer.attention.sliding_window_pattern",
        Array::Bool(vec![true]),
    )
    .unwrap();
    w.add_array("x.f64", Array::F64(vec![1.5, -2.0])).unwrap();
    w.add("x.i16", Value::I16(-3)).unwrap();
    w.add_f32_tensor("token_embd.weight", &[8, 4], &[0.5; 32])
        .unwrap();
    w.add_tensor(
        "blk.0.attn_q.weight",
        &[32, 2],
        GgmlType::Q8_0,
        vec![1u8; 68],
    )
    .unwrap();
    w.add_tensor(
        "blk.0.ffn_up.weight",
        &[256, 1],
        GgmlType::Q4_K,
        vec![2u8; 144],
    )
    .unwrap();
    w.to_bytes().unwrap()
}

fn check(bytes: Vec<u8>) {
    if let Ok(g) = Gguf::from_bytes(bytes) {
        for t in g.tensors() {
            assert_eq!(g.tensor_data(t).len() as u64, t.n_bytes);
        }
        for (_, v) in g.metadata() {
            let _ = v.summary(3);
        }
    }
}

#[test]
fn twenty_thousand_mutations_never_panic() {
    let seed = seed_file();
    let mut rng = Rng(0x5EED);
    let boundary: [u64; 8] = [0, 1, 7, 255, 1 << 31, u32::MAX as u64, 1 << 62, u64::MAX];
    for _ in 0..20_000 {
        let mut b = seed.clone();
        for _ in 0..1 + rng.below(4) {
            match rng.below(6) {
                0 => {
                    let i = rng.below(b.len());
                    b[i] ^= 1 << rng.below(8);
                }
                1 => {
                    let i = rng.below(b.len().saturating_sub(8));
                    let v = boundary[rng.below(boundary.len())];
                    b[i..i + 8].copy_from_slice(&v.to_le_bytes());
                }
                2 => {
                    let i = rng.below(b.len().saturating_sub(4));
                    let v = boundary[rng.below(boundary.len())] as u32;
                    b[i..i + 4].copy_from_slice(&v.to_le_bytes());
                }
                3 => {
                    let n = rng.below(b.len());
                    b.truncate(n);
                }
                4 => {
                    let i = rng.below(b.len());
                    b.insert(i, rng.next() as u8);
                }
                _ => {
                    if !b.is_empty() {
                        let i = rng.below(b.len());
                        b.remove(i);
                    }
                }
            }
            if b.len() < 8 {
                break;
            }
        }
        check(b);
    }
}

#[test]
fn the_fuzz_corpus_replays_cleanly() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/gguf_reader");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        println!(
            "no corpus at {}; run `cargo +nightly fuzz run gguf_reader` in fuzz/ to build one",
            dir.display()
        );
        return;
    };
    let mut n = 0;
    for e in entries.flatten() {
        if let Ok(b) = std::fs::read(e.path()) {
            check(b);
            n += 1;
        }
    }
    println!("replayed {n} corpus inputs");
}

/// Counts are capped as well as checked against the bytes present: a file of many tiny keys,
/// tensors or array strings would otherwise parse into many times its own size in memory.
#[test]
fn counts_past_the_caps_are_refused() {
    use muser_gguf::{MAX_ARRAY_STRINGS, MAX_ENTRIES};
    let header = |n_tensors: u64, n_kv: u64| {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(n_tensors.to_le_bytes());
        b.extend(n_kv.to_le_bytes());
        b
    };
    // Room for the entries' smallest encodings, so only the cap can refuse them.
    let room = |mut b: Vec<u8>, n: u64| {
        b.resize(b.len() + 40 * n as usize, 0);
        b
    };
    let e = Gguf::from_bytes(room(header(0, MAX_ENTRIES + 1), MAX_ENTRIES + 1)).unwrap_err();
    assert!(e.to_string().contains("metadata entries; at most"), "{e}");
    let e = Gguf::from_bytes(room(header(MAX_ENTRIES + 1, 0), MAX_ENTRIES + 1)).unwrap_err();
    assert!(e.to_string().contains("tensors; at most"), "{e}");
    // One string array past the cap, its empty strings all present.
    let mut b = header(0, 1);
    let key = b"big";
    b.extend((key.len() as u64).to_le_bytes());
    b.extend(key);
    b.extend(9u32.to_le_bytes()); // array
    b.extend(8u32.to_le_bytes()); // of strings
    let n = MAX_ARRAY_STRINGS as u64 + 1;
    b.extend(n.to_le_bytes());
    b.resize(b.len() + 8 * n as usize, 0);
    let e = Gguf::from_bytes(b).unwrap_err();
    assert!(e.to_string().contains("array 'big' holds"), "{e}");
}
