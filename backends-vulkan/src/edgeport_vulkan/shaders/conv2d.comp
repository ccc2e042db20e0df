#version 450
// Direct 2-D convolution, NCHW / OIHW, one output element per invocation (grid-stride loop).
// General: stride, padding, dilation, groups (incl. depthwise); optional bias and fused clamp(lo, hi).
layout(local_size_x = 64) in;
layout(std430, set = 0, binding = 0) readonly buffer I { float x[]; };
layout(std430, set = 0, binding = 1) readonly buffer W { float w[]; };
layout(std430, set = 0, binding = 2) readonly buffer Bias { float bias[]; };
layout(std430, set = 0, binding = 3) writeonly buffer O { float o[]; };
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
    int total = p.N * p.OC * p.OH * p.OW;
    int stride = int(gl_NumWorkGroups.x * gl_WorkGroupSize.x);
    int cpg = p.C / p.groups;     // input channels per group
    int opg = p.OC / p.groups;    // output channels per group
    for (int i = int(gl_GlobalInvocationID.x); i < total; i += stride) {
        int ow = i % p.OW;
        int t = i / p.OW;
        int oh = t % p.OH;
        t /= p.OH;
        int oc = t % p.OC;
        int n = t / p.OC;
        int g = oc / opg;
        float acc = p.has_bias != 0 ? bias[oc] : 0.0;
        int ih0 = oh * p.SH - p.PH;
        int iw0 = ow * p.SW - p.PW;
        for (int c = 0; c < cpg; ++c) {
            int xc = ((n * p.C) + g * cpg + c) * p.H;
            int wc = ((oc * cpg) + c) * p.KH;
            for (int kh = 0; kh < p.KH; ++kh) {
                int ih = ih0 + kh * p.DH;
                if (ih < 0 || ih >= p.H) continue;
                int xrow = (xc + ih) * p.W;
                int wrow = (wc + kh) * p.KW;
                for (int kw = 0; kw < p.KW; ++kw) {
                    int iw = iw0 + kw * p.DW;
                    if (iw < 0 || iw >= p.W) continue;
                    acc += x[xrow + iw] * w[wrow + kw];
                }
            }
        }
        o[i] = min(max(acc, p.lo), p.hi);
    }
}
