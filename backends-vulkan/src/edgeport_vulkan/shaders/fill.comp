#version 450
// edgeport-variants: fp16 i32
// Fill a buffer with a constant (pad's border, zero-initialised outputs).
#ifdef FP16  // fp16 storage (build variant <name>_fp16.spv); arithmetic stays fp32
#extension GL_EXT_shader_16bit_storage : require
#define DTYPE float16_t
#elif defined(INT32)  // 32-bit integer / bool storage (build variant <name>_i32.spv)
#define DTYPE int
#else
#define DTYPE float
#endif
layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) writeonly buffer O { DTYPE o[]; };
layout(push_constant) uniform P {
    int n;
    float value;
} p;

void main() {
    int stride = int(gl_NumWorkGroups.x * gl_WorkGroupSize.x);
    for (int i = int(gl_GlobalInvocationID.x); i < p.n; i += stride) o[i] = DTYPE(p.value);
}
