//! The tensor-parallel all-reduce on the GPUs: NCCL (through cudarc), one communicator per rank
//! in this process (`ncclCommInitAll`), the ranks' calls grouped so one host thread drives them
//! all. The sum runs on the ranks' own streams: no host synchronisation per layer.
//!
//! NCCL adds in its own order (ring or tree, chosen by size and topology); with two ranks that is
//! a + b, the same as the host's rank-order sum, bit for bit; with more ranks the order differs,
//! which moves results by rounding only (the parity test bounds it).

use cudarc::nccl::safe::{Comm, ReduceOp};
use muser_engine::tp::AllReduce;
use muser_engine::{Error, Result};

use crate::{CudaAct, CudaBackend};

/// Whether NCCL can be loaded (cudarc panics on first use when it cannot).
pub fn nccl_present() -> bool {
    // SAFETY: only tries to dlopen the library by its candidate names.
    unsafe { cudarc::nccl::sys::is_culib_present() }
}

/// One rank's communicator, movable to another thread.
struct RankComm(Comm);

// SAFETY: an NCCL communicator may be used from any thread, one call at a time (NCCL's thread-
// safety rule); `NcclAllReduce` only touches it with the mutex below held.
unsafe impl Send for RankComm {}

/// NCCL communicators for ranks `0..world`, one per backend, in rank order. The mutex makes the
/// calls of one all-reduce (a group over every rank) exclusive, so the type is safely `Sync`.
pub struct NcclAllReduce {
    comms: std::sync::Mutex<Vec<RankComm>>,
}

impl NcclAllReduce {
    /// Communicators over the backends' devices and streams (each backend one distinct GPU).
    pub fn new(ranks: &[CudaBackend]) -> Result<Self> {
        if !nccl_present() {
            return Err(Error::Backend(
                "tensor parallelism over GPUs needs NCCL: cannot load libnccl.so (the NCCL runtime ships libnccl.so.2 only: put a folder holding a link libnccl.so -> libnccl.so.2 on LD_LIBRARY_PATH)".into(),
            ));
        }
        let mut ordinals: Vec<usize> = ranks.iter().map(|b| b.ctx.ordinal()).collect();
        ordinals.sort_unstable();
        ordinals.dedup();
        if ordinals.len() != ranks.len() {
            return Err(Error::Backend(
                "tensor parallelism over GPUs needs one distinct GPU per rank".into(),
            ));
        }
        // One host thread records the ranks' steps together (TpBackend::record_begin).
        for b in ranks {
            b.set_capture_relaxed(true);
        }
        let streams = ranks.iter().map(|b| b.stream.clone()).collect();
        let comms =
            Comm::from_devices(streams).map_err(|e| Error::Backend(format!("NCCL init: {e:?}")))?;
        Ok(NcclAllReduce {
            comms: std::sync::Mutex::new(comms.into_iter().map(RankComm).collect()),
        })
    }
}

impl AllReduce<CudaBackend> for NcclAllReduce {
    fn all_reduce(&self, ranks: &[CudaBackend], parts: &mut [CudaAct]) -> Result<()> {
        let comms = self
            .comms
            .lock()
            .map_err(|_| Error::Backend("NCCL communicator lock poisoned".into()))?;
        if ranks.len() != comms.len() || parts.len() != comms.len() {
            return Err(Error::Backend(format!(
                "NCCL all-reduce over {} parts with {} communicators",
                parts.len(),
                comms.len()
            )));
        }
        let n = parts[0].rows * parts[0].cols;
        if parts.iter().any(|p| p.rows * p.cols != n) {
            return Err(Error::Backend(
                "NCCL all-reduce: the ranks' parts differ in shape".into(),
            ));
        }
        let err = |e| Error::Backend(format!("NCCL all-reduce: {e:?}"));
        cudarc::nccl::result::group_start().map_err(err)?;
        let mut first_err = None;
        for (comm, p) in comms.iter().zip(parts.iter_mut()) {
            p.xs_ok = false;
            let mut view = p.data.slice_mut(0..n);
            if let Err(e) = comm.0.all_reduce_in_place(&mut view, &ReduceOp::Sum) {
                first_err.get_or_insert(e);
            }
        }
        // The group must be closed even when a call failed, or later NCCL calls would hang.
        let end = cudarc::nccl::result::group_end();
        if let Some(e) = first_err {
            return Err(err(e));
        }
        end.map_err(err)?;
        Ok(())
    }

    fn name(&self) -> &'static str {
        "nccl"
    }
}
