/* The prefill's GEMM: Y (T x rows) = X (T x K) W^T over a weight in its block format, with
 * integer activations (int16 by default, int8 opt-in), integer dot products and one fp32 scale
 * step per block of 16 or 32 values. #included by qdecode.c after pool.c (it uses QW, the formats
 * of qformats.h, act_rows and the pool).
 *
 * Why: MKL's fp32 GEMM on the dequantized matrix was the prefill's ceiling (~815 tok/s on the
 * default model here). AVX-512 VNNI's vpdpwssd does 32 int16 multiply-adds an instruction and
 * vpdpbusd 64 u8 x s8, at one a cycle here, where an fp32 FMA does 16 (docs/cpu-prefill.md).
 *
 * Data, per call:
 *   activations  per token and 32 values: d = amax / 32767 (int16) or / 127 (int8), qa = round(x / d),
 *                in groups of 16 tokens so one 64-byte load holds one int32 lane a token:
 *                int16 [group][k / 2][16 tokens][2 values]; int8 stored biased (qa + 128, u8)
 *                [group][k / 4][16 tokens][4 values]; with d [group][k / 32][16] and
 *                d * sum(qa) [group][k / SUB][16] for the mins.
 *   weights      unpacked per block of rows by the thread that computes it, from the file's
 *                bytes: int8 values row-major (widened once to int16 for the int16 kernel), and per
 *                SUB values (16 or 32) the scale, the min (value = s * q + m) and -128 * sum(q),
 *                which cancels the int8 activations' bias in the integer sum exactly.
 * So a row r, token t, SUB-block b contributes (float)(sum qa q) * (d * s) + (d * sum qa) * m:
 * exact integers, then two fp32 roundings per block in a fixed order (any thread count gives the
 * same bits).
 *
 * Work: one pool phase per call, its blocks are rows; a block's row tiles pass over the tokens
 * in chunks that stay in L2; claimed by compare-and-swap, computed into the thread's own
 * scratch, published by whoever wins the block (pool.c), so a descheduled thread delays nobody.
 * Idle threads spin SPIN_US, then sleep.
 */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(QD_AVX2)
#define QG_VNNI 1
#endif

#define QG_TOK 16        /* tokens a group (one zmm of int32 lanes) */
#define QG_R 4           /* rows the inner kernel holds */
#define QG_TMAX 512      /* tokens a phase: longer inputs run as several */
#define QG_MAX_BLOCKS 8192

#include "prefill_attn.c"   /* the prefill's causal attention: phase kind 3 on this pool */
#include "prefill_ops.c"    /* its norms and rotary, on the calling thread */
#include "prefill_bf16.c"   /* the AMX prefill's bf16 rows and GLU */

typedef struct {
    QW w;
    float *y;
    int nb, rb, t, tp, kind, bits;   /* kind 0: idle, 1: GEMM, 2: quantize x, 3: attention, 4: rows to bf16 */
    const float *x;                  /* kind 2: the input, t x k */
    int k, sub;
    int glu;                         /* 0, or 1 + act: y = act(y) * (x W^T), y holding the gate's output */
    uint64_t call;
    uint16_t *yb;                    /* kind 4: the bf16 rows' destination */
    AttnJob at;                      /* kind 3 (last: the GEMM's phases are initialised in order) */
} GPhase;

typedef struct {
    int8_t *q; int16_t *q16; float *sw, *mn; int32_t *wc;   /* one block's unpacked rows (q16: int16 path) */
    float *out;                                /* [tp][rows] */
    uint8_t *gq; float *gd, *gs;               /* one token group quantized */
    AScratch a;                                /* one attention block */
} GScratch;

typedef struct {
    Pool pool;
    int nt, k_max, last_sub, last_t;   /* what the input buffers hold */
    pthread_t *workers;
    GPhase ph, next;               /* the open phase; the GEMM that follows a quantize phase */
    uint64_t call;
    int last_bits;
    uint8_t *aq; float *ad, *as;   /* the quantized input (int8 or int16), written between phases;
                                      sized once, since a straggler of an old phase may still read it */
    GScratch *scr;                 /* per thread, sized once likewise */
} GCtx;

/* ---- weights: one row as int8 values and per-SUB scale, min, bias correction ------------------ */
static int qg_sub(const QW *w) {
    if (w->kind >= K_FILE_FIRST) return FILE_FMT[w->kind - K_FILE_FIRST].per16 ? 16 : 32;
    return w->sub;
}

/* 1 when the GEMM serves w: block formats whose rows are whole 32-blocks */
int qg_supports(const QW *w) {
    if (w->cols % 32 || w->rows < 1) return 0;
    if (w->kind == K_Q4) return w->sub == 32;
    if (w->kind == K_Q8) return w->sub == 32 || w->sub == 16;
    return w->kind >= K_FILE_FIRST && w->kind <= K_Q5_K;
}

static inline void q32_file(const QW *w, const uint8_t *b, int k, int8_t *q) {
#ifdef QD_AVX2
#define V32(K, NAME) case K: _mm256_storeu_si256((__m256i *)q, v32_##NAME(b, k)); return;
#else
#define V32(K, NAME) case K: c32_##NAME(b, k, q); return;
#endif
    switch (w->kind) {
        V32(K_Q5_0, q5_0) V32(K_Q6_K, q6_k) V32(K_Q2_K, q2_k) V32(K_Q3_K, q3_k)
        V32(K_IQ4_NL, iq4_nl) V32(K_IQ4_XS, iq4_xs) V32(K_Q4_K, q4_k) V32(K_Q5_K, q5_k)
    }
#undef V32
}

