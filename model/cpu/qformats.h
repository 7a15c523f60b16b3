/* GGUF block formats read as the file stores them: Q5_0, Q6_K, Q2_K, Q3_K, IQ4_NL, IQ4_XS, Q4_K, Q5_K.
 *
 * #included by qdecode.c (after QW, Act, h2f, hsum and PF2). A weight of one of these kinds
 * is the GGUF tensor's own bytes, `rows` rows of cols/bv blocks of bb bytes; nothing is widened,
 * so a token reads exactly the file's bits per weight (docs/weight-formats.md).
 *
 * Each format is three small functions:
 *   prep  the block's scales (and Q2_K's mins) as fp32, one per 16 values, computed in the
 *         order the gguf package computes them (d * sub-scale), so dequantization is exact;
 *   q32   the k-th 32 values of the block as int8 (AVX2: one vector; portable: an array).
 * One generic row dot (int8 values x int16 activations, one integer sum per 16 or 32 values,
 * scaled once) and one generic row dequantizer serve them all, in AVX2 and in portable C.
 */
enum { K_Q5_0 = 5, K_Q6_K = 6, K_Q2_K = 7, K_Q3_K = 8, K_IQ4_NL = 9, K_IQ4_XS = 10, K_Q4_K = 11, K_Q5_K = 12 };
#define K_FILE_FIRST K_Q5_0

static const int8_t IQ4_VALUES[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

static inline uint16_t rd16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t rd32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }

/* ---- scales: fp32, one per 16 values (per16 formats) or per 32 (the rest; a 32-value block has one).
   Each is d * (small integer), as the gguf package computes it; min likewise with dmin. ---------- */
static inline void prep_q5_0(const uint8_t *b, float *sc, float *mn) { (void)mn; sc[0] = h2f(rd16(b)); }
static inline void prep_iq4_nl(const uint8_t *b, float *sc, float *mn) { (void)mn; sc[0] = h2f(rd16(b)); }
static inline void prep_q6_k(const uint8_t *b, float *sc, float *mn) {   /* ql 128, qh 64, sc 16, d */
    (void)mn;
    const float d = h2f(rd16(b + 208));
    for (int i = 0; i < 16; i++) sc[i] = d * (float)(int8_t)b[192 + i];
}
static inline void prep_q2_k(const uint8_t *b, float *sc, float *mn) {   /* sc 16, qs 64, d, dmin */
    const float d = h2f(rd16(b + 80)), dmin = h2f(rd16(b + 82));
    for (int i = 0; i < 16; i++) { sc[i] = d * (float)(b[i] & 15); mn[i] = dmin * (float)(b[i] >> 4); }
}
static inline void prep_q3_k(const uint8_t *b, float *sc, float *mn) {   /* hmask 32, qs 64, sc 12, d */
    (void)mn;
    /* 6-bit scales: low nibbles in bytes 0-7 (scales 0-7 low, 8-15 high nibble), 2-bit highs in 8-11 */
    const uint32_t a0 = rd32(b + 96), a1 = rd32(b + 100), hi = rd32(b + 104);
    uint32_t u[4] = {(a0 & 0x0f0f0f0f) | ((hi & 0x03030303) << 4), (a1 & 0x0f0f0f0f) | (((hi >> 2) & 0x03030303) << 4),
                     ((a0 >> 4) & 0x0f0f0f0f) | (((hi >> 4) & 0x03030303) << 4),
                     ((a1 >> 4) & 0x0f0f0f0f) | (((hi >> 6) & 0x03030303) << 4)};
    uint8_t v[16];
    memcpy(v, u, 16);
    const float d = h2f(rd16(b + 108));
    for (int i = 0; i < 16; i++) sc[i] = d * (float)((int)v[i] - 32);
}
static inline void prep_iq4_xs(const uint8_t *b, float *sc, float *mn) {   /* d, sc_h u16, sc_l 4, qs 128 */
    (void)mn;
    const float d = h2f(rd16(b));
    const uint16_t h = rd16(b + 2);
    for (int i = 0; i < 8; i++) {
        int ls = ((b[4 + i / 2] >> (4 * (i % 2))) & 15) | (((h >> (2 * i)) & 3) << 4);
        sc[i] = d * (float)(ls - 32);
    }
}
static inline void prep_q4_k(const uint8_t *b, float *sc, float *mn) {   /* d, dmin, sc 12, (qh 32,) qs 128 */
    /* 6-bit scale and min per 32: scales 0-3 and mins 0-3 in the low 6 bits of bytes 0-7; scales and
       mins 4-7 in the nibbles of bytes 8-11, their top 2 bits in the top of bytes 0-7 */
    const uint32_t s0 = rd32(b + 4), s1 = rd32(b + 8), s2 = rd32(b + 12);
    uint32_t u[4] = {s0 & 0x3f3f3f3f, (s2 & 0x0f0f0f0f) | (((s0 >> 6) & 0x03030303) << 4),
                     s1 & 0x3f3f3f3f, ((s2 >> 4) & 0x0f0f0f0f) | (((s1 >> 6) & 0x03030303) << 4)};
    uint8_t v[16];
    memcpy(v, u, 16);
    const float d = h2f(rd16(b)), dmin = h2f(rd16(b + 2));
    for (int j = 0; j < 8; j++) { sc[j] = d * (float)v[j]; mn[j] = dmin * (float)v[8 + j]; }
}
#define prep_q5_k prep_q4_k

