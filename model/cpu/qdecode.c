/* Batch-1 decode of a Llama-shaped model on the CPU, over weights in our block formats.
 *
 * One call runs a whole token: embedding, every layer, the head. Python's per-op overhead
 * (about 17 ms a token in the eager step) is what made the CPU path slow, not the matmuls,
 * so the step lives here, run by a pool of our own threads that share each phase's blocks out
 * dynamically (pool.c, decode_step.c, docs/cpu-threads.md).
 *
 * Weight formats (docs/weight-formats.md): dense f32/f16/bf16 rows, or blocks along a row of
 *   Q8: int8 values, one scale per sub-block of 16 or 32 (and optionally a min), value = s*q + m
 *   Q4: 4-bit unsigned values, 16 bytes per 32 (low nibbles 0..15, high 16..31), s*q + m
 * Activations are quantized to int16 per 32, so a block's dot product is one integer
 * multiply-add chain scaled once.
 *
 * The KV cache is the persistent FA3-layout cache (n_layers, 1, T, Hk, D) in fp16; this step
 * writes the new token's K/V at `pos` and attends over [start, pos] (start > 0 for windows).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define QD_AVX2 1
#endif
/* Software prefetch of a weight stream, every line of both rows a GEMV walks: L2 (T1) PF_FAR
   bytes ahead, L1 (T0) PF_NEAR ahead. One thread's demand misses alone left the GEMVs at 6-11 GB/s
   from DRAM against 20-25 for torch.sum; prefetching only row 0 of each pair (as before) left half
   the lines to the hardware. Measured (docs/benchmarks.md, issue 24 decode): the Q8 heads of SmolLM2
   and Gemma 3 11 -> 25 GB/s a thread, Q6_K 8.5 -> 12, Q4_K 11 -> 12. */
#ifndef PF_FAR
#define PF_FAR 8192
#endif
#ifndef KPF_BYTES   /* attention: the K/V rows this many bytes ahead into L2 (0: none) */
#define KPF_BYTES 32768
#endif
#ifndef PF_NEAR
#define PF_NEAR 1024
#endif
#define PF2(p) do { if (PF_FAR) _mm_prefetch((const char *)(p) + PF_FAR, _MM_HINT_T1); \
                    if (PF_NEAR) _mm_prefetch((const char *)(p) + PF_NEAR, _MM_HINT_T0); } while (0)

enum { K_F32 = 0, K_F16 = 1, K_BF16 = 2, K_Q8 = 3, K_Q4 = 4 };   /* 5 and up: qformats.h */
enum { S_F16 = 0, S_F32 = 1 };
enum { ACT_SILU = 0, ACT_GELU_TANH = 1 };

typedef struct {
    int32_t kind, sdt, rows, cols, sub;   /* sub: values per scale (16 or 32) */
    int32_t pad;
    const void *q, *scale, *min;          /* min may be NULL */
    const float *bias;                    /* per row, may be NULL */
} QW;

typedef struct {
    QW wq, wk, wv, wo, wg, wu, wd;
    const float *attn_norm, *ffn_norm, *post_attn_norm, *post_ffn_norm, *q_norm, *k_norm;
    const float *cos, *sin;               /* (capacity, D/2) */
    int32_t window, pad;                  /* keys [pos - window, pos]; -1: all */
} Layer;

typedef struct {
    int32_t n_layers, dim, n_head, n_kv, head_dim, hidden, vocab, cap, act, n_threads;
    float eps, emb_scale, attn_scale, final_softcap;
    QW embed, lm_head;
    const float *final_norm;
    const Layer *layers;
} Model;

/* ---- scalar conversions ------------------------------------------------------------- */
static inline float h2f(uint16_t h) {
#ifdef QD_AVX2
    return _cvtsh_ss(h);
#else
    uint32_t s = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, bits;
    if (e == 0) {
        if (m == 0) bits = s;
        else { e = 127 - 15 + 1; while (!(m & 0x400)) { m <<= 1; e--; } bits = s | (e << 23) | ((m & 0x3ff) << 13); }
    } else if (e == 31) bits = s | 0x7f800000 | (m << 13);
    else bits = s | ((e + 112) << 23) | (m << 13);
    float f; memcpy(&f, &bits, 4); return f;
#endif
}

static inline uint16_t f2h(float f) {
#ifdef QD_AVX2
    return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else   /* round to nearest even, as torch's .half() */
    uint32_t x; memcpy(&x, &f, 4);
    uint32_t s = (x >> 16) & 0x8000, e = (x >> 23) & 0xff, m = x & 0x7fffff;
    if (e == 255) return (uint16_t)(s | 0x7c00 | (m ? 0x200 : 0));
    int32_t ee = (int32_t)e - 127 + 15;
    if (ee >= 31) return (uint16_t)(s | 0x7c00);
    if (ee <= 0) {
        if (ee < -10) return (uint16_t)s;
        m |= 0x800000; int shift = 14 - ee; uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(s | r);
    }
    uint32_t r = ((uint32_t)ee << 10) | (m >> 13), rem = m & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) r++;
    return (uint16_t)(s | r);
#endif
}

static inline float bf2f(uint16_t h) { uint32_t b = (uint32_t)h << 16; float f; memcpy(&f, &b, 4); return f; }

static inline float ld_s(const void *p, int sdt, size_t i) {
    return sdt == S_F32 ? ((const float *)p)[i] : h2f(((const uint16_t *)p)[i]);
}

/* ---- activations quantized to int16 per 32 ---------------------------------------------- */
/* int16, not llama.cpp's int8: with int8 the head's logits moved by 0.25 on the default model
   (its last hidden state has outlier channels) and greedy picks flipped; int16 costs one more
   widening per 16 weights and leaves the activations' error at 1/32639 of each block's max.
   32639 = 127 * 257, not 32767: every q then splits exactly into two signed bytes (split_act). */
#define QMAX 32639.f
typedef struct {
    const float *x; int16_t *q; float *d, *s; int n;
    /* VNNI builds: q = 256 * q1 + q2 exactly, both int8, and q's sum over each 4 values */
    int8_t *q1, *q2; int32_t *q4;
    /* The K-quant rows' activations (k8 != NULL, n a multiple of 256): int8 with one scale kd per
       256 (quantize_k8), the sums of each 16 (kb, in the order qktree.h's tree leaves its lanes)
       and kd times each 32's sum (ks, for the mins). */
    int8_t *k8; float *kd, *ks; int32_t *kb;
    int use8;   /* quantize_k8 found the int8 rounding close enough (K8_MAX_ERR): the K-quant rows take it */
} Act;

