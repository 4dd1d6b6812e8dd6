//! The HTTP surface: routes, the JSON extractor that turns every bad body into an OpenAI error,
//! the API key check, request ids.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequest, MatchedPath, Path, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use metrics_exporter_prometheus::PrometheusHandle;
use muser_text::grammar::{Constraint, Grammar, GrammarVocab, MaskCache};
use muser_text::{ChatTemplate, Tokenizer, ToolCallParser};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::trace::{DefaultOnResponse, TraceLayer};

use crate::engine::{EngineHandle, Job, JobGrammar, SlotAction, SlotReply};
use crate::error::ApiError;
use crate::openai::{self, Endpoint, GenRequest};
use crate::respond::{self, ChatStops, Meta};

/// Events buffered per request before the engine holds that request's sequences back.
const CHANNEL_EVENTS: usize = 256;

#[derive(Clone)]
pub struct AppState {
    pub engine: EngineHandle,
    pub tok: Arc<Tokenizer>,
    pub template: Option<Arc<ChatTemplate>>,
    pub model_id: Arc<str>,
    pub api_key: Option<Arc<str>>,
    pub max_body_bytes: usize,
    pub metrics: PrometheusHandle,
    pub created: u64,
    /// Requests reading, parsing and formatting their bodies at once (`Prep`): a body holding
    /// many small messages grows about 80 times in memory on its way to a prompt (a 6.8 MB body,
    /// 540 MB), so their number is bounded; the others wait their turn.
    pub prepare: Arc<tokio::sync::Semaphore>,
    /// The vocabulary's pieces as grammars read them, built at the first constrained request.
    pub grammar_vocab: Arc<std::sync::OnceLock<Arc<GrammarVocab>>>,
    /// Grammars compiled lately, by their text, with their masks over this vocabulary: requests
    /// of the same schema share them.
    pub grammars: Arc<std::sync::Mutex<GrammarCache>>,
    /// `--slot-save-path`: where slot files are saved and restored from.
    pub slot_dir: Option<Arc<std::path::Path>>,
}

/// Grammars kept by `AppState::grammars` (past this many the least recently used goes).
const GRAMMARS_KEPT: usize = 64;
/// And bytes of their texts, the cache's keys (a grammar built from a schema may be up to
/// `MAX_GRAMMAR_OUTPUT_BYTES`, 8 MiB: 64 such would hold half a gigabyte).
const GRAMMAR_TEXT_KEPT_BYTES: usize = 64 << 20;

/// Grammars by their GBNF text, each with its masks over the vocabulary (masks are by state, so
/// they serve any prefill) and when it was last used.
#[derive(Default)]
pub struct GrammarCache {
    kept: std::collections::HashMap<String, (Arc<Grammar>, Arc<MaskCache>, u64)>,
    uses: u64,
}

impl GrammarCache {
    fn get(&mut self, text: &str) -> Option<(Arc<Grammar>, Arc<MaskCache>)> {
        self.uses += 1;
        let now = self.uses;
        self.kept.get_mut(text).map(|(g, m, used)| {
            *used = now;
            (g.clone(), m.clone())
        })
    }

    fn put(&mut self, text: String, g: Arc<Grammar>, m: Arc<MaskCache>) {
        // The least recently used go first, until both bounds hold with the new one.
        while !self.kept.is_empty()
            && (self.kept.len() >= GRAMMARS_KEPT
                || self.kept.keys().map(String::len).sum::<usize>() + text.len()
                    > GRAMMAR_TEXT_KEPT_BYTES)
        {
            let Some(oldest) = self
                .kept
                .iter()
                .min_by_key(|(_, v)| v.2)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            self.kept.remove(&oldest);
        }
        self.uses += 1;
        self.kept.insert(text, (g, m, self.uses));
    }
}

/// A request's constraint compiled for the engine, on a preparation turn: a chat's prefill
/// checked against the prompt's end (a template whose generation prompt is not Muse Glimmer's
/// cannot take a chat answer's grammar), and followed by the text of a message the answer
/// continues (`continued`: the prompt was built to end with both).
fn job_grammar(
    st_tok: &Tokenizer,
    vocab: &std::sync::OnceLock<Arc<GrammarVocab>>,
    cache: &std::sync::Mutex<GrammarCache>,
    c: &openai::Constrain,
    ep: Endpoint,
    prompt: &[u32],
    continued: Option<&str>,
) -> Result<JobGrammar, ApiError> {
    let (text, param, prefill) = c.gbnf(ep)?;
    if let Some(p) = prefill
        && continued.is_none()
    {
        let tail = st_tok.decode(&prompt[prompt.len().saturating_sub(16)..], false)?;
        if !tail.ends_with(p) {
            let from = tail.char_indices().rev().nth(23).map_or(0, |(i, _)| i);
            return Err(ApiError::invalid(
                param,
                format!(
                    "a response format or a forced tool call needs the Muse Glimmer chat format, whose prompt ends with {p:?}; this chat template's ends with {:?}",
                    &tail[from..]
                ),
            ));
        }
    }
    let bad = |e: muser_text::TextError| ApiError::invalid(param, e.to_string());
    let kept = cache.lock().ok().and_then(|mut m| m.get(&text));
    let (grammar, masks) = match kept {
        Some(k) => k,
        None => {
            let g = Arc::new(Grammar::parse(&text, "root").map_err(bad)?);
            let masks = Arc::new(MaskCache::default());
            if let Ok(mut m) = cache.lock() {
                m.put(text, g.clone(), masks.clone());
            }
            (g, masks)
        }
    };
    // Where every choice starts: past the generation prompt, and the text of a message the
    // answer continues (the user's: a grammar it does not fit is the messages' fault).
    let mut at = Constraint::sharing(grammar.clone(), masks.clone());
    if let Some(p) = prefill {
        at.prefill(p.as_bytes()).map_err(bad)?;
        if let Some(t) = continued {
            at.prefill(t.as_bytes()).map_err(|e| {
                ApiError::invalid(
                    "messages",
                    format!(
                        "the final assistant message cannot be continued under the request's {param}: {e}"
                    ),
                )
            })?;
        }
    }
    let start = at.state().clone();
    let vocab = vocab
        .get_or_init(|| Arc::new(GrammarVocab::new(st_tok)))
        .clone();
    Ok(JobGrammar {
        grammar,
        masks,
        vocab,
        start,
        trigger: c.trigger(),
    })
}

