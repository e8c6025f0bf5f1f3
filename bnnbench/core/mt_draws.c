/* torch's CPU draws, bit for bit and faster: torch.rand and torch.randn of a float32 tensor from a torch.Generator's
 * Mersenne twister (MT19937; Matsumoto & Nishimura, 1998), as ATen computes them (core/mt_draws.py says which
 * paths, and checks them against torch at first use).
 *
 * The generator's state is at::mt19937's: 624 words, `left` and `next` (its operator() decrements `left`, twists all
 * 624 words when it reaches 0, and returns word `next++` tempered). A uniform is (word & 0xFFFFFF) * 2^-24. A normal
 * fill of n >= 16 numbers writes n uniforms, turns each block of 16 into normals by Box-Muller over the pairs
 * (j, j + 8), and where 16 does not divide n draws 16 more uniforms into the last 16 places and turns those. Its
 * Box-Muller is ATen's normal_fill_16_AVX2: log and sincos by the Cephes single-precision polynomials (avx_mathfun.h)
 * with the fused multiply-adds that torch's compiled wheel has; every step below is one IEEE operation, fmaf where the
 * wheel fuses, so the result does not depend on how this file is compiled (-std=c99: no contraction of our own).
 *
 * Here the words are twisted a block at a time and tempered, masked and scaled in vector loops, and Box-Muller runs
 * on 8 lanes, where ATen draws one word per call through its generator.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#define NN 624
#define MM 397

static inline uint32_t twist(uint32_t u, uint32_t v) {
    return (((u & 0x80000000u) | (v & 0x7fffffffu)) >> 1) ^ ((v & 1u) ? 0x9908b0dfu : 0u);
}

static void regenerate(uint32_t *s) {
    int k;
    for (k = 0; k < NN - MM; k++) s[k] = s[k + MM] ^ twist(s[k], s[k + 1]);
    for (; k < NN - 1; k++) s[k] = s[k + MM - NN] ^ twist(s[k], s[k + 1]);
    s[NN - 1] = s[MM - 1] ^ twist(s[NN - 1], s[0]);
}

static void uniforms(uint32_t *s, int32_t *left, int32_t *next, float *out, long n) {
    long i = 0;
    int32_t l = *left, nx = *next;
    while (i < n) {
        if (l == 1) {            /* the call that takes `left` to 0 twists first */
            regenerate(s);
            l = NN + 1;
            nx = 0;
        }
        long take = n - i < l - 1 ? n - i : l - 1;
        const uint32_t *w = s + nx;
        float *o = out + i;
        for (long j = 0; j < take; j++) {
            uint32_t y = w[j];
            y ^= y >> 11;
            y ^= (y << 7) & 0x9d2c5680u;
            y ^= (y << 15) & 0xefc60000u;
            y ^= y >> 18;
            o[j] = (float)(int32_t)(y & 0xFFFFFFu) * 5.9604644775390625e-8f;   /* 2^-24: exact */
        }
        i += take;
        nx += (int32_t)take;
        l -= (int32_t)take;
    }
    *left = l;
    *next = nx;
}

static inline uint32_t bits(float x) { uint32_t b; memcpy(&b, &x, 4); return b; }
static inline float from_bits(uint32_t b) { float x; memcpy(&x, &b, 4); return x; }

/* log x for x in (0, 1] (Cephes logf's polynomial, avx_mathfun's log256_ps) */
static inline float cephes_log(float x) {
    x = x > 1.17549435e-38f ? x : 1.17549435e-38f;
    int32_t e_int = (int32_t)(bits(x) >> 23) - 0x7f;
    x = from_bits((bits(x) & ~0x7f800000u) | 0x3f000000u);
    float e = (float)e_int + 1.0f;
    const int small = x < 0.707106781186547524f;
    const float tmp = small ? x : 0.0f;
    x = x - 1.0f;
    e = e - (small ? 1.0f : 0.0f);
    x = x + tmp;
    const float z = x * x;
    float y = fmaf(7.0376836292e-2f, x, -1.1514610310e-1f);
    y = fmaf(y, x, 1.1676998740e-1f);
    y = fmaf(y, x, -1.2420140846e-1f);
    y = fmaf(y, x, 1.4249322787e-1f);
    y = fmaf(y, x, -1.6668057665e-1f);
    y = fmaf(y, x, 2.0000714765e-1f);
    y = fmaf(y, x, -2.4999993993e-1f);
    y = fmaf(y, x, 3.3333331174e-1f);
    y = y * x;
    y = fmaf(y, z, e * -2.12194440e-4f);
    y = fmaf(z, -0.5f, y);
    x = x + y;
    return fmaf(e, 0.693359375f, x);
}

