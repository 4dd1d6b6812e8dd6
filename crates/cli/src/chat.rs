//! `muser chat`: an interactive conversation through the model's chat template, streaming the
//! answer (reasoning shown dimmed), keeping the history; `/reset` forgets it, `/save F` writes
//! the conversation (its messages to `F.json`, its cache to `F`: `muser_engine::state`) and
//! `/load F` takes it up again without running it, Ctrl-C stops the answer being written (not
//! the program), `/quit` or Ctrl-D leaves.

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use muser_engine::{Backend, KvType, Logits, MuseGlimmer, Sampler, Session};
use muser_text::{ChatDelta, ChatTemplate, Message, StreamDecoder, Tokenizer, ToolCallParser};

use crate::common::{CliResult, ModelOpts};
use crate::generate::{SampleOpts, run_loop};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelOpts,
    /// Use this Jinja chat template instead of the GGUF's.
    #[arg(long = "chat-template-file")]
    pub chat_template_file: Option<PathBuf>,
    /// A system message opening the conversation.
    #[arg(long)]
    pub system: Option<String>,
    #[command(flatten)]
    pub sample: SampleOpts,
}

pub fn run(a: Args) -> CliResult {
    let params = a.sample.params()?;
    // A bad --draft-ngram is named before the weights load.
    a.sample.draft()?;
    let g = a.model.gguf()?;
    let tok = Tokenizer::from_gguf(&g)?;
    let mut template = match &a.chat_template_file {
        Some(p) => ChatTemplate::from_file(p)?,
        None => {
            ChatTemplate::from_gguf(&g).map_err(|e| format!("{e} (give --chat-template-file)"))?
        }
    };
    template.set_special_tokens(&tok);
    // The cache type first: a bad --kv-type is named before the weights load.
    let kv = a.model.kv()?;
    let loaded = a.model.load_from(g)?;
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    ctrlc::set_handler(move || s2.store(true, Ordering::SeqCst))
        .map_err(|e| format!("cannot install the Ctrl-C handler: {e}"))?;
    crate::with_model!(&loaded, model => chat(model, &a, &tok, &template, params, kv, &stop))
}

