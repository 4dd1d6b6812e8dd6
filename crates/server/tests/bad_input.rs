//! Bad requests, sent while other streams run: each gets a 4xx with an OpenAI error object, and
//! the running streams finish untouched.

mod common;

use common::{Opts, Server, long_text, request};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_openai_errors_while_streams_run() {
    let s = Server::start(Opts {
        n_ctx: 512,
        max_body_bytes: 64 << 10,
        ..Opts::default()
    })
    .await;
    // Two streams that run throughout.
    let mut streams = Vec::new();
    for seed in 0..2 {
        let mut st = s
            .stream(
                "/v1/chat/completions",
                &json!({"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 150,
                        "ignore_eos": true, "stream": true, "seed": seed}),
            )
            .await;
        assert_eq!(st.status(), 200);
        st.next().await.expect("first chunk");
        streams.push(tokio::spawn(async move { st.collect().await }));
    }

    let chat = "/v1/chat/completions";
    let comp = "/v1/completions";
    let hi = json!([{"role": "user", "content": "hi"}]);
    // (path, raw body, status, param)
    let raw_cases: Vec<(&str, Vec<u8>, u16, Option<&str>)> = vec![
        (chat, b"{\"messages\": [".to_vec(), 400, None),
        (chat, b"not json at all".to_vec(), 400, None),
        (chat, b"".to_vec(), 400, None),
        (chat, b"[1, 2, 3]".to_vec(), 400, None),
        (chat, b"{\"messages\": []} extra".to_vec(), 400, None),
        (comp, vec![0xff, 0xfe, b'{'], 400, None),
    ];
    let json_cases = vec![
        (chat, json!({"messages": 5}), 400, Some("messages")),
        (
            chat,
            json!({"messages": hi, "max_tokens": "ten"}),
            400,
            Some("max_tokens"),
        ),
        (
            chat,
            json!({"messages": hi, "temperature": "hot"}),
            400,
            Some("temperature"),
        ),
        (
            chat,
            json!({"messages": hi, "stream": "yes"}),
            400,
            Some("stream"),
        ),
        (
            chat,
            json!({"messages": hi, "stop": [1, 2]}),
            400,
            Some("stop"),
        ),
        (
            chat,
            json!({"model": "gpt-4o", "messages": hi}),
            404,
            Some("model"),
        ),
        (
            comp,
            json!({"model": "nope", "prompt": "x"}),
            404,
            Some("model"),
        ),
        (
            chat,
            json!({"messages": hi, "max_tokens": -1}),
            400,
            Some("max_tokens"),
        ),
        (
            chat,
            json!({"messages": hi, "max_tokens": 0}),
            400,
            Some("max_tokens"),
        ),
        (
            chat,
            json!({"messages": hi, "max_tokens": 1_000_000_000_000i64}),
            400,
            Some("max_tokens"),
        ),
        (
            chat,
            json!({"messages": hi, "max_tokens": 1e300}),
            400,
            Some("max_tokens"),
        ),
        (
            chat,
            json!({"messages": hi, "max_completion_tokens": 100000}),
            400,
            Some("max_completion_tokens"),
        ),
        (comp, json!({"prompt": long_text(600)}), 400, Some("prompt")),
        (
            chat,
            json!({"messages": [{"role": "user", "content": long_text(600)}]}),
            400,
            Some("messages"),
        ),
        (
            chat,
            json!({"messages": hi, "temperature": 5}),
            400,
            Some("temperature"),
        ),
        (
            chat,
            json!({"messages": hi, "top_p": 1.5}),
            400,
            Some("top_p"),
        ),
        (
            chat,
            json!({"messages": hi, "top_k": -5}),
            400,
            Some("top_k"),
        ),
        (chat, json!({"messages": hi, "n": 0}), 400, Some("n")),
        (chat, json!({"messages": hi, "n": 1000}), 400, Some("n")),
        (
            chat,
            json!({"messages": hi, "presence_penalty": 3}),
            400,
            Some("presence_penalty"),
        ),
        (
            chat,
            json!({"messages": hi, "logprobs": true, "top_logprobs": 50}),
            400,
            Some("top_logprobs"),
        ),
        (
            chat,
            json!({"messages": hi, "top_logprobs": 2}),
            400,
            Some("top_logprobs"),
        ),
        (
            chat,
            json!({"messages": hi, "logit_bias": {"abc": 1}}),
            400,
            Some("logit_bias"),
        ),
        (
            chat,
            json!({"messages": hi, "logit_bias": {"5": 1000}}),
            400,
            Some("logit_bias"),
        ),
        (
            chat,
            json!({"messages": hi, "stop": vec!["x"; 40]}),
            400,
            Some("stop"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "p", "stop": ["ok", "y".repeat(1025)]}),
            400,
            Some("stop"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "p", "max_completion_tokens": 1_000_000}),
            400,
            Some("max_completion_tokens"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "p", "max_tokens": 1_000_000}),
            400,
            Some("max_tokens"),
        ),
        (
            chat,
            json!({"messages": hi, "tool_choice": "required", "tools": []}),
            400,
            Some("tool_choice"),
        ),
        (
            chat,
            json!({"messages": hi, "tools": "all"}),
            400,
            Some("tools"),
        ),
        (
            chat,
            json!({"messages": hi, "tools": [{"type": "function", "function": {"description": "no name"}}]}),
            400,
            Some("tools"),
        ),
        (
            chat,
            json!({"messages": hi, "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": 7}}}}),
            400,
            Some("response_format"),
        ),
        // An allOf through a $ref to itself, and a property name of 60,000 characters: refused
        // (each once overflowed a thread's stack, which ends the process).
        (
            chat,
            json!({"messages": hi, "response_format": {"type": "json_schema", "json_schema": {"schema":
                {"allOf": [{"$ref": "#/$defs/a"}], "$defs": {"a": {"$ref": "#/$defs/a"}}}}}}),
            400,
            Some("response_format"),
        ),
        (
            chat,
            json!({"messages": hi, "response_format": {"type": "json_schema", "json_schema": {"schema":
                {"type": "object", "properties": {"a".repeat(60_000): {}}, "additionalProperties": true}}}}),
            400,
            Some("response_format"),
        ),
        (
            chat,
            json!({"messages": [{"role": "wizard", "content": "hi"}]}),
            400,
            Some("messages"),
        ),
        (chat, json!({"messages": []}), 400, Some("messages")),
        (
            chat,
            json!({"messages": [{"content": "no role"}]}),
            400,
            Some("messages"),
        ),
        (chat, json!({}), 400, Some("messages")),
        (
            chat,
            json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x.png"}}]}]}),
            400,
            Some("messages"),
        ),
        (
            chat,
            json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image"}]}]}),
            400,
            Some("messages"),
        ),
        (
            chat,
            json!({"messages": [{"role": "system", "content": "a"}, {"role": "developer", "content": "b"}, {"role": "user", "content": "hi"}]}),
            400,
            Some("messages"),
        ),
        (comp, json!({}), 400, Some("prompt")),
        (comp, json!({"prompt": [1, 2, 99999]}), 400, Some("prompt")),
        (comp, json!({"prompt": [-1]}), 400, Some("prompt")),
        (comp, json!({"prompt": [[1], "x"]}), 400, Some("prompt")),
        (
            comp,
            json!({"prompt": "x", "logprobs": true}),
            400,
            Some("logprobs"),
        ),
        (
            chat,
            json!({"messages": [{"role": "user", "content": "hi"}], "echo": true}),
            400,
            Some("echo"),
        ),
        (
            comp,
            json!({"prompt": "x", "max_tokens": 0}),
            400,
            Some("max_tokens"),
        ),
        (comp, json!({"prompt": "", "max_tokens": 1}), 200, None),
    ];

    for (path, body, status, param) in raw_cases {
        let r = request(&s.addr, "POST", path, &[], &body).await;
        let e = r.openai_error(status);
        assert_eq!(
            e["param"].as_str(),
            param,
            "{path} {:?}: {e}",
            String::from_utf8_lossy(&body)
        );
    }
    for (path, body, status, param) in json_cases {
        let r = s.post(path, &body).await;
        if status == 200 {
            assert_eq!(
                r.status,
                200,
                "{body}: {}",
                String::from_utf8_lossy(&r.body)
            );
            continue;
        }
        let e = r.openai_error(status);
        assert_eq!(e["param"].as_str(), param, "{path} {body}: {e}");
    }
    // A forced tool call with no tools, or naming a tool not offered, against a tool_choice
    // that means nothing.
    for (choice, code) in [
        (json!("required"), "invalid_value"),
        (
            json!({"type": "function", "function": {"name": "f"}}),
            "invalid_value",
        ),
        (json!({"type": "function"}), "invalid_value"),
        (json!("bogus"), "invalid_value"),
        (json!(7), "invalid_value"),
    ] {
        let e = s
            .post(chat, &json!({"messages": hi, "tool_choice": choice}))
            .await
            .openai_error(400);
        assert_eq!(e["code"], code, "{choice}: {e}");
    }
    // Over the body limit: 413, whether the length is announced or not.
    let big = json!({"prompt": "x".repeat(100 << 10)}).to_string();
    let r = request(&s.addr, "POST", comp, &[], big.as_bytes()).await;
    assert_eq!(r.openai_error(413)["code"], "request_too_large");
    // A prompt over the context says so in OpenAI's words.
    let e = s
        .post(comp, &json!({"prompt": long_text(600)}))
        .await
        .openai_error(400);
    assert_eq!(e["code"], "context_length_exceeded");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("maximum context length is 512")
    );

    // The streams were not disturbed.
    for t in streams {
        let chunks = t.await.unwrap();
        let last = chunks.last().unwrap();
        assert_eq!(last["choices"][0]["finish_reason"], "length", "{last}");
        let n = chunks
            .iter()
            .filter(|c| c["choices"][0]["delta"].get("role").is_none())
            .count();
        assert!(n > 1);
    }
    // And the server still serves.
    let r = s
        .post(
            comp,
            &json!({"prompt": "still here", "max_tokens": 3, "ignore_eos": true}),
        )
        .await;
    assert_eq!(r.json()["usage"]["completion_tokens"], 3);
}
