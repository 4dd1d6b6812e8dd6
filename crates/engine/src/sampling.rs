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

    /// The value this generator, seeded with `seed`, gives after `k` others (its `k + 1`-th):
    /// SplitMix64's state is a counter, so any position is one mix away.
    pub fn at(seed: u64, k: u64) -> u64 {
        Rng(seed.wrapping_add(k.wrapping_mul(0x9E37_79B9_7F4A_7C15))).next_u64()
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// One change to a logit before a draw next to the logits (`RowDraw`), applied in list order
/// with the host chain's f32 arithmetic: a logit bias, a masked token, or the penalties.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LogitEdit {
    /// `v += bias`
    Add { token: u32, bias: f32 },
    /// `v = -inf`
    Mask { token: u32 },
    /// `v = v > 0 ? v / repeat : v * repeat`, then `v -= sub` (`Sampler::apply_penalties`).
    Penalize { token: u32, repeat: f32, sub: f32 },
}

impl LogitEdit {
    pub fn token(&self) -> u32 {
        match *self {
            LogitEdit::Add { token, .. }
            | LogitEdit::Mask { token }
            | LogitEdit::Penalize { token, .. } => token,
        }
    }

    /// The edit on one value (the device kernel, kernels/elementwise.cu `logit_edits`, does
    /// the same f32 operations, unfused).
    pub fn apply(&self, v: f32) -> f32 {
        match *self {
            LogitEdit::Add { bias, .. } => v + bias,
            LogitEdit::Mask { .. } => f32::NEG_INFINITY,
            LogitEdit::Penalize { repeat, sub, .. } => {
                let v = if repeat == 1.0 {
                    v
                } else if v > 0.0 {
                    v / repeat
                } else {
                    v * repeat
                };
                v - sub
            }
        }
    }
}

/// What `Backend::draw_rows` gives for a row whose logits, before their edits, hold a NaN or
/// an infinity (a file whose weights or scales overflow f32): no token can be drawn from it,
/// and a draw would silently turn it into one. No vocabulary reaches this id.
pub const NOT_FINITE: u32 = u32::MAX;

/// A token choice made where the logits are (the device), without the row going to the host:
/// the row edited (`edits`), then greedy (`inv_temperature == 0`) or one seeded draw by the
/// Gumbel-max trick.
///
/// The draw: with `m` the largest edited logit, a token is a candidate if
/// `exp(v - m) >= min_p` (min-p on the temperature-1 probabilities, as the host chain), and the
/// choice is the candidate with the largest `v * inv_temperature + g`, `g = -ln(-ln(u))`,
/// `u = ((z >> 11) + 0.5) / 2^53` and `z` the value of the SplitMix64 stream of `seed` at
/// position `(counter << 32) | id` (`Rng`'s generator, one value per token and draw). The
/// largest of `v / t + Gumbel noise` is a draw from softmax(v / t) over the candidates,
/// exactly (up to the noise's resolution, 2^-53), with every token's noise independent of
/// the others and of the batch: the same seed and step give the same token in any batch.
/// Ties go to the lowest id; with no candidate (every logit -inf or NaN) the greedy token.
/// It is not the host chain's draw (`Sampler::sample` walks one uniform through the
/// weights): the same distribution, another stream of random numbers.
///
/// Top-k and top-p (not greedy) first cut the candidates to a prefix of the edited row in
/// candidate order (larger value first, `total_cmp`'s order, ties by the lower id; NaN never
/// a candidate), as the host chain's top-k then top-p over the top-k's renormalized
/// probabilities do (llama.cpp's order): the first `top_k`, then of those the shortest prefix
/// whose weight reaches `top_p` of theirs (`draw_cut`, in the fixed point `cut_weight`, so
/// that the device and the host cut alike in any order of summation).
#[derive(Clone, Debug, PartialEq)]
pub struct RowDraw {
    /// 1 / temperature, or 0 for greedy.
    pub inv_temperature: f64,
    pub min_p: f64,
    pub seed: u64,
    /// This sequence's draw number (the position in its stream).
    pub counter: u64,
    pub edits: Vec<LogitEdit>,
    /// The tokens a grammar allows, a bit per id (bit `id % 64` of word `id / 64`, as
    /// `muser_text::grammar::mask_allows` reads it): every other token is set to -inf after
    /// the edits. None: no mask. (A mask's -inf commutes with every edit: a bias, a masked
    /// token and the penalties all keep -inf.)
    pub allowed: Option<std::sync::Arc<[u64]>>,
    /// Top-k: the first `top_k` tokens in candidate order stay candidates (0: all).
    pub top_k: usize,
    /// Top-p over those: the shortest prefix whose weight reaches `top_p` of theirs (1: all).
    pub top_p: f64,
}

