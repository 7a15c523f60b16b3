/* The prefill's causal attention over the fp16 KV cache, on the GEMM's pool (qgemm.c includes it).
 *
 * Why: torch's SDPA was ~17% of a one-thread pp512 and, with one core busy, its OpenMP split got
 * slower on two threads than on one (docs/notes.md). Here a block is one query head and 32
 * consecutive queries, claimed dynamically like the GEMM's row blocks, so a descheduled thread
 * delays nobody and any thread count computes each block the same way (the same bits).
 *
 * A block, queries in the vector lanes (two zmm of 16): q^T scaled [d][32]; then keys in steps of
 * QA_KB (flash-style online softmax): the step's K and V rows converted from fp16, scores
 * s^T[key][32] = sum_d q^T[d] * k[key][d] (a broadcast key value a multiply-add), the causal and
 * sliding-window masks (-inf) for steps that cross them, the running max and sum per lane, and
 * o^T[d][32] = o^T * alpha + sum_key p^T[key] * v[key][d]. Keys a block cannot see are never read:
 * [max(0, first query - window), last query]. GQA: query head h reads KV head h / (hq / hk).
 * e^x is the decode step's polynomial at 512 bits, exactly 0 below -87 (so -inf gives 0).
 *
 * The bf16 prefill's attention (AttnJob.bf16, where the CPU has AVX-512 BF16): q, K, the softmax's
 * weights and V rounded to bf16 and multiplied by VDPBF16PS, two products a lane an instruction
 * (twice an fp32 FMA's): pairs of dims for the scores, pairs of keys for the values, the sums,
 * the running max and the denominators in fp32. Long inputs are where it counts: at 3,600 tokens
 * attention was half of a SmolLM2 prefill.
 */
#define QA_QB 32      /* queries a block: two zmm of lanes */
#define QA_KB 64      /* keys a step of the online softmax */
#define QA_DMAX 512   /* head_dim, a multiple of 16 */

typedef struct {
    const float *q;        /* t x hq x d, the rotated queries */
    float *o;              /* t x hq x d */
    const uint16_t *kc, *vc;   /* the layer's cache: rows of hk x d fp16, positions [0, pos + t) written */
    int t, pos, hq, hk, d, wl;   /* wl: keys before the query a windowed layer sees (-1: all) */
    float scale;
    int bf16;              /* 1: the bf16 products (the bf16 prefill's), d a multiple of 32 */
} AttnJob;

typedef struct { float *qt, *kf, *vf, *st, *ot, *ob; uint16_t *qb, *kb, *vt, *vb, *pb; } AScratch;

static int ascratch_alloc(AScratch *a) {
    a->qt = malloc(sizeof(float) * QA_DMAX * QA_QB);
    a->kf = malloc(sizeof(float) * QA_KB * QA_DMAX);
    a->vf = malloc(sizeof(float) * QA_KB * QA_DMAX);
    a->st = malloc(sizeof(float) * QA_KB * QA_QB);
    a->ot = malloc(sizeof(float) * QA_DMAX * QA_QB);
    a->ob = malloc(sizeof(float) * QA_QB * QA_DMAX);
    a->qb = aligned_alloc(64, sizeof(uint16_t) * QA_DMAX * QA_QB);
    a->kb = aligned_alloc(64, sizeof(uint16_t) * QA_KB * QA_DMAX);
    a->vt = aligned_alloc(64, sizeof(uint16_t) * QA_KB * QA_DMAX);
    a->vb = aligned_alloc(64, sizeof(uint16_t) * QA_KB * QA_DMAX);
    a->pb = aligned_alloc(64, sizeof(uint16_t) * QA_KB * QA_QB);
    return a->qt && a->kf && a->vf && a->st && a->ot && a->ob && a->qb && a->kb && a->vt && a->vb && a->pb ? 0 : -1;
}

static void ascratch_free(AScratch *a) {
    free(a->qt); free(a->kf); free(a->vf); free(a->st); free(a->ot); free(a->ob);
    free(a->qb); free(a->kb); free(a->vt); free(a->vb); free(a->pb);
}

