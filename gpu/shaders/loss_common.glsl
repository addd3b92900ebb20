// Shared part of the loss kernels: bindings, push constants, loads, stores and
// stable helpers.
//
// Layout: logits and targets are (rows, cols) row-major; one dispatch covers one
// chunk of rows (no binding over the device's range limits). Every invocation owns
// K consecutive classes (a "quad"; K = 4, 2 or 1 divides cols) and walks
// ROWS_PER_LANE (a specialization constant, at most 256) rows of them, far below
// lavapipe's silent 65,535-iteration loop cap, adding the loss into its own
// per-class partial sums: no cross-invocation reduction in this pass. A work group
// of QG * M invocations covers QG quads of M rows per step, so consecutive
// invocations read consecutive memory; it writes M rows of partial sums and
// positive counts, which reduce.glsl folds afterwards.
//
// The includer defines TEXEL (0 or 1) and POS_WEIGHT (0 or 1). TEXEL reads
// logits, targets and weights as uniform texel buffers whose format (r/rg/rgba,
// 16 or 32-bit float, chosen by the host) converts to float32, reads the gradient
// it adds to through a uniform texel view as well (binding 8, the same range as
// binding 2: each invocation reads its texels before writing them, and lavapipe's
// texel fetch is a third cheaper than an image load), and writes the gradient, the
// elementwise loss and the partial sums as storage texel buffers
// of the float32 format matching K (TEXEL_K, OUT_FORMAT, COUNT_FORMAT; declared
// formats keep lavapipe on its fast path). On lavapipe texel accesses are vector
// gathers, several times cheaper than storage-buffer accesses (a per-lane loop).
// Otherwise (the portable path) inputs are storage buffers of float or float16_t
// (16-bit storage; LOGIT_F16 / TARGET_F16 say which). What the kernel writes is fixed at pipeline creation (GRAD_MODE,
// WRITE_LOSS), so unused paths are compiled out rather than masked.

#extension GL_EXT_control_flow_attributes : require
#if !TEXEL
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#endif

layout(local_size_x_id = 0) in;                        // QG * M invocations
layout(constant_id = 1) const uint QG = 1u;            // quads per work group
#if TEXEL
const uint K = TEXEL_K;                                // classes per quad: 4, 2 or 1
#else
layout(constant_id = 2) const uint K = 4u;             // classes per quad: 4, 2 or 1
#endif
layout(constant_id = 3) const uint GRAD_MODE = 0u;     // 0: no gradient, 1: grad += g, 2: grad = g
layout(constant_id = 4) const bool WRITE_LOSS = false; // write the elementwise loss
layout(constant_id = 5) const uint ROWS_PER_LANE = 64u; // rows each invocation walks

const uint GRAD_ADD = 1u;
const uint GRAD_STORE = 2u;

layout(push_constant, std430) uniform Params {
    uint rows;         // rows in this chunk
    uint cols;         // classes
    uint part_row0;    // first partial-sum row of this chunk
    float grad_scale;  // 1/(N*C) for "mean", else 1
    float alpha;       // focal: alpha < 0 disables alpha weighting
    float gamma;       // focal: focusing exponent >= 0
} pc;

#if TEXEL
layout(set = 0, binding = 0) uniform samplerBuffer logits;
layout(set = 0, binding = 1) uniform samplerBuffer targets;
layout(set = 0, binding = 2, OUT_FORMAT) uniform restrict writeonly imageBuffer grad;
layout(set = 0, binding = 8) uniform samplerBuffer grad_in;  // the same range as grad, read as a texel fetch
layout(set = 0, binding = 3, OUT_FORMAT) uniform restrict writeonly imageBuffer loss_out;
layout(set = 0, binding = 4) uniform samplerBuffer weight;
layout(set = 0, binding = 6, OUT_FORMAT) uniform restrict writeonly imageBuffer part_sum;
layout(set = 0, binding = 7, COUNT_FORMAT) uniform restrict writeonly uimageBuffer part_pos;
#if POS_WEIGHT
layout(set = 0, binding = 5) uniform samplerBuffer pos_weight;
vec4 load_pos_weight(uint c) { return texelFetch(pos_weight, int(c / K)); }
#endif

// i is the flat index of the first of K values, a multiple of K: texel i / K.
vec4 load_logits(uint i) { return texelFetch(logits, int(i / K)); }
vec4 load_targets(uint i) { return texelFetch(targets, int(i / K)); }
vec4 load_weight(uint c) { return texelFetch(weight, int(c / K)); }