impl Default for RowDraw {
    /// Greedy, nothing edited, no cut.
    fn default() -> Self {
        RowDraw {
            inv_temperature: 0.0,
            min_p: 0.0,
            seed: 0,
            counter: 0,
            edits: Vec::new(),
            allowed: None,
            top_k: 0,
            top_p: 1.0,
        }
    }
}

/// A prefix of a row in candidate order: token `(key, id)` (`order_key`) is in it if
/// `key > self.key`, or `key == self.key` and `id <= self.id`. `Cut::ALL` holds every token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cut {
    pub key: u32,
    pub id: u32,
}

impl Cut {
    pub const ALL: Cut = Cut {
        key: 0,
        id: u32::MAX,
    };

    pub fn holds(&self, key: u32, id: u32) -> bool {
        key > self.key || (key == self.key && id <= self.id)
    }
}

/// A logit's place in candidate order as an integer: larger values (as `f32::total_cmp` orders
/// them) have larger keys.
pub fn order_key(v: f32) -> u32 {
    let b = v.to_bits();
    if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    }
}

/// A candidate's weight in top-p's sums: `exp(v - m)` (`m` the row's largest) in units of
/// 2^-44, rounded to nearest (1 exactly at `m`; 0 for NaN). Integer sums are the same in any
/// order, so the device's parallel sums and the host's give one cut; a row's weights sum below
/// 2^18 * 2^44 (a vocabulary under 262,144 tokens), and the weights a unit drops move a cut
/// less than f32 probabilities would (llama.cpp's top-p sums f32).
pub fn cut_weight(v: f32, m: f32) -> u64 {
    if v == m {
        return 1 << 44;
    }
    let e = (v as f64 - m as f64).exp();
    if e >= 0.0 {
        (e * (1u64 << 44) as f64).round_ties_even() as u64
    } else {
        0
    }
}

/// Top-p's target: of `total`, the weight the prefix must reach (at least 1, at most `total`).
pub fn top_p_target(top_p: f64, total: u64) -> u64 {
    let t = (top_p * total as f64).ceil();
    if !(t >= 1.0) {
        1
    } else if t >= total as f64 {
        total
    } else {
        t as u64
    }
}

/// The cut top-k and top-p leave of an edited row (`RowDraw`), found as the device finds it: a
/// radix selection on `order_key`, 8 bits a pass, then the ties at the boundary in id order.
/// `Cut::ALL` when neither cuts.
pub fn draw_cut(row: &[f32], top_k: usize, top_p: f64) -> Cut {
    match first_largest(row) {
        Some(g) => cut_below(row, row[g], top_k, top_p),
        None => Cut::ALL,
    }
}

/// `draw_cut` of a row whose largest value is `m`.
fn cut_below(row: &[f32], m: f32, top_k: usize, top_p: f64) -> Cut {
    let mut cut = Cut::ALL;
    let k = top_k as u64;
    if top_k > 0
        && top_k < row.len()
        && let Some(c) = select_cut(row, cut, |_| 1, |total| (total > k).then_some(k))
    {
        cut = c;
    }
    if top_p < 1.0
        && let Some(c) = select_cut(
            row,
            cut,
            |v| cut_weight(v, m),
            |total| Some(top_p_target(top_p, total)),
        )
    {
        cut = c;
    }
    cut
}

