//! Split models: the first shard's path opens every shard, and each way a set of shards can be
//! wrong is refused with a message naming the file and the problem.

use std::path::{Path, PathBuf};

use muser_gguf::{Gguf, GgufWriter, Value};

/// A fresh folder for one test's files.
fn folder(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("muser-split-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// One shard: its split keys (`None` leaves a key out), the first shard's model key, and
/// tensors named as given, each holding its shard number and position.
struct Shard<'a> {
    no: Option<Value>,
    count: Option<Value>,
    total: Option<Value>,
    tensors: &'a [&'a str],
}

fn write(path: &Path, s: &Shard, first: bool) {
    let mut w = GgufWriter::new();
    if first {
        w.add_str("general.architecture", "muse-glimmer").unwrap();
    }
    for (k, v) in [
        ("split.no", &s.no),
        ("split.count", &s.count),
        ("split.tensors.count", &s.total),
    ] {
        if let Some(v) = v {
            w.add(k, v.clone()).unwrap();
        }
    }
    for (i, t) in s.tensors.iter().enumerate() {
        w.add_f32_tensor(t, &[3], &[i as f32, t.len() as f32, -1.0])
            .unwrap();
    }
    w.write(path).unwrap();
}

/// Three well-formed shards `m-0000i-of-00003.gguf` holding tensors a..f, two a shard.
fn three(dir: &Path) -> Vec<PathBuf> {
    let names = [["a", "bb"], ["ccc", "d"], ["ee", "fff"]];
    (0..3u16)
        .map(|i| {
            let p = dir.join(format!("m-{:05}-of-00003.gguf", i + 1));
            let shard = Shard {
                no: Some(Value::U16(i)),
                count: Some(Value::U16(3)),
                total: (i == 0).then_some(Value::I32(6)),
                tensors: &names[i as usize],
            };
            write(&p, &shard, i == 0);
            p
        })
        .collect()
}

fn err(path: &Path) -> String {
    match Gguf::open(path) {
        Ok(g) => panic!("{} opened: {g:?}", path.display()),
        Err(e) => e.to_string(),
    }
}

fn assert_mentions(e: &str, needles: &[&str]) {
    for n in needles {
        assert!(e.contains(n), "error {e:?} does not mention {n:?}");
    }
}

