#version 450
// bce kernel through texel buffers, 1 classes per invocation (any float16/float32 inputs).
#extension GL_GOOGLE_include_directive : require
#define TEXEL 1
#define TEXEL_K 1u
#define OUT_FORMAT r32f
#define COUNT_FORMAT r32ui
#include "bce.glsl"
