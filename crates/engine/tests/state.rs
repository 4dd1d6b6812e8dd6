//! Saved sequence state (`muser_engine::state`): a sequence saved and loaded into a fresh cache
//! continues exactly as the saved one does, and a file that does not fit the model is refused.

mod common;

use std::path::PathBuf;

use muser_engine::state::{self, SavedState};
use muser_engine::{CpuBackend, KvType, Logits, MuseGlimmer, NumericMode, Session};

fn tokens(n: usize, n_vocab: usize, seed: u64) -> Vec<u32> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n_vocab as u64) as u32
        })
        .collect()
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("muser-state-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

/// Prompt lengths around the fixtures' window (16) and past the CPU ring (16 + 512 slots): the
/// ring wraps once and twice.
const LENS: [usize; 5] = [1, 9, 40, 600, 1100];

fn continues_as_saved(m: &MuseGlimmer<CpuBackend>, kv: KvType, name: &str) {
    let n_vocab = m.config.n_vocab;
    for (i, &len) in LENS.iter().enumerate() {
        let prompt = tokens(len, n_vocab, 1 + i as u64);
        let more = tokens(6, n_vocab, 100 + i as u64);
        let other = tokens(4, n_vocab, 200 + i as u64);
        let mut a = Session::new(m, kv, 1200).unwrap();
        a.feed(&prompt, 64, Logits::Last).unwrap();
        let path = tmp(&format!("{name}-{len}.state"));
        let bytes = a.save_state(&path, &prompt).unwrap();
        assert_eq!(bytes, std::fs::metadata(&path).unwrap().len());
        // Loaded into a cache of the same context and into one just large enough (a smaller
        // ring when the context is below the window plus the slack).
        for n_ctx in [1200, len + more.len() + 1] {
            let mut b = Session::new(m, kv, n_ctx).unwrap();
            let (t, made_by) = b.load_state(&path).unwrap();
            assert_eq!(t, prompt, "{name} {len}");
            assert!(made_by.starts_with("cpu"), "{made_by}");
            assert_eq!(b.pos(), len);
            let mut a2 = Session::new(m, kv, 1200).unwrap();
            a2.feed(&prompt, 64, Logits::Last).unwrap();
            let la = a2.feed(&more, 3, Logits::All).unwrap();
            let lb = b.feed(&more, 3, Logits::All).unwrap();
            assert!(
                la == lb,
                "{name}, {len} positions loaded into a context of {n_ctx}: logits differ"
            );
        }
        // Going back after a load: where the loaded cache may, it continues as the saved one
        // going back as far (prefix reuse with other tokens).
        let mut b = Session::new(m, kv, 1200).unwrap();
        b.load_state(&path).unwrap();
        for back in [len, len - len / 2, len.saturating_sub(300)] {
            if back == 0 || !b.truncate(back) {
                continue;
            }
            assert!(
                a.truncate(back),
                "{name}: the loaded cache goes back further than the saved one"
            );
            let la = a.feed(&other, 2, Logits::All).unwrap();
            let lb = b.feed(&other, 2, Logits::All).unwrap();
            assert!(
                la == lb,
                "{name}, {len} positions back to {back}: logits differ"
            );
            // (Both hold the same tokens again for the next going back.)
            assert!(a.truncate(back) && b.truncate(back));
        }
        std::fs::remove_file(&path).unwrap();
    }
}

#[test]
fn a_loaded_state_continues_bit_for_bit() {
    for (name, kv) in [
        ("tame-q4_k_m", KvType::F16),
        ("tame-f32", KvType::F32),
        ("sharp-q8_0", KvType::Q8_0),
        ("odd-q4_k_m", KvType::BF16),
    ] {
        let m = common::load(name, NumericMode::Accurate);
        continues_as_saved(&m, kv, name);
    }
}

#[test]
fn a_state_that_does_not_fit_is_refused() {
    let m = common::load("tame-q4_k_m", NumericMode::Accurate);
    let n_vocab = m.config.n_vocab;
    let prompt = tokens(50, n_vocab, 7);
    let mut a = Session::new(&m, KvType::F16, 256).unwrap();
    a.feed(&prompt, 16, Logits::Last).unwrap();
    let path = tmp("refused.state");
    a.save_state(&path, &prompt).unwrap();
    let err = |r: Result<(Vec<u32>, String), muser_engine::Error>| match r {
        Ok(_) => panic!("loaded"),
        Err(e) => e.to_string(),
    };

    // Tokens that are not the cache's.
    assert!(a.save_state(&tmp("x.state"), &prompt[1..]).is_err());

    // The same shapes, other weights.
    let other = common::load("tame-q8_0", NumericMode::Accurate);
    assert_ne!(other.fingerprint, m.fingerprint);
    let mut s = Session::new(&other, KvType::F16, 256).unwrap();
    let e = err(s.load_state(&path));
    assert!(e.contains("another model"), "{e}");

    // Another cache type, a context too small.
    let mut s = Session::new(&m, KvType::Q8_0, 256).unwrap();
    let e = err(s.load_state(&path));
    assert!(e.contains("cache type is f16"), "{e}");
    let mut s = Session::new(&m, KvType::F16, 49).unwrap();
    let e = err(s.load_state(&path));
    assert!(e.contains("more than the context size 49"), "{e}");

    // A well-formed file (its checksum right) whose tokens are outside the vocabulary, whose
    // sliding layers lack the window, whose layers are of the wrong kinds: each refused, and the
    // cache it was to load into left as it was.
    let good: SavedState = state::load(&path).unwrap();
    let mut bad = good.clone();
    bad.tokens[3] = n_vocab as u32;
    let mut bad_window = good.clone();
    // (The window is 16: the next token, at 50, reads positions from 50 - 16 + 1 = 35.)
    for l in bad_window.image.layers.iter_mut().filter(|l| l.sliding) {
        let rb = bad_window.image.row_bytes;
        let cut = 36 - l.lo;
        l.lo = 36;
        l.k.drain(..cut * rb);
        l.v.drain(..cut * rb);
    }
    let mut bad_window_ok = good.clone();
    // Rows from 35 suffice.
    for l in bad_window_ok.image.layers.iter_mut().filter(|l| l.sliding) {
        let rb = bad_window_ok.image.row_bytes;
        let cut = 35 - l.lo;
        l.lo = 35;
        l.k.drain(..cut * rb);
        l.v.drain(..cut * rb);
    }
    let mut bad_kinds = good.clone();
    bad_kinds.image.layers.swap(0, 2);
    for (st, want) in [
        (&bad, Some("outside the vocabulary")),
        (&bad_window, Some("the next token reads from 35")),
        (&bad_kinds, Some("of another kind")),
        (&bad_window_ok, None),
    ] {
        let p = tmp("crafted.state");
        state::save(&p, st, m.config.n_swa).unwrap();
        let mut s = Session::new(&m, KvType::F16, 256).unwrap();
        s.feed(&prompt[..5], 5, Logits::Last).unwrap();
        match want {
            Some(w) => {
                let e = err(s.load_state(&p));
                assert!(e.contains(w), "{e}");
                assert_eq!(s.pos(), 5, "{w}: the cache was changed");
                let again = s.feed(&prompt[5..8], 3, Logits::All).unwrap();
                let mut fresh = Session::new(&m, KvType::F16, 256).unwrap();
                fresh.feed(&prompt[..5], 5, Logits::Last).unwrap();
                assert!(again == fresh.feed(&prompt[5..8], 3, Logits::All).unwrap());
            }
            None => {
                // Only the window: it continues like the whole state.
                s.load_state(&p).unwrap();
                let mut full = Session::new(&m, KvType::F16, 256).unwrap();
                full.load_state(&path).unwrap();
                let more = tokens(5, n_vocab, 9);
                assert!(
                    s.feed(&more, 5, Logits::All).unwrap()
                        == full.feed(&more, 5, Logits::All).unwrap()
                );
                // But it cannot go back before its window.
                assert!(!s.truncate(40) && full.truncate(40));
            }
        }
    }

    // Not a state file at all.
    let p = tmp("garbage.state");
    std::fs::write(&p, b"GGUF and then some").unwrap();
    let mut s = Session::new(&m, KvType::F16, 256).unwrap();
    let e = err(s.load_state(&p));
    assert!(e.contains("MUSERKV1"), "{e}");

    // Parity mode keeps llama.cpp's cells: it neither saves nor loads.
    let pm = common::load("tame-q4_k_m", NumericMode::Parity);
    let mut ps = Session::new(&pm, KvType::F16, 256).unwrap();
    ps.feed(&prompt, 16, Logits::Last).unwrap();
    assert!(ps.save_state(&tmp("p.state"), &prompt).is_err());
    let e = err(ps.load_state(&path));
    assert!(e.contains("parity"), "{e}");
}
