/* The K-quant GEMVs (Q4_K, Q5_K, Q6_K: 256-value blocks) on VNNI, scaled once per 16 sums.
 *
 * #included by qdecode.c after qformats.h (whose pv/u32 pieces it reuses). dot2_file_v8 scales
 * every 32-value group's eight int32 lanes on their own: a convert, a broadcast and an FMA per
 * 32 values a row. Here a block's eight group vectors are first summed across lanes by a
 * transpose tree (unpacks and adds), so per 256 values a row there are two converts and two
 * FMAs, with the weight scales times the activations' formed once as vectors. Measured on this
 * Zen 4 (one thread, thread CPU time): 2-6% on Q4_K/Q5_K and 2-4% on Q6_K, not the 1.5x the
 * instruction count suggested; the kernels stay near 14-18 GB/s from L2 and DRAM alike
 * (docs/notes.md, "CPU decode, fourth push").
 *
 * After two tree levels, lane j (0-3) of U0 holds group j's sum over its first 16 values and lane
 * 4 + j its second 16; U1 likewise for groups 4-7. Those are the per-16 sums, so a per-16 format
 * (Q6_K) needs no third level, and a per-32 one multiplies both halves by its group's scale.
 * Every per-16 sum is an exact integer below 2^24 (|value - offset| <= 32, |q| <= 32639, 16
 * values: 16,711,168), so its conversion to fp32 is exact, and a row's result differs from the
 * int16 reference only by the fp32 products and sums of these 16-value sums (two roundings per
 * 16 values, against one per 4 values' lane in dot2_file_v8).
 *
 * With the int8 activations (f.a8: Act.use8, quantize_k8) a group is one VNNI multiply-add of the
 * weights' unsigned bytes with the activations, not two, and the offset's correction (Q6_K's
 * value + 32) is taken once per 16 after the tree from the activations' 16-sums: the Qwen3-0.6B
 * shape's Q4_K layers 14-15 -> 17.5 GB/s a thread, its Q6_K head 17.8 -> 22.
 */
#ifdef QD_VNNI8
static inline __m256i tree2(__m256i a, __m256i b) {   /* per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3] */
    return _mm256_add_epi32(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
}
static inline __m256i tree4(__m256i t0, __m256i t1) {   /* per 128-bit lane: the four inputs' sums */
    return _mm256_add_epi32(_mm256_unpacklo_epi64(t0, t1), _mm256_unpackhi_epi64(t0, t1));
}

/* The 32-group k of both rows as int32 lanes, lanes 0-3 its first 16 values and 4-7 the rest: VNNI
   on the activations' byte planes, as dot2_file_v8. (A plain-AVX2 version, madd on the widened
   values with a lane-crossing pair to separate the halves, ran slower than dot2_file_avx2: Q4_K
   10.4 against 11.8 GB/s from L2, so those CPUs keep it.) */
#define KT_GROUP8(u32)                                                                                      \
    const __m256i x = _mm256_loadu_si256((const __m256i *)(a->k8 + 32 * g));                                \
    for (int t = 0; t < 2; t++) P[t][k] = DPBUSD(_mm256_setzero_si256(), u32(b[t], k), x);
#define KT_GROUP(u32)                                                                                       \
    const __m256i x1 = _mm256_loadu_si256((const __m256i *)(a->q1 + 32 * g));                               \
    const __m256i x2 = _mm256_loadu_si256((const __m256i *)(a->q2 + 32 * g));                               \
    __m256i corr = _mm256_setzero_si256();                                                                  \
    if (f.off) corr = _mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)(a->q4 + 8 * g)), shift);       \
    for (int t = 0; t < 2; t++) {                                                                           \
        const __m256i u = u32(b[t], k);                                                                     \
        __m256i p = DPBUSD(_mm256_slli_epi32(DPBUSD(_mm256_setzero_si256(), u, x1), 8), u, x2);             \
        P[t][k] = f.off ? _mm256_sub_epi32(p, corr) : p;                                                    \
    }

