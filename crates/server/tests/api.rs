//! The OpenAI protocol against a live server on a fixture model (random weights: the text is
//! noise, so these check shapes, counts, determinism and stop handling, not quality).

mod common;

use common::{MODEL, Opts, Server, long_text, request};
use muser_engine::NumericMode;
use serde_json::{Value, json};

/// POST a completion from a task of its own (to run beside others).
fn spawn_completion(addr: &str, body: Value) -> tokio::task::JoinHandle<common::Resp> {
    let addr = addr.to_string();
    tokio::spawn(async move {
        request(
            &addr,
            "POST",
            "/v1/completions",
            &[],
            body.to_string().as_bytes(),
        )
        .await
    })
}

fn text_of(v: &Value) -> String {
    v["choices"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_health_tokenize_detokenize() {
    let s = Server::start(Opts::default()).await;
    let h = s.get("/health").await;
    assert_eq!((h.status, h.json()["status"].clone()), (200, json!("ok")));
    let m = s.get("/v1/models").await.json();
    assert_eq!(m["object"], "list");
    assert_eq!(m["data"][0]["id"], MODEL);
    assert_eq!(m["data"][0]["object"], "model");
    assert_eq!(
        s.get(&format!("/v1/models/{MODEL}")).await.json()["id"],
        MODEL
    );
    s.get("/v1/models/gpt-4").await.openai_error(404);
    s.get("/v1/nothing").await.openai_error(404);
    s.get("/v1/chat/completions").await.openai_error(405);

    let t = s
        .post("/tokenize", &json!({"content": "Hello world"}))
        .await;
    assert_eq!(t.status, 200);
    let t = t.json();
    let ids: Vec<i64> = t["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_i64().unwrap())
        .collect();
    assert_eq!(t["count"], ids.len());
    let no_bos = s
        .post(
            "/tokenize",
            &json!({"prompt": "Hello world", "add_special": false}),
        )
        .await
        .json();
    assert_eq!(
        no_bos["tokens"],
        json!(ids[1..]),
        "BOS first (the model's add_bos_token)"
    );
    let d = s
        .post("/detokenize", &json!({"tokens": ids[1..]}))
        .await
        .json();
    assert_eq!(d["content"], "Hello world");
    let d = s
        .post("/detokenize", &json!({"tokens": ids, "skip_special": true}))
        .await
        .json();
    assert_eq!(d["content"], "Hello world");
    let p = s
        .post("/tokenize", &json!({"content": "Hi", "with_pieces": true}))
        .await
        .json();
    assert!(p["tokens"][0]["piece"].is_string() && p["tokens"][0]["id"].is_number());
    // Chat through the template: the count the chat endpoint reports as prompt_tokens.
    let msgs = json!([{"role": "user", "content": "Hello"}]);
    let tc = s.post("/tokenize", &json!({"messages": msgs})).await.json();
    let c = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": msgs, "max_tokens": 1}),
        )
        .await
        .json();
    assert_eq!(c["usage"]["prompt_tokens"], tc["count"]);
    // A tool without description or parameters is completed as chat completes it (before, the
    // template failed on it here); an image part is refused as chat refuses it.
    let tools = json!([{"type": "function", "function": {"name": "f"}}]);
    let tc = s
        .post("/tokenize", &json!({"messages": msgs, "tools": tools}))
        .await
        .json();
    let full = json!([{"type": "function", "function": {"name": "f", "description": "",
        "parameters": {"type": "object", "properties": {}}}}]);
    let tf = s
        .post("/tokenize", &json!({"messages": msgs, "tools": full}))
        .await
        .json();
    assert!(tc["count"].as_u64().unwrap() > 0);
    assert_eq!(tc["tokens"], tf["tokens"]);
    let image =
        json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]);
    s.post("/tokenize", &json!({"messages": image}))
        .await
        .openai_error(400);
    s.post("/detokenize", &json!({"tokens": [1, 99999]}))
        .await
        .openai_error(400);
    s.post("/tokenize", &json!({})).await.openai_error(400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_shape_usage_and_max_tokens() {
    let s = Server::start(Opts::default()).await;
    let body = json!({"model": MODEL, "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}],
                      "max_tokens": 8, "seed": 3, "ignore_eos": true});
    let r = s.post("/v1/chat/completions", &body).await;
    assert_eq!(r.status, 200);
    assert!(r.header("x-request-id").is_some());
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(v["model"], MODEL);
    let c = &v["choices"][0];
    assert_eq!(c["index"], 0);
    assert_eq!(c["message"]["role"], "assistant");
    assert!(c["message"]["content"].is_string());
    assert_eq!(c["finish_reason"], "length");
    assert_eq!(c["logprobs"], Value::Null);
    let u = &v["usage"];
    assert_eq!(u["completion_tokens"], 8);
    assert!(u["prompt_tokens"].as_u64().unwrap() > 5);
    assert_eq!(
        u["total_tokens"].as_u64(),
        Some(u["prompt_tokens"].as_u64().unwrap() + 8)
    );
    // max_completion_tokens wins over max_tokens; without ignore_eos a stop token may end early.
    let v = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 50, "max_completion_tokens": 3}),
        )
        .await
        .json();
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() <= 3);
    assert!(["stop", "length"].contains(&v["choices"][0]["finish_reason"].as_str().unwrap()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeds_reproduce_and_n_gives_distinct_choices() {
    let s = Server::start(Opts::default()).await;
    let body = json!({"prompt": "Once upon a time", "max_tokens": 24, "seed": 11, "temperature": 1.0, "ignore_eos": true});
    let a = s.post("/v1/completions", &body).await.json();
    let b = s.post("/v1/completions", &body).await.json();
    assert_eq!(a["object"], "text_completion");
    assert_eq!(text_of(&a), text_of(&b));
    assert_eq!(a["usage"]["completion_tokens"], 24);
    let mut other = body.clone();
    other["seed"] = json!(12);
    let c = s.post("/v1/completions", &other).await.json();
    assert_ne!(text_of(&a), text_of(&c), "another seed, another text");

    let mut nb = body.clone();
    nb["n"] = json!(3);
    let v = s.post("/v1/completions", &nb).await.json();
    let ch = v["choices"].as_array().unwrap();
    assert_eq!(ch.len(), 3);
    for (i, c) in ch.iter().enumerate() {
        assert_eq!(c["index"], i);
    }
    // Choice 0 uses the request's seed; the others differ from it.
    assert_eq!(ch[0]["text"], a["choices"][0]["text"]);
    assert_ne!(ch[0]["text"], ch[1]["text"]);
    assert_eq!(v["usage"]["completion_tokens"], 72);
    assert_eq!(
        v["usage"]["prompt_tokens"], a["usage"]["prompt_tokens"],
        "the prompt counts once"
    );

    // Several prompts: choices are prompt-major.
    let v = s
        .post(
            "/v1/completions",
            &json!({"prompt": ["one", "two"], "n": 2, "max_tokens": 2, "ignore_eos": true}),
        )
        .await
        .json();
    assert_eq!(v["choices"].as_array().unwrap().len(), 4);
    // Token-id prompts.
    let v = s
        .post(
            "/v1/completions",
            &json!({"prompt": [1, 40, 41], "max_tokens": 2}),
        )
        .await
        .json();
    assert_eq!(v["usage"]["prompt_tokens"], 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_sequences_match_solo_runs() {
    // The CPU accurate mode gives identical bits for any batch composition, so a seeded
    // request must not depend on what else runs.
    let s = Server::start(Opts::default()).await;
    let body = |seed: u64| json!({"prompt": format!("story {seed}"), "max_tokens": 40, "seed": seed, "temperature": 0.9, "ignore_eos": true});
    let mut solo = Vec::new();
    for seed in 0..4 {
        solo.push(text_of(
            &s.post("/v1/completions", &body(seed)).await.json(),
        ));
    }
    let tasks: Vec<_> = (0..4)
        .map(|seed| spawn_completion(&s.addr, body(seed)))
        .collect();
    for (seed, t) in tasks.into_iter().enumerate() {
        let r = t.await.unwrap();
        assert_eq!(text_of(&r.json()), solo[seed], "seed {seed}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_equals_whole_and_ends_with_done() {
    let s = Server::start(Opts::default()).await;
    let body = json!({"prompt": "The", "max_tokens": 30, "seed": 5, "ignore_eos": true});
    let whole = s.post("/v1/completions", &body).await.json();
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    sb["stream_options"] = json!({"include_usage": true});
    let mut st = s.stream("/v1/completions", &sb).await;
    assert_eq!(st.status(), 200);
    assert!(
        st.body
            .headers
            .iter()
            .any(|(k, v)| k == "content-type" && v.starts_with("text/event-stream"))
    );
    let chunks = st.collect().await;
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0))
        .filter_map(|c| c["text"].as_str())
        .collect();
    assert_eq!(text, text_of(&whole));
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    // (The second request may find the first's prompt in a kept cache: cached_tokens may differ.)
    for k in ["prompt_tokens", "completion_tokens", "total_tokens"] {
        assert_eq!(last["usage"][k], whole["usage"][k], "{k}");
    }
    let fin: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0))
        .filter(|c| !c["finish_reason"].is_null())
        .collect();
    assert_eq!(fin.len(), 1);
    assert_eq!(fin[0]["finish_reason"], "length");
    assert!(
        chunks[..chunks.len() - 1]
            .iter()
            .all(|c| c["usage"].is_null())
    );

    // Chat: a role delta first, content deltas, one finish, no usage unless asked.
    let mut st = s
        .stream(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 12, "seed": 1, "stream": true, "ignore_eos": true}),
        )
        .await;
    let chunks = st.collect().await;
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(chunks.iter().all(|c| c.get("usage").is_none()));
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    let whole = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 12, "seed": 1, "ignore_eos": true}),
        )
        .await
        .json();
    assert_eq!(
        streamed,
        whole["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or("")
    );
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_strings_end_the_text_and_are_not_emitted() {
    let s = Server::start(Opts::default()).await;
    let body = json!({"prompt": "Hello", "max_tokens": 60, "seed": 9, "temperature": 1.0, "ignore_eos": true});
    let full = text_of(&s.post("/v1/completions", &body).await.json());
    let chars: Vec<char> = full.chars().collect();
    assert!(chars.len() > 20, "{full:?}");
    // A piece of the middle of the text (maybe spanning tokens) as the stop string.
    let stop: String = chars[12..15].iter().collect();
    let at = full.find(&stop).unwrap();
    for stream in [false, true] {
        let mut b = body.clone();
        b["stop"] = json!([stop, "never-appears-xyz"]);
        b["stream"] = json!(stream);
        let (text, reason) = if stream {
            let mut st = s.stream("/v1/completions", &b).await;
            let ch = st.collect().await;
            let t: String = ch
                .iter()
                .filter_map(|c| c["choices"][0]["text"].as_str())
                .collect();
            let r = ch.last().unwrap()["choices"][0]["finish_reason"].clone();
            (t, r)
        } else {
            let v = s.post("/v1/completions", &b).await.json();
            (text_of(&v), v["choices"][0]["finish_reason"].clone())
        };
        assert_eq!(text, full[..at], "stream={stream}");
        assert_eq!(reason, "stop");
    }
}

/// A chat's stop string ends its answer (not shown), streamed or whole, and the engine stops
/// generating it: fewer completion tokens than asked, counted up to the stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_stop_strings_end_the_answer() {
    let s = Server::start(Opts::default()).await;
    let body = json!({"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 60, "seed": 9,
                      "temperature": 1.0, "ignore_eos": true});
    let first = s.post("/v1/chat/completions", &body).await.json();
    let full = first["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let chars: Vec<char> = full.chars().collect();
    assert!(chars.len() > 20, "{full:?}");
    let stop: String = chars[12..15].iter().collect();
    let at = full.find(&stop).unwrap();
    let mut counts = Vec::new();
    for stream in [false, true] {
        let mut b = body.clone();
        b["stop"] = json!([stop, "never-appears-xyz"]);
        b["stream"] = json!(stream);
        b["stream_options"] = if stream {
            json!({"include_usage": true})
        } else {
            Value::Null
        };
        let (text, reason, usage) = if stream {
            let mut st = s.stream("/v1/chat/completions", &b).await;
            let ch = st.collect().await;
            let t: String = ch
                .iter()
                .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
                .collect();
            let r = ch
                .iter()
                .filter_map(|c| c["choices"][0]["finish_reason"].as_str())
                .last()
                .map(str::to_string);
            let u = ch.last().unwrap()["usage"].clone();
            (t, r, u)
        } else {
            let v = s.post("/v1/chat/completions", &b).await.json();
            let t = v["choices"][0]["message"]["content"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let r = v["choices"][0]["finish_reason"]
                .as_str()
                .map(str::to_string);
            (t, r, v["usage"].clone())
        };
        assert_eq!(text, full[..at], "stream={stream}");
        assert_eq!(reason.as_deref(), Some("stop"), "stream={stream}");
        let n = usage["completion_tokens"].as_u64().unwrap();
        assert!(n < 60, "stream={stream}: the engine went on to {n} tokens");
        counts.push(n);
    }
    // The tokens up to the one that completed the stop, whatever the engine made after it
    // before it saw the flag: the same streamed or whole.
    assert_eq!(counts[0], counts[1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_for_chat_and_completions() {
    let s = Server::start(Opts::default()).await;
    let v = s
        .post(
            "/v1/completions",
            &json!({"prompt": "A", "max_tokens": 6, "logprobs": 3, "temperature": 0, "ignore_eos": true}),
        )
        .await
        .json();
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 6);
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), 6);
    assert_eq!(lp["text_offset"][0], 0);
    for (i, top) in lp["top_logprobs"].as_array().unwrap().iter().enumerate() {
        let top = top.as_object().unwrap();
        // Three names: tokens that are pieces of a character read "bytes:\\x..", not all "\u{fffd}".
        assert_eq!(top.len(), 3, "{top:?}");
        let best = top
            .values()
            .map(|x| x.as_f64().unwrap())
            .fold(f64::MIN, f64::max);
        // Greedy: the chosen token is the most likely one, under its own name in the map.
        let chosen = lp["token_logprobs"][i].as_f64().unwrap();
        assert!(
            chosen <= 0.0 && (chosen - best).abs() <= 1e-6,
            "{chosen} vs {best}"
        );
        let name = lp["tokens"][i].as_str().unwrap();
        assert_eq!(top[name].as_f64(), Some(chosen), "{name:?} in {top:?}");
    }
    // "hi" at temperature 0 starts with a piece of a character on the test model: the greedy
    // token's own entry, and 20 distinct alternatives.
    let v = s
        .post(
            "/v1/completions",
            &json!({"prompt": "hi", "max_tokens": 1, "logprobs": 20, "temperature": 0}),
        )
        .await
        .json();
    let lp = &v["choices"][0]["logprobs"];
    let top = lp["top_logprobs"][0].as_object().unwrap();
    assert_eq!(top.len(), 20, "{top:?}");
    let name = lp["tokens"][0].as_str().unwrap();
    assert!(name.starts_with("bytes:\\x"), "{name:?}");
    assert_eq!(top[name], lp["token_logprobs"][0], "{name:?} in {top:?}");

    let v = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5, "logprobs": true, "top_logprobs": 2, "ignore_eos": true, "seed": 4}),
        )
        .await
        .json();
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 5);
    for e in content {
        assert!(e["token"].is_string() && e["bytes"].is_array());
        assert!(e["logprob"].as_f64().unwrap() <= 0.0);
        assert_eq!(e["top_logprobs"].as_array().unwrap().len(), 2);
    }
    // Streamed: one logprobs entry per token across the chunks.
    let mut st = s
        .stream(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5, "logprobs": true, "ignore_eos": true, "seed": 4, "stream": true}),
        )
        .await;
    let n: usize = st
        .collect()
        .await
        .iter()
        .filter_map(|c| {
            c["choices"][0]["logprobs"]["content"]
                .as_array()
                .map(Vec::len)
        })
        .sum();
    assert_eq!(n, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_history_renders_and_tools_are_offered() {
    let s = Server::start(Opts {
        n_ctx: 4096,
        ..Opts::default()
    })
    .await;
    let tools = json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]);
    let messages = json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp_c\": 21}"}
    ]);
    let with_tools = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": messages, "tools": tools, "max_tokens": 4}),
        )
        .await;
    assert_eq!(
        with_tools.status,
        200,
        "{}",
        String::from_utf8_lossy(&with_tools.body)
    );
    let plain = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": messages, "max_tokens": 4}),
        )
        .await
        .json();
    assert!(
        with_tools.json()["usage"]["prompt_tokens"].as_u64()
            > plain["usage"]["prompt_tokens"].as_u64(),
        "the tool schema is in the prompt"
    );
    let none = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": messages, "tools": tools, "tool_choice": "none", "max_tokens": 1}),
        )
        .await;
    assert_eq!(none.status, 200);
    // A forced call of a tool that is not offered.
    let e = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": messages, "tools": tools,
                    "tool_choice": {"type": "function", "function": {"name": "get_time"}}}),
        )
        .await
        .openai_error(400);
    assert_eq!(e["param"], "tool_choice");
    // A function's description and parameters are optional in OpenAI's API: the template gets
    // "" and an empty object schema, as a tool that gave them.
    let bare = json!([{"type": "function", "function": {"name": "get_time"}}]);
    let filled = json!([{"type": "function", "function": {"name": "get_time", "description": "",
        "parameters": {"type": "object", "properties": {}}}}]);
    let prompt_tokens = |r: common::Resp| {
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        r.json()["usage"]["prompt_tokens"].as_u64()
    };
    let hi = json!([{"role": "user", "content": "What time is it?"}]);
    let a = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": hi, "tools": bare, "max_tokens": 1}),
        )
        .await;
    let b = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": hi, "tools": filled, "max_tokens": 1}),
        )
        .await;
    assert_eq!(prompt_tokens(a), prompt_tokens(b));
    // A developer message is the system prompt: the same prompt as with role system.
    let dev = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "developer", "content": "Be brief."},
            {"role": "user", "content": "hi"}], "max_tokens": 1}),
        )
        .await;
    let sys = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hi"}], "max_tokens": 1}),
        )
        .await;
    let plain = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}),
        )
        .await;
    let (dev, sys, plain) = (prompt_tokens(dev), prompt_tokens(sys), prompt_tokens(plain));
    assert_eq!(dev, sys);
    assert_ne!(
        dev, plain,
        "the developer message replaces the default system prompt"
    );
}

