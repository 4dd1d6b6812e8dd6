//! Split models: one model in several GGUF files, as llama.cpp's `gguf-split` and the
//! converter's `--split-max-tensors`/`--split-max-size` write it.
//!
//! Every shard carries `split.no` (u16, from 0) and `split.count` (u16); the first also carries
//! every other key of the model and `split.tensors.count` (the total over the shards). The files
//! are named `PREFIX-00001-of-00003.gguf` and so on (`llama_split_path`, src/llama.cpp), and the
//! loader finds the others from the first file's name (`llama_split_prefix`,
//! `llama_get_list_splits` in src/llama-model-loader.cpp). Each shard is a whole GGUF with its
//! own header, alignment and data section; a tensor lives in exactly one of them.

use std::path::{Path, PathBuf};

use crate::reader::Gguf;
use crate::{GgufError, Result};

pub const KEY_NO: &str = "split.no";
pub const KEY_COUNT: &str = "split.count";
pub const KEY_TENSORS: &str = "split.tensors.count";

/// A key read as an integer in `0..=max`, or an error naming the key and the file.
fn int_key(g: &Gguf, key: &str, path: Option<&Path>, max: i64) -> Result<Option<i64>> {
    let Some(v) = g.get(key) else {
        return Ok(None);
    };
    let whose = path.map_or(String::new(), |p| format!(" in {}", p.display()));
    match v.as_i64() {
        Some(i) if (0..=max).contains(&i) => Ok(Some(i)),
        Some(i) => Err(GgufError::Format(format!(
            "{key} is {i}{whose}, expected 0 to {max}"
        ))),
        None => Err(GgufError::Format(format!(
            "{key} ({}){whose} is not an integer from 0 to {max}",
            v.value_type().name()
        ))),
    }
}

/// The file's `split.count`, if it has one.
pub fn count(g: &Gguf) -> Result<Option<u16>> {
    count_in(g, None)
}

/// `count`, its error naming the file read from `path`.
pub(crate) fn count_in(g: &Gguf, path: Option<&Path>) -> Result<Option<u16>> {
    Ok(int_key(g, KEY_COUNT, path, u16::MAX as i64)?.map(|n| n as u16))
}

/// The shard's `split.no` (required in a shard).
pub(crate) fn number(g: &Gguf, path: &Path) -> Result<u16> {
    int_key(g, KEY_NO, Some(path), u16::MAX as i64)?
        .map(|n| n as u16)
        .ok_or_else(|| {
            GgufError::Format(format!(
                "{} is a shard of a split model without a {KEY_NO} key",
                path.display()
            ))
        })
}

/// The first shard's `split.tensors.count` (required there, as llama.cpp requires it).
pub(crate) fn tensor_count(g: &Gguf, path: &Path) -> Result<u64> {
    int_key(g, KEY_TENSORS, Some(path), i32::MAX as i64)?
        .map(|n| n as u64)
        .ok_or_else(|| {
            GgufError::Format(format!(
                "{} is the first shard of a split model without a {KEY_TENSORS} key",
                path.display()
            ))
        })
}

/// The name of shard `no` (from 0) of `count` with this prefix: `llama_split_path`.
pub fn shard_name(prefix: &str, no: u16, count: u16) -> String {
    format!("{prefix}-{:05}-of-{:05}.gguf", no as u32 + 1, count)
}

/// Every shard's path, from the path of shard `no`: its name must end with llama.cpp's suffix
/// for that shard, and the rest of it is the prefix of them all.
pub(crate) fn paths(path: &Path, no: u16, count: u16) -> Result<Vec<PathBuf>> {
    if no >= count {
        return Err(GgufError::Format(format!(
            "{} says it is shard {} ({KEY_NO} {no}) of {count}",
            path.display(),
            no as u32 + 1
        )));
    }
    // The name as the bytes the OS gave (a name need not be UTF-8): the suffix is ASCII, so
    // the prefix is the name's bytes before it, and the other names are that prefix and theirs.
    let name = path.file_name().unwrap_or_default();
    let suffix = shard_name("", no, count);
    let prefix = name
        .as_encoded_bytes()
        .strip_suffix(suffix.as_bytes())
        .filter(|p| !p.is_empty())
        .ok_or_else(|| {
            GgufError::Format(format!(
                "{} is shard {} of {count} of a split model, but its name does not end with \
                 '{suffix}': the other shards are found by that name (rename the files as \
                 llama.cpp's gguf-split names them)",
                path.display(),
                no as u32 + 1
            ))
        })?;
    Ok((0..count)
        .map(|i| {
            let mut n = prefix.to_vec();
            n.extend_from_slice(shard_name("", i, count).as_bytes());
            // SAFETY: `prefix` is a leading part of an OsStr's encoded bytes that ends where
            // ASCII begins (the suffix), and what is appended is ASCII: the documented
            // condition of `OsString::from_encoded_bytes_unchecked` (bytes split at a valid
            // non-empty UTF-8 substring and joined with valid UTF-8).
            path.with_file_name(unsafe { std::ffi::OsString::from_encoded_bytes_unchecked(n) })
        })
        .collect())
}
