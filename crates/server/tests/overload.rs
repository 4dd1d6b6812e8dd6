//! A full queue answers 429 with Retry-After; a client that disconnects has its sequence
//! cancelled and its slot given to the next request. (Its own test binary: it reads the
//! process-wide metrics.)

mod common;

use std::time::{Duration, Instant};

use common::{Opts, Server};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_full_is_429_and_a_disconnect_frees_the_slot() {
    let s = Server::start(Opts {
        parallel: 1,
        max_queue: 1,
        n_ctx: 4096,
        ..Opts::default()
    })
    .await;
    let long = json!({"prompt": "x", "max_tokens": 4000, "ignore_eos": true, "stream": true});
    // A holds the one slot.
    let mut a = s.stream("/v1/completions", &long).await;
    assert_eq!(a.status(), 200);
    a.next().await.expect("A runs");
    // B waits in the queue.
    let mut b = s
        .stream(
            "/v1/completions",
            &json!({"prompt": "y", "max_tokens": 3, "ignore_eos": true, "stream": true}),
        )
        .await;
    assert_eq!(b.status(), 200);
    let t0 = Instant::now();
    while s.metric("muser_queue_depth", "").await != 1.0 {
        assert!(t0.elapsed() < Duration::from_secs(10), "B never queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // C finds the queue full, streaming or not.
    for stream in [false, true] {
        let c = s
            .post(
                "/v1/completions",
                &json!({"prompt": "z", "max_tokens": 3, "stream": stream}),
            )
            .await;
        let e = c.openai_error(429);
        assert_eq!(e["type"], "rate_limit_error");
        assert_eq!(c.header("retry-after"), Some("1"));
    }
    // A's client goes away: its sequence is cancelled and B gets the slot.
    drop(a);
    let chunks = b.collect().await;
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );
    let generated = s.metric("muser_generation_tokens_total", "").await;
    assert!(
        generated < 4000.0,
        "A was cancelled, not run to the end ({generated} tokens generated)"
    );
    let t0 = Instant::now();
    while s
        .metric("muser_sequences_finished_total", "reason=\"cancelled\"")
        .await
        < 1.0
    {
        assert!(t0.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(s.metric("muser_sequences_running", "").await, 0.0);
    assert_eq!(s.metric("muser_queue_depth", "").await, 0.0);
    assert_eq!(s.metric("muser_kv_cache_reserved_bytes", "").await, 0.0);
    // The 429s were counted, and the server serves again.
    assert!(s.metric("muser_rejected_total", "").await >= 2.0);
    let r = s
        .post("/v1/completions", &json!({"prompt": "z", "max_tokens": 2}))
        .await;
    assert_eq!(r.status, 200);
    let m = String::from_utf8_lossy(&s.get("/metrics").await.body).to_string();
    for name in [
        "muser_time_to_first_token_seconds_bucket",
        "muser_tokens_per_second",
        "muser_kv_cache_usage_ratio",
        "muser_http_requests_total",
        "muser_prompt_tokens_total",
    ] {
        assert!(m.contains(name), "{name} missing from /metrics:\n{m}");
    }
}
