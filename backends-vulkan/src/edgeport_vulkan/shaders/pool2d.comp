#version 450
// 2-D max / average pooling over NCHW (PyTorch semantics; the host computes OH/OW incl. ceil_mode).
// Specialization constant OP: 0 max (padding ignored, dilation honoured), 1 avg (count_include_pad,
// divisor_override).
#ifdef FP16  // fp16 storage (build variant <name>_fp16.spv); arithmetic stays fp32
#extension GL_EXT_shader_16bit_storage : require
#define DTYPE float16_t
#else
#define DTYPE float
#endif
layout(local_size_x = 64) in;
layout(constant_id = 0) const int OP = 0;
layout(std430, set = 0, binding = 0) readonly buffer I { DTYPE x[]; };
layout(std430, set = 0, binding = 1) writeonly buffer O { DTYPE o[]; };
layout(push_constant) uniform P {
    int NC, H, W;
    int OH, OW;
    int KH, KW;
    int SH, SW;
    int PH, PW;
    int DH, DW;
    int count_include_pad;
    int divisor;   // 0: none
} p;

void main() {
    int total = p.NC * p.OH * p.OW;
    int stride = int(gl_NumWorkGroups.x * gl_WorkGroupSize.x);
    for (int i = int(gl_GlobalInvocationID.x); i < total; i += stride) {
        int ow = i % p.OW;
        int t = i / p.OW;
        int oh = t % p.OH;
        int nc = t / p.OH;
        int base = nc * p.H * p.W;
        int hs = oh * p.SH - p.PH;
        int ws = ow * p.SW - p.PW;
        if (OP == 0) {
            float m = uintBitsToFloat(0xff800000u);  // -inf
            for (int kh = 0; kh < p.KH; ++kh) {
                int ih = hs + kh * p.DH;
                if (ih < 0 || ih >= p.H) continue;
                for (int kw = 0; kw < p.KW; ++kw) {
                    int iw = ws + kw * p.DW;
                    if (iw < 0 || iw >= p.W) continue;
                    float v = float(x[base + ih * p.W + iw]);
                    if (v > m || isnan(v)) m = v;
                }
            }
            o[i] = DTYPE(m);
        } else {
            int he = min(hs + p.KH, p.H + p.PH);
            int we = min(ws + p.KW, p.W + p.PW);
            int pool = (he - hs) * (we - ws);
            int h0 = max(hs, 0);
            int w0 = max(ws, 0);
            int h1 = min(he, p.H);
            int w1 = min(we, p.W);
            float s = 0.0;
            for (int ih = h0; ih < h1; ++ih) {
                for (int iw = w0; iw < w1; ++iw) {
                    s += float(x[base + ih * p.W + iw]);
                }
            }
            int div = p.divisor != 0 ? p.divisor : (p.count_include_pad != 0 ? pool : (h1 - h0) * (w1 - w0));
            o[i] = DTYPE(s / float(div));
        }
    }
}
