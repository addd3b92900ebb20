#version 450
// focal kernel through texel buffers, 2 classes per invocation (any float16/float32 inputs).
#extension GL_GOOGLE_include_directive : require
#define TEXEL 1
#define TEXEL_K 2u
#define OUT_FORMAT rg32f
#define COUNT_FORMAT rg32ui
#include "focal.glsl"
