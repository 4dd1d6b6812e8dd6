"""The official `openai` Python client against a live `muser serve` on a fixture model.

Run by `cargo test -p muser-server --test python_clients` (which starts the server); by hand:
    python test_openai.py --base-url http://127.0.0.1:8080/v1 --model tame-q4_k_m

The fixture model has random weights: these tests check the protocol as the client sees it
(types, counts, streaming, tool-call history, logprobs, errors, cancellation), not text quality.
"""

import argparse
import json
import sys
import time
import traceback

import httpx
import openai

ARGS = None


def client():
    return openai.OpenAI(base_url=ARGS.base_url, api_key=ARGS.api_key or "none", max_retries=0, timeout=60)


def metric(name, labels=""):
    root = ARGS.base_url.rsplit("/v1", 1)[0]
    headers = {"Authorization": f"Bearer {ARGS.api_key}"} if ARGS.api_key else {}
    text = httpx.get(f"{root}/metrics", headers=headers, timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        if head.split("{")[0] == name and labels in head:
            total += float(value)
    return total


def test_models():
    models = client().models.list()
    ids = [m.id for m in models.data]
    assert ids == [ARGS.model], ids


def test_chat():
    r = client().chat.completions.create(
        model=ARGS.model,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}],
        max_tokens=8,
        seed=1,
        extra_body={"ignore_eos": True},
    )
    assert r.object == "chat.completion"
    assert r.model == ARGS.model
    c = r.choices[0]
    assert c.message.role == "assistant"
    assert isinstance(c.message.content, str)
    assert c.finish_reason == "length"
    assert r.usage.completion_tokens == 8
    assert r.usage.total_tokens == r.usage.prompt_tokens + 8


def test_chat_seed_and_n():
    kw = dict(model=ARGS.model, messages=[{"role": "user", "content": "Hi"}], max_tokens=10,
              temperature=1.0, seed=42, extra_body={"ignore_eos": True})
    a = client().chat.completions.create(**kw)
    b = client().chat.completions.create(**kw)
    assert a.choices[0].message.content == b.choices[0].message.content
    three = client().chat.completions.create(n=3, **kw)
    assert [c.index for c in three.choices] == [0, 1, 2]
    assert three.choices[0].message.content == a.choices[0].message.content
    assert three.usage.completion_tokens == 30


def test_completions():
    r = client().completions.create(model=ARGS.model, prompt="Once upon a time", max_tokens=12, seed=3,
                                    stop=["never-xyz"], extra_body={"ignore_eos": True})
    assert r.object == "text_completion"
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 12
    assert isinstance(r.choices[0].text, str)


def test_streaming_chat_with_usage():
    kw = dict(model=ARGS.model, messages=[{"role": "user", "content": "Count"}], max_tokens=16, seed=5,
              extra_body={"ignore_eos": True})
    whole = client().chat.completions.create(**kw)
    stream = client().chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == (whole.choices[0].message.content or ""), (text, whole.choices[0].message.content)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"], finishes
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 16
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_streaming_completions():
    stream = client().completions.create(model=ARGS.model, prompt="The", max_tokens=10, stream=True, seed=2,
                                         extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.object == "text_completion" for c in chunks)


