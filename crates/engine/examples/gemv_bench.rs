//! One-token products on random Q4_K and Q6_K matrices, in the accurate mode
//! (`cpu::matmul::matmul`) and in parity mode (`cpu::ggml::mul_mat_act`): a matrix small enough
//! to stay in cache (512 rows) and one that streams from memory (the `mid` preset's FFN, 5,632 x
//! 2,048), on rayon's threads (`RAYON_NUM_THREADS=1` for one), called from one of them as the
//! forward pass does. Prints the best of 5 rounds of `reps` products: GB/s of weights read and G
//! weights/s. `cargo run --release -p muser-engine --example gemv_bench [reps]`.
use muser_engine::cpu::ggml::mul_mat::{Activations, mul_mat_act};
use muser_engine::cpu::matmul::matmul;
use muser_gguf::GgmlType;
use std::time::Instant;

fn main() {
    // On one of the pool's threads, as the forward pass runs (`Backend::run_ops`): each product's
    // parallel loop then starts in place, not handed over from outside the pool.
    rayon::ThreadPoolBuilder::new()
        .build()
        .expect("a thread pool")
        .install(run);
}

fn run() {
    let reps: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200);
    let mut s = 0x9e3779b97f4a7c15u64;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    for (rows, cols) in [(512usize, 2048usize), (5632, 2048)] {
        for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
            let rb = ty.type_size() * cols / 256;
            let mut w: Vec<u8> = (0..rows * rb).map(|_| next() as u8).collect();
            // Finite f16 scales: clear the top exponent bit of each d (and dmin).
            for blk in w.chunks_exact_mut(ty.type_size()) {
                if ty == GgmlType::Q6_K {
                    blk[209] &= 0x3B;
                } else {
                    blk[1] &= 0x3B;
                    blk[3] &= 0x3B;
                }
            }
            let x: Vec<f32> = (0..cols)
                .map(|_| (next() % 2000) as f32 / 1000.0 - 1.0)
                .collect();
            let act = Activations::new(ty, &x, cols, 1);
            let mut y = vec![0f32; rows];
            for parity in [false, true] {
                let product = |y: &mut [f32]| {
                    if parity {
                        mul_mat_act(ty, &w, rows, &act, y);
                    } else {
                        matmul(ty, &w, rows, cols, &x, 1, y);
                    }
                };
                product(&mut y);
                let mut best = f64::MAX;
                for _ in 0..5 {
                    let t = Instant::now();
                    for _ in 0..reps {
                        product(&mut y);
                    }
                    best = best.min(t.elapsed().as_secs_f64() / reps as f64);
                }
                println!(
                    "{} {ty:?} {rows}x{cols}: {:.1} us, {:.1} GB/s, {:.2} G weights/s (y[0] {})",
                    if parity { "parity  " } else { "accurate" },
                    best * 1e6,
                    w.len() as f64 / best / 1e9,
                    (rows * cols) as f64 / best / 1e9,
                    y[0]
                );
            }
        }
    }
}
