#version 450
// Fill a buffer with a constant (pad's border, zero-initialised outputs).
layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) writeonly buffer O { float o[]; };
layout(push_constant) uniform P {
    int n;
    float value;
} p;

void main() {
    int stride = int(gl_NumWorkGroups.x * gl_WorkGroupSize.x);
    for (int i = int(gl_GlobalInvocationID.x); i < p.n; i += stride) o[i] = p.value;
}
