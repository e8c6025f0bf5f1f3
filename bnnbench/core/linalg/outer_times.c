/* out = c2 G G^T Y in float32 for R replicas: G [P, n] the per-example gradients of an MLP's n = S M (sample, example)
   pairs, never formed (core/linalg/outer_times.py). Layer l's block of G^T Y and of G W, for the layer's inputs with a
   1 appended a_i [j] and back-propagated gradients g_i [o] (example i's gradient a_i g_i^T) and Y's block [j, o, k]:

       (G^T Y)_ik = sum_o g_io X_iok,   X_i = a_i^T Y   (summed over layers),
       (G W)_jok  = sum_i a_ij H_iok,   H_iok = g_io W_ik.

   Where the S samples share a layer's inputs (the first layer: the data), X is formed once per example and H summed
   over the samples before the product with a: a pass over M, not S M, examples. The inputs and gradients are
   transposed once a step (outer_pack: examples innermost, each sample's M padded with zeros to whole vectors); the
   products take one replica at a time, in a scratch buffer that stays in the core's cache: X by blocked.h's layer_fwd,
   a H by its layer_grads where o k is under a vector's 16 columns, else by rows_times on H transposed; the shared layer
   at k = 3, S = 2 (SLANG L = 1's Nystrom products) by shared_t3 and shared_gw3, which keep X and H in registers
   (neither is stored, nothing is transposed), where its examples take more than one vector (at one, minibatches of 16
   and fewer, their sums would end in a horizontal reduction each: the generic products are faster). outer_nystrom
   packs and multiplies one replica at a time for the whole of SLANG's Nystrom subspace iteration (its operands stay in
   the core's cache for the five products), orthonormalising by Householder reflections as LAPACK does. */
#include <math.h>
#include "blocked.h"

static long width(long S, long M, const long *shared, long l) { return shared[l] ? padded(M) : S * padded(M); }

long outer_pack_size(long S, long M, const long *j, const long *o, const long *shared, long L) {
    long w = 0;
    for (long l = 0; l < L; l++) w += j[l] * width(S, M, shared, l) + o[l] * S * padded(M);
    return w;
}

typedef float vfu __attribute__((vector_size(V * sizeof(float)), aligned(sizeof(float))));   /* unaligned loads */

/* One round of a 16 x 16 transpose in registers: rows i and i + d (i & d = 0) swap their off-diagonal d x d blocks,
   r[i][q] = q & d ? r[i + d][q - d] : r[i][q] and r[i + d][q] = q & d ? r[i + d][q] : r[i][q + d] (the masks lo, hi). */
#define SWAP(d, lo, hi)                                                                                       \
    for (long i = 0; i < V; i++)                                                                              \
        if (!(i & (d))) {                                                                                     \
            vf a_ = r[i], b_ = r[i + (d)];                                                                    \
            r[i] = __builtin_shuffle(a_, b_, lo);                                                             \
            r[i + (d)] = __builtin_shuffle(a_, b_, hi);                                                       \
        }

/* r[0..V) = 16 rows of src from m0 (rows from m0 + nm on zero), columns c0.. (contiguous), transposed in registers by
   four rounds of SWAP: r[i] is then column c0 + i. */
static inline __attribute__((always_inline)) void transpose_block(const float *src, long rs, long m0, long nm, long c0,
                                                                  vf r[V]) {
    for (long i = 0; i < V; i++) r[i] = i < nm ? *(const vfu *)(src + (m0 + i) * rs + c0) : (vf){0};
    SWAP(8, ((vi){0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23}),
         ((vi){8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31}));
    SWAP(4, ((vi){0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27}),
         ((vi){4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31}));
    SWAP(2, ((vi){0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29}),
         ((vi){2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31}));
    SWAP(1, ((vi){0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30}),
         ((vi){1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31}));
}

/* dst[c * ld + m] = src[m * rs + c * cs] for m < M, c < C: 16 x 16 blocks transposed in registers where the columns are
   contiguous (cs = 1), element by element elsewhere. With cs = 1 the last rows' block, fewer than 16 rows, is
   transposed with rows of zeros below it and stored whole: dst's rows must then have room for M padded to whole
   vectors, and get zeros past M (where C has whole blocks of 16 columns). */
