//! Shared by the `ggml_*` tests: the golden manifest written by tools/ggml-golden and the input
//! generator that tool uses, re-implemented bit for bit.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::PathBuf;

use muser_gguf::GgmlType;

pub struct Case {
    pub name: String,
    pub op: String,
    pub kv: HashMap<String, String>,
    pub out: Vec<u8>,
}

impl Case {
    pub fn get(&self, k: &str) -> &str {
        self.kv
            .get(k)
            .unwrap_or_else(|| panic!("case {}: no key {k}", self.name))
    }
    pub fn usize(&self, k: &str) -> usize {
        self.get(k).parse().unwrap()
    }
    pub fn i64(&self, k: &str) -> i64 {
        self.get(k).parse().unwrap()
    }
    pub fn u64(&self, k: &str) -> u64 {
        self.get(k).parse().unwrap()
    }
    pub fn f32_bits(&self, k: &str) -> f32 {
        f32::from_bits(u32::from_str_radix(self.get(k), 16).unwrap())
    }
    pub fn ty(&self, k: &str) -> GgmlType {
        GgmlType::from_name(self.get(k)).unwrap_or_else(|| panic!("unknown type {}", self.get(k)))
    }
    pub fn out_f32(&self) -> Vec<f32> {
        self.out
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }
}

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/ggml")
}

/// All cases of the manifest whose op is `op`.
pub fn cases(op: &str) -> Vec<Case> {
    let dir = data_dir();
    let manifest =
        std::fs::read_to_string(dir.join("manifest.txt")).expect("tests/data/ggml/manifest.txt");
    let blob = std::fs::read(dir.join("goldens.bin")).expect("tests/data/ggml/goldens.bin");
    let mut res = Vec::new();
    for line in manifest.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let mut it = line.split_whitespace();
        let name = it.next().unwrap().to_string();
        let o = it.next().unwrap().to_string();
        if o != op {
            continue;
        }
        let kv: HashMap<String, String> = it
            .map(|p| {
                let (k, v) = p.split_once('=').unwrap();
                (k.to_string(), v.to_string())
            })
            .collect();
        let off: usize = kv["off"].parse().unwrap();
        let len: usize = kv["len"].parse().unwrap();
        res.push(Case {
            name,
            op: o,
            out: blob[off..off + len].to_vec(),
            kv,
        });
    }
    assert!(!res.is_empty(), "no golden cases for op {op}");
    res
}

/// splitmix64, as in tools/ggml-golden/golden.cpp
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn unif(&mut self) -> f32 {
        (self.next() >> 40) as f32 * (1.0f32 / 16_777_216.0) * 2.0 - 1.0
    }
    pub fn act(&mut self) -> f32 {
        let u = self.unif();
        let k = self.next() & 31;
        let amp = if k == 0 {
            8.0f32
        } else if k < 8 {
            2.0
        } else {
            0.5
        };
        u * amp
    }
    pub fn acts(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.act()).collect()
    }
    fn f16_bits(&mut self, e: u16) -> u16 {
        (e << 10) | (self.next() & 0x3FF) as u16
    }

    /// `gen_weights` of golden.cpp
    pub fn weights(&mut self, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
        let rs = ty.row_bytes(cols as u64).unwrap() as usize;
        let mut w = vec![0u8; rs * rows];
        match ty {
            GgmlType::F32 => {
                for c in w.chunks_exact_mut(4) {
                    c.copy_from_slice(&self.act().to_le_bytes());
                }
            }
            GgmlType::F16 => {
                for c in w.chunks_exact_mut(2) {
                    let s = (self.next() & 1) as u16;
                    let e = 11 + (self.next() % 5) as u16;
                    let m = (self.next() & 0x3FF) as u16;
                    c.copy_from_slice(&((s << 15) | (e << 10) | m).to_le_bytes());
                }
            }
            GgmlType::BF16 => {
                for c in w.chunks_exact_mut(2) {
                    let s = (self.next() & 1) as u16;
                    let e = 119 + (self.next() % 8) as u16;
                    let m = (self.next() & 0x7F) as u16;
                    c.copy_from_slice(&((s << 15) | (e << 7) | m).to_le_bytes());
                }
            }
            _ => {
                for b in w.iter_mut() {
                    *b = (self.next() & 0xFF) as u8;
                }
                let bs = ty.type_size();
                for b in w.chunks_exact_mut(bs) {
                    match ty {
                        GgmlType::Q8_0 => {
                            let d = self.f16_bits(7);
                            b[0..2].copy_from_slice(&d.to_le_bytes());
                            for q in &mut b[2..34] {
                                if *q == 0x80 {
                                    *q = 0x81;
                                }
                            }
                        }
                        GgmlType::Q4_0 => {
                            let d = self.f16_bits(7);
                            b[0..2].copy_from_slice(&d.to_le_bytes());
                        }
                        GgmlType::Q4_K | GgmlType::Q5_K => {
                            let d = self.f16_bits(6);
                            b[0..2].copy_from_slice(&d.to_le_bytes());
                            let m = self.f16_bits(6);
                            b[2..4].copy_from_slice(&m.to_le_bytes());
                        }
                        GgmlType::Q6_K => {
                            let d = self.f16_bits(6);
                            b[208..210].copy_from_slice(&d.to_le_bytes());
                        }
                        _ => panic!("weights: unsupported {ty}"),
                    }
                }
            }
        }
        w
    }
}

/// Compare f32 outputs bit for bit; on mismatch report the count, the first few and the max ulp.
pub fn assert_bits_eq(name: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{name}: length");
    let mut bad = 0;
    let mut max_ulp = 0i64;
    let mut first = Vec::new();
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        if g.to_bits() != w.to_bits() {
            bad += 1;
            let u = (g.to_bits() as i32 as i64 - w.to_bits() as i32 as i64).abs();
            max_ulp = max_ulp.max(u);
            if first.len() < 5 {
                first.push(format!(
                    "[{i}] got {g:e} ({:08x}) want {w:e} ({:08x})",
                    g.to_bits(),
                    w.to_bits()
                ));
            }
        }
    }
    assert!(
        bad == 0,
        "{name}: {bad}/{} values differ (max {max_ulp} ulp): {}",
        got.len(),
        first.join("; ")
    );
}
