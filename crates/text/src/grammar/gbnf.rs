//! GBNF grammars as llama.cpp b11434 reads and matches them (`src/llama-grammar.cpp`): the same
//! syntax, the same rewriting of repetitions into rules, the same refusals (an undefined rule,
//! left recursion, more than 2,000 repeated rules), and the same pushdown matcher over code
//! points: a set of stacks of element positions, each ending at a character range, advanced one
//! code point at a time, with a UTF-8 sequence cut between two pieces carried over. The
//! vocabulary-token elements (`<...>`, `!<...>`) are refused: they name ids of one vocabulary.

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap};

use crate::error::{Result, TextError};

/// `MAX_REPETITION_THRESHOLD` of llama-grammar.cpp.
const MAX_REPETITION_THRESHOLD: u64 = 2000;

/// Groups nested deeper than this are refused (each level is a recursion of the parser; llama.cpp
/// has no bound, and a text of parentheses overflows its stack).
pub const MAX_NESTING: usize = 256;

/// Elements the rules may hold in all, repetitions expanded (each `x{0,2000}` writes 2,000
/// rules: a 256 KB text of them would take gigabytes).
pub const MAX_ELEMENTS: usize = 1 << 20;

/// Stacks a state may hold: the ways the text so far can be read. A grammar that keeps more
/// (an ambiguous one) is refused when it gets there, not matched slowly.
pub const MAX_STACKS: usize = 4096;

/// Positions the stacks of a state may hold in all (a stack a nesting level deep).
pub const MAX_STATE_POSITIONS: usize = 1 << 20;

/// Work one call of the matcher may do (taking a piece, checking tokens, a vocabulary's mask):
/// a stack expanded or copied (by its length in 16s), a candidate checked against a stack. A
/// mask of a 202,048-token vocabulary inside a JSON string takes about 4.2 million. Past it the
/// grammar is too ambiguous to follow, and every call says so alike (llama.cpp goes on, in time
/// exponential in the text or the token on some grammars).
pub const MAX_WORK: usize = 16_000_000;

/// The work budget of one call ran out (`MAX_WORK`, `MAX_STACKS`, `MAX_STATE_POSITIONS`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Spent;

impl From<Spent> for TextError {
    fn from(_: Spent) -> Self {
        err(format!(
            "the grammar is too ambiguous to follow: matching it took more than {MAX_WORK} steps or {MAX_STACKS} readings of the text"
        ))
    }
}

/// What one call of the matcher may still do.
pub(crate) struct Budget(usize);

impl Budget {
    pub(crate) fn new() -> Self {
        Budget(MAX_WORK)
    }

    fn spend(&mut self, n: usize) -> std::result::Result<(), Spent> {
        if self.0 < n {
            self.0 = 0;
            return Err(Spent);
        }
        self.0 -= n;
        Ok(())
    }
}

/// A stack's cost to copy or expand, in work units.
fn cost(stack: &[u32]) -> usize {
    1 + stack.len() / 16
}

/// One element of a rule (`llama_grammar_element`): the rules' alternatives are runs of
/// elements separated by `Alt` and ended by `End`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Elem {
    End,
    Alt,
    RuleRef(u32),
    /// A character, or the start of a character class (`[abc]`, `[a-z]`).
    Char(u32),
    /// The start of a negated class (`[^...]`).
    CharNot(u32),
    /// The upper end of a range whose lower end is the element before.
    CharRngUpper(u32),
    /// Another character of the class the element before began.
    CharAlt(u32),
    /// `.`
    CharAny,
}

impl Elem {
    fn is_end_of_sequence(self) -> bool {
        matches!(self, Elem::End | Elem::Alt)
    }
}

fn err(msg: impl Into<String>) -> TextError {
    TextError::Grammar(msg.into())
}

/// The grammar text at byte `i` (0 past the end, as a C string ends).
struct Src<'a>(&'a [u8]);

impl Src<'_> {
    fn at(&self, i: usize) -> u8 {
        self.0.get(i).copied().unwrap_or(0)
    }

    /// The rest of the text from `i`, for error messages (as llama.cpp prints `pos`).
    fn rest(&self, i: usize) -> String {
        let end = self.0.len().min(i.saturating_add(40));
        String::from_utf8_lossy(self.0.get(i..end).unwrap_or_default()).into_owned()
    }
}

fn is_digit_char(c: u8) -> bool {
    c.is_ascii_digit()
}

fn is_word_char(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'-' || is_digit_char(c)
}

/// `decode_utf8` (one code point of the grammar text; the text is UTF-8, a lone byte is taken as
/// llama.cpp takes it).
fn decode_utf8_one(s: &Src, i: usize) -> (u32, usize) {
    const LOOKUP: [usize; 16] = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4];
    let first = s.at(i);
    let len = LOOKUP[(first >> 4) as usize];
    let mask = (1u32 << (8 - len)) - 1;
    let mut value = first as u32 & mask;
    let end = i + len;
    let mut pos = i + 1;
    while pos < end && s.at(pos) != 0 {
        value = (value << 6) + (s.at(pos) as u32 & 0x3F);
        pos += 1;
    }
    (value, pos)
}

