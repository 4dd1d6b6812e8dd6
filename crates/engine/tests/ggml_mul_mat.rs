//! mul_mat and the activation quantizers against ggml-cpu goldens (tools/ggml-golden).

mod ggml_common;

use ggml_common::{Rng, assert_bits_eq, cases};
use muser_engine::cpu::ggml::quantize::{
    BlockQ8K, quantize_row_bf16, quantize_row_f16, quantize_row_q8_0, quantize_row_q8_k,
};
use muser_engine::cpu::ggml::{MatMulPath, mul_mat, mul_mat_path};
use muser_gguf::GgmlType;

fn crafted_q(r: &mut Rng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let (blk, j) = (i / 256, i % 256);
            match blk % 5 {
                0 => {
                    if j == 0 {
                        127.0
                    } else {
                        ((j % 64) as i32 - 32) as f32 + 0.5
                    }
                }
                1 => 0.0,
                2 => {
                    if j == 77 {
                        -3.0
                    } else {
                        r.unif() * 1e-3
                    }
                }
                3 => {
                    if j == 5 {
                        -127.0
                    } else {
                        (if j % 2 == 1 { 0.5f32 } else { -0.5 }) * (j % 7) as f32
                    }
                }
                _ => r.act(),
            }
        })
        .collect()
}

fn edges() -> Vec<f32> {
    let pats: [u32; 27] = [
        0x33000000, 0x33000001, 0x337FFFFF, 0x38800000, 0x387FC000, 0x387FE000, 0x387FF000,
        0x477FE000, 0x477FF000, 0x477FEFFF, 0x47800000, 0x3F801000, 0x3F803000, 0x3F800800,
        0x3F808000, 0x3F818000, 0xBF808000, 0x00000001, 0x80000000, 0x7F7FFFFF, 0xFF7FFFFF,
        0x3FFF8000, 0x3FFE8000, 0x34000000, 0x33800000, 0x33C00000, 0x2F800000,
    ];
    let mut x: Vec<f32> = pats.iter().map(|&p| f32::from_bits(p)).collect();
    while x.len() % 32 != 0 {
        x.push(0.0);
    }
    x
}

#[test]
fn from_float_matches_ggml() {
    for c in cases("from_float") {
        let n = c.usize("n");
        let x = match c.get("gen") {
            "crafted" => crafted_q(&mut Rng::new(c.u64("seed")), n),
            "act" => Rng::new(c.u64("seed")).acts(n),
            "edges" => edges(),
            g => panic!("gen {g}"),
        };
        let got: Vec<u8> = match c.ty("type") {
            GgmlType::Q8_0 => {
                let mut o = vec![0u8; n / 32 * 34];
                quantize_row_q8_0(&x, &mut o);
                o
            }
            GgmlType::Q8_K => {
                let mut b = vec![BlockQ8K::ZERO; n / 256];
                quantize_row_q8_k(&x, &mut b);
                let mut o = Vec::new();
                for blk in &b {
                    blk.to_bytes(&mut o);
                }
                o
            }
            GgmlType::F16 => {
                let mut h = vec![0u16; n];
                quantize_row_f16(&x, &mut h);
                h.iter().flat_map(|v| v.to_le_bytes()).collect()
            }
            GgmlType::BF16 => {
                let mut h = vec![0u16; n];
                quantize_row_bf16(&x, &mut h);
                h.iter().flat_map(|v| v.to_le_bytes()).collect()
            }
            t => panic!("type {t}"),
        };
        let bad = got.iter().zip(&c.out).position(|(a, b)| a != b);
        assert!(
            got.len() == c.out.len() && bad.is_none(),
            "{}: first differing byte {bad:?}",
            c.name
        );
    }
}