/// Requests that may prepare at once: the host's cores, at least 2.
pub fn prepare_permits() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get().max(2))
}

/// A turn to parse and format a request's body (`PrepJson`), taken once its bytes have all
/// come (a slow upload holds no turn) and given back when the work that builds the prompt ends,
/// even where the client has left by then.
pub struct Prep(
    // Held, never read: dropping it gives the turn back.
    #[allow(dead_code)] tokio::sync::OwnedSemaphorePermit,
);

/// A JSON body as `ApiJson` reads it, parsed under a preparation turn (`Prep`), which comes
/// with it for the formatting that follows.
pub struct PrepJson<T>(pub T, pub Prep);

impl<T: DeserializeOwned> FromRequest<AppState> for PrepJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, st: &AppState) -> Result<Self, ApiError> {
        let bytes = body_bytes(req, st).await?;
        let turn = Arc::clone(&st.prepare)
            .acquire_owned()
            .await
            .map_err(|_| ApiError::unavailable("the server is shutting down"))?;
        Ok(PrepJson(parse_json(&bytes)?, Prep(turn)))
    }
}

/// The id of one request: the client's `x-request-id` if sane, else a fresh one.
#[derive(Clone, Debug)]
pub struct RequestId(pub String);

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/v1/models/{*id}", get(model))
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .route("/v1/messages", post(anthropic_messages))
        .route("/v1/responses", post(responses))
        .route("/responses", post(responses))
        .route("/v1/responses/input_tokens", post(responses_input_tokens))
        .route("/responses/input_tokens", post(responses_input_tokens))
        .route("/v1/chat/completions/input_tokens", post(chat_input_tokens))
        .route("/chat/completions/input_tokens", post(chat_input_tokens))
        // llama-server's other names for the same endpoints.
        .route("/chat/completions", post(chat_completions))
        .route("/models", get(models))
        .route("/v1/health", get(health))
        .route("/apply-template", post(apply_template))
        .route("/props", get(props))
        .route("/v1/messages/count_tokens", post(anthropic_count_tokens))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/slots", get(slots))
        .route("/slots/{id}", post(slot_action))
        .fallback(|| async { ApiError::not_found("no such endpoint") })
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
        .layer(CatchPanicLayer::custom(|_| {
            ApiError::internal("the server hit a bug serving this request").into_response()
        }))
        .layer(DefaultBodyLimit::max(state.max_body_bytes))
        .layer(middleware::from_fn_with_state(state.clone(), auth))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(|req: &Request| {
                    let id = req
                        .extensions()
                        .get::<RequestId>()
                        .map_or("-", |r| r.0.as_str());
                    tracing::info_span!("request", id = %id, method = %req.method(), path = %req.uri().path())
                })
                .on_response(DefaultOnResponse::new().level(tracing::Level::INFO)),
        )
        .layer(middleware::from_fn(request_id))
        .with_state(state)
}

fn new_request_id() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let x = muser_engine::sampling::Rng::new(t ^ N.fetch_add(1, Ordering::Relaxed).rotate_left(32))
        .next_u64();
    format!("{x:016x}")
}

async fn request_id(mut req: Request, next: Next) -> Response {
    let id = req
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|s| {
            !s.is_empty()
                && s.len() <= 64
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        })
        .map_or_else(new_request_id, str::to_string);
    req.extensions_mut().insert(RequestId(id.clone()));
    let path = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("other", |p| p.as_str())
        .to_string();
    let mut resp = next.run(req).await;
    if let Ok(v) = HeaderValue::from_str(&id) {
        resp.headers_mut().insert("x-request-id", v);
    }
    let status = resp.status().as_u16().to_string();
    metrics::counter!("muser_http_requests_total", "path" => path, "status" => status).increment(1);
    resp
}

/// Equal, in time independent of where the strings differ (only the key's length leaks).
fn constant_time_eq(given: &[u8], key: &[u8]) -> bool {
    let mut diff = (given.len() ^ key.len()) as u64;
    for (i, &k) in key.iter().enumerate() {
        let g = given.get(i).copied().unwrap_or(0);
        diff |= u64::from(g ^ k);
    }
    std::hint::black_box(diff) == 0
}