static void transpose(const float *src, long rs, long cs, long M, long C, float *dst, long ld) {
    long m0 = 0;
    if (cs == 1)
        for (; m0 < M; m0 += V) {
            long nm = M - m0 < V ? M - m0 : V, c0 = 0;
            for (; c0 + V <= C; c0 += V) {
                vf r[V];
                transpose_block(src, rs, m0, nm, c0, r);
                for (long i = 0; i < V; i++) *(vf *)(dst + (c0 + i) * ld + m0) = r[i];
            }
            for (long m = m0; m < m0 + nm; m++)
                for (long c = c0; c < C; c++) dst[c * ld + m] = src[m * rs + c];
        }
    for (long m = m0; m < M; m++)
        for (long c = 0; c < C; c++) dst[c * ld + m] = src[m * rs + c * cs];
}

/* One replica's packed inputs and gradients (outer_pack) at p. */
static void pack_replica(const float *const *a, const long *astr, const float *const *g, const long *gstr,
                         const long *j, const long *o, const long *shared, long L, long r, long S, long M, float *p) {
    long Mp = padded(M), n = S * Mp;
    for (long l = 0; l < L; l++) {
        long Sl = shared[l] ? 1 : S, Ml = Sl * Mp;
        const long *as = astr + 4 * l, *gs = gstr + 4 * l;
        for (long s = 0; s < Sl; s++) {
            float *dst = p + s * Mp;
            transpose(a[l] + r * as[0] + s * as[1], as[2], as[3], M, j[l] - 1, dst, Ml);
            for (long m = 0; m < M; m++) dst[(j[l] - 1) * Ml + m] = 1.0f;
            for (long jj = 0; jj < j[l]; jj++) memset(dst + jj * Ml + M, 0, (Mp - M) * sizeof(float));
        }
        p += j[l] * Ml;
        for (long s = 0; s < S; s++) {
            float *dst = p + s * Mp;
            transpose(g[l] + r * gs[0] + s * gs[1], gs[2], gs[3], M, o[l], dst, n);
            for (long oo = 0; oo < o[l]; oo++) memset(dst + oo * n + M, 0, (Mp - M) * sizeof(float));
        }
        p += o[l] * n;
    }
}

/* packed[r]: per layer a^T [j, Ml] (the inputs a[r, s, m, :] with a 1 appended; Ml = Mp where shared, else S Mp) and
   g^T [o, S Mp], each sample's M examples padded with zeros to Mp, a whole number of vectors; a[l] and g[l] read
   through their strides (astr, gstr: replica, sample, example, unit). Once a step: the products reuse it. */
void outer_pack(const float *const *a, const long *astr, const float *const *g, const long *gstr, const long *j,
                const long *o, const long *shared, long L, long R, long S, long M, float *packed) {
    long W = outer_pack_size(S, M, j, o, shared, L);
    for (long r = 0; r < R; r++) pack_replica(a, astr, g, gstr, j, o, shared, L, r, S, M, packed + r * W);
}

long outer_times_work(long S, long M, const long *o, long L, long k) {
    long n = S * padded(M), mx = 0;
    for (long l = 0; l < L; l++) if (o[l] * k > mx) mx = o[l] * k;
    return k * n + 2 * padded(mx) * n + 2 * padded(mx) + V;
}

/* out[jj, c] = sum_m aT[jj, m] H[m, c] for jj < j, c < C (H [Ml, ld]: its columns past C reach only columns of out
   that are not stored): blocks of 4 rows x 5 vectors of columns in registers, a block at the edge repeating its last
   row or vector (computed, not stored). */
