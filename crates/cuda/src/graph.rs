//! Decode with one launch per token: the whole forward pass of one token (and the greedy
//! argmax) is captured once as a CUDA graph and replayed; only the token id and position
//! change, and the kernels read them from device memory.

use cudarc::driver::CudaSlice;
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use muser_engine::backend::Batch;
use muser_engine::muse_glimmer::Workspace;
use muser_engine::{Backend, Error, MuseGlimmer, Result};

use crate::{CudaBackend, CudaKv};

pub struct GraphDecoder<'m> {
    model: &'m MuseGlimmer<CudaBackend>,
    ws: Workspace<CudaBackend>,
    out: CudaSlice<u32>,
    /// The graph, the cache it was captured for and the backend's scratch epoch then.
    graph: Option<(u64, u64, cudarc::driver::CudaGraph)>,
    /// The cache and scratch epoch of the last eager step: a capture for that cache while the
    /// epoch is unchanged finds every lazily grown buffer sized, so it allocates nothing.
    warm: Option<(u64, u64)>,
    /// Capture a graph (true) or launch kernel by kernel (false, for comparison).
    pub use_graph: bool,
}

fn dev<E: std::fmt::Debug>(what: &'static str) -> impl FnOnce(E) -> Error {
    move |e| Error::Backend(format!("CUDA {what}: {e:?}"))
}

impl<'m> GraphDecoder<'m> {
    pub fn new(model: &'m MuseGlimmer<CudaBackend>) -> Result<Self> {
        let ws = model.workspace(1)?;
        let out = model.backend.stream.alloc_zeros(1).map_err(dev("alloc"))?;
        Ok(GraphDecoder {
            model,
            ws,
            out,
            graph: None,
            warm: None,
            // A tapped model copies tensors to the host mid-step: no capture.
            use_graph: !model.tapped(),
        })
    }

    /// Forget the captured graph (a new cache gets a new capture: the graph was sized for its
    /// context and recorded for its KV type).
    pub fn reset(&mut self) {
        self.graph = None;
        self.warm = None;
    }

    /// Run one token at the cache's next position; returns the greedy next token. When
    /// `logits` is given, the step's logits are copied into it too.
    pub fn step(
        &mut self,
        kv: &mut CudaKv,
        token: u32,
        logits: Option<&mut Vec<f32>>,
    ) -> Result<u32> {
        let b = &self.model.backend;
        let pos = b.kv_len(kv) as u32;
        // A replay skips the model's batch checks: this is the one that matters for it.
        if pos as usize >= b.kv_capacity(kv) {
            return Err(Error::Input(format!(
                "position {pos} is past the context size {}",
                b.kv_capacity(kv)
            )));
        }
        let batch = Batch::single(&[token], pos);
        b.upload_batch(&batch)?;
        b.upload_seqtab(&[kv.table_addr])?;
        let epoch = b.scratch_epoch();
        let current = self
            .graph
            .as_ref()
            .filter(|(id, e, _)| self.use_graph && *id == kv.id && *e == epoch);
        if let Some((_, _, g)) = current {
            // Host-side bookkeeping the captured kernels do not do.
            b.kv_set_len(kv, pos as usize + 1);
            g.launch().map_err(dev("graph launch"))?;
        } else if self.use_graph && self.warm == Some((kv.id, epoch)) {
            b.sync()?;
            b.capturing.store(true, std::sync::atomic::Ordering::SeqCst);
            let begun = b
                .stream
                .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
                .map_err(dev("begin capture"));
            let run = begun.and_then(|_| {
                self.model
                    .forward_device(&mut self.ws, &batch, &mut [kv], &[0])?;
                b.argmax(&self.ws.logits, &mut self.out)
            });
            let graph = b
                .stream
                .end_capture(CUgraphInstantiate_flags(0))
                .map_err(dev("end capture"));
            b.capturing
                .store(false, std::sync::atomic::Ordering::SeqCst);
            run?;
            let graph =
                graph?.ok_or_else(|| Error::Backend("CUDA capture produced no graph".into()))?;
            if b.scratch_epoch() != epoch {
                return Err(Error::Backend(
                    "a scratch buffer was reallocated during a graph capture".into(),
                ));
            }
            graph.launch().map_err(dev("graph launch"))?;
            self.graph = Some((kv.id, epoch, graph));
        } else {
            // Eager: the first step of a cache, after a reallocation, or without graphs.
            self.model
                .forward_device(&mut self.ws, &batch, &mut [kv], &[0])?;
            b.argmax(&self.ws.logits, &mut self.out)?;
            self.warm = Some((kv.id, b.scratch_epoch()));
        }
        if let Some(l) = logits {
            *l = b.read(&self.ws.logits)?;
        }
        let ids = b
            .stream
            .clone_dtoh(&self.out)
            .map_err(dev("download token"))?;
        ids.first()
            .copied()
            .ok_or_else(|| Error::Backend("no token".into()))
    }
}
