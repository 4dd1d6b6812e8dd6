//! Where llama.cpp b11434 puts each token in its KV cache, and the `n_kv` its graph uses: a
//! simulator of `llama_kv_cache` (llama-kv-cache.cpp) for one sequence, as the iSWA cache of
//! muse-glimmer uses it (llama-kv-cache-iswa.cpp): a full cache for the full (NoPE) layers and a
//! sliding-window cache for the SWA layers, `swa_full = false`, one stream, `n_pad = 1`.
//!
//! Why it matters for parity: the non-flash attention reads the first `n_kv` cells in cell order,
//! and a key's cell index decides its SIMD lane in the `V·P` product and its 8-group in the
//! softmax sum (see [`super::attention`]).
//!
//! The rules, each with its source:
//! - sizes (llama-context.cpp:292, llama-kv-cache-iswa.cpp:74): `n_ctx` is padded to 256; the full
//!   cache has `n_ctx` cells; the SWA cache `GGML_PAD(min(n_ctx, n_swa + n_ubatch), 256)`.
//! - slot search (`find_slot`, llama-kv-cache.cpp:916, non-contiguous): start at `head`, or at 0 when
//!   `head > used + 2*n_tokens`; walk the cells in order, wrapping at the end, and take every cell
//!   that is empty or (SWA cache) holds a position `p` with `(max_pos + 1) - p >= n_swa`, where
//!   `max_pos` is the sequence's largest position in the cache before this ubatch; fail after
//!   testing `size` cells.
//! - placing (`apply_ubatch`, :1115): overwritten cells are freed, then every cell of the sequence
//!   with a position `<=` the largest overwritten position is removed too (`seq_rm`); `head`
//!   becomes the last used slot + 1.
//! - `n_kv` (`get_n_kv`, :1280): `min(size, max(256, GGML_PAD(used_max + 1, 256)))`, computed after
//!   placing the ubatch.
//! - the batch is split into ubatches of `n_ubatch` tokens (`split_simple`) and `prepare` places
//!   them one after the other, exactly as this simulator does when called per ubatch.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// `GGML_PAD(x, n)`
pub fn pad(x: usize, n: usize) -> usize {
    x.div_ceil(n) * n
}

/// Why a ubatch could not be placed (llama.cpp: "failed to find a memory slot").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvFull {
    pub size: usize,
    pub n_tokens: usize,
}

impl fmt::Display for KvFull {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "no room for {} tokens in a KV cache of {} cells",
            self.n_tokens, self.size
        )
    }
}

impl std::error::Error for KvFull {}

/// The cells of one ubatch and the `n_kv` of the graph that computes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// `slots[i]` is the cell of the ubatch's token `i`.
    pub slots: Vec<usize>,
    pub n_kv: usize,
}

/// One `llama_kv_cache` holding one sequence.
#[derive(Clone, Debug)]
pub struct KvLayout {
    /// `pos[slot]`, -1 for an empty cell
    pos: Vec<i32>,
    used: BTreeSet<usize>,
    /// multiset of the sequence's positions (`seq_pos` of llama_kv_cells)
    seq_pos: BTreeMap<i32, u32>,
    head: usize,
    n_swa: Option<u32>,
}

impl KvLayout {
    /// The full-attention cache of a context of `n_ctx` tokens (padded to 256).
    pub fn full(n_ctx: usize) -> KvLayout {
        KvLayout::with_size(pad(n_ctx, 256), None)
    }

    /// The sliding-window cache (`swa_full = false`) for a context of `n_ctx` tokens.
    pub fn swa(n_ctx: usize, n_swa: u32, n_ubatch: usize) -> KvLayout {
        let size = pad(pad(n_ctx, 256).min(n_swa as usize + n_ubatch), 256);
        KvLayout::with_size(size, Some(n_swa))
    }

    /// A cache of `size` cells; `n_swa` makes it a (standard) sliding-window cache.
    pub fn with_size(size: usize, n_swa: Option<u32>) -> KvLayout {
        KvLayout {
            pos: vec![-1; size],
            used: BTreeSet::new(),
            seq_pos: BTreeMap::new(),
            head: 0,
            n_swa,
        }
    }

    pub fn size(&self) -> usize {
        self.pos.len()
    }

    pub fn n_swa(&self) -> Option<u32> {
        self.n_swa
    }

    /// The position held by a cell, if any.
    pub fn pos_of(&self, slot: usize) -> Option<i32> {
        let p = self.pos[slot];
        (p >= 0).then_some(p)
    }

