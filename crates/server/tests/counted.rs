//! Tests that count the process-wide metrics (where tokens are drawn, prompt tokens run and
//! shared), and one that draws on the backend (whose draws api.rs's
//! `draws_on_the_backend_reproduce_and_agree_with_the_host` would count): one test binary of
//! their own, run one after another (`counted`), so no other test's requests move the counters
//! they read.

mod common;

use common::{Opts, Server};
use serde_json::{Value, json};

/// One after another: each reads counters the others move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counted() {
    a_lazy_grammar_draws_on_the_backend_before_and_after_its_trigger().await;
    constrained_rows_draw_on_the_backend().await;
    choices_share_their_prompt().await;
    requests_share_a_prefix_in_flight().await;
    logits_that_are_not_finite_end_the_request_with_a_reason_wherever_drawn().await;
}

/// `tool_choice: "auto"` on a backend that draws next to its logits (a GPU's path): an answer's
/// tokens before it begins a call are drawn there, as any free row is, and from the call's
/// trigger on too: each checked on the host, where the grammar is, and drawn again there under
/// its mask where refused (`worker::grammar_redraw`); the call is whole. The model and the
/// favoured tokens are those of api.rs's `begun_tool_calls_are_well_formed`.
async fn a_lazy_grammar_draws_on_the_backend_before_and_after_its_trigger() {
    let s = Server::start(Opts {
        n_ctx: 4096,
        flat: true,
        row_draws: true,
        ..Opts::default()
    })
    .await;
    let bias = common::call_bias();
    let tools = json!([{"type": "function", "function": {"name": "ping"}}]);
    let hi = json!([{"role": "user", "content": "Ping."}]);
    let draws = |w: &'static str| {
        let s = &s;
        async move {
            s.metric("muser_draws_total", &format!("where=\"{w}\""))
                .await
        }
    };
    let mut calls = 0;
    for seed in 0..8 {
        let (dev0, host0) = (draws("device").await, draws("host").await);
        let r = s
            .post(
                "/v1/chat/completions",
                &json!({"messages": hi, "tools": tools, "max_tokens": 160, "seed": seed,
                        "logit_bias": bias, "frequency_penalty": 2.0, "presence_penalty": 2.0,
                        "parallel_tool_calls": false}),
            )
            .await
            .json();
        let c = &r["choices"][0];
        let (dev, host) = (draws("device").await - dev0, draws("host").await - host0);
        let n = r["usage"]["completion_tokens"].as_f64().unwrap();
        if c["finish_reason"] == "tool_calls" {
            calls += 1;
            let f = &c["message"]["tool_calls"][0]["function"];
            assert_eq!(f["name"], "ping", "{r}");
            let args: Value = serde_json::from_str(f["arguments"].as_str().unwrap()).unwrap();
            assert_eq!(args, json!({}));
            // The call and its end on the backend too.
            assert_eq!((host, dev), (0.0, n), "a call: {r}");
        } else {
            assert_eq!((host, dev), (0.0, n), "a free answer: {r}");
        }
    }
    assert!(calls >= 3, "{calls} calls");
}