static inline __attribute__((always_inline)) void dot2_ktree(const QW *w, int r, const Act *a, float *out,
                                                             const FileFmt f, PrepV pv, V32Fn u32) {
    const size_t rb = (size_t)(w->cols / 256) * f.bb;
    const uint8_t *row[2] = {(const uint8_t *)w->q + (size_t)r * rb, (const uint8_t *)w->q + (size_t)(r + 1) * rb};
    const int shift = f.off == 32 ? 5 : 4;
    const __m256i lo4 = _mm256_setr_epi32(0, 1, 2, 3, 0, 1, 2, 3), hi4 = _mm256_setr_epi32(4, 5, 6, 7, 4, 5, 6, 7);
    const __m256i even_odd = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    __m256 v[2][2], mv[2];
    for (int t = 0; t < 2; t++) v[t][0] = v[t][1] = mv[t] = _mm256_setzero_ps();
    for (int i = 0; i < w->cols / 256; i++) {
        const uint8_t *b[2] = {row[0] + (size_t)i * f.bb, row[1] + (size_t)i * f.bb};
        __m256i P[2][8];
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            const int g = i * 8 + k;
            if (f.a8) { KT_GROUP8(u32) } else { KT_GROUP(u32) }
        }
        /* int8 activations: the offset's correction per 16, after the tree */
        const __m256 d8 = _mm256_loadu_ps((f.a8 ? a->kd : a->d) + i * 8);
        const __m256 dlo = _mm256_permutevar8x32_ps(d8, lo4), dhi = _mm256_permutevar8x32_ps(d8, hi4);
        __m256i C0 = _mm256_setzero_si256(), C1 = C0;
        if (f.a8 && f.off) {
            C0 = _mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)(a->kb + 16 * i)), shift);
            C1 = _mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)(a->kb + 16 * i + 8)), shift);
        }
        for (int t = 0; t < 2; t++) {
            for (int o = 0; o < f.bb; o += 64) PF2(b[t] + o);
            __m256i U0 = tree4(tree2(P[t][0], P[t][1]), tree2(P[t][2], P[t][3]));
            __m256i U1 = tree4(tree2(P[t][4], P[t][5]), tree2(P[t][6], P[t][7]));
            if (f.a8 && f.off) { U0 = _mm256_sub_epi32(U0, C0); U1 = _mm256_sub_epi32(U1, C1); }
            __m256 s[2], m[2], SA, SB;
            pv(b[t], s, m);
            if (f.per16) {   /* U0's lanes are scales 0, 2, 4, 6, 1, 3, 5, 7; U1's the same plus 8 */
                SA = _mm256_mul_ps(_mm256_permutevar8x32_ps(s[0], even_odd), dlo);
                SB = _mm256_mul_ps(_mm256_permutevar8x32_ps(s[1], even_odd), dhi);
            } else {   /* one scale per group, for both its halves */
                const __m256 ms = _mm256_mul_ps(s[0], d8);
                SA = _mm256_permutevar8x32_ps(ms, lo4);
                SB = _mm256_permutevar8x32_ps(ms, hi4);
                if (f.has_min == 2) mv[t] = _mm256_fmadd_ps(m[0], _mm256_loadu_ps((f.a8 ? a->ks : a->s) + i * 8), mv[t]);
            }
            v[t][0] = _mm256_fmadd_ps(SA, _mm256_cvtepi32_ps(U0), v[t][0]);
            v[t][1] = _mm256_fmadd_ps(SB, _mm256_cvtepi32_ps(U1), v[t][1]);
        }
    }
    for (int t = 0; t < 2; t++) out[t] = hsum(_mm256_add_ps(v[t][0], v[t][1])) - (f.has_min == 2 ? hsum(mv[t]) : 0.f);
}
#undef KT_GROUP
#undef KT_GROUP8

/* 1 when dot2_ktree serves this kind (rows two at a time) */
static inline int ktree_kind(int kind) { return kind == K_Q4_K || kind == K_Q5_K || kind == K_Q6_K; }

static void dot2_kt(const QW *w, int r, const Act *a, float *out) {
    const int u8 = a->use8;
#define KT_CASE(K, NAME) case K: WITH_A8(K, dot2_ktree(w, r, a, out, F, pv_##NAME, u32_##NAME)) break;
    switch (w->kind) { KT_CASE(K_Q4_K, q4_k) KT_CASE(K_Q5_K, q5_k) KT_CASE(K_Q6_K, q6_k) }
#undef KT_CASE
}
#endif
