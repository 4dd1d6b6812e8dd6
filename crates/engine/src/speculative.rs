//! Speculative decoding from the sequence's own tokens (prompt lookup; llama.cpp's
//! `ngram-simple`, common/ngram-map.cpp): where the last `n` tokens appeared before, the tokens
//! that followed them then are guessed to follow again. The guess and the token before it run
//! in one forward; each row is sampled in turn, as plain decoding would sample it, and the guess
//! is kept while the samples agree with it.
//!
//! Each emitted token is one draw of the sampler from the row plain decoding would have given
//! it, in the same order, so the tokens are plain decoding's wherever a forward of several
//! tokens gives the logits of one token at a time: the CPU's accurate mode does, bit for bit, as
//! does CUDA's `--batch-invariant` mode. Elsewhere the rows differ in the last bits and a
//! sampled token may come out otherwise where two logits nearly tie. A guess that is wrong costs
//! its rows' compute, and its positions are taken back out of the cache.
//!
//! On a backend that draws where the logits are (`Backend::draws_on_device`: CUDA), every row
//! is drawn there (`Session::feed_drawn`) and no logits come to the host; a seeded draw there
//! takes its randomness from `RowDraw`'s stream, as the server's device draws do, not from the
//! host sampler's, so a seeded run on the GPU is another sample than the CPU's of the same seed
//! (greedy is the same choice either way).

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::sampling::{NOT_FINITE, RowDraw, Sampler};
use crate::session::{Logits, Session};

/// The longest guess: a guess's positions are written past the ones kept, and a sliding
/// layer's ring keeps 512 positions beyond its window to go back from.
pub const MAX_DRAFT: usize = 256;

/// Guesses from the sequence's earlier tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NgramDraft {
    /// Tokens matched: the last `n` of the sequence.
    pub n: usize,
    /// Tokens guessed at most.
    pub max: usize,
}

impl NgramDraft {
    pub fn new(n: usize, max: usize) -> Result<Self> {
        if n == 0 || max == 0 || max > MAX_DRAFT {
            return Err(Error::Input(format!(
                "a draft matches at least 1 token (asked {n}) and guesses 1 to {MAX_DRAFT} (asked {max})"
            )));
        }
        Ok(NgramDraft { n, max })
    }

    /// The `max` tokens that followed the latest earlier appearance of `tokens`' last `n` (none
    /// where they never appeared before). Where the sequence ends before `max` tokens, the copy
    /// goes on from its own start, as an overlapping copy does (a sequence going round a loop
    /// is guessed to go on round it): a guess that is found is always `max` long, so the
    /// forwards that check guesses have one shape (a backend may record it once and replay it).
    pub fn draft(&self, tokens: &[u32]) -> Vec<u32> {
        match tokens.split_last() {
            Some((&last, head)) => self.draft_after(head, last),
            None => Vec::new(),
        }
    }

    /// As `draft` for the sequence `head` then `last`, without building it (the server's
    /// sequences keep their tokens and their pending one apart).
    pub fn draft_after(&self, head: &[u32], last: u32) -> Vec<u32> {
        let n = self.n;
        let len = head.len() + 1;
        if len <= n {
            return Vec::new();
        }
        // The pattern is head's last n - 1 tokens, then `last`.
        let tail = &head[head.len() + 1 - n..];
        // The latest start before the pattern's own: its last token found first (one compare a
        // position), then the rest. Every earlier appearance lies within `head`.
        let Some(j) = head
            .iter()
            .enumerate()
            .skip(n - 1)
            .rev()
            .filter(|&(_, &t)| t == last)
            .map(|(e, _)| e + 1 - n)
            .find(|&j| head[j..j + n - 1] == *tail)
        else {
            return Vec::new();
        };
        let at = |i: usize| if i < head.len() { head[i] } else { last };
        let from = j + n;
        let mut guess: Vec<u32> = Vec::with_capacity(self.max);
        for i in from..from + self.max {
            let t = if i < len { at(i) } else { guess[i - len] };
            guess.push(t);
        }
        guess
    }
}

/// What one speculative step gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// The tokens sampled, in order: the guess's agreed tokens, then the first that disagreed
    /// (or the one after the whole guess). The last is not in the cache yet.
    pub tokens: Vec<u32>,
    /// How many of the guess were kept.
    pub accepted: usize,
}

/// Runs `last` (sampled, not yet in the cache) and `guess` after it in one forward and samples
/// their rows in turn with `sampler` (each token accepted into it as sampled), stopping at the
/// first sample that is not the guess's next token, at an end-of-generation token (in `eog`),
/// or after `limit` tokens. The cache keeps `last` and the guessed tokens that were sampled.
/// Its rows are drawn where the logits are when the backend draws there (`draws_on_device`).
pub fn step<B: Backend>(
    s: &mut Session<'_, B>,
    sampler: &mut Sampler,
    last: u32,
    guess: &[u32],
    eog: &[u32],
    limit: usize,
) -> Result<Step> {
    let drawn = s.model.backend.draws_on_device();
    step_with(s, sampler, last, guess, eog, limit, drawn)
}

