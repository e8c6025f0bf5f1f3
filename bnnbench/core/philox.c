/* Counter-based draws for the rng=philox setting (core/prng.py): Philox4x32-10 (Salmon, Moraes, Dror and Shaw,
   "Parallel random numbers: as easy as 1, 2, 3", SC 2011) on 16 counters at once, then uniform or Box-Muller normal
   floats. Counter c (a 64-bit number: words c0 = c mod 2^32, c1 = c div 2^32, c2 = c3 = 0) under a 64-bit key gives four
   words w0..w3; the counters of a draw run from 0 in blocks of 16, and block b's words fill out[64 b + 16 w + lane] for
   counter 16 b + lane. From the words (u = w 2^-32 + 2^-33, in (0, 1], and v = (w >> 8) 2^-24, in [0, 1)):

       uniform:  out = (w >> 8) 2^-24
       normal:   z0 = sqrt(-2 log u(w0)) cos(2 pi v(w1)),  z1 = sqrt(-2 log u(w0)) sin(2 pi v(w1))  (and w2, w3 alike)

   with log, cos and sin by the polynomials below (Cephes' logf, sinf, cosf, about 1e-7 relative) in single IEEE
   operations, no fused multiply-adds, so that draws.py's torch version of the same operations gives the same bits. */
#pragma GCC optimize("fp-contract=off", "no-math-errno")
#include <stdint.h>
#include <string.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

#define V 16
#define NB 4   /* blocks of 16 counters whose rounds interleave (independent chains) */
typedef uint32_t vu __attribute__((vector_size(V * 4)));
typedef uint64_t vq __attribute__((vector_size(V * 4)));
typedef int32_t vi __attribute__((vector_size(V * 4)));
typedef float vf __attribute__((vector_size(V * 4)));

static inline vf splat(float a) { return (vf){0} + a; }

/* (hi, lo) words of m a, lane by lane: even and odd lanes as 64-bit products */
static inline void mulhilo(uint32_t m, vu a, vu *hi, vu *lo) {
#ifdef __AVX512F__
    __m512i x = (__m512i)a, mm = _mm512_set1_epi64(m);
    __m512i pe = _mm512_mul_epu32(x, mm), po = _mm512_mul_epu32(_mm512_srli_epi64(x, 32), mm);
    *lo = (vu)_mm512_mask_blend_epi32(0xAAAA, pe, _mm512_slli_epi64(po, 32));
    *hi = (vu)_mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(pe, 32), po);
#else
    const vq low = (vq){0} + 0xffffffffu;
    vq pe = ((vq)a & low) * (uint64_t)m, po = ((vq)a >> 32) * (uint64_t)m;
    *lo = (vu)((pe & low) | (po << 32));
    *hi = (vu)((pe >> 32) | (po & ~low));
#endif
}

static inline vf sqrtv(vf x) {
#ifdef __AVX512F__
    return (vf)_mm512_sqrt_ps((__m512)x);
#else
    for (int i = 0; i < V; i++) x[i] = __builtin_sqrtf(x[i]);
    return x;
#endif
}

/* Ten rounds on NB blocks of counters c[b][0..3], the key (k0, k1) bumped by the Weyl constants after each. */
static inline void philox(vu c[NB][4], uint32_t k0, uint32_t k1) {
    for (int r = 0; r < 10; r++) {
        for (int b = 0; b < NB; b++) {
            vu hi0, lo0, hi1, lo1;
            mulhilo(0xD2511F53u, c[b][0], &hi0, &lo0);
            mulhilo(0xCD9E8D57u, c[b][2], &hi1, &lo1);
            vu n0 = hi1 ^ c[b][1] ^ k0, n2 = hi0 ^ c[b][3] ^ k1;
            c[b][0] = n0, c[b][1] = lo1, c[b][2] = n2, c[b][3] = lo0;
        }
        k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
    }
}

static inline void counters(vu c[NB][4], uint64_t first) {
    const vu lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    for (int b = 0; b < NB; b++) {
        uint64_t c0 = first + (uint64_t)b * V;
        c[b][0] = (uint32_t)c0 + lane;
        c[b][1] = ((vu){0} + (uint32_t)(c0 >> 32)) - (vu)(c[b][0] < lane);   /* the carry: a comparison is -1 */
        c[b][2] = (vu){0}, c[b][3] = (vu){0};
    }
}

static inline vf unit_half_open(vu w) { return __builtin_convertvector((vi)(w >> 8), vf) * splat(0x1p-24f); }
static inline vf unit_open(vu w) { return __builtin_convertvector(w, vf) * splat(0x1p-32f) + splat(0x1p-33f); }

