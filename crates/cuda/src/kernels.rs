//! Kernel sources, compiled by NVRTC at run time for the device's architecture and cached on
//! disk (one PTX per source file, keyed by a hash of the source, the architecture and the NVRTC
//! version), so one binary runs on any NVIDIA GPU and later starts skip the compiler.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction};
use cudarc::nvrtc::{CompileOptions, Ptx};
use muser_engine::{Error, Result};

const COMMON: &str = include_str!("../kernels/common.cuh");

/// (file, source): one NVRTC program each, with `common.cuh` prepended.
pub const SOURCES: &[(&str, &str)] = &[
    ("dequant", include_str!("../kernels/dequant.cu")),
    ("norm", include_str!("../kernels/norm.cu")),
    ("rope", include_str!("../kernels/rope.cu")),
    ("elementwise", include_str!("../kernels/elementwise.cu")),
    ("matvec", include_str!("../kernels/matvec.cu")),
    ("kv", include_str!("../kernels/kv.cu")),
    ("mmq", include_str!("../kernels/mmq.cu")),
    ("parity", include_str!("../kernels/parity.cu")),
    ("qmma", include_str!("../kernels/qmma.cu")),
];

/// The attention kernels, compiled per (query heads per KV head, head_dim) with `-DNREP -DHD`.
pub const ATTENTION: &str = include_str!("../kernels/attention.cu");

/// The full text NVRTC compiles for one source file.
pub fn program(src: &str) -> String {
    format!("{COMMON}\n{src}")
}

/// `sm_XY` for a compute capability (NVRTC's `--gpu-architecture`).
pub fn arch_for(cc: (i32, i32)) -> Result<&'static str> {
    Ok(match cc {
        (9, 0) => "sm_90",
        (8, 0) => "sm_80",
        (8, 6) => "sm_86",
        (8, 7) => "sm_87",
        (8, 9) => "sm_89",
        (10, 0) => "sm_100",
        (12, 0) => "sm_120",
        (a, b) => {
            return Err(Error::Backend(format!(
                "compute capability {a}.{b} is not supported (need 8.0 or newer)"
            )));
        }
    })
}

fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for p in parts {
        for &b in *p {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

fn cache_dir() -> Option<PathBuf> {
    if let Ok(d) = std::env::var("MUSER_KERNEL_CACHE") {
        return Some(PathBuf::from(d));
    }
    std::env::var("HOME")
        .ok()
        .map(|h| PathBuf::from(h).join(".cache/muser/kernels"))
}

/// Compile one source to PTX (no device needed: used by the CI compile check too).
pub fn compile(name: &str, src: &str, arch: &'static str) -> Result<String> {
    compile_with(name, src, arch, &[])
}

/// Definitions for every program from `MUSER_NVRTC_DEFINES` (space-separated `NAME=VALUE`),
/// for measuring a kernel variant without another build (e.g. `X_LOAD=2`, kernels/common.cuh).
pub fn env_defines() -> Vec<String> {
    std::env::var("MUSER_NVRTC_DEFINES")
        .map(|v| v.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default()
}

/// Compile with extra `-D` definitions.
pub fn compile_with(
    name: &str,
    src: &str,
    arch: &'static str,
    defines: &[String],
) -> Result<String> {
    let mut options = vec!["--std=c++17".to_string(), "-default-device".to_string()];
    options.extend(defines.iter().map(|d| format!("-D{d}")));
    options.extend(env_defines().into_iter().map(|d| format!("-D{d}")));
    let opts = CompileOptions {
        arch: Some(arch),
        options,
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(program(src), opts).map_err(|e| {
        Error::Backend(format!(
            "NVRTC failed on kernels/{name}.cu: {}",
            nvrtc_log(&e)
        ))
    })?;
    Ok(ptx.to_src())
}

fn nvrtc_log(e: &cudarc::nvrtc::CompileError) -> String {
    match e {
        cudarc::nvrtc::CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
        other => format!("{other:?}"),
    }
}

/// Where program `name` (`src` with `defines`, and `MUSER_NVRTC_DEFINES`) compiled for `arch`
/// by NVRTC `version` lies in the disk cache `dir`: its name carries a hash of all of these.
fn cache_path(
    dir: &std::path::Path,
    name: &str,
    src: &str,
    arch: &str,
    version: &str,
    defines: &[String],
) -> PathBuf {
    let defs = format!("{} {}", defines.join(" "), env_defines().join(" "));
    let key = fnv1a(&[
        COMMON.as_bytes(),
        src.as_bytes(),
        arch.as_bytes(),
        version.as_bytes(),
        defs.as_bytes(),
    ]);
    dir.join(format!("{name}-{arch}-{key:016x}.ptx"))
}

/// Compile programs (name, source, defines) for `arch` into the disk cache `dir`, as `load`
/// would write them: a cache made without a GPU (the NVRTC from PyPI), for a machine whose
/// NVRTC has the same version to read instead of compiling. Returns the files written.
pub fn write_cache(
    dir: &std::path::Path,
    arch: &'static str,
    programs: &[(String, &str, Vec<String>)],
) -> Result<Vec<PathBuf>> {
    // SAFETY: this only tries to dlopen the library by name (cudarc panics on a missing one).
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(Error::Backend(
            "NVRTC (libnvrtc.so.13) is not on the library path".into(),
        ));
    }
    let version = nvrtc_version();
    std::fs::create_dir_all(dir).map_err(|e| Error::Backend(format!("{}: {e}", dir.display())))?;
    let mut written = Vec::new();
    for (name, src, defines) in programs {
        let path = cache_path(dir, name, src, arch, &version, defines);
        let ptx = compile_with(name, src, arch, defines)?;
        std::fs::write(&path, ptx)
            .map_err(|e| Error::Backend(format!("{}: {e}", path.display())))?;
        written.push(path);
    }
    Ok(written)
}

/// The base programs (every source but the attention's): `load_all`'s list.
pub fn base_programs() -> Vec<(String, &'static str, Vec<String>)> {
    SOURCES
        .iter()
        .map(|&(name, src)| (name.to_string(), src, Vec::new()))
        .collect()
}

/// The attention program for `nrep` query heads per KV head and head size `hd`:
/// `load_attention`'s.
pub fn attention_program(nrep: usize, hd: usize) -> (String, &'static str, Vec<String>) {
    (
        format!("attention-{nrep}x{hd}"),
        ATTENTION,
        vec![format!("ATTN_NREP={nrep}"), format!("ATTN_HD={hd}")],
    )
}

/// Compile (or read from the disk cache) every base source and load its kernels into `ctx`.
pub fn load_all(
    ctx: &Arc<CudaContext>,
    arch: &'static str,
) -> Result<HashMap<String, CudaFunction>> {
    load(ctx, arch, &base_programs())
}

/// The attention kernels for `nrep` query heads per KV head and head size `hd`.
pub fn load_attention(
    ctx: &Arc<CudaContext>,
    arch: &'static str,
    nrep: usize,
    hd: usize,
) -> Result<HashMap<String, CudaFunction>> {
    load(ctx, arch, &[attention_program(nrep, hd)])
}

/// Compile (in parallel, or read from the disk cache) and load programs (name, source, defines).
pub fn load(
    ctx: &Arc<CudaContext>,
    arch: &'static str,
    programs: &[(String, &str, Vec<String>)],
) -> Result<HashMap<String, CudaFunction>> {
    let version = nvrtc_version();
    let dir = cache_dir();
    let ptxs: Vec<Result<(String, String)>> = std::thread::scope(|s| {
        let handles: Vec<_> = programs
            .iter()
            .map(|(name, src, defines)| {
                let dir = dir.clone();
                let version = version.clone();
                s.spawn(move || -> Result<(String, String)> {
                    let path = dir
                        .as_ref()
                        .map(|d| cache_path(d, name, src, arch, &version, defines));
                    if let Some(p) = &path {
                        if let Ok(text) = std::fs::read_to_string(p) {
                            return Ok((name.to_string(), text));
                        }
                    }
                    let ptx = compile_with(name, src, arch, defines)?;
                    if let Some(p) = &path {
                        if let Some(parent) = p.parent() {
                            let _ = std::fs::create_dir_all(parent);
                        }
                        let _ = std::fs::write(p, &ptx);
                    }
                    Ok((name.to_string(), ptx))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(Error::Backend("kernel compile thread panicked".into()))
                })
            })
            .collect()
    });
    let mut funcs = HashMap::new();
    for r in ptxs {
        let (name, ptx) = r?;
        let module = ctx
            .load_module(Ptx::from_src(ptx.clone()))
            .map_err(|e| Error::Backend(format!("loading kernels/{name}.cu: {e:?}")))?;
        for entry in entry_points(&ptx) {
            let f = module
                .load_function(&entry)
                .map_err(|e| Error::Backend(format!("kernel {entry} in {name}.cu: {e:?}")))?;
            if let Some(pct) = carveout() {
                f.set_attribute(
                    cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                    pct,
                )
                .map_err(|e| Error::Backend(format!("carveout of {entry}: {e:?}")))?;
            }
            funcs.insert(entry, f);
        }
    }
    Ok(funcs)
}

/// `MUSER_CARVEOUT` (0..=100, for measurements): every kernel's preferred share of the SM's
/// unified L1 for shared memory. Kernels whose shares differ cannot share an SM, so a kernel
/// launched early (programmatically) waits for the SM to drain and be reconfigured.
fn carveout() -> Option<i32> {
    std::env::var("MUSER_CARVEOUT")
        .ok()
        .and_then(|v| v.parse::<i32>().ok())
        .filter(|v| (0..=100).contains(v))
}

/// NVRTC's version, part of the cache key.
pub fn nvrtc_version() -> String {
    let (mut major, mut minor) = (0i32, 0i32);
    // SAFETY: nvrtcVersion writes two ints through valid pointers; callers first checked that
    // the NVRTC library is present (device::check), so the symbol loads.
    let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    let _ = r;
    format!("{major}.{minor}")
}

/// Names of the `.entry` functions of a PTX text.
pub fn entry_points(ptx: &str) -> Vec<String> {
    ptx.lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let rest = l
                .strip_prefix(".visible .entry ")
                .or_else(|| l.strip_prefix(".entry "))?;
            Some(
                rest.split(|c: char| c == '(' || c.is_whitespace())
                    .next()?
                    .to_string(),
            )
        })
        .collect()
}
