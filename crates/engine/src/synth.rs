//! Synthetic Muse Glimmer GGUFs: the real shapes (or smaller presets) with random weights,
//! for speed measurements. Every quant block gets a sane f16 scale (never zeros, which can run
//! faster than real data and hide unwritten outputs), and the files load in llama.cpp.
//!
//! Layout `q4_k_m` follows llama.cpp's Q4_K_M recipe (`llama_tensor_get_type`): token_embd
//! Q4_K, output Q6_K, attn_v and ffn_down Q6_K on the "more bits" layers, Q4_K elsewhere.

use std::io::Write;
use std::path::Path;

use half::f16;
use muser_gguf::{Array, GgmlType, GgufWriter, Value};
use rayon::prelude::*;

use crate::config::{ARCH, reference_layer_kinds};
use crate::error::{Error, Result};
use crate::sampling::Rng;

/// Shapes of a synthetic model.
#[derive(Clone, Debug, PartialEq)]
pub struct Preset {
    pub name: &'static str,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_vocab: usize,
    pub n_ctx: usize,
    pub n_swa: usize,
}

pub const PRESETS: &[Preset] = &[
    // The released 30B (MUSE-GLIMMER.md).
    Preset {
        name: "30b",
        n_layer: 52,
        n_embd: 6656,
        n_ff: 19968,
        n_head: 32,
        n_head_kv: 2,
        head_dim: 128,
        n_vocab: 202_048,
        n_ctx: 131_072,
        n_swa: 2048,
    },
    // The mid-size model of the CPU comparison in H200.md.
    Preset {
        name: "mid",
        n_layer: 8,
        n_embd: 2048,
        n_ff: 5632,
        n_head: 16,
        n_head_kv: 2,
        head_dim: 128,
        n_vocab: 32_000,
        n_ctx: 131_072,
        n_swa: 2048,
    },
    Preset {
        name: "small",
        n_layer: 4,
        n_embd: 512,
        n_ff: 1536,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 128,
        n_vocab: 4096,
        n_ctx: 8192,
        n_swa: 256,
    },
];

pub fn preset(name: &str) -> Result<&'static Preset> {
    PRESETS.iter().find(|p| p.name == name).ok_or_else(|| {
        Error::Input(format!(
            "unknown preset '{name}' (known: {})",
            PRESETS
                .iter()
                .map(|p| p.name)
                .collect::<Vec<_>>()
                .join(", ")
        ))
    })
}

/// How matrices are stored: llama.cpp's Q4_K_M mix, or one format for every matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    Q4KM,
    Uniform(GgmlType),
}

impl Layout {
    pub fn parse(s: &str) -> Result<Self> {
        if s.eq_ignore_ascii_case("q4_k_m") {
            return Ok(Self::Q4KM);
        }
        match GgmlType::from_name(s) {
            Some(t) if crate::formats::is_supported(t) => Ok(Self::Uniform(t)),
            _ => Err(Error::Input(format!(
                "unknown layout '{s}' (q4_k_m, or one of f32, f16, bf16, q8_0, q4_0, q4_k, q5_k, q6_k)"
            ))),
        }
    }

    /// llama.cpp's `use_more_bits(i_layer, n_layers)`.
    fn more_bits(i: usize, n: usize) -> bool {
        i < n / 8 || i >= 7 * n / 8 || (i >= n / 8 && (i - n / 8) % 3 == 2)
    }

    fn ty(self, tensor: &str, layer: Option<usize>, n_layer: usize) -> GgmlType {
        match self {
            Self::Uniform(t) => t,
            Self::Q4KM => match (tensor, layer) {
                ("output", _) => GgmlType::Q6_K,
                ("attn_v", Some(i)) | ("ffn_down", Some(i)) if Self::more_bits(i, n_layer) => {
                    GgmlType::Q6_K
                }
                _ => GgmlType::Q4_K,
            },
        }
    }

    fn file_type(self) -> u32 {
        // llama_ftype values (llama.h).
        match self {
            Self::Q4KM => 15,
            Self::Uniform(GgmlType::F32) => 0,
            Self::Uniform(GgmlType::F16) => 1,
            Self::Uniform(GgmlType::Q4_0) => 2,
            Self::Uniform(GgmlType::Q8_0) => 7,
            Self::Uniform(GgmlType::Q4_K) => 14,
            Self::Uniform(GgmlType::Q5_K) => 17,
            Self::Uniform(GgmlType::Q6_K) => 18,
            Self::Uniform(GgmlType::BF16) => 32,
            Self::Uniform(_) => 0,
        }
    }
}

