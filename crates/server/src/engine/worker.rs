//! The engine loop: admit, plan a step, run it, sample, send, repeat.
//!
//! Each sequence owns a slot (a KV cache of `n_ctx`, created on first use and cleared for reuse)
//! from admission to its end. A step mixes the running sequences in one `forward` call where the
//! backend attends several sequences per micro-batch (the CPU's accurate mode), and otherwise
//! runs one call per sequence (parity mode, CUDA today): the same plan either way.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};

use muser_engine::muse_glimmer::Workspace;
use muser_engine::sampling::{LogitEdit, NOT_FINITE, RowDraw, RowLogprob};
use muser_engine::{Backend, Batch, MuseGlimmer, Sampler};
use muser_text::grammar::{Constraint, GrammarVocab, mask_allows};
use muser_text::{StreamDecoder, Tokenizer};
use tokio::sync::mpsc::error::TrySendError;

use super::scheduler::{self, SeqView};
use super::{
    Command, EchoToken, EngineConfig, Event, Finish, Job, Shared, SlotAction, SlotReply,
    TokenLogprob,
};
use crate::error::ApiError;
use serde_json::json;

/// What the sequences of one request share.
struct JobCommon {
    request_id: String,
    /// `Job::stop_flags`.
    stop_flags: Option<Arc<[std::sync::atomic::AtomicBool]>>,
    tx: tokio::sync::mpsc::Sender<Event>,
    logprobs: Option<usize>,
    /// `Job::echo`.
    echo: bool,
    skip_special: bool,
    ignore_eos: bool,
    logit_bias: Vec<(u32, f32)>,
    /// The vocabulary as the request's grammar reads it (with a grammar).
    grammar_vocab: Option<Arc<GrammarVocab>>,
}

struct Seq {
    job: Arc<JobCommon>,
    index: usize,
    prompt: Arc<[u32]>,
    /// Prompt tokens already run (or found in the slot's cache: `reused`).
    fed: usize,
    /// Prompt tokens the slot's cache held at admission (prefix reuse).
    reused: usize,
    /// The last sampled token, to run at the next step.
    pending: Option<u32>,
    /// Tokens guessed to follow `pending` (speculative decoding, `EngineConfig::draft`), run
    /// after it in the step's forward; the step keeps those its draws agree with.
    guess: Vec<u32>,
    generated: usize,
    max_tokens: usize,
    sampler: Sampler,
    /// Where the output stands in the request's grammar, if it has one.
    constraint: Option<Constraint>,
    /// The running sequence whose cache will hold this one's first tokens: it waits for them and
    /// starts from a copy of that cache (`Backend::kv_copy`) instead of running them itself.
    follow: Option<Follow>,
    /// With echo and logprobs: the prompt's tokens' log-probabilities so far (token i + 1's
    /// after the tokens before it), for `Event::Echo`.
    echo_lp: Vec<TokenLogprob>,
    decoder: StreamDecoder,
    /// Events not yet taken by the client (the channel was full): the sequence waits for them.
    outbox: VecDeque<Event>,
    /// Since when the client has taken none of `outbox` (None: it took everything).
    stalled_since: Option<Instant>,
    slot: usize,
    /// KV bytes reserved at admission (the worst case of prompt + max_tokens).
    reserve: usize,
    arrived: Instant,
    first_token: Option<Instant>,
    done: bool,
}

/// A sequence's leader (`Seq::follow`): another running sequence, by its slot, request and
/// choice, whose prompt begins with the follower's first `keep` tokens. (Weak: a follower does
/// not keep its leader's request, and so its client's channel, alive.)
struct Follow {
    slot: usize,
    job: std::sync::Weak<JobCommon>,
    index: usize,
    keep: usize,
}

impl Follow {
    fn leads(&self, o: &Seq) -> bool {
        o.slot == self.slot
            && o.index == self.index
            && std::ptr::eq(self.job.as_ptr(), Arc::as_ptr(&o.job))
    }
}

/// What `Worker::copy_prefix` did.
enum Copied {
    Done,
    /// Nothing: the source cannot go back so far.
    NotSoFar,
    /// The copy failed: the slot is cleared.
    Failed,
}

/// Fewest prompt tokens a sequence of another request starts from a copy of a running one's
/// cache for (the choices of one request share any): a copy of a whole cache, or a wait for
/// its leader's prompt, is not worth a few tokens of a system prompt's first line.
const MIN_SHARE: usize = 8;

/// How many first tokens `a` and `b` share.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl Seq {
    fn prompt_left(&self) -> usize {
        self.prompt.len() - self.fed
    }

    /// Where its prompt stands after `copy_prefix` gave it the first `keep` tokens of another's
    /// cache (or did not): those tokens fed, and counted as cached when they came from another
    /// request (a sibling choice's are the request's own prompt).
    fn started_from(&mut self, copied: Copied, keep: usize, sibling: bool) {
        match copied {
            Copied::Done => {
                self.fed = keep;
                if !sibling {
                    self.reused = keep;
                }
            }
            Copied::NotSoFar => {}
            Copied::Failed => (self.fed, self.reused) = (0, 0),
        }
    }

    /// Whether every prompt position's logits are wanted (echo with logprobs): the prompt runs
    /// whole, never from a kept cache.
    fn scores_prompt(&self) -> bool {
        self.job.echo && self.job.logprobs.is_some()
    }
}

pub(super) struct Worker<B: Backend> {
    model: MuseGlimmer<B>,
    tok: Arc<Tokenizer>,
    cfg: EngineConfig,
    shared: Arc<Shared>,
    rx: Receiver<Command>,
    ws: Workspace<B>,
    /// Most sequences one `forward` call may mix.
    max_seqs: usize,
    step_tokens: usize,
    eog: Vec<u32>,
    slots: Vec<Option<B::Kv>>,
    /// Per slot, the tokens its cache holds, in position order (prefix reuse); `dirty` when a
    /// failed step may have left the cache unlike them (it is cleared before reuse).
    history: Vec<Vec<u32>>,
    dirty: Vec<bool>,
    /// Per slot, when it was last freed (the least recently used is taken first for a prompt
    /// that reuses nothing).
    freed_at: Vec<u64>,
    /// Per free slot, the KV bytes its kept cache holds (`KvCost` of its length; 0 when
    /// cleared), and their sum: kept caches count against the budget beside `reserved`.
    kept: Vec<usize>,
    kept_total: usize,
    ticks: u64,
    free: Vec<usize>,
    reserved: usize,
    waiting: VecDeque<Seq>,
    running: Vec<Seq>,
    /// The last step's logits (reused: `forward_into`).
    logits: Vec<f32>,
    /// Final events of finished sequences whose clients have not read them yet.
    draining: Vec<(tokio::sync::mpsc::Sender<Event>, VecDeque<Event>, Instant)>,
    shutdown: Option<Instant>,
    /// Tokens generated since `rate_since` (the tokens/s gauge).
    rate_tokens: usize,
    rate_since: Instant,
    /// `MUSER_CUTS_ON_HOST=1` (a measurement knob): rows under top-k or top-p come to the host
    /// and are drawn by the host chain, as before the device cut them (`draw_cut`).
    cuts_on_host: bool,
    /// `MUSER_LOGPROBS_ON_HOST=1` (a measurement knob): rows whose sequences ask for logprobs
    /// come to the host, drawn by the host chain and scored there, as before the device scored
    /// them (`row_logprobs`).
    logprobs_on_host: bool,
}

impl<B: Backend> Worker<B> {
    pub(super) fn new(
        model: MuseGlimmer<B>,
        tok: Arc<Tokenizer>,
        cfg: EngineConfig,
        shared: Arc<Shared>,
        rx: Receiver<Command>,
    ) -> Result<Self, String> {
        // Every decoding sequence plus at least one prompt token fit in a step.
        // (new() has checked parallel < max_batch_tokens.)
        let step_tokens = cfg
            .step_tokens
            .max(cfg.parallel + 1)
            .min(model.backend.max_batch_tokens());
        let ws = model
            .workspace(step_tokens)
            .map_err(|e| format!("cannot allocate the engine's workspace: {e}"))?;
        let max_seqs = model.backend.max_sequences_per_batch().max(1);
        tracing::info!(
            backend = %model.backend.name(),
            parallel = cfg.parallel,
            n_ctx = cfg.n_ctx,
            step_tokens,
            sequences_per_forward = if max_seqs == usize::MAX { "any".to_string() } else { max_seqs.to_string() },
            kv_budget_bytes = shared.budget,
            "engine ready"
        );
        metrics::gauge!("muser_kv_cache_budget_bytes").set(shared.budget as f64);
        metrics::gauge!("muser_tokens_per_second").set(0.0);
        Ok(Worker {
            eog: tok.eog_ids(),
            slots: (0..cfg.parallel).map(|_| None).collect(),
            history: vec![Vec::new(); cfg.parallel],
            dirty: vec![false; cfg.parallel],
            freed_at: vec![0; cfg.parallel],
            kept: vec![0; cfg.parallel],
            kept_total: 0,
            ticks: 0,
            free: (0..cfg.parallel).rev().collect(),
            model,
            tok,
            shared,
            rx,
            ws,
            max_seqs,
            step_tokens,
            cfg,
            reserved: 0,
            waiting: VecDeque::new(),
            running: Vec::new(),
            logits: Vec::new(),
            draining: Vec::new(),
            shutdown: None,
            rate_tokens: 0,
            cuts_on_host: std::env::var("MUSER_CUTS_ON_HOST").is_ok_and(|v| v == "1"),
            logprobs_on_host: std::env::var("MUSER_LOGPROBS_ON_HOST").is_ok_and(|v| v == "1"),
            rate_since: Instant::now(),
        })
    }

