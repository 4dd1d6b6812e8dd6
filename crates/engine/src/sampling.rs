//! Token selection: greedy, or a seeded draw after penalties, top-k, top-p, min-p and
//! temperature (llama.cpp's default chain order: penalties, top-k, top-p, min-p, temperature,
//! then the draw).

/// Sampling parameters. `temperature <= 0` selects greedily (after penalties).
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens (0 = all).
    pub top_k: usize,
    /// Keep the smallest set whose probability reaches `top_p` (1 = all).
    pub top_p: f32,
    /// Drop tokens whose probability is below `min_p` times the top one's (0 = none).
    pub min_p: f32,
    /// llama.cpp's repetition penalty over the last `penalty_last_n` tokens (1 = off):
    /// a positive logit is divided by it, a negative one multiplied.
    pub repeat_penalty: f32,
    /// OpenAI-style penalties: logit -= frequency * count + presence * [count > 0].
    pub frequency_penalty: f32,
    pub presence_penalty: f32,
    pub penalty_last_n: usize,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            penalty_last_n: 64,
            seed: 0,
        }
    }
}

impl SamplingParams {
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            ..Default::default()
        }
    }

    pub fn validate(&self) -> Result<(), String> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(format!(
                "temperature {} must be a finite number >= 0",
                self.temperature
            ));
        }
        if !(0.0..=1.0).contains(&self.top_p) {
            return Err(format!("top_p {} must be in [0, 1]", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(format!("min_p {} must be in [0, 1]", self.min_p));
        }
        if !self.repeat_penalty.is_finite() || self.repeat_penalty <= 0.0 {
            return Err(format!(
                "repeat_penalty {} must be > 0",
                self.repeat_penalty
            ));
        }
        for (n, v) in [
            ("frequency_penalty", self.frequency_penalty),
            ("presence_penalty", self.presence_penalty),
        ] {
            if !v.is_finite() || !(-2.0..=2.0).contains(&v) {
                return Err(format!("{n} {v} must be in [-2, 2]"));
            }
        }
        Ok(())
    }
}

/// A small, stable PRNG (SplitMix64): the same seed gives the same tokens on every machine
/// and every version of Muser.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The index of the largest logit (the lowest index among ties).
pub fn argmax(logits: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best
}

/// Log-softmax in f64.
pub fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let m = logits
        .iter()
        .fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
    let lse = logits
        .iter()
        .map(|&v| (v as f64 - m).exp())
        .sum::<f64>()
        .ln()
        + m;
    logits.iter().map(|&v| v as f64 - lse).collect()
}

