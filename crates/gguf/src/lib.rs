//! GGUF (versions 2 and 3): a bounds-checked, memory-mapped reader and a streaming writer.
//!
//! Every count, length and offset in a file is checked against the bytes present before it
//! is used, so a truncated, lying or hostile file yields a [`GgufError`] naming the problem,
//! never a panic, an out-of-bounds read or an allocation larger than the file. Counts are
//! capped too ([`MAX_ENTRIES`] keys and tensors, [`MAX_ARRAY_STRINGS`] strings in arrays), so
//! many tiny entries cannot make the parsed header many times the file's size.

mod reader;
pub mod split;
mod types;
mod value;
mod writer;

pub use reader::{
    DEFAULT_ALIGNMENT, GGUF_MAGIC, Gguf, MAX_ARRAY_STRINGS, MAX_DIMS, MAX_ENTRIES, TensorInfo,
};
pub use types::{GgmlType, QK_K};
pub use value::{Array, Value, ValueType};
pub use writer::GgufWriter;

/// Why a GGUF file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{0}")]
    Io(String),
    #[error("invalid GGUF: {0}")]
    Format(String),
}

pub type Result<T> = std::result::Result<T, GgufError>;

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> GgufWriter {
        let mut w = GgufWriter::new();
        w.add_str("general.architecture", "muse-glimmer").unwrap();
        w.add("muse-glimmer.block_count", Value::U32(2)).unwrap();
        w.add(
            "muse-glimmer.attention.layer_norm_rms_epsilon",
            Value::F32(1e-5),
        )
        .unwrap();
        w.add("some.u8", Value::U8(7)).unwrap();
        w.add("some.i8", Value::I8(-7)).unwrap();
        w.add("some.u16", Value::U16(700)).unwrap();
        w.add("some.i16", Value::I16(-700)).unwrap();
        w.add("some.i32", Value::I32(-70000)).unwrap();
        w.add("some.u64", Value::U64(1 << 40)).unwrap();
        w.add("some.i64", Value::I64(-(1 << 40))).unwrap();
        w.add("some.f64", Value::F64(0.1)).unwrap();
        w.add("some.bool", Value::Bool(true)).unwrap();
        w.add_array(
            "tokens",
            Array::String(vec!["a".into(), "é".into(), "".into(), "<|eot|>".into()]),
        )
        .unwrap();
        w.add_array("pattern", Array::Bool(vec![true, false, true]))
            .unwrap();
        w.add_array("scores", Array::F32(vec![0.5, -1.0])).unwrap();
        w.add_array("types", Array::I32(vec![1, 3])).unwrap();
        w.add_array("u8s", Array::U8(vec![1, 2, 3])).unwrap();
        w.add_f32_tensor("a.weight", &[4, 2], &[1., 2., 3., 4., 5., 6., 7., 8.])
            .unwrap();
        w.add_tensor("b.weight", &[32], GgmlType::Q8_0, vec![9u8; 34])
            .unwrap();
        w.add_f32_tensor("c.weight", &[3], &[-1.0, 0.0, 1.0])
            .unwrap();
        w
    }

    #[test]
    fn round_trip_every_type() {
        let w = sample();
        let bytes = w.to_bytes().unwrap();
        let g = Gguf::from_bytes(bytes).unwrap();
        assert_eq!(g.version, 3);
        assert_eq!(
            g.get("general.architecture").and_then(Value::as_str),
            Some("muse-glimmer")
        );
        assert_eq!(g.get("muse-glimmer.block_count"), Some(&Value::U32(2)));
        assert_eq!(g.get("some.i64"), Some(&Value::I64(-(1 << 40))));
        assert_eq!(g.get("some.f64"), Some(&Value::F64(0.1)));
        assert_eq!(
            g.get("tokens"),
            Some(&Value::Array(Array::String(vec![
                "a".into(),
                "é".into(),
                "".into(),
                "<|eot|>".into()
            ])))
        );
        assert_eq!(
            g.get("pattern"),
            Some(&Value::Array(Array::Bool(vec![true, false, true])))
        );
        assert_eq!(g.metadata().len(), 17);
        assert_eq!(g.tensors().len(), 3);
        let a = g.tensor("a.weight").unwrap();
        assert_eq!(a.dims, vec![4, 2]);
        assert_eq!(a.ggml_type, GgmlType::F32);
        let data = g.tensor_data(a);
        assert_eq!(data.len(), 32);
        assert_eq!(f32::from_le_bytes(data[28..32].try_into().unwrap()), 8.0);
        let b = g.tensor("b.weight").unwrap();
        assert_eq!(b.offset, 32);
        assert_eq!(g.tensor_data(b), &[9u8; 34][..]);
        let c = g.tensor("c.weight").unwrap();
        assert_eq!(c.offset, 96);
        assert_eq!(g.data_offset % 32, 0);
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        let bytes = sample().to_bytes().unwrap();
        // The trailing padding after the last tensor is optional (llama.cpp's mmap loader
        // does not need it either); every byte before the end of the last tensor is needed.
        let g = Gguf::from_bytes(bytes.clone()).unwrap();
        let last = g.tensors().last().unwrap();
        let end = (g.data_offset + last.offset + last.n_bytes) as usize;
        assert!(Gguf::from_bytes(bytes[..end].to_vec()).is_ok());
        for n in 0..end {
            let r = Gguf::from_bytes(bytes[..n].to_vec());
            assert!(
                r.is_err(),
                "truncation to {n} of {} bytes was accepted",
                bytes.len()
            );
        }
    }

    #[test]
    fn every_single_byte_corruption_is_handled() {
        // Flip each header byte: the reader must return Ok or Err, never panic.
        let bytes = sample().to_bytes().unwrap();
        let g = Gguf::from_bytes(bytes.clone()).unwrap();
        for i in 0..g.data_offset as usize {
            for x in [0x00u8, 0xff, 0x80, 0x01] {
                let mut b = bytes.clone();
                b[i] ^= x.max(1);
                let _ = Gguf::from_bytes(b);
            }
        }
    }

    fn header(version: u32, n_tensors: u64, n_kv: u64) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(b"GGUF");
        v.extend_from_slice(&version.to_le_bytes());
        v.extend_from_slice(&n_tensors.to_le_bytes());
        v.extend_from_slice(&n_kv.to_le_bytes());
        v
    }

    fn err(bytes: Vec<u8>) -> String {
        Gguf::from_bytes(bytes).unwrap_err().to_string()
    }

    #[test]
    fn hostile_headers_name_the_problem() {
        assert!(err(b"GGML\x03\0\0\0".to_vec()).contains("not a GGUF file"));
        assert!(err(header(1, 0, 0)).contains("version 1"));
        assert!(err(header(0x0300_0000, 0, 0)).contains("big-endian"));
        assert!(err(header(7, 0, 0)).contains("unsupported GGUF version 7"));
        assert!(err(header(3, 0, u64::MAX)).contains("metadata entries"));
        assert!(err(header(3, u64::MAX, 0)).contains("tensors"));

        // A string length far past the end of the file.
        let mut b = header(3, 0, 1);
        b.extend_from_slice(&(1u64 << 60).to_le_bytes());
        b.extend_from_slice(&[0u8; 32]);
        assert!(err(b).contains("claims a string"));

        // An array count that cannot fit.
        let mut b = header(3, 0, 1);
        b.extend_from_slice(&3u64.to_le_bytes());
        b.extend_from_slice(b"arr");
        b.extend_from_slice(&9u32.to_le_bytes());
        b.extend_from_slice(&8u32.to_le_bytes());
        b.extend_from_slice(&(1u64 << 59).to_le_bytes());
        b.extend_from_slice(&[0u8; 16]);
        assert!(err(b).contains("array 'arr' claims"));

        // An unknown value type.
        let mut b = header(3, 0, 1);
        b.extend_from_slice(&1u64.to_le_bytes());
        b.extend_from_slice(b"k");
        b.extend_from_slice(&99u32.to_le_bytes());
        b.extend_from_slice(&[0u8; 16]);
        assert!(err(b).contains("unknown value type 99"));
    }

    fn with_tensor(dims: &[u64], ty: u32, offset: u64, data_len: usize) -> Vec<u8> {
        let mut b = header(3, 1, 0);
        b.extend_from_slice(&1u64.to_le_bytes());
        b.extend_from_slice(b"t");
        b.extend_from_slice(&(dims.len() as u32).to_le_bytes());
        for d in dims {
            b.extend_from_slice(&d.to_le_bytes());
        }
        b.extend_from_slice(&ty.to_le_bytes());
        b.extend_from_slice(&offset.to_le_bytes());
        while b.len() % 32 != 0 {
            b.push(0);
        }
        b.extend(std::iter::repeat_n(0u8, data_len));
        b
    }

    #[test]
    fn hostile_tensor_infos_name_the_problem() {
        assert!(Gguf::from_bytes(with_tensor(&[8], 0, 0, 32)).is_ok());
        assert!(err(with_tensor(&[8], 0, 0, 31)).contains("truncated"));
        assert!(err(with_tensor(&[8], 0, 32, 64)).contains("offset 32, expected 0"));
        assert!(err(with_tensor(&[8], 77, 0, 32)).contains("unknown ggml type id 77"));
        assert!(err(with_tensor(&[33], 8, 0, 64)).contains("not a multiple"));
        assert!(err(with_tensor(&[1 << 32, 1 << 32, 1 << 32], 0, 0, 32)).contains("overflows"));
        assert!(err(with_tensor(&[u64::MAX], 0, 0, 32)).contains("negative"));
        assert!(err(with_tensor(&[1, 1, 1, 1, 1], 0, 0, 32)).contains("5 dimensions"));
        assert!(err(with_tensor(&[1 << 40], 0, 0, 32)).contains("truncated"));
    }

    #[test]
    fn duplicates_and_bad_alignment_are_refused() {
        let mut w = GgufWriter::new();
        w.add("general.alignment", Value::U32(48)).unwrap();
        assert!(err(w.to_bytes().unwrap()).contains("power of two"));
        let mut w = GgufWriter::new();
        w.add("general.alignment", Value::U64(32)).unwrap();
        assert!(err(w.to_bytes().unwrap()).contains("expected u32"));

        let mut b = header(3, 0, 2);
        for _ in 0..2 {
            b.extend_from_slice(&1u64.to_le_bytes());
            b.extend_from_slice(b"k");
            b.extend_from_slice(&0u32.to_le_bytes());
            b.push(1);
        }
        assert!(err(b).contains("duplicate metadata key 'k'"));
    }

    #[test]
    fn custom_alignment_round_trips() {
        let mut w = GgufWriter::new();
        w.set_alignment(64).unwrap();
        w.add_f32_tensor("x", &[3], &[1.0, 2.0, 3.0]).unwrap();
        w.add_f32_tensor("y", &[2], &[4.0, 5.0]).unwrap();
        let g = Gguf::from_bytes(w.to_bytes().unwrap()).unwrap();
        assert_eq!(g.alignment, 64);
        assert_eq!(g.data_offset % 64, 0);
        assert_eq!(g.tensor("y").unwrap().offset, 64);
    }

    #[test]
    fn version_2_files_are_read() {
        let mut b = sample().to_bytes().unwrap();
        b[4..8].copy_from_slice(&2u32.to_le_bytes());
        assert_eq!(Gguf::from_bytes(b).unwrap().version, 2);
    }
}
