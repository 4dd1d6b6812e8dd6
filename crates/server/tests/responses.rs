//! `POST /v1/responses` (OpenAI's Responses API) runs the chat endpoint's path: the same answer
//! as `/v1/chat/completions` for the same conversation and seed, as a response object (output
//! items, status, usage) or as the Responses stream's events, whose deltas and `.done` items add
//! up to the whole response. Also llama-server's small endpoints: `input_tokens`,
//! `/apply-template`, `/props` and the other names of the chat and health endpoints.

mod common;

use common::{Opts, Server};
use serde_json::{Value, json};

fn pinned() -> Value {
    json!({"current_date": "2026-08-15"})
}

/// A response's output items from a stream's events, checking their order: `response.created`,
/// `response.in_progress`, items added at consecutive indexes, each given deltas of its kind and
/// finished (`.done`) before the next is added, then `response.completed` or
/// `response.incomplete`, every event numbered in order. Returns the items and the last event's
/// response.
async fn collect_response(s: &Server, body: &Value) -> (Vec<Value>, Value) {
    let mut st = s.stream("/v1/responses", body).await;
    assert_eq!(st.status(), 200);
    let mut events = Vec::new();
    while let Some(e) = st.next_event().await {
        events.push(e);
    }
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names[..2],
        ["response.created", "response.in_progress"],
        "{names:?}"
    );
    let last = *names.last().unwrap();
    assert!(
        last == "response.completed" || last == "response.incomplete",
        "{names:?}"
    );
    for (i, (n, d)) in events.iter().enumerate() {
        assert_eq!(d["type"], n.as_str(), "an event's data names its type");
        assert_eq!(d["sequence_number"], i, "{n}");
    }
    let id = events[0].1["response"]["id"].clone();
    assert!(id.as_str().unwrap().starts_with("resp_"), "{id}");
    let mut items: Vec<Value> = Vec::new();
    let mut open: Option<usize> = None;
    for (n, d) in &events[2..events.len() - 1] {
        let at = d["output_index"].as_u64().map(|i| i as usize);
        match n.as_str() {
            "response.output_item.added" => {
                assert_eq!(open, None, "an item added while another is open: {d}");
                assert_eq!(at, Some(items.len()), "{d}");
                open = at;
                let mut item = d["item"].clone();
                assert_eq!(item["status"], "in_progress");
                if item["type"] != "function_call" {
                    item["content"] = json!([]);
                }
                items.push(item);
            }
            "response.content_part.added" => {
                let i = open.expect("a part outside an item");
                assert_eq!(at, Some(i));
                items[i]["content"]
                    .as_array_mut()
                    .unwrap()
                    .push(d["part"].clone());
            }
            "response.output_text.delta" | "response.reasoning_text.delta" => {
                let i = open.expect("a delta outside an item");
                assert_eq!(at, Some(i));
                assert_eq!(d["item_id"], items[i]["id"]);
                let want = if n == "response.output_text.delta" {
                    "message"
                } else {
                    "reasoning"
                };
                assert_eq!(items[i]["type"], want, "{n}");
                let part = &mut items[i]["content"][0];
                let so_far = part["text"].as_str().unwrap().to_string();
                part["text"] = json!(so_far + d["delta"].as_str().unwrap());
            }
            "response.function_call_arguments.delta" => {
                let i = open.expect("a delta outside an item");
                assert_eq!(items[i]["type"], "function_call");
                let so_far = items[i]["arguments"].as_str().unwrap().to_string();
                items[i]["arguments"] = json!(so_far + d["delta"].as_str().unwrap());
            }
            "response.output_text.done"
            | "response.reasoning_text.done"
            | "response.content_part.done" => {
                let i = open.expect("a done outside an item");
                assert_eq!(at, Some(i));
                let text = if n == "response.content_part.done" {
                    &d["part"]["text"]
                } else {
                    &d["text"]
                };
                assert_eq!(*text, items[i]["content"][0]["text"], "{n}");
            }
            "response.function_call_arguments.done" => {
                let i = open.expect("a done outside an item");
                assert_eq!(d["arguments"], items[i]["arguments"]);
            }
            "response.output_item.done" => {
                let i = open.expect("a done outside an item");
                assert_eq!(at, Some(i));
                let mut folded = items[i].clone();
                folded["status"] = json!("completed");
                assert_eq!(d["item"], folded, "the item's deltas add up to its done");
                items[i] = folded;
                open = None;
            }
            other => panic!("unexpected event {other}: {d}"),
        }
    }
    assert_eq!(open, None, "an item left open");
    let r = events.last().unwrap().1["response"].clone();
    assert_eq!(r["id"], id);
    (items, r)
}