fn parse_hex(s: &Src, i: usize, size: usize) -> Result<(u32, usize)> {
    let mut value = 0u32;
    let mut pos = i;
    let end = i + size;
    while pos < end && s.at(pos) != 0 {
        let c = s.at(pos);
        let d = match c {
            b'a'..=b'f' => c - b'a' + 10,
            b'A'..=b'F' => c - b'A' + 10,
            b'0'..=b'9' => c - b'0',
            _ => break,
        };
        value = (value << 4) + d as u32;
        pos += 1;
    }
    if pos != end {
        return Err(err(format!("expecting {size} hex chars at {}", s.rest(i))));
    }
    Ok((value, pos))
}

fn parse_space(s: &Src, mut pos: usize, newline_ok: bool) -> usize {
    loop {
        match s.at(pos) {
            b' ' | b'\t' => pos += 1,
            b'#' => {
                while s.at(pos) != 0 && s.at(pos) != b'\r' && s.at(pos) != b'\n' {
                    pos += 1;
                }
            }
            b'\r' | b'\n' if newline_ok => pos += 1,
            _ => return pos,
        }
    }
}

fn parse_name(s: &Src, i: usize) -> Result<usize> {
    let mut pos = i;
    while is_word_char(s.at(pos)) {
        pos += 1;
    }
    if pos == i {
        return Err(err(format!("expecting name at {}", s.rest(i))));
    }
    Ok(pos)
}

fn parse_int(s: &Src, i: usize) -> Result<usize> {
    let mut pos = i;
    while is_digit_char(s.at(pos)) {
        pos += 1;
    }
    if pos == i {
        return Err(err(format!("expecting integer at {}", s.rest(i))));
    }
    Ok(pos)
}

fn parse_char(s: &Src, i: usize) -> Result<(u32, usize)> {
    if s.at(i) == b'\\' {
        return match s.at(i + 1) {
            b'x' => parse_hex(s, i + 2, 2),
            b'u' => parse_hex(s, i + 2, 4),
            b'U' => parse_hex(s, i + 2, 8),
            b't' => Ok(('\t' as u32, i + 2)),
            b'r' => Ok(('\r' as u32, i + 2)),
            b'n' => Ok(('\n' as u32, i + 2)),
            c @ (b'\\' | b'"' | b'[' | b']' | b'-') => Ok((c as u32, i + 2)),
            _ => Err(err(format!("unknown escape at {}", s.rest(i)))),
        };
    }
    if s.at(i) != 0 {
        return Ok(decode_utf8_one(s, i));
    }
    Err(err("unexpected end of input"))
}

/// The rules as parsed, before they are checked and flattened: `llama_grammar_parser`.
struct Parser<'a> {
    s: Src<'a>,
    symbol_ids: HashMap<String, u32>,
    /// Names by id, for the undefined-rule message.
    names: Vec<String>,
    rules: Vec<Vec<Elem>>,
    /// Groups open now.
    depth: usize,
    /// Elements written so far.
    elements: usize,
}

