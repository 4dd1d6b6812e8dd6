//! GPT-2's byte-level alphabet: every byte is stored in the vocabulary as one printable char.
//!
//! Same table as `bytes_to_unicode()` in OpenAI's GPT-2 `encoder.py`, HF tokenizers
//! `pre_tokenizers/byte_level.rs` and llama.cpp `unicode.cpp` `unicode_byte_to_utf8_map`.

use std::sync::OnceLock;

/// `char -> byte` for the 256 chars of the alphabet; `None` elsewhere.
fn char_to_byte(c: char) -> Option<u8> {
    static TABLE: OnceLock<[u16; 324]> = OnceLock::new();
    // The alphabet's chars are all below U+0144 (256 + 68), so a flat table indexed by code point works.
    let table = TABLE.get_or_init(|| {
        let mut t = [u16::MAX; 324];
        for b in 0..=255u8 {
            t[byte_to_char(b) as usize] = b as u16;
        }
        t
    });
    table.get(c as usize).and_then(|&b| u8::try_from(b).ok())
}

/// The printable char that stands for byte `b`.
pub fn byte_to_char(b: u8) -> char {
    // Printable Latin-1 bytes stand for themselves; the other 68 are shifted to U+0100.. in byte order.
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
    if printable(b) {
        return b as char;
    }
    let shift = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + shift).unwrap_or('\u{FFFD}')
}

/// The bytes of a token made only of alphabet chars (an ordinary BPE token); `None` otherwise.
pub fn strict_bytes(token: &str) -> Option<Vec<u8>> {
    token.chars().map(char_to_byte).collect()
}

/// The bytes a token stands for when decoded, exactly as HF's ByteLevel decoder computes them
/// (`decode_chain` in tokenizers `pre_tokenizers/byte_level.rs`): every char mapped through the
/// alphabet if all of them are in it, else the token's own UTF-8 (added tokens such as "<|eot|>"
/// are all-ASCII-printable and map to themselves either way).
pub fn token_bytes(token: &str) -> Vec<u8> {
    strict_bytes(token).unwrap_or_else(|| token.as_bytes().to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alphabet_round_trips_and_matches_gpt2() {
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(byte_to_char(b)), Some(b));
        }
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(byte_to_char(b'\t'), 'ĉ');
        assert_eq!(byte_to_char(0xAD), 'Ń');
        assert_eq!(byte_to_char(b'a'), 'a');
        assert_eq!(token_bytes("Ġhello"), b" hello");
        assert_eq!(token_bytes("<|eot|>"), b"<|eot|>");
        // Not all chars in the alphabet: the token's UTF-8 as is.
        assert_eq!(token_bytes("a b"), b"a b");
    }
}
