// ggml-golden: golden outputs of the real ggml-cpu (llama.cpp b11434, CPU build, no repack) for
// Muser's parity kernels (crates/engine/src/cpu/ggml).
//
// Every case builds a tiny ggml graph on the CPU backend (ggml_graph_compute_with_ctx, the same
// ggml_graph_plan/ggml_graph_compute that llama.cpp's CPU backend runs), or calls a ggml-cpu
// routine directly (the quantizers), on inputs drawn from a seeded generator that the Rust tests
// re-implement bit for bit (see `gen` below and crates/engine/tests/ggml_common/mod.rs).
// Only the outputs are written: one blob (goldens.bin) and a manifest (manifest.txt) with one
// line per case: `name op key=value ... off=<byte offset> len=<bytes>`.
//
// Every graph is run with 1, 2 and 3 threads and the outputs are compared: ggml's results must not
// depend on the thread count (the harness aborts if they do).
//
// usage: ggml-golden <out-dir>

#include "ggml.h"
#include "ggml-cpu.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

// ------------------------------------------------------------------------------------------------
// generator (mirrored in Rust)

struct Rng {
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed) {}
    uint64_t next() {  // splitmix64
        s += 0x9E3779B97F4A7C15ull;
        uint64_t z = s;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    // uniform in [-1, 1), 24-bit grid: exact in f32
    float unif() { return (float) (next() >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f; }
    // activation-like: uniform times 0.5, 2 or 8 (powers of two keep it exact)
    float act() {
        const float u = unif();
        const uint64_t k = next() & 31;
        const float amp = k == 0 ? 8.0f : (k < 8 ? 2.0f : 0.5f);
        return u * amp;
    }
};

static std::vector<float> gen_act(Rng & r, size_t n) {
    std::vector<float> v(n);
    for (auto & x : v) x = r.act();
    return v;
}

static uint16_t f16_bits(Rng & r, uint32_t exp_field) {  // positive f16 with the given exponent field
    return (uint16_t) ((exp_field << 10) | (r.next() & 0x3FF));
}

static void put16(uint8_t * p, uint16_t v) { memcpy(p, &v, 2); }

static unsigned fbits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

// weights of `type`, `rows` rows of `cols` values, as raw ggml bytes
static std::vector<uint8_t> gen_weights(Rng & r, ggml_type type, int64_t rows, int64_t cols) {
    const size_t rs = ggml_row_size(type, cols);
    std::vector<uint8_t> w(rs * rows);
    switch (type) {
        case GGML_TYPE_F32: {
            for (size_t i = 0; i < w.size() / 4; i++) { const float x = r.act(); memcpy(&w[4 * i], &x, 4); }
        } break;
        case GGML_TYPE_F16: {
            for (size_t i = 0; i < w.size() / 2; i++) {
                const uint16_t s = r.next() & 1;
                const uint16_t e = 11 + r.next() % 5;
                const uint16_t m = r.next() & 0x3FF;
                put16(&w[2 * i], (uint16_t) ((s << 15) | (e << 10) | m));
            }
        } break;
        case GGML_TYPE_BF16: {
            for (size_t i = 0; i < w.size() / 2; i++) {
                const uint16_t s = r.next() & 1;
                const uint16_t e = 119 + r.next() % 8;
                const uint16_t m = r.next() & 0x7F;
                put16(&w[2 * i], (uint16_t) ((s << 15) | (e << 7) | m));
            }
        } break;
        default: {
            for (auto & b : w) b = (uint8_t) (r.next() & 0xFF);
            const size_t bs = ggml_type_size(type);
            for (size_t o = 0; o < w.size(); o += bs) {
                uint8_t * b = &w[o];
                switch (type) {
                    case GGML_TYPE_Q8_0:
                        put16(b, f16_bits(r, 7));
                        for (int j = 0; j < 32; j++) if (b[2 + j] == 0x80) b[2 + j] = 0x81;
                        break;
                    case GGML_TYPE_Q4_0: put16(b, f16_bits(r, 7)); break;
                    case GGML_TYPE_Q4_K:
                    case GGML_TYPE_Q5_K: put16(b, f16_bits(r, 6)); put16(b + 2, f16_bits(r, 6)); break;
                    case GGML_TYPE_Q6_K: put16(b + 208, f16_bits(r, 6)); break;
                    default: fprintf(stderr, "gen_weights: unsupported type %s\n", ggml_type_name(type)); exit(1);
                }
            }
        } break;
    }
    return w;
}

// ------------------------------------------------------------------------------------------------
// output

static FILE * g_blob = nullptr;
static FILE * g_manifest = nullptr;
static uint64_t g_off = 0;

static void emit(const std::string & name, const std::string & desc, const void * data, size_t len) {
    fwrite(data, 1, len, g_blob);
    fprintf(g_manifest, "%s %s off=%llu len=%zu\n", name.c_str(), desc.c_str(), (unsigned long long) g_off, len);
    g_off += len;
}

static std::string tname(ggml_type t) { return ggml_type_name(t); }

// ------------------------------------------------------------------------------------------------
// graph helpers

struct Ctx {
    ggml_context * ctx;
    explicit Ctx(size_t mb) {
        ggml_init_params p = { mb * 1024 * 1024, nullptr, false };
        ctx = ggml_init(p);
    }
    ~Ctx() { ggml_free(ctx); }
};

static void set_data(ggml_tensor * t, const void * src, size_t len) {
    if (ggml_nbytes(t) != len) { fprintf(stderr, "set_data: %zu != %zu\n", ggml_nbytes(t), len); exit(1); }
    memcpy(t->data, src, len);
}

// compute `out` with 1, 2 and 3 threads; the results must agree; return the bytes
static std::vector<uint8_t> compute(ggml_context * ctx, ggml_tensor * out, const char * what,
                                    std::vector<ggml_tensor *> restore = {}, std::vector<std::vector<uint8_t>> saved = {}) {
    ggml_cgraph * gf = ggml_new_graph_custom(ctx, 256, false);
    ggml_build_forward_expand(gf, out);
    std::vector<uint8_t> first;
    for (int nt : {2, 1, 3}) {
        for (size_t i = 0; i < restore.size(); i++) memcpy(restore[i]->data, saved[i].data(), saved[i].size());
        if (ggml_graph_compute_with_ctx(ctx, gf, nt) != GGML_STATUS_SUCCESS) { fprintf(stderr, "%s: compute failed\n", what); exit(1); }
        std::vector<uint8_t> res((uint8_t *) out->data, (uint8_t *) out->data + ggml_nbytes(out));
        if (first.empty()) {
            first = res;
        } else if (res != first) {
            fprintf(stderr, "%s: result depends on the thread count (%d threads)\n", what, nt);
            exit(1);
        }
    }
    return first;
}

// ------------------------------------------------------------------------------------------------
// cases

// direct calls of ggml-cpu's from_float (quantize_row_q8_0, quantize_row_q8_K, fp32->fp16/bf16)
static void case_from_float(ggml_type type, const std::string & name, const std::vector<float> & x, const std::string & desc) {
    const auto * tr = ggml_get_type_traits_cpu(type);
    std::vector<uint8_t> out(ggml_row_size(type, x.size()));
    tr->from_float(x.data(), out.data(), (int64_t) x.size());
    emit(name, "from_float type=" + tname(type) + " n=" + std::to_string(x.size()) + " " + desc, out.data(), out.size());
}

static std::vector<float> crafted_q(Rng & r, size_t n) {
    // ties and edge cases for the quantizers: halves at scale 1 (amax 127), zero blocks, a lone max,
    // signed max of either sign, tiny values, then random activations
    std::vector<float> x(n);
    for (size_t i = 0; i < n; i++) {
        const size_t blk = i / 256, j = i % 256;
        switch (blk % 5) {
            case 0: x[i] = (j == 0) ? 127.0f : (float) ((int) (j % 64) - 32) + 0.5f; break;
            case 1: x[i] = 0.0f; break;
            case 2: x[i] = (j == 77) ? -3.0f : r.unif() * 1e-3f; break;
            case 3: x[i] = (j == 5) ? -127.0f : ((j % 2) ? 0.5f : -0.5f) * (float) (j % 7); break;
            default: x[i] = r.act(); break;
        }
    }
    return x;
}

static void cases_quantize() {
    for (uint64_t seed : {1, 2}) {
        Rng r(seed);
        auto x = (seed == 1) ? crafted_q(r, 256 * 10) : gen_act(r, 256 * 16);
        const std::string d = "gen=" + std::string(seed == 1 ? "crafted" : "act") + " seed=" + std::to_string(seed);
        case_from_float(GGML_TYPE_Q8_0, "q8_0_" + std::to_string(seed), x, d);
        case_from_float(GGML_TYPE_Q8_K, "q8_K_" + std::to_string(seed), x, d);
        case_from_float(GGML_TYPE_F16,  "f16_" + std::to_string(seed), x, d);
        case_from_float(GGML_TYPE_BF16, "bf16_" + std::to_string(seed), x, d);
    }
    {
        // fp16 / bf16 rounding edges: subnormals, overflow, ties
        std::vector<float> x;
        const uint32_t pats[] = { 0x33000000, 0x33000001, 0x337FFFFF, 0x38800000, 0x387FC000, 0x387FE000, 0x387FF000,
                                  0x477FE000, 0x477FF000, 0x477FEFFF, 0x47800000, 0x3F801000, 0x3F803000, 0x3F800800,
                                  0x3F808000, 0x3F818000, 0xBF808000, 0x00000001, 0x80000000, 0x7F7FFFFF, 0xFF7FFFFF,
                                  0x3FFF8000, 0x3FFE8000, 0x34000000, 0x33800000, 0x33C00000, 0x2F800000 };
        for (uint32_t p : pats) { float f; memcpy(&f, &p, 4); x.push_back(f); }
        while (x.size() % 32) x.push_back(0.0f);
        case_from_float(GGML_TYPE_F16,  "f16_edges", x, "gen=edges seed=0");
        case_from_float(GGML_TYPE_BF16, "bf16_edges", x, "gen=edges seed=0");
    }
}

static void case_mul_mat(ggml_type type, int64_t rows, int64_t cols, int64_t ntok, uint64_t seed) {
    Rng r(seed);
    auto w = gen_weights(r, type, rows, cols);
    auto x = gen_act(r, (size_t) (cols * ntok));
    Ctx c(64 + (w.size() + x.size() * 4) / (1024 * 1024) * 3);
    ggml_tensor * tw = ggml_new_tensor_2d(c.ctx, type, cols, rows);
    ggml_tensor * tx = ggml_new_tensor_2d(c.ctx, GGML_TYPE_F32, cols, ntok);
    set_data(tw, w.data(), w.size());
    set_data(tx, x.data(), x.size() * 4);
    ggml_tensor * y = ggml_mul_mat(c.ctx, tw, tx);
    const std::string name = "mm_" + tname(type) + "_" + std::to_string(rows) + "x" + std::to_string(cols) + "_t" + std::to_string(ntok);
    auto out = compute(c.ctx, y, name.c_str());
    emit(name, "mul_mat type=" + tname(type) + " rows=" + std::to_string(rows) + " cols=" + std::to_string(cols) +
               " ntok=" + std::to_string(ntok) + " seed=" + std::to_string(seed), out.data(), out.size());
}

static void cases_mul_mat() {
    const ggml_type types[] = { GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0,
                                GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K };
    uint64_t seed = 100;
    for (ggml_type t : types) {
        for (int64_t ntok : {1, 2, 3, 7, 8, 9, 16, 17, 32, 100}) {
            case_mul_mat(t, 64, 512, ntok, seed++);
        }
        // ragged row counts (not a multiple of 4 / 16), long rows
        case_mul_mat(t, 18, 2048, 1, seed++);
        case_mul_mat(t, 18, 2048, 5, seed++);
        case_mul_mat(t, 40, 2048, 12, seed++);
        case_mul_mat(t, 100, 256, 33, seed++);
        case_mul_mat(t, 36, 1024, 300, seed++);
    }
    // muse-glimmer's real row lengths (n_embd 6656, n_ff 19968): the tiled kernel's narrow (<= 16 columns)
    // and standard paths over many K blocks, vec_dot over long rows
    case_mul_mat(GGML_TYPE_Q4_K, 20, 6656, 9, seed++);
    case_mul_mat(GGML_TYPE_Q4_K, 20, 6656, 1, seed++);
    case_mul_mat(GGML_TYPE_Q6_K, 20, 19968, 8, seed++);
    case_mul_mat(GGML_TYPE_Q5_K, 20, 19968, 17, seed++);
    case_mul_mat(GGML_TYPE_Q6_K, 20, 6656, 3, seed++);
    case_mul_mat(GGML_TYPE_Q8_0, 20, 6656, 5, seed++);
    case_mul_mat(GGML_TYPE_F16, 20, 6656, 2, seed++);
    case_mul_mat(GGML_TYPE_F16, 20, 6656, 1, seed++);
    // f32/f16/bf16 rows whose length is not a multiple of 32 (vec_dot leftovers, sgemm partial loads)
    for (ggml_type t : { GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16 }) {
        for (int64_t ntok : {1, 4}) {
            case_mul_mat(t, 12, 200, ntok, seed++);
            case_mul_mat(t, 12, 45, ntok, seed++);
        }
    }
}

static void case_rms_norm(int64_t n, int64_t rows, float eps, bool with_mul, uint64_t seed) {
    Rng r(seed);
    auto x = gen_act(r, (size_t) (n * rows));
    auto w = gen_act(r, (size_t) n);
    Ctx c(64);
    ggml_tensor * tx = ggml_new_tensor_2d(c.ctx, GGML_TYPE_F32, n, rows);
    ggml_tensor * tw = ggml_new_tensor_1d(c.ctx, GGML_TYPE_F32, n);
    set_data(tx, x.data(), x.size() * 4);
    set_data(tw, w.data(), w.size() * 4);
    ggml_tensor * y = ggml_rms_norm(c.ctx, tx, eps);
    if (with_mul) y = ggml_mul(c.ctx, y, tw);
    char epsbuf[32];
    snprintf(epsbuf, sizeof epsbuf, "%08x", fbits(eps));
    const std::string name = std::string(with_mul ? "rmsmul_" : "rms_") + std::to_string(n) + "x" + std::to_string(rows) + "_" + epsbuf;
    auto out = compute(c.ctx, y, name.c_str());
    emit(name, std::string("rms_norm") + " n=" + std::to_string(n) + " rows=" + std::to_string(rows) + " eps_bits=" + epsbuf +
               " mul=" + (with_mul ? "1" : "0") + " seed=" + std::to_string(seed), out.data(), out.size());
}

static void case_rope(int64_t n_head, int64_t ntok, float base, int32_t pos0, int32_t step, uint64_t seed) {
    const int64_t hd = 128;
    Rng r(seed);
    auto x = gen_act(r, (size_t) (hd * n_head * ntok));
    Ctx c(64);
    ggml_tensor * tx = ggml_new_tensor_3d(c.ctx, GGML_TYPE_F32, hd, n_head, ntok);
    ggml_tensor * tp = ggml_new_tensor_1d(c.ctx, GGML_TYPE_I32, ntok);
    set_data(tx, x.data(), x.size() * 4);
    for (int64_t i = 0; i < ntok; i++) ((int32_t *) tp->data)[i] = pos0 + (int32_t) i * step;
    // muse-glimmer: n_rot = head_dim, NORM mode, freq_scale 1, ext_factor 0, attn_factor 1; n_ctx_orig and
    // beta_* only matter when ext_factor != 0
    ggml_tensor * y = ggml_rope_ext(c.ctx, tx, tp, nullptr, (int) hd, GGML_ROPE_TYPE_NORMAL, 131072, base, 1.0f, 0.0f, 1.0f, 32.0f, 1.0f);
    char bbuf[32];
    snprintf(bbuf, sizeof bbuf, "%08x", fbits(base));
    const std::string name = "rope_h" + std::to_string(n_head) + "_t" + std::to_string(ntok) + "_" + bbuf + "_p" + std::to_string(pos0);
    auto out = compute(c.ctx, y, name.c_str());
    emit(name, "rope n_head=" + std::to_string(n_head) + " ntok=" + std::to_string(ntok) + " base_bits=" + bbuf +
               " pos0=" + std::to_string(pos0) + " step=" + std::to_string(step) + " seed=" + std::to_string(seed), out.data(), out.size());
}

// soft_max_ext(x * scale + mask) over rows of n_kv, with an f32 mask [n_kv, ntok] broadcast over heads.
// mask: key j of row t is visible iff (j * 7 + t * 3) % 5 != 0 or j == t (never an empty row)
static void case_softmax(int64_t n_kv, int64_t ntok, int64_t n_head, float scale, uint64_t seed) {
    Rng r(seed);
    auto x = gen_act(r, (size_t) (n_kv * ntok * n_head));
    for (auto & v : x) v *= 4.0f;
    Ctx c(64);
    ggml_tensor * tx = ggml_new_tensor_3d(c.ctx, GGML_TYPE_F32, n_kv, ntok, n_head);
    ggml_tensor * tm = ggml_new_tensor_2d(c.ctx, GGML_TYPE_F32, n_kv, ntok);
    set_data(tx, x.data(), x.size() * 4);
    for (int64_t t = 0; t < ntok; t++)
        for (int64_t j = 0; j < n_kv; j++)
            ((float *) tm->data)[t * n_kv + j] = ((j * 7 + t * 3) % 5 != 0 || j == t) ? 0.0f : -INFINITY;
    ggml_tensor * y = ggml_soft_max_ext(c.ctx, tx, tm, scale, 0.0f);
    char sbuf[32];
    snprintf(sbuf, sizeof sbuf, "%08x", fbits(scale));
    const std::string name = "softmax_" + std::to_string(n_kv) + "x" + std::to_string(ntok) + "x" + std::to_string(n_head);
    auto out = compute(c.ctx, y, name.c_str());
    emit(name, "softmax n_kv=" + std::to_string(n_kv) + " ntok=" + std::to_string(ntok) + " n_head=" + std::to_string(n_head) +
               " scale_bits=" + sbuf + " seed=" + std::to_string(seed), out.data(), out.size());
}

// unary / binary elementwise ops on n values (x: act*k_amp, y: act)
static void case_elementwise(const std::string & op, int64_t n, float amp, float s, uint64_t seed) {
    Rng r(seed);
    auto x = gen_act(r, (size_t) n);
    auto y = gen_act(r, (size_t) n);
    for (auto & v : x) v *= amp;
    Ctx c(64);
    ggml_tensor * tx = ggml_new_tensor_1d(c.ctx, GGML_TYPE_F32, n);
    ggml_tensor * ty = ggml_new_tensor_1d(c.ctx, GGML_TYPE_F32, n);
    set_data(tx, x.data(), x.size() * 4);
    set_data(ty, y.data(), y.size() * 4);
    ggml_tensor * o = nullptr;
    if (op == "swiglu") o = ggml_swiglu_split(c.ctx, tx, ty);
    else if (op == "silu") o = ggml_silu(c.ctx, tx);
    else if (op == "sigmoid") o = ggml_sigmoid(c.ctx, tx);
    else if (op == "tanh") o = ggml_tanh(c.ctx, tx);
    else if (op == "scale") o = ggml_scale(c.ctx, tx, s);
    else if (op == "add") o = ggml_add(c.ctx, tx, ty);
    else if (op == "mul") o = ggml_mul(c.ctx, tx, ty);
    else if (op == "softcap") o = ggml_scale(c.ctx, ggml_tanh(c.ctx, ggml_scale(c.ctx, ggml_scale(c.ctx, tx, s), 1.0f / 20.0f)), 20.0f);
    else { fprintf(stderr, "unknown op %s\n", op.c_str()); exit(1); }
    char abuf[32], sbuf[32];
    snprintf(abuf, sizeof abuf, "%08x", fbits(amp));
    snprintf(sbuf, sizeof sbuf, "%08x", fbits(s));
    const std::string name = "ew_" + op + "_" + std::to_string(n) + "_" + abuf;
    auto out = compute(c.ctx, o, name.c_str());
    emit(name, "elementwise op=" + op + " n=" + std::to_string(n) + " amp_bits=" + abuf + " s_bits=" + sbuf +
               " seed=" + std::to_string(seed), out.data(), out.size());
}

static void case_get_rows(ggml_type type, int64_t cols, int64_t rows, uint64_t seed) {
    Rng r(seed);
    auto w = gen_weights(r, type, rows, cols);
    std::vector<int32_t> ids;
    for (int64_t i = 0; i < 7; i++) ids.push_back((int32_t) (r.next() % (uint64_t) rows));
    Ctx c(64);
    ggml_tensor * tw = ggml_new_tensor_2d(c.ctx, type, cols, rows);
    ggml_tensor * ti = ggml_new_tensor_1d(c.ctx, GGML_TYPE_I32, (int64_t) ids.size());
    set_data(tw, w.data(), w.size());
    set_data(ti, ids.data(), ids.size() * 4);
    ggml_tensor * y = ggml_get_rows(c.ctx, tw, ti);
    const std::string name = "getrows_" + tname(type);
    auto out = compute(c.ctx, y, name.c_str());
    emit(name, "get_rows type=" + tname(type) + " cols=" + std::to_string(cols) + " rows=" + std::to_string(rows) +
               " nids=7 seed=" + std::to_string(seed), out.data(), out.size());
}

// K-cache store: set_rows of ntok f32 rows (256 values) into a cache of `type`
static void case_set_rows(ggml_type type, uint64_t seed) {
    const int64_t n = 256, ntok = 5, size = 8;
    Rng r(seed);
    auto x = gen_act(r, (size_t) (n * ntok));
    Ctx c(64);
    ggml_tensor * cache = ggml_new_tensor_2d(c.ctx, type, n, size);
    memset(cache->data, 0, ggml_nbytes(cache));
    ggml_tensor * tx = ggml_new_tensor_2d(c.ctx, GGML_TYPE_F32, n, ntok);
    ggml_tensor * ti = ggml_new_tensor_1d(c.ctx, GGML_TYPE_I64, ntok);
    set_data(tx, x.data(), x.size() * 4);
    const int64_t idx[5] = { 3, 0, 7, 1, 4 };
    memcpy(ti->data, idx, sizeof idx);
    ggml_tensor * y = ggml_set_rows(c.ctx, cache, tx, ti);
    std::vector<uint8_t> zero(ggml_nbytes(cache), 0);
    const std::string name = "setrows_" + tname(type);
    auto out = compute(c.ctx, y, name.c_str(), { cache }, { zero });
    emit(name, "set_rows type=" + tname(type) + " n=256 ntok=5 size=8 seed=" + std::to_string(seed), out.data(), out.size());
}

// llama_mul_mat_hadamard (src/llama-impl.h:57): groups of n contiguous values through ggml_mul_mat with the
// GGML_HINT_SRC0_IS_HADAMARD hint, which the CPU backend computes as ggml_compute_forward_fwht (the matrix's
// values are not read)
static ggml_tensor * mul_mat_hadamard(ggml_context * ctx, ggml_tensor * cur, int64_t n) {
    ggml_tensor * rot = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n, n);
    memset(rot->data, 0, ggml_nbytes(rot));
    ggml_tensor * res = ggml_is_contiguous(cur) ? ggml_reshape_2d(ctx, cur, n, ggml_nelements(cur) / n)
                                                : ggml_cont_2d(ctx, cur, n, ggml_nelements(cur) / n);
    res = ggml_mul_mat(ctx, rot, res);
    ggml_mul_mat_set_hint(res, GGML_HINT_SRC0_IS_HADAMARD);
    return ggml_reshape_4d(ctx, res, cur->ne[0], cur->ne[1], cur->ne[2], cur->ne[3]);
}