static void rows_times(const float *restrict aT, long j, long Ml, const float *restrict H, long ld, long C,
                       float *restrict out) {
    long nvc = ld / V;
    for (long j0 = 0; j0 < j; j0 += 4) {
        long nj = j - j0 < 4 ? j - j0 : 4, q1 = nj > 1, q2 = nj > 2 ? 2 : q1, q3 = nj > 3 ? 3 : q2;
        const float *a0 = aT + j0 * Ml, *a1 = aT + (j0 + q1) * Ml, *a2 = aT + (j0 + q2) * Ml, *a3 = aT + (j0 + q3) * Ml;
        for (long c0 = 0; c0 < nvc; c0 += 5) {
            long nc = nvc - c0 < 5 ? nvc - c0 : 5, u[5];
            for (long i = 0; i < 5; i++) u[i] = i < nc ? i : nc - 1;
            vf acc[4][5] = {{{0}}};
            for (long m = 0; m < Ml; m++) {
                const vf *h = (const vf *)(H + m * ld) + c0;
                vf h0 = h[u[0]], h1 = h[u[1]], h2 = h[u[2]], h3 = h[u[3]], h4 = h[u[4]];
                vf x[4] = {splat(a0[m]), splat(a1[m]), splat(a2[m]), splat(a3[m])};
                for (long q = 0; q < 4; q++) {
                    acc[q][0] += x[q] * h0; acc[q][1] += x[q] * h1; acc[q][2] += x[q] * h2;
                    acc[q][3] += x[q] * h3; acc[q][4] += x[q] * h4;
                }
            }
            for (long q = 0; q < nj; q++)
                for (long i = 0; i < nc; i++) {
                    long c = (c0 + i) * V;
                    float *dst = out + (j0 + q) * C + c;
                    if (c + V <= C) *(vfu *)dst = acc[q][i];
                    else for (long e = 0; c + e < C; e++) dst[e] = acc[q][i][e];
                }
        }
    }
}

/* Scratch of one replica's products (times_replica), carved from work (outer_times_work floats). */
typedef struct { float *TT, *XT, *H, *zero, *db; } scratch;

static scratch carve(float *work, long S, long M, const long *o, long L, long k) {
    long n = S * padded(M), mx = 0;
    for (long l = 0; l < L; l++) if (o[l] * k > mx) mx = o[l] * k;
    scratch w;
    w.TT = aligned(work), w.XT = w.TT + k * n, w.H = w.XT + padded(mx) * n, w.zero = w.H + padded(mx) * n,
    w.db = w.zero + padded(mx);
    memset(w.zero, 0, mx * sizeof(float));
    return w;
}

/* nu (1 or 2) output units' contributions from oo to the shared layer's T^T at k = 3, S = 2 for two vectors of
   examples: X's three columns of each unit summed over the inputs in registers (2 nu x 3 independent sums), then
   into T's accumulators t, the units in order. */
static inline __attribute__((always_inline)) void shared_t3_units(const vf *restrict av, long u1, long j, long Mp,
                                                                   const vf *restrict g, long n, const float *Yl,
                                                                   long o, long oo, const long nu, vf t[3][2][2]) {
    vf x[2][3][2] = {{{{0}}}};
    for (long jj = 0; jj < j; jj++) {
        const vf *a = av + jj * (Mp / V);
        vf a0 = a[0], a1 = a[u1];
        const float *w = Yl + (jj * o + oo) * 3;
        for (long u = 0; u < nu; u++)
            for (long kk = 0; kk < 3; kk++) {
                vf wk = splat(w[3 * u + kk]);
                x[u][kk][0] += wk * a0, x[u][kk][1] += wk * a1;
            }
    }
    for (long u = 0; u < nu; u++)
        for (long s = 0; s < 2; s++) {
            const vf *gv = g + ((oo + u) * n + s * Mp) / V;
            vf g0 = gv[0], g1 = gv[u1];
            for (long kk = 0; kk < 3; kk++) t[kk][s][0] += g0 * x[u][kk][0], t[kk][s][1] += g1 * x[u][kk][1];
        }
}

/* The shared layer's part of T^T at k = 3, S = 2 (SLANG L = 1's Nystrom probes on its two samples), X never stored:
   for two vectors of examples, X's three columns of two output units at a time sum over the inputs in registers and
   go straight into T's twelve accumulators, which stay in registers across the units (the sums and their order are
   those of layer_fwd and the loop over o in times_replica):
       T^T[kk, s Mp + m] += sum_o g^T[o, s Mp + m] sum_j Y_l[j, o, kk] a^T[j, m]. */
