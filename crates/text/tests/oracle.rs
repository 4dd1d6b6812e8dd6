//! Muser's encoder against HF tokenizers itself (the library transformers runs), built in memory
//! from the same GGUF the way Llama-4's tokenizer.json is laid out: on the golden strings and on
//! pseudo-random text over characters that exercise every branch of the split and the added tokens.

use muser_text::{LLAMA4_REGEX, TokenType, Tokenizer, Vocab};
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{
    AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior, Tokenizer as HfTokenizer,
};

fn data(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn hf_from(gguf: &std::path::Path) -> (HfTokenizer, HfTokenizer) {
    let v = Vocab::from_gguf(&muser_gguf::Gguf::open(gguf).unwrap()).unwrap();
    let mut vocab = ahash::AHashMap::new();
    for (id, (t, ty)) in v.tokens.iter().zip(&v.types).enumerate() {
        if *ty != TokenType::Unused {
            vocab.entry(t.clone()).or_insert(id as u32);
        }
    }
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, v.merges.clone())
        .build()
        .unwrap();
    let mut hf = HfTokenizer::new(bpe);
    let split = Split::new(
        SplitPattern::Regex(LLAMA4_REGEX.into()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .unwrap();
    hf.with_pre_tokenizer(Some(PreTokenizerWrapper::Sequence(Sequence::new(vec![
        PreTokenizerWrapper::Split(split),
        PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, false)),
    ]))));
    let added: Vec<AddedToken> = v
        .tokens
        .iter()
        .zip(&v.types)
        .filter_map(|(t, ty)| match ty {
            TokenType::Control => Some(AddedToken::from(t.clone(), true)),
            TokenType::UserDefined => Some(AddedToken::from(t.clone(), false)),
            _ => None,
        })
        .collect();
    hf.add_tokens(added).unwrap();
    let mut plain = hf.clone();
    plain.set_encode_special_tokens(true);
    (hf, plain)
}

fn random_text(seed: u64, len: usize) -> String {
    const POOL: &[&str] = &[
        " ",
        "  ",
        "\t",
        "\n",
        "\r\n",
        "\u{a0}",
        "\u{3000}",
        "a",
        "b",
        "e",
        "t",
        "th",
        "the",
        "The",
        "ing",
        "Z",
        "é",
        "e\u{301}",
        "中",
        "文",
        "ก",
        "\u{e31}",
        "क",
        "\u{94d}",
        "1",
        "23",
        "'s",
        "'LL",
        "!",
        "/",
        "-",
        ".",
        ",",
        "😀",
        "\u{200d}",
        "<|eot|>",
        "<|start|>",
        "<|eot|",
        "<tool_output",
        "</tool_output>",
        "<",
        "|",
        ">",
        "_",
        "ß",
        "Ġ",
        "€",
        "\u{0}",
        "\u{7f}",
        "𒐫",
    ];
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            POOL[(x % POOL.len() as u64) as usize]
        })
        .collect()
}

#[test]
fn encoder_equals_hf_tokenizers() {
    for vocab in ["glimmer-mini", "fixture"] {
        let tok = Tokenizer::from_gguf_file(data(&format!("{vocab}.gguf"))).unwrap();
        let (hf, hf_plain) = hf_from(&data(&format!("{vocab}.gguf")));
        let golden: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(data(&format!("golden/tokenizer-{vocab}.json"))).unwrap(),
        )
        .unwrap();
        let mut texts: Vec<String> = golden["cases"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["text"].as_str().unwrap().to_string())
            .collect();
        texts.extend((0..1500).map(|i| random_text(i, 1 + (i as usize * 7) % 90)));
        for t in &texts {
            assert_eq!(
                tok.encode(t, false, true).unwrap(),
                hf.encode(t.as_str(), false).unwrap().get_ids(),
                "{vocab} {t:?}"
            );
            assert_eq!(
                tok.encode(t, false, false).unwrap(),
                hf_plain.encode(t.as_str(), false).unwrap().get_ids(),
                "{vocab} plain {t:?}"
            );
        }
    }
}
