//! The loader refuses every malformed input with a message naming the key or tensor and what
//! was expected. Each case edits a valid fixture and rebuilds it with the GGUF writer.

mod common;

use std::sync::Arc;

use muser_engine::ModelFile;
use muser_gguf::{Array, GgmlType, Gguf, GgufWriter, Value};

struct Tensor {
    name: String,
    dims: Vec<u64>,
    ty: GgmlType,
    data: Vec<u8>,
}

fn parts() -> (Vec<(String, Value)>, Vec<Tensor>) {
    let g = Gguf::open(common::model_path("tame-q4_k_m")).unwrap();
    let kv = g.metadata().to_vec();
    let ts = g
        .tensors()
        .iter()
        .map(|t| Tensor {
            name: t.name.clone(),
            dims: t.dims.clone(),
            ty: t.ggml_type,
            data: g.tensor_data(t).to_vec(),
        })
        .collect();
    (kv, ts)
}

fn build(kv: &[(String, Value)], ts: &[Tensor]) -> Result<ModelFile, String> {
    let mut w = GgufWriter::new();
    for (k, v) in kv {
        w.add(k, v.clone()).unwrap();
    }
    for t in ts {
        w.add_tensor(&t.name, &t.dims, t.ty, t.data.clone())
            .unwrap();
    }
    let g = Gguf::from_bytes(w.to_bytes().unwrap()).map_err(|e| e.to_string())?;
    ModelFile::from_gguf(Arc::new(g)).map_err(|e| e.to_string())
}

fn refuses(kv: &[(String, Value)], ts: &[Tensor], needles: &[&str]) {
    match build(kv, ts) {
        Ok(_) => panic!("accepted a file that should be refused ({needles:?})"),
        Err(e) => {
            for n in needles {
                assert!(e.contains(n), "error {e:?} does not mention {n:?}");
            }
        }
    }
}

