//! Constrained rows on a backend that draws next to its logits (a GPU's path; here the CPU's
//! `row_draws`). Its own test binary: it counts the process-wide draw metrics.

mod common;

use common::{Opts, Server};
use serde_json::{Value, json};

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
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
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
