//! Muse Glimmer hyper-parameters, read from GGUF keys and refused when not understood.
//!
//! The keys are those `llama_model_muse_glimmer::load_arch_hparams` (src/models/muse-glimmer.cpp)
//! and the generic loader read, as written by `conversion/muse_glimmer.py` (llama.cpp b11434).
//! Where llama.cpp defaults a missing key (the sliding-window pattern defaults to period 4),
//! Muser refuses: a silently defaulted layer partition runs and produces fluent, wrong text.

use muser_gguf::{Array, Gguf, Value};

use crate::error::{Error, Result};

/// The architecture name in `general.architecture`.
pub const ARCH: &str = "muse-glimmer";

/// Epsilon of the two post norms (post-attention, post-FFN). Not in the GGUF: llama.cpp's graph
/// hard-codes it (`src/models/muse-glimmer.cpp`: `const float post_norm_eps = 1e-8f;`), matching
/// transformers' `MuseGlimmerTextConfig.post_norm_eps = 1e-8`.
pub const POST_NORM_EPS: f32 = 1e-8;

/// What one layer's attention is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerKind {
    /// Sliding-window attention with RoPE (`is_swa(il)` in llama.cpp).
    SlidingRope,
    /// Full causal attention without positional rotation.
    FullNope,
}

impl LayerKind {
    /// RoPE runs iff the layer is a sliding layer (muse-glimmer.cpp: `const bool use_rope = hparams.is_swa(il);`).
    pub const fn uses_rope(self) -> bool {
        matches!(self, Self::SlidingRope)
    }

    pub const fn is_sliding(self) -> bool {
        matches!(self, Self::SlidingRope)
    }

    pub const fn name(self) -> &'static str {
        match self {
            Self::SlidingRope => "sliding+rope",
            Self::FullNope => "full+nope",
        }
    }
}

/// The hyper-parameters of a Muse Glimmer GGUF.
#[derive(Clone, Debug, PartialEq)]
pub struct MuseConfig {
    pub n_vocab: usize,
    /// `context_length`: the training context, the most positions a sequence may use.
    pub n_ctx_train: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    /// `attention.key_length` == `attention.value_length` (llama.cpp asserts they are equal).
    pub head_dim: usize,
    /// `attention.layer_norm_rms_epsilon`: entry norm, the two pre norms, QK-norm, final norm.
    pub rms_eps: f32,
    /// `attention.sliding_window`.
    pub n_swa: usize,
    pub layer_kinds: Vec<LayerKind>,
    /// `rope.freq_base`.
    pub rope_freq_base: f32,
    /// `rope.freq_base_swa`, or `rope.freq_base` when absent (as llama.cpp); RoPE runs on
    /// sliding layers only, so this is the base actually used.
    pub rope_freq_base_swa: f32,
    /// `logit_scale` (transformers' `output_multiplier`).
    pub logit_scale: f32,
    /// `final_logit_softcapping`; `None` when it is 0 (llama.cpp then skips the cap). The key is
    /// required: where it is absent, llama.cpp b11434 caps at its default 30
    /// (`llama-hparams.h`: `f_final_logit_softcapping = 30.0f`, read as optional in
    /// `models/muse-glimmer.cpp`) while transformers would not cap at all, and the converter
    /// always writes it (`conversion/muse_glimmer.py`), so a file without it has no one meaning.
    pub softcap: Option<f32>,
}

/// Keys of the `muse-glimmer.` namespace that Muser understands. Any other key in that
/// namespace stops the load: it would be a hyper-parameter whose meaning the engine ignores.
const KNOWN_ARCH_KEYS: &[&str] = &[
    "context_length",
    "embedding_length",
    "feed_forward_length",
    "block_count",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "attention.layer_norm_rms_epsilon",
    "attention.sliding_window",
    "attention.sliding_window_pattern",
    "rope.freq_base",
    "rope.freq_base_swa",
    "rope.dimension_count",
    "logit_scale",
    "final_logit_softcapping",
    "vocab_size",
    "attention.causal",
    "rope.scaling.type",
];

fn key(name: &str) -> String {
    format!("{ARCH}.{name}")
}