def test_tool_call_round_trip():
    # The model's side of a tool call (ATEM markup -> tool_calls) is unit-tested with canned
    # text in crates/server/src/respond.rs: a random-weight model does not emit ATEM. Here the
    # client's side: offer a tool, send back the assistant's call and the tool's result, and
    # get the next turn.
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    messages = [{"role": "user", "content": "What's the weather in Paris?"}]
    first = client().chat.completions.create(model=ARGS.model, messages=messages, tools=tools, max_tokens=8)
    assert first.choices[0].finish_reason in ("stop", "length", "tool_calls")
    call = {"id": "call_abc123", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_abc123", "content": json.dumps({"temp_c": 21, "sky": "clear"})},
    ]
    second = client().chat.completions.create(model=ARGS.model, messages=messages, tools=tools, max_tokens=8)
    assert second.choices[0].message.role == "assistant"
    assert second.usage.prompt_tokens > first.usage.prompt_tokens
    # Streamed, the same request works too.
    chunks = list(client().chat.completions.create(model=ARGS.model, messages=messages, tools=tools,
                                                   max_tokens=4, stream=True))
    assert chunks[-1].choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_logprobs():
    r = client().chat.completions.create(model=ARGS.model, messages=[{"role": "user", "content": "Hi"}],
                                         max_tokens=5, logprobs=True, top_logprobs=3, seed=1,
                                         extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    assert len(content) == 5
    for t in content:
        assert t.logprob <= 0
        assert len(t.top_logprobs) == 3
        assert t.top_logprobs[0].logprob >= t.top_logprobs[-1].logprob
        assert isinstance(t.token, str) and isinstance(t.bytes, list)
    c = client().completions.create(model=ARGS.model, prompt="A", max_tokens=4, logprobs=2,
                                    extra_body={"ignore_eos": True})
    lp = c.choices[0].logprobs
    assert len(lp.tokens) == 4 and len(lp.token_logprobs) == 4 and len(lp.top_logprobs) == 4


def test_structured_outputs():
    # The client's own structured outputs: a pydantic model as a strict json_schema response
    # format, parsed back by the client. The random-weight model may run past max_tokens (the
    # client then raises), so several seeds are tried and those that end must parse.
    import pydantic

    class Answer(pydantic.BaseModel):
        ok: bool
        mood: str = pydantic.Field(json_schema_extra={"enum": ["good", "bad"]})

    parsed = 0
    for seed in range(6):
        try:
            # The template's date fixed: the same answers on every day the test runs.
            r = client().chat.completions.parse(model=ARGS.model, messages=[{"role": "user", "content": "JSON"}],
                                                response_format=Answer, max_tokens=150, seed=seed,
                                                extra_body={"chat_template_kwargs": {"current_date": "2026-08-15"}})
        except openai.LengthFinishReasonError:
            continue
        a = r.choices[0].message.parsed
        assert isinstance(a, Answer) and isinstance(a.ok, bool) and a.mood in ("good", "bad"), a
        parsed += 1
    assert parsed >= 2, parsed
    r = client().chat.completions.create(model=ARGS.model, messages=[{"role": "user", "content": "JSON"}],
                                         response_format={"type": "json_object"}, max_tokens=150, seed=1,
                                         temperature=0)
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_responses():
    # The Responses API: the same answer whole and streamed (the stream helper's final response),
    # its usage, a forced function call sent back with its output, the prompt's count.
    kw = dict(model=ARGS.model, instructions="Be brief.", input="Tell me a story.", max_output_tokens=24,
              extra_body={"seed": 5, "chat_template_kwargs": {"current_date": "2026-08-15"}})
    r = client().responses.create(**kw)
    assert r.object == "response" and r.id.startswith("resp_"), r
    assert r.status in ("completed", "incomplete"), r.status
    assert r.usage.output_tokens <= 24 and r.usage.input_tokens > 0, r.usage
    deltas = []
    with client().responses.stream(**kw) as s:
        for e in s:
            if e.type == "response.output_text.delta":
                deltas.append(e.delta)
        final = s.get_final_response()
    assert final.output_text == r.output_text, (final.output_text, r.output_text)
    assert "".join(deltas) == r.output_text
    assert [i.type for i in final.output] == [i.type for i in r.output]
    assert final.usage.output_tokens == r.usage.output_tokens

    tools = [{"type": "function", "name": "get_weather", "description": "Weather of a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
    for seed in range(5):
        first = client().responses.create(model=ARGS.model, input="Weather in Paris?", tools=tools,
                                          tool_choice="required", max_output_tokens=320,
                                          extra_body={"seed": seed, "chat_template_kwargs": {"current_date": "2026-08-15"}})
        calls = [i for i in first.output if i.type == "function_call"]
        if first.status == "incomplete" or not calls:
            continue
        assert calls[0].name == "get_weather" and isinstance(json.loads(calls[0].arguments), dict), calls[0]
        follow_input = [{"role": "user", "content": "Weather in Paris?"}] + [i.model_dump() for i in first.output] + [
            {"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny, 21 C"}]
        second = client().responses.create(model=ARGS.model, input=follow_input, tools=tools, max_output_tokens=8,
                                           extra_body={"seed": seed})
        assert second.usage.input_tokens > first.usage.input_tokens, (second.usage, first.usage)
        if hasattr(client().responses, "input_tokens"):
            n = client().responses.input_tokens.count(model=ARGS.model, input=follow_input, tools=tools)
            assert n.input_tokens == second.usage.input_tokens, (n, second.usage)
        break
    else:
        raise AssertionError("no seed of 5 ended in a function call")
    try:
        client().responses.create(model=ARGS.model, input="x", previous_response_id="resp_1")
        raise AssertionError("previous_response_id accepted")
    except openai.BadRequestError as e:
        assert e.body["param"] == "previous_response_id", e.body


def test_errors():
    c = client()
    try:
        c.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
        raise AssertionError("unknown model accepted")
    except openai.NotFoundError as e:
        assert e.status_code == 404
    try:
        c.chat.completions.create(model=ARGS.model, messages=[{"role": "user", "content": "x"}], max_tokens=-1)
        raise AssertionError("negative max_tokens accepted")
    except openai.BadRequestError as e:
        assert e.body["param"] == "max_tokens", e.body


def test_cancellation():
    before = metric("muser_sequences_finished_total", 'reason="cancelled"')
    stream = client().chat.completions.create(
        model=ARGS.model, messages=[{"role": "user", "content": "Go on forever"}],
        max_tokens=3000, stream=True, extra_body={"ignore_eos": True})
    seen = 0
    for _ in stream:
        seen += 1
        if seen == 3:
            break
    stream.close()
    deadline = time.time() + 10
    while metric("muser_sequences_finished_total", 'reason="cancelled"') < before + 1:
        assert time.time() < deadline, "the closed stream was not cancelled (running: %s, generated: %s)" % (
            metric("muser_sequences_running"), metric("muser_generation_tokens_total"))
        time.sleep(0.05)
    while metric("muser_sequences_running") != 0:
        assert time.time() < deadline, "the cancelled sequence still holds its slot"
        time.sleep(0.05)
    # The server goes on serving.
    r = client().completions.create(model=ARGS.model, prompt="ok", max_tokens=2)
    assert r.usage.completion_tokens <= 2


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("--base-url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--api-key", default="")
    ARGS = p.parse_args()
    tests = [(n, f) for n, f in globals().items() if n.startswith("test_") and callable(f)]
    failed = 0
    for name, f in tests:
        t0 = time.time()
        try:
            f()
            print(f"ok     {name} ({time.time() - t0:.2f}s)")
        except Exception:
            failed += 1
            print(f"FAILED {name}")
            traceback.print_exc()
    print(f"openai {openai.__version__}: {len(tests) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
