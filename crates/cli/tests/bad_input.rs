//! Bad input gives a clear message and a non-zero exit code, never a panic.

use std::path::PathBuf;
use std::process::Command;

fn muser(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_muser"))
        .args(args)
        .output()
        .expect("run muser");
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!stderr.contains("panicked"), "muser panicked: {stderr}");
    (out.status.success(), stderr)
}

fn fixture(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/models")
        .join(name)
        .to_string_lossy()
        .to_string()
}

/// A file in the temporary folder, removed when the test lets go of it (also when it fails).
struct Tmp(String);

impl std::ops::Deref for Tmp {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl Drop for Tmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn tmp(name: &str, bytes: &[u8]) -> Tmp {
    let p = std::env::temp_dir().join(format!("muser-cli-{}-{name}", std::process::id()));
    std::fs::write(&p, bytes).unwrap();
    Tmp(p.to_string_lossy().to_string())
}

fn ids(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn missing_file() {
    let (ok, e) = muser(&["inspect", "/nonexistent/model.gguf"]);
    assert!(
        !ok && e.contains("cannot open /nonexistent/model.gguf"),
        "{e}"
    );
}

#[test]
fn corrupt_and_truncated_files() {
    let good = std::fs::read(fixture("tame-q4_0.gguf")).unwrap();
    let trunc = tmp("trunc.gguf", &good[..good.len() / 2]);
    let (ok, e) = muser(&["inspect", &trunc]);
    assert!(!ok && e.contains("truncated"), "{e}");
    let garbage = tmp("garbage.gguf", b"this is not a model at all");
    let (ok, e) = muser(&["inspect", &garbage]);
    assert!(!ok && e.contains("not a GGUF file"), "{e}");
    let toks = tmp("t1.i32", &ids(&[1, 2, 3]));
    let out = tmp("o1.f32", b"");
    let (ok, e) = muser(&["logits", "-m", &trunc, "--tokens", &toks, "--out", &out]);
    assert!(!ok && e.contains("truncated"), "{e}");
}

#[test]
fn token_outside_the_vocabulary() {
    let toks = tmp("t2.i32", &ids(&[1, 2, 100_000]));
    let out = tmp("o2.f32", b"");
    let (ok, e) = muser(&[
        "logits",
        "-m",
        &fixture("tame-q4_0.gguf"),
        "--tokens",
        &toks,
        "--out",
        &out,
    ]);
    assert!(
        !ok && e.contains("token id 100000 is outside the vocabulary"),
        "{e}"
    );
    let neg = tmp("t3.i32", &ids(&[1, -5]));
    let (ok, e) = muser(&[
        "logits",
        "-m",
        &fixture("tame-q4_0.gguf"),
        "--tokens",
        &neg,
        "--out",
        &out,
    ]);
    assert!(!ok && e.contains("negative"), "{e}");
    let odd = tmp("t4.i32", &[1, 2, 3]);
    let (ok, e) = muser(&[
        "logits",
        "-m",
        &fixture("tame-q4_0.gguf"),
        "--tokens",
        &odd,
        "--out",
        &out,
    ]);
    assert!(!ok && e.contains("not a whole number"), "{e}");
}

#[test]
fn prompt_longer_than_the_context() {
    let toks = tmp("t5.i32", &ids(&[5; 40]));
    let out = tmp("o5.f32", b"");
    let (ok, e) = muser(&[
        "logits",
        "-m",
        &fixture("tame-q4_0.gguf"),
        "--tokens",
        &toks,
        "--out",
        &out,
        "--ctx-size",
        "16",
    ]);
    assert!(!ok && e.contains("do not fit a context of 16"), "{e}");
    let (ok, e) = muser(&[
        "generate",
        "-m",
        &fixture("tame-q4_0.gguf"),
        "--prompt-ids",
        "1,2,3,4,5,6,7,8,9,10",
        "-c",
        "8",
    ]);
    assert!(!ok && e.contains("exceed the context size 8"), "{e}");
    let (ok, e) = muser(&[
        "generate",
        "-m",
        &fixture("tame-q4_0.gguf"),
        "--prompt-ids",
        "1",
        "-c",
        "99999",
    ]);
    assert!(ok, "a context larger than the model's is clamped: {e}");
    let (ok, e) = muser(&[
        "generate",
        "-m",
        &fixture("tame-q4_0.gguf"),
        "--prompt-ids",
        "1",
        "-c",
        "0",
    ]);
    assert!(!ok && e.contains("--ctx-size 0 leaves no room"), "{e}");
}

/// Flags whose values cannot work are named: a cache type that does not exist (before the
/// weights load), bench sizes past the context (before their tokens are made), a body limit of
/// 0 MiB or one that overflows.
#[test]
fn impossible_flag_values_are_named() {
    let m = fixture("tame-q4_0.gguf");
    let (ok, e) = muser(&["generate", "-m", &m, "-p", "hi", "--kv-type", "bogus"]);
    assert!(!ok && e.to_lowercase().contains("kv"), "{e}");
    for (args, named) in [
        (&["-p", "100000000000", "-n", "0"][..], "-p 100000000000"),
        (
            &["-p", "0", "-n", "4", "--depth", "100000000000"],
            "--depth 100000000000",
        ),
        (
            &[
                "-p",
                "0",
                "-n",
                "0",
                "--parallel",
                "2",
                "--batch-ctx",
                "100000000000",
            ],
            "--batch-ctx 100000000000",
        ),
    ] {
        let (ok, e) = muser(&[&["bench", "-m", &m][..], args].concat());
        assert!(!ok && e.contains(named), "{named}: {e}");
    }
    // synth never replaces a file unasked (it might be a real model).
    let existing = tmp("existing.gguf", b"not random weights");
    let (ok, e) = muser(&["synth", &existing, "--preset", "small"]);
    assert!(!ok && e.contains("--force"), "{e}");
    assert_eq!(std::fs::read(&*existing).unwrap(), b"not random weights");
    for v in ["0", "17592186044416"] {
        let (ok, e) = muser(&["serve", "-m", &m, "--max-body-mib", v, "--port", "0"]);
        assert!(!ok && e.contains("--max-body-mib"), "{v}: {e}");
    }
}

#[test]
fn logits_writes_one_row_per_position() {
    let toks = tmp("t6.i32", &ids(&[3, 1, 4, 1, 5, 9, 2, 6]));
    let out = tmp("o6.f32", b"");
    let (ok, e) = muser(&[
        "logits",
        "-m",
        &fixture("tame-q4_0.gguf"),
        "--tokens",
        &toks,
        "--out",
        &out,
        "--ubatch",
        "3",
    ]);
    assert!(ok, "{e}");
    assert_eq!(std::fs::metadata(&*out).unwrap().len(), 8 * 332 * 4);
}

fn muser_stdin(args: &[&str], input: &[u8]) -> (bool, String, String) {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_muser"))
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run muser");
    child.stdin.take().unwrap().write_all(input).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!stderr.contains("panicked"), "muser panicked: {stderr}");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        stderr,
    )
}

