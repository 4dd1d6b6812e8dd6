//! Token ids and decodings against transformers' goldens (tests/tools/gen_golden.py), on two
//! vocabularies converted to GGUF by llama.cpp's own converter.

use muser_text::{TextError, TokenType, Tokenizer};
use serde_json::Value;

fn data(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn golden(vocab: &str) -> Value {
    let text = std::fs::read_to_string(data(&format!("golden/tokenizer-{vocab}.json"))).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn check_vocab(vocab: &str) {
    let tok = Tokenizer::from_gguf_file(data(&format!("{vocab}.gguf"))).unwrap();
    let g = golden(vocab);
    let mut failures = Vec::new();
    for case in g["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let checks = [
            (
                "ids",
                tok.encode(text, false, true).unwrap(),
                ids(&case["ids"]),
            ),
            (
                "ids_no_special",
                tok.encode(text, false, false).unwrap(),
                ids(&case["ids_no_special"]),
            ),
            (
                "ids_bos",
                tok.encode(text, true, true).unwrap(),
                ids(&case["ids_bos"]),
            ),
        ];
        for (what, got, want) in checks {
            if got != want {
                failures.push(format!(
                    "{what} {text:?}: got {got:?}, transformers {want:?}"
                ));
            }
        }
        let want_ids = ids(&case["ids"]);
        let decoded = tok.decode(&want_ids, false).unwrap();
        if decoded != case["decoded"].as_str().unwrap() || decoded != text {
            failures.push(format!("decode {text:?}: got {decoded:?}"));
        }
        let skip = tok.decode(&want_ids, true).unwrap();
        if skip != case["decoded_skip_special"].as_str().unwrap() {
            failures.push(format!("decode skip_special {text:?}: got {skip:?}"));
        }
        let plain = tok.decode(&ids(&case["ids_no_special"]), false).unwrap();
        if plain != case["decoded_plain"].as_str().unwrap() {
            failures.push(format!("decode plain {text:?}: got {plain:?}"));
        }
    }
    for case in g["decode_cases"].as_array().unwrap() {
        let got = tok.decode(&ids(&case["ids"]), false).unwrap();
        if got != case["text"].as_str().unwrap() {
            failures.push(format!(
                "decode {:?}: got {got:?}, want {:?}",
                case["ids"], case["text"]
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{vocab}: {} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn glimmer_mini_matches_transformers() {
    check_vocab("glimmer-mini");
}

#[test]
fn fixture_vocab_matches_transformers() {
    check_vocab("fixture");
}

#[test]
fn gguf_keys_are_read() {
    let tok = Tokenizer::from_gguf_file(data("glimmer-mini.gguf")).unwrap();
    assert_eq!(tok.n_vocab(), 4019);
    let id = |s| tok.token_id(s).unwrap();
    assert_eq!(tok.bos(), Some(id("<|begin_of_text|>")));
    assert_eq!(tok.eos(), Some(id("<|end_of_text|>")));
    assert_eq!(tok.eot(), Some(id("<|eot|>")));
    assert_eq!(tok.eog_ids(), vec![id("<|end_of_text|>"), id("<|eot|>")]);
    assert!(tok.add_bos_default());
    assert_eq!(tok.token_type(id("<|eot|>")), Some(TokenType::Control));
    assert_eq!(
        tok.token_type(id("<tool_output")),
        Some(TokenType::UserDefined)
    );
    assert_eq!(tok.token_type(4018), Some(TokenType::Unused));
    // Unused fillers decode to nothing, as in llama.cpp and transformers (which does not know them).
    assert_eq!(tok.decode(&[4016, 4017, 4018], false).unwrap(), "");
}

#[test]
fn bad_input_is_an_error_value() {
    let mut tok = Tokenizer::from_gguf_file(data("glimmer-mini.gguf")).unwrap();
    match tok.encode_bytes(b"ok\xffno", false, false) {
        Err(TextError::InvalidUtf8 { offset: 2 }) => {}
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        tok.decode(&[5000], false),
        Err(TextError::UnknownToken { id: 5000, .. })
    ));
    assert!(matches!(
        tok.check_ids(&[1, -1]),
        Err(TextError::UnknownToken { id: -1, .. })
    ));
    tok.set_max_input_bytes(10);
    let e = tok
        .encode("this is longer than ten bytes", false, false)
        .unwrap_err();
    assert!(
        e.to_string().contains("exceeds the limit of 10 bytes"),
        "{e}"
    );
    // Still usable after an error.
    assert_eq!(
        tok.decode(&tok.encode("fine", false, false).unwrap(), false)
            .unwrap(),
        "fine"
    );
}

#[test]
fn enormous_words_and_runs_stay_linear_and_exact() {
    let tok = Tokenizer::from_gguf_file(data("glimmer-mini.gguf")).unwrap();
    for text in [
        "a".repeat(300_000),
        " ".repeat(300_000) + "x",
        "中".repeat(100_000),
        "\u{301}".repeat(100_000),
        "!?".repeat(100_000),
    ] {
        let t = std::time::Instant::now();
        let ids = tok.encode(&text, false, false).unwrap();
        assert_eq!(tok.decode(&ids, false).unwrap(), text);
        assert!(t.elapsed().as_secs_f64() < 5.0, "{:?}", t.elapsed());
    }
}

#[test]
fn shared_types_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Tokenizer>();
    check::<muser_text::ChatTemplate>();
    check::<muser_text::ToolCallParser>();
    check::<muser_text::StreamDecoder>();
    check::<muser_text::AtemStream>();
}
