#!/usr/bin/env python3
"""Small timed probes of `muser serve` (standard library only; the H200 scripts run it).

  choices: R requests, C at a time, each asking n choices of a P-token prompt (random ids, a
           different prompt per request) and M tokens each (ignore_eos): wall time, completion
           tokens/s, mean and p99 latency of a request.
  echo:    R requests, C at a time, each scoring a P-token prompt (echo, max_tokens 0,
           logprobs 1): scored prompt tokens/s, and entries that are not a log-probability.
"""
import argparse
import concurrent.futures as cf
import json
import random
import time
import urllib.request


def post(url, body, timeout=600):
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def timed(url, bodies, conc):
    lat = []

    def one(b):
        t = time.time()
        v = post(url, b)
        lat.append(time.time() - t)
        return v

    t0 = time.time()
    with cf.ThreadPoolExecutor(conc) as ex:
        out = list(ex.map(one, bodies))
    return time.time() - t0, out, sorted(lat)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["choices", "echo"])
    p.add_argument("--url", default="http://127.0.0.1:8081")
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--conc", type=int, default=8)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--prompt", type=int, default=1024)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--vocab", type=int, default=200000, help="prompt ids are drawn from [low, vocab)")
    p.add_argument("--low", type=int, default=1000)
    p.add_argument("--label", default="")
    a = p.parse_args()
    rng = random.Random(1)
    prompts = [[rng.randrange(a.low, a.vocab) for _ in range(a.prompt)] for _ in range(a.requests)]
    if a.mode == "choices":
        bodies = [{"prompt": pr, "n": a.n, "max_tokens": a.max_tokens, "ignore_eos": True,
                   "temperature": 0.8, "seed": i} for i, pr in enumerate(prompts)]
        wall, out, lat = timed(a.url, bodies, a.conc)
        toks = sum(v["usage"]["completion_tokens"] for v in out)
        print(f"{a.label}choices: {a.requests} requests x n {a.n}, {a.prompt}-token prompts, {a.max_tokens} tokens, "
              f"{a.conc} at a time: {wall:.2f} s, {toks / wall:.1f} completion tokens/s, "
              f"latency mean {sum(lat) / len(lat):.2f} s p99 {lat[int(0.99 * (len(lat) - 1))]:.2f} s")
    else:
        bodies = [{"prompt": pr, "echo": True, "max_tokens": 0, "logprobs": 1} for pr in prompts]
        wall, out, lat = timed(a.url, bodies, a.conc)
        n = sum(len(v["choices"][0]["logprobs"]["token_logprobs"]) for v in out)
        bad = sum(1 for v in out for x in v["choices"][0]["logprobs"]["token_logprobs"][1:]
                  if not isinstance(x, (int, float)) or x > 0)
        print(f"{a.label}echo: {a.requests} prompts of {a.prompt} tokens scored, {a.conc} at a time: {wall:.2f} s, "
              f"{n / wall:.1f} scored tokens/s, latency mean {sum(lat) / len(lat):.2f} s, {bad} bad entries")


if __name__ == "__main__":
    main()
