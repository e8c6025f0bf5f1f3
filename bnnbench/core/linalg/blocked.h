/* Register-blocked products of small matrices whose columns are examples, padded to whole vectors of V floats, with
   GCC's vector extensions: the building blocks of mlp_relu.c and outer_times.c (core/linalg/c_kernels.py builds each
   with this header). */
#pragma GCC optimize("fp-contract=fast")   /* fused multiply-adds (-std=c99 turns them off) */
#include <stdint.h>
#include <string.h>

#define V 16
typedef float vf __attribute__((vector_size(V * sizeof(float))));
typedef int vi __attribute__((vector_size(V * sizeof(int))));

/* The sums of eight vectors, hsum(a[k]) in lane 2 k, by one tree of shuffles over all of them. */
static inline vf hsum8(const vf *a) {
    vf c[4], d[2];
    for (int k = 0; k < 4; k++)
        c[k] = __builtin_shuffle(a[2 * k], a[2 * k + 1], (vi){0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23})
             + __builtin_shuffle(a[2 * k], a[2 * k + 1], (vi){8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31});
    for (int k = 0; k < 2; k++)
        d[k] = __builtin_shuffle(c[2 * k], c[2 * k + 1], (vi){0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27})
             + __builtin_shuffle(c[2 * k], c[2 * k + 1], (vi){4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31});
    vf e = __builtin_shuffle(d[0], d[1], (vi){0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29})
         + __builtin_shuffle(d[0], d[1], (vi){2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31});
    return e + __builtin_shuffle(e, (vi){1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14});
}

static inline vf where_pos(vf a, vf z) { return (vf)((vi)z & (a > 0)); }   /* z where a > 0, else 0 */
static inline vf act(vf a, int relu) { return relu ? where_pos(a, a) : a; }

static inline vf splat(float a) { vf v = {a}; return __builtin_shuffle(v, (vi){0}); }
static inline float hsum(vf v) {   /* a tree of shuffles */
    v += __builtin_shuffle(v, (vi){8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7});
    v += __builtin_shuffle(v, (vi){4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11});
    v += __builtin_shuffle(v, (vi){2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13});
    v += __builtin_shuffle(v, (vi){1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14});
    return v[0];
}

/* z^T [dout, Bp] = W^T a^T + b (relu where asked), a^T [di, Bp], W [di, dout] row-major: blocks of 4 units x 2 vectors
   of examples (1 unit x 4 vectors where dout < 4, 8 units x 1 vector where Bp is one vector) in registers, a block at
   the edge repeating its last unit or vector (computed and stored twice, the same values), so that every block runs the
   same code and stores straight from its registers. */
