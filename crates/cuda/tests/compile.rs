//! Every kernel source compiles with NVRTC for Hopper (sm_90) and exports the entry points the
//! backend launches. Needs only NVRTC (no GPU): CI installs it from PyPI (nvidia-cuda-nvrtc);
//! without it the test says so and passes nothing off as checked.

use muser_cuda::kernels;

fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen libnvrtc.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

#[test]
fn every_kernel_source_compiles_for_sm_90() {
    if !nvrtc_present() {
        println!(
            "SKIPPED: NVRTC (libnvrtc.so.13) not found; install nvidia-cuda-nvrtc and put its lib folder on LD_LIBRARY_PATH"
        );
        return;
    }
    let mut entries = Vec::new();
    for (name, src) in kernels::SOURCES {
        let ptx = kernels::compile(name, src, "sm_90").unwrap_or_else(|e| panic!("{e}"));
        assert!(
            ptx.contains(".target sm_90"),
            "{name}: PTX is not for sm_90"
        );
        entries.extend(kernels::entry_points(&ptx));
    }
    // The attention variants of the real model and of both fixture families.
    for (nrep, hd) in [(16, 128), (4, 64), (2, 128)] {
        let defs = [format!("ATTN_NREP={nrep}"), format!("ATTN_HD={hd}")];
        let ptx = kernels::compile_with("attention", kernels::ATTENTION, "sm_90", &defs)
            .unwrap_or_else(|e| panic!("{e}"));
        entries.extend(kernels::entry_points(&ptx));
    }
    for want in [
        "get_rows",
        "dequant_rows",
        "rms_norm",
        "norm_tail_512",
        "norm_tail_1024",
        "norm_tail_cluster",
        "norm_tail_cluster16",
        "post_norm_add",
        "head_norm",
        "rope_norm",
        "sigmoid_gate",
        "swiglu",
        "swiglu_fast",
        "logit_finish",
        "sums8",
        "select_rows",
        "argmax_rows",
        "kv_store",
        "attn_combine",
        "qkv_prep_64",
        "qkv_prep_128",
        "mv_q4_k_1_1",
        "mv_q4_k_4_1",
        "mv_q6_k_2_8",
        "mv_q5_k_1_2",
        "mv_q8_0_4_4",
        "mv_q4_0_1_1",
        "mv_f16_2_1",
        "mv_bf16_1_1",
        "mv_f32_4_1",
        "xq_planes",
        "mvq_q4_k_pair_tma",
        "mvq_q4_k_split_tma_p2",
        "mvq_q6_k_tma",
        "mvq_q6_k_split_tma",
        "mvq_q6_k_pair_tma_p2",
        "mmq_q4_k_1",
        "mmq_q4_k_4",
        "mmq_q6_k_3",
        "mmq_q6_k_4",
        "mmq_s_q4_k_4",
        "mmq_s2_q6_k_2",
        "mmq_sa_q4_k_4",
        "mmq_p2_q4_k_4",
        "mmq_p2_q6_k_4",
        "mmq_p2o_q4_k_3",
        "mmq_p2o_q6_k_4",
        "mmq_reduce",
        "x16_runsums",
        "qmma_q4_k_1",
        "qmma_q4_k_4",
        "qmma_q4_k_8",
        "qmma_q4_k_x4",
        "qmma_reduce",
        "w8_rowscale",
        "w8_rows",
        "x8_rowquant",
        "y_split4",
        "swiglu_joint",
        "y_scale_outer",
        "attn_16_128_f16",
        "attn_tcd_16_128",
        "attn_tcd_16_128_split",
        "attn_tcd_4_64",
        "attn_tcd_2_128_split",
        "attn_tcd2_16_128",
        "attn_tcd2_4_64_split",
        "attn_4_64_q8_0",
        "attn_2_128_f32",
    ] {
        assert!(
            entries.iter().any(|e| e == want),
            "entry point {want} missing (have {} entries)",
            entries.len()
        );
    }
    // Every few-token form the backend may name, and its one-token kernel.
    for &(one, two, three) in muser_cuda::MVQ_FEW_KERNELS {
        for want in [one, two, three] {
            assert!(
                entries.iter().any(|e| e == want),
                "x-stationary kernel {want} missing"
            );
        }
    }
    println!(
        "compiled {} kernels from {} sources",
        entries.len(),
        kernels::SOURCES.len()
    );
}

/// `row_logprobs` holds at most `MAX_TOP` alternatives a row in shared memory: the kernel's
/// bound is the engine's (`MAX_TOP_LOGPROBS`, which `check_logprob_rows` enforces).
#[test]
fn the_logprobs_kernels_bound_is_the_engines() {
    use muser_engine::sampling::MAX_TOP_LOGPROBS;
    let (_, src) = kernels::SOURCES
        .iter()
        .find(|(n, _)| *n == "elementwise")
        .expect("the elementwise source is listed");
    let want = format!("#define MAX_TOP {MAX_TOP_LOGPROBS}\n");
    assert!(
        src.contains(&want),
        "elementwise.cu lacks `{}`",
        want.trim()
    );
}
