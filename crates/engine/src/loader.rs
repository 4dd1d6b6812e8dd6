//! Opening a Muse Glimmer GGUF: configuration, every tensor checked for presence, shape and
//! type, the QK-norm probe, and a refusal of any tensor the graph would not use.
//!
//! Shapes follow `llama_model_muse_glimmer::load_arch_tensors` (src/models/muse-glimmer.cpp),
//! in ggml order (`dims[0]` is the row length, i.e. the input width of a projection).

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use muser_gguf::{GgmlType, Gguf, TensorInfo};

use crate::config::MuseConfig;
use crate::error::{Error, Result};
use crate::formats;

/// A weight matrix in the file: `rows` outputs, each a row of `cols` inputs, in format `ty`.
#[derive(Clone, Debug)]
pub struct Matrix {
    pub name: String,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    /// Offset and length of the tensor's bytes within the file's data section.
    pub(crate) info: TensorInfo,
}

impl Matrix {
    /// A matrix description not tied to a file (its bytes come from elsewhere: a shard).
    pub fn detached(name: &str, ty: GgmlType, rows: usize, cols: usize) -> Result<Matrix> {
        let row = ty.row_bytes(cols as u64).ok_or_else(|| {
            Error::Tensor(format!(
                "{name}: {cols} columns are not whole {} blocks",
                ty.name()
            ))
        })?;
        let info = TensorInfo {
            name: name.to_string(),
            dims: vec![cols as u64, rows as u64],
            ggml_type: ty,
            offset: 0,
            n_bytes: row * rows as u64,
            shard: 0,
        };
        Ok(Matrix {
            name: name.to_string(),
            ty,
            rows,
            cols,
            info,
        })
    }

    /// Bytes of the whole matrix.
    pub fn n_bytes(&self) -> usize {
        self.info.n_bytes as usize
    }

    /// Refuse `bytes` that are not exactly this matrix's size (a backend's upload from memory).
    pub fn check_bytes(&self, bytes: &[u8]) -> Result<()> {
        if bytes.len() != self.n_bytes() {
            return Err(Error::Backend(format!(
                "{}: {} bytes for a matrix of {}",
                self.name,
                bytes.len(),
                self.n_bytes()
            )));
        }
        Ok(())
    }

    /// The bytes of this matrix in `file`.
    pub fn bytes<'a>(&self, file: &'a Gguf) -> &'a [u8] {
        file.tensor_data(&self.info)
    }

    pub fn row_bytes(&self) -> usize {
        self.info.n_bytes as usize / self.rows
    }
}

/// One layer's tensors (`blk.N.*`).
#[derive(Clone, Debug)]
pub struct LayerTensors {
    pub attn_norm: Vec<f32>,           // [n_embd], (1 + w) folded at conversion
    pub attn_q: Matrix,                // [n_head*head_dim rows][n_embd]
    pub attn_k: Matrix,                // [n_head_kv*head_dim][n_embd]
    pub attn_v: Matrix,                // [n_head_kv*head_dim][n_embd]
    pub attn_gate: Matrix,             // [n_head*head_dim][n_embd]
    pub attn_output: Matrix,           // [n_embd][n_head*head_dim]
    pub qk_scale: f32,                 // attn_q_norm: full(head_dim, qk_scale_factor), probed
    pub post_attention_norm: Vec<f32>, // [n_embd]
    pub ffn_norm: Vec<f32>,            // [n_embd]
    pub ffn_gate: Matrix,              // [n_ff][n_embd]
    pub ffn_up: Matrix,                // [n_ff][n_embd]
    pub ffn_down: Matrix,              // [n_embd][n_ff]
    pub post_ffw_norm: Vec<f32>,       // [n_embd]
}

/// All tensors of the model.
#[derive(Clone, Debug)]
pub struct Tensors {
    pub token_embd: Matrix,    // [n_vocab rows][n_embd]
    pub output_norm: Vec<f32>, // [n_embd], no +1
    pub output: Matrix,        // [n_vocab][n_embd]
    pub layers: Vec<LayerTensors>,
}

