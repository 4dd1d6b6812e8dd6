//! Streaming detokenization over real token streams: every golden string, token by token, with
//! and without stop strings that span tokens.

use muser_text::{StopReason, StreamDecoder, Tokenizer};
use serde_json::Value;

fn data(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn stream(
    tok: &Tokenizer,
    ids: &[u32],
    stops: &[&str],
) -> (String, Vec<String>, Option<StopReason>) {
    let mut d = StreamDecoder::new(false, stops.iter().copied());
    let mut pieces = Vec::new();
    for &id in ids {
        pieces.push(d.push(tok, id).unwrap());
    }
    pieces.push(d.finish());
    (pieces.concat(), pieces, d.stopped().cloned())
}

#[test]
fn token_by_token_equals_whole_decode_and_stops_are_never_emitted() {
    let tok = Tokenizer::from_gguf_file(data("glimmer-mini.gguf")).unwrap();
    let g: Value = serde_json::from_str(
        &std::fs::read_to_string(data("golden/tokenizer-glimmer-mini.json")).unwrap(),
    )
    .unwrap();
    let mut spanning = 0;
    for case in g["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let ids = tok.encode(text, false, true).unwrap();
        let (out, pieces, stop) = stream(&tok, &ids, &[]);
        assert_eq!(out, text);
        assert_eq!(stop, None);
        // Text leaves only as whole characters: no piece has a replacement char the text lacks.
        assert!(
            text.contains('\u{FFFD}') || pieces.iter().all(|p| !p.contains('\u{FFFD}')),
            "{text:?}"
        );

        // Every substring of up to 6 chars that starts at a char boundary, used as a stop string.
        let chars: Vec<(usize, char)> = text.char_indices().collect();
        for (k, &(start, _)) in chars.iter().enumerate().step_by(3) {
            let end = chars.get(k + 6).map_or(text.len(), |&(e, _)| e);
            let stop_str = &text[start..end];
            let first = text.find(stop_str).unwrap();
            let (out, _, stop) = stream(&tok, &ids, &[stop_str]);
            assert_eq!(out, &text[..first], "{text:?} stop {stop_str:?}");
            assert_eq!(stop, Some(StopReason::StopString(stop_str.to_string())));
            let bounds: Vec<usize> = ids
                .iter()
                .scan(0, |n, &id| {
                    *n += tok.piece(id, false).unwrap().len();
                    Some(*n)
                })
                .collect();
            if bounds
                .iter()
                .any(|&b| b > first && b < first + stop_str.len())
            {
                spanning += 1;
            }
        }
    }
    assert!(
        spanning > 100,
        "only {spanning} stop strings spanned a token boundary"
    );
}

#[test]
fn a_character_split_across_tokens_is_emitted_once_whole() {
    let tok = Tokenizer::from_gguf_file(data("glimmer-mini.gguf")).unwrap();
    // "𒐫" is not in the vocabulary as one token: its 4 bytes come as byte tokens.
    let ids = tok.encode("a𒐫b", false, false).unwrap();
    assert!(ids.len() >= 4);
    let (out, pieces, _) = stream(&tok, &ids, &[]);
    assert_eq!(out, "a𒐫b");
    assert!(pieces.iter().any(|p| p.contains('𒐫')));
    // A stream cut inside the character ends with one replacement char, as decode() gives.
    let cut = &ids[..ids.len() - 2];
    let (out, _, _) = stream(&tok, cut, &[]);
    assert_eq!(out, tok.decode(cut, false).unwrap());
    assert!(out.ends_with('\u{FFFD}'));
}

#[test]
fn special_tokens_can_be_stops_or_skipped() {
    let tok = Tokenizer::from_gguf_file(data("glimmer-mini.gguf")).unwrap();
    let ids = tok
        .encode(
            "Hi there<|eom|><|start|>assistant to=user<|message|>Bye",
            false,
            true,
        )
        .unwrap();
    let (out, _, stop) = stream(&tok, &ids, &["<|eom|>"]);
    assert_eq!(
        (out.as_str(), stop),
        ("Hi there", Some(StopReason::StopString("<|eom|>".into())))
    );
    let mut d = StreamDecoder::new(true, Vec::<String>::new());
    let out: String = ids
        .iter()
        .map(|&id| d.push(&tok, id).unwrap())
        .collect::<String>()
        + &d.finish();
    assert_eq!(out, "Hi thereassistant to=userBye");
    assert!(d.push(&tok, 99_999).is_err());
}
