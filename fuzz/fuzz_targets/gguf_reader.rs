//! Fuzz the GGUF reader and the Muse Glimmer loader on arbitrary bytes: any input must give
//! Ok or a clean error; tensor data of an accepted file must be readable in full.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(g) = muser_gguf::Gguf::from_bytes(data.to_vec()) {
        for t in g.tensors() {
            let bytes = g.tensor_data(t);
            assert_eq!(bytes.len() as u64, t.n_bytes);
        }
        for (_, v) in g.metadata() {
            let _ = v.summary(4);
        }
        let _ = muser_engine::ModelFile::from_gguf(std::sync::Arc::new(g));
    }
});
