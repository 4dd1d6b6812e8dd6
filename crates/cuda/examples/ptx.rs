//! Writes every kernel source's PTX for sm_90 (and the attention variants of the 30B and the
//! fixture families) into a folder, for `ptxas -v` (registers, spills, shared memory) without a
//! GPU: `cargo run --release -p muser-cuda --example ptx -- DIR`, then
//! `ptxas -arch=sm_90 -v DIR/attention_16_128.ptx -o /dev/null` (ptxas from PyPI's
//! nvidia-cuda-nvcc). Needs NVRTC (libnvrtc.so.13) on the library path.
//!
//! `ptx --cache DIR` writes the same programs as the kernel disk cache names them
//! (`MUSER_KERNEL_CACHE`): a machine whose NVRTC has this one's version then reads them
//! instead of compiling (scripts/h200-env.sh takes `carry/kernels`).

use muser_cuda::kernels;

const ATTENTION_SHAPES: [(usize, usize); 3] = [(16, 128), (4, 64), (2, 128)];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let first = args
        .next()
        .ok_or("usage: ptx DIR | ptx --cache DIR (the folder the .ptx files go to)")?;
    if first == "--cache" {
        let dir = args.next().ok_or("usage: ptx --cache DIR")?;
        let mut programs = kernels::base_programs();
        programs.extend(
            ATTENTION_SHAPES
                .iter()
                .map(|&(nrep, hd)| kernels::attention_program(nrep, hd)),
        );
        let written = kernels::write_cache(std::path::Path::new(&dir), "sm_90", &programs)?;
        println!(
            "{} programs in the kernel cache {dir} (NVRTC {})",
            written.len(),
            kernels::nvrtc_version()
        );
        return Ok(());
    }
    let dir = first;
    std::fs::create_dir_all(&dir)?;
    for (name, src) in kernels::SOURCES {
        let ptx = kernels::compile(name, src, "sm_90")?;
        std::fs::write(format!("{dir}/{name}.ptx"), ptx)?;
    }
    for (nrep, hd) in ATTENTION_SHAPES {
        let defs = [format!("ATTN_NREP={nrep}"), format!("ATTN_HD={hd}")];
        let ptx = kernels::compile_with("attention", kernels::ATTENTION, "sm_90", &defs)?;
        std::fs::write(format!("{dir}/attention_{nrep}_{hd}.ptx"), ptx)?;
    }
    println!("PTX written to {dir}");
    Ok(())
}