fn get<'a>(g: &'a Gguf, name: &str) -> Result<&'a Value> {
    let k = key(name);
    g.get(&k)
        .ok_or_else(|| Error::Config(format!("required key '{k}' is missing")))
}

fn get_usize(g: &Gguf, name: &str) -> Result<usize> {
    let v = get(g, name)?;
    match v.as_i64() {
        Some(x) if x > 0 => usize::try_from(x)
            .map_err(|_| Error::Config(format!("key '{}' = {x} is too large", key(name)))),
        Some(x) => Err(Error::Config(format!(
            "key '{}' = {x}, expected a positive integer",
            key(name)
        ))),
        None => Err(Error::Config(format!(
            "key '{}' has type {}, expected an integer (per-layer arrays are not supported)",
            key(name),
            v.value_type().name()
        ))),
    }
}

fn get_f32(g: &Gguf, name: &str) -> Result<f32> {
    let v = get(g, name)?;
    match *v {
        Value::F32(x) if x.is_finite() => Ok(x),
        Value::F32(x) => Err(Error::Config(format!(
            "key '{}' = {x} is not finite",
            key(name)
        ))),
        _ => Err(Error::Config(format!(
            "key '{}' has type {}, expected f32",
            key(name),
            v.value_type().name()
        ))),
    }
}

fn get_opt_f32(g: &Gguf, name: &str) -> Result<Option<f32>> {
    if g.get(&key(name)).is_none() {
        return Ok(None);
    }
    get_f32(g, name).map(Some)
}

/// The layer partition llama.cpp's converter writes and the reference config implies:
/// full (NoPE) attention where `(n_layer - 1 - i) % 4 == 0`, sliding elsewhere.
pub fn reference_layer_kinds(n_layer: usize) -> Vec<LayerKind> {
    (0..n_layer)
        .map(|i| {
            if (n_layer - 1 - i) % 4 == 0 {
                LayerKind::FullNope
            } else {
                LayerKind::SlidingRope
            }
        })
        .collect()
}

