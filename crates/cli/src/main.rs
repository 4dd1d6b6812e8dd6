//! `muser`: load a Muse Glimmer GGUF, inspect it, compute logits, generate, benchmark.

mod bench;
mod chat;
mod common;
mod generate;
mod inspect;
mod logits;
mod serve;
mod synth;
mod text;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "muser",
    version,
    about = "Muser: an inference engine for Muse Glimmer 30B"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print a GGUF's metadata, tensors, layer kinds and load-time probes.
    Inspect(inspect::Args),
    /// Teacher-forced logits of every position: int32 token ids in, f32 logits out.
    Logits(logits::Args),
    /// Generate a continuation of a prompt.
    Generate(generate::Args),
    /// Measure prompt and decode throughput.
    Bench(bench::Args),
    /// Write a synthetic Muse Glimmer GGUF with random weights (speed tests only).
    Synth(synth::Args),
    /// Talk to the model through its chat template.
    Chat(chat::Args),
    /// Text on stdin to token ids (a JSON array) on stdout.
    Tokenize(text::TokenizeArgs),
    /// A JSON array of token ids on stdin to text on stdout.
    Detokenize(text::DetokenizeArgs),
    /// Serve the model over an OpenAI-compatible HTTP API.
    Serve(serve::Args),
}

fn main() -> ExitCode {
    // NVLink multicast (NVLS) in NCCL can take a host's shared GPUs out of service; Muser's
    // tensor-parallel all-reduce does not need it. Off unless the environment says otherwise.
    if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
        // SAFETY: the first statement of main, before any thread exists.
        unsafe { std::env::set_var("NCCL_NVLS_ENABLE", "0") };
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Inspect(a) => inspect::run(a),
        Command::Logits(a) => logits::run(a),
        Command::Generate(a) => generate::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Synth(a) => synth::run(a),
        Command::Chat(a) => chat::run(a),
        Command::Tokenize(a) => text::tokenize(a),
        Command::Detokenize(a) => text::detokenize(a),
        Command::Serve(a) => serve::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