    pub(super) fn run(mut self) {
        loop {
            let busy = !self.running.is_empty() || !self.waiting.is_empty();
            if !busy && self.draining.is_empty() {
                if self.shutdown.is_some() {
                    break;
                }
                match self.rx.recv_timeout(Duration::from_millis(250)) {
                    Ok(c) => self.command(c),
                    Err(RecvTimeoutError::Timeout) => {
                        self.update_gauges();
                        continue;
                    }
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            }
            loop {
                match self.rx.try_recv() {
                    Ok(c) => self.command(c),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        // Every handle is gone: nobody can read results any more.
                        if self.shutdown.is_none() {
                            self.shutdown = Some(Instant::now());
                        }
                        break;
                    }
                }
            }
            if self.shutdown.is_some_and(|d| Instant::now() >= d) {
                self.cancel_all();
                break;
            }
            self.reap_closed();
            self.admit();
            let ran = self.step();
            self.flush();
            self.update_gauges();
            if !ran {
                // Nothing runnable (every stream waits for its client): wait a little.
                if let Ok(c) = self.rx.recv_timeout(Duration::from_millis(2)) {
                    self.command(c)
                }
            }
        }
        self.flush();
        tracing::info!("engine stopped");
    }

    fn command(&mut self, c: Command) {
        match c {
            Command::Submit(job) => self.enqueue(job),
            Command::Slot {
                slot,
                action,
                reply,
            } => {
                let _ = reply.send(self.slot_action(slot, action));
            }
            Command::Shutdown { deadline } => {
                tracing::info!(
                    running = self.running.len(),
                    waiting = self.waiting.len(),
                    "engine draining before shutdown"
                );
                self.shutdown = Some(deadline);
            }
        }
    }

    /// `/slots`: list them, or copy out, restore or erase the cache of one that runs no
    /// sequence. Files are written and read by the caller, off this thread: here only the
    /// copies between the backend's cache and the host hold up the other sequences.
    fn slot_action(
        &mut self,
        slot: Option<usize>,
        action: SlotAction,
    ) -> Result<SlotReply, ApiError> {
        let backend = &self.model.backend;
        let Some(slot) = slot else {
            let list: Vec<_> = (0..self.cfg.parallel)
                .map(|i| {
                    let busy = !self.free.contains(&i);
                    json!({
                        "id": i,
                        "n_ctx": self.cfg.n_ctx,
                        "is_processing": busy,
                        "n_cached": if busy { 0 } else { self.kept_len(i) },
                    })
                })
                .collect();
            return Ok(SlotReply::Done(serde_json::Value::Array(list)));
        };
        if slot >= self.cfg.parallel {
            return Err(ApiError::invalid(
                "id_slot",
                format!(
                    "slot {slot} does not exist: this server has slots 0..{}",
                    self.cfg.parallel
                ),
            ));
        }
        if !self.free.contains(&slot) {
            return Err(ApiError::conflict(format!(
                "slot {slot} is running a sequence; try again when it has finished"
            )));
        }
        let started = Instant::now();
        let ms = || started.elapsed().as_secs_f64() * 1e3;
        match action {
            SlotAction::List => Err(ApiError::internal("a list names no slot")),
            SlotAction::Erase => {
                let n = self.kept_len(slot);
                self.clear_slot(slot);
                Ok(SlotReply::Done(json!({"id_slot": slot, "n_erased": n})))
            }
            SlotAction::Save => {
                let n = self.kept_len(slot);
                let Some(kv) = self.slots[slot].as_ref().filter(|_| n > 0) else {
                    return Err(ApiError::bad_request(format!(
                        "slot {slot} keeps no cache to save"
                    )));
                };
                let image = backend
                    .kv_export(kv)
                    .map_err(|e| ApiError::internal(format!("saving slot {slot}: {e}")))?;
                let state = Box::new(muser_engine::state::SavedState {
                    fingerprint: self.model.fingerprint,
                    made_by: backend.name(),
                    tokens: self.history[slot].clone(),
                    image,
                });
                Ok(SlotReply::Snapshot {
                    state,
                    n_swa: self.model.config.n_swa,
                    copy_ms: ms(),
                })
            }
            SlotAction::Restore(st) => {
                if !self.cfg.prefix_reuse {
                    return Err(ApiError::bad_request(
                        "a restored cache is used by prefix reuse, which this server runs without (--no-prefix-reuse)",
                    ));
                }
                if st.fingerprint != self.model.fingerprint {
                    return Err(ApiError::bad_request(
                        "the file was saved from another model than the one this server runs",
                    ));
                }
                if st
                    .tokens
                    .iter()
                    .any(|&t| t as usize >= self.model.config.n_vocab)
                {
                    return Err(ApiError::bad_request(
                        "the file holds a token id outside the vocabulary",
                    ));
                }
                let n = st.tokens.len();
                let need = self.shared.cost.bytes(n);
                if !self.make_room(need, slot) {
                    return Err(ApiError::overloaded(
                        "the KV budget has no room for this cache beside the running sequences now",
                        1,
                    ));
                }
                if self.slots[slot].is_none() {
                    let kv = self
                        .model
                        .new_cache(self.cfg.kv_type, self.cfg.n_ctx)
                        .map_err(|e| ApiError::internal(format!("slot {slot}'s cache: {e}")))?;
                    self.slots[slot] = Some(kv);
                }
                let Some(kv) = self.slots[slot].as_mut() else {
                    return Err(ApiError::internal("no cache"));
                };
                if let Err(e) = self.model.backend.kv_import(&st.image, kv) {
                    // A refused image leaves the slot as it was; a failed copy, empty.
                    if self.model.backend.kv_len(kv) != self.history[slot].len() {
                        self.clear_slot(slot);
                    }
                    return Err(match e {
                        muser_engine::Error::Input(m) => ApiError::bad_request(m),
                        e => ApiError::internal(e.to_string()),
                    });
                }
                let made_by = st.made_by.clone();
                self.history[slot] = st.tokens;
                self.dirty[slot] = false;
                self.kept_total -= self.kept[slot];
                self.kept[slot] = need;
                self.kept_total += need;
                self.ticks += 1;
                self.freed_at[slot] = self.ticks;
                tracing::info!(slot, positions = n, made_by = %made_by, "slot restored");
                Ok(SlotReply::Done(json!({
                    "id_slot": slot,
                    "n_restored": n,
                    "timings": {"copy_ms": ms()},
                })))
            }
        }
    }

    /// The positions a free slot's cache keeps for prefix reuse (0 when none or spoiled).
    fn kept_len(&self, slot: usize) -> usize {
        match self.slots[slot].as_ref() {
            Some(kv)
                if !self.dirty[slot]
                    && self.model.backend.kv_len(kv) == self.history[slot].len() =>
            {
                self.history[slot].len()
            }
            _ => 0,
        }
    }

    fn enqueue(&mut self, job: Job) {
        let arrived = Instant::now();
        let common = Arc::new(JobCommon {
            request_id: job.request_id,
            stop_flags: job.stop_flags,
            tx: job.tx,
            logprobs: job.logprobs,
            echo: job.echo,
            skip_special: job.skip_special,
            ignore_eos: job.ignore_eos,
            logit_bias: job.logit_bias,
            grammar_vocab: job.grammar.as_ref().map(|g| g.vocab.clone()),
        });
        for spec in job.seqs {
            let constraint = job.grammar.as_ref().map(|g| match g.trigger {
                Some(t) => Constraint::lazy(g.grammar.clone(), g.masks.clone(), t),
                None => Constraint::at(g.grammar.clone(), g.masks.clone(), g.start.clone()),
            });
            let positions = (spec.prompt.len() + spec.max_tokens).min(self.cfg.n_ctx);
            let mut params = spec.params;
            // OpenAI's penalties count every generated token (the sampler sees only those).
            params.penalty_last_n = usize::MAX;
            self.waiting.push_back(Seq {
                job: common.clone(),
                index: spec.index,
                prompt: spec.prompt,
                fed: 0,
                reused: 0,
                pending: None,
                guess: Vec::new(),
                generated: 0,
                max_tokens: spec.max_tokens,
                sampler: Sampler::new(params),
                constraint,
                echo_lp: Vec::new(),
                follow: None,
                decoder: StreamDecoder::new(job.skip_special, job.stops.iter().cloned()),
                outbox: VecDeque::new(),
                stalled_since: None,
                slot: usize::MAX,
                reserve: self.shared.cost.bytes(positions),
                arrived,
                first_token: None,
                done: false,
            });
        }
        tracing::debug!(request_id = %common.request_id, waiting = self.waiting.len(), "queued");
    }

    /// Cancel the sequences whose client went away, end those whose answer met a stop string
    /// (their stop flag), freeing their slots.
    fn reap_closed(&mut self) {
        let before = self.waiting.len();
        self.waiting.retain(|s| !s.job.tx.is_closed());
        let dropped = before - self.waiting.len();
        if dropped > 0 {
            self.shared.active.fetch_sub(dropped, Ordering::SeqCst);
            metrics::counter!("muser_sequences_finished_total", "reason" => "cancelled")
                .increment(dropped as u64);
        }
        for s in &mut self.running {
            if !s.done && s.job.tx.is_closed() {
                cancel(s);
            } else if !s.done && stop_flagged(&s.job, s.index) {
                // Its answer met a stop string: no further forward for it.
                s.outbox.push_back(Event::Done {
                    index: s.index,
                    finish: Finish::Stop,
                    text: String::new(),
                    prompt_tokens: s.prompt.len(),
                    cached_tokens: s.reused,
                    completion_tokens: s.generated,
                });
                s.done = true;
                metrics::counter!("muser_sequences_finished_total", "reason" => "stop")
                    .increment(1);
            }
        }
        self.release_done();
        self.draining.retain(|(tx, _, _)| !tx.is_closed());
    }

