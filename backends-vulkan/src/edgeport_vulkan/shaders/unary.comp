#version 450
// Elementwise unary activations. Specialization constant OP (one pipeline per op): 0 relu, 1 clamp(lo, hi)
// (relu6, hardtanh), 2 sigmoid, 3 tanh, 4 hardswish, 5 gelu (erf), 6 gelu (tanh approximation), 7 neg,
// 8 abs, 9 exp, 10 sqrt, 11 silu, 12 leaky_relu(slope = lo), 13 rsqrt, 14 pow(x, lo) (torch's rules for
// negative bases and zero: integer exponents keep the sign, other exponents give NaN), 15 sin, 16 cos.
#ifdef FP16  // fp16 storage (build variant <name>_fp16.spv); arithmetic stays fp32
#extension GL_EXT_shader_16bit_storage : require
#define DTYPE float16_t
#else
#define DTYPE float
#endif
layout(local_size_x = 256) in;
layout(constant_id = 0) const int OP = 0;
layout(std430, set = 0, binding = 0) readonly buffer I { DTYPE x[]; };
layout(std430, set = 0, binding = 1) writeonly buffer O { DTYPE o[]; };
layout(push_constant) uniform P {
    int n;
    float lo;
    float hi;
} p;

float sigmoid_(float v) {
    if (v >= 0.0) return 1.0 / (1.0 + exp(-v));
    float e = exp(v);
    return e / (1.0 + e);
}

float tanh_(float v) {
    float e = exp(-2.0 * abs(v));
    return sign(v) * (1.0 - e) / (1.0 + e);
}

// erf with |error| < 1.2e-7 (Numerical Recipes erfc, Chebyshev fit).
float erf_(float v) {
    float z = abs(v);
    float t = 1.0 / (1.0 + 0.5 * z);
    float r = t * exp(-z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 +
              t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 +
              t * (-0.82215223 + t * 0.17087277)))))))));
    return v >= 0.0 ? 1.0 - r : r - 1.0;
}

float pow_(float v, float e) {
    if (e == 2.0) return v * v;
    if (e == 1.0) return v;
    if (e == 0.0) return 1.0;
    if (v == 0.0) return e > 0.0 ? 0.0 : 1.0 / 0.0;
    float r = pow(abs(v), e);
    if (v > 0.0) return r;
    if (e != floor(e)) return 0.0 / 0.0;
    return mod(e, 2.0) == 1.0 ? -r : r;
}

void main() {
    int stride = int(gl_NumWorkGroups.x * gl_WorkGroupSize.x);
    for (int i = int(gl_GlobalInvocationID.x); i < p.n; i += stride) {
        float v = float(x[i]);
        float r;
        if (OP == 0) r = max(v, 0.0);
        else if (OP == 1) r = min(max(v, p.lo), p.hi);
        else if (OP == 2) r = sigmoid_(v);
        else if (OP == 3) r = tanh_(v);
        else if (OP == 4) r = v * min(max(v + 3.0, 0.0), 6.0) / 6.0;
        else if (OP == 5) r = 0.5 * v * (1.0 + erf_(v * 0.70710678118654752));
        else if (OP == 6) r = 0.5 * v * (1.0 + tanh_(0.79788456080286536 * (v + 0.044715 * v * v * v)));
        else if (OP == 7) r = -v;
        else if (OP == 8) r = abs(v);
        else if (OP == 9) r = exp(v);
        else if (OP == 10) r = sqrt(v);
        else if (OP == 11) r = v * sigmoid_(v);
        else if (OP == 12) r = v >= 0.0 ? v : v * p.lo;
        else if (OP == 13) r = inversesqrt(v);
        else if (OP == 14) r = pow_(v, p.lo);
        else if (OP == 15) r = sin(v);
        else r = cos(v);
        o[i] = DTYPE(r);
    }
}
