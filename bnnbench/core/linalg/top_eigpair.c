/* The largest eigenpair of each of R real symmetric n x n matrices (row-major doubles; the lower triangle is read),
   W of them at a time, one in each SIMD lane of a core: every inner loop runs over the lanes. Per matrix, LAPACK's
   steps for one eigenpair (?syevr with il = iu = n), in float64:
   1. Householder tridiagonalisation Q^T A Q = T, Q = H_0 ... H_{n-3}, H_k = I - tau_k v_k v_k^T (?sytd2, lower);
   2. the largest eigenvalue of T by bisection on Sturm counts (?stebz), between max_i T_ii and Gershgorin's bound;
   3. its eigenvector by inverse iteration, T - lam I factored with partial pivoting (?lagtf, ?lagts);
   4. back-transformed, x <- Q x, and normalised. A zero matrix gives 0 and the first unit vector.
   Called through ctypes by bnnbench/core/linalg/top_eigpair.py, which builds it with the system's C compiler. */
#pragma GCC optimize("fp-contract=fast")   /* fused multiply-adds (-std=c99 turns them off) */
#include <float.h>
#include <math.h>

#ifndef W
#define W 8
#endif
#define LOOP for (int l = 0; l < W; l++)

#define AT(i, j) (a + ((i) * n + (j)) * W)

/* The reflector H_k = I - tau_k v_k v_k^T that zeroes A[k+2:, k] (?larfg): e_k, tau_k and v_k (v_k[0] = 1). */
static void reflector(double *restrict a, long n, long k, double *restrict tau, double *restrict e,
                      double *restrict vk) {
    double alpha[W], sigma[W], scale[W];
    LOOP { alpha[l] = AT(k + 1, k)[l]; sigma[l] = 0; }
    for (long i = k + 2; i < n; i++) LOOP { double z = AT(i, k)[l]; sigma[l] += z * z; }
    LOOP {
        double norm = sqrt(alpha[l] * alpha[l] + sigma[l]);
        int keep = sigma[l] == 0.0;
        double beta = keep ? alpha[l] : (alpha[l] >= 0 ? -norm : norm);
        scale[l] = keep ? 0.0 : 1.0 / (alpha[l] - beta);
        e[k * W + l] = beta;
        tau[k * W + l] = keep ? 0.0 : (beta - alpha[l]) / beta;
        vk[l] = 1.0;
    }
    for (long i = 1; i < n - k - 1; i++) LOOP vk[i * W + l] = AT(k + 1 + i, k)[l] * scale[l];
}

/* p = A22 v_k, A22 = A[k+1:, k+1:] from its lower triangle. */
static void symv(const double *restrict a, long n, long k, const double *restrict vk, double *restrict p) {
    long m = n - k - 1;
    for (long i = 0; i < m; i++) LOOP p[i * W + l] = 0;
    for (long i = 0; i < m; i++) {
        const double *restrict row = AT(k + 1 + i, k + 1);
        double s[W], vi[W];
        LOOP { vi[l] = vk[i * W + l]; s[l] = row[i * W + l] * vi[l]; }
        for (long j = 0; j < i; j++)
            LOOP { double aij = row[j * W + l]; s[l] += aij * vk[j * W + l]; p[j * W + l] += aij * vi[l]; }
        LOOP p[i * W + l] += s[l];
    }
}

/* A vector of the W lanes' doubles, read and written in place (W consecutive doubles need not be aligned). */
typedef double vd __attribute__((vector_size(W * sizeof(double)), aligned(sizeof(double))));
#define VAT(i, j) ((vd *)AT(i, j))

/* Rows of A22 updated together in rank2_symv: each column's v, w, v_{k+1} and pn entries are read once for them all,
   and the rows' dot products run as independent chains. With fused multiply-adds, 100 Gram matrices of n = 129 ran
   1.25x faster than one row at a time (2026-12-03, AMD EPYC, one thread); 4 and 8 rows gained less. */
#define ROWS 6