void store_partials(uint p, vec4 sums, uvec4 counts) {
    imageStore(part_sum, int(p / K), sums);
    imageStore(part_pos, int(p / K), counts);
}

void store_outputs(uint i, vec4 l, vec4 g) {
    int t = int(i / K);
    if (GRAD_MODE == GRAD_ADD) {
        imageStore(grad, t, texelFetch(grad_in, t) + g * pc.grad_scale);
    } else if (GRAD_MODE == GRAD_STORE) {
        imageStore(grad, t, g * pc.grad_scale);
    }
    if (WRITE_LOSS) {
        imageStore(loss_out, t, l);
    }
}
#else
#if LOGIT_F16
#define LOGIT_T float16_t
#else
#define LOGIT_T float
#endif
#if TARGET_F16
#define TARGET_T float16_t
#else
#define TARGET_T float
#endif
layout(std430, set = 0, binding = 0) readonly buffer Logits { LOGIT_T logits[]; };
layout(std430, set = 0, binding = 1) readonly buffer Targets { TARGET_T targets[]; };
layout(std430, set = 0, binding = 2) buffer Grad { float grad[]; };
layout(std430, set = 0, binding = 3) writeonly buffer LossOut { float loss_out[]; };
layout(std430, set = 0, binding = 4) readonly buffer Weight { float weight[]; };
layout(std430, set = 0, binding = 6) writeonly buffer PartSum { float part_sum[]; };
layout(std430, set = 0, binding = 7) writeonly buffer PartPos { uint part_pos[]; };
#if POS_WEIGHT
layout(std430, set = 0, binding = 5) readonly buffer PosWeight { float pos_weight[]; };
#endif

#define LOAD4(ARR, i) \
    vec4(float(ARR[i]), K > 1u ? float(ARR[(i) + 1u]) : 0.0, \
         K > 2u ? float(ARR[(i) + 2u]) : 0.0, K > 2u ? float(ARR[(i) + 3u]) : 0.0)
vec4 load_logits(uint i) { return LOAD4(logits, i); }
vec4 load_targets(uint i) { return LOAD4(targets, i); }
vec4 load_weight(uint c) { return LOAD4(weight, c); }
#if POS_WEIGHT
vec4 load_pos_weight(uint c) { return LOAD4(pos_weight, c); }
#endif

void store_partials(uint p, vec4 sums, uvec4 counts) {
    [[unroll]] for (uint k = 0u; k < 4u; ++k) {
        if (k < K) {
            part_sum[p + k] = sums[k];
            part_pos[p + k] = counts[k];
        }
    }
}

void store_outputs(uint i, vec4 l, vec4 g) {
    [[unroll]] for (uint k = 0u; k < 4u; ++k) {
        if (k < K) {
            if (GRAD_MODE == GRAD_ADD) {
                grad[i + k] += g[k] * pc.grad_scale;
            } else if (GRAD_MODE == GRAD_STORE) {
                grad[i + k] = g[k] * pc.grad_scale;
            }
            if (WRITE_LOSS) {
                loss_out[i + k] = l[k];
            }
        }
    }
}
#endif

// Per-class values an invocation keeps for all its rows (weights, pos_weights).
struct ClassParams {
    vec4 w;
    vec4 pw;
};

// What both losses need about x, each without cancellation for |x| up to 1e4:
// softplus(x), softplus(-x), sigmoid(x), sigmoid(-x). With e = exp(-|x|) and
// u = fl(1 + e), log1p(e) = log(u) + (e - (u - 1)) / u to float32 rounding: the
// rounding error e - (u - 1) is exact, and 1/u is also sigmoid(|x|). The
// temporaries are precise so that (1 + e) - 1 is not folded to e.
struct Logit {
    vec4 sp_pos;
    vec4 sp_neg;
    vec4 sig_pos;
    vec4 sig_neg;
};

Logit logit_terms(vec4 x) {
    vec4 e = exp(-abs(x));
    precise vec4 u = 1.0 + e;
    precise vec4 lost = e - (u - 1.0);
    vec4 hi = 1.0 / u;
    vec4 lp = log(u) + lost * hi;
    vec4 lo = e * hi;
    bvec4 pos = greaterThanEqual(x, vec4(0.0));
    Logit t;
    t.sp_pos = max(x, 0.0) + lp;
    t.sp_neg = max(-x, 0.0) + lp;
    t.sig_pos = mix(lo, hi, pos);
    t.sig_neg = mix(hi, lo, pos);
    return t;
}
