//! End to end: a muse-glimmer forward pass composed only of the parity kernels
//! (`muser_engine::cpu::ggml`), in the graph order of llama.cpp's src/models/muse-glimmer.cpp, against
//! llama.cpp b11434's own logits and greedy continuations for the committed fixture models
//! (tests/fixtures: every fixture model, KV cache f32 and f16; see tests/fixtures/README.md).
//!
//! This is a check of the kernels, not the engine's model: it keeps everything as plain vectors.

use std::path::PathBuf;

use muser_engine::cpu::ggml::{
    Activations, AttnParams, IswaLayout, KvKey, Placement, add, get_row, kv_row_bytes, mul,
    mul_mat_act, rms_norm_mul, rms_norm_rows, rope_norm, scale, sigmoid, softcap, store_kv_row,
    swiglu_row,
};
use muser_gguf::{GgmlType, Gguf};

struct Weight<'a> {
    ty: GgmlType,
    data: &'a [u8],
    cols: usize,
    rows: usize,
}

struct Model<'a> {
    g: &'a Gguf,
    n_layer: usize,
    n_embd: usize,
    n_head: usize,
    n_head_kv: usize,
    head_dim: usize,
    n_swa: u32,
    swa: Vec<bool>,
    eps: f32,
    freq_base_swa: f32,
    logit_scale: f32,
    softcap: Option<f32>,
    n_vocab: usize,
}

impl<'a> Model<'a> {
    fn load(g: &'a Gguf) -> Model<'a> {
        let k = |s: &str| {
            g.get(&format!("muse-glimmer.{s}"))
                .unwrap_or_else(|| panic!("key {s}"))
        };
        let n_embd = k("embedding_length").as_i64().unwrap() as usize;
        let n_head = k("attention.head_count").as_i64().unwrap() as usize;
        let swa: Vec<bool> = match k("attention.sliding_window_pattern").as_array().unwrap() {
            muser_gguf::Array::Bool(v) => v.clone(),
            a => panic!("pattern {a:?}"),
        };
        let base = k("rope.freq_base").as_f64().unwrap() as f32;
        let out = g.tensor("output.weight").unwrap();
        Model {
            g,
            n_layer: k("block_count").as_i64().unwrap() as usize,
            n_embd,
            n_head,
            n_head_kv: k("attention.head_count_kv").as_i64().unwrap() as usize,
            head_dim: k("attention.key_length").as_i64().unwrap() as usize,
            n_swa: k("attention.sliding_window").as_i64().unwrap() as u32,
            swa,
            eps: k("attention.layer_norm_rms_epsilon").as_f64().unwrap() as f32,
            freq_base_swa: g
                .get("muse-glimmer.rope.freq_base_swa")
                .map_or(base, |v| v.as_f64().unwrap() as f32),
            logit_scale: k("logit_scale").as_f64().unwrap() as f32,
            softcap: g
                .get("muse-glimmer.final_logit_softcapping")
                .map(|v| v.as_f64().unwrap() as f32),
            n_vocab: out.dims[1] as usize,
        }
    }

    fn w(&self, name: &str) -> Weight<'a> {
        let t = self
            .g
            .tensor(name)
            .unwrap_or_else(|| panic!("tensor {name}"));
        let rows = t.dims.get(1).copied().unwrap_or(1) as usize;
        Weight {
            ty: t.ggml_type,
            data: self.g.tensor_data(t),
            cols: t.dims[0] as usize,
            rows,
        }
    }

    fn vec(&self, name: &str) -> Vec<f32> {
        let w = self.w(name);
        let mut v = vec![0.0f32; w.cols * w.rows];
        get_row(w.ty, w.data, &mut v);
        v
    }
}

/// `mul_mat(W, x)` for `n` rows of `x`.
fn mm(w: &Weight, x: &[f32], n: usize) -> Vec<f32> {
    let act = Activations::new(w.ty, x, w.cols, n);
    let mut y = vec![0.0f32; w.rows * n];
    mul_mat_act(w.ty, w.data, w.rows, &act, &mut y);
    y
}

/// One layer's cache: K and V rows per cell.
struct LayerCache {
    k: Vec<Vec<u8>>,
    v: Vec<Vec<u8>>,
}

struct State {
    layout: IswaLayout,
    caches: Vec<LayerCache>,
    kv_type: GgmlType,
}

