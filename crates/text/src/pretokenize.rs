//! The pre-tokenizer split, on the `regex` crate's automata instead of a backtracking engine.
//!
//! Both split regexes end in `\s+(?!\S)|\s+`, the one lookahead that needs backtracking. Here that
//! tail is plain `\s+` and the lookahead is applied afterwards, which gives the same matches:
//! the alternatives before it are unchanged and tried first (leftmost-first, as a backtracking
//! engine), and when the match is a whitespace run from the tail (all whitespace and without
//! '\r'/'\n', which `\s*[\r\n]+` would have taken), `\s+(?!\S)` would have given back the run's
//! last char if a non-space follows, unless the run is one char (then `\s+` takes it whole).
//! `tests`: equal to the verbatim regex under fancy-regex on the golden strings and random text.

use crate::error::{Result, TextError};

/// The split of a regex ending in `\s+(?!\S)|\s+`, without the lookahead.
#[derive(Clone, Debug)]
pub struct WhitespaceLookaheadSplit {
    re: regex::Regex,
}

const TAIL: &str = r"|\s+(?!\S)|\s+";

impl WhitespaceLookaheadSplit {
    /// `pattern` must end with `|\s+(?!\S)|\s+` and have no other lookaround.
    pub fn new(pattern: &str) -> Result<Self> {
        let head = pattern
            .strip_suffix(TAIL)
            .ok_or_else(|| TextError::Tokenizer(format!("split regex does not end in {TAIL:?}")))?;
        let re = regex::Regex::new(&format!(r"{head}|\s+"))
            .map_err(|e| TextError::Tokenizer(format!("split regex: {e}")))?;
        Ok(Self { re })
    }

    /// Match ranges, in order, as the original regex's `find_iter` gives them.
    pub fn matches(&self, s: &str) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        let mut at = 0;
        while let Some(m) = self.re.find_at(s, at) {
            let (start, mut end) = (m.start(), m.end());
            let text = m.as_str();
            let next_is_non_space = s[end..].chars().next().is_some_and(|c| !c.is_whitespace());
            let from_tail = text.chars().all(char::is_whitespace) && !text.contains(['\r', '\n']);
            if next_is_non_space
                && from_tail
                && let Some((last, _)) = text.char_indices().last().filter(|&(i, _)| i > 0)
            {
                end = start + last;
            }
            out.push((start, end));
            at = end;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::{LLAMA3_REGEX, LLAMA4_REGEX};

    fn reference(re: &fancy_regex::Regex, s: &str) -> Vec<(usize, usize)> {
        re.find_iter(s)
            .map(|m| m.unwrap())
            .map(|m| (m.start(), m.end()))
            .collect()
    }

    fn golden_strings() -> Vec<String> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/golden");
        let g: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join("tokenizer-glimmer-mini.json")).unwrap(),
        )
        .unwrap();
        g["cases"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["text"].as_str().unwrap().to_string())
            .collect()
    }

    /// A deterministic pseudo-random string over characters that exercise every alternative.
    fn random_text(seed: u64, len: usize) -> String {
        const POOL: &[&str] = &[
            " ", "  ", "\t", "\n", "\r", "\r\n", "\u{a0}", "\u{3000}", "\u{2028}", "\u{85}",
            "\u{b}", "a", "Z", "é", "É", "e\u{301}", "\u{301}", "ǅ", "ʰ", "中", "ก", "\u{e31}",
            "क", "\u{94d}", "1", "٣", "½", "'", "'s", "'LL", "'d", "!", "/", "//", "-", "😀",
            "\u{200d}", "<", "|", ">", "_", "$", "\u{ad}", "ß", "İ", "ﬁ", "𝐀",
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
    fn same_matches_as_the_verbatim_regex() {
        for pattern in [LLAMA4_REGEX, LLAMA3_REGEX] {
            let split = WhitespaceLookaheadSplit::new(pattern).unwrap();
            let re = fancy_regex::Regex::new(pattern).unwrap();
            let mut texts = golden_strings();
            texts.extend((0..400).map(|i| random_text(i, 1 + (i as usize % 40))));
            for t in &texts {
                assert_eq!(split.matches(t), reference(&re, t), "{t:?}");
            }
        }
    }
}
