/* C = L^-T with X = L L^T (so C C^T = X^-1) for each of R real symmetric n x n matrices X (row-major; the lower
   triangle is read), W = 8 of them at a time, one in each lane of a vector of doubles (GCC's and Clang's vector
   extension: one AVX-512 register, two AVX2 ones). In float64 whatever the input's type:
   1. the Cholesky factor L, column by column from dot products of its rows (left-looking, LAPACK's ?potf2):
      L_jj = sqrt(X_jj - sum_{k<j} L_jk^2),  L_ij = (X_ij - sum_{k<j} L_ik L_jk) / L_jj  (i > j);
   2. C = L^-T row by row, each row of C a column of L^-1 (?trti2's recurrence):
      C_jj = 1 / L_jj,  C_ji = -(sum_{k=j}^{i-1} L_ik C_jk) / L_ii  (i > j);  C_ji = 0 (i < j).
   Four rows at a time in both (independent sums, so the FMA units do not wait on one accumulator).
   info[r] = 0, or k > 0 where the k-th pivot is not positive or not finite (X not numerically positive definite, or
   holding a NaN or an inf): C[r] is then undefined, as after ?potrf's info.
   Called through ctypes by bnnbench/core/linalg/chol_root.py, which builds it with the system's C compiler. */
#include <math.h>

#define W 8
typedef double vec __attribute__((vector_size(W * sizeof(double)), aligned(8)));   /* any double-aligned buffer */

long chol_root_work(long n) { return 2 * n * n * W + n * W; }

/* a[i n + j]: X's lower triangle, each entry the W matrices' lanes, overwritten by L; c: C's upper triangle */
static void factor(vec *restrict a, vec *restrict c, vec *restrict rdiag, long n, int *restrict bad) {
    for (int l = 0; l < W; l++) bad[l] = 0;
    for (long j = 0; j < n; j++) {
        const vec *restrict rj = a + j * n;
        vec d = rj[j];
        for (long k = 0; k < j; k++) d -= rj[k] * rj[k];
        vec s, q;
        for (int l = 0; l < W; l++) {
            int ok = d[l] > 0 && d[l] < INFINITY;   /* false for NaN */
            if (!ok && !bad[l]) bad[l] = (int)j + 1;
            s[l] = sqrt(ok ? d[l] : 1.0);
            q[l] = 1.0 / s[l];
        }
        a[j * n + j] = s;
        rdiag[j] = q;
        long i = j + 1;
        for (; i + 4 <= n; i += 4) {
            vec *restrict r0 = a + i * n, *restrict r1 = r0 + n, *restrict r2 = r1 + n, *restrict r3 = r2 + n;
            vec s0 = r0[j], s1 = r1[j], s2 = r2[j], s3 = r3[j];
            for (long k = 0; k < j; k++) {
                vec x = rj[k];
                s0 -= r0[k] * x; s1 -= r1[k] * x; s2 -= r2[k] * x; s3 -= r3[k] * x;
            }
            r0[j] = s0 * q; r1[j] = s1 * q; r2[j] = s2 * q; r3[j] = s3 * q;
        }
        for (; i < n; i++) {
            vec *restrict ri = a + i * n;
            vec t = ri[j];
            for (long k = 0; k < j; k++) t -= ri[k] * rj[k];
            ri[j] = t * q;
        }
    }
    const vec zero = {0};
    for (long j0 = 0; j0 < n; j0 += 4) {   /* rows j0 .. j0 + m - 1 of C; C_jk = 0 for k < j, so sums start at j0 */
        long m = n - j0 < 4 ? n - j0 : 4;
        vec *restrict c0 = c + j0 * n, *restrict c1 = c0 + n, *restrict c2 = c1 + n, *restrict c3 = c2 + n;
        for (long r = 1; r < m; r++)
            for (long k = j0; k < j0 + r; k++) c[(j0 + r) * n + k] = zero;
        for (long i = j0; i < n; i++) {
            const vec *restrict ri = a + i * n;
            vec s0 = zero, s1 = zero, s2 = zero, s3 = zero;
            if (m == 4)
                for (long k = j0; k < i; k++) {
                    vec x = ri[k];
                    s0 += x * c0[k]; s1 += x * c1[k]; s2 += x * c2[k]; s3 += x * c3[k];
                }
            else
                for (long k = j0; k < i; k++) {
                    vec x = ri[k];
                    s0 += x * c0[k];
                    if (m > 1) s1 += x * c1[k];
                    if (m > 2) s2 += x * c2[k];
                }
            vec q = rdiag[i];
            if (i == j0) c0[i] = q; else c0[i] = -s0 * q;
            if (m > 1 && i >= j0 + 1) c1[i] = i == j0 + 1 ? q : -s1 * q;
            if (m > 2 && i >= j0 + 2) c2[i] = i == j0 + 2 ? q : -s2 * q;
            if (m > 3 && i >= j0 + 3) c3[i] = i == j0 + 3 ? q : -s3 * q;
        }
    }
}

#define ENTRY(NAME, T)                                                                                             \
void NAME(const T *X, long R, long n, T *C, int *info, double *work) {                                            \
    vec *a = (vec *)work, *c = a + n * n, *rdiag = c + n * n;                                                      \
    int bad[W];                                                                                                    \
    for (long r = 0; r < R; r += W) {                                                                              \
        int lanes = R - r < W ? (int)(R - r) : W;                                                                  \
        const T *x = X + r * n * n;                                                                                \
        for (long i = 0; i < n; i++)                                                                               \
            for (long j = 0; j <= i; j++)                                                                          \
                for (int l = 0; l < W; l++) a[i * n + j][l] = (double)x[(l < lanes ? l : 0) * n * n + i * n + j];  \
        factor(a, c, rdiag, n, bad);                                                                               \
        for (int l = 0; l < lanes; l++) {                                                                          \
            T *out = C + (r + l) * n * n;                                                                          \
            for (long i = 0; i < n; i++)                                                                           \
                for (long j = 0; j < n; j++) out[i * n + j] = j < i ? (T)0 : (T)c[i * n + j][l];                   \
            info[r + l] = bad[l];                                                                                  \
        }                                                                                                          \
    }                                                                                                              \
}

ENTRY(chol_root_f32_all, float)
ENTRY(chol_root_f64_all, double)
