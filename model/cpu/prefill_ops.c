/* A prefill's small per-token steps in C, on the calling thread: RMSNorm (Llama's and Gemma's) and
 * rotary embedding. qgemm.c includes it.
 *
 * Why: as PyTorch ops they were ~6% of a one-thread pp512 (each norm is six passes over the
 * activations), and on two threads each op woke torch's sleeping OpenMP workers for ~0.1 ms of
 * work: with another program on a core a Gemma 3 pp512 spent 163 ms in norms against 39 on one
 * thread. One pass each here, no threads to wake.
 */

/* y[r] = x[r] / rms(x[r]) scaled by w (gemma 0: w * (x r), Llama's order) or (1 + w) (gemma 1:
   (x r) * (1 + w)), per row of n. The sum of squares in double (in float it left the result ~3 ulp
   from PyTorch's; in double, with the mean rounded to float as PyTorch's is, within an ulp).
   x's rows come in groups of `inner` contiguous ones, a group every `stride` floats: a head norm's
   q or k as a column slice of the stacked q/k/v product, read in place (y is contiguous). */
void qp_rmsnorm(const float *x, float *y, const float *w, int rows, int n, float eps, int gemma, int inner,
                long stride) {
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)(r / inner) * stride + (size_t)(r % inner) * n;
        float *yr = y + (size_t)r * n;
        double ss = 0.0;
        int i = 0;
#ifdef __AVX512F__
        __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
        for (; i + 16 <= n; i += 16) {
            const __m512d lo = _mm512_cvtps_pd(_mm256_loadu_ps(xr + i)), hi = _mm512_cvtps_pd(_mm256_loadu_ps(xr + i + 8));
            a0 = _mm512_fmadd_pd(lo, lo, a0);
            a1 = _mm512_fmadd_pd(hi, hi, a1);
        }
        ss = _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
#endif
        for (; i < n; i++) ss += (double)xr[i] * xr[i];
        const float mean = (float)(ss / n), inv = 1.f / sqrtf(mean + eps);
        i = 0;
#ifdef __AVX512F__
        const __m512 iv = _mm512_set1_ps(inv), one = _mm512_set1_ps(1.f);
        for (; i + 16 <= n; i += 16) {
            const __m512 v = _mm512_mul_ps(_mm512_loadu_ps(xr + i), iv), wv = _mm512_loadu_ps(w + i);
            _mm512_storeu_ps(yr + i, gemma ? _mm512_mul_ps(v, _mm512_add_ps(one, wv)) : _mm512_mul_ps(wv, v));
        }
#endif
        for (; i < n; i++) yr[i] = gemma ? (xr[i] * inv) * (1.f + w[i]) : w[i] * (xr[i] * inv);
    }
}

/* y = x (t x h x d) with each head's pairs (x[i], x[i + d/2]) rotated by token row's (cos, sin)
   (t x d/2): (x1 c - x2 s, x2 c + x1 s), each product rounded before the sum as PyTorch's
   apply_rotary rounds them (no fused multiply-add: the same bits). */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("fp-contract=off")))
#endif
void qp_rotary(const float *x, float *y, const float *cs, const float *sn, int t, int h, int d, long stride) {
#ifdef __clang__
#pragma clang fp contract(off)
#endif
    const int half = d / 2;
    for (int i = 0; i < t; i++) {
        const float *c = cs + (size_t)i * half, *s = sn + (size_t)i * half;
        for (int k = 0; k < h; k++) {
            const float *x1 = x + (size_t)i * stride + (size_t)k * d, *x2 = x1 + half;   /* token i's heads */
            float *y1 = y + ((size_t)i * h + k) * d, *y2 = y1 + half;
            int j = 0;
#ifdef __AVX512F__
            for (; j + 16 <= half; j += 16) {
                const __m512 a = _mm512_loadu_ps(x1 + j), b = _mm512_loadu_ps(x2 + j);
                const __m512 cv = _mm512_loadu_ps(c + j), sv = _mm512_loadu_ps(s + j);
                _mm512_storeu_ps(y1 + j, _mm512_sub_ps(_mm512_mul_ps(a, cv), _mm512_mul_ps(b, sv)));
                _mm512_storeu_ps(y2 + j, _mm512_add_ps(_mm512_mul_ps(b, cv), _mm512_mul_ps(a, sv)));
            }
#endif
            for (; j < half; j++) {
                const float a = x1[j], b = x2[j];
                const float ac = a * c[j], bs = b * s[j], bc = b * c[j], as = a * s[j];
                y1[j] = ac - bs;
                y2[j] = bc + as;
            }
        }
    }
}
