#version 450
// Echo a push-constant block {uint; uint64_t; float} whose std430 layout puts
// the 64-bit member at offset 8: tight packing ('<IQf') puts it at 4.
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require

layout(local_size_x = 1) in;

layout(push_constant, std430) uniform Params {
    uint a;
    uint64_t b;
    float c;
} pc;

layout(std430, set = 0, binding = 0) writeonly buffer Out {
    uint a;
    uint64_t b;
    float c;
} result;

void main() {
    result.a = pc.a;
    result.b = pc.b;
    result.c = pc.c;
}