static void shared_t3(const float *restrict aT, long j, long Mp, const float *restrict gT, long o, long n,
                      const float *restrict Yl, float *restrict TT) {
    long nv = Mp / V;
    for (long v0 = 0; v0 < nv; v0 += 2) {
        long u1 = nv - v0 > 1;
        vf t[3][2][2];
        for (long kk = 0; kk < 3; kk++)
            for (long s = 0; s < 2; s++) {
                const vf *tv = (const vf *)(TT + kk * n + s * Mp) + v0;
                t[kk][s][0] = tv[0], t[kk][s][1] = tv[u1];
            }
        const vf *av = (const vf *)aT + v0, *g = (const vf *)gT + v0;
        long oo = 0;
        for (; oo + 1 < o; oo += 2) shared_t3_units(av, u1, j, Mp, g, n, Yl, o, oo, 2, t);
        if (oo < o) shared_t3_units(av, u1, j, Mp, g, n, Yl, o, oo, 1, t);
        for (long kk = 0; kk < 3; kk++)
            for (long s = 0; s < 2; s++) {   /* a repeated vector: the same sum twice */
                vf *tv = (vf *)(TT + kk * n + s * Mp) + v0;
                tv[u1] = t[kk][s][1], tv[0] = t[kk][s][0];
            }
    }
}

/* The shared layer's (G W)_l at k = 3, S = 2 for nr <= 6 of its input rows from j0, H never stored: for one output
   unit, H's three columns one vector of examples at a time, the rows' dot products with them summed along the
   examples in nr x 3 registers, then across each vector's lanes (hsum8):
       out[jj, o, kk] = sum_m a^T[jj, m] H[m, o, kk],   H[m, o, kk] = sum_s g^T[o, s Mp + m] W^T[kk, s Mp + m]. */
static inline __attribute__((always_inline)) void shared_gw3(const float *restrict aT, long j0, const long nr, long Mp,
                                                              const float *restrict gT, long o, long n,
                                                              const float *restrict WT, float *restrict out) {
    long nv = Mp / V;
    for (long oo = 0; oo < o; oo++) {
        vf acc[6][3] = {{{0}}};
        const vf *g0 = (const vf *)(gT + oo * n), *g1 = g0 + nv;
        for (long v = 0; v < nv; v++) {
            vf h[3];
            for (long kk = 0; kk < 3; kk++) {
                const vf *wk = (const vf *)(WT + kk * n);
                h[kk] = g0[v] * wk[v] + g1[v] * wk[nv + v];
            }
            for (long i = 0; i < nr; i++) {
                vf a = ((const vf *)(aT + (j0 + i) * Mp))[v];
                for (long kk = 0; kk < 3; kk++) acc[i][kk] += a * h[kk];
            }
        }
        for (long b = 0; b < 3 * nr; b += 8) {
            vf sums[8];
            for (long q = 0; q < 8; q++) sums[q] = b + q < 3 * nr ? acc[(b + q) / 3][(b + q) % 3] : acc[0][0];
            vf e = hsum8(sums);
            for (long q = 0; q < 8 && b + q < 3 * nr; q++)
                out[((j0 + (b + q) / 3) * o + oo) * 3 + (b + q) % 3] = e[2 * q];
        }
    }
}

/* shared_gw3 over all j rows in groups of at most 6, as equal as they come (9: 5 and 4; 17: 6, 6 and 5). */
static void shared_gw3_rows(const float *aT, long j, long Mp, const float *gT, long o, long n, const float *WT,
                            float *out) {
    long ng = (j + 5) / 6;
    for (long gi = 0, j0 = 0; gi < ng; gi++) {
        long nr = j / ng + (gi < j % ng);
        switch (nr) {
            case 1: shared_gw3(aT, j0, 1, Mp, gT, o, n, WT, out); break;
            case 2: shared_gw3(aT, j0, 2, Mp, gT, o, n, WT, out); break;
            case 3: shared_gw3(aT, j0, 3, Mp, gT, o, n, WT, out); break;
            case 4: shared_gw3(aT, j0, 4, Mp, gT, o, n, WT, out); break;
            case 5: shared_gw3(aT, j0, 5, Mp, gT, o, n, WT, out); break;
            default: shared_gw3(aT, j0, 6, Mp, gT, o, n, WT, out); break;
        }
        j0 += nr;
    }
}