impl MuseConfig {
    /// Read and validate the configuration. Every missing required key, wrong type or value
    /// the engine does not implement is an error naming the key.
    pub fn from_gguf(g: &Gguf) -> Result<Self> {
        // A split GGUF opened from its first file's path holds every shard's tensors
        // (`Gguf::open`); a single shard read any other way (an image in memory) holds part
        // of them, and would otherwise be refused for its missing tensors, a message that
        // hides the cause.
        if let Some(n) = muser_gguf::split::count(g)?
            && n > 1
            && g.n_shards() != n as usize
        {
            let no = g
                .get(muser_gguf::split::KEY_NO)
                .and_then(Value::as_i64)
                .map_or(String::new(), |i| {
                    format!(" (this is shard {} of them)", i.saturating_add(1))
                });
            return Err(Error::Config(format!(
                "this GGUF is one of {n} shards of a split model{no}, read alone: open the first shard's file (NAME-00001-of-{n:05}.gguf) and Muser finds the others beside it"
            )));
        }
        match g.get("general.architecture") {
            Some(Value::String(a)) if a == ARCH => {}
            Some(Value::String(a)) => {
                return Err(Error::Config(format!(
                    "general.architecture is {a:?}; Muser runs only '{ARCH}' (Muse Glimmer)"
                )));
            }
            Some(v) => {
                return Err(Error::Config(format!(
                    "general.architecture has type {}, expected a string",
                    v.value_type().name()
                )));
            }
            None => {
                return Err(Error::Config(
                    "required key 'general.architecture' is missing".into(),
                ));
            }
        }
        let prefix = format!("{ARCH}.");
        for (k, _) in g.metadata() {
            if let Some(rest) = k.strip_prefix(&prefix) {
                if !KNOWN_ARCH_KEYS.contains(&rest) {
                    return Err(Error::Config(format!(
                        "unknown key {k:?}: Muser cannot prove it computes what this key asks for, so it refuses the file"
                    )));
                }
            }
        }

        let n_layer = get_usize(g, "block_count")?;
        let n_embd = get_usize(g, "embedding_length")?;
        let n_ff = get_usize(g, "feed_forward_length")?;
        let n_head = get_usize(g, "attention.head_count")?;
        let n_head_kv = get_usize(g, "attention.head_count_kv")?;
        let key_len = get_usize(g, "attention.key_length")?;
        let value_len = get_usize(g, "attention.value_length")?;
        let n_ctx_train = get_usize(g, "context_length")?;
        let n_swa = get_usize(g, "attention.sliding_window")?;
        let rms_eps = get_f32(g, "attention.layer_norm_rms_epsilon")?;
        let rope_freq_base = get_f32(g, "rope.freq_base")?;
        let rope_freq_base_swa = get_opt_f32(g, "rope.freq_base_swa")?.unwrap_or(rope_freq_base);
        let logit_scale = get_f32(g, "logit_scale")?;
        let softcap = get_f32(g, "final_logit_softcapping")?;

        // Widths the kernels index with 32-bit integers, products that cannot wrap, positions that
        // stay below u32::MAX (the caches' empty-slot marker), and no more layers than the file
        // has tensors (each layer needs 14): a hostile header never sizes an allocation.
        let limit = i32::MAX as usize;
        for (name, v) in [
            ("embedding_length", Some(n_embd)),
            ("feed_forward_length", Some(n_ff)),
            (
                "attention.head_count x attention.key_length",
                n_head.checked_mul(key_len),
            ),
            (
                "attention.head_count_kv x attention.key_length",
                n_head_kv.checked_mul(key_len),
            ),
            ("context_length", Some(n_ctx_train)),
            ("attention.sliding_window", Some(n_swa)),
        ] {
            match v {
                Some(v) if v <= limit => {}
                _ => {
                    return Err(Error::Config(format!(
                        "{name} is larger than {limit}, the most the kernels index"
                    )));
                }
            }
        }
        if n_layer.saturating_mul(14) > g.tensors().len() {
            return Err(Error::Config(format!(
                "block_count = {n_layer}, but the file holds only {} tensors (14 per layer and more)",
                g.tensors().len()
            )));
        }
        if key_len != value_len {
            return Err(Error::Config(format!(
                "attention.key_length ({key_len}) != attention.value_length ({value_len}); the graph requires equal head sizes"
            )));
        }
        let head_dim = key_len;
        if head_dim % 2 != 0 {
            return Err(Error::Config(format!(
                "head size {head_dim} is odd; RoPE rotates pairs"
            )));
        }
        if n_head % n_head_kv != 0 {
            return Err(Error::Config(format!(
                "attention.head_count ({n_head}) is not a multiple of attention.head_count_kv ({n_head_kv})"
            )));
        }
        if !(logit_scale > 0.0) {
            return Err(Error::Config(format!(
                "logit_scale = {logit_scale}, expected > 0 (0 flattens the logits, a negative scale ranks them backwards)"
            )));
        }
        if !(rms_eps > 0.0) {
            return Err(Error::Config(format!(
                "attention.layer_norm_rms_epsilon = {rms_eps}, expected > 0"
            )));
        }
        if !(rope_freq_base > 0.0) || !(rope_freq_base_swa > 0.0) {
            return Err(Error::Config(format!(
                "rope.freq_base = {rope_freq_base} / rope.freq_base_swa = {rope_freq_base_swa}, expected > 0"
            )));
        }
        // llama.cpp treats 0 as "no cap"; any other non-positive value is meaningless.
        if !(softcap > 0.0) && softcap != 0.0 {
            return Err(Error::Config(format!(
                "final_logit_softcapping = {softcap}, expected > 0 (or 0: no cap)"
            )));
        }
        let softcap = Some(softcap).filter(|&c| c != 0.0);
        if let Some(v) = g.get(&key("rope.dimension_count")) {
            match v.as_i64() {
                Some(n) if n as usize == head_dim => {}
                _ => {
                    return Err(Error::Config(format!(
                        "rope.dimension_count = {}, but only full-head RoPE (= key_length {head_dim}) is implemented",
                        v.summary(4)
                    )));
                }
            }
        }
        if let Some(v) = g.get(&key("rope.scaling.type")) {
            if v.as_str() != Some("none") {
                return Err(Error::Config(format!(
                    "rope.scaling.type = {}; RoPE scaling is not implemented",
                    v.summary(4)
                )));
            }
        }
        if let Some(v) = g.get(&key("attention.causal")) {
            if v.as_bool() != Some(true) {
                return Err(Error::Config(format!(
                    "attention.causal = {}; Muse Glimmer is causal",
                    v.summary(4)
                )));
            }
        }

        // The layer partition: required, never defaulted.
        let pattern_key = key("attention.sliding_window_pattern");
        let pattern = match g.get(&pattern_key) {
            None => {
                return Err(Error::Config(format!(
                    "required key '{pattern_key}' is missing; llama.cpp would default to a period of 4, \
                     but a guessed layer partition runs and produces fluent, wrong text, so Muser refuses"
                )));
            }
            Some(Value::Array(Array::Bool(p))) => p.clone(),
            Some(v) => {
                return Err(Error::Config(format!(
                    "'{pattern_key}' has type {}{}, expected an array of bools",
                    v.value_type().name(),
                    v.as_array()
                        .map(|a| format!(" of {}", a.elem_type().name()))
                        .unwrap_or_default()
                )));
            }
        };
        if pattern.len() != n_layer {
            return Err(Error::Config(format!(
                "'{pattern_key}' has {} entries, but block_count is {n_layer}",
                pattern.len()
            )));
        }
        let layer_kinds: Vec<LayerKind> = pattern
            .iter()
            .map(|&s| {
                if s {
                    LayerKind::SlidingRope
                } else {
                    LayerKind::FullNope
                }
            })
            .collect();

        // The vocabulary size comes from the tokenizer's token list (as llama.cpp's n_vocab).
        let n_vocab = match g.get("tokenizer.ggml.tokens") {
            Some(Value::Array(a @ Array::String(_))) if !a.is_empty() => a.len(),
            Some(_) => {
                return Err(Error::Config(
                    "'tokenizer.ggml.tokens' is not a non-empty array of strings".into(),
                ));
            }
            None => {
                return Err(Error::Config(
                    "required key 'tokenizer.ggml.tokens' is missing".into(),
                ));
            }
        };
        if let Some(v) = g.get(&key("vocab_size")) {
            if v.as_i64() != Some(n_vocab as i64) {
                return Err(Error::Config(format!(
                    "vocab_size = {} disagrees with the {n_vocab} tokens of tokenizer.ggml.tokens",
                    v.summary(4)
                )));
            }
        }

        Ok(MuseConfig {
            n_vocab,
            n_ctx_train,
            n_embd,
            n_ff,
            n_layer,
            n_head,
            n_head_kv,
            head_dim,
            rms_eps,
            n_swa,
            layer_kinds,
            rope_freq_base,
            rope_freq_base_swa,
            logit_scale,
            softcap,
        })
    }

