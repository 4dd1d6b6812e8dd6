//! The tokenizer refuses a vocabulary it cannot read as its writer meant: no token types (the
//! control tokens could not be told apart), no end-of-turn id in a Muse Glimmer (llama4)
//! vocabulary, a type value llama.cpp does not define, a flag of the wrong type, a true
//! `add_space_prefix` (llama.cpp would drop a leading space in detokenizing). Each case edits the metadata of tests/data/glimmer-mini.gguf.

use muser_gguf::{Array, Gguf, GgufWriter, Value};
use muser_text::Tokenizer;

fn edited(edit: impl Fn(&mut Vec<(String, Value)>)) -> Result<Tokenizer, String> {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/glimmer-mini.gguf");
    let g = Gguf::open(path).map_err(|e| e.to_string())?;
    let mut kv = g.metadata().to_vec();
    edit(&mut kv);
    let mut w = GgufWriter::new();
    for (k, v) in &kv {
        w.add(k, v.clone()).map_err(|e| e.to_string())?;
    }
    let g =
        Gguf::from_bytes(w.to_bytes().map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
    Tokenizer::from_gguf(&g).map_err(|e| e.to_string())
}

fn refused(edit: impl Fn(&mut Vec<(String, Value)>), needles: &[&str]) {
    match edited(edit) {
        Ok(_) => panic!("accepted a vocabulary that should be refused ({needles:?})"),
        Err(e) => {
            for n in needles {
                assert!(e.contains(n), "error {e:?} does not mention {n:?}");
            }
        }
    }
}

const TYPES: &str = "tokenizer.ggml.token_type";

#[test]
fn the_unedited_vocabulary_loads() {
    assert!(edited(|_| {}).is_ok());
}

#[test]
fn missing_types_unknown_types_and_mistyped_flags_are_refused() {
    refused(|kv| kv.retain(|(k, _)| k != TYPES), &[TYPES, "missing"]);
    refused(
        |kv| kv.retain(|(k, _)| k != "tokenizer.ggml.eot_token_id"),
        &["tokenizer.ggml.eot_token_id", "missing"],
    );
    refused(
        |kv| {
            for (k, v) in kv.iter_mut() {
                if k == TYPES
                    && let Value::Array(Array::I32(t)) = v
                {
                    t[3] = 9;
                }
            }
        },
        &[TYPES, "[3] = 9", "not a token type"],
    );
    refused(
        |kv| {
            kv.retain(|(k, _)| k != "tokenizer.ggml.add_bos_token");
            kv.push((
                "tokenizer.ggml.add_bos_token".into(),
                Value::String("true".into()),
            ));
        },
        &["tokenizer.ggml.add_bos_token", "a bool"],
    );
    refused(
        |kv| kv.push(("tokenizer.ggml.add_space_prefix".into(), Value::Bool(true))),
        &["tokenizer.ggml.add_space_prefix", "true"],
    );
    refused(
        |kv| kv.push(("tokenizer.ggml.add_space_prefix".into(), Value::U32(1))),
        &["tokenizer.ggml.add_space_prefix", "a bool"],
    );
    // False is the converter's value for byte-level BPE: accepted.
    assert!(
        edited(|kv| kv.push(("tokenizer.ggml.add_space_prefix".into(), Value::Bool(false))))
            .is_ok()
    );
}

/// Keys llama.cpp acts on and Muser does not implement: a true `add_eos_token` (EOS appended to
/// every prompt) and a `suppress_tokens` list (never sampled); and a vocabulary without one of
/// the 256 byte-level tokens (that byte could not be encoded).
#[test]
fn appended_eos_suppressed_tokens_and_missing_bytes_are_refused() {
    refused(
        |kv| kv.push(("tokenizer.ggml.add_eos_token".into(), Value::Bool(true))),
        &["tokenizer.ggml.add_eos_token", "appends EOS"],
    );
    assert!(
        edited(|kv| kv.push(("tokenizer.ggml.add_eos_token".into(), Value::Bool(false)))).is_ok()
    );
    refused(
        |kv| {
            kv.push((
                "tokenizer.ggml.suppress_tokens".into(),
                Value::Array(Array::I32(vec![5, 7])),
            ))
        },
        &["tokenizer.ggml.suppress_tokens"],
    );
    assert!(
        edited(|kv| kv.push((
            "tokenizer.ggml.suppress_tokens".into(),
            Value::Array(Array::I32(vec![]))
        )))
        .is_ok()
    );
    // 'z' renamed: byte 0x7a has no token.
    refused(
        |kv| {
            for (k, v) in kv.iter_mut() {
                if k == "tokenizer.ggml.tokens"
                    && let Value::Array(Array::String(t)) = v
                {
                    let i = t.iter().position(|s| s == "z").unwrap();
                    t[i] = "z-renamed".into();
                }
            }
        },
        &["byte 0x7a"],
    );
}

/// A missing pre-tokenizer name, or a model or pre-tokenizer name that is not a string, is
/// named as what it is (not as the name 'default', nor as missing).
#[test]
fn missing_and_mistyped_names_say_so() {
    refused(
        |kv| kv.retain(|(k, _)| k != "tokenizer.ggml.pre"),
        &["missing 'tokenizer.ggml.pre'", "'default' pre-tokenizer"],
    );
    refused(
        |kv| {
            for (k, v) in kv.iter_mut() {
                if k == "tokenizer.ggml.pre" {
                    *v = Value::U32(4);
                }
            }
        },
        &["'tokenizer.ggml.pre' should be a string"],
    );
    refused(
        |kv| {
            for (k, v) in kv.iter_mut() {
                if k == "tokenizer.ggml.model" {
                    *v = Value::U32(4);
                }
            }
        },
        &["'tokenizer.ggml.model' should be a string"],
    );
}