impl Parser<'_> {
    fn get_symbol_id(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.symbol_ids.get(name) {
            return id;
        }
        let id = self.symbol_ids.len() as u32;
        self.symbol_ids.insert(name.to_string(), id);
        self.names.push(name.to_string());
        id
    }

    fn generate_symbol_id(&mut self, base: &str) -> u32 {
        let id = self.symbol_ids.len() as u32;
        let name = format!("{base}_{id}");
        self.symbol_ids.insert(name.clone(), id);
        self.names.push(name);
        id
    }

    fn add_rule(&mut self, id: u32, rule: Vec<Elem>) -> Result<()> {
        self.elements += rule.len();
        if self.elements > MAX_ELEMENTS {
            return Err(err(format!(
                "the grammar expands to more than {MAX_ELEMENTS} elements (its repetitions written out); simplify it"
            )));
        }
        let id = id as usize;
        if self.rules.len() <= id {
            self.rules.resize(id + 1, Vec::new());
        }
        self.rules[id] = rule;
        Ok(())
    }

    fn parse_alternates(&mut self, src: usize, name: &str, id: u32, nested: bool) -> Result<usize> {
        let mut rule = Vec::new();
        let mut pos = self.parse_sequence(src, name, &mut rule, nested)?;
        while self.s.at(pos) == b'|' {
            rule.push(Elem::Alt);
            pos = parse_space(&self.s, pos + 1, true);
            pos = self.parse_sequence(pos, name, &mut rule, nested)?;
        }
        rule.push(Elem::End);
        self.add_rule(id, rule)?;
        Ok(pos)
    }

    fn parse_sequence(
        &mut self,
        src: usize,
        name: &str,
        rule: &mut Vec<Elem>,
        nested: bool,
    ) -> Result<usize> {
        let mut last_sym_start = rule.len();
        let mut pos = src;
        let mut n_prev_rules: u64 = 1;
        loop {
            let c = self.s.at(pos);
            if c == 0 {
                break;
            }
            if c == b'"' {
                pos += 1;
                last_sym_start = rule.len();
                n_prev_rules = 1;
                while self.s.at(pos) != b'"' {
                    if self.s.at(pos) == 0 {
                        return Err(err("unexpected end of input"));
                    }
                    let (ch, next) = parse_char(&self.s, pos)?;
                    pos = next;
                    rule.push(Elem::Char(ch));
                }
                pos = parse_space(&self.s, pos + 1, nested);
            } else if c == b'[' {
                pos += 1;
                let negated = self.s.at(pos) == b'^';
                if negated {
                    pos += 1;
                }
                last_sym_start = rule.len();
                n_prev_rules = 1;
                while self.s.at(pos) != b']' {
                    if self.s.at(pos) == 0 {
                        return Err(err("unexpected end of input"));
                    }
                    let (ch, next) = parse_char(&self.s, pos)?;
                    pos = next;
                    rule.push(if last_sym_start < rule.len() {
                        Elem::CharAlt(ch)
                    } else if negated {
                        Elem::CharNot(ch)
                    } else {
                        Elem::Char(ch)
                    });
                    if self.s.at(pos) == b'-' && self.s.at(pos + 1) != b']' {
                        if self.s.at(pos + 1) == 0 {
                            return Err(err("unexpected end of input"));
                        }
                        let (end, next) = parse_char(&self.s, pos + 1)?;
                        pos = next;
                        rule.push(Elem::CharRngUpper(end));
                    }
                }
                pos = parse_space(&self.s, pos + 1, nested);
            } else if c == b'<' || c == b'!' {
                return Err(err(format!(
                    "vocabulary token references (<...>) are not supported, at {}",
                    self.s.rest(pos)
                )));
            } else if is_word_char(c) {
                let end = parse_name(&self.s, pos)?;
                let sym = String::from_utf8_lossy(&self.s.0[pos..end]).into_owned();
                let id = self.get_symbol_id(&sym);
                pos = parse_space(&self.s, end, nested);
                last_sym_start = rule.len();
                n_prev_rules = 1;
                rule.push(Elem::RuleRef(id));
            } else if c == b'(' {
                if self.depth >= MAX_NESTING {
                    return Err(err(format!(
                        "groups nested deeper than {MAX_NESTING} at {}",
                        self.s.rest(pos)
                    )));
                }
                pos = parse_space(&self.s, pos + 1, true);
                let n_before = self.symbol_ids.len() as u64;
                let sub = self.generate_symbol_id(name);
                self.depth += 1;
                pos = self.parse_alternates(pos, name, sub, true)?;
                self.depth -= 1;
                n_prev_rules = 1u64.max(self.symbol_ids.len() as u64 - n_before);
                last_sym_start = rule.len();
                rule.push(Elem::RuleRef(sub));
                if self.s.at(pos) != b')' {
                    return Err(err(format!("expecting ')' at {}", self.s.rest(pos))));
                }
                pos = parse_space(&self.s, pos + 1, nested);
            } else if c == b'.' {
                last_sym_start = rule.len();
                n_prev_rules = 1;
                rule.push(Elem::CharAny);
                pos = parse_space(&self.s, pos + 1, nested);
            } else if c == b'*' || c == b'+' || c == b'?' {
                pos = parse_space(&self.s, pos + 1, nested);
                let (min, max) = match c {
                    b'*' => (0, u64::MAX),
                    b'+' => (1, u64::MAX),
                    _ => (0, 1),
                };
                self.repeat(rule, name, last_sym_start, &mut n_prev_rules, min, max, pos)?;
            } else if c == b'{' {
                pos = parse_space(&self.s, pos + 1, nested);
                if !is_digit_char(self.s.at(pos)) {
                    return Err(err(format!("expecting an int at {}", self.s.rest(pos))));
                }
                let end = parse_int(&self.s, pos)?;
                let min = stoull(&self.s.0[pos..end])?;
                pos = parse_space(&self.s, end, nested);
                let mut max = u64::MAX;
                if self.s.at(pos) == b'}' {
                    max = min;
                    pos = parse_space(&self.s, pos + 1, nested);
                } else if self.s.at(pos) == b',' {
                    pos = parse_space(&self.s, pos + 1, nested);
                    if is_digit_char(self.s.at(pos)) {
                        let end = parse_int(&self.s, pos)?;
                        max = stoull(&self.s.0[pos..end])?;
                        pos = parse_space(&self.s, end, nested);
                    }
                    if self.s.at(pos) != b'}' {
                        return Err(err(format!("expecting '}}' at {}", self.s.rest(pos))));
                    }
                    pos = parse_space(&self.s, pos + 1, nested);
                } else {
                    return Err(err(format!("expecting ',' at {}", self.s.rest(pos))));
                }
                if min > MAX_REPETITION_THRESHOLD {
                    return Err(err(
                        "number of repetitions exceeds sane defaults, please reduce the number of repetitions",
                    ));
                }
                if max != u64::MAX && max > MAX_REPETITION_THRESHOLD {
                    max = u64::MAX;
                }
                self.repeat(rule, name, last_sym_start, &mut n_prev_rules, min, max, pos)?;
            } else {
                break;
            }
        }
        Ok(pos)
    }

    /// `handle_repetitions`: S{m,n} becomes S S S (m times) S'(n-m), with S'(x) ::= S S'(x-1) |
    /// and S'(1) ::= S | ; S{m,} becomes S ... S (m times) S', S' ::= S S' | .
    #[allow(clippy::too_many_arguments)]
    fn repeat(
        &mut self,
        rule: &mut Vec<Elem>,
        name: &str,
        last_sym_start: usize,
        n_prev_rules: &mut u64,
        min: u64,
        max: u64,
        pos: usize,
    ) -> Result<()> {
        let no_max = max == u64::MAX;
        if last_sym_start == rule.len() {
            return Err(err(format!(
                "expecting preceding item to */+/?/{{ at {}",
                self.s.rest(pos)
            )));
        }
        if !no_max && max < min {
            return Err(err(format!(
                "a repetition {{{min},{max}}} whose most is below its least, at {}",
                self.s.rest(pos)
            )));
        }
        let prev: Vec<Elem> = rule[last_sym_start..].to_vec();
        // The copies below count against the bound before they are made.
        let copies = (min.saturating_sub(1) as usize).saturating_mul(prev.len());
        if self
            .elements
            .saturating_add(rule.len())
            .saturating_add(copies)
            > MAX_ELEMENTS
        {
            return Err(err(format!(
                "the grammar expands to more than {MAX_ELEMENTS} elements (its repetitions written out); simplify it"
            )));
        }
        let total = if !no_max && max > 0 {
            max
        } else if min > 0 {
            min
        } else {
            1
        };
        if n_prev_rules.saturating_mul(total) > MAX_REPETITION_THRESHOLD {
            return Err(err(
                "number of rules that are going to be repeated multiplied by the new repetition exceeds sane defaults, please reduce the number of repetitions or rule complexity",
            ));
        }
        if min == 0 {
            rule.truncate(last_sym_start);
        } else {
            for _ in 1..min {
                rule.extend_from_slice(&prev);
            }
        }
        let mut last_rec = 0u32;
        let n_opt = if no_max { 1 } else { max.saturating_sub(min) };
        for i in 0..n_opt {
            let mut rec = prev.clone();
            let id = self.generate_symbol_id(name);
            if i > 0 || no_max {
                rec.push(Elem::RuleRef(if no_max { id } else { last_rec }));
            }
            rec.push(Elem::Alt);
            rec.push(Elem::End);
            self.add_rule(id, rec)?;
            last_rec = id;
        }
        if n_opt > 0 {
            rule.push(Elem::RuleRef(last_rec));
        }
        *n_prev_rules = n_prev_rules.saturating_mul(total);
        Ok(())
    }

    fn parse_rule(&mut self, src: usize) -> Result<usize> {
        let name_end = parse_name(&self.s, src)?;
        let mut pos = parse_space(&self.s, name_end, false);
        let name = String::from_utf8_lossy(&self.s.0[src..name_end]).into_owned();
        let id = self.get_symbol_id(&name);
        if !(self.s.at(pos) == b':' && self.s.at(pos + 1) == b':' && self.s.at(pos + 2) == b'=') {
            return Err(err(format!("expecting ::= at {}", self.s.rest(pos))));
        }
        pos = parse_space(&self.s, pos + 3, true);
        pos = self.parse_alternates(pos, &name, id, false)?;
        match self.s.at(pos) {
            b'\r' => pos += if self.s.at(pos + 1) == b'\n' { 2 } else { 1 },
            b'\n' => pos += 1,
            0 => {}
            _ => {
                return Err(err(format!(
                    "expecting newline or end at {}",
                    self.s.rest(pos)
                )));
            }
        }
        Ok(parse_space(&self.s, pos, true))
    }
}