/* ---- values, portable: the k-th 32 of the block as int8 --------------------------------------- */
static inline void c32_q5_0(const uint8_t *b, int k, int8_t *q) {   /* d, qh u32, qs 16 */
    (void)k;
    const uint32_t qh = rd32(b + 2);
    for (int j = 0; j < 32; j++)
        q[j] = (int8_t)((((j < 16 ? b[6 + j] : b[6 + j - 16] >> 4) & 15) | (((qh >> j) & 1) << 4)) - 16);
}
static inline void c32_iq4_nl(const uint8_t *b, int k, int8_t *q) {
    (void)k;
    for (int j = 0; j < 32; j++) q[j] = IQ4_VALUES[(j < 16 ? b[2 + j] : b[2 + j - 16] >> 4) & 15];
}
static inline void c32_iq4_xs(const uint8_t *b, int k, int8_t *q) {
    const uint8_t *qs = b + 8 + 16 * k;
    for (int j = 0; j < 32; j++) q[j] = IQ4_VALUES[(j < 16 ? qs[j] : qs[j - 16] >> 4) & 15];
}
/* The K-types lay a 256-block out in halves of 128; 32-group k is half k/4, position s = k%4. */
static inline void c32_q6_k(const uint8_t *b, int k, int8_t *q) {
    const int h = k / 4, s = k % 4;
    const uint8_t *ql = b + 64 * h + 32 * (s % 2), *qh = b + 128 + 32 * h;
    for (int j = 0; j < 32; j++) q[j] = (int8_t)((((ql[j] >> (4 * (s / 2))) & 15) | (((qh[j] >> (2 * s)) & 3) << 4)) - 32);
}
static inline void c32_q2_k(const uint8_t *b, int k, int8_t *q) {
    const uint8_t *qs = b + 16 + 32 * (k / 4);
    for (int j = 0; j < 32; j++) q[j] = (int8_t)((qs[j] >> (2 * (k % 4))) & 3);
}
static inline void c32_q3_k(const uint8_t *b, int k, int8_t *q) {   /* a clear hmask bit means minus 4 */
    const uint8_t *qs = b + 32 + 32 * (k / 4);
    for (int j = 0; j < 32; j++) q[j] = (int8_t)(((qs[j] >> (2 * (k % 4))) & 3) - (((b[j] >> k) & 1) ? 0 : 4));
}
static inline void c32_q4_k(const uint8_t *b, int k, int8_t *q) {   /* 64 values per 32 bytes: low, high */
    const uint8_t *qs = b + 16 + 32 * (k / 2);
    for (int j = 0; j < 32; j++) q[j] = (int8_t)((qs[j] >> (4 * (k % 2))) & 15);
}
static inline void c32_q5_k(const uint8_t *b, int k, int8_t *q) {   /* the fifth bit: bit k of qh[j] */
    const uint8_t *qs = b + 48 + 32 * (k / 2);
    for (int j = 0; j < 32; j++) q[j] = (int8_t)(((qs[j] >> (4 * (k % 2))) & 15) | (((b[16 + j] >> k) & 1) << 4));
}

typedef void (*PrepFn)(const uint8_t *, float *, float *);
typedef void (*C32Fn)(const uint8_t *, int, int8_t *);

/* values and bytes a block; a scale per 16 values (else per 32)? mins: 0 none, 1 per 16, 2 per 32;
   v8: the VNNI byte kernel (dot2_file_v8) reads it, its values as unsigned bytes less `off`;
   a8: its rows take the int8-per-256 activations (Act.k8, quantize_k8), in every build */
