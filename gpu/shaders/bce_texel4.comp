#version 450
// bce kernel through texel buffers, 4 classes per invocation (any float16/float32 inputs).
#extension GL_GOOGLE_include_directive : require
#define TEXEL 1
#define TEXEL_K 4u
#define OUT_FORMAT rgba32f
#define COUNT_FORMAT rgba32ui
#include "bce.glsl"
