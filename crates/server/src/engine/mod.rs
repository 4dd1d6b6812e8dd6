//! The engine thread: it owns the model, the KV caches and the scheduler, and talks to the HTTP
//! handlers over channels (the model is not safe to call from several threads at once).
//!
//! A handler validates a request, turns it into a [`Job`] (one sequence per choice) and
//! [`EngineHandle::submit`]s it; the engine streams [`Event`]s back on the job's bounded channel.
//! A handler that goes away (client disconnected) drops the receiver: the engine sees the
//! channel closed at its next step, cancels the sequences and frees their KV.

mod scheduler;
mod worker;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

use muser_engine::{Backend, KvType, MuseConfig, MuseGlimmer, SamplingParams};
use muser_text::Tokenizer;
use tokio::sync::mpsc;

use crate::error::ApiError;
pub use scheduler::KvCost;

/// How the engine batches and what it admits.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Positions one sequence may hold (prompt and completion).
    pub n_ctx: usize,
    /// Sequences decoded together (each has a KV cache of `n_ctx`).
    pub parallel: usize,
    /// Tokens one engine step runs at most (decode tokens first, then prompt chunks).
    pub step_tokens: usize,
    /// Sequences that may wait for a slot; beyond that, requests get 429.
    pub max_queue: usize,
    pub kv_type: KvType,
    /// KV memory admitted sequences may reserve at their worst case (default: `parallel` full contexts).
    pub kv_budget_bytes: Option<usize>,
    /// Keep a finished sequence's cache in its slot, and start a new sequence whose prompt
    /// begins with the same tokens in that slot, from where they end (prefix reuse).
    pub prefix_reuse: bool,
    /// A sequence whose client has taken none of its queued events for this long (a stream
    /// nobody reads) is cancelled: its slot and KV go to the next request. Finished answers
    /// waiting for such a client are dropped after it too.
    pub stall_timeout: std::time::Duration,
    /// Guess each decoding sequence's next tokens from its own (`speculative`) and check the
    /// guess in the step's forward; None: one token a step.
    pub draft: Option<muser_engine::speculative::NgramDraft>,
}

/// One choice of a request: its prompt and its sampler.
#[derive(Clone, Debug)]
pub struct SeqSpec {
    /// The index of the choice in the response.
    pub index: usize,
    pub prompt: Arc<[u32]>,
    pub params: SamplingParams,
    /// Completion tokens at most (the prompt plus this fits the context: checked at validation).
    pub max_tokens: usize,
}

/// A validated request, as the engine runs it.
pub struct Job {
    pub request_id: String,
    pub seqs: Vec<SeqSpec>,
    pub stops: Vec<String>,
    /// Set by the response builder when a choice must end (its answer met a stop string): one
    /// flag per choice, read by the engine before each step (`Worker::reap_closed`).
    pub stop_flags: Option<std::sync::Arc<[std::sync::atomic::AtomicBool]>>,
    /// Drop control tokens from the text (completions) or keep them for the ATEM parser (chat).
    pub skip_special: bool,
    /// Return each token's log-probability and this many alternatives.
    pub logprobs: Option<usize>,
    /// Send each choice's prompt back before its completion (`Event::Echo`; completions'
    /// `echo`), with its tokens' log-probabilities when `logprobs` asks for them.
    pub echo: bool,
    /// Keep generating past end-of-generation tokens (they are masked out).
    pub ignore_eos: bool,
    pub logit_bias: Vec<(u32, f32)>,
    /// The request field the completion length came from (`max_completion_tokens` or
    /// `max_tokens`), named by a refusal about it.
    pub max_tokens_param: &'static str,
    /// What every choice's output must match, if anything.
    pub grammar: Option<JobGrammar>,
    pub tx: mpsc::Sender<Event>,
}

/// A request's grammar, as each of its choices follows it.
#[derive(Clone)]
pub struct JobGrammar {
    pub grammar: Arc<muser_text::grammar::Grammar>,
    /// The grammar's masks over `vocab`, shared with the other requests of this grammar.
    pub masks: Arc<muser_text::grammar::MaskCache>,
    /// The vocabulary's pieces as the grammar reads them (one per tokenizer, shared).
    pub vocab: Arc<muser_text::grammar::GrammarVocab>,
    /// Where every choice starts in the grammar: past the text the prompt ends with that the
    /// grammar begins with (its prefill), matched once.
    pub start: muser_text::grammar::GrammarState,
    /// A lazy grammar's trigger: every choice is free until it finds its text (`tool_choice`
    /// auto); None: constrained from the first token.
    pub trigger: Option<muser_text::grammar::Trigger>,
}

/// A token's log-probability under the model and the most likely alternatives.
pub use muser_engine::sampling::RowLogprob as TokenLogprob;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// An end-of-generation token or a stop string.
    Stop,
    /// `max_tokens` reached (or the context is full).
    Length,
}

impl Finish {
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
        }
    }
}