/* Step k's update A22 -= v w^T + w v^T (v = ``vk``, w = ``w``), and where ``vn`` is given (a step k+1 follows),
   step k+1's reflector (into ``vn``) and its product pn = A22' v_{k+1} (A22' = A[k+2:, k+2:]) in the same pass over
   A22: each entry updated, then used, in ?sytd2's order (the same arithmetic as two passes, half the traffic through
   the cache); column k+1 is updated first, since v_{k+1} is made from it. The rows go ROWS at a time: pn's sums over
   rows then add ROWS terms per pass, in row order. */
static void rank2_symv(double *restrict a, long n, long k, const double *restrict vk_, const double *restrict w_,
                       double *restrict vn_, double *restrict pn_, double *restrict tau, double *restrict e) {
    long m = n - k - 1;
    const vd *vk = (const vd *)vk_, *w = (const vd *)w_;
    const vd *vn = (const vd *)vn_;
    vd *pn = (vd *)pn_;
    for (long i = 0; i < m; i++) *VAT(k + 1 + i, k + 1) -= vk[i] * w[0] + w[i] * vk[0];             /* column k+1 */
    if (!vn_) {
        for (long i = 1; i < m; i++) {
            vd *row = VAT(k + 1 + i, k + 1), vi = vk[i], wi = w[i];
            for (long j = 1; j <= i; j++) row[j] -= vi * w[j] + wi * vk[j];
        }
        return;
    }
    reflector(a, n, k + 1, tau, e, vn_);
    for (long i = 0; i + 1 < m; i++) pn[i] = (vd){0};
    long i = 1;
    for (; i + ROWS <= m; i += ROWS) {                                         /* the rest, and A22' v_{k+1} */
        vd *r[ROWS], v[ROWS], wr[ROWS], u[ROWS], s[ROWS];
        for (int q = 0; q < ROWS; q++) {
            long iq = i + q;
            r[q] = VAT(k + 1 + iq, k + 1); v[q] = vk[iq]; wr[q] = w[iq]; u[q] = vn[iq - 1];
            r[q][iq] -= v[q] * w[iq] + wr[q] * vk[iq];
            s[q] = r[q][iq] * u[q];
        }
        for (long j = 1; j < i; j++) {
            vd wj = w[j], vj = vk[j], nj = vn[j - 1], p = pn[j - 1];
            for (int q = 0; q < ROWS; q++) {
                vd aq = (r[q][j] - v[q] * wj) - wr[q] * vj;
                r[q][j] = aq; s[q] += aq * nj; p += aq * u[q];
            }
            pn[j - 1] = p;
        }
        for (int q = 0; q < ROWS; q++) {                                       /* the triangle of the block's rows */
            for (long j = i; j < i + q; j++) {
                vd aq = r[q][j] - (v[q] * w[j] + wr[q] * vk[j]);
                r[q][j] = aq; s[q] += aq * vn[j - 1]; pn[j - 1] += aq * u[q];
            }
            pn[i + q - 1] += s[q];
        }
    }
    for (; i < m; i++) {                                                       /* the last rows, one at a time */
        vd *row = VAT(k + 1 + i, k + 1), vi = vk[i], wi = w[i], ui = vn[i - 1];
        row[i] -= vi * w[i] + wi * vk[i];
        vd s = row[i] * ui;
        for (long j = 1; j < i; j++) {
            vd aij = row[j] - (vi * w[j] + wi * vk[j]);
            row[j] = aij; s += aij * vn[j - 1]; pn[j - 1] += aij * ui;
        }
        pn[i - 1] += s;
    }
}

