//! Accurate-mode attention over the host KV cache.
//!
//! For each query (token i at position p) and KV head g, the visible keys are positions
//! `lo..=p` with `lo = p + 1 - n_swa` on sliding layers (key j visible iff `0 <= p - j < n_swa`,
//! as both anchors) and `lo = 0` on full layers. Keys of this micro-batch are rounded to the
//! cache type before use, exactly as if read back from the cache, so a token's result does not
//! depend on which micro-batch carried it. Scores are canonical f32 dot products; the softmax
//! and the weighted sum of V run in f64 over keys in increasing position. Memory is
//! O(head_dim) per task: nothing quadratic in the prompt length.

use rayon::prelude::*;

use crate::backend::{AttnSpec, Batch};
use crate::cpu::matmul::dot;
use crate::error::{Error, Result};
use crate::kv::HostKv;

/// KV head `g`'s `head_dim` values of a stored row `bytes` (as f32, exact), widened into `row`
/// (`n_head_kv * head_dim` long): that head's `part` bytes alone where given, else the whole row.
fn load_head<'a>(
    ty: crate::kv::KvType,
    part: Option<usize>,
    bytes: &[u8],
    g: usize,
    head_dim: usize,
    row: &'a mut [f32],
) -> &'a [f32] {
    match part {
        Some(hb) => {
            ty.load_row(&bytes[g * hb..(g + 1) * hb], &mut row[..head_dim]);
            &row[..head_dim]
        }
        None => {
            ty.load_row(bytes, row);
            &row[g * head_dim..(g + 1) * head_dim]
        }
    }
}

