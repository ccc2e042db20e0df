#version 450
// Elementwise binary op with N-D broadcasting (up to 6 dims): out[i] = a[ia] OP b[ib].
// Broadcast dims carry stride 0. Specialization constants (one pipeline per combination): OP (0 add, 1 sub,
// 2 mul, 3 div, 4 max, 5 min, 6 pow) and NDIM (1..6; 1 = flat: same shapes, or a scalar operand of stride 0).
#ifdef FP16  // fp16 storage (build variant <name>_fp16.spv); arithmetic stays fp32
#extension GL_EXT_shader_16bit_storage : require
#define DTYPE float16_t
#else
#define DTYPE float
#endif
layout(local_size_x = 256) in;
layout(constant_id = 0) const int OP = 0;
layout(constant_id = 1) const int NDIM = 1;
layout(std430, set = 0, binding = 0) readonly buffer A { DTYPE a[]; };
layout(std430, set = 0, binding = 1) readonly buffer B { DTYPE b[]; };
layout(std430, set = 0, binding = 2) writeonly buffer O { DTYPE o[]; };
layout(push_constant) uniform P {
    int n;
    int shape[6];
    int sa[6];
    int sb[6];
} p;

void main() {
    int stride = int(gl_NumWorkGroups.x * gl_WorkGroupSize.x);
    for (int i = int(gl_GlobalInvocationID.x); i < p.n; i += stride) {
        int rem = i;
        int ia = 0;
        int ib = 0;
        for (int d = NDIM - 1; d >= 0; --d) {
            int c = rem % p.shape[d];
            rem /= p.shape[d];
            ia += c * p.sa[d];
            ib += c * p.sb[d];
        }
        float x = float(a[ia]);
        float y = float(b[ib]);
        float r;
        if (OP == 0) r = x + y;
        else if (OP == 1) r = x - y;
        else if (OP == 2) r = x * y;
        else if (OP == 3) r = x / y;
        else if (OP == 4) r = max(x, y);
        else if (OP == 5) r = min(x, y);
        else r = pow(x, y);
        o[i] = DTYPE(r);
    }
}
