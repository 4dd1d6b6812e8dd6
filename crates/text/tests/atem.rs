//! The ATEM parser: llama.cpp's own Muse Glimmer cases (tests/test-chat.cpp in the b11434 sdist),
//! round trips through the real chat template, streaming under every split, and malformed text.

use muser_gguf::Gguf;
use muser_text::{ChatDelta, ChatTemplate, ParsedMessage, Tokenizer, Tool, ToolCallParser};
use serde_json::{Value, json};

const CALL_MARKUP: &str = "<atem:function_calls>\n<atem:invoke name=\"special_function\">\n<atem:parameter name=\"arg1\">1</atem:parameter>\n</atem:invoke>\n</atem:function_calls>";

/// test-chat.cpp `special_function_tool`.
fn special_function() -> Vec<Tool> {
    serde_json::from_value(json!([{"type": "function", "function": {
        "name": "special_function", "description": "I'm special",
        "parameters": {"type": "object", "properties": {"arg1": {"type": "integer", "description": "The arg."}}, "required": ["arg1"]}}}]))
    .unwrap()
}

fn args(m: &ParsedMessage, i: usize) -> Value {
    serde_json::from_str(&m.tool_calls[i].function.arguments).unwrap()
}

/// Parses in one piece, and checks that every cut into two or three pieces streams the same message.
fn parse_all_ways(p: &ToolCallParser, text: &str) -> ParsedMessage {
    let whole = p.parse(text);
    let cuts: Vec<usize> = (0..=text.len())
        .filter(|&i| text.is_char_boundary(i))
        .collect();
    let same = |a: &ParsedMessage, b: &ParsedMessage| {
        a.content == b.content
            && a.reasoning_content == b.reasoning_content
            && a.tool_calls.len() == b.tool_calls.len()
            && a.tool_calls
                .iter()
                .zip(&b.tool_calls)
                .all(|(x, y)| x.function == y.function)
    };
    let step = (cuts.len() / 60).max(1);
    for &i in &cuts {
        for &j in cuts.iter().filter(|&&j| j >= i).step_by(step) {
            let mut s = p.stream();
            let mut deltas = s.push(&text[..i]);
            let mut spans = s.take_content_spans();
            deltas.extend(s.push(&text[i..j]));
            spans.extend(s.take_content_spans());
            deltas.extend(s.push(&text[j..]));
            spans.extend(s.take_content_spans());
            deltas.extend(s.finish());
            spans.extend(s.take_content_spans());
            assert_eq!(s.consumed(), text.len(), "cut {i},{j} of {text:?}");
            let mut rebuilt = ParsedMessage::default();
            for d in &deltas {
                match d {
                    ChatDelta::Content(c) => rebuilt.content += c,
                    ChatDelta::Reasoning(r) => rebuilt.reasoning_content += r,
                    ChatDelta::ToolCall { index, call } => {
                        assert_eq!(*index, rebuilt.tool_calls.len());
                        rebuilt.tool_calls.push(call.clone());
                    }
                }
            }
            assert!(
                same(&rebuilt, &whole),
                "cut {i},{j} of {text:?}: {rebuilt:?} vs {whole:?}"
            );
            // The content is the text of its spans, in order (what chat logprobs attribute).
            assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0), "{spans:?}");
            let from_spans: String = spans.iter().map(|&(a, b)| &text[a..b]).collect();
            assert_eq!(
                from_spans, rebuilt.content,
                "cut {i},{j} of {text:?}: {spans:?}"
            );
            assert!(same(s.message(), &whole));
        }
    }
    whole
}

