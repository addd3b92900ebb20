// Class-weighted BCE with logits:
//   l = w_c * (pw_c * y * softplus(-x) + (1 - y) * softplus(x))
//   dl/dx = w_c * ((1 - y) * sigmoid(x) - pw_c * y * sigmoid(-x))
// (equal to w_c * ((pw_c*y + 1 - y) * sigmoid(x) - pw_c*y), without its cancellation).

#define POS_WEIGHT 1
#include "loss_common.glsl"

ClassParams class_params(uint c) {
    ClassParams p;
    p.w = load_weight(c);
    p.pw = load_pos_weight(c);
    return p;
}

void element(vec4 x, vec4 y, ClassParams p, out vec4 l, out vec4 g) {
    Logit t = logit_terms(x);
    vec4 pwy = p.pw * y;
    l = p.w * (pwy * t.sp_neg + (1.0 - y) * t.sp_pos);
    g = p.w * ((1.0 - y) * t.sig_pos - pwy * t.sig_neg);
}

#include "loss_main.glsl"