    /// Move waiting sequences into free slots, oldest first, while the KV budget holds them
    /// (their reserves and the caches kept for reuse: `make_room`).
    fn admit(&mut self) {
        while let Some(s) = self.waiting.front() {
            if self.free.is_empty() {
                break;
            }
            let Some((fi, reuse)) = self.pick_slot(&s.prompt) else {
                break;
            };
            let reuse = if s.scores_prompt() { 0 } else { reuse };
            if !self.make_room(s.reserve, self.free[fi]) {
                break;
            }
            let Some(mut s) = self.waiting.pop_front() else {
                break;
            };
            let slot = self.free.swap_remove(fi);
            self.take_slot(slot, reuse);
            s.fed = reuse;
            s.reused = reuse;
            if reuse > 0 {
                metrics::counter!("muser_prompt_tokens_reused_total").increment(reuse as u64);
            }
            if self.slots[slot].is_none() {
                match self.model.new_cache(self.cfg.kv_type, self.cfg.n_ctx) {
                    Ok(kv) => self.slots[slot] = Some(kv),
                    Err(e) => {
                        self.free.push(slot);
                        tracing::error!(request_id = %s.job.request_id, "cannot allocate a KV cache: {e}");
                        s.outbox.push_back(Event::Error {
                            index: s.index,
                            error: ApiError::unavailable(format!(
                                "cannot allocate a KV cache: {e}"
                            )),
                        });
                        s.done = true;
                        s.slot = usize::MAX;
                        self.finish_unadmitted(s);
                        continue;
                    }
                }
            }
            s.slot = slot;
            // A running sequence's cache holds, or its prompt will, more of this prompt than the
            // slot does: start from a copy of it now, or wait for its prompt (`share_prompt`).
            if let Some((f, now)) = self.share_source(&s, reuse) {
                if now {
                    let copied = self.copy_prefix(f.slot, slot, &s.prompt, f.keep);
                    let sibling = std::ptr::eq(f.job.as_ptr(), Arc::as_ptr(&s.job));
                    s.started_from(copied, f.keep, sibling);
                } else {
                    s.follow = Some(f);
                }
            }
            self.reserved += s.reserve;
            tracing::debug!(
                request_id = %s.job.request_id,
                choice = s.index,
                slot,
                prompt_tokens = s.prompt.len(),
                reused_tokens = reuse,
                queued_ms = s.arrived.elapsed().as_millis() as u64,
                "admitted"
            );
            self.running.push(s);
        }
    }

    /// The running sequence whose cache `s` (just admitted, its slot holding its first `reuse`
    /// tokens) had best start from, and whether its cache holds them now (else its prompt will,
    /// once it has run them): the one that gives the most of the prompt, at most all but its
    /// last token, a choice of the same request or (with prefix reuse on) at least `MIN_SHARE`
    /// tokens more than the slot holds; one whose cache holds them already before one whose
    /// prompt will. None where the backend cannot copy caches or the prompt is scored (it runs
    /// whole).
    fn share_source(&self, s: &Seq, reuse: usize) -> Option<(Follow, bool)> {
        let backend = &self.model.backend;
        if !backend.kv_can_copy() || s.scores_prompt() {
            return None;
        }
        let cap = s.prompt.len().saturating_sub(1);
        let mut best: Option<(usize, bool, &Seq)> = None;
        for o in &self.running {
            let sibling = Arc::ptr_eq(&o.job, &s.job);
            if o.done
                || o.follow.is_some()
                || self.dirty[o.slot]
                || !(sibling || self.cfg.prefix_reuse)
            {
                continue;
            }
            let Some(kv) = self.slots[o.slot].as_ref() else {
                continue;
            };
            let held = &self.history[o.slot];
            if backend.kv_len(kv) != held.len() {
                continue;
            }
            let now = common_prefix(held, &s.prompt).min(cap);
            // Its cache holds the first `o.fed` tokens of its prompt and will hold the rest.
            let later = if o.prompt_left() > 0 {
                common_prefix(&o.prompt, &s.prompt).min(cap)
            } else {
                now
            };
            let (keep, ready) = if later > now {
                (later, false)
            } else {
                (now, true)
            };
            // (Going back to `keep` is allowed down to a point: kv::ring_allows_truncate.)
            if keep <= reuse
                || (!sibling && keep < reuse + MIN_SHARE)
                || (ready && !backend.kv_can_truncate(kv, keep))
            {
                continue;
            }
            if best.is_none_or(|(bk, br, _)| (keep, ready) > (bk, br)) {
                best = Some((keep, ready, o));
            }
        }
        best.map(|(keep, now, o)| {
            let f = Follow {
                slot: o.slot,
                job: Arc::downgrade(&o.job),
                index: o.index,
                keep,
            };
            (f, now)
        })
    }

    /// Make slot `dst`'s cache a copy of slot `src`'s, back to its first `keep` tokens, which
    /// are `prompt`'s first (`Backend::kv_copy`). `NotSoFar` leaves the slot as it was (the
    /// cache cannot go back so far); `Failed` leaves it cleared.
    fn copy_prefix(&mut self, src: usize, dst: usize, prompt: &[u32], keep: usize) -> Copied {
        let Some(mut to) = self.slots.get_mut(dst).and_then(Option::take) else {
            return Copied::NotSoFar;
        };
        let backend = &self.model.backend;
        let copied = match self.slots.get(src).and_then(Option::as_ref) {
            Some(kv) if keep <= prompt.len() && backend.kv_can_truncate(kv, keep) => {
                backend.kv_copy(kv, &mut to).map(|()| true)
            }
            _ => Ok(false),
        };
        let result = match copied {
            Ok(true) => {
                backend.kv_set_len(&mut to, keep);
                let h = &mut self.history[dst];
                h.clear();
                h.extend_from_slice(&prompt[..keep]);
                self.dirty[dst] = false;
                metrics::counter!("muser_prompt_tokens_shared_total").increment(keep as u64);
                Copied::Done
            }
            Ok(false) => Copied::NotSoFar,
            Err(e) => {
                tracing::warn!("a prompt's cache could not be copied: {e}");
                backend.kv_clear(&mut to);
                self.history[dst].clear();
                Copied::Failed
            }
        };
        self.slots[dst] = Some(to);
        result
    }

    /// The free slot a prompt starts in (its index in `free`) and how many of its first tokens
    /// that slot's cache already holds: the longest reusable prefix (at most all but the last
    /// prompt token, whose logits the sequence needs) among the slots where it is at least half
    /// of what the slot keeps; else an empty slot; else the least recently freed. (A prefix of a
    /// token or two, a BOS, is no reason to throw away a long kept conversation while an empty
    /// slot waits.)
    fn pick_slot(&self, prompt: &[u32]) -> Option<(usize, usize)> {
        let backend = &self.model.backend;
        // (reuse that counts, the slot is empty, its index in `free`, reuse)
        let mut best: Option<(usize, bool, usize, usize)> = None;
        for (fi, &slot) in self.free.iter().enumerate() {
            let mut reuse = 0;
            // (With reuse off, release_done has cleared every free slot's cache and history.)
            if let (Some(kv), false) = (self.slots[slot].as_ref(), self.dirty[slot]) {
                let h = &self.history[slot];
                if backend.kv_len(kv) == h.len() {
                    let common = h.iter().zip(prompt).take_while(|(a, b)| a == b).count();
                    let n = common.min(prompt.len().saturating_sub(1));
                    // Going back is allowed down to a point and not below (kv::ring_allows_truncate).
                    if n > 0 && backend.kv_can_truncate(kv, n) {
                        reuse = n;
                    }
                }
            }
            let kept = self.slots[slot].as_ref().map_or(0, |kv| backend.kv_len(kv));
            let counted = if 2 * reuse >= kept { reuse } else { 0 };
            let empty = kept == 0;
            let better = match best {
                None => true,
                Some((bc, be, bi, _)) => {
                    (counted, empty) > (bc, be)
                        || ((counted, empty) == (bc, be)
                            && self.freed_at[slot] < self.freed_at[self.free[bi]])
                }
            };
            if better {
                best = Some((counted, empty, fi, reuse));
            }
        }
        best.map(|(_, _, fi, reuse)| (fi, reuse))
    }

    /// Whether a sequence reserving `need` bytes fits the budget in `slot`, beside the running
    /// sequences' reserves and the caches other free slots keep: the least recently freed of
    /// those are cleared until it does (the slot's own kept cache becomes part of the new
    /// sequence, whose reserve counts every position it holds). False, clearing nothing, when
    /// the reserves alone leave no room.
    fn make_room(&mut self, need: usize, slot: usize) -> bool {
        let budget = self.shared.budget;
        if self.reserved + need > budget {
            return false;
        }
        let own = self.kept.get(slot).copied().unwrap_or(0);
        while self.reserved + need + (self.kept_total - own) > budget {
            let Some(j) = self
                .free
                .iter()
                .copied()
                .filter(|&j| j != slot && self.kept[j] > 0)
                .min_by_key(|&j| self.freed_at[j])
            else {
                return false;
            };
            self.clear_slot(j);
        }
        true
    }

