//! CUDA against the CPU's accurate mode, on a GPU. Without one (CI), every test prints why it
//! skips. On the H200, `scripts/h200-run.sh` runs this file with MUSER_FIXTURES pointing at
//! tests/fixtures.
//!
//! Must show: max |Δ log-softmax| of CUDA vs CPU accurate <= 1e-4 on tame and odd fixtures (the
//! tame-sensitivity families) and <= 1e-3 on sharp ones, over every position, for the prompt path
//! (cuBLAS) and the graph decode path; identical greedy continuations of 32 tokens; no NaN or Inf.

use std::path::PathBuf;

use muser_cuda::CudaBackend;
use muser_cuda::graph::GraphDecoder;
use muser_engine::backend::{Backend, Batch};
use muser_engine::sampling::{argmax, log_softmax};
use muser_engine::{CpuBackend, KvType, Logits, ModelFile, MuseGlimmer, NumericMode, Session};

fn gpu() -> Option<CudaBackend> {
    if let Err(e) = muser_cuda::check_libraries() {
        println!("SKIPPED (no CUDA): {e}");
        return None;
    }
    match CudaBackend::new(0) {
        Ok(b) => Some(b),
        Err(e) => {
            println!("SKIPPED (no usable GPU): {e}");
            None
        }
    }
}

fn fixtures() -> PathBuf {
    std::env::var("MUSER_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures"))
}

/// A fixture's model file.
fn model_path(name: &str) -> PathBuf {
    fixtures().join("models").join(format!("{name}.gguf"))
}

/// Every fixture, sorted: each `<name>` with `models/<name>.gguf` and `golden/<name>/tokens.i32`.
fn names() -> Vec<String> {
    let fix = fixtures();
    let mut v: Vec<String> = std::fs::read_dir(fix.join("golden"))
        .unwrap_or_else(|e| panic!("{}: {e}", fix.join("golden").display()))
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| {
            fix.join("models").join(format!("{n}.gguf")).is_file()
                && fix.join("golden").join(n).join("tokens.i32").is_file()
        })
        .collect();
    v.sort();
    assert!(!v.is_empty(), "no fixtures found in {}", fix.display());
    v
}

/// Families whose measured sensitivity is tame's (tests/fixtures/MANIFEST.md: max |Δ log-softmax|
/// / eps 18.0 for tame, 19.2 for odd, 97.1 for sharp); every other family gets the sharp bound.
fn tame_sensitivity(name: &str) -> bool {
    ["tame", "odd"].contains(&name.split('-').next().unwrap_or(name))
}

fn tokens(name: &str) -> Vec<u32> {
    read_ids(&fixtures().join("golden").join(name).join("tokens.i32")).expect("tokens")
}

fn max_dls(a: &[f32], b: &[f32], n: usize) -> f64 {
    if a.len() != b.len() || !a.iter().all(|v| v.is_finite()) {
        return f64::NAN; // a shape mismatch or a NaN/Inf fails the bound below
    }
    a.chunks_exact(n)
        .zip(b.chunks_exact(n))
        .map(|(x, y)| {
            let (lx, ly) = (log_softmax(x), log_softmax(y));
            lx.iter()
                .zip(&ly)
                .map(|(p, q)| (p - q).abs())
                .fold(0.0, f64::max)
        })
        .fold(0.0, f64::max)
}

#[test]
fn cuda_matches_cpu_accurate_on_every_fixture() {
    let Some(_) = gpu() else { return };
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    for name in names() {
        match check_fixture(&name, &mut rows) {
            Ok(mut f) => failures.append(&mut f),
            Err(e) => failures.push(format!("{name}: error {e}")),
        }
    }
    report(
        "CUDA accurate vs CPU accurate, max |Δ log-softmax| over every position",
        &rows,
        &failures,
    );
}

fn check_fixture(name: &str, rows: &mut Vec<String>) -> Result<Vec<String>, muser_engine::Error> {
    let mut failures = Vec::new();
    let file = ModelFile::open(model_path(name))?;
    let cpu = MuseGlimmer::load(&file, CpuBackend::new(NumericMode::Accurate, 0)?)?;
    let gpu = MuseGlimmer::load(&file, CudaBackend::new(0)?)?;
    let toks = tokens(name);
    let n_vocab = cpu.config.n_vocab;
    let bound = if tame_sensitivity(name) { 1e-4 } else { 1e-3 };
    for kv in [KvType::F32, KvType::F16] {
        let want = Session::new(&cpu, kv, 256)?.feed(&toks, 512, Logits::All)?;
        // Prompt path: one micro-batch (cuBLAS on exactly dequantized weights).
        let prompt = Session::new(&gpu, kv, 256)?.feed(&toks, 512, Logits::All)?;
        let dp = max_dls(&prompt, &want, n_vocab);
        // Decode path: one token at a time through the captured graph.
        let mut s = Session::new(&gpu, kv, 256)?;
        let mut dec = GraphDecoder::new(&gpu)?;
        let decode = graph_steps(&mut dec, &mut s.kv, &toks)?;
        let dd = max_dls(&decode, &want, n_vocab);
        // Greedy continuation of 32 tokens: CPU session vs CUDA graph.
        let mut cs = Session::new(&cpu, kv, 256)?;
        let mut next = argmax(&cs.feed(&toks, 512, Logits::Last)?) as u32;
        let mut cpu_greedy = Vec::new();
        for _ in 0..32 {
            cpu_greedy.push(next);
            next = argmax(&cs.feed(&[next], 1, Logits::Last)?) as u32;
        }
        let mut gpu_greedy = Vec::new();
        let mut g_next = argmax(&decode[decode.len() - n_vocab..]) as u32;
        for _ in 0..32 {
            gpu_greedy.push(g_next);
            g_next = dec.step(&mut s.kv, g_next, None)?;
        }
        let same = cpu_greedy == gpu_greedy;
        rows.push(format!(
            "{name:<14} {kv:?}: prompt {dp:.2e}  decode {dd:.2e}  greedy32 {}",
            if same { "identical" } else { "DIFFER" }
        ));
        if kv == KvType::F32 {
            // The accurate configuration: f32 everywhere, the two backends differ only in the
            // order of f32 sums.
            if !(dp <= bound && dd <= bound && same) {
                failures.push(format!("{name} {kv:?}: prompt {dp:.2e} decode {dd:.2e} greedy same {same} (bound {bound:e})"));
            }
        } else {
            // An f16 cache rounds K and V: an f32 difference of one ulp between the backends can
            // flip an f16 rounding (docs/PARITY.md). The backends must still agree better than
            // the cache's own rounding moves the model (CPU f16 vs CPU f32), and greedily.
            let mut c32 = Session::new(&cpu, KvType::F32, 256)?;
            let own = max_dls(&want, &c32.feed(&toks, 512, Logits::All)?, n_vocab);
            rows.push(format!(
                "{name:<14}      (the f16 cache's own effect on the CPU: {own:.2e})"
            ));
            if !(dp <= own && dd <= own && same) {
                failures.push(format!("{name} F16: prompt {dp:.2e} decode {dd:.2e} vs the cache's own {own:.2e}, greedy same {same}"));
            }
        }
    }
    Ok(failures)
}

/// A one-layer synthetic file in `dir` with the 30B's width 6656 and FFN width `n_ff`, every
/// tensor in `layout` (random weights from `seed`).
fn one_layer_file(dir: &std::path::Path, layout: &str, n_ff: usize, seed: u64) -> ModelFile {
    layer_file(dir, layout, (n_ff, 4, 512), seed)
}

/// `one_layer_file` with (FFN width, query heads of 128 values, vocabulary) of the caller's.
fn layer_file(
    dir: &std::path::Path,
    layout: &str,
    (n_ff, n_head, n_vocab): (usize, usize, usize),
    seed: u64,
) -> ModelFile {
    let p = muser_engine::synth::Preset {
        name: "t",
        n_layer: 1,
        n_embd: 6656,
        n_ff,
        n_head,
        n_head_kv: 2,
        head_dim: 128,
        n_vocab,
        n_ctx: 4096,
        n_swa: 128,
    };
    let path = dir.join(format!("{layout}-{n_ff}-{n_head}-{n_vocab}.gguf"));
    muser_engine::synth::write(
        &path,
        &p,
        muser_engine::synth::Layout::parse(layout).unwrap(),
        seed,
    )
    .unwrap();
    ModelFile::open(&path).unwrap()
}

