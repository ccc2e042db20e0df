#version 450
// Softmax (log_softmax when log != 0) over the last dim of x viewed as (R, L); one workgroup per row.
#ifdef FP16  // fp16 storage (build variant <name>_fp16.spv); arithmetic stays fp32
#extension GL_EXT_shader_16bit_storage : require
#define DTYPE float16_t
#else
#define DTYPE float
#endif
#define WG 128
layout(local_size_x = WG) in;
layout(std430, set = 0, binding = 0) readonly buffer I { DTYPE x[]; };
layout(std430, set = 0, binding = 1) writeonly buffer O { DTYPE o[]; };
layout(push_constant) uniform P {
    int R;
    int L;
    int log;
} p;

shared float red[WG];

void main() {
    int tid = int(gl_LocalInvocationID.x);
    for (int r = int(gl_WorkGroupID.x); r < p.R; r += int(gl_NumWorkGroups.x)) {
        int base = r * p.L;
        float m = uintBitsToFloat(0xff800000u);  // -inf
        for (int j = tid; j < p.L; j += WG) m = max(m, float(x[base + j]));
        red[tid] = m;
        barrier();
        for (int h = WG / 2; h > 0; h >>= 1) {
            if (tid < h) red[tid] = max(red[tid], red[tid + h]);
            barrier();
        }
        m = red[0];
        barrier();
        float s = 0.0;
        for (int j = tid; j < p.L; j += WG) s += exp(float(x[base + j]) - m);
        red[tid] = s;
        barrier();
        for (int h = WG / 2; h > 0; h >>= 1) {
            if (tid < h) red[tid] += red[tid + h];
            barrier();
        }
        s = red[0];
        if (p.log != 0) {
            float ls = log(s);
            for (int j = tid; j < p.L; j += WG) o[base + j] = DTYPE(float(x[base + j]) - m - ls);
        } else {
            float inv = 1.0 / s;
            for (int j = tid; j < p.L; j += WG) o[base + j] = DTYPE(exp(float(x[base + j]) - m) * inv);
        }
        barrier();
    }
}