#[test]
fn the_first_shard_opens_them_all() {
    let dir = folder("all");
    let p = three(&dir);
    let g = Gguf::open(&p[0]).unwrap();
    assert_eq!(g.n_shards(), 3);
    assert_eq!(g.tensors().len(), 6);
    assert_eq!(
        g.get("general.architecture").and_then(Value::as_str),
        Some("muse-glimmer")
    );
    let sizes: u64 = p.iter().map(|p| std::fs::metadata(p).unwrap().len()).sum();
    assert_eq!(g.file_size(), sizes);
    for (name, shard, pos) in [
        ("a", 0, 0),
        ("bb", 0, 1),
        ("ccc", 1, 0),
        ("d", 1, 1),
        ("ee", 2, 0),
        ("fff", 2, 1),
    ] {
        let t = g.tensor(name).unwrap();
        assert_eq!(t.shard, shard, "{name}");
        let v: Vec<f32> = g
            .tensor_data(t)
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(v, [pos as f32, name.len() as f32, -1.0], "{name}");
    }
    // One file alone is still one file.
    let one = Gguf::open_file(&p[1]).unwrap();
    assert_eq!((one.n_shards(), one.tensors().len()), (1, 2));
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_later_shard_names_the_first() {
    let dir = folder("later");
    let p = three(&dir);
    let e = err(&p[1]);
    assert_mentions(
        &e,
        &[
            "shard 2 of 3",
            "open the first shard",
            "m-00001-of-00003.gguf",
        ],
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_missing_shard_is_named() {
    let dir = folder("missing");
    let p = three(&dir);
    std::fs::remove_file(&p[2]).unwrap();
    let e = err(&p[0]);
    assert_mentions(&e, &["m-00003-of-00003.gguf", "shard 3 of 3"]);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_renamed_first_shard_says_how_the_others_are_found() {
    let dir = folder("renamed");
    let p = three(&dir);
    let q = dir.join("model.gguf");
    std::fs::rename(&p[0], &q).unwrap();
    let e = err(&q);
    assert_mentions(&e, &["shard 1 of 3", "-00001-of-00003.gguf"]);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn shards_that_do_not_belong_together_are_refused() {
    let dir = folder("mixed");
    let p = three(&dir);
    let cases: [(Shard, &[&str]); 6] = [
        // A tensor in two shards.
        (
            Shard {
                no: Some(Value::U16(1)),
                count: Some(Value::U16(3)),
                total: None,
                tensors: &["ccc", "a"],
            },
            &["tensor 'a' is in shard 1 and again in shard 2"],
        ),
        // The second file says it is the third.
        (
            Shard {
                no: Some(Value::U16(2)),
                count: Some(Value::U16(3)),
                total: None,
                tensors: &["ccc", "d"],
            },
            &["says it is shard 3", "expected shard 2 of 3"],
        ),
        // A shard of another split.
        (
            Shard {
                no: Some(Value::U16(1)),
                count: Some(Value::U16(4)),
                total: None,
                tensors: &["ccc", "d"],
            },
            &["4 shards", "two different splits"],
        ),
        // No split.no.
        (
            Shard {
                no: None,
                count: Some(Value::U16(3)),
                total: None,
                tensors: &["ccc", "d"],
            },
            &["without a split.no key"],
        ),
        // A split.no that is no integer.
        (
            Shard {
                no: Some(Value::String("1".into())),
                count: Some(Value::U16(3)),
                total: None,
                tensors: &["ccc", "d"],
            },
            &["split.no (string)", "not an integer"],
        ),
        // One tensor fewer than split.tensors.count says.
        (
            Shard {
                no: Some(Value::U16(1)),
                count: Some(Value::U16(3)),
                total: None,
                tensors: &["ccc"],
            },
            &["hold 5 tensors", "split.tensors.count says 6"],
        ),
    ];
    for (second, needles) in cases {
        write(&p[1], &second, false);
        assert_mentions(&err(&p[0]), needles);
    }
    // And the first shard must give the total.
    three(&dir);
    write(
        &p[0],
        &Shard {
            no: Some(Value::U16(0)),
            count: Some(Value::U16(3)),
            total: None,
            tensors: &["a", "bb"],
        },
        true,
    );
    assert_mentions(&err(&p[0]), &["without a split.tensors.count key"]);
    // A split.count out of range.
    write(
        &p[0],
        &Shard {
            no: Some(Value::U16(0)),
            count: Some(Value::I32(-3)),
            total: Some(Value::I32(6)),
            tensors: &["a", "bb"],
        },
        true,
    );
    assert_mentions(&err(&p[0]), &["split.count is -3", "expected 0 to 65535"]);
    std::fs::remove_dir_all(dir).unwrap();
}

/// `split.count` 1 (or 0) is a whole file: it opens alone, whatever its name.
#[test]
fn a_split_count_of_one_is_a_whole_file() {
    let dir = folder("one");
    let p = dir.join("whole.gguf");
    write(
        &p,
        &Shard {
            no: Some(Value::U16(0)),
            count: Some(Value::U16(1)),
            total: Some(Value::I32(1)),
            tensors: &["a"],
        },
        true,
    );
    let g = Gguf::open(&p).unwrap();
    assert_eq!((g.n_shards(), g.tensors().len()), (1, 1));
    std::fs::remove_dir_all(dir).unwrap();
}

/// Whatever is wrong in a later shard, its error names that shard and the model opened: the
/// user opened the first file, and the fault is in another.
#[test]
fn a_later_shards_errors_name_it() {
    let dir = folder("later-errors");
    let p = three(&dir);
    // Cut short: its own header check fails.
    let bytes = std::fs::read(&p[1]).unwrap();
    std::fs::write(&p[1], &bytes[..bytes.len() - 30]).unwrap();
    assert_mentions(
        &err(&p[0]),
        &[
            "truncated",
            "shard 2 of 3",
            "m-00002-of-00003.gguf",
            "m-00001-of-00003.gguf",
        ],
    );
    // A split.count out of range there.
    write(
        &p[1],
        &Shard {
            no: Some(Value::U16(1)),
            count: Some(Value::I32(70000)),
            total: None,
            tensors: &["ccc", "d"],
        },
        false,
    );
    assert_mentions(
        &err(&p[0]),
        &[
            "split.count is 70000",
            "in ",
            "m-00002-of-00003.gguf",
            "shard 2 of 3",
        ],
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// A file name need not be UTF-8: the shards are found from its bytes.
#[cfg(unix)]
#[test]
fn shards_whose_names_are_not_utf8_open() {
    use std::os::unix::ffi::OsStrExt;
    let dir = folder("not-utf8");
    let p = three(&dir);
    let renamed: Vec<PathBuf> = p
        .iter()
        .map(|q| {
            let mut name = b"m\xff".to_vec();
            name.extend_from_slice(&q.file_name().unwrap().as_bytes()[1..]);
            let r = dir.join(std::ffi::OsStr::from_bytes(&name));
            std::fs::rename(q, &r).unwrap();
            r
        })
        .collect();
    let g = Gguf::open(&renamed[0]).unwrap();
    assert_eq!((g.n_shards(), g.tensors().len()), (3, 6));
    std::fs::remove_dir_all(dir).unwrap();
}
