//! ggml tensor types and their block geometry.
//!
//! The table mirrors `GGML_QUANT_SIZES` in gguf-py (`gguf/constants.py`) and `type_traits`
//! in `ggml/src/ggml.c` of llama.cpp b11434. The reader needs the geometry of every type
//! to bound-check tensor data, even for types the engine cannot compute with.

use std::fmt;

/// A ggml tensor element type, by its on-disk id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
    NVFP4,
    Q1_0,
    Q2_0,
}

/// Super-block size of the K-quants (`QK_K` in ggml-common.h).
pub const QK_K: usize = 256;

impl GgmlType {
    /// Every type, for iteration in tests and tables.
    pub const ALL: [GgmlType; 35] = [
        Self::F32,
        Self::F16,
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q8_0,
        Self::Q8_1,
        Self::Q2_K,
        Self::Q3_K,
        Self::Q4_K,
        Self::Q5_K,
        Self::Q6_K,
        Self::Q8_K,
        Self::IQ2_XXS,
        Self::IQ2_XS,
        Self::IQ3_XXS,
        Self::IQ1_S,
        Self::IQ4_NL,
        Self::IQ3_S,
        Self::IQ2_S,
        Self::IQ4_XS,
        Self::I8,
        Self::I16,
        Self::I32,
        Self::I64,
        Self::F64,
        Self::IQ1_M,
        Self::BF16,
        Self::TQ1_0,
        Self::TQ2_0,
        Self::MXFP4,
        Self::NVFP4,
        Self::Q1_0,
        Self::Q2_0,
    ];

