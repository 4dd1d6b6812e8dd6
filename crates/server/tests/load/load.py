#!/usr/bin/env python3
"""Load test for `muser serve`: N concurrent streaming chat clients for a fixed time.

Standard library only (asyncio and a minimal HTTP/1.1 client, so the client's own cost stays
small next to the server's). Each client loops: one streaming chat completion with
`stream_options.include_usage`, a random short conversation and a random max_tokens, reading
every chunk to `data: [DONE]`; then the next. The server's memory (VmRSS of --server-pid) and a
few /metrics gauges are sampled every --sample-every seconds.

With --turns N each client keeps a conversation for N requests (its answers and a new user
message appended each time), so prompts repeat what the server has seen (prefix reuse: the
report sums usage's prompt_tokens and prompt_tokens_details.cached_tokens).

Reported: requests ok / failed (non-200, an error chunk, a stream without [DONE], a connection
error, a usage count that disagrees with the chunks), completion tokens and tokens/s, time to
first token (request sent -> first SSE chunk, which the server sends with the first generated
token) p50/p90/p99, request latency, and memory over time.

Targets only the loopback address given with --url; stops by itself after --duration seconds
plus the time the last requests take to finish.

    muser serve -m tests/fixtures/models/tame-q4_k_m.gguf --parallel 64 --port 8080 &
    python3 crates/server/tests/load/load.py --url http://127.0.0.1:8080 --clients 64 \\
        --duration 300 --server-pid $! --out /tmp/load.json
"""

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
import urllib.parse

PROMPTS = [
    "Hello!",
    "Write a haiku about the sea.",
    "Explain continuous batching in two sentences.",
    "What is the capital of France? Answer in one word.",
    "List five prime numbers and say why each is prime, step by step, in detail.",
    "Translate 'good morning' into French, German, Spanish and Italian.",
    "Summarise the plot of a story about a robot who learns to paint, in a paragraph.",
]


