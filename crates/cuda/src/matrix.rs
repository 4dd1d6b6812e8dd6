//! Weight matrices on the device, in the layouts the kernels read (kernels/common.cuh):
//! F32/F16/BF16 and the 16-byte-aligned Q4_K (144 B) and Q5_K (176 B) blocks as in the file;
//! Q8_0, Q4_0 and Q6_K, whose blocks (34, 18, 210 B) break 16-byte alignment, split into one
//! array per block field so every load is aligned and no byte is padded.

use muser_gguf::GgmlType;

/// Format codes shared with the kernels (`FMT_*` in common.cuh).
pub fn fmt_code(ty: GgmlType) -> Option<i32> {
    Some(match ty {
        GgmlType::F32 => 0,
        GgmlType::F16 => 1,
        GgmlType::BF16 => 2,
        GgmlType::Q8_0 => 3,
        GgmlType::Q4_0 => 4,
        GgmlType::Q4_K => 5,
        GgmlType::Q5_K => 6,
        GgmlType::Q6_K => 7,
        _ => return None,
    })
}

/// Total block count of a matrix (elements / block size): the SoA arrays' stride.
pub fn n_blocks(ty: GgmlType, rows: usize, cols: usize) -> usize {
    rows * (cols / ty.block_size())
}

/// Rearrange a matrix's file bytes into the device layout.
pub fn device_layout(ty: GgmlType, bytes: &[u8]) -> Vec<u8> {
    let (_, bs) = ty.block_geometry();
    let nb = bytes.len() / bs;
    // (offset, length) of each field of a block, in the order the arrays are laid out.
    let fields: &[(usize, usize)] = match ty {
        GgmlType::Q8_0 => &[(2, 32), (0, 2)],
        GgmlType::Q4_0 => &[(2, 16), (0, 2)],
        GgmlType::Q6_K => &[(0, 128), (128, 64), (192, 16), (208, 2)],
        _ => return bytes.to_vec(),
    };
    let mut out = vec![0u8; bytes.len()];
    let mut base = 0;
    for &(off, len) in fields {
        for (b, blk) in bytes.chunks_exact(bs).enumerate() {
            out[base + b * len..base + (b + 1) * len].copy_from_slice(&blk[off..off + len]);
        }
        base += nb * len;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn soa_layout_moves_every_byte_once() {
        // Two Q6_K blocks with distinct bytes: ql, qh, scales, d of block 0 then block 1.
        let bytes: Vec<u8> = (0..420u32).map(|i| (i % 251) as u8).collect();
        let out = device_layout(GgmlType::Q6_K, &bytes);
        assert_eq!(out.len(), 420);
        assert_eq!(&out[0..128], &bytes[0..128]);
        assert_eq!(&out[128..256], &bytes[210..338]);
        assert_eq!(&out[256..320], &bytes[128..192]);
        assert_eq!(&out[320..384], &bytes[338..402]);
        assert_eq!(&out[384..400], &bytes[192..208]);
        assert_eq!(&out[400..416], &bytes[402..418]);
        assert_eq!(&out[416..418], &bytes[208..210]);
        assert_eq!(&out[418..420], &bytes[418..420]);
        let mut sorted_in = bytes.clone();
        let mut sorted_out = out.clone();
        sorted_in.sort();
        sorted_out.sort();
        assert_eq!(sorted_in, sorted_out);
        assert_eq!(
            device_layout(GgmlType::Q4_K, &bytes[..144]),
            bytes[..144].to_vec()
        );
    }
}
