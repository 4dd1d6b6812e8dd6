//! Tensor parallelism, with the ranks simulated by CPU backends: the same logits as one rank
//! within 1e-3 on log-softmax and the same greedy tokens, on every fixture a split allows; one
//! rank bit-identical to the plain model; plans that would cut a quantization block refused.

mod common;

use common::*;
use muser_engine::tp::{ShardPlan, TpBackend};
use muser_engine::{CpuBackend, KvType, Logits, ModelFile, MuseGlimmer, NumericMode, Session};

fn tp_model(name: &str, world: usize) -> Result<MuseGlimmer<TpBackend<CpuBackend>>, String> {
    let file = ModelFile::open(model_path(name)).map_err(|e| e.to_string())?;
    let plan = ShardPlan::new(&file.config, &file.tensors, world).map_err(|e| e.to_string())?;
    let ranks = (0..world)
        .map(|_| CpuBackend::new(NumericMode::Accurate, 1).unwrap())
        .collect();
    let b = TpBackend::new(ranks, plan).map_err(|e| e.to_string())?;
    MuseGlimmer::load(&file, b).map_err(|e| e.to_string())
}

fn greedy<B: muser_engine::Backend>(m: &MuseGlimmer<B>, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut s = Session::new(m, KvType::F32, 256).unwrap();
    let mut next =
        muser_engine::sampling::argmax(&s.feed(prompt, 512, Logits::Last).unwrap()) as u32;
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(next);
        next = muser_engine::sampling::argmax(&s.feed(&[next], 1, Logits::Last).unwrap()) as u32;
    }
    out
}

#[test]
fn split_models_agree_with_one_rank() {
    let mut report = Vec::new();
    let mut ran = 0;
    for name in all_fixtures() {
        let single = load(&name, NumericMode::Accurate);
        let tokens = read_i32(&golden_path(&name, "tokens.i32"));
        let want = logits(&single, &tokens, KvType::F32, 512);
        let want_greedy = greedy(&single, &tokens, 16);
        for world in [1usize, 2, 4] {
            match tp_model(&name, world) {
                Err(e) => report.push(format!("{name:<14} x{world}: refused ({e})")),
                Ok(m) => {
                    let got = logits(&m, &tokens, KvType::F32, 512);
                    let d = max_dls(&got, &want, single.config.n_vocab);
                    let same = greedy(&m, &tokens, 16) == want_greedy;
                    report.push(format!(
                        "{name:<14} x{world}: max |Δ log-softmax| {d:.2e}, greedy16 {}",
                        if same { "same" } else { "DIFFERENT" }
                    ));
                    if world == 1 {
                        assert!(
                            got.iter()
                                .zip(&want)
                                .all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{name}: one rank must be bit-identical"
                        );
                    }
                    assert!(d <= 1e-3, "{name} x{world}: {d}");
                    assert!(same, "{name} x{world}: greedy tokens differ");
                    ran += 1;
                }
            }
        }
    }
    println!("{}", report.join("\n"));
    assert!(ran >= 30, "too few splits ran ({ran})");
}

#[test]
fn a_split_that_cuts_a_block_is_refused() {
    // tame: 4 heads x 64 = 256 columns of attn_output; two ranks would hold 128 columns each,
    // half a Q4_K block.
    let e = tp_model("tame-q4_k_m", 2).err().expect("refused");
    assert!(e.contains("not whole blocks"), "{e}");
    let e = tp_model("sharp-f32", 4).err().expect("refused");
    assert!(e.contains("cannot be split over 4 ranks"), "{e}");
    let e = tp_model("tame-f32", 3).err().expect("refused");
    assert!(e.contains("over 3 ranks"), "{e}");
}
