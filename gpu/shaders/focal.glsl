// Sigmoid focal loss (torchvision.ops.sigmoid_focal_loss) times a class weight:
//   ce = softplus(x) - x*y = y*softplus(-x) + (1-y)*softplus(x)
//   m  = 1 - p_t = sigmoid(x)*(1-y) + sigmoid(-x)*y
//   a  = alpha*y + (1-alpha)*(1-y) when alpha >= 0, else 1
//   l  = w_c * a * ce * m^gamma
//   dl/dx = w_c * a * (dce * m^gamma + ce * gamma * m^(gamma-1) * dm)
//   with dce = sigmoid(x) - y and dm = sigmoid(x)*sigmoid(-x)*(1-2y).
// m^(gamma-1) * sigmoid(x)*sigmoid(-x) is evaluated as m^gamma * r with
// r = sigmoid(x)*sigmoid(-x)/m <= 1, so it stays finite for 0 <= gamma < 1 too.

#define POS_WEIGHT 0
#include "loss_common.glsl"

ClassParams class_params(uint c) {
    ClassParams p;
    p.w = load_weight(c);
    p.pw = vec4(1.0);
    return p;
}

void element(vec4 x, vec4 y, ClassParams p, out vec4 l, out vec4 g) {
    Logit t = logit_terms(x);
    vec4 w = p.w;
    vec4 ce = y * t.sp_neg + (1.0 - y) * t.sp_pos;
    vec4 dce = (1.0 - y) * t.sig_pos - y * t.sig_neg;
    vec4 m = t.sig_pos * (1.0 - y) + t.sig_neg * y;
    vec4 mg = vec4(1.0);
    vec4 focus = vec4(0.0);
    if (pc.gamma != 0.0) {
        bvec4 live = greaterThan(m, vec4(0.0));
        vec4 safe = mix(vec4(1.0), m, live);
        mg = mix(vec4(0.0), exp2(pc.gamma * log2(safe)), live);
        vec4 r = mix(vec4(0.0), (t.sig_pos * t.sig_neg) / safe, live);
        focus = pc.gamma * mg * r * (1.0 - 2.0 * y);
    }
    vec4 a = pc.alpha >= 0.0 ? pc.alpha * y + (1.0 - pc.alpha) * (1.0 - y) : vec4(1.0);
    l = w * a * ce * mg;
    g = w * a * (dce * mg + ce * focus);
}

#include "loss_main.glsl"