/// A sampler with its RNG and the history its penalties read.
#[derive(Clone, Debug)]
pub struct Sampler {
    pub params: SamplingParams,
    rng: Rng,
    history: Vec<u32>,
    /// The row being sampled, adjusted (penalties, the caller's changes), and the draw's
    /// weights: kept from draw to draw, so a 202,048-token row costs no allocation.
    row: Vec<f32>,
    weights: Vec<f64>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        let rng = Rng::new(params.seed);
        Sampler {
            params,
            rng,
            history: Vec::new(),
            row: Vec::new(),
            weights: Vec::new(),
        }
    }

    /// Tokens the penalties see (prompt and generated so far).
    pub fn accept(&mut self, token: u32) {
        self.history.push(token);
    }

    fn apply_penalties(&self, logits: &mut [f32]) {
        let p = &self.params;
        if p.repeat_penalty == 1.0 && p.frequency_penalty == 0.0 && p.presence_penalty == 0.0 {
            return;
        }
        let start = self.history.len().saturating_sub(p.penalty_last_n);
        let mut counts: std::collections::HashMap<u32, u32> = std::collections::HashMap::new();
        for &t in &self.history[start..] {
            *counts.entry(t).or_default() += 1;
        }
        for (&t, &n) in &counts {
            let Some(l) = logits.get_mut(t as usize) else {
                continue;
            };
            if p.repeat_penalty != 1.0 {
                *l = if *l > 0.0 {
                    *l / p.repeat_penalty
                } else {
                    *l * p.repeat_penalty
                };
            }
            *l -= n as f32 * p.frequency_penalty + if n > 0 { p.presence_penalty } else { 0.0 };
        }
    }

    /// Choose the next token from one row of logits.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        self.sample_adjusted(logits, |_| {})
    }

    /// As `sample`, after `adjust` has changed a copy of the row (logit biases, masked tokens).
    pub fn sample_adjusted(&mut self, logits: &[f32], adjust: impl FnOnce(&mut [f32])) -> u32 {
        let mut l = std::mem::take(&mut self.row);
        l.clear();
        l.extend_from_slice(logits);
        adjust(&mut l);
        let id = self.sample_in_place(&mut l);
        self.row = l;
        id
    }

    /// The draw on a copy of the row the sampler may change (penalties).
    fn sample_in_place(&mut self, l: &mut [f32]) -> u32 {
        self.apply_penalties(l);
        let l: &[f32] = l;
        let p = &self.params;
        if p.temperature <= 0.0 {
            return argmax(&l) as u32;
        }
        // Candidates sorted by logit (ties: the lower id first). A full sort of a 202,048-token
        // vocabulary takes about 15 ms, which at 64 sequences was most of a server step, so
        // it is avoided: the top_k best are found in one pass; with every token a candidate
        // (OpenAI's default top_k = 0), top_p takes the shortest sorted prefix that reaches
        // it, min_p the tokens above its threshold, and with neither the draw runs over the
        // logits in id order (the same distribution as over the sorted ones).
        // Whether the candidates already went through top_p (or, without it, min_p): those
        // passes must not run again on the shorter, renormalized list.
        let (mut top_p_done, mut min_p_done) = (false, false);
        let top = || l.iter().copied().max_by(|a, b| a.total_cmp(b));
        let cand = if p.top_k > 0 && p.top_k < l.len() {
            top_k_sorted(l, p.top_k)
        } else if let Some(m) = top().filter(|m| m.is_finite()) {
            if p.top_p < 1.0 {
                top_p_done = true;
                top_p_prefix(l, m, p.top_p)
            } else if p.min_p > 0.0 {
                min_p_done = true;
                min_p_sorted(l, m, p.min_p)
            } else {
                return draw_in_id_order(l, m, p.temperature, &mut self.rng, &mut self.weights);
            }
        } else {
            // A NaN or infinite logit: the plain sort's order, whatever it makes of it.
            let mut c: Vec<(u32, f32)> =
                l.iter().enumerate().map(|(i, &v)| (i as u32, v)).collect();
            c.sort_by(candidate_order);
            c
        };
        let mut cand = cand;
        if p.top_p < 1.0 && !top_p_done {
            let pr = sorted_probs(&cand);
            let mut cum = 0.0;
            let mut keep = cand.len();
            for (i, q) in pr.iter().enumerate() {
                cum += q;
                if cum >= p.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
            cand.truncate(keep.max(1));
        }
        if p.min_p > 0.0 && !min_p_done {
            let pr = sorted_probs(&cand);
            let keep = pr
                .iter()
                .take_while(|&&q| q >= p.min_p as f64 * pr[0])
                .count();
            cand.truncate(keep.max(1));
        }
        draw_sorted(&cand, p.temperature, &mut self.rng)
    }
}

