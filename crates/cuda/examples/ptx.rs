//! Writes every kernel source's PTX for sm_90 (and the attention variants of the 30B and the
//! fixture families) into a folder, for `ptxas -v` (registers, spills, shared memory) without a
//! GPU: `cargo run --release -p muser-cuda --example ptx -- DIR`, then
//! `ptxas -arch=sm_90 -v DIR/attention_16_128.ptx -o /dev/null` (ptxas from PyPI's
//! nvidia-cuda-nvcc). Needs NVRTC (libnvrtc.so.13) on the library path.

use muser_cuda::kernels;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args()
        .nth(1)
        .ok_or("usage: ptx DIR (the folder the .ptx files go to)")?;
    std::fs::create_dir_all(&dir)?;
    for (name, src) in kernels::SOURCES {
        let ptx = kernels::compile(name, src, "sm_90")?;
        std::fs::write(format!("{dir}/{name}.ptx"), ptx)?;
    }
    for (nrep, hd) in [(16, 128), (4, 64), (2, 128)] {
        let defs = [format!("ATTN_NREP={nrep}"), format!("ATTN_HD={hd}")];
        let ptx = kernels::compile_with("attention", kernels::ATTENTION, "sm_90", &defs)?;
        std::fs::write(format!("{dir}/attention_{nrep}_{hd}.ptx"), ptx)?;
    }
    println!("PTX written to {dir}");
    Ok(())
}