/// Attend and store. `q` is [n][n_head*head_dim], `k`/`v` [n][n_head_kv*head_dim].
pub fn attention(
    caches: &mut [&mut HostKv],
    spec: AttnSpec,
    batch: &Batch,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &mut [f32],
) -> Result<()> {
    let (n_head, n_head_kv, head_dim) = (spec.n_head, spec.n_head_kv, spec.head_dim);
    let n = batch.len();
    let kv_dim = n_head_kv * head_dim;
    let q_dim = n_head * head_dim;
    let n_rep = n_head / n_head_kv;
    let ty = caches
        .first()
        .map(|c| c.ty)
        .ok_or_else(|| Error::Backend("attention without a cache".into()))?;
    let rb = caches[0].row_bytes;

    // This batch's K and V rows in the cache type: rounded once, like stored rows.
    let mut kb = vec![0u8; n * rb];
    let mut vb = vec![0u8; n * rb];
    for i in 0..n {
        ty.store_row(
            &k[i * kv_dim..(i + 1) * kv_dim],
            &mut kb[i * rb..(i + 1) * rb],
        );
        ty.store_row(
            &v[i * kv_dim..(i + 1) * kv_dim],
            &mut vb[i * rb..(i + 1) * rb],
        );
    }
    // Row of the batch holding (seq, pos), for keys this batch brings.
    let first_in_batch: Vec<Option<(u32, usize)>> = (0..caches.len())
        .map(|s| {
            batch
                .seq
                .iter()
                .position(|&x| x == s)
                .map(|i| (batch.pos[i], i))
        })
        .collect();

    // One KV head's part of a stored row, where it is whole blocks: only that part is widened.
    let part = ty
        .row_bytes(head_dim)
        .ok()
        .filter(|&hb| hb * n_head_kv == rb);
    {
        let shared: Vec<&HostKv> = caches.iter().map(|c| &**c).collect();
        let key_rows = |s: usize, j: u32| -> Option<(&[u8], &[u8])> {
            if let Some((p0, i0)) = first_in_batch[s] {
                if j >= p0 {
                    let i = i0 + (j - p0) as usize;
                    return Some((&kb[i * rb..(i + 1) * rb], &vb[i * rb..(i + 1) * rb]));
                }
            }
            shared[s].rows(spec.layer, j)
        };
        let failed = std::sync::atomic::AtomicBool::new(false);
        out.par_chunks_mut(n_rep * head_dim)
            .enumerate()
            .for_each(|(c, o)| {
                // Compiled for AVX2 where the CPU has it (wider f64 vectors for the sums of V):
                // no operation is fused or reordered by that, so the bits are the same.
                crate::cpu::ggml::lanes::with_avx2_fma(
                    #[inline(always)]
                    || {
                        let (i, g) = (c / n_head_kv, c % n_head_kv);
                        let (s, p) = (batch.seq[i], batch.pos[i]);
                        let lo = if spec.kind.is_sliding() {
                            (p + 1).saturating_sub(spec.n_swa as u32)
                        } else {
                            0
                        };
                        let qs = &q[i * q_dim + g * n_rep * head_dim
                            ..i * q_dim + (g + 1) * n_rep * head_dim];
                        let nk = (p - lo + 1) as usize;
                        let mut scores = vec![0f64; n_rep * nk];
                        let mut row = vec![0f32; kv_dim];
                        for (jj, j) in (lo..=p).enumerate() {
                            let Some((kr, _)) = key_rows(s, j) else {
                                failed.store(true, std::sync::atomic::Ordering::Relaxed);
                                return;
                            };
                            let kh = load_head(ty, part, kr, g, head_dim, &mut row);
                            for r in 0..n_rep {
                                scores[r * nk + jj] = dot(&qs[r * head_dim..(r + 1) * head_dim], kh)
                                    as f64
                                    * spec.scale as f64;
                            }
                        }
                        for r in 0..n_rep {
                            let sc = &mut scores[r * nk..(r + 1) * nk];
                            let m = sc.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                            let mut sum = 0f64;
                            for x in sc.iter_mut() {
                                *x = (*x - m).exp();
                                sum += *x;
                            }
                            for x in sc.iter_mut() {
                                *x /= sum;
                            }
                        }
                        let mut acc = vec![0f64; n_rep * head_dim];
                        for (jj, j) in (lo..=p).enumerate() {
                            let Some((_, vr)) = key_rows(s, j) else {
                                failed.store(true, std::sync::atomic::Ordering::Relaxed);
                                return;
                            };
                            let vh = load_head(ty, part, vr, g, head_dim, &mut row);
                            for r in 0..n_rep {
                                let w = scores[r * nk + jj];
                                for (a, &x) in
                                    acc[r * head_dim..(r + 1) * head_dim].iter_mut().zip(vh)
                                {
                                    *a += w * x as f64;
                                }
                            }
                        }
                        for (o, a) in o.iter_mut().zip(&acc) {
                            *o = *a as f32;
                        }
                    },
                );
            });
        if failed.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(Error::Backend(format!(
                "layer {}: a visible key is missing from the cache (positions out of order?)",
                spec.layer
            )));
        }
    }

    // Commit this batch's rows to the caches.
    for i in 0..n {
        caches[batch.seq[i]].put(
            spec.layer,
            batch.pos[i],
            &kb[i * rb..(i + 1) * rb],
            &vb[i * rb..(i + 1) * rb],
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{LayerKind, MuseConfig};
    use crate::kv::KvType;

    fn cfg() -> MuseConfig {
        MuseConfig {
            n_vocab: 8,
            n_ctx_train: 64,
            n_embd: 8,
            n_ff: 8,
            n_layer: 2,
            n_head: 2,
            n_head_kv: 1,
            head_dim: 8,
            rms_eps: 1e-5,
            n_swa: 3,
            layer_kinds: vec![LayerKind::SlidingRope, LayerKind::FullNope],
            rope_freq_base: 10000.0,
            rope_freq_base_swa: 10000.0,
            logit_scale: 1.0,
            softcap: None,
        }
    }

    /// With equal scores (q = 0) attention is the mean of the visible V rows; V row p carries
    /// 2^p in its first value, so the output names exactly which positions were visible.
    fn visible_sets(layer: usize, kind: LayerKind, ubatch: usize) -> Vec<Vec<u32>> {
        let c = cfg();
        let mut kv = HostKv::new(&c, KvType::F32, 16).unwrap();
        let n = 9u32;
        let mut sets = Vec::new();
        let mut p0 = 0;
        while p0 < n {
            let m = (ubatch as u32).min(n - p0);
            let batch = Batch {
                tokens: vec![0; m as usize],
                pos: (p0..p0 + m).collect(),
                seq: vec![0; m as usize],
            };
            let q = vec![0f32; m as usize * 16];
            let k: Vec<f32> = (0..m as usize * 8).map(|i| (i % 5) as f32).collect();
            let v: Vec<f32> = (p0..p0 + m)
                .flat_map(|p| (0..8).map(move |d| if d == 0 { (1u32 << p) as f32 } else { 0.0 }))
                .collect();
            let mut out = vec![0f32; m as usize * 16];
            let spec = AttnSpec {
                layer,
                kind,
                n_swa: c.n_swa,
                scale: 1.0,
                n_head: 2,
                n_head_kv: 1,
                head_dim: 8,
            };
            attention(&mut [&mut kv], spec, &batch, &q, &k, &v, &mut out).unwrap();
            for i in 0..m as usize {
                let p = p0 + i as u32;
                let count = (0..=p)
                    .filter(|&j| kind == LayerKind::FullNope || p - j < 3)
                    .count() as f32;
                let sum = (out[i * 16] * count).round() as u32;
                assert_eq!(
                    out[i * 16],
                    out[i * 16 + 8],
                    "both query heads share the KV head"
                );
                sets.push((0..16).filter(|b| sum & (1 << b) != 0).collect());
            }
            kv.len = (p0 + m) as usize;
            p0 += m;
        }
        sets
    }

    #[test]
    fn the_sliding_window_boundary_is_exactly_0_le_i_minus_j_lt_window() {
        for ub in [1usize, 2, 4, 9] {
            let s = visible_sets(0, LayerKind::SlidingRope, ub);
            for (p, set) in s.iter().enumerate() {
                let want: Vec<u32> = (p.saturating_sub(2) as u32..=p as u32).collect();
                assert_eq!(set, &want, "sliding, position {p}, micro-batch {ub}");
            }
            let f = visible_sets(1, LayerKind::FullNope, ub);
            for (p, set) in f.iter().enumerate() {
                assert_eq!(
                    set,
                    &(0..=p as u32).collect::<Vec<_>>(),
                    "full, position {p}, micro-batch {ub}"
                );
            }
        }
    }
}
