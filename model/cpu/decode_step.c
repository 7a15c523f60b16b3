/* One token through the model as a chain of phases run by the pool (pool.c). Included by
 * qdecode.c after the kernels.
 *
 * Per layer: QKV (the three projections' rows as one range), ATTN (key chunks, every KV head in each),
 * WO, GU (gate and up rows together, the activation applied), DOWN; then HEAD. Between two
 * phases the thread that finished the first runs the small serial work (norms, rotary, the
 * K/V write, the softmax merge, the residual, quantizing the next input) once, on shared
 * buffers, and opens the next phase.
 */
#ifdef QD_STALL_US
#include <unistd.h>
#endif

enum { PH_IDLE = 0, PH_QKV, PH_ATTN, PH_WO, PH_GU, PH_DOWN, PH_HEAD };

#ifndef BLOCK_BYTES
/* Weight bytes a row block reads at most (rows_per_block also caps a block at a quarter of a
   thread's share). Large on purpose: each block is one long sequential stream for the hardware
   prefetcher, where 32 KB blocks claimed in turn by two threads interleaved their streams and
   bounced the claim's cache line ~10x as often; 32 KB -> 256 KB took 2-thread decode from ~29.5
   to ~37 tok/s on the Llama-3.2-1B shape, ~88 to ~106 on Gemma 3 270M, ~53 to ~65 on Qwen3-0.6B
   (docs/benchmarks.md). A descheduled thread's block is still computed by the rescue. */
#define BLOCK_BYTES 262144
#endif
#define RMAX 512            /* rows a block holds at most */
#define CHUNK_MIN 64        /* keys an attention block holds at least ... */
#define CHUNK_MAX 1024      /* ... and at most (the per-thread score buffer) */

typedef struct {
    int kind, layer, nb, rows, per;   /* per: rows (or keys) a block */
    int start, n;                     /* ATTN: keys [start, start + n) */
    uint64_t token;
} Phase;

typedef struct {
    Model m;
    int nt;
    Pool pool;
    pthread_t *workers;
    Phase ph;                          /* the open phase (read under the seqlock) */
    uint64_t token;                    /* tokens started */
    int pos;
    uint16_t *kbase, *vbase;
    float *logits;
    float *x, *xn, *qkv, *att, *y, *h; /* shared, written only between phases */
    int16_t *aq; float *ad, *as;       /* the quantized input of the open phase */
    int8_t *aq1, *aq2; int32_t *aq4;
    Act a;
    float *slots;                      /* ATTN: per block m[g], l[g], acc[g * d] */
    size_t slot;
    float *priv, *scores;              /* per thread */
    size_t priv_n;
} Ctx;

static size_t row_bytes(const QW *w) {
    size_t n = (size_t)w->cols;
    if (w->kind == K_F32) return 4 * n;
    if (w->kind <= K_BF16) return 2 * n;
    if (w->kind >= K_FILE_FIRST) {   /* qformats.h: the file's own blocks */
        const FileFmt *f = &FILE_FMT[w->kind - K_FILE_FIRST];
        return n / f->bv * f->bb;
    }
    size_t per = (size_t)(w->sdt == S_F32 ? 4 : 2) * (w->min ? 2 : 1) * (n / w->sub);
    return (w->kind == K_Q4 ? n / 2 : n) + per;
}

/* Rows a block of w's matrix holds: about BLOCK_BYTES, a multiple of 8 (no two blocks share a
   cache line of the output), and at least 4 blocks a thread where the matrix allows. */
static int rows_per_block(const QW *w, int rows, int nt) {
    int r = (int)((BLOCK_BYTES / row_bytes(w) + 7) & ~(size_t)7);
    int fair = ((rows + 4 * nt - 1) / (4 * nt) + 7) & ~7;
    if (r > fair) r = fair;
    if (r < 8) r = 8;
    return r > RMAX ? RMAX : r;
}

static int attn_chunk(const Ctx *c, int n) {
    int want = 4 * c->nt;   /* chunks for about 4 blocks a thread */
    int ch = (n + want - 1) / want;
    return ch < CHUNK_MIN ? CHUNK_MIN : ch > CHUNK_MAX ? CHUNK_MAX : ch;
}

