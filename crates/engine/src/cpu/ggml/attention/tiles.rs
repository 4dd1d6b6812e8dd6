//! [`super::attention`] for a micro-batch of 2 or more tokens where both products take
//! tinyBLAS's form (`Q·K` and `V·P` each one 8-lane accumulator over the reduced axis, then
//! `hsum8`): an f16 or bf16 K cache (or f32 with one head) and `n_kv % 4 == 0`, `head_dim % 8 ==
//! 0`, on a CPU with AVX2, FMA and F16C. The same FMAs in the same order as (token, head) by
//! (token, head), so the same bits, but taken a KV head and a few tokens at a time:
//!
//! - `Q·K`: the KV head's query rows (its query heads x the task's tokens, up to [`ROWS`]) against
//!   keys [`KEY_CHUNK`] at a time, so a chunk's widened K rows are read from L1 by every row, in
//!   register tiles of 4 keys x 2 rows (each score's 8 lanes and `hsum8` its own);
//! - the softmax row by row, as before;
//! - `V·P`: V laid out by slot groups (`[dim tile][group][4 dims][8 lanes]`, lane = slot % 8, as
//!   tinyBLAS's accumulator lanes are), so one FMA adds a group's 8 slots to a (dim, row)'s
//!   accumulator, in tiles of 4 dims x 2 rows. A key hidden from a row (or an empty slot) is left
//!   out of that row's lanes by a blend, exactly as the key-by-key form leaves it out.
//!
//! Taken (token, head) by (token, head), every row read the KV head's whole widened K and V
//! (2 MB each at 4,096 keys of head_dim 128) from L3 or memory: on AVX2 machines that bound the
//! prompt's attention (37 ns a visible (key, head, token) on 2 Zen 3 cores, 2026-12-07).

use super::super::lanes::v_expf8;
use super::{AttnParams, hsum8, round_to, visible};
use muser_gguf::GgmlType;
use rayon::prelude::*;

/// Query rows a task takes at most (its KV head's query heads for as many tokens as fit).
const ROWS: usize = 32;
/// Keys a `Q·K` pass reads at once (32 KB of f32 K rows at head_dim 128).
const KEY_CHUNK: usize = 64;
/// The scores and weights a task keeps, at most (values): long caches take fewer tokens a task.
const TASK_VALUES: usize = 1 << 20;
/// Query rows of a `Q·K` register tile (4 keys each: 12 accumulators).
const QK_ROWS: usize = 3;
/// Dims of a `V·P` register tile.
const RD: usize = 4;

/// Whether [`attention`] computes this call (see the module's comment for the conditions).
pub(super) fn applies(p: &AttnParams, n_tokens: usize) -> bool {
    n_tokens >= 2
        && p.head_dim > 0
        && p.head_dim.is_multiple_of(8)
        && p.n_kv.is_multiple_of(4)
        && match p.k_type {
            GgmlType::F16 | GgmlType::BF16 => true,
            GgmlType::F32 => p.n_head == 1,
            _ => false,
        }
        && super::super::lanes::has_avx2_fma()
}

