//! Speculative decoding from the sequence's own tokens (`muser_engine::speculative`): in the
//! CPU's accurate mode, where a forward of several tokens gives each the bits of one at a time,
//! it samples plain decoding's tokens, greedy and seeded (with penalties), while keeping some
//! of its guesses; a cache taken back after a wrong guess continues as a fresh one.

mod common;

use common::{all_fixtures, load};
use muser_engine::speculative::{self, NgramDraft};
use muser_engine::{
    Backend, KvType, Logits, MuseGlimmer, NumericMode, Sampler, SamplingParams, Session,
};

/// Plain decoding: `n` tokens after `prompt`, one forward each.
fn plain<B: Backend>(m: &MuseGlimmer<B>, prompt: &[u32], n: usize, p: &SamplingParams) -> Vec<u32> {
    let mut s = Session::new(m, KvType::F32, prompt.len() + n + 8).unwrap();
    let mut sampler = Sampler::new(p.clone());
    prompt.iter().for_each(|&t| sampler.accept(t));
    let mut logits = s.feed(prompt, 64, Logits::Last).unwrap();
    let mut out = Vec::new();
    while out.len() < n {
        let t = sampler.sample(&logits);
        sampler.accept(t);
        out.push(t);
        logits = s.feed(&[t], 1, Logits::Last).unwrap();
    }
    out
}

/// Plain decoding with each token drawn next to the logits, as a device draws it
/// (`Sampler::row_draw`, `RowDraw::choose`: the host reference of `Backend::draw_rows`), whose
/// random stream is the draws' own, not the host sampler's.
fn plain_drawn<B: Backend>(
    m: &MuseGlimmer<B>,
    prompt: &[u32],
    n: usize,
    p: &SamplingParams,
) -> Vec<u32> {
    let mut s = Session::new(m, KvType::F32, prompt.len() + n + 8).unwrap();
    let mut sampler = Sampler::new(p.clone());
    prompt.iter().for_each(|&t| sampler.accept(t));
    let first = s.feed(prompt, 64, Logits::Last).unwrap();
    // The first token as the loop below takes it: sampled on the host.
    let mut t = sampler.sample(&first);
    sampler.accept(t);
    let mut out = vec![t];
    while out.len() < n {
        let mut row = s.feed(&[t], 1, Logits::Last).unwrap();
        let d = sampler.row_draw(&[], m.config.n_vocab);
        d.edit(&mut row);
        t = d.choose(&row);
        sampler.accept(t);
        out.push(t);
    }
    out
}

/// Speculative decoding of the same: the tokens, and the guessed tokens kept.
fn guessed<B: Backend>(
    m: &MuseGlimmer<B>,
    prompt: &[u32],
    n: usize,
    p: &SamplingParams,
    d: NgramDraft,
) -> (Vec<u32>, usize) {
    guessed_with(m, prompt, n, p, d, false)
}

/// As `guessed`, the rows drawn next to the logits (`drawn`: `Backend::draw_rows`, a device's
/// way, whose host reference the CPU runs) or sampled on the host.
fn guessed_with<B: Backend>(
    m: &MuseGlimmer<B>,
    prompt: &[u32],
    n: usize,
    p: &SamplingParams,
    d: NgramDraft,
    drawn: bool,
) -> (Vec<u32>, usize) {
    let mut s = Session::new(m, KvType::F32, prompt.len() + n + 8).unwrap();
    let mut sampler = Sampler::new(p.clone());
    prompt.iter().for_each(|&t| sampler.accept(t));
    let logits = s.feed(prompt, 64, Logits::Last).unwrap();
    let mut t = sampler.sample(&logits);
    sampler.accept(t);
    let mut out = vec![t];
    let mut history = prompt.to_vec();
    history.push(t);
    let mut kept = 0;
    while out.len() < n {
        let guess = d.draft(&history);
        let st = speculative::step_with(&mut s, &mut sampler, t, &guess, &[], n - out.len(), drawn)
            .unwrap();
        assert!(!st.tokens.is_empty() && st.accepted < st.tokens.len());
        assert_eq!(st.tokens[..st.accepted], guess[..st.accepted]);
        // The cache holds every token but the last sampled.
        assert_eq!(s.pos(), prompt.len() + out.len() + st.tokens.len() - 1);
        kept += st.accepted;
        out.extend_from_slice(&st.tokens);
        history.extend_from_slice(&st.tokens);
        t = *st.tokens.last().unwrap();
    }
    assert_eq!(out.len(), n);
    (out, kept)
}

/// A prompt that repeats itself, so that guesses come from the start.
fn prompt(n_vocab: usize, len: usize) -> Vec<u32> {
    let phrase: Vec<u32> = (0..7).map(|i| ((i * 37 + 5) % n_vocab) as u32).collect();
    phrase.iter().copied().cycle().take(len).collect()
}

#[test]
fn guesses_sample_plain_decodings_tokens() {
    let greedy = SamplingParams {
        temperature: 0.0,
        ..Default::default()
    };
    let sampled = SamplingParams {
        temperature: 0.9,
        top_k: 40,
        top_p: 0.95,
        min_p: 0.02,
        repeat_penalty: 1.1,
        seed: 7,
        ..Default::default()
    };
    let mut kept_total = 0;
    for name in all_fixtures()
        .iter()
        .filter(|n| n.ends_with("q4_k_m") || n.ends_with("f32"))
    {
        let m = load(name, NumericMode::Accurate);
        let n_vocab = m.config.n_vocab;
        for (p, what) in [(&greedy, "greedy"), (&sampled, "sampled")] {
            for (len, n) in [(12usize, 60usize), (30, 40)] {
                let pr = prompt(n_vocab, len);
                let want = plain(&m, &pr, n, p);
                let want_drawn = plain_drawn(&m, &pr, n, p);
                for d in [
                    NgramDraft::new(1, 4).unwrap(),
                    NgramDraft::new(2, 16).unwrap(),
                ] {
                    let (got, kept) = guessed(&m, &pr, n, p, d);
                    assert_eq!(got, want, "{name} {what} prompt {len}, draft {d:?}");
                    kept_total += kept;
                    // Drawn next to the logits (a device's way): plain decoding's draws
                    // made there.
                    let (got, kept_drawn) = guessed_with(&m, &pr, n, p, d, true);
                    assert_eq!(
                        got, want_drawn,
                        "{name} {what} prompt {len}, draft {d:?}, drawn"
                    );
                    kept_total += kept_drawn;
                }
            }
        }
    }
    println!("guessed tokens kept: {kept_total}");
    // Guesses that are never kept would test only the taking back.
    assert!(kept_total > 0, "no guess was ever kept");
}

/// Past the sliding layers' rings (the fixtures' window of 16 plus 512 positions): guesses run
/// while the rings wrap, and are taken back across the wrap.
#[test]
fn guesses_across_the_rings_wrap() {
    let name = all_fixtures()
        .into_iter()
        .find(|n| n == "tame-q4_k_m")
        .expect("the tame-q4_k_m fixture");
    let m = load(&name, NumericMode::Accurate);
    let greedy = SamplingParams {
        temperature: 0.0,
        ..Default::default()
    };
    let pr = prompt(m.config.n_vocab, 520);
    let want = plain(&m, &pr, 40, &greedy);
    let (got, _) = guessed(&m, &pr, 40, &greedy, NgramDraft::new(3, 24).unwrap());
    assert_eq!(got, want);
}