fn set(kv: &mut Vec<(String, Value)>, key: &str, v: Value) {
    match kv.iter_mut().find(|(k, _)| k == key) {
        Some(slot) => slot.1 = v,
        None => kv.push((key.into(), v)),
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn the_unedited_fixture_loads() {
    let (kv, ts) = parts();
    assert!(build(&kv, &ts).is_ok());
}

#[test]
fn every_required_key_is_required() {
    let (kv, ts) = parts();
    for key in [
        "general.architecture",
        "muse-glimmer.context_length",
        "muse-glimmer.embedding_length",
        "muse-glimmer.feed_forward_length",
        "muse-glimmer.block_count",
        "muse-glimmer.attention.head_count",
        "muse-glimmer.attention.head_count_kv",
        "muse-glimmer.attention.key_length",
        "muse-glimmer.attention.value_length",
        "muse-glimmer.attention.layer_norm_rms_epsilon",
        "muse-glimmer.attention.sliding_window",
        "muse-glimmer.attention.sliding_window_pattern",
        "muse-glimmer.rope.freq_base",
        "muse-glimmer.logit_scale",
        "muse-glimmer.final_logit_softcapping",
        "tokenizer.ggml.tokens",
    ] {
        let kv2: Vec<_> = kv.iter().filter(|(k, _)| k != key).cloned().collect();
        refuses(&kv2, &ts, &[key, "missing"]);
    }
}

/// A shard of a split GGUF is named as such, with what to do, not refused for its missing
/// tensors; `split.count` 1 (a whole file) loads.
#[test]
fn a_split_shard_is_named() {
    let (mut kv, ts) = parts();
    set(&mut kv, "split.count", Value::U16(1));
    set(&mut kv, "split.no", Value::U16(0));
    assert!(build(&kv, &ts).is_ok());
    set(&mut kv, "split.count", Value::U16(3));
    set(&mut kv, "split.no", Value::U16(1));
    let half: Vec<Tensor> = ts.iter().take(ts.len() / 2).map(clone).collect();
    refuses(
        &kv,
        &half,
        &["one of 3 shards", "shard 2", "open the first shard"],
    );
}

#[test]
fn the_sliding_window_pattern_is_never_defaulted() {
    let (kv, ts) = parts();
    let key = "muse-glimmer.attention.sliding_window_pattern";
    let kv2: Vec<_> = kv.iter().filter(|(k, _)| k != key).cloned().collect();
    refuses(&kv2, &ts, &[key, "refuses"]);
    let mut kv3 = kv.clone();
    set(&mut kv3, key, Value::Array(Array::Bool(vec![true; 4])));
    refuses(&kv3, &ts, &[key, "4 entries", "block_count is 3"]);
    let mut kv4 = kv.clone();
    set(&mut kv4, key, Value::Array(Array::I32(vec![1; 5])));
    refuses(&kv4, &ts, &[key, "array of bools"]);
}

#[test]
fn wrong_types_and_values_are_named() {
    let (kv, ts) = parts();
    let mut a = kv.clone();
    set(
        &mut a,
        "muse-glimmer.block_count",
        Value::String("five".into()),
    );
    refuses(
        &a,
        &ts,
        &["muse-glimmer.block_count", "expected an integer"],
    );
    let mut b = kv.clone();
    set(
        &mut b,
        "general.architecture",
        Value::String("llama".into()),
    );
    refuses(&b, &ts, &["\"llama\"", "muse-glimmer"]);
    let mut c = kv.clone();
    set(
        &mut c,
        "muse-glimmer.attention.layer_norm_rms_epsilon",
        Value::F64(1e-5),
    );
    refuses(&c, &ts, &["layer_norm_rms_epsilon", "expected f32"]);
    let mut d = kv.clone();
    set(&mut d, "muse-glimmer.expert_count", Value::U32(8));
    refuses(&d, &ts, &["unknown key \"muse-glimmer.expert_count\""]);
    let mut e = kv.clone();
    set(&mut e, "muse-glimmer.rope.dimension_count", Value::U32(32));
    refuses(&e, &ts, &["rope.dimension_count", "full-head"]);
    let mut f = kv.clone();
    set(
        &mut f,
        "muse-glimmer.attention.value_length",
        Value::U32(128),
    );
    refuses(&f, &ts, &["key_length", "value_length"]);
}

/// A hostile header never sizes an allocation or wraps a width: head counts whose product with
/// the head size overflows, more layers than the file has tensors, a context past u32 positions.
/// And values that would compute something else quietly: a logit scale of 0 or below, a token
/// list that is not strings.
#[test]
fn sizes_that_wrap_or_overreach_and_meaningless_scales_are_refused() {
    let (kv, ts) = parts();
    let mut a = kv.clone();
    for k in ["attention.head_count", "attention.head_count_kv"] {
        set(&mut a, &format!("muse-glimmer.{k}"), Value::U64(1 << 62));
    }
    for k in ["attention.key_length", "attention.value_length"] {
        set(&mut a, &format!("muse-glimmer.{k}"), Value::U32(4));
    }
    refuses(
        &a,
        &ts,
        &["attention.head_count x attention.key_length", "larger than"],
    );
    let mut b = kv.clone();
    set(&mut b, "muse-glimmer.block_count", Value::U64(100_000_000));
    refuses(&b, &ts, &["block_count = 100000000", "tensors"]);
    let mut c = kv.clone();
    set(&mut c, "muse-glimmer.context_length", Value::U64(1 << 40));
    refuses(&c, &ts, &["context_length", "larger than"]);
    for scale in [0.0f32, -0.5] {
        let mut d = kv.clone();
        set(&mut d, "muse-glimmer.logit_scale", Value::F32(scale));
        refuses(&d, &ts, &["logit_scale", "expected > 0"]);
    }
    let mut e = kv.clone();
    let n = match kv.iter().find(|(k, _)| k == "tokenizer.ggml.tokens") {
        Some((_, Value::Array(a))) => a.len(),
        _ => panic!("the fixture has tokens"),
    };
    set(
        &mut e,
        "tokenizer.ggml.tokens",
        Value::Array(Array::U8(vec![0; n])),
    );
    refuses(&e, &ts, &["tokenizer.ggml.tokens", "array of strings"]);
}

#[test]
fn missing_unexpected_misshapen_and_mistyped_tensors_are_named() {
    let (kv, ts) = parts();
    let without: Vec<Tensor> = ts
        .iter()
        .filter(|t| t.name != "blk.2.attn_gate.weight")
        .map(clone)
        .collect();
    refuses(&kv, &without, &["blk.2.attn_gate.weight", "missing"]);

    let mut extra: Vec<Tensor> = ts.iter().map(clone).collect();
    extra.push(Tensor {
        name: "rope_freqs.weight".into(),
        dims: vec![32],
        ty: GgmlType::F32,
        data: f32_bytes(&[1.0; 32]),
    });
    refuses(&kv, &extra, &["unexpected", "rope_freqs.weight"]);

    let mut misshapen: Vec<Tensor> = ts.iter().map(clone).collect();
    let k = clone(
        misshapen
            .iter()
            .find(|t| t.name == "blk.1.attn_k.weight")
            .unwrap(),
    );
    let q = misshapen
        .iter_mut()
        .find(|t| t.name == "blk.1.attn_q.weight")
        .unwrap();
    (q.dims, q.ty, q.data) = (k.dims, k.ty, k.data);
    refuses(
        &kv,
        &misshapen,
        &[
            "blk.1.attn_q.weight",
            "shape [256, 64]",
            "expected [256, 256]",
        ],
    );

    let mut q41: Vec<Tensor> = ts.iter().map(clone).collect();
    let t = q41
        .iter_mut()
        .find(|t| t.name == "blk.0.attn_q.weight")
        .unwrap();
    t.ty = GgmlType::Q4_1;
    t.data = vec![0u8; (t.dims[0] * t.dims[1] / 32 * 20) as usize];
    refuses(
        &kv,
        &q41,
        &["blk.0.attn_q.weight", "q4_1", "does not implement"],
    );

    let mut f16norm: Vec<Tensor> = ts.iter().map(clone).collect();
    let t = f16norm
        .iter_mut()
        .find(|t| t.name == "blk.2.ffn_norm.weight")
        .unwrap();
    t.ty = GgmlType::F16;
    t.data = vec![0u8; t.data.len() / 2];
    refuses(&kv, &f16norm, &["blk.2.ffn_norm.weight", "expected f32"]);

    let mut nan: Vec<Tensor> = ts.iter().map(clone).collect();
    let t = nan
        .iter_mut()
        .find(|t| t.name == "output_norm.weight")
        .unwrap();
    t.data[8..12].copy_from_slice(&f32::NAN.to_le_bytes());
    refuses(&kv, &nan, &["output_norm.weight", "not finite"]);
}

#[test]
fn a_learned_qk_norm_is_refused() {
    let (kv, ts) = parts();
    let mut learned: Vec<Tensor> = ts.iter().map(clone).collect();
    let t = learned
        .iter_mut()
        .find(|t| t.name == "blk.1.attn_q_norm.weight")
        .unwrap();
    let mut v: Vec<f32> = t
        .data
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    v[5] *= 1.01;
    t.data = f32_bytes(&v);
    refuses(
        &kv,
        &learned,
        &["blk.1.attn_q_norm.weight", "not a constant broadcast"],
    );

    let mut k: Vec<Tensor> = ts.iter().map(clone).collect();
    let t = k
        .iter_mut()
        .find(|t| t.name == "blk.0.attn_k_norm.weight")
        .unwrap();
    t.data[0..4].copy_from_slice(&0.5f32.to_le_bytes());
    refuses(&kv, &k, &["blk.0.attn_k_norm.weight", "all ones"]);

    let mut other: Vec<Tensor> = ts.iter().map(clone).collect();
    let t = other
        .iter_mut()
        .find(|t| t.name == "blk.2.attn_q_norm.weight")
        .unwrap();
    let n = t.data.len() / 4;
    t.data = f32_bytes(&vec![2.0; n]);
    refuses(&kv, &other, &["blk.2.attn_q_norm.weight", "layer 0"]);
}

fn clone(t: &Tensor) -> Tensor {
    Tensor {
        name: t.name.clone(),
        dims: t.dims.clone(),
        ty: t.ty,
        data: t.data.clone(),
    }
}
