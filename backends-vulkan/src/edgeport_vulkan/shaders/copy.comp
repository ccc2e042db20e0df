#version 450
// edgeport-variants: fp16 i32
// Strided copy of an N-D region (up to 6-D) with offsets on both sides: the building block of
// cat (one copy per input), slice (offset + stepped strides) and pad (fill, then copy to the interior).
//   dst[dst_off + sum(c_d * dst_str[d])] = src[src_off + sum(c_d * src_str[d])], c over `shape`.
#ifdef FP16  // fp16 storage (build variant <name>_fp16.spv); arithmetic stays fp32
#extension GL_EXT_shader_16bit_storage : require
#define DTYPE float16_t
#elif defined(INT32)  // 32-bit integer / bool storage (build variant <name>_i32.spv)
#define DTYPE int
#else
#define DTYPE float
#endif
layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) readonly buffer I { DTYPE src[]; };
layout(std430, set = 0, binding = 1) buffer O { DTYPE dst[]; };
layout(push_constant) uniform P {
    int n;
    int ndim;
    int src_off;
    int dst_off;
    int shape[6];
    int src_str[6];
    int dst_str[6];
} p;

void main() {
    int stride = int(gl_NumWorkGroups.x * gl_WorkGroupSize.x);
    for (int i = int(gl_GlobalInvocationID.x); i < p.n; i += stride) {
        int rem = i;
        int s = p.src_off;
        int d = p.dst_off;
        for (int k = p.ndim - 1; k >= 0; --k) {
            int c = rem % p.shape[k];
            rem /= p.shape[k];
            s += c * p.src_str[k];
            d += c * p.dst_str[k];
        }
        dst[d] = src[s];
    }
}