static inline void prep_file(const QW *w, const uint8_t *b, float *sc, float *mn) {
    switch (w->kind) {
        case K_Q5_0: prep_q5_0(b, sc, mn); break;   case K_Q6_K: prep_q6_k(b, sc, mn); break;
        case K_Q2_K: prep_q2_k(b, sc, mn); break;   case K_Q3_K: prep_q3_k(b, sc, mn); break;
        case K_IQ4_NL: prep_iq4_nl(b, sc, mn); break; case K_IQ4_XS: prep_iq4_xs(b, sc, mn); break;
        case K_Q4_K: prep_q4_k(b, sc, mn); break;   case K_Q5_K: prep_q5_k(b, sc, mn); break;
    }
}

/* Row r of w into q[cols], and per SUB: sw, mn (value = sw * q + mn) and, for int8 activations
   (wc not NULL), wc = -128 * sum(q). */
static void unpack_row(const QW *w, int r, int8_t *q, float *sw, float *mn, int32_t *wc) {
    const int n = w->cols, sub = qg_sub(w);
    if (w->kind >= K_FILE_FIRST) {
        const FileFmt f = FILE_FMT[w->kind - K_FILE_FIRST];
        const uint8_t *row = file_row(w, r, &f);
        float sc[16], mf[16] = {0};
        for (int i = 0; i < n / f.bv; i++) {
            const uint8_t *b = row + (size_t)i * f.bb;
            prep_file(w, b, sc, mf);
            for (int k = 0; k < f.bv / 32; k++) {
                const int j0 = i * f.bv + 32 * k;
                q32_file(w, b, k, q + j0);
                for (int h = 0; h < 32 / sub; h++) {
                    const int s = j0 / sub + h, si = f.per16 ? 2 * k + h : k;
                    sw[s] = sc[si];
                    mn[s] = f.has_min ? -mf[si] : 0.f;
                }
            }
        }
    } else if (w->kind == K_Q4) {
        const uint8_t *p = (const uint8_t *)w->q + (size_t)r * n / 2;
        int b = 0;
#ifdef QD_AVX2   /* GCC left this loop scalar: ~4% of a SmolLM2 GEMM */
        const __m128i lo4 = _mm_set1_epi8(15);
        for (; b < n / 32; b++) {
            const __m128i v = _mm_loadu_si128((const __m128i *)(p + 16 * b));
            _mm_storeu_si128((__m128i *)(q + 32 * b), _mm_and_si128(v, lo4));
            _mm_storeu_si128((__m128i *)(q + 32 * b + 16), _mm_and_si128(_mm_srli_epi16(v, 4), lo4));
        }
#endif
        for (; b < n / 32; b++)
            for (int j = 0; j < 16; j++) {
                q[32 * b + j] = (int8_t)(p[16 * b + j] & 15);
                q[32 * b + 16 + j] = (int8_t)(p[16 * b + j] >> 4);
            }
    } else {
        memcpy(q, (const int8_t *)w->q + (size_t)r * n, (size_t)n);
    }
    if (w->kind < K_FILE_FIRST) {
        const size_t sb = (size_t)r * (n / sub);
        for (int s = 0; s < n / sub; s++) {
            sw[s] = ld_s(w->scale, w->sdt, sb + s);
            mn[s] = w->min ? ld_s(w->min, w->sdt, sb + s) : 0.f;
        }
    }
    for (int s = 0; wc && s < n / sub; s++) {
        int32_t t = 0;
        for (int j = 0; j < sub; j++) t += q[s * sub + j];
        wc[s] = -128 * t;
    }
}

/* ---- activations --------------------------------------------------------------------------- */
/* 32 values as int8 with their scale: d = amax / 127, q = round(x / d) (to nearest even). */
static inline float quant32(const float *p, int8_t *v) {
#ifdef QD_AVX2
    __m256 x[4];
    const float amax = load32_amax(p, x);
    const float d = amax / 127.f, id = d > 0.f ? 1.f / d : 0.f;
    __m256i q[4];
    for (int k = 0; k < 4; k++) q[k] = _mm256_cvtps_epi32(_mm256_mul_ps(x[k], _mm256_set1_ps(id)));
    /* the packs work within 128-bit lanes: dwords come out as q0[0:4] q1[0:4] q2[0:4] q3[0:4] q0[4:8] ... */
    __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)v, b);
    return d;
#else
    float amax = 0.f;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(p[j]));
    const float d = amax / 127.f, id = d > 0.f ? 1.f / d : 0.f;
    for (int j = 0; j < 32; j++) v[j] = (int8_t)lrintf(p[j] * id);
    return d;
#endif
}

/* 32 values as int16 with their scale, exactly as the decode step quantizes them (quantize_act). */
static inline float quant32_16(const float *p, int16_t *v) {
    float amax = 0.f;
#ifdef QD_AVX2
    __m256 x[4];
    amax = load32_amax(p, x);
    const float d = amax / 32767.f, id = d > 0.f ? 1.f / d : 0.f;
    __m256i q[4];
    for (int k = 0; k < 4; k++) q[k] = _mm256_cvtps_epi32(_mm256_mul_ps(x[k], _mm256_set1_ps(id)));
    _mm256_storeu_si256((__m256i *)v, _mm256_permute4x64_epi64(_mm256_packs_epi32(q[0], q[1]), 0xd8));
    _mm256_storeu_si256((__m256i *)(v + 16), _mm256_permute4x64_epi64(_mm256_packs_epi32(q[2], q[3]), 0xd8));
    return d;
#else
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(p[j]));
    const float d = amax / 32767.f, id = d > 0.f ? 1.f / d : 0.f;
    for (int j = 0; j < 32; j++) v[j] = (int16_t)lrintf(p[j] * id);
    return d;