/// One ubatch (`tokens` at `pos0..`), returning the logits of the last `n_out` tokens.
fn forward(m: &Model, st: &mut State, tokens: &[i32], pos0: i32, n_out: usize) -> Vec<f32> {
    let n = tokens.len();
    let (ne, hd, nh, nkv) = (m.n_embd, m.head_dim, m.n_head, m.n_head_kv);
    let positions: Vec<i32> = (0..n as i32).map(|i| pos0 + i).collect();
    let (full, swa): (Placement, Placement) = st.layout.place(&positions).unwrap();

    let emb = m.w("token_embd.weight");
    let rb = emb.ty.row_bytes(ne as u64).unwrap() as usize;
    let mut inp = vec![0.0f32; n * ne];
    for (t, &tok) in tokens.iter().enumerate() {
        get_row(
            emb.ty,
            &emb.data[tok as usize * rb..(tok as usize + 1) * rb],
            &mut inp[t * ne..(t + 1) * ne],
        );
    }
    rms_norm_rows(&mut inp, ne, None, m.eps);

    let post_eps = 1e-8f32;
    let mut n_rows = n;
    for il in 0..m.n_layer {
        let p = |s: &str| format!("blk.{il}.{s}.weight");
        let inp_sa = inp.clone();
        let mut cur = vec![0.0f32; n_rows * ne];
        let an = m.vec(&p("attn_norm"));
        for (x, o) in inp.chunks(ne).zip(cur.chunks_mut(ne)) {
            rms_norm_mul(x, &an, m.eps, o);
        }
        let mut q = mm(&m.w(&p("attn_q")), &cur, n_rows);
        let mut k = mm(&m.w(&p("attn_k")), &cur, n_rows);
        let v = mm(&m.w(&p("attn_v")), &cur, n_rows);
        let mut gate = mm(&m.w(&p("attn_gate")), &cur, n_rows);
        rms_norm_rows(&mut q, hd, Some(&m.vec(&p("attn_q_norm"))), m.eps);
        rms_norm_rows(&mut k, hd, Some(&m.vec(&p("attn_k_norm"))), m.eps);
        let is_swa = m.swa[il];
        if is_swa {
            for t in 0..n {
                rope_norm(
                    &mut q[t * nh * hd..(t + 1) * nh * hd],
                    hd,
                    positions[t],
                    m.freq_base_swa,
                );
                rope_norm(
                    &mut k[t * nkv * hd..(t + 1) * nkv * hd],
                    hd,
                    positions[t],
                    m.freq_base_swa,
                );
            }
        }
        // KV store, then attention over the layer's cache
        let (pl, layout) = if is_swa {
            (&swa, &st.layout.swa)
        } else {
            (&full, &st.layout.full)
        };
        let krb = kv_row_bytes(st.kv_type, nkv * hd);
        let cache = &mut st.caches[il];
        for t in 0..n {
            let s = pl.slots[t];
            cache.k[s] = vec![0u8; krb];
            cache.v[s] = vec![0u8; krb];
            store_kv_row(
                st.kv_type,
                &k[t * nkv * hd..(t + 1) * nkv * hd],
                &mut cache.k[s],
            );
            store_kv_row(
                st.kv_type,
                &v[t * nkv * hd..(t + 1) * nkv * hd],
                &mut cache.v[s],
            );
        }
        let keys: Vec<KvKey> = layout
            .cells()
            .map(|(slot, pos)| KvKey {
                slot,
                pos,
                k: &cache.k[slot],
                v: &cache.v[slot],
            })
            .collect();
        let params = AttnParams {
            n_head: nh,
            n_head_kv: nkv,
            head_dim: hd,
            k_type: st.kv_type,
            v_type: st.kv_type,
            n_kv: pl.n_kv,
            n_swa: is_swa.then_some(m.n_swa),
            scale: 1.0f32 / (hd as f32).sqrt(),
        };
        let mut attn = vec![0.0f32; n * nh * hd];
        muser_engine::cpu::ggml::attention(&params, &q, &positions, &keys, &mut attn);
        sigmoid(&mut gate);
        mul(&mut attn, &gate);
        let o = mm(&m.w(&p("attn_output")), &attn, n);
        let pn = m.vec(&p("post_attention_norm"));
        let mut cur = vec![0.0f32; n * ne];
        for (x, y) in o.chunks(ne).zip(cur.chunks_mut(ne)) {
            rms_norm_mul(x, &pn, post_eps, y);
        }
        // inp_out_ids: the last layer keeps only the output rows (the last n_out tokens here)
        let mut inp_sa = inp_sa;
        if il == m.n_layer - 1 {
            n_rows = n_out;
            cur = cur[(n - n_out) * ne..].to_vec();
            inp_sa = inp_sa[(n - n_out) * ne..].to_vec();
        }
        add(&mut cur, &inp_sa);
        let ffn_inp = cur;
        let fnw = m.vec(&p("ffn_norm"));
        let mut h = vec![0.0f32; n_rows * ne];
        for (x, y) in ffn_inp.chunks(ne).zip(h.chunks_mut(ne)) {
            rms_norm_mul(x, &fnw, m.eps, y);
        }
        let up_w = m.w(&p("ffn_up"));
        let up = mm(&up_w, &h, n_rows);
        let g = mm(&m.w(&p("ffn_gate")), &h, n_rows);
        let n_ff = up_w.rows;
        let mut act = vec![0.0f32; n_rows * n_ff];
        for r in 0..n_rows {
            swiglu_row(
                &g[r * n_ff..(r + 1) * n_ff],
                &up[r * n_ff..(r + 1) * n_ff],
                &mut act[r * n_ff..(r + 1) * n_ff],
            );
        }
        let down = mm(&m.w(&p("ffn_down")), &act, n_rows);
        let pf = m.vec(&p("post_ffw_norm"));
        let mut out = vec![0.0f32; n_rows * ne];
        for (x, y) in down.chunks(ne).zip(out.chunks_mut(ne)) {
            rms_norm_mul(x, &pf, post_eps, y);
        }
        add(&mut out, &ffn_inp);
        inp = out;
    }
    let onw = m.vec("output_norm.weight");
    let mut h = vec![0.0f32; n_rows * ne];
    for (x, y) in inp.chunks(ne).zip(h.chunks_mut(ne)) {
        rms_norm_mul(x, &onw, m.eps, y);
    }
    let mut logits = mm(&m.w("output.weight"), &h, n_rows);
    scale(&mut logits, m.logit_scale);
    if let Some(c) = m.softcap {
        softcap(&mut logits, c);
    }
    logits
}