async fn auth(State(st): State<AppState>, req: Request, next: Next) -> Response {
    if let Some(key) = &st.api_key
        && !matches!(req.uri().path(), "/health" | "/v1/health")
    {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            // The scheme is case-insensitive (RFC 7235): "bearer K" is "Bearer K".
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, k)| k.trim())
            // Anthropic's clients send the key as x-api-key (llama-server reads it too).
            .or_else(|| {
                req.headers()
                    .get("x-api-key")
                    .and_then(|v| v.to_str().ok())
                    .map(str::trim)
            });
        if !given.is_some_and(|g| constant_time_eq(g.as_bytes(), key.as_bytes())) {
            // Each API's clients read its own error shape.
            if req.uri().path().starts_with("/v1/messages") {
                return crate::anthropic::error_response(ApiError::unauthorized());
            }
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

/// JSON bodies whose every failure is an OpenAI error: 413 over the size limit, 400 for
/// malformed JSON, 400 naming the field for a wrong type.
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, st: &AppState) -> Result<Self, ApiError> {
        parse_json(&body_bytes(req, st).await?).map(ApiJson)
    }
}

/// A request's body, whole: 413 over the size limit.
async fn body_bytes(req: Request, st: &AppState) -> Result<Bytes, ApiError> {
    Bytes::from_request(req, st).await.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large(st.max_body_bytes)
        } else {
            ApiError::bad_request(format!("cannot read the request body: {}", e.body_text()))
        }
    })
}

pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    // serde would also read a struct from an array, positionally: only objects are requests.
    match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => {}
        None => return Err(ApiError::bad_request("the request body is empty").code("invalid_json")),
        Some(_) => {
            return Err(
                ApiError::bad_request("the request body must be a JSON object")
                    .code("invalid_json"),
            );
        }
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let v = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if inner.is_syntax() || inner.is_eof() {
            ApiError::bad_request(format!("the request body is not valid JSON: {inner}"))
                .code("invalid_json")
        } else if path == "." {
            ApiError::bad_request(format!("the request body must be a JSON object: {inner}"))
        } else {
            ApiError::invalid(path.clone(), format!("{path}: {inner}"))
        }
    })?;
    de.end().map_err(|e| {
        ApiError::bad_request(format!("the request body is not valid JSON: {e}"))
            .code("invalid_json")
    })?;
    Ok(v)
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A chat request's prompt, as the chat endpoint builds it and `/tokenize` shows it: the
/// messages through the template, user text sanitized; with Muse Glimmer's format a final
/// assistant message continued (`openai::prompt_end`; taken off the messages), with another
/// template the conversation whole, as before (continuing one is refused). The message
/// continued, if one is.
fn chat_prompt(
    template: &ChatTemplate,
    tok: &Tokenizer,
    mut messages: Value,
    tools: Option<&Value>,
    add_generation_prompt: Option<bool>,
    continue_final_message: Option<&Value>,
    kwargs: Option<&serde_json::Map<String, Value>>,
) -> Result<(Vec<u32>, Option<openai::Continued>), ApiError> {
    use muser_text::grammar::GENERATION_PROMPT;
    let end = if template.prompt_ends_with(GENERATION_PROMPT) {
        openai::prompt_end(&mut messages, add_generation_prompt, continue_final_message)?
    } else if continue_final_message.is_some_and(|v| !matches!(v, Value::Null | Value::Bool(false)))
    {
        return Err(ApiError::invalid(
            "continue_final_message",
            format!(
                "continuing a message needs Muse Glimmer's chat format, whose prompt ends with {GENERATION_PROMPT:?}; this chat template's does not"
            ),
        ));
    } else {
        openai::PromptEnd {
            add_generation_prompt: add_generation_prompt.unwrap_or(true),
            continued: None,
        }
    };
    let pieces = end.continued.as_ref().map(openai::Continued::pieces);
    let ids = template.encode_sanitized_then(
        tok,
        &messages,
        tools,
        end.add_generation_prompt,
        kwargs,
        pieces.as_deref().map(|p| (GENERATION_PROMPT, p)),
    )?;
    Ok((ids, end.continued))
}

async fn chat_completions(
    State(st): State<AppState>,
    Extension(rid): Extension<RequestId>,
    PrepJson(req, turn): PrepJson<GenRequest>,
) -> Result<Response, ApiError> {
    let job = start_chat(&st, &rid, req, turn, "chatcmpl-").await?;
    Ok(if job.stream {
        respond::stream(job.meta, job.rx, st.tok.clone(), Some(job.parser)).into_response()
    } else {
        respond::whole(job.meta, job.rx, st.tok.clone(), Some(job.parser)).await
    })
}

/// Another API's request body as the chat path's request, read under a preparation turn:
/// `convert` rewrites the body as a chat request's and returns what else the adapter keeps.
async fn adapted_request<E>(
    st: &AppState,
    req: Request,
    convert: impl FnOnce(Value) -> Result<(Value, E), ApiError>,
) -> Result<(GenRequest, E, Prep), ApiError> {
    let bytes = body_bytes(req, st).await?;
    let turn = Arc::clone(&st.prepare)
        .acquire_owned()
        .await
        .map_err(|_| ApiError::unavailable("the server is shutting down"))?;
    let body: Value = parse_json(&bytes)?;
    let (chat, kept) = convert(body)?;
    let req = serde_path_to_error::deserialize(chat).map_err(|e| {
        let path = e.path().to_string();
        ApiError::invalid(path.clone(), format!("{path}: {}", e.into_inner()))
    })?;
    Ok((req, kept, Prep(turn)))
}