#[test]
fn llama_cpp_muse_glimmer_cases() {
    let none = ToolCallParser::new(&[]);
    let tools = ToolCallParser::new(&special_function());

    // A plain answer is unaffected.
    let m = parse_all_ways(&none, " to=user<|message|>Hello, world!\nWhat's up?<|eot|>");
    assert_eq!(m.content, "Hello, world!\nWhat's up?");
    assert!(m.reasoning_content.is_empty() && m.tool_calls.is_empty());

    // A tool call as the first message of the turn.
    let m = parse_all_ways(
        &tools,
        &format!(" to=special_function<|message|>{CALL_MARKUP}"),
    );
    assert_eq!(m.content, "");
    assert_eq!(m.tool_calls.len(), 1);
    assert_eq!(m.tool_calls[0].function.name, "special_function");
    assert_eq!(args(&m, 0), json!({"arg1": 1}));
    assert_eq!(m.tool_calls[0].function.arguments, r#"{"arg1":1}"#);

    // "Inform then act": the answer stops at <|eom|>, then the call.
    let m = parse_all_ways(
        &tools,
        &format!(
            " to=user<|message|>Hello, world!\nWhat's up?<|eom|><|start|>assistant to=special_function<|message|>{CALL_MARKUP}"
        ),
    );
    assert_eq!(m.content, "Hello, world!\nWhat's up?");
    assert_eq!(args(&m, 0), json!({"arg1": 1}));

    // Markup quoted in an answer stays content.
    let text = format!(" to=user<|message|>You invoke it like this:\n{CALL_MARKUP}<|eot|>");
    let m = parse_all_ways(&tools, &text);
    assert_eq!(
        m.content,
        format!("You invoke it like this:\n{CALL_MARKUP}")
    );
    assert!(m.tool_calls.is_empty());

    // Structured output straight to the answer.
    let json_out = r#"{"amount": 123.45, "date": "2025-12-03"}"#;
    let m = parse_all_ways(&none, &format!(" to=user<|message|>{json_out}"));
    assert_eq!(m.content, json_out);

    // Structured output after reasoning.
    let m = parse_all_ways(
        &none,
        &format!(
            " to=self<|message|>I need to output the invoice details in JSON<|eom|><|start|>assistant to=user<|message|>{json_out}"
        ),
    );
    assert_eq!(
        m.reasoning_content,
        "I need to output the invoice details in JSON"
    );
    assert_eq!(m.content, json_out);

    // Tool markup inside the analysis channel is reasoning, not a call.
    let m = parse_all_ways(
        &tools,
        &format!(
            " to=self<|message|>I could use {CALL_MARKUP} here<|eom|><|start|>assistant to=user<|message|>Hello!<|eot|>"
        ),
    );
    assert_eq!(
        m.reasoning_content,
        format!("I could use {CALL_MARKUP} here")
    );
    assert_eq!(m.content, "Hello!");
    assert!(m.tool_calls.is_empty());
}

#[test]
fn reasoning_then_parallel_calls_then_nothing_after_eot() {
    let tools = ToolCallParser::new(&special_function());
    let call = |n: i32| {
        format!(
            "<|start|>assistant to=special_function<|message|><atem:function_calls>\n<atem:invoke name=\"special_function\">\n<atem:parameter name=\"arg1\">{n}</atem:parameter>\n</atem:invoke>\n</atem:function_calls>"
        )
    };
    let text = format!(
        " to=self<|message|>Two calls.<|eom|>{}<|eom|>{}<|eot|>ignored",
        call(1),
        call(2)
    );
    let m = parse_all_ways(&tools, &text);
    assert_eq!(m.reasoning_content, "Two calls.");
    assert_eq!(m.tool_calls.len(), 2);
    assert_eq!(
        (args(&m, 0), args(&m, 1)),
        (json!({"arg1": 1}), json!({"arg1": 2}))
    );
    assert_ne!(m.tool_calls[0].id, m.tool_calls[1].id);
    assert_eq!(m.content, "");
}

#[test]
fn reasoning_off_keeps_everything_as_content() {
    let p = ToolCallParser::new(&[]).extract_reasoning(false);
    let text = " to=self<|message|>hmm<|eom|><|start|>assistant to=user<|message|>Hi";
    assert_eq!(parse_all_ways(&p, text).content, text);
    let p = ToolCallParser::new(&special_function()).extract_reasoning(false);
    let m = parse_all_ways(
        &p,
        " to=self<|message|>hmm<|eom|><|start|>assistant to=user<|message|>Hi",
    );
    assert_eq!(
        (m.content.as_str(), m.reasoning_content.as_str()),
        ("hmmHi", "")
    );
}

#[test]
fn malformed_text_degrades_to_content() {
    let tools = ToolCallParser::new(&special_function());
    for (text, content) in [
        ("Hello there", "Hello there"),
        ("", ""),
        (
            " to=special_function<|message|><atem:function_calls>\n<atem:invoke name=\"special_function\">broken",
            "<atem:function_calls>\n<atem:invoke name=\"special_function\">broken",
        ),
        (
            " to=unknown_tool<|message|><atem:function_calls><atem:invoke name=\"unknown_tool\"></atem:invoke></atem:function_calls><|eot|>",
            "<atem:function_calls><atem:invoke name=\"unknown_tool\"></atem:invoke></atem:function_calls>",
        ),
        (" to=user<|message|>a<|eom|>garbage", "agarbage"),
        (" to=<|eot|>x", " to=<|eot|>x"),
        ("<|message|>direct answer<|eot|>", "direct answer"),
        (" to=user<|message|>cut at <|eo", "cut at <|eo"),
        (" to=self<|mess", ""),
        (" to=user<|message|>done<|eom|><|start|>assis", "done"),
    ] {
        let m = parse_all_ways(&tools, text);
        assert_eq!(m.content, content, "{text:?}");
        assert!(m.tool_calls.is_empty(), "{text:?}");
    }
    // A call to a tool that was not offered is content when no tools are offered at all.
    let m = parse_all_ways(
        &ToolCallParser::new(&[]),
        &format!(" to=special_function<|message|>{CALL_MARKUP}"),
    );
    assert_eq!(m.content, CALL_MARKUP);
}

#[test]
fn arguments_are_typed_by_the_schema() {
    let tools: Vec<Tool> = serde_json::from_value(json!([{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {
            "s": {"type": "string"}, "n": {"type": "number"}, "i": {"type": "integer"}, "b": {"type": "boolean"},
            "o": {"type": "object"}, "a": {"type": "array"}, "e": {"enum": ["1", "2"]}, "u": {"type": ["integer", "null"]},
            "any": {}}}}}]))
    .unwrap();
    let p = ToolCallParser::new(&tools);
    let body = "<atem:function_calls>\n<atem:invoke name=\"f\">\n\
        <atem:parameter name=\"s\"> 42 </atem:parameter>\n<atem:parameter name=\"n\">2.5</atem:parameter>\n\
        <atem:parameter name=\"i\">7</atem:parameter>\n<atem:parameter name=\"b\">true</atem:parameter>\n\
        <atem:parameter name=\"o\">{\"k\": [1, null]}</atem:parameter>\n<atem:parameter name=\"a\">[1, \"x\"]</atem:parameter>\n\
        <atem:parameter name=\"e\">1</atem:parameter>\n<atem:parameter name=\"u\">null</atem:parameter>\n\
        <atem:parameter name=\"any\">not json</atem:parameter>\n<atem:parameter name=\"extra\">9</atem:parameter>\n\
        </atem:invoke>\n</atem:function_calls>";
    let m = p.parse(&format!(" to=f<|message|>{body}<|eot|>"));
    assert_eq!(m.tool_calls.len(), 1);
    let a: Value = serde_json::from_str(&m.tool_calls[0].function.arguments).unwrap();
    assert_eq!(
        a,
        json!({"s": " 42 ", "n": 2.5, "i": 7, "b": true, "o": {"k": [1, null]}, "a": [1, "x"], "e": "1", "u": null, "any": "not json", "extra": "9"})
    );
    // Parameter order is kept.
    assert!(
        m.tool_calls[0]
            .function
            .arguments
            .starts_with(r#"{"s":" 42 ","n":2.5,"i":7"#)
    );
}