typedef struct { int bv, bb, per16, has_min, v8, off, a8; } FileFmt;
#ifdef QD_NO_ACT8   /* the int16 activations for every format: the A/B and the error measurement */
#define A8 0
#else
#define A8 1
#endif
static const FileFmt FILE_FMT[] = {
    [K_Q5_0 - K_FILE_FIRST] = {32, 22, 0, 0, 1, 16, 0},   [K_Q6_K - K_FILE_FIRST] = {256, 210, 1, 0, 1, 32, A8},
    [K_Q2_K - K_FILE_FIRST] = {256, 84, 1, 1, 0, 0, 0},   [K_Q3_K - K_FILE_FIRST] = {256, 110, 1, 0, 0, 0, 0},
    [K_IQ4_NL - K_FILE_FIRST] = {32, 18, 0, 0, 0, 0, 0},  [K_IQ4_XS - K_FILE_FIRST] = {256, 136, 0, 0, 0, 0, 0},
    [K_Q4_K - K_FILE_FIRST] = {256, 144, 0, 2, 1, 0, A8}, [K_Q5_K - K_FILE_FIRST] = {256, 176, 0, 2, 1, 0, A8},
};
static inline int act8_kind(int kind) { return kind >= K_FILE_FIRST && FILE_FMT[kind - K_FILE_FIRST].a8; }
/* the format as a kernel runs it: a8 only where the input's int8 rounding was good enough (Act.use8) */
static inline __attribute__((always_inline)) FileFmt fmt_of(int kind, int use8) {
    FileFmt f = FILE_FMT[kind - K_FILE_FIRST];
    f.a8 = f.a8 && use8;
    return f;
}
/* Both instantiations of a kernel, so that f.a8 is a constant in each: u8 is the caller's use8. */
#define WITH_A8(K, CALL) { if (u8) { const FileFmt F = fmt_of(K, 1); CALL; } else { const FileFmt F = fmt_of(K, 0); CALL; } }

static inline const uint8_t *file_row(const QW *w, int r, const FileFmt *f) {
    return (const uint8_t *)w->q + (size_t)r * (w->cols / f->bv) * f->bb;
}

/* the scale (or min) of values 16h..16h+15 of 32-group k */
#define SI(f, k, h) ((f).per16 ? 2 * (k) + (h) : (k))

/* ---- portable C row dot and dequantization ----------------------------------------------------- */
static inline __attribute__((always_inline)) float dot_file_c(const QW *w, int r, const Act *a, const FileFmt f,
                                                              PrepFn prep, C32Fn c32) {
    const uint8_t *row = file_row(w, r, &f);
    const int nk = f.bv / 32;
    float acc = 0.f, sc[16], mn[16] = {0};
    int8_t q[32];
    for (int i = 0; i < w->cols / f.bv; i++) {
        const uint8_t *b = row + (size_t)i * f.bb;
        prep(b, sc, mn);
        for (int k = 0; k < nk; k++) {
            const int g = i * nk + k;
            c32(b, k, q);
            int s[2] = {0, 0}, xs[2] = {0, 0};
            for (int j = 0; j < 32; j++) {
                const int x = f.a8 ? a->k8[32 * g + j] : a->q[32 * g + j];
                s[j / 16] += q[j] * x;
                xs[j / 16] += x;
            }
            const float dx = f.a8 ? a->kd[g] : a->d[g];
            for (int h = 0; h < 2; h++) {
                acc += sc[SI(f, k, h)] * dx * (float)s[h];
                if (f.has_min) acc -= mn[SI(f, k, h)] * dx * (float)xs[h];
            }
        }
    }
    return acc;
}

/* value = scale * q (- min), in gguf's order: the product is exact in fp32, so one rounding */
static inline __attribute__((always_inline)) void dequant_file_c(const QW *w, int r, float *out, const FileFmt f,
                                                                 PrepFn prep, C32Fn c32) {
    const uint8_t *row = file_row(w, r, &f);
    float sc[16], mn[16] = {0};
    int8_t q[32];
    for (int i = 0; i < w->cols / f.bv; i++) {
        const uint8_t *b = row + (size_t)i * f.bb;
        prep(b, sc, mn);
        for (int k = 0; k < f.bv / 32; k++) {
            c32(b, k, q);
            float *o = out + (size_t)i * f.bv + 32 * k;
            for (int j = 0; j < 32; j++) {
                const float s = sc[SI(f, k, j / 16)];
                o[j] = f.has_min ? s * (float)q[j] - mn[SI(f, k, j / 16)] : s * (float)q[j];
            }
        }
    }
}