    /// The non-empty cells, as `(slot, pos)` in slot order.
    pub fn cells(&self) -> impl Iterator<Item = (usize, i32)> + '_ {
        self.used.iter().map(|&s| (s, self.pos[s]))
    }

    /// `get_n_kv` for the current state.
    pub fn n_kv(&self) -> usize {
        let used_max_p1 = self.used.iter().next_back().map_or(0, |&s| s + 1);
        self.size().min(256usize.max(pad(used_max_p1, 256)))
    }

    fn seq_pos_max(&self) -> Option<i32> {
        self.seq_pos.keys().next_back().copied()
    }

    fn seq_pos_min(&self) -> Option<i32> {
        self.seq_pos.keys().next().copied()
    }

    fn rm(&mut self, slot: usize) {
        let p = self.pos[slot];
        debug_assert!(p >= 0);
        if let Some(c) = self.seq_pos.get_mut(&p) {
            *c -= 1;
            if *c == 0 {
                self.seq_pos.remove(&p);
            }
        }
        self.pos[slot] = -1;
        self.used.remove(&slot);
    }

    fn set(&mut self, slot: usize, p: i32) {
        self.pos[slot] = p;
        self.used.insert(slot);
        *self.seq_pos.entry(p).or_insert(0) += 1;
    }

    /// `find_slot(ubatch, cont = false)` for `n_tokens` tokens; does not change the cache.
    pub fn find_slots(&self, n_tokens: usize) -> Result<Vec<usize>, KvFull> {
        let size = self.size();
        let full = KvFull { size, n_tokens };
        if n_tokens > size {
            return Err(full);
        }
        let mut head_cur = self.head;
        if head_cur > self.used.len() + 2 * n_tokens {
            head_cur = 0;
        }
        let max_p1 = self.seq_pos_max().map_or(0, |m| m as i64 + 1);
        let mut idxs = Vec::with_capacity(n_tokens);
        let mut n_tested = 0usize;
        loop {
            if head_cur + 1 > size {
                n_tested += size - head_cur;
                head_cur = 0;
                continue;
            }
            let idx = head_cur;
            head_cur += 1;
            n_tested += 1;
            let p = self.pos[idx];
            let mut can_use = p < 0;
            if !can_use {
                if let Some(w) = self.n_swa {
                    // is_masked_swa(n_swa, STANDARD, pos_cell, seq_pos_max + 1)
                    if max_p1 - p as i64 >= w as i64 {
                        can_use = true;
                    }
                }
            }
            if can_use {
                idxs.push(idx);
            }
            if idxs.len() == n_tokens {
                return Ok(idxs);
            }
            if n_tested >= size {
                return Err(full);
            }
        }
    }

    /// Place one ubatch of the sequence (its positions, in token order): `find_slot` then
    /// `apply_ubatch`; returns the cells and the `n_kv` its graph uses.
    pub fn place(&mut self, positions: &[i32]) -> Result<Placement, KvFull> {
        let slots = self.find_slots(positions.len())?;
        Ok(self.apply(slots, positions))
    }

    /// `apply_ubatch` with the cells from [`KvLayout::find_slots`].
    pub fn apply(&mut self, slots: Vec<usize>, positions: &[i32]) -> Placement {
        assert_eq!(
            slots.len(),
            positions.len(),
            "KvLayout::apply: one slot per token"
        );
        let mut pos_max_rm: Option<i32> = None;
        for (&slot, &p) in slots.iter().zip(positions) {
            if self.pos[slot] >= 0 {
                pos_max_rm = pos_max_rm.max(Some(self.pos[slot]));
                self.rm(slot);
            }
            self.set(slot, p);
        }
        if let (Some(rm_max), Some(min)) = (pos_max_rm, self.seq_pos_min()) {
            if min <= rm_max {
                // seq_rm(seq, min, rm_max + 1): drop every cell with a position in [min, rm_max]
                let victims: Vec<usize> = self
                    .used
                    .iter()
                    .copied()
                    .filter(|&s| self.pos[s] >= min && self.pos[s] <= rm_max)
                    .collect();
                for s in victims {
                    self.rm(s);
                }
            }
        }
        self.head = slots.last().map_or(self.head, |&s| s + 1);
        Placement {
            slots,
            n_kv: self.n_kv(),
        }
    }

    /// Remove every cell (llama_memory_clear).
    pub fn clear(&mut self) {
        self.pos.iter_mut().for_each(|p| *p = -1);
        self.used.clear();
        self.seq_pos.clear();
        self.head = 0;
    }
}

/// The two caches of muse-glimmer's `llama_kv_cache_iswa` for one sequence.
#[derive(Clone, Debug)]
pub struct IswaLayout {
    pub full: KvLayout,
    pub swa: KvLayout,
}

impl IswaLayout {
    pub fn new(n_ctx: usize, n_swa: u32, n_ubatch: usize) -> IswaLayout {
        IswaLayout {
            full: KvLayout::full(n_ctx),
            swa: KvLayout::swa(n_ctx, n_swa, n_ubatch),
        }
    }

    /// Place one ubatch in both caches: `(full, swa)`. llama.cpp prepares both before computing;
    /// if either fails the ubatch is refused and neither cache changes.
    pub fn place(&mut self, positions: &[i32]) -> Result<(Placement, Placement), KvFull> {
        let a = self.full.find_slots(positions.len())?;
        let b = self.swa.find_slots(positions.len())?;
        Ok((self.full.apply(a, positions), self.swa.apply(b, positions)))
    }

    /// Split a batch of consecutive positions `[pos0, pos0 + n)` into ubatches of `n_ubatch`
    /// (`split_simple`) and place them in order.
    pub fn place_batch(
        &mut self,
        pos0: i32,
        n: usize,
        n_ubatch: usize,
    ) -> Result<Vec<(Placement, Placement)>, KvFull> {
        let mut res = Vec::new();
        let mut i = 0;
        while i < n {
            let m = n_ubatch.min(n - i);
            let positions: Vec<i32> = (0..m).map(|k| pos0 + (i + k) as i32).collect();
            res.push(self.place(&positions)?);
            i += m;
        }
        Ok(res)
    }
}
