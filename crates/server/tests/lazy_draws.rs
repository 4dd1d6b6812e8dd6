//! Where the tokens of a lazily constrained answer are drawn. (Its own test binary: with
//! `row_draws` it draws on the backend, and api.rs's
//! `draws_on_the_backend_reproduce_and_agree_with_the_host` counts the process-wide device draws.)

mod common;

use common::{Opts, Server};
use serde_json::{Value, json};

/// `tool_choice: "auto"` on a backend that draws next to its logits (a GPU's path): an answer's
/// tokens before it begins a call are drawn there, as any free row is, and from the call's
/// trigger on too: each checked on the host, where the grammar is, and drawn again there under
/// its mask where refused (`worker::grammar_redraw`); the call is whole. The model and the
/// favoured tokens are those of api.rs's `begun_tool_calls_are_well_formed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
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