fn chat_text(want: &Value) -> (String, String) {
    let m = &want["choices"][0]["message"];
    (
        m["content"].as_str().unwrap_or("").to_string(),
        m["reasoning_content"].as_str().unwrap_or("").to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_answers_as_the_chat_endpoint_whole_and_streamed() {
    let s = Server::start(Opts::default()).await;
    for seed in 0..3 {
        let chat = json!({"messages": [{"role": "system", "content": "Be brief."},
                                       {"role": "user", "content": "Hello there"}],
                          "max_tokens": 48, "seed": seed, "chat_template_kwargs": pinned()});
        let want = s.post("/v1/chat/completions", &chat).await.json();
        let body = json!({"instructions": "Be brief.",
                          "input": [{"role": "user", "content": [{"type": "input_text", "text": "Hello there"}]}],
                          "max_output_tokens": 48, "seed": seed, "chat_template_kwargs": pinned()});
        let r = s.post("/v1/responses", &body).await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        let r = r.json();
        assert_eq!(r["object"], "response");
        assert!(r["id"].as_str().unwrap().starts_with("resp_"), "{r}");
        let (text, reasoning) = chat_text(&want);
        assert!(
            !(text.is_empty() && reasoning.is_empty()),
            "seed {seed}: an empty answer tests little: {want}"
        );
        let output = r["output"].as_array().unwrap();
        let of = |kind: &str| -> String {
            output
                .iter()
                .filter(|i| i["type"] == kind)
                .map(|i| i["content"][0]["text"].as_str().unwrap().to_string())
                .collect()
        };
        assert_eq!(of("message"), text, "seed {seed}");
        assert_eq!(of("reasoning"), reasoning, "seed {seed}");
        let finish = want["choices"][0]["finish_reason"].as_str().unwrap();
        match finish {
            "length" => {
                assert_eq!(r["status"], "incomplete");
                assert_eq!(r["incomplete_details"]["reason"], "max_output_tokens");
            }
            "stop" => assert_eq!(r["status"], "completed"),
            other => panic!("{other}"),
        }
        let u = &want["usage"];
        assert_eq!(r["usage"]["output_tokens"], u["completion_tokens"]);
        assert_eq!(r["usage"]["input_tokens"], u["prompt_tokens"]);
        assert_eq!(r["max_output_tokens"], 48);
        // Streamed: the same items (their ids included) and the same end.
        let mut sb = body.clone();
        sb["stream"] = json!(true);
        let (items, last) = collect_response(&s, &sb).await;
        let strip = |v: &Value| -> Value {
            let mut v = v.clone();
            for (i, item) in v.as_array_mut().unwrap().iter_mut().enumerate() {
                // Item ids are built on the response's id, fresh in each.
                let id = item["id"].as_str().unwrap().to_string();
                assert!(id.ends_with(&format!("_{i}")), "{id}");
                item["id"] = Value::Null;
            }
            v
        };
        assert_eq!(strip(&json!(items)), strip(&r["output"]), "seed {seed}");
        assert_eq!(last["output"], json!(items));
        assert_eq!(last["status"], r["status"]);
        assert_eq!(last["usage"]["output_tokens"], r["usage"]["output_tokens"]);
    }
}

/// A forced function call is a `function_call` item with the chat endpoint's arguments; its
/// output sent back as a `function_call_output` item goes on with the conversation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_function_call_and_its_output() {
    let s = Server::start(Opts {
        n_ctx: 4096,
        ..Opts::default()
    })
    .await;
    let params =
        json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]});
    let tools = json!([{"type": "function", "name": "get_weather", "description": "Weather of a city",
        "parameters": params}]);
    let mut used = 0;
    for seed in 0..5 {
        let body = json!({"input": "Weather in Paris?", "tools": tools, "tool_choice": "required",
                          "max_output_tokens": 320, "seed": seed, "chat_template_kwargs": pinned()});
        let r = s.post("/v1/responses", &body).await.json();
        if r["status"] == "incomplete" {
            continue;
        }
        let calls: Vec<&Value> = r["output"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| i["type"] == "function_call")
            .collect();
        assert!(!calls.is_empty(), "seed {seed}: {r}");
        let oai = s
            .post(
                "/v1/chat/completions",
                &json!({"messages": [{"role": "user", "content": "Weather in Paris?"}],
                        "tools": [{"type": "function", "function": {"name": "get_weather",
                            "description": "Weather of a city", "parameters": params}}],
                        "tool_choice": "required", "max_tokens": 320, "seed": seed,
                        "chat_template_kwargs": pinned()}),
            )
            .await
            .json();
        let want: Vec<Value> = oai["choices"][0]["message"]["tool_calls"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["function"]["arguments"].clone())
            .collect();
        let got: Vec<Value> = calls.iter().map(|c| c["arguments"].clone()).collect();
        assert_eq!(got, want, "seed {seed}");
        for c in &calls {
            assert_eq!(c["name"], "get_weather");
            assert!(c["call_id"].as_str().is_some_and(|i| !i.is_empty()));
            assert_eq!(c["id"], format!("fc_{}", c["call_id"].as_str().unwrap()));
        }
        let mut sb = body.clone();
        sb["stream"] = json!(true);
        let (items, _) = collect_response(&s, &sb).await;
        let no_ids = |v: &Value| -> Value {
            let mut v = v.clone();
            for i in v.as_array_mut().unwrap() {
                i["id"] = Value::Null;
                if i["type"] == "function_call" {
                    i["call_id"] = Value::Null;
                }
            }
            v
        };
        assert_eq!(no_ids(&json!(items)), no_ids(&r["output"]), "seed {seed}");
        used += 1;

        // The output goes back with the call; the conversation goes on.
        let mut input = vec![json!({"role": "user", "content": "Weather in Paris?"})];
        input.extend(r["output"].as_array().unwrap().iter().cloned());
        input.push(json!({"type": "function_call_output", "call_id": calls[0]["call_id"], "output": "Sunny, 21 C"}));
        let next = json!({"input": input, "tools": tools, "max_output_tokens": 8, "seed": seed,
                          "chat_template_kwargs": pinned()});
        let r2 = s.post("/v1/responses", &next).await;
        assert_eq!(r2.status, 200, "{}", String::from_utf8_lossy(&r2.body));
        let n = s.post("/v1/responses/input_tokens", &next).await.json();
        assert_eq!(n["object"], "response.input_tokens");
        assert_eq!(n["input_tokens"], r2.json()["usage"]["input_tokens"], "{n}");
    }
    assert!(used >= 2, "only {used} of 5 answers ended in a call");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_responses_requests_are_refused_by_name() {
    let s = Server::start(Opts::default()).await;
    for (body, param) in [
        (json!({"model": "x"}), "input"),
        (json!({"input": 3}), "input"),
        (
            json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:"}]}]}),
            "input",
        ),
        (
            json!({"input": "x", "previous_response_id": "resp_1"}),
            "previous_response_id",
        ),
        (
            json!({"input": "x", "tools": [{"type": "web_search"}]}),
            "tools",
        ),
        (
            json!({"input": "x", "max_output_tokens": -1}),
            "max_output_tokens",
        ),
        (
            json!({"input": "x", "text": {"format": {"type": "json_schema", "name": "x", "schema": 3}}}),
            "text.format",
        ),
        (json!({"input": "x", "temperature": "hot"}), "temperature"),
    ] {
        let r = s.post("/v1/responses", &body).await;
        let e = r.openai_error(400);
        assert_eq!(e["param"], param, "{body}: {e}");
    }
    let r = s
        .post(
            "/v1/responses",
            &json!({"input": "x", "model": "no-such-model"}),
        )
        .await;
    r.openai_error(404);
    // The server still serves.
    let r = s
        .post(
            "/v1/responses",
            &json!({"input": "Hi", "max_output_tokens": 2}),
        )
        .await;
    assert_eq!(r.status, 200);
}

