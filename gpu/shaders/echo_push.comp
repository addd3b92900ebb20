#version 450
// Echo the push constants into a storage buffer of the same std430 layout.
// 64-bit members follow 32-bit ones, a vec3 is followed by a float that packs
// into its fourth slot, and arrays have 4- and 8-byte strides.
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require

layout(local_size_x = 1) in;

struct Echo {
    uint a;
    uint64_t b;
    float c;
    int64_t d;
    double e;
    vec3 f;
    float g;
    int h[3];
    double k[2];
    uvec2 m;
    int n;
};

layout(push_constant, std430) uniform Params {
    uint a;
    uint64_t b;
    float c;
    int64_t d;
    double e;
    vec3 f;
    float g;
    int h[3];
    double k[2];
    uvec2 m;
    int n;
} pc;

layout(std430, set = 0, binding = 0) writeonly buffer Out {
    uint a;
    uint64_t b;
    float c;
    int64_t d;
    double e;
    vec3 f;
    float g;
    int h[3];
    double k[2];
    uvec2 m;
    int n;
} result;

void main() {
    result.a = pc.a;
    result.b = pc.b;
    result.c = pc.c;
    result.d = pc.d;
    result.e = pc.e;
    result.f = pc.f;
    result.g = pc.g;
    for (int i = 0; i < 3; ++i) {
        result.h[i] = pc.h[i];
    }
    for (int i = 0; i < 2; ++i) {
        result.k[i] = pc.k[i];
    }
    result.m = pc.m;
    result.n = pc.n;
}
