#version 450
// edgeport-variants:
// Scans and reductions along one dim of a float32 / int32 / bool tensor viewed as (outer, length, inner), one
// invocation per (outer, inner) line, 32-bit words. Specialization constants: MODE (0 cumsum: out has the input's
// shape; 1 any: out is (outer, inner), bool), TI / TO the input / output element types (0 float32, 1 int32,
// 2 bool); cumsum adds in int32 when TO is int32, else in float.
layout(local_size_x = 64) in;
layout(constant_id = 0) const int MODE = 0;
layout(constant_id = 1) const int TI = 0;
layout(constant_id = 2) const int TO = 0;
layout(std430, set = 0, binding = 0) readonly buffer I { int x[]; };
layout(std430, set = 0, binding = 1) writeonly buffer O { int o[]; };
layout(push_constant) uniform P {
    int lines;
    int len;
    int inner;
} p;

void main() {
    int stride = int(gl_NumWorkGroups.x * gl_WorkGroupSize.x);
    for (int line = int(gl_GlobalInvocationID.x); line < p.lines; line += stride) {
        int outer = line / p.inner;
        int k = line % p.inner;
        int base = outer * p.len * p.inner + k;
        if (MODE == 1) {
            int r = 0;
            for (int j = 0; j < p.len && r == 0; ++j) {
                int v = x[base + j * p.inner];
                r = (TI == 0 ? intBitsToFloat(v) != 0.0 : v != 0) ? 1 : 0;
            }
            o[line] = r;
        } else if (TO == 0) {
            float s = 0.0;
            for (int j = 0; j < p.len; ++j) {
                int v = x[base + j * p.inner];
                s += TI == 0 ? intBitsToFloat(v) : float(v);
                o[base + j * p.inner] = floatBitsToInt(s);
            }
        } else {
            int s = 0;
            for (int j = 0; j < p.len; ++j) {
                int v = x[base + j * p.inner];
                s += TI == 0 ? int(intBitsToFloat(v)) : v;
                o[base + j * p.inner] = s;
            }
        }
    }
}