/// The attention of `q_pos.len()` tokens over `keys` in slot order (their K widened to f32 as
/// `[kvh][key][d]` in `kf`); `q` and `out` as in [`super::attention`]. The caller checked
/// [`applies`].
pub(super) fn attention(
    p: &AttnParams,
    q: &[f32],
    q_pos: &[i32],
    keys: &[super::KvKey],
    kf: &[f32],
    out: &mut [f32],
) {
    let (nh, nkv, hd) = (p.n_head, p.n_head_kv, p.head_dim);
    let (g, nk, n_tokens) = (nh / nkv, keys.len(), q_pos.len());
    assert!(kf.len() == nkv * nk * hd, "attention tiles: K plane");
    let slots: Vec<usize> = keys.iter().map(|k| k.slot).collect();
    let kpos: Vec<i32> = keys.iter().map(|k| k.pos).collect();
    let (slots, kpos) = (&slots[..], &kpos[..]);
    // The slot groups of 8 that hold keys, and each key's group and lane.
    let mut groups = 0usize;
    let mut last = usize::MAX;
    let key_group: Vec<(usize, usize)> = slots
        .iter()
        .map(|&s| {
            if s / 8 != last {
                last = s / 8;
                groups += 1;
            }
            (groups - 1, s % 8)
        })
        .collect();
    let ng = groups;
    // V by slot groups, each row widened once: [kvh][dim tile][group][RD][8], empty lanes 0
    // (always blended away).
    let ndt = hd / RD;
    let tile = ng * RD * 8;
    let mut vt = vec![0.0f32; nkv * ndt * tile];
    vt.par_chunks_mut(ndt * tile)
        .enumerate()
        .for_each(|(kvh, o)| {
            let mut row = vec![std::mem::MaybeUninit::<f32>::uninit(); hd];
            for (k, &(gi, lane)) in keys.iter().zip(&key_group) {
                super::widen_row(p.v_type, k.v, kvh, &mut row);
                for (d, v) in row.iter().enumerate() {
                    // SAFETY: `widen_row` wrote every value of `row`.
                    let v = unsafe { v.assume_init() };
                    o[((d / RD) * ng + gi) * RD * 8 + (d % RD) * 8 + lane] = v;
                }
            }
        });
    // Tasks: a KV head and `tb` tokens.
    let tb = (ROWS / g)
        .min(TASK_VALUES / (g * nk.max(ng * 8)).max(1))
        .max(1);
    let ntb = n_tokens.div_ceil(tb);
    let tasks: Vec<(usize, usize)> = (0..nkv)
        .flat_map(|kvh| (0..ntb).map(move |b| (kvh, b)))
        .collect();
    let results: Vec<Vec<f32>> = tasks
        .par_iter()
        .map(|&(kvh, b)| {
            let toks = b * tb..((b + 1) * tb).min(n_tokens);
            let task = Task {
                p,
                g,
                kvh,
                q,
                q_pos: &q_pos[toks.clone()],
                t0: toks.start,
                kpos,
                slots,
                key_group: &key_group,
                ng,
                kf: &kf[kvh * nk * hd..(kvh + 1) * nk * hd],
                vt: &vt[kvh * ndt * tile..(kvh + 1) * ndt * tile],
            };
            super::with_avx2_fma(
                #[inline(always)]
                || task.run(),
            )
        })
        .collect();
    for (&(kvh, b), o) in tasks.iter().zip(&results) {
        for (r, row) in o.chunks_exact(hd).enumerate() {
            let (t, h) = (b * tb + r / g, kvh * g + r % g);
            out[(t * nh + h) * hd..(t * nh + h + 1) * hd].copy_from_slice(row);
        }
    }
}