#endif
}

/* Tokens [0, t) of x (t x k, row-major) into the kernels' layouts; tokens up to tp are zero (qa = 0).
   bits 8: biased u8 (qa + 128) in aq, [group][k / 4][16 tokens][4 values].
   bits 16: int16 in aq (as int16_t), [group][k / 2][16 tokens][2 values] (vpdpwssd's pairs). */
static void quantize_tokens(const float *x, int t, int tp, int k, int sub, int bits, uint8_t *aq, float *ad,
                            float *as) {
    const int kg = k / 4, nb = k / 32, ns = k / sub;
    int16_t *a16 = (int16_t *)aq;
    for (int tok = 0; tok < tp; tok++) {
        const int g = tok / QG_TOK, i = tok % QG_TOK;
        for (int b = 0; b < nb; b++) {
            int8_t v[32];
            int16_t v16[32];
            float d = 0.f;
            int sums[2] = {0, 0};
            if (bits == 16) {
                if (tok < t) d = quant32_16(x + (size_t)tok * k + 32 * b, v16);
                else memset(v16, 0, sizeof v16);
#ifdef QD_AVX2   /* the scalar loop through the stack was 17% of a GEMM */
                const __m256i one = _mm256_set1_epi16(1);
                const __m256i s0 = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)v16), one);
                const __m256i s1 = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(v16 + 16)), one);
                int32_t ps[16];
                _mm256_storeu_si256((__m256i *)ps, s0);
                _mm256_storeu_si256((__m256i *)(ps + 8), s1);
                for (int j = 0; j < 8; j++) { sums[0] += ps[j]; sums[1] += ps[8 + j]; }
#else
                for (int j = 0; j < 32; j++) sums[j / 16] += v16[j];
#endif
                int16_t *dst = a16 + (((size_t)g * (k / 2) + 16 * b) * QG_TOK + i) * 2;
                for (int j = 0; j < 16; j++) memcpy(dst + (size_t)j * QG_TOK * 2, v16 + 2 * j, 4);
            } else {
                if (tok < t) d = quant32(x + (size_t)tok * k + 32 * b, v);
                else memset(v, 0, 32);
                for (int j = 0; j < 32; j++) sums[j / 16] += v[j];
                const size_t at = (((size_t)g * kg + 8 * b) * QG_TOK + i) * 4;
                for (int j = 0; j < 8; j++) {   /* 4 values a token in each 64-byte row of the group */
                    uint32_t u;
                    memcpy(&u, v + 4 * j, 4);
                    u ^= 0x80808080u;            /* + 128 per byte */
                    memcpy(aq + at + (size_t)j * QG_TOK * 4, &u, 4);
                }
            }
            ad[((size_t)g * nb + b) * QG_TOK + i] = d;
            if (sub == 32) as[((size_t)g * ns + b) * QG_TOK + i] = d * (float)(sums[0] + sums[1]);
            else
                for (int h = 0; h < 2; h++) as[((size_t)g * ns + 2 * b + h) * QG_TOK + i] = d * (float)sums[h];
        }
    }
}

/* ---- the kernels: rows [r0, r0 + R) of the unpacked block x token groups [g0, g0 + N) ---------- */
typedef struct { const int8_t *q; const int16_t *q16; const float *sw, *mn; const int32_t *wc; int k, sub, has_min; } GRows;
typedef struct { const uint8_t *aq; const float *ad, *as; int k, bits; } GAct;

#ifdef QG_VNNI
/* One scale block's integer sums into the float accumulators (activation scale x weight scale,
   plus the weights' min x the activations' sum where the format has mins), and the finished tile
   out: the same steps for the int8 and the int16 kernel. */
static inline __attribute__((always_inline)) void scale_block(const GRows *w, const GAct *a, int r0, int g0,
                                                              int s, int ns, int nb, int b32, const int N,
                                                              __m512i acc[QG_R][4], __m512 facc[QG_R][4]) {
    for (int n = 0; n < N; n++) {
        const __m512 dv = _mm512_loadu_ps(a->ad + ((size_t)(g0 + n) * nb + b32) * QG_TOK);
        const __m512 sv = _mm512_loadu_ps(a->as + ((size_t)(g0 + n) * ns + s) * QG_TOK);
        for (int r = 0; r < QG_R; r++) {
            const size_t wi = (size_t)(r0 + r) * ns + s;
            const __m512 scale = _mm512_mul_ps(dv, _mm512_set1_ps(w->sw[wi]));
            facc[r][n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][n]), scale, facc[r][n]);
            if (w->has_min) facc[r][n] = _mm512_fmadd_ps(sv, _mm512_set1_ps(w->mn[wi]), facc[r][n]);
        }
    }
}