    /// Width of the query (and gate) projection: n_head * head_dim.
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Width of the key and value projections: n_head_kv * head_dim.
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// Softmax scale of attention: 1/sqrt(head_dim), as `kq_scale = 1.0f / sqrtf(float(n_embd_head))`.
    pub fn kq_scale(&self) -> f32 {
        1.0f32 / (self.head_dim as f32).sqrt()
    }

    /// Whether the layer partition is the reference one (every 4th layer from the last is full).
    pub fn has_reference_pattern(&self) -> bool {
        self.layer_kinds == reference_layer_kinds(self.n_layer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_pattern_of_the_30b() {
        let kinds = reference_layer_kinds(52);
        let full: Vec<usize> = kinds
            .iter()
            .enumerate()
            .filter(|(_, k)| **k == LayerKind::FullNope)
            .map(|(i, _)| i)
            .collect();
        assert_eq!(full.len(), 13);
        assert_eq!(full[0], 3);
        assert_eq!(*full.last().unwrap(), 51);
        assert!(full.iter().all(|i| i % 4 == 3));
        assert!(!LayerKind::FullNope.uses_rope());
        assert!(LayerKind::SlidingRope.uses_rope());
    }

    #[test]
    fn post_norm_epsilon_is_not_the_gguf_epsilon() {
        assert_eq!(POST_NORM_EPS, 1e-8f32);
        assert_ne!(POST_NORM_EPS, 1e-5f32);
    }
}