/* u8 x s8 products summed 4 at a time into int32 lanes (AVX-512 VNNI with VL, or AVX-VNNI). The
   file-format GEMVs run them on the two bytes of each int16 activation: two instructions per 32
   values, as two int16 multiply-adds are, but the weights' bytes need no widening to int16
   first, and every integer sum is the int16 kernels' own. */
#if defined(__AVX2__) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define QD_VNNI8 1
#define DPBUSD(acc, u, s) _mm256_dpbusd_epi32(acc, u, s)
#elif defined(__AVX2__) && defined(__AVXVNNI__)
#define QD_VNNI8 1
#define DPBUSD(acc, u, s) _mm256_dpbusd_avx_epi32(acc, u, s)
#endif

/* q1 = round(q / 256) (|q| <= 32639 keeps it in -128..127), q2 = q - 256 * q1 (-128..127) */
static void split_act(Act *a) {
#ifdef QD_VNNI8
    for (int j = 0; j < a->n; j++) {
        const int v = a->q[j], h = (v + 128) >> 8;
        a->q1[j] = (int8_t)h;
        a->q2[j] = (int8_t)(v - 256 * h);
    }
    for (int j = 0; j < a->n / 4; j++)
        a->q4[j] = (int32_t)a->q[4 * j] + a->q[4 * j + 1] + a->q[4 * j + 2] + a->q[4 * j + 3];
#else
    (void)a;
#endif
}

#ifdef QD_AVX2
static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 32 floats into x[0..3], and their largest magnitude: the numerator of an int8 or int16 block's
   scale (quantize_act here, and qgemm.c's quant32 and quant32_16). */
static inline float load32_amax(const float *p, __m256 x[4]) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 mx = _mm256_setzero_ps();
    for (int k = 0; k < 4; k++) { x[k] = _mm256_loadu_ps(p + 8 * k); mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, x[k])); }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    return _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
}
#endif

/* int8 for the K-quant rows (Q4_K, Q5_K, Q6_K): one multiply-add per 32 values a row where the
   int16 activations need two (one per byte plane). One scale per K8_GROUP values (32; 256 is
   llama.cpp's Q8_K), stored per 32 either way: 1/127 of the group's largest magnitude, against
   1/32639 for the int16 ones. q = rint(x * (1 / d)). The error this costs is measured in
   docs/notes.md ("CPU decode, fifth push"). */
#ifndef K8_GROUP
#define K8_GROUP 32
#endif
#define Q8MAX 127.f
/* The int8 rounding's relative error (|x - q d| / |x|) above which a vector keeps the int16 path:
   0.53% is the floor for Gaussian values at one scale per 32; the real models' MLP hidden states
   (the down projections' input, with outlier channels) measured 0.9-1.3%, and int8 there cost
   greedy agreement (docs/notes.md). */
#ifndef K8_MAX_ERR
#define K8_MAX_ERR 0.007f
#endif
static inline int kb_slot(int p) { return (p >> 3) * 8 + (p & 1) * 4 + ((p >> 1) & 3); }   /* p: the 16-group */

static void quantize_k8(Act *a) {
    float err = 0.f, norm = 0.f;   /* |x - q d|^2 and |x|^2 over the vector */
    for (int i = 0; i < a->n / 256; i++) {
        const float *x = a->x + 256 * i;
        float amax[8];
        int sum[16];
#ifdef QD_AVX2
        __m256 v[8][4];
        for (int k = 0; k < 8; k++) amax[k] = load32_amax(x + 32 * k, v[k]);
#else
        for (int k = 0; k < 8; k++) {
            amax[k] = 0.f;
            for (int j = 32 * k; j < 32 * k + 32; j++) amax[k] = fmaxf(amax[k], fabsf(x[j]));
        }
#endif
        for (int k0 = 0; k0 < 8; k0 += K8_GROUP / 32) {   /* a group's scale: its largest magnitude */
            float m = 0.f;
            for (int k = k0; k < k0 + K8_GROUP / 32; k++) m = fmaxf(m, amax[k]);
            for (int k = k0; k < k0 + K8_GROUP / 32; k++) amax[k] = m;
        }
        for (int k = 0; k < 8; k++) {
            const float d = amax[k] / Q8MAX, id = d > 0.f ? 1.f / d : 0.f;
            int8_t *q8 = a->k8 + 256 * i + 32 * k;
#ifdef QD_AVX2
            __m256i q[4];
            __m256 e8 = _mm256_setzero_ps(), n8 = e8;
            for (int j = 0; j < 4; j++) {
                q[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k][j], _mm256_set1_ps(id)));
                const __m256 r = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(q[j]), _mm256_set1_ps(d), v[k][j]);
                e8 = _mm256_fmadd_ps(r, r, e8);
                n8 = _mm256_fmadd_ps(v[k][j], v[k][j], n8);
            }
            err += hsum(e8);
            norm += hsum(n8);
            /* packs works within 128-bit lanes: dwords [q0a q1a q2a q3a q0b q1b q2b q3b] back to order */
            const __m256i b8 = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
            _mm256_storeu_si256((__m256i *)q8, _mm256_permutevar8x32_epi32(b8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
            for (int h = 0; h < 2; h++) {
                const __m256i t = _mm256_add_epi32(q[2 * h], q[2 * h + 1]);
                __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
                s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
                sum[2 * k + h] = _mm_cvtsi128_si32(_mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1)));
            }
#else
            for (int h = 0; h < 2; h++) {
                sum[2 * k + h] = 0;
                for (int j = 16 * h; j < 16 * h + 16; j++) {
                    const float xj = x[32 * k + j];
                    q8[j] = (int8_t)lrintf(xj * id);
                    sum[2 * k + h] += q8[j];
                    err += (xj - q8[j] * d) * (xj - q8[j] * d);
                    norm += xj * xj;
                }
            }
#endif
            a->kd[8 * i + k] = d;
            a->ks[8 * i + k] = d * (float)(sum[2 * k] + sum[2 * k + 1]);
        }
        for (int p = 0; p < 16; p++) a->kb[16 * i + kb_slot(p)] = sum[p];
    }
    a->use8 = err <= K8_MAX_ERR * K8_MAX_ERR * norm;
}