/// Prefix reuse: a prompt that begins with the tokens a finished sequence left in its slot
/// starts from there (`usage.prompt_tokens_details.cached_tokens`) and answers exactly as on a
/// server that runs it whole (the CPU accurate mode gives the same bits however a prompt is cut
/// into steps): after a sequence whose cache holds its prompt (max_tokens 1: the drawn token is
/// never run), after one whose cache holds one generated token more (the cache goes back one
/// position), and after one whose cache ran 20 tokens past the shared prefix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefix_reuse_answers_as_a_fresh_run() {
    let s = Server::start(Opts::default()).await;
    let fresh = Server::start(Opts {
        prefix_reuse: false,
        stall_timeout: std::time::Duration::from_secs(60),
        ..Opts::default()
    })
    .await;
    let more = s
        .token_ids(" and then the river turned north past the old mill", None)
        .await;
    for (i, (text, first_max)) in [
        ("Once upon a time a fox lived in a quiet wood", 1usize),
        ("Seven bakers argued about bread until dawn", 2),
        ("A lighthouse keeper counted ships every night", 20),
    ]
    .into_iter()
    .enumerate()
    {
        let head = s.token_ids(text, None).await;
        assert!(head.len() > 4, "{text}: {} tokens", head.len());
        let first = s
            .post(
                "/v1/completions",
                &json!({"prompt": head, "max_tokens": first_max, "temperature": 0, "ignore_eos": true}),
            )
            .await
            .json();
        // (It may find its first tokens in an earlier case's cache: prompts can share them.)
        let first_fresh = fresh
            .post(
                "/v1/completions",
                &json!({"prompt": head, "max_tokens": first_max, "temperature": 0, "ignore_eos": true}),
            )
            .await
            .json();
        assert_eq!(
            first["choices"][0]["text"], first_fresh["choices"][0]["text"],
            "case {i}"
        );
        let mut prompt = head.clone();
        prompt.extend(&more);
        let body = json!({"prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": true, "logprobs": 2});
        let got = s.post("/v1/completions", &body).await.json();
        let want = fresh.post("/v1/completions", &body).await.json();
        assert_eq!(
            got["choices"][0]["text"], want["choices"][0]["text"],
            "case {i}"
        );
        assert_eq!(
            got["choices"][0]["logprobs"], want["choices"][0]["logprobs"],
            "case {i}"
        );
        assert_eq!(
            got["usage"]["prompt_tokens"],
            want["usage"]["prompt_tokens"]
        );
        assert_eq!(want["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
        let cached = got["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap() as usize;
        match first_max {
            // The cache holds the prompt, or the prompt and the token drawn after its first
            // step, which differs from `more`'s first: the shared part is the prompt.
            1 | 2 => assert_eq!(cached, head.len(), "case {i}"),
            // 19 tokens past the prefix: reused only where the sliding rings still hold the
            // prefix's last window (kv::ring_allows_truncate), else run again.
            _ => assert!(cached == head.len() || cached == 0, "case {i}: {cached}"),
        }
    }
}

/// Caches kept for prefix reuse count against the KV budget: with room for one sequence's
/// reserve and half of another's kept cache, a sequence that shares nothing with a kept cache
/// clears it to fit (the first prompt, asked again, finds nothing cached), where the default
/// budget keeps it (the same prompt finds all but its last token).
#[tokio::test]
async fn kept_caches_count_against_the_kv_budget() {
    use muser_server::engine::KvCost;
    const GEN: usize = 4;
    let file = muser_engine::ModelFile::open(common::fixture(MODEL)).unwrap();
    let cost = KvCost::new(&file.config, muser_engine::KvType::F16).unwrap();
    let probe = Server::start(Opts::default()).await;
    // No BOS: the two prompts share no first token.
    let a = probe
        .token_ids("Once upon a time a fox lived in a quiet wood", Some(false))
        .await;
    let b = probe
        .token_ids("Seven bakers argued about bread until dawn", Some(false))
        .await;
    assert_ne!(a[0], b[0]);
    // A's kept cache: its prompt and the generated tokens fed back (all but the last).
    let kept_a = cost.bytes(a.len() + GEN - 1);
    let (ra, rb) = (cost.bytes(a.len() + GEN), cost.bytes(b.len() + GEN));
    let tight = rb + kept_a / 2;
    assert!(
        ra <= tight && rb + kept_a > tight,
        "{ra} {rb} {kept_a} {tight}"
    );
    for (budget, want) in [(None, a.len() - 1), (Some(tight), 0)] {
        let s = Server::start(Opts {
            parallel: 2,
            kv_budget: budget,
            ..Opts::default()
        })
        .await;
        let run = |p: &Vec<u64>| {
            let body =
                json!({"prompt": p, "max_tokens": GEN, "temperature": 0, "ignore_eos": true});
            let s = &s;
            async move { s.post("/v1/completions", &body).await.json() }
        };
        run(&a).await;
        run(&b).await;
        let again = run(&a).await;
        let cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap() as usize;
        assert_eq!(cached, want, "budget {budget:?}");
    }
}

/// A prompt that shares only its first token with a kept conversation takes an empty slot, so
/// the conversation is still there when it comes back (before, the one-token prefix won the
/// slot and cut the conversation's cache to it).
#[tokio::test]
async fn a_one_token_prefix_does_not_take_a_kept_conversation() {
    let s = Server::start(Opts {
        parallel: 2,
        ..Opts::default()
    })
    .await;
    let a = s
        .token_ids(
            "Once upon a time a fox lived in a quiet wood near the river and sang",
            Some(false),
        )
        .await;
    let mut b = vec![a[0]];
    b.extend(s.token_ids("Seven bakers argued", Some(false)).await);
    assert_ne!(a[1], b[1]);
    let run = |p: &Vec<u64>| {
        let body = json!({"prompt": p, "max_tokens": 4, "temperature": 0, "ignore_eos": true});
        let s = &s;
        async move { s.post("/v1/completions", &body).await.json() }
    };
    run(&a).await;
    run(&b).await;
    let again = run(&a).await;
    assert_eq!(
        again["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap() as usize,
        a.len() - 1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_prompts_are_chunked_while_streams_run() {
    let s = Server::start(Opts {
        step_tokens: 32,
        ..Opts::default()
    })
    .await;
    let mut st = s
        .stream(
            "/v1/completions",
            &json!({"prompt": "x", "max_tokens": 200, "ignore_eos": true, "stream": true, "seed": 2}),
        )
        .await;
    for _ in 0..3 {
        st.next().await.unwrap();
    }
    let prompt = long_text(150);
    let n = s
        .post("/tokenize", &json!({"content": prompt}))
        .await
        .json()["count"]
        .as_u64()
        .unwrap();
    assert!(n > 150 && n < 1000, "{n} tokens");
    let v = s
        .post(
            "/v1/completions",
            &json!({"prompt": prompt, "max_tokens": 2, "ignore_eos": true}),
        )
        .await
        .json();
    assert_eq!(v["usage"]["prompt_tokens"], n);
    let chunks = st.collect().await;
    let toks = chunks.len();
    assert!(toks > 100, "the stream went on: {toks} chunks");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parity_mode_runs_one_sequence_per_forward() {
    let s = Server::start(Opts {
        mode: NumericMode::Parity,
        ..Opts::default()
    })
    .await;
    let addr = s.addr.clone();
    let tasks: Vec<_> = (0..3)
        .map(|i| {
            let addr = addr.clone();
            tokio::spawn(async move {
                let b = json!({"prompt": format!("p{i}"), "max_tokens": 10, "ignore_eos": true, "seed": i});
                request(&addr, "POST", "/v1/completions", &[], b.to_string().as_bytes()).await
            })
        })
        .collect();
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.json()["usage"]["completion_tokens"], 10);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_without_a_template_refuses_chat() {
    let s = Server::start(Opts {
        template: false,
        ..Opts::default()
    })
    .await;
    let e = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "Hi"}]}),
        )
        .await
        .openai_error(400);
    assert_eq!(e["code"], "no_chat_template");
    let r = s
        .post("/v1/completions", &json!({"prompt": "Hi", "max_tokens": 2}))
        .await;
    assert_eq!(r.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_is_required_when_set() {
    let s = Server::start(Opts {
        api_key: Some("sekrit-key".into()),
        ..Opts::default()
    })
    .await;
    let e = s.get("/v1/models").await.openai_error(401);
    assert_eq!(e["code"], "invalid_api_key");
    let bad = request(
        &s.addr,
        "GET",
        "/v1/models",
        &[("Authorization", "Bearer sekrit-kez")],
        b"",
    )
    .await;
    bad.openai_error(401);
    let short = request(
        &s.addr,
        "GET",
        "/v1/models",
        &[("Authorization", "Bearer sekrit")],
        b"",
    )
    .await;
    short.openai_error(401);
    let ok = request(
        &s.addr,
        "GET",
        "/v1/models",
        &[("Authorization", "Bearer sekrit-key")],
        b"",
    )
    .await;
    assert_eq!(ok.status, 200);
    // The scheme is case-insensitive (RFC 7235).
    for scheme in ["bearer", "BEARER"] {
        let ok = request(
            &s.addr,
            "GET",
            "/v1/models",
            &[("Authorization", &format!("{scheme} sekrit-key"))],
            b"",
        )
        .await;
        assert_eq!(ok.status, 200, "{scheme}");
    }
    let body = json!({"prompt": "x", "max_tokens": 1}).to_string();
    let r = request(&s.addr, "POST", "/v1/completions", &[], body.as_bytes()).await;
    r.openai_error(401);
    let r = request(
        &s.addr,
        "POST",
        "/v1/completions",
        &[("Authorization", "Bearer sekrit-key")],
        body.as_bytes(),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(s.get("/health").await.status, 200, "health stays open");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_finishes_in_flight_streams() {
    let mut s = Server::start(Opts::default()).await;
    let mut st = s
        .stream(
            "/v1/completions",
            &json!({"prompt": "x", "max_tokens": 100, "ignore_eos": true, "stream": true}),
        )
        .await;
    st.next().await.unwrap();
    s.signal_stop();
    let chunks = st.collect().await;
    let fin = chunks.last().unwrap()["choices"][0]["finish_reason"].clone();
    assert_eq!(fin, "length", "the in-flight stream finished");
    s.stop().await.unwrap();
    assert!(
        tokio::net::TcpStream::connect(&s.addr).await.is_err(),
        "no longer listening"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_deadline_cancels_with_an_error_event() {
    let mut s = Server::start(Opts {
        grace: std::time::Duration::from_millis(300),
        n_ctx: 4096,
        ..Opts::default()
    })
    .await;
    // A stream that would outlive the grace period (and is read slowly, so it stays in flight).
    let mut st = s
        .stream(
            "/v1/completions",
            &json!({"prompt": "x", "max_tokens": 4000, "ignore_eos": true, "stream": true}),
        )
        .await;
    st.next().await.unwrap();
    s.signal_stop();
    let mut last = String::new();
    while let Some(d) = st.next().await {
        if d == "[DONE]" {
            break;
        }
        last = d;
    }
    let v: Value = serde_json::from_str(&last).unwrap();
    assert!(
        v["error"]["code"] == "service_unavailable" || v["choices"][0]["finish_reason"] == "length",
        "{v}"
    );
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draws_on_the_backend_reproduce_and_agree_with_the_host() {
    // A backend that draws where its logits are (a GPU; here the CPU's `row_draws`, the same
    // `RowDraw` code path): greedy tokens and biased tokens equal the host sampler's, seeds
    // reproduce whatever the batch, and a request with logprobs is drawn there too, its
    // logprobs computed there (`Backend::row_logprobs`) as the host computes them.
    let host = Server::start(Opts::default()).await;
    let dev = Server::start(Opts {
        row_draws: true,
        ..Opts::default()
    })
    .await;
    let greedy = json!({"prompt": "Once upon a time", "max_tokens": 32, "temperature": 0, "ignore_eos": true,
                        "logit_bias": {"40": 2.5, "41": -100}, "frequency_penalty": 2.0, "presence_penalty": 2.0});
    let a = text_of(&host.post("/v1/completions", &greedy).await.json());
    let b = text_of(&dev.post("/v1/completions", &greedy).await.json());
    assert_eq!(a, b, "greedy after biases and penalties");
    let forced = json!({"prompt": "x", "max_tokens": 6, "temperature": 1.0, "seed": 5, "ignore_eos": true,
                        "logit_bias": {"42": 100}});
    let a = text_of(&host.post("/v1/completions", &forced).await.json());
    let b = text_of(&dev.post("/v1/completions", &forced).await.json());
    assert_eq!(a, b, "a token biased by 100 is drawn either way");

    let body = |seed: u64| json!({"prompt": format!("story {seed}"), "max_tokens": 24, "seed": seed, "temperature": 0.9, "min_p": 0.02, "ignore_eos": true});
    let mut solo = Vec::new();
    for seed in 0..4 {
        solo.push(text_of(
            &dev.post("/v1/completions", &body(seed)).await.json(),
        ));
    }
    assert_eq!(
        solo[0],
        text_of(&dev.post("/v1/completions", &body(0)).await.json())
    );
    assert_ne!(solo[0], solo[1]);
    let mut tasks: Vec<_> = (0..4)
        .map(|seed| spawn_completion(&dev.addr, body(seed)))
        .collect();
    let lp = json!({"prompt": "A", "max_tokens": 5, "logprobs": 2, "temperature": 0.7, "seed": 1, "ignore_eos": true});
    tasks.push(spawn_completion(&dev.addr, lp));
    let lp = tasks.pop().unwrap().await.unwrap().json();
    // The same seed without logprobs: the same tokens.
    let plain =
        json!({"prompt": "A", "max_tokens": 5, "temperature": 0.7, "seed": 1, "ignore_eos": true});
    assert_eq!(
        text_of(&dev.post("/v1/completions", &plain).await.json()),
        text_of(&lp),
        "logprobs must not change a seed's tokens"
    );
    let lps = lp["choices"][0]["logprobs"]["token_logprobs"]
        .as_array()
        .unwrap();
    assert_eq!(lps.len(), 5);
    assert!(lps.iter().all(|v| v.as_f64().is_some_and(|x| x <= 0.0)));
    for (seed, t) in tasks.into_iter().enumerate() {
        assert_eq!(text_of(&t.await.unwrap().json()), solo[seed], "seed {seed}");
    }
    // The logprobs of a greedy request, with 20 alternatives, and of its echoed prompt: the
    // backend's the host's, number for number.
    let scored = json!({"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0, "logprobs": 20,
                        "echo": true, "ignore_eos": true});
    let a = host.post("/v1/completions", &scored).await.json();
    let b = dev.post("/v1/completions", &scored).await.json();
    let top = &b["choices"][0]["logprobs"]["top_logprobs"];
    assert!(top.as_array().is_some_and(|t| t.len() > 8), "{top}");
    assert_eq!(a["choices"][0]["logprobs"], b["choices"][0]["logprobs"]);
    let chat = json!({"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8, "temperature": 0,
                      "logprobs": true, "top_logprobs": 20, "ignore_eos": true});
    let a = host.post("/v1/chat/completions", &chat).await.json();
    let b = dev.post("/v1/chat/completions", &chat).await.json();
    let content = &b["choices"][0]["logprobs"]["content"];
    assert!(
        content.as_array().is_some_and(|c| c.len() == 8
            && c.iter()
                .all(|t| t["top_logprobs"].as_array().is_some_and(|l| l.len() == 20))),
        "{content}"
    );
    assert_eq!(a["choices"][0]["logprobs"], b["choices"][0]["logprobs"]);
    // Where the tokens were chosen (the metrics are the process's, shared by both servers and
    // by the tests running beside this one, which all draw on the host): on the device, every
    // token of this test's device server: 32 + 6 + 9 x 24 + 5 + 5 + 8 + 8.
    assert_eq!(
        dev.metric("muser_draws_total", "where=\"device\"").await,
        (32 + 6 + 9 * 24 + 5 + 5 + 8 + 8) as f64
    );
    let on_host = host.metric("muser_draws_total", "where=\"host\"").await;
    assert!(on_host >= (32 + 6 + 8 + 8) as f64, "{on_host}");

    // Top-k and top-p are cut where the logits are too (`RowDraw::cut`): top_k 1 and top_p 1e-6
    // give the greedy tokens; under both, a seed's tokens are the same alone, in a batch and
    // with logprobs.
    let d0 = dev.metric("muser_draws_total", "where=\"device\"").await;
    let plain = json!({"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0, "ignore_eos": true});
    let greedy = text_of(&host.post("/v1/completions", &plain).await.json());
    for (k, p) in [(1, 1.0), (0, 1e-6)] {
        let cut = json!({"prompt": "Once upon a time", "max_tokens": 16, "temperature": 1.5, "seed": 3,
                         "top_k": k, "top_p": p, "ignore_eos": true});
        assert_eq!(
            text_of(&dev.post("/v1/completions", &cut).await.json()),
            greedy,
            "top_k {k} top_p {p}"
        );
    }
    let cut = |seed: u64| {
        json!({"prompt": format!("tale {seed}"), "max_tokens": 12, "seed": seed, "temperature": 1.2,
                                 "top_k": 40, "top_p": 0.9, "ignore_eos": true})
    };
    let mut alone = Vec::new();
    for seed in 0..3 {
        alone.push(text_of(
            &dev.post("/v1/completions", &cut(seed)).await.json(),
        ));
    }
    assert!(alone[0] != alone[1] || alone[1] != alone[2], "{alone:?}");
    let mut tasks: Vec<_> = (0..3)
        .map(|seed| spawn_completion(&dev.addr, cut(seed)))
        .collect();
    let mut with_lp = cut(1);
    with_lp["logprobs"] = json!(3);
    tasks.push(spawn_completion(&dev.addr, with_lp));
    let lp = tasks.pop().unwrap().await.unwrap().json();
    assert_eq!(
        text_of(&lp),
        alone[1],
        "logprobs must not change a seed's tokens under a cut"
    );
    for (seed, t) in tasks.into_iter().enumerate() {
        assert_eq!(
            text_of(&t.await.unwrap().json()),
            alone[seed],
            "seed {seed} in a batch"
        );
    }
    assert_eq!(
        dev.metric("muser_draws_total", "where=\"device\"").await - d0,
        (2 * 16 + 7 * 12) as f64,
        "every token drawn on the backend"
    );
}

/// A request whose worst case cannot fit the KV budget is refused with the field its length came
/// from.
#[tokio::test]
async fn the_kv_budget_refusal_names_the_length_field() {
    use muser_server::engine::KvCost;
    let file = muser_engine::ModelFile::open(common::fixture(MODEL)).unwrap();
    let cost = KvCost::new(&file.config, muser_engine::KvType::F16).unwrap();
    let s = Server::start(Opts {
        kv_budget: Some(cost.bytes(64)),
        ..Opts::default()
    })
    .await;
    for field in ["max_tokens", "max_completion_tokens"] {
        let e = s
            .post("/v1/completions", &json!({"prompt": "hi", field: 500}))
            .await
            .openai_error(400);
        assert_eq!(e["param"], field, "{e}");
        assert!(
            e["message"]
                .as_str()
                .unwrap()
                .contains(&format!("lower {field}")),
            "{e}"
        );
    }
}

/// Whether `v` is what `SMALL_SCHEMA` allows.
fn small_schema_holds(v: &Value) -> bool {
    let Some(o) = v.as_object() else {
        return false;
    };
    o.keys().all(|k| k == "ok" || k == "n")
        && o.get("ok").is_some_and(Value::is_boolean)
        && o.get("n")
            .and_then(Value::as_i64)
            .is_some_and(|n| (0..=9).contains(&n))
}

const SMALL_SCHEMA: &str = r#"{"type": "object", "properties": {"ok": {"type": "boolean"},
    "n": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["ok", "n"],
    "additionalProperties": false}"#;

/// The date Muse Glimmer's template writes into the system prompt (today's, by default), fixed
/// for tests whose counts of random-weight answers depend on the prompt: the same answers on
/// every day CI runs.
static PINNED_DATE: std::sync::LazyLock<Value> =
    std::sync::LazyLock::new(|| json!({"current_date": "2026-08-15"}));

/// `response_format` in chat: every answer that ends is JSON of the schema (the random-weight
/// model writes noise unconstrained), whole or streamed alike; `json_object` gives an object;
/// a seed reproduces. On the backend's draw path too (a constrained row is drawn there, checked
/// on the host and drawn again there under the grammar's mask where refused).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_formats_constrain_chat_answers() {
    let schema: Value = serde_json::from_str(SMALL_SCHEMA).unwrap();
    for row_draws in [false, true] {
        let s = Server::start(Opts {
            row_draws,
            ..Opts::default()
        })
        .await;
        let body = |seed: u64, stream: bool| {
            json!({"messages": [{"role": "user", "content": "Answer in JSON."}],
                   "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
                   "max_tokens": 120, "temperature": 1.0, "seed": seed, "stream": stream,
                   "chat_template_kwargs": PINNED_DATE.clone()})
        };
        let mut stopped = 0;
        for seed in 0..6 {
            let r = s.post("/v1/chat/completions", &body(seed, false)).await;
            assert_eq!(r.status, 200, "{}", r.json());
            let v = r.json();
            let c = &v["choices"][0];
            let content = c["message"]["content"].as_str().unwrap_or_default();
            match c["finish_reason"].as_str().unwrap() {
                "stop" => {
                    stopped += 1;
                    let answer: Value = serde_json::from_str(content)
                        .unwrap_or_else(|e| panic!("seed {seed}: {e}: {content:?}"));
                    assert!(small_schema_holds(&answer), "seed {seed}: {answer}");
                }
                "length" => assert_eq!(v["usage"]["completion_tokens"], 120),
                f => panic!("seed {seed}: finish {f}"),
            }
            // Streamed, the same seed: the same content and reasoning.
            let chunks = s
                .stream("/v1/chat/completions", &body(seed, true))
                .await
                .collect()
                .await;
            let streamed: String = chunks
                .iter()
                .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
                .collect();
            assert_eq!(streamed, content, "seed {seed}, row_draws {row_draws}");
            assert_eq!(
                s.post("/v1/chat/completions", &body(seed, false))
                    .await
                    .json()["choices"][0]["message"],
                c["message"],
                "seed {seed}: not reproduced"
            );
        }
        assert!(
            stopped >= 3,
            "row_draws {row_draws}: {stopped} of 6 answers ended"
        );
        let r = s
            .post(
                "/v1/chat/completions",
                &json!({"messages": [{"role": "user", "content": "JSON please"}],
                        "response_format": {"type": "json_object"}, "max_tokens": 200,
                        "temperature": 0}),
            )
            .await
            .json();
        let c = &r["choices"][0];
        if c["finish_reason"] == "stop" {
            let content = c["message"]["content"].as_str().unwrap();
            let answer: Value =
                serde_json::from_str(content).unwrap_or_else(|e| panic!("{e}: {content:?}"));
            assert!(answer.is_object(), "{answer}");
        }
    }
}

/// A completion's `response_format` and `grammar` constrain its text itself; with `ignore_eos`
/// a whole match ends the completion (nothing else may follow it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grammars_constrain_completions() {
    let s = Server::start(Opts::default()).await;
    for seed in 0..4 {
        let r = s
            .post(
                "/v1/completions",
                &json!({"prompt": "The answer:", "grammar": "root ::= (\"yes\" | \"no\") \" \" [0-9]{2}",
                        "max_tokens": 40, "temperature": 1.0, "seed": seed, "ignore_eos": true}),
            )
            .await
            .json();
        let t = text_of(&r);
        let (word, digits) = t.split_once(' ').unwrap_or_else(|| panic!("{t:?}"));
        assert!(["yes", "no"].contains(&word), "{t:?}");
        assert!(
            digits.len() == 2 && digits.bytes().all(|b| b.is_ascii_digit()),
            "{t:?}"
        );
        assert_eq!(r["choices"][0]["finish_reason"], "stop", "{r}");
        assert!(
            r["usage"]["completion_tokens"].as_u64().unwrap() <= 6,
            "{r}"
        );
    }
    let schema: Value = serde_json::from_str(SMALL_SCHEMA).unwrap();
    let mut stopped = 0;
    for seed in 0..4 {
        let r = s
            .post(
                "/v1/completions",
                &json!({"prompt": "{", "response_format": {"type": "json_schema", "json_schema": {"schema": schema}},
                        "max_tokens": 60, "temperature": 1.0, "seed": seed}),
            )
            .await
            .json();
        if r["choices"][0]["finish_reason"] == "stop" {
            stopped += 1;
            let t = text_of(&r);
            let v: Value = serde_json::from_str(&t).unwrap_or_else(|e| panic!("{e}: {t:?}"));
            assert!(small_schema_holds(&v), "{v}");
        }
    }
    assert!(stopped >= 2, "{stopped} of 4 completions ended");
}

/// What a constraint cannot be is a 400 naming its field, and the server goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_constraints_are_refused_by_field() {
    let s = Server::start(Opts::default()).await;
    let chat = |extra: Value| {
        let mut b = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    for (extra, param, needle) in [
        (
            json!({"response_format": {"type": "xml"}}),
            "response_format",
            "must be one of",
        ),
        (
            json!({"response_format": "json"}),
            "response_format",
            "must be an object",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "thing"}}}}),
            "response_format",
            "unrecognized type thing",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"schema": {"$ref": "http://x/y"}}}}),
            "response_format",
            "only references into the same document",
        ),
        (
            json!({"grammar": "root ::= \"a"}),
            "grammar",
            "unexpected end of input",
        ),
        (
            json!({"grammar": "root ::= root \"a\" | \"b\""}),
            "grammar",
            "left recursion",
        ),
        (
            json!({"grammar": "start ::= \"a\""}),
            "grammar",
            "'root' symbol",
        ),
        (
            json!({"grammar": "root ::= \"a\"", "json_schema": {"type": "object"}}),
            "grammar",
            "cannot both",
        ),
        (
            json!({"json_schema": [1]}),
            "json_schema",
            "must be a JSON schema object",
        ),
        (
            json!({"grammar": "root ::= \"a\"", "tools": [{"type": "function", "function": {"name": "f"}}]}),
            "grammar",
            "cannot be given with tools",
        ),
        (
            json!({"tool_choice": "required", "tools": [{"type": "function", "function": {"name": "f",
                "parameters": {"type": "object", "properties": {"a": {"type": "strin"}}}}}]}),
            "tool_choice",
            "unrecognized type strin",
        ),
        // The grammar of a call the answer may begin (`auto`, the default), as llama.cpp builds.
        (
            json!({"tool_choice": "auto", "tools": [{"type": "function", "function": {"name": "f",
                "parameters": {"type": "object", "properties": {"a": {"type": "strin"}}}}}]}),
            "tools",
            "unrecognized type strin",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f",
                "parameters": {"type": "object", "properties": {"a": {"type": "strin"}}}}}]}),
            "tools",
            "unrecognized type strin",
        ),
    ] {
        let r = s.post("/v1/chat/completions", &chat(extra.clone())).await;
        let e = r.openai_error(400);
        assert_eq!(e["param"], param, "{extra}: {e}");
        assert!(
            e["message"].as_str().unwrap().contains(needle),
            "{extra}: {e}"
        );
    }
    let long = format!("root ::= \"{}\"", "a".repeat(300_000));
    let e = s
        .post("/v1/completions", &json!({"prompt": "x", "grammar": long}))
        .await
        .openai_error(400);
    assert_eq!(e["param"], "grammar");
    // A grammar the matcher cannot follow past its first character (its stacks would double
    // with each rule): the request ends with a reason, not a token outside the grammar.
    let mut g = String::from("root ::= \"a\" d0\n");
    for i in 0..40 {
        g.push_str(&format!("d{i} ::= d{n} \"x\" | d{n} \"y\"\n", n = i + 1));
    }
    g.push_str("d40 ::= \"b\"\n");
    let e = s
        .post(
            "/v1/completions",
            &json!({"prompt": "x", "grammar": g, "max_tokens": 8}),
        )
        .await
        .openai_error(400);
    assert_eq!(e["code"], "grammar_stuck", "{e}");
    // Still serving; a null schema is any object (as llama.cpp reads it).
    assert_eq!(
        s.post("/v1/completions", &json!({"prompt": "x", "max_tokens": 2}))
            .await
            .status,
        200
    );
    let r = s
        .post(
            "/v1/chat/completions",
            &chat(json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": null}}})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.json());
    // A chat template that is not Muse Glimmer's: a response format cannot follow its answers.
    let other = Server::start(Opts {
        template_source: Some("{% for m in messages %}{{ m['content'] }}\n{% endfor %}Answer:"),
        ..Opts::default()
    })
    .await;
    let e = other
        .post(
            "/v1/chat/completions",
            &chat(json!({"response_format": {"type": "json_object"}})),
        )
        .await
        .openai_error(400);
    assert_eq!(e["param"], "response_format");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("Muse Glimmer chat format"),
        "{e}"
    );
}