static inline __attribute__((always_inline)) void store_tile(__m512 facc[QG_R][4], int r0, int g0, float *out,
                                                             int rb, const int N) {
    for (int n = 0; n < N; n++)
        for (int r = 0; r < QG_R; r++) {
            float v[QG_TOK];
            _mm512_storeu_ps(v, facc[r][n]);
            for (int i = 0; i < QG_TOK; i++) out[(size_t)((g0 + n) * QG_TOK + i) * rb + r0 + r] = v[i];
        }
}

/* int8 activations: vpdpbusd, 4 values of 16 tokens a lane group, the +128 bias cancelled by wc. */
static inline __attribute__((always_inline)) void kern_vnni(const GRows *w, const GAct *a, int r0, int g0,
                                                            float *out, int rb, const int N) {
    const int k = w->k, sub = w->sub, ns = k / sub, kg = k / 4, nb = k / 32;
    __m512 facc[QG_R][4];
    for (int r = 0; r < QG_R; r++) for (int n = 0; n < N; n++) facc[r][n] = _mm512_setzero_ps();
    for (int s = 0; s < ns; s++) {
        __m512i ia[QG_R][4];
        for (int r = 0; r < QG_R; r++) {
            const __m512i c = _mm512_set1_epi32(w->wc[(size_t)(r0 + r) * ns + s]);
            for (int n = 0; n < N; n++) ia[r][n] = c;
        }
        const int kq0 = s * sub / 4;
        for (int j = 0; j < sub / 4; j++) {
            __m512i av[3];
            for (int n = 0; n < N; n++)
                av[n] = _mm512_loadu_si512((const void *)(a->aq + (((size_t)(g0 + n) * kg + kq0 + j) * QG_TOK) * 4));
            for (int r = 0; r < QG_R; r++) {
                int32_t wv;
                memcpy(&wv, w->q + (size_t)(r0 + r) * k + 4 * (kq0 + j), 4);
                const __m512i wb = _mm512_set1_epi32(wv);
                for (int n = 0; n < N; n++) ia[r][n] = _mm512_dpbusd_epi32(ia[r][n], av[n], wb);
            }
        }
        scale_block(w, a, r0, g0, s, ns, nb, s * sub / 32, N, ia, facc);
    }
    store_tile(facc, r0, g0, out, rb, N);
}

/* int16 activations: vpdpwssd, 2 values of 16 tokens a lane group, int16 weights; every loop has
   constant bounds (N groups, SUB values a scale block) so the accumulators stay in registers (the
   general kernel this replaces had GCC copying them between registers at every step: 51% of the
   instruction's peak). The integer sums and the float steps are the portable kernel's. */
static inline __attribute__((always_inline)) void kern16(const GRows *w, const GAct *a, int r0, int g0,
                                                         float *out, int rb, const int N, const int SUB) {
    const int k = w->k, ns = k / SUB, kp = k / 2, nb = k / 32;
    const int16_t *a16 = (const int16_t *)a->aq;
    const int16_t *wr0 = w->q16 + (size_t)r0 * k;
    __m512 facc[QG_R][4];
    for (int r = 0; r < QG_R; r++) for (int n = 0; n < N; n++) facc[r][n] = _mm512_setzero_ps();
    for (int s = 0; s < ns; s++) {
        __m512i acc[QG_R][4];
        for (int r = 0; r < QG_R; r++) for (int n = 0; n < N; n++) acc[r][n] = _mm512_setzero_si512();
        const int p0 = s * SUB / 2;
#pragma GCC unroll 16
        for (int j = 0; j < SUB / 2; j++) {
            __m512i av[4];
            for (int n = 0; n < N; n++)
                av[n] = _mm512_loadu_si512((const void *)(a16 + (((size_t)(g0 + n) * kp + p0 + j) * QG_TOK) * 2));
            for (int r = 0; r < QG_R; r++) {
                int32_t wv;
                memcpy(&wv, wr0 + (size_t)r * k + 2 * (p0 + j), 4);
                const __m512i wb = _mm512_set1_epi32(wv);
                for (int n = 0; n < N; n++) acc[r][n] = _mm512_dpwssd_epi32(acc[r][n], av[n], wb);
            }
        }
        scale_block(w, a, r0, g0, s, ns, nb, s * SUB / 32, N, acc, facc);
    }
    store_tile(facc, r0, g0, out, rb, N);
}

static void kern16_groups(const GRows *w, const GAct *a, int r, int g0, int g1, float *out, int rb) {
    int g = g0;
    if (w->sub == 32) {
        for (; g + 4 <= g1; g += 4) kern16(w, a, r, g, out, rb, 4, 32);
        if (g1 - g == 3) kern16(w, a, r, g, out, rb, 3, 32);
        else if (g1 - g == 2) kern16(w, a, r, g, out, rb, 2, 32);
        else if (g1 - g == 1) kern16(w, a, r, g, out, rb, 1, 32);
    } else {
        for (; g + 4 <= g1; g += 4) kern16(w, a, r, g, out, rb, 4, 16);
        if (g1 - g == 3) kern16(w, a, r, g, out, rb, 3, 16);
        else if (g1 - g == 2) kern16(w, a, r, g, out, rb, 2, 16);
        else if (g1 - g == 1) kern16(w, a, r, g, out, rb, 1, 16);
    }
}
#endif