static void block(const double *restrict A, long n, int lanes, double *restrict a, double *restrict tau,
                  double *restrict d, double *restrict e, double *restrict v, double *restrict p,
                  double *restrict lam_out, double *restrict vec_out) {
    double *restrict u0 = p, *restrict u1 = p + n * W, *restrict u2 = p + 2 * n * W, *restrict mu = p + 3 * n * W;
    double *restrict piv = p + 4 * n * W, *restrict x = p + 5 * n * W;
    for (long i = 0; i < n; i++)
        for (long j = 0; j <= i; j++)
            for (int l = 0; l < W; l++)
                AT(i, j)[l] = A[(l < lanes ? l : 0) * n * n + i * n + j];
    double *pk = p, *pn = u1;   /* p of this step and of the next (u1's room: unused until 3.) */
    if (n > 2) { reflector(a, n, 0, tau, e, v); symv(a, n, 0, v, pk); }
    for (long k = 0; k + 2 < n; k++) {
        long m = n - k - 1;
        const double *restrict vk = v + k * n * W;
        double t[W], pv[W];
        LOOP { t[l] = tau[k * W + l]; pv[l] = 0; }
        for (long i = 0; i < m; i++) LOOP { pk[i * W + l] *= t[l]; pv[l] += pk[i * W + l] * vk[i * W + l]; }
        LOOP pv[l] *= -0.5 * t[l];
        for (long i = 0; i < m; i++) LOOP pk[i * W + l] += pv[l] * vk[i * W + l];       /* w = p - tau/2 (p.v) v */
        double *restrict vn = v + (k + 1) * n * W;
        int next = k + 3 < n;
        rank2_symv(a, n, k, vk, pk, next ? vn : 0, next ? pn : 0, tau, e);
        double *swap = pk; pk = pn; pn = swap;
    }
    for (long i = 0; i < n; i++) LOOP d[i * W + l] = AT(i, i)[l];
    if (n >= 2) LOOP e[(n - 2) * W + l] = AT(n - 1, n - 2)[l];
#undef AT
    double lo[W], hi[W], tnorm[W], pivmin[W], lam[W], nan[W];   /* nan: 0, or NaN where T holds a NaN or an inf */
    LOOP { lo[l] = -INFINITY; hi[l] = -INFINITY; tnorm[l] = 0; nan[l] = 0; }
    for (long i = 0; i < n; i++) LOOP {
        double r = (i > 0 ? fabs(e[(i - 1) * W + l]) : 0) + (i + 1 < n ? fabs(e[i * W + l]) : 0), di = d[i * W + l];
        lo[l] = fmax(lo[l], di);
        hi[l] = fmax(hi[l], di + r);
        tnorm[l] = fmax(tnorm[l], fabs(di) + r);
        nan[l] += 0 * (di + r);
    }
    LOOP { pivmin[l] = DBL_MIN * fmax(1.0, tnorm[l] * tnorm[l]); hi[l] += 2 * DBL_EPSILON * tnorm[l]; }
    for (int it = 0; it < 64; it++) {            /* lam in [lo, hi): fewer than n eigenvalues below lo, n below hi */
        double mid[W], q[W];
        int below[W], open = 0;
        LOOP { open |= hi[l] - lo[l] > 2 * DBL_EPSILON * tnorm[l]; mid[l] = 0.5 * (lo[l] + hi[l]);
               q[l] = d[l] - mid[l]; if (fabs(q[l]) < pivmin[l]) q[l] = -pivmin[l]; below[l] = q[l] < 0; }
        if (!open) break;
        for (long i = 1; i < n; i++) LOOP {
            double ei = e[(i - 1) * W + l], qi = d[i * W + l] - mid[l] - ei * ei / q[l];
            if (fabs(qi) < pivmin[l]) qi = -pivmin[l];
            q[l] = qi; below[l] += qi < 0;
        }
        LOOP { if (below[l] == n) hi[l] = mid[l]; else lo[l] = mid[l]; }
    }
    LOOP lam[l] = 0.5 * (lo[l] + hi[l]) + nan[l];   /* fmax skips NaNs: a non-finite matrix gives NaN, not a value */
    /* P (T - lam I) = L U: U with two superdiagonals, L unit lower bidiagonal (multipliers mu), row swaps in piv */
    LOOP {
        double tiny = DBL_EPSILON * fmax(tnorm[l], DBL_MIN);
        double c0 = d[l] - lam[l], c1 = n > 1 ? e[l] : 0;
        for (long i = 0; i + 1 < n; i++) {
            double sub = e[i * W + l], next = d[(i + 1) * W + l] - lam[l], far = i + 2 < n ? e[(i + 1) * W + l] : 0;
            if (fabs(c0) >= fabs(sub)) {
                if (c0 == 0) c0 = tiny;
                double f = sub / c0;
                u0[i * W + l] = c0; u1[i * W + l] = c1; u2[i * W + l] = 0; mu[i * W + l] = f; piv[i * W + l] = 0;
                c0 = next - f * c1; c1 = far;
            } else {
                double f = c0 / sub;
                u0[i * W + l] = sub; u1[i * W + l] = next; u2[i * W + l] = far; mu[i * W + l] = f; piv[i * W + l] = 1;
                c0 = c1 - f * next; c1 = -f * far;
            }
        }
        if (fabs(c0) < tiny) c0 = c0 < 0 ? -tiny : tiny;
        u0[(n - 1) * W + l] = c0; u1[(n - 1) * W + l] = 0; u2[(n - 1) * W + l] = 0;
    }
    for (long i = 0; i < n; i++) LOOP x[i * W + l] = 1.0;
    for (int rep = 0; rep < 3; rep++) {
        for (long i = 0; i + 1 < n; i++) LOOP {
            double xi = x[i * W + l], xj = x[(i + 1) * W + l];
            double top = piv[i * W + l] != 0 ? xj : xi, bot = piv[i * W + l] != 0 ? xi : xj;
            x[i * W + l] = top; x[(i + 1) * W + l] = bot - mu[i * W + l] * top;
        }
        for (long i = n - 1; i >= 0; i--) LOOP {
            double s = x[i * W + l];
            if (i + 1 < n) s -= u1[i * W + l] * x[(i + 1) * W + l];
            if (i + 2 < n) s -= u2[i * W + l] * x[(i + 2) * W + l];
            x[i * W + l] = s / u0[i * W + l];
        }
        double big[W];
        LOOP big[l] = 0;
        for (long i = 0; i < n; i++) LOOP big[l] = fmax(big[l], fabs(x[i * W + l]));
        for (long i = 0; i < n; i++) LOOP x[i * W + l] /= big[l];
    }
    for (long i = 0; i < n; i++) LOOP if (tnorm[l] == 0) x[i * W + l] = i == 0;
    for (long k = n - 3; k >= 0; k--) {          /* x <- H_0 ... H_{n-3} x */
        const double *restrict vk = v + k * n * W;
        double s[W];
        LOOP s[l] = 0;
        for (long i = 0; i < n - k - 1; i++) LOOP s[l] += vk[i * W + l] * x[(k + 1 + i) * W + l];
        LOOP s[l] *= tau[k * W + l];
        for (long i = 0; i < n - k - 1; i++) LOOP x[(k + 1 + i) * W + l] -= s[l] * vk[i * W + l];
    }
    double norm[W];
    LOOP norm[l] = 0;
    for (long i = 0; i < n; i++) LOOP norm[l] += x[i * W + l] * x[i * W + l];
    for (int l = 0; l < lanes; l++) {
        double r = 1.0 / sqrt(norm[l]);
        lam_out[l] = lam[l];
        for (long i = 0; i < n; i++) vec_out[l * n + i] = x[i * W + l] * r;
    }
}

long top_eigpair_work(long n) { return (2 * n * n + 10 * n) * W; }

void top_eigpair(const double *A, long R, long n, double *lam, double *vec, double *work) {
    double *a = work, *v = a + n * n * W, *tau = v + n * n * W, *d = tau + n * W, *e = d + n * W, *p = e + n * W;
    for (long r = 0; r < R; r += W)
        block(A + r * n * n, n, R - r < W ? (int)(R - r) : W, a, tau, d, e, v, p, lam + r, vec + r * n);
}
