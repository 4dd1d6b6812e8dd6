//! Streaming detokenization: text leaves only at UTF-8 boundaries, and stop strings are found
//! across token boundaries and never emitted.
//!
//! The concatenation of everything emitted is the same for every way of cutting the token (or
//! byte) stream: it equals `String::from_utf8_lossy` of all bytes (what [`Tokenizer::decode`]
//! returns), truncated before the stop string that completes first.

use crate::error::Result;
use crate::tokenizer::Tokenizer;

/// Why a stream stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    /// This stop string appeared in the text; nothing from its first byte on was emitted.
    StopString(String),
}

/// Incremental detokenizer for one generation.
#[derive(Debug, Clone, Default)]
pub struct StreamDecoder {
    skip_special: bool,
    stops: Vec<String>,
    /// Bytes of a character not yet complete (at most 3).
    pending: Vec<u8>,
    /// Decoded text held back because it may be the start of a stop string.
    held: String,
    stopped: Option<StopReason>,
}

impl StreamDecoder {
    /// `skip_special` drops control tokens from the text (as [`Tokenizer::decode`]); a chat
    /// front end that parses ATEM keeps them. Empty stop strings are ignored.
    pub fn new(skip_special: bool, stops: impl IntoIterator<Item = impl Into<String>>) -> Self {
        let stops = stops
            .into_iter()
            .map(Into::into)
            .filter(|s: &String| !s.is_empty())
            .collect();
        Self {
            skip_special,
            stops,
            ..Self::default()
        }
    }