#ifdef QD_AVX2
/* ---- values, AVX2: the k-th 32 of the block in one vector of int8 ------------------------------- */
static inline __m256i nibbles16(const uint8_t *p) {   /* bytes 0-15: low nibbles, 16-31: high nibbles */
    /* the 16 bytes in both halves, the upper half shifted by 4: three instructions, not five */
    const __m256i raw = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
    return _mm256_and_si256(_mm256_srlv_epi64(raw, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(15));
}
static inline __m256i shr_and(__m256i v, int shift, int mask) {   /* per byte: (v >> shift) & mask */
    return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(shift)), _mm256_set1_epi8((char)mask));
}
static inline __m256i v32_q5_0(const uint8_t *b, int k) {
    (void)k;
    /* byte j of the result = 0xff where bit j of qh is set: broadcast qh's byte j/8, test bit j%8 */
    const __m256i sel = _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL, 0x0101010101010101LL, 0);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i hb = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)rd32(b + 2)), sel), bit);
    hb = _mm256_and_si256(_mm256_cmpeq_epi8(hb, bit), _mm256_set1_epi8(16));
    return _mm256_sub_epi8(_mm256_or_si256(nibbles16(b + 6), hb), _mm256_set1_epi8(16));
}
static inline __m256i lut_iq4(__m256i idx) {   /* IQ4_VALUES[idx] per byte: pshufb on the 16-entry table */
    const __m128i t = _mm_loadu_si128((const __m128i *)IQ4_VALUES);
    return _mm256_shuffle_epi8(_mm256_set_m128i(t, t), idx);
}
static inline __m256i v32_iq4_nl(const uint8_t *b, int k) { (void)k; return lut_iq4(nibbles16(b + 2)); }
static inline __m256i v32_iq4_xs(const uint8_t *b, int k) { return lut_iq4(nibbles16(b + 8 + 16 * k)); }
static inline __m256i v32_q6_k(const uint8_t *b, int k) {
    const int h = k / 4, s = k % 4;
    __m256i lo = shr_and(_mm256_loadu_si256((const __m256i *)(b + 64 * h + 32 * (s % 2))), 4 * (s / 2), 15);
    __m256i hi = shr_and(_mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h)), 2 * s, 3);
    return _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), _mm256_set1_epi8(32));
}
static inline __m256i v32_q2_k(const uint8_t *b, int k) {
    return shr_and(_mm256_loadu_si256((const __m256i *)(b + 16 + 32 * (k / 4))), 2 * (k % 4), 3);
}
static inline __m256i v32_q3_k(const uint8_t *b, int k) {
    __m256i lo = shr_and(_mm256_loadu_si256((const __m256i *)(b + 32 + 32 * (k / 4))), 2 * (k % 4), 3);
    __m256i hm = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)b), _mm256_set1_epi8((char)(1 << k)));
    __m256i minus4 = _mm256_and_si256(_mm256_cmpeq_epi8(hm, _mm256_setzero_si256()), _mm256_set1_epi8(4));
    return _mm256_sub_epi8(lo, minus4);
}
static inline __m256i v32_q4_k(const uint8_t *b, int k) {
    return shr_and(_mm256_loadu_si256((const __m256i *)(b + 16 + 32 * (k / 2))), 4 * (k % 2), 15);
}
static inline __m256i v32_q5_k(const uint8_t *b, int k) {
    __m256i lo = shr_and(_mm256_loadu_si256((const __m256i *)(b + 48 + 32 * (k / 2))), 4 * (k % 2), 15);
    __m256i hb = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(b + 16)), _mm256_set1_epi8((char)(1 << k)));
    hb = _mm256_andnot_si256(_mm256_cmpeq_epi8(hb, _mm256_setzero_si256()), _mm256_set1_epi8(16));
    return _mm256_or_si256(lo, hb);
}

/* ---- scales, AVX2: a 256-block's scales as vectors (8 per 32 in s[0], or 16 per 16 in s[0..1]),
   built in registers: filling a float array and loading it as a vector stalls store forwarding,
   which cost the kernels twice their time. Same products as prep_*, so the same numbers. ------- */