/// A pool of random blocks of one type, cycled through to fill tensors quickly.
struct Pool {
    bytes: Vec<u8>,
}

const POOL_BLOCKS: usize = 1 << 18;

fn make_pool(ty: GgmlType, seed: u64) -> Pool {
    let (_, bs) = ty.block_geometry();
    let n = POOL_BLOCKS * bs;
    let chunk = 1 << 16;
    let mut bytes = vec![0u8; n];
    bytes
        .par_chunks_mut(chunk * bs)
        .enumerate()
        .for_each(|(ci, out)| {
            let mut rng = Rng::new(seed ^ (ci as u64).wrapping_mul(0x9E37_79B9));
            for blk in out.chunks_exact_mut(bs) {
                fill_block(ty, blk, &mut rng);
            }
        });
    Pool { bytes }
}

fn put_f16(b: &mut [u8], at: usize, v: f32) {
    b[at..at + 2].copy_from_slice(&f16::from_f32(v).to_bits().to_le_bytes());
}

/// A random block with a sane scale: values of order 0.01-0.05, like trained weights.
fn fill_block(ty: GgmlType, b: &mut [u8], rng: &mut Rng) {
    for chunk in b.chunks_mut(8) {
        let r = rng.next_u64().to_le_bytes();
        chunk.copy_from_slice(&r[..chunk.len()]);
    }
    let gauss = |rng: &mut Rng| -> f32 {
        // Sum of 4 uniforms: cheap, roughly normal, unit-ish variance.
        ((0..4).map(|_| rng.next_f64()).sum::<f64>() - 2.0) as f32 * 1.7
    };
    match ty {
        GgmlType::F32 => {
            let v = 0.02 * gauss(rng);
            b.copy_from_slice(&v.to_le_bytes());
        }
        GgmlType::F16 | GgmlType::BF16 => {
            let v = 0.02 * gauss(rng);
            let bits = if ty == GgmlType::F16 {
                f16::from_f32(v).to_bits()
            } else {
                half::bf16::from_f32(v).to_bits()
            };
            b.copy_from_slice(&bits.to_le_bytes());
        }
        GgmlType::Q8_0 => put_f16(b, 0, 3e-4 * (1.0 + 0.2 * gauss(rng)).abs()),
        GgmlType::Q4_0 => put_f16(b, 0, 6e-3 * (1.0 + 0.2 * gauss(rng)).abs()),
        GgmlType::Q4_K | GgmlType::Q5_K => {
            put_f16(b, 0, 2e-3 * (1.0 + 0.2 * gauss(rng)).abs());
            put_f16(b, 2, 1e-3 * (1.0 + 0.2 * gauss(rng)).abs());
        }
        GgmlType::Q6_K => put_f16(b, 208, 1e-4 * (1.0 + 0.2 * gauss(rng)).abs()),
        _ => {}
    }
}

