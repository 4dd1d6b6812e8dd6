//! `muser tokenize` and `muser detokenize`.

use std::io::Read;

use muser_text::Tokenizer;

use crate::common::{CliResult, ModelOpts};

#[derive(clap::Args)]
pub struct TokenizeArgs {
    #[command(flatten)]
    pub model: ModelOpts,
    /// Parse control tokens written in the text (e.g. "<|eot|>") as their ids.
    #[arg(long)]
    pub special: bool,
    /// Do not prepend the BOS token (added by default when the GGUF asks for it).
    #[arg(long = "no-bos")]
    pub no_bos: bool,
}

/// Read stdin as text, print the token ids as a JSON array.
pub fn tokenize(a: TokenizeArgs) -> CliResult {
    let g = a.model.gguf()?;
    let tok = Tokenizer::from_gguf(&g)?;
    let mut bytes = Vec::new();
    std::io::stdin().read_to_end(&mut bytes)?;
    let text = String::from_utf8(bytes).map_err(|e| {
        format!(
            "stdin is not valid UTF-8 (first bad byte at {})",
            e.utf8_error().valid_up_to()
        )
    })?;
    let ids = tok.encode(&text, tok.add_bos_default() && !a.no_bos, a.special)?;
    println!("{}", serde_json::to_string(&ids)?);
    Ok(())
}

#[derive(clap::Args)]
pub struct DetokenizeArgs {
    #[command(flatten)]
    pub model: ModelOpts,
    /// Leave control tokens out of the text.
    #[arg(long = "skip-special")]
    pub skip_special: bool,
}

/// Read a JSON array of ids on stdin, print the text.
pub fn detokenize(a: DetokenizeArgs) -> CliResult {
    let g = a.model.gguf()?;
    let tok = Tokenizer::from_gguf(&g)?;
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input)?;
    let raw: Vec<i64> = serde_json::from_str(input.trim())
        .map_err(|e| format!("stdin is not a JSON array of token ids: {e}"))?;
    let ids = tok.check_ids(&raw)?;
    print!("{}", tok.decode(&ids, a.skip_special)?);
    Ok(())
}
