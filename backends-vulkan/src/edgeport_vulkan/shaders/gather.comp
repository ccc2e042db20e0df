#version 450
// edgeport-variants:
// Gathers 32-bit words (float32, int32 or bool tensors) by an int32 index tensor. Specialization constant MODE:
//   0 (embedding, index_select, index.Tensor): the source viewed as (outer, size, inner), out as
//     (outer, nidx, inner): out[o, j, k] = src[o, idx[j], k];
//   1 (gather): out and idx share a shape of `ndim` dims (`shape`); out[c] = src[c with c[dim] = idx[c]],
//     src strides `sstr`.
// WRAP = 1 takes negative indices from the end (index.Tensor). An index out of range writes 0 and sets
// status[0] = 1, which the executor checks after the run.
layout(local_size_x = 256) in;
layout(constant_id = 0) const int MODE = 0;
layout(constant_id = 1) const int WRAP = 0;
layout(std430, set = 0, binding = 0) readonly buffer S { int src[]; };
layout(std430, set = 0, binding = 1) readonly buffer I { int idx[]; };
layout(std430, set = 0, binding = 2) writeonly buffer O { int o[]; };
layout(std430, set = 0, binding = 3) buffer F { int status[]; };
layout(push_constant) uniform P {
    int n;
    int size;
    int inner;
    int nidx;
    int ndim;
    int dim;
    int shape[6];
    int sstr[6];
} p;

void main() {
    int stride = int(gl_NumWorkGroups.x * gl_WorkGroupSize.x);
    for (int i = int(gl_GlobalInvocationID.x); i < p.n; i += stride) {
        int j;
        int base;
        if (MODE == 0) {
            int k = i % p.inner;
            int q = i / p.inner;
            j = q % p.nidx;
            base = (q / p.nidx) * p.size * p.inner + k;
        } else {
            j = i;
            int rem = i;
            base = 0;
            for (int d = p.ndim - 1; d >= 0; --d) {
                if (d != p.dim) base += (rem % p.shape[d]) * p.sstr[d];
                rem /= p.shape[d];
            }
        }
        int ix = idx[j];
        if (WRAP == 1 && ix < 0) ix += p.size;
        if (ix < 0 || ix >= p.size) {
            atomicOr(status[0], 1);
            o[i] = 0;
        } else {
            o[i] = src[base + ix * (MODE == 0 ? p.inner : p.sstr[p.dim])];
        }
    }
}