thread_local! {
    /// A task's scores and weights, reused from task to task (fresh buffers of this size came
    /// as zeroed pages from the kernel on every call).
    static SCRATCH: std::cell::RefCell<(Vec<f32>, Vec<f32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// One KV head's query rows for a few tokens: row `r` is token `t0 + r / g`, query head
/// `kvh g + r % g`.
struct Task<'a> {
    p: &'a AttnParams,
    g: usize,
    kvh: usize,
    q: &'a [f32],
    q_pos: &'a [i32],
    t0: usize,
    kpos: &'a [i32],
    slots: &'a [usize],
    key_group: &'a [(usize, usize)],
    ng: usize,
    /// This KV head's widened K rows, `[key][d]`.
    kf: &'a [f32],
    /// This KV head's V by slot groups, `[dim tile][group][RD][8]`.
    vt: &'a [f32],
}

impl Task<'_> {
    #[inline(always)]
    fn run(&self) -> Vec<f32> {
        let p = self.p;
        let (hd, nk, ng) = (p.head_dim, self.kpos.len(), self.ng);
        let nr = self.q_pos.len() * self.g;
        // q converted to K's vec_dot_type (exact widenings back).
        let mut qr = vec![0.0f32; nr * hd];
        for (r, o) in qr.chunks_exact_mut(hd).enumerate() {
            let (t, h) = (self.t0 + r / self.g, self.kvh * self.g + r % self.g);
            let src = &self.q[(t * p.n_head + h) * hd..][..hd];
            for (o, &v) in o.iter_mut().zip(src) {
                *o = round_to(p.k_type, v);
            }
        }
        let (mut s, mut pw) = SCRATCH.with(|c| c.take());
        s.resize(nr * nk, 0.0);
        pw.resize(nr * ng * 8, 0.0);
        // Each row's lanes that hold a visible key, a byte a (row, group).
        let mut mask = vec![0u8; nr * ng];
        self.scores(&qr, &mut s);
        let mut span = vec![(usize::MAX, 0usize); nr];
        let mut vis = Vec::with_capacity(nk);
        for r in 0..nr {
            if r % self.g == 0 {
                // The keys this row's token sees (its query heads share them).
                let q_pos = self.q_pos[r / self.g];
                vis.clear();
                vis.extend((0..nk).filter(|&i| visible(self.kpos[i], q_pos, p.n_swa)));
                assert!(
                    !vis.is_empty(),
                    "attention: a query at position {q_pos} sees no key"
                );
            }
            span[r] = self.softmax(r, &vis, &s[r * nk..(r + 1) * nk], &mut pw, &mut mask);
        }
        let mut out = vec![0.0f32; nr * hd];
        let ndt = hd / RD;
        for dt in 0..ndt {
            let v = &self.vt[dt * ng * RD * 8..(dt + 1) * ng * RD * 8];
            let mut r = 0;
            while r < nr {
                let n = (nr - r).min(2);
                let lo = span[r..r + n].iter().map(|x| x.0).min().unwrap_or(0);
                let hi = span[r..r + n].iter().map(|x| x.1).max().unwrap_or(0);
                let sums: Vec<[f32; RD]> = if n == 2 {
                    // SAFETY: the task runs inside `with_avx2_fma` on a CPU with avx2 and fma
                    // (`applies` checked `has_avx2_fma`); `vp_tile` reads through checked slices.
                    unsafe { vp_tile::<2>(v, &pw, &mask, r, ng, lo, hi) }.to_vec()
                } else {
                    // SAFETY: as above.
                    unsafe { vp_tile::<1>(v, &pw, &mask, r, ng, lo, hi) }.to_vec()
                };
                for (i, sum) in sums.iter().enumerate() {
                    out[(r + i) * hd + dt * RD..][..RD].copy_from_slice(sum);
                }
                r += n;
            }
        }
        SCRATCH.with(|c| c.replace((s, pw)));
        out
    }

    /// Every row's score against every key of a chunk any row of the task sees (the others are
    /// left as they were: the softmax reads visible keys only).
    #[inline(always)]
    fn scores(&self, qr: &[f32], s: &mut [f32]) {
        let (hd, nk) = (self.p.head_dim, self.kpos.len());
        let nr = qr.len() / hd;
        for c0 in (0..nk).step_by(KEY_CHUNK) {
            let c1 = (c0 + KEY_CHUNK).min(nk);
            let seen = self.kpos[c0..c1]
                .iter()
                .any(|&kp| self.q_pos.iter().any(|&qp| visible(kp, qp, self.p.n_swa)));
            if !seen {
                continue;
            }
            let mut r = 0;
            while r < nr {
                let n = (nr - r).min(QK_ROWS);
                match n {
                    3 => self.score_rows::<3>(qr, s, r, c0..c1),
                    2 => self.score_rows::<2>(qr, s, r, c0..c1),
                    _ => self.score_rows::<1>(qr, s, r, c0..c1),
                }
                r += n;
            }
        }
    }

    /// Rows `r..r + NR`'s scores against keys `keys`, 4 keys a register tile.
    #[inline(always)]
    fn score_rows<const NR: usize>(
        &self,
        qr: &[f32],
        s: &mut [f32],
        r: usize,
        keys: std::ops::Range<usize>,
    ) {
        let (hd, nk) = (self.p.head_dim, self.kpos.len());
        let k = |i: usize| &self.kf[i * hd..(i + 1) * hd];
        let rows: [&[f32]; NR] = std::array::from_fn(|x| &qr[(r + x) * hd..(r + x + 1) * hd]);
        let mut i = keys.start;
        while i + 4 <= keys.end {
            // SAFETY: inside `with_avx2_fma` (avx2 and fma present, `applies`); rows of `hd`
            // values through checked slices.
            let d = unsafe { qk_tile::<4, NR>([k(i), k(i + 1), k(i + 2), k(i + 3)], rows) };
            for (a, da) in d.iter().enumerate() {
                for (x, &v) in da.iter().enumerate() {
                    s[(r + x) * nk + i + a] = v;
                }
            }
            i += 4;
        }
        while i < keys.end {
            // SAFETY: as above.
            let d = unsafe { qk_tile::<1, NR>([k(i)], rows) };
            for (x, &v) in d[0].iter().enumerate() {
                s[(r + x) * nk + i] = v;
            }
            i += 1;
        }
    }

    /// Row `r`'s softmax over the keys it sees (the key-by-key form's steps: scale, max, exp in
    /// the mask's 8-groups, an f64 sum of their `hsum8`s, P converted to V's type), written as
    /// weights by slot group and lane with the row's lane masks; the span of groups it touches.
    #[inline(always)]
    fn softmax(
        &self,
        r: usize,
        vis: &[usize],
        s: &[f32],
        pw: &mut [f32],
        mask: &mut [u8],
    ) -> (usize, usize) {
        let p = self.p;
        let ng = self.ng;
        let sv: Vec<f32> = vis.iter().map(|&i| s[i] * p.scale + 0.0f32).collect();
        let e = weights(&sv, |j| self.slots[vis[j]], p.n_kv, p.v_type);
        let (pw, mask) = (
            &mut pw[r * ng * 8..(r + 1) * ng * 8],
            &mut mask[r * ng..(r + 1) * ng],
        );
        let mut span = (usize::MAX, 0);
        for (&i, &pv) in vis.iter().zip(&e) {
            let (gi, lane) = self.key_group[i];
            pw[gi * 8 + lane] = pv;
            mask[gi] |= 1 << lane;
            span = (span.0.min(gi), span.1.max(gi + 1));
        }
        span
    }
}

