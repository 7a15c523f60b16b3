/* The prefill GEMM in bf16: the bf16 path's matmuls on this pool (bits 0 in qgemm.c), on AMX
 * tiles where the CPU has them, else on AVX-512 BF16's VDPBF16PS (Zen 4, Cooper Lake and later).
 * #included by qgemm.c (it uses GCtx, GPhase, the pool and weight_row_bf16).
 *
 * Why our own: oneDNN's tile GEMM (through torch.matmul) splits each matrix statically over
 * OpenMP's threads, so with another program on one core two threads prefilled slower than one
 * (1,425 against 1,507 tok/s); it needs each weight dequantized to bf16 in memory first (a fifth
 * of the prefill); and it rounds its fp32 sums to bf16. Here a block of weight rows is claimed
 * dynamically like every other block of this pool, dequantized into the thread's scratch, and
 * multiplied over all the tokens while it is in L2; the sums stay fp32. Against the int16 GEMM
 * (qgemm.c's kern16) VDPBF16PS does as many multiply-adds an instruction (32) with no scale step
 * per block of 32 inputs, and the weights are dequantized once per block of rows, not per token.
 *
 * Weights, both kernels: 16 weight rows x 32 inputs as 16 lines of 64 bytes, line i holding
 * inputs 2i and 2i+1 of each of the 16 rows side by side (the B tile TDPBF16PS reads; for
 * VDPBF16PS one line is one vector of 16 rows' pairs).
 * Activations: AMX: row-major bf16 as they are (A tiles of 16 tokens x 32 inputs). AVX-512:
 * per 16 tokens [k / 2][16 tokens] pairs, so the 16 pairs one step broadcasts share a line.
 * Tiles (all eight 16 rows x 64 bytes): A, B as above; C = 16 tokens x 16 weight rows, fp32.
 * Each step multiplies 32 tokens by 32 weight rows (2 x 2 tiles); the AVX-512 kernel holds
 * 8 tokens x 32 rows of sums in 16 registers.
 */
/* gcc names the AMX macros __AMX_TILE__ / __AMX_BF16__; clang 14 (Debian 12's, as in CI) __AMXTILE__ / __AMXBF16__ */
#if (defined(__AMX_TILE__) || defined(__AMXTILE__)) && (defined(__AMX_BF16__) || defined(__AMXBF16__)) && \
    defined(QB_BF16) && defined(__linux__)
#define QG_AMX 1
#include <sys/syscall.h>
#include <unistd.h>

/* 1 when this process may use the tile registers (Linux grants them on request, once a process) */
static int amx_ready(void) {
    static int ok = -1;
    if (ok < 0) ok = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
    return ok;
}

