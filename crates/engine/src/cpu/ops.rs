//! Accurate-mode row operations: norms, RoPE, the gate, SwiGLU, the logit tail.
//!
//! Reductions (sums of squares, softmax sums) and transcendental functions run in f64 and
//! round once to f32: these are the "accurate" references the parity-mode kernels of
//! `cpu::ggml` are compared against.

/// y = x * (1 / sqrt(mean(x^2) + eps)) * w, for one row.
pub fn rms_norm_row(x: &[f32], w: Option<&[f32]>, eps: f32, y: &mut [f32]) {
    let ss: f64 = x.iter().map(|&v| v as f64 * v as f64).sum();
    let scale = 1.0 / (ss / x.len() as f64 + eps as f64).sqrt();
    match w {
        Some(w) => {
            for ((o, &v), &g) in y.iter_mut().zip(x).zip(w) {
                *o = (v as f64 * scale * g as f64) as f32;
            }
        }
        None => {
            for (o, &v) in y.iter_mut().zip(x) {
                *o = (v as f64 * scale) as f32;
            }
        }
    }
}

/// Per-head RMSNorm times a constant, in place.
pub fn head_norm_row(x: &mut [f32], head_dim: usize, eps: f32, scale: f32) {
    for h in x.chunks_exact_mut(head_dim) {
        let ss: f64 = h.iter().map(|&v| v as f64 * v as f64).sum();
        let s = scale as f64 / (ss / head_dim as f64 + eps as f64).sqrt();
        for v in h.iter_mut() {
            *v = (*v as f64 * s) as f32;
        }
    }
}

/// The RoPE table of one position: (cos, sin) of `pos * base^(-2j/head_dim)` for each pair j.
pub fn rope_table(pos: u32, head_dim: usize, base: f32) -> Vec<(f64, f64)> {
    (0..head_dim / 2)
        .map(|j| {
            let theta = pos as f64 * (base as f64).powf(-2.0 * j as f64 / head_dim as f64);
            (theta.cos(), theta.sin())
        })
        .collect()
}

/// NORM-convention RoPE of every head of one row: pair j is (x[2j], x[2j+1]).
pub fn rope_row(x: &mut [f32], head_dim: usize, table: &[(f64, f64)]) {
    for h in x.chunks_exact_mut(head_dim) {
        for (j, &(c, s)) in table.iter().enumerate() {
            let (x0, x1) = (h[2 * j] as f64, h[2 * j + 1] as f64);
            h[2 * j] = (x0 * c - x1 * s) as f32;
            h[2 * j + 1] = (x0 * s + x1 * c) as f32;
        }
    }
}

pub fn sigmoid(x: f32) -> f32 {
    (1.0 / (1.0 + (-(x as f64)).exp())) as f32
}

/// x *= sigmoid(g).
pub fn sigmoid_gate_row(x: &mut [f32], g: &[f32]) {
    for (v, &gv) in x.iter_mut().zip(g) {
        *v = (*v as f64 / (1.0 + (-(gv as f64)).exp())) as f32;
    }
}

/// out = silu(g) * u = g * sigmoid(g) * u.
pub fn swiglu_row(g: &[f32], u: &[f32], out: &mut [f32]) {
    for ((o, &gv), &uv) in out.iter_mut().zip(g).zip(u) {
        let gv = gv as f64;
        *o = (gv / (1.0 + (-gv).exp()) * uv as f64) as f32;
    }
}