/// Among the row's tokens in `within` (NaN never), the shortest prefix in candidate order whose
/// weight (`w`) reaches `target(total)` (None: no cut), as a cut.
fn select_cut(
    row: &[f32],
    within: Cut,
    w: impl Fn(f32) -> u64,
    target: impl Fn(u64) -> Option<u64>,
) -> Option<Cut> {
    let admitted = |i: usize, v: f32| !v.is_nan() && within.holds(order_key(v), i as u32);
    let (mut prefix, mut above, mut goal) = (0u32, 0u64, 0u64);
    for pass in 0..4 {
        let shift = 24 - 8 * pass;
        let mut hist = [0u64; 256];
        for (i, &v) in row.iter().enumerate() {
            if !admitted(i, v) {
                continue;
            }
            let k = order_key(v);
            if pass > 0 && k >> (shift + 8) != prefix {
                continue;
            }
            hist[(k >> shift & 255) as usize] += w(v);
        }
        if pass == 0 {
            let total: u64 = hist.iter().sum();
            goal = target(total).filter(|_| total > 0)?;
        }
        let mut b = 255;
        while b > 0 && above + hist[b] < goal {
            above += hist[b];
            b -= 1;
        }
        prefix = prefix << 8 | b as u32;
    }
    // The tokens at the boundary key, in id order: as many as reach the goal.
    let tied: Vec<(usize, f32)> = row
        .iter()
        .enumerate()
        .filter(|&(i, &v)| admitted(i, v) && order_key(v) == prefix)
        .map(|(i, &v)| (i, v))
        .collect();
    let (&(_, v), &(last, _)) = (tied.first()?, tied.last()?);
    let each = w(v).max(1);
    let need = (goal - above).div_ceil(each) as usize;
    let id = if need >= tied.len() {
        last
    } else {
        tied[need.max(1) - 1].0
    };
    Some(Cut {
        key: prefix,
        id: id as u32,
    })
}

impl RowDraw {
    /// Apply the edits to a row (ids outside it are ignored).
    pub fn edit(&self, row: &mut [f32]) {
        for e in &self.edits {
            if let Some(v) = row.get_mut(e.token() as usize) {
                *v = e.apply(*v);
            }
        }
        if let Some(m) = &self.allowed {
            for (id, v) in row.iter_mut().enumerate() {
                if !mask_bit(m, id) {
                    *v = f32::NEG_INFINITY;
                }
            }
        }
    }

    /// The token this draw chooses from an edited row: the reference the device kernel
    /// (kernels/elementwise.cu `draw_rows`) is tested against.
    pub fn choose(&self, row: &[f32]) -> u32 {
        // The largest value, the lowest id among ties, never a NaN (argmax_rows on the device).
        let greedy = first_largest(row);
        let m = greedy.map_or(0.0, |g| row[g] as f64);
        let cut = match greedy {
            Some(g) if self.cuts() => cut_below(row, row[g], self.top_k, self.top_p),
            _ => Cut::ALL,
        };
        let mut best = (f64::NEG_INFINITY, u32::MAX);
        for (i, &v) in row.iter().enumerate() {
            if !cut.holds(order_key(v), i as u32) {
                continue;
            }
            let s = self.score(v, m, i as u32);
            if s > best.0 {
                best = (s, i as u32);
            }
        }
        if best.1 == u32::MAX {
            greedy.unwrap_or(0) as u32
        } else {
            best.1
        }
    }

    /// The prefix of an edited row top-k and top-p leave (`Cut::ALL` for a greedy draw).
    pub fn cut(&self, row: &[f32]) -> Cut {
        if !self.cuts() {
            return Cut::ALL;
        }
        draw_cut(row, self.top_k, self.top_p)
    }

    /// Whether top-k or top-p may cut this draw's row (a draw, not greedy, with either set).
    pub fn cuts(&self) -> bool {
        self.inv_temperature != 0.0 && (self.top_k > 0 || self.top_p < 1.0)
    }

    /// Token `id`'s score (-inf when it is no candidate; NaN never wins a comparison).
    fn score(&self, v: f32, m: f64, id: u32) -> f64 {
        let v = v as f64;
        if self.min_p > 0.0 && !((v - m).exp() >= self.min_p) {
            return f64::NEG_INFINITY;
        }
        if self.inv_temperature == 0.0 {
            return v;
        }
        v * self.inv_temperature + gumbel(self.seed, (self.counter << 32) | id as u64)
    }
}