/// What the engine sends back, per choice (`index`).
#[derive(Clone, Debug)]
pub enum Event {
    /// A generated token and the text that became final with it (often empty: held back at a
    /// UTF-8 boundary or as a possible stop-string start).
    Token {
        index: usize,
        id: u32,
        text: String,
        logprob: Option<TokenLogprob>,
    },
    /// The choice ended; `text` is the last held-back text.
    Done {
        index: usize,
        finish: Finish,
        text: String,
        prompt_tokens: usize,
        /// Prompt tokens whose cache a finished sequence left (prefix reuse): not run again.
        cached_tokens: usize,
        completion_tokens: usize,
    },
    /// The choice's prompt, sent back before its first token (`Job::echo`): its tokens, their
    /// text, and with `logprobs` each one's log-probability after the tokens before it (none for
    /// the first).
    Echo {
        index: usize,
        tokens: Vec<EchoToken>,
        logprobs: bool,
    },
    /// The choice failed (engine error, shutdown).
    Error { index: usize, error: ApiError },
}

/// A prompt token sent back (`Event::Echo`).
#[derive(Clone, Debug)]
pub struct EchoToken {
    pub id: u32,
    /// The text that became final with it (the last one's carries what was held back).
    pub text: String,
    pub logprob: Option<TokenLogprob>,
}

/// What `/slots` asks of a slot (llama.cpp's slot actions).
#[derive(Clone, Debug)]
pub enum SlotAction {
    /// Every slot: whether it runs a sequence, the positions its cache keeps.
    List,
    /// Copy the slot's kept cache and its tokens out of the backend (the engine thread's part of
    /// a save: the caller writes the file, off that thread).
    Save,
    /// Make the slot keep a state file's cache, read and checked beforehand off the engine
    /// thread: a later prompt that begins with its tokens continues from it (prefix reuse), in
    /// this server or after a restart.
    Restore(Box<muser_engine::state::SavedState>),
    /// Forget the slot's kept cache.
    Erase,
}

/// The engine's answer to a slot action.
#[derive(Debug)]
pub enum SlotReply {
    /// The answer to send as it is.
    Done(serde_json::Value),
    /// A slot's cache copied out (`SlotAction::Save`): the state to write, the window the file
    /// records, and the milliseconds the copy held the engine thread.
    Snapshot {
        state: Box<muser_engine::state::SavedState>,
        n_swa: usize,
        copy_ms: f64,
    },
}

pub(crate) enum Command {
    Submit(Job),
    /// A slot action (`slot` is None for `List`); the answer is the JSON body.
    Slot {
        slot: Option<usize>,
        action: SlotAction,
        reply: tokio::sync::oneshot::Sender<Result<SlotReply, ApiError>>,
    },
    /// Finish in-flight work, cancelling what is left at `deadline`.
    Shutdown {
        deadline: Instant,
    },
}

/// What handlers and the engine share.
pub(crate) struct Shared {
    /// Sequences accepted and not yet finished (waiting or running).
    active: AtomicUsize,
    /// `parallel + max_queue`: more active sequences than this are refused with 429.
    capacity: usize,
    accepting: AtomicBool,
    /// The engine thread runs (false once it has returned or panicked).
    alive: AtomicBool,
    pub cost: KvCost,
    pub budget: usize,
    pub n_ctx: usize,
    /// Slots: sequences that run at once.
    pub parallel: usize,
}

/// The handlers' side of the engine. Cheap to clone.
#[derive(Clone)]
pub struct EngineHandle {
    cmd: std::sync::mpsc::Sender<Command>,
    shared: Arc<Shared>,
}

impl EngineHandle {
    pub fn n_ctx(&self) -> usize {
        self.shared.n_ctx
    }

    /// Slots: sequences that run at once (`--parallel`).
    pub fn parallel(&self) -> usize {
        self.shared.parallel
    }

