//! The parity mode's attention for `tokens` tokens (default 1: decode; more: the last `tokens`
//! positions of a prompt, as a micro-batch's attention) over an f16 cache of `keys` keys
//! (`cpu::ggml::attention`), the mid preset's heads (16 query heads, 2 KV heads, head_dim 128), a
//! full-attention layer: best time of 5 rounds of `reps` calls, on rayon's threads
//! (`RAYON_NUM_THREADS`), called from one of them as the forward pass does.
//! `cargo run --release -p muser-engine --example attn_bench [keys] [reps] [tokens]`.
use muser_engine::cpu::ggml::{AttnParams, KvKey, attention, kv_row_bytes, store_kv_row};
use muser_gguf::GgmlType;
use std::time::Instant;

fn main() {
    rayon::ThreadPoolBuilder::new()
        .build()
        .expect("a thread pool")
        .install(run);
}

fn run() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let nk = args.first().copied().unwrap_or(4096);
    let reps = args.get(1).copied().unwrap_or(50);
    let nt = args.get(2).copied().unwrap_or(1).clamp(1, nk);
    let (nh, nkv, hd) = (16usize, 2usize, 128usize);
    let mut s = 0x9e3779b97f4a7c15u64;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s % 2000) as f32 / 1000.0 - 1.0
    };
    let rb = kv_row_bytes(GgmlType::F16, nkv * hd);
    let rows: Vec<(Vec<u8>, Vec<u8>)> = (0..nk)
        .map(|_| {
            let (k, v): (Vec<f32>, Vec<f32>) = (0..nkv * hd).map(|_| (next(), next())).unzip();
            let (mut kb, mut vb) = (vec![0u8; rb], vec![0u8; rb]);
            store_kv_row(GgmlType::F16, &k, &mut kb);
            store_kv_row(GgmlType::F16, &v, &mut vb);
            (kb, vb)
        })
        .collect();
    let keys: Vec<KvKey> = rows
        .iter()
        .enumerate()
        .map(|(i, (k, v))| KvKey {
            slot: i,
            pos: i as i32,
            k,
            v,
        })
        .collect();
    let p = AttnParams {
        n_head: nh,
        n_head_kv: nkv,
        head_dim: hd,
        k_type: GgmlType::F16,
        v_type: GgmlType::F16,
        n_kv: nk.next_multiple_of(256),
        n_swa: None,
        scale: 1.0 / (hd as f32).sqrt(),
    };
    let q: Vec<f32> = (0..nt * nh * hd).map(|_| next()).collect();
    let mut out = vec![0f32; nt * nh * hd];
    // The last `nt` keys' positions: each token sees the keys up to its own.
    let q_pos: Vec<i32> = (nk - nt..nk).map(|p| p as i32).collect();
    attention(&p, &q, &q_pos, &keys, &mut out);
    // (key, token) pairs visible: token at position p sees keys 0..=p.
    let visible: usize = q_pos.iter().map(|&p| p as usize + 1).sum();
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..reps {
            attention(&p, &q, &q_pos, &keys, &mut out);
        }
        best = best.min(t.elapsed().as_secs_f64() / reps as f64);
    }
    let sum: f64 = out.iter().map(|&v| v as f64).sum();
    println!(
        "{nk} keys, {nt} tokens, {nh} heads: {:.1} us a call, {:.2} ns a visible (key, head, token) (sum of out {sum:e})",
        best * 1e6,
        best * 1e9 / (visible * nh) as f64
    );
}