static inline __m256 f8_u8(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)); }
static inline __m256 f8_i8(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)); }
static inline void pv_none(const uint8_t *b, __m256 *s, __m256 *m) { (void)b; (void)s; (void)m; }
#define pv_q5_0 pv_none
#define pv_iq4_nl pv_none
static inline void pv_q4_k(const uint8_t *b, __m256 *s, __m256 *m) {
    const uint32_t s0 = rd32(b + 4), s1 = rd32(b + 8), s2 = rd32(b + 12);
    const __m128i v = _mm_set_epi32((int)(((s2 >> 4) & 0x0f0f0f0f) | (((s1 >> 6) & 0x03030303) << 4)), (int)(s1 & 0x3f3f3f3f),
                                    (int)((s2 & 0x0f0f0f0f) | (((s0 >> 6) & 0x03030303) << 4)), (int)(s0 & 0x3f3f3f3f));
    s[0] = _mm256_mul_ps(_mm256_set1_ps(h2f(rd16(b))), f8_u8(v));
    m[0] = _mm256_mul_ps(_mm256_set1_ps(h2f(rd16(b + 2))), f8_u8(_mm_srli_si128(v, 8)));
}
#define pv_q5_k pv_q4_k
static inline void pv_q6_k(const uint8_t *b, __m256 *s, __m256 *m) {
    (void)m;
    const __m128i v = _mm_loadu_si128((const __m128i *)(b + 192));
    const __m256 d = _mm256_set1_ps(h2f(rd16(b + 208)));
    s[0] = _mm256_mul_ps(d, f8_i8(v));
    s[1] = _mm256_mul_ps(d, f8_i8(_mm_srli_si128(v, 8)));
}
static inline void pv_q2_k(const uint8_t *b, __m256 *s, __m256 *m) {
    const __m128i v = _mm_loadu_si128((const __m128i *)b), lo = _mm_and_si128(v, _mm_set1_epi8(15));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(15));
    const __m256 d = _mm256_set1_ps(h2f(rd16(b + 80))), dmin = _mm256_set1_ps(h2f(rd16(b + 82)));
    s[0] = _mm256_mul_ps(d, f8_u8(lo));
    s[1] = _mm256_mul_ps(d, f8_u8(_mm_srli_si128(lo, 8)));
    m[0] = _mm256_mul_ps(dmin, f8_u8(hi));
    m[1] = _mm256_mul_ps(dmin, f8_u8(_mm_srli_si128(hi, 8)));
}
static inline void pv_q3_k(const uint8_t *b, __m256 *s, __m256 *m) {
    (void)m;
    const uint32_t a0 = rd32(b + 96), a1 = rd32(b + 100), hi = rd32(b + 104);
    const __m128i v = _mm_set_epi32((int)(((a1 >> 4) & 0x0f0f0f0f) | (((hi >> 6) & 0x03030303) << 4)),
                                    (int)(((a0 >> 4) & 0x0f0f0f0f) | (((hi >> 4) & 0x03030303) << 4)),
                                    (int)((a1 & 0x0f0f0f0f) | (((hi >> 2) & 0x03030303) << 4)),
                                    (int)((a0 & 0x0f0f0f0f) | ((hi & 0x03030303) << 4)));
    const __m128i c = _mm_sub_epi8(v, _mm_set1_epi8(32));   /* 0..63 - 32: fits int8 */
    const __m256 d = _mm256_set1_ps(h2f(rd16(b + 108)));
    s[0] = _mm256_mul_ps(d, f8_i8(c));
    s[1] = _mm256_mul_ps(d, f8_i8(_mm_srli_si128(c, 8)));
}
static inline void pv_iq4_xs(const uint8_t *b, __m256 *s, __m256 *m) {
    (void)m;
    const uint16_t h = rd16(b + 2);
    uint64_t u = 0;
    for (int i = 0; i < 8; i++)
        u |= (uint64_t)(((b[4 + i / 2] >> (4 * (i % 2))) & 15) | (((h >> (2 * i)) & 3) << 4)) << (8 * i);
    const __m128i c = _mm_sub_epi8(_mm_cvtsi64_si128((long long)u), _mm_set1_epi8(32));
    s[0] = _mm256_mul_ps(_mm256_set1_ps(h2f(rd16(b))), f8_i8(c));
}
/* the same values as unsigned bytes, before the format's offset (v32 = u32 - off): the VNNI
   kernel's first operand is unsigned */
static inline __m256i u32_q5_0(const uint8_t *b, int k) {
#if defined(__AVX512BW__) && defined(__AVX512VL__)   /* the fifth bits as a mask register: + 16 where set */
    (void)k;
    const __m256i lo = nibbles16(b + 6);
    return _mm256_mask_add_epi8(lo, (__mmask32)rd32(b + 2), lo, _mm256_set1_epi8(16));
#else
    return _mm256_add_epi8(v32_q5_0(b, k), _mm256_set1_epi8(16));
#endif
}
static inline __m256i u32_q6_k(const uint8_t *b, int k) { return _mm256_add_epi8(v32_q6_k(b, k), _mm256_set1_epi8(32)); }
#define u32_q4_k v32_q4_k
#define u32_q5_k v32_q5_k
#define u32_q2_k v32_q2_k
#define u32_q3_k v32_q3_k
#define u32_iq4_nl v32_iq4_nl
#define u32_iq4_xs v32_iq4_xs
typedef void (*PrepV)(const uint8_t *, __m256 *, __m256 *);

typedef __m256i (*V32Fn)(const uint8_t *, int);