/* out [P, k] = c2 G G^T Y for one replica's packed inputs and gradients p and Y [P, k]. */
static void times_replica(const float *p, const long *j, const long *o, const long *shared, long L, long S, long M,
                          long k, const float *Yr, float c2, float *outr, scratch w) {
    long Mp = padded(M), n = S * Mp, nv = Mp / V;
    float *TT = w.TT, *XT = w.XT, *H = w.H;
    int fused3 = k == 3 && S == 2 && nv > 1;   /* the shared layer by shared_t3 and shared_gw3 */
    const float *aT[L], *gT[L];
    for (long l = 0; l < L; l++) {
        aT[l] = p; p += j[l] * width(S, M, shared, l);
        gT[l] = p; p += o[l] * n;
    }
    memset(TT, 0, k * n * sizeof(float));
    for (long l = 0, off = 0; l < L; off += j[l] * o[l], l++) {   /* T^T [k, n] = (G^T Y)^T */
        long Ml = shared[l] ? Mp : n, ok = o[l] * k;
        if (shared[l] && fused3) {
            shared_t3(aT[l], j[l], Mp, gT[l], o[l], n, Yr + off * k, TT);
            continue;
        }
        layer_fwd(aT[l], j[l], Ml, Yr + off * k, w.zero, ok, XT, 0);   /* X^T [o k, Ml] = Y_l^T a^T */
        for (long s = 0; s < S; s++) {   /* T^T[kk, s] += sum_o g^T[o, s] X^T[o k + kk]: blocks of 4 vectors */
            long xs = shared[l] ? 0 : s * Mp;
            for (long kk = 0; kk < k; kk++)
                for (long v0 = 0; v0 < nv; v0 += 4) {
                    long nb = nv - v0 < 4 ? nv - v0 : 4, u1 = nb > 1, u2 = nb > 2 ? 2 : u1, u3 = nb > 3 ? 3 : u2;
                    vf *t = (vf *)(TT + kk * n + s * Mp) + v0;
                    vf t0 = t[0], t1 = t[u1], t2 = t[u2], t3 = t[u3];
                    for (long oo = 0; oo < o[l]; oo++) {
                        const vf *gv = (const vf *)(gT[l] + oo * n + s * Mp) + v0,
                                 *xv = (const vf *)(XT + (oo * k + kk) * Ml + xs) + v0;
                        t0 += gv[0] * xv[0]; t1 += gv[u1] * xv[u1]; t2 += gv[u2] * xv[u2]; t3 += gv[u3] * xv[u3];
                    }
                    t[u3] = t3, t[u2] = t2, t[u1] = t1, t[0] = t0;   /* a repeated vector: the same sum twice */
                }
        }
    }
    vf c = splat(c2);
    for (long v = 0; v < k * n / V; v++) ((vf *)TT)[v] *= c;
    for (long l = 0, off = 0; l < L; off += j[l] * o[l], l++) {   /* (G W)_l with W = c2 T */
        long Ml = shared[l] ? Mp : n, ok = o[l] * k;
        if (shared[l] && fused3) {
            shared_gw3_rows(aT[l], j[l], Mp, gT[l], o[l], n, TT, outr + off * k);
            continue;
        }
        for (long oo = 0; oo < o[l]; oo++)
            for (long kk = 0; kk < k; kk++) {
                vf *h = (vf *)(XT + (oo * k + kk) * Ml);   /* H^T [o k, Ml] */
                const vf *gv = (const vf *)(gT[l] + oo * n), *tv = (const vf *)(TT + kk * n);
                if (shared[l])
                    for (long v = 0; v < nv; v++) {
                        vf acc = gv[v] * tv[v];
                        for (long s = 1; s < S; s++) acc += gv[s * nv + v] * tv[s * nv + v];
                        h[v] = acc;
                    }
                else
                    for (long v = 0; v < S * nv; v++) h[v] = gv[v] * tv[v];
            }
        if (ok < V)   /* a few columns: dot products along the examples */
            layer_grads(aT[l], j[l], Ml, XT, ok, outr + off * k, w.db);
        else {        /* H [Ml, o k] = (H^T)^T (its rows zero-padded to whole 16 x 16 blocks), then rows of a times H */
            memset(XT + ok * Ml, 0, (padded(ok) - ok) * Ml * sizeof(float));
            transpose(XT, Ml, 1, padded(ok), Ml, H, padded(ok));
            rows_times(aT[l], j[l], Ml, H, padded(ok), ok, outr + off * k);
        }
    }
}

void outer_times(const float *packed, const long *j, const long *o, const long *shared, long L, const float *Y,
                 const float *c2, float *out, long R, long S, long M, long k, float *work) {
    long P = 0, W = outer_pack_size(S, M, j, o, shared, L);
    for (long l = 0; l < L; l++) P += j[l] * o[l];
    scratch w = carve(work, S, M, o, L, k);
    for (long r = 0; r < R; r++) times_replica(packed + r * W, j, o, shared, L, S, M, k, Y + r * P * k, c2[r],
                                               out + r * P * k, w);
}