/// `std::stoull` of a run of digits (out of range is an error, as it throws).
fn stoull(digits: &[u8]) -> Result<u64> {
    std::str::from_utf8(digits)
        .ok()
        .and_then(|d| d.parse().ok())
        .ok_or_else(|| err("repetition count out of range"))
}

/// A UTF-8 sequence begun in one piece and not yet ended: `llama_partial_utf8`, with the
/// sequence's length (for the strict checks below).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Partial {
    value: u32,
    /// Bytes still to come; -1 after an invalid sequence.
    n_remain: i32,
    /// The whole sequence's length in bytes.
    len: u8,
}

impl Partial {
    const INVALID: Partial = Partial {
        value: 0,
        n_remain: -1,
        len: 0,
    };

    /// Bytes still to come (0: none; -1 after an invalid sequence).
    pub(crate) fn n_remain(&self) -> i32 {
        self.n_remain
    }

    /// The code points this sequence can still end as, lowest and highest: none where every
    /// ending would be an overlong form, a surrogate or past U+10FFFF.
    fn range(&self) -> Option<(u32, u32)> {
        if self.n_remain <= 0 {
            return None;
        }
        let shift = 6 * self.n_remain as u32;
        let low = (self.value << shift).max(min_of_len(self.len));
        let high = (self.value << shift | ((1 << shift) - 1)).min(0x10FFFF);
        (low <= high && !(0xD800 <= low && high <= 0xDFFF)).then_some((low, high))
    }
}

/// The least code point a sequence of `len` bytes may hold (shorter forms are overlong).
fn min_of_len(len: u8) -> u32 {
    match len {
        2 => 0x80,
        3 => 0x800,
        4 => 0x10000,
        _ => 0,
    }
}

