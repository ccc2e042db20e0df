#version 450
// Row mean: out[r] = mean(x[r, 0:L]) for x viewed as (R, L); one workgroup per row (rows strided over
// the grid), shared-memory tree reduction. Mean over the last k dims / global average pooling = wider rows.
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
} p;

shared float red[WG];

void main() {
    int tid = int(gl_LocalInvocationID.x);
    for (int r = int(gl_WorkGroupID.x); r < p.R; r += int(gl_NumWorkGroups.x)) {
        int base = r * p.L;
        float s = 0.0;
        for (int j = tid; j < p.L; j += WG) s += float(x[base + j]);
        red[tid] = s;
        barrier();
        for (int h = WG / 2; h > 0; h >>= 1) {
            if (tid < h) red[tid] += red[tid + h];
            barrier();
        }
        if (tid == 0) o[r] = DTYPE(red[0] / float(p.L));
        barrier();
    }
}