/// What the load-time probes found.
#[derive(Clone, Debug, PartialEq)]
pub struct Probes {
    /// The constant of every layer's `attn_q_norm` (the converter's `qk_scale_factor`).
    pub qk_scale: f32,
    /// Every `attn_k_norm` is all ones.
    pub k_norm_ones: bool,
}

/// An opened, validated Muse Glimmer GGUF.
pub struct ModelFile {
    pub gguf: Arc<Gguf>,
    pub config: MuseConfig,
    pub tensors: Tensors,
    pub probes: Probes,
}

impl ModelFile {
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let gguf = Gguf::open(path.as_ref())?;
        Self::from_gguf(Arc::new(gguf))
    }

    pub fn from_gguf(gguf: Arc<Gguf>) -> Result<Self> {
        let config = MuseConfig::from_gguf(&gguf)?;
        let (tensors, probes) = load_tensors(&gguf, &config)?;
        Ok(ModelFile {
            gguf,
            config,
            tensors,
            probes,
        })
    }
}

struct Checker<'a> {
    g: &'a Gguf,
    used: HashSet<String>,
}

impl<'a> Checker<'a> {
    fn info(&mut self, name: &str) -> Result<&'a TensorInfo> {
        let t = self
            .g
            .tensor(name)
            .ok_or_else(|| Error::Tensor(format!("required tensor '{name}' is missing")))?;
        self.used.insert(name.to_string());
        Ok(t)
    }

    fn matrix(&mut self, name: &str, cols: usize, rows: usize) -> Result<Matrix> {
        let t = self.info(name)?;
        if t.dims != [cols as u64, rows as u64] {
            return Err(Error::Tensor(format!(
                "tensor '{name}' has shape {:?}, expected [{cols}, {rows}] (ggml order: inputs, outputs)",
                t.dims
            )));
        }
        if !formats::is_supported(t.ggml_type) {
            return Err(Error::Tensor(format!(
                "tensor '{name}' has type {}, which Muser does not implement (supported: {})",
                t.ggml_type,
                formats::SUPPORTED
                    .iter()
                    .map(|t| t.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        Ok(Matrix {
            name: name.to_string(),
            ty: t.ggml_type,
            rows,
            cols,
            info: t.clone(),
        })
    }

    fn vector(&mut self, name: &str, n: usize) -> Result<Vec<f32>> {
        let t = self.info(name)?;
        if t.dims != [n as u64] {
            return Err(Error::Tensor(format!(
                "tensor '{name}' has shape {:?}, expected [{n}]",
                t.dims
            )));
        }
        if t.ggml_type != GgmlType::F32 {
            return Err(Error::Tensor(format!(
                "tensor '{name}' has type {}, expected f32",
                t.ggml_type
            )));
        }
        let mut v = vec![0f32; n];
        formats::dequantize_row(GgmlType::F32, self.g.tensor_data(t), &mut v);
        if let Some(i) = v.iter().position(|x| !x.is_finite()) {
            return Err(Error::Tensor(format!(
                "tensor '{name}' element {i} is {} (not finite)",
                v[i]
            )));
        }
        Ok(v)
    }
}

fn load_tensors(g: &Gguf, c: &MuseConfig) -> Result<(Tensors, Probes)> {
    let mut ck = Checker {
        g,
        used: HashSet::new(),
    };
    let token_embd = ck.matrix("token_embd.weight", c.n_embd, c.n_vocab)?;
    let output_norm = ck.vector("output_norm.weight", c.n_embd)?;
    let output = ck.matrix("output.weight", c.n_embd, c.n_vocab)?;

    let mut layers = Vec::with_capacity(c.n_layer);
    let mut qk_scale: Option<f32> = None;
    for i in 0..c.n_layer {
        let p = |s: &str| format!("blk.{i}.{s}.weight");
        let q_norm = ck.vector(&p("attn_q_norm"), c.head_dim)?;
        let k_norm = ck.vector(&p("attn_k_norm"), c.head_dim)?;
        // The converter synthesizes q_norm = full(head_dim, qk_scale_factor) and k_norm = ones
        // (conversion/muse_glimmer.py). A learned per-channel norm would silently redefine the
        // attention scores, so anything else refuses the load.
        let s = q_norm[0];
        if let Some(j) = q_norm.iter().position(|&x| x != s) {
            return Err(Error::Tensor(format!(
                "'{}' is not a constant broadcast (element 0 = {s}, element {j} = {}); Muser implements only the \
                 converter's synthesized qk_scale_factor, not a learned per-channel QK-norm",
                p("attn_q_norm"),
                q_norm[j]
            )));
        }
        if !(s > 0.0) {
            return Err(Error::Tensor(format!(
                "'{}' is the constant {s}, expected a positive scale",
                p("attn_q_norm")
            )));
        }
        match qk_scale {
            None => qk_scale = Some(s),
            Some(s0) if s0 != s => {
                return Err(Error::Tensor(format!(
                    "'{}' holds {s} but layer 0's attn_q_norm holds {s0}; the converter writes one qk_scale_factor for all layers",
                    p("attn_q_norm")
                )));
            }
            Some(_) => {}
        }
        if let Some(j) = k_norm.iter().position(|&x| x != 1.0) {
            return Err(Error::Tensor(format!(
                "'{}' element {j} is {}, expected all ones (the converter's identity k_norm)",
                p("attn_k_norm"),
                k_norm[j]
            )));
        }
        layers.push(LayerTensors {
            attn_norm: ck.vector(&p("attn_norm"), c.n_embd)?,
            attn_q: ck.matrix(&p("attn_q"), c.n_embd, c.q_dim())?,
            attn_k: ck.matrix(&p("attn_k"), c.n_embd, c.kv_dim())?,
            attn_v: ck.matrix(&p("attn_v"), c.n_embd, c.kv_dim())?,
            attn_gate: ck.matrix(&p("attn_gate"), c.n_embd, c.q_dim())?,
            attn_output: ck.matrix(&p("attn_output"), c.q_dim(), c.n_embd)?,
            qk_scale: s,
            post_attention_norm: ck.vector(&p("post_attention_norm"), c.n_embd)?,
            ffn_norm: ck.vector(&p("ffn_norm"), c.n_embd)?,
            ffn_gate: ck.matrix(&p("ffn_gate"), c.n_embd, c.n_ff)?,
            ffn_up: ck.matrix(&p("ffn_up"), c.n_embd, c.n_ff)?,
            ffn_down: ck.matrix(&p("ffn_down"), c.n_ff, c.n_embd)?,
            post_ffw_norm: ck.vector(&p("post_ffw_norm"), c.n_embd)?,
        });
    }
    // llama.cpp refuses files with tensors the graph does not create; so do we, naming them.
    let unused: Vec<&str> = g
        .tensors()
        .iter()
        .map(|t| t.name.as_str())
        .filter(|n| !ck.used.contains(*n))
        .collect();
    if !unused.is_empty() {
        // Quoted as Rust strings: a name may hold anything (an empty name, control characters).
        let shown: Vec<String> = unused.iter().take(5).map(|n| format!("{n:?}")).collect();
        return Err(Error::Tensor(format!(
            "{} unexpected tensor(s) the Muse Glimmer graph does not use: {}{}",
            unused.len(),
            shown.join(", "),
            if unused.len() > 5 { ", ..." } else { "" }
        )));
    }
    let probes = Probes {
        qk_scale: qk_scale.unwrap_or(0.0),
        k_norm_ones: true,
    };
    Ok((
        Tensors {
            token_embd,
            output_norm,
            output,
            layers,
        },
        probes,
    ))
}