/// A recipient of any length that reaches `<|message|>` is a header, as the anchor's
/// `until("<|message|>")` reads it, whole or streamed (its forced-call grammar lets a random model
/// write one of hundreds of bytes); one that never reaches it is content when long, and an
/// unfinished header, dropped, when short.
#[test]
fn long_recipients_read_the_same_whole_and_streamed() {
    let p = ToolCallParser::from_json(Some(&json!([{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}}])))
    .unwrap();
    let call = "<atem:function_calls>\n<atem:invoke name=\"f\">\n\
        <atem:parameter name=\"x\">1</atem:parameter>\n</atem:invoke>\n</atem:function_calls>";
    for n in [1usize, 255, 256, 257, 300, 1000] {
        let recipient = "a".repeat(n);
        // The header is read and dropped: a body that is no call is the message's content.
        let m = parse_all_ways(&p, &format!(" to={recipient}<|message|>hello<|eot|>"));
        assert_eq!(m.content, "hello", "{n}");
        assert!(m.tool_calls.is_empty(), "{n}");
        let m = parse_all_ways(&p, &format!(" to={recipient}<|message|>{call}<|eot|>"));
        assert_eq!(m.content, "", "{n}");
        assert_eq!(m.tool_calls.len(), 1, "{n}");
        assert_eq!(m.tool_calls[0].function.name, "f", "{n}");
        let open = format!(" to={recipient}");
        let m = parse_all_ways(&p, &open);
        if n >= 256 + "<|message|>".len() {
            assert_eq!(m.content, open, "{n}");
        } else {
            assert_eq!(m.content, "", "{n}");
        }
        assert!(m.tool_calls.is_empty(), "{n}");
    }
}

