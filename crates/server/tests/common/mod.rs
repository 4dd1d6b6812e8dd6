//! A live server on an ephemeral port with a fixture model, and a small raw HTTP/1.1 client
//! (raw so that tests control exactly what is sent and when a connection drops).
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use muser_engine::{CpuBackend, KvType, ModelFile, MuseGlimmer, NumericMode};
use muser_gguf::Gguf;
use muser_server::{EngineConfig, ServeConfig, TextModel};
use muser_text::{ChatTemplate, Tokenizer};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub const MODEL: &str = "tame-q4_k_m";

pub fn fixture(name: &str) -> String {
    format!(
        "{}/../../tests/fixtures/models/{name}.gguf",
        env!("CARGO_MANIFEST_DIR")
    )
}

pub struct Opts {
    pub mode: NumericMode,
    pub template: bool,
    pub api_key: Option<String>,
    pub n_ctx: usize,
    pub parallel: usize,
    pub max_queue: usize,
    pub step_tokens: usize,
    pub max_body_bytes: usize,
    pub grace: Duration,
    /// Tokens chosen through `Backend::draw_rows` (a GPU's draw), not the host sampler.
    pub row_draws: bool,
    pub prefix_reuse: bool,
    pub stall_timeout: Duration,
    /// `--draft-ngram N --draft-max M`.
    pub draft: Option<muser_engine::speculative::NgramDraft>,
    /// `--kv-budget-mib` in bytes (None: `--parallel` full contexts).
    pub kv_budget: Option<usize>,
    /// Every `attn_q_norm` at 3e38, a finite constant the loader accepts whose products
    /// overflow f32: the model's logits are NaN.
    pub overflow: bool,
    /// `output_norm` at 0: every logit is 0 whatever the text, so what is drawn is set by the
    /// request's `logit_bias` and penalties alone (the random model repeats its last token).
    pub flat: bool,
    /// A chat template's source in place of the file's.
    pub template_source: Option<&'static str>,
    /// `--slot-save-path`.
    pub slot_dir: Option<std::path::PathBuf>,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            mode: NumericMode::Accurate,
            template: true,
            api_key: None,
            n_ctx: 1024,
            parallel: 4,
            max_queue: 16,
            step_tokens: 128,
            max_body_bytes: 1 << 20,
            grace: Duration::from_secs(10),
            row_draws: false,
            prefix_reuse: true,
            stall_timeout: Duration::from_secs(60),
            draft: None,
            kv_budget: None,
            overflow: false,
            flat: false,
            template_source: None,
            slot_dir: None,
        }
    }
}

pub struct Server {
    pub addr: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<Result<(), String>>>,
}

impl Server {
    pub async fn start(o: Opts) -> Server {
        let mut g = Arc::new(Gguf::open(fixture(MODEL)).expect("fixture model"));
        if o.overflow {
            g = Arc::new(with_norm(&g, "attn_q_norm.weight", 3e38));
        }
        if o.flat {
            g = Arc::new(with_norm(&g, "output_norm.weight", 0.0));
        }
        let tokenizer = Tokenizer::from_gguf(&g).expect("tokenizer");
        let template = o.template.then(|| match o.template_source {
            Some(src) => ChatTemplate::new(src, "test").expect("template"),
            None => ChatTemplate::from_gguf(&g).expect("template"),
        });
        let file = ModelFile::from_gguf(g).expect("model file");
        let mut backend = CpuBackend::new(o.mode, 1).expect("cpu");
        backend.row_draws = o.row_draws;
        let model = MuseGlimmer::load(&file, backend).expect("load");
        let cfg = ServeConfig {
            model_id: MODEL.into(),
            engine: EngineConfig {
                n_ctx: o.n_ctx,
                parallel: o.parallel,
                step_tokens: o.step_tokens,
                max_queue: o.max_queue,
                kv_type: KvType::F16,
                kv_budget_bytes: o.kv_budget,
                prefix_reuse: o.prefix_reuse,
                stall_timeout: o.stall_timeout,
                draft: o.draft,
            },
            api_key: o.api_key,
            max_body_bytes: o.max_body_bytes,
            shutdown_grace: o.grace,
            slot_save_path: o.slot_dir,
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(muser_server::serve(
            model,
            TextModel {
                tokenizer,
                template,
            },
            cfg,
            listener,
            async move {
                let _ = rx.await;
            },
        ));
        Server {
            addr,
            stop: Some(tx),
            task: Some(task),
        }
    }

    /// Signal shutdown and wait for `serve` to return.
    pub async fn stop(&mut self) -> Result<(), String> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        match self.task.take() {
            Some(t) => t.await.map_err(|e| e.to_string())?,
            None => Ok(()),
        }
    }