typedef double vd __attribute__((vector_size(8 * sizeof(double)), aligned(sizeof(double))));   /* unaligned */

static double dotd(const double *x, const double *y, long n) {   /* two vectors of partial sums, then the tail */
    vd s0 = {0}, s1 = {0};
    long i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 += *(const vd *)(x + i) * *(const vd *)(y + i);
        s1 += *(const vd *)(x + i + 8) * *(const vd *)(y + i + 8);
    }
    s0 += s1;
    double s = 0;
    for (long e = 0; e < 8; e++) s += s0[e];
    for (; i < n; i++) s += x[i] * y[i];
    return s;
}

static void axpyd(double a, const double *x, double *y, long n) { for (long i = 0; i < n; i++) y[i] += a * x[i]; }

/* A [k, P] = Y [P, k]^T in float64 */
static void columns(const float *restrict Y, long P, long k, double *restrict A) {
    if (k == 3)   /* SLANG L = 1's probes: a constant stride, which GCC vectorises */
        for (long i = 0; i < P; i++) A[i] = Y[3 * i], A[P + i] = Y[3 * i + 1], A[2 * P + i] = Y[3 * i + 2];
    else
        for (long i = 0; i < P; i++)
            for (long c = 0; c < k; c++) A[c * P + i] = Y[i * k + c];
}

/* Q [P, k] = A [k, P]^T in float32 */
static void rows(const double *restrict A, long P, long k, float *restrict Q) {
    if (k == 3)
        for (long i = 0; i < P; i++)
            Q[3 * i] = (float)A[i], Q[3 * i + 1] = (float)A[P + i], Q[3 * i + 2] = (float)A[2 * P + i];
    else
        for (long i = 0; i < P; i++)
            for (long c = 0; c < k; c++) Q[i * k + c] = (float)A[c * P + i];
}

/* Q [P, k] = the orthonormal factor of Y [P, k] (row-major) by Householder reflections with LAPACK's conventions
   (sgeqr2, then sorg2r: R's diagonal entry -sign(alpha) |column|, so Q's column signs are those of torch.linalg.qr's),
   in float64 on A [k, P] (Y's columns, contiguous) and tau [k]; sq [k]: Y's columns' squared norms, where not NULL. */
static void householder_q(const float *Y, long P, long k, float *Q, double *A, double *tau, double *sq) {
    columns(Y, P, k, A);
    if (sq)
        for (long c = 0; c < k; c++) sq[c] = dotd(A + c * P, A + c * P, P);
    for (long c = 0; c < k; c++) {
        double *a = A + c * P, alpha = a[c], xx = dotd(a + c + 1, a + c + 1, P - c - 1);
        if (xx == 0) { tau[c] = 0; continue; }
        double beta = -copysign(sqrt(alpha * alpha + xx), alpha), s = 1 / (alpha - beta);
        tau[c] = (beta - alpha) / beta;
        for (long i = c + 1; i < P; i++) a[i] *= s;   /* v = [1; x / (alpha - beta)] */
        a[c] = beta;
        for (long cc = c + 1; cc < k; cc++) {   /* H_c = I - tau v v^T on the columns to the right */
            double *b = A + cc * P, w = tau[c] * (b[c] + dotd(a + c + 1, b + c + 1, P - c - 1));
            b[c] -= w;
            axpyd(-w, a + c + 1, b + c + 1, P - c - 1);
        }
    }
    for (long c = k - 1; c >= 0; c--) {   /* Q = H_0 ... H_{k-1} I[:, :k], in place over the reflectors (sorg2r) */
        double *a = A + c * P;
        for (long cc = c + 1; cc < k; cc++) {   /* column cc is 0 in row c */
            double *b = A + cc * P, w = tau[c] * dotd(a + c + 1, b + c + 1, P - c - 1);
            b[c] = -w;
            axpyd(-w, a + c + 1, b + c + 1, P - c - 1);
        }
        for (long i = c + 1; i < P; i++) a[i] *= -tau[c];
        a[c] = 1 - tau[c];
        for (long i = 0; i < c; i++) a[i] = 0;
    }
    rows(A, P, k, Q);
}

