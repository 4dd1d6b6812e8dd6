//! `muser serve --draft-ngram N`: each decoding sequence guesses its next tokens from its own and
//! checks the guess in the step's forward. In the CPU's accurate mode a forward gives every
//! token the bits it has alone, so the answers are a plain server's, greedy and seeded, with
//! penalties, several choices, streamed, cut by max_tokens or by a stop string, and batched with
//! other sequences, while guesses are kept.

mod common;

use common::{Opts, Server};
use muser_engine::speculative::NgramDraft;
use serde_json::{Value, json};

/// A prompt that says a passage twice: the lookup has guesses from the first step.
fn prompt() -> Vec<u64> {
    let passage: Vec<u64> = (0..30).map(|i| 40 + (i * 7) % 90).collect();
    let mut p = vec![1];
    p.extend(&passage);
    p.extend(&passage);
    p
}

fn answers(v: &Value) -> Vec<(Value, Value)> {
    v["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["text"].clone(), c["finish_reason"].clone()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guesses_give_a_plain_servers_answers() {
    answers_as_plain(false).await;
}

/// The same where tokens are drawn next to the logits (a GPU's way; here the CPU's
/// `row_draws`): each guessed row's draw is the one plain decoding makes there, from its own
/// stream of random numbers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guesses_drawn_where_the_logits_are_give_a_plain_servers_answers() {
    answers_as_plain(true).await;
}

async fn answers_as_plain(row_draws: bool) {
    let plain = Server::start(Opts {
        row_draws,
        ..Opts::default()
    })
    .await;
    let guessing = Server::start(Opts {
        draft: Some(NgramDraft::new(1, 4).unwrap()),
        row_draws,
        ..Opts::default()
    })
    .await;
    let p = prompt();
    let bodies = [
        json!({"prompt": p, "max_tokens": 40, "temperature": 0}),
        json!({"prompt": p, "max_tokens": 37, "temperature": 0.8, "seed": 3, "n": 2,
               "frequency_penalty": 0.5, "repetition_penalty": 1.1}),
        json!({"prompt": p, "max_tokens": 25, "temperature": 0.7, "top_k": 20, "top_p": 0.9, "seed": 9}),
        json!({"prompt": "The cat sat on the mat. The cat sat on the", "max_tokens": 30, "temperature": 0}),
        // Steered to two tokens, the answer repeats itself: most guesses are kept.
        json!({"prompt": p, "max_tokens": 60, "temperature": 0, "logit_bias": {"50": 30, "60": 30}}),
        json!({"prompt": p, "max_tokens": 60, "temperature": 1.0, "seed": 5, "logit_bias": {"50": 12, "60": 12, "70": 12}}),
    ];
    for body in &bodies {
        let want = plain.post("/v1/completions", body).await.json();
        let got = guessing.post("/v1/completions", body).await.json();
        assert_eq!(answers(&got), answers(&want), "{body}");
        assert_eq!(got["usage"], want["usage"], "{body}");
    }
    // A stop string met inside a guess ends the answer where a plain server's ends.
    let free = plain.post("/v1/completions", &bodies[0]).await.json();
    let text = free["choices"][0]["text"].as_str().unwrap().to_string();
    if let Some(stop) = text.get(12..15).filter(|s| !s.trim().is_empty()) {
        let mut b = bodies[0].clone();
        b["stop"] = json!([stop]);
        let want = plain.post("/v1/completions", &b).await.json();
        let got = guessing.post("/v1/completions", &b).await.json();
        assert_eq!(answers(&got), answers(&want), "stop {stop:?}");
    }
    // Streamed, and several at once (batched with each other and with a prompt being run).
    let mut sb = bodies[1].clone();
    sb["stream"] = json!(true);
    let (a, b, c) = tokio::join!(
        guessing.stream("/v1/completions", &sb),
        guessing.post("/v1/completions", &bodies[0]),
        guessing.post("/v1/completions", &bodies[2]),
    );
    let mut a = a;
    let mut texts = vec![String::new(), String::new()];
    for chunk in a.collect().await {
        for ch in chunk["choices"].as_array().into_iter().flatten() {
            let i = ch["index"].as_u64().unwrap() as usize;
            texts[i] += ch["text"].as_str().unwrap_or("");
        }
    }
    let want = plain.post("/v1/completions", &bodies[1]).await.json();
    let want_texts: Vec<String> = want["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(texts, want_texts);
    let want0 = plain.post("/v1/completions", &bodies[0]).await.json();
    let want2 = plain.post("/v1/completions", &bodies[2]).await.json();
    assert_eq!(answers(&b.json()), answers(&want0));
    assert_eq!(answers(&c.json()), answers(&want2));
    // Guesses were kept (else this tested only the taking back), and missed.
    let kept = guessing
        .metric("muser_draft_tokens_total", "kept=\"yes\"")
        .await;
    let missed = guessing
        .metric("muser_draft_tokens_total", "kept=\"no\"")
        .await;
    println!("row_draws {row_draws}: guessed tokens kept {kept}, missed {missed}");
    assert!(kept >= 40.0 && missed > 0.0, "kept {kept}, missed {missed}");
    // A prompt that begins with one a guessing sequence ran (its slot's kept cache, prefix
    // reuse): the same answer.
    let mut longer = p.clone();
    longer.extend([77u64, 78]);
    let b = json!({"prompt": longer, "max_tokens": 20, "temperature": 0});
    let want = plain.post("/v1/completions", &b).await.json();
    let got = guessing.post("/v1/completions", &b).await.json();
    assert_eq!(answers(&got), answers(&want));
}