/* A block's start in both two-row kernels (dot2_file_avx2, dot2_file_v8): prefetch its lines, then
   the weight scales times the activations'. A 32-value block: ms[0]. Per-32 scales: ms[0..7], and
   the mins' term (min * the 32 activations' sum) into *mv. Per-16 scales are left to the caller:
   the weight scales (and mins) in s[0..1] (m[0..1]), the activation scales (one per 32, or the
   block's one) in *dx8. */
static inline __attribute__((always_inline)) void block_scales(const uint8_t *b, int i, const Act *a, const FileFmt f,
                                                               PrepFn prep, PrepV pv, float *ms, __m256 *mv,
                                                               __m256 s[2], __m256 m[2], __m256 *dx8) {
    const int nk = f.bv / 32;
    if (f.bb >= 64) for (int o = 0; o < f.bb; o += 64) PF2(b + o);
    else if ((i * f.bb) % 64 < f.bb) PF2(b);   /* small blocks: once per line */
    if (nk == 1) {   /* a 32-value block: one scale */
        float sc[16], mn[16];
        prep(b, sc, mn);
        ms[0] = sc[0] * a->d[i];
        return;
    }
    pv(b, s, m);
    *dx8 = _mm256_loadu_ps((f.a8 ? a->kd : a->d) + i * nk);
    if (f.per16) return;
    _mm256_storeu_ps(ms, _mm256_mul_ps(s[0], *dx8));
    if (f.has_min == 2) *mv = _mm256_fmadd_ps(m[0], _mm256_loadu_ps(f.a8 ? a->ks + 8 * i : a->s + i * nk), *mv);
}

/* Two rows at once (rows2 in qdecode.c does the same for our own layouts): the activation loads,
   their scales and (Q2_K) their 16-sums are shared. Per block the weight scales times the
   activations' are formed 8 at a time, then broadcast from memory, one per 16 or 32 values. */
static inline __attribute__((always_inline)) void dot2_file_avx2(const QW *w, int r, const Act *a, float *out,
                                                                 const FileFmt f, PrepFn prep, PrepV pv, V32Fn v32) {
    const size_t rb = (size_t)(w->cols / f.bv) * f.bb;
    const uint8_t *row[2] = {(const uint8_t *)w->q + (size_t)r * rb, (const uint8_t *)w->q + (size_t)(r + 1) * rb};
    const int nk = f.bv / 32;
    const __m256i ones = _mm256_set1_epi16(1);
    float ms[2][16], mm[2][16];
    __m256 v[2][2], mv[2];
    for (int t = 0; t < 2; t++) v[t][0] = v[t][1] = mv[t] = _mm256_setzero_ps();
    for (int i = 0; i < w->cols / f.bv; i++) {
        for (int t = 0; t < 2; t++) {
            __m256 s[2], m[2], d8;
            block_scales(row[t] + (size_t)i * f.bb, i, a, f, prep, pv, ms[t], &mv[t], s, m, &d8);
            if (nk > 1 && f.per16) {   /* one activation scale serves two weight scales */
                const __m256 lo = _mm256_permutevar8x32_ps(d8, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
                const __m256 hi = _mm256_permutevar8x32_ps(d8, _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7));
                _mm256_storeu_ps(ms[t], _mm256_mul_ps(s[0], lo));
                _mm256_storeu_ps(ms[t] + 8, _mm256_mul_ps(s[1], hi));
                if (f.has_min == 1) {
                    _mm256_storeu_ps(mm[t], _mm256_mul_ps(m[0], lo));
                    _mm256_storeu_ps(mm[t] + 8, _mm256_mul_ps(m[1], hi));
                }
            }
        }
#pragma GCC unroll 8
        for (int k = 0; k < nk; k++) {   /* unrolled: the shifts and bit masks become constants */
            const int g = i * nk + k;
            const __m256i x0 = f.a8 ? _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(a->k8 + 32 * g)))
                                    : _mm256_loadu_si256((const __m256i *)(a->q + 32 * g));
            const __m256i x1 = f.a8 ? _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(a->k8 + 32 * g + 16)))
                                    : _mm256_loadu_si256((const __m256i *)(a->q + 32 * g + 16));
            __m256 xs0 = _mm256_setzero_ps(), xs1 = xs0;
            if (f.has_min == 1) {
                xs0 = _mm256_cvtepi32_ps(_mm256_madd_epi16(x0, ones));
                xs1 = _mm256_cvtepi32_ps(_mm256_madd_epi16(x1, ones));
            }
            for (int t = 0; t < 2; t++) {
                const __m256i q = v32(row[t] + (size_t)i * f.bb, k);
                const __m256i q0 = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(q));
                const __m256i q1 = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1));
                /* two accumulators a row: one chain of dependent FMAs per row was the limit */
                if (!f.per16) {   /* one sum per 32: two VNNI multiply-adds where the CPU has them */
                    v[t][k & 1] = _mm256_fmadd_ps(_mm256_broadcast_ss(&ms[t][k]), _mm256_cvtepi32_ps(DOT2(q0, x0, q1, x1)),
                                                  v[t][k & 1]);
                } else {
                    const __m256i p0 = _mm256_madd_epi16(q0, x0), p1 = _mm256_madd_epi16(q1, x1);
                    v[t][0] = _mm256_fmadd_ps(_mm256_broadcast_ss(&ms[t][2 * k]), _mm256_cvtepi32_ps(p0), v[t][0]);
                    v[t][1] = _mm256_fmadd_ps(_mm256_broadcast_ss(&ms[t][2 * k + 1]), _mm256_cvtepi32_ps(p1), v[t][1]);
                }
                if (f.has_min == 1) {   /* - min * (sum of the 16 activations) */
                    v[t][0] = _mm256_fnmadd_ps(_mm256_broadcast_ss(&mm[t][2 * k]), xs0, v[t][0]);
                    v[t][1] = _mm256_fnmadd_ps(_mm256_broadcast_ss(&mm[t][2 * k + 1]), xs1, v[t][1]);
                }
            }
        }
    }
    for (int t = 0; t < 2; t++) out[t] = hsum(_mm256_add_ps(v[t][0], v[t][1])) - (f.has_min == 2 ? hsum(mv[t]) : 0.f);
}

