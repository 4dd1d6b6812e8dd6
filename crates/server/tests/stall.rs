//! A stream nobody reads gives its slot up after the stall timeout. (Its own test binary: it
//! reads the process-wide metrics.)

mod common;

use std::time::{Duration, Instant};

use common::{Opts, Server};
use serde_json::json;

/// A client that sends a streaming request of 4 choices (every slot) and then reads nothing:
/// once the socket and the request's channel are full its sequences can no longer run, and
/// after `stall_timeout` without the client taking anything they are cancelled, so a slot goes
/// to the next request (before, that request waited as long as the silent client kept its
/// connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_nobody_reads_gives_up_its_slot() {
    use tokio::io::AsyncWriteExt;
    let s = Server::start(Opts {
        parallel: 4,
        n_ctx: 4096,
        stall_timeout: Duration::from_secs(1),
        ..Opts::default()
    })
    .await;
    let body = json!({"prompt": "x", "max_tokens": 4000, "ignore_eos": true, "stream": true,
                      "logprobs": 20, "n": 4})
    .to_string();
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let mut silent = sock.connect(s.addr.parse().unwrap()).await.unwrap();
    silent
        .write_all(
            format!(
                "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let t0 = Instant::now();
    while s.metric("muser_sequences_running", "").await != 4.0 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the silent request never ran"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = tokio::time::timeout(
        Duration::from_secs(120),
        s.post("/v1/completions", &json!({"prompt": "z", "max_tokens": 2})),
    )
    .await
    .expect("the next request still waits for the silent client's slot");
    assert_eq!(r.status, 200);
    assert!(
        s.metric("muser_sequences_finished_total", "reason=\"stalled\"")
            .await
            >= 1.0,
        "none of the silent client's sequences was cancelled for stalling"
    );
    let generated = s.metric("muser_generation_tokens_total", "").await;
    assert!(
        generated < 16000.0,
        "{generated} tokens: they ran to the end"
    );
    drop(silent);
}
