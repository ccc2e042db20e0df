#version 450
// Batched matmul: out[b] = A[b] (M x K) @ B[b] (K x N) (+ bias[N]). 64x64 output tile per workgroup of 16x16
// invocations, each accumulating a 4x4 register block; A / B tiles staged through shared memory (k-step 16).
// trans_b: B is stored N x K (linear weights). Batch strides of 0 broadcast an operand.
// Dispatch: (ceil(N/64), ceil(M/64), batch).
#ifdef FP16  // fp16 storage (build variant <name>_fp16.spv); arithmetic stays fp32
#extension GL_EXT_shader_16bit_storage : require
#define DTYPE float16_t
#else
#define DTYPE float
#endif
#define TS 16
#define WPT 4
#define TILE 64
#define TK 16
layout(local_size_x = TS, local_size_y = TS) in;
layout(std430, set = 0, binding = 0) readonly buffer A { DTYPE a[]; };
layout(std430, set = 0, binding = 1) readonly buffer B { DTYPE b[]; };
layout(std430, set = 0, binding = 2) readonly buffer Bias { DTYPE bias[]; };
layout(std430, set = 0, binding = 3) writeonly buffer O { DTYPE o[]; };
layout(push_constant) uniform P {
    int M;
    int N;
    int K;
    int batch_a;   // batch stride of A in elements (0: broadcast)
    int batch_b;   // batch stride of B in elements (0: broadcast)
    int trans_b;
    int has_bias;
} p;

shared float ta[TILE][TK + 1];
shared float tb[TK][TILE];

void main() {
    int tx = int(gl_LocalInvocationID.x);
    int ty = int(gl_LocalInvocationID.y);
    int lid = ty * TS + tx;
    int row0 = int(gl_WorkGroupID.y) * TILE;
    int col0 = int(gl_WorkGroupID.x) * TILE;
    int bi = int(gl_WorkGroupID.z);
    int oa = bi * p.batch_a;
    int ob = bi * p.batch_b;
    float acc[WPT][WPT];
    for (int i = 0; i < WPT; ++i)
        for (int j = 0; j < WPT; ++j) acc[i][j] = 0.0;
    for (int k0 = 0; k0 < p.K; k0 += TK) {
        for (int l = 0; l < (TILE * TK) / (TS * TS); ++l) {
            int e = lid + l * TS * TS;
            int r = e / TK, kk = e % TK;
            int gr = row0 + r, gk = k0 + kk;
            ta[r][kk] = (gr < p.M && gk < p.K) ? float(a[oa + gr * p.K + gk]) : 0.0;
            kk = e / TILE;
            int c = e % TILE;
            int gc = col0 + c;
            gk = k0 + kk;
            float vb = 0.0;
            if (gk < p.K && gc < p.N) {
                vb = p.trans_b != 0 ? float(b[ob + gc * p.K + gk]) : float(b[ob + gk * p.N + gc]);
            }
            tb[kk][c] = vb;
        }
        barrier();
        for (int k = 0; k < TK; ++k) {
            float bv[WPT];
            for (int j = 0; j < WPT; ++j) bv[j] = tb[k][tx + j * TS];
            for (int i = 0; i < WPT; ++i) {
                float av = ta[ty + i * TS][k];
                for (int j = 0; j < WPT; ++j) acc[i][j] += av * bv[j];
            }
        }
        barrier();
    }
    for (int i = 0; i < WPT; ++i) {
        int r = row0 + ty + i * TS;
        if (r >= p.M) continue;
        for (int j = 0; j < WPT; ++j) {
            int c = col0 + tx + j * TS;
            if (c >= p.N) continue;
            float v = acc[i][j];
            if (p.has_bias != 0) v += float(bias[c]);
            o[(bi * p.M + r) * p.N + c] = DTYPE(v);
        }
    }
}