/// An Anthropic Messages request's body (`anthropic::to_chat_request`) as the chat path's
/// request; every failure Anthropic's error object.
async fn anthropic_request(st: &AppState, req: Request) -> Result<(GenRequest, Prep), ApiError> {
    let (req, (), turn) = adapted_request(st, req, |b| {
        crate::anthropic::to_chat_request(b).map(|c| (c, ()))
    })
    .await?;
    Ok((req, turn))
}

/// `POST /v1/messages`: Anthropic's Messages API over the chat path (`anthropic`), streamed as
/// Anthropic's events or answered whole.
async fn anthropic_messages(
    State(st): State<AppState>,
    Extension(rid): Extension<RequestId>,
    req: Request,
) -> Response {
    let run = async {
        let (req, turn) = anthropic_request(&st, req).await?;
        let mut job = start_chat(&st, &rid, req, turn, "msg_").await?;
        let (id, model) = (job.meta.id.clone(), job.meta.model.clone());
        // Whole or streamed, the message is folded from the same chunks (the last with the
        // usage), so its blocks keep the order the model wrote them in either way.
        job.meta.include_usage = true;
        let chunks = respond::chunks(job.meta, job.rx, st.tok.clone(), Some(job.parser));
        Ok::<_, ApiError>(if job.stream {
            crate::anthropic::events(id, model, job.prompt_tokens, chunks).into_response()
        } else {
            Json(crate::anthropic::message(id, model, chunks).await?).into_response()
        })
    };
    run.await.unwrap_or_else(crate::anthropic::error_response)
}

/// The prompt a chat request's conversation makes, as the chat endpoint would run it (its
/// template, tools, kwargs, generation prompt or continued message), run nothing.
async fn chat_prompt_of(
    st: &AppState,
    mut req: GenRequest,
    turn: Prep,
) -> Result<Vec<u32>, ApiError> {
    req.check_model(&st.model_id)?;
    let template = st.template.clone().ok_or_else(|| {
        ApiError::bad_request("this model has no chat template").code("no_chat_template")
    })?;
    let tok = Arc::clone(&st.tok);
    tokio::task::spawn_blocking(move || -> Result<Vec<u32>, ApiError> {
        let Some(messages) = req.messages.take() else {
            return Err(ApiError::invalid("messages", "messages is required"));
        };
        openai::text_parts_only(&messages)?;
        let (tools, _) = req.chat_tools()?;
        let kwargs = req.template_kwargs()?;
        let (ids, _) = chat_prompt(
            &template,
            &tok,
            messages,
            tools.as_ref(),
            req.add_generation_prompt,
            req.continue_final_message.as_ref(),
            kwargs.as_ref(),
        )?;
        drop(turn);
        Ok(ids)
    })
    .await
    .map_err(|e| ApiError::internal(format!("formatting the chat failed: {e}")))?
}

/// `POST /v1/messages/count_tokens`: the prompt tokens a Messages request would have,
/// `{"input_tokens": N}`.
async fn anthropic_count_tokens(State(st): State<AppState>, req: Request) -> Response {
    let run = async {
        let (req, turn) = anthropic_request(&st, req).await?;
        let n = chat_prompt_of(&st, req, turn).await?.len();
        Ok::<_, ApiError>(Json(json!({"input_tokens": n})).into_response())
    };
    run.await.unwrap_or_else(crate::anthropic::error_response)
}

/// A Responses request's body (`responses::to_chat_request`) as the chat path's request and the
/// fields its response repeats, read under a preparation turn; errors name the Responses fields.
async fn responses_request(
    st: &AppState,
    req: Request,
) -> Result<(GenRequest, crate::responses::Echo, Prep), ApiError> {
    adapted_request(st, req, crate::responses::to_chat_request)
        .await
        .map_err(crate::responses::own_names)
}

/// `POST /v1/responses`: OpenAI's Responses API over the chat path (`responses`), streamed as
/// its events or answered whole.
async fn responses(
    State(st): State<AppState>,
    Extension(rid): Extension<RequestId>,
    req: Request,
) -> Result<Response, ApiError> {
    let (req, echo, turn) = responses_request(&st, req).await?;
    let mut job = start_chat(&st, &rid, req, turn, "resp_")
        .await
        .map_err(crate::responses::own_names)?;
    let out = crate::responses::Output::new(job.meta.id.clone(), job.meta.model.clone(), echo);
    // Whole or streamed, the response is written from the same chunks (the last with the
    // usage).
    job.meta.include_usage = true;
    let chunks = respond::chunks(job.meta, job.rx, st.tok.clone(), Some(job.parser));
    Ok(if job.stream {
        crate::responses::events(out, chunks).into_response()
    } else {
        Json(crate::responses::response(out, chunks).await?).into_response()
    })
}

/// `POST /v1/responses/input_tokens`: the prompt tokens a Responses request would have.
async fn responses_input_tokens(
    State(st): State<AppState>,
    req: Request,
) -> Result<Json<Value>, ApiError> {
    let (req, _, turn) = responses_request(&st, req).await?;
    input_tokens(&st, req, turn)
        .await
        .map_err(crate::responses::own_names)
}

/// `POST /v1/chat/completions/input_tokens` (llama-server's): the prompt tokens a chat request
/// would have.
async fn chat_input_tokens(
    State(st): State<AppState>,
    PrepJson(req, turn): PrepJson<GenRequest>,
) -> Result<Json<Value>, ApiError> {
    input_tokens(&st, req, turn).await
}

