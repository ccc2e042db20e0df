#version 450
// Bilinear 2-D upsampling / resizing of NCHW (torch's upsample_bilinear2d): for each output pixel, the source
// coordinate is dst * scale (align_corners) or max((dst + 0.5) * scale - 0.5, 0), and the four neighbours are
// blended with the fractional parts (the high neighbour clamped to the last row / column).
#ifdef FP16  // fp16 storage (build variant <name>_fp16.spv); arithmetic stays fp32
#extension GL_EXT_shader_16bit_storage : require
#define DTYPE float16_t
#else
#define DTYPE float
#endif
layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) readonly buffer I { DTYPE x[]; };
layout(std430, set = 0, binding = 1) writeonly buffer O { DTYPE o[]; };
layout(push_constant) uniform P {
    int n;
    int ih;
    int iw;
    int oh;
    int ow;
    int align_corners;
    float scale_h;
    float scale_w;
} p;

float source(int dst, float scale, int size) {
    if (p.align_corners != 0) return float(dst) * scale;
    return max((float(dst) + 0.5) * scale - 0.5, 0.0);
}

void main() {
    int stride = int(gl_NumWorkGroups.x * gl_WorkGroupSize.x);
    for (int i = int(gl_GlobalInvocationID.x); i < p.n; i += stride) {
        int xo = i % p.ow;
        int yo = (i / p.ow) % p.oh;
        int plane = i / (p.ow * p.oh);
        float sy = source(yo, p.scale_h, p.ih);
        float sx = source(xo, p.scale_w, p.iw);
        int y0 = min(int(sy), p.ih - 1);
        int x0 = min(int(sx), p.iw - 1);
        int y1 = y0 < p.ih - 1 ? y0 + 1 : y0;
        int x1 = x0 < p.iw - 1 ? x0 + 1 : x0;
        float ly = sy - float(y0);
        float lx = sx - float(x0);
        int base = plane * p.ih * p.iw;
        float top = (1.0 - lx) * float(x[base + y0 * p.iw + x0]) + lx * float(x[base + y0 * p.iw + x1]);
        float bottom = (1.0 - lx) * float(x[base + y1 * p.iw + x0]) + lx * float(x[base + y1 * p.iw + x1]);
        o[i] = DTYPE((1.0 - ly) * top + ly * bottom);
    }
}