static int act_need(const QW *w) {   /* quantize_act's A_* for one weight */
    if (w->kind < K_Q8) return 0;   /* dense: the fp32 input itself */
    if (w->kind < K_FILE_FIRST) return A_16;
    const FileFmt *f = &FILE_FMT[w->kind - K_FILE_FIRST];
    return (f->a8 ? A_K8 : A_16) | (f->v8 ? A_SPLIT : 0);
}

/* The input of phase `kind` (of layer l) quantized as its weights read it. */
static void quantize_input(Ctx *c, float *x, int n, int kind, int l) {
    const Layer *L = c->m.layers + l;
    int need = 0;
    if (kind == PH_QKV) need = act_need(&L->wq) | act_need(&L->wk) | act_need(&L->wv);
    else if (kind == PH_WO) need = act_need(&L->wo);
    else if (kind == PH_GU) need = act_need(&L->wg) | act_need(&L->wu);
    else if (kind == PH_DOWN) need = act_need(&L->wd);
    else need = act_need(&c->m.lm_head);
    c->a.x = x;
    c->a.n = n;
    quantize_act(&c->a, need);
}

/* Opens phase `kind` of layer l after phase s (the caller finished s, or no phase is running). */
static void open_phase(Ctx *c, uint64_t s, int kind, int l) {
    const Model *m = &c->m;
    Phase p = {kind, l, 0, 0, 0, 0, 0, c->token};
    const Layer *L = m->layers + (l < m->n_layers ? l : 0);
    const QW *w = kind == PH_QKV ? &L->wq : kind == PH_WO ? &L->wo : kind == PH_GU ? &L->wg
                : kind == PH_DOWN ? &L->wd : &m->lm_head;
    if (kind == PH_ATTN) {
        p.start = L->window >= 0 && c->pos - L->window > 0 ? c->pos - L->window : 0;
        p.n = c->pos + 1 - p.start;
        p.per = attn_chunk(c, p.n);
        p.nb = (p.n + p.per - 1) / p.per;
    } else if (kind != PH_IDLE) {
        p.rows = kind == PH_QKV ? m->n_head * m->head_dim + 2 * m->n_kv * m->head_dim
               : kind == PH_GU ? m->hidden : kind == PH_HEAD ? m->vocab : m->dim;
        p.per = rows_per_block(w, p.rows, c->nt);
        p.nb = (p.rows + p.per - 1) / p.per;
    }
    pool_open_begin(&c->pool, s);
    c->ph = p;
    pool_open_end(&c->pool, s);
}

static void residual(Ctx *c, const float *norm) {
    const int dim = c->m.dim;
    if (norm) {
        rmsnorm(c->xn, c->y, norm, dim, c->m.eps);
        for (int j = 0; j < dim; j++) c->x[j] += c->xn[j];
    } else
        for (int j = 0; j < dim; j++) c->x[j] += c->y[j];
}