static void case_fwht(int64_t n, int64_t rows, uint64_t seed) {
    Rng r(seed);
    auto x = gen_act(r, (size_t) (n * rows));
    Ctx c(64);
    ggml_tensor * tx = ggml_new_tensor_2d(c.ctx, GGML_TYPE_F32, n, rows);
    set_data(tx, x.data(), x.size() * 4);
    ggml_tensor * y = mul_mat_hadamard(c.ctx, tx, n);
    const std::string name = "fwht_" + std::to_string(n) + "x" + std::to_string(rows);
    auto out = compute(c.ctx, y, name.c_str());
    emit(name, "fwht n=" + std::to_string(n) + " rows=" + std::to_string(rows) + " seed=" + std::to_string(seed), out.data(), out.size());
}

// ------------------------------------------------------------------------------------------------
// attention, non-flash path, exactly as llm_graph_context::build_attn_mha builds it over a KV cache
// whose cells are described by `cell_pos` (-1 = empty); the cache is filled with ggml_set_rows from
// f32 rows (as llama_kv_cache::cpy_k / cpy_v do), the query rows are given in f32.
//
// inputs drawn from seed: q [ntok][n_head][128], then for each non-empty cell in slot order its K row
// [256] and V row [256] (f32, converted by set_rows to the cache type). A quantized K cache turns on
// llama.cpp's Hadamard rotation of Q and K (llama-kv-cache.cpp:321, n_rot = 128 for head_dim 128), applied
// to q and to the K rows before they are stored (llama-graph.cpp build_attn)