/// A tool given as the function itself ({"name", "parameters"}, which the template renders as
/// well) types its arguments as the OpenAI form does.
#[test]
fn flat_tools_are_read_as_the_openai_form() {
    let params =
        json!({"type": "object", "properties": {"s": {"type": "string"}, "n": {"type": "number"}}});
    let nested = ToolCallParser::from_json(Some(
        &json!([{"type": "function", "function": {"name": "f", "parameters": params}}]),
    ))
    .unwrap();
    let flat =
        ToolCallParser::from_json(Some(&json!([{"name": "f", "parameters": params}]))).unwrap();
    let text = " to=f<|message|><atem:function_calls>\n<atem:invoke name=\"f\">\n\
        <atem:parameter name=\"s\">7</atem:parameter>\n<atem:parameter name=\"n\">7</atem:parameter>\n\
        </atem:invoke>\n</atem:function_calls><|eot|>";
    let (a, b) = (nested.parse(text), flat.parse(text));
    assert_eq!(a.tool_calls.len(), 1);
    assert_eq!(a.tool_calls[0].function.arguments, r#"{"s":"7","n":7}"#);
    assert_eq!(
        a.tool_calls[0].function.arguments,
        b.tool_calls[0].function.arguments
    );
    for bad in [
        json!([{"description": "no name"}]),
        json!({"name": "f"}),
        json!([7]),
    ] {
        assert!(ToolCallParser::from_json(Some(&bad)).is_err(), "{bad}");
    }
}

/// Render an assistant tool call with the real template, parse the generated part back.
#[test]
fn template_round_trip() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let g = Gguf::open(dir.join("glimmer-mini.gguf")).unwrap();
    let t = ChatTemplate::from_gguf(&g).unwrap();
    let tok = Tokenizer::from_gguf(&g).unwrap();
    let golden: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("golden/template.json")).unwrap())
            .unwrap();
    let tools_json = golden["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "parallel_tool_calls")
        .unwrap()["tools"]
        .clone();
    let tools: Vec<Tool> = serde_json::from_value(tools_json.clone()).unwrap();
    let p = ToolCallParser::new(&tools);
    let date = json!({"current_date": "2026-08-15"});
    let user = json!({"role": "user", "content": "Search and weather"});
    let calls = json!([
        {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 3, "unit": "celsius"}}},
        {"id": "b", "type": "function", "function": {"name": "browser.search", "arguments": {
            "query": "  spaced  <b>&amp;</b>\nline2 ", "filters": {"site": "example.org", "recent": true}, "top_k": null}}}
    ]);
    for (reasoning, content) in [
        (None, None::<&str>),
        (Some("Let me look.\nTwo tools."), None),
    ] {
        let mut a = json!({"role": "assistant", "tool_calls": calls});
        if let Some(r) = reasoning {
            a["reasoning_content"] = json!(r);
        }
        if let Some(c) = content {
            a["content"] = json!(c);
        }
        let prompt = t
            .render(&json!([user]), Some(&tools_json), true, date.as_object())
            .unwrap();
        let full = t
            .render(
                &json!([user, a]),
                Some(&tools_json),
                false,
                date.as_object(),
            )
            .unwrap();
        let generated = full
            .strip_prefix(&prompt)
            .expect("the generation prompt is a prefix");
        // What the model would emit, through the tokenizer and back with special tokens kept.
        let ids = tok.encode(generated, false, true).unwrap();
        let text = tok.decode(&ids, false).unwrap();
        assert_eq!(text, generated);
        let m = parse_all_ways(&p, text.strip_suffix("<|eot|>").unwrap());
        assert_eq!(m.reasoning_content, reasoning.unwrap_or(""));
        assert_eq!(m.tool_calls.len(), 2);
        for (i, call) in calls.as_array().unwrap().iter().enumerate() {
            assert_eq!(
                m.tool_calls[i].function.name,
                call["function"]["name"].as_str().unwrap()
            );
            assert_eq!(args(&m, i), call["function"]["arguments"]);
        }
        // And the parsed message renders back to the same text.
        let mut back = serde_json::to_value(m.clone().into_message()).unwrap();
        for (i, c) in back["tool_calls"]
            .as_array_mut()
            .unwrap()
            .iter_mut()
            .enumerate()
        {
            c["id"] = calls[i]["id"].clone();
        }
        let again = t
            .render(
                &json!([user, back]),
                Some(&tools_json),
                false,
                date.as_object(),
            )
            .unwrap();
        assert_eq!(again, full);
    }
}
