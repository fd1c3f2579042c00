"""3xTF32 operand split for the Hopper fp32-accurate GEMM: one pass writes an operand K-major and three
times as wide along K, as big/small TF32 parts (``big = x`` with the low 13 mantissa bits cleared,
``small = x - big``, exact in fp32). A gets segments (small, big, big), B gets (big, small, big), so a
single TF32 GEMM over K' = 3K computes small*big + big*small + big*big.

A NaN or +-Inf x goes whole into the third segment, with zeros in the other two (for A and B alike):
its small part would be inf - inf = NaN, and its big part against the other operand's small part
(0 when that one is a TF32 value) would make inf * 0 = NaN, where fp32 math gives +-Inf. So every
product a*b comes out as IEEE fp32 has it: a*b from the third segments, 0 from the other two."""

from __future__ import annotations

KERNEL_NAME = "tracea_split3"
PAIR_NAME = "tracea_split3_pair"


def render() -> str:
    return r"""
static __device__ __forceinline__ float tf32_big(float x) { return __uint_as_float(__float_as_uint(x) & 0xFFFFE000u); }
static __device__ __forceinline__ void put3(float* o, long long K, float x, int order) {
    const bool finite = (__float_as_uint(x) & 0x7f800000u) != 0x7f800000u;
    const float big = tf32_big(x), small = x - big;
    o[0] = finite ? (order ? big : small) : 0.0f;
    o[K] = finite ? (order ? small : big) : 0.0f;
    o[2 * K] = finite ? big : x;
}
// in: [batch][R][C]. kmajor: R = rows, C = K -> out[b][r][seg*K + c]; else R = K, C = rows -> out[b][c][seg*K + r].
static __device__ __forceinline__ void tracea_split3_tile(const float* __restrict__ in, float* __restrict__ out,
                                                          int R, int C, int kmajor, int order, int bx, int by, int bz) {
    __shared__ float tile[32][33];
    const long long K = kmajor ? C : R, rows = kmajor ? R : C;
    in += (long long)bz * R * C;
    out += (long long)bz * rows * 3 * K;
    const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
    const int c0 = bx * 32, r0 = by * 32;
    if (kmajor) {
        for (int i = ty; i < 32; i += 8) {
            const int r = r0 + i, c = c0 + tx;
            if (r < R && c < C) put3(out + (long long)r * 3 * K + c, K, in[(long long)r * C + c], order);
        }
        return;
    }
    for (int i = ty; i < 32; i += 8) {
        const int r = r0 + i, c = c0 + tx;
        if (r < R && c < C) tile[i][tx] = in[(long long)r * C + c];
    }
    __syncthreads();
    for (int i = ty; i < 32; i += 8) {
        const int c = c0 + i, r = r0 + tx;
        if (r < R && c < C) put3(out + (long long)c * 3 * K + r, K, tile[tx][i], order);
    }
}
extern "C" __global__ void __launch_bounds__(256) tracea_split3(const float* __restrict__ in, float* __restrict__ out,
                                                                int R, int C, int kmajor, int order) {
    tracea_split3_tile(in, out, R, C, kmajor, order, blockIdx.x, blockIdx.y, blockIdx.z);
}
// both operands of one GEMM in one launch: a 1-D grid over job 0's tiles, then job 1's
extern "C" __global__ void __launch_bounds__(256) tracea_split3_pair(
        const float* __restrict__ in0, float* __restrict__ out0, int R0, int C0, int kmajor0, int order0, int gx0, int gy0,
        const float* __restrict__ in1, float* __restrict__ out1, int R1, int C1, int kmajor1, int order1, int gx1, int gy1,
        int blocks0) {
    int id = blockIdx.x;
    if (id < blocks0) {
        tracea_split3_tile(in0, out0, R0, C0, kmajor0, order0, id % gx0, (id / gx0) % gy0, id / (gx0 * gy0));
    } else {
        id -= blocks0;
        tracea_split3_tile(in1, out1, R1, C1, kmajor1, order1, id % gx1, (id / gx1) % gy1, id / (gx1 * gy1));
    }
}
"""
