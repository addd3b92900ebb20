#version 450
// focal kernel through storage buffers, logits/targets f16/f16 (float16 through 16-bit storage).
#extension GL_GOOGLE_include_directive : require
#define TEXEL 0
#define LOGIT_F16 1
#define TARGET_F16 1
#include "focal.glsl"