/// The `input_tokens` answer for a chat request's prompt.
async fn input_tokens(st: &AppState, req: GenRequest, turn: Prep) -> Result<Json<Value>, ApiError> {
    let n = chat_prompt_of(st, req, turn).await?.len();
    Ok(Json(
        json!({"object": "response.input_tokens", "input_tokens": n}),
    ))
}

/// `POST /apply-template` (llama-server's): the prompt text a chat request's conversation
/// makes, `{"prompt": ...}`: the text of the tokens the chat endpoint would run.
async fn apply_template(
    State(st): State<AppState>,
    PrepJson(req, turn): PrepJson<GenRequest>,
) -> Result<Json<Value>, ApiError> {
    let ids = chat_prompt_of(&st, req, turn).await?;
    let prompt = st.tok.decode(&ids, false)?;
    Ok(Json(json!({"prompt": prompt})))
}

/// `GET /props` (llama-server's): what the server serves and how.
async fn props(State(st): State<AppState>) -> Json<Value> {
    let token = |id: Option<u32>| {
        id.and_then(|i| st.tok.piece(i, false).ok())
            .map(|p| String::from_utf8_lossy(p).into_owned())
    };
    Json(json!({
        "default_generation_settings": {
            "n_ctx": st.engine.n_ctx(),
            "params": {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0,
                "presence_penalty": 0.0, "frequency_penalty": 0.0, "repeat_penalty": 1.0,
                "n_predict": -1},
        },
        "total_slots": st.engine.parallel(),
        "model_alias": &*st.model_id,
        "modalities": {"vision": false, "video": false, "audio": false},
        "endpoint_slots": true,
        "endpoint_props": false,
        "endpoint_metrics": true,
        "chat_template": st.template.as_ref().map(|t| t.source()),
        "bos_token": token(st.tok.bos()),
        "eos_token": token(st.tok.eos()),
        "build_info": concat!("muser ", env!("CARGO_PKG_VERSION")),
        "is_sleeping": false,
    }))
}

/// A chat request submitted to the engine: what its response is built from.
pub(crate) struct ChatJob {
    pub meta: Meta,
    pub rx: tokio::sync::mpsc::Receiver<crate::engine::Event>,
    pub parser: respond::ChatParser,
    pub stream: bool,
    /// The first choice's prompt tokens.
    pub prompt_tokens: usize,
}

/// Format a chat request's messages, check its options and submit it (the chat endpoint's
/// work before its response; other APIs' adapters share it). `id_prefix`: the response id's
/// (`chatcmpl-`, Anthropic's `msg_`).
pub(crate) async fn start_chat(
    st: &AppState,
    rid: &RequestId,
    mut req: GenRequest,
    turn: Prep,
    id_prefix: &str,
) -> Result<ChatJob, ApiError> {
    req.check_model(&st.model_id)?;
    let template = st.template.as_ref().ok_or_else(|| {
        ApiError::bad_request(
            "this model has no chat template, so chat requests cannot be formatted; use /v1/completions, or start the server with --chat-template-file",
        )
        .code("no_chat_template")
    })?;
    let Some(messages) = req.messages.take() else {
        return Err(ApiError::invalid("messages", "messages is required"));
    };
    openai::text_parts_only(&messages)?;
    let mut opts = req.options(Endpoint::Chat, &st.tok)?;
    let (tools, calls) = req.chat_tools()?;
    // A response format wins over the tools' calls, as in llama.cpp's grammar for the model.
    if opts.constrain.is_none() {
        opts.constrain = calls;
    }
    // Reading the tools' schemas, rendering and tokenizing a body of megabytes take CPU time:
    // off the async workers, so the other requests' streams are not held up behind them. The
    // work owns the messages and the turn, both let go when it ends.
    let (prompt, parser, grammar) = {
        let (template, tok) = (Arc::clone(template), Arc::clone(&st.tok));
        let kwargs = req.template_kwargs()?;
        let (constrain, gv, gc) = (
            opts.constrain.clone(),
            Arc::clone(&st.grammar_vocab),
            Arc::clone(&st.grammars),
        );
        let (agp, cfm) = (req.add_generation_prompt, req.continue_final_message.take());
        tokio::task::spawn_blocking(move || {
            let parser = ToolCallParser::from_json(tools.as_ref())
                .map_err(|e| ApiError::invalid("tools", e.to_string()))?;
            let (prompt, continued) = chat_prompt(
                &template,
                &tok,
                messages,
                tools.as_ref(),
                agp,
                cfm.as_ref(),
                kwargs.as_ref(),
            )?;
            let text = continued.as_ref().map(openai::Continued::text);
            let grammar = constrain
                .map(|c| job_grammar(&tok, &gv, &gc, &c, Endpoint::Chat, &prompt, text.as_deref()))
                .transpose()?;
            drop(turn);
            Ok::<_, ApiError>((prompt, (parser, continued), grammar))
        })
        .await
        .map_err(|e| ApiError::internal(format!("formatting the chat failed: {e}")))??
    };
    let (parser, continued) = parser;
    let seqs = openai::sequences(&[prompt], &opts, st.engine.n_ctx(), "messages")?;
    // Stop strings end the answer, not the reasoning or the protocol around it: matched as the
    // text is parsed (respond::ChatStops), not by the engine.
    let chat_stops =
        (!opts.stops.is_empty()).then(|| ChatStops::new(opts.stops.clone(), seqs.len()));
    let prompt_tokens = seqs.first().map_or(0, |q| q.prompt.len());
    let meta = Meta {
        id: format!("{id_prefix}{}", rid.0),
        created: now(),
        model: st.model_id.to_string(),
        endpoint: Endpoint::Chat,
        choices: seqs.len(),
        n: opts.n,
        include_usage: opts.include_usage,
        chat_stops: chat_stops.clone(),
    };
    let json_answer = matches!(opts.constrain, Some(openai::Constrain::Schema { .. }));
    let rx = submit(st, rid, seqs, &opts, false, chat_stops.as_ref(), grammar)?;
    let parser = respond::ChatParser {
        tools: parser,
        json_answer,
        continued,
    };
    Ok(ChatJob {
        meta,
        rx,
        parser,
        stream: opts.stream,
        prompt_tokens,
    })
}

