/* The prefill GEMM on AMX tiles: the bf16 path's matmuls on this pool (bits 0 in qgemm.c).
 * #included by qgemm.c (it uses GCtx, GPhase, the pool and weight_row_bf16).
 *
 * Why our own: oneDNN's tile GEMM (through torch.matmul) splits each matrix statically over
 * OpenMP's threads, so with another program on one core two threads prefilled slower than one
 * (1,425 against 1,507 tok/s); it needs each weight dequantized to bf16 in memory first (a fifth
 * of the prefill); and it rounds its fp32 sums to bf16. Here a block of weight rows is claimed
 * dynamically like every other block of this pool, dequantized into the thread's scratch, and
 * multiplied over all the tokens while it is in L2; the sums stay fp32.
 *
 * Tiles (all eight 16 rows x 64 bytes): A = 16 tokens x 32 inputs of the bf16 activations,
 * row-major as they are; B = 32 inputs x 16 weight rows in the pair-interleaved layout
 * TDPBF16PS reads (row i holds inputs 2i and 2i+1 of each weight row, side by side); C = 16
 * tokens x 16 weight rows, fp32. Each step multiplies 32 tokens by 32 weight rows (2 x 2 tiles).
 */
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(QB_BF16) && defined(__linux__)
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

/* The bf16 input rows [t0, t0 + 16) of x (zero past t) into token group b of the shared buffer */
static void amx_input_block(GCtx *c, const GPhase *p, int b, int tid, uint64_t s) {
    GScratch *sc = &c->scr[tid];
    const int k = p->k, t0 = b * QG_TOK;
    uint16_t *g = (uint16_t *)sc->gq;   /* 16 x k bf16: gq holds 2 * 16 * k bytes */
    for (int i = 0; i < QG_TOK; i++) {
        if (t0 + i < p->t) row_to_bf16(p->x + (size_t)(t0 + i) * k, g + (size_t)i * k, k);
        else memset(g + (size_t)i * k, 0, sizeof(uint16_t) * (size_t)k);
    }
    if (!pool_take(&c->pool, s, b)) return;
    memcpy(c->aq + (size_t)b * QG_TOK * k * 2, g, sizeof(uint16_t) * QG_TOK * (size_t)k);
    if (pool_published(&c->pool, s, b, p->nb)) {   /* the input is ready: open the GEMM */
        pool_open_begin(&c->pool, s);
        c->ph = c->next;
        pool_open_end(&c->pool, s);
    }
}

/* out[j][i] = r[i][j] for 16 x 16 32-bit values (the pairs of 16 weight rows -> a B tile) */
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

/* Rows [r0, r0 + rp) of w (zero past its last row) as B tiles: tile (m, kc) holds weight rows
   16m.. and inputs 32kc.., 256 pairs, at (m * nk + kc) * 256 */
static void amx_pack_weights(const QW *w, int r0, int rp, GScratch *sc, uint32_t *bt) {
    const int k = w->cols, nk = k / 32;
    uint16_t *rows = (uint16_t *)sc->q;   /* 16 rows of k bf16: q holds QG_RB_MAX * k bytes */
    for (int m = 0; m < rp / 16; m++) {
        for (int n = 0; n < 16; n++) {
            uint16_t *row = rows + (size_t)n * k;
            if (r0 + 16 * m + n < w->rows) weight_row_bf16(w, r0 + 16 * m + n, sc->gd, row);
            else memset(row, 0, sizeof(uint16_t) * (size_t)k);
        }
        for (int kc = 0; kc < nk; kc++) {
            __m512i v[16];
            for (int n = 0; n < 16; n++) v[n] = _mm512_loadu_si512((const void *)(rows + (size_t)n * k + kc * 32));
            transpose16(v);
            uint32_t *tile = bt + ((size_t)m * nk + kc) * 256;
            for (int i = 0; i < 16; i++) _mm512_storeu_si512((void *)(tile + i * 16), v[i]);
        }
    }
}

/* out[tp][rp] (fp32) = the block's product over every token: 32 tokens x 32 rows a step */
static int amx_block(GCtx *c, const GPhase *p, int b, int tid, uint64_t s, int rp) {
    const QW *w = &p->w;
    GScratch *sc = &c->scr[tid];
    const int k = w->cols, nk = k / 32;
    uint32_t *bt = (uint32_t *)sc->q16;   /* rp x k bf16: q16 holds 2 * QG_RB_MAX * k bytes */
    amx_pack_weights(w, b * p->rb, rp, sc, bt);
    const uint16_t *xa = (const uint16_t *)c->aq;
    const size_t xs = (size_t)k * 2, os = (size_t)rp * 4;
    tiles_on();
    for (int t = 0; t < p->tp; t += 32) {
        if (!pool_unpublished(&c->pool, s, b)) { _tile_release(); return 0; }   /* rescued, published */
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
            float *o = sc->out + (size_t)t * rp + m * 16;
            _tile_stored(0, o, os);
            _tile_stored(1, o + 16, os);
            _tile_stored(2, o + 16 * rp, os);
            _tile_stored(3, o + 16 * rp + 16, os);
        }
    }
    _tile_release();
    return 1;
}
#else
static int amx_ready(void) { return 0; }
#endif

/* 1 when the bf16 tile GEMM (bits 0) runs here */
int qg_amx(void) { return amx_ready(); }