/* Portable C (and any CPU without VNNI): the same sums in the same order. */
static __attribute__((unused)) void kern_c(const GRows *w, const GAct *a, int r0, int g0, float *out, int rb) {
    const int k = w->k, sub = w->sub, ns = k / sub, kg = k / 4, kp = k / 2, nb = k / 32;
    const int16_t *a16 = (const int16_t *)a->aq;
    for (int r = r0; r < r0 + QG_R; r++)
        for (int i = 0; i < QG_TOK; i++) {
            float acc = 0.f;
            for (int s = 0; s < ns; s++) {
                int32_t isum = a->bits == 16 ? 0 : w->wc[(size_t)r * ns + s];
                for (int j = s * sub; j < (s + 1) * sub; j++) {
                    if (a->bits == 16) isum += (int32_t)a16[(((size_t)g0 * kp + j / 2) * QG_TOK + i) * 2 + j % 2] * w->q[(size_t)r * k + j];
                    else isum += (int32_t)a->aq[(((size_t)g0 * kg + j / 4) * QG_TOK + i) * 4 + j % 4] * w->q[(size_t)r * k + j];
                }
                const float d = a->ad[((size_t)g0 * nb + s * sub / 32) * QG_TOK + i];
                acc = fmaf((float)isum, d * w->sw[(size_t)r * ns + s], acc);
                if (w->has_min) acc = fmaf(a->as[((size_t)g0 * ns + s) * QG_TOK + i], w->mn[(size_t)r * ns + s], acc);
            }
            out[(size_t)(g0 * QG_TOK + i) * rb + r] = acc;
        }
}

/* ---- one block: unpack its rows, run every token group ---------------------------------------- */
#define QG_RB_MAX 64     /* rows a block holds at most */
#define QG_GCHUNK 8      /* token groups a pass over the block's row tiles (144 tokens: <= 590 KB at k 2,048) */

/* 64-byte aligned: a tile's or a vector's row never straddles two cache lines (with malloc's
   16-byte alignment the AMX GEMM ran at 45 or 64 ms for the same work, by where its buffers fell) */
static void *alloc64(size_t n) {
    void *p = NULL;
    return posix_memalign(&p, 64, n ? n : 64) == 0 ? p : NULL;
}

static int scratch_alloc(GScratch *s, int k) {
    const size_t need = (size_t)QG_RB_MAX * k;
    s->q = alloc64(need);
    s->q16 = alloc64(2 * need);
    s->sw = malloc(sizeof(float) * need / 16);
    s->mn = malloc(sizeof(float) * need / 16);
    s->wc = malloc(sizeof(int32_t) * need / 16);
    s->out = alloc64(sizeof(float) * QG_TMAX * QG_RB_MAX);
    s->gq = alloc64((size_t)2 * QG_TOK * k);
    s->gd = alloc64(sizeof(float) * k);
    s->gs = alloc64(sizeof(float) * k);
    if (ascratch_alloc(&s->a) != 0) return -1;
    return s->q && s->q16 && s->sw && s->mn && s->wc && s->out && s->gq && s->gd && s->gs ? 0 : -1;
}

/* Token group b of the input into the shared buffers (computed apart, copied by the winner). */
static void quant_block(GCtx *c, const GPhase *p, int b, int tid, uint64_t s) {
    GScratch *sc = &c->scr[tid];
    const int k = p->k, nb = k / 32, ns = k / p->sub, t0 = b * QG_TOK;
    quantize_tokens(p->x + (size_t)t0 * k, p->t - t0 < QG_TOK ? p->t - t0 : QG_TOK, QG_TOK, k, p->sub, p->bits,
                    sc->gq, sc->gd, sc->gs);
    if (!pool_take(&c->pool, s, b)) return;
    const size_t bytes = (size_t)QG_TOK * k * (p->bits / 8);
    memcpy(c->aq + (size_t)b * bytes, sc->gq, bytes);
    memcpy(c->ad + (size_t)b * nb * QG_TOK, sc->gd, sizeof(float) * nb * QG_TOK);
    memcpy(c->as + (size_t)b * ns * QG_TOK, sc->gs, sizeof(float) * ns * QG_TOK);
    if (pool_published(&c->pool, s, b, p->nb)) {   /* the input is ready: open the GEMM */
        pool_open_begin(&c->pool, s);
        c->ph = c->next;
        pool_open_end(&c->pool, s);
    }
}

/* y[r] = act(y[r]) * u[r], r < n, each value through act_rows' vector path (its scalar tail
   would give other bits, and where a block ends depends on the thread count) */
static void glu_rows(int act, float *y, const float *u, int n) {
    const int whole = n / 8 * 8;
    act_rows(act, y, u, 0, whole);
    if (whole < n) {
        float ty[8] = {0}, tu[8] = {0};
        memcpy(ty, y + whole, sizeof(float) * (n - whole));
        memcpy(tu, u + whole, sizeof(float) * (n - whole));
        act_rows(act, ty, tu, 0, 8);
        memcpy(y + whole, ty, sizeof(float) * (n - whole));
    }
}

/* The phase's last block is published: close it (an idle phase has no blocks, so nobody claims
   the finished call's). */
static void phase_done(GCtx *c, uint64_t s) {
    pool_open_begin(&c->pool, s);
    c->ph.kind = 0;
    c->ph.nb = 0;
    pool_open_end(&c->pool, s);
}

#include "qgemm_bf16.c"   /* bits 0: the bf16 GEMM, on AMX tiles or AVX-512 BF16 */

