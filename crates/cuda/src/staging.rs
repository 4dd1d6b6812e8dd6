//! Large device-to-host reads through page-locked staging buffers (`CudaBackend::download`).
//!
//! A copy into pageable memory runs through the driver's own small staging buffers: on the H200
//! machine, 64 rows of 202,048 logits (52 MB) took about 5 ms of a batched step that way
//! (docs/BENCHMARKS.md, 2026-11-30). Here the copy engine writes into two page-locked buffers
//! in turn, and while it fills one, the host copies the other out into the caller's memory on
//! several threads. The values are the same either way; only the time differs.

use std::ffi::c_void;

use cudarc::driver::{CudaContext, CudaEvent, CudaStream, CudaView, DevicePtr, result};
use muser_engine::{Error, Result};
use rayon::prelude::*;

use crate::dev;

/// Reads of fewer bytes go straight to pageable memory: below this the second copy and the
/// threads would cost more than they save.
pub(crate) const STAGED_READ_MIN_BYTES: usize = 1 << 20;
/// Floats per staging buffer (16 MiB each, two of them per backend, made at the first large
/// read).
const STAGE_FLOATS: usize = 4 << 20;
/// Floats each host thread copies out of a staging buffer at a time.
const COPY_FLOATS: usize = 256 << 10;

/// One page-locked buffer of STAGE_FLOATS floats and the event recorded after the last copy
/// into it.
struct Stage {
    ptr: *mut f32,
    done: CudaEvent,
}

// SAFETY: `ptr` is a page-locked allocation owned by this Stage alone (freed in Drop); the
// staging buffers are only touched under the backend's mutex (`CudaBackend::staging`).
unsafe impl Send for Stage {}

impl Drop for Stage {
    fn drop(&mut self) {
        // A copy into the buffer may still be queued if a read failed half way: wait for it
        // before the memory goes back.
        let _ = self.done.synchronize();
        // SAFETY: `ptr` came from malloc_host and is freed once, here.
        let _ = unsafe { result::free_host(self.ptr as *mut c_void) };
    }
}

pub(crate) struct Staging {
    stages: [Stage; 2],
}

impl Staging {
    pub(crate) fn new(ctx: &std::sync::Arc<CudaContext>) -> Result<Staging> {
        let stage = || -> Result<Stage> {
            ctx.bind_to_thread().map_err(dev("staging buffer"))?;
            // Flags 0: cached host memory (cudarc's alloc_pinned asks for write-combined
            // memory, which the host reads back slowly).
            // SAFETY: a plain allocation of STAGE_FLOATS floats; checked for null below.
            let ptr = unsafe { result::malloc_host(STAGE_FLOATS * 4, 0) }
                .map_err(dev("page-locked staging buffer"))? as *mut f32;
            if ptr.is_null() {
                return Err(Error::Backend(
                    "page-locked staging buffer: null pointer".into(),
                ));
            }
            let done = ctx.new_event(None).map_err(dev("staging event"))?;
            Ok(Stage { ptr, done })
        };
        Ok(Staging {
            stages: [stage()?, stage()?],
        })
    }

    /// `dst` = `src` (the same length), through the staging buffers: chunk k into stage k % 2,
    /// chunk k + 1's copy queued before chunk k is copied out.
    pub(crate) fn download(
        &mut self,
        stream: &std::sync::Arc<CudaStream>,
        src: &CudaView<'_, f32>,
        dst: &mut [f32],
    ) -> Result<()> {
        let n = dst.len();
        if src.len() != n {
            return Err(Error::Backend(format!(
                "download of {} values into {n}",
                src.len()
            )));
        }
        let (base, _rec) = src.device_ptr(stream);
        let chunks = n.div_ceil(STAGE_FLOATS);
        let range = |k: usize| k * STAGE_FLOATS..((k + 1) * STAGE_FLOATS).min(n);
        let issue = |stage: &Stage, k: usize| -> Result<()> {
            let r = range(k);
            // SAFETY: the stage holds STAGE_FLOATS >= r.len() floats and nothing reads it until
            // its event has completed (the host copies a stage out only after `synchronize`,
            // and queues the next copy into it only after that); the source range lies inside
            // `src` (r.end <= n = src.len()). On success `download` has waited for every copy
            // it queued; after an error a queued copy may still run: it writes only the stage
            // (kept until its event is waited for in Drop) and reads `src`, whose memory the
            // stream frees only after the work queued before.
            unsafe {
                let d = std::slice::from_raw_parts_mut(stage.ptr, r.len());
                result::memcpy_dtoh_async(d, base + (r.start * 4) as u64, stream.cu_stream())
                    .map_err(dev("download"))?;
            }
            stage.done.record(stream).map_err(dev("download event"))
        };
        issue(&self.stages[0], 0)?;
        for k in 0..chunks {
            if k + 1 < chunks {
                issue(&self.stages[(k + 1) % 2], k + 1)?;
            }
            let stage = &self.stages[k % 2];
            stage.done.synchronize().map_err(dev("download"))?;
            let r = range(k);
            // SAFETY: the copy into this stage has completed (its event, just waited for) and
            // the next copy into it is queued only after this read-out; r.len() <= STAGE_FLOATS.
            let from = unsafe { std::slice::from_raw_parts(stage.ptr as *const f32, r.len()) };
            dst[r]
                .par_chunks_mut(COPY_FLOATS)
                .zip(from.par_chunks(COPY_FLOATS))
                .for_each(|(d, s)| d.copy_from_slice(s));
        }
        Ok(())
    }
}
