/* The AMX prefill's C side (model/cpu/prefill_bf16.py): a weight's rows as bf16 for oneDNN's
 * tile GEMM, and the gated MLP's activation from that GEMM's bf16 product. #included by
 * qgemm.c (it uses QW, dequant_row, f2bf, bf2f, act_fn and exp512).
 *
 * Both were scalar loops over an fp32 copy, and together a fifth of a one-thread pp512 of the
 * default model: the 106M weights were dequantized to fp32, rounded, staged and copied every
 * prefill, and the GLU ran at 8 lanes with a division. With AVX-512 BF16 the rounding is one
 * instruction per 32 values (VCVTNE2PS2BF16: nearest even, f2bf's bits for every finite value),
 * the Q4/Q8 blocks go from their bytes to bf16 without the fp32 row, and the GLU runs at 16
 * lanes with a refined reciprocal, its output bf16 (the down projection's GEMM input, so that
 * rounding is the one PyTorch did before, not a new one).
 */

#ifdef __AVX512BF16__
#define QB_BF16 1
static inline void store_bf16x32(uint16_t *y, __m512 lo, __m512 hi) {
    _mm512_storeu_si512((void *)y, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
}

static inline __m512 load_bf16x16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
#endif

/* n fp32 values to bf16, rounded to nearest even */
static void row_to_bf16(const float *x, uint16_t *y, int n) {
    int j = 0;
#ifdef QB_BF16
    for (; j + 32 <= n; j += 32) store_bf16x32(y + j, _mm512_loadu_ps(x + j), _mm512_loadu_ps(x + j + 16));
#endif
    for (; j < n; j++) y[j] = f2bf(x[j]);
}

/* Row r of a K_Q4 or K_Q8 weight with 32-value blocks, straight from its bytes: s * q (+ m, one
   fused rounding, as dequant_row) rounded to bf16. 0 where this does not serve the weight. */
static int block_row_bf16(const QW *w, int r, uint16_t *y) {
#ifdef QB_BF16
    if ((w->kind != K_Q4 && w->kind != K_Q8) || w->sub != 32 || w->cols % 32) return 0;
    const size_t o = (size_t)r * w->cols, sb = o / 32;
    for (int b = 0; b < w->cols / 32; b++) {
        __m512 lo, hi;
        if (w->kind == K_Q4) {   /* a block's 16 bytes: values 0-15 in the low nibbles, 16-31 high */
            const __m128i raw = _mm_loadu_si128((const __m128i *)((const uint8_t *)w->q + o / 2 + (size_t)b * 16));
            const __m128i m4 = _mm_set1_epi8(0x0f);
            lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(raw, m4)));
            hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(raw, 4), m4)));
        } else {
            const __m256i raw = _mm256_loadu_si256((const __m256i *)((const int8_t *)w->q + o + (size_t)b * 32));
            lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(raw)));
            hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(raw, 1)));
        }
        const __m512 s = _mm512_set1_ps(ld_s(w->scale, w->sdt, sb + b));
        if (w->min) {
            const __m512 m = _mm512_set1_ps(ld_s(w->min, w->sdt, sb + b));
            lo = _mm512_fmadd_ps(s, lo, m);
            hi = _mm512_fmadd_ps(s, hi, m);
        } else {
            lo = _mm512_mul_ps(s, lo);
            hi = _mm512_mul_ps(s, hi);
        }
        store_bf16x32(y + (size_t)b * 32, lo, hi);
    }
    return 1;
#else
    (void)w; (void)r; (void)y;
    return 0;
#endif
}

#if defined(QB_BF16) && defined(QD_AVX2)
/* dequant_file_avx2's values (the same products and differences), 32 at a time to bf16 */
static inline __attribute__((always_inline)) void bf16_file_avx2(const QW *w, int r, uint16_t *out, const FileFmt f,
                                                                 PrepFn prep, PrepV pv, V32Fn v32) {
    (void)pv;
    const uint8_t *row = file_row(w, r, &f);
    float sc[16], mn[16] = {0};
    for (int i = 0; i < w->cols / f.bv; i++) {
        const uint8_t *b = row + (size_t)i * f.bb;
        prep(b, sc, mn);
        for (int k = 0; k < f.bv / 32; k++) {
            const __m256i q = v32(b, k);
            __m512 h[2];
            for (int g = 0; g < 2; g++) {   /* values 16g..16g+15 of the 32 */
                const __m128i part = g ? _mm256_extracti128_si256(q, 1) : _mm256_castsi256_si128(q);
                h[g] = _mm512_mul_ps(_mm512_set1_ps(sc[SI(f, k, g)]), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(part)));
                if (f.has_min) h[g] = _mm512_sub_ps(h[g], _mm512_set1_ps(mn[SI(f, k, g)]));
            }
            store_bf16x32(out + (size_t)i * f.bv + 32 * k, h[0], h[1]);
        }
    }
}