static void layer_fwd(const float *restrict aT, long di, long Bp, const float *restrict W, const float *restrict b,
                      long dout, float *restrict zT, int relu) {
    long nv = Bp / V;
    if (dout < 4) {
        for (long o = 0; o < dout; o++)
            for (long v0 = 0; v0 < nv; v0 += 4) {
                long n = nv - v0 < 4 ? nv - v0 : 4, u1 = n > 1, u2 = n > 2 ? 2 : u1, u3 = n > 3 ? 3 : u2;
                vf c0 = splat(b[o]), c1 = c0, c2 = c0, c3 = c0;
                for (long j = 0; j < di; j++) {
                    const vf *aj = (const vf *)(aT + j * Bp) + v0;
                    vf w = splat(W[j * dout + o]);
                    c0 += w * aj[0]; c1 += w * aj[u1]; c2 += w * aj[u2]; c3 += w * aj[u3];
                }
                vf *z = (vf *)(zT + o * Bp) + v0;
                z[u3] = act(c3, relu), z[u2] = act(c2, relu), z[u1] = act(c1, relu), z[0] = act(c0, relu);
            }
        return;
    }
    if (nv == 1) {   /* one vector of examples: blocks of 8 units (a 4 x 2 block would compute each vector twice) */
        for (long o0 = 0; o0 < dout; o0 += 8) {
            long no = dout - o0 < 8 ? dout - o0 : 8, q[8];
            for (long u = 0; u < 8; u++) q[u] = u < no ? u : no - 1;
            vf c[8];
            for (long u = 0; u < 8; u++) c[u] = splat(b[o0 + q[u]]);
            for (long j = 0; j < di; j++) {
                vf x = *(const vf *)(aT + j * Bp);
                const float *wj = W + j * dout + o0;
                for (long u = 0; u < 8; u++) c[u] += splat(wj[q[u]]) * x;
            }
            for (long u = 7; u >= 0; u--) *(vf *)(zT + (o0 + q[u]) * Bp) = act(c[u], relu);
        }
        return;
    }
    for (long o0 = 0; o0 < dout; o0 += 4) {
        long no = dout - o0 < 4 ? dout - o0 : 4, q1 = no > 1, q2 = no > 2 ? 2 : q1, q3 = no > 3 ? 3 : q2;
        for (long v0 = 0; v0 < nv; v0 += 2) {
            long n = nv - v0 < 2 ? nv - v0 : 2, u1 = n > 1;
            const float *bo = b + o0;
            vf c00 = splat(bo[0]), c01 = c00, c10 = splat(bo[q1]), c11 = c10, c20 = splat(bo[q2]), c21 = c20,
               c30 = splat(bo[q3]), c31 = c30;
            for (long j = 0; j < di; j++) {
                const vf *aj = (const vf *)(aT + j * Bp) + v0;
                vf x0 = aj[0], x1 = aj[u1];
                const float *wj = W + j * dout + o0;
                vf w0 = splat(wj[0]), w1 = splat(wj[q1]), w2 = splat(wj[q2]), w3 = splat(wj[q3]);
                c00 += w0 * x0; c01 += w0 * x1; c10 += w1 * x0; c11 += w1 * x1;
                c20 += w2 * x0; c21 += w2 * x1; c30 += w3 * x0; c31 += w3 * x1;
            }
            vf *z0 = (vf *)(zT + o0 * Bp) + v0, *z1 = (vf *)(zT + (o0 + q1) * Bp) + v0,
               *z2 = (vf *)(zT + (o0 + q2) * Bp) + v0, *z3 = (vf *)(zT + (o0 + q3) * Bp) + v0;
            z3[u1] = act(c31, relu), z3[0] = act(c30, relu), z2[u1] = act(c21, relu), z2[0] = act(c20, relu);
            z1[u1] = act(c11, relu), z1[0] = act(c10, relu), z0[u1] = act(c01, relu), z0[0] = act(c00, relu);
        }
    }
}

static long padded(long B) { return (B + V - 1) / V * V; }

static float *aligned(float *w) {
    return (float *)(((uintptr_t)w + V * sizeof(float) - 1) & ~(uintptr_t)(V * sizeof(float) - 1));
}

/* dW [di, dout] = a (g^T)^T summed over examples, db = g summed; 2 x 4 blocks of dot products along the examples. */
static void layer_grads(const float *restrict aT, long di, long Bp, const float *restrict gT, long dout,
                        float *restrict dW, float *restrict db) {
    long nv = Bp / V;
    for (long o = 0; o < dout; o++) {
        vf s = {0};
        for (long v = 0; v < nv; v++) s += ((const vf *)(gT + o * Bp))[v];
        db[o] = hsum(s);
    }
    for (long j0 = 0; j0 < di; j0 += 2) {
        long nj = di - j0 < 2 ? di - j0 : 2;
        for (long o0 = 0; o0 < dout; o0 += 4) {
            long no = dout - o0 < 4 ? dout - o0 : 4;
            vf acc[8] = {0};
            const vf *a0 = (const vf *)(aT + j0 * Bp), *a1 = (const vf *)(aT + (j0 + nj - 1) * Bp);
            const vf *g[4];
            for (long q = 0; q < 4; q++) g[q] = (const vf *)(gT + (o0 + (q < no ? q : 0)) * Bp);
            for (long v = 0; v < nv; v++) {
                vf x0 = a0[v], x1 = a1[v];
                for (long q = 0; q < 4; q++) { vf gv = g[q][v]; acc[q] += x0 * gv; acc[4 + q] += x1 * gv; }
            }
            /* from the register: through a buffer, the loads of whole words after single stores stall */
            vf e = hsum8(acc);
            float *d0 = dW + j0 * dout + o0, *d1 = dW + (j0 + nj - 1) * dout + o0;
            d1[0] = e[8], d0[0] = e[0];
            if (no > 1) d1[1] = e[10], d0[1] = e[2];
            if (no > 2) d1[2] = e[12], d0[2] = e[4];
            if (no > 3) d1[3] = e[14], d0[3] = e[6];
        }
    }
}