/* rows [j0, j0 + n) of KV head kv as fp32 [n][d], zero rows up to n8 (a multiple of 8) */
static void rows_f32(const uint16_t *c, int j0, int n, int n8, int hk, int kv, int d, float *out) {
    for (int j = 0; j < n; j++) {
        const uint16_t *src = c + ((size_t)(j0 + j) * hk + kv) * d;
        float *dst = out + (size_t)j * d;
#ifdef __AVX512F__
        for (int i = 0; i < d; i += 16) _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
#else
        for (int i = 0; i < d; i++) dst[i] = h2f(src[i]);
#endif
    }
    memset(out + (size_t)n * d, 0, sizeof(float) * (size_t)(n8 - n) * d);
}

#ifdef __AVX512F__
static inline __m512 exp512(__m512 x) {
    const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_GE_OQ);
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(EXP_LOG2E)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 p = EXP_POLY(_mm512_, __m512, n, x);   /* qdecode.c's, at 16 lanes */
    return _mm512_maskz_mov_ps(live, _mm512_scalef_ps(p, n));
}

/* s^T[key][32] for keys [0, n8) of the step, per 16 queries: 8 keys of accumulators, each key
   value broadcast from memory into its one multiply-add. D a constant (the callers' switch): the
   8 rows' offsets are then immediates (with a runtime d GCC kept them in vector registers and
   moved one to an address register per multiply-add: half the loop's time). */
static inline __attribute__((always_inline)) void scores_d(const float *qt, const float *kf, int n8, const int D,
                                                           float *st) {
    for (int half = 0; half < 2; half++)
        for (int j = 0; j < n8; j += 8) {
            __m512 a[8];
            for (int u = 0; u < 8; u++) a[u] = _mm512_setzero_ps();
            const float *k = kf + (size_t)j * D;
            for (int i = 0; i < D; i++) {
                const __m512 q = _mm512_loadu_ps(qt + (size_t)i * QA_QB + 16 * half);
                for (int u = 0; u < 8; u++) a[u] = _mm512_fmadd_ps(q, _mm512_set1_ps(k[u * D + i]), a[u]);
            }
            for (int u = 0; u < 8; u++) _mm512_storeu_ps(st + (size_t)(j + u) * QA_QB + 16 * half, a[u]);
        }
}

static void step_scores(const float *qt, const float *kf, int n8, int d, float *st) {
    switch (d) {
    case 64: scores_d(qt, kf, n8, 64, st); break;
    case 128: scores_d(qt, kf, n8, 128, st); break;
    case 256: scores_d(qt, kf, n8, 256, st); break;
    default: scores_d(qt, kf, n8, d, st); break;
    }
}

/* o^T = o^T * alpha + sum_key p^T[key] v[key], per 16 queries: 16 dims of accumulators */
static void step_values(const float *st, const float *vf, int n8, int d, const __m512 al[2], float *ot) {
    for (int half = 0; half < 2; half++)
        for (int i = 0; i < d; i += 16) {
            __m512 a[16];
            for (int u = 0; u < 16; u++) a[u] = _mm512_mul_ps(_mm512_loadu_ps(ot + (size_t)(i + u) * QA_QB + 16 * half), al[half]);
            for (int j = 0; j < n8; j++) {
                const __m512 p = _mm512_loadu_ps(st + (size_t)j * QA_QB + 16 * half);
                const float *v = vf + (size_t)j * d + i;
                for (int u = 0; u < 16; u++) a[u] = _mm512_fmadd_ps(p, _mm512_set1_ps(v[u]), a[u]);
            }
            for (int u = 0; u < 16; u++) _mm512_storeu_ps(ot + (size_t)(i + u) * QA_QB + 16 * half, a[u]);
        }
}
#endif