fn text_of(v: &Value) -> String {
    v["choices"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// A constrained row is drawn where its logits are, its token checked against the grammar on
/// the host and, where refused, drawn again there under the grammar's mask (`RowDraw::allowed`):
/// greedy answers are the host chain's token for token (the largest logit the grammar allows,
/// either way); a seed's tokens do not change with logprobs (the host row is chosen by the
/// same draws); every token is drawn on the backend, and the random-weight model's refused
/// first draws were drawn again there; the text matches its grammar.
async fn constrained_rows_draw_on_the_backend() {
    let host = Server::start(Opts::default()).await;
    let dev = Server::start(Opts {
        row_draws: true,
        ..Opts::default()
    })
    .await;
    let draws = |w: &'static str| {
        let dev = &dev;
        async move {
            dev.metric("muser_draws_total", &format!("where=\"{w}\""))
                .await
        }
    };
    let grammar = "root ::= \"{\" (\"\\\"k\\\": \" [0-9]{1,3} (\", \" | \"\"))+ \"}\"";
    let greedy = json!({"prompt": "Numbers:", "grammar": grammar, "max_tokens": 40,
                        "temperature": 0, "ignore_eos": true, "logit_bias": {"40": 1.5},
                        "frequency_penalty": 0.5});
    let a = host.post("/v1/completions", &greedy).await.json();
    let (d0, h0) = (draws("device").await, draws("host").await);
    let r0 = dev.metric("muser_grammar_redraws_total", "").await;
    let b = dev.post("/v1/completions", &greedy).await.json();
    assert_eq!(text_of(&a), text_of(&b), "greedy under a grammar: {a} {b}");
    let n = b["usage"]["completion_tokens"].as_f64().unwrap();
    assert!(n >= 3.0, "{b}");
    let t = text_of(&b);
    assert!(
        t.starts_with("{\"k\": ") && t.bytes().all(|c| b"{}\"k: ,0123456789".contains(&c)),
        "{t:?}"
    );
    // With `ignore_eos`, a whole match ends the completion at the draw that finds nothing
    // more allowed (`stop`): one draw more than tokens.
    let ended = b["choices"][0]["finish_reason"] == "stop";
    assert_eq!(
        (draws("device").await - d0, draws("host").await - h0),
        (n + ended as u8 as f64, 0.0),
        "every token drawn on the backend: {b}"
    );
    let redrawn = dev.metric("muser_grammar_redraws_total", "").await - r0;
    assert!(
        redrawn >= 1.0 && redrawn <= n,
        "{redrawn} redraws of {n} tokens"
    );

    // Sampled: a seed reproduces, and logprobs do not change its tokens.
    for seed in 0..4u64 {
        let body = |lp: bool| {
            let mut b = json!({"prompt": "Numbers:", "grammar": grammar, "max_tokens": 30,
                               "temperature": 1.0, "seed": seed, "ignore_eos": true});
            if lp {
                b["logprobs"] = json!(1);
            }
            b
        };
        let plain = dev.post("/v1/completions", &body(false)).await.json();
        let with_lp = dev.post("/v1/completions", &body(true)).await.json();
        let t = text_of(&plain);
        assert_eq!(
            t,
            text_of(&with_lp),
            "seed {seed}: logprobs changed the tokens"
        );
        assert_eq!(
            t,
            text_of(&dev.post("/v1/completions", &body(false)).await.json()),
            "seed {seed}: not reproduced"
        );
        assert!(t.starts_with("{\"k\": "), "seed {seed}: {t:?}");
        let lps = with_lp["choices"][0]["logprobs"]["token_logprobs"]
            .as_array()
            .unwrap();
        assert!(lps.iter().all(|v| v.as_f64().is_some_and(|x| x <= 0.0)));
    }
}

fn texts(v: &Value) -> Vec<String> {
    v["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["text"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// `n` choices of a prompt run it once: the others wait for it and start from a copy of its
/// cache (`Backend::kv_copy`), running only the last prompt token again. Their tokens are those
/// of separate requests with the choices' seeds (choice i: seed + i), greedy and sampled, over a
/// prompt of several chunks (`step_tokens` 16) and past the sliding window.
async fn choices_share_their_prompt() {
    let s = Server::start(Opts {
        step_tokens: 16,
        prefix_reuse: false,
        ..Opts::default()
    })
    .await;
    let prompt = "Once upon a time, in a land far away, there lived a small dragon who counted the stars every night and wrote their names in a book of gold. ".repeat(3);
    let body = |n: usize, seed: u64, t: f64| {
        json!({"prompt": prompt, "n": n, "seed": seed, "temperature": t, "max_tokens": 12,
               "ignore_eos": true, "frequency_penalty": 0.3})
    };
    let ran = || s.metric("muser_prompt_tokens_total", "");
    let shared = || s.metric("muser_prompt_tokens_shared_total", "");
    for (t, seed) in [(0.9, 7u64), (0.0, 0)] {
        let (r0, s0) = (ran().await, shared().await);
        let v = s.post("/v1/completions", &body(3, seed, t)).await.json();
        let (r1, s1) = (ran().await, shared().await);
        let l = v["usage"]["prompt_tokens"].as_f64().unwrap();
        assert!(l > 64.0, "{l} prompt tokens");
        assert_eq!(
            (r1 - r0, s1 - s0),
            (l + 2.0, 2.0 * (l - 1.0)),
            "tokens run and shared for 3 choices"
        );
        let got = texts(&v);
        for (i, g) in got.iter().enumerate() {
            let alone = s
                .post("/v1/completions", &body(1, seed + i as u64, t))
                .await
                .json();
            assert_eq!(g, &texts(&alone)[0], "temperature {t}, choice {i}");
        }
        if t > 0.0 {
            assert!(got[0] != got[1] || got[1] != got[2], "{got:?}");
        }
    }
}

/// Requests of different clients whose prompts begin alike (a system prompt) share the first
/// tokens' cache while they run: sent at once, one waits for the other's prompt to run them and
/// starts from a copy of its cache (`worker::share_source`, then `share_prompt`); sent while the
/// other generates, it starts from a copy at once. Every answer, its logprobs included, is that
/// of a server that shares nothing (the CPU's accurate mode gives the same bits however a
/// prompt is cut into steps), and `cached_tokens` says what was shared.
async fn requests_share_a_prefix_in_flight() {
    let s = Server::start(Opts {
        step_tokens: 16,
        ..Opts::default()
    })
    .await;
    let fresh = Server::start(Opts {
        step_tokens: 16,
        prefix_reuse: false,
        ..Opts::default()
    })
    .await;
    let head = s
        .token_ids(
            &"You are a careful assistant who answers in short plain sentences. ".repeat(4),
            None,
        )
        .await;
    assert!(head.len() > 40, "{} tokens", head.len());
    let (a, b, c) = (
        with(&s, &head, "Tell me about rivers.").await,
        with(&s, &head, "What do owls eat?").await,
        with(&s, &head, "Name three colours.").await,
    );
    assert!(a[head.len()] != b[head.len()] && b[head.len()] != c[head.len()]);
    let body = |p: &Vec<u64>, n: usize| json!({"prompt": p, "max_tokens": n, "temperature": 0, "ignore_eos": true, "logprobs": 2});
    let shared = || s.metric("muser_prompt_tokens_shared_total", "");
    let cached = |v: &Value| {
        v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap() as usize
    };
    // At once: one of the two follows the other's prompt.
    let s0 = shared().await;
    let (ba, bb) = (body(&a, 8), body(&b, 8));
    let (ra, rb) = tokio::join!(
        s.post("/v1/completions", &ba),
        s.post("/v1/completions", &bb)
    );
    let (ra, rb) = (ra.json(), rb.json());
    assert_eq!(
        shared().await - s0,
        head.len() as f64,
        "tokens shared at once"
    );
    let mut got = [cached(&ra), cached(&rb)];
    got.sort();
    assert_eq!(got, [0, head.len()]);
    for (p, r) in [(&a, &ra), (&b, &rb)] {
        let want = fresh.post("/v1/completions", &body(p, 8)).await.json();
        assert_eq!(r["choices"][0]["text"], want["choices"][0]["text"]);
        assert_eq!(r["choices"][0]["logprobs"], want["choices"][0]["logprobs"]);
    }
    // While the other generates (400 tokens: its cache can still go back to the shared ones),
    // under another system prompt (the free slots keep the first one's tokens: a prompt that
    // begins with them starts from there, as a kept cache's prefix, `pick_slot`).
    let head = s
        .token_ids(
            &"You are a patient teacher who explains each step before the next. ".repeat(4),
            None,
        )
        .await;
    let (a, c) = (
        with(&s, &head, "Tell me about rivers.").await,
        with(&s, &head, "Name three colours.").await,
    );
    assert_ne!(a[head.len()], c[head.len()]);
    let long = {
        let addr = s.addr.clone();
        let body = body(&a, 400).to_string();
        tokio::spawn(async move {
            common::request(&addr, "POST", "/v1/completions", &[], body.as_bytes()).await
        })
    };
    let generated = || s.metric("muser_generation_tokens_total", "");
    let g0 = generated().await;
    while generated().await < g0 + 4.0 {
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    let s0 = shared().await;
    let rc = s.post("/v1/completions", &body(&c, 8)).await.json();
    assert_eq!(
        shared().await - s0,
        head.len() as f64,
        "tokens shared from a running cache"
    );
    assert_eq!(cached(&rc), head.len());
    let want = fresh.post("/v1/completions", &body(&c, 8)).await.json();
    assert_eq!(rc["choices"][0]["text"], want["choices"][0]["text"]);
    assert_eq!(rc["choices"][0]["logprobs"], want["choices"][0]["logprobs"]);
    let rl = long.await.unwrap().json();
    let want = fresh.post("/v1/completions", &body(&a, 400)).await.json();
    assert_eq!(rl["choices"][0]["text"], want["choices"][0]["text"]);
    assert_eq!(rl["choices"][0]["logprobs"], want["choices"][0]["logprobs"]);
}

/// `head`'s ids, then `tail`'s (no BOS).
async fn with(s: &Server, head: &[u64], tail: &str) -> Vec<u64> {
    let mut p = head.to_vec();
    p.extend(s.token_ids(tail, Some(false)).await);
    p
}

async fn logits_that_are_not_finite_end_the_request_with_a_reason_wherever_drawn() {
    // A file whose scales overflow f32 (NaN logits): a token drawn from them would be some
    // token, silently. On the host and on the backend (`row_draws`, a GPU's path: the row is
    // checked where the logits are), greedy or sampled, with logprobs or without, the request
    // ends with a 500 that says why, and the server goes on answering.
    for row_draws in [false, true] {
        let mut s = Server::start(Opts {
            row_draws,
            overflow: true,
            ..Opts::default()
        })
        .await;
        for body in [
            json!({"prompt": "Once", "max_tokens": 4, "temperature": 0}),
            json!({"prompt": "Once", "max_tokens": 4, "temperature": 0.8, "seed": 3, "min_p": 0.05}),
            json!({"prompt": "Once", "max_tokens": 4, "temperature": 0.8, "logprobs": 2}),
            json!({"prompt": "Once", "max_tokens": 4, "temperature": 0, "logit_bias": {"40": 5}}),
            // A prompt scored (echo): on the backend (one alternative) and on the host (two).
            json!({"prompt": "Once upon a time", "echo": true, "max_tokens": 0, "logprobs": 1}),
            json!({"prompt": "Once upon a time", "echo": true, "max_tokens": 0, "logprobs": 2}),
        ] {
            let r = s.post("/v1/completions", &body).await;
            let e = r.openai_error(500);
            assert!(
                e["message"].as_str().unwrap().contains("not finite"),
                "row_draws {row_draws}, {body}: {e}"
            );
        }
        assert_eq!(s.get("/health").await.status, 200, "row_draws {row_draws}");
        s.stop().await.unwrap();
    }
}