#[test]
fn tokenize_and_detokenize_round_trip_and_refuse_bad_input() {
    let m = fixture("tame-q4_k_m.gguf");
    let (ok, ids, e) = muser_stdin(
        &["tokenize", "-m", &m, "--no-bos"],
        "héllo wörld <|eot|>".as_bytes(),
    );
    assert!(ok, "{e}");
    let (ok, text, e) = muser_stdin(&["detokenize", "-m", &m], ids.trim().as_bytes());
    assert!(ok, "{e}");
    assert_eq!(text, "héllo wörld <|eot|>");
    // --special turns the written control token into its id: one token fewer than as text.
    let (_, special, _) = muser_stdin(
        &["tokenize", "-m", &m, "--no-bos", "--special"],
        "<|eot|>".as_bytes(),
    );
    assert_eq!(special.trim().matches(',').count(), 0, "{special}");
    let (ok, _, e) = muser_stdin(&["tokenize", "-m", &m], &[0x66, 0xff, 0x66]);
    assert!(!ok && e.contains("not valid UTF-8"), "{e}");
    let (ok, _, e) = muser_stdin(&["detokenize", "-m", &m], b"[1, 2, oops]");
    assert!(!ok && e.contains("not a JSON array"), "{e}");
    let (ok, _, e) = muser_stdin(&["detokenize", "-m", &m], b"[1, 999999]");
    assert!(!ok && e.contains("999999"), "{e}");
}