/* Uk [Lu, P k]: U's columns each repeated k times along the rows of a [P, k] matrix, Uk[l, q k + c] = U[q, l]. */
static void expand_U(const float *U, long P, long Lu, long k, float *Uk) {
    for (long l = 0; l < Lu; l++)
        for (long q = 0; q < P; q++)
            for (long c = 0; c < k; c++) Uk[(l * P + q) * k + c] = U[q * Lu + l];
}

#define KMAX_FLAT 8   /* add_low_rank's flat blocks of k vectors: up to k = L + 2 = 8 */

/* out [P, k] += a2 U U^T Y for U's columns expanded by expand_U, a pass over Y and one over out per column of U, as
   flat arrays of P k floats: a block of k vectors holds whole rows of Y, so lane e of its vector v is column
   (v V + e) mod k; U^T Y's k sums in k vectors of partial sums (a few rows' tail in scalars). Inlined for each k, so
   that the partial sums stay in registers. */
static inline __attribute__((always_inline)) void add_low_rank_k(const float *Uk, long P, long Lu, const long k,
                                                                   float a2, const float *Y, float *out) {
    long n = P * k, nb = n / (k * V), tail = nb * k * V;
    for (long l = 0; l < Lu; l++) {
        const float *u = Uk + l * n;
        vf acc[KMAX_FLAT] = {{0}};
        for (long b = 0; b < nb; b++)
            for (long v = 0; v < k; v++) {
                long i = (b * k + v) * V;
                acc[v] += *(const vfu *)(u + i) * *(const vfu *)(Y + i);
            }
        float s[KMAX_FLAT] = {0};
        for (long v = 0, c = 0; v < k; v++)
            for (long e = 0; e < V; e++, c = c + 1 == k ? 0 : c + 1) s[c] += acc[v][e];
        for (long i = tail, c = 0; i < n; i++, c = c + 1 == k ? 0 : c + 1) s[c] += u[i] * Y[i];
        vf w[KMAX_FLAT];
        for (long v = 0, c = 0; v < k; v++)
            for (long e = 0; e < V; e++, c = c + 1 == k ? 0 : c + 1) w[v][e] = a2 * s[c];
        for (long b = 0; b < nb; b++)
            for (long v = 0; v < k; v++) {
                long i = (b * k + v) * V;
                *(vfu *)(out + i) = *(const vfu *)(out + i) + *(const vfu *)(u + i) * w[v];
            }
        for (long i = tail, c = 0; i < n; i++, c = c + 1 == k ? 0 : c + 1) out[i] += u[i] * (a2 * s[c]);
    }
}

static void add_low_rank(const float *Uk, long P, long Lu, long k, float a2, const float *Y, float *out) {
    switch (k) {
        case 1: add_low_rank_k(Uk, P, Lu, 1, a2, Y, out); break;
        case 2: add_low_rank_k(Uk, P, Lu, 2, a2, Y, out); break;
        case 3: add_low_rank_k(Uk, P, Lu, 3, a2, Y, out); break;
        case 4: add_low_rank_k(Uk, P, Lu, 4, a2, Y, out); break;
        case 5: add_low_rank_k(Uk, P, Lu, 5, a2, Y, out); break;
        case 6: add_low_rank_k(Uk, P, Lu, 6, a2, Y, out); break;
        case 7: add_low_rank_k(Uk, P, Lu, 7, a2, Y, out); break;
        default: add_low_rank_k(Uk, P, Lu, 8, a2, Y, out); break;
    }
}

/* out = a2 U U^T Y + c2 G G^T Y for one replica (U [P, Lu]; Uk: U expanded by expand_U where k <= KMAX_FLAT, else
   NULL: U^T Y by four partial sums per entry). */
static void apply_A(const float *p, const long *j, const long *o, const long *shared, long L, long S, long M, long k,
                    const float *U, const float *Uk, long Lu, float a2, float c2, const float *Y, float *out,
                    scratch w) {
    long P = 0;
    for (long l = 0; l < L; l++) P += j[l] * o[l];
    times_replica(p, j, o, shared, L, S, M, k, Y, c2, out, w);
    if (Uk) {
        add_low_rank(Uk, P, Lu, k, a2, Y, out);
        return;
    }
    for (long l = 0; l < Lu; l++)
        for (long c = 0; c < k; c++) {
            float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
            long q = 0;
            for (; q + 4 <= P; q += 4) {
                s0 += U[q * Lu + l] * Y[q * k + c];
                s1 += U[(q + 1) * Lu + l] * Y[(q + 1) * k + c];
                s2 += U[(q + 2) * Lu + l] * Y[(q + 2) * k + c];
                s3 += U[(q + 3) * Lu + l] * Y[(q + 3) * k + c];
            }
            for (; q < P; q++) s0 += U[q * Lu + l] * Y[q * k + c];
            float utY = a2 * ((s0 + s1) + (s2 + s3));
            for (long qq = 0; qq < P; qq++) out[qq * k + c] += U[qq * Lu + l] * utY;
        }
}