    /// Adds one generated token; returns the text that is now final (often empty).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<String> {
        let piece = tok.piece(id, self.skip_special)?;
        Ok(self.push_bytes(piece))
    }

    /// Adds raw bytes (what a token stands for); returns the text that is now final.
    pub fn push_bytes(&mut self, bytes: &[u8]) -> String {
        if self.stopped.is_some() {
            return String::new();
        }
        self.pending.extend_from_slice(bytes);
        let mut text = String::new();
        let mut rest: &[u8] = &self.pending;
        // Same loop as `String::from_utf8_lossy`: one U+FFFD per invalid sequence, but an
        // incomplete sequence at the end waits for its next bytes.
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    text.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    // `valid` is UTF-8 by the error's own account.
                    text.push_str(std::str::from_utf8(valid).unwrap_or_default());
                    match e.error_len() {
                        Some(n) => {
                            text.push('\u{FFFD}');
                            rest = &after[n..];
                        }
                        None => {
                            rest = after;
                            break;
                        }
                    }
                }
            }
        }
        self.pending = rest.to_vec();
        self.release(&text)
    }

    /// Ends the stream: an unfinished character becomes U+FFFD, and text held back for a stop
    /// string that never completed is released.
    pub fn finish(&mut self) -> String {
        if self.stopped.is_some() {
            return String::new();
        }
        let mut out = String::new();
        if !self.pending.is_empty() {
            self.pending.clear();
            out = self.release("\u{FFFD}");
        }
        if self.stopped.is_none() {
            out.push_str(&std::mem::take(&mut self.held));
        }
        out
    }

    /// Set once a stop string has appeared; later input is ignored.
    pub fn stopped(&self) -> Option<&StopReason> {
        self.stopped.as_ref()
    }

    /// Adds decoded text to the held text and releases what can no longer begin a stop string.
    fn release(&mut self, text: &str) -> String {
        self.held.push_str(text);
        // The stop string that completes first (smallest end; the longest if two end together).
        let hit = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()).map(|at| (at + s.len(), at, s)))
            .min_by_key(|&(end, at, _)| (end, at));
        if let Some((_, at, s)) = hit {
            let out = self.held[..at].to_string();
            self.stopped = Some(StopReason::StopString(s.clone()));
            self.held.clear();
            return out;
        }
        let keep = self.longest_stop_prefix_suffix();
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        out
    }

    /// Length of the longest suffix of `held` that is a proper prefix of some stop string.
    fn longest_stop_prefix_suffix(&self) -> usize {
        let h = &self.held;
        let mut best = 0;
        for s in &self.stops {
            let max = (s.len() - 1).min(h.len());
            for n in (best + 1..=max).rev() {
                let start = h.len() - n;
                if h.is_char_boundary(start) && s.starts_with(&h[start..]) {
                    best = n;
                    break;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `parts` and returns (all emitted text, stop reason).
    fn run(stops: &[&str], parts: &[&[u8]]) -> (String, Option<StopReason>) {
        let mut d = StreamDecoder::new(false, stops.iter().copied());
        let mut out = String::new();
        for p in parts {
            out += &d.push_bytes(p);
        }
        out += &d.finish();
        (out, d.stopped().cloned())
    }

    /// Every way of cutting `bytes` into up to three pieces gives the same result.
    fn all_splits_agree(stops: &[&str], bytes: &[u8]) -> (String, Option<StopReason>) {
        let whole = run(stops, &[bytes]);
        for i in 0..=bytes.len() {
            for j in i..=bytes.len() {
                let got = run(stops, &[&bytes[..i], &bytes[i..j], &bytes[j..]]);
                assert_eq!(got, whole, "split at {i},{j} of {bytes:?}");
            }
        }
        let one_by_one: Vec<&[u8]> = bytes.chunks(1).collect();
        assert_eq!(run(stops, &one_by_one), whole);
        whole
    }

    #[test]
    fn utf8_is_only_emitted_whole() {
        let s = "aé€😀ä\u{301}b";
        let (out, stop) = all_splits_agree(&[], s.as_bytes());
        assert_eq!(out, s);
        assert_eq!(stop, None);
        let mut d = StreamDecoder::new(false, Vec::<String>::new());
        assert_eq!(d.push_bytes(&[0xF0, 0x9F]), "");
        assert_eq!(d.push_bytes(&[0x98]), "");
        assert_eq!(d.push_bytes(&[0x80, b'x']), "😀x");
    }

    #[test]
    fn invalid_bytes_match_from_utf8_lossy() {
        let cases: &[&[u8]] = &[
            b"a\xffb",
            b"\xe2\x82",
            b"\xe2\x82a",
            b"\xf0\x9f\x98",
            b"\xc0\xaf",
            b"\xed\xa0\x80x",
            b"ok\xf4\x90\x80\x80",
            b"\xe2\x82\xac\xe2",
        ];
        for c in cases {
            let (out, _) = all_splits_agree(&[], c);
            assert_eq!(out, String::from_utf8_lossy(c), "{c:?}");
        }
    }

    #[test]
    fn stop_strings_are_found_across_pieces_and_never_emitted() {
        let (out, stop) = all_splits_agree(&["<|eot|>"], b"Hello <|eot|> world");
        assert_eq!(out, "Hello ");
        assert_eq!(stop, Some(StopReason::StopString("<|eot|>".into())));

        // A false start is released once it cannot match any more.
        let (out, stop) = all_splits_agree(&["STOP"], b"a STO b ST");
        assert_eq!(out, "a STO b ST");
        assert_eq!(stop, None);

        // The stop that completes first wins, wherever the pieces are cut.
        let (out, stop) = all_splits_agree(&["abcd", "bc"], b"xabcd");
        assert_eq!(out, "xa");
        assert_eq!(stop, Some(StopReason::StopString("bc".into())));

        // Multi-byte stop strings and text.
        let (out, _) = all_splits_agree(&["終わり"], "日本語終わりです".as_bytes());
        assert_eq!(out, "日本語");

        // Overlapping prefix: "aab" must be found in "aaab".
        let (out, _) = all_splits_agree(&["aab"], b"aaab!");
        assert_eq!(out, "a");
    }

    #[test]
    fn nothing_after_a_stop() {
        let mut d = StreamDecoder::new(false, ["\n\n"]);
        assert_eq!(d.push_bytes(b"one\n"), "one");
        assert_eq!(d.push_bytes(b"\ntwo"), "");
        assert!(d.stopped().is_some());
        assert_eq!(d.push_bytes(b"three"), "");
        assert_eq!(d.finish(), "");
    }
}
