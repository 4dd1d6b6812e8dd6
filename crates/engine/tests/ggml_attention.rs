//! Non-flash attention over a KV cache, and the KV slot simulator, against ggml-cpu goldens
//! (tools/ggml-golden: the graph of llama-graph.cpp build_attn_mha over set_rows-filled caches).

mod ggml_common;

use ggml_common::{Rng, assert_bits_eq, cases};
use muser_engine::cpu::ggml::{
    AttnParams, KvKey, KvLayout, attention, attention_by_head, hadamard_rotate, k_rotation,
    kv_row_bytes, store_kv_row,
};
use muser_gguf::GgmlType;

/// Each filled cell's (slot, position, K bytes, V bytes): K and V rows of `width` values drawn
/// from `r` in turn (K rotated by `rot`'s Hadamard blocks where given), stored in the cache types.
fn cache_rows(
    kt: GgmlType,
    vt: GgmlType,
    cells: &[i32],
    width: usize,
    r: &mut Rng,
    rot: Option<usize>,
) -> Vec<(usize, i32, Vec<u8>, Vec<u8>)> {
    let (krb, vrb) = (kv_row_bytes(kt, width), kv_row_bytes(vt, width));
    let mut rows = Vec::new();
    for (slot, &p) in cells.iter().enumerate() {
        if p < 0 {
            continue;
        }
        let (mut k, v) = (r.acts(width), r.acts(width));
        if let Some(n) = rot {
            hadamard_rotate(&mut k, n);
        }
        let (mut kb, mut vb) = (vec![0u8; krb], vec![0u8; vrb]);
        store_kv_row(kt, &k, &mut kb);
        store_kv_row(vt, &v, &mut vb);
        rows.push((slot, p, kb, vb));
    }
    rows
}

/// The keys of `rows` ([`cache_rows`]) in the first `n_kv` cells.
fn kv_keys(rows: &[(usize, i32, Vec<u8>, Vec<u8>)], n_kv: usize) -> Vec<KvKey<'_>> {
    rows.iter()
        .filter(|r| r.0 < n_kv)
        .map(|r| KvKey {
            slot: r.0,
            pos: r.1,
            k: &r.2,
            v: &r.3,
        })
        .collect()
}

#[test]
fn attention_matches_ggml() {
    for c in cases("attention") {
        let (kt, vt) = (c.ty("kt"), c.ty("vt"));
        let (n_head, n_kv) = (c.usize("n_head"), c.usize("n_kv"));
        let n_swa = c.i64("n_swa");
        let q_pos: Vec<i32> = c
            .get("q_pos")
            .split(',')
            .map(|v| v.parse().unwrap())
            .collect();
        let cells: Vec<i32> = c
            .get("cells")
            .split(',')
            .map(|v| v.parse().unwrap())
            .collect();
        let hd = 128usize;
        let n_head_kv = c.kv.get("n_head_kv").map_or(2, |v| v.parse().unwrap());
        let ntok = q_pos.len();
        let mut r = Rng::new(c.u64("seed"));
        let mut q = r.acts(hd * n_head * ntok);
        let rot = k_rotation(kt, hd);
        if let Some(n) = rot {
            hadamard_rotate(&mut q, n);
        }
        let rows = cache_rows(kt, vt, &cells, hd * n_head_kv, &mut r, rot);
        // ggml's view only covers the first n_kv cells
        let keys = kv_keys(&rows, n_kv);
        let params = AttnParams {
            n_head,
            n_head_kv,
            head_dim: hd,
            k_type: kt,
            v_type: vt,
            n_kv,
            n_swa: if n_swa > 0 { Some(n_swa as u32) } else { None },
            scale: 1.0f32 / (hd as f32).sqrt(),
        };
        let mut out = vec![0.0f32; ntok * n_head * hd];
        attention(&params, &q, &q_pos, &keys, &mut out);
        assert_bits_eq(&c.name, &out, &c.out_f32());
    }
}

#[test]
fn kv_layout_basic_rules() {
    // full cache: consecutive slots from 0, n_kv padded to 256
    let mut full = KvLayout::full(1000);
    assert_eq!(full.size(), 1024);
    let p = full.place(&(0..300).collect::<Vec<i32>>()).unwrap();
    assert_eq!(p.slots, (0..300).collect::<Vec<usize>>());
    assert_eq!(p.n_kv, 512);
    let p = full.place(&[300]).unwrap();
    assert_eq!((p.slots[0], p.n_kv), (300, 512));

    // SWA cache: n_swa 256 + n_ubatch 512 -> 768 cells; a ring once the window has moved on
    let mut swa = KvLayout::swa(4096, 256, 512);
    assert_eq!(swa.size(), 768);
    let p = swa.place(&(0..512).collect::<Vec<i32>>()).unwrap();
    assert_eq!(p.n_kv, 512);
    let p = swa.place(&(512..1024).collect::<Vec<i32>>()).unwrap();
    // 256 empty cells at the end, then the cells whose position left the window (pos <= 511 - 256)
    assert_eq!(&p.slots[..256], &(512..768).collect::<Vec<usize>>()[..]);
    assert_eq!(&p.slots[256..], &(0..256).collect::<Vec<usize>>()[..]);
    assert_eq!(p.n_kv, 768);
    // everything at or before the largest overwritten position was purged
    assert!(swa.cells().all(|(_, pos)| pos > 255));
}