long outer_nystrom_work(long S, long M, const long *j, const long *o, const long *shared, long L, long k, long Lu) {
    long P = 0;
    for (long l = 0; l < L; l++) P += j[l] * o[l];
    /* the products' scratch, one replica's packed operands, Y and Q [P, k], U expanded [Lu, P k], A, tau and two norms
       in float64 */
    return outer_times_work(S, M, o, L, k) + outer_pack_size(S, M, j, o, shared, L) + V + 2 * P * k + Lu * P * k
           + 2 * (P * k + 3 * k) + 2;
}

/* SLANG's randomised Nystrom eigensolver's subspace (core/linalg/low_rank.nystrom_range) for R replicas of
   A = a2 U U^T + c2 G G^T, one replica at a time, its packed operands (pack_replica) staying in the core's cache for
   all n_iter + 1 products: from Q = probes, n_iter - 1 steps Q = orth(A Q); Y = A Q, the shift
   nu = 1e-7 sqrt(P) max_c |Y_c| / |Q_c|; Q = orth(Y) and E = A Q + nu Q. Writes Q, E [R, P, k] and nu [R]. */
void outer_nystrom(const float *const *a, const long *astr, const float *const *g, const long *gstr, const long *j,
                   const long *o, const long *shared, long L, long R, long S, long M, const float *U, long Lu,
                   const float *a2, const float *c2, const float *probes, long k, long n_iter, float *Q, float *E,
                   float *nu, float *work) {
    long P = 0;
    for (long l = 0; l < L; l++) P += j[l] * o[l];
    scratch w = carve(work, S, M, o, L, k);
    float *p = aligned(work + outer_times_work(S, M, o, L, k)), *Y = p + outer_pack_size(S, M, j, o, shared, L),
          *Qr = Y + P * k, *Uk = k <= KMAX_FLAT ? Qr + P * k : NULL;
    double *A = (double *)(((uintptr_t)(Qr + P * k + Lu * P * k) + 7) & ~(uintptr_t)7), *tau = A + P * k,
           *yy = tau + k, *qq = yy + k;
    for (long r = 0; r < R; r++) {
        const float *Ur = U + r * P * Lu;
        float *Qo = Q + r * P * k, *Eo = E + r * P * k;
        pack_replica(a, astr, g, gstr, j, o, shared, L, r, S, M, p);
        if (Uk) expand_U(Ur, P, Lu, k, Uk);
        memcpy(Qr, probes + r * P * k, P * k * sizeof(float));
        for (long it = 0; it + 1 < n_iter; it++) {
            apply_A(p, j, o, shared, L, S, M, k, Ur, Uk, Lu, a2[r], c2[r], Qr, Y, w);
            householder_q(Y, P, k, Qr, A, tau, NULL);
        }
        apply_A(p, j, o, shared, L, S, M, k, Ur, Uk, Lu, a2[r], c2[r], Qr, Y, w);
        columns(Qr, P, k, A);
        for (long c = 0; c < k; c++) qq[c] = dotd(A + c * P, A + c * P, P);
        householder_q(Y, P, k, Qo, A, tau, yy);
        float anorm = 0;
        for (long c = 0; c < k; c++) {
            float ratio = (float)(sqrt(yy[c]) / sqrt(qq[c]));
            if (c == 0 || ratio > anorm || ratio != ratio) anorm = ratio;   /* a NaN stays, as torch's amax */
        }
        nu[r] = (float)(1e-7 * sqrt((double)P)) * anorm;
        apply_A(p, j, o, shared, L, S, M, k, Ur, Uk, Lu, a2[r], c2[r], Qo, Eo, w);
        for (long i = 0; i < P * k; i++) Eo[i] += nu[r] * Qo[i];
    }
}
