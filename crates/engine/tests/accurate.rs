//! Accurate mode against transformers 5.24.0 in float64 (run on each GGUF's dequantized
//! weights), on every fixture and every position of sequences at least twice the window.

mod common;

use common::*;
use muser_engine::{KvType, NumericMode};

#[test]
fn accurate_mode_matches_transformers_float64() {
    let mut report = Vec::new();
    let mut failures = Vec::new();
    for name in all_fixtures() {
        let m = load(&name, NumericMode::Accurate);
        let tokens = read_i32(&golden_path(&name, "tokens.i32"));
        assert!(
            tokens.len() >= 2 * m.config.n_swa,
            "{name}: the sequence must be at least twice the window"
        );
        let ours = logits(&m, &tokens, KvType::F32, 512);
        let reference = read_f32(&golden_path(&name, "hf64.f32"));
        let d = max_dls(&ours, &reference, m.config.n_vocab);
        let b = bound(&name, 1e-4, 1e-3);
        report.push(format!("{name:<14} {d:.3e} (bound {b:.0e})"));
        if !(d <= b) {
            failures.push(format!("{name}: {d:.3e} > {b:.0e}"));
        }
    }
    println!(
        "accurate, f32 KV, vs transformers float64, max |Δ log-softmax|:\n{}",
        report.join("\n")
    );
    assert!(failures.is_empty(), "{failures:?}");
}

#[test]
fn prompt_decode_and_micro_batch_sizes_give_identical_logits() {
    for name in all_fixtures() {
        let m = load(&name, NumericMode::Accurate);
        let tokens = read_i32(&golden_path(&name, "tokens.i32"));
        for kv in [KvType::F16, KvType::Q8_0] {
            let whole = logits(&m, &tokens, kv, 512);
            for ub in [1usize, 7, 16, 33] {
                let other = logits(&m, &tokens, kv, ub);
                let same = whole
                    .iter()
                    .zip(&other)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "{name}, {kv:?} KV: micro-batch {ub} differs from one batch"
                );
            }
        }
    }
}

#[test]
fn with_an_f16_cache_accurate_mode_is_as_close_to_float64_as_llama_cpp() {
    // The f16 cache rounds K and V; llama.cpp with the same cache type is the yardstick.
    for name in all_fixtures() {
        let m = load(&name, NumericMode::Accurate);
        let tokens = read_i32(&golden_path(&name, "tokens.i32"));
        let reference = read_f32(&golden_path(&name, "hf64.f32"));
        let ours = max_dls(
            &logits(&m, &tokens, KvType::F16, 512),
            &reference,
            m.config.n_vocab,
        );
        let llama = max_dls(
            &read_f32(&golden_path(&name, "llama-kv_f16.f32")),
            &reference,
            m.config.n_vocab,
        );
        println!("{name:<14} f16 KV vs float64: muser {ours:.3e}, llama.cpp {llama:.3e}");
        assert!(
            ours <= llama,
            "{name}: {ours:.3e} > llama.cpp's {llama:.3e}"
        );
    }
}

#[test]
fn bf16_and_q8_0_caches_run_and_stay_finite() {
    let m = load("tame-q4_k_m", NumericMode::Accurate);
    let tokens = read_i32(&golden_path("tame-q4_k_m", "tokens.i32"));
    let reference = read_f32(&golden_path("tame-q4_k_m", "hf64.f32"));
    for kv in [KvType::BF16, KvType::Q8_0] {
        let d = max_dls(&logits(&m, &tokens, kv, 512), &reference, m.config.n_vocab);
        println!("tame-q4_k_m {kv:?} KV vs float64: {d:.3e}");
    }
}

/// Accurate mode is batch-invariant: sequences sharing micro-batches (prompts mixed in one
/// batch, then steps that advance every unfinished sequence) get, bit for bit, the logits each
/// gets alone. The server relies on it; the CUDA backend offers the same as `--batch-invariant`.
#[test]
fn sequences_batched_together_give_each_its_own_bits() {
    use common::batched::{alone, together};
    for name in all_fixtures()
        .into_iter()
        .filter(|n| n.ends_with("q4_k_m") || n.ends_with("f16"))
    {
        let m = load(&name, NumericMode::Accurate);
        let tokens = read_i32(&golden_path(&name, "tokens.i32"));
        let seqs: Vec<Vec<u32>> = (0..4)
            .map(|i| {
                tokens
                    .iter()
                    .cycle()
                    .skip(11 * i)
                    .take(20 + 5 * i)
                    .copied()
                    .collect()
            })
            .collect();
        let prompts = [6usize, 1, 13, 9];
        let got = together(&m, &seqs, &prompts, KvType::F16, 128).unwrap();
        for (i, s) in seqs.iter().enumerate() {
            let want = alone(&m, s, prompts[i], KvType::F16, 128).unwrap();
            assert_eq!(want.len(), got[i].len(), "{name}: sequence {i}: step count");
            for (step, (w, g)) in want.iter().zip(&got[i]).enumerate() {
                assert!(
                    w.iter().zip(g).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{name}: sequence {i}, position {}: batched logits differ from alone",
                    prompts[i] + step
                );
            }
        }
    }
}

