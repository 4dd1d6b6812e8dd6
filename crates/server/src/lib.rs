//! `muser serve`: an OpenAI-compatible HTTP server over Muser's engine, with continuous batching.
//!
//! ```text
//! HTTP (axum, tokio)                         engine thread (owns the model)
//!  POST /v1/chat/completions ─┐  Job        ┌──────────────────────────────────────────┐
//!  POST /v1/completions      ─┼──────────▶  │ queue ─▶ slots (KV cache each) ─▶ step:   │
//!   validate, template,       │  (429 when  │  decode tokens + prompt chunks, one       │
//!   tokenize                  │   full)     │  forward over all sequences, sample,      │
//!  SSE / JSON  ◀──────────────┘  Events     │  detokenize, stop strings                 │
//!   ATEM parse (chat)          ◀─────────── └──────────────────────────────────────────┘
//!                              bounded channel per request; dropped = cancelled
//! ```
//!
//! The model is not safe to call from several threads, so one engine thread owns it with the
//! scheduler ([`engine`]); handlers talk to it over channels.

pub mod adapt;
pub mod anthropic;
pub mod engine;
pub mod error;
pub mod openai;
pub mod respond;
pub mod responses;
pub mod routes;

use std::future::{Future, IntoFuture};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use muser_engine::{Backend, MuseGlimmer};
use muser_text::{ChatTemplate, Tokenizer};
use tokio::net::TcpListener;

pub use engine::EngineConfig;
pub use error::ApiError;

/// Everything `serve` needs besides the model.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// The name clients use in `model` (and `/v1/models` lists).
    pub model_id: String,
    pub engine: EngineConfig,
    /// Require `Authorization: Bearer <key>` on every endpoint but `/health`.
    pub api_key: Option<String>,
    pub max_body_bytes: usize,
    /// On shutdown, in-flight requests get this long to finish before they are cancelled.
    pub shutdown_grace: Duration,
    /// Where `/slots/{id}?action=save|restore` keep their files (llama.cpp's
    /// `--slot-save-path`); None: those actions answer 501.
    pub slot_save_path: Option<std::path::PathBuf>,
}

/// The text side of the model: its tokenizer and, if it has one, its chat template.
pub struct TextModel {
    pub tokenizer: Tokenizer,
    pub template: Option<ChatTemplate>,
}

/// The process's Prometheus recorder (installed once; servers in one process share it).
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let seconds = [
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
            ];
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("seconds".into()), &seconds)
                .unwrap_or_else(|_| PrometheusBuilder::new());
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            // Another recorder may already be installed by an embedding program; then this
            // handle renders what is recorded here only.
            let _ = metrics::set_global_recorder(recorder);
            let h = handle.clone();
            std::thread::Builder::new()
                .name("muser-metrics-upkeep".into())
                .spawn(move || {
                    loop {
                        std::thread::sleep(Duration::from_secs(5));
                        h.run_upkeep();
                    }
                })
                .ok();
            describe_metrics();
            handle
        })
        .clone()
}

fn describe_metrics() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        "muser_http_requests_total",
        "HTTP requests answered, by route and status"
    );
    describe_counter!("muser_rejected_total", "Requests refused with 429");
    describe_counter!("muser_prompt_tokens_total", "Prompt tokens run");
    describe_counter!("muser_generation_tokens_total", "Tokens generated");
    describe_counter!(
        "muser_sequences_finished_total",
        "Sequences ended, by reason (stop, length, cancelled, error)"
    );
    describe_gauge!(
        "muser_tokens_per_second",
        "Generated tokens per second over the last second"
    );
    describe_gauge!("muser_queue_depth", "Sequences waiting for a slot");
    describe_gauge!("muser_sequences_running", "Sequences holding a slot");
    describe_gauge!(
        "muser_kv_cache_used_bytes",
        "KV cache bytes holding positions of running sequences"
    );
    describe_gauge!(
        "muser_kv_cache_reserved_bytes",
        "KV cache bytes reserved by admitted sequences (their worst case)"
    );
    describe_gauge!("muser_kv_cache_budget_bytes", "KV cache admission budget");
    describe_gauge!(
        "muser_kv_cache_usage_ratio",
        "Used KV cache over the budget"
    );
    describe_histogram!(
        "muser_time_to_first_token_seconds",
        "From arrival to the first generated token"
    );
    describe_histogram!("muser_step_seconds", "Duration of one engine step");
    describe_histogram!(
        "muser_forward_seconds",
        "One forward pass of a step's sequences, with the tokens drawn on the device and the logits rows the host needs copied to it"
    );
    describe_histogram!(
        "muser_sample_seconds",
        "Drawing a forward pass's remaining tokens on the host and emitting them all"
    );
    describe_counter!(
        "muser_draws_total",
        "Tokens chosen, by where: on the device next to the logits, or on the host"
    );
}

