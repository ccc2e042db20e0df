#version 450
// Row mean: out[r] = mean(x[r, 0:L]) for x viewed as (R, L); one workgroup per row (rows strided over
// the grid), shared-memory tree reduction. Mean over the last k dims / global average pooling = wider rows.
#define WG 128
layout(local_size_x = WG) in;
layout(std430, set = 0, binding = 0) readonly buffer I { float x[]; };
layout(std430, set = 0, binding = 1) writeonly buffer O { float o[]; };
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
        for (int j = tid; j < p.L; j += WG) s += x[base + j];
        red[tid] = s;
        barrier();
        for (int h = WG / 2; h > 0; h >>= 1) {
            if (tid < h) red[tid] += red[tid + h];
            barrier();
        }
        if (tid == 0) o[r] = red[0] / float(p.L);
        barrier();
    }
}
