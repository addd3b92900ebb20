// Main of the loss kernels; the includer defines
//   ClassParams class_params(uint c)
//   void element(vec4 x, vec4 y, ClassParams p, out vec4 l, out vec4 g)
// giving the weighted elementwise loss and its derivative for classes c .. c+K-1.

void main() {
    uint lane = gl_LocalInvocationID.x;
    uint steps = gl_WorkGroupSize.x / QG;  // M: rows per step
    uint c0 = (gl_WorkGroupID.x * QG + lane % QG) * K;
    uint row0 = gl_WorkGroupID.y * steps * ROWS_PER_LANE + lane / QG;
    bool col_ok = c0 < pc.cols;
    uvec4 ukeep = uvec4(greaterThan(uvec4(K), uvec4(0u, 1u, 2u, 3u)));
    vec4 keep = vec4(ukeep);
    vec4 acc = vec4(0.0);
    uvec4 npos = uvec4(0u);
    ClassParams params = class_params(col_ok ? c0 : 0u);
    for (uint k = 0u; k < ROWS_PER_LANE; ++k) {
        uint r = row0 + k * steps;
        if (col_ok && r < pc.rows) {
            uint i = r * pc.cols + c0;
            vec4 y = load_targets(i);
            vec4 l;
            vec4 g;
            element(load_logits(i), y, params, l, g);
            acc += l * keep;
            npos += uvec4(greaterThan(y, vec4(0.0))) * ukeep;
            store_outputs(i, l, g);
        }
    }
    if (col_ok) {
        store_partials((pc.part_row0 + gl_WorkGroupID.y * steps + lane / QG) * pc.cols + c0, acc, npos);
    }
}