    pub fn signal_stop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }

    pub async fn post(&self, path: &str, body: &Value) -> Resp {
        request(&self.addr, "POST", path, &[], body.to_string().as_bytes()).await
    }

    /// `/tokenize`'s ids for `text` (`add_special`: BOS or not; None: the model's default).
    pub async fn token_ids(&self, text: &str, add_special: Option<bool>) -> Vec<u64> {
        let mut body = serde_json::json!({ "content": text });
        if let Some(a) = add_special {
            body["add_special"] = Value::Bool(a);
        }
        let v = self.post("/tokenize", &body).await.json();
        v["tokens"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_u64).collect())
            .unwrap_or_else(|| panic!("/tokenize: {v}"))
    }

    pub async fn get(&self, path: &str) -> Resp {
        request(&self.addr, "GET", path, &[], b"").await
    }

    pub async fn stream(&self, path: &str, body: &Value) -> Sse {
        Sse::open(&self.addr, path, &[], body).await
    }

    /// A Prometheus sample's value (the sum over label sets matching `labels`).
    pub async fn metric(&self, name: &str, labels: &str) -> f64 {
        let m = self.get("/metrics").await;
        let text = String::from_utf8_lossy(&m.body).to_string();
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter(|l| {
                l.split([' ', '{']).next() == Some(name)
                    && (labels.is_empty() || l.contains(labels))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.signal_stop();
    }
}

#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "status {}: body is not JSON ({e}): {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Asserts an OpenAI error object with this status; returns the `error` member.
    pub fn openai_error(&self, status: u16) -> Value {
        assert_eq!(
            self.status,
            status,
            "expected {status}, got {}: {}",
            self.status,
            String::from_utf8_lossy(&self.body)
        );
        let v = self.json();
        let e = v["error"].clone();
        assert!(e["message"].is_string(), "error.message: {v}");
        assert!(e["type"].is_string(), "error.type: {v}");
        let o = e.as_object().expect("error object");
        assert!(o.contains_key("param") && o.contains_key("code"), "{v}");
        e
    }
}

/// `logit_bias` favouring the tokens of ` to=` and `<|message|>` (` to` most), each one token of
/// the fixture's vocabulary: on a `flat` model, with penalties for repeating them, most answers
/// begin a tool call (` to=`, a recipient, `<|message|>`).
pub fn call_bias() -> serde_json::Map<String, Value> {
    let g = Gguf::open(fixture(MODEL)).expect("fixture model");
    let tok = Tokenizer::from_gguf(&g).expect("tokenizer");
    let mut bias = serde_json::Map::new();
    for (text, b) in [(" to", 24), ("=", 22), ("<|message|>", 20)] {
        let ids = tok.encode(text, false, true).expect("encode");
        assert_eq!(ids.len(), 1, "{text:?}: {ids:?}");
        bias.insert(ids[0].to_string(), serde_json::json!(b));
    }
    bias
}

/// `g` with every value of the f32 norms whose names end in `name` at `value`
/// (`Opts::overflow`, `Opts::flat`).
fn with_norm(g: &Gguf, name: &str, value: f32) -> Gguf {
    let mut w = muser_gguf::GgufWriter::new();
    for (k, v) in g.metadata() {
        if k != "general.alignment" {
            w.add(k, v.clone()).expect("key");
        }
    }
    for t in g.tensors() {
        let mut bytes = g.tensor_data(t).to_vec();
        if t.name.ends_with(name) {
            assert_eq!(t.ggml_type, muser_gguf::GgmlType::F32, "{}", t.name);
            bytes = bytes
                .chunks_exact(4)
                .flat_map(|_| value.to_le_bytes())
                .collect();
        }
        w.add_tensor(&t.name, &t.dims, t.ggml_type, bytes)
            .expect("tensor");
    }
    Gguf::from_bytes(w.to_bytes().expect("bytes")).expect("gguf")
}

fn head_request(
    method: &str,
    path: &str,
    addr: &str,
    headers: &[(&str, &str)],
    len: usize,
) -> String {
    let mut r = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {len}\r\n"
    );
    for (k, v) in headers {
        r.push_str(&format!("{k}: {v}\r\n"));
    }
    r.push_str("\r\n");
    r
}

/// One request on a fresh connection; the whole response.
pub async fn request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Resp {
    let mut b = Body::send(addr, method, path, headers, body).await;
    while b.more().await {}
    Resp {
        status: b.status,
        headers: b.headers.clone(),
        body: std::mem::take(&mut b.decoded),
    }
}

/// A response body read incrementally, chunked transfer encoding decoded.
pub struct Body {
    sock: TcpStream,
    pub status: u16,
    pub headers: Vec<(String, String)>,
    raw: Vec<u8>,
    pub decoded: Vec<u8>,
    chunked: bool,
    pub done: bool,
}

