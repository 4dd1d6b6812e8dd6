//! A split model (tests/fixtures/models/split: tame-q4_k_m cut into three shards by llama.cpp's
//! gguf-py, as `convert_hf_to_gguf.py --split-max-tensors 16` writes them) loads from its first
//! shard and computes exactly what the whole file computes.

mod common;

use muser_engine::{CpuBackend, KvType, ModelFile, MuseGlimmer, NumericMode};

#[test]
fn a_split_model_computes_what_the_whole_file_computes() {
    let split = common::fixtures_dir().join("models/split/tame-q4_k_m-00001-of-00003.gguf");
    let sf = ModelFile::open(&split).unwrap_or_else(|e| panic!("{}: {e}", split.display()));
    let wf = ModelFile::open(common::model_path("tame-q4_k_m")).unwrap();
    assert_eq!(sf.gguf.n_shards(), 3);
    assert_eq!(sf.gguf.tensors().len(), wf.gguf.tensors().len());
    assert_eq!(sf.config, wf.config);
    // Every tensor's bytes are the whole file's, wherever its shard put them.
    let shards: std::collections::BTreeSet<u16> =
        sf.gguf.tensors().iter().map(|t| t.shard).collect();
    assert_eq!(shards.into_iter().collect::<Vec<_>>(), [0, 1, 2]);
    for t in sf.gguf.tensors() {
        let w = wf.gguf.tensor(&t.name).unwrap();
        assert_eq!(sf.gguf.tensor_data(t), wf.gguf.tensor_data(w), "{}", t.name);
    }
    let tokens = common::read_i32(&common::golden_path("tame-q4_k_m", "tokens.i32"));
    let run = |f: &ModelFile| {
        let m = MuseGlimmer::load(f, CpuBackend::new(NumericMode::Accurate, 0).unwrap()).unwrap();
        common::logits(&m, &tokens, KvType::F32, 7)
    };
    let (a, b) = (run(&sf), run(&wf));
    assert_eq!(a.len(), tokens.len() * wf.config.n_vocab);
    assert!(
        a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
        "the split model's logits differ from the whole file's"
    );
}