async fn completions(
    State(st): State<AppState>,
    Extension(rid): Extension<RequestId>,
    PrepJson(req, turn): PrepJson<GenRequest>,
) -> Result<Response, ApiError> {
    req.check_model(&st.model_id)?;
    let opts = req.options(Endpoint::Completions, &st.tok)?;
    // Tokenizing off the async workers, as the chat's rendering, under the request's turn.
    let (prompts, grammar) = {
        let tok = Arc::clone(&st.tok);
        let (constrain, gv, gc) = (
            opts.constrain.clone(),
            Arc::clone(&st.grammar_vocab),
            Arc::clone(&st.grammars),
        );
        tokio::task::spawn_blocking(move || {
            let prompts = req.completion_prompts(&tok)?;
            let grammar = constrain
                .map(|c| job_grammar(&tok, &gv, &gc, &c, Endpoint::Completions, &[], None))
                .transpose()?;
            drop(turn);
            Ok::<_, ApiError>((prompts, grammar))
        })
        .await
        .map_err(|e| ApiError::internal(format!("tokenizing the prompt failed: {e}")))??
    };
    let seqs = openai::sequences(&prompts, &opts, st.engine.n_ctx(), "prompt")?;
    let meta = Meta {
        id: format!("cmpl-{}", rid.0),
        created: now(),
        model: st.model_id.to_string(),
        endpoint: Endpoint::Completions,
        choices: seqs.len(),
        n: opts.n,
        include_usage: opts.include_usage,
        chat_stops: None,
    };
    let rx = submit(&st, &rid, seqs, &opts, true, None, grammar)?;
    Ok(if opts.stream {
        respond::stream(meta, rx, st.tok.clone(), None).into_response()
    } else {
        respond::whole(meta, rx, st.tok.clone(), None).await
    })
}

fn submit(
    st: &AppState,
    rid: &RequestId,
    seqs: Vec<crate::engine::SeqSpec>,
    opts: &openai::Options,
    skip_special: bool,
    chat_stops: Option<&ChatStops>,
    grammar: Option<JobGrammar>,
) -> Result<mpsc::Receiver<crate::engine::Event>, ApiError> {
    let (tx, rx) = mpsc::channel(CHANNEL_EVENTS + 4 * seqs.len());
    st.engine.submit(Job {
        request_id: rid.0.clone(),
        seqs,
        // A chat's stops are matched in its answer (respond), which ends a choice by its flag.
        stops: if chat_stops.is_some() {
            Vec::new()
        } else {
            opts.stops.clone()
        },
        stop_flags: chat_stops.map(|c| Arc::clone(&c.flags)),
        skip_special,
        logprobs: opts.logprobs,
        echo: opts.echo,
        ignore_eos: opts.ignore_eos,
        logit_bias: opts.logit_bias.clone(),
        max_tokens_param: opts.max_tokens_param,
        grammar,
        tx,
    })?;
    Ok(rx)
}

fn model_object(st: &AppState) -> Value {
    json!({"id": &*st.model_id, "object": "model", "created": st.created, "owned_by": "muser",
           "max_model_len": st.engine.n_ctx()})
}

async fn models(State(st): State<AppState>) -> Json<Value> {
    Json(json!({"object": "list", "data": [model_object(&st)]}))
}

async fn model(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    if id != *st.model_id {
        return Err(ApiError::model_not_found(&id, &st.model_id));
    }
    Ok(Json(model_object(&st)))
}

async fn health(State(st): State<AppState>) -> Response {
    let status = if !st.engine.alive() {
        "engine stopped"
    } else if !st.engine.accepting() {
        "shutting down"
    } else {
        return Json(json!({"status": "ok"})).into_response();
    };
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(json!({"status": status})),
    )
        .into_response()
}

async fn metrics_text(State(st): State<AppState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4"),
        )],
        st.metrics.render(),
    )
        .into_response()
}

#[derive(Deserialize)]
struct TokenizeRequest {
    model: Option<String>,
    /// llama.cpp's name for the text.
    content: Option<String>,
    /// vLLM's name for the text.
    prompt: Option<String>,
    /// A conversation, rendered with the chat template (vLLM).
    messages: Option<Value>,
    tools: Option<Value>,
    add_generation_prompt: Option<bool>,
    /// As a chat request's: a final assistant message continued, the tools' choice (`none`:
    /// none offered), the template's variables.
    continue_final_message: Option<Value>,
    tool_choice: Option<Value>,
    chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    reasoning_effort: Option<Value>,
    /// Add BOS (default: the model's `add_bos_token`).
    add_special: Option<bool>,
    /// Read special-token text as special tokens (default false: it is plain text).
    parse_special: Option<bool>,
    /// Return `{"id", "piece"}` objects instead of ids (llama.cpp).
    with_pieces: Option<bool>,
}

