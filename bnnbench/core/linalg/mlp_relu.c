/* The forward pass and the vector-Jacobian product of R x S small ReLU networks in float32, for the compiled steps
   of the methods that train an MLP by its gradient (bnnbench/core/linalg/mlp_relu.py says which). Network (r, s) has
   the parameters theta[r, s] laid out as [W_1 (d_0 x d_1, row-major), b_1, W_2, b_2, ...] (core/models/mlp.py) and the
   inputs x[r] [B, d_0], shared by its S samples; z_l = a_{l-1} W_l + b_l, a_l = relu(z_l) but for the last layer,
   f = z_L. The vector-Jacobian product of cotangents g_L = df [B, d_L] is back-propagation:
   dW_l = a_{l-1}^T g_l, db_l = sum over examples of g_l, g_{l-1} = (g_l W_l^T) * 1[a_{l-1} > 0].
   One network at a time, its activations (recomputed by the product) kept with the examples innermost, a^T [d, Bp]
   (B padded with zeros to whole vectors of V examples), in a scratch buffer that stays in the core's cache; the
   products register-blocked over units x examples with GCC's vector extensions. The sums run in another order than
   a BLAS GEMM's: the results agree with torch's to float32 rounding, not bitwise. */
#include "blocked.h"

static long params(const long *d, long L) {
    long P = 0;
    for (long l = 0; l < L; l++) P += d[l] * d[l + 1] + d[l + 1];
    return P;
}

long mlp_relu_work(long B, const long *d, long L) {   /* floats of scratch, with room to align it */
    long Bp = padded(B), s = 0, mx = 0;
    for (long l = 0; l <= L; l++) { s += Bp * d[l]; if (d[l] > mx) mx = d[l]; }
    return s + 2 * Bp * mx + V;
}

/* acts: a_0^T (x, transposed, zero-padded), then each layer's output, [d_l, Bp] each. */
static void forward_all(const float *restrict th, long Bp, const long *d, long L, float *acts) {
    float *a = acts;
    for (long l = 0; l < L; l++) {
        float *z = a + d[l] * Bp;
        layer_fwd(a, d[l], Bp, th, th + d[l] * d[l + 1], d[l + 1], z, l < L - 1);
        th += d[l] * d[l + 1] + d[l + 1];
        a = z;
    }
}

static void load_xT(const float *x, long B, long Bp, long D, float *xT) {
    for (long j = 0; j < D; j++) {
        for (long m = 0; m < B; m++) xT[j * Bp + m] = x[m * D + j];
        for (long m = B; m < Bp; m++) xT[j * Bp + m] = 0.0f;
    }
}

void mlp_relu_forward(const float *x, const float *theta, float *f, long R, long S, long B, const long *d, long L,
                      float *work) {
    long P = params(d, L), Bp = padded(B), dL = d[L];
    float *acts = aligned(work), *out = acts;
    for (long l = 0; l < L; l++) out += d[l] * Bp;
    for (long r = 0; r < R; r++) {
        load_xT(x + r * B * d[0], B, Bp, d[0], acts);
        for (long s = 0; s < S; s++) {
            forward_all(theta + (r * S + s) * P, Bp, d, L, acts);
            float *fr = f + (r * S + s) * B * dL;
            for (long m = 0; m < B; m++) for (long o = 0; o < dL; o++) fr[m * dL + o] = out[o * Bp + m];
        }
    }
}

/* gprev^T [di, Bp] = (W g^T) masked where the layer's input a^T is not positive: blocks of 4 input units x 2 vectors of
   examples, clamped at the edges as layer_fwd's (a repeated unit or vector stored twice, the same values). */