typedef struct {
    uint8_t palette, start_row, pad[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} TileCfg;

static void tiles_on(void) {
    TileCfg cfg = {0};
    cfg.palette = 1;
    for (int i = 0; i < 8; i++) { cfg.colsb[i] = 64; cfg.rows[i] = 16; }
    _tile_loadconfig(&cfg);
}
#else
static int amx_ready(void) { return 0; }
#endif

#ifdef QB_BF16
#define QG_BF16 1

/* out[j][i] = r[i][j] for 16 x 16 32-bit values */
static inline void transpose16(__m512i r[16]) {
    __m512i a[16], b[16];
    for (int i = 0; i < 8; i++) {
        a[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        a[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {   /* b[4i + c], lane L: column 4L + c of rows 4i..4i+3 */
        b[4 * i] = _mm512_unpacklo_epi64(a[4 * i], a[4 * i + 2]);
        b[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i], a[4 * i + 2]);
        b[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
        b[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
    }
    for (int c = 0; c < 4; c++) {   /* then the 4 x 4 transpose of 128-bit lanes */
        const __m512i u0 = _mm512_shuffle_i32x4(b[c], b[4 + c], 0x44), u1 = _mm512_shuffle_i32x4(b[c], b[4 + c], 0xEE);
        const __m512i u2 = _mm512_shuffle_i32x4(b[8 + c], b[12 + c], 0x44), u3 = _mm512_shuffle_i32x4(b[8 + c], b[12 + c], 0xEE);
        r[c] = _mm512_shuffle_i32x4(u0, u2, 0x88);
        r[4 + c] = _mm512_shuffle_i32x4(u0, u2, 0xDD);
        r[8 + c] = _mm512_shuffle_i32x4(u1, u3, 0x88);
        r[12 + c] = _mm512_shuffle_i32x4(u1, u3, 0xDD);
    }
}

/* 16 rows of n 32-bit values (row stride n) -> [n / 16 chunks][16 rows][16], i.e. column j of
   the rows as line j: the pairs of 16 rows side by side (n % 16 == 0) */
static void interleave16(const uint32_t *rows, int n, uint32_t *out) {
    for (int j0 = 0; j0 < n; j0 += 16) {
        __m512i v[16];
        for (int i = 0; i < 16; i++) v[i] = _mm512_loadu_si512((const void *)(rows + (size_t)i * n + j0));
        transpose16(v);
        for (int i = 0; i < 16; i++) _mm512_storeu_si512((void *)(out + (size_t)(j0 + i) * 16), v[i]);
    }
}

/* The bf16 input rows [t0, t0 + 16) of x (zero past t) into token group b of the shared buffer,
   row-major for the tiles, pair-interleaved for VDPBF16PS */
static void bf16_input_block(GCtx *c, const GPhase *p, int b, int tid, uint64_t s) {
    GScratch *sc = &c->scr[tid];
    const int k = p->k, t0 = b * QG_TOK;
    uint16_t *g = (uint16_t *)sc->gq;   /* 16 x k bf16: gq holds 2 * 16 * k bytes */
    for (int i = 0; i < QG_TOK; i++) {
        if (t0 + i < p->t) row_to_bf16(p->x + (size_t)(t0 + i) * k, g + (size_t)i * k, k);
        else memset(g + (size_t)i * k, 0, sizeof(uint16_t) * (size_t)k);
    }
    if (!amx_ready()) {   /* q (QG_RB_MAX * k bytes) is free between this thread's GEMM blocks */
        interleave16((const uint32_t *)g, k / 2, (uint32_t *)sc->q);
        g = (uint16_t *)sc->q;
    }
    if (!pool_take(&c->pool, s, b)) return;
    memcpy(c->aq + (size_t)b * QG_TOK * k * 2, g, sizeof(uint16_t) * QG_TOK * (size_t)k);
    if (pool_published(&c->pool, s, b, p->nb)) {   /* the input is ready: open the GEMM */
        pool_open_begin(&c->pool, s);
        c->ph = c->next;
        pool_open_end(&c->pool, s);
    }
}

/* Rows [r0, r0 + rp) of w (zero past its last row), 16 at a time: group m, inputs 32kc.., at
   (m * nk + kc) * 256 pairs */
static void pack_weights(const QW *w, int r0, int rp, GScratch *sc, uint32_t *bt) {
    const int k = w->cols, nk = k / 32;
    uint16_t *rows = (uint16_t *)sc->q;   /* 16 rows of k bf16: q holds QG_RB_MAX * k bytes */
    for (int m = 0; m < rp / 16; m++) {
        for (int n = 0; n < 16; n++) {
            uint16_t *row = rows + (size_t)n * k;
            if (r0 + 16 * m + n < w->rows) weight_row_bf16(w, r0 + 16 * m + n, sc->gd, row);
            else memset(row, 0, sizeof(uint16_t) * (size_t)k);
        }
        interleave16((const uint32_t *)rows, k / 2, bt + (size_t)m * nk * 256);
    }
}

#ifdef QG_AMX
/* out[tp][rp] (fp32) on the tiles: 32 tokens x 32 rows a step. 0: rescued, someone published. */
static int amx_tiles(GCtx *c, const GPhase *p, int b, uint64_t s, const uint32_t *bt, int rp, float *out) {
    const int k = p->w.cols, nk = k / 32;
    const uint16_t *xa = (const uint16_t *)c->aq;
    const size_t xs = (size_t)k * 2, os = (size_t)rp * 4;
    tiles_on();
    for (int t = 0; t < p->tp; t += 32) {
        if (!pool_unpublished(&c->pool, s, b)) { _tile_release(); return 0; }
        for (int m = 0; m < rp / 16; m += 2) {
            _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
            for (int kc = 0; kc < nk; kc++) {
                _tile_loadd(4, xa + (size_t)t * k + kc * 32, xs);
                _tile_loadd(5, xa + (size_t)(t + 16) * k + kc * 32, xs);
                _tile_loadd(6, bt + ((size_t)m * nk + kc) * 256, 64);
                _tile_loadd(7, bt + ((size_t)(m + 1) * nk + kc) * 256, 64);
                _tile_dpbf16ps(0, 4, 6);
                _tile_dpbf16ps(1, 4, 7);
                _tile_dpbf16ps(2, 5, 6);
                _tile_dpbf16ps(3, 5, 7);
            }
            float *o = out + (size_t)t * rp + m * 16;
            _tile_stored(0, o, os);
            _tile_stored(1, o + 16, os);
            _tile_stored(2, o + 16 * rp, os);
            _tile_stored(3, o + 16 * rp + 16, os);
        }
    }
    _tile_release();
    return 1;
}
#endif

#define DP_T 8   /* tokens a VDPBF16PS step holds (x 2 groups of 16 rows: 16 accumulators) */

/* o[n][0..32) = tokens n < DP_T of xa (pairs [k / 2][16]) times the 32 rows of w0, w1 */
static inline __attribute__((always_inline)) void dp_tile(const uint32_t *xa, const uint32_t *w0, const uint32_t *w1,
                                                          int kp, float *o, size_t os) {
    __m512 acc[DP_T][2];
    for (int n = 0; n < DP_T; n++) acc[n][0] = acc[n][1] = _mm512_setzero_ps();
    for (int j = 0; j < kp; j++) {
        const __m512bh a = (__m512bh)_mm512_load_si512((const void *)(w0 + (size_t)j * 16));
        const __m512bh b = (__m512bh)_mm512_load_si512((const void *)(w1 + (size_t)j * 16));
        for (int n = 0; n < DP_T; n++) {
            const __m512bh x = (__m512bh)_mm512_set1_epi32((int)xa[(size_t)j * 16 + n]);
            acc[n][0] = _mm512_dpbf16_ps(acc[n][0], x, a);
            acc[n][1] = _mm512_dpbf16_ps(acc[n][1], x, b);
        }
    }
    for (int n = 0; n < DP_T; n++) {
        _mm512_storeu_ps(o + n * os, acc[n][0]);
        _mm512_storeu_ps(o + n * os + 16, acc[n][1]);
    }
}

/* out[tp][rp] (fp32) with VDPBF16PS: 16 tokens (two steps of DP_T) x all the block's rows at a
   time, so the group's inputs stay in L1. 0: rescued, someone published. */
static int dp_tiles(GCtx *c, const GPhase *p, int b, uint64_t s, const uint32_t *bt, int rp, float *out) {
    const int k = p->w.cols, kp = k / 2;
    for (int t = 0; t < p->tp; t += QG_TOK) {
        if (!pool_unpublished(&c->pool, s, b)) return 0;
        const uint32_t *xg = (const uint32_t *)c->aq + (size_t)t * kp;
        for (int h = 0; h < QG_TOK; h += DP_T)
            for (int m = 0; m < rp / 16; m += 2)
                dp_tile(xg + h, bt + (size_t)m * kp * 16, bt + (size_t)(m + 1) * kp * 16, kp,
                        out + (size_t)(t + h) * rp + m * 16, (size_t)rp);
    }
    return 1;
}

/* The block's product over every token into the thread's out[tp][rp], rp whole 32-row steps */
static int bf16_gemm_block(GCtx *c, const GPhase *p, int b, int tid, uint64_t s, int rp) {
    GScratch *sc = &c->scr[tid];
    uint32_t *bt = (uint32_t *)sc->q16;   /* rp x k bf16: q16 holds 2 * QG_RB_MAX * k bytes */
    pack_weights(&p->w, b * p->rb, rp, sc, bt);
#ifdef QG_AMX
    if (amx_ready()) return amx_tiles(c, p, b, s, bt, rp, sc->out);
#endif
    return dp_tiles(c, p, b, s, bt, rp, sc->out);
}
#endif

/* The bf16 GEMM (bits 0) here: 1 on AMX tiles, 2 with AVX-512 BF16, 0 none */
int qg_bf16(void) {
#ifdef QG_BF16
    return amx_ready() ? 1 : 2;
#else
    return 0;
#endif
}