/// The probabilities of sorted candidates (softmax at temperature 1, in f64).
fn sorted_probs(c: &[(u32, f32)]) -> Vec<f64> {
    let m = c[0].1 as f64;
    let e: Vec<f64> = c.iter().map(|&(_, v)| (v as f64 - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.into_iter().map(|x| x / s).collect()
}

/// One draw from sorted candidates at temperature `t`: weights exp((v - max) / t), a uniform
/// point on their sum, walked in candidate order.
fn draw_sorted(cand: &[(u32, f32)], t: f32, rng: &mut Rng) -> u32 {
    let t = t as f64;
    let m = cand[0].1 as f64;
    let w: Vec<f64> = cand
        .iter()
        .map(|&(_, v)| ((v as f64 - m) / t).exp())
        .collect();
    let mut r = rng.next_f64() * w.iter().sum::<f64>();
    for (i, wi) in w.iter().enumerate() {
        if r < *wi {
            return cand[i].0;
        }
        r -= wi;
    }
    cand[cand.len() - 1].0
}

/// The sampler's candidate order: higher logit first (`total_cmp`), ties by lower id.
fn candidate_order(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// With every token a candidate: the shortest prefix of the sorted candidates whose share of
/// the whole distribution (exp(v - m) over the sum of all, m the largest logit) reaches `top_p`,
/// or all of them; found with ever larger top-k passes rather than a full sort.
fn top_p_prefix(logits: &[f32], m: f32, top_p: f32) -> Vec<(u32, f32)> {
    let m = m as f64;
    let total: f64 = logits.iter().map(|&v| (v as f64 - m).exp()).sum();
    let n = logits.len();
    let mut k = 64;
    loop {
        let mut c = if k < n / 4 {
            top_k_sorted(logits, k)
        } else {
            let mut c: Vec<(u32, f32)> = logits
                .iter()
                .enumerate()
                .map(|(i, &v)| (i as u32, v))
                .collect();
            c.sort_by(candidate_order);
            c
        };
        let mut cum = 0.0;
        for i in 0..c.len() {
            cum += (c[i].1 as f64 - m).exp() / total;
            if cum >= top_p as f64 {
                c.truncate(i + 1);
                return c;
            }
        }
        if c.len() == n {
            return c;
        }
        k *= 4;
    }
}

/// With every token a candidate: those whose probability is at least `min_p` times the top
/// one's (exp(v - m) >= min_p), sorted.
fn min_p_sorted(logits: &[f32], m: f32, min_p: f32) -> Vec<(u32, f32)> {
    let m = m as f64;
    let mut c: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .filter(|&(_, &v)| (v as f64 - m).exp() >= min_p as f64)
        .map(|(i, &v)| (i as u32, v))
        .collect();
    c.sort_by(candidate_order);
    if c.is_empty() {
        // min_p above 1 keeps nothing: the top candidate stays, as in the sorted chain.
        c = top_k_sorted(logits, 1);
    }
    c
}

/// A draw over every token with weights exp((v - m) / t), walked in id order.
/// (`weights`: the caller's buffer, reused from draw to draw.)
fn draw_in_id_order(logits: &[f32], m: f32, t: f32, rng: &mut Rng, weights: &mut Vec<f64>) -> u32 {
    let (m, t) = (m as f64, t as f64);
    weights.clear();
    weights.extend(logits.iter().map(|&v| ((v as f64 - m) / t).exp()));
    let total: f64 = weights.iter().sum();
    let mut r = rng.next_f64() * total;
    let mut last = 0;
    for (i, &w) in weights.iter().enumerate() {
        if w > 0.0 {
            last = i;
            if r < w {
                return i as u32;
            }
            r -= w;
        }
    }
    last as u32
}

/// The first `k` (k > 0) candidates of `logits` in `candidate_order`, as a full sort
/// would give them: one pass keeping the best `k` in a heap whose top is the worst kept.
fn top_k_sorted(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    use std::cmp::Ordering;
    use std::collections::BinaryHeap;
    /// Ordered so that the heap's maximum is the candidate that sorts last.
    struct Worst((u32, f32));
    impl PartialEq for Worst {
        fn eq(&self, o: &Self) -> bool {
            self.cmp(o) == Ordering::Equal
        }
    }
    impl Eq for Worst {}
    impl PartialOrd for Worst {
        fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
            Some(self.cmp(o))
        }
    }
    impl Ord for Worst {
        fn cmp(&self, o: &Self) -> Ordering {
            candidate_order(&self.0, &o.0)
        }
    }
    let mut heap: BinaryHeap<Worst> = BinaryHeap::with_capacity(k + 1);
    for (i, &v) in logits.iter().enumerate() {
        let c = (i as u32, v);
        if heap.len() < k {
            heap.push(Worst(c));
        } else if let Some(top) = heap.peek() {
            // Ids come in increasing order, so a tie with the worst kept sorts after it.
            if candidate_order(&c, &top.0) == Ordering::Less {
                heap.pop();
                heap.push(Worst(c));
            }
        }
    }
    let mut out: Vec<(u32, f32)> = heap.into_iter().map(|w| w.0).collect();
    out.sort_by(candidate_order);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sorted candidates and their probabilities over the whole vocabulary, the slow way.
    fn sorted_with_probs(l: &[f32]) -> (Vec<(u32, f32)>, Vec<f64>) {
        let mut c: Vec<(u32, f32)> = l.iter().enumerate().map(|(i, &v)| (i as u32, v)).collect();
        c.sort_by(candidate_order);
        let m = c[0].1 as f64;
        let e: Vec<f64> = c.iter().map(|&(_, v)| (v as f64 - m).exp()).collect();
        let s: f64 = e.iter().sum();
        (c, e.into_iter().map(|x| x / s).collect())
    }

    #[test]
    fn top_p_and_min_p_without_top_k_keep_what_a_full_sort_keeps() {
        let mut rng = Rng::new(5);
        for &(n, spread) in &[
            (5000usize, 8.0f32),
            (5000, 0.5),
            (300, 20.0),
            (202_048, 12.0),
        ] {
            let l: Vec<f32> = (0..n)
                .map(|_| (rng.next_f64() as f32 - 0.5) * spread)
                .collect();
            let m = l.iter().copied().fold(f32::MIN, f32::max);
            let (full, pr) = sorted_with_probs(&l);
            for &top_p in &[0.05f32, 0.5, 0.9, 0.999] {
                let mut cum = 0.0;
                let keep = pr
                    .iter()
                    .position(|q| {
                        cum += q;
                        cum >= top_p as f64
                    })
                    .map_or(n, |i| i + 1);
                let got = top_p_prefix(&l, m, top_p);
                assert_eq!(got.len(), keep, "n={n} spread={spread} top_p={top_p}");
                assert!(got.iter().zip(&full).all(|(a, b)| a.0 == b.0));
            }
            for &min_p in &[0.01f32, 0.2, 0.9] {
                let keep = pr
                    .iter()
                    .take_while(|&&q| q >= min_p as f64 * pr[0])
                    .count();
                let got = min_p_sorted(&l, m, min_p);
                assert_eq!(got.len(), keep, "n={n} spread={spread} min_p={min_p}");
                assert!(got.iter().zip(&full).all(|(a, b)| a.0 == b.0));
            }
        }
    }

    /// The sampling chain with a full sort of the vocabulary (the code before the one-pass
    /// selections): penalties aside, top_k, top_p, min_p over the fully sorted list, then the
    /// sampler's own draw (`draw_sorted`, unchanged by them): what is compared is the choice of
    /// candidates.
    fn full_sort_sample(p: &SamplingParams, rng: &mut Rng, l: &[f32]) -> u32 {
        let (mut cand, _) = sorted_with_probs(l);
        if p.top_k > 0 && p.top_k < cand.len() {
            cand.truncate(p.top_k);
        }
        if p.top_p < 1.0 {
            let pr = sorted_probs(&cand);
            let mut cum = 0.0;
            let keep = pr
                .iter()
                .position(|q| {
                    cum += q;
                    cum >= p.top_p as f64
                })
                .map_or(cand.len(), |i| i + 1);
            cand.truncate(keep.max(1));
        }
        if p.min_p > 0.0 {
            let pr = sorted_probs(&cand);
            let keep = pr
                .iter()
                .take_while(|&&q| q >= p.min_p as f64 * pr[0])
                .count();
            cand.truncate(keep.max(1));
        }
        draw_sorted(&cand, p.temperature, rng)
    }

    #[test]
    fn the_sampler_draws_what_the_full_sort_chain_draws() {
        let mut source = Rng::new(21);
        for &(n, spread) in &[(3000usize, 10.0f32), (3000, 1.0), (40, 4.0)] {
            let l: Vec<f32> = (0..n)
                .map(|_| (source.next_f64() as f32 - 0.5) * spread)
                .collect();
            for &(top_k, top_p, min_p) in &[
                (0usize, 0.62f32, 0.0f32),
                (0, 0.9, 0.0),
                (0, 0.3, 0.05),
                (0, 1.0, 0.1),
                (0, 1.0, 1.0),
                (40, 0.95, 0.05),
                (5, 1.0, 0.0),
            ] {
                let p = SamplingParams {
                    temperature: 0.8,
                    top_k,
                    top_p,
                    min_p,
                    seed: 17,
                    ..Default::default()
                };
                let mut s = Sampler::new(p.clone());
                let mut rng = Rng::new(17);
                for i in 0..30 {
                    let want = full_sort_sample(&p, &mut rng, &l);
                    assert_eq!(
                        s.sample(&l),
                        want,
                        "n={n} spread={spread} top_k={top_k} top_p={top_p} min_p={min_p} draw {i}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_draw_over_every_token_follows_the_softmax() {
        let l = [1.0f32, 3.0, -2.0, 2.5, 0.0];
        let t = 0.8f32;
        let m = 3.0f32;
        let w: Vec<f64> = l
            .iter()
            .map(|&v| ((v - m) as f64 / t as f64).exp())
            .collect();
        let s: f64 = w.iter().sum();
        let mut rng = Rng::new(9);
        let mut counts = [0usize; 5];
        let draws = 40_000;
        let mut weights = Vec::new();
        for _ in 0..draws {
            counts[draw_in_id_order(&l, m, t, &mut rng, &mut weights) as usize] += 1;
        }
        for i in 0..5 {
            let got = counts[i] as f64 / draws as f64;
            assert!(
                (got - w[i] / s).abs() < 0.01,
                "token {i}: {got} vs {}",
                w[i] / s
            );
        }
        // Through the sampler: OpenAI's defaults (every token a candidate, no truncation).
        let params = SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 3,
            ..Default::default()
        };
        let a: Vec<u32> = {
            let mut s = Sampler::new(params.clone());
            (0..50).map(|_| s.sample(&l)).collect()
        };
        let b: Vec<u32> = {
            let mut s = Sampler::new(params);
            (0..50).map(|_| s.sample(&l)).collect()
        };
        assert_eq!(a, b, "one seed, one sequence of draws");
        assert!(a.iter().any(|&t| t != 1), "not greedy");
    }

    #[test]
    fn top_k_selection_equals_a_full_sort() {
        let mut rng = Rng::new(11);
        for &(n, k) in &[
            (1000usize, 40usize),
            (1000, 1),
            (1000, 999),
            (50, 7),
            (202_048, 40),
        ] {
            // Coarse values so ties are common; a NaN and infinities too.
            let mut l: Vec<f32> = (0..n)
                .map(|_| (rng.next_u64() % 64) as f32 * 0.25 - 8.0)
                .collect();
            l[n / 2] = f32::INFINITY;
            l[n / 3] = f32::NEG_INFINITY;
            l[n / 5] = f32::NAN;
            let mut full: Vec<(u32, f32)> =
                l.iter().enumerate().map(|(i, &v)| (i as u32, v)).collect();
            full.sort_by(candidate_order);
            full.truncate(k);
            let got = top_k_sorted(&l, k);
            assert_eq!(got.len(), k);
            assert!(
                got.iter()
                    .zip(&full)
                    .all(|(a, b)| a.0 == b.0 && a.1.to_bits() == b.1.to_bits()),
                "n={n} k={k}"
            );
        }
    }

    #[test]
    fn greedy_picks_the_max_and_seeds_reproduce() {
        let logits = [0.1f32, 2.0, -1.0, 1.9];
        assert_eq!(Sampler::new(SamplingParams::greedy()).sample(&logits), 1);
        let p = SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 42,
            ..Default::default()
        };
        let a: Vec<u32> = {
            let mut s = Sampler::new(p.clone());
            (0..50).map(|_| s.sample(&logits)).collect()
        };
        let b: Vec<u32> = {
            let mut s = Sampler::new(p.clone());
            (0..50).map(|_| s.sample(&logits)).collect()
        };
        assert_eq!(a, b);
        assert!(
            a.contains(&0) && a.contains(&3),
            "a full distribution draws more than the max"
        );
    }

    #[test]
    fn top_k_top_p_min_p_restrict_the_draw() {
        let logits = [5.0f32, 4.9, 0.0, -3.0];
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 2,
            top_p: 1.0,
            min_p: 0.0,
            ..Default::default()
        });
        assert!((0..200).all(|_| s.sample(&logits) < 2));
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.5,
            min_p: 0.0,
            ..Default::default()
        });
        assert!((0..200).all(|_| s.sample(&logits) == 0));
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.5,
            ..Default::default()
        });
        assert!((0..200).all(|_| s.sample(&logits) < 2));
    }

    #[test]
    fn temperature_sharpens_and_flattens() {
        let logits = [1.0f32, 0.0];
        let count = |t: f32| {
            let mut s = Sampler::new(SamplingParams {
                temperature: t,
                top_k: 0,
                top_p: 1.0,
                min_p: 0.0,
                seed: 1,
                ..Default::default()
            });
            (0..4000).filter(|_| s.sample(&logits) == 0).count() as f64 / 4000.0
        };
        // p0 = 1/(1+e^-1/t): 0.731 at t=1, 0.982 at t=0.25, 0.562 at t=4.
        assert!((count(1.0) - 0.731).abs() < 0.03);
        assert!(count(0.25) > 0.95);
        assert!((count(4.0) - 0.562).abs() < 0.03);
    }

    #[test]
    fn repetition_penalty_follows_llama_cpp() {
        let mut s = Sampler::new(SamplingParams {
            repeat_penalty: 2.0,
            temperature: 0.0,
            ..Default::default()
        });
        s.accept(0);
        s.accept(2);
        let mut l = vec![4.0f32, 3.0, -1.0];
        s.apply_penalties(&mut l);
        assert_eq!(l, vec![2.0, 3.0, -2.0]);
        assert_eq!(s.sample(&[4.0, 3.0, -1.0]), 1);
        let mut s = Sampler::new(SamplingParams {
            frequency_penalty: 0.5,
            presence_penalty: 1.0,
            ..Default::default()
        });
        s.accept(0);
        s.accept(0);
        let mut l = vec![4.0f32, 3.0];
        s.apply_penalties(&mut l);
        assert_eq!(l, vec![2.0, 3.0]);
    }

    #[test]
    fn log_softmax_normalizes() {
        let ls = log_softmax(&[1.0, 2.0, 3.0]);
        let s: f64 = ls.iter().map(|x| x.exp()).sum();
        assert!((s - 1.0).abs() < 1e-12);
    }
}
