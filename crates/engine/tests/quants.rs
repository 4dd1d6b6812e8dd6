//! Dequantization is bit-identical to gguf-py's numpy reference (gguf.quants of llama.cpp
//! b11434) on random blocks of every supported format (data/quants, made by make_goldens.py:
//! random codes, scales from zero and subnormal to 1000, both signs).

use std::path::PathBuf;

use muser_engine::formats;
use muser_gguf::GgmlType;

fn data(name: &str) -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/quants")
        .join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn every_format_dequantizes_bit_for_bit_like_gguf_py() {
    for ty in formats::SUPPORTED {
        let name = ty.name().to_lowercase();
        let raw = data(&format!("{name}.bin"));
        let want: Vec<f32> = data(&format!("{name}.f32"))
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let (bl, bs) = ty.block_geometry();
        assert_eq!(raw.len() / bs * bl, want.len(), "{name}: golden sizes");
        // Whole rows of 256 values (what the engine dequantizes) and single blocks.
        let mut got = vec![0f32; want.len()];
        for (o, r) in got.chunks_mut(256).zip(raw.chunks(256 / bl * bs)) {
            formats::dequantize_row(ty, r, o);
        }
        let bad = got
            .iter()
            .zip(&want)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(
            bad,
            0,
            "{name}: {bad} of {} values differ from gguf-py",
            want.len()
        );
        if bl > 1 {
            let mut blk = vec![0f32; bl];
            for (i, b) in raw.chunks(bs).enumerate() {
                formats::dequantize_block(ty, b, &mut blk);
                assert!(
                    blk.iter()
                        .zip(&want[i * bl..(i + 1) * bl])
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{name} block {i}"
                );
            }
        }
        println!("{name}: {} values bit-identical to gguf-py", want.len());
    }
}

#[test]
fn q8_0_and_q4_0_goldens_are_not_trivial() {
    // The scales include zero, subnormal and large values, and both signs.
    let q = data("q4_k.f32");
    let v: Vec<f32> = q
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert!(
        v.iter().any(|x| *x > 100.0)
            && v.iter().any(|x| *x < -100.0)
            && v.iter().any(|x| *x == 0.0)
    );
    let _ = GgmlType::Q4_K;
}