#ifdef __AVX512BF16__
#define QA_BF16 1
/* [a0..a15 | b0..b15] (one cvtne2ps of b, a) -> [a0 b0 a1 b1 ...]: 16 pairs */
static const int16_t PAIRS16[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                    8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
static inline __m512i pairs16(__m512 a, __m512 b) {
    return _mm512_permutexvar_epi16(_mm512_loadu_si512(PAIRS16), (__m512i)_mm512_cvtne2ps_pbh(b, a));
}

/* rows [j0, j0 + n) of KV head kv as bf16 [n][d], zero rows up to n8 */
static void rows_bf16(const uint16_t *c, int j0, int n, int n8, int hk, int kv, int d, uint16_t *out) {
    for (int j = 0; j < n; j++) {
        const uint16_t *src = c + ((size_t)(j0 + j) * hk + kv) * d;
        for (int i = 0; i < d; i += 32) {
            const __m512 lo = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i)));
            const __m512 hi = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i + 16)));
            _mm512_storeu_si512((void *)(out + (size_t)j * d + i), (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
        }
    }
    memset(out + (size_t)n * d, 0, sizeof(uint16_t) * (size_t)(n8 - n) * d);
}

/* v rows [n8][d] bf16 -> [n8 / 2][d] pairs: dim i of keys 2jj and 2jj + 1 side by side */
static const int16_t KEYS_LO[32] = {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
                                    8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
static const int16_t KEYS_HI[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
                                    24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
static void key_pairs(const uint16_t *v, int n8, int d, uint16_t *out) {
    const __m512i lo_idx = _mm512_loadu_si512(KEYS_LO), hi_idx = _mm512_loadu_si512(KEYS_HI);
    for (int jj = 0; jj < n8 / 2; jj++)
        for (int i = 0; i < d; i += 32) {
            const __m512i r0 = _mm512_loadu_si512(v + (size_t)(2 * jj) * d + i), r1 = _mm512_loadu_si512(v + (size_t)(2 * jj + 1) * d + i);
            _mm512_storeu_si512(out + ((size_t)jj * d + i) * 2, _mm512_permutex2var_epi16(r0, lo_idx, r1));
            _mm512_storeu_si512(out + ((size_t)jj * d + i + 16) * 2, _mm512_permutex2var_epi16(r0, hi_idx, r1));
        }
}

/* s^T[key][32] = q^T . k by pairs of dims: qb [D / 2][32] pairs, kb [key][D / 2] pairs */
static inline __attribute__((always_inline)) void scores_bf16_d(const uint32_t *qb, const uint32_t *kb, int n8,
                                                                const int D, float *st) {
    for (int half = 0; half < 2; half++)
        for (int j = 0; j < n8; j += 8) {
            __m512 a[8];
            for (int u = 0; u < 8; u++) a[u] = _mm512_setzero_ps();
            const uint32_t *k = kb + (size_t)j * (D / 2);
            for (int i = 0; i < D / 2; i++) {
                const __m512bh q = (__m512bh)_mm512_loadu_si512(qb + (size_t)i * QA_QB + 16 * half);
                for (int u = 0; u < 8; u++)
                    a[u] = _mm512_dpbf16_ps(a[u], q, (__m512bh)_mm512_set1_epi32((int)k[u * (D / 2) + i]));
            }
            for (int u = 0; u < 8; u++) _mm512_storeu_ps(st + (size_t)(j + u) * QA_QB + 16 * half, a[u]);
        }
}

static void step_scores_bf16(const uint32_t *qb, const uint32_t *kb, int n8, int d, float *st) {
    switch (d) {
    case 64: scores_bf16_d(qb, kb, n8, 64, st); break;
    case 128: scores_bf16_d(qb, kb, n8, 128, st); break;
    case 256: scores_bf16_d(qb, kb, n8, 256, st); break;
    default: scores_bf16_d(qb, kb, n8, d, st); break;
    }
}

/* o^T = o^T * alpha + p^T . v by pairs of keys: pb [n8 / 2][32] pairs, vb [n8 / 2][d] pairs */
static void step_values_bf16(const uint32_t *pb, const uint32_t *vb, int n8, int d, const __m512 al[2], float *ot) {
    for (int half = 0; half < 2; half++)
        for (int i = 0; i < d; i += 16) {
            __m512 a[16];
            for (int u = 0; u < 16; u++) a[u] = _mm512_mul_ps(_mm512_loadu_ps(ot + (size_t)(i + u) * QA_QB + 16 * half), al[half]);
            for (int jj = 0; jj < n8 / 2; jj++) {
                const __m512bh p = (__m512bh)_mm512_loadu_si512(pb + (size_t)jj * QA_QB + 16 * half);
                const uint32_t *v = vb + (size_t)jj * d + i;
                for (int u = 0; u < 16; u++) a[u] = _mm512_dpbf16_ps(a[u], p, (__m512bh)_mm512_set1_epi32((int)v[u]));
            }
            for (int u = 0; u < 16; u++) _mm512_storeu_ps(ot + (size_t)(i + u) * QA_QB + 16 * half, a[u]);
        }
}
#endif

/* Block b of the job into sc->ob ([32][d], lanes < the block's query count valid); returns the
   first query and the count. Late query blocks (the most keys) come first. */
static int attn_compute(const AttnJob *J, int b, AScratch *sc, int *nq_out) {
    const int nqb = (J->t + QA_QB - 1) / QA_QB, qb = nqb - 1 - b / J->hq, h = b % J->hq, d = J->d;
    const int i0 = qb * QA_QB, nq = J->t - i0 < QA_QB ? J->t - i0 : QA_QB, kv = h / (J->hq / J->hk);
    const size_t qrow = (size_t)J->hq * d;
    int pq[QA_QB];   /* each lane's absolute position (padding lanes repeat the last query) */
    for (int l = 0; l < QA_QB; l++) pq[l] = J->pos + i0 + (l < nq ? l : nq - 1);
#ifdef __AVX512F__   /* gathers: the scalar transpose was a tenth of the kernel at head_dim 64 */
    {
        const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                               _mm512_set1_epi32((int)qrow));
        const __m512 sv = _mm512_set1_ps(J->scale);
        for (int half = 0; half < 2; half++) {
            const int n = nq - 16 * half;
            const __mmask16 live = n >= 16 ? 0xffff : n > 0 ? (__mmask16)((1u << n) - 1) : 0;
            const float *base = J->q + (size_t)(i0 + (n > 0 ? 16 * half : 0)) * qrow + (size_t)h * d;
            for (int i = 0; i < d; i++) {
                const __m512 g = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), live, idx, base + i, 4);
                _mm512_storeu_ps(sc->qt + (size_t)i * QA_QB + 16 * half, _mm512_mul_ps(g, sv));
            }
        }
    }
