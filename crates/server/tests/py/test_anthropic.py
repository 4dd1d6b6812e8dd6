"""The official `anthropic` Python client against a live `muser serve` on a fixture model.

Run by `cargo test -p muser-server --test python_clients` (which starts the server); by hand:
    python test_anthropic.py --base-url http://127.0.0.1:8080 --model tame-q4_k_m --api-key K

The fixture model has random weights: these tests check the Messages API as the client sees it
(types, stop reasons, usage, streaming events and the message they build, tool use and its
result, token counting, errors), not text quality. `seed` and `chat_template_kwargs` are Muser's
extensions, sent with `extra_body`.
"""

import argparse
import sys
import traceback

import anthropic

ARGS = None
# The fixture's template dates its system prompt by default: pin it, so that answers repeat.
KWARGS = {"current_date": "2026-01-01"}


def client(api_key=None):
    return anthropic.Anthropic(
        base_url=ARGS.base_url, api_key=api_key or ARGS.api_key, max_retries=0, timeout=60
    )


def extra(seed=1):
    return {"seed": seed, "chat_template_kwargs": KWARGS}


def test_message():
    m = client().messages.create(
        model=ARGS.model,
        max_tokens=8,
        system="Be brief.",
        messages=[{"role": "user", "content": "Hello!"}],
        extra_body=extra(),
    )
    assert m.type == "message" and m.role == "assistant", m
    assert m.model == ARGS.model, m.model
    assert m.id.startswith("msg_"), m.id
    assert m.stop_reason in ("end_turn", "max_tokens"), m.stop_reason
    assert m.usage.output_tokens <= 8 and m.usage.output_tokens > 0, m.usage
    assert m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) > 0, m.usage
    assert all(b.type in ("text", "thinking") for b in m.content), m.content
    # The same request again: the same blocks (seeded).
    again = client().messages.create(
        model=ARGS.model,
        max_tokens=8,
        system="Be brief.",
        messages=[{"role": "user", "content": "Hello!"}],
        extra_body=extra(),
    )
    assert [b.model_dump() for b in again.content] == [b.model_dump() for b in m.content]


def test_stream_builds_the_same_message():
    kw = dict(
        model=ARGS.model,
        max_tokens=24,
        messages=[{"role": "user", "content": "Tell me a story."}],
        extra_body=extra(7),
    )
    whole = client().messages.create(**kw)
    texts = []
    with client().messages.stream(**kw) as s:
        for t in s.text_stream:
            texts.append(t)
        final = s.get_final_message()
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in whole.content], (
        final.content,
        whole.content,
    )
    assert "".join(texts) == "".join(b.text for b in whole.content if b.type == "text")
    assert final.stop_reason == whole.stop_reason, (final.stop_reason, whole.stop_reason)
    assert final.usage.output_tokens == whole.usage.output_tokens, (final.usage, whole.usage)


def test_count_tokens():
    messages = [{"role": "user", "content": "How many tokens is this?"}]
    n = client().messages.count_tokens(model=ARGS.model, messages=messages, extra_body={"chat_template_kwargs": KWARGS})
    m = client().messages.create(model=ARGS.model, max_tokens=1, messages=messages, extra_body=extra())
    assert n.input_tokens == m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0), (n, m.usage)
    more = client().messages.count_tokens(
        model=ARGS.model,
        messages=messages + [{"role": "assistant", "content": "Some."}, {"role": "user", "content": "And now?"}],
        extra_body={"chat_template_kwargs": KWARGS},
    )
    assert more.input_tokens > n.input_tokens, (more, n)


def test_stop_sequence():
    kw = dict(model=ARGS.model, max_tokens=40, messages=[{"role": "user", "content": "Count."}], extra_body=extra(3))
    free = client().messages.create(**kw)
    text = "".join(b.text for b in free.content if b.type == "text")
    words = text.split()
    if len(words) < 3:
        print(f"  (the answer {text!r} has too few words for a stop sequence: checked nothing more)")
        return
    stop = words[2]
    m = client().messages.create(stop_sequences=[stop], **kw)
    got = "".join(b.text for b in m.content if b.type == "text")
    assert m.stop_reason == "stop_sequence", m
    assert m.stop_sequence == stop, m.stop_sequence
    assert stop not in got and text.startswith(got), (got, text, stop)


def test_tool_use_round_trip():
    tools = [
        {
            "name": "get_weather",
            "description": "Weather of a city",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        }
    ]
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    for seed in range(5):
        m = client().messages.create(
            model=ARGS.model,
            max_tokens=320,
            tools=tools,
            tool_choice={"type": "any"},
            messages=messages,
            extra_body=extra(seed),
        )
        if m.stop_reason == "max_tokens":
            continue
        assert m.stop_reason == "tool_use", m
        uses = [b for b in m.content if b.type == "tool_use"]
        assert uses, m.content
        for u in uses:
            assert u.name == "get_weather" and isinstance(u.input, dict), u
            assert set(u.input) <= {"city"}, u.input
        # The streamed message is the same, the ids aside (fresh in every answer).
        with client().messages.stream(
            model=ARGS.model,
            max_tokens=320,
            tools=tools,
            tool_choice={"type": "any"},
            messages=messages,
            extra_body=extra(seed),
        ) as s:
            final = s.get_final_message()

        def no_ids(blocks):
            return [{**b.model_dump(), "id": None} if b.type == "tool_use" else b.model_dump() for b in blocks]

        assert no_ids(final.content) == no_ids(m.content), (final.content, m.content)
        assert final.stop_reason == "tool_use"
        # The result goes back; the conversation goes on.
        follow = client().messages.create(
            model=ARGS.model,
            max_tokens=8,
            tools=tools,
            messages=messages
            + [
                {"role": "assistant", "content": m.content},
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "Sunny, 21 C"}],
                },
            ],
            extra_body=extra(seed),
        )
        assert follow.stop_reason in ("end_turn", "max_tokens", "tool_use"), follow
        return
    raise AssertionError("no seed of 5 ended in a tool use")


def test_errors():
    try:
        client().messages.create(
            model=ARGS.model,
            max_tokens=8,
            messages=[
                {
                    "role": "user",
                    "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}],
                }
            ],
        )
        raise AssertionError("an image was accepted")
    except anthropic.BadRequestError as e:
        assert e.body["type"] == "error" and e.body["error"]["type"] == "invalid_request_error", e.body
        assert "image" in e.body["error"]["message"], e.body
    try:
        client().messages.create(model="no-such-model", max_tokens=8, messages=[{"role": "user", "content": "Hi"}])
        raise AssertionError("an unknown model was accepted")
    except anthropic.NotFoundError as e:
        assert e.body["error"]["type"] == "not_found_error", e.body
    try:
        client(api_key="wrong-key").messages.create(
            model=ARGS.model, max_tokens=8, messages=[{"role": "user", "content": "Hi"}]
        )
        raise AssertionError("a wrong key was accepted")
    except anthropic.AuthenticationError as e:
        assert e.body["error"]["type"] == "authentication_error", e.body
    # The server still serves.
    test_message()


TESTS = [
    test_message,
    test_stream_builds_the_same_message,
    test_count_tokens,
    test_stop_sequence,
    test_tool_use_round_trip,
    test_errors,
]


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("--base-url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--api-key", required=True)
    ARGS = p.parse_args()
    print(f"anthropic {anthropic.__version__}")
    failed = 0
    for t in TESTS:
        try:
            t()
            print(f"ok   {t.__name__}")
        except Exception:
            failed += 1
            print(f"FAIL {t.__name__}")
            traceback.print_exc(file=sys.stdout)
    print(f"{len(TESTS) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