/// `decode_utf8` of a piece, continuing `partial`: its complete code points and what is left.
/// An invalid sequence gives no code points and `n_remain` -1 (llama.cpp keeps a terminating 0,
/// which this leaves out).
///
/// Stricter than llama.cpp, which takes any lead byte and any value: what is not UTF-8 (lead
/// bytes C0, C1 and F5 to FF, overlong forms, surrogates, values past U+10FFFF, a sequence that
/// can only end as one of those) is invalid, so a grammar's text is always valid UTF-8 (a JSON
/// answer's strings included). A NUL byte is the code point 0, where llama.cpp's C strings end.
pub(crate) fn decode_piece(src: &[u8], partial: Partial) -> (Vec<u32>, Partial) {
    let mut cps = Vec::with_capacity(src.len());
    let mut cur = partial;
    let mut pos = 0;
    if cur.n_remain < 0 {
        cur = Partial::default();
    }
    while pos < src.len() {
        let b = src[pos];
        pos += 1;
        if cur.n_remain > 0 {
            if b >> 6 != 2 {
                return (Vec::new(), Partial::INVALID);
            }
            cur.value = (cur.value << 6) + (b as u32 & 0x3F);
            cur.n_remain -= 1;
            if cur.n_remain == 0 {
                let v = cur.value;
                if v < min_of_len(cur.len) || (0xD800..=0xDFFF).contains(&v) || v > 0x10FFFF {
                    return (Vec::new(), Partial::INVALID);
                }
                cps.push(v);
                cur = Partial::default();
            } else if cur.range().is_none() {
                return (Vec::new(), Partial::INVALID);
            }
            continue;
        }
        let (len, bits) = match b {
            0x00..=0x7F => {
                cps.push(b as u32);
                continue;
            }
            0xC2..=0xDF => (2, b & 0x1F),
            0xE0..=0xEF => (3, b & 0x0F),
            0xF0..=0xF4 => (4, b & 0x07),
            _ => return (Vec::new(), Partial::INVALID),
        };
        cur = Partial {
            value: bits as u32,
            n_remain: len - 1,
            len: len as u8,
        };
        if cur.range().is_none() {
            return (Vec::new(), Partial::INVALID);
        }
    }
    (cps, cur)
}

/// A stack of element positions (into [`Grammar`]'s elements), its top last.
pub(crate) type Stack = Vec<u32>;

/// Where a grammar's match stands: the live stacks (an empty stack: the grammar is complete)
/// and a UTF-8 sequence cut between pieces.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct GrammarState {
    pub(crate) stacks: Vec<Stack>,
    pub(crate) partial: Partial,
}

impl GrammarState {
    /// Whether the text so far is a whole sentence of the grammar (an end-of-generation token
    /// may come now): a stack is empty, and no character is cut (llama.cpp looks at the stacks
    /// alone; the text would end in a broken character).
    pub fn is_complete(&self) -> bool {
        self.partial.n_remain == 0 && self.stacks.iter().any(Vec::is_empty)
    }

    /// Whether nothing can follow any more: no stack is left (a state no accepted text reaches).
    pub fn is_dead(&self) -> bool {
        self.stacks.is_empty()
    }
}

/// A parsed and checked grammar: every rule's elements in one array, each rule's start.
#[derive(Debug)]
pub struct Grammar {
    elems: Vec<Elem>,
    rule_start: Vec<u32>,
    root: u32,
    start: GrammarState,
}

impl Grammar {
    /// Parse GBNF text and check it (`llama_grammar_init_impl`): every referenced rule defined,
    /// `root` present, no left recursion.
    pub fn parse(text: &str, root: &str) -> Result<Self> {
        let mut p = Parser {
            s: Src(text.as_bytes()),
            symbol_ids: HashMap::new(),
            names: Vec::new(),
            rules: Vec::new(),
            depth: 0,
            elements: 0,
        };
        let mut pos = parse_space(&p.s, 0, true);
        while p.s.at(pos) != 0 {
            pos = p.parse_rule(pos)?;
        }
        if p.rules.len() < p.names.len() {
            p.rules.resize(p.names.len(), Vec::new());
        }
        for (id, rule) in p.rules.iter().enumerate() {
            if rule.is_empty() {
                return Err(err(format!(
                    "Undefined rule identifier '{}'",
                    p.names.get(id).map_or("?", String::as_str)
                )));
            }
        }
        if p.rules.is_empty() {
            return Err(err("the grammar has no rules"));
        }
        let Some(&root_id) = p.symbol_ids.get(root) else {
            return Err(err(format!("grammar does not contain a '{root}' symbol")));
        };
        // Each rule up to its first End (llama.cpp copies so), then End.
        let mut elems = Vec::new();
        let mut rule_start = Vec::with_capacity(p.rules.len());
        for rule in &p.rules {
            rule_start.push(elems.len() as u32);
            elems.extend(rule.iter().take_while(|e| **e != Elem::End).copied());
            elems.push(Elem::End);
        }
        let mut g = Grammar {
            elems,
            rule_start,
            root: root_id,
            start: GrammarState::default(),
        };
        g.check_left_recursion(&p.names)?;
        g.start = g.first_state()?;
        Ok(g)
    }

    fn rule(&self, id: u32) -> usize {
        self.rule_start[id as usize] as usize
    }