/* The serial work after phase p (which was phase s), then the next phase. */
static void after(Ctx *c, const Phase *p, uint64_t s) {
    const Model *m = &c->m;
    const int d = m->head_dim, hq = m->n_head, hk = m->n_kv, qd = hq * d, kvd = hk * d, l = p->layer;
    const Layer *L = m->layers + l;
    if (p->kind == PH_QKV) {
        float *q = c->qkv, *k = q + qd, *v = k + kvd;
        if (L->q_norm) for (int h = 0; h < hq; h++) rmsnorm(q + h * d, q + h * d, L->q_norm, d, m->eps);
        if (L->k_norm) for (int h = 0; h < hk; h++) rmsnorm(k + h * d, k + h * d, L->k_norm, d, m->eps);
        rope(q, hq, d, L->cos + (size_t)c->pos * (d / 2), L->sin + (size_t)c->pos * (d / 2));
        rope(k, hk, d, L->cos + (size_t)c->pos * (d / 2), L->sin + (size_t)c->pos * (d / 2));
        uint16_t *kc = c->kbase + ((size_t)l * m->cap + c->pos) * kvd, *vc = c->vbase + ((size_t)l * m->cap + c->pos) * kvd;
        for (int j = 0; j < kvd; j++) { kc[j] = f2h(k[j]); vc[j] = f2h(v[j]); }
        open_phase(c, s, PH_ATTN, l);
    } else if (p->kind == PH_ATTN) {   /* merge the key chunks' partial softmaxes */
        const int chunks = p->nb;   /* a chunk's slot: m[hq], l[hq], acc[hq * d] */
        for (int h = 0; h < hq; h++) {
            float mx = -INFINITY, l2 = 0.f, *o = c->att + (size_t)h * d;
            for (int ch = 0; ch < chunks; ch++) mx = fmaxf(mx, c->slots[ch * c->slot + h]);
            for (int j = 0; j < d; j++) o[j] = 0.f;
            for (int ch = 0; ch < chunks; ch++) {
                const float *sl = c->slots + ch * c->slot;
                if (sl[hq + h] == 0.f) continue;
                float f = expf(sl[h] - mx);
                l2 += f * sl[hq + h];
                for (int j = 0; j < d; j++) o[j] += f * sl[2 * hq + h * d + j];
            }
            for (int j = 0; j < d; j++) o[j] /= l2;
        }
        quantize_input(c, c->att, qd, PH_WO, l);
        open_phase(c, s, PH_WO, l);
    } else if (p->kind == PH_WO) {
        residual(c, L->post_attn_norm);
        rmsnorm(c->xn, c->x, L->ffn_norm, m->dim, m->eps);
        quantize_input(c, c->xn, m->dim, PH_GU, l);
        open_phase(c, s, PH_GU, l);
    } else if (p->kind == PH_GU) {
        quantize_input(c, c->h, m->hidden, PH_DOWN, l);
        open_phase(c, s, PH_DOWN, l);
    } else if (p->kind == PH_DOWN) {
        residual(c, L->post_ffn_norm);
        const int last = l + 1 == m->n_layers;
        rmsnorm(c->xn, c->x, last ? m->final_norm : L[1].attn_norm, m->dim, m->eps);
        quantize_input(c, c->xn, m->dim, last ? PH_HEAD : PH_QKV, last ? 0 : l + 1);
        open_phase(c, s, last ? PH_HEAD : PH_QKV, last ? 0 : l + 1);
    } else if (p->kind == PH_HEAD)
        open_phase(c, s, PH_IDLE, 0);
}

/* Block b of phase p into this thread's scratch; returns where it goes and how many floats. */
static float *compute(Ctx *c, const Phase *p, int b, int tid, size_t *n) {
    const Model *m = &c->m;
    const Layer *L = m->layers + p->layer;
    float *out = c->priv + (size_t)tid * c->priv_n;
    if (p->kind == PH_ATTN) {
        /* every KV head of a key chunk in one block: each K/V row streams once, in key order */
        const int hk = m->n_kv, hq = m->n_head, t0 = p->start + b * p->per;
        const int t1 = t0 + p->per < p->start + p->n ? t0 + p->per : p->start + p->n;
        const size_t kvd = (size_t)hk * m->head_dim, lo = (size_t)p->layer * m->cap * kvd;
        attn_part(m, c->qkv, c->kbase + lo, c->vbase + lo, t0, t1, 0, hk,
                  c->scores + (size_t)tid * hq * CHUNK_MAX, out, out + hq, out + 2 * hq);
        *n = c->slot;
        return c->slots + (size_t)b * c->slot;
    }
    const int r0 = b * p->per, r1 = r0 + p->per < p->rows ? r0 + p->per : p->rows;
    float *y = out - r0;   /* gemv writes y[r] for r in [r0, r1) */
    *n = (size_t)(r1 - r0);
    if (p->kind == PH_QKV) {
        const int qd = m->n_head * m->head_dim, kvd = m->n_kv * m->head_dim;
        if (r0 < qd) gemv(&L->wq, &c->a, y, r0, r1 < qd ? r1 : qd);
        if (r1 > qd && r0 < qd + kvd) gemv(&L->wk, &c->a, y + qd, (r0 > qd ? r0 : qd) - qd, (r1 < qd + kvd ? r1 : qd + kvd) - qd);
        if (r1 > qd + kvd) gemv(&L->wv, &c->a, y + qd + kvd, (r0 > qd + kvd ? r0 : qd + kvd) - qd - kvd, r1 - qd - kvd);
        return c->qkv + r0;
    }
    if (p->kind == PH_GU) {
        float *u = out + RMAX - r0;
        gemv(&L->wg, &c->a, y, r0, r1);
        gemv(&L->wu, &c->a, u, r0, r1);
        act_rows(m->act, y, u, r0, r1);
        return c->h + r0;
    }
    if (p->kind == PH_HEAD) {
        gemv(&m->lm_head, &c->a, y, r0, r1);
        if (m->final_softcap > 0.f)
            for (int r = r0; r < r1; r++) y[r] = m->final_softcap * tanhf(y[r] / m->final_softcap);
        return c->logits + r0;
    }
    gemv(p->kind == PH_WO ? &L->wo : &L->wd, &c->a, y, r0, r1);
    return c->y + r0;
}

