#version 450
// edgeport-variants:
// Elementwise ops over float32, int32 and bool tensors, N-D broadcasting (up to 6 dims, stride 0 on broadcast
// dims): out[i] = OP(a[ia], b[ib], c[ic]). Every buffer holds 32-bit words: a float32 tensor its bits, an int32
// tensor its values, a bool tensor 0 / 1. Specialization constants (one pipeline per combination): OP, NDIM
// (1..6) and the element type of each operand and of the output, TA, TB, TC, TO (0 float32, 1 int32, 2 bool).
//   arithmetic (computed in float when TO is float, else in int32 with wrap-around): 0 add, 1 sub, 2 mul,
//     3 div (true division, float), 4 maximum, 5 minimum
//   comparisons (in int32 when neither operand is float, else in float; out bool): 10 eq, 11 ne, 12 lt, 13 le,
//     14 gt, 15 ge
//   logical (operands != 0; out bool): 20 and, 21 or, 22 xor, 23 not(a)
//   bitwise (int32 / bool operands): 30 and, 31 or, 32 xor, 33 not(a) (of a bool: logical not)
//   40 where(a != 0, b, c); 41 cast a to TO (float -> int truncates toward zero, -> bool is != 0)
layout(local_size_x = 256) in;
layout(constant_id = 0) const int OP = 0;
layout(constant_id = 1) const int NDIM = 1;
layout(constant_id = 2) const int TA = 0;
layout(constant_id = 3) const int TB = 0;
layout(constant_id = 4) const int TC = 0;
layout(constant_id = 5) const int TO = 0;
layout(std430, set = 0, binding = 0) readonly buffer A { int a[]; };
layout(std430, set = 0, binding = 1) readonly buffer B { int b[]; };
layout(std430, set = 0, binding = 2) readonly buffer C { int c[]; };
layout(std430, set = 0, binding = 3) writeonly buffer O { int o[]; };
layout(push_constant) uniform P {
    int n;
    int shape[6];
    int sa[6];
    int sb[6];
    int sc[6];
} p;

float f_(int raw, int t) { return t == 0 ? intBitsToFloat(raw) : float(raw); }
int i_(int raw, int t) { return t == 0 ? int(intBitsToFloat(raw)) : raw; }
bool b_(int raw, int t) { return t == 0 ? intBitsToFloat(raw) != 0.0 : raw != 0; }

// a value of type `t` stored as type TO
int as_out(int raw, int t) {
    if (TO == 2) return b_(raw, t) ? 1 : 0;
    if (TO == 1) return i_(raw, t);
    return t == 0 ? raw : floatBitsToInt(float(raw));
}

void main() {
    int stride = int(gl_NumWorkGroups.x * gl_WorkGroupSize.x);
    for (int i = int(gl_GlobalInvocationID.x); i < p.n; i += stride) {
        int rem = i;
        int ia = 0;
        int ib = 0;
        int ic = 0;
        for (int d = NDIM - 1; d >= 0; --d) {
            int k = rem % p.shape[d];
            rem /= p.shape[d];
            ia += k * p.sa[d];
            ib += k * p.sb[d];
            ic += k * p.sc[d];
        }
        int x = a[ia];
        int r;
        if (OP < 10) {
            int y = b[ib];
            if (TO == 0) {
                float u = f_(x, TA);
                float v = f_(y, TB);
                float f;
                if (OP == 0) f = u + v;
                else if (OP == 1) f = u - v;
                else if (OP == 2) f = u * v;
                else if (OP == 3) f = u / v;
                else if (OP == 4) f = (isnan(u) || isnan(v)) ? u + v : max(u, v);
                else f = (isnan(u) || isnan(v)) ? u + v : min(u, v);
                r = floatBitsToInt(f);
            } else {
                int u = i_(x, TA);
                int v = i_(y, TB);
                if (OP == 0) r = u + v;
                else if (OP == 1) r = u - v;
                else if (OP == 2) r = u * v;
                else if (OP == 4) r = max(u, v);
                else r = min(u, v);
                if (TO == 2) r = r != 0 ? 1 : 0;
            }
        } else if (OP < 20) {
            int y = b[ib];
            bool t;
            if (TA != 0 && TB != 0) {
                int u = x;
                int v = y;
                t = OP == 10 ? u == v : OP == 11 ? u != v : OP == 12 ? u < v : OP == 13 ? u <= v : OP == 14 ? u > v
                    : u >= v;
            } else {
                float u = f_(x, TA);
                float v = f_(y, TB);
                t = OP == 10 ? u == v : OP == 11 ? u != v : OP == 12 ? u < v : OP == 13 ? u <= v : OP == 14 ? u > v
                    : u >= v;
            }
            r = t ? 1 : 0;
        } else if (OP < 30) {
            bool u = b_(x, TA);
            bool v = OP == 23 ? false : b_(b[ib], TB);
            bool t = OP == 20 ? u && v : OP == 21 ? u || v : OP == 22 ? u != v : !u;
            r = t ? 1 : 0;
        } else if (OP < 40) {
            int v = OP == 33 ? 0 : b[ib];
            if (OP == 30) r = x & v;
            else if (OP == 31) r = x | v;
            else if (OP == 32) r = x ^ v;
            else r = TO == 2 ? 1 - x : ~x;
        } else if (OP == 40) {
            r = b_(x, TA) ? as_out(b[ib], TB) : as_out(c[ic], TC);
        } else {
            r = as_out(x, TA);
        }
        o[i] = r;
    }
}