/* Row r of a GGUF-format weight (qformats.h) as bf16; 0 for a kind without a file path */
static int file_row_bf16(const QW *w, int r, uint16_t *out) {
    const int u8 = 0;
    switch (w->kind) {
        FILE_CASES(FILE_CASE, bf16, w, r, out)
        default: return 0;
    }
    return 1;
}
#else
static int file_row_bf16(const QW *w, int r, uint16_t *out) { (void)w; (void)r; (void)out; return 0; }
#endif

/* Row r of any weight as bf16 (tmp: cols floats of scratch) */
static void weight_row_bf16(const QW *w, int r, float *tmp, uint16_t *y) {
    if (block_row_bf16(w, r, y) || file_row_bf16(w, r, y)) return;
    dequant_row(w, r, tmp);
    row_to_bf16(tmp, y, w->cols);
}

#ifdef QB_BF16
/* act(g) * u at 16 lanes: act(g) = g * sigmoid(a) as in act_rows, the division a reciprocal
   estimate refined once (relative error ~1e-7, far below bf16's 4e-3) */
static inline __m512 glu16(int act, __m512 g, __m512 u) {
    __m512 a = g;
    if (act == ACT_GELU_TANH) {
        const __m512 g3 = _mm512_mul_ps(_mm512_mul_ps(g, g), g);
        a = _mm512_mul_ps(_mm512_set1_ps(2.f * 0.7978845608028654f), _mm512_fmadd_ps(_mm512_set1_ps(0.044715f), g3, g));
    }
    const __m512 e = exp512(_mm512_min_ps(_mm512_sub_ps(_mm512_setzero_ps(), a), _mm512_set1_ps(80.f)));
    const __m512 den = _mm512_add_ps(_mm512_set1_ps(1.f), e);
    __m512 rc = _mm512_rcp14_ps(den);
    rc = _mm512_mul_ps(rc, _mm512_fnmadd_ps(den, rc, _mm512_set1_ps(2.f)));
    return _mm512_mul_ps(_mm512_mul_ps(g, rc), u);
}
#endif

/* o[j] = bf16(act(g[j]) * u[j]), from bf16 g and u */
static void glu_row_bf16(int act, const uint16_t *g, const uint16_t *u, uint16_t *o, int n) {
    int j = 0;
#ifdef QB_BF16
    for (; j + 32 <= n; j += 32)
        store_bf16x32(o + j, glu16(act, load_bf16x16(g + j), load_bf16x16(u + j)),
                      glu16(act, load_bf16x16(g + j + 16), load_bf16x16(u + j + 16)));
#endif
    for (; j < n; j++) o[j] = f2bf(act_fn(act, bf2f(g[j])) * bf2f(u[j]));
}

/* y[j] = act(y[j]) * u[j] in fp32: the bf16 GEMM's GLU (qgemm_bf16.c), whose bits, unlike the
   int16 GEMM's, need not match the decode step's act_rows */
static void glu_rows_fast(int act, float *y, const float *u, int n) {
    int j = 0;
#ifdef QB_BF16
    for (; j + 16 <= n; j += 16) _mm512_storeu_ps(y + j, glu16(act, _mm512_loadu_ps(y + j), _mm512_loadu_ps(u + j)));
#endif
    for (; j < n; j++) y[j] = act_fn(act, y[j]) * u[j];
}

/* out[i] = act(g[i]) * u[i] as bf16 for a bf16 GEMM's output y[t][2n] (the gate's n columns,
   then the up's) */
void qg_glu_bf16(const uint16_t *y, uint16_t *out, int t, int n, int act, int n_threads) {
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(n_threads)
#endif
    for (int i = 0; i < t; i++) glu_row_bf16(act, y + (size_t)i * 2 * n, y + (size_t)i * 2 * n + n, out + (size_t)i * n, n);
    (void)n_threads;
}