#[test]
fn generate_streams_text_and_is_reproducible_with_a_seed() {
    let m = fixture("tame-q4_k_m.gguf");
    let run = || {
        Command::new(env!("CARGO_BIN_EXE_muser"))
            .args([
                "generate",
                "-m",
                &m,
                "-p",
                "Once upon a time",
                "-n",
                "12",
                "--seed",
                "7",
                "--print-ids",
            ])
            .output()
            .unwrap()
    };
    let (a, b) = (run(), run());
    assert!(
        a.status.success() && b.status.success(),
        "{}",
        String::from_utf8_lossy(&a.stderr)
    );
    assert_eq!(a.stdout, b.stdout, "same seed, same tokens");
    let n = String::from_utf8_lossy(&a.stdout)
        .split_whitespace()
        .count();
    assert!((1..=12).contains(&n), "{n} tokens");
}

/// `--draft-ngram` samples plain decoding's tokens (the CPU's accurate mode: a forward of a
/// guess gives each token the bits of one at a time), seeded and greedy; bad draft sizes are
/// refused before the weights load.
#[test]
fn generate_with_guesses_gives_plain_decodings_tokens() {
    let m = fixture("tame-q4_k_m.gguf");
    // A prompt that repeats itself: the lookup finds guesses from the start.
    let prompt = [1, 40, 41, 42, 43, 44, 40, 41, 42, 43, 44, 40, 41, 42]
        .map(|t: i32| t.to_string())
        .join(",");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "generate",
            "-m",
            &m,
            "--prompt-ids",
            &prompt,
            "-n",
            "48",
            "--print-ids",
        ];
        args.extend_from_slice(extra);
        let out = Command::new(env!("CARGO_BIN_EXE_muser"))
            .args(&args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        (out.stdout, String::from_utf8_lossy(&out.stderr).to_string())
    };
    for sampling in [
        &["--temp", "0"][..],
        &["--seed", "11", "--repeat-penalty", "1.2"][..],
    ] {
        let (plain, _) = run(sampling);
        for draft in [
            &["--draft-ngram", "1", "--draft-max", "4"][..],
            &["--draft-ngram", "2", "--draft-max", "12"][..],
        ] {
            let (got, said) = run(&[sampling, draft].concat());
            assert_eq!(got, plain, "{sampling:?} {draft:?}: {said}");
            assert!(said.contains("guessed tokens kept"), "{said}");
        }
    }
    for (n, max) in [("0", "4"), ("2", "0"), ("2", "257")] {
        let args = [
            "generate",
            "-m",
            "/nonexistent/model.gguf",
            "-p",
            "x",
            "--draft-ngram",
            n,
            "--draft-max",
            max,
        ];
        let (ok, e) = muser(&args);
        if n == "0" {
            // 0 turns guessing off: the missing file is what is named.
            assert!(!ok && e.contains("/nonexistent/model.gguf"), "{e}");
        } else {
            assert!(!ok && e.contains("guesses 1 to 256"), "{e}");
        }
    }
}