/* noinline: inlined into gemm_block it cost the GEMM's blocks 12-15% (a Gemma GLU 17.0 -> 19.5 ms) */
static __attribute__((noinline)) void attn_block(GCtx *c, const GPhase *p, int b, int tid, uint64_t s) {
    const AttnJob *J = &p->at;
    AScratch *sc = &c->scr[tid].a;
    int nq;
    const int i0 = attn_compute(J, b, sc, &nq), h = b % J->hq;
    if (!pool_take(&c->pool, s, b)) return;
    for (int l = 0; l < nq; l++)
        memcpy(J->o + ((size_t)(i0 + l) * J->hq + h) * J->d, sc->ob + (size_t)l * J->d, sizeof(float) * J->d);
    if (pool_published(&c->pool, s, b, p->nb)) phase_done(c, s);
}

/* kind 4: rows [b * rb, ...) of w as bf16 into the thread's scratch, then out by whoever wins the
   block (a straggler of an old phase never writes into a buffer reused since). */
static __attribute__((noinline)) void bf16_block(GCtx *c, const GPhase *p, int b, int tid, uint64_t s) {
    const QW *w = &p->w;
    GScratch *sc = &c->scr[tid];
    const int r0 = b * p->rb, rows = r0 + p->rb <= w->rows ? p->rb : w->rows - r0;
    uint16_t *tmp = (uint16_t *)sc->out;
    for (int r = 0; r < rows; r++) weight_row_bf16(w, r0 + r, sc->gd, tmp + (size_t)r * w->cols);
    if (!pool_take(&c->pool, s, b)) return;
    memcpy(p->yb + (size_t)r0 * w->cols, tmp, sizeof(uint16_t) * (size_t)rows * w->cols);
    if (pool_published(&c->pool, s, b, p->nb)) phase_done(c, s);
}

static void publish_block(GCtx *c, const GPhase *p, int b, uint64_t s, const float *out, int rp);

static void gemm_block(GCtx *c, const GPhase *p, int b, int tid, uint64_t s) {
#ifdef QG_BF16
    if (p->kind == 2 && p->bits == 0) { bf16_input_block(c, p, b, tid, s); return; }
#endif
    if (p->kind == 2) { quant_block(c, p, b, tid, s); return; }
    if (p->kind == 4) { bf16_block(c, p, b, tid, s); return; }
    if (p->kind == 3) { attn_block(c, p, b, tid, s); return; }
    const QW *w = &p->w;
    const int r0 = b * p->rb, rows = (r0 + p->rb <= w->rows ? p->rb : w->rows - r0), rp = (rows + QG_R - 1) / QG_R * QG_R;
#ifdef QG_BF16
    if (p->bits == 0) {   /* whole 32-row steps */
        const int rp32 = (rows + 31) / 32 * 32;
        if (bf16_gemm_block(c, p, b, tid, s, rp32)) publish_block(c, p, b, s, c->scr[tid].out, rp32);
        return;
    }
#endif
    const int sub = qg_sub(w), ns = w->cols / sub;
    GScratch *sc = &c->scr[tid];
    for (int r = 0; r < rp; r++) {
        if (r < rows) unpack_row(w, r0 + r, sc->q + (size_t)r * w->cols, sc->sw + (size_t)r * ns, sc->mn + (size_t)r * ns,
                                 p->bits == 8 ? sc->wc + (size_t)r * ns : NULL);
        else {
            memset(sc->q + (size_t)r * w->cols, 0, (size_t)w->cols);
            for (int j = 0; j < ns; j++) { sc->sw[(size_t)r * ns + j] = 0.f; sc->mn[(size_t)r * ns + j] = 0.f; sc->wc[(size_t)r * ns + j] = 0; }
        }
    }
    int has_min = 0;
    for (size_t j = 0; j < (size_t)rp * ns && !has_min; j++) has_min = sc->mn[j] != 0.f;
#ifdef QG_VNNI
    if (p->bits == 16)   /* vpdpwssd multiplies int16 by int16: widen the block's weights once */
        for (size_t j = 0; j < (size_t)rp * w->cols; j++) sc->q16[j] = sc->q[j];
#endif
    GRows wr = {sc->q, sc->q16, sc->sw, sc->mn, sc->wc, w->cols, sub, has_min};
    GAct a = {c->aq, c->ad, c->as, w->cols, p->bits};
    const int ng = p->tp / QG_TOK;
    /* token groups in chunks whose activations stay in L2 while every row tile passes over them */
    for (int g0 = 0; g0 < ng; g0 += QG_GCHUNK) {
        const int g1 = g0 + QG_GCHUNK < ng ? g0 + QG_GCHUNK : ng;
        for (int r = 0; r < rp; r += QG_R) {
            if (!pool_unpublished(&c->pool, s, b)) return;   /* a rescued block someone already published */
#ifdef QG_VNNI
            if (p->bits == 16) { kern16_groups(&wr, &a, r, g0, g1, sc->out, rp); continue; }
            int g = g0;
            for (; g + 3 <= g1; g += 3) kern_vnni(&wr, &a, r, g, sc->out, rp, 3);
            if (g1 - g == 2) kern_vnni(&wr, &a, r, g, sc->out, rp, 2);
            else if (g1 - g == 1) kern_vnni(&wr, &a, r, g, sc->out, rp, 1);
#else
            for (int g = g0; g < g1; g++) kern_c(&wr, &a, r, g, sc->out, rp);
#endif
        }
    }
    publish_block(c, p, b, s, sc->out, rp);
}

