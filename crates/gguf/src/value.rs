//! GGUF metadata values.

use std::fmt;

/// The on-disk value type ids of GGUF (`enum gguf_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    pub fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => Self::U8,
            1 => Self::I8,
            2 => Self::U16,
            3 => Self::I16,
            4 => Self::U32,
            5 => Self::I32,
            6 => Self::F32,
            7 => Self::Bool,
            8 => Self::String,
            9 => Self::Array,
            10 => Self::U64,
            11 => Self::I64,
            12 => Self::F64,
            _ => return None,
        })
    }

    /// Fewest bytes one element of this type takes on disk (a string is at least its
    /// 8-byte length). Used to bound array counts before allocating.
    pub const fn min_size(self) -> usize {
        match self {
            Self::U8 | Self::I8 | Self::Bool => 1,
            Self::U16 | Self::I16 => 2,
            Self::U32 | Self::I32 | Self::F32 => 4,
            Self::U64 | Self::I64 | Self::F64 | Self::String => 8,
            Self::Array => 12,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            Self::U8 => "u8",
            Self::I8 => "i8",
            Self::U16 => "u16",
            Self::I16 => "i16",
            Self::U32 => "u32",
            Self::I32 => "i32",
            Self::F32 => "f32",
            Self::Bool => "bool",
            Self::String => "string",
            Self::Array => "array",
            Self::U64 => "u64",
            Self::I64 => "i64",
            Self::F64 => "f64",
        }
    }
}

/// A metadata value. Arrays hold one element type and never nest (as gguf.cpp).
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    U64(u64),
    I64(i64),
    F64(f64),
    Array(Array),
}

/// A homogeneous array value.
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(Vec<String>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl Array {
    pub fn len(&self) -> usize {
        match self {
            Self::U8(v) => v.len(),
            Self::I8(v) => v.len(),
            Self::U16(v) => v.len(),
            Self::I16(v) => v.len(),
            Self::U32(v) => v.len(),
            Self::I32(v) => v.len(),
            Self::F32(v) => v.len(),
            Self::Bool(v) => v.len(),
            Self::String(v) => v.len(),
            Self::U64(v) => v.len(),
            Self::I64(v) => v.len(),
            Self::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn elem_type(&self) -> ValueType {
        match self {
            Self::U8(_) => ValueType::U8,
            Self::I8(_) => ValueType::I8,
            Self::U16(_) => ValueType::U16,
            Self::I16(_) => ValueType::I16,
            Self::U32(_) => ValueType::U32,
            Self::I32(_) => ValueType::I32,
            Self::F32(_) => ValueType::F32,
            Self::Bool(_) => ValueType::Bool,
            Self::String(_) => ValueType::String,
            Self::U64(_) => ValueType::U64,
            Self::I64(_) => ValueType::I64,
            Self::F64(_) => ValueType::F64,
        }
    }

    /// Integer elements widened to i64 (None for non-integer arrays or u64 values past i64).
    pub fn as_i64s(&self) -> Option<Vec<i64>> {
        Some(match self {
            Self::U8(v) => v.iter().map(|&x| x as i64).collect(),
            Self::I8(v) => v.iter().map(|&x| x as i64).collect(),
            Self::U16(v) => v.iter().map(|&x| x as i64).collect(),
            Self::I16(v) => v.iter().map(|&x| x as i64).collect(),
            Self::U32(v) => v.iter().map(|&x| x as i64).collect(),
            Self::I32(v) => v.iter().map(|&x| x as i64).collect(),
            Self::U64(v) => v
                .iter()
                .map(|&x| i64::try_from(x).ok())
                .collect::<Option<_>>()?,
            Self::I64(v) => v.clone(),
            _ => return None,
        })
    }
}

impl Value {
    pub fn value_type(&self) -> ValueType {
        match self {
            Self::U8(_) => ValueType::U8,
            Self::I8(_) => ValueType::I8,
            Self::U16(_) => ValueType::U16,
            Self::I16(_) => ValueType::I16,
            Self::U32(_) => ValueType::U32,
            Self::I32(_) => ValueType::I32,
            Self::F32(_) => ValueType::F32,
            Self::Bool(_) => ValueType::Bool,
            Self::String(_) => ValueType::String,
            Self::U64(_) => ValueType::U64,
            Self::I64(_) => ValueType::I64,
            Self::F64(_) => ValueType::F64,
            Self::Array(_) => ValueType::Array,
        }
    }

    /// Any integer value widened to i64 (None when not an integer or out of range).
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Self::U8(x) => Some(x as i64),
            Self::I8(x) => Some(x as i64),
            Self::U16(x) => Some(x as i64),
            Self::I16(x) => Some(x as i64),
            Self::U32(x) => Some(x as i64),
            Self::I32(x) => Some(x as i64),
            Self::U64(x) => i64::try_from(x).ok(),
            Self::I64(x) => Some(x),
            _ => None,
        }
    }

    /// A float value (f32 or f64) as f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Self::F32(x) => Some(x as f64),
            Self::F64(x) => Some(x),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Self::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Self::Array(a) => Some(a),
            _ => None,
        }
    }

    /// A short human-readable rendering; long arrays are elided.
    pub fn summary(&self, max_items: usize) -> String {
        fn list<T: fmt::Debug>(v: &[T], max: usize) -> String {
            let shown: Vec<String> = v.iter().take(max).map(|x| format!("{x:?}")).collect();
            if v.len() > max {
                format!("[{}, ... ({} items)]", shown.join(", "), v.len())
            } else {
                format!("[{}]", shown.join(", "))
            }
        }
        match self {
            Self::U8(x) => x.to_string(),
            Self::I8(x) => x.to_string(),
            Self::U16(x) => x.to_string(),
            Self::I16(x) => x.to_string(),
            Self::U32(x) => x.to_string(),
            Self::I32(x) => x.to_string(),
            Self::F32(x) => format!("{x:?}"),
            Self::Bool(x) => x.to_string(),
            Self::String(s) => {
                let mut t: String = s.chars().take(120).collect();
                if t.len() < s.len() {
                    t.push_str(&format!("... ({} bytes)", s.len()));
                }
                format!("{t:?}")
            }
            Self::U64(x) => x.to_string(),
            Self::I64(x) => x.to_string(),
            Self::F64(x) => format!("{x:?}"),
            Self::Array(a) => match a {
                Array::U8(v) => list(v, max_items),
                Array::I8(v) => list(v, max_items),
                Array::U16(v) => list(v, max_items),
                Array::I16(v) => list(v, max_items),
                Array::U32(v) => list(v, max_items),
                Array::I32(v) => list(v, max_items),
                Array::F32(v) => list(v, max_items),
                Array::Bool(v) => list(v, max_items),
                Array::String(v) => list(v, max_items),
                Array::U64(v) => list(v, max_items),
                Array::I64(v) => list(v, max_items),
                Array::F64(v) => list(v, max_items),
            },
        }
    }
}