    /// The on-disk type id (`enum ggml_type`).
    pub const fn id(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q4_0 => 2,
            Self::Q4_1 => 3,
            Self::Q5_0 => 6,
            Self::Q5_1 => 7,
            Self::Q8_0 => 8,
            Self::Q8_1 => 9,
            Self::Q2_K => 10,
            Self::Q3_K => 11,
            Self::Q4_K => 12,
            Self::Q5_K => 13,
            Self::Q6_K => 14,
            Self::Q8_K => 15,
            Self::IQ2_XXS => 16,
            Self::IQ2_XS => 17,
            Self::IQ3_XXS => 18,
            Self::IQ1_S => 19,
            Self::IQ4_NL => 20,
            Self::IQ3_S => 21,
            Self::IQ2_S => 22,
            Self::IQ4_XS => 23,
            Self::I8 => 24,
            Self::I16 => 25,
            Self::I32 => 26,
            Self::I64 => 27,
            Self::F64 => 28,
            Self::IQ1_M => 29,
            Self::BF16 => 30,
            Self::TQ1_0 => 34,
            Self::TQ2_0 => 35,
            Self::MXFP4 => 39,
            Self::NVFP4 => 40,
            Self::Q1_0 => 41,
            Self::Q2_0 => 42,
        }
    }

    /// The type with on-disk id `id`, or `None` for ids ggml b11434 does not define
    /// (including the removed 4, 5, 31-33 and 36-38).
    pub fn from_id(id: u32) -> Option<Self> {
        Self::ALL.iter().copied().find(|t| t.id() == id)
    }

    /// (elements per block, bytes per block), as `GGML_QUANT_SIZES`.
    pub const fn block_geometry(self) -> (usize, usize) {
        match self {
            Self::F32 => (1, 4),
            Self::F16 => (1, 2),
            Self::Q4_0 => (32, 2 + 16),
            Self::Q4_1 => (32, 2 + 2 + 16),
            Self::Q5_0 => (32, 2 + 4 + 16),
            Self::Q5_1 => (32, 2 + 2 + 4 + 16),
            Self::Q8_0 => (32, 2 + 32),
            Self::Q8_1 => (32, 2 + 2 + 32),
            Self::Q2_K => (QK_K, 2 + 2 + QK_K / 16 + QK_K / 4),
            Self::Q3_K => (QK_K, 2 + QK_K / 4 + QK_K / 8 + 12),
            Self::Q4_K => (QK_K, 2 + 2 + QK_K / 2 + 12),
            Self::Q5_K => (QK_K, 2 + 2 + QK_K / 2 + QK_K / 8 + 12),
            Self::Q6_K => (QK_K, 2 + QK_K / 2 + QK_K / 4 + QK_K / 16),
            Self::Q8_K => (QK_K, 4 + QK_K + QK_K / 8),
            Self::IQ2_XXS => (QK_K, 2 + QK_K / 4),
            Self::IQ2_XS => (QK_K, 2 + QK_K / 4 + QK_K / 32),
            Self::IQ3_XXS => (QK_K, 2 + QK_K / 4 + QK_K / 8),
            Self::IQ1_S => (QK_K, 2 + QK_K / 8 + QK_K / 16),
            Self::IQ4_NL => (32, 2 + 16),
            Self::IQ3_S => (QK_K, 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4),
            Self::IQ2_S => (QK_K, 2 + QK_K / 4 + QK_K / 16),
            Self::IQ4_XS => (QK_K, 2 + 2 + QK_K / 2 + QK_K / 64),
            Self::I8 => (1, 1),
            Self::I16 => (1, 2),
            Self::I32 => (1, 4),
            Self::I64 => (1, 8),
            Self::F64 => (1, 8),
            Self::IQ1_M => (QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32),
            Self::BF16 => (1, 2),
            Self::TQ1_0 => (QK_K, 2 + 4 * 13),
            Self::TQ2_0 => (QK_K, 2 + 64),
            Self::MXFP4 => (32, 1 + 16),
            Self::NVFP4 => (64, 4 + 32),
            Self::Q1_0 => (128, 2 + 16),
            Self::Q2_0 => (64, 2 + 16),
        }
    }

    pub const fn block_size(self) -> usize {
        self.block_geometry().0
    }

    pub const fn type_size(self) -> usize {
        self.block_geometry().1
    }

    /// Bytes of one row of `n` elements, or `None` when `n` is not a whole number of
    /// blocks or the size overflows.
    pub fn row_bytes(self, n: u64) -> Option<u64> {
        let (blck, bytes) = self.block_geometry();
        if !n.is_multiple_of(blck as u64) {
            return None;
        }
        (n / blck as u64).checked_mul(bytes as u64)
    }

    /// The name ggml prints (`ggml_type_name`).
    pub const fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::Q4_0 => "q4_0",
            Self::Q4_1 => "q4_1",
            Self::Q5_0 => "q5_0",
            Self::Q5_1 => "q5_1",
            Self::Q8_0 => "q8_0",
            Self::Q8_1 => "q8_1",
            Self::Q2_K => "q2_K",
            Self::Q3_K => "q3_K",
            Self::Q4_K => "q4_K",
            Self::Q5_K => "q5_K",
            Self::Q6_K => "q6_K",
            Self::Q8_K => "q8_K",
            Self::IQ2_XXS => "iq2_xxs",
            Self::IQ2_XS => "iq2_xs",
            Self::IQ3_XXS => "iq3_xxs",
            Self::IQ1_S => "iq1_s",
            Self::IQ4_NL => "iq4_nl",
            Self::IQ3_S => "iq3_s",
            Self::IQ2_S => "iq2_s",
            Self::IQ4_XS => "iq4_xs",
            Self::I8 => "i8",
            Self::I16 => "i16",
            Self::I32 => "i32",
            Self::I64 => "i64",
            Self::F64 => "f64",
            Self::IQ1_M => "iq1_m",
            Self::BF16 => "bf16",
            Self::TQ1_0 => "tq1_0",
            Self::TQ2_0 => "tq2_0",
            Self::MXFP4 => "mxfp4",
            Self::NVFP4 => "nvfp4",
            Self::Q1_0 => "q1_0",
            Self::Q2_0 => "q2_0",
        }
    }

    /// Parse a ggml type name, case-insensitively (`q4_k`, `Q4_K`, `bf16`, ...).
    pub fn from_name(s: &str) -> Option<Self> {
        Self::ALL
            .iter()
            .copied()
            .find(|t| t.name().eq_ignore_ascii_case(s))
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_are_unique() {
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
            assert_eq!(GgmlType::from_name(t.name()), Some(t));
        }
        for removed in [4, 5, 31, 32, 33, 36, 37, 38, 43, u32::MAX] {
            assert_eq!(GgmlType::from_id(removed), None);
        }
    }

    #[test]
    fn k_quant_block_bytes_match_ggml_common() {
        // sizeof(block_q4_K) = 144, block_q5_K = 176, block_q6_K = 210, block_q8_0 = 34 (ggml-common.h)
        assert_eq!(GgmlType::Q4_K.type_size(), 144);
        assert_eq!(GgmlType::Q5_K.type_size(), 176);
        assert_eq!(GgmlType::Q6_K.type_size(), 210);
        assert_eq!(GgmlType::Q8_0.type_size(), 34);
        assert_eq!(GgmlType::Q4_0.type_size(), 18);
        assert_eq!(GgmlType::Q8_K.type_size(), 292);
        assert_eq!(GgmlType::Q4_K.row_bytes(512), Some(288));
        assert_eq!(GgmlType::Q4_K.row_bytes(100), None);
    }
}