/* The block's out[t][rp] into y's rows [r0, r0 + rows) by whoever wins it (a GLU's up phase
   forms act(gate) * up there, the gate's rows already in y) */
static void publish_block(GCtx *c, const GPhase *p, int b, uint64_t s, const float *out, int rp) {
    const QW *w = &p->w;
    const int r0 = b * p->rb, rows = (r0 + p->rb <= w->rows ? p->rb : w->rows - r0);
    if (!pool_take(&c->pool, s, b)) return;
    for (int t = 0; t < p->t; t++) {
        float *dst = p->y + (size_t)t * w->rows + r0;
        const float *src = out + (size_t)t * rp;
        if (p->glu && p->bits == 0) glu_rows_fast(p->glu - 1, dst, src, rows);
        else if (p->glu) glu_rows(p->glu - 1, dst, src, rows);   /* the gate's rows, now act(gate) * up */
        else if (w->bias) for (int r = 0; r < rows; r++) dst[r] = src[r] + w->bias[r0 + r];
        else memcpy(dst, src, sizeof(float) * rows);
    }
    if (pool_published(&c->pool, s, b, p->nb)) phase_done(c, s);
}

static void gemm_work(GCtx *c, int tid, uint64_t until) {
    Pool *P = &c->pool;
    GPhase p;
    for (;;) {
        uint64_t s = pool_read(P, &c->ph, &p, sizeof p);
        if (atomic_load_explicit(&P->quit, memory_order_relaxed)) return;
        if (p.kind == 0 && until && p.call >= until) return;
        int b;
        while ((b = pool_claim(P, s, p.nb)) >= 0) gemm_block(c, &p, b, tid, s);
        if (p.kind != 0 && !pool_spin(P, s, RESCUE_US))
            for (b = 0; b < p.nb && atomic_load_explicit(&P->seq, memory_order_acquire) == s; b++)
                if (pool_unpublished(P, s, b)) gemm_block(c, &p, b, tid, s);
        if (!pool_spin(P, s, SPIN_US)) pool_sleep(P, s);
    }
}

typedef struct { GCtx *c; int tid; } GArg;

static void *gemm_worker(void *arg) {
    GArg g = *(GArg *)arg;
    free(arg);
    gemm_work(g.c, g.tid, 0);
    return NULL;
}

void qg_free(void *p);

/* A context for weights of up to k_max columns, on n_threads (the caller's included). */
void *qg_new(int n_threads, int k_max) {
    GCtx *c = calloc(1, sizeof(GCtx));
    if (!c) return NULL;
    c->nt = n_threads > 0 ? n_threads : 1;
    c->k_max = k_max = (k_max + 31) / 32 * 32;
    c->scr = calloc((size_t)c->nt, sizeof(GScratch));
    c->workers = calloc((size_t)c->nt, sizeof(pthread_t));
    c->aq = alloc64((size_t)2 * QG_TMAX * k_max);
    c->ad = malloc(sizeof(float) * QG_TMAX * (k_max / 16));
    c->as = malloc(sizeof(float) * QG_TMAX * (k_max / 16));
    int bad = !c->scr || !c->workers || !c->aq || !c->ad || !c->as;
    for (int t = 0; t < c->nt && !bad; t++) bad = scratch_alloc(&c->scr[t], k_max) != 0;
    if (bad || pool_init(&c->pool, QG_MAX_BLOCKS) != 0) { c->nt = 1; qg_free(c); return NULL; }
    for (int t = 1; t < c->nt; t++) {   /* fewer threads if the OS gives fewer: the work is shared out anyway */
        GArg *a = malloc(sizeof *a);
        if (a) *a = (GArg){c, t};
        if (!a || pthread_create(&c->workers[t], NULL, gemm_worker, a) != 0) { free(a); c->nt = t; break; }
    }
    return c;
}

void qg_free(void *p) {
    GCtx *c = p;
    if (!c) return;
    if (c->pool.st) {
        pool_quit(&c->pool);
        for (int t = 1; t < c->nt; t++) pthread_join(c->workers[t], NULL);
        pool_destroy(&c->pool);
    }
    for (int t = 0; c->scr && t < c->nt; t++) {
        GScratch *s = &c->scr[t];
        free(s->q); free(s->q16); free(s->sw); free(s->mn); free(s->wc); free(s->out);
        free(s->gq); free(s->gd); free(s->gs);
        ascratch_free(&s->a);
    }
    free(c->aq); free(c->ad); free(c->as); free(c->scr); free(c->workers); free(c);
}

/* y (t x w->rows) = x (t x w->cols) W^T (+ bias), the activations rounded to `bits` (16: as the
   decode step rounds them; 8: llama.cpp's choice). `fresh` 0: x is the input of the previous call
   (same values), already quantized (ignored when t or SUB differ). Returns 0, or -1 (the caller falls back). */
static int gemm_call(GCtx *c, const QW *w, const float *x, int t, float *y, int fresh, int bits, int glu);

int qg_gemm(void *p, const QW *w, const float *x, int t, float *y, int fresh, int bits) {
    return gemm_call(p, w, x, t, y, fresh, bits, 0);
}

/* y (t x rows) = act(x Wg^T) * (x Wu^T): a gated MLP's first half in two phases, the product
   formed as each up block is published (the gate's output is complete by then), so the MLP's
   hidden activations are written once and never pass through PyTorch. act: ACT_SILU or
   ACT_GELU_TANH (the decode step's act_rows). Returns 0, or -1 (the caller runs them apart). */