/// Whether bit `id` of a token mask is set (`RowDraw::allowed`); ids past its end are not.
fn mask_bit(mask: &[u64], id: usize) -> bool {
    mask.get(id / 64).is_some_and(|w| w >> (id % 64) & 1 == 1)
}

/// Gumbel noise from position `k` of the SplitMix64 stream of `seed` (`RowDraw`).
pub fn gumbel(seed: u64, k: u64) -> f64 {
    let z = Rng::at(seed, k);
    let u = ((z >> 11) as f64 + 0.5) * (1.0 / (1u64 << 53) as f64);
    -(-u.ln()).ln()
}

/// The index of the largest logit (the lowest index among ties; a NaN never wins, and a row
/// of NaNs gives 0), as the devices' `argmax_rows` chooses.
pub fn argmax(logits: &[f32]) -> usize {
    first_largest(logits).unwrap_or(0)
}

fn first_largest(row: &[f32]) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (i, &v) in row.iter().enumerate() {
        if !v.is_nan() && best.is_none_or(|b| v > row[b]) {
            best = Some(i);
        }
    }
    best
}

/// Most alternatives a row's log-probabilities list (`RowLogprob`, `Backend::row_logprobs`;
/// OpenAI's `top_logprobs` allows 20).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// A token's log-probability in a row of logits, and the row's most likely tokens with theirs
/// (`Backend::row_logprobs`: a prompt's tokens scored, a generated token's logprobs, where the
/// logits are).
#[derive(Clone, Debug, PartialEq)]
pub struct RowLogprob {
    pub logprob: f32,
    /// The `n` largest logits' ids with their log-probabilities, largest first, the lower id
    /// first among ties (candidate order, `order_key`); a NaN never. Fewer where the row has
    /// fewer tokens that are not NaN.
    pub top: Vec<(u32, f32)>,
}

