#version 450
// One reduction level through texel buffers (see reduce.glsl).
#extension GL_GOOGLE_include_directive : require
#define TEXEL 1
#include "reduce.glsl"
