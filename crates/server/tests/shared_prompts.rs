//! The choices of one request share their prompt's cache. (Its own test binary: it counts the
//! process-wide prompt metrics.)

mod common;

use common::{Opts, Server};
use serde_json::{Value, json};

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
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
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
