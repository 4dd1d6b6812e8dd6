//! Timings of the parity kernels (not a correctness test; `--ignored`, release build):
//! `cargo test --release -p muser-engine --test ggml_bench -- --ignored --nocapture`

mod ggml_common;

use std::time::Instant;

use ggml_common::Rng;
use muser_engine::cpu::ggml::{
    Activations, AttnParams, KvKey, kv_row_bytes, mul_mat_act, store_kv_row,
};
use muser_gguf::GgmlType;

fn time<F: FnMut()>(mut f: F) -> f64 {
    f();
    let reps = 3;
    let t = Instant::now();
    for _ in 0..reps {
        f();
    }
    t.elapsed().as_secs_f64() / reps as f64
}

#[test]
#[ignore]
fn bench_mul_mat() {
    let (rows, cols) = (2048usize, 2048usize);
    for ty in muser_engine::formats::SUPPORTED {
        let mut r = Rng::new(1);
        let w = r.weights(ty, rows, cols);
        for n in [1usize, 7, 64] {
            let x = r.acts(cols * n);
            let mut y = vec![0.0f32; rows * n];
            let act = Activations::new(ty, &x, cols, n);
            let s = time(|| mul_mat_act(ty, &w, rows, &act, &mut y));
            let ns = s * 1e9 / (rows * cols * n) as f64;
            println!(
                "{ty:>5} {rows}x{cols} n={n:<3} {:8.2} ms  {ns:.3} ns/MAC",
                s * 1e3
            );
        }
    }
}

#[test]
#[ignore]
fn bench_attention() {
    let (hd, nh, nkv) = (128usize, 32usize, 2usize);
    for kv_type in [GgmlType::F32, GgmlType::F16] {
        for (n_ctx, ntok) in [(4096usize, 1usize), (4096, 64)] {
            let mut r = Rng::new(2);
            let rb = kv_row_bytes(kv_type, nkv * hd);
            let rows: Vec<(Vec<u8>, Vec<u8>)> = (0..n_ctx)
                .map(|_| {
                    let (mut k, mut v) = (vec![0u8; rb], vec![0u8; rb]);
                    store_kv_row(kv_type, &r.acts(nkv * hd), &mut k);
                    store_kv_row(kv_type, &r.acts(nkv * hd), &mut v);
                    (k, v)
                })
                .collect();
            let keys: Vec<KvKey> = rows
                .iter()
                .enumerate()
                .map(|(s, (k, v))| KvKey {
                    slot: s,
                    pos: s as i32,
                    k,
                    v,
                })
                .collect();
            let q = r.acts(ntok * nh * hd);
            let q_pos: Vec<i32> = (0..ntok).map(|i| (n_ctx - ntok + i) as i32).collect();
            let p = AttnParams {
                n_head: nh,
                n_head_kv: nkv,
                head_dim: hd,
                k_type: kv_type,
                v_type: kv_type,
                n_kv: n_ctx,
                n_swa: None,
                scale: 0.088,
            };
            let mut out = vec![0.0f32; ntok * nh * hd];
            let s = time(|| muser_engine::cpu::ggml::attention(&p, &q, &q_pos, &keys, &mut out));
            println!(
                "attention {kv_type:>4} n_kv={n_ctx} ntok={ntok}: {:8.2} ms",
                s * 1e3
            );
        }
    }
}

#[test]
#[ignore]
fn bench_dot_kernels() {
    use muser_engine::cpu::ggml::lanes::with_avx2_fma;
    use muser_engine::cpu::ggml::vec_dot::vec_dot_f32;
    let mut r = Rng::new(3);
    let a = r.acts(128 * 4096);
    let q = r.acts(128);
    let mut s = 0.0f32;
    let t = Instant::now();
    with_avx2_fma(
        #[inline(always)]
        || {
            for k in a.chunks(128) {
                s += vec_dot_f32(k, &q);
            }
        },
    );
    println!(
        "vec_dot_f32 x4096 (128): {:.3} ms ({s})",
        t.elapsed().as_secs_f64() * 1e3
    );
}