static void case_attention(ggml_type kt, ggml_type vt, int64_t n_head, int64_t kv_size, int64_t n_kv,
                           const std::vector<int32_t> & cell_pos, const std::vector<int32_t> & q_pos,
                           int32_t n_swa, const std::string & tag, uint64_t seed, int64_t n_head_kv = 2) {
    const int64_t hd = 128, n_embd_gqa = hd * n_head_kv;
    const int64_t ntok = (int64_t) q_pos.size();
    Rng r(seed);
    auto q = gen_act(r, (size_t) (hd * n_head * ntok));
    std::vector<int64_t> slots;
    std::vector<float> krows, vrows;
    for (int64_t s = 0; s < kv_size; s++) {
        if (cell_pos[s] < 0) continue;
        slots.push_back(s);
        auto k = gen_act(r, (size_t) n_embd_gqa);
        auto v = gen_act(r, (size_t) n_embd_gqa);
        krows.insert(krows.end(), k.begin(), k.end());
        vrows.insert(vrows.end(), v.begin(), v.end());
    }
    const int64_t nfill = (int64_t) slots.size();

    Ctx c(256);
    ggml_tensor * kc = ggml_new_tensor_2d(c.ctx, kt, n_embd_gqa, kv_size);
    ggml_tensor * vc = ggml_new_tensor_2d(c.ctx, vt, n_embd_gqa, kv_size);
    memset(kc->data, 0, ggml_nbytes(kc));
    memset(vc->data, 0, ggml_nbytes(vc));

    // 1. store: cpy_k (set_rows of whole rows) and cpy_v (transposed: one element per row)
    {
        ggml_tensor * tk = ggml_new_tensor_2d(c.ctx, GGML_TYPE_F32, n_embd_gqa, nfill);
        ggml_tensor * tv = ggml_new_tensor_2d(c.ctx, GGML_TYPE_F32, n_embd_gqa, nfill);
        ggml_tensor * ki = ggml_new_tensor_1d(c.ctx, GGML_TYPE_I64, nfill);
        ggml_tensor * vi = ggml_new_tensor_1d(c.ctx, GGML_TYPE_I64, nfill * n_embd_gqa);
        set_data(tk, krows.data(), krows.size() * 4);
        set_data(tv, vrows.data(), vrows.size() * 4);
        for (int64_t i = 0; i < nfill; i++) {
            ((int64_t *) ki->data)[i] = slots[i];
            for (int64_t j = 0; j < n_embd_gqa; j++) ((int64_t *) vi->data)[i * n_embd_gqa + j] = j * kv_size + slots[i];
        }
        ggml_tensor * tk_st = ggml_is_quantized(kt) ? mul_mat_hadamard(c.ctx, tk, hd) : tk;
        ggml_tensor * sk = ggml_set_rows(c.ctx, kc, tk_st, ki);
        ggml_tensor * vview = ggml_reshape_2d(c.ctx, vc, 1, ggml_nelements(vc));
        ggml_tensor * sv = ggml_set_rows(c.ctx, vview, ggml_reshape_2d(c.ctx, tv, 1, ggml_nelements(tv)), vi);
        ggml_cgraph * gf = ggml_new_graph_custom(c.ctx, 64, false);
        ggml_build_forward_expand(gf, sk);
        ggml_build_forward_expand(gf, sv);
        if (ggml_graph_compute_with_ctx(c.ctx, gf, 2) != GGML_STATUS_SUCCESS) { fprintf(stderr, "store failed\n"); exit(1); }
    }

    // 2. attention
    ggml_tensor * tq = ggml_new_tensor_3d(c.ctx, GGML_TYPE_F32, hd, n_head, ntok);
    set_data(tq, q.data(), q.size() * 4);
    ggml_tensor * mask = ggml_new_tensor_4d(c.ctx, GGML_TYPE_F32, n_kv, ntok, 1, 1);
    for (int64_t t = 0; t < ntok; t++) {
        for (int64_t j = 0; j < n_kv; j++) {
            const int32_t p0 = cell_pos[j], p1 = q_pos[t];
            bool keep = p0 >= 0 && p0 <= p1;
            if (keep && n_swa > 0 && p1 - p0 >= n_swa) keep = false;
            ((float *) mask->data)[t * n_kv + j] = keep ? 0.0f : -INFINITY;
        }
    }
    // get_k / get_v views (llama-kv-cache.cpp get_k, get_v with v_trans)
    ggml_tensor * k = ggml_view_4d(c.ctx, kc, hd, n_head_kv, n_kv, 1,
                                   ggml_row_size(kt, hd), ggml_row_size(kt, n_embd_gqa), ggml_row_size(kt, n_embd_gqa * kv_size), 0);
    ggml_tensor * v = ggml_view_4d(c.ctx, vc, n_kv, n_head_kv, hd, 1,
                                   ggml_row_size(vt, kv_size * hd), ggml_row_size(vt, kv_size), ggml_row_size(vt, kv_size * n_embd_gqa), 0);
    // build_attn_mha (non-FA)
    ggml_tensor * tq_r = ggml_is_quantized(kt) ? mul_mat_hadamard(c.ctx, tq, hd) : tq;
    ggml_tensor * qq = ggml_view_4d(c.ctx, tq_r, tq_r->ne[0], tq_r->ne[1], tq_r->ne[2], 1, tq_r->nb[1], tq_r->nb[2], tq_r->nb[2] * tq_r->ne[2], 0);
    qq = ggml_permute(c.ctx, qq, 0, 2, 1, 3);
    k = ggml_permute(c.ctx, k, 0, 2, 1, 3);
    v = ggml_permute(c.ctx, v, 0, 2, 1, 3);
    ggml_tensor * kq = ggml_mul_mat(c.ctx, k, qq);
    const float kq_scale = 1.0f / sqrtf(float(hd));
    kq = ggml_soft_max_ext(c.ctx, kq, mask, kq_scale, 0.0f);
    ggml_tensor * kqv = ggml_mul_mat(c.ctx, v, kq);
    ggml_tensor * cur = ggml_permute(c.ctx, kqv, 0, 2, 1, 3);
    cur = ggml_cont_2d(c.ctx, cur, cur->ne[0] * cur->ne[1], cur->ne[2] * cur->ne[3]);
    const std::string name = "attn_" + tag;
    auto out = compute(c.ctx, cur, name.c_str());

    std::string cells;
    for (int64_t s = 0; s < kv_size; s++) { if (s) cells += ","; cells += std::to_string(cell_pos[s]); }
    std::string qp;
    for (int64_t t = 0; t < ntok; t++) { if (t) qp += ","; qp += std::to_string(q_pos[t]); }
    emit(name, "attention kt=" + tname(kt) + " vt=" + tname(vt) + " n_head=" + std::to_string(n_head) +
               " n_head_kv=" + std::to_string(n_head_kv) +
               " kv_size=" + std::to_string(kv_size) + " n_kv=" + std::to_string(n_kv) + " n_swa=" + std::to_string(n_swa) +
               " seed=" + std::to_string(seed) + " q_pos=" + qp + " cells=" + cells, out.data(), out.size());
}