/* What a phase's weights read of the quantized input: the int8 activations (A_K8), the int16 ones
   (A_16) for the other block formats, and the int16's byte planes (A_SPLIT) for the VNNI byte
   kernels, which also serve a K-quant row when its input stays int16. Work a phase does not need
   is skipped: the byte split alone was ~2% of a SmolLM2 token, whose rows never read it. */
enum { A_K8 = 1, A_16 = 2, A_SPLIT = 4, A_ALL = 7 };

static void quantize_act(Act *a, int need) {
    a->use8 = 0;
    if ((need & A_K8) && a->k8 && a->n % 256 == 0) quantize_k8(a);
    if (!(need & A_16) && a->use8) return;
    for (int b = 0; b < a->n / 32; b++) {
        const float *x = a->x + 32 * b;
#ifdef QD_AVX2
        __m256 v[4];
        float amax = load32_amax(x, v);
        float d = amax / QMAX, id = d > 0.f ? 1.f / d : 0.f;
        __m256i sum = _mm256_setzero_si256();
        __m256i q[4];
        for (int k = 0; k < 4; k++) {   /* cvtps rounds to nearest even, as lrintf does */
            q[k] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], _mm256_set1_ps(id)));
            sum = _mm256_add_epi32(sum, q[k]);
        }
        /* packs works within 128-bit lanes: permute back to element order */
        __m256i p01 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[0], q[1]), 0xd8);
        __m256i p23 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[2], q[3]), 0xd8);
        _mm256_storeu_si256((__m256i *)(a->q + 32 * b), p01);
        _mm256_storeu_si256((__m256i *)(a->q + 32 * b + 16), p23);
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        a->d[b] = d;
        a->s[b] = d * (float)_mm_cvtsi128_si32(s4);
#else
        float amax = 0.f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / QMAX, id = d > 0.f ? 1.f / d : 0.f;
        int sum = 0;
        for (int j = 0; j < 32; j++) { int v = (int)lrintf(x[j] * id); a->q[32 * b + j] = (int16_t)v; sum += v; }
        a->d[b] = d;
        a->s[b] = d * (float)sum;
#endif
    }
    if (need & A_SPLIT) split_act(a);
}

/* ---- one row's dot product ---------------------------------------------------------------- */
#ifdef QD_AVX2
/* a0 . x0 + a1 . x1 in int32 pairs: two madds and an add, or two VNNI multiply-accumulates
   where the CPU has them (AVX-512 VNNI with VL, or AVX-VNNI): one instruction fewer per 16
   values, and the GEMVs are instruction-bound on one thread */
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define DOT2(a0, x0, a1, x1) _mm256_dpwssd_epi32(_mm256_dpwssd_epi32(_mm256_setzero_si256(), a0, x0), a1, x1)
#elif defined(__AVXVNNI__)
#define DOT2(a0, x0, a1, x1) _mm256_dpwssd_avx_epi32(_mm256_dpwssd_avx_epi32(_mm256_setzero_si256(), a0, x0), a1, x1)
#else
#define DOT2(a0, x0, a1, x1) _mm256_add_epi32(_mm256_madd_epi16(a0, x0), _mm256_madd_epi16(a1, x1))
#endif
#endif

static float dot_dense(const QW *w, int r, const float *x) {
    const int n = w->cols;
    size_t o = (size_t)r * n;
    int j = 0;
    float acc = 0.f;
#ifdef QD_AVX2
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    if (w->kind == K_F32) {
        const float *p = (const float *)w->q + o;
        for (; j + 16 <= n; j += 16) {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(p + j), _mm256_loadu_ps(x + j), a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(p + j + 8), _mm256_loadu_ps(x + j + 8), a1);
        }
    } else if (w->kind == K_F16) {
        const uint16_t *p = (const uint16_t *)w->q + o;
        for (; j + 16 <= n; j += 16) {
            a0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + j))), _mm256_loadu_ps(x + j), a0);
            a1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + j + 8))),
                                 _mm256_loadu_ps(x + j + 8), a1);
        }
    } else {
        const uint16_t *p = (const uint16_t *)w->q + o;
        for (; j + 8 <= n; j += 8) {
            __m256i b = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p + j))), 16);
            a0 = _mm256_fmadd_ps(_mm256_castsi256_ps(b), _mm256_loadu_ps(x + j), a0);
        }
    }
    acc = hsum(_mm256_add_ps(a0, a1));
#endif
    for (; j < n; j++) {
        float v = w->kind == K_F32 ? ((const float *)w->q)[o + j]
                : w->kind == K_F16 ? h2f(((const uint16_t *)w->q)[o + j]) : bf2f(((const uint16_t *)w->q)[o + j]);
        acc += v * x[j];
    }
    return acc;
}

#include "qformats.h"   /* the GGUF formats read as the file stores them (K_Q5_0 and after) */
#include "qktree.h"     /* Q4_K, Q5_K, Q6_K: one scale multiply per 16 sums */

static float dot_blocks(const QW *w, int r, const Act *a) {
    if (w->kind >= K_FILE_FIRST) return dot_file(w, r, a);
    const int nb = w->cols / 32, per = 32 / w->sub;   /* scales per 32-block: 1 or 2 */
    const size_t sb = (size_t)r * nb * per;
    float acc = 0.f, macc = 0.f;
    if (w->min)
        for (int b = 0; b < nb * per; b++) macc += ld_s(w->min, w->sdt, sb + b) * a->s[b / per] / per;
#ifdef QD_AVX2
    __m256 v = _mm256_setzero_ps();
    if (w->kind == K_Q4) {
        const uint8_t *q = (const uint8_t *)w->q + (size_t)r * nb * 16;
        const __m128i m4 = _mm_set1_epi8(0x0f);
        for (int b = 0; b < nb; b++) {
            __m128i raw = _mm_loadu_si128((const __m128i *)(q + 16 * b));
            __m256i lo = _mm256_cvtepu8_epi16(_mm_and_si128(raw, m4));                     /* values 0..15 */
            __m256i hi = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), m4));  /* values 16..31 */
            const __m256i *xq = (const __m256i *)(a->q + 32 * b);
            __m256i p = _mm256_add_epi32(_mm256_madd_epi16(lo, _mm256_loadu_si256(xq)),
                                         _mm256_madd_epi16(hi, _mm256_loadu_si256(xq + 1)));
            __m256 s = _mm256_set1_ps(ld_s(w->scale, w->sdt, sb + b) * a->d[b]);
            v = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(p), v);
        }
    } else {
        const int8_t *q = (const int8_t *)w->q + (size_t)r * w->cols;
        for (int b = 0; b < nb; b++) {
            __m256i raw = _mm256_loadu_si256((const __m256i *)(q + 32 * b));
            const __m256i *xq = (const __m256i *)(a->q + 32 * b);
            __m256i p0 = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(raw)), _mm256_loadu_si256(xq));
            __m256i p1 = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(raw, 1)),
                                           _mm256_loadu_si256(xq + 1));
            if (per == 1) {
                __m256 s = _mm256_set1_ps(ld_s(w->scale, w->sdt, sb + b) * a->d[b]);
                v = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(_mm256_add_epi32(p0, p1)), v);
            } else {   /* a scale per 16 values (Q6_K) */
                v = _mm256_fmadd_ps(_mm256_set1_ps(ld_s(w->scale, w->sdt, sb + 2 * b) * a->d[b]), _mm256_cvtepi32_ps(p0), v);
                v = _mm256_fmadd_ps(_mm256_set1_ps(ld_s(w->scale, w->sdt, sb + 2 * b + 1) * a->d[b]), _mm256_cvtepi32_ps(p1), v);
            }
        }
    }
    acc = hsum(v);