#[test]
fn weight_copies_outside_cuda_are_refused() {
    let toks = tmp("t-f16w.i32", &ids(&[1, 2, 3]));
    let out = tmp("o-f16w.f32", b"");
    let m = fixture("tame-q4_k_m.gguf");
    for (flag, says) in [
        ("--f16-weights", "--f16-weights keeps f16 copies on CUDA"),
        (
            "--fp8-weights",
            "--fp8-weights keeps e4m3 copies for --mode fast on CUDA",
        ),
    ] {
        for extra in [&[][..], &["--mode", "fast"][..]] {
            let mut args = vec!["logits", "-m", &m, "--tokens", &toks, "--out", &out, flag];
            args.extend_from_slice(extra);
            let (ok, e) = muser(&args);
            assert!(!ok && e.contains(says), "{args:?}: {e}");
        }
    }
}

/// `--f16-weights` where no product would read its copies: refused before any device is touched
/// (so on a machine without a GPU too).
#[test]
fn weight_copies_no_product_reads_are_refused() {
    let toks = tmp("t-f16w2.i32", &ids(&[1, 2, 3]));
    let out = tmp("o-f16w2.f32", b"");
    let m = fixture("tame-q4_k_m.gguf");
    for extra in [&["--mode", "cuda-parity"][..], &["--batch-invariant"][..]] {
        let mut args = vec![
            "logits",
            "-m",
            &m,
            "--tokens",
            &toks,
            "--out",
            &out,
            "--device",
            "cuda",
            "--f16-weights",
        ];
        args.extend_from_slice(extra);
        let (ok, e) = muser(&args);
        assert!(
            !ok && e.contains("which --mode cuda-parity and --batch-invariant never run"),
            "{args:?}: {e}"
        );
    }
}

/// `inspect` judges the tokenizer too: a file whose model loads but whose tokenizer is refused
/// (here a true add_eos_token) gets the tokenizer's reason, not "can run"; and a key holding
/// control characters is printed escaped.
#[test]
fn inspect_judges_the_tokenizer_and_escapes_names() {
    use muser_gguf::Value;
    let write = |extra: (&str, Value), name: &str| edited_fixture(name, Some(extra), |_, _| None);
    let eos = write(
        ("tokenizer.ggml.add_eos_token", Value::Bool(true)),
        "eos.gguf",
    );
    let out = Command::new(env!("CARGO_BIN_EXE_muser"))
        .args(["inspect", &eos])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success());
    assert!(
        stdout.contains("verdict: Muser refuses this file: its tokenizer")
            && stdout.contains("add_eos_token"),
        "{stdout}"
    );
    let esc = write(("x.\u{1b}]0;title\u{7}", Value::U32(1)), "esc.gguf");
    let out = Command::new(env!("CARGO_BIN_EXE_muser"))
        .args(["inspect", &esc])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains('\u{1b}'), "an escape reached the terminal");
    assert!(stdout.contains("x.\\u{1b}]0;title\\u{7}"), "{stdout}");
}

/// The tame fixture rewritten to a temporary file: with `extra` metadata, and each tensor's
/// data as `data(name, bytes)` gives it (None: as it was).
fn edited_fixture(
    name: &str,
    extra: Option<(&str, muser_gguf::Value)>,
    data: impl Fn(&str, &[u8]) -> Option<Vec<u8>>,
) -> Tmp {
    use muser_gguf::{Gguf, GgufWriter};
    let g = Gguf::open(fixture("tame-q4_k_m.gguf")).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in g.metadata() {
        w.add(k, v.clone()).unwrap();
    }
    if let Some((k, v)) = extra {
        w.add(k, v).unwrap();
    }
    for t in g.tensors() {
        let bytes = g.tensor_data(t);
        let bytes = data(&t.name, bytes).unwrap_or_else(|| bytes.to_vec());
        w.add_tensor(&t.name, &t.dims, t.ggml_type, bytes).unwrap();
    }
    tmp(name, &w.to_bytes().unwrap())
}