/// The first `"key": <integer>` of a JSON text.
fn json_usize(text: &str, key: &str) -> Option<usize> {
    let i = text.find(&format!("\"{key}\":"))?;
    let rest = text[i + key.len() + 3..].trim_start();
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

fn read_f32(p: &PathBuf) -> Vec<f32> {
    std::fs::read(p)
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn read_i32(p: &PathBuf) -> Vec<i32> {
    std::fs::read(p)
        .unwrap()
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn log_softmax(x: &[f32]) -> Vec<f64> {
    let m = x.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64));
    let s: f64 = x.iter().map(|&v| ((v as f64) - m).exp()).sum();
    x.iter().map(|&v| (v as f64) - m - s.ln()).collect()
}

fn argmax(x: &[f32]) -> i32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as i32
}

fn run_fixture(name: &str, kv: &str) -> (usize, f64, bool) {
    let fix = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
    let g = Gguf::open(fix.join(format!("models/{name}.gguf"))).unwrap();
    let m = Model::load(&g);
    let tokens = read_i32(&fix.join(format!("golden/{name}/tokens.i32")));
    let want = read_f32(&fix.join(format!("golden/{name}/llama-{kv}.f32")));
    let greedy_want = read_i32(&fix.join(format!("golden/{name}/greedy-{kv}.i32")));
    let kv_type = if kv == "kv_f16" {
        GgmlType::F16
    } else {
        GgmlType::F32
    };
    // the llama_logits.c run config of the manifest (n_ctx 256, n_batch = n_ubatch = 256 when written)
    let manifest = std::fs::read_to_string(fix.join("manifest.json")).unwrap_or_default();
    let n_ctx = json_usize(&manifest, "n_ctx").unwrap_or(256);
    let n_ubatch = json_usize(&manifest, "n_ubatch_effective").unwrap_or(256);
    assert!(
        tokens.len() <= n_ubatch,
        "the prompt is one ubatch in llama_logits.c's run"
    );
    let mut st = State {
        layout: IswaLayout::new(n_ctx, m.n_swa, n_ubatch),
        caches: (0..m.n_layer)
            .map(|_| LayerCache {
                k: vec![Vec::new(); n_ctx.next_multiple_of(256)],
                v: vec![Vec::new(); n_ctx.next_multiple_of(256)],
            })
            .collect(),
        kv_type,
    };
    let n = tokens.len();
    let got = forward(&m, &mut st, &tokens, 0, n);
    assert_eq!(got.len(), want.len());
    let diff_bits = got
        .iter()
        .zip(&want)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    let mut max_d = 0.0f64;
    for (gr, wr) in got.chunks(m.n_vocab).zip(want.chunks(m.n_vocab)) {
        for (a, b) in log_softmax(gr).iter().zip(log_softmax(wr)) {
            max_d = max_d.max((a - b).abs());
        }
    }
    // greedy: one token per decode
    let mut next = argmax(&got[(n - 1) * m.n_vocab..]);
    let mut ids = vec![next];
    for i in 1..greedy_want.len() {
        let l = forward(&m, &mut st, &[next], (n + i - 1) as i32, 1);
        next = argmax(&l);
        ids.push(next);
    }
    (diff_bits, max_d, ids == greedy_want)
}

#[test]
fn fixtures_match_llama_cpp_bit_for_bit() {
    let fix = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
    // every fixture with a model and llama.cpp goldens (tests/fixtures/README.md)
    let mut names: Vec<String> = std::fs::read_dir(fix.join("golden"))
        .expect("tests/fixtures/golden")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| {
            fix.join(format!("models/{n}.gguf")).exists()
                && fix.join(format!("golden/{n}/tokens.i32")).exists()
        })
        .collect();
    names.sort();
    assert!(
        !names.is_empty(),
        "no fixture models found in tests/fixtures"
    );
    let mut report = Vec::new();
    let mut ok = true;
    for name in &names {
        for kv in ["kv_f32", "kv_f16"] {
            if !fix.join(format!("golden/{name}/llama-{kv}.f32")).exists() {
                continue;
            }
            let (bad, d, greedy) = run_fixture(name, kv);
            ok &= bad == 0 && greedy;
            report.push(format!(
                "{name} {kv}: {bad} logits differ, max |dlogsoftmax| {d:.3e}, greedy {}",
                if greedy { "same" } else { "DIFFERENT" }
            ));
        }
    }
    println!("{}", report.join("\n"));
    assert!(ok, "{}", report.join("\n"));
}
