#version 450
// One reduction level through storage buffers (see reduce.glsl).
#extension GL_GOOGLE_include_directive : require
#define TEXEL 0
#include "reduce.glsl"