def pct(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


class Stats:
    def __init__(self):
        self.ok = 0
        self.failed = 0
        self.failures = {}
        self.tokens = 0
        self.ttft = []
        self.latency = []
        self.chunks = 0
        self.prompt_tokens = 0
        self.cached_tokens = 0

    def fail(self, why):
        self.failed += 1
        self.failures[why] = self.failures.get(why, 0) + 1


async def stream_chat(host, port, path, body, headers):
    """Returns (status, ttft_s, chunks(list of dicts), done_seen, error_body)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        data = json.dumps(body).encode()
        head = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", "Content-Type: application/json",
                f"Content-Length: {len(data)}", "Connection: close"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        t0 = time.perf_counter()
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + data)
        await writer.drain()
        status_line = await reader.readline()
        status = int(status_line.split()[1])
        hdrs = {}
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b""):
                break
            k, _, v = line.decode().partition(":")
            hdrs[k.strip().lower()] = v.strip()
        if status != 200:
            rest = await reader.read()
            return status, None, [], False, rest[:300]
        chunked = "chunked" in hdrs.get("transfer-encoding", "")
        buf = b""
        ttft = None
        chunks = []
        done = False
        while True:
            if chunked:
                size_line = await reader.readline()
                if not size_line:
                    break
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    break
                piece = await reader.readexactly(size + 2)
                buf += piece[:-2]
            else:
                piece = await reader.read(65536)
                if not piece:
                    break
                buf += piece
            while b"\n\n" in buf:
                ev, buf = buf.split(b"\n\n", 1)
                for line in ev.split(b"\n"):
                    if not line.startswith(b"data:"):
                        continue
                    payload = line[5:].strip()
                    if ttft is None:
                        ttft = time.perf_counter() - t0
                    if payload == b"[DONE]":
                        done = True
                    else:
                        chunks.append(json.loads(payload))
            if done:
                break
        return status, ttft, chunks, done, None
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except Exception:
            pass


def system_prompt(words):
    """The same long system prompt for every request (--system-words): a deployment's
    instructions, which every conversation begins with."""
    base = ("You are the assistant of a library. Answer questions about books, opening hours, "
            "loans and events, politely and in short sentences. Never invent a title. ").split()
    return " ".join(base[k % len(base)] for k in range(words))


async def client(i, args, stats, deadline):
    u = urllib.parse.urlparse(args.url)
    rng = random.Random(args.seed * 1000 + i)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    turns, turn = [], 0
    while time.time() < deadline:
        if turn % args.turns == 0:
            turns = [{"role": "user", "content": rng.choice(PROMPTS)}]
            if args.system_words > 0:
                turns = [{"role": "system", "content": system_prompt(args.system_words)}] + turns
            elif rng.random() < 0.3:
                turns = [{"role": "system", "content": "You are a helpful assistant."}] + turns
        else:
            turns.append({"role": "user", "content": rng.choice(PROMPTS)})
        turn += 1
        max_tokens = rng.randint(args.min_tokens, args.max_tokens)
        body = {"model": args.model, "max_tokens": max_tokens, "stream": True,
                "stream_options": {"include_usage": True}, "temperature": 0.8, "seed": rng.randrange(1 << 30)}
        if args.top_p < 1.0:
            body["top_p"] = args.top_p
        if args.top_k > 0:
            body["top_k"] = args.top_k
        if args.logprobs >= 0:
            if args.endpoint == "chat":
                body["logprobs"] = True
                body["top_logprobs"] = args.logprobs
            else:
                body["logprobs"] = args.logprobs
        if args.endpoint == "chat":
            body["messages"] = turns
            path = "/v1/chat/completions"
        else:
            # The same conversation as plain text: no chat template, no parsing of the output.
            body["prompt"] = "".join(f"{t['role']}: {t['content']}\n" for t in turns) + "assistant:"
            path = "/v1/completions"
        if args.ignore_eos:
            body["ignore_eos"] = True
        if args.json_schema:
            # llama.cpp's field, which both servers take on either endpoint.
            body["json_schema"] = json.loads(args.json_schema)
        if args.tools:
            # Tools offered, the model free to call one (`auto`): its answer is constrained only
            # from a call it begins on (llama.cpp's lazy grammar).
            body["tools"] = TOOLS
            body["tool_choice"] = "auto"
        t0 = time.perf_counter()
        try:
            status, ttft, chunks, done, err = await asyncio.wait_for(
                stream_chat(u.hostname, u.port or 80, path, body, headers), args.timeout)
        except Exception as e:
            stats.fail(type(e).__name__)
            continue
        if status != 200:
            stats.fail(f"http {status}")
            if args.verbose:
                print(f"client {i}: {status} {err}", file=sys.stderr)
            continue
        if any("error" in c for c in chunks):
            stats.fail("error chunk")
            continue
        if not done:
            stats.fail("no [DONE]")
            continue
        usage = chunks[-1].get("usage") if chunks else None
        finishes = [c["choices"][0].get("finish_reason") for c in chunks if c.get("choices")]
        finishes = [f for f in finishes if f]
        if not usage and args.usage_from_chunks:
            # Servers that leave usage out: llama-server's own count (timings.predicted_n) when
            # it sends one, else one token per chunk that carries text (an undercount where a
            # token is part of a character).
            timed = [c["timings"]["predicted_n"] for c in chunks
                     if isinstance(c.get("timings"), dict) and "predicted_n" in c["timings"]]
            n = timed[-1] if timed else sum(1 for c in chunks if c.get("choices") and (
                c["choices"][0].get("text") or (c["choices"][0].get("delta") or {}).get("content")))
            usage = {"completion_tokens": n}
        if not usage or len(finishes) != 1 or usage["completion_tokens"] > max_tokens:
            stats.fail("bad usage/finish")
            continue
        stats.ok += 1
        stats.tokens += usage["completion_tokens"]
        stats.prompt_tokens += usage.get("prompt_tokens", 0)
        stats.cached_tokens += (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0) or 0
        # The answer joins the conversation for the next turn.
        answer = "".join((c["choices"][0].get("text") or (c["choices"][0].get("delta") or {}).get("content") or "")
                         for c in chunks if c.get("choices"))
        turns.append({"role": "assistant", "content": answer})
        stats.chunks += len(chunks)
        stats.ttft.append(ttft)
        stats.latency.append(time.perf_counter() - t0)


def rss_kib(pid):
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    k, v = line.split(":")
                    out[k] = int(v.split()[0])
    except OSError:
        pass
    return out


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city, for a number of days.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city"]}}}]


async def scrape(args):
    u = urllib.parse.urlparse(args.url)
    try:
        reader, writer = await asyncio.open_connection(u.hostname, u.port or 80)
        auth = f"Authorization: Bearer {args.api_key}\r\n" if args.api_key else ""
        writer.write(f"GET /metrics HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n".encode())
        await writer.drain()
        text = (await reader.read()).decode(errors="replace")
        writer.close()
    except OSError:
        return {}
    want = ("muser_tokens_per_second", "muser_queue_depth", "muser_sequences_running",
            "muser_kv_cache_used_bytes", "muser_kv_cache_reserved_bytes", "muser_generation_tokens_total",
            "muser_step_seconds_sum", "muser_step_seconds_count",
            "muser_forward_seconds_sum", "muser_forward_seconds_count",
            "muser_sample_seconds_sum", "muser_sample_seconds_count")
    out = {}
    for line in text.splitlines():
        name = line.split("{")[0].split(" ")[0]
        # Where tokens were drawn: next to the logits (device) or on the host.
        if name == "muser_draws_total":
            where = "device" if 'where="device"' in line else "host"
            try:
                out[f"draws_{where}"] = float(line.rsplit(" ", 1)[1])
            except ValueError:
                pass
        if name in want:
            try:
                out[name] = float(line.rsplit(" ", 1)[1])
            except ValueError:
                pass
    return out


def metric_delta(samples, key):
    """A counter's growth between the first and last /metrics samples that have it."""
    have = [s[key] for s in samples if key in s]
    return have[-1] - have[0] if len(have) >= 2 else None


def step_ms_mean(samples, name="muser_step_seconds"):
    """Mean milliseconds of a Muser histogram (engine steps by default) between the first and
    last /metrics samples that have it."""
    have = [s for s in samples if f"{name}_count" in s and f"{name}_sum" in s]
    if len(have) < 2:
        return None
    n = have[-1][f"{name}_count"] - have[0][f"{name}_count"]
    t = have[-1][f"{name}_sum"] - have[0][f"{name}_sum"]
    return round(1000 * t / n, 2) if n > 0 else None


async def sampler(args, stats, t_start, samples, stop):
    while not stop.is_set():
        s = {"t": round(time.time() - t_start, 1), "ok": stats.ok, "failed": stats.failed, "tokens": stats.tokens}
        if args.server_pid:
            s.update(rss_kib(args.server_pid))
        s.update(await scrape(args))
        samples.append(s)
        if args.verbose:
            print(json.dumps(s), file=sys.stderr)
        try:
            await asyncio.wait_for(stop.wait(), args.sample_every)
        except asyncio.TimeoutError:
            pass


async def main_async(args):
    stats = Stats()
    samples = []
    t_start = time.time()
    deadline = t_start + args.duration
    stop = asyncio.Event()
    samp = asyncio.create_task(sampler(args, stats, t_start, samples, stop))
    await asyncio.gather(*(client(i, args, stats, deadline) for i in range(args.clients)))
    wall = time.time() - t_start
    stop.set()
    await samp
    end = {"t": round(wall, 1), "ok": stats.ok, "failed": stats.failed, "tokens": stats.tokens}
    if args.server_pid:
        end.update(rss_kib(args.server_pid))
    samples.append(end)
    rss = [s["VmRSS"] for s in samples if "VmRSS" in s]
    # Memory after warm-up: the first minute fills caches and allocator pools.
    steady = [s["VmRSS"] for s in samples if "VmRSS" in s and s["t"] >= min(60, args.duration / 3)]
    ms = lambda x: None if x is None else round(x * 1000, 1)
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "url": args.url, "model": args.model, "clients": args.clients, "duration_s": round(wall, 1),
        "max_tokens_range": [args.min_tokens, args.max_tokens], "ignore_eos": args.ignore_eos,
        "json_schema": args.json_schema or None,
        "endpoint": args.endpoint,
        "requests_ok": stats.ok, "requests_failed": stats.failed, "failures": stats.failures,
        "completion_tokens": stats.tokens,
        "turns": args.turns,
        "prompt_tokens": stats.prompt_tokens,
        "cached_prompt_tokens": stats.cached_tokens,
        "tokens_per_s": round(stats.tokens / wall, 1),
        "requests_per_s": round(stats.ok / wall, 2),
        "ttft_ms": {"p50": ms(pct(stats.ttft, 50)), "p90": ms(pct(stats.ttft, 90)), "p99": ms(pct(stats.ttft, 99)),
                    "max": ms(max(stats.ttft) if stats.ttft else None)},
        "latency_ms": {"p50": ms(pct(stats.latency, 50)), "p99": ms(pct(stats.latency, 99))},
        # The server's own engine steps over the run (Muser's /metrics): mean milliseconds a step.
        "step_ms_mean": step_ms_mean(samples),
        # Its parts: the model's forward passes (logits on the host included) and the sampling,
        # per forward call (a step makes one per group of sequences).
        "forward_ms_mean": step_ms_mean(samples, "muser_forward_seconds"),
        "sample_ms_mean": step_ms_mean(samples, "muser_sample_seconds"),
        # Tokens drawn over the run, where (Muser's /metrics).
        "draws": {w: metric_delta(samples, f"draws_{w}") for w in ("device", "host")},
        "rss_kib": {"first": rss[0] if rss else None, "min": min(rss) if rss else None,
                    "max": max(rss) if rss else None, "last": rss[-1] if rss else None,
                    "steady_min": min(steady) if steady else None, "steady_max": max(steady) if steady else None},
        "samples": samples,
    }
    return report


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--model", default="tame-q4_k_m")
    p.add_argument("--api-key", default="")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--duration", type=float, default=300)
    p.add_argument("--min-tokens", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--ignore-eos", action="store_true", help="always generate max_tokens")
    p.add_argument("--endpoint", choices=["chat", "completions"], default="chat",
                   help="chat: /v1/chat/completions; completions: /v1/completions with the conversation as text")
    p.add_argument("--tools", action="store_true",
                   help="chat: offer a tool on every request, tool_choice auto")
    p.add_argument("--json-schema", default="",
                   help="a JSON schema (text) every output must satisfy, sent as llama.cpp's json_schema field")
    p.add_argument("--turns", type=int, default=1,
                   help="requests per conversation: each appends the answer and a new user message")
    p.add_argument("--usage-from-chunks", action="store_true",
                   help="count tokens from the chunks when a server sends no usage (other servers only)")
    p.add_argument("--timeout", type=float, default=120, help="seconds one request may take")
    p.add_argument("--server-pid", type=int, default=0)
    p.add_argument("--sample-every", type=float, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0, help="each request's top_p (1: not sent)")
    p.add_argument("--top-k", type=int, default=0, help="each request's top_k (0: not sent)")
    p.add_argument("--system-words", type=int, default=0,
                   help="every request begins with the same system prompt of this many words (0: none)")
    p.add_argument("--logprobs", type=int, default=-1,
                   help="each request's logprobs with this many alternatives (-1: not sent)")
    p.add_argument("--out", default="")
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args()
    host = urllib.parse.urlparse(args.url).hostname
    if host not in ("127.0.0.1", "localhost", "::1") and not host.startswith("127."):
        sys.exit(f"refusing to load-test {host}: loopback addresses only")
    report = asyncio.run(main_async(args))
    summary = {k: v for k, v in report.items() if k != "samples"}
    print(json.dumps(summary, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
    sys.exit(1 if report["requests_failed"] else 0)


if __name__ == "__main__":
    main()
