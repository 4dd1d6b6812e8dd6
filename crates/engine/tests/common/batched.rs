//! Sequences alone and sequences sharing micro-batches, on any backend: the harness of the
//! batch-invariance tests (CPU: `accurate.rs`; CUDA: `crates/cuda/tests/gpu.rs`, which includes
//! this file by path).
#![allow(dead_code)]

use muser_engine::backend::Batch;
use muser_engine::{Backend, KvType, MuseGlimmer, Result};

/// One sequence's teacher-forced decode logits, alone: its first `prompt` tokens in one
/// micro-batch, then one token per step.
pub fn alone<B: Backend>(
    m: &MuseGlimmer<B>,
    seq: &[u32],
    prompt: usize,
    kv: KvType,
    n_ctx: usize,
) -> Result<Vec<Vec<f32>>> {
    let mut cache = m.new_cache(kv, n_ctx)?;
    let mut ws = m.workspace(prompt.max(1))?;
    m.forward(
        &mut ws,
        &Batch::single(&seq[..prompt], 0),
        &mut [&mut cache],
        &[],
    )?;
    let mut out = Vec::new();
    for (k, &t) in seq.iter().enumerate().skip(prompt) {
        out.push(m.forward(
            &mut ws,
            &Batch::single(&[t], k as u32),
            &mut [&mut cache],
            &[0],
        )?);
    }
    Ok(out)
}

/// The same sequences together: all prompts in one micro-batch, then steps that advance every
/// sequence with tokens left (the batch shrinks as sequences finish). Per sequence, its decode
/// logits in order.
pub fn together<B: Backend>(
    m: &MuseGlimmer<B>,
    seqs: &[Vec<u32>],
    prompts: &[usize],
    kv: KvType,
    n_ctx: usize,
) -> Result<Vec<Vec<Vec<f32>>>> {
    let nv = m.config.n_vocab;
    let mut caches = (0..seqs.len())
        .map(|_| m.new_cache(kv, n_ctx))
        .collect::<Result<Vec<_>>>()?;
    let mut ws = m.workspace(prompts.iter().sum::<usize>().max(seqs.len()))?;
    let mut b = Batch::default();
    for (i, s) in seqs.iter().enumerate() {
        for (k, &t) in s[..prompts[i]].iter().enumerate() {
            b.tokens.push(t);
            b.pos.push(k as u32);
            b.seq.push(i);
        }
    }
    let mut refs: Vec<&mut B::Kv> = caches.iter_mut().collect();
    m.forward(&mut ws, &b, &mut refs, &[])?;
    let mut out = vec![Vec::new(); seqs.len()];
    let mut next = prompts.to_vec();
    loop {
        let live: Vec<usize> = (0..seqs.len())
            .filter(|&i| next[i] < seqs[i].len())
            .collect();
        if live.is_empty() {
            break;
        }
        let b = Batch {
            tokens: live.iter().map(|&i| seqs[i][next[i]]).collect(),
            pos: live.iter().map(|&i| next[i] as u32).collect(),
            seq: live.clone(),
        };
        let rows: Vec<usize> = (0..live.len()).collect();
        let mut refs: Vec<&mut B::Kv> = caches.iter_mut().collect();
        let l = m.forward(&mut ws, &b, &mut refs, &rows)?;
        for (j, &i) in live.iter().enumerate() {
            out[i].push(l[j * nv..(j + 1) * nv].to_vec());
            next[i] += 1;
        }
    }
    Ok(out)
}
