// NORM-convention RoPE (pairs (x[2j], x[2j+1]), llama.cpp's rope_norm), in place, at each row's
// position (read from the device, so a captured graph replays at the next position).
// theta = pos * inv_freq[j] with inv_freq[j] = base^(-2j/head_dim) computed on the host in f64;
// cos/sin and the rotation in f64, rounded once: the CPU accurate mode's arithmetic.
extern "C" __global__ void rope_norm(float* x, int n_heads, int head_dim, const u32* pos, const double* inv_freq) {
    int half = head_dim / 2;
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= n_heads * half) return;
    int row = blockIdx.y;
    int h = idx / half, j = idx % half;
    float* p = x + ((long long)row * n_heads + h) * head_dim + 2 * j;
    double theta = __dmul_rn((double)pos[row], inv_freq[j]);
    double s, c;
    sincos(theta, &s, &c);
    double x0 = p[0], x1 = p[1];
    p[0] = (float)__dsub_rn(__dmul_rn(x0, c), __dmul_rn(x1, s));
    p[1] = (float)__dadd_rn(__dmul_rn(x0, s), __dmul_rn(x1, c));
}