#[allow(clippy::too_many_arguments)]
fn chat<B: Backend>(
    model: &MuseGlimmer<B>,
    a: &Args,
    tok: &Tokenizer,
    template: &ChatTemplate,
    params: muser_engine::SamplingParams,
    kv: KvType,
    stop: &AtomicBool,
) -> CliResult {
    let n_ctx = a.sample.ctx_size.min(model.config.n_ctx_train);
    let draft = a.sample.draft()?;
    let mut session = Session::new(model, kv, n_ctx)?;
    let mut cached: Vec<u32> = Vec::new();
    let mut history: Vec<Message> = Vec::new();
    if let Some(sys) = &a.system {
        history.push(Message::new("system", sys.clone()));
    }
    let parser = ToolCallParser::new(&[]);
    let eog = tok.eog_ids();
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    eprintln!(
        "chat: /reset forgets the conversation, /save F and /load F keep it in files, /quit leaves, Ctrl-C stops an answer"
    );
    loop {
        write!(out, "\n> ")?;
        out.flush()?;
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            writeln!(out)?;
            return Ok(());
        }
        // After the line: a Ctrl-C at the prompt does not stop the answer to come.
        stop.store(false, Ordering::SeqCst);
        let line = line.trim_end_matches(['\n', '\r']);
        match line.trim() {
            "" => continue,
            "/quit" | "/exit" => return Ok(()),
            "/reset" => {
                history.retain(|m| m.role == "system");
                session.reset();
                cached.clear();
                eprintln!("[conversation forgotten]");
                continue;
            }
            t if t.starts_with("/save ") || t.starts_with("/load ") => {
                let path = PathBuf::from(t[6..].trim());
                let r = if t.starts_with("/save ") {
                    save_chat(&session, &cached, &history, &path)
                } else {
                    load_chat(&mut session, &mut cached, &mut history, &path)
                };
                match r {
                    Ok(m) => eprintln!("[{m}]"),
                    Err(e) => eprintln!("error: {e}"),
                }
                continue;
            }
            _ => {}
        }
        history.push(Message::new("user", line.to_string()));
        let msgs = serde_json::to_value(&history)?;
        let ids = match template.encode_sanitized(tok, &msgs, None, true, None) {
            Ok(ids) => ids,
            Err(e) => {
                history.pop();
                eprintln!("error: {e}");
                continue;
            }
        };
        if ids.len() + 1 >= n_ctx {
            history.pop();
            eprintln!(
                "error: the conversation ({} tokens) no longer fits the context of {n_ctx}; /reset to start over",
                ids.len()
            );
            continue;
        }
        // Reuse the cache up to the longest prefix it shares with the new prompt (the template
        // may render the last answer otherwise than it was generated), where the cache can go
        // back to it; the prompt's last token always runs (its logits). Otherwise start over.
        let common = cached
            .iter()
            .zip(&ids)
            .take_while(|(a, b)| a == b)
            .count()
            .min(ids.len().saturating_sub(1))
            .min(session.pos());
        let common = if common > 0 && session.truncate(common) {
            common
        } else {
            session.reset();
            0
        };
        let mut sampler = Sampler::new(params.clone());
        ids.iter().for_each(|&t| sampler.accept(t));
        let logits = session.feed(&ids[common..], a.sample.ubatch, Logits::Last)?;
        cached = ids;
        let mut dec = StreamDecoder::new(false, Vec::<String>::new());
        let mut atem = parser.stream();
        let show = |deltas: Vec<ChatDelta>, out: &mut std::io::Stdout| -> std::io::Result<()> {
            for d in deltas {
                match d {
                    ChatDelta::Content(t) => write!(out, "{t}")?,
                    ChatDelta::Reasoning(t) => write!(out, "\x1b[2m{t}\x1b[0m")?,
                    ChatDelta::ToolCall { call, .. } => write!(
                        out,
                        "\n[tool call {} {}]",
                        call.function.name, call.function.arguments
                    )?,
                }
            }
            out.flush()
        };
        let generated = run_loop(
            &mut session,
            &mut sampler,
            logits,
            a.sample.n_predict,
            &eog,
            stop,
            &cached,
            draft,
            &mut |t| {
                let text = dec.push(tok, t)?;
                show(atem.push(&text), &mut std::io::stdout())?;
                Ok(())
            },
        )?;
        let tail = dec.finish();
        show(atem.push(&tail), &mut out)?;
        show(atem.finish(), &mut out)?;
        if stop.load(Ordering::SeqCst) {
            write!(out, " [stopped]")?;
        }
        writeln!(out)?;
        cached.extend(generated.tokens.iter().filter(|t| !eog.contains(t)));
        // Only what the cache holds (a token drawn when the context filled was not run).
        cached.truncate(session.pos());
        let msg = atem.into_message().into_message();
        history.push(msg);
    }
}

/// The messages' file beside a conversation's state file.
fn messages_path(path: &std::path::Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".json");
    PathBuf::from(p)
}

/// `/save F`: the cache and the tokens it holds to F, the messages to F.json.
fn save_chat<B: Backend>(
    session: &Session<'_, B>,
    cached: &[u32],
    history: &[Message],
    path: &std::path::Path,
) -> Result<String, Box<dyn std::error::Error>> {
    let n = session.save_state(path, cached)?;
    std::fs::write(messages_path(path), serde_json::to_vec_pretty(history)?)?;
    Ok(format!(
        "{} messages and {} cached positions saved to {} ({n} bytes) and {}",
        history.len(),
        cached.len(),
        path.display(),
        messages_path(path).display()
    ))
}

/// `/load F`: the conversation `/save F` wrote. Both files are read and checked before anything
/// changes; a state that does not fit this model or context is refused.
fn load_chat<B: Backend>(
    session: &mut Session<'_, B>,
    cached: &mut Vec<u32>,
    history: &mut Vec<Message>,
    path: &std::path::Path,
) -> Result<String, Box<dyn std::error::Error>> {
    let mp = messages_path(path);
    let text = std::fs::read(&mp).map_err(|e| format!("{}: {e}", mp.display()))?;
    let messages: Vec<Message> =
        serde_json::from_slice(&text).map_err(|e| format!("{}: {e}", mp.display()))?;
    let (tokens, made_by) = session.load_state(path)?;
    *cached = tokens;
    *history = messages;
    Ok(format!(
        "{} messages and {} cached positions loaded from {} (computed by {made_by})",
        history.len(),
        cached.len(),
        path.display()
    ))
}