/// Scales that overflow f32 (every attn_q_norm at 3e38, which the loader accepts: a finite
/// constant) give NaN logits; generate says so instead of printing token 0 again and again.
#[test]
fn nan_logits_stop_generation_with_a_reason() {
    let path = edited_fixture("nan.gguf", None, |name, bytes| {
        name.ends_with("attn_q_norm.weight").then(|| {
            bytes
                .chunks_exact(4)
                .flat_map(|_| 3e38f32.to_le_bytes())
                .collect()
        })
    });
    let (ok, e) = muser(&[
        "generate", "-m", &path, "-p", "hello", "-n", "4", "--temp", "0",
    ]);
    assert!(!ok && e.contains("logits are not finite"), "{e}");
    // bench's batched test with the tokens drawn where the logits are: the same reason, not a
    // drawn id refused as outside the vocabulary at the next step.
    let (ok, e) = muser(&[
        "bench",
        "-m",
        &path,
        "-p",
        "0",
        "-n",
        "0",
        "--parallel",
        "2",
        "--batch-prompt",
        "4",
        "--batch-gen",
        "3",
        "--batch-draw",
        "-r",
        "1",
    ]);
    assert!(!ok && e.contains("logits are not finite"), "{e}");
}

/// A split model is inspected and run from its first shard; a later shard names the first.
#[test]
fn a_split_model_runs_from_its_first_shard() {
    let first = fixture("split/tame-q4_k_m-00001-of-00003.gguf");
    let out = Command::new(env!("CARGO_BIN_EXE_muser"))
        .args(["inspect", &first])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("split model: 3 shards") && stdout.contains("verdict: Muser can run"),
        "{stdout}"
    );
    // The same greedy text as the whole file.
    let greedy = |m: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_muser"))
            .args([
                "generate", "-m", m, "-p", "Hello", "-n", "12", "--temp", "0",
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };
    let whole = greedy(&fixture("tame-q4_k_m.gguf"));
    assert!(!whole.is_empty());
    assert_eq!(greedy(&first), whole);
    let (ok, e) = muser(&["inspect", &fixture("split/tame-q4_k_m-00002-of-00003.gguf")]);
    assert!(
        !ok && e.contains("shard 2 of 3") && e.contains("tame-q4_k_m-00001-of-00003.gguf"),
        "{e}"
    );
}

#[test]
fn a_prompt_cache_is_reused_and_a_foreign_one_refused() {
    let m = fixture("tame-q4_k_m.gguf");
    let cache = std::env::temp_dir().join(format!("muser-cli-{}-prompt.state", std::process::id()));
    let _ = std::fs::remove_file(&cache);
    let c = cache.to_string_lossy().to_string();
    let run = |model: &str, prompt: &str, extra: &[&str]| {
        let mut args = vec![
            "generate",
            "-m",
            model,
            "-p",
            prompt,
            "-n",
            "10",
            "--temp",
            "0",
            "--print-ids",
            "--prompt-cache",
            &c,
        ];
        args.extend_from_slice(extra);
        let out = Command::new(env!("CARGO_BIN_EXE_muser"))
            .args(&args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(!err.contains("panicked"), "{err}");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            err,
        )
    };
    let prompt = "Once upon a time there was a prompt long enough to cache";
    let (ok, first, e) = run(&m, prompt, &[]);
    assert!(ok && e.contains("positions saved"), "{e}");
    // The same prompt again: all but its last token come from the file; the same tokens follow.
    let (ok, again, e) = run(&m, prompt, &["--prompt-cache-ro"]);
    assert!(ok && e.contains("prompt tokens from"), "{e}");
    let reused = |e: &str| -> usize {
        let n = e
            .split("prompt cache: ")
            .nth(1)
            .and_then(|r| r.split(' ').next());
        n.and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{e}"))
    };
    let n = reused(&e);
    assert!(n > 5, "{e}");
    assert_eq!(first, again);
    // A longer prompt beginning with it continues from it, as it would from scratch.
    let longer = format!("{prompt}, and then some more");
    let (ok, cached, e) = run(&m, &longer, &["--prompt-cache-ro"]);
    assert!(ok && reused(&e) >= n, "{e}");
    let _ = std::fs::remove_file(&cache);
    let (ok, scratch, _) = run(&m, &longer, &["--prompt-cache-ro"]);
    assert!(ok);
    assert_eq!(cached, scratch);
    // Saved from another model (same shapes), with another cache type: refused by name.
    let (ok, _, _) = run(&m, prompt, &[]);
    assert!(ok);
    let (ok, _, e) = run(&fixture("tame-q8_0.gguf"), prompt, &[]);
    assert!(!ok && e.contains("another model"), "{e}");
    let (ok, _, e) = run(&m, prompt, &["--kv-type", "q8_0"]);
    assert!(!ok && e.contains("cache type is f16"), "{e}");
    let _ = std::fs::remove_file(&cache);
}