async fn tokenize(
    State(st): State<AppState>,
    PrepJson(r, turn): PrepJson<TokenizeRequest>,
) -> Result<Json<Value>, ApiError> {
    if let Some(m) = &r.model
        && m != &*st.model_id
    {
        return Err(ApiError::model_not_found(m, &st.model_id));
    }
    let with_pieces = r.with_pieces.unwrap_or(false);
    let (template, tok) = (st.template.clone(), Arc::clone(&st.tok));
    // Off the async workers, under the request's turn, as a chat's prompt.
    let ids = tokio::task::spawn_blocking(move || -> Result<Vec<u32>, ApiError> {
        let ids = match (&r.messages, r.content.as_ref().or(r.prompt.as_ref())) {
            (Some(_), Some(_)) => {
                return Err(ApiError::bad_request(
                    "give either messages or content/prompt, not both",
                ));
            }
            (Some(messages), None) => {
                let template = template.as_ref().ok_or_else(|| {
                    ApiError::bad_request("this model has no chat template")
                        .code("no_chat_template")
                })?;
                // As a chat request's prompt.
                openai::text_parts_only(messages)?;
                let mut g = GenRequest {
                    tools: r.tools.clone(),
                    tool_choice: r.tool_choice.clone(),
                    chat_template_kwargs: r.chat_template_kwargs.clone(),
                    reasoning_effort: r.reasoning_effort.clone(),
                    ..GenRequest::default()
                };
                let (tools, _) = g.chat_tools()?;
                let kwargs = g.template_kwargs()?;
                chat_prompt(
                    template,
                    &tok,
                    messages.clone(),
                    tools.as_ref(),
                    r.add_generation_prompt,
                    r.continue_final_message.as_ref(),
                    kwargs.as_ref(),
                )?
                .0
            }
            (None, Some(text)) => tok.encode(
                text,
                r.add_special.unwrap_or(tok.add_bos_default()),
                r.parse_special.unwrap_or(false),
            )?,
            (None, None) => {
                return Err(ApiError::invalid(
                    "content",
                    "give the text as content (or prompt), or a conversation as messages",
                ));
            }
        };
        drop(turn);
        Ok(ids)
    })
    .await
    .map_err(|e| ApiError::internal(format!("tokenizing failed: {e}")))??;
    let tok = &st.tok;
    let tokens: Vec<Value> = if with_pieces {
        ids.iter()
            .map(|&id| {
                let piece = tok
                    .piece(id, false)
                    .map(String::from_utf8_lossy)
                    .unwrap_or_default();
                json!({"id": id, "piece": piece})
            })
            .collect()
    } else {
        ids.iter().map(|&id| json!(id)).collect()
    };
    Ok(Json(
        json!({"tokens": tokens, "count": ids.len(), "max_model_len": st.engine.n_ctx()}),
    ))
}

#[derive(Deserialize)]
struct DetokenizeRequest {
    model: Option<String>,
    tokens: Vec<i64>,
    /// Drop control tokens from the text (default false).
    skip_special: Option<bool>,
}

async fn detokenize(
    State(st): State<AppState>,
    ApiJson(r): ApiJson<DetokenizeRequest>,
) -> Result<Json<Value>, ApiError> {
    if let Some(m) = &r.model
        && m != &*st.model_id
    {
        return Err(ApiError::model_not_found(m, &st.model_id));
    }
    let ids = st
        .tok
        .check_ids(&r.tokens)
        .map_err(|e| ApiError::invalid("tokens", e.to_string()))?;
    let text = st.tok.decode(&ids, r.skip_special.unwrap_or(false))?;
    // llama.cpp answers `content`, vLLM `prompt`.
    Ok(Json(json!({"content": text, "prompt": text})))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_key_comparison() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secreT", b"secret"));
        assert!(!constant_time_eq(b"secret1", b"secret"));
        assert!(!constant_time_eq(b"secre", b"secret"));
        assert!(!constant_time_eq(b"", b"secret"));
    }

    #[test]
    fn json_errors_name_the_field() {
        let e = parse_json::<GenRequest>(b"{\"max_tokens\": \"ten\"}").unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
        let e = parse_json::<GenRequest>(b"{\"stop\": [1, 2]}").unwrap_err();
        assert_eq!(e.param.as_deref(), Some("stop"));
        let e = parse_json::<GenRequest>(b"{\"model\": ").unwrap_err();
        assert_eq!(e.code, Some("invalid_json"));
        let e = parse_json::<GenRequest>(b"[1]").unwrap_err();
        assert_eq!(e.param, None);
        assert!(parse_json::<GenRequest>(b"").is_err());
        let e = parse_json::<GenRequest>(b"{} trailing").unwrap_err();
        assert_eq!(e.code, Some("invalid_json"));
        assert!(parse_json::<GenRequest>(b"{\"unknown_field\": 1}").is_ok());
    }
}

