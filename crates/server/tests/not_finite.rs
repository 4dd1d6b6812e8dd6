//! Logits that are not finite end a request with a reason, wherever its tokens are drawn. (Its
//! own test binary: with `row_draws` it draws on the backend, and api.rs's
//! `draws_on_the_backend_reproduce_and_agree_with_the_host` counts the process-wide device draws.)

mod common;

use common::{Opts, Server};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
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