/// Log to stderr (`RUST_LOG` filters; default `info`).
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

/// Serve `model` on `listener` until `shutdown` resolves; then stop accepting, let in-flight
/// requests finish for `shutdown_grace`, cancel what is left, and return.
pub async fn serve<B: Backend + 'static>(
    model: MuseGlimmer<B>,
    text: TextModel,
    cfg: ServeConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), String> {
    let metrics = metrics_handle();
    let tok = Arc::new(text.tokenizer);
    check_slot_dir(&model, &cfg)?;
    let (engine, join) = engine::start(model, tok.clone(), cfg.engine.clone())?;
    let state = routes::AppState {
        engine: engine.clone(),
        tok,
        template: text.template.map(Arc::new),
        model_id: cfg.model_id.as_str().into(),
        api_key: cfg.api_key.as_deref().map(Into::into),
        max_body_bytes: cfg.max_body_bytes,
        metrics,
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        prepare: Arc::new(tokio::sync::Semaphore::new(routes::prepare_permits())),
        grammar_vocab: Default::default(),
        grammars: Default::default(),
        slot_dir: cfg.slot_save_path.clone().map(Into::into),
    };
    let app = routes::router(state);
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, model = %cfg.model_id, "listening");
    }
    let grace = cfg.shutdown_grace;
    let (fired_tx, fired_rx) = tokio::sync::oneshot::channel::<Instant>();
    let e2 = engine.clone();
    let signal = async move {
        shutdown.await;
        let deadline = Instant::now() + grace;
        tracing::info!(
            grace_s = grace.as_secs_f64(),
            in_flight = e2.active(),
            "shutting down: finishing in-flight requests"
        );
        e2.shutdown(deadline);
        let _ = fired_tx.send(deadline);
    };
    let server = axum::serve(listener, app).with_graceful_shutdown(signal);
    let server = std::pin::pin!(server.into_future());
    // After the signal, connections get the grace period plus a little to close by themselves.
    let hard_stop = async {
        match fired_rx.await {
            Ok(deadline) => {
                tokio::time::sleep_until((deadline + Duration::from_secs(5)).into()).await
            }
            Err(_) => std::future::pending().await,
        }
    };
    let result = tokio::select! {
        r = server => r.map_err(|e| format!("server error: {e}")),
        _ = hard_stop => {
            tracing::warn!("connections still open after the grace period: closing them");
            Ok(())
        }
    };
    engine.shutdown(Instant::now());
    drop(engine);
    let _ = tokio::task::spawn_blocking(move || join.join()).await;
    tracing::info!("server stopped");
    result
}

/// Listen on `addr` and serve until SIGINT or SIGTERM, on a runtime of its own (`muser serve`).
/// `--slot-save-path`: fail closed at start where the backend cannot save caches (parity mode,
/// tensor parallelism), not at the first save; create the folder.
fn check_slot_dir<B: Backend>(model: &MuseGlimmer<B>, cfg: &ServeConfig) -> Result<(), String> {
    let Some(dir) = &cfg.slot_save_path else {
        return Ok(());
    };
    let probe = model
        .new_cache(cfg.engine.kv_type, 1)
        .and_then(|kv| model.backend.kv_export(&kv));
    if let Err(e) = probe {
        return Err(format!("--slot-save-path: {e}"));
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("--slot-save-path {}: {e}", dir.display()))
}

pub fn run<B: Backend + 'static>(
    model: MuseGlimmer<B>,
    text: TextModel,
    cfg: ServeConfig,
    addr: &str,
) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("muser-http")
        .build()
        .map_err(|e| format!("cannot start the HTTP runtime: {e}"))?;
    check_slot_dir(&model, &cfg)?;
    rt.block_on(async move {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        let local = listener
            .local_addr()
            .map_or_else(|_| addr.to_string(), |a| a.to_string());
        eprintln!("muser serve: listening on http://{local} (OpenAI API under /v1)");
        serve(model, text, cfg, listener, shutdown_signal()).await
    })
}