/// As [`step`], the rows drawn next to the logits (`Backend::draw_rows`, through
/// `Session::feed_drawn`) if `drawn`, or brought to the host and sampled there.
pub fn step_with<B: Backend>(
    s: &mut Session<'_, B>,
    sampler: &mut Sampler,
    last: u32,
    guess: &[u32],
    eog: &[u32],
    limit: usize,
    drawn: bool,
) -> Result<Step> {
    let start = s.pos();
    // The guess fits the context and the tokens still wanted (the last row's sample is one).
    let room = s.n_ctx().saturating_sub(start + 1);
    let guess = &guess[..guess.len().min(room).min(limit.saturating_sub(1))];
    let mut fed = Vec::with_capacity(1 + guess.len());
    fed.push(last);
    fed.extend_from_slice(guess);
    let n_vocab = s.model.config.n_vocab;
    let mut tokens = Vec::new();
    if drawn {
        // Each row drawn where the logits are, by the draw plain decoding would make there had
        // the guess's tokens before it been drawn (a copy of the sampler takes them in turn;
        // the server's guessing rows do the same): no logits come to the host.
        let mut tmp = sampler.clone();
        let draws: Vec<RowDraw> = (0..fed.len())
            .map(|k| {
                let d = tmp.row_draw(&[], n_vocab);
                if let Some(&t) = guess.get(k) {
                    tmp.accept(t);
                }
                d
            })
            .collect();
        let ids = s.feed_drawn(&fed, &draws)?;
        for (i, &t) in ids.iter().enumerate() {
            if t == NOT_FINITE {
                return Err(not_finite(start + i));
            }
            // The copy's draw, counted as this sampler's.
            sampler.count_draw();
            sampler.accept(t);
            tokens.push(t);
            if i == guess.len() || t != guess[i] || eog.contains(&t) {
                break;
            }
        }
        return finish(s, start, tokens);
    }
    let logits = s.feed(&fed, fed.len(), Logits::All)?;
    for (i, row) in logits.chunks_exact(n_vocab).enumerate() {
        // Logits that overflowed would sample token 0 over and over, saying nothing.
        if row.iter().any(|v| !v.is_finite()) {
            return Err(not_finite(start + i));
        }
        let t = sampler.sample(row);
        sampler.accept(t);
        tokens.push(t);
        if i == guess.len() || t != guess[i] || eog.contains(&t) {
            break;
        }
    }
    finish(s, start, tokens)
}

fn not_finite(pos: usize) -> Error {
    Error::Backend(format!(
        "the model's logits are not finite at position {pos}: its weights or scales overflow f32 (a damaged file?)"
    ))
}

/// The step's end: the cache taken back to `start` and the tokens sampled but the last.
fn finish<B: Backend>(s: &mut Session<'_, B>, start: usize, tokens: Vec<u32>) -> Result<Step> {
    // Rows past the first disagreement were for tokens that will not be: their positions go.
    let keep = start + tokens.len();
    if keep < s.pos() && !s.truncate(keep) {
        return Err(Error::Backend(format!(
            "the cache cannot go back from {} to {keep} positions after a guess",
            s.pos()
        )));
    }
    Ok(Step {
        accepted: tokens.len() - 1,
        tokens,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_guess_is_what_followed_the_latest_earlier_match() {
        let d = NgramDraft::new(2, 3).unwrap();
        // "1 2" appeared at 0 (followed by 3 4 5) and at 5 (followed by 9 1 2): the latest wins.
        assert_eq!(d.draft(&[1, 2, 3, 4, 5, 1, 2, 9, 1, 2]), vec![9, 1, 2]);
        assert_eq!(d.draft(&[1, 2, 3, 1, 2]), vec![3, 1, 2]);
        // Past the sequence's end the copy goes on round the loop it found.
        assert_eq!(d.draft(&[7, 1, 2, 8, 1, 2]), vec![8, 1, 2]);
        assert_eq!(d.draft(&[1, 2, 1, 2]), vec![1, 2, 1]);
        assert_eq!(d.draft(&[5, 1, 2, 1, 2]), vec![1, 2, 1]);
        // A run of one token (llama.cpp's ngram-simple finds its latest match one position back,
        // one token to copy, fewer than its n, and guesses nothing there): the run goes on.
        assert_eq!(d.draft(&[4, 30, 30, 30]), vec![30, 30, 30]);
        assert_eq!(d.draft(&[4, 30, 30]), Vec::<u32>::new());
        let long = NgramDraft::new(1, 7).unwrap();
        assert_eq!(long.draft(&[4, 5, 6, 4]), vec![5, 6, 4, 5, 6, 4, 5]);
        // No earlier match, or too short.
        assert!(d.draft(&[1, 2, 3, 4]).is_empty());
        assert!(d.draft(&[1, 2]).is_empty());
        assert!(d.draft(&[]).is_empty());
        let one = NgramDraft::new(1, 8).unwrap();
        assert_eq!(one.draft(&[5, 6, 7, 5]), vec![6, 7, 5, 6, 7, 5, 6, 7]);
        assert!(NgramDraft::new(0, 4).is_err());
        assert!(NgramDraft::new(2, 0).is_err());
        assert!(NgramDraft::new(2, MAX_DRAFT + 1).is_err());
    }
}