/* (sin x, cos x) for x >= 0 (Cephes sinf / cosf, avx_mathfun's sincos256_ps) */
static inline void cephes_sincos(float x, float *sin_out, float *cos_out) {
    uint32_t sign_sin = bits(x) & 0x80000000u;
    x = from_bits(bits(x) & 0x7fffffffu);
    int32_t q = (int32_t)(x * 1.27323954473516f);
    q = (q + 1) & ~1;
    const float yq = (float)q;
    const uint32_t swap_sign = (uint32_t)(q & 4) << 29;
    const int poly = (q & 2) == 0;
    x = fmaf(yq, -0.78515625f, x);
    x = fmaf(yq, -2.4187564849853515625e-4f, x);
    x = fmaf(yq, -3.77489497744594108e-8f, x);
    const uint32_t sign_cos = (uint32_t)(~(q - 2) & 4) << 29;
    sign_sin ^= swap_sign;
    const float z = x * x;
    float yc = fmaf(2.443315711809948e-5f, z, -1.388731625493765e-3f);
    yc = fmaf(yc, z, 4.166664568298827e-2f);
    yc = yc * z;
    yc = fmaf(yc, z, -(z * 0.5f));
    yc = yc + 1.0f;
    float ys = fmaf(-1.9515295891e-4f, z, 8.3321608736e-3f);
    ys = fmaf(ys, z, -1.6666654611e-1f);
    ys = ys * z;
    ys = fmaf(ys, x, x);
    /* avx_mathfun selects by masks and sums: ysin = (mask & ys) + (~mask & yc), ycos = (yc - ~mask & yc) + (ys - ...) */
    const float s2 = poly ? ys : 0.0f, s1 = poly ? 0.0f : yc;
    const float c2 = ys - s2, c1 = yc - s1;
    *sin_out = from_bits(bits(s1 + s2) ^ sign_sin);
    *cos_out = from_bits(bits(c1 + c2) ^ sign_cos);
}

#if defined(__AVX2__) && defined(__FMA__)
/* the same steps on 8 lanes (each lane's operations are the scalar ones above: the same bits) */
static inline __m256 log8(__m256 x) {
    const __m256 one = _mm256_set1_ps(1.0f);
    x = _mm256_max_ps(x, _mm256_set1_ps(1.17549435e-38f));
    __m256i e_int = _mm256_sub_epi32(_mm256_srli_epi32(_mm256_castps_si256(x), 23), _mm256_set1_epi32(0x7f));
    x = _mm256_or_ps(_mm256_and_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(~0x7f800000))), _mm256_set1_ps(0.5f));
    __m256 e = _mm256_add_ps(_mm256_cvtepi32_ps(e_int), one);
    const __m256 small = _mm256_cmp_ps(x, _mm256_set1_ps(0.707106781186547524f), _CMP_LT_OS);
    const __m256 tmp = _mm256_and_ps(x, small);
    x = _mm256_sub_ps(x, one);
    e = _mm256_sub_ps(e, _mm256_and_ps(one, small));
    x = _mm256_add_ps(x, tmp);
    const __m256 z = _mm256_mul_ps(x, x);
    __m256 y = _mm256_fmadd_ps(_mm256_set1_ps(7.0376836292e-2f), x, _mm256_set1_ps(-1.1514610310e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.1676998740e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(-1.2420140846e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.4249322787e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(-1.6668057665e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(2.0000714765e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(-2.4999993993e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(3.3333331174e-1f));
    y = _mm256_mul_ps(y, x);
    y = _mm256_fmadd_ps(y, z, _mm256_mul_ps(e, _mm256_set1_ps(-2.12194440e-4f)));
    y = _mm256_fmadd_ps(z, _mm256_set1_ps(-0.5f), y);
    x = _mm256_add_ps(x, y);
    return _mm256_fmadd_ps(e, _mm256_set1_ps(0.693359375f), x);
}

static inline void sincos8(__m256 x, __m256 *sin_out, __m256 *cos_out) {
    const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000u));
    __m256 sign_sin = _mm256_and_ps(x, sign);
    x = _mm256_andnot_ps(sign, x);
    __m256i q = _mm256_cvttps_epi32(_mm256_mul_ps(x, _mm256_set1_ps(1.27323954473516f)));
    q = _mm256_and_si256(_mm256_add_epi32(q, _mm256_set1_epi32(1)), _mm256_set1_epi32(~1));
    const __m256 yq = _mm256_cvtepi32_ps(q);
    const __m256 swap_sign = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_and_si256(q, _mm256_set1_epi32(4)), 29));
    const __m256 poly = _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(q, _mm256_set1_epi32(2)),
                                                               _mm256_setzero_si256()));
    x = _mm256_fmadd_ps(yq, _mm256_set1_ps(-0.78515625f), x);
    x = _mm256_fmadd_ps(yq, _mm256_set1_ps(-2.4187564849853515625e-4f), x);
    x = _mm256_fmadd_ps(yq, _mm256_set1_ps(-3.77489497744594108e-8f), x);
    const __m256 sign_cos = _mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_andnot_si256(_mm256_sub_epi32(q, _mm256_set1_epi32(2)), _mm256_set1_epi32(4)), 29));
    sign_sin = _mm256_xor_ps(sign_sin, swap_sign);
    const __m256 z = _mm256_mul_ps(x, x);
    __m256 yc = _mm256_fmadd_ps(_mm256_set1_ps(2.443315711809948e-5f), z, _mm256_set1_ps(-1.388731625493765e-3f));
    yc = _mm256_fmadd_ps(yc, z, _mm256_set1_ps(4.166664568298827e-2f));
    yc = _mm256_mul_ps(yc, z);
    yc = _mm256_fmsub_ps(yc, z, _mm256_mul_ps(z, _mm256_set1_ps(0.5f)));
    yc = _mm256_add_ps(yc, _mm256_set1_ps(1.0f));
    __m256 ys = _mm256_fmadd_ps(_mm256_set1_ps(-1.9515295891e-4f), z, _mm256_set1_ps(8.3321608736e-3f));
    ys = _mm256_fmadd_ps(ys, z, _mm256_set1_ps(-1.6666654611e-1f));
    ys = _mm256_mul_ps(ys, z);
    ys = _mm256_fmadd_ps(ys, x, x);
    const __m256 s2 = _mm256_and_ps(poly, ys), s1 = _mm256_andnot_ps(poly, yc);
    const __m256 c2 = _mm256_sub_ps(ys, s2), c1 = _mm256_sub_ps(yc, s1);
    *sin_out = _mm256_xor_ps(_mm256_add_ps(s1, s2), sign_sin);
    *cos_out = _mm256_xor_ps(_mm256_add_ps(c1, c2), sign_cos);
}