    /// `llama_grammar_detect_left_recursion`, over every rule: a rule that can reach itself
    /// through leftmost references (past references that may be empty) is refused. The same
    /// walk as llama.cpp's recursion, written with a stack of its own (a chain of thousands of
    /// rules must not overflow the thread's).
    fn check_left_recursion(&self, names: &[String]) -> Result<()> {
        let n = self.rule_start.len();
        let mut visited = vec![false; n];
        let mut in_progress = vec![false; n];
        let mut may_be_empty = vec![false; n];
        // A frame: the rule, the position of the next element to look at, whether a reference
        // there is leftmost (`recurse_into_nonterminal`), and the reference just looked into.
        struct Frame {
            rule: usize,
            pos: usize,
            recurse: bool,
            pending: Option<usize>,
        }
        for root in 0..n {
            if visited[root] {
                continue;
            }
            let mut frames: Vec<Frame> = Vec::new();
            let enter = |r: usize,
                         frames: &mut Vec<Frame>,
                         visited: &[bool],
                         in_progress: &mut [bool],
                         may_be_empty: &mut [bool]|
             -> bool {
                if in_progress[r] {
                    return true;
                }
                // A rule whose walk ended found no cycle among the rules it reaches: not again
                // (llama.cpp walks it again, which takes exponential time on some grammars).
                if visited[r] {
                    return false;
                }
                in_progress[r] = true;
                // First, whether the rule may produce the empty string.
                let mut at_rule_start = true;
                let mut i = self.rule_start[r] as usize;
                loop {
                    let e = self.elems[i];
                    if e.is_end_of_sequence() {
                        if at_rule_start {
                            may_be_empty[r] = true;
                            break;
                        }
                        at_rule_start = true;
                    } else {
                        at_rule_start = false;
                    }
                    if e == Elem::End {
                        break;
                    }
                    i += 1;
                }
                frames.push(Frame {
                    rule: r,
                    pos: self.rule_start[r] as usize,
                    recurse: true,
                    pending: None,
                });
                false
            };
            let recursive = |r: usize| {
                Err(err(format!(
                    "unsupported grammar, left recursion detected for nonterminal '{}'",
                    names.get(r).map_or("?", String::as_str)
                )))
            };
            if enter(
                root,
                &mut frames,
                &visited,
                &mut in_progress,
                &mut may_be_empty,
            ) {
                return recursive(root);
            }
            while let Some(f) = frames.last_mut() {
                if let Some(r) = f.pending.take()
                    && !may_be_empty[r]
                {
                    f.recurse = false;
                }
                let e = self.elems[f.pos];
                if e == Elem::End {
                    let rule = f.rule;
                    frames.pop();
                    in_progress[rule] = false;
                    visited[rule] = true;
                    continue;
                }
                f.pos += 1;
                match e {
                    Elem::RuleRef(r) if f.recurse => {
                        f.pending = Some(r as usize);
                        if enter(
                            r as usize,
                            &mut frames,
                            &visited,
                            &mut in_progress,
                            &mut may_be_empty,
                        ) {
                            return recursive(r as usize);
                        }
                    }
                    e if e.is_end_of_sequence() => f.recurse = true,
                    _ => f.recurse = false,
                }
            }
        }
        Ok(())
    }

    /// The state before any text: the root's alternatives, advanced to their first characters.
    pub fn start(&self) -> GrammarState {
        self.start.clone()
    }

    fn first_state(&self) -> Result<GrammarState> {
        let mut stacks = Vec::new();
        let mut pos = self.rule(self.root);
        loop {
            let mut stack = Vec::new();
            if !self.elems[pos].is_end_of_sequence() {
                stack.push(pos as u32);
            }
            self.advance_stack(stack, &mut stacks, &mut Budget::new())?;
            while !self.elems[pos].is_end_of_sequence() {
                pos += 1;
            }
            if self.elems[pos] == Elem::Alt {
                pos += 1;
            } else {
                break;
            }
        }
        Ok(GrammarState {
            stacks,
            partial: Partial::default(),
        })
    }

    /// `llama_grammar_advance_stack`: the stacks `stack` becomes, each ending at a character
    /// element (or empty: complete), added to `out` unless already there; Spent where that
    /// takes more than the budget, or `out` would pass `MAX_STACKS` (the grammar is too
    /// ambiguous to follow; llama.cpp goes on, in time and memory exponential in the text).
    fn advance_stack(
        &self,
        stack: Stack,
        out: &mut Vec<Stack>,
        budget: &mut Budget,
    ) -> std::result::Result<(), Spent> {
        let mut todo = vec![stack];
        let mut seen: BTreeSet<Stack> = BTreeSet::new();
        while let Some(cur) = todo.pop() {
            budget.spend(cost(&cur))?;
            if out.len() > MAX_STACKS {
                return Err(Spent);
            }
            if !seen.insert(cur.clone()) {
                continue;
            }
            let Some(&top) = cur.last() else {
                if !out.contains(&cur) {
                    out.push(cur);
                }
                continue;
            };
            let top = top as usize;
            match self.elems[top] {
                Elem::RuleRef(r) => {
                    let mut sub = self.rule(r);
                    loop {
                        let mut next: Stack = cur[..cur.len() - 1].to_vec();
                        if !self.elems[top + 1].is_end_of_sequence() {
                            next.push(top as u32 + 1);
                        }
                        if !self.elems[sub].is_end_of_sequence() {
                            next.push(sub as u32);
                        }
                        todo.push(next);
                        while !self.elems[sub].is_end_of_sequence() {
                            sub += 1;
                        }
                        if self.elems[sub] == Elem::Alt {
                            sub += 1;
                        } else {
                            break;
                        }
                    }
                }
                Elem::Char(_) | Elem::CharNot(_) | Elem::CharAny => {
                    if !out.contains(&cur) {
                        budget.spend(out.len() / 16)?;
                        out.push(cur);
                    }
                }
                // A stack never rests on the end of an alternative or inside a class.
                Elem::End | Elem::Alt | Elem::CharRngUpper(_) | Elem::CharAlt(_) => {}
            }
        }
        if out.len() > MAX_STACKS || out.iter().map(Vec::len).sum::<usize>() > MAX_STATE_POSITIONS {
            return Err(Spent);
        }
        Ok(())
    }