#[test]
fn matvec_kernels_match_the_cpu_per_format() {
    let Some(gpu_b) = gpu() else { return };
    // Every one-token launch on the staged kernels where they exist (sm_90; by default only
    // launches of at least 50 MB of weights take them), so a pair and its matrices alone take
    // the same kernels; the register kernels are held to the staged ones by
    // staged_one_token_products_give_the_register_bits.
    gpu_b.set_mvq_tma_min_bytes(0);
    // Real 30B widths for the formats of a Q4_K_M file, plus every fixture format.
    let dir = std::env::temp_dir().join(format!("muser-gpu-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut report = Vec::new();
    // The 30B's FFN width too (19968 columns: the wide one-token kernels), for the formats of a
    // Q4_K_M file.
    let cases = ["q4_k", "q5_k", "q6_k", "q8_0", "q4_0", "f16", "bf16", "f32"]
        .map(|l| (l, 2048usize))
        .into_iter()
        .chain([("q4_k", 19968), ("q6_k", 19968)]);
    for (layout, n_ff) in cases {
        let file = one_layer_file(&dir, layout, n_ff, 7);
        let m = &file.tensors.layers[0].ffn_down; // 6656 rows x n_ff cols
        let up = &file.tensors.layers[0].ffn_up; // n_ff rows x 6656 cols
        // Batch-invariant too for Q4_K/Q6_K: every token count on the tensor-core kernels
        // (100 tokens: two launches).
        let modes: &[bool] = if matches!(layout, "q4_k" | "q6_k") {
            &[false, true]
        } else {
            &[false]
        };
        for (&invariant, mat) in modes.iter().flat_map(|i| [(i, m), (i, up)]) {
            gpu_b.set_batch_invariant(invariant);
            let cpu = CpuBackend::new(NumericMode::Accurate, 0).unwrap();
            let wc = cpu.matrix(&file.gguf, mat).unwrap();
            let wg = gpu_b.matrix(&file.gguf, mat).unwrap();
            // 2.. tokens: the tensor-core kernels for Q4_K/Q6_K (64 per launch: 100 takes two;
            // 160 two grid layers of 64 in one launch and a launch of 32).
            for n in [1usize, 3, 8, 17, 64, 100, 160] {
                let x = product_input(n, mat.cols);
                let mut xc = cpu.act(n, mat.cols).unwrap();
                xc.data.copy_from_slice(&x);
                let mut yc = cpu.act(n, mat.rows).unwrap();
                cpu.matmul(&wc, &xc, &mut yc).unwrap();
                let mut xg = gpu_b.act(n, mat.cols).unwrap();
                gpu_b.stream.memcpy_htod(&x, xg_data(&mut xg)).unwrap();
                let mut yg = gpu_b.act(n, mat.rows).unwrap();
                gpu_b.matmul(&wg, &xg, &mut yg).unwrap();
                let y = gpu_b.read(&yg).unwrap();
                if n == 1 && !invariant {
                    // One token: the same bits launch after launch (the column-split kernels of
                    // the wide matrices add their ranges in a fixed order, and each launch leaves
                    // its counters at zero for the next).
                    for _ in 0..3 {
                        gpu_b.matmul(&wg, &xg, &mut yg).unwrap();
                        let again = gpu_b.read(&yg).unwrap();
                        assert!(
                            y.iter()
                                .zip(&again)
                                .all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{layout} {}x{} n=1: a second launch changed the bits",
                            mat.rows,
                            mat.cols
                        );
                    }
                }
                if invariant {
                    // Every variant of the tensor-core kernels does the same arithmetic per
                    // (row, token): the same bits as the default launch.
                    let mut same_bits = |what: &str| {
                        gpu_b.matmul(&wg, &xg, &mut yg).unwrap();
                        let other = gpu_b.read(&yg).unwrap();
                        assert!(
                            y.iter()
                                .zip(&other)
                                .all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{layout} n={n}: {what} changed the bits"
                        );
                    };
                    // Fewer token tiles per warp (more warps), each also with Q4_K's scales in
                    // the weight operand (mmq_sa_*; Q6_K keeps its kernels).
                    for tiles in [1, 2, 4] {
                        gpu_b.set_mmq_tiles_per_warp(tiles);
                        if tiles != 4 {
                            same_bits(&format!("{tiles} tiles per warp"));
                        }
                        gpu_b.set_mmq_scale_in_a(true);
                        same_bits(&format!("{tiles} tiles per warp, scales in the weights"));
                        gpu_b.set_mmq_scale_in_a(false);
                    }
                    // Two tiles of 16 rows per warp (mmq_s2_*).
                    gpu_b.set_mmq_rows_per_warp(32);
                    same_bits("32 rows per warp");
                    gpu_b.set_mmq_rows_per_warp(16);
                    // Operands read from global memory instead of staged in shared memory.
                    gpu_b.set_mmq_staged(false);
                    same_bits("the one-stage kernels");
                    gpu_b.set_mmq_staged(true);
                    // A launch per 64 tokens instead of grid layers of 64 (the default).
                    gpu_b.set_mmq_zgrid(false);
                    same_bits("a launch per 64 tokens");
                    gpu_b.set_mmq_zgrid(true);
                }
                if !invariant && n > 64 && matches!(layout, "q4_k" | "q6_k") {
                    // With the f16 prompt products off (gemm16), the integer kernels take
                    // these products: grid layers of 64 tokens in one launch (the default),
                    // and a launch per 64 tokens (its own column split): within the same bound
                    // against the CPU.
                    gpu_b.set_gemm16(false);
                    for zgrid in [true, false] {
                        gpu_b.set_mmq_zgrid(zgrid);
                        let mut yz = gpu_b.act(n, mat.rows).unwrap();
                        gpu_b.matmul(&wg, &xg, &mut yz).unwrap();
                        let yz = gpu_b.read(&yz).unwrap();
                        let err = max_rel_err(&yz, &yc.data);
                        report.push(format!(
                            "{layout:<5} {}x{} n={n:<3} integer kernels, {}: max rel err {err:.2e}",
                            mat.rows,
                            mat.cols,
                            if zgrid {
                                "one launch"
                            } else {
                                "a launch per 64 tokens"
                            }
                        ));
                        assert!(
                            yz.iter().all(|v| v.is_finite()) && err < 2e-5,
                            "{layout} n={n} integer kernels zgrid={zgrid}: {err}"
                        );
                    }
                    gpu_b.set_mmq_zgrid(true);
                    gpu_b.set_gemm16(true);
                }
                if !invariant && n == 1 && matches!(layout, "q4_k" | "q6_k") {
                    // One token, two digit planes (`--mode fast`, the x-stationary kernels'
                    // `_p2` forms): each run of 16 (Q4_K) or 8 (Q6_K) values to within 2^(E-15)
                    // (|x| < 2^E over the run), within the bound below taken over the 256-value
                    // blocks (a run's E is at most its block's). A pair launch of the
                    // matrix with itself gives the same bits twice.
                    let bounds = two_plane_weight_sums(layout, mat, &file, &cpu, &wc);
                    let scale = max_abs(&yc.data);
                    gpu_b.set_mvq_planes(2);
                    let mut y2 = gpu_b.act(n, mat.rows).unwrap();
                    gpu_b.matmul(&wg, &xg, &mut y2).unwrap();
                    let y2h = gpu_b.read(&y2).unwrap();
                    let worst =
                        two_plane_excess(&y2h, &yc.data, &x, n, mat.rows, mat.cols, &bounds, scale);
                    report.push(format!(
                        "{layout:<5} {}x{} n=1   two planes (one token): largest error / its bound {worst:.3}",
                        mat.rows, mat.cols
                    ));
                    assert!(
                        worst <= 1.0,
                        "{layout} one token: two planes beyond their bound ({worst})"
                    );
                    let (mut pa, mut pb) = (
                        gpu_b.act(n, mat.rows).unwrap(),
                        gpu_b.act(n, mat.rows).unwrap(),
                    );
                    gpu_b.matmul_pair(&wg, &wg, &xg, &mut pa, &mut pb).unwrap();
                    let (pa, pb) = (gpu_b.read(&pa).unwrap(), gpu_b.read(&pb).unwrap());
                    let same =
                        |a: &[f32]| a.iter().zip(&y2h).all(|(p, q)| p.to_bits() == q.to_bits());
                    assert!(
                        same(&pa) && same(&pb),
                        "{layout} one token, two planes: pair bits differ"
                    );
                    gpu_b.set_mvq_planes(3);
                }
                if !invariant && (n == 17 || n == 160) && matches!(layout, "q4_k" | "q6_k") {
                    // Two digit planes (mmq_p2_*): the activations to within 2^(E - 15), so
                    // each (token, row) may move from the exact product by at
                    // most sum over blocks of 2^(E - 15) sum |d sc q| (|x| < 2^E over the
                    // block; d sc q the part of a weight the planes multiply), beyond the
                    // rounding the three-plane check above allows.
                    let bounds = two_plane_weight_sums(layout, mat, &file, &cpu, &wc);
                    let scale = max_abs(&yc.data);
                    gpu_b.set_mmq_planes(2);
                    // One block per SM (three stages) and two (mmq_p2o_*, two stages).
                    for per_sm in [1, 2] {
                        gpu_b.set_mmq_blocks_per_sm(per_sm);
                        let mut y2 = gpu_b.act(n, mat.rows).unwrap();
                        gpu_b.matmul(&wg, &xg, &mut y2).unwrap();
                        let y2 = gpu_b.read(&y2).unwrap();
                        let worst = two_plane_excess(
                            &y2, &yc.data, &x, n, mat.rows, mat.cols, &bounds, scale,
                        );
                        report.push(format!(
                            "{layout:<5} {}x{} n={n:<3} two planes, {per_sm} block(s) per SM: largest error / its bound {worst:.3}",
                            mat.rows, mat.cols
                        ));
                        assert!(
                            worst <= 1.0,
                            "{layout} n={n} {per_sm} per SM: two planes beyond their bound ({worst})"
                        );
                    }
                    gpu_b.set_mmq_blocks_per_sm(1);
                    gpu_b.set_mmq_planes(3);
                }
                if std::ptr::eq(mat, up) {
                    // The FFN's gate and up as one pair launch (ffn_swiglu): each product as
                    // alone (the same bits in the batch-invariant mode and at one token, the
                    // x-stationary pair kernels; else within the bound against the CPU below),
                    // the pair off for comparison.
                    let gm = &file.tensors.layers[0].ffn_gate;
                    let gg = gpu_b.matrix(&file.gguf, gm).unwrap();
                    let mut g_alone = gpu_b.act(n, gm.rows).unwrap();
                    gpu_b.matmul(&gg, &xg, &mut g_alone).unwrap();
                    let g_alone = gpu_b.read(&g_alone).unwrap();
                    let mut g_cpu = cpu.act(n, gm.rows).unwrap();
                    cpu.matmul(&cpu.matrix(&file.gguf, gm).unwrap(), &xc, &mut g_cpu)
                        .unwrap();
                    for pairs in [true, false] {
                        gpu_b.set_mmq_pairs(pairs);
                        let mut pg = gpu_b.act(n, gm.rows).unwrap();
                        let mut pu = gpu_b.act(n, mat.rows).unwrap();
                        let mut po = gpu_b.act(n, mat.rows).unwrap();
                        gpu_b
                            .ffn_swiglu(&gg, &wg, &xg, &mut pg, &mut pu, &mut po)
                            .unwrap();
                        let (pg, pu) = (gpu_b.read(&pg).unwrap(), gpu_b.read(&pu).unwrap());
                        let bits = |a: &[f32], b: &[f32]| {
                            a.iter().zip(b).all(|(p, q)| p.to_bits() == q.to_bits())
                        };
                        if invariant || n == 1 {
                            assert!(
                                bits(&pg, &g_alone) && bits(&pu, &y),
                                "{layout} n={n} pairs={pairs}: gate/up bits differ from alone"
                            );
                        }
                        let (eg, eu) = (max_rel_err(&pg, &g_cpu.data), max_rel_err(&pu, &yc.data));
                        assert!(
                            eg < 2e-5 && eu < 2e-5,
                            "{layout} n={n} pairs={pairs}: gate {eg} up {eu}"
                        );
                    }
                    gpu_b.set_mmq_pairs(true);
                }
                if !invariant && n > 64 {
                    // More than 64 tokens: the f16 tensor-core products (gemm16) in the
                    // accurate mode's split form (y, checked below; F32 weights keep f32
                    // cuBLAS), and here in `--mode fast`'s one f16 product: every weight and
                    // activation rounded to f16 (2^-12 of itself) after its power-of-two scale,
                    // within 2^-9 of the largest output.
                    gpu_b.set_fast_mode(true).unwrap();
                    let mut yf = gpu_b.act(n, mat.rows).unwrap();
                    gpu_b.matmul(&wg, &xg, &mut yf).unwrap();
                    gpu_b.set_fast_mode(false).unwrap();
                    let yf = gpu_b.read(&yf).unwrap();
                    let ef = max_rel_err(&yf, &yc.data);
                    report.push(format!(
                        "{layout:<5} {}x{} n={n:<3} fast (one f16 product): max rel err {ef:.2e}",
                        mat.rows, mat.cols
                    ));
                    assert!(
                        yf.iter().all(|v| v.is_finite()) && ef < 2f32.powi(-9),
                        "{layout} n={n} fast f16 product: {ef}"
                    );
                    // `--f16-weights`: the matrix's kept f16 copy (made at the first product,
                    // then reused): the same f16 values as the slabs, so the same bound.
                    gpu_b.set_fast_mode(true).unwrap();
                    let outs = kept_copy_products(&gpu_b, &file, mat, &xg);
                    gpu_b.set_fast_mode(false).unwrap();
                    let ek = max_rel_err(&outs[1], &yc.data);
                    report.push(format!(
                        "{layout:<5} {}x{} n={n:<3} fast, kept f16 weights: max rel err {ek:.2e}, bits as the slabs': {}",
                        mat.rows,
                        mat.cols,
                        same_bits(&outs[1], &yf)
                    ));
                    assert!(
                        outs[1].iter().all(|v| v.is_finite())
                            && ek < 2f32.powi(-9)
                            && same_bits(&outs[0], &outs[1]),
                        "{layout} n={n} kept f16 weights: {ek}, or the second product differs from the first"
                    );
                }
                if !invariant && n > 64 && mat.ty != muser_gguf::GgmlType::F32 {
                    // `--f16-weights` in the accurate mode: the split form's kept [hi | lo]
                    // copy (made at the first product, then reused): the slabs' f16 values and
                    // products of the same shapes (every matrix here fits one slab), so y's bits.
                    let outs = kept_copy_products(&gpu_b, &file, mat, &xg);
                    let (first, second) = (same_bits(&outs[0], &y), same_bits(&outs[1], &y));
                    report.push(format!(
                        "{layout:<5} {}x{} n={n:<3} accurate, kept split f16 weights: made {first}, kept {second} (the slabs' bits)",
                        mat.rows, mat.cols
                    ));
                    assert!(
                        first && second,
                        "{layout} n={n}: kept split f16 weights differ from the slabs' product"
                    );
                }
                let err = max_rel_err(&y, &yc.data);
                report.push(format!(
                    "{layout:<5} {}x{} n={n:<3} max rel err {err:.2e}{}",
                    mat.rows,
                    mat.cols,
                    if invariant { " (batch-invariant)" } else { "" }
                ));
                assert!(
                    y.iter().all(|v| v.is_finite()) && err < 2e-5,
                    "{layout} {}x{} n={n}: {err}",
                    mat.rows,
                    mat.cols
                );
            }
        }
    }
    println!("{}", report.join("\n"));
    std::fs::remove_dir_all(&dir).ok();
}

/// Five sequences cut from a fixture's tokens (repeated as needed): sequence i starts at
/// token `skip` i and is `len + grow` i tokens long.
fn five_sequences(toks: &[u32], skip: usize, len: usize, grow: usize) -> Vec<Vec<u32>> {
    sequences(toks, 5, skip, len, grow)
}

/// `count` sequences cut from the fixture's tokens: sequence i starts `skip * i` tokens in and
/// holds `len + grow * i` tokens (the tokens repeat where they run out).
fn sequences(toks: &[u32], count: usize, skip: usize, len: usize, grow: usize) -> Vec<Vec<u32>> {
    (0..count)
        .map(|i| {
            toks.iter()
                .cycle()
                .skip(skip * i)
                .take(len + grow * i)
                .copied()
                .collect()
        })
        .collect()
}

/// The largest |value|, at least 1e-30 (the scale of a relative error).
fn max_abs(v: &[f32]) -> f32 {
    v.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-30)
}

/// The accurate mode's split f16 products (`gemm16`) of 160 tokens at the 30B's widths, the
/// main product's columns summed in runs of at most 4,096 (the default), 2,048 and 1,024
/// columns added in f32, and of the largest micro-batch (MAX_BATCH_TOKENS, where cuBLAS may
/// choose other kernels) in the default runs: each within 2e-5 of its largest output from the CPU's accurate product
/// (itself within 1.3e-6 of the f64 result on these inputs, measured on the CPU). One run of all
/// the columns is measured and printed, not held to the bound: on an H100 (2026-12-07) it gave
/// 2.36e-5 (Q4_K) and 2.46e-5 (Q6_K) where the H200 gave at most 3.3e-6 (2026-11-30), which is
/// why the runs exist (GEMM16_RUN_COLUMNS in lib.rs).
#[test]
fn split_f16_products_in_column_runs_meet_the_bound() {
    let Some(gpu_b) = gpu() else { return };
    let dir = std::env::temp_dir().join(format!("muser-gpu-runs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut report = Vec::new();
    let mut failures = Vec::new();
    let cpu = CpuBackend::new(NumericMode::Accurate, 0).unwrap();
    let default_runs = gpu_b.gemm16_kchunk();
    assert_eq!(
        default_runs, 4096,
        "the default run length this test documents"
    );
    for (layout, n_ff) in [("q4_k", 2048usize), ("q4_k", 19968), ("q6_k", 19968)] {
        let file = one_layer_file(&dir, layout, n_ff, 7);
        let l = &file.tensors.layers[0];
        for (mat, n) in [&l.ffn_down, &l.ffn_up]
            .into_iter()
            .flat_map(|m| [(m, 160), (m, muser_cuda::MAX_BATCH_TOKENS)])
        {
            let x = product_input(n, mat.cols);
            let mut xc = cpu.act(n, mat.cols).unwrap();
            xc.data.copy_from_slice(&x);
            let mut yc = cpu.act(n, mat.rows).unwrap();
            cpu.matmul(&cpu.matrix(&file.gguf, mat).unwrap(), &xc, &mut yc)
                .unwrap();
            let wg = gpu_b.matrix(&file.gguf, mat).unwrap();
            let mut xg = gpu_b.act(n, mat.cols).unwrap();
            gpu_b.stream.memcpy_htod(&x, xg_data(&mut xg)).unwrap();
            let runs: &[usize] = if n == 160 {
                &[0, 4096, 2048, 1024]
            } else {
                &[4096]
            };
            for &kc in runs {
                gpu_b.set_gemm16_kchunk(kc);
                let mut yg = gpu_b.act(n, mat.rows).unwrap();
                gpu_b.matmul(&wg, &xg, &mut yg).unwrap();
                let y = gpu_b.read(&yg).unwrap();
                let err = max_rel_err(&y, &yc.data);
                let line = format!(
                    "{layout:<5} {}x{} n={n} runs of {}: max rel err {err:.2e}",
                    mat.rows,
                    mat.cols,
                    if kc == 0 {
                        "all columns".to_string()
                    } else {
                        kc.to_string()
                    }
                );
                let held = kc != 0;
                if held && !(y.iter().all(|v| v.is_finite()) && err < 2e-5) {
                    failures.push(line.clone());
                }
                report.push(if held {
                    line
                } else {
                    format!("{line} (not held to the bound)")
                });
            }
            gpu_b.set_gemm16_kchunk(default_runs);
        }
    }
    println!("split f16 products in column runs:\n{}", report.join("\n"));
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The per-format tests' input: `n` rows of `cols` values in [-0.7, 0.7).
fn product_input(n: usize, cols: usize) -> Vec<f32> {
    (0..n * cols)
        .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 0.7)
        .collect()
}

/// The largest |got - want| over the largest |want|.
fn max_rel_err(got: &[f32], want: &[f32]) -> f32 {
    got.iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max)
        / max_abs(want)
}

/// Per row and 256-column block of `mat`: the sum over the block of |d sc q|, the part of each
/// weight the tensor-core kernels multiply by the activations' digit planes (Q4_K: |d| sc 15 per
/// value, from the file's blocks, a bound; Q6_K: |w| itself, dequantized by the CPU backend).
fn two_plane_weight_sums(
    layout: &str,
    mat: &muser_engine::loader::Matrix,
    file: &ModelFile,
    cpu: &CpuBackend,
    wc: &<CpuBackend as Backend>::Matrix,
) -> Vec<f64> {
    let nb = mat.cols / 256;
    let mut out = vec![0f64; mat.rows * nb];
    if layout == "q4_k" {
        let raw = mat.bytes(&file.gguf);
        for (i, blk) in raw.chunks_exact(144).enumerate() {
            let d = half::f16::from_le_bytes([blk[0], blk[1]]).to_f32().abs() as f64;
            let sc = &blk[4..16];
            let total: u32 = (0..8)
                .map(|j| {
                    if j < 4 {
                        (sc[j] & 63) as u32
                    } else {
                        ((sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4)) as u32
                    }
                })
                .sum();
            out[i] = d * 15.0 * 32.0 * total as f64;
        }
    } else {
        let ids: Vec<u32> = (0..mat.rows as u32).collect();
        let mut w = cpu.act(mat.rows, mat.cols).unwrap();
        cpu.get_rows(wc, &ids, &mut w).unwrap();
        for (i, chunk) in w.data.chunks_exact(256).enumerate() {
            out[i] = chunk.iter().map(|v| v.abs() as f64).sum();
        }
    }
    out
}

/// The largest |y2 - y| / bound over tokens and rows, bound = sum over blocks of 2^(E - 15) times
/// the block's weight sum (`sums`) plus the three-plane check's 2e-5 of the largest |y|.
#[allow(clippy::too_many_arguments)]
fn two_plane_excess(
    y2: &[f32],
    y: &[f32],
    x: &[f32],
    n: usize,
    rows: usize,
    cols: usize,
    sums: &[f64],
    scale: f32,
) -> f64 {
    let nb = cols / 256;
    let mut worst = 0f64;
    for tok in 0..n {
        // |x| < 2^E over each block: E from the largest value's f32 exponent.
        let step: Vec<f64> = (0..nb)
            .map(|b| {
                let m = x[tok * cols + b * 256..][..256]
                    .iter()
                    .fold(0f32, |m, v| m.max(v.abs()));
                // (xq_planes takes E >= -100: blocks below 2^-100 share that step)
                let e = if m == 0.0 {
                    0
                } else {
                    (((m.to_bits() >> 23) & 0xff) as i32 - 126).max(-100)
                };
                2f64.powi(e - 15)
            })
            .collect();
        for r in 0..rows {
            let bound: f64 =
                (0..nb).map(|b| step[b] * sums[r * nb + b]).sum::<f64>() + 2e-5 * scale as f64;
            let err = (y2[tok * rows + r] as f64 - y[tok * rows + r] as f64).abs();
            worst = worst.max(err / bound);
        }
    }
    worst
}

/// Print a test's rows (under `title`, unless empty), then fail listing every failure.
fn report(title: &str, rows: &[String], failures: &[String]) {
    if title.is_empty() {
        println!("{}", rows.join("\n"));
    } else {
        println!("{title}:\n{}", rows.join("\n"));
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Whether two outputs are the same bits, value for value.
/// Every step's logits, one after another, of `toks` fed one at a time through `dec`'s captured
/// graph into `kv`.
fn graph_steps(
    dec: &mut GraphDecoder<'_>,
    kv: &mut muser_cuda::CudaKv,
    toks: &[u32],
) -> Result<Vec<f32>, muser_engine::Error> {
    let (mut all, mut l) = (Vec::new(), Vec::new());
    for &t in toks {
        dec.step(kv, t, Some(&mut l))?;
        all.extend_from_slice(&l);
    }
    Ok(all)
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// `--f16-weights`: `mat` uploaded afresh and multiplied by `x` twice, its kept f16 copy made
/// at the first product and read at the second (the backend's mode as the caller set it).
fn kept_copy_products(
    g: &CudaBackend,
    file: &ModelFile,
    mat: &muser_engine::loader::Matrix,
    x: &muser_cuda::CudaAct,
) -> [Vec<f32>; 2] {
    g.set_f16_weights(true);
    let wk = g.matrix(&file.gguf, mat).unwrap();
    let product = || {
        let mut y = g.act(x.rows, mat.rows).unwrap();
        g.matmul(&wk, x, &mut y).unwrap();
        g.read(&y).unwrap()
    };
    let outs = [product(), product()];
    g.set_f16_weights(false);
    outs
}

/// `mat`'s exact weights (the CPU's dequantization), rows x cols, row-major.
fn exact_weights(
    cpu: &CpuBackend,
    file: &ModelFile,
    mat: &muser_engine::loader::Matrix,
) -> Vec<f32> {
    let wc = cpu.matrix(&file.gguf, mat).unwrap();
    let ids: Vec<u32> = (0..mat.rows as u32).collect();
    let mut wh = cpu.act(mat.rows, mat.cols).unwrap();
    cpu.get_rows(&wc, &ids, &mut wh).unwrap();
    wh.data
}

fn xg_data(a: &mut muser_cuda::CudaAct) -> &mut cudarc::driver::CudaSlice<f32> {
    a.data_mut()
}

/// Tensor parallelism over GPUs with NCCL: the same logits as one GPU within 1e-3 on
/// log-softmax and the same greedy tokens, on every fixture the split allows (K-quant fixtures
/// are too narrow to split whole blocks over 2 ranks and are refused by the plan).
#[test]
fn tensor_parallel_over_gpus_matches_one_gpu() {
    use muser_engine::tp::{ShardPlan, TpBackend};
    let Some(_) = gpu() else { return };
    let n_dev = cudarc::driver::CudaContext::device_count().unwrap_or(0) as usize;
    if n_dev < 2 {
        println!("SKIPPED (tensor parallelism needs 2 GPUs, {n_dev} found)");
        return;
    }
    if !muser_cuda::nccl::nccl_present() {
        println!("SKIPPED (no NCCL: put a folder with libnccl.so on LD_LIBRARY_PATH)");
        return;
    }
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    let mut ran = 0;
    for name in names() {
        let file = ModelFile::open(model_path(&name)).expect("open");
        let one = MuseGlimmer::load(&file, CudaBackend::new(0).expect("gpu 0")).expect("load");
        let toks = tokens(&name);
        let n_vocab = one.config.n_vocab;
        let want = Session::new(&one, KvType::F32, 256)
            .and_then(|mut s| s.feed(&toks, 512, Logits::All))
            .expect("one gpu");
        let greedy = |m: &dyn Fn(&[u32], Logits) -> Vec<f32>| {
            let mut next = argmax(&m(&toks, Logits::Last)) as u32;
            let mut out = Vec::new();
            for _ in 0..16 {
                out.push(next);
                next = argmax(&m(&[next], Logits::Last)) as u32;
            }
            out
        };
        let mut s1 = Session::new(&one, KvType::F32, 256).expect("session");
        let cell = std::cell::RefCell::new(&mut s1);
        let want_greedy = greedy(&|t, l| cell.borrow_mut().feed(t, 512, l).expect("feed"));
        // Teacher-forced decode, one token per step: the steps after the first two are
        // recorded (CUDA graphs, NCCL inside on the ranks) and replayed.
        let decode = |m: &dyn Fn(&[u32], Logits) -> Vec<f32>| {
            let half = toks.len() / 2;
            m(&toks[..half], Logits::Last);
            toks[half..]
                .iter()
                .flat_map(|&t| m(&[t], Logits::Last))
                .collect::<Vec<f32>>()
        };
        let mut s1d = Session::new(&one, KvType::F32, 256).expect("session");
        let cell = std::cell::RefCell::new(&mut s1d);
        let want_decode = decode(&|t, l| cell.borrow_mut().feed(t, 512, l).expect("feed"));
        for world in [2usize, 4].into_iter().filter(|&w| w <= n_dev) {
            let plan = match ShardPlan::new(&file.config, &file.tensors, world) {
                Ok(p) => p,
                Err(e) => {
                    rows.push(format!("{name:<14} x{world}: refused by the plan ({e})"));
                    continue;
                }
            };
            let ranks: Vec<CudaBackend> = (0..world)
                .map(|i| CudaBackend::new(i).expect("gpu"))
                .collect();
            let nccl = Box::new(muser_cuda::nccl::NcclAllReduce::new(&ranks).expect("nccl"));
            let tp = TpBackend::new(ranks, plan)
                .expect("tp")
                .with_all_reduce(nccl);
            let m = MuseGlimmer::load(&file, tp).expect("load tp");
            let got = Session::new(&m, KvType::F32, 256)
                .and_then(|mut s| s.feed(&toks, 512, Logits::All))
                .expect("tp");
            let d = max_dls(&got, &want, n_vocab);
            let mut s2 = Session::new(&m, KvType::F32, 256).expect("session");
            let cell2 = std::cell::RefCell::new(&mut s2);
            let same =
                greedy(&|t, l| cell2.borrow_mut().feed(t, 512, l).expect("feed")) == want_greedy;
            let before = m.backend.ranks[0].step_graph_replays();
            let mut s3 = Session::new(&m, KvType::F32, 256).expect("session");
            let cell3 = std::cell::RefCell::new(&mut s3);
            let got_decode = decode(&|t, l| cell3.borrow_mut().feed(t, 512, l).expect("feed"));
            let dd = max_dls(&got_decode, &want_decode, n_vocab);
            let replays = m.backend.ranks[0].step_graph_replays() - before;
            rows.push(format!(
                "{name:<14} x{world} (NCCL): max |Δ log-softmax| prompt {d:.2e}, decode {dd:.2e} \
                 ({replays} steps replayed), greedy16 {}",
                if same { "same" } else { "DIFFERENT" }
            ));
            if !(d <= 1e-3 && dd <= 1e-3 && same && replays > 0) {
                failures.push(format!(
                    "{name} x{world}: {d:.2e} / {dd:.2e}, {replays} replays, greedy same {same}"
                ));
            }
            ran += 1;
        }
    }
    println!("tensor parallel over GPUs vs one GPU:\n{}", rows.join("\n"));
    assert!(ran > 0, "no fixture could be split");
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The row norms at real widths (the fixtures are 256 wide, where a kernel that covers only
/// part of a row would still pass): rms_norm and the fused tail against the CPU, every value.
#[test]
fn norms_match_the_cpu_at_real_widths() {
    let Some(g) = gpu() else { return };
    let c = CpuBackend::new(NumericMode::Accurate, 0).unwrap();
    fn run<B: Backend>(b: &B, n: usize, rows: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let val = |i: usize, k: usize| {
            (((i * 7919 + k * 104_729) % 2001) as f32 / 1000.0 - 1.0) * (1.0 + k as f32)
        };
        let x: Vec<f32> = (0..rows * n).map(|i| val(i, 1)).collect();
        let src: Vec<f32> = (0..rows * n).map(|i| val(i, 2)).collect();
        let w1 = b
            .vector(&(0..n).map(|i| 0.5 + val(i, 3).abs()).collect::<Vec<_>>())
            .unwrap();
        let w2 = b
            .vector(&(0..n).map(|i| 0.25 + val(i, 4).abs()).collect::<Vec<_>>())
            .unwrap();
        let mut xa = b.act(rows, n).unwrap();
        b.write(&mut xa, &x).unwrap();
        let mut out = b.act(rows, n).unwrap();
        b.rms_norm(&xa, Some(&w1), 1e-5, &mut out).unwrap();
        let normed = b.read(&out).unwrap();
        let mut sa = b.act(rows, n).unwrap();
        b.write(&mut sa, &src).unwrap();
        let mut next = b.act(rows, n).unwrap();
        b.norm_tail(&mut xa, &sa, &w1, 1e-8, &w2, 1e-6, &mut next)
            .unwrap();
        (normed, b.read(&xa).unwrap(), b.read(&next).unwrap())
    }
    // Three rows (the block-per-row kernels, with sums of 8), and one row with and without
    // the cluster forms of the tail (`set_norm_tail_cluster`: 16 blocks, the default on sm_90,
    // and 8; sm_90 and newer; they take rows without sums).
    let default_form = g.norm_tail_cluster();
    for n in [256usize, 2048, 6656, 8192] {
        for (rows, blocks) in [(3, 0), (1, 0), (1, 8), (1, 16)] {
            if blocks > 0 && !g.hopper() {
                continue;
            }
            g.set_norm_tail_cluster(blocks).unwrap();
            let (a, b) = (run(&c, n, rows), run(&g, n, rows));
            for (what, x, y) in [
                ("rms_norm", &a.0, &b.0),
                ("tail residual", &a.1, &b.1),
                ("tail next", &a.2, &b.2),
            ] {
                let err = x
                    .iter()
                    .zip(y.iter())
                    .map(|(p, q)| ((p - q) / p.abs().max(1e-3)).abs())
                    .fold(0f32, f32::max);
                let form = match blocks {
                    0 => String::new(),
                    8 => "cluster".to_string(),
                    n => format!("cluster{n}"),
                };
                println!("n={n:<5} rows {rows} {what:<14} {form:<7} max rel err {err:.2e}");
                assert!(err <= 1e-6, "{what} at n={n}, {rows} rows {form}: {err}");
            }
        }
    }
    g.set_norm_tail_cluster(default_form).unwrap();
}

/// A whole model wider than the fixtures (the synthetic 'small' and 'mid' presets: 512 and 2048
/// wide, llama.cpp's Q4_K_M mix, random weights): CUDA (prompt and graph decode) against the CPU's
/// accurate mode, f32 cache, and greedy continuations.
#[test]
fn wide_synthetic_models_match_the_cpu() {
    let Some(_) = gpu() else { return };
    let dir = std::env::temp_dir().join(format!("muser-wide-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for preset in ["small", "mid"] {
        let path = dir.join(format!("{preset}.gguf"));
        let p = muser_engine::synth::preset(preset).unwrap();
        muser_engine::synth::write(&path, p, muser_engine::synth::Layout::Q4KM, 11).unwrap();
        let file = ModelFile::open(&path).unwrap();
        let cpu =
            MuseGlimmer::load(&file, CpuBackend::new(NumericMode::Accurate, 0).unwrap()).unwrap();
        let gpu = MuseGlimmer::load(&file, CudaBackend::new(0).unwrap()).unwrap();
        let n_vocab = cpu.config.n_vocab;
        let toks: Vec<u32> = (0..40u32)
            .map(|i| (i * 7919 + 13) % n_vocab as u32)
            .collect();
        let want = Session::new(&cpu, KvType::F32, 256)
            .unwrap()
            .feed(&toks, 512, Logits::All)
            .unwrap();
        let prompt = Session::new(&gpu, KvType::F32, 256)
            .unwrap()
            .feed(&toks, 512, Logits::All)
            .unwrap();
        let mut s = Session::new(&gpu, KvType::F32, 256).unwrap();
        let mut dec = GraphDecoder::new(&gpu).unwrap();
        let decode = graph_steps(&mut dec, &mut s.kv, &toks).unwrap();
        // The prompt again on the f16 tensor-core products (gemm16, split), the threshold
        // lowered so that 40 tokens take them.
        let g16 = CudaBackend::new(0).unwrap();
        g16.set_gemm16_min_tokens(8);
        let gpu16 = MuseGlimmer::load(&file, g16).unwrap();
        let prompt16 = Session::new(&gpu16, KvType::F32, 256)
            .unwrap()
            .feed(&toks, 512, Logits::All)
            .unwrap();
        drop(gpu16);
        let d16 = max_dls(&prompt16, &want, n_vocab);
        let (dp, dd) = (
            max_dls(&prompt, &want, n_vocab),
            max_dls(&decode, &want, n_vocab),
        );
        let mut cs = Session::new(&cpu, KvType::F32, 256).unwrap();
        let mut next = argmax(&cs.feed(&toks, 512, Logits::Last).unwrap()) as u32;
        let mut g_next = argmax(&decode[decode.len() - n_vocab..]) as u32;
        let (mut cg, mut gg) = (Vec::new(), Vec::new());
        for _ in 0..16 {
            cg.push(next);
            next = argmax(&cs.feed(&[next], 1, Logits::Last).unwrap()) as u32;
            gg.push(g_next);
            g_next = dec.step(&mut s.kv, g_next, None).unwrap();
        }
        println!(
            "{preset} ({}x{}): prompt {dp:.2e} (f16 products {d16:.2e}) decode {dd:.2e} greedy16 {}",
            p.n_embd,
            p.n_ff,
            if cg == gg { "identical" } else { "DIFFER" }
        );
        assert!(
            dp <= 1e-3 && dd <= 1e-3 && d16 <= 1e-3,
            "{preset}: prompt {dp:.2e} (f16 products {d16:.2e}) decode {dd:.2e}"
        );
        assert_eq!(cg, gg, "{preset}: greedy tokens differ");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Micro-batches of more tokens than the attention takes at once (MAX_UBATCH): their products
/// run over all the tokens, their attention in pieces of MAX_UBATCH, each piece's K and V stored
/// before it attends. A sliding window of 64 keys (rings of 64 + MAX_UBATCH slots) and 1,500
/// tokens in one micro-batch: stored at once, the later tokens' K and V would overwrite keys the
/// first ones see (1,500 positions in 576 slots). Against the CPU's accurate mode (f32 cache)
/// and against the same prompt in micro-batches of 512 (f32 and f16 caches: the f16 cache takes
/// the tensor-core prompt attention).
#[test]
fn micro_batches_past_the_attention_limit_attend_in_pieces() {
    let Some(_) = gpu() else { return };
    let dir = std::env::temp_dir().join(format!("muser-pieces-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("pieces.gguf");
    let p = muser_engine::synth::Preset {
        name: "pieces",
        n_layer: 4,
        n_embd: 512,
        n_ff: 1536,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 128,
        n_vocab: 4096,
        n_ctx: 4096,
        n_swa: 64,
    };
    muser_engine::synth::write(&path, &p, muser_engine::synth::Layout::Q4KM, 17).unwrap();
    let file = ModelFile::open(&path).unwrap();
    let cpu = MuseGlimmer::load(&file, CpuBackend::new(NumericMode::Accurate, 0).unwrap()).unwrap();
    let gpu = MuseGlimmer::load(&file, CudaBackend::new(0).unwrap()).unwrap();
    let most = gpu.backend.max_batch_tokens();
    assert!(
        most > muser_cuda::MAX_UBATCH,
        "the backend takes {most} tokens"
    );
    let n_vocab = cpu.config.n_vocab;
    let toks: Vec<u32> = (0..1500u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 7) % n_vocab as u32)
        .collect();
    let want = Session::new(&cpu, KvType::F32, 2048)
        .unwrap()
        .feed(&toks, 512, Logits::All)
        .unwrap();
    let mut failures = Vec::new();
    for kv in [KvType::F32, KvType::F16] {
        let one = Session::new(&gpu, kv, 2048)
            .unwrap()
            .feed(&toks, most, Logits::All)
            .unwrap();
        let in512 = Session::new(&gpu, kv, 2048)
            .unwrap()
            .feed(&toks, 512, Logits::All)
            .unwrap();
        let d512 = max_dls(&one, &in512, n_vocab);
        let dcpu = max_dls(&one, &want, n_vocab);
        println!(
            "{kv:?}: 1,500 tokens in one micro-batch against micro-batches of 512 {d512:.2e}, against the CPU {dcpu:.2e}"
        );
        // The f16 cache's rounding moves the model by itself (check_fixture): the CPU's f32
        // figures bound the f32 cache only.
        if !(d512 <= 1e-3 && (kv == KvType::F16 || dcpu <= 1e-3)) {
            failures.push(format!(
                "{kv:?}: against 512s {d512:.2e}, against the CPU {dcpu:.2e}"
            ));
        }
    }
    std::fs::remove_dir_all(&dir).ok();
    assert!(failures.is_empty(), "{failures:?}");
}

/// `--mode fast`: prompt products on the TF32 tensor cores (10-bit mantissas in, f32
/// accumulation). Its stated tolerance against the CPU's accurate mode is the fixture family's
/// measured sensitivity (tests/fixtures/MANIFEST.md: max |Δ log-softmax| per unit relative
/// perturbation of the input, 18.0 tame, 19.2 odd, 97.1 sharp) times TF32's unit roundoff 2^-10:
/// 1.8e-2 tame, 1.9e-2 odd, 9.5e-2 sharp (docs/PARITY.md). A first guess of 1e-2 for every family
/// was below what TF32 rounding costs on the sharp family (measured 1.7e-2 to 3.7e-2). Decode,
/// token by token (the one-token products), is held to the same bound.
///
/// How far a fixture family's log-softmax moves per unit of relative rounding in the products
/// (measured; docs/PARITY.md): the scale of `--mode fast`'s tolerance.
fn sensitivity(name: &str) -> f64 {
    match name.split('-').next().unwrap_or("") {
        "tame" => 18.0,
        "odd" => 19.2,
        _ => 97.1,
    }
}

#[test]
fn fast_mode_prompts_and_decode_stay_within_its_tolerance() {
    let Some(_) = gpu() else { return };
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    for name in names() {
        let bound = sensitivity(&name) * 2f64.powi(-10);
        let file = ModelFile::open(model_path(&name)).expect("open");
        let cpu =
            MuseGlimmer::load(&file, CpuBackend::new(NumericMode::Accurate, 0).unwrap()).unwrap();
        let g = CudaBackend::new(0).unwrap();
        g.set_fast_mode(true).unwrap();
        let gpu = MuseGlimmer::load(&file, g).unwrap();
        let toks = tokens(&name);
        let want = Session::new(&cpu, KvType::F32, 256)
            .unwrap()
            .feed(&toks, 512, Logits::All)
            .unwrap();
        let got = Session::new(&gpu, KvType::F32, 256)
            .unwrap()
            .feed(&toks, 512, Logits::All)
            .unwrap();
        // Token by token: the one-token products (the x-stationary kernels, two planes).
        let steps = Session::new(&gpu, KvType::F32, 256)
            .unwrap()
            .feed(&toks, 1, Logits::All)
            .unwrap();
        let d = max_dls(&got, &want, cpu.config.n_vocab);
        let ds = max_dls(&steps, &want, cpu.config.n_vocab);
        rows.push(format!(
            "{name:<14} fast vs CPU accurate: prompt {d:.2e}, token by token {ds:.2e} (bound {bound:.1e})"
        ));
        if !(d <= bound && ds <= bound) {
            failures.push(format!(
                "{name}: prompt {d:.2e}, token by token {ds:.2e}, bound {bound:.1e}"
            ));
        }
    }
    report("", &rows, &failures);
}

/// `qmma` (kernels/qmma.cu, `--mode fast` Q4_K products of 9 to 64 tokens): against the exact
/// weights (the CPU's dequantization) times the activations rounded to f16, summed in f64, every
/// output within 2^-18 of the row's sum of |w||x^| (the f32 sums inside and after the mma); the
/// same bits on relaunch, a token's outputs the same bits whatever the batch around it, and every
/// way of cutting the launch (QmmaShape: rows per block, stages, activations through registers,
/// one token warp of 64) the default's bits.
#[test]
fn qmma_products_match_the_exact_weights() {
    let Some(_) = gpu() else { return };
    let g = CudaBackend::new(0).unwrap();
    g.set_fast_mode(true).unwrap();
    g.set_qmma(true);
    let base = muser_cuda::QmmaShape {
        row_warps: 4,
        stages: 2,
        wave: 3,
        xreg: false,
        nt8: false,
    };
    let others = [
        muser_cuda::QmmaShape {
            row_warps: 8,
            stages: 3,
            ..base
        },
        muser_cuda::QmmaShape {
            row_warps: 2,
            stages: 4,
            ..base
        },
        muser_cuda::QmmaShape {
            stages: 3,
            xreg: true,
            ..base
        },
        muser_cuda::QmmaShape {
            row_warps: 8,
            stages: 4,
            xreg: true,
            ..base
        },
        muser_cuda::QmmaShape { nt8: true, ..base },
    ];
    let dir = std::env::temp_dir().join(format!("muser-qmma-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut rows_out = Vec::new();
    let mut failures = Vec::new();
    for n_ff in [2048usize, 19968] {
        let file = one_layer_file(&dir, "q4_k", n_ff, 13);
        let cpu = CpuBackend::new(NumericMode::Accurate, 0).unwrap();
        for mat in [
            &file.tensors.layers[0].ffn_down,
            &file.tensors.layers[0].ffn_up,
        ] {
            let wg = g.matrix(&file.gguf, mat).unwrap();
            let wh = exact_weights(&cpu, &file, mat);
            let (mut worst, mut rep_ok, mut inv_ok) = (0f64, true, true);
            let mut shape_diff: Vec<String> = Vec::new();
            let mut first: Option<Vec<f32>> = None;
            for n in [9usize, 17, 32, 33, 40, 64] {
                let x: Vec<f32> = (0..n * mat.cols)
                    .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 0.7 + 1e-3)
                    .collect();
                let xh: Vec<f64> = x.iter().map(|&v| half::f16::from_f32(v).to_f64()).collect();
                let mut xg = g.act(n, mat.cols).unwrap();
                g.write(&mut xg, &x).unwrap();
                let mut yg = g.act(n, mat.rows).unwrap();
                g.set_qmma_shape(base).unwrap();
                g.matmul(&wg, &xg, &mut yg).unwrap();
                let got = g.read(&yg).unwrap();
                g.matmul(&wg, &xg, &mut yg).unwrap();
                rep_ok &= same_bits(&g.read(&yg).unwrap(), &got);
                for sh in others {
                    g.set_qmma_shape(sh).unwrap();
                    match g.matmul(&wg, &xg, &mut yg) {
                        Ok(()) => {
                            let other = g.read(&yg).unwrap();
                            if !same_bits(&other, &got) {
                                shape_diff.push(format!("n={n} {sh:?}: different bits"));
                            }
                        }
                        Err(e) => shape_diff.push(format!("n={n} {sh:?}: {e}")),
                    }
                }
                g.set_qmma_shape(base).unwrap();
                // Tokens 0..9 are the same activations in every batch.
                let head = &got[..9 * mat.rows];
                match &first {
                    None => first = Some(head.to_vec()),
                    Some(f) => inv_ok &= same_bits(f, head),
                }
                if !got.iter().all(|v| v.is_finite()) {
                    failures.push(format!("{}x{} n={n}: not finite", mat.rows, mat.cols));
                    continue;
                }
                for r in (0..mat.rows).step_by(7) {
                    let wr = &wh[r * mat.cols..(r + 1) * mat.cols];
                    for t in 0..n {
                        let xt = &xh[t * mat.cols..(t + 1) * mat.cols];
                        let (mut want, mut mag) = (0f64, 0f64);
                        for (a, b) in wr.iter().zip(xt) {
                            want += *a as f64 * b;
                            mag += (*a as f64 * b).abs();
                        }
                        let d = (got[t * mat.rows + r] as f64 - want).abs();
                        worst = worst.max(d / (mag * 2f64.powi(-18)).max(1e-30));
                    }
                }
            }
            let what = format!(
                "{}x{}: largest difference / bound {worst:.3}, relaunch {}, batch {}, {} other shapes: {}",
                mat.rows,
                mat.cols,
                if rep_ok {
                    "same bits"
                } else {
                    "DIFFERENT BITS"
                },
                if inv_ok { "invariant" } else { "DEPENDENT" },
                others.len(),
                if shape_diff.is_empty() {
                    "same bits".to_string()
                } else {
                    format!("{shape_diff:?}")
                }
            );
            if !(worst <= 1.0 && rep_ok && inv_ok && shape_diff.is_empty()) {
                failures.push(what.clone());
            }
            rows_out.push(what);
        }
    }
    std::fs::remove_dir_all(&dir).ok();
    report("qmma vs the exact weights", &rows_out, &failures);
}

/// The f16 tensor-core prompt products (gemm16) on every fixture: with the token threshold
/// lowered so the 64-token prompt takes them, the accurate mode's split form must meet the
/// accurate bounds against the CPU (F32 cache; as cuda_matches_cpu_accurate_on_every_fixture),
/// and `--mode fast`'s one f16 product the fast mode's tolerance.
#[test]
fn f16_prompt_products_meet_each_modes_bound() {
    let Some(_) = gpu() else { return };
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    for name in names() {
        let file = ModelFile::open(model_path(&name)).expect("open");
        let cpu =
            MuseGlimmer::load(&file, CpuBackend::new(NumericMode::Accurate, 0).unwrap()).unwrap();
        let toks = tokens(&name);
        let want = Session::new(&cpu, KvType::F32, 256)
            .unwrap()
            .feed(&toks, 512, Logits::All)
            .unwrap();
        for fast in [false, true] {
            let g = CudaBackend::new(0).unwrap();
            g.set_fast_mode(fast).unwrap();
            g.set_gemm16_min_tokens(8);
            let gpu = MuseGlimmer::load(&file, g).unwrap();
            let got = Session::new(&gpu, KvType::F32, 256)
                .unwrap()
                .feed(&toks, 512, Logits::All)
                .unwrap();
            let d = max_dls(&got, &want, cpu.config.n_vocab);
            let bound = if fast {
                sensitivity(&name) * 2f64.powi(-10)
            } else if tame_sensitivity(&name) {
                1e-4
            } else {
                1e-3
            };
            let what = if fast {
                "fast, one f16 product"
            } else {
                "accurate, split f16"
            };
            rows.push(format!("{name:<14} {what}: {d:.2e} (bound {bound:.1e})"));
            if !(d <= bound) {
                failures.push(format!("{name} {what}: {d:.2e} > {bound:.1e}"));
            }
        }
    }
    report("", &rows, &failures);
}

/// softmax(q k^T scale + mask) v in f64 for one sequence at positions 0..n, K and V rounded to
/// f16 first as the cache stores them (query head h reads KV head h / (n_head / n_head_kv); the
/// causal mask, and 0 <= i - j < n_swa on sliding layers).
fn attention_f64(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    n: usize,
    spec: &muser_engine::backend::AttnSpec,
) -> Vec<f32> {
    let (hd, nh) = (spec.head_dim, spec.n_head);
    let r16 = |x: &f32| half::f16::from_f32(*x).to_f64();
    let (k, v): (Vec<f64>, Vec<f64>) = (k.iter().map(r16).collect(), v.iter().map(r16).collect());
    let mut out = vec![0f32; n * nh * hd];
    for i in 0..n {
        out[i * nh * hd..(i + 1) * nh * hd].copy_from_slice(&attention_f64_row(q, &k, &v, i, spec));
    }
    out
}

/// Row i of attention_f64 (the query at position i over keys 0..=i of K and V, already f16).
fn attention_f64_row(
    q: &[f32],
    k: &[f64],
    v: &[f64],
    i: usize,
    spec: &muser_engine::backend::AttnSpec,
) -> Vec<f32> {
    let (hd, nh, nkv) = (spec.head_dim, spec.n_head, spec.n_head_kv);
    let sliding = spec.kind == muser_engine::LayerKind::SlidingRope;
    let mut out = vec![0f32; nh * hd];
    let j0 = if sliding {
        (i + 1).saturating_sub(spec.n_swa)
    } else {
        0
    };
    for h in 0..nh {
        let g = h / (nh / nkv);
        let qi = &q[(i * nh + h) * hd..][..hd];
        let s: Vec<f64> = (j0..=i)
            .map(|j| {
                let kj = &k[(j * nkv + g) * hd..][..hd];
                qi.iter().zip(kj).map(|(a, b)| *a as f64 * b).sum::<f64>() * spec.scale as f64
            })
            .collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let p: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
        let l: f64 = p.iter().sum();
        for d in 0..hd {
            let acc: f64 = (j0..=i)
                .zip(&p)
                .map(|(j, pj)| pj * v[(j * nkv + g) * hd + d])
                .sum();
            out[h * hd + d] = (acc / l) as f32;
        }
    }
    out
}

/// The attention checks' synthetic model (written into `dir`): the 30B's 16 query heads per KV
/// head (32 over 2) and head_dim 128, 4 layers (0 to 2 sliding with a window of 128, 3 full).
fn nrep16_file(dir: &std::path::Path) -> ModelFile {
    let p = muser_engine::synth::Preset {
        name: "t",
        n_layer: 4,
        n_embd: 1024,
        n_ff: 1024,
        n_head: 32,
        n_head_kv: 2,
        head_dim: 128,
        n_vocab: 512,
        n_ctx: 4096,
        n_swa: 128,
    };
    let path = dir.join("nrep16.gguf");
    muser_engine::synth::write(&path, &p, muser_engine::synth::Layout::Q4KM, 5).unwrap();
    ModelFile::open(&path).unwrap()
}

/// `len` values in [-amp, amp), a different pattern per seed (the attention checks' inputs).
fn fill(len: usize, seed: usize, amp: f32) -> Vec<f32> {
    (0..len)
        .map(|i| (((i * 7919 + seed * 104729) % 2000) as f32 / 1000.0 - 1.0) * amp)
        .collect()
}

/// Batched decode attention on the tensor cores (attn_tcd): one token of each of 12 sequences
/// whose caches hold 3 to 454 earlier tokens (a sliding layer's window of 128 and ring crossed,
/// and a full layer), against the CUDA-core kernel on the same caches and both against the f64
/// result for each sequence's last query: the bounds of the prompt kernel's check (accurate
/// split form 2^-14 of the largest output, fast 2^-9).
#[test]
fn decode_batch_attention_on_tensor_cores_matches_the_cuda_cores() {
    let Some(_) = gpu() else { return };
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    let dir = std::env::temp_dir().join(format!("muser-attn-tcd-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = nrep16_file(&dir);
    let gpu = MuseGlimmer::load(&file, CudaBackend::new(0).unwrap()).unwrap();
    let (qd, kd) = (32 * 128, 2 * 128);
    let lens: Vec<usize> = (0..12).map(|s| 3 + 41 * s).collect();
    // Sequence s: L_s + 1 tokens of q, k, v (the last one is the decode step's).
    let seqs: Vec<(Vec<f32>, Vec<f32>, Vec<f32>)> = lens
        .iter()
        .enumerate()
        .map(|(s, &l)| {
            (
                fill((l + 1) * qd, 10 * s + 1, 3.0),
                fill((l + 1) * kd, 10 * s + 2, 2.0),
                fill((l + 1) * kd, 10 * s + 3, 1.5),
            )
        })
        .collect();
    let b = &gpu.backend;
    let upload = |rows: usize, cols: usize, data: &[f32]| {
        let mut a = b.act(rows, cols).unwrap();
        b.stream.memcpy_htod(data, xg_data(&mut a)).unwrap();
        a
    };
    for (layer, kind) in [
        (0usize, muser_engine::LayerKind::SlidingRope),
        (3, muser_engine::LayerKind::FullNope),
    ] {
        assert_eq!(
            gpu.config.layer_kinds[layer], kind,
            "the synthetic model's layer {layer}"
        );
        let spec = muser_engine::backend::AttnSpec {
            layer,
            kind,
            n_swa: 128,
            scale: 1.0 / (128f32).sqrt(),
            n_head: 32,
            n_head_kv: 2,
            head_dim: 128,
        };
        let r16 = |x: &f32| half::f16::from_f32(*x).to_f64();
        let mut exact = Vec::new();
        for (s, &l) in lens.iter().enumerate() {
            let (q, k, v) = &seqs[s];
            let (k, v): (Vec<f64>, Vec<f64>) =
                (k.iter().map(r16).collect(), v.iter().map(r16).collect());
            exact.extend(attention_f64_row(q, &k, &v, l, &spec));
        }
        for fast in [false, true] {
            b.set_fast_mode(fast).unwrap();
            // Each sequence's earlier tokens into its own cache (one micro-batch each).
            let mut caches: Vec<_> = lens
                .iter()
                .map(|_| gpu.new_cache(KvType::F16, 512).unwrap())
                .collect();
            for (s, &l) in lens.iter().enumerate() {
                let toks = vec![0u32; l];
                let batch = Batch::single(&toks, 0);
                b.begin_batch(&batch).unwrap();
                let (q, k, v) = &seqs[s];
                let (q, k, v) = (
                    upload(l, qd, &q[..l * qd]),
                    upload(l, kd, &k[..l * kd]),
                    upload(l, kd, &v[..l * kd]),
                );
                let mut out = b.act(l, qd).unwrap();
                b.attention(&mut [&mut caches[s]], spec, &batch, &q, &k, &v, &mut out)
                    .unwrap();
            }
            let n = lens.len();
            let batch = Batch {
                tokens: vec![0; n],
                pos: lens.iter().map(|&l| l as u32).collect(),
                seq: (0..n).collect(),
            };
            let last = |i: usize, d: usize| -> Vec<f32> {
                lens.iter()
                    .enumerate()
                    .flat_map(|(s, &l)| {
                        let x = match i {
                            0 => &seqs[s].0,
                            1 => &seqs[s].1,
                            _ => &seqs[s].2,
                        };
                        x[l * d..(l + 1) * d].to_vec()
                    })
                    .collect()
            };
            let (q, k, v) = (
                upload(n, qd, &last(0, qd)),
                upload(n, kd, &last(1, kd)),
                upload(n, kd, &last(2, kd)),
            );
            let mut run = |tcd: u8| {
                b.set_attn_tcd(tcd);
                b.begin_batch(&batch).unwrap();
                let mut out = b.act(n, qd).unwrap();
                let mut refs: Vec<_> = caches.iter_mut().collect();
                b.attention(&mut refs, spec, &batch, &q, &k, &v, &mut out)
                    .unwrap();
                b.read(&out).unwrap()
            };
            let (with, staged, without) = (run(1), run(2), run(0));
            let err = max_rel_err(&with, &without);
            let (tc_ref, cc_ref) = (max_rel_err(&with, &exact), max_rel_err(&without, &exact));
            let bound = if fast { 2f32.powi(-9) } else { 2f32.powi(-14) };
            // attn_tcd2 stages the same tiles another way and reads the same fragments.
            let same = same_bits(&with, &staged);
            let what = format!(
                "decode batch of {n}, layer {layer} ({kind:?}), {}: tensor cores vs CUDA cores {err:.2e}, \
                 vs f64 {tc_ref:.2e} (CUDA cores vs f64 {cc_ref:.2e}; bound {bound:.1e}); attn_tcd2 {}",
                if fast {
                    "fast (hi)"
                } else {
                    "accurate (hi + lo)"
                },
                if same {
                    "the same bits"
                } else {
                    "DIFFERENT BITS"
                }
            );
            let finite = with.iter().all(|x| x.is_finite());
            if !(finite && same && err <= bound && tc_ref <= bound && cc_ref <= bound) {
                failures.push(what.clone());
            }
            rows.push(what);
        }
    }
    b.set_fast_mode(false).unwrap();
    b.set_attn_tcd(2);
    drop(gpu);
    std::fs::remove_dir_all(&dir).ok();
    report(
        "decode batch attention on the tensor cores",
        &rows,
        &failures,
    );
}

/// The bounds two GPU paths that differ only in their attention must meet on fixture `name` with
/// the f16 cache, as (accurate, fast): in the accurate mode, the f16 cache's own effect (the CPU
/// model's logits over `toks` with an f16 cache against an f32 cache: a last-bit difference in
/// one layer moves the next layer's K and V across f16 roundings now and then); in `--mode
/// fast`, the family's sensitivity x 2^-10.
fn f16_cache_bounds(file: &ModelFile, name: &str, toks: &[u32]) -> (f64, f64) {
    let cpu = MuseGlimmer::load(file, CpuBackend::new(NumericMode::Accurate, 0).unwrap()).unwrap();
    let feed = |kv| {
        Session::new(&cpu, kv, 256)
            .unwrap()
            .feed(toks, 512, Logits::All)
            .unwrap()
    };
    let own = max_dls(&feed(KvType::F16), &feed(KvType::F32), cpu.config.n_vocab);
    (own, sensitivity(name) * 2f64.powi(-10))
}

/// Decode attention on the tensor cores (attn_tcd2, the default with an f16 cache) end to end:
/// every fixture's 10 sequences decoded together (10 tokens a step, then fewer as sequences end),
/// and its first sequence decoded alone (one token a step), with attn_tcd2 and with the CUDA-core
/// kernel, within `f16_cache_bounds` (the prompt kernel's end-to-end bounds).
#[test]
fn decode_batches_on_tensor_core_attention_match_the_cuda_cores() {
    let Some(_) = gpu() else { return };
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    for name in names() {
        let file = ModelFile::open(model_path(&name)).unwrap();
        let toks = tokens(&name);
        let bounds = f16_cache_bounds(&file, &name, &toks);
        let seqs = sequences(&toks, 10, 5, 20, 2);
        let prompts: Vec<usize> = (0..10).map(|i| 3 + (i * 7) % 11).collect();
        for fast in [false, true] {
            let g = CudaBackend::new(0).unwrap();
            g.set_fast_mode(fast).unwrap();
            let m = MuseGlimmer::load(&file, g).unwrap();
            let n_vocab = m.config.n_vocab;
            let run = |tcd: u8| {
                m.backend.set_attn_tcd(tcd);
                let mut all = batched::together(&m, &seqs, &prompts, KvType::F16, 256).unwrap();
                all.push(batched::alone(&m, &seqs[0], prompts[0], KvType::F16, 256).unwrap());
                all
            };
            let (with, without) = (run(2), run(0));
            let mut worst = 0f64;
            let mut finite = true;
            for (a, b) in with.iter().zip(&without) {
                assert_eq!(a.len(), b.len());
                for (x, y) in a.iter().zip(b) {
                    worst = worst.max(max_dls(x, y, n_vocab));
                    finite &= x.iter().all(|v| v.is_finite());
                }
            }
            let bound = if fast { bounds.1 } else { bounds.0 };
            let what = format!(
                "{name:<14} {}: attn_tcd2 vs CUDA cores {worst:.2e} (bound {bound:.2e})",
                if fast { "fast    " } else { "accurate" }
            );
            if !(finite && worst <= bound) {
                failures.push(what.clone());
            }
            rows.push(what);
        }
    }
    report(
        "10 sequences decoded together and one alone, f16 cache: attn_tcd2 vs the CUDA-core kernel",
        &rows,
        &failures,
    );
}

/// Prompt attention on the tensor cores (attn_tc; f16 cache, one sequence, 16 or more tokens).
///
/// The kernel alone, against the CUDA-core kernels on the same inputs and the same f16 cache
/// contents (the 30B's shape, 16 query heads per KV head, head_dim 128, a sliding layer whose
/// window of 128 a 200-token micro-batch crosses, and a full layer), and both against an f64
/// reference: the accurate mode's split form (Q and P each as hi + lo f16) within 2^-14 of the
/// largest output, `--mode fast` (hi alone) within 2^-9; the CUDA-core kernels within the same
/// bound of the reference. The split form carries Q and P to 2^-22 of themselves; what remains is
/// each kernel's f32 arithmetic (sums, the softmax's exponentials). Measured on the H200
/// (2026-11-30): tensor cores 3.85e-6 from the f64 result, the CUDA-core kernels 6.0e-6, the two
/// 7.99e-6 apart. The first bound, 2e-6 between the two kernels, was set before the check ever
/// ran correctly and lay below the CUDA-core kernels' own distance to the exact result. 2^-14 is
/// 32x below the fast bound, where a lost or mis-scaled lo term lands (hi alone: 7.05e-4).
///
/// Then every fixture's 64-token prompt end to end with the f16 cache, tensor cores on and off.
/// Here a last-bit difference in one layer's output moves the next layer's K and V across an
/// f16 rounding boundary now and then (docs/PARITY.md, "f16 cache"), so the bound is the
/// accurate f16-cache rule: the two must agree better than the f16 cache's own effect (CPU f16
/// cache against CPU f32 cache); fast mode its usual tolerance.
#[test]
fn prompt_attention_on_tensor_cores_matches_the_cuda_cores() {
    let Some(_) = gpu() else { return };
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    let dir = std::env::temp_dir().join(format!("muser-attn-tc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = nrep16_file(&dir);
    let gpu = MuseGlimmer::load(&file, CudaBackend::new(0).unwrap()).unwrap();
    let n = 200usize;
    let toks = vec![0u32; n];
    let batch = Batch::single(&toks, 0);
    let (qd, kd) = (32 * 128, 2 * 128);
    let (qh, kh, vh) = (
        fill(n * qd, 1, 3.0),
        fill(n * kd, 2, 2.0),
        fill(n * kd, 3, 1.5),
    );
    for (layer, kind) in [
        (0usize, muser_engine::LayerKind::SlidingRope),
        (3, muser_engine::LayerKind::FullNope),
    ] {
        assert_eq!(
            gpu.config.layer_kinds[layer], kind,
            "the synthetic model's layer {layer}"
        );
        let spec = muser_engine::backend::AttnSpec {
            layer,
            kind,
            n_swa: 128,
            scale: 1.0 / (128f32).sqrt(),
            n_head: 32,
            n_head_kv: 2,
            head_dim: 128,
        };
        let exact = attention_f64(&qh, &kh, &vh, n, &spec);
        for fast in [false, true] {
            gpu.backend.set_fast_mode(fast).unwrap();
            let run = |tc: bool| {
                gpu.backend.set_attn_tc(tc);
                let mut cache = gpu.new_cache(KvType::F16, 512).unwrap();
                let b = &gpu.backend;
                // The batch's positions to the device (the model's forward does this first;
                // without it every token stored its K and V at position 0).
                b.begin_batch(&batch).unwrap();
                let (mut q, mut k, mut v) = (
                    b.act(n, qd).unwrap(),
                    b.act(n, kd).unwrap(),
                    b.act(n, kd).unwrap(),
                );
                b.stream.memcpy_htod(&qh, xg_data(&mut q)).unwrap();
                b.stream.memcpy_htod(&kh, xg_data(&mut k)).unwrap();
                b.stream.memcpy_htod(&vh, xg_data(&mut v)).unwrap();
                let mut out = b.act(n, qd).unwrap();
                b.attention(&mut [&mut cache], spec, &batch, &q, &k, &v, &mut out)
                    .unwrap();
                b.read(&out).unwrap()
            };
            let (with, without) = (run(true), run(false));
            let err = max_rel_err(&with, &without);
            let (tc_ref, cc_ref) = (max_rel_err(&with, &exact), max_rel_err(&without, &exact));
            let bound = if fast { 2f32.powi(-9) } else { 2f32.powi(-14) };
            let what = format!(
                "kernel, layer {layer} ({kind:?}), {}: tensor cores vs CUDA cores {err:.2e}, \
                 vs f64 {tc_ref:.2e} (CUDA cores vs f64 {cc_ref:.2e}; bound {bound:.1e})",
                if fast {
                    "fast (hi)"
                } else {
                    "accurate (hi + lo)"
                }
            );
            let finite = with.iter().all(|x| x.is_finite());
            if !(finite && err <= bound && tc_ref <= bound && cc_ref <= bound) {
                failures.push(what.clone());
            }
            rows.push(what);
        }
    }
    gpu.backend.set_fast_mode(false).unwrap();
    gpu.backend.set_attn_tc(true);
    drop(gpu);
    std::fs::remove_dir_all(&dir).ok();
    for name in names() {
        let file = ModelFile::open(model_path(&name)).expect("open");
        let toks = tokens(&name);
        let bounds = f16_cache_bounds(&file, &name, &toks);
        for fast in [false, true] {
            let g = CudaBackend::new(0).unwrap();
            g.set_fast_mode(fast).unwrap();
            let gpu = MuseGlimmer::load(&file, g).unwrap();
            let n_vocab = gpu.config.n_vocab;
            let run = |tc: bool| {
                gpu.backend.set_attn_tc(tc);
                Session::new(&gpu, KvType::F16, 256)
                    .unwrap()
                    .feed(&toks, 512, Logits::All)
                    .unwrap()
            };
            let (with, without) = (run(true), run(false));
            let d = max_dls(&with, &without, n_vocab);
            let bound = if fast { bounds.1 } else { bounds.0 };
            let what = if fast {
                "fast (hi)"
            } else {
                "accurate (hi + lo)"
            };
            rows.push(format!(
                "{name:<14} prompt, {what}: {d:.2e} (bound {bound:.1e}{})",
                if fast {
                    ""
                } else {
                    ", the f16 cache's own effect"
                }
            ));
            if !(d <= bound) {
                failures.push(format!("{name} {what}: {d:.2e} > {bound:.1e}"));
            }
        }
    }
    report(
        "tensor-core prompt attention vs the CUDA-core kernels, f16 cache",
        &rows,
        &failures,
    );
}

/// The fused FFN kernel (gate, up and SwiGLU of one token in one launch) must give the unfused
/// path's bits: each product is summed in the same order and the SwiGLU is the same expression.
/// On every fixture whose FFN is Q4_K and on the wide synthetic models, graph decode of a prompt.
#[test]
fn fused_ffn_gives_the_unfused_bits() {
    let Some(_) = gpu() else { return };
    let dir = std::env::temp_dir().join(format!("muser-fuse-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut paths: Vec<(String, PathBuf)> = names()
        .into_iter()
        .filter(|n| n.ends_with("q4_k_m"))
        .map(|n| {
            let p = model_path(&n);
            (n, p)
        })
        .collect();
    for preset in ["small", "mid"] {
        let path = dir.join(format!("{preset}.gguf"));
        let p = muser_engine::synth::preset(preset).unwrap();
        muser_engine::synth::write(&path, p, muser_engine::synth::Layout::Q4KM, 5).unwrap();
        paths.push((preset.to_string(), path));
    }
    for (name, path) in paths {
        let file = ModelFile::open(&path).unwrap();
        let run = |fused: bool| {
            let b = CudaBackend::new(0).unwrap();
            // The fused kernel is a form of the register kernels (mvq_q4_k): against them.
            b.set_mvq_stages(0);
            b.set_fused_ffn(fused);
            let m = MuseGlimmer::load(&file, b).unwrap();
            let toks: Vec<u32> = (0..24u32)
                .map(|i| (i * 7919 + 3) % m.config.n_vocab as u32)
                .collect();
            let mut s = Session::new(&m, KvType::F32, 64).unwrap();
            let mut dec = GraphDecoder::new(&m).unwrap();
            graph_steps(&mut dec, &mut s.kv, &toks).unwrap()
        };
        let (a, b) = (run(false), run(true));
        let same = same_bits(&a, &b);
        println!(
            "{name:<14} fused FFN vs unfused: {}",
            if same { "identical bits" } else { "DIFFERENT" }
        );
        assert!(same, "{name}: the fused FFN changed the logits");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[path = "../../engine/tests/common/batched.rs"]
mod batched;

/// Prefix reuse on the device: a cache that ran a prefix and 20 more tokens, taken back to the
/// prefix (`Session::truncate`), then fed other tokens (a prompt chunk, then three
/// one-token steps), gives the bits of a cache that ran the prefix alone and then the same:
/// the rows left past the prefix (in the planes and the rings) are never read.
#[test]
fn going_back_in_a_cache_gives_a_fresh_caches_bits() {
    let Some(_) = gpu() else { return };
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    for name in names() {
        let file = ModelFile::open(model_path(&name)).unwrap();
        let toks = tokens(&name);
        if toks.len() < 48 {
            failures.push(format!("{name}: only {} tokens", toks.len()));
            continue;
        }
        let (prefix, extra) = (&toks[..10], &toks[10..30]);
        let suffix: Vec<u32> = toks[30..48].iter().rev().copied().collect();
        let m = MuseGlimmer::load(&file, CudaBackend::new(0).unwrap()).unwrap();
        let run = |back: bool| -> Vec<f32> {
            let mut s = Session::new(&m, KvType::F16, 256).unwrap();
            s.feed(prefix, 512, Logits::Last).unwrap();
            if back {
                s.feed(extra, 512, Logits::Last).unwrap();
                assert!(s.truncate(prefix.len()));
            }
            let mut out = s.feed(&suffix[..15], 512, Logits::All).unwrap();
            for &t in &suffix[15..] {
                out.extend(s.feed(&[t], 1, Logits::Last).unwrap());
            }
            out
        };
        let (fresh, back) = (run(false), run(true));
        let same = fresh.len() == back.len()
            && fresh
                .iter()
                .zip(&back)
                .all(|(a, b)| a.to_bits() == b.to_bits());
        let what = format!(
            "{name:<14} back to 10 of 30 positions: {}",
            if same { "same bits" } else { "DIFFERENT" }
        );
        if !same {
            failures.push(what.clone());
        }
        rows.push(what);
    }
    report("going back in a device cache", &rows, &failures);
}

/// Decode steps recorded as CUDA graphs and replayed (`set_batch_graphs`) give the bits of the
/// same steps launched kernel by kernel: 5 sequences sharing micro-batches whose size shrinks as
/// they finish (each size recorded on its second step, replayed after), then each alone.
#[test]
fn recorded_steps_give_the_eager_bits() {
    let Some(_) = gpu() else { return };
    let mut rows = Vec::new();
    for name in names() {
        let file = ModelFile::open(model_path(&name)).unwrap();
        let toks = tokens(&name);
        let seqs = five_sequences(&toks, 5, 20, 4);
        let prompts = [3usize, 9, 1, 14, 6];
        let m = MuseGlimmer::load(&file, CudaBackend::new(0).unwrap()).unwrap();
        // A 12-token prompt with every row's logits (the prompt kernels inside a recording),
        // three times into fresh caches: eager, recorded, replayed.
        let score = |m: &MuseGlimmer<CudaBackend>| -> Vec<Vec<f32>> {
            let mut ws = m.workspace(16).unwrap();
            let rows: Vec<usize> = (0..12).collect();
            (0..3)
                .map(|_| {
                    let mut cache = m.new_cache(KvType::F32, 256).unwrap();
                    let b = Batch::single(&seqs[3][..12], 0);
                    m.forward(&mut ws, &b, &mut [&mut cache], &rows).unwrap()
                })
                .collect()
        };
        m.backend.set_batch_graphs(false);
        let eager = batched::together(&m, &seqs, &prompts, KvType::F32, 256).unwrap();
        let eager_alone = batched::alone(&m, &seqs[4], prompts[4], KvType::F16, 256).unwrap();
        let eager_score = score(&m);
        m.backend.set_batch_graphs(true);
        let before = m.backend.step_graph_replays();
        let graphs = batched::together(&m, &seqs, &prompts, KvType::F32, 256).unwrap();
        let graphs_alone = batched::alone(&m, &seqs[4], prompts[4], KvType::F16, 256).unwrap();
        let graphs_score = score(&m);
        let replays = m.backend.step_graph_replays() - before;
        m.backend.set_batch_graphs(false);
        let bits = |a: &Vec<Vec<f32>>, b: &Vec<Vec<f32>>| {
            a.len() == b.len()
                && a.iter().zip(b).all(|(x, y)| {
                    x.len() == y.len() && x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits())
                })
        };
        let same = eager.iter().zip(&graphs).all(|(a, b)| bits(a, b))
            && bits(&eager_alone, &graphs_alone)
            && bits(&eager_score, &graphs_score);
        rows.push(format!(
            "{name:<14} {replays} steps replayed: {}",
            if same { "identical bits" } else { "DIFFERENT" }
        ));
        assert!(replays > 0, "{name}: no step was replayed");
        assert!(same, "{name}: replayed steps changed the logits");
    }
    println!("recorded decode steps vs eager:\n{}", rows.join("\n"));
}

#[test]
fn batched_sequences_match_one_at_a_time() {
    let Some(_) = gpu() else { return };
    // Must show (issue 5): a batched result equals the single-sequence result within 1e-3 on
    // log-softmax, and is identical in the batch-invariant mode. `--mode fast` is held to its
    // own tolerance against the accurate mode (fast_mode_prompts_and_decode_stay_within_its_tolerance: the
    // family's sensitivity x 2^-10): its batched steps multiply with coarser activations (two
    // planes; TF32 for the formats without tensor-core kernels) than one token alone does.
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    for name in names() {
        let file = ModelFile::open(model_path(&name)).unwrap();
        let toks = tokens(&name);
        let seqs = five_sequences(&toks, 7, 24, 3);
        let prompts = [5usize, 12, 1, 20, 9];
        // The default, the batch-invariant mode and `--mode fast` (batched steps on the two-plane
        // kernels, one token alone on the accurate ones).
        for (label, invariant, fast) in [
            ("default        ", false, false),
            ("batch-invariant", true, false),
            ("fast           ", false, true),
        ] {
            let b = CudaBackend::new(0).unwrap();
            b.set_batch_invariant(invariant);
            b.set_fast_mode(fast).unwrap();
            let m = MuseGlimmer::load(&file, b).unwrap();
            let nv = m.config.n_vocab;
            let got = batched::together(&m, &seqs, &prompts, KvType::F32, 256).unwrap();
            let mut worst = 0f64;
            let mut identical = true;
            for (i, s) in seqs.iter().enumerate() {
                let want = batched::alone(&m, s, prompts[i], KvType::F32, 256).unwrap();
                assert_eq!(want.len(), got[i].len());
                for (w, g) in want.iter().zip(&got[i]) {
                    worst = worst.max(max_dls(g, w, nv));
                    identical &= w.iter().zip(g).all(|(a, b)| a.to_bits() == b.to_bits());
                }
            }
            rows.push(format!(
                "{name:<14} {label}: max |Δ log-softmax| {worst:.2e}, bits {}",
                if identical { "identical" } else { "differ" }
            ));
            let bound = if fast {
                sensitivity(&name) * 2f64.powi(-10)
            } else {
                1e-3
            };
            if !(worst <= bound) || (invariant && !identical) {
                failures.push(format!(
                    "{name} {}: {worst:.2e} identical {identical}",
                    label.trim()
                ));
            }
        }
    }
    report(
        "5 sequences batched vs each alone (teacher-forced decode logits)",
        &rows,
        &failures,
    );
}

/// Greedy selection on the device (chunks per row, the last block of a row merging them) picks
/// the largest value, the lowest index among ties, never a NaN, whatever the row's width.
/// The TMA-staged one-token kernels (`mvq_*_tma`, sm_90) against the register kernels, on every
/// product the x-stationary kernels take at the 30B's widths (the FFN's 19968-column down
/// product column-split, its gate and up, Q and the gate, K and V as pairs, O, an LM head of
/// 1,003 rows whose last step holds 3), Q4_K and Q6_K, three and two digit planes: Q6_K's staged
/// kernel does the register kernel's arithmetic (the same bits); Q4_K's adds the same exact
/// integer sums in another order (4 threads per block, not 8), within 2^-20 of the largest |y|.
/// Either gives the same bits at 2, 3, 4 and 8 stages and on a relaunch. (Against the CPU:
/// matvec_kernels_match_the_cpu_per_format, whose one-token products take the staged kernels.)
#[test]
fn staged_one_token_products_give_the_register_bits() {
    let Some(g) = gpu() else { return };
    g.set_mvq_stages(4);
    // Every launch on the staged forms while this test runs (by default only the largest).
    g.set_mvq_tma_min_bytes(0);
    if g.mvq_stages() == 0 {
        println!(
            "SKIPPED: the staged kernels need sm_90 or newer ({})",
            g.device_name()
        );
        return;
    }
    let dir = std::env::temp_dir().join(format!("muser-tma-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut rows = Vec::new();
    for layout in ["q4_k", "q6_k"] {
        let file = layer_file(&dir, layout, (19968, 4, 1003), 11);
        let l = &file.tensors.layers[0];
        let up = |m| g.matrix(&file.gguf, m).unwrap();
        let singles = [
            ("ffn_down", up(&l.ffn_down)),
            ("ffn_up", up(&l.ffn_up)),
            ("attn_output", up(&l.attn_output)),
            ("output", up(&file.tensors.output)),
        ];
        let pairs = [
            ("ffn_gate+up", up(&l.ffn_gate), up(&l.ffn_up)),
            ("attn_q+gate", up(&l.attn_q), up(&l.attn_gate)),
            ("attn_k+v", up(&l.attn_k), up(&l.attn_v)),
        ];
        // Activations of mixed sizes (runs of large and tiny values), as a normed stream has.
        let x_for = |cols: usize| -> Vec<f32> {
            (0..cols)
                .map(|i| {
                    let v = ((i * 7919 % 2003) as f32 / 1001.5 - 1.0) * 0.9;
                    if (i / 48) % 5 == 0 { v * 1e-3 } else { v }
                })
                .collect()
        };
        for planes in [3usize, 2] {
            g.set_mvq_planes(planes);
            let run =
                |stages: usize, w: &muser_cuda::CudaMatrix, w2: Option<&muser_cuda::CudaMatrix>| {
                    g.set_mvq_stages(stages);
                    let mut xg = g.act(1, w.cols).unwrap();
                    g.stream
                        .memcpy_htod(&x_for(w.cols), xg_data(&mut xg))
                        .unwrap();
                    let mut y = g.act(1, w.rows).unwrap();
                    let mut y2 = g.act(1, w.rows).unwrap();
                    match w2 {
                        Some(w2) => g.matmul_pair(w, w2, &xg, &mut y, &mut y2).unwrap(),
                        None => g.matmul(w, &xg, &mut y).unwrap(),
                    }
                    let mut v = g.read(&y).unwrap();
                    if w2.is_some() {
                        v.extend(g.read(&y2).unwrap());
                    }
                    v
                };
            let cases = singles
                .iter()
                .map(|(n, w)| (*n, w, None))
                .chain(pairs.iter().map(|(n, w, w2)| (*n, w, Some(w2))));
            for (name, w, w2) in cases {
                let register = run(0, w, w2);
                assert!(
                    register.iter().all(|v| v.is_finite()),
                    "{layout} {name}: not finite"
                );
                let staged = run(4, w, w2);
                let top = max_abs(&register).max(f32::MIN_POSITIVE);
                let worst = staged
                    .iter()
                    .zip(&register)
                    .map(|(a, b)| (a - b).abs() / top)
                    .fold(0.0f32, f32::max);
                let same = staged
                    .iter()
                    .zip(&register)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                let mut differ = Vec::new();
                if staged.len() != register.len() || !staged.iter().all(|v| v.is_finite()) {
                    differ.push("wrong length or not finite".to_string());
                }
                if layout == "q6_k" && !same {
                    differ.push(format!(
                        "not the register bits (largest difference {worst:.2e} of max |y|)"
                    ));
                }
                if worst > 2f32.powi(-20) {
                    differ.push(format!("{worst:.2e} of max |y| from the register kernel"));
                }
                for stages in [2usize, 3, 8, 4] {
                    let got = run(stages, w, w2);
                    let bad = got
                        .iter()
                        .zip(&staged)
                        .filter(|(a, b)| a.to_bits() != b.to_bits())
                        .count();
                    if got.len() != staged.len() || bad > 0 {
                        differ.push(format!("{stages} stages: {bad} rows differ from 4 stages"));
                    }
                }
                rows.push(format!(
                    "{layout:<5} {name:<12} {}x{} planes {planes}: vs register {}, stages and relaunch {}",
                    w.rows,
                    w.cols,
                    if same { "same bits".to_string() } else { format!("{worst:.2e} of max |y|") },
                    if differ.is_empty() { "same bits" } else { "DIFFER" }
                ));
                assert!(
                    differ.is_empty(),
                    "{layout} {name} planes {planes}: {differ:?}"
                );
            }
        }
        g.set_mvq_planes(3);
    }
    g.set_mvq_stages(4);
    println!("{}", rows.join("\n"));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn device_argmax_picks_the_first_largest() {
    let Some(g) = gpu() else { return };
    let mut report = Vec::new();
    for cols in [7usize, 4096, 4097, 202_048] {
        let rows = 3;
        let mut x: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7919 % 10007) as f32 / 10007.0) - 0.5)
            .collect();
        for r in 0..rows {
            let row = &mut x[r * cols..(r + 1) * cols];
            // A tie for the largest value late in the row and once earlier (row r: earlier is
            // further back), and NaNs that must not win.
            let (late, early) = (cols - 1, (cols / (r + 2)).min(cols - 2));
            row[late] = 3.0;
            row[early] = 3.0;
            row[cols / 3] = f32::NAN;
            row[0] = f32::NAN;
        }
        let mut xg = g.act(rows, cols).unwrap();
        g.stream.memcpy_htod(&x, xg_data(&mut xg)).unwrap();
        let mut out = g.stream.alloc_zeros::<u32>(rows).unwrap();
        for _ in 0..2 {
            g.argmax(&xg, &mut out).unwrap();
            let got = g.stream.clone_dtoh(&out).unwrap();
            for r in 0..rows {
                let row = &x[r * cols..(r + 1) * cols];
                let mut want = 0usize;
                let mut best = f32::NEG_INFINITY;
                for (i, &v) in row.iter().enumerate() {
                    if v > best {
                        best = v;
                        want = i;
                    }
                }
                assert_eq!(got[r] as usize, want, "cols {cols} row {r}");
                assert_eq!(want, row.iter().position(|&v| v == 3.0).unwrap());
            }
        }
        report.push(format!("{cols}: ok"));
    }
    println!("device argmax: {}", report.join(", "));
}

/// Top-k and top-p on the device (`draw_cut`): each row's cut is `RowDraw::cut`'s, key and id,
/// and the draw over it `RowDraw::choose`'s, on rows of the 30B's vocabulary: spread values,
/// few levels (ties at every boundary), a softcap's plateau (thousands tied at the largest), a
/// sharp row, with edits and a grammar's mask on some.
#[test]
fn device_top_k_and_top_p_cut_as_the_host_reference() {
    use muser_engine::sampling::{Cut, LogitEdit, RowDraw};
    let Some(g) = gpu() else { return };
    let cols = 202_048usize;
    let hash = |i: u64| (i.wrapping_mul(2_654_435_761) % 1_000_003) as f32 / 1_000_003.0;
    let mut x: Vec<f32> = Vec::new();
    // 0: spread; 1: 40 levels; 2: a plateau at 5.0 (about a fifth of the row); 3: sharp (one
    // token far above, a few near it); 4: spread with a stretch far below (weights 0 in top-p's
    // fixed point). (A -inf before the edits is no row to draw from, NOT_FINITE: the masks and
    // edits write theirs.)
    x.extend((0..cols as u64).map(|i| hash(i) * 8.0 - 4.0));
    x.extend((0..cols as u64).map(|i| (hash(i + 7) * 40.0).floor() / 4.0 - 5.0));
    x.extend((0..cols as u64).map(|i| (hash(i + 13) * 25.0 - 15.0).min(5.0)));
    x.extend((0..cols as u64).map(|i| {
        hash(i + 29) * 2.0
            - (if i == 777 {
                -20.0
            } else if i % 50_000 == 3 {
                -17.0
            } else {
                10.0
            })
    }));
    x.extend((0..cols as u64).map(|i| {
        if (50_000..120_000).contains(&i) {
            -80.0 - hash(i + 3)
        } else {
            hash(i + 41) * 6.0 - 3.0
        }
    }));
    let rows = x.len() / cols;
    let mut xg = g.act(rows, cols).unwrap();
    g.stream.memcpy_htod(&x, xg_data(&mut xg)).unwrap();
    let words = cols.div_ceil(64);
    let mask: Vec<u64> = (0..words as u64)
        .map(|w| w.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 0x0101_0101_0101_0101)
        .collect();
    let mut draws = Vec::new();
    let mut drawn_rows = Vec::new();
    let settings = [
        (1usize, 1.0f64),
        (2, 1.0),
        (40, 1.0),
        (1000, 1.0),
        (cols - 1, 1.0),
        (0, 0.0),
        (0, 0.5),
        (0, 0.9),
        (0, 0.95),
        (0, 0.999),
        (40, 0.9),
        (5000, 0.5),
        (64, 0.2),
    ];
    for r in 0..rows {
        for (i, &(top_k, top_p)) in settings.iter().enumerate() {
            let c = (r * settings.len() + i) as u64;
            draws.push(RowDraw {
                inv_temperature: [1.0, 1.0 / 0.7, 0.5, 1.0 / 1.3][i % 4],
                min_p: if i % 5 == 4 { 0.05 } else { 0.0 },
                seed: 9 + r as u64,
                counter: c,
                edits: if i % 3 == 1 {
                    vec![
                        LogitEdit::Add {
                            token: 5,
                            bias: 30.0,
                        },
                        LogitEdit::Mask { token: 777 },
                        LogitEdit::Penalize {
                            token: 9,
                            repeat: 1.3,
                            sub: 0.5,
                        },
                    ]
                } else {
                    Vec::new()
                },
                allowed: (i % 4 == 2).then(|| mask.clone().into()),
                top_k,
                top_p,
            });
            drawn_rows.push(r);
        }
    }
    // A greedy draw with a cut asked for cuts nothing.
    draws.push(RowDraw {
        top_k: 3,
        top_p: 0.5,
        ..Default::default()
    });
    drawn_rows.push(1);
    let (ids, cuts) = g.draw_cuts(&xg, &drawn_rows, &draws).unwrap();
    let mut sizes = Vec::new();
    for (k, (d, &r)) in draws.iter().zip(&drawn_rows).enumerate() {
        let mut row = x[r * cols..(r + 1) * cols].to_vec();
        d.edit(&mut row);
        let want = d.cut(&row);
        assert_eq!(
            cuts[k], want,
            "draw {k} (row {r}, top_k {}, top_p {}): device cut vs RowDraw::cut",
            d.top_k, d.top_p
        );
        assert_eq!(
            ids[k],
            d.choose(&row),
            "draw {k} (row {r}): device token vs RowDraw::choose"
        );
        let kept = (0..cols)
            .filter(|&i| {
                !row[i].is_nan() && want.holds(muser_engine::sampling::order_key(row[i]), i as u32)
            })
            .count();
        if d.top_k > 0 && d.top_p >= 1.0 {
            assert_eq!(kept, d.top_k.min(cols), "draw {k}: top-k keeps k");
        }
        sizes.push(kept);
    }
    assert_eq!(cuts[draws.len() - 1], Cut::ALL);
    println!(
        "device top-k / top-p cuts: {} draws, the host's cut and token each; candidates kept {:?}",
        draws.len(),
        sizes
    );
}

/// Draws on the device (`draw_rows`: edits, a grammar's mask, argmax, Gumbel-max) choose what
/// the host reference `RowDraw::choose` chooses on the rows `RowDraw::edit` edits, and leave the
/// logits as they were (a row can be drawn again); over many draws a row's tokens follow its
/// softmax.
#[test]
fn device_draws_match_the_host_reference() {
    use muser_engine::sampling::{LogitEdit, RowDraw};
    let Some(g) = gpu() else { return };
    let (rows, cols) = (6usize, 202_048usize);
    let x: Vec<f32> = (0..rows * cols)
        .map(|i| ((i as u64 * 2_654_435_761 % 1_000_003) as f32 / 1_000_003.0) * 8.0 - 4.0)
        .collect();
    let edits = vec![
        LogitEdit::Add {
            token: 5,
            bias: 2.5,
        },
        LogitEdit::Mask { token: 17 },
        LogitEdit::Penalize {
            token: 5,
            repeat: 1.3,
            sub: 0.75,
        },
        LogitEdit::Penalize {
            token: 99,
            repeat: 1.1,
            sub: 0.5,
        },
        LogitEdit::Add {
            token: cols as u32 + 3,
            bias: 1.0,
        }, // outside the row: ignored
    ];
    let draw = |t: f64, min_p: f64, seed: u64, counter: u64| RowDraw {
        inv_temperature: if t > 0.0 { 1.0 / t } else { 0.0 },
        min_p,
        seed,
        counter,
        edits: edits.clone(),
        allowed: None,
        top_k: 0,
        top_p: 1.0,
    };
    let draws = vec![
        draw(0.0, 0.0, 1, 0),
        draw(0.8, 0.0, 2, 0),
        draw(1.0, 0.05, 3, 7),
        draw(1.5, 0.0, 4, 1 << 20),
        draw(0.3, 0.5, 5, 2),
    ];
    let pick = [0usize, 2, 3, 4, 5];
    let mut want_rows = x.clone();
    let mut want = Vec::new();
    for (&r, d) in pick.iter().zip(&draws) {
        let row = &mut want_rows[r * cols..(r + 1) * cols];
        d.edit(row);
        want.push(d.choose(row));
    }
    let mut xg = g.act(rows, cols).unwrap();
    g.stream.memcpy_htod(&x, xg_data(&mut xg)).unwrap();
    let got = g.draw(&xg, &pick, &draws).unwrap();
    assert_eq!(got, want, "device draws vs RowDraw::choose");
    let after = g.stream.clone_dtoh(xg_data(&mut xg)).unwrap();
    let differ = after
        .iter()
        .zip(&x)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    assert_eq!(differ, 0, "a draw changed the logits");
    // Selected rows to the host (runs of consecutive rows in one copy each).
    let pick_rows = [1usize, 2, 3, 5, 0];
    let mut host = Vec::new();
    g.read_rows_into(&xg, cols, &pick_rows, &mut host).unwrap();
    for (i, &r) in pick_rows.iter().enumerate() {
        assert_eq!(
            host[i * cols..(i + 1) * cols],
            x[r * cols..(r + 1) * cols],
            "row {r}"
        );
    }
    // Under grammar masks (`RowDraw::allowed`): a third of the tokens, one token, a mask
    // shorter than the row (the ids past it not allowed), with the edits, greedy and drawn;
    // one row drawn three times in one call, one draw without a mask among them.
    let words = cols.div_ceil(64);
    let third: Vec<u64> = (0..words as u64)
        .map(|w| {
            (w.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5555_5555_5555_5555) & 0x9249_2492_4924_9249
        })
        .collect();
    let mut one = vec![0u64; words];
    one[150_001 / 64] |= 1 << (150_001 % 64);
    let short: Vec<u64> = vec![u64::MAX; 1000];
    let masked = |d: &RowDraw, m: &[u64]| RowDraw {
        allowed: Some(m.into()),
        ..d.clone()
    };
    let mdraws = vec![
        masked(&draws[0], &third),
        masked(&draws[1], &third),
        masked(&draws[2], &one),
        masked(&draws[3], &short),
        draws[4].clone(),
        masked(&draws[4], &third),
    ];
    let mrows = [1usize, 1, 4, 5, 1, 3];
    let mut mwant = Vec::new();
    for (&r, d) in mrows.iter().zip(&mdraws) {
        let mut row = x[r * cols..(r + 1) * cols].to_vec();
        d.edit(&mut row);
        let id = d.choose(&row);
        assert!(
            d.allowed
                .as_ref()
                .is_none_or(|m| m[id as usize / 64] >> (id % 64) & 1 == 1),
            "the reference chose a token its mask refuses"
        );
        mwant.push(id);
    }
    assert_eq!(mwant[2], 150_001, "the one token a mask allows");
    assert!(mwant[3] < 64_000, "a short mask allows its own ids only");
    let mgot = g.draw(&xg, &mrows, &mdraws).unwrap();
    assert_eq!(mgot, mwant, "masked device draws vs RowDraw::choose");
    // Edge rows: NaNs and a tie for the largest, all -inf, a +inf with min-p, min-p 1 over a
    // tie, 600 penalties on distinct tokens after biases on some of them (the kernel's parallel
    // part), all NaN.
    let ec = 5000usize;
    let mut e: Vec<f32> = (0..6 * ec)
        .map(|i| ((i as u64 * 2_654_435_761 % 1_000_003) as f32 / 1_000_003.0) * 6.0 - 3.0)
        .collect();
    e[7] = f32::NAN;
    e[100] = 9.0;
    e[4000] = 9.0;
    e[ec..2 * ec].fill(f32::NEG_INFINITY);
    e[2 * ec + 321] = f32::INFINITY;
    e[3 * ec + 10] = 7.5;
    e[3 * ec + 20] = 7.5;
    e[5 * ec..].fill(f32::NAN);
    let mut long = vec![
        LogitEdit::Add {
            token: 3,
            bias: 1.25,
        },
        LogitEdit::Add {
            token: 3,
            bias: -0.5,
        },
        LogitEdit::Mask { token: 11 },
    ];
    long.extend((0..600u32).map(|t| LogitEdit::Penalize {
        token: t * 7,
        repeat: 1.2,
        sub: 0.01 * (t % 13) as f32,
    }));
    let edge = |t: f64, min_p: f64, edits: Vec<LogitEdit>| RowDraw {
        inv_temperature: if t > 0.0 { 1.0 / t } else { 0.0 },
        min_p,
        seed: 77,
        counter: 3,
        edits,
        allowed: None,
        top_k: 0,
        top_p: 1.0,
    };
    let edge_draws = vec![
        edge(0.0, 0.0, Vec::new()),
        edge(0.9, 0.0, Vec::new()),
        edge(1.0, 0.5, Vec::new()),
        edge(0.8, 1.0, Vec::new()),
        edge(1.1, 0.01, long),
        edge(0.7, 0.0, Vec::new()),
    ];
    let edge_rows: Vec<usize> = (0..6).collect();
    let mut want_e = e.clone();
    let mut want_ids = Vec::new();
    for (r, d) in edge_draws.iter().enumerate() {
        let row = &mut want_e[r * ec..(r + 1) * ec];
        d.edit(row);
        want_ids.push(d.choose(row));
    }
    let mut eg = g.act(6, ec).unwrap();
    g.stream.memcpy_htod(&e, xg_data(&mut eg)).unwrap();
    let got_e = g.draw(&eg, &edge_rows, &edge_draws).unwrap();
    // A row holding a NaN or an infinity before its edits has no token (NOT_FINITE, the
    // host's `Backend::draw_rows`); a -inf its edits write (row 4's mask) is no such value.
    let want_dev: Vec<u32> = (0..6)
        .map(
            |r| match e[r * ec..(r + 1) * ec].iter().all(|v| v.is_finite()) {
                true => want_ids[r],
                false => muser_engine::sampling::NOT_FINITE,
            },
        )
        .collect();
    assert_eq!(
        want_dev
            .iter()
            .map(|&i| i == muser_engine::sampling::NOT_FINITE)
            .collect::<Vec<_>>(),
        [true, true, true, false, false, true]
    );
    assert_eq!(got_e, want_dev, "edge rows: device vs RowDraw::choose");
    assert_eq!(
        want_ids[0], 100,
        "a NaN never wins; ties go to the lower id"
    );
    assert_eq!(
        want_ids[2], 321,
        "+inf leaves no candidate under min-p: the greedy token"
    );
    assert!(
        [10, 20].contains(&want_ids[3]),
        "min-p 1 keeps the tied largest only"
    );
    let after_e = g.stream.clone_dtoh(xg_data(&mut eg)).unwrap();
    let bits_differ = after_e
        .iter()
        .zip(&e)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    assert_eq!(bits_differ, 0, "a draw changed the edge rows");
    // Row 3 drawn twice in one call: each draw as alone.
    let twice = g.draw(&eg, &[3, 3], &edge_draws[3..5]).unwrap();
    let mut row3 = e[3 * ec..4 * ec].to_vec();
    edge_draws[4].edit(&mut row3);
    assert_eq!(
        twice,
        [want_ids[3], edge_draws[4].choose(&row3)],
        "one row drawn twice"
    );
    // Many draws of one small row (counters 0..n): frequencies follow softmax(v / t).
    let small = [1.0f32, 3.0, -2.0, 2.5, 0.0, 2.9];
    let n = 4000usize;
    let mut xs = g.act(n, small.len()).unwrap();
    let tile: Vec<f32> = (0..n).flat_map(|_| small).collect();
    g.stream.memcpy_htod(&tile, xg_data(&mut xs)).unwrap();
    let t = 0.7;
    let many: Vec<RowDraw> = (0..n as u64)
        .map(|c| RowDraw {
            inv_temperature: 1.0 / t,
            min_p: 0.0,
            seed: 42,
            counter: c,
            edits: Vec::new(),
            allowed: None,
            top_k: 0,
            top_p: 1.0,
        })
        .collect();
    let rows_all: Vec<usize> = (0..n).collect();
    let ids = g.draw(&xs, &rows_all, &many).unwrap();
    let host: Vec<u32> = many.iter().map(|d| d.choose(&small)).collect();
    assert_eq!(ids, host, "a small row's draws vs the host reference");
    let w: Vec<f64> = small.iter().map(|&v| (v as f64 / t).exp()).collect();
    let sum: f64 = w.iter().sum();
    let mut counts = vec![0usize; small.len()];
    for &i in &ids {
        counts[i as usize] += 1;
    }
    for i in 0..small.len() {
        let (got, p) = (counts[i] as f64 / n as f64, w[i] / sum);
        // 5 standard deviations of a binomial share.
        let sd = (p * (1.0 - p) / n as f64).sqrt();
        assert!((got - p).abs() < 5.0 * sd + 1e-9, "token {i}: {got} vs {p}");
    }
    println!(
        "device draws: {want:?} as the host reference; {n} draws of a 6-token row follow its softmax"
    );
}

fn read_f32(p: &std::path::Path) -> Option<Vec<f32>> {
    let b = std::fs::read(p).ok()?;
    Some(
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    )
}

/// Raw little-endian 32-bit ids (int32 token files read as u32).
fn read_ids(p: &std::path::Path) -> Option<Vec<u32>> {
    Some(read_f32(p)?.into_iter().map(|v| v.to_bits()).collect())
}

/// The CUDA anchor: llama.cpp b11434's CUDA build on an H200, one token per llama_decode
/// (flash attention auto, f16 cache; committed in tests/fixtures/golden/<fixture>/llama-cuda-*,
/// or fresh from scripts/h200-llama-parity.sh in MUSER_LLAMA_CUDA/<fixture>/). A report, not a bound: Muser has no CUDA parity mode yet. For each
/// fixture it prints max |Δ log-softmax| over the 64 positions of
///   Muser CUDA accurate (graph decode, f16 cache) vs llama.cpp CUDA,
///   llama.cpp CPU (Muser's CPU parity mode, bit-exact to it, one token per call) vs llama.cpp CUDA:
///     llama.cpp's own two builds, the scale the issue quotes,
///   llama.cpp CUDA vs llama.cpp CPU with the whole prompt in one call (the committed CPU goldens),
/// and whether the 32 greedy tokens agree. It fails on missing or malformed anchor data.
#[test]
fn llama_cuda_anchor_report() {
    let Some(_) = gpu() else { return };
    // The committed anchor (tests/fixtures/MANIFEST.md), or a fresh one.
    let dir = std::env::var_os("MUSER_LLAMA_CUDA")
        .map(PathBuf::from)
        .unwrap_or_else(|| fixtures().join("golden"));
    let mut rows = Vec::new();
    for name in names() {
        let d = dir.join(&name);
        let anchor = read_f32(&d.join("llama-cuda-ub1-kv_f16.f32"))
            .unwrap_or_else(|| panic!("{name}: no llama.cpp CUDA logits in {}", d.display()));
        let anchor_greedy = read_ids(&d.join("llama-cuda-greedy-kv_f16.i32")).expect("greedy ids");
        let file = ModelFile::open(model_path(&name)).unwrap();
        let gpu_model = MuseGlimmer::load(&file, CudaBackend::new(0).unwrap()).unwrap();
        let n_vocab = gpu_model.config.n_vocab;
        let toks = tokens(&name);
        assert_eq!(anchor.len(), toks.len() * n_vocab, "{name}: anchor shape");
        assert!(
            anchor.iter().all(|v| v.is_finite()),
            "{name}: anchor not finite"
        );
        assert_eq!(anchor_greedy.len(), 32, "{name}: anchor greedy ids");
        // Muser CUDA accurate, one token per graph replay.
        let mut s = Session::new(&gpu_model, KvType::F16, 256).unwrap();
        let mut dec = GraphDecoder::new(&gpu_model).unwrap();
        let muser = graph_steps(&mut dec, &mut s.kv, &toks).unwrap();
        let mut muser_greedy = Vec::new();
        let mut next = argmax(&muser[muser.len() - n_vocab..]) as u32;
        for _ in 0..32 {
            muser_greedy.push(next);
            next = dec.step(&mut s.kv, next, None).unwrap();
        }
        // llama.cpp CPU, one token per call (its n_ubatch 1 sizes the sliding ring).
        let mut cpu = CpuBackend::new(NumericMode::Parity, 0).unwrap();
        cpu.parity_ubatch = 1;
        let cpu_model = MuseGlimmer::load(&file, cpu).unwrap();
        let mut cs = Session::new(&cpu_model, KvType::F16, 256).unwrap();
        let cpu_logits = cs.feed(&toks, 1, Logits::All).unwrap();
        let mut cpu_greedy = Vec::new();
        let mut next = argmax(&cpu_logits[cpu_logits.len() - n_vocab..]) as u32;
        for _ in 0..32 {
            cpu_greedy.push(next);
            next = argmax(&cs.feed(&[next], 1, Logits::Last).unwrap()) as u32;
        }
        // Muser CUDA cuda-parity (kernels/parity.cu products), the same way.
        let par_backend = CudaBackend::new(0).unwrap();
        par_backend.set_cuda_parity(true);
        let par_model = MuseGlimmer::load(&file, par_backend).unwrap();
        let mut ps = Session::new(&par_model, KvType::F16, 256).unwrap();
        let mut pdec = GraphDecoder::new(&par_model).unwrap();
        let parity = graph_steps(&mut pdec, &mut ps.kv, &toks).unwrap();
        let d_parity = max_dls(&parity, &anchor, n_vocab);
        let d_muser = max_dls(&muser, &anchor, n_vocab);
        let d_cpu = max_dls(&cpu_logits, &anchor, n_vocab);
        let prompt = match (
            read_f32(&d.join("llama-cuda-ub512-kv_f16.f32")),
            read_f32(
                &fixtures()
                    .join("golden")
                    .join(&name)
                    .join("llama-kv_f16.f32"),
            ),
        ) {
            (Some(a), Some(b)) => format!("{:.2e}", max_dls(&a, &b, n_vocab)),
            _ => "-".into(),
        };
        let same = |g: &[u32]| {
            g.iter()
                .zip(&anchor_greedy)
                .take_while(|(a, b)| a == b)
                .count()
        };
        rows.push(format!(
            "{name:<14} muser {d_muser:.2e} (greedy {}/32)  cuda-parity {d_parity:.2e}  llama CPU {d_cpu:.2e} (greedy {}/32)  prompt CUDA vs CPU {prompt}",
            same(&muser_greedy),
            same(&cpu_greedy)
        ));
        assert!(
            d_muser.is_finite() && d_cpu.is_finite() && d_parity.is_finite(),
            "{name}: a comparison failed"
        );
        // The issue's bound where no product rounds its input (f32, bf16 weights: both modes
        // compute the accurate products there); elsewhere the residual is the fixtures'
        // sensitivity (docs/PARITY.md), reported.
        let rounds = file
            .gguf
            .tensors()
            .iter()
            .any(|t| t.dims.len() == 2 && muser_engine::cpu::cuda_anchor::models(t.ggml_type));
        if tame_sensitivity(&name) && !rounds {
            assert!(
                d_parity <= 1e-3 && d_muser <= 1e-3,
                "{name}: {d_parity:.2e} / {d_muser:.2e} above 1e-3"
            );
        }
    }
    println!(
        "vs llama.cpp b11434 CUDA (one token per decode, f16 cache), max |Δ log-softmax| over 64 positions:\n{}",
        rows.join("\n")
    );
}

/// `--mode cuda-parity` on the GPU (kernels/parity.cu) computes the products of the CPU model
/// (cpu/cuda_anchor.rs) bit for bit: every rounding product matrix of the fixtures (and the LM
/// head) times activations of 1 and 3 tokens.
#[test]
fn cuda_parity_products_match_the_cpu_model() {
    let Some(g) = gpu() else { return };
    g.set_cuda_parity(true);
    let cpu = CpuBackend::new(NumericMode::CudaParity, 0).unwrap();
    let mut report = Vec::new();
    for name in names() {
        let file = ModelFile::open(model_path(&name)).unwrap();
        let t = &file.tensors;
        let l0 = &t.layers[0];
        let mut checked = 0;
        for m in [&l0.attn_q, &l0.attn_v, &l0.ffn_down, &l0.ffn_up, &t.output] {
            if !muser_engine::cpu::cuda_anchor::models(m.ty) {
                continue;
            }
            let wc = cpu.matrix(&file.gguf, m).unwrap();
            let wg = g.matrix(&file.gguf, m).unwrap();
            for n in [1usize, 3] {
                let x: Vec<f32> = (0..n * m.cols)
                    .map(|i| ((i * 7919 % 10007) as f32 / 10007.0 - 0.5) * 3.0)
                    .collect();
                let mut xc = cpu.act(n, m.cols).unwrap();
                cpu.write(&mut xc, &x).unwrap();
                let mut yc = cpu.act(n, m.rows).unwrap();
                cpu.matmul(&wc, &xc, &mut yc).unwrap();
                let want = cpu.read(&yc).unwrap();
                let mut xg = g.act(n, m.cols).unwrap();
                g.write(&mut xg, &x).unwrap();
                let mut yg = g.act(n, m.rows).unwrap();
                g.matmul(&wg, &xg, &mut yg).unwrap();
                let got = g.read(&yg).unwrap();
                let differ = got
                    .iter()
                    .zip(&want)
                    .filter(|(a, b)| a.to_bits() != b.to_bits())
                    .count();
                assert_eq!(
                    differ, 0,
                    "{name} {} ({}) n={n}: {differ} values differ",
                    m.name, m.ty
                );
                checked += 1;
            }
        }
        report.push(format!("{name}: {checked} products identical"));
    }
    g.set_cuda_parity(false);
    println!(
        "cuda-parity products, GPU vs the CPU model:\n{}",
        report.join("\n")
    );
}

/// e4m3 of v (finite, |v| < 448: the scales keep it below 2^8): the nearest value with 3 bits
/// after the leading one (ties to even), spacing 2^-9 below the smallest normal 2^-6.
fn e4m3(v: f64) -> f64 {
    if v == 0.0 {
        return 0.0;
    }
    let a = v.abs();
    let e = (((a.to_bits() >> 52) & 0x7ff) as i32 - 1023).max(-6);
    let q = 2f64.powi(e - 3);
    ((a / q).round_ties_even() * q).copysign(v)
}

/// The power-of-two exponent S that puts a largest value m into [2^7, 2^8) (kernels/common.cuh
/// pow2_shift(m, 8, lim)): 0 for 0.
fn pow2_shift8(m: f64, lim: i32) -> i32 {
    if m == 0.0 {
        return 0;
    }
    let e = ((m.to_bits() >> 52) & 0x7ff) as i32 - 1023 + 1; // m < 2^e, m >= 2^(e-1)
    (8 - e).clamp(-lim, lim)
}

/// A row as the FP8 path puts it in e4m3 (a weight row: lim 60; a token: lim 120): each value
/// times 2^S (pow2_shift8 of the row's largest |value|), rounded to e4m3; and 2^-S.
fn e4m3_row(v: &[f32], lim: i32) -> (Vec<f64>, f64) {
    let m = v.iter().fold(0f64, |a, x| a.max((*x as f64).abs()));
    let s = pow2_shift8(m, lim);
    let up = 2f64.powi(s);
    (
        v.iter().map(|x| e4m3(*x as f64 * up)).collect(),
        2f64.powi(-s),
    )
}

/// The FP8 products' test activations: n tokens of `cols`, token t of magnitude 2^(t % 7 - 3).
fn fp8_test_input(n: usize, cols: usize) -> Vec<f32> {
    (0..n * cols)
        .map(|i| {
            let t = i / cols;
            ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 2f32.powi((t % 7) as i32 - 3) + 1e-3
        })
        .collect()
}

/// A backend in `--mode fast --fp8-weights` with FP8 products from 9 tokens, or None (printed)
/// where this device has no FP8 tensor cores.
fn fp8_backend() -> Option<CudaBackend> {
    let g = CudaBackend::new(0).unwrap();
    g.set_fast_mode(true).unwrap();
    if let Err(e) = g.set_fp8_weights(true) {
        println!("SKIPPED (no FP8 here): {e}");
        return None;
    }
    g.set_gemm8_min_tokens(8);
    Some(g)
}

/// `--fp8-weights` (fp8.rs, kernels/dequant.cu "Products of many tokens on the FP8 tensor
/// cores"): every checked output against the same product of the e4m3 operands the kernels
/// must make (each weight row and token scaled by its power of two, rounded to nearest even
/// e4m3, summed in f64), within 2^-9 of their sum of |w8||x8|: the tensor cores' f32 sums may
/// add at most 1/32 of the 2^-4 error e4m3 itself allows. And against the exact weights and
/// activations within e4m3's own bound (each operand to 2^-4 of itself, subnormals to 2^-10
/// absolute, before the scales are undone) plus that 2^-9. Both ways of applying the scales
/// (cuBLASLt's outer vectors, y_scale_outer), four formats, 9 to 200 tokens of activations whose
/// tokens differ in magnitude by up to 2^6; the same bits on relaunch.
#[test]
fn fp8_products_match_their_e4m3_operands() {
    let Some(_) = gpu() else { return };
    let Some(g) = fp8_backend() else { return };
    let dir = std::env::temp_dir().join(format!("muser-fp8-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut rows_out = Vec::new();
    let mut failures = Vec::new();
    for layout in ["q4_k", "q6_k", "q8_0", "f16"] {
        let file = one_layer_file(&dir, layout, 2048, 17);
        let cpu = CpuBackend::new(NumericMode::Accurate, 0).unwrap();
        for mat in [
            &file.tensors.layers[0].ffn_down,
            &file.tensors.layers[0].ffn_up,
        ] {
            let (rows, cols) = (mat.rows, mat.cols);
            let wg = g.matrix(&file.gguf, mat).unwrap();
            let wh = exact_weights(&cpu, &file, mat);
            // Each row's e4m3 weights and factor 2^-S_r.
            let check_rows: Vec<usize> = (0..rows).step_by(13).collect();
            let w8: Vec<(Vec<f64>, f64, Vec<f64>)> = check_rows
                .iter()
                .map(|&r| {
                    let wr = &wh[r * cols..(r + 1) * cols];
                    let (q, down) = e4m3_row(wr, 60);
                    let exact: Vec<f64> = wr.iter().map(|v| *v as f64 / down).collect();
                    (q, down, exact)
                })
                .collect();
            for outer in [true, false] {
                g.set_fp8_outer_scales(outer);
                let (mut worst8, mut worst_exact, mut rep_ok) = (0f64, 0f64, true);
                let before = g.fp8_products();
                for n in [9usize, 64, 200] {
                    let x = fp8_test_input(n, cols);
                    let mut xg = g.act(n, cols).unwrap();
                    g.write(&mut xg, &x).unwrap();
                    let mut yg = g.act(n, rows).unwrap();
                    g.matmul(&wg, &xg, &mut yg).unwrap();
                    let got = g.read(&yg).unwrap();
                    g.matmul(&wg, &xg, &mut yg).unwrap();
                    rep_ok &= same_bits(&g.read(&yg).unwrap(), &got);
                    if !got.iter().all(|v| v.is_finite()) {
                        failures.push(format!("{layout} {rows}x{cols} n={n}: not finite"));
                        continue;
                    }
                    for t in 0..n {
                        let xt = &x[t * cols..(t + 1) * cols];
                        let (xq, xd) = e4m3_row(xt, 120);
                        let up = 1.0 / xd;
                        for (i, &r) in check_rows.iter().enumerate() {
                            let (wq, wd, we) = &w8[i];
                            let (mut want8, mut mag8, mut exact, mut room) =
                                (0f64, 0f64, 0f64, 0f64);
                            for c in 0..cols {
                                let xe = xt[c] as f64 * up;
                                want8 += wq[c] * xq[c];
                                mag8 += (wq[c] * xq[c]).abs();
                                exact += we[c] * xe;
                                let ew = (we[c].abs() / 16.0).max(2f64.powi(-10));
                                let ex = (xe.abs() / 16.0).max(2f64.powi(-10));
                                room += ew * xe.abs() + ex * we[c].abs() + ew * ex;
                            }
                            let k = wd * xd;
                            let y = got[t * rows + r] as f64;
                            let acc = 2f64.powi(-9) * mag8 * k;
                            worst8 = worst8.max((y - want8 * k).abs() / acc.max(1e-300));
                            worst_exact = worst_exact
                                .max((y - exact * k).abs() / (room * k + acc).max(1e-300));
                        }
                    }
                }
                let used = g.fp8_products() - before;
                let by = match g.fp8_outer_scales_used() {
                    Some(true) => "cuBLASLt's outer vectors",
                    Some(false) => "y_scale_outer",
                    None => "no FP8 product",
                };
                let what = format!(
                    "{layout} {rows}x{cols}, scales asked of cuBLASLt: {outer}, applied by {by}: vs the e4m3 operands {worst8:.3} of the 2^-9 bound, vs the exact ones {worst_exact:.3} of e4m3's bound, relaunch {}, {used} FP8 products",
                    if rep_ok {
                        "same bits"
                    } else {
                        "DIFFERENT BITS"
                    },
                );
                if !(worst8 <= 1.0 && worst_exact <= 1.0 && rep_ok && used == 6) {
                    failures.push(what.clone());
                }
                rows_out.push(what);
            }
        }
    }
    std::fs::remove_dir_all(&dir).ok();
    report("FP8 products", &rows_out, &failures);
}

/// `--fp8-weights`, products of one input by several matrices as one FP8 product of their joint
/// e4m3 copy (fp8.rs `joint8`): the attention's Q, gate, K and V through `matmul_group`, the
/// FFN's gate and up through `ffn_swiglu`. Every checked output against the f64 product of its
/// own matrix's e4m3 operands within the 2^-9 bound of fp8_products_match_their_e4m3_operands
/// (the joint copy must hold each member's rows as its own copy would, and the split must put
/// each output where it belongs); the SwiGLU against swiglu_fast's formula on those references,
/// within what the two products' bounds allow through it (silu's slope is at most 1.1) plus
/// 2^-20 of f32 rounding; one FP8 product per group; the same bits on relaunch.
#[test]
fn joint_fp8_products_match_their_e4m3_operands() {
    let Some(_) = gpu() else { return };
    let Some(g) = fp8_backend() else { return };
    let dir = std::env::temp_dir().join(format!("muser-fp8j-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = one_layer_file(&dir, "q4_k", 2048, 23);
    let cpu = CpuBackend::new(NumericMode::Accurate, 0).unwrap();
    let l = &file.tensors.layers[0];
    let mats = [
        &l.attn_q,
        &l.attn_gate,
        &l.attn_k,
        &l.attn_v,
        &l.ffn_gate,
        &l.ffn_up,
    ];
    let wg: Vec<_> = mats
        .iter()
        .map(|m| g.matrix(&file.gguf, m).unwrap())
        .collect();
    // Every 7th row of each matrix: its e4m3 weights and factor 2^-S_r.
    let refs: Vec<Vec<(usize, Vec<f64>, f64)>> = mats
        .iter()
        .map(|m| {
            let wh = exact_weights(&cpu, &file, m);
            (0..m.rows)
                .step_by(7)
                .map(|r| {
                    let (q, down) = e4m3_row(&wh[r * m.cols..(r + 1) * m.cols], 60);
                    (r, q, down)
                })
                .collect()
        })
        .collect();
    let (n, cols) = (64usize, mats[0].cols);
    let x = fp8_test_input(n, cols);
    let xq: Vec<(Vec<f64>, f64)> = (0..n)
        .map(|t| e4m3_row(&x[t * cols..(t + 1) * cols], 120))
        .collect();
    // (the e4m3 product, its 2^-9 bound) for check row e of matrix i and token t.
    let want = |i: usize, e: usize, t: usize| -> (f64, f64) {
        let (_, wq, wd) = &refs[i][e];
        let (xv, xd) = &xq[t];
        let (mut y, mut mag) = (0f64, 0f64);
        for c in 0..cols {
            y += wq[c] * xv[c];
            mag += (wq[c] * xv[c]).abs();
        }
        let k = wd * xd;
        (y * k, 2f64.powi(-9) * mag * k)
    };
    let mut xg = g.act(n, cols).unwrap();
    g.write(&mut xg, &x).unwrap();
    let mut failures = Vec::new();
    let mut rows_out = Vec::new();

    let mut outs: Vec<_> = mats[..4]
        .iter()
        .map(|m| g.act(n, m.rows).unwrap())
        .collect();
    let group = [&wg[0], &wg[1], &wg[2], &wg[3]];
    let before = g.fp8_products();
    {
        let mut o: Vec<_> = outs.iter_mut().collect();
        g.matmul_group(&group, &xg, &mut o).unwrap();
    }
    let used = g.fp8_products() - before;
    let got: Vec<Vec<f32>> = outs.iter().map(|o| g.read(o).unwrap()).collect();
    {
        let mut o: Vec<_> = outs.iter_mut().collect();
        g.matmul_group(&group, &xg, &mut o).unwrap();
    }
    let rep = outs
        .iter()
        .zip(&got)
        .all(|(o, a)| same_bits(&g.read(o).unwrap(), a));
    let mut worst = 0f64;
    for i in 0..4 {
        let rows = mats[i].rows;
        for (e, (r, _, _)) in refs[i].iter().enumerate() {
            for t in 0..n {
                let (w, b) = want(i, e, t);
                let y = got[i][t * rows + r] as f64;
                worst = worst.max((y - w).abs() / b.max(1e-300));
            }
        }
    }
    let what = format!(
        "Q, gate, K, V ({} rows) as one product: {worst:.3} of the 2^-9 bound, {used} FP8 product(s), relaunch {}",
        mats[..4].iter().map(|m| m.rows).sum::<usize>(),
        if rep { "same bits" } else { "DIFFERENT BITS" }
    );
    if !(worst <= 1.0 && used == 1 && rep) {
        failures.push(what.clone());
    }
    rows_out.push(what);

    let f = mats[4].rows;
    let (mut fg, mut fu, mut fo) = (
        g.act(n, f).unwrap(),
        g.act(n, f).unwrap(),
        g.act(n, f).unwrap(),
    );
    let before = g.fp8_products();
    g.ffn_swiglu(&wg[4], &wg[5], &xg, &mut fg, &mut fu, &mut fo)
        .unwrap();
    let used = g.fp8_products() - before;
    let out = g.read(&fo).unwrap();
    g.ffn_swiglu(&wg[4], &wg[5], &xg, &mut fg, &mut fu, &mut fo)
        .unwrap();
    let rep = same_bits(&g.read(&fo).unwrap(), &out);
    let mut worst = 0f64;
    for (e, (r, _, _)) in refs[4].iter().enumerate() {
        for t in 0..n {
            let ((gw, gb), (uw, ub)) = (want(4, e, t), want(5, e, t));
            let silu = gw / (1.0 + (-gw).exp());
            let r_ref = silu * uw;
            let bound = 1.1 * gb * (uw.abs() + ub) + silu.abs() * ub + 2f64.powi(-20) * r_ref.abs();
            let y = out[t * f + r] as f64;
            worst = worst.max((y - r_ref).abs() / bound.max(1e-300));
        }
    }
    let what = format!(
        "FFN gate and up ({} rows) as one product, SwiGLU from it: {worst:.3} of the bound, {used} FP8 product(s), relaunch {}",
        2 * f,
        if rep { "same bits" } else { "DIFFERENT BITS" }
    );
    if !(worst <= 1.0 && used == 1 && rep) {
        failures.push(what.clone());
    }
    rows_out.push(what);
    std::fs::remove_dir_all(&dir).ok();
    report("joint FP8 products", &rows_out, &failures);
}

/// `--fp8-weights` on every fixture's prompt (its products of more than 8 tokens on the FP8
/// tensor cores: the threshold lowered from 32 so that every fixture's prompt takes them)
/// against the CPU's accurate mode, held to the fast mode's rule with e4m3's error in place of
/// f16's: the family's sensitivity (max |Δ log-softmax| per unit of relative
/// perturbation, tests/fixtures/MANIFEST.md) times 2^-3, the relative error bound of one term of
/// an FP8 product (2^-4 per operand). The fast mode's f16 products (sensitivity x 2^-10) are
/// printed beside it for scale. Every fixture must take the FP8 path.
#[test]
fn fp8_weights_prompts_stay_within_their_bound() {
    let Some(_) = gpu() else { return };
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    for name in names() {
        let file = ModelFile::open(model_path(&name)).expect("open");
        let cpu =
            MuseGlimmer::load(&file, CpuBackend::new(NumericMode::Accurate, 0).unwrap()).unwrap();
        let toks = tokens(&name);
        let want = Session::new(&cpu, KvType::F32, 256)
            .unwrap()
            .feed(&toks, 512, Logits::All)
            .unwrap();
        let mut d = [0f64; 2];
        let mut used = 0;
        for (i, fp8) in [false, true].into_iter().enumerate() {
            let g = CudaBackend::new(0).unwrap();
            g.set_fast_mode(true).unwrap();
            if fp8 {
                if let Err(e) = g.set_fp8_weights(true) {
                    println!("SKIPPED (no FP8 here): {e}");
                    return;
                }
                g.set_gemm8_min_tokens(8);
            }
            let gpu = MuseGlimmer::load(&file, g).unwrap();
            let got = Session::new(&gpu, KvType::F32, 256)
                .unwrap()
                .feed(&toks, 512, Logits::All)
                .unwrap();
            d[i] = max_dls(&got, &want, cpu.config.n_vocab);
            if fp8 {
                used = gpu.backend.fp8_products();
            }
        }
        let bound = sensitivity(&name) * 2f64.powi(-3);
        rows.push(format!(
            "{name:<14} FP8 vs CPU accurate: {:.2e} (bound {bound:.2e}; f16 fast {:.2e}), {used} FP8 products",
            d[1], d[0]
        ));
        if !(d[1] <= bound && used > 0) {
            failures.push(format!(
                "{name}: {:.2e} > {bound:.2e} or {used} FP8 products",
                d[1]
            ));
        }
    }
    report("", &rows, &failures);
}

/// Large reads to the host (the staging buffers, staging.rs) give the device's values bit for
/// bit: a whole matrix of 64 logits rows (4 staging buffers' worth and a remainder), one row
/// (below the staging threshold), runs of rows in another order, and a read just past one
/// staging buffer; twice each (the buffers reused), NaNs and infinities included.
#[test]
fn large_reads_give_the_device_values() {
    let Some(g) = gpu() else { return };
    let (rows, cols) = (64usize, 202_048usize);
    let mut x: Vec<f32> = (0..rows * cols)
        .map(|i| f32::from_bits((i as u32).wrapping_mul(2_654_435_761) ^ 0x3f00_0000))
        .collect();
    x[17] = f32::NAN;
    x[rows * cols - 1] = f32::INFINITY;
    x[(4 << 20) - 1] = f32::NEG_INFINITY;
    let mut xg = g.act(rows, cols).unwrap();
    g.stream.memcpy_htod(&x, xg_data(&mut xg)).unwrap();
    let mut host = vec![1.0f32; 3];
    for _ in 0..2 {
        g.read_into(&xg, &mut host).unwrap();
        assert!(same_bits(&host, &x), "whole matrix");
        let pick = [
            5usize, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 0, 63, 40,
            41,
        ];
        g.read_rows_into(&xg, cols, &pick, &mut host).unwrap();
        assert_eq!(host.len(), pick.len() * cols);
        for (i, &r) in pick.iter().enumerate() {
            assert!(
                same_bits(
                    &host[i * cols..(i + 1) * cols],
                    &x[r * cols..(r + 1) * cols]
                ),
                "row {r} at {i}"
            );
        }
        g.read_rows_into(&xg, cols, &[3], &mut host).unwrap();
        assert!(same_bits(&host, &x[3 * cols..4 * cols]), "one row");
    }
    // 21 rows: 4,243,008 floats, one staging buffer (4,194,304) and a remainder.
    let mut part = g.act(21, cols).unwrap();
    g.stream
        .memcpy_htod(&x[..21 * cols], xg_data(&mut part))
        .unwrap();
    g.read_into(&part, &mut host).unwrap();
    assert!(
        same_bits(&host, &x[..21 * cols]),
        "one buffer and a remainder"
    );
}

/// One token's Q, gate, K and V as one group launch (`mvq_q4_k_group`, the default for the
/// attention's products): each output the bits of its matrix alone, with three and two digit
/// planes; with every matrix Q4_K (one launch of four) and in llama.cpp's Q4_K_M layout (V may be
/// Q6_K: then three in the group and V alone). The 30B's widths: 6656 columns, 4096 + 4096 + 256
/// + 256 rows.
#[test]
fn grouped_one_token_products_give_the_bits_alone() {
    let Some(g) = gpu() else { return };
    let dir = std::env::temp_dir().join(format!("muser-group-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut rows = Vec::new();
    for layout in ["q4_k", "q4_k_m"] {
        let file = layer_file(&dir, layout, (512, 32, 512), 23);
        let l = &file.tensors.layers[0];
        let up = |m| g.matrix(&file.gguf, m).unwrap();
        let ws = [
            up(&l.attn_q),
            up(&l.attn_gate),
            up(&l.attn_k),
            up(&l.attn_v),
        ];
        let x: Vec<f32> = (0..6656)
            .map(|i| {
                let v = ((i * 7919 % 2003) as f32 / 1001.5 - 1.0) * 0.9;
                if (i / 48) % 5 == 0 { v * 1e-3 } else { v }
            })
            .collect();
        let mut xg = g.act(1, 6656).unwrap();
        g.stream.memcpy_htod(&x, xg_data(&mut xg)).unwrap();
        for planes in [3usize, 2] {
            g.set_mvq_planes(planes);
            let mut alone = Vec::new();
            for w in &ws {
                let mut y = g.act(1, w.rows).unwrap();
                g.matmul(w, &xg, &mut y).unwrap();
                alone.push(g.read(&y).unwrap());
            }
            let mut outs: Vec<_> = ws.iter().map(|w| g.act(1, w.rows).unwrap()).collect();
            g.set_profiling(true);
            {
                let refs: Vec<&muser_cuda::CudaMatrix> = ws.iter().collect();
                let mut orefs: Vec<&mut muser_cuda::CudaAct> = outs.iter_mut().collect();
                g.matmul_group(&refs, &xg, &mut orefs).unwrap();
            }
            let launches = g.profile_report().unwrap();
            g.set_profiling(false);
            let group = launches
                .iter()
                .find(|(label, ..)| label.starts_with("matmul group q4_k"))
                .map(|(label, ..)| label.clone());
            let want_members = ws
                .iter()
                .filter(|w| w.ty == muser_gguf::GgmlType::Q4_K)
                .count();
            assert!(
                want_members >= 2 && group.is_some(),
                "{layout} planes {planes}: no group launch ({launches:?})"
            );
            for (i, (w, o)) in ws.iter().zip(&outs).enumerate() {
                let got = g.read(o).unwrap();
                assert!(
                    got.iter().all(|v| v.is_finite()) && same_bits(&got, &alone[i]),
                    "{layout} planes {planes}: output {i} ({} {}x{}) differs from its matrix alone",
                    w.ty,
                    w.rows,
                    w.cols
                );
            }
            rows.push(format!(
                "{layout:<6} planes {planes}: {} ({}) same bits as alone",
                group.unwrap_or_default(),
                ws.iter()
                    .map(|w| w.ty.to_string())
                    .collect::<Vec<_>>()
                    .join(" ")
            ));
        }
        g.set_mvq_planes(3);
    }
    println!("{}", rows.join("\n"));
    std::fs::remove_dir_all(&dir).ok();
}

/// A device cache copied from another (`Backend::kv_copy`: the choices of one request sharing
/// their prompt), taken back one position and fed on, gives the bits of its source fed the same:
/// past the sliding window (the rings wrapped), in f16 and q8_0 caches, eagerly and through
/// the captured graph.
#[test]
fn a_copied_device_cache_gives_its_sources_bits() {
    use muser_engine::Backend;
    let Some(_) = gpu() else { return };
    let mut checked = Vec::new();
    for name in names() {
        let file = ModelFile::open(model_path(&name)).unwrap();
        let g = MuseGlimmer::load(&file, CudaBackend::new(0).unwrap()).unwrap();
        assert!(g.backend.kv_can_copy());
        let toks = tokens(&name);
        let p = (g.config.n_swa + 5).min(toks.len() - 8);
        for kv in [KvType::F16, KvType::Q8_0] {
            let mut a = Session::new(&g, kv, 256).unwrap();
            a.feed(&toks[..p], 64, Logits::Last).unwrap();
            let mut b = Session::new(&g, kv, 256).unwrap();
            b.feed(&toks[..3], 64, Logits::Last).unwrap();
            g.backend.kv_copy(&a.kv, &mut b.kv).unwrap();
            assert_eq!(b.pos(), p);
            assert!(a.truncate(p - 1) && b.truncate(p - 1));
            let run = |s: &mut Session<'_, CudaBackend>| {
                let mut out = s.feed(&toks[p - 1..p + 3], 4, Logits::All).unwrap();
                let mut dec = GraphDecoder::new(&g).unwrap();
                out.extend(graph_steps(&mut dec, &mut s.kv, &toks[p + 3..p + 8]).unwrap());
                out
            };
            let want = run(&mut a);
            let got = run(&mut b);
            let differ = want
                .iter()
                .zip(&got)
                .filter(|(x, y)| x.to_bits() != y.to_bits())
                .count();
            assert_eq!(differ, 0, "{name} {kv:?}: the copy's logits differ");
        }
        checked.push(name);
    }
    println!(
        "copied device caches give their sources' bits: {}",
        checked.join(", ")
    );
}

/// Log-probabilities computed where the logits are (`row_logprobs`: a prompt scored by echo, a
/// generated token's logprobs) against the host reference `RowLogprob::of`: rows of Muse
/// Glimmer's vocabulary picked out of order and twice, 0 to 20 alternatives, a tie for the
/// largest (the lower id), ties across the 20th place, a plateau of tied largest values, +0
/// and -0, a NaN, a target past the row, a -inf.
#[test]
fn device_logprobs_match_the_host_reference() {
    use muser_engine::sampling::{MAX_TOP_LOGPROBS, RowLogprob};
    let Some(g) = gpu() else { return };
    let (rows, cols) = (7usize, 202_048usize);
    let mut x: Vec<f32> = (0..rows * cols)
        .map(|i| ((i as u64 * 2_654_435_761 % 1_000_003) as f32 / 1_000_003.0) * 20.0 - 10.0)
        .collect();
    x[2 * cols + 77] = 30.0;
    x[2 * cols + 55] = 30.0;
    x[3 * cols + 9] = f32::NEG_INFINITY;
    // Row 4: 40 levels, so thousands tie at each, the 20th place inside a tie.
    for (c, v) in x[4 * cols..5 * cols].iter_mut().enumerate() {
        *v = (c * 7 % 40) as f32 * 0.25;
    }
    // Row 5: a plateau of 1,000 tied at the largest, +0 and -0 above the rest, a NaN (which
    // makes the row's sums NaN: the tops are still listed, a NaN never).
    for (c, v) in x[5 * cols..6 * cols].iter_mut().enumerate() {
        *v = if c % 200 == 3 {
            4.0
        } else {
            -1.0 - (c % 13) as f32
        };
    }
    x[5 * cols + 10] = -0.0;
    x[5 * cols + 11] = 0.0;
    x[5 * cols + 12] = f32::NAN;
    // Row 6: a sharp row, one token far above.
    x[6 * cols + 150_000] = 80.0;
    let pick = [3usize, 0, 2, 2, 4, 1, 4, 5, 5, 6, 0, 2];
    let targets = [
        9u32,
        123,
        77,
        202_047,
        8,
        cols as u32 + 5,
        1,
        11,
        3,
        0,
        5,
        55,
    ];
    let tops = [0usize, 1, 1, 2, 20, 5, 7, 20, 1, 20, 20, 3];
    assert_eq!(*tops.iter().max().unwrap(), MAX_TOP_LOGPROBS);
    let mut xg = g.act(rows, cols).unwrap();
    g.stream.memcpy_htod(&x, xg_data(&mut xg)).unwrap();
    let got = g.logprobs(&xg, &pick, &targets, &tops).unwrap();
    assert_eq!(got.len(), pick.len());
    let mut worst = 0.0f32;
    let close = |a: f32, b: f32| {
        if a.is_finite() || b.is_finite() {
            assert_eq!(a.is_finite(), b.is_finite(), "{a} against {b}");
            (a - b).abs()
        } else {
            assert_eq!(a.is_nan(), b.is_nan(), "{a} against {b}");
            0.0
        }
    };
    for (i, l) in got.iter().enumerate() {
        let r = pick[i];
        let want = RowLogprob::of(&x[r * cols..(r + 1) * cols], targets[i], tops[i]);
        let ids = |t: &RowLogprob| t.top.iter().map(|p| p.0).collect::<Vec<_>>();
        assert_eq!(ids(l), ids(&want), "row {r}, {} alternatives", tops[i]);
        assert_eq!(l.top.len(), tops[i], "row {r}");
        worst = worst.max(close(l.logprob, want.logprob));
        for (a, b) in l.top.iter().zip(&want.top) {
            worst = worst.max(close(a.1, b.1));
        }
    }
    assert_eq!(got[2].top[0].0, 55, "a tie goes to the lower id");
    assert_eq!(got[5].logprob, f32::NEG_INFINITY, "a target past the row");
    assert!(got[7].logprob.is_nan() && got[7].top.iter().all(|p| p.0 % 200 == 3));
    assert_eq!(got[9].top[0].0, 150_000);
    assert!(
        worst <= 1e-6,
        "device log-probabilities against the host's: {worst}"
    );
    println!(
        "device log-probabilities: within {worst:.1e} of the host's, the same alternatives (0 to 20 a row)"
    );
}

/// Saved sequence state (`muser_engine::state`) on the GPU: a cache saved and loaded into a fresh
/// one (of the same context, and of one just large enough: a smaller ring) continues bit for bit
/// as the saved one does, past the ring's wrap; across backends (f32 caches), a CPU-saved cache
/// continues on the GPU, and a GPU-saved one on the CPU, within the tame bound of the CPU.
#[test]
fn saved_state_loads_on_the_gpu_and_across_backends() {
    let Some(_) = gpu() else { return };
    let name = "tame-q4_k_m";
    let file = ModelFile::open(model_path(name)).expect("fixture");
    let cpu = MuseGlimmer::load(&file, CpuBackend::new(NumericMode::Accurate, 0).unwrap()).unwrap();
    let gpu = MuseGlimmer::load(&file, CudaBackend::new(0).unwrap()).unwrap();
    assert_eq!(cpu.fingerprint, gpu.fingerprint);
    let n_vocab = cpu.config.n_vocab;
    let toks = tokens(name);
    let long: Vec<u32> = toks.iter().cycle().take(1110).copied().collect();
    let dir = std::env::temp_dir().join(format!("muser-gpu-state-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    for kv in [KvType::F16, KvType::Q8_0] {
        for len in [40, 600, 1100] {
            let (prompt, more) = (&long[..len], &long[len..len + 6]);
            let mut a = Session::new(&gpu, kv, 1200).unwrap();
            a.feed(prompt, 512, Logits::Last).unwrap();
            let path = dir.join(format!("{kv:?}-{len}.state"));
            a.save_state(&path, prompt).unwrap();
            let want = a.feed(more, 3, Logits::All).unwrap();
            for n_ctx in [1200, len + 7] {
                let mut b = Session::new(&gpu, kv, n_ctx).unwrap();
                let (t, by) = b.load_state(&path).unwrap();
                assert_eq!(t, prompt);
                assert!(by.starts_with("cuda"), "{by}");
                let same = same_bits(&b.feed(more, 3, Logits::All).unwrap(), &want);
                rows.push(format!(
                    "{kv:?} {len} positions into a context of {n_ctx}: {}",
                    if same { "identical" } else { "DIFFER" }
                ));
                if !same {
                    failures.push(format!("{kv:?} {len} -> ctx {n_ctx}: logits differ"));
                }
            }
        }
    }
    let bound = 1e-4;
    let (prompt, more) = (&long[..600], &long[600..606]);
    let mut c = Session::new(&cpu, KvType::F32, 1200).unwrap();
    c.feed(prompt, 512, Logits::Last).unwrap();
    let cpath = dir.join("cpu.state");
    c.save_state(&cpath, prompt).unwrap();
    let cpu_more = c.feed(more, 3, Logits::All).unwrap();
    let mut g = Session::new(&gpu, KvType::F32, 1200).unwrap();
    g.load_state(&cpath).unwrap();
    let d1 = max_dls(&g.feed(more, 3, Logits::All).unwrap(), &cpu_more, n_vocab);
    let mut g = Session::new(&gpu, KvType::F32, 1200).unwrap();
    g.feed(prompt, 512, Logits::Last).unwrap();
    let gpath = dir.join("gpu.state");
    g.save_state(&gpath, prompt).unwrap();
    let mut c = Session::new(&cpu, KvType::F32, 1200).unwrap();
    c.load_state(&gpath).unwrap();
    let d2 = max_dls(&c.feed(more, 3, Logits::All).unwrap(), &cpu_more, n_vocab);
    rows.push(format!("f32, 600 positions: CPU-saved on the GPU {d1:.2e}, GPU-saved on the CPU {d2:.2e} (against the CPU throughout)"));
    if !(d1 <= bound && d2 <= bound) {
        failures.push(format!(
            "across backends: {d1:.2e} / {d2:.2e} above {bound:e}"
        ));
    }
    let _ = std::fs::remove_dir_all(&dir);
    report("saved state on the GPU", &rows, &failures);
}

/// Speculative decoding from the sequence's own tokens (`muser_engine::speculative`) on the
/// device: in the batch-invariant mode, where a forward of several tokens gives each row the
/// bits of one token alone, it samples plain decoding's tokens (greedy, and seeded with
/// penalties) while keeping some of its guesses, on every fixture, the rows drawn on the
/// device (`muser generate`'s way) or on the host. The default and `--mode fast` multiply a
/// guess's rows on other kernels than one token's, so a near-tie may come out otherwise: their
/// agreement is reported, not asserted.
#[test]
fn guesses_on_the_device_sample_plain_decodings_tokens() {
    use muser_engine::speculative::{self, NgramDraft};
    use muser_engine::{Sampler, SamplingParams};
    let Some(_) = gpu() else { return };
    // `n` tokens after `prompt`, each step guessing with `d` (plain decoding without), the rows
    // drawn on the device or sampled on the host: the tokens, and the guessed tokens kept.
    fn decode<B: Backend>(
        m: &MuseGlimmer<B>,
        prompt: &[u32],
        n: usize,
        p: &SamplingParams,
        d: Option<NgramDraft>,
        drawn: bool,
    ) -> (Vec<u32>, usize) {
        let mut s = Session::new(m, KvType::F16, prompt.len() + n + 8).unwrap();
        let mut sampler = Sampler::new(p.clone());
        prompt.iter().for_each(|&t| sampler.accept(t));
        let logits = s.feed(prompt, 64, Logits::Last).unwrap();
        let mut t = sampler.sample(&logits);
        sampler.accept(t);
        let mut out = vec![t];
        let mut history = prompt.to_vec();
        history.push(t);
        let mut kept = 0;
        while out.len() < n {
            let guess = d.map(|d| d.draft(&history)).unwrap_or_default();
            let st =
                speculative::step_with(&mut s, &mut sampler, t, &guess, &[], n - out.len(), drawn)
                    .unwrap();
            assert_eq!(st.tokens[..st.accepted], guess[..st.accepted]);
            assert_eq!(s.pos(), prompt.len() + out.len() + st.tokens.len() - 1);
            kept += st.accepted;
            out.extend_from_slice(&st.tokens);
            history.extend_from_slice(&st.tokens);
            t = *st.tokens.last().unwrap();
        }
        (out, kept)
    }
    let greedy = SamplingParams {
        temperature: 0.0,
        ..Default::default()
    };
    let sampled = SamplingParams {
        temperature: 0.9,
        top_k: 40,
        top_p: 0.95,
        repeat_penalty: 1.1,
        seed: 7,
        ..Default::default()
    };
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    let mut kept_invariant = 0;
    for name in names() {
        let file = ModelFile::open(model_path(&name)).unwrap();
        // A passage said three times: guesses from the start.
        let toks = tokens(&name);
        let phrase = &toks[..toks.len().min(9)];
        let prompt: Vec<u32> = phrase
            .iter()
            .copied()
            .cycle()
            .take(phrase.len() * 3)
            .collect();
        for (label, invariant, fast) in [
            ("batch-invariant", true, false),
            ("default        ", false, false),
            ("fast           ", false, true),
        ] {
            let b = CudaBackend::new(0).unwrap();
            b.set_batch_invariant(invariant);
            b.set_fast_mode(fast).unwrap();
            let m = MuseGlimmer::load(&file, b).unwrap();
            for (p, what) in [(&greedy, "greedy"), (&sampled, "sampled")] {
                for (drawn, at) in [(true, "device"), (false, "host")] {
                    let (want, _) = decode(&m, &prompt, 48, p, None, drawn);
                    for d in [
                        NgramDraft::new(1, 4).unwrap(),
                        NgramDraft::new(2, 16).unwrap(),
                    ] {
                        let (got, kept) = decode(&m, &prompt, 48, p, Some(d), drawn);
                        let agree = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
                        let row = format!(
                            "{name:<14} {label} {what:<7} drawn on the {at:<6} n={} max={:<2}: {kept:>2} guessed tokens kept, {agree}/48 tokens plain decoding's",
                            d.n, d.max
                        );
                        if invariant {
                            kept_invariant += kept;
                            if got != want {
                                failures.push(row.clone());
                            }
                        }
                        rows.push(row);
                    }
                }
            }
        }
    }
    // Guesses never kept would test only the taking back.
    if kept_invariant == 0 {
        failures.push("no guess was ever kept in the batch-invariant mode".into());
    }
    report(
        "speculative decoding on the device against plain decoding",
        &rows,
        &failures,
    );
}

/// `n` rows of `cols` values from `v`, on the device.
fn act_of(g: &CudaBackend, n: usize, cols: usize, v: &[f32]) -> muser_cuda::CudaAct {
    let mut a = g.act(n, cols).unwrap();
    g.stream.memcpy_htod(v, xg_data(&mut a)).unwrap();
    a
}

/// `w1 x` and `w2 x` through one `matmul_pair` (n tokens), read back.
fn pair_outputs(
    g: &CudaBackend,
    n: usize,
    w1: &muser_cuda::CudaMatrix,
    w2: &muser_cuda::CudaMatrix,
    x: &muser_cuda::CudaAct,
) -> [Vec<f32>; 2] {
    let (mut y1, mut y2) = (g.act(n, w1.rows).unwrap(), g.act(n, w2.rows).unwrap());
    g.matmul_pair(w1, w2, x, &mut y1, &mut y2).unwrap();
    [g.read(&y1).unwrap(), g.read(&y2).unwrap()]
}

/// The products of a layer that the few-token tests launch, every output in order: the FFN's
/// down projection of `xf`, its gate and up as a pair of `xh`, the attention's group of four of
/// `xh` (n tokens each).
fn ffn_attn_outputs(
    g: &CudaBackend,
    n: usize,
    (down, gate, up): (
        &muser_cuda::CudaMatrix,
        &muser_cuda::CudaMatrix,
        &muser_cuda::CudaMatrix,
    ),
    attn: &[muser_cuda::CudaMatrix; 4],
    xh: &muser_cuda::CudaAct,
    xf: &muser_cuda::CudaAct,
) -> Vec<Vec<f32>> {
    let mut outs = Vec::new();
    let mut y = g.act(n, down.rows).unwrap();
    g.matmul(down, xf, &mut y).unwrap();
    outs.push(g.read(&y).unwrap());
    outs.extend(pair_outputs(g, n, gate, up, xh));
    let mut ys: Vec<_> = attn.iter().map(|w| g.act(n, w.rows).unwrap()).collect();
    {
        let refs: Vec<&muser_cuda::CudaMatrix> = attn.iter().collect();
        let mut orefs: Vec<&mut muser_cuda::CudaAct> = ys.iter_mut().collect();
        g.matmul_group(&refs, xh, &mut orefs).unwrap();
    }
    for y in &ys {
        outs.push(g.read(y).unwrap());
    }
    outs
}

/// The x-stationary kernels' few-token forms (`set_mvq_tokens`, `mvq_*_n2`, `_n3`): each token's
/// outputs carry the bits of a one-token launch on that token alone, for every product of a
/// layer (the FFN's down projection column-split, its gate and up as a pair, the attention's
/// group, V with itself as a pair, O, the LM head), Q4_K and Q6_K, both modes, with the staged
/// forms at their default threshold, for every launch, and for none; and the same tokens on the
/// tensor-core kernels give other bits (so the route to the few-token forms is what is tested).
#[test]
fn few_token_products_give_each_token_its_one_token_bits() {
    let Some(g) = gpu() else { return };
    let dir = std::env::temp_dir().join(format!("muser-few-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut rows = Vec::new();
    for layout in ["q4_k", "q4_k_m"] {
        let file = layer_file(&dir, layout, (19968, 4, 512), 31);
        let l = &file.tensors.layers[0];
        let up = |m| g.matrix(&file.gguf, m).unwrap();
        let (down, gate, upm) = (up(&l.ffn_down), up(&l.ffn_gate), up(&l.ffn_up));
        let (o, head) = (up(&l.attn_output), up(&file.tensors.output));
        let attn = [
            up(&l.attn_q),
            up(&l.attn_gate),
            up(&l.attn_k),
            up(&l.attn_v),
        ];
        // Every output of a layer's launches for the n rows of `xs` (x of 6656 columns, the
        // down projection's input, O's input), in order.
        let run = |n: usize, xs: [&[f32]; 3]| -> Vec<Vec<f32>> {
            let (xh, xf, xo) = (
                act_of(&g, n, 6656, xs[0]),
                act_of(&g, n, down.cols, xs[1]),
                act_of(&g, n, o.cols, xs[2]),
            );
            let mut outs = ffn_attn_outputs(&g, n, (&down, &gate, &upm), &attn, &xh, &xf);
            // V with itself as a pair (Q6_K in q4_k_m: the Q6_K pair forms).
            outs.extend(pair_outputs(&g, n, &attn[3], &attn[3], &xh));
            let mut y = g.act(n, o.rows).unwrap();
            g.matmul(&o, &xo, &mut y).unwrap();
            outs.push(g.read(&y).unwrap());
            let mut y = g.act(n, head.rows).unwrap();
            g.matmul(&head, &xh, &mut y).unwrap();
            outs.push(g.read(&y).unwrap());
            outs
        };
        for fast in [true, false] {
            g.set_fast_mode(fast).unwrap();
            for tma_min in [50usize << 20, 0, usize::MAX] {
                g.set_mvq_tma_min_bytes(tma_min);
                for n in 2..=3usize {
                    let x = |cols: usize, salt: usize| -> Vec<f32> {
                        (0..n * cols)
                            .map(|i| (((i + salt) * 7919 % 2003) as f32 / 1001.5 - 1.0) * 0.8)
                            .collect()
                    };
                    let (xh, xf, xo) = (x(6656, 1), x(down.cols, 2), x(o.cols, 3));
                    g.set_mvq_tokens(3);
                    let got = run(n, [&xh, &xf, &xo]);
                    g.set_mvq_tokens(1);
                    // The same tokens on the tensor-core kernels differ: equal bits below come
                    // from the few-token forms, not from a route that missed them.
                    assert!(
                        run(n, [&xh, &xf, &xo]) != got,
                        "{layout} fast {fast} n={n}: the tensor-core products gave the few-token forms' bits"
                    );
                    for k in 0..n {
                        let row = |v: &Vec<f32>| v[k * v.len() / n..(k + 1) * v.len() / n].to_vec();
                        let want = run(1, [&row(&xh), &row(&xf), &row(&xo)]);
                        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                            let a = &a[k * b.len()..(k + 1) * b.len()];
                            assert!(
                                a.iter().all(|v| v.is_finite()) && same_bits(a, b),
                                "{layout} fast {fast} staged from {tma_min} B, n={n}: output {i} of token {k} differs from a one-token launch's"
                            );
                        }
                    }
                }
            }
            g.set_mvq_tma_min_bytes(50 << 20);
            rows.push(format!(
                "{layout:<6} fast {fast}: 2 and 3 tokens, each with its one-token bits (11 outputs of 9 launches, staged at 50 MB, always, never)"
            ));
        }
        g.set_fast_mode(false).unwrap();
    }
    g.set_mvq_tokens(1);
    println!("{}", rows.join("\n"));
    std::fs::remove_dir_all(&dir).ok();
}

/// The lean launches of a few tokens' tensor-core products (`set_mmq_lean`: a split's ranges added
/// by its last blocks instead of mmq_reduce launches, the activation planes made for the launch's
/// block tokens instead of 64, x's planes made once per `matmul_group`) give the default launches'
/// bits: one matrix (the FFN's down projection of the 30B's widths, whose column ranges split in
/// `--mode fast`), a pair (gate and up) and the attention's group of four, at token counts from 2
/// to 160 (two grid layers of 64 and a launch of 32), twice in a row (the split's counters left at
/// zero), in both modes and both file layouts.
#[test]
fn lean_few_token_products_give_the_default_bits() {
    let Some(g) = gpu() else { return };
    let dir = std::env::temp_dir().join(format!("muser-lean-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut rows = Vec::new();
    for layout in ["q4_k", "q4_k_m"] {
        let file = layer_file(&dir, layout, (19968, 4, 512), 29);
        let l = &file.tensors.layers[0];
        let up = |m| g.matrix(&file.gguf, m).unwrap();
        let (down, gate, upm) = (up(&l.ffn_down), up(&l.ffn_gate), up(&l.ffn_up));
        let attn = [
            up(&l.attn_q),
            up(&l.attn_gate),
            up(&l.attn_k),
            up(&l.attn_v),
        ];
        for fast in [true, false] {
            g.set_fast_mode(fast).unwrap();
            for n in [2usize, 3, 9, 17, 40, 64, 160] {
                // Every output of the three launches, in order.
                let run = || -> Vec<Vec<f32>> {
                    let x = |cols: usize| -> muser_cuda::CudaAct {
                        let v: Vec<f32> = (0..n * cols)
                            .map(|i| ((i * 7919 % 2003) as f32 / 1001.5 - 1.0) * 0.8)
                            .collect();
                        act_of(&g, n, cols, &v)
                    };
                    let (xf, xh) = (x(down.cols), x(6656));
                    ffn_attn_outputs(&g, n, (&down, &gate, &upm), &attn, &xh, &xf)
                };
                g.set_mmq_lean(false);
                let want = run();
                g.set_mmq_lean(true);
                for round in 0..2 {
                    let got = run();
                    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                        assert!(
                            a.iter().all(|v| v.is_finite()) && same_bits(a, b),
                            "{layout} fast {fast} n={n} round {round}: output {i} differs from the default launches'"
                        );
                    }
                }
                g.set_mmq_lean(false);
            }
            rows.push(format!(
                "{layout:<6} fast {fast}: lean launches, the default bits at 2 to 160 tokens"
            ));
        }
        g.set_fast_mode(false).unwrap();
    }
    println!("{}", rows.join("\n"));
    std::fs::remove_dir_all(&dir).ok();
}
