//! The parity mode's tiled K-quant kernel in isolation: one thread, `rows` random Q4_K or Q6_K
//! rows of `cols` values against `n` tokens, in chunks of 16 rows as `mul_mat_act` hands them
//! out. Prints GMAC/s. `cargo run --release -p muser-engine --example tiled_bench [cols] [n]`.
use muser_engine::cpu::ggml::quantize::{BlockQ8K, quantize_row_q8_k};
use muser_engine::cpu::ggml::vec_dot::{OutLayout, TiledSums, tiled_rows_k_packed_with};
use muser_gguf::GgmlType;
use std::time::Instant;

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let cols = args.first().copied().unwrap_or(5632);
    let n = args.get(1).copied().unwrap_or(128);
    let rows = 512;
    let mut s = 0x9e3779b97f4a7c15u64;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
        let rb = ty.type_size() * cols / 256;
        let mut w: Vec<u8> = (0..rows * rb).map(|_| next() as u8).collect();
        let k4 = ty != GgmlType::Q6_K;
        for blk in w.chunks_exact_mut(ty.type_size()) {
            let off = if k4 { 0 } else { 208 };
            blk[off + 1] &= 0x3B;
            if k4 {
                blk[3] &= 0x3B;
            }
        }
        let x: Vec<f32> = (0..n * cols)
            .map(|_| (next() % 2000) as f32 / 1000.0 - 1.0)
            .collect();
        let nb = cols / 256;
        let mut y = vec![BlockQ8K::ZERO; nb * n];
        for (o, r) in y.chunks_exact_mut(nb).zip(x.chunks_exact(cols)) {
            quantize_row_q8_k(r, o);
        }
        let mut out = vec![0.0f32; 16 * n];
        let mut best = f64::MAX;
        for _ in 0..20 {
            let t = Instant::now();
            let sums = TiledSums::new(ty, &y, n).expect("AVX2");
            for c in w.chunks_exact(16 * rb) {
                assert!(tiled_rows_k_packed_with(
                    &sums,
                    c,
                    rb,
                    &y,
                    &mut out,
                    OutLayout::RowToken
                ));
            }
            best = best.min(t.elapsed().as_secs_f64());
        }
        let macs = (rows * cols * n) as f64;
        println!(
            "{ty} cols {cols} tokens {n}: {:.1} GMAC/s (best of 20)",
            macs / best / 1e9
        );
    }
}