/// Write a synthetic model of `preset` shapes in `layout` to `path`.
pub fn write(path: &Path, p: &Preset, layout: Layout, seed: u64) -> Result<()> {
    let mut w = GgufWriter::new();
    let kinds = reference_layer_kinds(p.n_layer);
    let k = |s: &str| format!("{ARCH}.{s}");
    let e = |r: muser_gguf::Result<()>| r.map_err(Error::from);
    e(w.add_str("general.architecture", ARCH))?;
    e(w.add_str(
        "general.name",
        &format!(
            "muse-glimmer synthetic {} ({}) random weights",
            p.name,
            layout_name(layout)
        ),
    ))?;
    e(w.add_u32("general.file_type", layout.file_type()))?;
    e(w.add_u32("general.quantization_version", 2))?;
    e(w.add_u32(&k("context_length"), p.n_ctx as u32))?;
    e(w.add_u32(&k("embedding_length"), p.n_embd as u32))?;
    e(w.add_u32(&k("feed_forward_length"), p.n_ff as u32))?;
    e(w.add_u32(&k("block_count"), p.n_layer as u32))?;
    e(w.add_u32(&k("attention.head_count"), p.n_head as u32))?;
    e(w.add_u32(&k("attention.head_count_kv"), p.n_head_kv as u32))?;
    e(w.add_u32(&k("attention.key_length"), p.head_dim as u32))?;
    e(w.add_u32(&k("attention.value_length"), p.head_dim as u32))?;
    e(w.add_f32(&k("attention.layer_norm_rms_epsilon"), 1e-5))?;
    e(w.add_f32(&k("rope.freq_base"), 500_000.0))?;
    e(w.add_u32(&k("attention.sliding_window"), p.n_swa as u32))?;
    e(w.add_array(
        &k("attention.sliding_window_pattern"),
        Array::Bool(kinds.iter().map(|k| k.is_sliding()).collect()),
    ))?;
    e(w.add_f32(&k("logit_scale"), 0.196_116_14))?;
    e(w.add_f32(&k("final_logit_softcapping"), 20.0))?;
    // A byte-level vocabulary padded with placeholder tokens: enough for loaders and benches.
    let mut tokens: Vec<String> = byte_tokens();
    tokens.push("ab".into());
    while tokens.len() < p.n_vocab {
        tokens.push(format!("t{}", tokens.len()));
    }
    tokens.truncate(p.n_vocab);
    e(w.add_str("tokenizer.ggml.model", "gpt2"))?;
    e(w.add_str("tokenizer.ggml.pre", "llama4"))?;
    e(w.add_array("tokenizer.ggml.tokens", Array::String(tokens)))?;
    e(w.add_array("tokenizer.ggml.token_type", Array::I32(vec![1; p.n_vocab])))?;
    e(w.add_array("tokenizer.ggml.merges", Array::String(vec!["a b".into()])))?;
    e(w.add(
        "tokenizer.ggml.bos_token_id",
        Value::U32(p.n_vocab.min(200_000).saturating_sub(2) as u32),
    ))?;
    e(w.add(
        "tokenizer.ggml.eos_token_id",
        Value::U32((p.n_vocab.min(200_001) - 1) as u32),
    ))?;
    // The end of a turn (the 30B's <|eot|> id where the vocabulary reaches it).
    e(w.add(
        "tokenizer.ggml.eot_token_id",
        Value::U32((p.n_vocab.min(200_002) - 1) as u32),
    ))?;

    let (qd, kvd) = (p.n_head * p.head_dim, p.n_head_kv * p.head_dim);
    let mut mats: Vec<(String, GgmlType)> = Vec::new();
    let mut add_mat =
        |w: &mut GgufWriter, name: String, cols: usize, rows: usize, ty: GgmlType| -> Result<()> {
            w.add_tensor_deferred(&name, &[cols as u64, rows as u64], ty)?;
            mats.push((name, ty));
            Ok(())
        };
    let vec = |w: &mut GgufWriter, name: &str, n: usize, v: f32| -> Result<()> {
        w.add_f32_tensor(name, &[n as u64], &vec![v; n])
            .map_err(Error::from)
    };
    add_mat(
        &mut w,
        "token_embd.weight".into(),
        p.n_embd,
        p.n_vocab,
        layout.ty("token_embd", None, p.n_layer),
    )?;
    vec(&mut w, "output_norm.weight", p.n_embd, 1.0)?;
    add_mat(
        &mut w,
        "output.weight".into(),
        p.n_embd,
        p.n_vocab,
        layout.ty("output", None, p.n_layer),
    )?;
    for i in 0..p.n_layer {
        let n = |s: &str| format!("blk.{i}.{s}.weight");
        vec(&mut w, &n("attn_norm"), p.n_embd, 1.0)?;
        vec(&mut w, &n("post_attention_norm"), p.n_embd, 1.0)?;
        vec(&mut w, &n("ffn_norm"), p.n_embd, 1.0)?;
        vec(&mut w, &n("post_ffw_norm"), p.n_embd, 1.0)?;
        vec(&mut w, &n("attn_q_norm"), p.head_dim, 3.87)?;
        vec(&mut w, &n("attn_k_norm"), p.head_dim, 1.0)?;
        let t = |s: &str| layout.ty(s, Some(i), p.n_layer);
        add_mat(&mut w, n("attn_q"), p.n_embd, qd, t("attn_q"))?;
        add_mat(&mut w, n("attn_k"), p.n_embd, kvd, t("attn_k"))?;
        add_mat(&mut w, n("attn_v"), p.n_embd, kvd, t("attn_v"))?;
        add_mat(&mut w, n("attn_gate"), p.n_embd, qd, t("attn_gate"))?;
        add_mat(&mut w, n("attn_output"), qd, p.n_embd, t("attn_output"))?;
        add_mat(&mut w, n("ffn_gate"), p.n_embd, p.n_ff, t("ffn_gate"))?;
        add_mat(&mut w, n("ffn_up"), p.n_embd, p.n_ff, t("ffn_up"))?;
        add_mat(&mut w, n("ffn_down"), p.n_ff, p.n_embd, t("ffn_down"))?;
    }
    let mut types: Vec<GgmlType> = mats.iter().map(|(_, t)| *t).collect();
    types.sort_by_key(|t| t.id());
    types.dedup();
    let pools: Vec<(GgmlType, Pool)> = types
        .iter()
        .enumerate()
        .map(|(i, &t)| (t, make_pool(t, seed.wrapping_add(i as u64 * 7919))))
        .collect();
    let mut offsets: std::collections::HashMap<GgmlType, usize> = Default::default();
    w.write_with(path, |name, n_bytes, out: &mut dyn Write| {
        let ty = mats
            .iter()
            .find(|(m, _)| m == name)
            .map(|(_, t)| *t)
            .ok_or_else(|| {
                std::io::Error::other(format!("no synthetic source for tensor {name}"))
            })?;
        let pool = &pools
            .iter()
            .find(|(t, _)| *t == ty)
            .ok_or_else(|| std::io::Error::other("pool"))?
            .1
            .bytes;
        let off = offsets.entry(ty).or_default();
        let mut left = n_bytes as usize;
        let bs = ty.type_size();
        while left > 0 {
            let take = left.min(pool.len() - *off);
            out.write_all(&pool[*off..*off + take])?;
            left -= take;
            // Advance by a block-aligned stride so consecutive tensors start at other blocks.
            *off = (*off + take) % pool.len() / bs * bs;
        }
        Ok(())
    })?;
    Ok(())
}