#[test]
fn mul_mat_matches_ggml() {
    let mut failures = Vec::new();
    for c in cases("mul_mat") {
        let ty = c.ty("type");
        let (rows, cols, ntok) = (c.usize("rows"), c.usize("cols"), c.usize("ntok"));
        let mut r = Rng::new(c.u64("seed"));
        let w = r.weights(ty, rows, cols);
        let x = r.acts(cols * ntok);
        let mut y = vec![0.0f32; rows * ntok];
        mul_mat(ty, &w, rows, cols, &x, ntok, &mut y);
        let path = mul_mat_path(ty, rows, ntok);
        if let Err(e) = std::panic::catch_unwind(|| assert_bits_eq(&c.name, &y, &c.out_f32())) {
            let msg = e.downcast_ref::<String>().cloned().unwrap_or_default();
            failures.push(format!("{path:?} {msg}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} mul_mat cases differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn routing_table() {
    use GgmlType::*;
    assert_eq!(mul_mat_path(Q4_K, 64, 7), MatMulPath::VecDot);
    assert_eq!(mul_mat_path(Q4_K, 64, 8), MatMulPath::Tiled);
    assert_eq!(mul_mat_path(Q8_0, 64, 2), MatMulPath::Sgemm);
    assert_eq!(mul_mat_path(F16, 18, 5), MatMulPath::VecDot);
    assert_eq!(mul_mat_path(F16, 20, 5), MatMulPath::Sgemm);
    assert_eq!(mul_mat_path(BF16, 20, 1), MatMulPath::VecDot);
}

/// K-quant dots straight from the row's bytes (AVX2 integer products), one token's (`vec_dot`)
/// and the tiled kernel's (8 tokens or more), against the same dots over decoded blocks: the same
/// bits, on blocks of random bytes (every byte pattern is a block) and on the extremes (every code at its largest against activations of -128 and 127,
/// where `maddubs` would saturate if a pair could leave i16).
#[test]
fn packed_k_dots_give_the_decoded_bits() {
    use muser_engine::cpu::ggml::tiled::tiled_dot_k;
    use muser_engine::cpu::ggml::vec_dot::{
        OutLayout, TiledSums, decode_k_row, has_avx512_vnni, tiled_rows_k_packed,
        tiled_rows_k_packed_with, vec_dot_k, vec_dot_k_packed,
    };
    if !muser_engine::cpu::ggml::lanes::has_avx2_fma() {
        println!("SKIPPED: this CPU has no AVX2 and FMA (the packed path is not taken)");
        return;
    }
    let mut r = Rng::new(7);
    let mut checked = 0;
    for ty in [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K] {
        let bs = ty.type_size();
        for case in 0..200 {
            let nb = 1 + case % 9;
            let mut w: Vec<u8> = (0..nb * bs).map(|_| r.next() as u8).collect();
            let mut x = r.acts(nb * 256);
            if case % 10 == 0 {
                // Largest codes and scales, activations at the q8 extremes.
                for b in w.iter_mut() {
                    *b = 0xFF;
                }
                for (i, v) in x.iter_mut().enumerate() {
                    *v = if i % 3 == 0 { -1.0 } else { 1.0 };
                }
            }
            // Finite f16 block scales (0xFFFF would be a NaN: the same NaN either way).
            for blk in w.chunks_exact_mut(bs) {
                let k4 = ty != GgmlType::Q6_K;
                let off = if k4 { 0 } else { 208 };
                blk[off + 1] &= 0x3B;
                if k4 {
                    blk[3] &= 0x3B;
                }
            }
            let mut y = vec![BlockQ8K::ZERO; nb];
            quantize_row_q8_k(&x, &mut y);
            let mut blocks = Vec::new();
            decode_k_row(ty, &w, &mut blocks);
            let want = vec_dot_k(ty, &blocks, &y);
            let got = vec_dot_k_packed(ty, &w, &y).expect("the packed path on AVX2");
            assert_eq!(
                got.to_bits(),
                want.to_bits(),
                "{ty} case {case}: {got} against {want}"
            );
            // The tiled kernel's arithmetic (8 tokens or more), from the bytes and decoded, for
            // two rows (this one and its blocks in reverse order) against `nt` tokens at once
            // (more than one group of 8 in most cases, and more than one of the kernel's tiles
            // of 32 tokens in some): this token's activations and others' (x rotated by t values).
            let nt = [1, 3, 9, 17, 40, 64, 71, 130][case % 8];
            let mut ys = Vec::with_capacity(nb * nt);
            for t in 0..nt {
                let mut xt = x.clone();
                xt.rotate_left(t % x.len());
                let mut yt = vec![BlockQ8K::ZERO; nb];
                quantize_row_q8_k(&xt, &mut yt);
                ys.extend(yt);
            }
            let reversed: Vec<u8> = w.chunks_exact(bs).rev().flatten().copied().collect();
            let rows = [w.clone(), reversed].concat();
            // Both forms of the kernel where the CPU has AVX-512 VNNI (the default then), the
            // AVX2 form alone otherwise; 2 rows here and 9 below (8 at a time, then 1).
            let mut forms = vec![TiledSums::new_avx2(ty, &ys, nt).expect("AVX2")];
            if has_avx512_vnni() {
                let v = TiledSums::new(ty, &ys, nt).expect("AVX2");
                assert!(v.vnni(), "the VNNI form where the CPU has it");
                forms.push(v);
            } else if case == 0 {
                println!("this CPU has no AVX-512 VNNI: the tiled kernel's VNNI form is not run");
            }
            let nine: Vec<u8> = (0..9)
                .flat_map(|i| if i % 2 == 0 { rows.clone() } else { w.clone() })
                .take(9 * w.len())
                .collect();
            for sums in &forms {
                for rows in [&rows, &nine] {
                    let nr = rows.len() / w.len();
                    let mut got = vec![0.0f32; nr * nt];
                    assert!(
                        tiled_rows_k_packed_with(
                            sums,
                            rows,
                            w.len(),
                            &ys,
                            &mut got,
                            OutLayout::RowToken
                        ),
                        "the packed path on AVX2"
                    );
                    for (i, row) in rows.chunks_exact(w.len()).enumerate() {
                        let mut blocks = Vec::new();
                        decode_k_row(ty, row, &mut blocks);
                        for t in 0..nt {
                            let want = tiled_dot_k(ty, &blocks, &ys[t * nb..(t + 1) * nb]);
                            let g = got[i * nt + t];
                            assert_eq!(
                                g.to_bits(),
                                want.to_bits(),
                                "tiled {ty} (vnni: {}) case {case} row {i} of {nr}, token {t} of {nt}: {g} against {want}",
                                sums.vnni()
                            );
                        }
                    }
                    checked += nr * nt;
                }
            }
            // The entry point that arranges the sums itself.
            let mut got = vec![0.0f32; 2 * nt];
            assert!(tiled_rows_k_packed(ty, &rows, w.len(), &ys, &mut got));
            let mut want = vec![0.0f32; 2 * nt];
            assert!(tiled_rows_k_packed_with(
                &forms[0],
                &rows,
                w.len(),
                &ys,
                &mut want,
                OutLayout::RowToken
            ));
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits())
            );
            checked += 1;
        }
    }
    println!("{checked} packed K-quant dots (one-token and tiled): the decoded path's bits");
}
