//! `POST /v1/messages` (Anthropic's Messages API) runs the chat endpoint's path: the same
//! answer as `/v1/chat/completions` for the same conversation and seed, as an Anthropic message
//! (thinking, text and tool_use blocks, stop reason, usage) or as Anthropic's stream events,
//! whose deltas add up to the whole message; its errors are Anthropic's error objects.

mod common;

use common::{Opts, Server};
use serde_json::{Value, json};

fn pinned() -> Value {
    json!({"current_date": "2026-08-15"})
}

/// A message's content blocks from a stream's events, checking their order: `message_start`,
/// `ping`, blocks numbered from 0 each started, given deltas of its type and stopped before the
/// next, `message_delta`, `message_stop`. Returns the blocks and the `message_delta` event.
async fn collect_message(s: &Server, body: &Value) -> (Vec<Value>, Value) {
    let mut st = s.stream("/v1/messages", body).await;
    assert_eq!(st.status(), 200);
    let mut events = Vec::new();
    while let Some(e) = st.next_event().await {
        events.push(e);
    }
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names[..2], ["message_start", "ping"], "{names:?}");
    assert_eq!(
        names[names.len() - 2..],
        ["message_delta", "message_stop"],
        "{names:?}"
    );
    for (n, d) in &events {
        assert_eq!(d["type"], n.as_str(), "an event's data names its type");
    }
    let start = &events[0].1["message"];
    assert_eq!(
        (start["role"].clone(), start["content"].clone()),
        (json!("assistant"), json!([]))
    );
    let mut blocks: Vec<Value> = Vec::new();
    let mut open: Option<usize> = None;
    for (n, d) in &events[2..events.len() - 2] {
        match n.as_str() {
            "content_block_start" => {
                assert_eq!(open, None, "a block starts while another is open: {d}");
                assert_eq!(d["index"], blocks.len(), "{d}");
                open = Some(blocks.len());
                let mut b = d["content_block"].clone();
                if b["type"] == "tool_use" {
                    b["input"] = json!("");
                }
                blocks.push(b);
            }
            "content_block_delta" => {
                let i = open.expect("a delta outside a block");
                assert_eq!(d["index"], i);
                let b = &mut blocks[i];
                let delta = &d["delta"];
                let (field, piece) =
                    match (b["type"].as_str().unwrap(), delta["type"].as_str().unwrap()) {
                        ("text", "text_delta") => ("text", &delta["text"]),
                        ("thinking", "thinking_delta") => ("thinking", &delta["thinking"]),
                        ("thinking", "signature_delta") => ("signature", &delta["signature"]),
                        ("tool_use", "input_json_delta") => ("input", &delta["partial_json"]),
                        other => panic!("a delta of the wrong type: {other:?}"),
                    };
                let so_far = b[field].as_str().unwrap_or_default().to_string();
                b[field] = json!(so_far + piece.as_str().unwrap());
            }
            "content_block_stop" => {
                assert_eq!(Some(d["index"].as_u64().unwrap() as usize), open);
                open = None;
            }
            other => panic!("unexpected event {other}: {d}"),
        }
    }
    assert_eq!(open, None, "a block left open");
    for b in &mut blocks {
        if b["type"] == "tool_use" {
            b["input"] = serde_json::from_str(b["input"].as_str().unwrap()).unwrap();
        }
    }
    (blocks, events[events.len() - 2].1.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_answers_as_the_chat_endpoint_whole_and_streamed() {
    let s = Server::start(Opts::default()).await;
    let model = s.get("/v1/models").await.json()["data"][0]["id"].clone();
    for seed in 0..3 {
        let chat = json!({"messages": [{"role": "system", "content": "Be brief."},
                                       {"role": "user", "content": "Hello there"}],
                          "max_tokens": 48, "seed": seed, "chat_template_kwargs": pinned()});
        let want = s.post("/v1/chat/completions", &chat).await.json();
        let body = json!({"model": model, "system": [{"type": "text", "text": "Be brief."}],
                          "messages": [{"role": "user", "content": [{"type": "text", "text": "Hello there"}]}],
                          "max_tokens": 48, "seed": seed, "chat_template_kwargs": pinned()});
        let r = s.post("/v1/messages", &body).await;
        assert_eq!(r.status, 200);
        let m = r.json();
        assert_eq!(
            (m["type"].clone(), m["role"].clone()),
            (json!("message"), json!("assistant"))
        );
        assert!(m["id"].as_str().unwrap().starts_with("msg_"), "{m}");
        let c = &want["choices"][0];
        let mut blocks = Vec::new();
        if let Some(r) = c["message"]["reasoning_content"]
            .as_str()
            .filter(|r| !r.is_empty())
        {
            blocks.push(json!({"type": "thinking", "thinking": r, "signature": ""}));
        }
        if let Some(t) = c["message"]["content"].as_str().filter(|t| !t.is_empty()) {
            blocks.push(json!({"type": "text", "text": t}));
        }
        assert!(
            !blocks.is_empty(),
            "seed {seed}: an empty answer tests little: {want}"
        );
        assert_eq!(m["content"], json!(blocks), "seed {seed}");
        let reason = match c["finish_reason"].as_str().unwrap() {
            "length" => "max_tokens",
            "stop" => "end_turn",
            other => panic!("{other}"),
        };
        assert_eq!(m["stop_reason"], reason);
        assert_eq!(m["stop_sequence"], Value::Null);
        let u = &want["usage"];
        assert_eq!(m["usage"]["output_tokens"], u["completion_tokens"]);
        assert_eq!(
            m["usage"]["input_tokens"].as_u64().unwrap()
                + m["usage"]["cache_read_input_tokens"].as_u64().unwrap(),
            u["prompt_tokens"].as_u64().unwrap()
        );

        let mut sb = body.clone();
        sb["stream"] = json!(true);
        let (streamed, delta) = collect_message(&s, &sb).await;
        assert_eq!(
            json!(streamed),
            m["content"],
            "seed {seed}: the stream's blocks"
        );
        assert_eq!(delta["delta"]["stop_reason"], reason);
        assert_eq!(delta["usage"]["output_tokens"], u["completion_tokens"]);
    }
    // The prompt the answer ran on, counted.
    let count = s
        .post(
            "/v1/messages/count_tokens",
            &json!({"model": model, "system": "Be brief.", "chat_template_kwargs": pinned(),
                    "messages": [{"role": "user", "content": "Hello there"}]}),
        )
        .await
        .json();
    let tokenized = s
        .post(
            "/tokenize",
            &json!({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}],
                    "chat_template_kwargs": pinned()}),
        )
        .await
        .json();
    assert_eq!(count["input_tokens"], tokenized["count"], "{count}");
}