static void cases_attention() {
    uint64_t seed = 9000;
    // quantized K cache (Hadamard-rotated q and K, q8_0 scores) with an f16 V cache
    {
        std::vector<int32_t> cells(256, -1);
        for (int i = 0; i < 7; i++) cells[i] = i;
        case_attention(GGML_TYPE_Q8_0, GGML_TYPE_F16, 4, 256, 256, cells, {0, 1, 2, 3, 4, 5, 6}, 0, "q8_0_f16_prefill7", seed++);
        std::vector<int32_t> cells2(512, -1);
        for (int p = 300; p <= 811; p++) cells2[p % 512] = p;
        case_attention(GGML_TYPE_Q8_0, GGML_TYPE_F16, 32, 512, 512, cells2, {811}, 256, "q8_0_f16_swa_ring1", seed++);
        case_attention(GGML_TYPE_Q8_0, GGML_TYPE_F16, 4, 512, 512, cells2, {809, 810, 811}, 256, "q8_0_f16_swa_ring3", seed++);
    }
    for (ggml_type t : { GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16 }) {
        // full layer, fresh cache: prefill of 7 tokens at positions 0..6 in slots 0..6, n_kv 256
        {
            std::vector<int32_t> cells(256, -1);
            for (int i = 0; i < 7; i++) cells[i] = i;
            case_attention(t, t, 4, 256, 256, cells, {0, 1, 2, 3, 4, 5, 6}, 0, tname(t) + "_prefill7", seed++);
        }
        // decode at position 40 (41 cells), GQA 16
        {
            std::vector<int32_t> cells(256, -1);
            for (int i = 0; i <= 40; i++) cells[i] = i;
            case_attention(t, t, 32, 256, 256, cells, {40}, 0, tname(t) + "_decode41_gqa16", seed++);
        }
        // sliding layer, ring wrapped: cache of 512 cells with positions 300..811 placed modulo 512,
        // window 256, ubatch of 3 tokens at 809..811; n_kv = 512
        {
            std::vector<int32_t> cells(512, -1);
            for (int p = 300; p <= 811; p++) cells[p % 512] = p;
            case_attention(t, t, 4, 512, 512, cells, {809, 810, 811}, 256, tname(t) + "_swa_ring3", seed++);
            case_attention(t, t, 4, 512, 512, cells, {811}, 256, tname(t) + "_swa_ring1", seed++);
        }
        // holes: empty cells inside the window and n_kv smaller than the cache size
        {
            std::vector<int32_t> cells(768, -1);
            for (int i = 0; i < 300; i++) if (i % 3 != 1) cells[i] = i;
            case_attention(t, t, 4, 768, 512, cells, {297, 298, 299}, 0, tname(t) + "_holes", seed++);
        }
    }
    // mixed: f16 K with f32 V, f32 K with bf16 V (one graph each)
    {
        std::vector<int32_t> cells(256, -1);
        for (int i = 0; i < 40; i++) cells[i] = i;
        case_attention(GGML_TYPE_F16, GGML_TYPE_F32, 4, 256, 256, cells, {37, 38, 39}, 0, "f16_f32_mixed3", seed++);
        case_attention(GGML_TYPE_F32, GGML_TYPE_BF16, 4, 256, 256, cells, {39}, 0, "f32_bf16_mixed1", seed++);
        // one query head: q stays contiguous after the permute, so an f32 K goes through tinyBLAS
        case_attention(GGML_TYPE_F32, GGML_TYPE_F32, 1, 256, 256, cells, {36, 37, 38, 39}, 0, "f32_1head4", seed++, 1);
        case_attention(GGML_TYPE_F16, GGML_TYPE_F16, 1, 256, 256, cells, {36, 37, 38, 39}, 0, "f16_1head4", seed++, 1);
    }
}

