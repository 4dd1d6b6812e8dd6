//! `/slots` (llama.cpp's slot actions): a slot's kept cache saved to `--slot-save-path` and
//! restored in another server continues a conversation from the saved tokens, answering exactly
//! as a server that runs the prompt whole; every bad slot request is a 4xx/501 error object.

mod common;

use common::{Opts, Server};
use serde_json::{Value, json};

fn tmp_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("muser-slots-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// The slot that keeps a cache, and how many positions.
async fn kept(s: &Server) -> (usize, u64) {
    let v = s.get("/slots").await.json();
    let a = v.as_array().unwrap_or_else(|| panic!("/slots: {v}"));
    a.iter()
        .filter(|e| e["n_cached"].as_u64().unwrap_or(0) > 0)
        .map(|e| {
            (
                e["id"].as_u64().unwrap() as usize,
                e["n_cached"].as_u64().unwrap(),
            )
        })
        .next()
        .unwrap_or_else(|| panic!("no slot keeps a cache: {v}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saved_slot_restored_in_another_server_continues_the_prompt() {
    let dir = tmp_dir("restore");
    let opts = || Opts {
        parallel: 2,
        slot_dir: Some(dir.clone()),
        ..Opts::default()
    };
    let a = Server::start(opts()).await;
    let head = a
        .token_ids(
            "A lighthouse keeper counted ships every night and wrote their names",
            None,
        )
        .await;
    let r = a
        .post(
            "/v1/completions",
            &json!({"prompt": head, "max_tokens": 1, "temperature": 0}),
        )
        .await;
    assert_eq!(r.status, 200);
    let (slot, n) = kept(&a).await;
    assert_eq!(n as usize, head.len());
    let saved = a
        .post(
            &format!("/slots/{slot}?action=save"),
            &json!({"filename": "keeper.bin"}),
        )
        .await
        .json();
    assert_eq!(saved["n_saved"], n, "{saved}");
    assert_eq!(saved["filename"], "keeper.bin");
    assert_eq!(
        saved["n_written"].as_u64().unwrap(),
        std::fs::metadata(dir.join("keeper.bin")).unwrap().len()
    );
    drop(a);

    // Another server (a restart): restored into slot 1, the longer prompt starts from it.
    let b = Server::start(opts()).await;
    let restored = b
        .post(
            "/slots/1?action=restore",
            &json!({"filename": "keeper.bin"}),
        )
        .await
        .json();
    assert_eq!(restored["n_restored"], n, "{restored}");
    assert_eq!(kept(&b).await, (1, n));
    let mut prompt = head.clone();
    prompt.extend(b.token_ids(" in a book bound with rope", None).await);
    let body = json!({"prompt": prompt, "max_tokens": 10, "temperature": 0, "ignore_eos": true, "logprobs": 2});
    let got = b.post("/v1/completions", &body).await.json();
    assert_eq!(
        got["usage"]["prompt_tokens_details"]["cached_tokens"], n,
        "{got}"
    );
    let fresh = Server::start(Opts {
        prefix_reuse: false,
        ..Opts::default()
    })
    .await;
    let want = fresh.post("/v1/completions", &body).await.json();
    assert_eq!(want["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(got["choices"][0]["text"], want["choices"][0]["text"]);
    assert_eq!(
        got["choices"][0]["logprobs"],
        want["choices"][0]["logprobs"]
    );

    // Erase: the slot keeps nothing; the same prompt then runs whole.
    let (slot, n2) = kept(&b).await;
    let erased = b
        .post(&format!("/slots/{slot}?action=erase"), &json!({}))
        .await
        .json();
    assert_eq!(erased["n_erased"], n2);
    let v = b.get("/slots").await.json();
    assert!(
        v.as_array().unwrap().iter().all(|e| e["n_cached"] == 0),
        "{v}"
    );
    let again = b.post("/v1/completions", &body).await.json();
    assert_eq!(again["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(again["choices"][0]["text"], want["choices"][0]["text"]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_slot_requests_are_refused_by_name() {
    let dir = tmp_dir("bad");
    let s = Server::start(Opts {
        parallel: 2,
        slot_dir: Some(dir.clone()),
        ..Opts::default()
    })
    .await;
    let e = |r: common::Resp, status: u16| -> Value { r.openai_error(status) };
    let f = json!({"filename": "x.bin"});
    // An empty slot has nothing to save; an unknown slot, action or a path for a name.
    let m = e(s.post("/slots/0?action=save", &f).await, 400);
    assert!(m["message"].as_str().unwrap().contains("no cache"), "{m}");
    let m = e(s.post("/slots/7?action=save", &f).await, 400);
    assert_eq!(m["param"], "id_slot");
    let m = e(s.post("/slots/x?action=save", &f).await, 400);
    assert_eq!(m["param"], "id_slot");
    let m = e(s.post("/slots/0?action=explode", &f).await, 400);
    assert_eq!(m["param"], "action");
    let m = e(s.post("/slots/0", &f).await, 400);
    assert_eq!(m["param"], "action");
    for bad in [
        "../escape.bin",
        "/etc/passwd",
        ".hidden",
        "",
        "a b",
        "dir/x",
    ] {
        let m = e(
            s.post("/slots/0?action=restore", &json!({"filename": bad}))
                .await,
            400,
        );
        assert_eq!(m["param"], "filename", "{bad:?}: {m}");
    }
    let m = e(s.post("/slots/0?action=restore", &json!({})).await, 400);
    assert_eq!(m["param"], "filename");
    let m = e(
        s.post(
            "/slots/0?action=restore",
            &json!({"filename": "x.bin", "extra": 1}),
        )
        .await,
        400,
    );
    assert!(
        m["message"].as_str().unwrap().contains("unknown field"),
        "{m}"
    );
    // A file that is not there, one that is not a state file, one from another model.
    let m = e(s.post("/slots/0?action=restore", &f).await, 404);
    assert!(m["message"].as_str().unwrap().contains("x.bin"), "{m}");
    std::fs::write(dir.join("junk.bin"), b"not a state file at all").unwrap();
    let m = e(
        s.post("/slots/0?action=restore", &json!({"filename": "junk.bin"}))
            .await,
        400,
    );
    assert!(m["message"].as_str().unwrap().contains("MUSERKV1"), "{m}");
    let other = muser_engine::ModelFile::open(common::fixture("tame-q8_0")).unwrap();
    let om = muser_engine::MuseGlimmer::load(
        &other,
        muser_engine::CpuBackend::new(muser_engine::NumericMode::Accurate, 1).unwrap(),
    )
    .unwrap();
    let mut sess = muser_engine::Session::new(&om, muser_engine::KvType::F16, 64).unwrap();
    sess.feed(&[1, 2, 3], 3, muser_engine::Logits::Last)
        .unwrap();
    sess.save_state(&dir.join("other.bin"), &[1, 2, 3]).unwrap();
    let m = e(
        s.post("/slots/0?action=restore", &json!({"filename": "other.bin"}))
            .await,
        400,
    );
    assert!(
        m["message"].as_str().unwrap().contains("another model"),
        "{m}"
    );
    // The server still serves.
    let r = s
        .post(
            "/v1/completions",
            &json!({"prompt": "hello", "max_tokens": 2}),
        )
        .await;
    assert_eq!(r.status, 200);

    // Without --slot-save-path: 501 for save and restore (erase and the list still work).
    let plain = Server::start(Opts::default()).await;
    e(plain.post("/slots/0?action=save", &f).await, 501);
    e(plain.post("/slots/0?action=restore", &f).await, 501);
    assert_eq!(
        plain.post("/slots/0?action=erase", &json!({})).await.status,
        200
    );
    assert_eq!(plain.get("/slots").await.status, 200);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Saves run their file writes off the engine thread, so several at once may write to one name:
/// each writes its own temporary file and renames it whole, so the name ends up holding one
/// complete save (that restores) and no temporary file is left; requests run meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn saves_to_one_name_at_once_leave_one_whole_file() {
    let dir = tmp_dir("same-name");
    // A third slot, left empty, for the request that runs while the other two are saved (a
    // new prompt takes an empty slot before a kept cache; a slot running one answers 409).
    let s = Server::start(Opts {
        parallel: 3,
        slot_dir: Some(dir.clone()),
        ..Opts::default()
    })
    .await;
    let short = s.token_ids("Rain on the harbour wall", None).await;
    let long = s
        .token_ids(
            "The cartographer drew every island twice, once as it was and once as the sailors told it",
            None,
        )
        .await;
    assert_ne!(short.len(), long.len());
    let run = |p: &Vec<u64>| json!({"prompt": p, "max_tokens": 1, "temperature": 0});
    let (rs, rl) = (run(&short), run(&long));
    let (a, b) = tokio::join!(
        s.post("/v1/completions", &rs),
        s.post("/v1/completions", &rl)
    );
    assert_eq!((a.status, b.status), (200, 200));
    let v = s.get("/slots").await.json();
    let kept: Vec<(u64, u64)> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["id"].as_u64().unwrap(), e["n_cached"].as_u64().unwrap()))
        .filter(|&(_, n)| n > 0)
        .collect();
    let mut cached: Vec<u64> = kept.iter().map(|&(_, n)| n).collect();
    cached.sort();
    assert_eq!(cached, [short.len() as u64, long.len() as u64], "{v}");
    let ids: Vec<u64> = kept.iter().map(|&(id, _)| id).collect();

    let f = json!({"filename": "same.bin"});
    let saves = (0..8).map(|i| {
        let s = &s;
        let f = &f;
        let id = ids[i % 2];
        async move { s.post(&format!("/slots/{id}?action=save"), f).await }
    });
    let hello = json!({"prompt": "hello there", "max_tokens": 3});
    let during = s.post("/v1/completions", &hello);
    let (done, other) = tokio::join!(futures_util::future::join_all(saves), during);
    assert_eq!(other.status, 200);
    for r in done {
        let v = r.json();
        assert!(v["n_written"].as_u64().unwrap() > 0, "{v}");
        assert!(
            v["timings"]["copy_ms"].as_f64().unwrap() <= v["timings"]["save_ms"].as_f64().unwrap(),
            "{v}"
        );
    }
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["same.bin"], "temporary files left behind");
    let st = muser_engine::state::load(&dir.join("same.bin")).unwrap();
    let saved: Vec<u64> = st.tokens.iter().map(|&t| u64::from(t)).collect();
    assert!(saved == short || saved == long);
    let r = s
        .post(&format!("/slots/{}?action=restore", ids[0]), &f)
        .await
        .json();
    assert_eq!(r["n_restored"], st.tokens.len(), "{r}");
    assert_eq!(
        r["n_read"],
        std::fs::metadata(dir.join("same.bin")).unwrap().len()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