/// `tool_choice: "required"` and a named function: every answer that ends is a call of an
/// offered tool (of the named one), its arguments of their schemas, `finish_reason`
/// "tool_calls"; with `parallel_tool_calls: false`, one call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_tool_calls_call_the_tools() {
    let s = Server::start(Opts {
        n_ctx: 4096,
        ..Opts::default()
    })
    .await;
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}}
    ]);
    let hi = json!([{"role": "user", "content": "Weather in Paris?"}]);
    let mut called = std::collections::BTreeMap::new();
    for (choice, parallel) in [
        (json!("required"), true),
        (
            json!({"type": "function", "function": {"name": "get_weather"}}),
            true,
        ),
        (json!("required"), false),
    ] {
        for seed in 0..5 {
            let r = s
                .post(
                    "/v1/chat/completions",
                    &json!({"messages": hi, "tools": tools, "tool_choice": choice,
                            "parallel_tool_calls": parallel, "max_tokens": 320, "seed": seed,
                            "chat_template_kwargs": PINNED_DATE.clone()}),
                )
                .await
                .json();
            let c = &r["choices"][0];
            if c["finish_reason"] == "length" {
                continue;
            }
            assert_eq!(
                c["finish_reason"], "tool_calls",
                "{choice} seed {seed}: {r}"
            );
            let calls = c["message"]["tool_calls"].as_array().unwrap();
            assert!(!calls.is_empty() && (parallel || calls.len() == 1), "{r}");
            for call in calls {
                let name = call["function"]["name"].as_str().unwrap();
                let args: Value =
                    serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
                match name {
                    "get_weather" => {
                        let a = args.as_object().unwrap();
                        assert!(a.keys().all(|k| k == "city" || k == "days"), "{args}");
                        assert!(a.get("city").is_none_or(Value::is_string), "{args}");
                        assert!(
                            a.get("days")
                                .is_none_or(|d| d.as_i64().is_some_and(|d| (1..=7).contains(&d))),
                            "{args}"
                        );
                    }
                    "ping" => {
                        assert!(choice.is_string(), "{choice}: {r}");
                        assert_eq!(args, json!({}));
                    }
                    other => panic!("{other}"),
                }
                *called.entry(name.to_string()).or_insert(0) += 1;
            }
        }
    }
    assert!(called.values().sum::<i32>() >= 5, "{called:?}");
}

