//! The shared fixtures (tests/fixtures at the repository root, made by llama.cpp's converter from
//! random-weight Muse Glimmer checkpoints): their tokenizer and template load from full model
//! GGUFs, and their tokenizer cases (ids from transformers) match. Skipped if the fixtures are absent.

use muser_text::{ChatTemplate, Tokenizer};
use serde_json::Value;

fn fixtures() -> Option<std::path::PathBuf> {
    let d = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
    if d.join("golden/tokenizer_cases.json").is_file() && d.join("models").is_dir() {
        Some(d)
    } else {
        eprintln!("skipped: tests/fixtures not present");
        None
    }
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn fixture_models_tokenize_like_transformers() {
    let Some(d) = fixtures() else { return };
    let cases: Value = serde_json::from_str(
        &std::fs::read_to_string(d.join("golden/tokenizer_cases.json")).unwrap(),
    )
    .unwrap();
    let mut models = 0;
    for family in ["tame", "sharp"] {
        let path = d.join(format!("models/{family}-f32.gguf"));
        if !path.is_file() {
            continue;
        }
        let g = muser_gguf::Gguf::open(&path).unwrap();
        let tok = Tokenizer::from_gguf(&g).unwrap();
        ChatTemplate::from_gguf(&g).unwrap();
        for c in cases.as_array().unwrap() {
            let text = c["text"].as_str().unwrap();
            assert_eq!(
                tok.encode(text, false, true).unwrap(),
                ids(&c["ids"]),
                "{family} {text:?}"
            );
            assert_eq!(
                tok.encode(text, true, true).unwrap(),
                ids(&c["ids_with_special"]),
                "{family} {text:?}"
            );
            assert_eq!(
                tok.encode(text, false, false).unwrap(),
                ids(&c["ids_split_special"]),
                "{family} {text:?}"
            );
            assert_eq!(
                tok.decode(&ids(&c["ids"]), false).unwrap(),
                c["decoded"].as_str().unwrap(),
                "{family} {text:?}"
            );
        }
        models += 1;
    }
    assert!(models > 0, "no fixture model found");
}

/// llama.cpp's own tokenizer reference cases (models/ggml-vocab-llama-bpe.gguf.{inp,out}, ids made
/// by transformers with Llama-3's tokenizer): checks the Llama-3 split and `ignore_merges` path on a
/// real 128k vocabulary. Needs the llama.cpp sdist: MUSER_LLAMA_CPP=/path/to/llama.cpp.
#[test]
fn llama_cpp_llama_bpe_reference_cases() {
    let Some(dir) = std::env::var_os("MUSER_LLAMA_CPP").map(std::path::PathBuf::from) else {
        eprintln!("skipped: set MUSER_LLAMA_CPP to a llama.cpp source tree");
        return;
    };
    let base = dir.join("models/ggml-vocab-llama-bpe.gguf");
    let tok = Tokenizer::from_gguf_file(&base).unwrap();
    let inp = std::fs::read_to_string(base.with_extension("gguf.inp")).unwrap();
    let out = std::fs::read_to_string(base.with_extension("gguf.out")).unwrap();
    let texts: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
    let want: Vec<&str> = out.lines().collect();
    assert_eq!(texts.len() - 1, want.len());
    for (text, want) in texts.iter().zip(&want) {
        let want: Vec<u32> = want
            .split_whitespace()
            .map(|x| x.parse().unwrap())
            .collect();
        assert_eq!(tok.encode(text, false, false).unwrap(), want, "{text:?}");
        assert_eq!(tok.decode(&want, false).unwrap(), *text);
    }
    eprintln!("{} llama.cpp reference cases match", want.len());
}