#ifdef QD_VNNI8
/* dot2_file_avx2 on VNNI: per 32 values, u = the weights as unsigned bytes (value + off), and
   u . q = 256 (u . q1) + u . q2 in two u8 x s8 multiply-adds (q = 256 q1 + q2, split_act); then
   value . q = u . q - off * (q summed per 4), still per int32 lane. A lane holds 4 values, so
   lanes 0-3 are the first 16 and 4-7 the next (a scale per 16: one permute). Lane sums stay below
   2^24, so they convert to fp32 exactly, and the result is the int16 kernels' to fp32 rounding. */
static inline __attribute__((always_inline)) void dot2_file_v8(const QW *w, int r, const Act *a, float *out,
                                                               const FileFmt f, PrepFn prep, PrepV pv, V32Fn u32) {
    const size_t rb = (size_t)(w->cols / f.bv) * f.bb;
    const uint8_t *row[2] = {(const uint8_t *)w->q + (size_t)r * rb, (const uint8_t *)w->q + (size_t)(r + 1) * rb};
    const int nk = f.bv / 32, shift = f.off == 32 ? 5 : 4;
    __m256 v[2][2], mv[2], S[2][2];
    for (int t = 0; t < 2; t++) v[t][0] = v[t][1] = mv[t] = S[t][0] = S[t][1] = _mm256_setzero_ps();
    float ms[2][8];
    for (int i = 0; i < w->cols / f.bv; i++) {
        for (int t = 0; t < 2; t++) {
            __m256 s[2], m[2], d8;
            block_scales(row[t] + (size_t)i * f.bb, i, a, f, prep, pv, ms[t], &mv[t], s, m, &d8);
            if (nk > 1 && f.per16) {   /* one activation scale serves two weight scales */
                S[t][0] = _mm256_mul_ps(s[0], _mm256_permutevar8x32_ps(d8, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3)));
                S[t][1] = _mm256_mul_ps(s[1], _mm256_permutevar8x32_ps(d8, _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7)));
            }
        }
#pragma GCC unroll 8
        for (int k = 0; k < nk; k++) {
            const int g = i * nk + k;
            const __m256i x1 = _mm256_loadu_si256((const __m256i *)(a->q1 + 32 * g));
            const __m256i x2 = _mm256_loadu_si256((const __m256i *)(a->q2 + 32 * g));
            __m256i corr = _mm256_setzero_si256();
            if (f.off) corr = _mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)(a->q4 + 8 * g)), shift);
            for (int t = 0; t < 2; t++) {
                const __m256i u = u32(row[t] + (size_t)i * f.bb, k);
                __m256i p = DPBUSD(_mm256_slli_epi32(DPBUSD(_mm256_setzero_si256(), u, x1), 8), u, x2);
                if (f.off) p = _mm256_sub_epi32(p, corr);
                const __m256 pf = _mm256_cvtepi32_ps(p);
                if (!f.per16) {
                    v[t][k & 1] = _mm256_fmadd_ps(_mm256_broadcast_ss(&ms[t][nk == 1 ? 0 : k]), pf, v[t][k & 1]);
                } else {   /* lanes 0-3: scale 2k, lanes 4-7: scale 2k + 1 */
                    const int j = 2 * (k & 3);
                    const __m256 sl = _mm256_permutevar8x32_ps(S[t][k >> 2], _mm256_setr_epi32(j, j, j, j, j + 1, j + 1, j + 1, j + 1));
                    v[t][k & 1] = _mm256_fmadd_ps(sl, pf, v[t][k & 1]);
                }
            }
        }
    }
    for (int t = 0; t < 2; t++) out[t] = hsum(_mm256_add_ps(v[t][0], v[t][1])) - (f.has_min == 2 ? hsum(mv[t]) : 0.f);
}
#endif