static void box_muller16(float *d) {
    const __m256 u1 = _mm256_sub_ps(_mm256_set1_ps(1.0f), _mm256_loadu_ps(d));
    const __m256 u2 = _mm256_loadu_ps(d + 8);
    const __m256 r = _mm256_sqrt_ps(_mm256_mul_ps(_mm256_set1_ps(-2.0f), log8(u1)));
    __m256 s, c;
    sincos8(_mm256_mul_ps(_mm256_set1_ps(6.283185307179586f), u2), &s, &c);
    _mm256_storeu_ps(d, _mm256_fmadd_ps(_mm256_mul_ps(r, c), _mm256_set1_ps(1.0f), _mm256_setzero_ps()));
    _mm256_storeu_ps(d + 8, _mm256_fmadd_ps(_mm256_mul_ps(r, s), _mm256_set1_ps(1.0f), _mm256_setzero_ps()));
}
#else
static void box_muller16(float *d) {
    const float two_pi = 6.283185307179586f;
    float r[8], c[8], s[8];
    for (int j = 0; j < 8; j++) {
        r[j] = sqrtf(-2.0f * cephes_log(1.0f - d[j]));
        cephes_sincos(two_pi * d[j + 8], &s[j], &c[j]);
    }
    for (int j = 0; j < 8; j++) {
        d[j] = fmaf(r[j] * c[j], 1.0f, 0.0f);
        d[j + 8] = fmaf(r[j] * s[j], 1.0f, 0.0f);
    }
}
#endif

/* The generator's state as torch.Generator.get_state() gives it (CPUGeneratorImplState: the initial seed (8 bytes),
 * left (int32 at 8), seeded (int32), next (uint64 at 16), the 624 words as uint64 at 24, ...): read, drawn from, and
 * written back, the rest untouched. */
typedef struct { uint32_t s[NN]; int32_t left, next; } Twister;

static void load(const unsigned char *st, Twister *t) {
    uint64_t next, w[NN];
    memcpy(&t->left, st + 8, 4);
    memcpy(&next, st + 16, 8);
    memcpy(w, st + 24, sizeof w);
    t->next = (int32_t)next;
    for (int k = 0; k < NN; k++) t->s[k] = (uint32_t)w[k];
}

static void store(unsigned char *st, const Twister *t) {
    uint64_t next = (uint64_t)t->next, w[NN];
    for (int k = 0; k < NN; k++) w[k] = t->s[k];
    memcpy(st + 8, &t->left, 4);
    memcpy(st + 16, &next, 8);
    memcpy(st + 24, w, sizeof w);
}

/* torch.rand(n) of float32 */
void mt_uniform(unsigned char *state, float *out, long n) {
    Twister t;
    load(state, &t);
    uniforms(t.s, &t.left, &t.next, out, n);
    store(state, &t);
}

/* torch.randn(n) of float32, n >= 16 */
void mt_normal(unsigned char *state, float *out, long n) {
    Twister t;
    load(state, &t);
    uniforms(t.s, &t.left, &t.next, out, n);
    for (long i = 0; i + 16 <= n; i += 16) box_muller16(out + i);
    if (n % 16) {
        uniforms(t.s, &t.left, &t.next, out + n - 16, 16);
        box_muller16(out + n - 16);
    }
    store(state, &t);
}