    /// `llama_grammar_match_char`: whether `chr` is in the class at `pos`, and the position
    /// after the class.
    fn match_char(&self, mut pos: usize, chr: u32) -> (bool, usize) {
        let positive = matches!(self.elems[pos], Elem::Char(_) | Elem::CharAny);
        let mut found = false;
        loop {
            let v = match self.elems[pos] {
                Elem::Char(v) | Elem::CharNot(v) | Elem::CharAlt(v) => Some(v),
                _ => None,
            };
            if let (Some(lo), Elem::CharRngUpper(hi)) = (v, self.elems[pos + 1]) {
                found = found || (lo <= chr && chr <= hi);
                pos += 2;
            } else if self.elems[pos] == Elem::CharAny {
                found = true;
                pos += 1;
            } else {
                found = found || v == Some(chr);
                pos += 1;
            }
            if !matches!(self.elems[pos], Elem::CharAlt(_)) {
                break;
            }
        }
        (found == positive, pos)
    }

    /// `llama_grammar_match_partial_char`: whether some completion of `partial` could be in the
    /// class at `pos`.
    fn match_partial_char(&self, mut pos: usize, partial: Partial) -> bool {
        let positive = matches!(self.elems[pos], Elem::Char(_) | Elem::CharAny);
        // The code points the sequence can still end as (llama.cpp's low and high, without the
        // endings that are not UTF-8).
        let Some((low, high)) = partial.range() else {
            return false;
        };
        loop {
            let v = match self.elems[pos] {
                Elem::Char(v) | Elem::CharNot(v) | Elem::CharAlt(v) => Some(v),
                _ => None,
            };
            if let (Some(lo), Elem::CharRngUpper(hi)) = (v, self.elems[pos + 1]) {
                if lo <= high && low <= hi {
                    return positive;
                }
                pos += 2;
            } else if self.elems[pos] == Elem::CharAny {
                return true;
            } else {
                if v.is_some_and(|c| low <= c && c <= high) {
                    return positive;
                }
                pos += 1;
            }
            if !matches!(self.elems[pos], Elem::CharAlt(_)) {
                break;
            }
        }
        !positive
    }

    /// `llama_grammar_accept_chr` for one stack.
    fn accept_chr(
        &self,
        stack: &Stack,
        chr: u32,
        out: &mut Vec<Stack>,
        budget: &mut Budget,
    ) -> std::result::Result<(), Spent> {
        let Some(&top) = stack.last() else {
            return Ok(());
        };
        let (ok, after) = self.match_char(top as usize, chr);
        if ok {
            let mut next: Stack = stack[..stack.len() - 1].to_vec();
            if !self.elems[after].is_end_of_sequence() {
                next.push(after as u32);
            }
            self.advance_stack(next, out, budget)?;
        }
        Ok(())
    }

    /// The state after a piece of text that is not an end-of-generation token
    /// (`llama_grammar_accept_token` for a piece): None where no stack survives it, or the piece
    /// is not UTF-8 (a cut character at its end may continue in the next); an error where the
    /// grammar is too ambiguous to follow (`MAX_WORK`).
    pub fn accept_piece(&self, st: &GrammarState, piece: &[u8]) -> Result<Option<GrammarState>> {
        Ok(self.accept_piece_in(st, piece, &mut Budget::new())?)
    }

    pub(crate) fn accept_piece_in(
        &self,
        st: &GrammarState,
        piece: &[u8],
        budget: &mut Budget,
    ) -> std::result::Result<Option<GrammarState>, Spent> {
        let (cps, partial) = decode_piece(piece, st.partial);
        if partial.n_remain < 0 {
            // Not UTF-8 (llama.cpp would take what it decoded and go on).
            return Ok(None);
        }
        let mut stacks_new: Vec<Stack> = Vec::with_capacity(st.stacks.len());
        for stack in &st.stacks {
            if stack.is_empty() {
                continue;
            }
            let mut cur = vec![stack.clone()];
            for &c in &cps {
                let mut next = Vec::new();
                for s in &cur {
                    self.accept_chr(s, c, &mut next, budget)?;
                }
                cur = next;
                if cur.is_empty() {
                    break;
                }
            }
            for s in cur {
                if !stacks_new.contains(&s) {
                    budget.spend(stacks_new.len() / 16)?;
                    stacks_new.push(s);
                }
            }
            if stacks_new.len() > MAX_STACKS {
                return Err(Spent);
            }
        }
        Ok((!stacks_new.is_empty()).then_some(GrammarState {
            stacks: stacks_new,
            partial,
        }))
    }

    /// Whether a piece (already decoded against the state's partial sequence: `cps`, `partial`)
    /// may come next: `llama_grammar_reject_candidates` for one candidate. Its code points must
    /// each be matched, and a sequence it leaves cut must be able to continue the match.
    pub(crate) fn allows(
        &self,
        st: &GrammarState,
        cps: &[u32],
        partial: Partial,
        budget: &mut Budget,
    ) -> std::result::Result<bool, Spent> {
        let texts = Texts {
            cps,
            start: &[0, cps.len() as u32],
            partial: std::slice::from_ref(&partial),
        };
        Ok(self
            .reject(&texts, &st.stacks, &[Cand::new(&texts, 0)], budget)?
            .is_empty())
    }