/// llama-server's small endpoints: the chat's prompt as text and as a count, the server's
/// properties, and the chat and health endpoints under their other names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llama_servers_small_endpoints() {
    let s = Server::start(Opts {
        parallel: 3,
        ..Opts::default()
    })
    .await;
    let chat = json!({"messages": [{"role": "user", "content": "Hello there"}],
                      "chat_template_kwargs": pinned()});
    let t = s.post("/apply-template", &chat).await.json();
    let prompt = t["prompt"].as_str().unwrap();
    assert!(prompt.contains("Hello there"), "{prompt}");
    // The prompt's text is the tokens /tokenize gives for the conversation, and as many as
    // the chat endpoint's usage counts.
    let ids = s.post("/tokenize", &chat).await.json()["tokens"].clone();
    let text = s.post("/detokenize", &json!({"tokens": ids})).await.json();
    assert_eq!(text["content"], prompt);
    let n = s
        .post("/v1/chat/completions/input_tokens", &chat)
        .await
        .json();
    assert_eq!(n["input_tokens"], ids.as_array().unwrap().len());
    let mut one = chat.clone();
    one["max_tokens"] = json!(1);
    let u = s.post("/chat/completions", &one).await.json();
    assert_eq!(u["usage"]["prompt_tokens"], n["input_tokens"]);
    assert_eq!(u["object"], "chat.completion");

    let p = s.get("/props").await.json();
    assert_eq!(p["total_slots"], 3);
    assert_eq!(
        p["default_generation_settings"]["n_ctx"],
        s.get("/v1/models").await.json()["data"][0]["max_model_len"]
    );
    assert!(p["chat_template"].as_str().unwrap().contains("message"));
    assert_eq!(
        p["model_alias"],
        s.get("/models").await.json()["data"][0]["id"]
    );
    assert_eq!(s.get("/v1/health").await.json()["status"], "ok");
    // Without a template's conversation: a 400 naming the field.
    let r = s.post("/apply-template", &json!({"prompt": "x"})).await;
    assert_eq!(r.openai_error(400)["param"], "messages");
}