/// `GET /slots`: each slot, whether it runs a sequence and the positions it keeps.
async fn slots(State(st): State<AppState>) -> Result<Json<Value>, ApiError> {
    match st.engine.slot(None, SlotAction::List).await? {
        SlotReply::Done(v) => Ok(Json(v)),
        SlotReply::Snapshot { .. } => {
            Err(ApiError::internal("the engine answered a list with a copy"))
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct SlotBody {
    filename: Option<String>,
}

#[derive(Deserialize)]
struct SlotQuery {
    action: Option<String>,
}

/// `POST /slots/{id}?action=save|restore|erase` (llama.cpp's): save a slot's kept cache to a
/// file in `--slot-save-path`, make a slot keep a file's cache (a later prompt beginning with
/// its tokens continues from it), or forget a slot's cache. Body `{"filename": "..."}` for save
/// and restore: a plain file name, no folders.
async fn slot_action(
    State(st): State<AppState>,
    Path(id): Path<String>,
    axum::extract::Query(q): axum::extract::Query<SlotQuery>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let slot: usize = id
        .parse()
        .map_err(|_| ApiError::invalid("id_slot", format!("slot id {id:?} is not a number")))?;
    let body: SlotBody = if body.iter().all(u8::is_ascii_whitespace) {
        SlotBody::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| ApiError::bad_request(format!("the body is not a slot request: {e}")))?
    };
    let file = |dir: &Option<Arc<std::path::Path>>| -> Result<std::path::PathBuf, ApiError> {
        let Some(dir) = dir else {
            return Err(ApiError::not_enabled(
                "this server saves and restores slots only when started with --slot-save-path DIR",
            ));
        };
        let name = body.filename.as_deref().ok_or_else(|| {
            ApiError::invalid("filename", "give the file's name: {\"filename\": \"...\"}")
        })?;
        validate_filename(name)?;
        Ok(dir.join(name))
    };
    let started = std::time::Instant::now();
    let ms = move || started.elapsed().as_secs_f64() * 1e3;
    match q.action.as_deref() {
        Some("save") => {
            let path = file(&st.slot_dir)?;
            let SlotReply::Snapshot {
                state,
                n_swa,
                copy_ms,
            } = st.engine.slot(Some(slot), SlotAction::Save).await?
            else {
                return Err(ApiError::internal("the engine copied no cache out"));
            };
            let n = state.tokens.len();
            // The file is written here, off the engine thread: the other sequences wait only for
            // the copy out of the backend.
            let target = path.clone();
            let written = tokio::task::spawn_blocking(move || {
                muser_engine::state::save(&target, &state, n_swa)
            })
            .await
            .map_err(|e| ApiError::internal(format!("saving slot {slot}: {e}")))?
            .map_err(|e| ApiError::internal(e.to_string()))?;
            tracing::info!(slot, positions = n, bytes = written, path = %path.display(), "slot saved");
            Ok(Json(json!({
                "id_slot": slot,
                "filename": body.filename,
                "n_saved": n,
                "n_written": written,
                "timings": {"save_ms": ms(), "copy_ms": copy_ms},
            })))
        }
        Some("restore") => {
            let path = file(&st.slot_dir)?;
            let name = body.filename.clone().unwrap_or_default();
            // Read and checked here, off the engine thread; the engine only copies it in.
            let source = path.clone();
            let (state, n_read) = tokio::task::spawn_blocking(move || {
                let n_read = std::fs::metadata(&source).map_or(0, |m| m.len());
                muser_engine::state::load(&source).map(|s| (s, n_read))
            })
            .await
            .map_err(|e| ApiError::internal(format!("restoring slot {slot}: {e}")))?
            .map_err(|e| match e {
                muser_engine::Error::Io(m) => ApiError::not_found(m),
                e => ApiError::bad_request(e.to_string()),
            })?;
            let reply = st
                .engine
                .slot(Some(slot), SlotAction::Restore(Box::new(state)))
                .await
                .map_err(|mut e| {
                    if e.status == axum::http::StatusCode::BAD_REQUEST {
                        e.message = format!("{name}: {}", e.message);
                    }
                    e
                })?;
            let SlotReply::Done(mut v) = reply else {
                return Err(ApiError::internal(
                    "the engine answered a restore with a copy",
                ));
            };
            tracing::info!(slot, path = %path.display(), "slot restored");
            v["filename"] = json!(name);
            v["n_read"] = json!(n_read);
            v["timings"]["restore_ms"] = json!(ms());
            Ok(Json(v))
        }
        Some("erase") => match st.engine.slot(Some(slot), SlotAction::Erase).await? {
            SlotReply::Done(v) => Ok(Json(v)),
            SlotReply::Snapshot { .. } => Err(ApiError::internal(
                "the engine answered an erase with a copy",
            )),
        },
        Some(a) => Err(ApiError::invalid(
            "action",
            format!("unknown slot action {a:?}: save, restore or erase"),
        )),
        None => Err(ApiError::invalid(
            "action",
            "give ?action=save, restore or erase",
        )),
    }
}

/// A slot file's name: 1 to 200 characters of letters, digits, `.`, `_` and `-`, not beginning
/// with a dot (no folders, no `..`, nothing hidden).
fn validate_filename(name: &str) -> Result<(), ApiError> {
    let ok = !name.is_empty()
        && name.len() <= 200
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(
            "filename",
            format!(
                "{:?} is not a usable file name: 1 to 200 letters, digits, '.', '_' or '-', not beginning with '.'",
                name.chars().take(64).collect::<String>()
            ),
        ))
    }
}