    /// `llama_grammar_reject_candidates`: the candidates the stacks cannot take (all of them
    /// where no stack can), in llama.cpp's order.
    ///
    /// llama.cpp recurses once a matched code point (`reject_candidates` calls
    /// `reject_candidates_for_stack`, which calls `reject_candidates` on the stacks after the
    /// code point): a token of a few hundred thousand code points, which a GGUF's vocabulary may
    /// hold, would end the process on a thread's stack. The same walk keeps its frames here on a
    /// stack of its own, in the heap; the work it does is the recursion's, step for step.
    pub(crate) fn reject(
        &self,
        t: &Texts,
        stacks: &[Stack],
        cands: &[Cand],
        budget: &mut Budget,
    ) -> std::result::Result<Vec<Cand>, Spent> {
        enum Frame<'s> {
            /// `reject_candidates` over `stacks`, at stack `next`: the value carried is the
            /// candidates every stack before it rejects.
            Stacks {
                stacks: Cow<'s, [Stack]>,
                next: usize,
            },
            /// `reject_candidates_for_stack`, waiting for the rejects of the stacks after its
            /// code point: `rejects` are its own.
            Back { rejects: Vec<Cand> },
        }
        let mut frames = vec![Frame::Stacks {
            stacks: Cow::Borrowed(stacks),
            next: 0,
        }];
        // What the frame on top takes in, and what a frame that ends gives back.
        let mut carried: Vec<Cand> = cands.to_vec();
        while let Some(frame) = frames.last_mut() {
            match frame {
                Frame::Stacks { stacks, next } => {
                    let Some(stack) = stacks.get(*next).filter(|_| !carried.is_empty()) else {
                        // Every stack seen, or none left to reject: the rejects go back.
                        frames.pop();
                        continue;
                    };
                    *next += 1;
                    let step = self.reject_for_stack(t, stack, &carried, budget)?;
                    match step {
                        ForStack::Done(rejects) => carried = rejects,
                        ForStack::After {
                            rejects,
                            next_stacks,
                            next_cands,
                        } => {
                            frames.push(Frame::Back { rejects });
                            frames.push(Frame::Stacks {
                                stacks: Cow::Owned(next_stacks),
                                next: 0,
                            });
                            carried = next_cands;
                        }
                    }
                }
                Frame::Back { rejects } => {
                    // The candidates the rest rejects, as they came in: one code point back.
                    let mut all = std::mem::take(rejects);
                    all.extend(carried.drain(..).map(|c| Cand {
                        pos: c.pos - 1,
                        ..c
                    }));
                    carried = all;
                    frames.pop();
                }
            }
        }
        Ok(carried)
    }

    /// `llama_grammar_reject_candidates_for_stack` up to its recursion: the candidates one
    /// stack rejects at their next code point, and where some match it, the stacks after it
    /// and those candidates one code point on (for [`Grammar::reject`] to follow).
    fn reject_for_stack(
        &self,
        t: &Texts,
        stack: &Stack,
        cands: &[Cand],
        budget: &mut Budget,
    ) -> std::result::Result<ForStack, Spent> {
        budget.spend(cands.len())?;
        let mut rejects = Vec::new();
        let Some(&top) = stack.last() else {
            for c in cands {
                if t.at(*c).is_some() || t.partial[c.id as usize].n_remain != 0 {
                    rejects.push(*c);
                }
            }
            return Ok(ForStack::Done(rejects));
        };
        let top = top as usize;
        let mut next_cands = Vec::with_capacity(cands.len());
        for c in cands {
            match t.at(*c) {
                None => {
                    let partial = t.partial[c.id as usize];
                    if partial.n_remain != 0 && !self.match_partial_char(top, partial) {
                        rejects.push(*c);
                    }
                }
                Some(ch) => {
                    if self.match_char(top, ch).0 {
                        next_cands.push(Cand {
                            pos: c.pos + 1,
                            ..*c
                        });
                    } else {
                        rejects.push(*c);
                    }
                }
            }
        }
        if next_cands.is_empty() {
            return Ok(ForStack::Done(rejects));
        }
        let after = self.match_char(top, 0).1;
        let mut stack_after: Stack = stack[..stack.len() - 1].to_vec();
        if !self.elems[after].is_end_of_sequence() {
            stack_after.push(after as u32);
        }
        let mut next_stacks = Vec::new();
        self.advance_stack(stack_after, &mut next_stacks, budget)?;
        Ok(ForStack::After {
            rejects,
            next_stacks,
            next_cands,
        })
    }
}

/// One stack's step of [`Grammar::reject`].
enum ForStack {
    /// No candidate matched its next code point: these are the stack's rejects.
    Done(Vec<Cand>),
    /// These are rejected now; `next_cands` are to be followed through `next_stacks`.
    After {
        rejects: Vec<Cand>,
        next_stacks: Vec<Stack>,
        next_cands: Vec<Cand>,
    },
}

/// The candidates' text for [`Grammar::reject`]: candidate `id`'s code points are
/// `cps[start[id]..start[id + 1]]`, and `partial[id]` the sequence it leaves cut.
pub(crate) struct Texts<'a> {
    pub cps: &'a [u32],
    pub start: &'a [u32],
    pub partial: &'a [Partial],
}

impl Texts<'_> {
    /// The candidate's next code point, None past its last.
    fn at(&self, c: Cand) -> Option<u32> {
        (c.pos < c.end).then(|| self.cps[c.pos as usize])
    }
}

/// A candidate token for [`Grammar::reject`]: its id in the [`Texts`], and where its next code
/// point is there and its last ends (those before `pos` are matched).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Cand {
    pub id: u32,
    pos: u32,
    end: u32,
}

impl Cand {
    /// Candidate `id` of `t`, none of its code points matched.
    pub(crate) fn new(t: &Texts, id: u32) -> Self {
        Cand {
            id,
            pos: t.start[id as usize],
            end: t.start[id as usize + 1],
        }
    }
}