static inline vf blend(vi mask, vf a, vf b) { return (vf)(((vi)a & mask) | ((vi)b & ~mask)); }

/* log x for x in (0, 1]: x = m 2^e, m in [sqrt(1/2), sqrt(2)); log(1 + f) by Cephes' logf polynomial. */
static inline vf logv(vf x) {
    vi b = (vi)x;
    vi e = ((b >> 23) & 0xff) - 126;
    vf m = (vf)((b & 0x007fffff) | 0x3f000000);   /* [1/2, 1) */
    vi small = m < splat(0.707106781186547524f);
    e = e + small;                                 /* a comparison is -1 */
    m = blend(small, m + m, m) - splat(1.0f);
    vf z = m * m;
    vf y = splat(7.0376836292e-2f);
    y = y * m + splat(-1.1514610310e-1f);
    y = y * m + splat(1.1676998740e-1f);
    y = y * m + splat(-1.2420140846e-1f);
    y = y * m + splat(1.4249322787e-1f);
    y = y * m + splat(-1.6668057665e-1f);
    y = y * m + splat(2.0000714765e-1f);
    y = y * m + splat(-2.4999993993e-1f);
    y = y * m + splat(3.3333331174e-1f);
    y = y * m * z;
    vf fe = __builtin_convertvector(e, vf);
    y = y + fe * splat(-2.12194440e-4f);
    y = y - splat(0.5f) * z;
    return m + y + fe * splat(0.693359375f);
}

/* (cos, sin) of 2 pi v for v in [0, 1): quadrant q = round(4 v) mod 4, r = (4 v - round(4 v)) pi / 2 in
   [-pi/4, pi/4], Cephes' sinf and cosf polynomials in r, rotated by q. */
static inline void cos_sin(vf v, vf *c, vf *s) {
    vf x = v * splat(4.0f);
    vi n = __builtin_convertvector(x + splat(0.5f), vi);   /* x + 1/2 >= 0: truncation is floor */
    vf r = (x - __builtin_convertvector(n, vf)) * splat(1.57079632679489662f);
    vf r2 = r * r;
    vf sr = r + r * r2 * (splat(-1.6666654611e-1f) + r2 * (splat(8.3321608736e-3f) + r2 * splat(-1.9515295891e-4f)));
    vf cr = splat(1.0f) - splat(0.5f) * r2
            + r2 * r2 * (splat(4.166664568298827e-2f) + r2 * (splat(-1.388731625493765e-3f)
                                                              + r2 * splat(2.443315711809948e-5f)));
    vi odd = (n & 1) == 1, neg_c = ((n + 1) & 2) == 2, neg_s = (n & 2) == 2;
    const vi sign = (vi){0} + (int32_t)0x80000000;
    *c = (vf)((vi)blend(odd, sr, cr) ^ (neg_c & sign));
    *s = (vf)((vi)blend(odd, cr, sr) ^ (neg_s & sign));
}

static inline void box_muller(vu w0, vu w1, vf *z0, vf *z1) {
    vf rad = sqrtv(logv(unit_open(w0)) * splat(-2.0f)), c, s;
    cos_sin(unit_half_open(w1), &c, &s);
    *z0 = rad * c, *z1 = rad * s;
}

/* n draws (normal: 1, else uniform) of key from counter 0 into out. */
static void draw(uint64_t key, float *out, long n, int normal) {
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    float buf[NB * 4 * V];
    uint64_t ctr = 0;
    for (long i = 0; i < n; i += NB * 4 * V, ctr += NB * V) {
        vu c[NB][4];
        counters(c, ctr);
        philox(c, k0, k1);
        float *dst = i + NB * 4 * V <= n ? out + i : buf;
        for (int b = 0; b < NB; b++)
            for (int h = 0; h < 4; h += 2) {
                vf a, z;
                if (normal) box_muller(c[b][h], c[b][h + 1], &a, &z);
                else a = unit_half_open(c[b][h]), z = unit_half_open(c[b][h + 1]);
                memcpy(dst + (4 * b + h) * V, &a, sizeof a);
                memcpy(dst + (4 * b + h + 1) * V, &z, sizeof z);
            }
        if (dst == buf) memcpy(out + i, buf, (n - i) * sizeof(float));
    }
}

void philox_normal(uint64_t key, float *out, long n) { draw(key, out, n, 1); }
void philox_uniform(uint64_t key, float *out, long n) { draw(key, out, n, 0); }