#else
    for (int b = 0; b < nb * per; b++) {
        int sum = 0, j0 = b * w->sub;
        for (int j = j0; j < j0 + w->sub; j++) {
            int wv = w->kind == K_Q4 ? (((const uint8_t *)w->q)[(size_t)r * nb * 16 + (j / 32) * 16 + (j % 16)]
                                        >> ((j % 32) >= 16 ? 4 : 0)) & 15
                                     : ((const int8_t *)w->q)[(size_t)r * w->cols + j];
            sum += wv * a->q[j];
        }
        acc += ld_s(w->scale, w->sdt, sb + b) * a->d[b / per] * (float)sum;
    }
#endif
    return acc + macc;
}

#ifdef QD_AVX2
/* Up to 8 (m) fp32 values of a scale or min row (fp16 or fp32) from index `at`, 0 past m. */
static inline __m256 scale8(const void *p, int sdt, size_t at, int m) {
    if (m == 8)
        return sdt == S_F32 ? _mm256_loadu_ps((const float *)p + at)
                            : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + at)));
#ifdef __AVX512VL__
    const __mmask8 k = (__mmask8)((1u << m) - 1);
    return sdt == S_F32 ? _mm256_maskz_loadu_ps(k, (const float *)p + at)
                        : _mm256_cvtph_ps(_mm_maskz_loadu_epi16(k, (const uint16_t *)p + at));
#else
    float t[8] = {0};
    for (int j = 0; j < m; j++) t[j] = ld_s(p, sdt, at + j);
    return _mm256_loadu_ps(t);
#endif
}

static inline __m256 act8(const float *p, int m) {   /* up to 8 of the activations' numbers, 0 past m */
    if (m == 8) return _mm256_loadu_ps(p);
#ifdef __AVX512VL__
    return _mm256_maskz_loadu_ps((__mmask8)((1u << m) - 1), p);
#else
    float t[8] = {0};
    memcpy(t, p, sizeof(float) * m);
    return _mm256_loadu_ps(t);
#endif
}

/* Without AVX-512 VL a tail of fewer than 8 blocks (SmolLM2's 576 columns: 18) had its scales
   and activations built as vectors through memory, scalar stores then a vector load, which the
   CPU cannot forward: on a Zen 1 (AVX2 only) the 576-column Q4 rows ran 4.3 GB/s a thread
   against 6.0 for the 1,536-column ones with no tail. Such a tail is scalars now. */
#ifdef __AVX512VL__
#define ROWS2_MASKED_TAIL 1
#else
#define ROWS2_MASKED_TAIL 0
#endif

/* Two rows of a 32-value-scale block matrix at once: the activation loads are shared. Per 8
   blocks, both rows' scales times the activations' are formed as one vector each and the mins'
   term (min * the block's activation sum) is accumulated by one FMA; the scales, the mins and
   their sum were three passes over arrays before the blocks' loop, a third of the time of a
   576-column row (SmolLM2's). */