    /// Empty `slot`'s cache and what is known of it (history, kept bytes).
    fn clear_slot(&mut self, slot: usize) {
        if let Some(kv) = self.slots[slot].as_mut() {
            self.model.backend.kv_clear(kv);
        }
        self.history[slot].clear();
        self.dirty[slot] = false;
        self.kept_total -= self.kept[slot];
        self.kept[slot] = 0;
    }

    /// Ready `slot` for a sequence whose first `reuse` prompt tokens its cache holds: back to
    /// them, or cleared.
    fn take_slot(&mut self, slot: usize, reuse: usize) {
        if reuse == 0 {
            self.clear_slot(slot);
            return;
        }
        self.kept_total -= self.kept[slot];
        self.kept[slot] = 0;
        if let Some(kv) = self.slots[slot].as_mut() {
            self.model.backend.kv_set_len(kv, reuse);
        }
        self.history[slot].truncate(reuse);
        self.dirty[slot] = false;
    }

    fn finish_unadmitted(&mut self, mut s: Seq) {
        self.shared.active.fetch_sub(1, Ordering::SeqCst);
        if !s.outbox.is_empty() {
            self.draining.push((
                s.job.tx.clone(),
                std::mem::take(&mut s.outbox),
                Instant::now(),
            ));
        }
    }

    /// Sequences waiting for a leader's prompt (`Seq::follow`) whose leader is no longer running
    /// it (it failed or was cancelled) run their own, from what their slot holds.
    fn release_followers(&mut self) {
        let running = &self.running;
        let gone: Vec<usize> = (0..running.len())
            .filter(|&i| {
                running[i].follow.as_ref().is_some_and(|f| {
                    !running
                        .iter()
                        .any(|o| f.leads(o) && !o.done && o.prompt_left() > 0)
                })
            })
            .collect();
        for i in gone {
            self.running[i].follow = None;
        }
    }

    /// Plan and run one step; false if nothing could run.
    fn step(&mut self) -> bool {
        self.release_followers();
        self.guess();
        let views: Vec<SeqView> = self
            .running
            .iter()
            .map(|s| SeqView {
                prompt_left: s.prompt_left(),
                ready: !s.done
                    && s.follow.is_none()
                    && s.outbox.is_empty()
                    && (s.prompt_left() > 0 || s.pending.is_some()),
                guess: s.guess.len(),
            })
            .collect();
        let plan = scheduler::plan(&views, self.step_tokens);
        if plan.is_empty() {
            return false;
        }
        let t0 = Instant::now();
        let tokens: usize = plan.iter().map(|&(_, n)| n).sum();
        for group in plan.chunks(self.max_seqs) {
            self.run_group(group);
        }
        metrics::histogram!("muser_step_seconds").record(t0.elapsed().as_secs_f64());
        metrics::counter!("muser_step_tokens_total").increment(tokens as u64);
        self.release_done();
        true
    }

    /// With `EngineConfig::draft`: each decoding sequence's guess of the tokens after its
    /// pending one, from the tokens its slot holds (`speculative::NgramDraft`), as long as its
    /// `max_tokens` and the context leave room for. A sequence under a grammar or asking for
    /// logprobs guesses nothing (its draws are checked or scored one at a time).
    fn guess(&mut self) {
        use rayon::prelude::*;
        let n_ctx = self.cfg.n_ctx;
        let draft = self.cfg.draft;
        let history = &self.history;
        // Each sequence's lookup reads its whole slot's tokens: in parallel.
        self.running.par_iter_mut().for_each(|s| {
            s.guess.clear();
            let (Some(d), Some(p)) = (draft, s.pending) else {
                return;
            };
            if s.done
                || s.follow.is_some()
                || s.prompt_left() > 0
                || s.constraint.is_some()
                || s.job.logprobs.is_some()
            {
                return;
            }
            // The tokens after `pending` this sequence may still take.
            let room = (s.max_tokens.saturating_sub(s.generated))
                .min(n_ctx.saturating_sub(s.prompt.len() + s.generated))
                .saturating_sub(1);
            let Some(h) = history.get(s.slot).filter(|_| room > 0) else {
                return;
            };
            let mut g = d.draft_after(h, p);
            g.truncate(room);
            s.guess = g;
        });
    }