    /// Queue a job, or refuse it at once: 429 when the queue is full, 503 when shutting down,
    /// 400 when one of its sequences could never fit the KV budget or it has more sequences
    /// than the server ever holds.
    pub fn submit(&self, job: Job) -> Result<(), ApiError> {
        let n = job.seqs.len();
        if !self.shared.accepting.load(Ordering::SeqCst) {
            return Err(ApiError::unavailable("the server is shutting down"));
        }
        if !self.alive() {
            return Err(ApiError::unavailable("the engine has stopped"));
        }
        let s = &self.shared;
        for q in &job.seqs {
            let need = s.cost.bytes((q.prompt.len() + q.max_tokens).min(s.n_ctx));
            if need > s.budget {
                return Err(ApiError::invalid(
                    job.max_tokens_param,
                    format!(
                        "this request needs {need} bytes of KV cache at most, above the server's budget of {} bytes; lower {} or shorten the prompt",
                        s.budget, job.max_tokens_param
                    ),
                ));
            }
        }
        if n > s.capacity {
            // Never fits, however long the client waits: not a 429 it would retry.
            return Err(ApiError::invalid(
                "n",
                format!(
                    "this request asks for {n} sequences (choices x prompts), more than the {} this server runs and queues at once",
                    s.capacity
                ),
            ));
        }
        if s.active
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |a| {
                (a + n <= s.capacity).then_some(a + n)
            })
            .is_err()
        {
            metrics::counter!("muser_rejected_total", "reason" => "queue_full").increment(1);
            return Err(ApiError::overloaded(
                format!(
                    "the server is at capacity ({} sequences running or queued); retry later",
                    s.capacity
                ),
                1,
            ));
        }
        if self.cmd.send(Command::Submit(job)).is_err() {
            s.active.fetch_sub(n, Ordering::SeqCst);
            return Err(ApiError::unavailable("the engine has stopped"));
        }
        Ok(())
    }

    /// Run a slot action on the engine thread (between steps) and wait for its answer.
    pub async fn slot(
        &self,
        slot: Option<usize>,
        action: SlotAction,
    ) -> Result<SlotReply, ApiError> {
        if !self.alive() {
            return Err(ApiError::unavailable("the engine has stopped"));
        }
        let (reply, rx) = tokio::sync::oneshot::channel();
        self.cmd
            .send(Command::Slot {
                slot,
                action,
                reply,
            })
            .map_err(|_| ApiError::unavailable("the engine has stopped"))?;
        rx.await
            .map_err(|_| ApiError::unavailable("the engine stopped before answering"))?
    }

    pub fn accepting(&self) -> bool {
        self.shared.accepting.load(Ordering::SeqCst)
    }

    /// Whether the engine thread still runs.
    pub fn alive(&self) -> bool {
        self.shared.alive.load(Ordering::SeqCst)
    }

    /// Stop accepting requests; the engine finishes in-flight ones until `deadline`, then
    /// cancels the rest and exits.
    pub fn shutdown(&self, deadline: Instant) {
        self.shared.accepting.store(false, Ordering::SeqCst);
        let _ = self.cmd.send(Command::Shutdown { deadline });
    }

    /// Sequences accepted and not finished.
    pub fn active(&self) -> usize {
        self.shared.active.load(Ordering::SeqCst)
    }
}

/// Start the engine thread, which owns `model` until shutdown.
pub fn start<B: Backend + 'static>(
    model: MuseGlimmer<B>,
    tok: Arc<Tokenizer>,
    cfg: EngineConfig,
) -> Result<(EngineHandle, std::thread::JoinHandle<()>), String> {
    let c: &MuseConfig = &model.config;
    if cfg.n_ctx == 0 || cfg.n_ctx > c.n_ctx_train {
        return Err(format!(
            "context size {} is outside 1..={} (the model's context_length)",
            cfg.n_ctx, c.n_ctx_train
        ));
    }
    if cfg.parallel == 0 {
        return Err("--parallel must be at least 1".into());
    }
    if cfg.step_tokens == 0 {
        return Err("the step size (--ubatch) must be at least 1".into());
    }
    // Every running sequence decodes in each step, with room for one prompt token.
    let max_tokens = model.backend.max_batch_tokens();
    if cfg.parallel >= max_tokens {
        return Err(format!(
            "--parallel {}: the {} backend takes at most {max_tokens} tokens per step, so at most {} sequences",
            cfg.parallel,
            model.backend.name(),
            max_tokens.saturating_sub(1)
        ));
    }
    let cost = KvCost::new(c, cfg.kv_type).map_err(|e| e.to_string())?;
    let budget = cfg
        .kv_budget_bytes
        .unwrap_or_else(|| cost.bytes(cfg.n_ctx).saturating_mul(cfg.parallel));
    if budget < cost.bytes(1) {
        return Err(format!(
            "a KV budget of {budget} bytes holds not even one position ({} bytes)",
            cost.bytes(1)
        ));
    }
    let shared = Arc::new(Shared {
        active: AtomicUsize::new(0),
        capacity: cfg.parallel + cfg.max_queue,
        accepting: AtomicBool::new(true),
        alive: AtomicBool::new(true),
        cost,
        budget,
        n_ctx: cfg.n_ctx,
        parallel: cfg.parallel,
    });
    let (tx, rx) = std::sync::mpsc::channel();
    let worker = worker::Worker::new(model, tok, cfg, shared.clone(), rx)?;
    /// Marks the engine stopped when its thread ends, by return or by panic.
    struct Alive(Arc<Shared>);
    impl Drop for Alive {
        fn drop(&mut self) {
            self.0.alive.store(false, Ordering::SeqCst);
        }
    }
    let alive = Alive(shared.clone());
    let join = std::thread::Builder::new()
        .name("muser-engine".into())
        .spawn(move || {
            let _alive = alive;
            worker.run()
        })
        .map_err(|e| format!("cannot start the engine thread: {e}"))?;
    Ok((EngineHandle { cmd: tx, shared }, join))
}
