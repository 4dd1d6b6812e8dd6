//! How far a product's f32 sums land from the exact result when each addition of 16 exact
//! products to the accumulator truncates (rounds toward zero, as the tensor cores' f32
//! accumulators were measured to do: Fasi et al., PeerJ Computer Science 7:e330, 2021; the
//! H100's modelled in Khattak and Mikaitis, arXiv:2512.07004) against rounding to nearest,
//! over runs of all the columns or of 4,096, 2,048 and 1,024 columns added to the total in
//! f32: for the Q4_K matrices and inputs of gpu.rs's `matvec_kernels_match_the_cpu_per_format`
//! (the 30B's widths, seed 7), its first 16 tokens and up to 2,048 rows. A model of the accumulator, not the GPU itself: it
//! gives the scale of the error (docs/PARITY.md). `cargo run --release -p muser-engine
//! --example accumulation_probe`.
use muser_engine::ModelFile;

/// `v` rounded toward zero to f32.
fn rz(v: f64) -> f64 {
    let f = v as f32;
    if (f as f64).abs() > v.abs() {
        let b = f.to_bits();
        f32::from_bits(b - 1) as f64
    } else {
        f as f64
    }
}

fn main() {
    let dir = std::env::temp_dir().join(format!("muser-accumulation-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (layout, n_ff) in [("q4_k", 2048usize), ("q4_k", 19968)] {
        let p = muser_engine::synth::Preset {
            name: "t",
            n_layer: 1,
            n_embd: 6656,
            n_ff,
            n_head: 4,
            n_head_kv: 2,
            head_dim: 128,
            n_vocab: 512,
            n_ctx: 4096,
            n_swa: 128,
        };
        let path = dir.join(format!("{layout}-{n_ff}.gguf"));
        muser_engine::synth::write(
            &path,
            &p,
            muser_engine::synth::Layout::parse(layout).unwrap(),
            7,
        )
        .unwrap();
        let file = ModelFile::open(&path).unwrap();
        // gpu.rs's input (`product_input`), its first `nt` tokens.
        let nt = 16usize;
        let input = |cols: usize| -> Vec<f32> {
            (0..nt * cols)
                .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 0.7)
                .collect()
        };
        for kc in [usize::MAX, 4096, 2048, 1024] {
            for (what, mat) in [
                ("down", &file.tensors.layers[0].ffn_down),
                ("up", &file.tensors.layers[0].ffn_up),
            ] {
                let nr = mat.rows.min(if mat.cols > 10000 { 1024 } else { 2048 });
                let x = input(mat.cols);
                let bytes = mat.bytes(&file.gguf);
                let rb = bytes.len() / mat.rows;
                let mut w = vec![0f32; mat.cols];
                let (mut maxy, mut e_rz, mut e_rn) = (0f64, 0f64, 0f64);
                for r in 0..nr {
                    muser_engine::formats::dequantize_row(
                        mat.ty,
                        &bytes[r * rb..(r + 1) * rb],
                        &mut w,
                    );
                    for t in 0..nt {
                        let xs = &x[t * mat.cols..(t + 1) * mat.cols];
                        let (mut ex, mut a_rz, mut a_rn) = (0f64, 0f64, 0f64);
                        for (wk, xk) in w.chunks(kc).zip(xs.chunks(kc)) {
                            let mut run = 0f64;
                            for (wc, xc) in wk.chunks(16).zip(xk.chunks(16)) {
                                let s: f64 =
                                    wc.iter().zip(xc).map(|(a, b)| *a as f64 * *b as f64).sum();
                                ex += s;
                                run = rz(run + s);
                                a_rn = ((a_rn + s) as f32) as f64;
                            }
                            a_rz = ((a_rz + run) as f32) as f64;
                        }
                        maxy = maxy.max(ex.abs());
                        e_rz = e_rz.max((a_rz - ex).abs());
                        e_rn = e_rn.max((a_rn - ex).abs());
                    }
                }
                println!(
                    "{layout} n_ff {n_ff} {what} {}x{} ({nr} rows, {nt} tokens) runs {}: truncating adds {:.2e}, round-to-nearest {:.2e} of max|y|",
                    mat.rows,
                    mat.cols,
                    if kc == usize::MAX {
                        "all".to_string()
                    } else {
                        kc.to_string()
                    },
                    e_rz / maxy,
                    e_rn / maxy
                );
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