static void rows2(const QW *w, int r, const Act *a, float *out) {
    const int nb = w->cols / 32;
    const size_t s0 = (size_t)r * nb, s1 = s0 + nb;
    __m256 v0 = _mm256_setzero_ps(), v1 = v0, mv0 = v0, mv1 = v0;
    float sd[2][8], mt0 = 0.f, mt1 = 0.f;
    const __m256i m16 = _mm256_set1_epi16(0x0f);
    const uint8_t *q40 = (const uint8_t *)w->q + (size_t)r * nb * 16, *q41 = q40 + (size_t)nb * 16;
    const int8_t *q80 = (const int8_t *)w->q + (size_t)r * w->cols, *q81 = q80 + w->cols;
    for (int b0 = 0; b0 < nb; b0 += 8) {
        const int m = nb - b0 < 8 ? nb - b0 : 8;
        if (m == 8 || ROWS2_MASKED_TAIL) {
            const __m256 dx = act8(a->d + b0, m);
            _mm256_storeu_ps(sd[0], _mm256_mul_ps(scale8(w->scale, w->sdt, s0 + b0, m), dx));
            _mm256_storeu_ps(sd[1], _mm256_mul_ps(scale8(w->scale, w->sdt, s1 + b0, m), dx));
            if (w->min) {
                const __m256 sx = act8(a->s + b0, m);
                mv0 = _mm256_fmadd_ps(scale8(w->min, w->sdt, s0 + b0, m), sx, mv0);
                mv1 = _mm256_fmadd_ps(scale8(w->min, w->sdt, s1 + b0, m), sx, mv1);
            }
        } else {   /* a short tail without masked loads: scalars, not a vector built in memory */
            for (int j = 0; j < m; j++) {
                const int b = b0 + j;
                sd[0][j] = ld_s(w->scale, w->sdt, s0 + b) * a->d[b];
                sd[1][j] = ld_s(w->scale, w->sdt, s1 + b) * a->d[b];
                if (w->min) {
                    mt0 += ld_s(w->min, w->sdt, s0 + b) * a->s[b];
                    mt1 += ld_s(w->min, w->sdt, s1 + b) * a->s[b];
                }
            }
        }
        if (w->kind == K_Q4) {
            for (int j = 0; j < m; j++) {
                const int b = b0 + j;
                if (!(b & 3)) {   /* a line of each row's stream */
                    PF2(q40 + 16 * b);
                    PF2(q41 + 16 * b);
                }
                const __m256i *xp = (const __m256i *)(a->q + 32 * b);
                __m256i x0 = _mm256_loadu_si256(xp), x1 = _mm256_loadu_si256(xp + 1);
                /* widen the bytes once: a 16-bit lane's low nibble is value j, the rest (>> 4) value j + 16 */
                __m256i w0 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(q40 + 16 * b)));
                __m256i w1 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(q41 + 16 * b)));
                __m256i p0 = DOT2(_mm256_and_si256(w0, m16), x0, _mm256_srli_epi16(w0, 4), x1);
                __m256i p1 = DOT2(_mm256_and_si256(w1, m16), x0, _mm256_srli_epi16(w1, 4), x1);
                v0 = _mm256_fmadd_ps(_mm256_broadcast_ss(&sd[0][j]), _mm256_cvtepi32_ps(p0), v0);
                v1 = _mm256_fmadd_ps(_mm256_broadcast_ss(&sd[1][j]), _mm256_cvtepi32_ps(p1), v1);
            }
        } else {
            for (int j = 0; j < m; j++) {
                const int b = b0 + j;
                if (!(b & 1)) {
                    PF2(q80 + 32 * b);
                    PF2(q81 + 32 * b);
                }
                const __m256i *xp = (const __m256i *)(a->q + 32 * b);
                __m256i x0 = _mm256_loadu_si256(xp), x1 = _mm256_loadu_si256(xp + 1);
                const __m128i *p = (const __m128i *)(q80 + 32 * b), *pq = (const __m128i *)(q81 + 32 * b);
                __m256i p0 = DOT2(_mm256_cvtepi8_epi16(_mm_loadu_si128(p)), x0, _mm256_cvtepi8_epi16(_mm_loadu_si128(p + 1)), x1);
                __m256i p1 = DOT2(_mm256_cvtepi8_epi16(_mm_loadu_si128(pq)), x0, _mm256_cvtepi8_epi16(_mm_loadu_si128(pq + 1)), x1);
                v0 = _mm256_fmadd_ps(_mm256_broadcast_ss(&sd[0][j]), _mm256_cvtepi32_ps(p0), v0);
                v1 = _mm256_fmadd_ps(_mm256_broadcast_ss(&sd[1][j]), _mm256_cvtepi32_ps(p1), v1);
            }
        }
    }
    out[0] = hsum(v0) + (w->min ? hsum(mv0) + mt0 : 0.f);
    out[1] = hsum(v1) + (w->min ? hsum(mv1) + mt1 : 0.f);
}
#endif

/* y[r] for rows [r0, r1) */
static void gemv(const QW *w, const Act *a, float *y, int r0, int r1) {
    int r = r0;
#ifdef QD_AVX2
    if ((w->kind == K_Q8 || w->kind == K_Q4) && w->sub == 32)
        for (; r + 2 <= r1; r += 2) rows2(w, r, a, y + r);
#if defined(QD_VNNI8) && !defined(QD_NO_KTREE)
    if (ktree_kind(w->kind))
        for (; r + 2 <= r1; r += 2) dot2_kt(w, r, a, y + r);
#endif
    if (w->kind >= K_FILE_FIRST)
        for (; r + 2 <= r1; r += 2) dot2_file(w, r, a, y + r);
#endif
    if (w->kind >= K_Q8) for (; r < r1; r++) y[r] = dot_blocks(w, r, a);
    else for (; r < r1; r++) y[r] = dot_dense(w, r, a->x);
    if (w->bias) for (int r = r0; r < r1; r++) y[r] += w->bias[r];
}

/* One row as fp32: exact (s*q + m, one rounding, as the gguf package computes it). */
static void dequant_row(const QW *w, int r, float *out) {
    const int n = w->cols;
    size_t o = (size_t)r * n;
    if (w->kind == K_F32) { memcpy(out, (const float *)w->q + o, n * sizeof(float)); return; }
    if (w->kind == K_F16) { for (int j = 0; j < n; j++) out[j] = h2f(((const uint16_t *)w->q)[o + j]); return; }
    if (w->kind == K_BF16) { for (int j = 0; j < n; j++) out[j] = bf2f(((const uint16_t *)w->q)[o + j]); return; }
    if (w->kind >= K_FILE_FIRST) { dequant_file(w, r, out); return; }
    const size_t sb = o / w->sub;
    int j = 0;
#ifdef QD_AVX2
    for (; j + 32 <= n; j += 32) {   /* a 32-block: 4 vectors of 8 values */
        __m256 v[4];
        if (w->kind == K_Q4) {
            __m128i raw = _mm_loadu_si128((const __m128i *)((const uint8_t *)w->q + o / 2 + j / 2));
            __m128i lo = _mm_and_si128(raw, _mm_set1_epi8(0x0f)), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(0x0f));
            v[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
            v[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)));
            v[2] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));
            v[3] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)));
        } else {
            __m256i raw = _mm256_loadu_si256((const __m256i *)((const int8_t *)w->q + o + j));
            __m128i a = _mm256_castsi256_si128(raw), b = _mm256_extracti128_si256(raw, 1);
            v[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(a));
            v[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(a, 8)));
            v[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
            v[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)));
        }
        for (int k = 0; k < 4; k++) {
            size_t si = sb + (j + 8 * k) / w->sub;
            __m256 sc = _mm256_set1_ps(ld_s(w->scale, w->sdt, si));
            /* fma rounds s*q + m once; s*q is exact for these widths, so this is gguf's s*q then + m */
            __m256 r = w->min ? _mm256_fmadd_ps(sc, v[k], _mm256_set1_ps(ld_s(w->min, w->sdt, si))) : _mm256_mul_ps(sc, v[k]);
            _mm256_storeu_ps(out + j + 8 * k, r);
        }
    }
#endif
    for (; j < n; j++) {
        float q = w->kind == K_Q4 ? (float)((((const uint8_t *)w->q)[o / 2 + (j / 32) * 16 + (j % 16)] >> ((j % 32) >= 16 ? 4 : 0)) & 15)
                                  : (float)((const int8_t *)w->q)[o + j];
        float sc = ld_s(w->scale, w->sdt, sb + j / w->sub);
        out[j] = w->min ? sc * q + ld_s(w->min, w->sdt, sb + j / w->sub) : sc * q;
    }
}