fn layout_name(l: Layout) -> String {
    match l {
        Layout::Q4KM => "q4_k_m".into(),
        Layout::Uniform(t) => t.name().into(),
    }
}

/// GPT-2's byte-to-unicode table: the 256 byte tokens of a byte-level BPE.
fn byte_tokens() -> Vec<String> {
    let mut bs: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut cs = bs.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !bs.contains(&b) {
            bs.push(b);
            cs.push(256 + n);
            n += 1;
        }
    }
    let mut pairs: Vec<(u32, u32)> = bs.into_iter().zip(cs).collect();
    pairs.sort();
    pairs
        .into_iter()
        .map(|(_, c)| char::from_u32(c).map(String::from).unwrap_or_default())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loader::ModelFile;

    #[test]
    fn q4_k_m_recipe_matches_llama_cpp_for_52_layers() {
        let more: Vec<usize> = (0..52).filter(|&i| Layout::more_bits(i, 52)).collect();
        // n/8 = 6: layers 0-5, 45-51, and every third from 8.
        assert_eq!(&more[..7], &[0, 1, 2, 3, 4, 5, 8]);
        assert!(
            more.contains(&51) && more.contains(&45) && more.contains(&44) && !more.contains(&43)
        );
    }

    #[test]
    fn a_synthetic_model_loads_and_passes_the_probes() {
        let dir = std::env::temp_dir().join(format!("muser-synth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = Preset {
            name: "t",
            n_layer: 5,
            n_embd: 256,
            n_ff: 512,
            n_head: 4,
            n_head_kv: 2,
            head_dim: 64,
            n_vocab: 300,
            n_ctx: 512,
            n_swa: 16,
        };
        for layout in [
            Layout::Q4KM,
            Layout::Uniform(GgmlType::Q8_0),
            Layout::Uniform(GgmlType::BF16),
        ] {
            let path = dir.join("m.gguf");
            write(&path, &p, layout, 1).unwrap();
            let f = ModelFile::open(&path).unwrap();
            assert_eq!(f.config.n_layer, 5);
            assert_eq!(f.probes.qk_scale, 3.87);
            if layout == Layout::Q4KM {
                assert_eq!(f.tensors.output.ty, GgmlType::Q6_K);
                assert_eq!(f.tensors.layers[4].attn_v.ty, GgmlType::Q6_K);
                assert_eq!(f.tensors.layers[0].attn_v.ty, GgmlType::Q4_K);
                assert_eq!(f.tensors.layers[2].attn_q.ty, GgmlType::Q4_K);
            }
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}