int main(int argc, char ** argv) {
    if (argc != 2) { fprintf(stderr, "usage: %s <out-dir>\n", argv[0]); return 1; }
    ggml_cpu_init();
    const std::string dir = argv[1];
    g_blob = fopen((dir + "/goldens.bin").c_str(), "wb");
    g_manifest = fopen((dir + "/manifest.txt").c_str(), "w");
    if (!g_blob || !g_manifest) { fprintf(stderr, "cannot open outputs in %s\n", dir.c_str()); return 1; }
    fprintf(g_manifest, "# ggml-golden (llama.cpp b11434 ggml-cpu, AVX2+FMA+F16C build, no repack); see tools/ggml-golden\n");

    cases_quantize();
    cases_mul_mat();

    uint64_t seed = 5000;
    for (float eps : {1e-5f, 1e-8f}) {
        for (bool mul : {false, true}) {
            case_rms_norm(256, 3, eps, mul, seed++);
            case_rms_norm(128, 34, eps, mul, seed++);
            case_rms_norm(1000, 2, eps, mul, seed++);
            case_rms_norm(6656, 2, eps, mul, seed++);
        }
    }
    case_rope(4, 3, 10000.0f, 0, 1, seed++);
    case_rope(2, 5, 500000.0f, 2040, 1, seed++);
    case_rope(3, 4, 1000000.0f, 131000, 17, seed++);
    case_rope(1, 6, 10000.0f, 70000, 4001, seed++);
    case_softmax(256, 3, 4, 0.08838834764831845f, seed++);
    case_softmax(45, 2, 2, 0.08838834764831845f, seed++);
    case_softmax(1000, 1, 3, 0.25f, seed++);
    for (const char * op : {"swiglu", "silu", "sigmoid", "tanh", "add", "mul"}) {
        case_elementwise(op, 1003, 1.0f, 1.0f, seed++);
        case_elementwise(op, 64, 16.0f, 1.0f, seed++);
    }
    case_elementwise("scale", 1003, 4.0f, 0.19611613513818404f, seed++);
    case_elementwise("softcap", 1003, 64.0f, 0.19611613513818404f, seed++);
    for (ggml_type t : { GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0,
                         GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K }) {
        case_get_rows(t, 512, 20, seed++);
    }
    for (ggml_type t : { GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0 }) {
        case_set_rows(t, seed++);
    }
    cases_attention();
    case_fwht(128, 9, seed++);
    case_fwht(64, 5, seed++);

    fclose(g_blob);
    fclose(g_manifest);
    fprintf(stderr, "wrote %llu bytes of goldens to %s\n", (unsigned long long) g_off, dir.c_str());
    return 0;
}