#else
    for (int i = 0; i < d; i++)
        for (int l = 0; l < QA_QB; l++)
            sc->qt[(size_t)i * QA_QB + l] = l < nq ? J->q[(size_t)(i0 + l) * qrow + (size_t)h * d + i] * J->scale : 0.f;
#endif
#ifdef QA_BF16
    const int bf = J->bf16;
    if (bf)   /* q^T's dims in pairs: [d / 2][32 queries] */
        for (int i = 0; i < d / 2; i++)
            for (int half = 0; half < 2; half++)
                _mm512_storeu_si512(sc->qb + ((size_t)i * QA_QB + 16 * half) * 2,
                                    pairs16(_mm512_loadu_ps(sc->qt + (size_t)(2 * i) * QA_QB + 16 * half),
                                            _mm512_loadu_ps(sc->qt + (size_t)(2 * i + 1) * QA_QB + 16 * half)));
#endif
    memset(sc->ot, 0, sizeof(float) * (size_t)d * QA_QB);
    float m[QA_QB], lsum[QA_QB];
    for (int l = 0; l < QA_QB; l++) { m[l] = -INFINITY; lsum[l] = 0.f; }
    const int hi = pq[QA_QB - 1] + 1, lo = J->wl >= 0 && pq[0] - J->wl > 0 ? pq[0] - J->wl : 0;
    for (int j0 = lo; j0 < hi; j0 += QA_KB) {
        const int n = hi - j0 < QA_KB ? hi - j0 : QA_KB, n8 = (n + 7) / 8 * 8;
#ifdef QA_BF16
        if (bf) {
            rows_bf16(J->kc, j0, n, n8, J->hk, kv, d, sc->kb);
            rows_bf16(J->vc, j0, n, n8, J->hk, kv, d, sc->vt);
            key_pairs(sc->vt, n8, d, sc->vb);
        } else
#endif
        {
            rows_f32(J->kc, j0, n, n8, J->hk, kv, d, sc->kf);
            rows_f32(J->vc, j0, n, n8, J->hk, kv, d, sc->vf);
        }
        /* the step crosses the causal edge, the window's, or its zero padding: mask it */
        const int masked = j0 + n8 - 1 > pq[0] || (J->wl >= 0 && j0 < pq[QA_QB - 1] - J->wl);
#ifdef __AVX512F__
#ifdef QA_BF16
        if (bf) step_scores_bf16((const uint32_t *)sc->qb, (const uint32_t *)sc->kb, n8, d, sc->st);
        else
#endif
        step_scores(sc->qt, sc->kf, n8, d, sc->st);
        const __m512 ninf = _mm512_set1_ps(-INFINITY);
        __m512i p0 = _mm512_loadu_si512(pq), p1 = _mm512_loadu_si512(pq + 16);
        if (masked)
            for (int j = 0; j < n8; j++) {
                const __m512i jv = _mm512_set1_epi32(j0 + j);
                __mmask16 k0 = _mm512_cmpgt_epi32_mask(jv, p0), k1 = _mm512_cmpgt_epi32_mask(jv, p1);
                if (J->wl >= 0) {
                    const __m512i wv = _mm512_set1_epi32(J->wl);
                    k0 |= _mm512_cmplt_epi32_mask(jv, _mm512_sub_epi32(p0, wv));
                    k1 |= _mm512_cmplt_epi32_mask(jv, _mm512_sub_epi32(p1, wv));
                }
                float *s = sc->st + (size_t)j * QA_QB;
                _mm512_mask_storeu_ps(s, k0, ninf);
                _mm512_mask_storeu_ps(s + 16, k1, ninf);
            }
        __m512 mo0 = _mm512_loadu_ps(m), mo1 = _mm512_loadu_ps(m + 16), mn0 = mo0, mn1 = mo1;
        for (int j = 0; j < n8; j++) {
            mn0 = _mm512_max_ps(mn0, _mm512_loadu_ps(sc->st + (size_t)j * QA_QB));
            mn1 = _mm512_max_ps(mn1, _mm512_loadu_ps(sc->st + (size_t)j * QA_QB + 16));
        }
        /* a lane that has seen no key yet keeps -inf: subtract 0 there, so e^(-inf) = 0, not NaN */
        const __m512 mu0 = _mm512_mask_mov_ps(mn0, _mm512_cmp_ps_mask(mn0, ninf, _CMP_EQ_OQ), _mm512_setzero_ps());
        const __m512 mu1 = _mm512_mask_mov_ps(mn1, _mm512_cmp_ps_mask(mn1, ninf, _CMP_EQ_OQ), _mm512_setzero_ps());
        const __m512 a0 = exp512(_mm512_sub_ps(mo0, mu0)), a1 = exp512(_mm512_sub_ps(mo1, mu1));
        __m512 l0 = _mm512_mul_ps(_mm512_loadu_ps(lsum), a0), l1 = _mm512_mul_ps(_mm512_loadu_ps(lsum + 16), a1);
        for (int j = 0; j < n8; j++) {
            float *s = sc->st + (size_t)j * QA_QB;
            const __m512 e0 = exp512(_mm512_sub_ps(_mm512_loadu_ps(s), mu0));
            const __m512 e1 = exp512(_mm512_sub_ps(_mm512_loadu_ps(s + 16), mu1));
            _mm512_storeu_ps(s, e0);
            _mm512_storeu_ps(s + 16, e1);
            l0 = _mm512_add_ps(l0, e0);
            l1 = _mm512_add_ps(l1, e1);
        }
        _mm512_storeu_ps(m, mn0); _mm512_storeu_ps(m + 16, mn1);
        _mm512_storeu_ps(lsum, l0); _mm512_storeu_ps(lsum + 16, l1);
        const __m512 al2[2] = {a0, a1};
#ifdef QA_BF16
        if (bf) {   /* the weights in pairs of keys: [n8 / 2][32 queries] */
            for (int jj = 0; jj < n8 / 2; jj++)
                for (int half = 0; half < 2; half++)
                    _mm512_storeu_si512(sc->pb + ((size_t)jj * QA_QB + 16 * half) * 2,
                                        pairs16(_mm512_loadu_ps(sc->st + (size_t)(2 * jj) * QA_QB + 16 * half),
                                                _mm512_loadu_ps(sc->st + (size_t)(2 * jj + 1) * QA_QB + 16 * half)));
            step_values_bf16((const uint32_t *)sc->pb, (const uint32_t *)sc->vb, n8, d, al2, sc->ot);
        } else
#endif
        step_values(sc->st, sc->vf, n8, d, al2, sc->ot);
#else
        float al[QA_QB];
        for (int j = 0; j < n8; j++)
            for (int l = 0; l < QA_QB; l++) {
                float s = 0.f;
                for (int i = 0; i < d; i++) s += sc->qt[(size_t)i * QA_QB + l] * sc->kf[(size_t)j * d + i];
                const int jp = j0 + j;
                if (masked && (jp > pq[l] || (J->wl >= 0 && jp < pq[l] - J->wl))) s = -INFINITY;
                sc->st[(size_t)j * QA_QB + l] = s;
            }
        for (int l = 0; l < QA_QB; l++) {
            float mn = m[l];
            for (int j = 0; j < n8; j++) mn = fmaxf(mn, sc->st[(size_t)j * QA_QB + l]);
            const float mu = mn == -INFINITY ? 0.f : mn;
            al[l] = m[l] == -INFINITY ? 0.f : expf(m[l] - mu);
            lsum[l] *= al[l];
            for (int j = 0; j < n8; j++) {
                float *s = sc->st + (size_t)j * QA_QB + l;
                *s = *s == -INFINITY ? 0.f : expf(*s - mu);
                lsum[l] += *s;
            }
            m[l] = mn;
        }
        for (int i = 0; i < d; i++)
            for (int l = 0; l < QA_QB; l++) {
                float acc = sc->ot[(size_t)i * QA_QB + l] * al[l];
                for (int j = 0; j < n8; j++) acc += sc->st[(size_t)j * QA_QB + l] * sc->vf[(size_t)j * d + i];
                sc->ot[(size_t)i * QA_QB + l] = acc;
            }
#endif
    }
    for (int l = 0; l < nq; l++) {
        const float inv = 1.f / lsum[l];
        for (int i = 0; i < d; i++) sc->ob[(size_t)l * d + i] = sc->ot[(size_t)i * QA_QB + l] * inv;
    }
    *nq_out = nq;
    return i0;
}

static int attn_blocks(const AttnJob *J) { return J->hq * ((J->t + QA_QB - 1) / QA_QB); }

static int attn_supports(const AttnJob *J) {
#ifdef QA_BF16
    if (J->bf16 && J->d % 32) return 0;
#else
    if (J->bf16) return 0;
#endif
    return J->t >= 1 && J->pos >= 0 && J->hk >= 1 && J->hq % J->hk == 0 && J->d >= 16 && J->d <= QA_DMAX
        && J->d % 16 == 0 && attn_blocks(J) <= QG_MAX_BLOCKS;
}