/// The softmax's weights of the visible keys (slot order; key `j` in slot `slot(j)`) from
/// their scaled scores `sv`, as the key-by-key form computes them: `ggml_v_expf(s - max)` 8
/// keys at a time (each lane's bits the one-lane form's), libm's exp past the mask's last
/// 8-group (ggml's softmax's tail), their sum in f64 by the 8-groups' `hsum8`, then `e / sum`
/// converted to V's vec_dot_type `ty` (f16 by F16C, as `GGML_CPU_FP32_TO_FP16`). `sv.len()`
/// values, then padding to a multiple of 8. Called inside `with_avx2_fma` (avx2, fma, f16c).
#[inline(always)]
fn weights(sv: &[f32], slot: impl Fn(usize) -> usize, n_kv: usize, ty: GgmlType) -> Vec<f32> {
    use std::arch::x86_64::*;
    let mut max = f32::NEG_INFINITY;
    for &v in sv {
        max = if max > v { max } else { v };
    }
    let (nv, n8) = (sv.len(), n_kv & !7);
    let mut e = vec![0.0f32; nv.next_multiple_of(8)];
    for (e, x) in e.iter_mut().zip(sv) {
        *e = x - max;
    }
    for c in e.chunks_exact_mut(8) {
        // SAFETY: the callers run inside `with_avx2_fma` on a CPU with avx2, fma and f16c
        // (`applies`, `one_token_applies`); 8 floats of a chunk of 8 in and out.
        unsafe { _mm256_storeu_ps(c.as_mut_ptr(), v_expf8(_mm256_loadu_ps(c.as_ptr()))) };
    }
    let mut sum = 0.0f64;
    let mut j = 0;
    while j < nv {
        if slot(j) >= n8 {
            // libm tail
            e[j] = (sv[j] - max).exp();
            sum += e[j] as f64;
            j += 1;
            continue;
        }
        let group = slot(j) / 8;
        let mut lanes = [0.0f32; 8];
        while j < nv && slot(j) / 8 == group && slot(j) < n8 {
            lanes[slot(j) % 8] = e[j];
            j += 1;
        }
        sum += hsum8(&lanes) as f64;
    }
    let inv = (1.0f64 / sum) as f32;
    for c in e.chunks_exact_mut(8) {
        // SAFETY: as above; 8 floats in and out.
        unsafe {
            let x = _mm256_mul_ps(_mm256_loadu_ps(c.as_ptr()), _mm256_set1_ps(inv));
            let x = match ty {
                GgmlType::F16 => _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x)),
                _ => x,
            };
            _mm256_storeu_ps(c.as_mut_ptr(), x);
        }
    }
    if ty == GgmlType::BF16 {
        for v in e.iter_mut() {
            *v = round_to(GgmlType::BF16, *v);
        }
    }
    e
}