    /// One `forward` call over the sequences of `group` (`(index into running, n_tokens)`; a
    /// decoding sequence's `n_tokens` beyond 1 are its guess's).
    fn run_group(&mut self, group: &[(usize, usize)]) {
        let mut item_of_slot: Vec<Option<usize>> = vec![None; self.slots.len()];
        for (gi, &(ri, _)) in group.iter().enumerate() {
            item_of_slot[self.running[ri].slot] = Some(gi);
        }
        let backend = &self.model.backend;
        let mut caches: Vec<&mut B::Kv> = Vec::with_capacity(group.len());
        let mut cache_item = Vec::with_capacity(group.len());
        for (slot, kv) in self.slots.iter_mut().enumerate() {
            if let (Some(gi), Some(kv)) = (item_of_slot[slot], kv.as_mut()) {
                caches.push(kv);
                cache_item.push(gi);
            }
        }
        // Each sequence's tokens are contiguous in the batch, at the positions its cache continues.
        let mut batch = Batch::default();
        let mut rows = Vec::new();
        let mut row_item = Vec::new();
        // Echo with logprobs: the prompt positions scored (batch row, running index, the next
        // prompt token, its alternatives), their logits rows after the drawn ones.
        let mut scored: Vec<(usize, usize, u32, usize)> = Vec::new();
        // Decoding sequences that run a guess: (running index, their cache's length before
        // the step, their first logits row, their rows); each of their rows is drawn on the host
        // in turn (`speculative`).
        let mut guessing: Vec<(usize, usize, usize, usize)> = Vec::new();
        let mut fed = Vec::new();
        for (ci, &gi) in cache_item.iter().enumerate() {
            let (ri, n) = group[gi];
            let s = &mut self.running[ri];
            let start = backend.kv_len(&*caches[ci]) as u32;
            let tokens: &[u32] = if s.prompt_left() > 0 {
                &s.prompt[s.fed..s.fed + n]
            } else {
                let Some(t) = s.pending else { continue };
                s.guess.truncate(n - 1);
                fed.clear();
                fed.push(t);
                fed.extend_from_slice(&s.guess);
                &fed
            };
            for (k, &t) in tokens.iter().enumerate() {
                batch.tokens.push(t);
                batch.pos.push(start + k as u32);
                batch.seq.push(ci);
            }
            if s.prompt_left() > 0 && s.scores_prompt() {
                let base = batch.len() - tokens.len();
                for k in 0..tokens.len() {
                    if let Some(&next) = s.prompt.get(s.fed + k + 1) {
                        scored.push((base + k, ri, next, s.job.logprobs.unwrap_or(0)));
                    }
                }
            }
            // Logits for a decode token (and each guessed one), or a prompt chunk that ends the
            // prompt (unless nothing is to be generated: echo with max_tokens 0).
            if s.prompt_left() == 0 && tokens.len() > 1 {
                guessing.push((ri, start as usize, rows.len(), tokens.len()));
                for k in 0..tokens.len() {
                    rows.push(batch.len() - tokens.len() + k);
                    row_item.push(gi);
                }
            } else if s.max_tokens > 0 && (s.prompt_left() == 0 || s.prompt_left() == n) {
                rows.push(batch.len() - 1);
                row_item.push(gi);
            }
        }
        if batch.is_empty() {
            return;
        }
        let scored_at = rows.len();
        rows.extend(scored.iter().map(|p| p.0));
        // Each logits row's token is drawn where the logits are when the backend can
        // (`Backend::draws_on_device`; top-k and top-p are cut there too, `RowDraw::cut`), and
        // its logprobs, if the sequence asks for them, are computed there for the token drawn
        // (`Backend::row_logprobs`); on other backends the rows come to the host. (A device
        // draw is another stream of random numbers than the host's: `RowDraw`.) A row under a
        // grammar is drawn so too: its token is checked on the host and, where the grammar
        // refuses it, drawn again over the tokens the grammar allows (`grammar_redraw`).
        let n_vocab = self.model.config.n_vocab;
        let on_device = self.model.backend.draws_on_device();
        let (mut dev_rows, mut dev_draws, mut host_rows) = (Vec::new(), Vec::new(), Vec::new());
        // Per logits row: its index among the device draws (Ok) or the host rows (Err).
        let mut place: Vec<Result<usize, usize>> = Vec::with_capacity(row_item.len());
        let guessed_row = |r: usize| guessing.iter().any(|&(_, _, f, n)| (f..f + n).contains(&r));
        // A guessing sequence's rows drawn where the logits are: each row's draw made as plain
        // decoding would make it had the guess's tokens before it been drawn (a copy of the
        // sampler takes them in turn), so a kept token is the draw plain decoding makes.
        let mut guess_sampler: Option<(usize, Sampler)> = None;
        for (r, &gi) in row_item.iter().enumerate() {
            let ri = group[gi].0;
            let s = &mut self.running[ri];
            let edits = || pre_edits(&s.job, &self.eog);
            let draw = if !on_device {
                None
            } else if let Some(&(_, _, first, _)) = guessing
                .iter()
                .find(|&&(_, _, f, n)| (f..f + n).contains(&r))
            {
                let k = r - first;
                if k == 0 {
                    guess_sampler = Some((ri, s.sampler.clone()));
                }
                match guess_sampler.as_mut() {
                    Some((owner, tmp)) if *owner == ri => {
                        let d = tmp.row_draw(&edits(), n_vocab);
                        if let Some(&t) = s.guess.get(k) {
                            tmp.accept(t);
                        }
                        Some(d)
                    }
                    _ => None,
                }
            } else {
                Some(s.sampler.row_draw(&edits(), n_vocab))
            }
            .filter(|d| !(self.cuts_on_host && d.cuts()))
            .filter(|_| !(self.logprobs_on_host && s.job.logprobs.is_some()));
            match draw {
                Some(d) => {
                    place.push(Ok(dev_rows.len()));
                    dev_rows.push(r);
                    dev_draws.push(d);
                }
                None => {
                    place.push(Err(host_rows.len()));
                    host_rows.push(r);
                }
            }
        }
        metrics::counter!("muser_draws_total", "where" => "device")
            .increment(dev_rows.len() as u64);
        metrics::counter!("muser_draws_total", "where" => "host").increment(host_rows.len() as u64);
        // The logits buffer is reused from step to step (tens of megabytes at 64 sequences).
        let mut logits = std::mem::take(&mut self.logits);
        let mut dev_ids = Vec::new();
        let mut scores = Vec::new();
        let t_forward = Instant::now();
        let result = self
            .model
            .forward_device(&mut self.ws, &batch, &mut caches, &rows)
            .and_then(|()| {
                self.model
                    .read_logit_rows(&self.ws, &host_rows, &mut logits)
            })
            .and_then(|()| {
                if dev_rows.is_empty() {
                    return Ok(());
                }
                self.model
                    .draw_logit_rows(&mut self.ws, &dev_rows, &dev_draws, &mut dev_ids)
            })
            .and_then(|()| score_prompts(&self.model, &self.ws, scored_at, &scored, &mut scores));
        // The model's part of a step: the forward pass, the device draws and the rows the host
        // needs copied to it.
        metrics::histogram!("muser_forward_seconds").record(t_forward.elapsed().as_secs_f64());
        drop(caches);
        // Device draws under a grammar: each token checked, the refused ones drawn again over
        // the tokens their grammars allow (or the reason there is none, by device draw).
        let t_grammar = Instant::now();
        let mut dev_no: Vec<Option<NoToken>> = Vec::new();
        let mut dev_lp: Vec<Option<TokenLogprob>> = Vec::new();
        let result = result.and_then(|()| {
            dev_no = self.grammar_redraws(group, &row_item, &place, &dev_rows, &mut dev_ids)?;
            dev_lp =
                self.device_logprobs(group, &row_item, &place, &dev_rows, &dev_ids, &dev_no)?;
            Ok(())
        });
        let grammar_secs = t_grammar.elapsed().as_secs_f64();
        match result {
            Ok(()) => {}
            Err(e) => {
                tracing::error!("forward failed for {} sequences: {e}", group.len());
                for &(ri, _) in group {
                    let s = &mut self.running[ri];
                    s.outbox.clear();
                    s.outbox.push_back(Event::Error {
                        index: s.index,
                        error: ApiError::internal(format!("the engine failed: {e}")),
                    });
                    s.done = true;
                    // The step may have written part of its tokens' rows: not reusable.
                    self.dirty[s.slot] = true;
                    metrics::counter!("muser_sequences_finished_total", "reason" => "error")
                        .increment(1);
                }
                self.logits = logits;
                return;
            }
        }
        let mut prompt_tokens = 0;
        for (lp, &(_, ri, _, _)) in scores.into_iter().zip(&scored) {
            if let Some(s) = self.running.get_mut(ri) {
                s.echo_lp.push(lp);
            }
        }
        for &(ri, n) in group {
            let s = &mut self.running[ri];
            let h = &mut self.history[s.slot];
            if s.prompt_left() > 0 {
                h.extend_from_slice(&s.prompt[s.fed..s.fed + n]);
                s.fed += n;
                prompt_tokens += n;
                // The sequences waiting for the tokens its cache now holds start from a copy.
                self.share_prompt(ri);
                if self.running[ri].prompt_left() == 0 {
                    self.prompt_done(ri);
                }
            } else {
                h.extend(s.pending.take());
            }
        }
        metrics::counter!("muser_prompt_tokens_total").increment(prompt_tokens as u64);
        // Each host row's draw is its own (its sampler, its row): drawn in parallel, a
        // 202,048-token vocabulary times 64 sequences is otherwise a large part of a step.
        let mut row_of: Vec<Option<usize>> = vec![None; self.running.len()];
        // A guessing sequence's host rows, or its device draws: the first and how many.
        let mut rows_of: Vec<Option<(usize, usize)>> = vec![None; self.running.len()];
        let mut dev_of: Vec<Option<(usize, usize)>> = vec![None; self.running.len()];
        for (r, (&gi, p)) in row_item.iter().zip(&place).enumerate() {
            let ri = group[gi].0;
            let (of, at) = match *p {
                Err(h) if !guessed_row(r) => {
                    if let Some(slot) = row_of.get_mut(ri) {
                        *slot = Some(h);
                    }
                    continue;
                }
                Err(h) => (&mut rows_of, h),
                Ok(d) if guessed_row(r) => (&mut dev_of, d),
                Ok(_) => continue,
            };
            if let Some(e) = of.get_mut(ri) {
                let (first, n) = e.get_or_insert((at, 0));
                debug_assert_eq!(*first + *n, at);
                *n += 1;
            }
        }
        let eog = &self.eog;
        let t_sample = Instant::now();
        // Err: the row holds a NaN or an infinity (a file whose weights or scales overflow f32),
        // which a draw would silently turn into token 0 (a row drawn on the device is checked
        // there: its id is NOT_FINITE), or its grammar allows no token its edits leave possible.
        // With the token, its logprobs where the sequence asks for them.
        let mut ids: Vec<Option<Result<Drawn, NoToken>>> = {
            use rayon::prelude::*;
            self.running
                .par_iter_mut()
                .zip(row_of.par_iter())
                .map(|(s, r)| {
                    let row = r.and_then(|r| logits.get(r * n_vocab..(r + 1) * n_vocab))?;
                    if row.iter().any(|v| !v.is_finite()) {
                        return Some(Err(NoToken::NotFinite));
                    }
                    let top = s.job.logprobs;
                    Some(
                        choose(s, row, eog).map(|id| (id, top.map(|n| RowLogprob::of(row, id, n)))),
                    )
                })
                .collect()
        };
        // A guessing sequence's rows, drawn in turn as plain decoding would draw them, each
        // token taken into its sampler before the next row's draw (penalties), while the draws
        // agree with the guess: the tokens drawn (the last one the guess's first miss, or the
        // token after the whole guess, or an end of generation).
        let mut guessed: Vec<Option<Result<Vec<u32>, NoToken>>> = {
            use rayon::prelude::*;
            self.running
                .par_iter_mut()
                .zip(rows_of.par_iter())
                .map(|(s, r)| {
                    let (first, n) = (*r)?;
                    let mut out = Vec::with_capacity(n);
                    for k in 0..n {
                        let Some(row) =
                            logits.get((first + k) * n_vocab..(first + k + 1) * n_vocab)
                        else {
                            break;
                        };
                        if row.iter().any(|v| !v.is_finite()) {
                            return Some(Err(NoToken::NotFinite));
                        }
                        let id = match choose(s, row, eog) {
                            Ok(id) => id,
                            Err(no) => return Some(Err(no)),
                        };
                        s.sampler.accept(id);
                        out.push(id);
                        if s.guess.get(k) != Some(&id) || eog.contains(&id) {
                            break;
                        }
                    }
                    Some(Ok(out))
                })
                .collect()
        };
        for (r, (&gi, p)) in row_item.iter().zip(&place).enumerate() {
            let ri = group[gi].0;
            if guessed_row(r) {
                continue;
            }
            let drawn = match *p {
                Ok(d) => match (dev_ids.get(d).copied(), dev_no.get(d).cloned().flatten()) {
                    (Some(NOT_FINITE), _) => {
                        self.fail_not_finite(ri);
                        continue;
                    }
                    (_, Some(no)) => {
                        self.no_token(ri, no);
                        continue;
                    }
                    (id, None) => id.map(|id| (id, dev_lp.get_mut(d).and_then(Option::take))),
                },
                Err(_) => match ids.get_mut(ri).and_then(Option::take) {
                    Some(Err(
                        no @ (NoToken::GrammarDone | NoToken::GrammarStuck | NoToken::Grammar(_)),
                    )) => {
                        self.no_token(ri, no);
                        continue;
                    }
                    Some(Err(NoToken::NotFinite)) => {
                        self.fail_not_finite(ri);
                        continue;
                    }
                    Some(Ok(drawn)) => Some(drawn),
                    None => None,
                },
            };
            match drawn {
                Some((id, logprob)) => self.next_token(ri, logprob, id, false),
                None => {
                    let s = &mut self.running[ri];
                    s.outbox.push_back(Event::Error {
                        index: s.index,
                        error: ApiError::internal("the engine returned too few logits"),
                    });
                    s.done = true;
                }
            }
        }
        // The guessing sequences: their tokens, in order, until one ends the sequence; their
        // caches keep the pending token and the guessed tokens drawn after it, the rest of the
        // guess's positions taken back out.
        for &(ri, start, _, n) in &guessing {
            // Drawn on the device: the draws up to the first that is not the guess's.
            let on_dev = dev_of.get(ri).copied().flatten().map(|(first, count)| {
                let s = &self.running[ri];
                let mut ids = Vec::new();
                for k in 0..count {
                    let Some(&id) = dev_ids.get(first + k) else {
                        break;
                    };
                    if id == NOT_FINITE {
                        return Err(NoToken::NotFinite);
                    }
                    ids.push(id);
                    if s.guess.get(k) != Some(&id) || self.eog.contains(&id) {
                        break;
                    }
                }
                Ok(ids)
            });
            let from_device = on_dev.is_some();
            let ids = match on_dev.or_else(|| guessed.get_mut(ri).and_then(Option::take)) {
                Some(Ok(ids)) => ids,
                Some(Err(NoToken::NotFinite)) => {
                    self.fail_not_finite(ri);
                    Vec::new()
                }
                Some(Err(no)) => {
                    self.no_token(ri, no);
                    Vec::new()
                }
                None => Vec::new(),
            };
            let mut taken = 0usize;
            for id in ids {
                if self.running[ri].done {
                    break;
                }
                if from_device {
                    // The draw was a copy's: the sequence's sampler counts it, and takes the
                    // token below.
                    self.running[ri].sampler.count_draw();
                }
                self.next_token(ri, None, id, !from_device);
                taken += 1;
            }
            let s = &mut self.running[ri];
            let kept = taken.saturating_sub(1);
            metrics::counter!("muser_draft_tokens_total", "kept" => "yes").increment(kept as u64);
            metrics::counter!("muser_draft_tokens_total", "kept" => "no")
                .increment((n - 1 - kept) as u64);
            let h = &mut self.history[s.slot];
            h.extend_from_slice(&s.guess[..kept.min(s.guess.len())]);
            let keep = start + 1 + kept;
            debug_assert_eq!(h.len(), keep);
            if let Some(kv) = self.slots[s.slot].as_mut()
                && self.model.backend.kv_len(kv) > keep
            {
                if self.model.backend.kv_can_truncate(kv, keep) {
                    self.model.backend.kv_set_len(kv, keep);
                } else {
                    // Not with a guess of at most speculative::MAX_DRAFT tokens: a ring keeps
                    // 512 positions to go back.
                    self.dirty[s.slot] = true;
                    if !s.done {
                        s.outbox.push_back(Event::Error {
                            index: s.index,
                            error: ApiError::internal("the cache could not go back after a guess"),
                        });
                        s.done = true;
                    }
                }
            }
        }
        // Drawing the tokens and turning them into events (logprobs, stop strings, text), and
        // the device draws' grammar checks and redraws.
        metrics::histogram!("muser_sample_seconds")
            .record(t_sample.elapsed().as_secs_f64() + grammar_secs);
        self.logits = logits;
    }

