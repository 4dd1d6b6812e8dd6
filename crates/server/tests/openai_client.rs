//! The official `openai` Python client (tests/py/test_openai.py) against a live server.
//!
//! Python comes from `MUSER_PYTHON` (CI sets it to a venv with `openai` from PyPI), else
//! `python3`; without Python or the `openai` package the test says so and passes as skipped.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{MODEL, Opts, Server};

fn python() -> Result<String, String> {
    let py = std::env::var("MUSER_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(&py)
        .args(["-c", "import openai, httpx; print(openai.__version__)"])
        .output()
        .map_err(|e| format!("cannot run {py}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{py} lacks the openai package (pip install openai; or set MUSER_PYTHON): {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        ));
    }
    Ok(py)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_python_client() {
    let py = match python() {
        Ok(p) => p,
        Err(why) => {
            println!("SKIPPED openai_python_client: {why}");
            eprintln!("SKIPPED openai_python_client: {why}");
            return;
        }
    };
    let mut s = Server::start(Opts {
        api_key: Some("test-key".into()),
        n_ctx: 4096,
        ..Opts::default()
    })
    .await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/test_openai.py");
    let base = format!("http://{}/v1", s.addr);
    let run = tokio::task::spawn_blocking(move || {
        Command::new(py)
            .args([
                script,
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
        "openai client tests failed:\n{stdout}"
    );
    s.stop().await.unwrap();
}