/// Replays real llama.cpp runs (tools/ggml-golden/kv_slots.cpp on a tiny muse-glimmer fixture) and
/// checks every ubatch's cells and `n_kv` in both caches.
#[test]
fn kv_layout_matches_llama_cpp() {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/ggml");
    for name in ["a", "b", "c", "d"] {
        let text = std::fs::read_to_string(dir.join(format!("kv_slots_{name}.txt"))).unwrap();
        let mut lines = text.lines();
        let header = lines.next().unwrap();
        let field = |k: &str| -> usize {
            let v = header
                .split_whitespace()
                .find_map(|p| p.strip_prefix(&format!("{k}=")))
                .unwrap();
            v.parse().unwrap()
        };
        let (n_ctx, n_ubatch, n_swa) = (field("n_ctx"), field("n_ubatch"), field("n_swa"));
        let mut layout = muser_engine::cpu::ggml::IswaLayout::new(n_ctx, n_swa as u32, n_ubatch);
        let mut count = 0;
        for line in lines {
            let kv: std::collections::HashMap<&str, &str> = line
                .split_whitespace()
                .skip(1)
                .map(|p| p.split_once('=').unwrap())
                .collect();
            let n: usize = kv["n"].parse().unwrap();
            let pos0: i32 = kv["pos0"].parse().unwrap();
            let slots =
                |k: &str| -> Vec<usize> { kv[k].split(',').map(|v| v.parse().unwrap()).collect() };
            let positions: Vec<i32> = (0..n as i32).map(|i| pos0 + i).collect();
            let (full, swa) = layout.place(&positions).unwrap();
            assert_eq!(
                full.slots,
                slots("full"),
                "scenario {name}, ubatch at {pos0}: full-cache slots"
            );
            assert_eq!(
                swa.slots,
                slots("swa"),
                "scenario {name}, ubatch at {pos0}: swa-cache slots"
            );
            assert_eq!(
                full.n_kv,
                kv["full_nkv"].parse::<usize>().unwrap(),
                "scenario {name} at {pos0}: full n_kv"
            );
            assert_eq!(
                swa.n_kv,
                kv["swa_nkv"].parse::<usize>().unwrap(),
                "scenario {name} at {pos0}: swa n_kv"
            );
            count += 1;
        }
        assert!(count > 50, "scenario {name}: only {count} ubatches");
    }
}

/// The micro-batch tiles (`attention` for 2 or more tokens on the tinyBLAS paths) and the
/// one-token form over f16 rows on AVX2 (without AVX-512F) give the bits of the (token, head) by
/// (token, head) form on random caches: gaps between slots, slots out
/// of position order (a ring), sliding windows, `n_kv` not a multiple of 8 (the softmax's libm
/// tail), several head groupings and widths, f16, bf16 and f32 caches, sharp scores (weights
/// that round to zero) and keys each token sees only part of.
#[test]
fn micro_batch_tiles_give_the_bits_by_head() {
    let mut r = Rng::new(0x5eed_a77e);
    let mut pick = |n: usize| (r.next() % n as u64) as usize;
    let mut cases_run = 0;
    for case in 0..48 {
        let (kt, vt) = match case % 4 {
            0 => (GgmlType::F16, GgmlType::F16),
            1 => (GgmlType::BF16, GgmlType::F16),
            2 => (GgmlType::F16, GgmlType::BF16),
            _ => (GgmlType::F32, GgmlType::F32),
        };
        let (n_head, n_head_kv) = if kt == GgmlType::F32 {
            (1, 1)
        } else {
            [(16, 2), (8, 8), (12, 2), (6, 3), (4, 1)][pick(5)]
        };
        let hd = [64usize, 128, 256, 40][pick(4)];
        // One token (decode) in a fifth of the cases.
        let ntok = if case % 5 == 4 { 1 } else { 2 + pick(40) };
        let n_kv = 4 * (ntok / 4 + 1 + pick(120));
        let n_swa = if pick(2) == 0 {
            None
        } else {
            Some(1 + pick(n_kv) as u32)
        };
        // Positions 0..n_kv - 1 laid in the slots from a random start (a ring), some slots empty.
        let start = pick(n_kv);
        let first_q = n_kv as i32 - ntok as i32;
        let mut cells = vec![-1i32; n_kv];
        for p in 0..n_kv {
            if p as i32 >= first_q || pick(8) != 0 {
                cells[(start + p) % n_kv] = p as i32;
            }
        }
        let q_pos: Vec<i32> = (first_q..n_kv as i32).collect();
        let sharp = 1.0 + 40.0 * (pick(3) == 0) as u32 as f32;
        let mut rng = Rng::new(case as u64 + 1);
        let q: Vec<f32> = rng
            .acts(hd * n_head * ntok)
            .iter()
            .map(|v| v * sharp)
            .collect();
        let rows = cache_rows(kt, vt, &cells, hd * n_head_kv, &mut rng, None);
        let keys = kv_keys(&rows, n_kv);
        let params = AttnParams {
            n_head,
            n_head_kv,
            head_dim: hd,
            k_type: kt,
            v_type: vt,
            n_kv,
            n_swa,
            scale: 1.0f32 / (hd as f32).sqrt(),
        };
        let mut tiled = vec![0.0f32; ntok * n_head * hd];
        let mut by_head = vec![1.0f32; ntok * n_head * hd];
        attention(&params, &q, &q_pos, &keys, &mut tiled);
        attention_by_head(&params, &q, &q_pos, &keys, &mut by_head);
        let name = format!(
            "case {case}: {kt}/{vt} heads {n_head}/{n_head_kv} hd {hd} tokens {ntok} n_kv {n_kv} swa {n_swa:?}"
        );
        assert_bits_eq(&name, &tiled, &by_head);
        cases_run += 1;
    }
    assert_eq!(cases_run, 48);
}