#[test]
fn slot_files_on_a_backend_that_cannot_save_them_stop_the_server_at_start() {
    let m = fixture("tame-q4_k_m.gguf");
    let dir = std::env::temp_dir().join(format!("muser-cli-{}-slots", std::process::id()));
    let d = dir.to_string_lossy().to_string();
    let (ok, e) = muser(&[
        "serve",
        "-m",
        &m,
        "--mode",
        "parity",
        "--slot-save-path",
        &d,
        "--port",
        "0",
    ]);
    assert!(
        !ok && e.contains("--slot-save-path") && e.contains("parity"),
        "{e}"
    );
    assert!(!e.contains("listening"), "{e}");
}

/// `muser chat`'s `/save F` and `/load F`: a conversation taken up again in another process
/// answers its next message as the process that kept it would; a state from another model, or
/// messages that are not a conversation, are refused and the chat goes on.
#[test]
fn a_saved_chat_is_taken_up_again() {
    let m = fixture("tame-q4_k_m.gguf");
    let dir = std::env::temp_dir().join(format!("muser-cli-{}-chat", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("conv").to_string_lossy().to_string();
    let args = ["chat", "-m", &m, "-n", "8", "--seed", "3"];
    // Answers, one per message, split at the prompts ("\n> ").
    let answers =
        |out: &str| -> Vec<String> { out.split("\n> ").map(|a| a.trim().to_string()).collect() };
    let (ok, whole, e) = muser_stdin(&args, b"hello there\nand more\n/quit\n");
    assert!(ok, "{e}");
    let whole = answers(&whole);
    let (ok, _, e) = muser_stdin(&args, format!("hello there\n/save {f}\n/quit\n").as_bytes());
    assert!(ok && e.contains("saved to"), "{e}");
    let (ok, resumed, e) = muser_stdin(&args, format!("/load {f}\nand more\n/quit\n").as_bytes());
    assert!(ok && e.contains("2 messages and"), "{e}");
    let resumed = answers(&resumed);
    // whole: [before, answer 1, answer 2, after /quit]; resumed: [before, after /load, answer 2, ...]
    assert!(!whole[2].is_empty());
    assert_eq!(whole[2], resumed[2]);
    // Another model's state: refused, the chat goes on.
    let other = fixture("tame-q8_0.gguf");
    let (ok, _, e) = muser_stdin(
        &["chat", "-m", &other, "-n", "4"],
        format!("/load {f}\nhi\n/quit\n").as_bytes(),
    );
    assert!(ok && e.contains("another model"), "{e}");
    std::fs::write(format!("{f}.json"), b"{\"not\": \"a list\"}").unwrap();
    let (ok, _, e) = muser_stdin(&args, format!("/load {f}\n/quit\n").as_bytes());
    assert!(ok && e.contains("conv.json"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