static inline __attribute__((always_inline)) void dequant_file_avx2(const QW *w, int r, float *out, const FileFmt f,
                                                                    PrepFn prep, PrepV pv, V32Fn v32) {
    (void)pv;
    const uint8_t *row = file_row(w, r, &f);
    float sc[16], mn[16] = {0};
    for (int i = 0; i < w->cols / f.bv; i++) {
        const uint8_t *b = row + (size_t)i * f.bb;
        prep(b, sc, mn);
        for (int k = 0; k < f.bv / 32; k++) {
            const __m256i q = v32(b, k);
            const __m128i h[2] = {_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1)};
            float *o = out + (size_t)i * f.bv + 32 * k;
            for (int g = 0; g < 4; g++) {   /* 8 values at a time; groups 0-1 are the first 16 */
                __m128i part = g % 2 ? _mm_srli_si128(h[g / 2], 8) : h[g / 2];
                __m256 val = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(part));
                __m256 y = _mm256_mul_ps(_mm256_set1_ps(sc[SI(f, k, g / 2)]), val);
                if (f.has_min) y = _mm256_sub_ps(y, _mm256_set1_ps(mn[SI(f, k, g / 2)]));
                _mm256_storeu_ps(o + 8 * g, y);
            }
        }
    }
}
#define FILE_CASE(K, NAME, OP, ...) \
    case K: WITH_A8(K, OP##_file_avx2(__VA_ARGS__, F, prep_##NAME, pv_##NAME, v32_##NAME)) break;
#ifdef QD_VNNI8
#define FILE_CASE_V8(K, NAME, OP, ...) \
    case K: WITH_A8(K, if (F.v8 && !F.a8) dot2_file_v8(__VA_ARGS__, F, prep_##NAME, pv_##NAME, u32_##NAME); \
                       else dot2_file_avx2(__VA_ARGS__, F, prep_##NAME, pv_##NAME, v32_##NAME)) break;
#endif
#endif
#define FILE_CASE_C(K, NAME, OP, ...) \
    case K: WITH_A8(K, OP##_file_c(__VA_ARGS__, F, prep_##NAME, c32_##NAME)) break;

#define FILE_CASES(CASE, OP, ...) \
    CASE(K_Q5_0, q5_0, OP, __VA_ARGS__) CASE(K_Q6_K, q6_k, OP, __VA_ARGS__) \
    CASE(K_Q2_K, q2_k, OP, __VA_ARGS__) CASE(K_Q3_K, q3_k, OP, __VA_ARGS__) \
    CASE(K_IQ4_NL, iq4_nl, OP, __VA_ARGS__) CASE(K_IQ4_XS, iq4_xs, OP, __VA_ARGS__) \
    CASE(K_Q4_K, q4_k, OP, __VA_ARGS__) CASE(K_Q5_K, q5_k, OP, __VA_ARGS__)

/* One row of a file-format weight: its dot with the quantized activations, or its fp32 values.
   The AVX2 build takes rows two at a time (dot2_file); a last odd row and other CPUs use the
   portable dot. */
static float dot_file(const QW *w, int r, const Act *a) {
    const int u8 = a->use8;
    float y = 0.f;
    switch (w->kind) { FILE_CASES(FILE_CASE_C, y = dot, w, r, a) }
    return y;
}
#ifdef QD_AVX2
static void dot2_file(const QW *w, int r, const Act *a, float *out) {
    const int u8 = a->use8;
#ifdef QD_VNNI8
    switch (w->kind) { FILE_CASES(FILE_CASE_V8, dot2, w, r, a, out) }
#else
    switch (w->kind) { FILE_CASES(FILE_CASE, dot2, w, r, a, out) }
#endif
}
static void dequant_file(const QW *w, int r, float *out) {
    const int u8 = 0;
    switch (w->kind) { FILE_CASES(FILE_CASE, dequant, w, r, out) }
}
#else
static void dequant_file(const QW *w, int r, float *out) {
    const int u8 = 0;
    switch (w->kind) { FILE_CASES(FILE_CASE_C, dequant, w, r, out) }
}
#endif
