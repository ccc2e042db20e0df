#version 450
// Batched matmul, 16x16 tiles through shared memory: out[b] = A[b] (M x K) @ B[b] (K x N) (+ bias[N]).
// trans_b: B is stored N x K (linear weights). Batch strides of 0 broadcast an operand.
// Dispatch: (ceil(N/16), ceil(M/16), batch).
#define TS 16
layout(local_size_x = TS, local_size_y = TS) in;
layout(std430, set = 0, binding = 0) readonly buffer A { float a[]; };
layout(std430, set = 0, binding = 1) readonly buffer B { float b[]; };
layout(std430, set = 0, binding = 2) readonly buffer Bias { float bias[]; };
layout(std430, set = 0, binding = 3) writeonly buffer O { float o[]; };
layout(push_constant) uniform P {
    int M;
    int N;
    int K;
    int batch_a;   // batch stride of A in elements (0: broadcast)
    int batch_b;   // batch stride of B in elements (0: broadcast)
    int trans_b;
    int has_bias;
} p;

shared float ta[TS][TS];
shared float tb[TS][TS];

void main() {
    int tx = int(gl_LocalInvocationID.x);
    int ty = int(gl_LocalInvocationID.y);
    int col = int(gl_WorkGroupID.x) * TS + tx;
    int row = int(gl_WorkGroupID.y) * TS + ty;
    int bi = int(gl_WorkGroupID.z);
    int oa = bi * p.batch_a;
    int ob = bi * p.batch_b;
    float acc = 0.0;
    for (int k0 = 0; k0 < p.K; k0 += TS) {
        int ka = k0 + tx;
        ta[ty][tx] = (row < p.M && ka < p.K) ? a[oa + row * p.K + ka] : 0.0;
        int kb = k0 + ty;
        float vb = 0.0;
        if (col < p.N && kb < p.K) {
            vb = p.trans_b != 0 ? b[ob + col * p.K + kb] : b[ob + kb * p.N + col];
        }
        tb[ty][tx] = vb;
        barrier();
        for (int k = 0; k < TS; ++k) {
            acc += ta[ty][k] * tb[k][tx];
        }
        barrier();
    }
    if (row < p.M && col < p.N) {
        if (p.has_bias != 0) acc += bias[col];
        o[(bi * p.M + row) * p.N + col] = acc;
    }
}