/* ---- small per-token pieces ----------------------------------------------------------------- */
static void rmsnorm(float *y, const float *x, const float *w, int n, float eps) {
    float ss = 0.f;
    for (int j = 0; j < n; j++) ss += x[j] * x[j];
    float k = 1.f / sqrtf(ss / n + eps);
    for (int j = 0; j < n; j++) y[j] = w[j] * (x[j] * k);
}

static void rope(float *v, int heads, int d, const float *c, const float *s) {
    const int h2 = d / 2;
    for (int h = 0; h < heads; h++) {
        float *x = v + h * d;
        for (int i = 0; i < h2; i++) {
            float x1 = x[i], x2 = x[i + h2];
            x[i] = x1 * c[i] - x2 * s[i];
            x[i + h2] = x2 * c[i] + x1 * s[i];
        }
    }
}

static inline float act_fn(int act, float g) {
    if (act == ACT_SILU) return g / (1.f + expf(-g));
    return 0.5f * g * (1.f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
}

/* ---- attention over one thread's share of the keys -------------------------------------------- */
/* e^x = 2^n p(r) for x <= 0 (softmax arguments), relative error ~2e-7: n = round(x / ln 2) (the
   caller's), r = x - n ln 2 with ln 2 in two parts, p a degree-6 polynomial. One formula for both
   widths: V is the intrinsics' prefix (_mm256_ here, _mm512_ in prefill_attn.c), T the vector type. */
#define EXP_POLY(V, T, n, x) __extension__({                                          \
    T r_ = V##fnmadd_ps(n, V##set1_ps(0.693359375f), x);                               \
    r_ = V##fnmadd_ps(n, V##set1_ps(-2.12194440e-4f), r_);                             \
    T p_ = V##set1_ps(1.9875691500e-4f);                                               \
    p_ = V##fmadd_ps(p_, r_, V##set1_ps(1.3981999507e-3f));                            \
    p_ = V##fmadd_ps(p_, r_, V##set1_ps(8.3334519073e-3f));                            \
    p_ = V##fmadd_ps(p_, r_, V##set1_ps(4.1665795894e-2f));                            \
    p_ = V##fmadd_ps(p_, r_, V##set1_ps(1.6666665459e-1f));                            \
    p_ = V##fmadd_ps(p_, r_, V##set1_ps(5.0000001201e-1f));                            \
    V##fmadd_ps(p_, V##mul_ps(r_, r_), V##add_ps(r_, V##set1_ps(1.0f))); })
#define EXP_LOG2E 1.44269504088896341f

#ifdef QD_AVX2
/* Scalar expf was a third of the attention at 1,500 keys. */
static inline __m256 exp256(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(EXP_LOG2E)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 p = EXP_POLY(_mm256_, __m256, n, x);
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
#endif

/* y[r] = act(y[r]) * u[r] for r in [r0, r1). act(g) = g * sigmoid(a): a = g for SiLU, and for
   Gemma's tanh GELU a = 2 * 0.79788 * (g + 0.044715 g^3), since 0.5 (1 + tanh(z)) = sigmoid(2 z).
   Vectorised through exp256 (relative error ~2e-7): scalar tanhf was ~0.7 ms of a Gemma 3 270M
   token (36,864 calls). */
static void act_rows(int act, float *y, const float *u, int r0, int r1) {
    int r = r0;
#ifdef QD_AVX2
    for (; r + 8 <= r1; r += 8) {
        const __m256 g = _mm256_loadu_ps(y + r);
        __m256 a = g;
        if (act == ACT_GELU_TANH) {
            const __m256 g3 = _mm256_mul_ps(_mm256_mul_ps(g, g), g);
            a = _mm256_mul_ps(_mm256_set1_ps(2.f * 0.7978845608028654f), _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), g3, g));
        }
        /* e^-a, with -a at most 80 (e^80 is finite, and g / (1 + e^80) is 0 to fp32) */
        const __m256 e = exp256(_mm256_min_ps(_mm256_sub_ps(_mm256_setzero_ps(), a), _mm256_set1_ps(80.f)));
        const __m256 h = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.f), e));
        _mm256_storeu_ps(y + r, _mm256_mul_ps(h, _mm256_loadu_ps(u + r)));
    }
#endif
    for (; r < r1; r++) y[r] = act_fn(act, y[r]) * u[r];
}

#ifdef QD_AVX2
/* Scores of nh query heads (q, d apart) against four keys (k, row apart): each key's fp16 chunk
   is converted once for all the heads that share its KV head, where the loop per head converted
   it once per head (three times for SmolLM2, four for Gemma 3 and Llama 3.2). 4 x nh
   accumulators: SC_HEADS is 4 where AVX-512VL gives 32 vector registers, else 2 (16). */
#ifdef __AVX512VL__
#define SC_HEADS 4
#else
#define SC_HEADS 2
#endif
static inline __attribute__((always_inline)) void scores4(const float *q, const uint16_t *k, size_t row, int d, int nh,
                                                          float scale, float *out, int stride) {
    __m256 acc[SC_HEADS][4];
    for (int i = 0; i < nh; i++)
        for (int r = 0; r < 4; r++) acc[i][r] = _mm256_setzero_ps();
    for (int j = 0; j < d; j += 8) {
        __m256 kv[4];
        for (int r = 0; r < 4; r++) kv[r] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + r * row + j)));
        for (int i = 0; i < nh; i++) {
            const __m256 qv = _mm256_loadu_ps(q + (size_t)i * d + j);
            for (int r = 0; r < 4; r++) acc[i][r] = _mm256_fmadd_ps(qv, kv[r], acc[i][r]);
        }
    }
    for (int i = 0; i < nh; i++) {
        const __m256 s4 = _mm256_hadd_ps(_mm256_hadd_ps(acc[i][0], acc[i][1]), _mm256_hadd_ps(acc[i][2], acc[i][3]));
        const __m128 r = _mm_add_ps(_mm256_castps256_ps128(s4), _mm256_extractf128_ps(s4, 1));
        _mm_storeu_ps(out + (size_t)i * stride, _mm_mul_ps(r, _mm_set1_ps(scale)));
    }
}
#endif

#ifdef __AVX512VL__
/* acc[h] += sum over keys u of p[h][u] * V[u] for nh heads of one KV head, every one of the d8 x 8
   dims in registers (nh * d8 <= 24 of the 32): each V row is read and converted once, in key
   order, where the 8-dims-at-a-time pass below walked a 32-key tile d/8 times and (for three
   heads) kept a fourth accumulator for nothing. */