static void run_block(Ctx *c, const Phase *p, uint64_t s, int b, int tid) {
    size_t n;
    float *dst = compute(c, p, b, tid, &n);
#ifdef QD_STALL_US   /* tests: a worker the OS takes away while it holds a third of its blocks */
    if (tid > 0 && b % 3 == 0) usleep(QD_STALL_US);
#endif
    if (!pool_take(&c->pool, s, b)) return;   /* someone else published it first */
    memcpy(dst, c->priv + (size_t)tid * c->priv_n, n * sizeof(float));
    if (pool_published(&c->pool, s, b, p->nb)) after(c, p, s);
}

/* Work on phases until token `until` is done (the caller of qd_step), or until told to quit. */
static void work(Ctx *c, int tid, uint64_t until) {
    Pool *P = &c->pool;
    Phase p;
    for (;;) {
        uint64_t s = pool_read(P, &c->ph, &p, sizeof p);
        if (atomic_load_explicit(&P->quit, memory_order_relaxed)) return;
        if (p.kind == PH_IDLE && until && p.token >= until) return;
        int b;
        while ((b = pool_claim(P, s, p.nb)) >= 0) run_block(c, &p, s, b, tid);
        if (p.kind != PH_IDLE && !pool_spin(P, s, RESCUE_US))   /* a block is late: compute it too */
            for (b = 0; b < p.nb && atomic_load_explicit(&P->seq, memory_order_acquire) == s; b++)
                if (pool_unpublished(P, s, b)) run_block(c, &p, s, b, tid);
        if (!pool_spin(P, s, SPIN_US)) pool_sleep(P, s);
    }
}

static void flush_denormals(void) {
#ifdef QD_AVX2
    /* softmax weights of far-off keys underflow into denormals, and each multiply by one takes
       a microcode assist of ~100 cycles */
    _mm_setcsr(_mm_getcsr() | 0x8040);
#endif
}

typedef struct { Ctx *c; int tid; } WorkerArg;

static void *worker(void *arg) {
    WorkerArg w = *(WorkerArg *)arg;
    free(arg);
    flush_denormals();
    work(w.c, w.tid, 0);
    return NULL;
}

void qd_free(void *p);

static int any_act8(const Model *m) {   /* does any weight of the step read Act.k8? */
    int any = act8_kind(m->lm_head.kind);
    for (int l = 0; l < m->n_layers; l++) {
        const Layer *L = m->layers + l;
        const QW *w[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->wg, &L->wu, &L->wd};
        for (int j = 0; j < 7; j++) any |= act8_kind(w[j]->kind);
    }
    return any;
}

/* The int8-per-256 activations' buffers for n values (n rounded down to 256s). */
static int act8_alloc(Act *a, size_t n) {
    a->k8 = malloc(n + 32);
    a->kd = malloc(sizeof(float) * (n / 32 + 8));
    a->ks = malloc(sizeof(float) * (n / 32 + 8));
    a->kb = malloc(sizeof(int32_t) * 16 * (n / 256 + 1));
    return a->k8 && a->kd && a->ks && a->kb;
}
static void act8_free(Act *a) { free(a->k8); free(a->kd); free(a->ks); free(a->kb); }

