// kv_slots: record where llama.cpp b11434 puts each token in its KV caches and the n_kv of every
// ubatch graph, for a muse-glimmer model (one sequence, flash attention off, swa_full false), to
// check Muser's KvLayout simulator (crates/engine/src/cpu/ggml/kv_layout.rs).
//
// A cb_eval callback reads, for every ubatch graph, the row indices of the K-cache set_rows of the
// first full layer and the first sliding layer (their src[1], the attn_inp_k_idxs input), and the
// n_kv of those layers (ne0 of kq_soft_max-<il>).
//
// usage: kv_slots MODEL.gguf OUT.txt n_ctx n_ubatch n_batch SCHEDULE
//   the first full-attention and the first sliding layer are read from the GGUF's
//   muse-glimmer.attention.sliding_window_pattern
//   SCHEDULE: comma-separated llama_decode sizes, e.g. 150,1x300,100,1x200 (NxM = M decodes of N)
// output lines: `ubatch n=<tokens> pos0=<first position> full_nkv=<n> swa_nkv=<n> full=<slots> swa=<slots>`

#include "llama.h"
#include "ggml.h"
#include "gguf.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

struct rec {
    FILE * out = nullptr;
    int pos = 0;  // first position of the next ubatch
    int full_layer = -1, swa_layer = -1;
    std::vector<int64_t> full_slots, swa_slots;
    int64_t full_nkv = -1, swa_nkv = -1;
};

static bool ends_with_layer(const char * name, const char * prefix, int il) {
    char want[128];
    snprintf(want, sizeof want, "%s-%d", prefix, il);
    return strcmp(name, want) == 0;
}

static bool cb(struct ggml_tensor * t, bool ask, void * user) {
    rec * r = (rec *) user;
    if (ask) {
        return t->op == GGML_OP_SET_ROWS || t->op == GGML_OP_SOFT_MAX;
    }
    if (t->op == GGML_OP_SET_ROWS && t->view_src) {
        char want_full[64], want_swa[64];
        snprintf(want_full, sizeof want_full, "cache_k_l%d", r->full_layer);
        snprintf(want_swa, sizeof want_swa, "cache_k_l%d", r->swa_layer);
        const ggml_tensor * idx = t->src[1];
        std::vector<int64_t> v((size_t) ggml_nelements(idx));
        memcpy(v.data(), idx->data, v.size() * sizeof(int64_t));
        if (strcmp(t->view_src->name, want_full) == 0) r->full_slots = v;
        if (strcmp(t->view_src->name, want_swa) == 0) r->swa_slots = v;
    }
    if (t->op == GGML_OP_SOFT_MAX) {
        if (ends_with_layer(t->name, "kq_soft_max", r->full_layer)) r->full_nkv = t->ne[0];
        if (ends_with_layer(t->name, "kq_soft_max", r->swa_layer)) r->swa_nkv = t->ne[0];
        if (r->full_nkv >= 0 && r->swa_nkv >= 0) {
            // both layers of this ubatch graph seen: one record
            if (r->full_slots.size() != r->swa_slots.size() || r->full_slots.empty()) {
                fprintf(stderr, "kv_slots: incomplete record at pos %d\n", r->pos);
                exit(1);
            }
            fprintf(r->out, "ubatch n=%zu pos0=%d full_nkv=%lld swa_nkv=%lld full=", r->full_slots.size(), r->pos,
                    (long long) r->full_nkv, (long long) r->swa_nkv);
            for (size_t i = 0; i < r->full_slots.size(); i++) fprintf(r->out, "%s%lld", i ? "," : "", (long long) r->full_slots[i]);
            fprintf(r->out, " swa=");
            for (size_t i = 0; i < r->swa_slots.size(); i++) fprintf(r->out, "%s%lld", i ? "," : "", (long long) r->swa_slots[i]);
            fprintf(r->out, "\n");
            r->pos += (int) r->full_slots.size();
            r->full_slots.clear();
            r->swa_slots.clear();
            r->full_nkv = r->swa_nkv = -1;
        }
    }
    return true;
}