static void layer_back(const float *restrict aT, long di, long Bp, const float *restrict W, const float *restrict gT,
                       long dout, float *restrict gpT) {
    long nv = Bp / V;
    for (long j0 = 0; j0 < di; j0 += 4) {
        long nj = di - j0 < 4 ? di - j0 : 4, q1 = nj > 1, q2 = nj > 2 ? 2 : q1, q3 = nj > 3 ? 3 : q2;
        const float *w0 = W + j0 * dout, *w1 = W + (j0 + q1) * dout, *w2 = W + (j0 + q2) * dout,
                    *w3 = W + (j0 + q3) * dout;
        for (long v0 = 0; v0 < nv; v0 += 2) {
            long n = nv - v0 < 2 ? nv - v0 : 2, u1 = n > 1;
            vf c00 = {0}, c01 = {0}, c10 = {0}, c11 = {0}, c20 = {0}, c21 = {0}, c30 = {0}, c31 = {0};
            for (long o = 0; o < dout; o++) {
                const vf *go = (const vf *)(gT + o * Bp) + v0;
                vf g0 = go[0], g1 = go[u1];
                vf a0 = splat(w0[o]), a1 = splat(w1[o]), a2 = splat(w2[o]), a3 = splat(w3[o]);
                c00 += a0 * g0; c01 += a0 * g1; c10 += a1 * g0; c11 += a1 * g1;
                c20 += a2 * g0; c21 += a2 * g1; c30 += a3 * g0; c31 += a3 * g1;
            }
            const vf *in0 = (const vf *)(aT + j0 * Bp) + v0, *in1 = (const vf *)(aT + (j0 + q1) * Bp) + v0,
                     *in2 = (const vf *)(aT + (j0 + q2) * Bp) + v0, *in3 = (const vf *)(aT + (j0 + q3) * Bp) + v0;
            vf *z0 = (vf *)(gpT + j0 * Bp) + v0, *z1 = (vf *)(gpT + (j0 + q1) * Bp) + v0,
               *z2 = (vf *)(gpT + (j0 + q2) * Bp) + v0, *z3 = (vf *)(gpT + (j0 + q3) * Bp) + v0;
            z3[u1] = where_pos(in3[u1], c31), z3[0] = where_pos(in3[0], c30);
            z2[u1] = where_pos(in2[u1], c21), z2[0] = where_pos(in2[0], c20);
            z1[u1] = where_pos(in1[u1], c11), z1[0] = where_pos(in1[0], c10);
            z0[u1] = where_pos(in0[u1], c01), z0[0] = where_pos(in0[0], c00);
        }
    }
}

void mlp_relu_vjp(const float *x, const float *theta, const float *gf, float *gtheta, long R, long S, long B,
                  const long *d, long L, float *work) {
    long P = params(d, L), Bp = padded(B), dL = d[L], mx = 0, A = 0;
    for (long l = 0; l <= L; l++) if (d[l] > mx) mx = d[l];
    for (long l = 0; l < L; l++) A += d[l] * Bp;
    float *acts = aligned(work), *g = acts + A + dL * Bp, *gp = g + mx * Bp;
    for (long r = 0; r < R; r++) {
        load_xT(x + r * B * d[0], B, Bp, d[0], acts);
        for (long s = 0; s < S; s++) {
            const float *th = theta + (r * S + s) * P;
            float *gt = gtheta + (r * S + s) * P;
            forward_all(th, Bp, d, L, acts);
            const float *gfr = gf + (r * S + s) * B * dL;
            for (long o = 0; o < dL; o++) {
                for (long m = 0; m < B; m++) g[o * Bp + m] = gfr[m * dL + o];
                for (long m = B; m < Bp; m++) g[o * Bp + m] = 0.0f;
            }
            long off = P, aoff = A;
            for (long l = L - 1; l >= 0; l--) {
                long di = d[l], dout = d[l + 1];
                off -= di * dout + dout;
                aoff -= di * Bp;
                layer_grads(acts + aoff, di, Bp, g, dout, gt + off, gt + off + di * dout);
                if (l > 0) {
                    layer_back(acts + aoff, di, Bp, th + off, g, dout, gp);
                    float *t = g; g = gp; gp = t;
                }
            }
        }
    }
}