void *qd_new(const Model *m) {
    Ctx *c = calloc(1, sizeof(Ctx));
    if (!c) return NULL;
    c->m = *m;
    c->nt = m->n_threads > 0 ? m->n_threads : 1;
    const int nt = c->nt;
    size_t qd = (size_t)m->n_head * m->head_dim, kvd = (size_t)m->n_kv * m->head_dim, w = (size_t)m->dim;
    if ((size_t)m->hidden > w) w = m->hidden;
    if (qd > w) w = qd;
    c->slot = 2 * (size_t)m->n_head + (size_t)m->n_head * m->head_dim;
    c->priv_n = 2 * RMAX > c->slot ? 2 * RMAX : c->slot;
    /* a matmul's blocks hold >= 8 rows; attention's >= CHUNK_MIN keys of every KV head */
    int rows = m->vocab > m->hidden ? m->vocab : m->hidden, max_nb = m->cap / CHUNK_MIN + 2;
    if ((int)(qd + 2 * kvd) > rows) rows = (int)(qd + 2 * kvd);
    if (m->dim > rows) rows = m->dim;
    if (rows / 8 + 1 > max_nb) max_nb = rows / 8 + 1;
    c->x = malloc(sizeof(float) * m->dim);
    c->xn = malloc(sizeof(float) * w);
    c->qkv = malloc(sizeof(float) * (qd + 2 * kvd));
    c->att = malloc(sizeof(float) * qd);
    c->y = malloc(sizeof(float) * m->dim);
    c->h = malloc(sizeof(float) * m->hidden);
    c->aq = malloc(sizeof(int16_t) * (w + 32));
    c->ad = malloc(sizeof(float) * (w / 32 + 1));
    c->as = malloc(sizeof(float) * (w / 32 + 1));
    c->aq1 = malloc(w + 32);
    c->aq2 = malloc(w + 32);
    c->aq4 = malloc(sizeof(int32_t) * (w / 4 + 8));
    c->slots = malloc(sizeof(float) * c->slot * (size_t)(m->cap / CHUNK_MIN + 2));
    c->priv = malloc(sizeof(float) * c->priv_n * nt);
    c->scores = malloc(sizeof(float) * (size_t)m->n_head * CHUNK_MAX * nt);
    c->a = (Act){c->xn, c->aq, c->ad, c->as, m->dim, c->aq1, c->aq2, c->aq4, NULL, NULL, NULL, NULL};
    if (any_act8(m) && !act8_alloc(&c->a, w)) { qd_free(c); return NULL; }
    if (!c->x || !c->xn || !c->qkv || !c->att || !c->y || !c->h || !c->aq || !c->ad || !c->as || !c->aq1 || !c->aq2 || !c->aq4 || !c->slots || !c->priv ||
        !c->scores || pool_init(&c->pool, max_nb) != 0) { qd_free(c); return NULL; }
    c->ph.kind = PH_IDLE;
    c->workers = calloc((size_t)nt, sizeof(pthread_t));
    if (!c->workers) { qd_free(c); return NULL; }
    for (int t = 1; t < nt; t++) {   /* fewer threads if the OS gives fewer: the work is shared out anyway */
        WorkerArg *a = malloc(sizeof *a);
        if (a) *a = (WorkerArg){c, t};
        if (!a || pthread_create(&c->workers[t], NULL, worker, a) != 0) { free(a); c->nt = t; break; }
    }
    return c;
}

void qd_free(void *p) {
    Ctx *c = p;
    if (!c) return;
    if (c->workers) {
        pool_quit(&c->pool);
        for (int t = 1; t < c->nt; t++) pthread_join(c->workers[t], NULL);
        free(c->workers);
    }
    if (c->pool.st) pool_destroy(&c->pool);
    free(c->x); free(c->xn); free(c->qkv); free(c->att); free(c->y); free(c->h); free(c->aq); free(c->ad);
    free(c->as); free(c->aq1); free(c->aq2); free(c->aq4); act8_free(&c->a); free(c->slots); free(c->priv); free(c->scores); free(c);
}

/* Token id `token_id` at position `pos`: its K/V land in the cache at pos, its logits in `logits`. */
int qd_step(void *p, int token_id, int pos, uint16_t *kbase, uint16_t *vbase, float *logits) {
    Ctx *c = p;
    if (!c || token_id < 0 || token_id >= c->m.vocab || pos < 0 || pos >= c->m.cap) return -1;
#ifdef QD_AVX2
    const unsigned int csr = _mm_getcsr();
#endif
    flush_denormals();
    const Model *m = &c->m;
    c->pos = pos; c->kbase = kbase; c->vbase = vbase; c->logits = logits;
    c->token++;
    dequant_row(&m->embed, token_id, c->x);
    if (m->emb_scale != 1.f) for (int j = 0; j < m->dim; j++) c->x[j] *= m->emb_scale;
    rmsnorm(c->xn, c->x, m->layers[0].attn_norm, m->dim, m->eps);
    quantize_input(c, c->xn, m->dim, PH_QKV, 0);
    open_phase(c, atomic_load(&c->pool.seq), PH_QKV, 0);
    work(c, 0, c->token);
#ifdef QD_AVX2
    _mm_setcsr(csr);
#endif
    return 0;
}