static void log_cb(enum ggml_log_level level, const char * text, void *) {
    if (level == GGML_LOG_LEVEL_ERROR || level == GGML_LOG_LEVEL_WARN) fputs(text, stderr);
}

int main(int argc, char ** argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: %s MODEL.gguf OUT.txt n_ctx n_ubatch n_batch SCHEDULE\n", argv[0]);
        return 1;
    }
    const int n_ctx = atoi(argv[3]), n_ubatch = atoi(argv[4]), n_batch = atoi(argv[5]);
    std::vector<int> sizes;
    {
        std::string s = argv[6];
        size_t p = 0;
        while (p < s.size()) {
            size_t q = s.find(',', p);
            std::string item = s.substr(p, q == std::string::npos ? std::string::npos : q - p);
            size_t x = item.find('x');
            if (x == std::string::npos) {
                sizes.push_back(atoi(item.c_str()));
            } else {
                const int n = atoi(item.substr(0, x).c_str()), m = atoi(item.substr(x + 1).c_str());
                for (int i = 0; i < m; i++) sizes.push_back(n);
            }
            if (q == std::string::npos) break;
            p = q + 1;
        }
    }

    llama_log_set(log_cb, nullptr);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    mp.use_extra_bufts = false;
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "cannot load %s\n", argv[1]); return 1; }

    rec r;
    {
        gguf_init_params gp = { true, nullptr };
        gguf_context * g = gguf_init_from_file(argv[1], gp);
        const int64_t key = g ? gguf_find_key(g, "muse-glimmer.attention.sliding_window_pattern") : -1;
        if (key < 0 || gguf_get_arr_type(g, key) != GGUF_TYPE_BOOL) { fprintf(stderr, "no sliding_window_pattern\n"); return 1; }
        const bool * pat = (const bool *) gguf_get_arr_data(g, key);
        for (size_t il = 0; il < gguf_get_arr_n(g, key); il++) {
            if (pat[il] && r.swa_layer < 0) r.swa_layer = (int) il;
            if (!pat[il] && r.full_layer < 0) r.full_layer = (int) il;
        }
        gguf_free(g);
        if (r.full_layer < 0 || r.swa_layer < 0) { fprintf(stderr, "need a full and a sliding layer\n"); return 1; }
    }

    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = n_batch;
    cp.n_ubatch = n_ubatch;
    cp.n_seq_max = 1;
    cp.n_threads = 2;
    cp.n_threads_batch = 2;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.swa_full = false;
    cp.no_perf = true;
    cp.cb_eval = cb;
    cp.cb_eval_user_data = &r;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "cannot create context\n"); return 1; }

    FILE * out = fopen(argv[2], "w");
    r.out = out;
    fprintf(out, "# kv_slots model=%s n_ctx=%d (%u) n_ubatch=%d n_batch=%d n_swa=%d full_layer=%d swa_layer=%d schedule=%s\n",
            argv[1], n_ctx, llama_n_ctx(ctx), n_ubatch, n_batch, llama_model_n_swa(model), r.full_layer, r.swa_layer, argv[6]);

    int pos = 0;
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    for (int n : sizes) {
        llama_batch batch = llama_batch_init(n, 0, 1);
        batch.n_tokens = n;
        for (int j = 0; j < n; j++) {
            batch.token[j] = (pos + j * 7) % n_vocab;
            batch.pos[j] = pos + j;
            batch.n_seq_id[j] = 1;
            batch.seq_id[j][0] = 0;
            batch.logits[j] = j == n - 1;
        }
        if (llama_decode(ctx, batch) != 0) { fprintf(stderr, "decode failed at pos %d\n", pos); return 1; }
        llama_batch_free(batch);
        pos += n;
    }
    fclose(out);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
