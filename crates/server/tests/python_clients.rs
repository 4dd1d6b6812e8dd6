//! The official Python clients against a live server: `openai` (tests/py/test_openai.py) and
//! `anthropic` (tests/py/test_anthropic.py).
//!
//! Python comes from `MUSER_PYTHON` (CI sets it to a venv with `openai` and `anthropic` from
//! PyPI), else `python3`; without Python or the client's package a test says so and passes as
//! skipped.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{MODEL, Opts, Server};

/// The Python that imports `package` (and httpx).
fn python(package: &str) -> Result<String, String> {
    let py = std::env::var("MUSER_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(&py)
        .args([
            "-c",
            &format!("import {package}, httpx; print({package}.__version__)"),
        ])
        .output()
        .map_err(|e| format!("cannot run {py}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{py} lacks the {package} package (pip install {package}; or set MUSER_PYTHON): {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        ));
    }
    Ok(py)
}

/// Runs `tests/py/{script}` with `package`'s client against a server with an API key, at
/// `http://ADDR{base_path}`; it must pass every test it has.
async fn run_client(test: &str, package: &str, script: &str, base_path: &str) {
    let py = match python(package) {
        Ok(p) => p,
        Err(why) => {
            println!("SKIPPED {test}: {why}");
            eprintln!("SKIPPED {test}: {why}");
            return;
        }
    };
    let mut s = Server::start(Opts {
        api_key: Some("test-key".into()),
        n_ctx: 4096,
        ..Opts::default()
    })
    .await;
    let script = format!("{}/tests/py/{script}", env!("CARGO_MANIFEST_DIR"));
    let base = format!("http://{}{base_path}", s.addr);
    let run = tokio::task::spawn_blocking(move || {
        Command::new(py)
            .args([
                script.as_str(),
                "--base-url",
                &base,
                "--model",
                MODEL,
                "--api-key",
                "test-key",
            ])
            .output()
    });
    let out = tokio::time::timeout(Duration::from_secs(300), run)
        .await
        .expect("the Python tests finish within 5 minutes")
        .expect("join")
        .expect("run python");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "{package} client tests failed:\n{stdout}"
    );
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_python_client() {
    run_client("openai_python_client", "openai", "test_openai.py", "/v1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_python_client() {
    run_client(
        "anthropic_python_client",
        "anthropic",
        "test_anthropic.py",
        "",
    )
    .await;
}