impl Body {
    pub async fn send(
        addr: &str,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Body {
        let mut sock = TcpStream::connect(addr).await.expect("connect");
        let head = head_request(method, path, addr, headers, body.len());
        sock.write_all(head.as_bytes()).await.expect("write head");
        // The server may answer (413) and close before the whole body is sent.
        let _ = sock.write_all(body).await;
        let mut raw = Vec::new();
        let mut buf = [0u8; 8192];
        let end = loop {
            if let Some(i) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
                break i;
            }
            let n = sock.read(&mut buf).await.expect("read head");
            assert!(n > 0, "connection closed before the response head");
            raw.extend_from_slice(&buf[..n]);
        };
        let head = String::from_utf8_lossy(&raw[..end]).to_string();
        let mut lines = head.split("\r\n");
        let status = lines
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|s| s.parse().ok())
            .expect("status line");
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        let chunked = headers
            .iter()
            .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
        let raw = raw[end + 4..].to_vec();
        let mut b = Body {
            sock,
            status,
            headers,
            raw,
            decoded: Vec::new(),
            chunked,
            done: false,
        };
        b.decode();
        b
    }

    fn decode(&mut self) {
        if !self.chunked {
            self.decoded.append(&mut self.raw);
            return;
        }
        loop {
            let Some(i) = self.raw.windows(2).position(|w| w == b"\r\n") else {
                return;
            };
            let size_line = String::from_utf8_lossy(&self.raw[..i]).to_string();
            let size = usize::from_str_radix(size_line.split(';').next().unwrap_or("").trim(), 16)
                .expect("chunk size");
            if size == 0 {
                self.done = true;
                return;
            }
            if self.raw.len() < i + 2 + size + 2 {
                return;
            }
            self.decoded
                .extend_from_slice(&self.raw[i + 2..i + 2 + size]);
            self.raw.drain(..i + 2 + size + 2);
        }
    }

    /// Reads more; false at the end of the body.
    pub async fn more(&mut self) -> bool {
        if self.done {
            return false;
        }
        let mut buf = [0u8; 16384];
        let n: usize = self.sock.read(&mut buf).await.unwrap_or_default();
        if n == 0 {
            self.done = true;
            return false;
        }
        self.raw.extend_from_slice(&buf[..n]);
        self.decode();
        true
    }
}

/// A server-sent event stream.
pub struct Sse {
    pub body: Body,
}

impl Sse {
    pub async fn open(addr: &str, path: &str, headers: &[(&str, &str)], body: &Value) -> Sse {
        Sse {
            body: Body::send(addr, "POST", path, headers, body.to_string().as_bytes()).await,
        }
    }

    pub fn status(&self) -> u16 {
        self.body.status
    }

    /// The next `data:` payload, or None at the end of the stream.
    pub async fn next(&mut self) -> Option<String> {
        loop {
            if let Some(i) = self.body.decoded.windows(2).position(|w| w == b"\n\n") {
                let ev: Vec<u8> = self.body.decoded.drain(..i + 2).collect();
                let ev = String::from_utf8_lossy(&ev).to_string();
                let data: Vec<&str> = ev
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(|l| l.strip_prefix(' ').unwrap_or(l))
                    .collect();
                if data.is_empty() {
                    continue; // a keep-alive comment
                }
                return Some(data.join("\n"));
            }
            if !self.body.more().await {
                return None;
            }
        }
    }

    /// The next event's name (`event:`, "" without one) and `data:` payload, parsed; None at
    /// the end of the stream.
    pub async fn next_event(&mut self) -> Option<(String, Value)> {
        loop {
            if let Some(i) = self.body.decoded.windows(2).position(|w| w == b"\n\n") {
                let ev: Vec<u8> = self.body.decoded.drain(..i + 2).collect();
                let ev = String::from_utf8_lossy(&ev).to_string();
                let field = |name: &str| -> Vec<String> {
                    ev.lines()
                        .filter_map(|l| l.strip_prefix(name))
                        .map(|l| l.strip_prefix(' ').unwrap_or(l).to_string())
                        .collect()
                };
                let data = field("data:");
                if data.is_empty() {
                    continue; // a keep-alive comment
                }
                let data = data.join("\n");
                let v = serde_json::from_str(&data)
                    .unwrap_or_else(|e| panic!("event data is not JSON ({e}): {data}"));
                return Some((field("event:").join(""), v));
            }
            if !self.body.more().await {
                return None;
            }
        }
    }

    /// Every payload up to `[DONE]` (asserting it comes), parsed.
    pub async fn collect(&mut self) -> Vec<Value> {
        let mut out = Vec::new();
        loop {
            match self.next().await {
                Some(d) if d == "[DONE]" => return out,
                Some(d) => out.push(serde_json::from_str(&d).expect("chunk is JSON")),
                None => panic!("stream ended without [DONE] after {out:?}"),
            }
        }
    }
}

/// A prompt of about `n` tokens.
pub fn long_text(n: usize) -> String {
    let words = [
        "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta",
    ];
    (0..n)
        .map(|i| words[i % words.len()])
        .collect::<Vec<_>>()
        .join(" ")
}
