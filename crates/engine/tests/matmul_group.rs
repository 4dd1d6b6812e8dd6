//! `Backend::matmul_group`'s reference composition (the attention's Q, gate, K and V from one
//! input): each output has the bits of its own `matmul`, on a real converted fixture, for any
//! group size; a group whose matrices and outputs differ in number is refused.

mod common;

use common::*;
use muser_engine::backend::Backend;
use muser_engine::{CpuBackend, ModelFile, MuseGlimmer, NumericMode};

#[test]
fn matmul_group_gives_each_matmuls_bits() {
    for name in ["tame-q4_k_m", "odd-f32"] {
        let file = ModelFile::open(model_path(name)).unwrap();
        let m =
            MuseGlimmer::load(&file, CpuBackend::new(NumericMode::Accurate, 0).unwrap()).unwrap();
        let b = &m.backend;
        let l = &m.layers[0];
        let cols = m.config.n_embd;
        let n = 5;
        let x: Vec<f32> = (0..n * cols)
            .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * (1.0 + (i / cols) as f32))
            .collect();
        let mut xa = b.act(n, cols).unwrap();
        b.write(&mut xa, &x).unwrap();
        let ws = [&l.attn_q, &l.attn_gate, &l.attn_k, &l.attn_v];
        let rows: Vec<usize> = [
            m.config.n_head * m.config.head_dim,
            m.config.n_head * m.config.head_dim,
            m.config.n_head_kv * m.config.head_dim,
            m.config.n_head_kv * m.config.head_dim,
        ]
        .to_vec();
        let alone: Vec<Vec<f32>> = ws
            .iter()
            .zip(&rows)
            .map(|(w, &r)| {
                let mut o = b.act(n, r).unwrap();
                b.matmul(w, &xa, &mut o).unwrap();
                b.read(&o).unwrap()
            })
            .collect();
        // Groups of 4, 3 (a pair and one left over) and 1.
        for k in [4usize, 3, 1] {
            let mut outs: Vec<_> = rows[..k].iter().map(|&r| b.act(n, r).unwrap()).collect();
            {
                let mut refs: Vec<_> = outs.iter_mut().collect();
                b.matmul_group(&ws[..k], &xa, &mut refs).unwrap();
            }
            for (i, o) in outs.iter().enumerate() {
                let got = b.read(o).unwrap();
                assert!(
                    got.len() == alone[i].len()
                        && got
                            .iter()
                            .zip(&alone[i])
                            .all(|(a, c)| a.to_bits() == c.to_bits()),
                    "{name}: group of {k}, output {i} differs from its matmul"
                );
            }
        }
        let mut o = b.act(n, rows[0]).unwrap();
        let err = b
            .matmul_group(&ws[..2], &xa, &mut [&mut o])
            .expect_err("two matrices, one output");
        assert!(err.to_string().contains("2 matrices, 1 outputs"), "{err}");
    }
}
