//! Byte-level BPE over token ids: HF tokenizers' algorithm (`models/bpe/word.rs` `merge_all`,
//! `models/bpe/model.rs` `merge_word`) without its per-token string allocations.
//!
//! A word starts as one symbol per byte (the id of that byte's alphabet char; a byte missing from
//! the vocabulary is dropped, as HF does without an unk token), then the lowest-ranked adjacent
//! pair is merged, leftmost first among equals, until no pair has a merge.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::RwLock;

use ahash::AHashMap;

use crate::byte_level::{byte_to_char, strict_bytes};
use crate::error::{Result, TextError};

/// Words up to this many bytes are cached (HF caches words too; long ones are rare and unique).
const CACHE_WORD_BYTES: usize = 256;
const CACHE_ENTRIES: usize = 1 << 17;

pub struct Bpe {
    /// (left id, right id) -> (rank, merged id).
    merges: AHashMap<(u32, u32), (u32, u32)>,
    /// Id of each byte's single-char token.
    byte_ids: [Option<u32>; 256],
    /// Whole-word lookup for `ignore_merges` vocabularies (Llama-3): a word in the vocabulary is one token.
    whole_words: Option<AHashMap<Vec<u8>, u32>>,
    cache: RwLock<WordCache>,
}

/// Word bytes -> ids.
type WordCache = AHashMap<Box<[u8]>, Box<[u32]>>;

impl Bpe {
    /// `vocab`: the tokens BPE may produce, as (GGUF string, id), first id winning for a repeated
    /// string; `merges`: pairs of token strings in rank order.
    pub fn new(
        vocab: &[(&str, u32)],
        merges: &[(String, String)],
        ignore_merges: bool,
    ) -> Result<Self> {
        let mut ids: AHashMap<&str, u32> = AHashMap::with_capacity(vocab.len());
        for &(t, id) in vocab {
            ids.entry(t).or_insert(id);
        }
        let mut byte_ids = [None; 256];
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            *slot = ids
                .get(byte_to_char(b as u8).encode_utf8(&mut [0; 4]) as &str)
                .copied();
        }
        let mut map = AHashMap::with_capacity(merges.len());
        let mut joined = String::new();
        for (rank, (a, b)) in merges.iter().enumerate() {
            // HF refuses a merge whose parts or result are not tokens (MergeTokenOutOfVocabulary).
            let missing = |s: &str| {
                TextError::Vocab(format!(
                    "merge {rank} ('{a} {b}') uses '{s}', which is not a token"
                ))
            };
            let l = *ids.get(a.as_str()).ok_or_else(|| missing(a))?;
            let r = *ids.get(b.as_str()).ok_or_else(|| missing(b))?;
            joined.clear();
            joined.push_str(a);
            joined.push_str(b);
            let m = *ids.get(joined.as_str()).ok_or_else(|| missing(&joined))?;
            // A repeated pair keeps its first (best) rank.
            map.entry((l, r)).or_insert((rank as u32, m));
        }
        // HF looks a word up by its byte-level string, which only tokens made wholly of alphabet
        // chars can equal; keyed by their bytes here (the alphabet is a bijection).
        let whole_words = ignore_merges.then(|| {
            ids.iter()
                .filter_map(|(t, &id)| strict_bytes(t).map(|b| (b, id)))
                .collect()
        });
        Ok(Self {
            merges: map,
            byte_ids,
            whole_words,
            cache: RwLock::new(AHashMap::new()),
        })
    }

    /// Appends the ids of one pre-tokenized word.
    pub fn encode_word(&self, word: &[u8], out: &mut Vec<u32>) {
        if let Some(&id) = self.whole_words.as_ref().and_then(|w| w.get(word)) {
            out.push(id);
            return;
        }
        let cacheable = word.len() <= CACHE_WORD_BYTES;
        if cacheable
            && let Ok(cache) = self.cache.read()
            && let Some(ids) = cache.get(word)
        {
            out.extend_from_slice(ids);
            return;
        }
        let start = out.len();
        self.merge(word, out);
        if cacheable {
            // Never wait for the lock: a busy cache only costs a recomputation.
            if let Ok(mut cache) = self.cache.try_write() {
                if cache.len() >= CACHE_ENTRIES {
                    cache.clear();
                }
                cache.insert(word.into(), out[start..].into());
            }
        }
    }

    fn merge(&self, word: &[u8], out: &mut Vec<u32>) {
        // Symbols as a linked list over positions; `alive == false` marks a symbol merged away.
        struct Sym {
            id: u32,
            prev: isize,
            next: isize,
            alive: bool,
        }
        let mut syms: Vec<Sym> = Vec::with_capacity(word.len());
        for &b in word {
            if let Some(id) = self.byte_ids[b as usize] {
                let i = syms.len() as isize;
                syms.push(Sym {
                    id,
                    prev: i - 1,
                    next: i + 1,
                    alive: true,
                });
            }
        }
        if let Some(last) = syms.last_mut() {
            last.next = -1;
        }
        // Min-heap on (rank, position): HF's `Merge` ordering.
        let mut heap: BinaryHeap<Reverse<(u32, usize, u32)>> = syms
            .windows(2)
            .enumerate()
            .filter_map(|(i, w)| {
                self.merges
                    .get(&(w[0].id, w[1].id))
                    .map(|&(rank, m)| Reverse((rank, i, m)))
            })
            .collect();
        while let Some(Reverse((_, pos, new_id))) = heap.pop() {
            if !syms[pos].alive || syms[pos].next < 0 {
                continue;
            }
            let next = syms[pos].next as usize;
            // A stale entry: one side was merged since it was queued.
            if self
                .merges
                .get(&(syms[pos].id, syms[next].id))
                .is_none_or(|&(_, m)| m != new_id)
            {
                continue;
            }
            syms[pos].id = new_id;
            syms[next].alive = false;
            let after = syms[next].next;
            syms[pos].next = after;
            if after >= 0 {
                syms[after as usize].prev = pos as isize;
            }
            if syms[pos].prev >= 0 {
                let p = syms[pos].prev as usize;
                if let Some(&(rank, m)) = self.merges.get(&(syms[p].id, syms[pos].id)) {
                    heap.push(Reverse((rank, p, m)));
                }
            }
            if after >= 0
                && let Some(&(rank, m)) = self.merges.get(&(syms[pos].id, syms[after as usize].id))
            {
                heap.push(Reverse((rank, pos, m)));
            }
        }
        out.extend(syms.iter().filter(|s| s.alive).map(|s| s.id));
    }
}