impl RowLogprob {
    /// The reference: `log_softmax` in f64, token `target`'s entry (-inf past the row), and the
    /// `n` first tokens in candidate order with theirs.
    pub fn of(row: &[f32], target: u32, n: usize) -> RowLogprob {
        let ls = log_softmax(row);
        let first = |a: &u32, b: &u32| {
            let key = |i: &u32| order_key(row[*i as usize]);
            key(b).cmp(&key(a)).then(a.cmp(b))
        };
        let mut idx: Vec<u32> = (0..row.len() as u32)
            .filter(|&i| !row[i as usize].is_nan())
            .collect();
        let n = n.min(idx.len());
        if n > 0 && n < idx.len() {
            idx.select_nth_unstable_by(n - 1, first);
        }
        idx.truncate(n);
        idx.sort_by(first);
        RowLogprob {
            logprob: ls
                .get(target as usize)
                .map_or(f32::NEG_INFINITY, |&v| v as f32),
            top: idx
                .into_iter()
                .map(|t| (t, ls[t as usize] as f32))
                .collect(),
        }
    }
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
    /// How often each token occurs in the penalties' window (the last `penalty_last_n` of
    /// `history`), kept as tokens are accepted: a long generation's step costs its distinct
    /// tokens, not its length.
    counts: std::collections::BTreeMap<u32, u32>,
    /// The row being sampled, adjusted (penalties, the caller's changes), and the draw's
    /// weights: kept from draw to draw, so a 202,048-token row costs no allocation.
    row: Vec<f32>,
    weights: Vec<f64>,
    /// Draws made next to the logits (`row_draw`): the next one's position in its stream.
    draws: u64,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        let rng = Rng::new(params.seed);
        Sampler {
            params,
            rng,
            history: Vec::new(),
            counts: Default::default(),
            row: Vec::new(),
            weights: Vec::new(),
            draws: 0,
        }
    }

    /// The next token's choice as a backend makes it next to the logits (`RowDraw`): the
    /// caller's edits `pre` (logit biases, masked tokens) then this sampler's penalties, and
    /// its temperature, top-k, top-p and min-p.
    pub fn row_draw(&mut self, pre: &[LogitEdit], n_vocab: usize) -> RowDraw {
        let p = &self.params;
        let greedy = p.temperature <= 0.0;
        let mut edits = pre.to_vec();
        edits.extend(self.penalty_edits());
        let draw = RowDraw {
            inv_temperature: if greedy {
                0.0
            } else {
                1.0 / p.temperature as f64
            },
            min_p: if greedy { 0.0 } else { p.min_p as f64 },
            seed: p.seed,
            counter: self.draws,
            edits,
            allowed: None,
            top_k: if greedy || p.top_k >= n_vocab {
                0
            } else {
                p.top_k
            },
            top_p: if greedy { 1.0 } else { p.top_p as f64 },
        };
        self.draws += 1;
        draw
    }

    /// A draw made next to the logits from a copy of this sampler (`row_draw` on a clone that
    /// took guessed tokens: speculative decoding), counted here as this sampler's next.
    pub fn count_draw(&mut self) {
        self.draws += 1;
    }

    /// Tokens the penalties see (prompt and generated so far).
    pub fn accept(&mut self, token: u32) {
        self.history.push(token);
        *self.counts.entry(token).or_default() += 1;
        // The token that left the window, if one did.
        let n = self.params.penalty_last_n;
        if self.history.len() > n {
            let gone = self.history[self.history.len() - 1 - n];
            if let std::collections::btree_map::Entry::Occupied(mut e) = self.counts.entry(gone) {
                *e.get_mut() -= 1;
                if *e.get() == 0 {
                    e.remove();
                }
            }
        }
    }

    fn penalized(&self) -> bool {
        let p = &self.params;
        p.repeat_penalty != 1.0 || p.frequency_penalty != 0.0 || p.presence_penalty != 0.0
    }

    /// The penalties as edits, one per token of the window (none when they are off): `v / repeat`
    /// or `v * repeat` by the sign, then `v -= frequency * count + presence`.
    fn penalty_edits(&self) -> impl Iterator<Item = LogitEdit> + '_ {
        let p = &self.params;
        let on = self.penalized();
        self.counts
            .iter()
            .filter(move |_| on)
            .map(move |(&token, &n)| LogitEdit::Penalize {
                token,
                repeat: p.repeat_penalty,
                sub: n as f32 * p.frequency_penalty + if n > 0 { p.presence_penalty } else { 0.0 },
            })
    }

    fn apply_penalties(&self, logits: &mut [f32]) {
        for e in self.penalty_edits() {
            if let Some(l) = logits.get_mut(e.token() as usize) {
                *l = e.apply(*l);
            }
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
    fn row_logprobs_list_the_first_tokens_in_candidate_order() {
        let row = [0.0f32, 3.0, 1.0, 3.0, -2.0];
        let t = RowLogprob::of(&row, 2, 3);
        let ids = |t: &RowLogprob| t.top.iter().map(|&(i, _)| i).collect::<Vec<_>>();
        assert_eq!(ids(&t), vec![1, 3, 2], "ties: the lower id first");
        let total: f64 = log_softmax(&row).iter().map(|x| x.exp()).sum();
        assert!((total - 1.0).abs() < 1e-9);
        assert_eq!(t.logprob, t.top[2].1);
        assert!(RowLogprob::of(&row, 0, 0).top.is_empty());
        assert_eq!(RowLogprob::of(&row, 0, 99).top.len(), 5);
        assert_eq!(
            RowLogprob::of(&row, 5, 1).logprob,
            f32::NEG_INFINITY,
            "past the row"
        );
        // A NaN is never listed; +0 comes before -0 (order_key), as on the devices.
        let row = [f32::NAN, -0.0, 0.0, -1.0, f32::NEG_INFINITY];
        let t = RowLogprob::of(&row, 1, 20);
        assert_eq!(ids(&t), vec![2, 1, 3, 4]);
        assert!(
            t.logprob.is_nan(),
            "a NaN anywhere makes the row's sum NaN, as log_softmax"
        );
    }

    #[test]
    fn log_softmax_normalizes() {
        let ls = log_softmax(&[1.0, 2.0, 3.0]);
        let s: f64 = ls.iter().map(|x| x.exp()).sum();
        assert!((s - 1.0).abs() < 1e-12);
    }

    #[test]
    fn rng_at_is_the_stream_position() {
        let mut r = Rng::new(77);
        for k in 0..100u64 {
            assert_eq!(Rng::at(77, k), r.next_u64(), "position {k}");
        }
    }

    #[test]
    fn row_draw_edits_as_the_host_chain() {
        // Biases, a masked token and penalties: RowDraw::edit gives the bits the host chain
        // (sample_adjusted's closure, then apply_penalties) gives.
        let l: Vec<f32> = (0..300)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let params = SamplingParams {
            temperature: 0.9,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repeat_penalty: 1.17,
            frequency_penalty: 0.3,
            presence_penalty: 0.45,
            penalty_last_n: 6,
            seed: 5,
        };
        let mut s = Sampler::new(params);
        for t in [3u32, 9, 3, 250, 77, 3, 9, 12] {
            s.accept(t);
        }
        let pre = [
            LogitEdit::Add {
                token: 9,
                bias: 1.5,
            },
            LogitEdit::Add {
                token: 9,
                bias: -0.25,
            },
            LogitEdit::Mask { token: 12 },
            LogitEdit::Add {
                token: 40,
                bias: 3.0,
            },
        ];
        let mut host = l.clone();
        host[9] += 1.5;
        host[9] += -0.25;
        host[12] = f32::NEG_INFINITY;
        host[40] += 3.0;
        s.apply_penalties(&mut host);
        let d = s.row_draw(&pre, l.len());
        let mut dev = l.clone();
        d.edit(&mut dev);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&dev), bits(&host));
        assert_eq!((d.counter, s.row_draw(&pre, l.len()).counter), (0, 1));
        // top_k and top_p go with the draw; a greedy one cuts nothing, nor a top_k of the
        // whole vocabulary.
        for (k, p, t, want) in [
            (40, 1.0, 0.8, (40, 1.0)),
            (0, 0.9, 0.8, (0, 0.9f32 as f64)),
            (40, 0.5, 0.0, (0, 1.0)),
            (300, 1.0, 1.0, (0, 1.0)),
        ] {
            let mut s = Sampler::new(SamplingParams {
                top_k: k,
                top_p: p,
                temperature: t,
                ..Default::default()
            });
            let d = s.row_draw(&[], 300);
            assert_eq!((d.top_k, d.top_p), want, "top_k {k} top_p {p} t {t}");
        }
    }

    #[test]
    fn row_draws_follow_the_softmax_and_min_p() {
        let l = [1.0f32, 3.0, -2.0, 2.5, 0.0, f32::NEG_INFINITY, f32::NAN];
        let t = 0.8f64;
        let n = 40_000u64;
        let draw = |min_p: f64, c: u64| RowDraw {
            inv_temperature: 1.0 / t,
            min_p,
            seed: 11,
            counter: c,
            edits: Vec::new(),
            allowed: None,
            top_k: 0,
            top_p: 1.0,
        };
        let w: Vec<f64> = l[..5].iter().map(|&v| (v as f64 / t).exp()).collect();
        let sum: f64 = w.iter().sum();
        let mut counts = [0usize; 7];
        for c in 0..n {
            counts[draw(0.0, c).choose(&l) as usize] += 1;
        }
        assert_eq!(counts[5] + counts[6], 0, "-inf and NaN are never drawn");
        for i in 0..5 {
            let got = counts[i] as f64 / n as f64;
            assert!(
                (got - w[i] / sum).abs() < 0.01,
                "token {i}: {got} vs {}",
                w[i] / sum
            );
        }
        // min_p 0.5 at temperature 1: exp(v - 3) >= 0.5 keeps 3.0 and 2.5 only.
        let mut kept = [0usize; 7];
        for c in 0..2000 {
            kept[draw(0.5, c).choose(&l) as usize] += 1;
        }
        assert_eq!(kept[1] + kept[3], 2000);
        assert!(kept[1] > 0 && kept[3] > 0);
        // Greedy is the first largest after the edits; one seed and counter, one token.
        let greedy = RowDraw {
            inv_temperature: 0.0,
            min_p: 0.0,
            seed: 0,
            counter: 0,
            edits: vec![LogitEdit::Add {
                token: 3,
                bias: 0.5,
            }],
            allowed: None,
            top_k: 0,
            top_p: 1.0,
        };
        let mut e = l.to_vec();
        greedy.edit(&mut e);
        assert_eq!(greedy.choose(&e), 1, "3.0 ties 3.0: the lower id");
        // Other counters, other noise: a spread of tokens (not one stuck value).
        let distinct: std::collections::BTreeSet<u32> =
            (0..200).map(|c| draw(0.0, c).choose(&l)).collect();
        assert!(distinct.len() >= 3, "{distinct:?}");
        let all_masked = [f32::NEG_INFINITY; 4];
        assert_eq!(draw(0.0, 1).choose(&all_masked), 0);
    }

    /// The cut by its definition: the non-NaN tokens sorted in candidate order, the first
    /// top_k, then the shortest prefix of those whose weight reaches top-p's target.
    fn sorted_cut(row: &[f32], top_k: usize, top_p: f64) -> Vec<u32> {
        let mut c: Vec<(u32, f32)> = row
            .iter()
            .enumerate()
            .filter(|(_, v)| !v.is_nan())
            .map(|(i, &v)| (i as u32, v))
            .collect();
        c.sort_by(candidate_order);
        if top_k > 0 && top_k < row.len() {
            c.truncate(top_k);
        }
        if top_p < 1.0 && !c.is_empty() {
            let m = c[0].1;
            let total: u64 = c.iter().map(|&(_, v)| cut_weight(v, m)).sum();
            let goal = top_p_target(top_p, total);
            let mut cum = 0;
            let keep = c
                .iter()
                .position(|&(_, v)| {
                    cum += cut_weight(v, m);
                    cum >= goal
                })
                .map_or(c.len(), |i| i + 1);
            c.truncate(keep);
        }
        let mut ids: Vec<u32> = c.into_iter().map(|(i, _)| i).collect();
        ids.sort_unstable();
        ids
    }

    #[test]
    fn draw_cuts_are_the_sorted_prefix() {
        let mut rng = Rng::new(5);
        for case in 0..60 {
            let n = [7usize, 64, 300, 1000, 5000][case % 5];
            // Few distinct values (ties at every boundary), or spread ones; some -inf, a NaN, a
            // negative zero next to a zero.
            let levels = [3u64, 17, 1 << 20][case % 3];
            let mut row: Vec<f32> = (0..n)
                .map(|_| ((rng.next_u64() % levels) as f32 / levels as f32) * 12.0 - 6.0)
                .collect();
            if case % 4 == 1 {
                row[n / 3] = f32::NEG_INFINITY;
                row[n / 2] = f32::NAN;
                row[1] = -0.0;
                row[2] = 0.0;
            }
            if case % 7 == 3 {
                row.iter_mut().for_each(|v| *v = v.clamp(-1.0, 1.0)); // a softcap's plateau
            }
            for top_k in [0usize, 1, 2, 5, 37, n - 1, n] {
                for top_p in [0.0f64, 0.3, 0.9, 0.999, 1.0] {
                    let cut = draw_cut(&row, top_k, top_p);
                    let got: Vec<u32> = (0..n as u32)
                        .filter(|&i| {
                            let v = row[i as usize];
                            !v.is_nan() && cut.holds(order_key(v), i)
                        })
                        .collect();
                    assert_eq!(
                        got,
                        sorted_cut(&row, top_k, top_p),
                        "case {case}: n {n}, top_k {top_k}, top_p {top_p}"
                    );
                }
            }
        }
        // The order keys follow total_cmp.
        let vals = [
            f32::NEG_INFINITY,
            -3.5,
            -0.0,
            0.0,
            1e-40,
            2.0,
            f32::INFINITY,
        ];
        for w in vals.windows(2) {
            assert!(order_key(w[0]) < order_key(w[1]), "{w:?}");
        }
    }

    #[test]
    fn row_draws_under_top_k_and_top_p_follow_the_renormalized_softmax() {
        let l = [1.0f32, 3.0, -2.0, 2.5, 0.0, 2.5, f32::NAN];
        let t = 0.7f64;
        let n = 40_000u64;
        let check = |top_k: usize, top_p: f64, kept: &[usize]| {
            let mut counts = [0usize; 7];
            for c in 0..n {
                let d = RowDraw {
                    inv_temperature: 1.0 / t,
                    seed: 21,
                    counter: c,
                    top_k,
                    top_p,
                    ..Default::default()
                };
                counts[d.choose(&l) as usize] += 1;
            }
            let w: Vec<f64> = kept.iter().map(|&i| (l[i] as f64 / t).exp()).collect();
            let sum: f64 = w.iter().sum();
            for i in 0..7 {
                let want = kept
                    .iter()
                    .position(|&k| k == i)
                    .map_or(0.0, |j| w[j] / sum);
                let got = counts[i] as f64 / n as f64;
                assert!(
                    (got - want).abs() < 0.01,
                    "top_k {top_k} top_p {top_p}, token {i}: {got} vs {want}"
                );
            }
        };
        // The two 2.5s tie: top-k 2 keeps 3.0 and the lower id of them.
        check(2, 1.0, &[1, 3]);
        check(3, 1.0, &[1, 3, 5]);
        // Probabilities at temperature 1: 3.0 holds 0.40 of the row, with the 2.5s 0.88.
        check(0, 0.3, &[1]);
        check(0, 0.5, &[1, 3]);
        check(0, 0.85, &[1, 3, 5]);
        // top-p over the top-k's renormalized weights: of {3.0, 2.5}, 3.0 holds 0.62.
        check(2, 0.6, &[1]);
        check(2, 0.7, &[1, 3]);
        // Greedy ignores both.
        let g = RowDraw {
            top_k: 2,
            top_p: 0.1,
            ..Default::default()
        };
        assert_eq!(g.choose(&l), 1);
    }

    #[test]
    fn a_row_draws_mask_leaves_only_its_tokens() {
        // Bits 1 and 3 of word 0, bit 6 of word 1 (id 70); ids past the mask's two words are not
        // allowed.
        let mask: std::sync::Arc<[u64]> = vec![0b1010u64, 1 << 6].into();
        let d = RowDraw {
            inv_temperature: 1.0,
            min_p: 0.0,
            seed: 3,
            counter: 0,
            edits: vec![LogitEdit::Add {
                token: 3,
                bias: 1.0,
            }],
            allowed: Some(mask),
            top_k: 0,
            top_p: 1.0,
        };
        let mut row: Vec<f32> = (0..200).map(|i| (i % 7) as f32).collect();
        d.edit(&mut row);
        let kept: Vec<usize> = (0..200).filter(|&i| row[i].is_finite()).collect();
        assert_eq!(kept, [1, 3, 70]);
        assert_eq!((row[1], row[3], row[70]), (1.0, 4.0, 0.0));
        for c in 0..200 {
            let t = RowDraw {
                counter: c,
                ..d.clone()
            }
            .choose(&row);
            assert!([1, 3, 70].contains(&t), "{t}");
        }
    }

    #[test]
    fn penalty_window_counts_follow_the_history() {
        for last_n in [0usize, 1, 3, 64, usize::MAX] {
            let mut s = Sampler::new(SamplingParams {
                penalty_last_n: last_n,
                ..Default::default()
            });
            let mut rng = Rng::new(last_n as u64);
            for step in 0..300 {
                s.accept((rng.next_u64() % 23) as u32);
                let start = s.history.len().saturating_sub(last_n);
                let mut want: std::collections::BTreeMap<u32, u32> = Default::default();
                for &t in &s.history[start..] {
                    *want.entry(t).or_default() += 1;
                }
                assert_eq!(s.counts, want, "last_n {last_n}, step {step}");
            }
        }
    }
}