static inline __attribute__((always_inline)) void values_regs(const float *p, int nt, const uint16_t *v, size_t row,
                                                              size_t far, int nh, int d8, float *pacc, int hs) {
    __m256 acc[4][16];
    for (int i = 0; i < nh; i++)
        for (int j = 0; j < d8; j++) acc[i][j] = _mm256_setzero_ps();
    for (int u = 0; u < nt; u++) {
        const uint16_t *vr = v + (size_t)u * row;
        for (int o = 0; o < d8 * 16; o += 64) {
            _mm_prefetch((const char *)(vr + 16 * row) + o, _MM_HINT_T0);
            if (KPF_BYTES) _mm_prefetch((const char *)(vr + far * row) + o, _MM_HINT_T1);
        }
        for (int j = 0; j < d8; j++) {
            const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vr + 8 * j)));
            for (int i = 0; i < nh; i++) acc[i][j] = _mm256_fmadd_ps(_mm256_broadcast_ss(p + (size_t)i * nt + u), x, acc[i][j]);
        }
    }
    for (int i = 0; i < nh; i++)
        for (int j = 0; j < d8; j++) {
            float *pa = pacc + (size_t)i * hs + 8 * j;   /* hs: floats from one head's output to the next */
            _mm256_storeu_ps(pa, _mm256_add_ps(_mm256_loadu_ps(pa), acc[i][j]));
        }
}
#endif

/* Partial softmax over keys [t0, t1): per query head its max m, sum l and unnormalised acc.
   Three passes (scores, exp, values), each walking the keys in order with every KV head of a
   row together, so the layer's K and V stream from memory once; in cache this is 4x faster
   than per-head sweeps, from DRAM it is what keeps long chats near bandwidth. */
static void attn_part(const Model *m, const float *q, const uint16_t *kc, const uint16_t *vc, int t0, int t1,
                      int kv0, int kv1, float *scores, float *pm, float *pl, float *pacc) {
    /* KV heads [kv0, kv1) and their query heads [h0, h1); outputs are indexed from h0 */
    const int hk = m->n_kv, d = m->head_dim, g = m->n_head / hk, nt = t1 - t0, h0 = kv0 * g, h1 = kv1 * g;
    const size_t row = (size_t)hk * d;
    /* the K and V rows KPF_BYTES ahead, into L2: the 8- and 16-key T0 distances alone left the
       attention at depth 1,500 waiting on DRAM (SmolLM2: 9.7-10.5 -> 8.4-8.9 ms a token) */
    const size_t far = KPF_BYTES > row * 2 ? KPF_BYTES / (row * 2) : 1;
    (void)far;
    memset(pacc, 0, sizeof(float) * (h1 - h0) * d);
    for (int h = 0; h < h1 - h0; h++) { pm[h] = -INFINITY; pl[h] = 0.f; }
    if (nt <= 0) return;
    int t = 0;
#ifdef QD_AVX2
    if (d % 8 == 0) {   /* four keys at a time: each query chunk is loaded once for all four */
        for (; t + 4 <= nt; t += 4) {
            const uint16_t *k0 = kc + (size_t)(t0 + t) * row;
            /* every line of the four K rows 8 keys ahead (one line of them left the rest to the
               hardware: 6 GB/s of K/V at depth 1,500) */
            for (size_t o = 0; o < 4 * row * sizeof(uint16_t); o += 64) {
                _mm_prefetch((const char *)(k0 + 8 * row) + o, _MM_HINT_T0);
                if (KPF_BYTES) _mm_prefetch((const char *)(k0 + far * row) + o, _MM_HINT_T1);
            }
            for (int kv = kv0; kv < kv1; kv++)
                for (int i0 = 0; i0 < g; i0 += SC_HEADS) {
                    const int h = kv * g + i0, nh = g - i0 < SC_HEADS ? g - i0 : SC_HEADS;
                    const float *qh = q + (size_t)h * d;
                    const uint16_t *k = k0 + (size_t)kv * d;
                    float *o = scores + (size_t)(h - h0) * nt + t;
                    switch (nh) {   /* a constant head count per call: its loops unroll */
                    case 1: scores4(qh, k, row, d, 1, m->attn_scale, o, nt); break;
                    case 2: scores4(qh, k, row, d, 2, m->attn_scale, o, nt); break;
#if SC_HEADS > 2
                    case 3: scores4(qh, k, row, d, 3, m->attn_scale, o, nt); break;
                    default: scores4(qh, k, row, d, 4, m->attn_scale, o, nt); break;
#endif
                    }
                }
        }
    }
#endif
    for (; t < nt; t++)
        for (int h = h0; h < h1; h++) {
            const uint16_t *k = kc + (size_t)(t0 + t) * row + (size_t)(h / g) * d;
            float sc = 0.f;
            for (int j = 0; j < d; j++) sc += q[h * d + j] * h2f(k[j]);
            scores[(size_t)(h - h0) * nt + t] = sc * m->attn_scale;
        }
    for (int h = 0; h < h1 - h0; h++) {
        float *sc = scores + (size_t)h * nt, mx = -INFINITY, l = 0.f;
        int u = 0;
#ifdef QD_AVX2
        __m256 mx8 = _mm256_set1_ps(-INFINITY);
        for (; u + 8 <= nt; u += 8) mx8 = _mm256_max_ps(mx8, _mm256_loadu_ps(sc + u));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx8), _mm256_extractf128_ps(mx8, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        mx = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
#endif
        for (; u < nt; u++) mx = mx > sc[u] ? mx : sc[u];
        u = 0;
#ifdef QD_AVX2
        __m256 lv = _mm256_setzero_ps(), mv = _mm256_set1_ps(mx);
        for (; u + 8 <= nt; u += 8) {
            __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(sc + u), mv));
            _mm256_storeu_ps(sc + u, e);
            lv = _mm256_add_ps(lv, e);
        }
        l = hsum(lv);
#endif
        for (; u < nt; u++) { sc[u] = expf(sc[u] - mx); l += sc[u]; }
        pm[h] = mx;
        pl[h] = l;
    }