/// Prefix reuse on the CPU: a cache taken back to an earlier length (`Session::truncate`:
/// `kv_can_truncate`, `kv_set_len`) and fed other tokens gives the bits of a cache that never went further (one
/// position back, and a window and more back: within the rings' slack); going back is refused
/// where a sliding ring has already dropped the window before that length.
#[test]
fn going_back_in_a_cache_gives_a_fresh_caches_bits() {
    use muser_engine::{Logits, Session};
    for name in all_fixtures() {
        let m = load(&name, NumericMode::Accurate);
        let toks = read_i32(&golden_path(&name, "tokens.i32"));
        let w = m.config.n_swa;
        let p = w + 3;
        let suffix: Vec<u32> = toks.iter().rev().take(8).copied().collect();
        let n_ctx = p + w + muser_engine::kv::RING_SLACK + 16;
        let run = |ahead: usize| -> Option<Vec<f32>> {
            let mut s = Session::new(&m, KvType::F16, n_ctx).unwrap();
            s.feed(&toks[..p], 64, Logits::Last).unwrap();
            if ahead > 0 {
                let more: Vec<u32> = toks.iter().cycle().skip(p).take(ahead).copied().collect();
                s.feed(&more, 64, Logits::Last).unwrap();
                if !s.truncate(p) {
                    return None;
                }
                assert_eq!(s.pos(), p);
            }
            let mut out = s.feed(&suffix[..5], 64, Logits::All).unwrap();
            for &t in &suffix[5..] {
                out.extend(s.feed(&[t], 1, Logits::Last).unwrap());
            }
            Some(out)
        };
        let fresh = run(0).unwrap();
        // One position past, and a window and more past: within the rings' slack, the window
        // before `p` is still held.
        for (ahead, what) in [(1, "one position"), (w + 2, "a window")] {
            let back = run(ahead).unwrap_or_else(|| panic!("{name}: going back {what} refused"));
            assert!(
                fresh
                    .iter()
                    .zip(&back)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{name}: going back {what} changed the logits"
            );
        }
        // Past the slack: the ring (n_swa + RING_SLACK slots) no longer holds the window.
        assert!(
            run(muser_engine::kv::RING_SLACK + 2).is_none(),
            "{name}: going back past the ring was allowed"
        );
    }
}

/// A cache copied from another (`Backend::kv_copy`, the choices of one request sharing their
/// prompt), taken back one position and fed on gives the bits of the cache it was copied from
/// fed the same; the source is unchanged by the copy. Past a window, so the rings have wrapped.
#[test]
fn a_copied_cache_gives_its_sources_bits() {
    use muser_engine::{Backend, Logits, Session};
    for name in all_fixtures() {
        let m = load(&name, NumericMode::Accurate);
        assert!(m.backend.kv_can_copy());
        let toks = read_i32(&golden_path(&name, "tokens.i32"));
        let p = m.config.n_swa + 5;
        let n_ctx = 2 * p + 32;
        let suffix: Vec<u32> = toks.iter().rev().take(6).copied().collect();
        let mut a = Session::new(&m, KvType::F16, n_ctx).unwrap();
        a.feed(&toks[..p], 16, Logits::Last).unwrap();
        let mut b = Session::new(&m, KvType::F16, n_ctx).unwrap();
        b.feed(&toks[..3], 16, Logits::Last).unwrap(); // whatever it held before is gone
        m.backend.kv_copy(&a.kv, &mut b.kv).unwrap();
        assert_eq!(b.pos(), p);
        assert!(b.truncate(p - 1));
        let tail = |s: &mut Session<'_, _>| {
            let mut out = s.feed(&toks[p - 1..p], 1, Logits::Last).unwrap();
            out.extend(s.feed(&suffix, 4, Logits::All).unwrap());
            out
        };
        assert!(a.truncate(p - 1));
        let want = tail(&mut a);
        let got = tail(&mut b);
        assert!(
            want.iter()
                .zip(&got)
                .all(|(x, y)| x.to_bits() == y.to_bits()),
            "{name}: the copy's logits differ"
        );
    }
    // Parity mode keeps llama.cpp's cell layout, which is not copied: refused, not wrong.
    let m = load(&all_fixtures()[0], NumericMode::Parity);
    assert!(!m.backend.kv_can_copy());
}