/// `tool_choice: "auto"` (the default with tools): the answer is free until it begins a call, and
/// a call it begins is well formed. On a model whose logits are all 0 (`Opts::flat`), the tokens
/// of ` to=` and `<|message|>` are favoured (`logit_bias`, ` to` most, and penalties for
/// repeating them), so that most answers begin ` to=`, a recipient, then `<|message|>`: a call,
/// made whole (`finish_reason` `tool_calls`, one call of a tool offered, arguments of its
/// schema) by the grammar, which keeps the favoured tokens out of it; the answers that begin otherwise stay
/// free text, the favoured tokens to `max_tokens`.
#[tokio::test]
async fn begun_tool_calls_are_well_formed() {
    let s = Server::start(Opts {
        n_ctx: 4096,
        flat: true,
        ..Opts::default()
    })
    .await;
    let bias = common::call_bias();
    let tools = json!([
        {"type": "function", "function": {"name": "set_days",
            "parameters": {"type": "object", "properties": {
                "days": {"type": "integer", "minimum": 1, "maximum": 7}}}}},
        {"type": "function", "function": {"name": "ping"}}
    ]);
    let hi = json!([{"role": "user", "content": "Plan my week."}]);
    let (mut calls, mut free) = (0, 0);
    for seed in 0..12 {
        let mut body = json!({"messages": hi, "tools": tools, "max_tokens": 160, "seed": seed,
            "logit_bias": bias, "frequency_penalty": 2.0, "presence_penalty": 2.0,
            "parallel_tool_calls": false});
        if seed % 2 == 1 {
            body["tool_choice"] = json!("auto");
        }
        let r = s.post("/v1/chat/completions", &body).await.json();
        let c = &r["choices"][0];
        if c["finish_reason"] == "tool_calls" {
            calls += 1;
            let list = c["message"]["tool_calls"].as_array().unwrap();
            assert_eq!(list.len(), 1, "{r}");
            let f = &list[0]["function"];
            let args: Value = serde_json::from_str(f["arguments"].as_str().unwrap()).unwrap();
            match f["name"].as_str().unwrap() {
                "set_days" => {
                    let a = args.as_object().unwrap();
                    assert!(a.keys().all(|k| k == "days"), "{args}");
                    assert!(
                        a.get("days")
                            .is_none_or(|d| d.as_i64().is_some_and(|d| (1..=7).contains(&d))),
                        "{args}"
                    );
                }
                "ping" => assert_eq!(args, json!({})),
                other => panic!("{other}: {r}"),
            }
        } else {
            // Free text, which never began a call: where it would have, the grammar took over.
            assert!(
                c["finish_reason"] == "length" || c["finish_reason"] == "stop",
                "{r}"
            );
            let text = c["message"]["content"].as_str().unwrap();
            assert!(
                muser_text::grammar::tool_call_trigger(text.as_bytes()).is_none()
                    && !text.is_empty(),
                "{r}"
            );
            free += 1;
        }
    }
    eprintln!("auto tool choice: {calls} calls, {free} free answers");
    assert!(
        calls >= 4 && free >= 1,
        "{calls} calls, {free} free answers"
    );
}