/// `NK` keys' scores against `NR` query rows (each `head_dim` long, a multiple of 8): tinyBLAS's
/// dot, `acc = fma(k, q, acc)` 8 lanes at a time through the row, then `hsum8`.
///
/// # Safety
/// The CPU must have avx2 and fma.
#[target_feature(enable = "avx2,fma")]
fn qk_tile<const NK: usize, const NR: usize>(k: [&[f32]; NK], q: [&[f32]; NR]) -> [[f32; NR]; NK] {
    use std::arch::x86_64::*;
    let hd = q[0].len();
    assert!(
        hd.is_multiple_of(8) && k.iter().all(|r| r.len() == hd) && q.iter().all(|r| r.len() == hd),
        "qk_tile: rows"
    );
    let mut acc = [[_mm256_setzero_ps(); NR]; NK];
    for c in (0..hd).step_by(8) {
        let mut qv = [_mm256_setzero_ps(); NR];
        for (v, qr) in qv.iter_mut().zip(&q) {
            // SAFETY: 8 floats at c < hd of rows of hd (checked above), hd a multiple of 8.
            *v = unsafe { _mm256_loadu_ps(qr.as_ptr().add(c)) };
        }
        for (a, kr) in acc.iter_mut().zip(&k) {
            // SAFETY: as above.
            let kv = unsafe { _mm256_loadu_ps(kr.as_ptr().add(c)) };
            for (x, qv) in a.iter_mut().zip(&qv) {
                *x = _mm256_fmadd_ps(kv, *qv, *x);
            }
        }
    }
    // (plain loops: closures would be compiled without this function's target features)
    let mut out = [[0.0f32; NR]; NK];
    for (o, a) in out.iter_mut().zip(&acc) {
        for (o, v) in o.iter_mut().zip(a) {
            *o = hsum8(&lanes(*v));
        }
    }
    out
}

/// `RD` dims' `V·P` sums of rows `r0..r0 + NR` over the slot groups `lo..hi`: each (dim, row) one
/// 8-lane accumulator (lane = slot % 8) adding a group's weighted values by one FMA, the lanes a
/// row does not see kept by a blend; then `hsum8`. `v` is one dim tile `[group][RD][8]`, `pw` and
/// `mask` the task's `[row][group][8]` weights and `[row][group]` lane masks.
///
/// # Safety
/// The CPU must have avx2 and fma.
#[target_feature(enable = "avx2,fma")]
fn vp_tile<const NR: usize>(
    v: &[f32],
    pw: &[f32],
    mask: &[u8],
    r0: usize,
    ng: usize,
    lo: usize,
    hi: usize,
) -> [[f32; RD]; NR] {
    use std::arch::x86_64::*;
    assert!(
        v.len() == ng * RD * 8 && pw.len() >= (r0 + NR) * ng * 8 && mask.len() >= (r0 + NR) * ng,
        "vp_tile: shapes"
    );
    let hi = hi.min(ng);
    let bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    let mut acc = [[_mm256_setzero_ps(); NR]; RD];
    for gi in lo..hi {
        let mut m = [0u8; NR];
        for (r, m) in m.iter_mut().enumerate() {
            *m = mask[(r0 + r) * ng + gi];
        }
        if m.iter().all(|&x| x == 0) {
            continue;
        }
        let mut vv = [_mm256_setzero_ps(); RD];
        for (j, x) in vv.iter_mut().enumerate() {
            // SAFETY: 8 floats at (gi RD + j) 8, gi < ng, j < RD: inside v (checked above).
            *x = unsafe { _mm256_loadu_ps(v.as_ptr().add((gi * RD + j) * 8)) };
        }
        for r in 0..NR {
            if m[r] == 0 {
                continue;
            }
            // SAFETY: 8 floats at ((r0 + r) ng + gi) 8, inside pw (checked above).
            let pv = unsafe { _mm256_loadu_ps(pw.as_ptr().add(((r0 + r) * ng + gi) * 8)) };
            if m[r] == 0xff {
                for (j, a) in acc.iter_mut().enumerate() {
                    a[r] = _mm256_fmadd_ps(vv[j], pv, a[r]);
                }
            } else {
                let keep = _mm256_castsi256_ps(_mm256_cmpeq_epi32(
                    _mm256_and_si256(_mm256_set1_epi32(m[r] as i32), bits),
                    bits,
                ));
                for (j, a) in acc.iter_mut().enumerate() {
                    let x = &mut a[r];
                    *x = _mm256_blendv_ps(*x, _mm256_fmadd_ps(vv[j], pv, *x), keep);
                }
            }
        }
    }
    let mut out = [[0.0f32; RD]; NR];
    for (j, a) in acc.iter().enumerate() {
        for (r, v) in a.iter().enumerate() {
            out[r][j] = hsum8(&lanes(*v));
        }
    }
    out
}