    /// The logprobs of the device-drawn rows whose sequences ask for them (`dev_ids`, in the
    /// order of `dev_rows`, and `dev_no`, the rows without a token), computed where the logits
    /// are for the token drawn: per device row, None where it has none.
    fn device_logprobs(
        &self,
        group: &[(usize, usize)],
        row_item: &[usize],
        place: &[Result<usize, usize>],
        dev_rows: &[usize],
        dev_ids: &[u32],
        dev_no: &[Option<NoToken>],
    ) -> muser_engine::Result<Vec<Option<TokenLogprob>>> {
        let mut lp: Vec<Option<TokenLogprob>> = vec![None; dev_ids.len()];
        let (mut rows, mut ids, mut tops, mut at) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (&gi, p) in row_item.iter().zip(place) {
            if let (Ok(d), Some(s)) = (p, self.running.get(group[gi].0))
                && let Some(n) = s.job.logprobs
                && let (Some(&r), Some(&id)) = (dev_rows.get(*d), dev_ids.get(*d))
                && id != NOT_FINITE
                && dev_no.get(*d).is_none_or(Option::is_none)
            {
                rows.push(r);
                ids.push(id);
                tops.push(n);
                at.push(*d);
            }
        }
        if rows.is_empty() {
            return Ok(lp);
        }
        let mut got = Vec::new();
        self.model
            .logit_row_logprobs(&self.ws, &rows, &ids, &tops, &mut got)?;
        for (d, l) in at.into_iter().zip(got) {
            if let Some(slot) = lp.get_mut(d) {
                *slot = Some(l);
            }
        }
        Ok(lp)
    }

    /// The device-drawn rows of constrained sequences (`dev_ids`, in the order of `dev_rows`):
    /// each token checked against its grammar, and those refused drawn again on the device
    /// over the tokens the grammar allows (`grammar_redraw`), their ids put in `dev_ids`.
    /// Returns, per device row, why it has no token (None: it has one).
    fn grammar_redraws(
        &mut self,
        group: &[(usize, usize)],
        row_item: &[usize],
        place: &[Result<usize, usize>],
        dev_rows: &[usize],
        dev_ids: &mut [u32],
    ) -> muser_engine::Result<Vec<Option<NoToken>>> {
        use rayon::prelude::*;
        let mut no: Vec<Option<NoToken>> = vec![None; dev_ids.len()];
        // Per running sequence: its device row's index, where it has one under a grammar.
        let mut dev_of: Vec<Option<usize>> = vec![None; self.running.len()];
        let mut any = false;
        for (&gi, p) in row_item.iter().zip(place) {
            let ri = group[gi].0;
            if let (Ok(d), Some(s)) = (p, self.running.get(ri))
                && s.constraint.as_ref().is_some_and(Constraint::constrains)
                && dev_ids.get(*d).is_some_and(|&id| id != NOT_FINITE)
                && let Some(slot) = dev_of.get_mut(ri)
            {
                *slot = Some(*d);
                any = true;
            }
        }
        if !any {
            return Ok(no);
        }
        let (eog, n_vocab) = (&self.eog, self.model.config.n_vocab);
        let verdicts: Vec<Option<(usize, Redraw)>> = self
            .running
            .par_iter_mut()
            .zip(dev_of.par_iter())
            .map(|(s, d)| {
                let d = (*d)?;
                let id = *dev_ids.get(d)?;
                Some((d, grammar_redraw(s, id, eog, n_vocab)))
            })
            .collect();
        let (mut rows, mut draws, mut at) = (Vec::new(), Vec::new(), Vec::new());
        for (d, v) in verdicts.into_iter().flatten() {
            match v {
                Ok(None) => {}
                Ok(Some(draw)) => {
                    if let Some(&r) = dev_rows.get(d) {
                        rows.push(r);
                        draws.push(draw);
                        at.push(d);
                    }
                }
                Err(e) => no[d] = Some(e),
            }
        }
        metrics::counter!("muser_grammar_redraws_total").increment(rows.len() as u64);
        if rows.is_empty() {
            return Ok(no);
        }
        let mut ids = Vec::new();
        self.model
            .draw_logit_rows(&mut self.ws, &rows, &draws, &mut ids)?;
        for (&d, id) in at.iter().zip(ids) {
            if let Some(slot) = dev_ids.get_mut(d) {
                *slot = id;
            }
        }
        Ok(no)
    }

    /// `running[ri]`'s prompt has run: with echo, send it back (`Event::Echo`); with nothing to
    /// generate (max_tokens 0), end there.
    fn prompt_done(&mut self, ri: usize) {
        // A scored position whose logits held a NaN (a damaged file's overflow): no score.
        if self.running[ri].echo_lp.iter().any(|l| l.logprob.is_nan()) {
            self.fail_not_finite(ri);
            return;
        }
        let tok = &self.tok;
        let s = &mut self.running[ri];
        if s.job.echo {
            let mut dec = StreamDecoder::new(s.job.skip_special, std::iter::empty::<String>());
            let lps = s.job.logprobs.is_some();
            let mut lp = std::mem::take(&mut s.echo_lp).into_iter();
            let mut tokens: Vec<EchoToken> = s
                .prompt
                .iter()
                .enumerate()
                .map(|(i, &id)| EchoToken {
                    id,
                    // A token the tokenizer cannot spell (its id checked when the prompt was
                    // read) adds no text.
                    text: dec.push(tok, id).unwrap_or_default(),
                    logprob: if lps && i > 0 { lp.next() } else { None },
                })
                .collect();
            if let Some(last) = tokens.last_mut() {
                last.text.push_str(&dec.finish());
            }
            s.outbox.push_back(Event::Echo {
                index: s.index,
                tokens,
                logprobs: lps,
            });
        }
        if s.max_tokens == 0 {
            self.end_without_token(ri, Finish::Length);
        }
    }

    /// The sequences following `running[ri]` (`Seq::follow`) whose first tokens its cache now
    /// holds: each slot's cache becomes a copy of its, back to those tokens (`copy_prefix`; a
    /// choice of the same prompt runs its last prompt token again for its own logits). Where a
    /// copy cannot be made the follower runs its prompt itself.
    fn share_prompt(&mut self, ri: usize) {
        let Some(l) = self.running.get(ri) else {
            return;
        };
        let (ls, held, job) = (l.slot, self.history[l.slot].len(), l.job.clone());
        let followers: Vec<(usize, usize)> = (0..self.running.len())
            .filter_map(|i| {
                let f = self.running[i].follow.as_ref()?;
                (f.leads(l) && f.keep <= held).then_some((i, f.keep))
            })
            .collect();
        for (fi, keep) in followers {
            let f = &mut self.running[fi];
            f.follow = None;
            let (fs, prompt) = (f.slot, f.prompt.clone());
            let copied = self.copy_prefix(ls, fs, &prompt, keep);
            let f = &mut self.running[fi];
            let sibling = Arc::ptr_eq(&f.job, &job);
            f.started_from(copied, keep, sibling);
        }
    }

