//! Parity mode: the backend operations composed of the ggml-exact kernels of [`super::ggml`],
//! op for op as llama.cpp b11434's graph (src/models/muse-glimmer.cpp) runs them on its CPU
//! backend. The KV cache of parity mode is llama.cpp's own cell layout (an [`IswaLayout`]):
//! which cell a position lands in decides its SIMD lane and accumulator in the attention
//! products, so reproducing the arithmetic means reproducing the layout.

use muser_gguf::GgmlType;

use super::ggml::{self, AttnParams, IswaLayout, KvKey, Placement};
use crate::backend::{AttnSpec, Batch};
use crate::config::MuseConfig;
use crate::error::{Error, Result};
use crate::kv::{HostKv, KvType};

/// llama.cpp's KV cells of one sequence: an iSWA layout and every layer's cell rows.
#[derive(Debug)]
pub struct ParityKv {
    layout: IswaLayout,
    /// The current micro-batch's cells (placed when layer 0 attends).
    placed: Option<(Placement, Placement)>,
    /// Per layer: K and V rows of every cell of that layer's cache.
    k: Vec<Vec<u8>>,
    v: Vec<Vec<u8>>,
    row_bytes: usize,
    sliding: Vec<bool>,
    n_ctx: usize,
    n_swa: u32,
    n_ubatch: usize,
}

impl ParityKv {
    /// `n_ubatch` is llama.cpp's micro-batch (it sizes the sliding-window cache); like
    /// llama.cpp it is clamped to the context size.
    pub fn new(cfg: &MuseConfig, ty: KvType, n_ctx: usize, n_ubatch: usize) -> Result<Self> {
        if ty == KvType::Q8_0 {
            return Err(Error::Config(
                "parity mode reproduces llama.cpp's non-flash attention, which cannot use a q8_0 V cache; use f32, f16 or bf16".into(),
            ));
        }
        let n_swa = u32::try_from(cfg.n_swa)
            .map_err(|_| Error::Config("sliding window too large".into()))?;
        let n_ubatch = n_ubatch.clamp(1, n_ctx);
        let layout = IswaLayout::new(n_ctx, n_swa, n_ubatch);
        let row_bytes = ty.row_bytes(cfg.kv_dim())?;
        let sliding: Vec<bool> = cfg.layer_kinds.iter().map(|k| k.is_sliding()).collect();
        let cells = |s: bool| {
            if s {
                layout.swa.size()
            } else {
                layout.full.size()
            }
        };
        let k = sliding
            .iter()
            .map(|&s| vec![0u8; cells(s) * row_bytes])
            .collect();
        let v = sliding
            .iter()
            .map(|&s| vec![0u8; cells(s) * row_bytes])
            .collect();
        Ok(ParityKv {
            layout,
            placed: None,
            k,
            v,
            row_bytes,
            sliding,
            n_ctx,
            n_swa,
            n_ubatch,
        })
    }

    pub fn clear(&mut self) {
        self.layout = IswaLayout::new(self.n_ctx, self.n_swa, self.n_ubatch);
        self.placed = None;
    }
}

/// One layer's non-flash attention for one micro-batch of one sequence, as llama.cpp:
/// store K and V into their cells, then `ggml::attention` over the layer's cells.
pub fn attention(
    kv: &mut HostKv,
    spec: AttnSpec,
    batch: &Batch,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &mut [f32],
) -> Result<()> {
    let ty: GgmlType = kv.ty.ggml_type();
    let p = kv.parity.as_mut().ok_or_else(|| {
        Error::Backend("parity attention on a cache made in accurate mode".into())
    })?;
    let positions: Vec<i32> = batch.pos.iter().map(|&x| x as i32).collect();
    if spec.layer == 0 {
        let placed = p.layout.place(&positions).map_err(|e| {
            Error::Input(format!(
                "parity mode: llama.cpp's KV cache has no room for this micro-batch ({e:?})"
            ))
        })?;
        p.placed = Some(placed);
    }
    let (full, swa) = p
        .placed
        .as_ref()
        .ok_or_else(|| Error::Backend("parity: micro-batch not placed".into()))?;
    let sliding = p.sliding[spec.layer];
    let placement = if sliding { swa } else { full };
    let kv_dim = spec.n_head_kv * spec.head_dim;
    let rb = p.row_bytes;
    for (t, &slot) in placement.slots.iter().enumerate() {
        ggml::store_kv_row(
            ty,
            &k[t * kv_dim..(t + 1) * kv_dim],
            &mut p.k[spec.layer][slot * rb..(slot + 1) * rb],
        );
        ggml::store_kv_row(
            ty,
            &v[t * kv_dim..(t + 1) * kv_dim],
            &mut p.v[spec.layer][slot * rb..(slot + 1) * rb],
        );
    }
    let layout = if sliding {
        &p.layout.swa
    } else {
        &p.layout.full
    };
    let (kc, vc) = (&p.k[spec.layer], &p.v[spec.layer]);
    let keys: Vec<KvKey> = layout
        .cells()
        .map(|(slot, pos)| KvKey {
            slot,
            pos,
            k: &kc[slot * rb..(slot + 1) * rb],
            v: &vc[slot * rb..(slot + 1) * rb],
        })
        .collect();
    let params = AttnParams {
        n_head: spec.n_head,
        n_head_kv: spec.n_head_kv,
        head_dim: spec.head_dim,
        k_type: ty,
        v_type: ty,
        n_kv: placement.n_kv,
        n_swa: sliding.then_some(spec.n_swa as u32),
        scale: spec.scale,
    };
    ggml::attention(&params, q, &positions, &keys, out);
    Ok(())
}