#ifdef QD_AVX2
#ifdef __AVX512VL__
    if (d == 64 || d == 128) {   /* every dim of up to 3 (d 64) or 1 (d 128) heads in registers */
        const int hg = d == 64 ? 3 : 1;
        for (int kv = kv0; kv < kv1; kv++)
            for (int i0 = 0; i0 < g; i0 += hg) {
                const int nh = g - i0 < hg ? g - i0 : hg, hb = kv * g + i0 - h0;
                const float *p = scores + (size_t)hb * nt;
                const uint16_t *v = vc + (size_t)t0 * row + (size_t)kv * d;
                float *pa = pacc + (size_t)hb * d;
                if (d == 128) values_regs(p, nt, v, row, far, 1, 16, pa, d);
                else if (nh == 3) values_regs(p, nt, v, row, far, 3, 8, pa, d);
                else if (nh == 2) values_regs(p, nt, v, row, far, 2, 8, pa, d);
                else values_regs(p, nt, v, row, far, 1, 8, pa, d);
            }
        return;
    }
    if (d % 32 == 0 && g % 4 == 0) {   /* Gemma 3's d 256: four heads x 32 dims a pass, V read once per pass */
        for (int kv = kv0; kv < kv1; kv++)
            for (int i0 = 0; i0 < g; i0 += 4)
                for (int o = 0; o < d; o += 32) {
                    const int hb = kv * g + i0 - h0;
                    values_regs(scores + (size_t)hb * nt, nt, vc + (size_t)t0 * row + (size_t)kv * d + o, row, far, 4, 4,
                                pacc + (size_t)hb * d + o, d);
                }
        return;
    }
#endif
    if (d % 8 == 0) {   /* per 8 dims, four heads' accumulators stay in registers over 32 keys */
        for (t = 0; t < nt; t += 32) {
            const int te = t + 32 < nt ? t + 32 : nt;
            for (int kv = kv0; kv < kv1; kv++)
                for (int i0 = 0; i0 < g; i0 += 4) {
                    const int ng = g - i0 < 4 ? g - i0 : 4, hb = kv * g + i0 - h0;
                    const float *p0 = scores + (size_t)hb * nt, *p1 = p0 + (ng > 1 ? nt : 0),
                                *p2 = p0 + (ng > 2 ? 2 * (size_t)nt : 0), *p3 = p0 + (ng > 3 ? 3 * (size_t)nt : 0);
                    for (int j = 0; j < d; j += 8) {
                        __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
                        for (int u = t; u < te; u++) {
                            if (j == 0)   /* this head's V row 32 keys ahead, every line */
                                for (int o = 0; o < d * 2; o += 64)
                                    _mm_prefetch((const char *)(vc + (size_t)(t0 + u + 32) * row + (size_t)kv * d) + o, _MM_HINT_T0);
                            __m256 v = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vc + (size_t)(t0 + u) * row + (size_t)kv * d + j)));
                            c0 = _mm256_fmadd_ps(_mm256_broadcast_ss(p0 + u), v, c0);
                            c1 = _mm256_fmadd_ps(_mm256_broadcast_ss(p1 + u), v, c1);
                            c2 = _mm256_fmadd_ps(_mm256_broadcast_ss(p2 + u), v, c2);
                            c3 = _mm256_fmadd_ps(_mm256_broadcast_ss(p3 + u), v, c3);
                        }
                        __m256 cs[4] = {c0, c1, c2, c3};
                        for (int i = 0; i < ng; i++) {
                            float *pa = pacc + (size_t)(hb + i) * d + j;
                            _mm256_storeu_ps(pa, _mm256_add_ps(_mm256_loadu_ps(pa), cs[i]));
                        }
                    }
                }
        }
        return;
    }
#endif
    for (t = 0; t < nt; t++)
        for (int h = h0; h < h1; h++) {
            const uint16_t *v = vc + (size_t)(t0 + t) * row + (size_t)(h / g) * d;
            float p = scores[(size_t)(h - h0) * nt + t], *acc = pacc + (size_t)(h - h0) * d;
            for (int j = 0; j < d; j++) acc[j] += p * h2f(v[j]);
        }
}

/* ---- the step: a pool of threads over phases of blocks ------------------------------------------ */
#include "pool.c"
#include "decode_step.c"

/* ---- for the prefill and the tests ---------------------------------------------------------------- */
#ifdef _OPENMP
static void split(int n, int tid, int nt, int *a, int *b) {
    int per = ((n + nt - 1) / nt + 7) & ~7;   /* whole 8-row groups: no two threads share a cache line of y */
    *a = tid * per < n ? tid * per : n;
    *b = (tid + 1) * per < n ? (tid + 1) * per : n;
}
#endif

void qd_dequant(const QW *w, float *out, int n_threads) {
#ifdef _OPENMP
#pragma omp parallel for num_threads(n_threads) schedule(static)
#endif
    for (int r = 0; r < w->rows; r++) dequant_row(w, r, out + (size_t)r * w->cols);
}

/* A float as bf16, rounded to nearest even (torch's float -> bfloat16): the AMX prefill's weights
   (qg_dequant_bf16, in qgemm.c). */
static inline uint16_t f2bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* y = W x for one vector, through the same kernels as the step (activations quantized). */
void qd_gemv(const QW *w, const float *x, float *y, int n_threads) {
    int n = w->cols;
    int16_t *q = malloc(sizeof(int16_t) * (n + 32));
    float *d = malloc(sizeof(float) * (n / 32 + 1)), *s = malloc(sizeof(float) * (n / 32 + 1));
    int8_t *q1 = malloc(n + 32), *q2 = malloc(n + 32);
    int32_t *q4 = malloc(sizeof(int32_t) * (n / 4 + 8));
    Act a = {x, q, d, s, n, q1, q2, q4, NULL, NULL, NULL, NULL};
    if (act8_kind(w->kind)) act8_alloc(&a, (size_t)n);   /* the K-quant rows' int8 activations */
    if (w->kind >= K_Q8) quantize_act(&a, A_ALL);
#ifdef _OPENMP
#pragma omp parallel num_threads(n_threads)
    {
        int r0, r1;
        split(w->rows, omp_get_thread_num(), omp_get_num_threads(), &r0, &r1);
        gemv(w, &a, y, r0, r1);
    }
#else
    gemv(w, &a, y, 0, w->rows);
#endif
    free(q); free(d); free(s); free(q1); free(q2); free(q4); act8_free(&a);
}

int qd_simd(void) {   /* 0: portable C, 1: AVX2 */
#ifdef QD_AVX2
    return 1;
#else
    return 0;
#endif
}
#include "qgemm.c"   /* the prefill GEMM (integer activations), on its own pool */
