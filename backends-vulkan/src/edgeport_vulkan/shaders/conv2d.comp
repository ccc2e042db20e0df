#version 450
// Direct 2-D convolution, NCHW / OIHW (grid-stride loop). Each invocation computes OCB consecutive output
// channels (specialization constant; the host picks 4 when the channels per group allow it, else 1) at one
// output position, so every input load feeds OCB multiply-adds.
// General: stride, padding, dilation, groups (incl. depthwise); optional bias and fused clamp(lo, hi).
#ifdef FP16  // fp16 storage (build variant <name>_fp16.spv); arithmetic stays fp32
#extension GL_EXT_shader_16bit_storage : require
#define DTYPE float16_t
#else
#define DTYPE float
#endif
layout(local_size_x = 64) in;
layout(constant_id = 0) const int OCB = 1;
layout(std430, set = 0, binding = 0) readonly buffer I { DTYPE x[]; };
layout(std430, set = 0, binding = 1) readonly buffer W { DTYPE w[]; };
layout(std430, set = 0, binding = 2) readonly buffer Bias { DTYPE bias[]; };
layout(std430, set = 0, binding = 3) writeonly buffer O { DTYPE o[]; };
layout(push_constant) uniform P {
    int N, C, H, W;
    int OC, OH, OW;
    int KH, KW;
    int SH, SW;
    int PH, PW;
    int DH, DW;
    int groups;
    int has_bias;
    float lo;
    float hi;
} p;

void main() {
    int ocblocks = p.OC / OCB;   // the host guarantees OCB divides OC / groups
    int total = p.N * ocblocks * p.OH * p.OW;
    int stride = int(gl_NumWorkGroups.x * gl_WorkGroupSize.x);
    int cpg = p.C / p.groups;     // input channels per group
    int opg = p.OC / p.groups;    // output channels per group
    int wstride = cpg * p.KH * p.KW;  // weights per output channel
    for (int i = int(gl_GlobalInvocationID.x); i < total; i += stride) {
        int ow = i % p.OW;
        int t = i / p.OW;
        int oh = t % p.OH;
        t /= p.OH;
        int oc0 = (t % ocblocks) * OCB;
        int n = t / ocblocks;
        int g = oc0 / opg;
        float acc[OCB];
        for (int j = 0; j < OCB; ++j) acc[j] = p.has_bias != 0 ? float(bias[oc0 + j]) : 0.0;
        int ih0 = oh * p.SH - p.PH;
        int iw0 = ow * p.SW - p.PW;
        for (int c = 0; c < cpg; ++c) {
            int xc = ((n * p.C) + g * cpg + c) * p.H;
            int wc = ((oc0 * cpg) + c) * p.KH;
            for (int kh = 0; kh < p.KH; ++kh) {
                int ih = ih0 + kh * p.DH;
                if (ih < 0 || ih >= p.H) continue;
                int xrow = (xc + ih) * p.W;
                int wrow = (wc + kh) * p.KW;
                for (int kw = 0; kw < p.KW; ++kw) {
                    int iw = iw0 + kw * p.DW;
                    if (iw < 0 || iw >= p.W) continue;
                    float xv = float(x[xrow + iw]);
                    for (int j = 0; j < OCB; ++j) acc[j] += xv * float(w[wrow + kw + j * wstride]);
                }
            }
        }
        int plane = p.OH * p.OW;
        int obase = ((n * p.OC + oc0) * p.OH + oh) * p.OW + ow;
        for (int j = 0; j < OCB; ++j) o[obase + j * plane] = DTYPE(min(max(acc[j], p.lo), p.hi));
    }
}