/// x = softcap * tanh(x * scale / softcap), or x * scale.
pub fn logit_finish_row(x: &mut [f32], scale: f32, softcap: Option<f32>) {
    match softcap {
        Some(c) => {
            let (s, c) = (scale as f64, c as f64);
            for v in x.iter_mut() {
                *v = (c * (*v as f64 * s / c).tanh()) as f32;
            }
        }
        None => {
            for v in x.iter_mut() {
                *v = (*v as f64 * scale as f64) as f32;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_worked_example_of_chapter_12() {
        // x = [3, 4, 0, 0], eps = 1e-5: mean(x^2) = 6.25, rms ~ 2.500002, y ~ [1.2, 1.6, 0, 0].
        let mut y = [0f32; 4];
        rms_norm_row(&[3.0, 4.0, 0.0, 0.0], None, 1e-5, &mut y);
        let inv = 1.0 / (6.25f64 + 1e-5).sqrt();
        assert_eq!(y, [(3.0 * inv) as f32, (4.0 * inv) as f32, 0.0, 0.0]);
        assert!((y[0] - 1.2).abs() < 1e-5 && (y[1] - 1.6).abs() < 1e-5);
        // gamma = [2, 0.5, 1, 1] reshapes: y = [2.4, 0.8, 0, 0].
        rms_norm_row(
            &[3.0, 4.0, 0.0, 0.0],
            Some(&[2.0, 0.5, 1.0, 1.0]),
            1e-5,
            &mut y,
        );
        assert!((y[0] - 2.4).abs() < 1e-5 && (y[1] - 0.8).abs() < 1e-5);
    }

    #[test]
    fn the_two_epsilons_differ_where_it_shows() {
        // A tiny vector: mean(x^2) = 1e-8, comparable to the post-norm epsilon.
        let x = [1e-4f32; 4];
        let (mut a, mut b) = ([0f32; 4], [0f32; 4]);
        rms_norm_row(&x, None, 1e-8, &mut a);
        rms_norm_row(&x, None, 1e-5, &mut b);
        assert!((a[0] - (1e-4 / (2e-8f64).sqrt()) as f32).abs() < 1e-6); // 0.7071
        assert!((b[0] - (1e-4 / (1.001e-5f64).sqrt()) as f32).abs() < 1e-6); // 0.0316
    }

    #[test]
    fn per_head_norm_is_per_head() {
        let mut x = [3.0f32, 4.0, 30.0, 40.0];
        head_norm_row(&mut x, 2, 0.0, 3.87);
        let s = 3.87f32 as f64;
        assert_eq!(x[0], (3.0 * (s / (12.5f64).sqrt())) as f32);
        assert_eq!(x[2], (30.0 * (s / (1250f64).sqrt())) as f32);
        assert!(
            (x[0] - x[2]).abs() < 1e-6,
            "each head is normalized on its own"
        );
    }

    #[test]
    fn rope_norm_worked_example_of_chapter_14() {
        // head_dim 4, base 10000, pos 2, x = [1, 0, 1, 0] -> [cos 2, sin 2, cos .02, sin .02].
        let t = rope_table(2, 4, 10000.0);
        let mut x = [1.0f32, 0.0, 1.0, 0.0];
        rope_row(&mut x, 4, &t);
        assert!((x[0] - (-0.4161)).abs() < 1e-4 && (x[1] - 0.9093).abs() < 1e-4);
        assert!((x[2] - 0.9998).abs() < 1e-4 && (x[3] - 0.0200).abs() < 1e-4);
        // Interleaved, not half-split: a NEOX rotation would have paired x[0] with x[2].
        let mut y = [1.0f32, 0.0, 0.0, 0.0];
        rope_row(&mut y, 4, &t);
        assert_eq!(y[2], 0.0);
        assert_eq!(y[3], 0.0);
    }

    #[test]
    fn rope_depends_only_on_the_position_difference() {
        let q = [0.3f32, -0.2, 0.5, 0.1];
        let k = [0.7f32, 0.4, -0.6, 0.2];
        let score = |m: u32, n: u32| {
            let (mut a, mut b) = (q, k);
            rope_row(&mut a, 4, &rope_table(m, 4, 100.0));
            rope_row(&mut b, 4, &rope_table(n, 4, 100.0));
            a.iter().zip(&b).map(|(x, y)| x * y).sum::<f32>()
        };
        assert!((score(5, 2) - score(13, 10)).abs() < 1e-5);
        assert!((score(5, 2) - score(5, 3)).abs() > 1e-3);
    }

    #[test]
    fn gate_and_softcap() {
        let mut x = [2.0f32, 2.0];
        sigmoid_gate_row(&mut x, &[0.0, 100.0]);
        assert_eq!(x, [1.0, 2.0]);
        let mut l = [1000.0f32, -1000.0, 0.0, 10.0];
        logit_finish_row(&mut l, 0.5, Some(20.0));
        assert!((l[0] - 20.0).abs() < 1e-5 && (l[1] + 20.0).abs() < 1e-5 && l[2] == 0.0);
        assert!((l[3] - (20.0 * (0.25f64).tanh()) as f32).abs() < 1e-6);
        let mut m = [10.0f32];
        logit_finish_row(&mut m, 0.5, None);
        assert_eq!(m, [5.0]);
        let mut s = [0f32; 2];
        swiglu_row(&[0.0, 1.0], &[3.0, 2.0], &mut s);
        assert_eq!(s[0], 0.0);
        assert!((s[1] - (2.0 / (1.0 + (-1f64).exp())) as f32).abs() < 1e-7);
    }
}
