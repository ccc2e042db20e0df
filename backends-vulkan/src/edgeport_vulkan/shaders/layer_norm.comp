#version 450
// Layer norm over the last dim of x viewed as (R, L): two passes (mean, then centred variance), then
// (x - mean) * rsqrt(var + eps) * weight + bias. One workgroup per row.
#ifdef FP16  // fp16 storage (build variant <name>_fp16.spv); arithmetic stays fp32
#extension GL_EXT_shader_16bit_storage : require
#define DTYPE float16_t
#else
#define DTYPE float
#endif
#define WG 128
layout(local_size_x = WG) in;
layout(std430, set = 0, binding = 0) readonly buffer I { DTYPE x[]; };
layout(std430, set = 0, binding = 1) readonly buffer Wt { DTYPE w[]; };
layout(std430, set = 0, binding = 2) readonly buffer Bs { DTYPE b[]; };
layout(std430, set = 0, binding = 3) writeonly buffer O { DTYPE o[]; };
layout(push_constant) uniform P {
    int R;
    int L;
    float eps;
    int has_weight;
    int has_bias;
} p;

shared float red[WG];

float block_sum(float v, int tid) {
    red[tid] = v;
    barrier();
    for (int h = WG / 2; h > 0; h >>= 1) {
        if (tid < h) red[tid] += red[tid + h];
        barrier();
    }
    float s = red[0];
    barrier();
    return s;
}

void main() {
    int tid = int(gl_LocalInvocationID.x);
    for (int r = int(gl_WorkGroupID.x); r < p.R; r += int(gl_NumWorkGroups.x)) {
        int base = r * p.L;
        float s = 0.0;
        for (int j = tid; j < p.L; j += WG) s += float(x[base + j]);
        float mean = block_sum(s, tid) / float(p.L);
        float q = 0.0;
        for (int j = tid; j < p.L; j += WG) {
            float d = float(x[base + j]) - mean;
            q += d * d;
        }
        float rstd = inversesqrt(block_sum(q, tid) / float(p.L) + p.eps);
        for (int j = tid; j < p.L; j += WG) {
            float v = (float(x[base + j]) - mean) * rstd;
            if (p.has_weight != 0) v *= float(w[j]);
            if (p.has_bias != 0) v += float(b[j]);
            o[base + j] = DTYPE(v);
        }
    }
}