    /// End `running[ri]`, whose grammar gives it no token (`no`: not NotFinite).
    fn no_token(&mut self, ri: usize, no: NoToken) {
        match no {
            NoToken::GrammarDone => self.end_without_token(ri, Finish::Stop),
            NoToken::GrammarStuck => self.fail_grammar(
                ri,
                "the grammar allows no token after the text so far: the vocabulary cannot continue it".into(),
            ),
            NoToken::Grammar(e) => self.fail_grammar(ri, e),
            NoToken::NotFinite => self.fail_not_finite(ri),
        }
    }

    /// End `running[ri]` with an error: its logits hold a NaN or an infinity.
    fn fail_not_finite(&mut self, ri: usize) {
        let s = &mut self.running[ri];
        s.outbox.push_back(Event::Error {
            index: s.index,
            error: ApiError::internal(
                "the model's logits are not finite: its weights or scales overflow f32 (a damaged file?)",
            ),
        });
        s.done = true;
        // Its cache may hold the overflow too: not for reuse.
        self.dirty[s.slot] = true;
        metrics::counter!("muser_sequences_finished_total", "reason" => "error").increment(1);
    }

    /// End `running[ri]` with a 400: its grammar cannot go on (`message` says why).
    fn fail_grammar(&mut self, ri: usize, message: String) {
        let s = &mut self.running[ri];
        s.outbox.push_back(Event::Error {
            index: s.index,
            error: ApiError::bad_request(message).code("grammar_stuck"),
        });
        s.done = true;
        metrics::counter!("muser_sequences_finished_total", "reason" => "error").increment(1);
    }

    /// End `running[ri]` without a token: its grammar is complete and allows nothing more (an
    /// end-of-generation token, the one way on, is masked by `ignore_eos`).
    fn end_without_token(&mut self, ri: usize, finish: Finish) {
        let s = &mut self.running[ri];
        let text = s.decoder.finish();
        s.outbox.push_back(Event::Done {
            index: s.index,
            finish,
            text,
            prompt_tokens: s.prompt.len(),
            cached_tokens: s.reused,
            completion_tokens: s.generated,
        });
        s.done = true;
        metrics::counter!("muser_sequences_finished_total", "reason" => finish.as_str())
            .increment(1);
    }

    /// Emit `id`, the token drawn for `running[ri]`, with its logprobs if it asks for them.
    /// `taken`: the sampler has taken `id` already (a guessing sequence's draws).
    fn next_token(&mut self, ri: usize, logprob: Option<TokenLogprob>, id: u32, taken: bool) {
        let eog = &self.eog;
        let tok = &self.tok;
        let n_ctx = self.cfg.n_ctx;
        let s = &mut self.running[ri];
        let j = &s.job;
        if !taken {
            s.sampler.accept(id);
        }
        if let (Some(c), Some(v)) = (&mut s.constraint, &j.grammar_vocab)
            && let Err(e) = c.accept(v, id)
        {
            // A constrained token is one the grammar allows; taking it can still run out of the
            // matcher's budget, as checking it did not.
            self.fail_grammar(ri, e.to_string());
            return;
        }
        s.generated += 1;
        self.rate_tokens += 1;
        metrics::counter!("muser_generation_tokens_total").increment(1);
        if s.first_token.is_none() {
            let now = Instant::now();
            s.first_token = Some(now);
            metrics::histogram!("muser_time_to_first_token_seconds")
                .record((now - s.arrived).as_secs_f64());
        }
        let finish = if eog.contains(&id) && !j.ignore_eos {
            Some(Finish::Stop)
        } else {
            let text = match s.decoder.push(tok, id) {
                Ok(t) => t,
                Err(e) => {
                    s.outbox.push_back(Event::Error {
                        index: s.index,
                        error: ApiError::internal(format!("cannot decode token {id}: {e}")),
                    });
                    s.done = true;
                    return;
                }
            };
            s.outbox.push_back(Event::Token {
                index: s.index,
                id,
                text,
                logprob,
            });
            if s.decoder.stopped().is_some() {
                Some(Finish::Stop)
            } else if s.generated >= s.max_tokens || s.prompt.len() + s.generated >= n_ctx {
                Some(Finish::Length)
            } else {
                s.pending = Some(id);
                None
            }
        };
        if let Some(f) = finish {
            let text = s.decoder.finish();
            s.outbox.push_back(Event::Done {
                index: s.index,
                finish: f,
                text,
                prompt_tokens: s.prompt.len(),
                cached_tokens: s.reused,
                completion_tokens: s.generated,
            });
            s.done = true;
            let ttft = s
                .first_token
                .map_or(0, |t| (t - s.arrived).as_millis() as u64);
            tracing::info!(
                request_id = %s.job.request_id,
                choice = s.index,
                prompt_tokens = s.prompt.len(),
                completion_tokens = s.generated,
                finish = f.as_str(),
                ttft_ms = ttft,
                total_ms = s.arrived.elapsed().as_millis() as u64,
                "finished"
            );
            metrics::counter!("muser_sequences_finished_total", "reason" => f.as_str())
                .increment(1);
        }
    }

    /// Free the slots of finished sequences (their KV is cleared for the next one).
    fn release_done(&mut self) {
        let mut i = 0;
        while i < self.running.len() {
            if !self.running[i].done {
                i += 1;
                continue;
            }
            let mut s = self.running.swap_remove(i);
            // The cache stays for a later prompt that begins with its tokens (pick_slot),
            // unless reuse is off or a failed step may have spoiled it.
            if let Some(Some(kv)) = self.slots.get(s.slot) {
                let keep = self.cfg.prefix_reuse
                    && !self.dirty[s.slot]
                    && self.model.backend.kv_len(kv) == self.history[s.slot].len();
                if keep {
                    let bytes = self.shared.cost.bytes(self.history[s.slot].len());
                    self.kept[s.slot] = bytes;
                    self.kept_total += bytes;
                } else {
                    self.clear_slot(s.slot);
                }
            }
            self.ticks += 1;
            self.freed_at[s.slot] = self.ticks;
            self.free.push(s.slot);
            self.reserved -= s.reserve;
            self.shared.active.fetch_sub(1, Ordering::SeqCst);
            if !s.outbox.is_empty() {
                self.draining.push((
                    s.job.tx.clone(),
                    std::mem::take(&mut s.outbox),
                    Instant::now(),
                ));
            }
        }
        // Keep admission order (swap_remove moved the last one): older sequences prompt first.
        self.running.sort_by_key(|s| s.arrived);
    }

    /// Hand queued events to the clients; a closed channel cancels its sequences next step, and
    /// so does a client that has taken nothing for `stall_timeout` (its stream is never read:
    /// without this it would hold its slot, and with `--parallel` such clients every slot).
    fn flush(&mut self) {
        let limit = self.cfg.stall_timeout;
        let now = Instant::now();
        // The choices of one request share its channel: the client is reading if any event went
        // out on that channel, whichever choice it came from (the first of them may take every
        // free place while the others wait).
        let mut moving: Vec<tokio::sync::mpsc::Sender<Event>> = Vec::new();
        let mut sent = Vec::with_capacity(self.running.len());
        for s in &mut self.running {
            let before = s.outbox.len();
            let r = send_all(&s.job.tx, &mut s.outbox);
            if s.outbox.len() < before && !moving.iter().any(|t| t.same_channel(&s.job.tx)) {
                moving.push(s.job.tx.clone());
            }
            sent.push(r);
        }
        for (tx, q, _) in &mut self.draining {
            let before = q.len();
            send_all(tx, q);
            if q.len() < before && !moving.iter().any(|t| t.same_channel(tx)) {
                moving.push(tx.clone());
            }
        }
        let read =
            |tx: &tokio::sync::mpsc::Sender<Event>| moving.iter().any(|t| t.same_channel(tx));
        for (s, r) in self.running.iter_mut().zip(sent) {
            match r {
                Sent::Closed if !s.done => cancel(s),
                Sent::Blocked => {
                    if read(&s.job.tx) {
                        s.stalled_since = Some(now);
                    }
                    let since = *s.stalled_since.get_or_insert(now);
                    if now.duration_since(since) >= limit && !s.done {
                        stalled(s, limit);
                    }
                }
                _ => s.stalled_since = None,
            }
        }
        self.draining.retain_mut(|(tx, q, since)| {
            if q.is_empty() || tx.is_closed() {
                return false;
            }
            if read(tx) {
                *since = now;
            }
            now.duration_since(*since) < limit
        });
        self.release_done();
    }

    /// Shutdown deadline: every remaining sequence ends with a 503 error event.
    fn cancel_all(&mut self) {
        let n = self.running.len() + self.waiting.len();
        if n > 0 {
            tracing::warn!(sequences = n, "shutdown deadline: cancelling what is left");
        }
        for mut s in std::mem::take(&mut self.waiting) {
            s.outbox.push_back(Event::Error {
                index: s.index,
                error: ApiError::unavailable("the server shut down before this request ran"),
            });
            self.finish_unadmitted(s);
        }
        for s in &mut self.running {
            if !s.done {
                s.outbox.push_back(Event::Error {
                    index: s.index,
                    error: ApiError::unavailable("the server shut down during this request"),
                });
                s.done = true;
            }
        }
        self.release_done();
    }