int qg_gemm_glu(void *p, const QW *wg, const QW *wu, const float *x, int t, float *y, int fresh, int bits, int act) {
    if (wg->rows != wu->rows || wg->cols != wu->cols || wg->bias || wu->bias || (act != ACT_SILU && act != ACT_GELU_TANH)
        || !qg_supports(wg) || !qg_supports(wu))
        return -1;
    if (gemm_call(p, wg, x, t, y, fresh, bits, 0) != 0) return -1;
    return gemm_call(p, wu, x, t, y, 0, bits, 1 + act);
}

static int gemm_call(GCtx *c, const QW *w, const float *x, int t, float *y, int fresh, int bits, int glu) {
    if (!c || !qg_supports(w) || t < 1 || w->cols > c->k_max || (bits != 8 && bits != 16 && bits != 0)) return -1;
    if (bits == 0 && (!qg_bf16() || w->cols % 32)) return -1;
    const int sub = qg_sub(w), tile = bits == 0 ? 32 : QG_R;
    /* rows a block: about 8 blocks a thread, whole kernel tiles, at most QG_RB_MAX */
    int rb = (w->rows + 8 * c->nt - 1) / (8 * c->nt);
    rb = (rb + tile - 1) / tile * tile;
    if (rb > QG_RB_MAX) rb = QG_RB_MAX;
    if ((w->rows + rb - 1) / rb > QG_MAX_BLOCKS) return -1;
    if (sub != c->last_sub || t != c->last_t || bits != c->last_bits || t > QG_TMAX) fresh = 1;
    c->last_sub = sub;
    c->last_t = t;
    c->last_bits = bits;
    for (int t0 = 0; t0 < t; t0 += QG_TMAX) {
        const int step = bits == 0 && amx_ready() ? 2 * QG_TOK : QG_TOK;   /* the tiles: 32 tokens a step */
        const int tn = t - t0 < QG_TMAX ? t - t0 : QG_TMAX, tp = (tn + step - 1) / step * step;
        GPhase ph = {*w, y + (size_t)t0 * w->rows, (w->rows + rb - 1) / rb, rb, tn, tp, 1, bits, NULL, w->cols, sub,
                     glu, ++c->call};
        uint64_t s = atomic_load(&c->pool.seq);
        pool_open_begin(&c->pool, s);
        if (fresh) {   /* first a phase that quantizes the input, one token group a block */
            c->next = ph;
            c->ph = ph;
            c->ph.kind = 2;
            c->ph.nb = tp / QG_TOK;
            c->ph.x = x + (size_t)t0 * w->cols;
        } else c->ph = ph;
        pool_open_end(&c->pool, s);
        gemm_work(c, 0, c->call);
    }
    return 0;
}

/* Open `ph` as this context's next call and work it with the pool until it is done. */
static void run_phase(GCtx *c, GPhase ph) {
    ph.call = ++c->call;
    uint64_t s = atomic_load(&c->pool.seq);
    pool_open_begin(&c->pool, s);
    c->ph = ph;
    pool_open_end(&c->pool, s);
    gemm_work(c, 0, c->call);
}

/* o (t x hq x d) = causal softmax(q k^T * scale) v for the t queries at positions pos.. over the
   fp16 cache rows [0, pos + t) (already written), each query seeing keys [q - wl, q] (wl -1: all):
   a layer's prefill attention; bf16 1: the products in bf16 (prefill_attn.c). Returns 0, or -1 (the caller
   runs PyTorch's). */
int qg_attention(void *p, const float *q, const uint16_t *kc, const uint16_t *vc, int t, int pos, int hq, int hk,
                 int d, int wl, float scale, float *o, int bf16) {
    GCtx *c = p;
    AttnJob J = {q, o, kc, vc, t, pos, hq, hk, d, wl, scale, bf16};
    if (!c || !attn_supports(&J)) return -1;
    GPhase ph = {0};
    ph.kind = 3;
    ph.nb = attn_blocks(&J);
    ph.at = J;
    run_phase(c, ph);
    return 0;
}

/* w's values as bf16 (the exact dequantization, rounded to nearest even) into out, on this pool:
   blocks of rows claimed dynamically, waits that spin briefly and then sleep (OpenMP's sleeping
   workers cost a wake per matrix). Returns 0, or -1 (the caller keeps the int16 GEMM). */
int qg_dequant_bf16(void *p, const QW *w, uint16_t *out) {
    GCtx *c = p;
    const size_t room = sizeof(float) * QG_TMAX * QG_RB_MAX / sizeof(uint16_t);   /* a scratch's bf16 values */
    if (!c || w->cols > c->k_max || (size_t)w->cols > room) return -1;
    GPhase ph = {0};
    ph.kind = 4;
    ph.w = *w;
    ph.yb = out;
    ph.rb = (int)(room / (size_t)w->cols);
    if (ph.rb > 64) ph.rb = 64;   /* several blocks a thread, so a late one is small */
    ph.nb = (w->rows + ph.rb - 1) / ph.rb;
    if (ph.nb > QG_MAX_BLOCKS) return -1;
    run_phase(c, ph);
    return 0;
}

int qg_simd(void) {   /* 0: portable C, 2: AVX-512 VNNI */
#ifdef QG_VNNI
    return 2;
#else
    return 0;
#endif
}
