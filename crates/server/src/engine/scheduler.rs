//! Scheduling decisions, free of the model so they can be tested alone: what one step runs,
//! and what a sequence's KV cache costs.
//!
//! A step is continuous batching at token granularity (as vLLM's and llama-server's): every
//! decoding sequence contributes its one pending token, then prompts fill the rest of the step
//! in chunks, oldest admission first. A long prompt therefore takes several steps, and the
//! streams already running get a token at every one of them instead of waiting for it.

use muser_engine::{KvType, MuseConfig, Result};

/// What the planner needs to know about one running sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeqView {
    /// Prompt tokens not yet run (0 once decoding).
    pub prompt_left: usize,
    /// It may run this step (it has a token to feed and its client keeps up).
    pub ready: bool,
    /// Guessed tokens it would run after its decode token (speculative decoding), given what
    /// the step has left once the prompts have theirs.
    pub guess: usize,
}

/// The tokens of one step: `(sequence, n_tokens)` in the order of `seqs`, at most `budget`
/// tokens: decode tokens first, then prompt chunks, then decoding sequences' guesses (a
/// decoding sequence's `n_tokens` is 1 and the guessed tokens it got). A step makes progress
/// whenever some sequence is ready and `budget` is at least the number of decoding sequences
/// plus one.
pub fn plan(seqs: &[SeqView], budget: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut left = budget;
    for (i, s) in seqs.iter().enumerate() {
        if s.ready && s.prompt_left == 0 && left > 0 {
            out.push((i, 1));
            left -= 1;
        }
    }
    for (i, s) in seqs.iter().enumerate() {
        if s.ready && s.prompt_left > 0 && left > 0 {
            let n = s.prompt_left.min(left);
            out.push((i, n));
            left -= n;
        }
    }
    for (i, n) in out.iter_mut() {
        let s = &seqs[*i];
        if s.prompt_left == 0 && s.guess > 0 && left > 0 {
            let g = s.guess.min(left);
            *n += g;
            left -= g;
        }
    }
    out.sort_unstable_by_key(|&(i, _)| i);
    out
}

/// The KV memory of one sequence holding `positions` positions: per layer, a K and a V row per
/// position held, with sliding layers holding at most their ring's slots (the window and
/// kv::RING_SLACK beyond it, as the CPU and CUDA caches keep to go back for prefix reuse).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvCost {
    row_bytes: usize,
    n_sliding: usize,
    n_full: usize,
    ring_slots: usize,
}

impl KvCost {
    pub fn new(cfg: &MuseConfig, ty: KvType) -> Result<Self> {
        let n_sliding = cfg.layer_kinds.iter().filter(|k| k.is_sliding()).count();
        Ok(KvCost {
            row_bytes: ty.row_bytes(cfg.kv_dim())?,
            n_sliding,
            n_full: cfg.layer_kinds.len() - n_sliding,
            ring_slots: cfg.n_swa.saturating_add(muser_engine::kv::RING_SLACK),
        })
    }

    pub fn bytes(&self, positions: usize) -> usize {
        let rows = (self.n_sliding * positions.min(self.ring_slots))
            .saturating_add(self.n_full.saturating_mul(positions));
        2usize.saturating_mul(self.row_bytes).saturating_mul(rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dec(ready: bool) -> SeqView {
        SeqView {
            prompt_left: 0,
            ready,
            guess: 0,
        }
    }

    fn pre(n: usize) -> SeqView {
        SeqView {
            prompt_left: n,
            ready: true,
            guess: 0,
        }
    }

    #[test]
    fn decode_tokens_come_first_and_prompts_are_chunked() {
        // Two decoding streams and a 1000-token prompt with a 64-token step: the streams each
        // get their token, the prompt the other 62.
        let s = [dec(true), pre(1000), dec(true)];
        assert_eq!(plan(&s, 64), vec![(0, 1), (1, 62), (2, 1)]);
        // The prompt advances by 62 per step and never starves the streams.
        let mut left = 1000;
        let mut steps = 0;
        while left > 0 {
            let p = plan(
                &[
                    dec(true),
                    SeqView {
                        prompt_left: left,
                        ready: true,
                        guess: 0,
                    },
                    dec(true),
                ],
                64,
            );
            assert_eq!(p.iter().filter(|&&(i, n)| i != 1 && n == 1).count(), 2);
            left -= p.iter().find(|&&(i, _)| i == 1).map_or(0, |&(_, n)| n);
            steps += 1;
        }
        assert_eq!(steps, 1000usize.div_ceil(62));
    }

    #[test]
    fn guesses_take_what_the_prompts_leave() {
        let g = |guess| SeqView {
            prompt_left: 0,
            ready: true,
            guess,
        };
        // Decode tokens, then the prompt, then the guesses in order with what is left.
        assert_eq!(
            plan(&[g(8), pre(20), g(8)], 32),
            vec![(0, 9), (1, 20), (2, 3)]
        );
        assert_eq!(
            plan(&[g(8), pre(5), g(8)], 64),
            vec![(0, 9), (1, 5), (2, 9)]
        );
        // A prompt filling the step leaves no guess; a blocked stream guesses nothing.
        assert_eq!(plan(&[g(8), pre(100)], 16), vec![(0, 1), (1, 15)]);
        let blocked = SeqView {
            ready: false,
            ..g(8)
        };
        assert_eq!(plan(&[blocked, g(2)], 16), vec![(1, 3)]);
    }

    #[test]
    fn older_prompts_first_and_blocked_streams_skipped() {
        let s = [pre(10), dec(false), pre(100), pre(5)];
        assert_eq!(plan(&s, 50), vec![(0, 10), (2, 40)]);
        assert_eq!(plan(&s, 200), vec![(0, 10), (2, 100), (3, 5)]);
        assert!(plan(&[dec(false)], 8).is_empty());
        assert!(plan(&[], 8).is_empty());
    }

    #[test]
    fn kv_cost_counts_windows_and_planes() {
        let c = KvCost {
            row_bytes: 10,
            n_sliding: 2,
            n_full: 1,
            ring_slots: 16,
        };
        assert_eq!(c.bytes(0), 0);
        assert_eq!(c.bytes(8), 2 * 10 * (2 * 8 + 8));
        assert_eq!(c.bytes(100), 2 * 10 * (2 * 16 + 100));
        assert_eq!(c.bytes(usize::MAX), usize::MAX);
    }
}
