//! rms_norm, rope, softmax, the elementwise ops, get_rows and the KV store against ggml-cpu goldens
//! (tools/ggml-golden).

mod ggml_common;

use ggml_common::{Rng, assert_bits_eq, cases};
use muser_engine::cpu::ggml::{
    add, get_row, hadamard_rotate, kv_row_bytes, mul, rms_norm, rms_norm_mul, rope_norm, scale,
    sigmoid, silu_row, soft_max_ext, softcap, store_kv_row, swiglu_row, tanh,
};

#[test]
fn rms_norm_matches_ggml() {
    for c in cases("rms_norm") {
        let (n, rows) = (c.usize("n"), c.usize("rows"));
        let eps = c.f32_bits("eps_bits");
        let mut r = Rng::new(c.u64("seed"));
        let x = r.acts(n * rows);
        let w = r.acts(n);
        let mut y = vec![0.0f32; n * rows];
        for (xr, yr) in x.chunks(n).zip(y.chunks_mut(n)) {
            if c.get("mul") == "1" {
                rms_norm_mul(xr, &w, eps, yr);
            } else {
                rms_norm(xr, eps, yr);
            }
        }
        assert_bits_eq(&c.name, &y, &c.out_f32());
    }
}

#[test]
fn rope_matches_ggml() {
    for c in cases("rope") {
        let (nh, ntok) = (c.usize("n_head"), c.usize("ntok"));
        let base = c.f32_bits("base_bits");
        let (pos0, step) = (c.i64("pos0") as i32, c.i64("step") as i32);
        let mut x = Rng::new(c.u64("seed")).acts(128 * nh * ntok);
        for (t, tok) in x.chunks_mut(128 * nh).enumerate() {
            rope_norm(tok, 128, pos0 + t as i32 * step, base);
        }
        assert_bits_eq(&c.name, &x, &c.out_f32());
    }
}

#[test]
fn softmax_matches_ggml() {
    for c in cases("softmax") {
        let (n_kv, ntok, nh) = (c.usize("n_kv"), c.usize("ntok"), c.usize("n_head"));
        let sc = c.f32_bits("scale_bits");
        let x: Vec<f32> = Rng::new(c.u64("seed"))
            .acts(n_kv * ntok * nh)
            .iter()
            .map(|v| v * 4.0)
            .collect();
        let mut y = vec![0.0f32; x.len()];
        for (row, (xr, yr)) in x.chunks(n_kv).zip(y.chunks_mut(n_kv)).enumerate() {
            let t = row % ntok;
            let mask: Vec<f32> = (0..n_kv)
                .map(|j| {
                    if (j * 7 + t * 3) % 5 != 0 || j == t {
                        0.0
                    } else {
                        f32::NEG_INFINITY
                    }
                })
                .collect();
            soft_max_ext(xr, Some(&mask), sc, yr);
        }
        assert_bits_eq(&c.name, &y, &c.out_f32());
    }
}

#[test]
fn elementwise_matches_ggml() {
    for c in cases("elementwise") {
        let n = c.usize("n");
        let (amp, s) = (c.f32_bits("amp_bits"), c.f32_bits("s_bits"));
        let mut r = Rng::new(c.u64("seed"));
        let mut x: Vec<f32> = r.acts(n);
        let y = r.acts(n);
        for v in x.iter_mut() {
            *v *= amp;
        }
        let out = match c.get("op") {
            "swiglu" => {
                let mut o = vec![0.0f32; n];
                swiglu_row(&x, &y, &mut o);
                o
            }
            "silu" => {
                silu_row(&mut x);
                x
            }
            "sigmoid" => {
                sigmoid(&mut x);
                x
            }
            "tanh" => {
                tanh(&mut x);
                x
            }
            "add" => {
                add(&mut x, &y);
                x
            }
            "mul" => {
                mul(&mut x, &y);
                x
            }
            "scale" => {
                scale(&mut x, s);
                x
            }
            "softcap" => {
                scale(&mut x, s);
                softcap(&mut x, 20.0);
                x
            }
            op => panic!("op {op}"),
        };
        assert_bits_eq(&c.name, &out, &c.out_f32());
    }
}

#[test]
fn get_rows_matches_ggml() {
    for c in cases("get_rows") {
        let ty = c.ty("type");
        let (cols, rows) = (c.usize("cols"), c.usize("rows"));
        let mut r = Rng::new(c.u64("seed"));
        let w = r.weights(ty, rows, cols);
        let rb = ty.row_bytes(cols as u64).unwrap() as usize;
        let ids: Vec<usize> = (0..7).map(|_| (r.next() % rows as u64) as usize).collect();
        let mut y = vec![0.0f32; cols * ids.len()];
        for (o, &id) in y.chunks_mut(cols).zip(&ids) {
            get_row(ty, &w[id * rb..(id + 1) * rb], o);
        }
        assert_bits_eq(&c.name, &y, &c.out_f32());
    }
}

#[test]
fn kv_store_matches_ggml() {
    for c in cases("set_rows") {
        let ty = c.ty("type");
        let x = Rng::new(c.u64("seed")).acts(256 * 5);
        let rb = kv_row_bytes(ty, 256);
        let mut cache = vec![0u8; rb * 8];
        for (t, &slot) in [3usize, 0, 7, 1, 4].iter().enumerate() {
            store_kv_row(
                ty,
                &x[256 * t..256 * (t + 1)],
                &mut cache[slot * rb..(slot + 1) * rb],
            );
        }
        assert!(cache == c.out, "{}: cache bytes differ", c.name);
    }
}

#[test]
fn fwht_matches_ggml() {
    for c in cases("fwht") {
        let (n, rows) = (c.usize("n"), c.usize("rows"));
        let mut x = Rng::new(c.u64("seed")).acts(n * rows);
        hadamard_rotate(&mut x, n);
        assert_bits_eq(&c.name, &x, &c.out_f32());
    }
}