/// A stop sequence ends the answer before it: `stop_reason` "stop_sequence", with the string.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_sequence_is_named_as_the_stop_reason() {
    let s = Server::start(Opts::default()).await;
    let body = json!({"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 60, "seed": 9,
                      "temperature": 1.0, "ignore_eos": true});
    let first = s.post("/v1/messages", &body).await.json();
    let text = first["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "text")
        .and_then(|b| b["text"].as_str())
        .unwrap_or_else(|| panic!("no text: {first}"))
        .to_string();
    let chars: Vec<char> = text.chars().collect();
    assert!(chars.len() > 20, "{text:?}");
    let stop: String = chars[12..15].iter().collect();
    let at = text.find(&stop).unwrap();
    let mut b = body.clone();
    b["stop_sequences"] = json!([stop, "never-appears-xyz"]);
    let m = s.post("/v1/messages", &b).await.json();
    assert_eq!(m["stop_reason"], "stop_sequence", "{m}");
    assert_eq!(m["stop_sequence"], json!(stop));
    let cut = m["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "text")
        .unwrap();
    assert_eq!(cut["text"], json!(text[..at]));
    b["stream"] = json!(true);
    let (blocks, delta) = collect_message(&s, &b).await;
    assert_eq!(json!(blocks), m["content"]);
    assert_eq!(delta["delta"]["stop_reason"], "stop_sequence");
    assert_eq!(delta["delta"]["stop_sequence"], json!(stop));
}

/// `tool_choice: {"type": "any"}` forces a call of an offered tool: its `tool_use` block's
/// input is the call's arguments as an object (of the tool's schema), `stop_reason` "tool_use";
/// the call's result goes back as a `tool_result` and the conversation goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_tool_use_and_its_result() {
    let s = Server::start(Opts {
        n_ctx: 4096,
        ..Opts::default()
    })
    .await;
    let tools = json!([{"name": "get_weather", "description": "Weather of a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]);
    let mut used = 0;
    for seed in 0..5 {
        let body = json!({"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": tools,
                          "tool_choice": {"type": "any"}, "max_tokens": 320, "seed": seed,
                          "chat_template_kwargs": pinned()});
        let m = s.post("/v1/messages", &body).await.json();
        if m["stop_reason"] == "max_tokens" {
            continue;
        }
        assert_eq!(m["stop_reason"], "tool_use", "seed {seed}: {m}");
        let content = m["content"].as_array().unwrap();
        let calls: Vec<&Value> = content.iter().filter(|b| b["type"] == "tool_use").collect();
        assert!(!calls.is_empty(), "{m}");
        // The chat endpoint's calls for the same conversation and seed, argument for argument
        // (the call ids are fresh each time). The ATEM grammar, as llama.cpp's, leaves every
        // parameter optional.
        let oai = s
            .post(
                "/v1/chat/completions",
                &json!({"messages": [{"role": "user", "content": "Weather in Paris?"}],
                        "tools": [{"type": "function", "function": {"name": "get_weather",
                            "description": "Weather of a city", "parameters": tools[0]["input_schema"]}}],
                        "tool_choice": "required", "max_tokens": 320, "seed": seed,
                        "chat_template_kwargs": pinned()}),
            )
            .await
            .json();
        let want: Vec<Value> = oai["choices"][0]["message"]["tool_calls"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| serde_json::from_str(c["function"]["arguments"].as_str().unwrap()).unwrap())
            .collect();
        let got: Vec<Value> = calls.iter().map(|c| c["input"].clone()).collect();
        assert_eq!(got, want, "seed {seed}");
        for c in &calls {
            assert_eq!(c["name"], "get_weather");
            let input = c["input"].as_object().unwrap();
            assert!(
                input.keys().all(|k| k == "city") && input.get("city").is_none_or(Value::is_string),
                "{m}"
            );
            assert!(c["id"].as_str().is_some_and(|i| !i.is_empty()), "{m}");
        }
        let mut sb = body.clone();
        sb["stream"] = json!(true);
        let (blocks, delta) = collect_message(&s, &sb).await;
        // The same blocks, but for the calls' ids, fresh in each response.
        let no_ids = |v: &Value| -> Value {
            let mut v = v.clone();
            for b in v.as_array_mut().unwrap() {
                if b["type"] == "tool_use" {
                    assert!(
                        b["id"].as_str().is_some_and(|i| i.starts_with("call_")),
                        "{b}"
                    );
                    b["id"] = Value::Null;
                }
            }
            v
        };
        assert_eq!(no_ids(&json!(blocks)), no_ids(&m["content"]), "seed {seed}");
        assert_eq!(delta["delta"]["stop_reason"], "tool_use");
        used += 1;

        // The result, sent back: the conversation goes on (the model answers or calls again).
        let id = calls[0]["id"].clone();
        let next = json!({"messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": m["content"]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": "Sunny, 21 C"}]}],
            "tools": tools, "max_tokens": 8, "seed": seed, "chat_template_kwargs": pinned()});
        let r = s.post("/v1/messages", &next).await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        let n = s.post("/v1/messages/count_tokens", &next).await.json();
        // Counting the tokens reads the same prompt the request was answered from (Anthropic's
        // `input_tokens` leaves out those read from the prefix cache).
        let u = r.json()["usage"].clone();
        assert_eq!(
            n["input_tokens"].as_u64(),
            Some(
                u["input_tokens"].as_u64().unwrap()
                    + u["cache_read_input_tokens"].as_u64().unwrap()
            ),
            "{n} {u}"
        );
        assert!(n["input_tokens"].as_u64().unwrap() > 0, "{n}");
    }
    assert!(used >= 2, "only {used} of 5 answers ended in a call");
}

/// Bad requests are Anthropic's error objects (`{"type": "error", "error": {"type", "message"}}`)
/// naming the problem, and the server goes on serving; `x-api-key` is read as the API key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_messages_are_anthropic_errors() {
    let s = Server::start(Opts::default()).await;
    let err = |r: common::Resp, status: u16| -> Value {
        assert_eq!(r.status, status, "{}", String::from_utf8_lossy(&r.body));
        let v = r.json();
        assert_eq!(v["type"], "error", "{v}");
        assert!(v["error"]["message"].is_string(), "{v}");
        v["error"].clone()
    };
    let user = json!([{"role": "user", "content": "hi"}]);
    for (body, status, kind, says) in [
        (
            json!({"max_tokens": 4}),
            400,
            "invalid_request_error",
            "messages",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}),
            400,
            "invalid_request_error",
            "image",
        ),
        (
            json!({"messages": user, "tools": [{"type": "bash_20250124", "name": "bash"}]}),
            400,
            "invalid_request_error",
            "bash_20250124",
        ),
        (
            json!({"messages": user, "temperature": 9}),
            400,
            "invalid_request_error",
            "temperature",
        ),
        (
            json!({"messages": user, "max_tokens": "x"}),
            400,
            "invalid_request_error",
            "max_tokens",
        ),
        (
            json!({"messages": user, "model": "claude-other"}),
            404,
            "not_found_error",
            "claude-other",
        ),
        (
            json!({"messages": user, "tool_choice": {"type": "any"}}),
            400,
            "invalid_request_error",
            "no tools",
        ),
    ] {
        let e = err(s.post("/v1/messages", &body).await, status);
        assert_eq!(e["type"], kind, "{body}: {e}");
        assert!(e["message"].as_str().unwrap().contains(says), "{body}: {e}");
    }
    let raw = common::request(&s.addr, "POST", "/v1/messages", &[], b"{not json").await;
    err(raw, 400);
    let ok = s
        .post("/v1/messages", &json!({"messages": user, "max_tokens": 2}))
        .await;
    assert_eq!(ok.status, 200);

    let keyed = Server::start(Opts {
        api_key: Some("sekrit".into()),
        ..Opts::default()
    })
    .await;
    let body = json!({"messages": user, "max_tokens": 2}).to_string();
    let r = common::request(
        &keyed.addr,
        "POST",
        "/v1/messages",
        &[("x-api-key", "sekrit")],
        body.as_bytes(),
    )
    .await;
    assert_eq!(r.status, 200);
    let r = common::request(
        &keyed.addr,
        "POST",
        "/v1/messages",
        &[("x-api-key", "wrong")],
        body.as_bytes(),
    )
    .await;
    assert_eq!(r.status, 401);
}