/// A final assistant message is continued (llama.cpp's `prefill_assistant`, and
/// `continue_final_message`): the prompt is the conversation before it with the generation
/// prompt, then its reasoning message opened and, for an answer, closed and the answer's
/// opened; its tokens are those a completion of that text takes, and the output the same. The
/// message returned holds the continued text then the output (llama.cpp parses its generation
/// prompt with the output), streamed alike; a response format's grammar is matched from the
/// continued text. Refused: two assistant messages at the end, continuing with the generation
/// prompt asked for, a last message that is not the assistant's or holds tool calls.
#[tokio::test]
async fn final_assistant_messages_are_continued() {
    let s = Server::start(Opts {
        n_ctx: 4096,
        ..Opts::default()
    })
    .await;
    let g = muser_gguf::Gguf::open(common::fixture(common::MODEL)).unwrap();
    let tok = muser_text::Tokenizer::from_gguf(&g).unwrap();
    let tmpl = muser_text::ChatTemplate::from_gguf(&g).unwrap();
    let user = json!({"role": "user", "content": "Finish my sentence."});
    let before = tmpl
        .encode_sanitized(&tok, &json!([user]), None, true, None)
        .unwrap();
    let chat = |last: Value, extra: Value| {
        let mut b = json!({"messages": [user, last], "max_tokens": 8, "temperature": 0});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    for (last, extra, tail, reasoning, content) in [
        (
            json!({"role": "assistant", "content": "The answer is"}),
            json!({}),
            " to=self<|message|><|eom|><|start|>assistant to=user<|message|>The answer is",
            "",
            "The answer is",
        ),
        (
            json!({"role": "assistant", "reasoning_content": "Let me think", "content": ""}),
            json!({"continue_final_message": true, "add_generation_prompt": false}),
            " to=self<|message|>Let me think",
            "Let me think",
            "",
        ),
        (
            json!({"role": "assistant", "reasoning_content": "Hm.", "content": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]}),
            json!({"continue_final_message": "content"}),
            " to=self<|message|>Hm.<|eom|><|start|>assistant to=user<|message|>A\n\nB",
            "Hm.",
            "A\n\nB",
        ),
    ] {
        let mut ids = before.clone();
        ids.extend(tok.encode(tail, false, true).unwrap());
        let r = s
            .post("/v1/chat/completions", &chat(last.clone(), extra.clone()))
            .await
            .json();
        assert_eq!(r["usage"]["prompt_tokens"], ids.len(), "{last}: {r}");
        // `/tokenize` of the messages: the chat's prompt.
        let mut t = chat(last.clone(), extra.clone());
        t.as_object_mut().unwrap().retain(|k, _| {
            [
                "messages",
                "add_generation_prompt",
                "continue_final_message",
            ]
            .contains(&k.as_str())
        });
        let tk = s.post("/tokenize", &t).await.json();
        assert_eq!(tk["tokens"], json!(ids), "{tk}");
        let c = s
            .post(
                "/v1/completions",
                &json!({"prompt": ids, "max_tokens": 8, "temperature": 0}),
            )
            .await
            .json();
        let out = c["choices"][0]["text"].as_str().unwrap().to_string();
        assert_eq!(
            r["usage"]["completion_tokens"], c["usage"]["completion_tokens"],
            "{c}"
        );
        // The continued text, then the same output read by the same parser.
        let parser = muser_text::ToolCallParser::from_json(None).unwrap();
        let want = parser.parse(&format!("{tail}{out}"));
        let m = &r["choices"][0]["message"];
        assert_eq!(
            m["content"].as_str().unwrap_or(""),
            want.content,
            "{r}\n{out:?}"
        );
        assert_eq!(
            m["reasoning_content"].as_str().unwrap_or(""),
            want.reasoning_content,
            "{r}"
        );
        assert!(want.content.starts_with(content) && want.reasoning_content.starts_with(reasoning));
        // Streamed: the same message.
        let mut body = chat(last, extra);
        body["stream"] = json!(true);
        let (mut sc, mut sr) = (String::new(), String::new());
        for ev in s
            .stream("/v1/chat/completions", &body)
            .await
            .collect()
            .await
        {
            let d = &ev["choices"][0]["delta"];
            sc.push_str(d["content"].as_str().unwrap_or(""));
            sr.push_str(d["reasoning_content"].as_str().unwrap_or(""));
        }
        assert_eq!((sc, sr), (want.content, want.reasoning_content));
    }
    // An empty final assistant message is nothing to continue: the prompt as without it.
    let r = s
        .post(
            "/v1/chat/completions",
            &chat(json!({"role": "assistant", "content": ""}), json!({})),
        )
        .await
        .json();
    assert_eq!(r["usage"]["prompt_tokens"], before.len(), "{r}");
    // A JSON answer begun: the grammar goes on from the continued `{` (a schema whose answer
    // is short, so each ends), the answer whole.
    let schema = json!({"type": "object", "properties": {"ok": {"type": "boolean"}},
                        "required": ["ok"], "additionalProperties": false});
    for seed in 0..3 {
        let r = s
            .post(
                "/v1/chat/completions",
                &chat(
                    json!({"role": "assistant", "content": "{"}),
                    json!({"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}},
                           "max_tokens": 200, "temperature": 1.0, "seed": seed,
                           "chat_template_kwargs": PINNED_DATE.clone()}),
                ),
            )
            .await
            .json();
        let c = &r["choices"][0];
        assert_eq!(c["finish_reason"], "stop", "{r}");
        let text = c["message"]["content"].as_str().unwrap();
        let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {r}"));
        assert!(text.starts_with('{') && v["ok"].is_boolean(), "{r}");
    }
    // The user's text in the continued message is text, in the prompt and in the message: its
    // `<|eot|>` ends nothing.
    let r = s
        .post(
            "/v1/chat/completions",
            &chat(
                json!({"role": "assistant", "content": "Type <|eot|> to end"}),
                json!({}),
            ),
        )
        .await
        .json();
    let m = r["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(m.starts_with("Type <|eot|> to end"), "{r}");
    // Streamed: the role, then the continued text, then the output.
    let mut body = chat(
        json!({"role": "assistant", "content": "The answer is"}),
        json!({"stream": true}),
    );
    body["stream"] = json!(true);
    let evs = s
        .stream("/v1/chat/completions", &body)
        .await
        .collect()
        .await;
    assert_eq!(
        evs[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    assert_eq!(
        evs[1]["choices"][0]["delta"],
        json!({"content": "The answer is"})
    );
    for (body, param) in [
        (
            json!({"messages": [user, {"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}]}),
            "messages",
        ),
        (
            chat(
                json!({"role": "assistant", "content": "a"}),
                json!({"continue_final_message": true, "add_generation_prompt": true}),
            ),
            "add_generation_prompt",
        ),
        (
            json!({"messages": [user], "continue_final_message": true}),
            "continue_final_message",
        ),
        (
            chat(
                json!({"role": "assistant", "content": "a"}),
                json!({"continue_final_message": "answer"}),
            ),
            "continue_final_message",
        ),
        (
            json!({"messages": [user, {"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]}),
            "messages",
        ),
        (
            json!({"messages": [user, {"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}],
                "continue_final_message": true}),
            "continue_final_message",
        ),
        // A forced call cannot continue an answer begun as text.
        (
            json!({"messages": [user, {"role": "assistant", "content": "Well"}],
                   "tools": [{"type": "function", "function": {"name": "f"}}],
                   "tool_choice": "required"}),
            "messages",
        ),
    ] {
        let e = s
            .post("/v1/chat/completions", &body)
            .await
            .openai_error(400);
        assert_eq!(e["param"], param, "{body}: {e}");
    }
    // Another chat template: the conversation whole, as it renders it; continuing is refused.
    let src = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}Answer:";
    let other = Server::start(Opts {
        template_source: Some(src),
        ..Opts::default()
    })
    .await;
    let both = json!([user, {"role": "assistant", "content": "Hi"}]);
    let want = muser_text::ChatTemplate::new(src, "test")
        .unwrap()
        .encode_sanitized(&tok, &both, None, true, None)
        .unwrap();
    let r = other
        .post(
            "/v1/chat/completions",
            &json!({"messages": both, "max_tokens": 1}),
        )
        .await
        .json();
    assert_eq!(r["usage"]["prompt_tokens"], want.len(), "{r}");
    let e = other
        .post(
            "/v1/chat/completions",
            &json!({"messages": both, "continue_final_message": true}),
        )
        .await
        .openai_error(400);
    assert_eq!(e["param"], "continue_final_message", "{e}");
}

/// `reasoning_effort`, as llama.cpp passes it to the template: the template's
/// `reasoning_strength` (its system prompt's "Reasoning strength: ..." line), unless
/// `chat_template_kwargs` set that; "none" is the template's default; not a string: a 400.
#[tokio::test]
async fn reasoning_effort_is_the_templates_reasoning_strength() {
    let s = Server::start(Opts::default()).await;
    let g = muser_gguf::Gguf::open(common::fixture(common::MODEL)).unwrap();
    let tok = muser_text::Tokenizer::from_gguf(&g).unwrap();
    let tmpl = muser_text::ChatTemplate::from_gguf(&g).unwrap();
    let msgs = json!([{"role": "user", "content": "Hi"}]);
    let prompt = |strength: Option<&str>| {
        let extra = strength.map(|v| {
            let mut m = serde_json::Map::new();
            m.insert("reasoning_strength".into(), json!(v));
            m
        });
        tmpl.encode_sanitized(&tok, &msgs, None, true, extra.as_ref())
            .unwrap()
    };
    let slow = "as thorough and careful as it can possibly be";
    assert_ne!(prompt(Some(slow)), prompt(None));
    for (extra, want) in [
        (json!({"reasoning_effort": slow}), prompt(Some(slow))),
        (json!({"reasoning_effort": "none"}), prompt(None)),
        (
            json!({"reasoning_effort": slow, "chat_template_kwargs": {"reasoning_strength": "low"}}),
            prompt(Some("low")),
        ),
        (
            json!({"reasoning_effort": "none", "chat_template_kwargs": {"reasoning_effort": slow}}),
            prompt(None),
        ),
        (
            json!({"chat_template_kwargs": {"reasoning_effort": slow}}),
            prompt(Some(slow)),
        ),
    ] {
        let mut body = json!({"messages": msgs, "max_tokens": 1});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let r = s.post("/v1/chat/completions", &body).await.json();
        assert_eq!(r["usage"]["prompt_tokens"], want.len(), "{extra}: {r}");
        // `/tokenize` of the same fields: the same ids.
        body.as_object_mut().unwrap().remove("max_tokens");
        let t = s.post("/tokenize", &body).await.json();
        assert_eq!(t["tokens"], json!(want), "{extra}: {t}");
    }
    let e = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": msgs, "reasoning_effort": 3}),
        )
        .await
        .openai_error(400);
    assert_eq!(e["param"], "reasoning_effort");
}

/// Completions' `echo`: the text begins with the prompt, and with `logprobs` the lists begin
/// with the prompt's tokens, the first without a log-probability and each other's what the model
/// gives it after the tokens before it: against the engine itself run over the prompt (a
/// `Session`, every position's logits), over several prompt chunks (`step_tokens` 16).
/// `max_tokens: 0` scores the prompt alone; the continuation after an echo is the one without;
/// streamed, the same text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_returns_the_prompt_and_scores_its_tokens() {
    use muser_engine::{CpuBackend, KvType, Logits, ModelFile, MuseGlimmer, Session};
    let s = Server::start(Opts {
        step_tokens: 16,
        ..Opts::default()
    })
    .await;
    let file = ModelFile::open(common::fixture(MODEL)).unwrap();
    let tok = muser_text::Tokenizer::from_gguf(&file.gguf).unwrap();
    let text = "Once upon a time, in a land far away, there lived a small dragon who counted the stars every night.";
    let ids = tok.encode(text, true, false).unwrap();
    assert!(ids.len() > 20, "{} tokens", ids.len());
    let model =
        MuseGlimmer::load(&file, CpuBackend::new(NumericMode::Accurate, 1).unwrap()).unwrap();
    let mut sess = Session::new(&model, KvType::F16, 1024).unwrap();
    let logits = sess.feed(&ids, 512, Logits::All).unwrap();
    let nv = model.config.n_vocab;

    // Two alternatives: scored on the host; one or none: by the backend (`row_logprobs`).
    let mut echoed = String::new();
    for k in [2usize, 1, 0] {
        let r = s
            .post(
                "/v1/completions",
                &json!({"prompt": ids, "echo": true, "max_tokens": 0, "logprobs": k}),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.json());
        let v = r.json();
        let c = &v["choices"][0];
        assert_eq!(c["finish_reason"], "length", "{v}");
        assert_eq!(v["usage"]["completion_tokens"], 0);
        assert_eq!(v["usage"]["prompt_tokens"], ids.len());
        echoed = c["text"].as_str().unwrap().to_string();
        assert_eq!(echoed, tok.decode(&ids, true).unwrap());
        let lp = &c["logprobs"];
        let lps = lp["token_logprobs"].as_array().unwrap();
        let tops = lp["top_logprobs"].as_array().unwrap();
        let offsets = lp["text_offset"].as_array().unwrap();
        assert_eq!(lp["tokens"].as_array().unwrap().len(), ids.len());
        assert_eq!(
            (lps.len(), tops.len(), offsets.len()),
            (ids.len(), ids.len(), ids.len())
        );
        assert!(lps[0].is_null() && tops[0].is_null(), "{lp}");
        assert_eq!(offsets[0], 0);
        let mut worst = 0.0f64;
        for i in 1..ids.len() {
            let row = &logits[(i - 1) * nv..i * nv];
            let ls = muser_engine::sampling::log_softmax(row);
            let got = lps[i].as_f64().unwrap();
            worst = worst.max((got - ls[ids[i] as usize]).abs());
            // (Two tokens may read the same: the map keeps the likelier.)
            let top = tops[i].as_object().unwrap();
            assert!(
                top.len() <= k && (k == 0) == top.is_empty(),
                "k {k}: {top:?}"
            );
            if k > 0 {
                let best = top
                    .values()
                    .filter_map(Value::as_f64)
                    .fold(f64::MIN, f64::max);
                let top1 = ls.iter().fold(f64::MIN, |m, &v| m.max(v));
                worst = worst.max((best - top1).abs());
            }
            assert!(offsets[i].as_u64() >= offsets[i - 1].as_u64());
        }
        assert!(
            worst <= 1e-5,
            "logprobs {k}: echoed logprobs against the engine's: {worst}"
        );
    }

    // Generating after the echo: the prompt, then the continuation the request without echo gets.
    let greedy = |echo: bool| json!({"prompt": ids, "echo": echo, "max_tokens": 6, "temperature": 0, "logprobs": 1});
    let with = s.post("/v1/completions", &greedy(true)).await.json();
    let without = s.post("/v1/completions", &greedy(false)).await.json();
    assert_eq!(text_of(&with), format!("{echoed}{}", text_of(&without)));
    let n_lp = with["choices"][0]["logprobs"]["token_logprobs"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(n_lp, ids.len() + 6);
    assert_eq!(
        with["choices"][0]["logprobs"]["token_logprobs"][ids.len()],
        without["choices"][0]["logprobs"]["token_logprobs"][0]
    );
    // Streamed, and without logprobs (the prompt may then come from a kept cache): the same text.
    let mut b = greedy(true);
    b["stream"] = json!(true);
    b["logprobs"] = Value::Null;
    let chunks = s.stream("/v1/completions", &b).await.collect().await;
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(streamed, text_of(&with));
}