/// The 8 lanes of a vector.
#[inline(always)]
fn lanes(v: std::arch::x86_64::__m256) -> [f32; 8] {
    // SAFETY: __m256 and [f32; 8] have the same size, and every bit pattern is an f32.
    unsafe { std::mem::transmute(v) }
}

/// Query heads a one-token task takes at most.
const ONE_TOKEN_HEADS: usize = 4;

/// Whether [`one_token`] computes this call: one token over f16 K and V, `head_dim` a multiple
/// of 32, on a CPU with AVX2, FMA and F16C but without AVX-512F (where the key-by-key form
/// keeps its lanes in 512-bit registers and reads the rows in place).
pub(super) fn one_token_applies(p: &AttnParams, n_tokens: usize) -> bool {
    n_tokens == 1
        && p.k_type == GgmlType::F16
        && p.v_type == GgmlType::F16
        && p.head_dim > 0
        && p.head_dim.is_multiple_of(32)
        && super::super::lanes::has_avx2_fma()
        && !super::lane_sums_f16_ok(p.head_dim)
}

/// One token's attention (decode) on vec_dot's paths over f16 K and V rows read where they lie
/// (`keys` in slot order), a few query heads of one KV head a task: each key's K row dotted with
/// every head of the task while in L1 (`dot_kq_f16`, as before), and each V row widened once
/// (F16C) and added to every head's 32 vec_dot lanes (`((slot / 8) % 4) 8 + slot % 8`, a key's
/// lane the same for every head) in slot order, the keys past the last 32 summed after in f64:
/// the (token, head) form's FMAs in its order, so its bits. The caller checked
/// [`one_token_applies`].
pub(super) fn one_token(
    p: &AttnParams,
    q: &[f32],
    q_pos: i32,
    keys: &[super::KvKey],
    out: &mut [f32],
) {
    let (nh, nkv, hd) = (p.n_head, p.n_head_kv, p.head_dim);
    let g = nh / nkv;
    let vis: Vec<usize> = (0..keys.len())
        .filter(|&i| visible(keys[i].pos, q_pos, p.n_swa))
        .collect();
    assert!(
        !vis.is_empty(),
        "attention: a query at position {q_pos} sees no key"
    );
    let np = p.n_kv & !31;
    let lane_of: Vec<u8> = vis
        .iter()
        .map(|&i| {
            let slot = keys[i].slot;
            if slot >= np {
                super::SKIP
            } else {
                (((slot / 8) % 4) * 8 + slot % 8) as u8
            }
        })
        .collect();
    // Heads a task: a divisor of g, so that a task's heads share their KV head.
    let per = (1..=ONE_TOKEN_HEADS.min(g))
        .rev()
        .find(|d| g.is_multiple_of(*d))
        .unwrap_or(1);
    out.par_chunks_mut(per * hd).enumerate().for_each(|(c, o)| {
        let h0 = c * per;
        let qh = &q[h0 * hd..(h0 + per) * hd];
        super::with_avx2_fma(
            #[inline(always)]
            || one_token_heads(p, qh, keys, &vis, &lane_of, h0 / g, o),
        );
    });
}