    fn update_gauges(&mut self) {
        let used: usize = self
            .running
            .iter()
            .map(|s| {
                self.slots
                    .get(s.slot)
                    .and_then(|k| k.as_ref())
                    .map_or(0, |kv| {
                        self.shared.cost.bytes(self.model.backend.kv_len(kv))
                    })
            })
            .sum();
        metrics::gauge!("muser_queue_depth").set(self.waiting.len() as f64);
        metrics::gauge!("muser_sequences_running").set(self.running.len() as f64);
        metrics::gauge!("muser_kv_cache_used_bytes").set(used as f64);
        metrics::gauge!("muser_kv_cache_reserved_bytes").set(self.reserved as f64);
        metrics::gauge!("muser_kv_cache_kept_bytes").set(self.kept_total as f64);
        metrics::gauge!("muser_kv_cache_usage_ratio")
            .set(used as f64 / self.shared.budget.max(1) as f64);
        let dt = self.rate_since.elapsed();
        if dt >= Duration::from_secs(1) {
            metrics::gauge!("muser_tokens_per_second")
                .set(self.rate_tokens as f64 / dt.as_secs_f64());
            self.rate_tokens = 0;
            self.rate_since = Instant::now();
        }
    }
}

/// Whether the response builder asked choice `index` to end (its answer met a stop string).
fn stop_flagged(job: &JobCommon, index: usize) -> bool {
    job.stop_flags
        .as_ref()
        .and_then(|f| f.get(index))
        .is_some_and(|f| f.load(Ordering::Relaxed))
}

/// The client went away: end the sequence (its slot is freed by `release_done`).
fn cancel(s: &mut Seq) {
    tracing::info!(request_id = %s.job.request_id, choice = s.index, generated = s.generated, "cancelled: client disconnected");
    metrics::counter!("muser_sequences_finished_total", "reason" => "cancelled").increment(1);
    s.done = true;
    s.outbox.clear();
}

/// The client has taken nothing for `limit`: end the sequence (its slot is freed by
/// `release_done`; what it queued is dropped).
fn stalled(s: &mut Seq, limit: Duration) {
    tracing::warn!(request_id = %s.job.request_id, choice = s.index, generated = s.generated, seconds = limit.as_secs_f64(), "cancelled: the client took nothing it was sent");
    metrics::counter!("muser_sequences_finished_total", "reason" => "stalled").increment(1);
    s.done = true;
    s.outbox.clear();
    s.stalled_since = None;
}

#[derive(PartialEq)]
enum Sent {
    All,
    Blocked,
    Closed,
}

fn send_all(tx: &tokio::sync::mpsc::Sender<Event>, q: &mut VecDeque<Event>) -> Sent {
    while let Some(ev) = q.pop_front() {
        match tx.try_send(ev) {
            Ok(()) => {}
            Err(TrySendError::Full(ev)) => {
                q.push_front(ev);
                return Sent::Blocked;
            }
            Err(TrySendError::Closed(_)) => {
                q.clear();
                return Sent::Closed;
            }
        }
    }
    Sent::All
}

/// The edits a sequence's request makes to its logits before a draw on the device, in the
/// order `choose` makes them on the host: its logit biases, then the end-of-generation tokens
/// masked when it ignores them.
fn pre_edits(j: &JobCommon, eog: &[u32]) -> Vec<LogitEdit> {
    let mut e: Vec<LogitEdit> = j
        .logit_bias
        .iter()
        .map(|&(token, bias)| LogitEdit::Add { token, bias })
        .collect();
    if j.ignore_eos {
        e.extend(eog.iter().map(|&token| LogitEdit::Mask { token }));
    }
    e
}

/// A token drawn, with its logprobs where its sequence asks for them.
type Drawn = (u32, Option<TokenLogprob>);

/// After a draw under a grammar: nothing to do (its token is allowed), a draw again under the
/// grammar's mask, or why no token can come (`grammar_redraw`).
type Redraw = Result<Option<RowDraw>, NoToken>;

/// Why a row gives no token.
#[derive(Clone, Debug)]
enum NoToken {
    /// Its logits hold a NaN or an infinity.
    NotFinite,
    /// Its grammar is complete and allows only an end-of-generation token, which `ignore_eos`
    /// masks: the output is whole.
    GrammarDone,
    /// Its grammar allows no token here (one whose words the vocabulary cannot spell).
    GrammarStuck,
    /// Its grammar is too ambiguous to follow (`muser_text::grammar::gbnf::MAX_WORK`).
    Grammar(String),
}

/// Draw the next token of `s` from its logits row (its logit bias applied, end-of-generation
/// tokens masked when it ignores them). With a grammar, as llama.cpp's sampler: the chain's
/// token if the grammar allows it, else the chain again over the tokens the grammar allows
/// (common/sampling.cpp `common_sampler_sample`: the grammar is applied only when the first
/// choice is refused).
fn choose(s: &mut Seq, row: &[f32], eog: &[u32]) -> Result<u32, NoToken> {
    let first = draw(s, row, eog, None);
    Ok(match refused(s, first, eog, row.len())? {
        None => first,
        Some(mask) => draw(s, row, eog, Some(&mask)),
    })
}

/// After a draw of `id` for `s`: None when its grammar (if any) allows `id`; else the mask of
/// the tokens it allows (below `n`), or why no token can come (none but an end that
/// `ignore_eos` masks: the output is whole; none at all: stuck).
fn refused(s: &mut Seq, id: u32, eog: &[u32], n: usize) -> Result<Option<Arc<[u64]>>, NoToken> {
    let (Some(c), Some(v)) = (&mut s.constraint, &s.job.grammar_vocab) else {
        return Ok(None);
    };
    let grammar = |e: muser_text::TextError| NoToken::Grammar(e.to_string());
    if c.allows(v, id).map_err(grammar)? {
        return Ok(None);
    }
    let mask = c.allowed(v).map_err(grammar)?;
    let except = if s.job.ignore_eos { eog } else { &[] };
    if !mask_has_token(&mask, n, except) {
        return Err(if c.is_complete() {
            NoToken::GrammarDone
        } else {
            NoToken::GrammarStuck
        });
    }
    Ok(Some(mask))
}

/// The logits rows `scored_at..` of the last forward (the prompt positions `scored`) as
/// log-probabilities of the prompt's next tokens, with their alternatives, in order, into
/// `out`: by the backend where the logits are (`Backend::row_logprobs`: on a device, two
/// numbers a row come back and two an alternative).
fn score_prompts<B: Backend>(
    model: &MuseGlimmer<B>,
    ws: &Workspace<B>,
    scored_at: usize,
    scored: &[(usize, usize, u32, usize)],
    out: &mut Vec<TokenLogprob>,
) -> muser_engine::Result<()> {
    if scored.is_empty() {
        return Ok(());
    }
    let rows: Vec<usize> = (0..scored.len()).map(|i| scored_at + i).collect();
    let targets: Vec<u32> = scored.iter().map(|p| p.2).collect();
    let tops: Vec<usize> = scored.iter().map(|p| p.3).collect();
    model.logit_row_logprobs(ws, &rows, &targets, &tops, out)
}

/// After a `RowDraw` chose `id` for `s`: None when its grammar (if any) allows `id`; else the
/// draw again over the tokens the grammar allows, as the host chain's `choose` does it: the
/// next draw of the sequence's stream (fresh noise: its choice is a draw from the allowed
/// tokens' softmax whatever was refused), the same edits, the grammar's mask
/// (`RowDraw::allowed`). Or why no token can come.
fn grammar_redraw(s: &mut Seq, id: u32, eog: &[u32], n_vocab: usize) -> Redraw {
    let Some(mask) = refused(s, id, eog, n_vocab)? else {
        return Ok(None);
    };
    let mut d = s.sampler.row_draw(&pre_edits(&s.job, eog), n_vocab);
    d.allowed = Some(mask);
    Ok(Some(d))
}

/// Whether `mask` allows a token below `n` other than those of `except`.
fn mask_has_token(mask: &[u64], n: usize, except: &[u32]) -> bool {
    mask.iter().enumerate().take(n.div_ceil(64)).any(|(i, &w)| {
        let mut w = w;
        if (i + 1) * 64 > n {
            w &= (1u64 << (n % 64)) - 1;
        }
        for &e in except {
            if e as usize / 64 == i {
                w &= !(1u64 << (e % 64));
            }
        }
        w != 0
    })
}

/// One draw of the chain over `row` with the request's edits, the tokens outside `allowed`
/// masked.
fn draw(s: &mut Seq, row: &[f32], eog: &[u32], allowed: Option<&[u64]>) -> u32 {
    let j = &s.job;
    if j.logit_bias.is_empty() && !j.ignore_eos && allowed.is_none() {
        return s.sampler.sample(row);
    }
    let (bias, ignore_eos) = (&j.logit_bias, j.ignore_eos);
    s.sampler.sample_adjusted(row, |l| {
        for &(t, b) in bias {
            if let Some(x) = l.get_mut(t as usize) {
                *x += b;
            }
        }
        if ignore_eos {
            for &t in eog {
                if let Some(x) = l.get_mut(t as usize) {
                    *x = f32::NEG_INFINITY;
                }
            }
        }
        if let Some(m) = allowed {
            for (id, x) in l.iter_mut().enumerate() {
                if !mask_allows(m, id as u32) {
                    *x = f32::NEG_INFINITY;
                }
            }
        }
    })
}
