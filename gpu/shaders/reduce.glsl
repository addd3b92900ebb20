// One level of the per-class reduction: (rows_in, cols) partial sums and counts
// become (ceil(rows_in / ROWS_PER_LANE), cols). Each invocation owns one column and
// adds ROWS_PER_LANE rows in an unrolled loop (no loop counter); the host repeats
// levels until one row is left. The includer defines TEXEL (0 or 1), as for the
// loss kernels: texel views (r32f / r32ui) or storage buffers.

#extension GL_EXT_control_flow_attributes : require

layout(local_size_x_id = 0) in;

#if TEXEL
layout(set = 0, binding = 0) uniform samplerBuffer in_sum;
layout(set = 0, binding = 1) uniform usamplerBuffer in_pos;
layout(set = 0, binding = 2, r32f) uniform restrict writeonly imageBuffer out_sum;
layout(set = 0, binding = 3, r32ui) uniform restrict writeonly uimageBuffer out_pos;
#define LOAD_SUM(i) texelFetch(in_sum, int(i)).x
#define LOAD_POS(i) texelFetch(in_pos, int(i)).x
#define STORE(i, s, n) imageStore(out_sum, int(i), vec4(s)); imageStore(out_pos, int(i), uvec4(n))
#else
layout(std430, set = 0, binding = 0) readonly buffer InSum { float in_sum[]; };
layout(std430, set = 0, binding = 1) readonly buffer InPos { uint in_pos[]; };
layout(std430, set = 0, binding = 2) writeonly buffer OutSum { float out_sum[]; };
layout(std430, set = 0, binding = 3) writeonly buffer OutPos { uint out_pos[]; };
#define LOAD_SUM(i) in_sum[i]
#define LOAD_POS(i) in_pos[i]
#define STORE(i, s, n) out_sum[i] = s; out_pos[i] = n
#endif

layout(push_constant, std430) uniform Params {
    uint rows_in;
    uint cols;
} pc;

const uint ROWS_PER_LANE = 16u;

void main() {
    uint c = gl_GlobalInvocationID.x;
    uint g = gl_WorkGroupID.y;
    if (c >= pc.cols) {
        return;
    }
    float acc = 0.0;
    uint npos = 0u;
    [[unroll]] for (uint k = 0u; k < ROWS_PER_LANE; ++k) {
        uint r = g * ROWS_PER_LANE + k;
        if (r < pc.rows_in) {
            acc += LOAD_SUM(r * pc.cols + c);
            npos += LOAD_POS(r * pc.cols + c);
        }
    }
    STORE(g * pc.cols + c, acc, npos);
}
