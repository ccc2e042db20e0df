#version 450
// edgeport-variants: fp16 i32
// Permute (transpose) up to 6-D: out is contiguous with shape `shape`; in_strides are the input's
// strides reordered by the permutation, so out[i] = x[sum(coord_d * in_strides[d])].
#ifdef FP16  // fp16 storage (build variant <name>_fp16.spv); arithmetic stays fp32
#extension GL_EXT_shader_16bit_storage : require
#define DTYPE float16_t
#elif defined(INT32)  // 32-bit integer / bool storage (build variant <name>_i32.spv)
#define DTYPE int
#else
#define DTYPE float
#endif
layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) readonly buffer I { DTYPE x[]; };
layout(std430, set = 0, binding = 1) writeonly buffer O { DTYPE o[]; };
layout(push_constant) uniform P {
    int n;
    int ndim;
    int shape[6];
    int in_strides[6];
} p;

void main() {
    int stride = int(gl_NumWorkGroups.x * gl_WorkGroupSize.x);
    for (int i = int(gl_GlobalInvocationID.x); i < p.n; i += stride) {
        int rem = i;
        int src = 0;
        for (int d = p.ndim - 1; d >= 0; --d) {
            src += (rem % p.shape[d]) * p.in_strides[d];
            rem /= p.shape[d];
        }
        o[i] = x[src];
    }
}