/// [`one_token`] for the query heads `q` (`[head][d]`) of KV head `kvh`, into `out` (the same
/// shape).
#[inline(always)]
fn one_token_heads(
    p: &AttnParams,
    q: &[f32],
    keys: &[super::KvKey],
    vis: &[usize],
    lane_of: &[u8],
    kvh: usize,
    out: &mut [f32],
) {
    let hd = p.head_dim;
    let nh = q.len() / hd;
    let nv = vis.len();
    let part = kvh * hd * 2..(kvh + 1) * hd * 2;
    // q converted to f16 and back (K's vec_dot_type).
    let qr: Vec<f32> = q.iter().map(|&v| round_to(GgmlType::F16, v)).collect();
    // Scores, key chunks read by every head while in L1.
    let mut s = vec![0.0f32; nh * nv];
    for c0 in (0..nv).step_by(KEY_CHUNK) {
        let c1 = (c0 + KEY_CHUNK).min(nv);
        for h in 0..nh {
            let qh = &qr[h * hd..(h + 1) * hd];
            for j in c0..c1 {
                // SAFETY: `one_token_applies` checked avx2, fma and f16c.
                s[h * nv + j] = unsafe { super::dot_kq_f16(&keys[vis[j]].k[part.clone()], qh) };
            }
        }
    }
    // The softmax head by head, as the key-by-key form's.
    let mut pw = vec![0.0f32; nh * nv];
    for h in 0..nh {
        let sv: Vec<f32> = s[h * nv..(h + 1) * nv]
            .iter()
            .map(|&v| v * p.scale + 0.0f32)
            .collect();
        let e = weights(&sv, |j| keys[vis[j]].slot, p.n_kv, GgmlType::F16);
        pw[h * nv..(h + 1) * nv].copy_from_slice(&e[..nv]);
    }
    // V·P: each V row widened once, added to every head's lane.
    let mut acc = vec![0.0f32; nh * 32 * hd];
    let mut row = vec![0.0f32; hd];
    let mut tail: Vec<(usize, Vec<f32>)> = Vec::new();
    for (j, &i) in vis.iter().enumerate() {
        let src = &keys[i].v[part.clone()];
        // SAFETY: avx and f16c (`one_token_applies`); hd values from 2 hd bytes.
        unsafe { crate::formats::f16c_to(src, row.as_mut_ptr(), hd) };
        if lane_of[j] == super::SKIP {
            tail.push((j, row.clone()));
            continue;
        }
        let lane = lane_of[j] as usize;
        for h in 0..nh {
            let a = &mut acc[(h * 32 + lane) * hd..(h * 32 + lane + 1) * hd];
            // SAFETY: avx2 and fma (`one_token_applies`); rows of hd.
            unsafe { axpy(a, &row, pw[h * nv + j]) };
        }
    }
    for h in 0..nh {
        for (d, o) in out[h * hd..(h + 1) * hd].iter_mut().enumerate() {
            let mut a = [[0.0f32; 8]; 4];
            for (r, ar) in a.iter_mut().enumerate() {
                for (lane, v) in ar.iter_mut().enumerate() {
                    *v = acc[(h * 32 + r * 8 + lane) * hd + d];
                }
            }
            let mut sumf = super::reduce4x8(&a) as f64;
            for (j, v) in &tail {
                sumf += (v[d] * pw[h * nv + j]) as f64;
            }
            *o = sumf as f32;
        }
    }
}

/// `a[d] = fma(x[d], w, a[d])` for every d (equal lengths, a multiple of 8).
///
/// # Safety
/// The CPU must have avx2 and fma.
#[target_feature(enable = "avx2,fma")]
fn axpy(a: &mut [f32], x: &[f32], w: f32) {
    use std::arch::x86_64::*;
    assert!(
        a.len() == x.len() && a.len().is_multiple_of(8),
        "axpy: lengths"
    );
    let wv = _mm256_set1_ps(w);
    for c in (0..a.len()).step_by(8) {
        // SAFETY: 8 floats at c of two slices of the same length, a multiple of 8 (checked).
        unsafe {
            let y = _mm256_fmadd_ps(
                _mm256_loadu_ps(x.as_ptr().add(c)),
                wv,
                _mm256_loadu_ps(a.as_ptr().add(c)),
            );
            _mm256_storeu_ps(a.as_mut_ptr().add(c), y);
        }
    }
}
