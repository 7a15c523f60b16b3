/* The decode step's threads: phases of blocks handed out dynamically, and waits that sleep.
 * Included by qdecode.c.
 *
 * A token is a chain of phases (one matmul's row blocks, attention's key chunks, ...). Any
 * thread claims the next unclaimed block of the open phase with one compare-and-swap,
 * computes it into its own scratch and publishes it; the thread that publishes a phase's last
 * block runs the small serial work between phases and opens the next one. So a thread the OS
 * has descheduled (a busy machine) delays nobody unless it holds a block, and even then an
 * idle thread computes that block again (a block is a pure function of the phase's inputs)
 * and whoever finishes first publishes it: the late one finds it taken and drops its copy.
 * Statically split work with spinning barriers (the OpenMP step before) waited a whole
 * scheduler slice for a descheduled thread at each of ~150 barriers a token.
 *
 * Block states are phase sequence numbers, which only grow: st[b] < seq: not yet published
 * in phase seq; seq: being copied out; seq + 1: published. A straggler from an old phase
 * sees st[b] >= its seq and gives up, so it never writes into a later phase's buffers.
 * The phase descriptor is read under a seqlock (seq odd while the opener writes it).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#ifndef SPIN_US
#define SPIN_US 40      /* an idle thread spins this long for the next phase, then sleeps */
#endif
#ifndef RESCUE_US
#define RESCUE_US 8     /* how long a claimed block may run before an idle thread computes it too */
#endif

typedef struct {
    _Atomic uint64_t seq;     /* even: a phase is open; odd: the next is being set up */
    _Atomic uint64_t claim;   /* (seq low 32 bits << 32) | the next unclaimed block */
    _Atomic int ndone;        /* blocks published in the open phase */
    _Atomic int sleepers;
    _Atomic int quit;
    _Atomic uint64_t *st;     /* per block, see above */
    int max_blocks;
    pthread_mutex_t mu;
    pthread_cond_t cv;
} Pool;

static inline void cpu_relax(void) {
#ifdef QD_AVX2
    _mm_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static inline double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

static int pool_init(Pool *p, int max_blocks) {
    atomic_init(&p->seq, 2);
    atomic_init(&p->claim, (uint64_t)2 << 32);
    atomic_init(&p->ndone, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->quit, 0);
    p->max_blocks = max_blocks;
    p->st = calloc((size_t)max_blocks, sizeof(*p->st));
    if (!p->st) return -1;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    return 0;
}

/* The next block of phase s, or -1 when all are claimed or the phase has moved on. */
static inline int pool_claim(Pool *p, uint64_t s, int nb) {
    uint64_t c = atomic_load_explicit(&p->claim, memory_order_relaxed);
    for (;;) {
        if ((c >> 32) != (s & 0xffffffffu) || (int)(c & 0xffffffffu) >= nb) return -1;
        if (atomic_compare_exchange_weak_explicit(&p->claim, &c, c + 1, memory_order_relaxed, memory_order_relaxed))
            return (int)(c & 0xffffffffu);
    }
}

static inline int pool_unpublished(Pool *p, uint64_t s, int b) {
    return atomic_load_explicit(&p->st[b], memory_order_acquire) < s;
}

/* 1: this thread copies block b out (then calls pool_published); 0: someone else did. */
static inline int pool_take(Pool *p, uint64_t s, int b) {
    uint64_t old = atomic_load_explicit(&p->st[b], memory_order_acquire);
    return old < s && atomic_compare_exchange_strong_explicit(&p->st[b], &old, s, memory_order_acq_rel,
                                                              memory_order_relaxed);
}

/* 1 when block b was the phase's last: the caller runs the serial work and opens the next. */
static inline int pool_published(Pool *p, uint64_t s, int b, int nb) {
    atomic_store_explicit(&p->st[b], s + 1, memory_order_release);
    return atomic_fetch_add_explicit(&p->ndone, 1, memory_order_acq_rel) + 1 == nb;
}

/* Seqlock writer, run by the one thread that finished phase s (or by qd_step between tokens):
   pool_open_begin, write the descriptor, pool_open_end. */
static inline void pool_open_begin(Pool *p, uint64_t s) {
    atomic_store_explicit(&p->seq, s + 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
}

static inline void pool_open_end(Pool *p, uint64_t s) {
    const uint64_t n = s + 2;
    atomic_store_explicit(&p->ndone, 0, memory_order_relaxed);
    atomic_store_explicit(&p->claim, (n & 0xffffffffu) << 32, memory_order_relaxed);
    atomic_store_explicit(&p->seq, n, memory_order_seq_cst);
    if (atomic_load_explicit(&p->sleepers, memory_order_seq_cst) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
}

/* Seqlock reader: a consistent copy of the descriptor `src` (n bytes) and the phase it is for. */
static uint64_t pool_read(Pool *p, const void *src, void *dst, size_t n) {
    for (;;) {
        uint64_t s = atomic_load_explicit(&p->seq, memory_order_acquire);
        if (s & 1) { cpu_relax(); continue; }
        memcpy(dst, src, n);
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&p->seq, memory_order_relaxed) == s) return s;
    }
}

/* Spin until the phase is no longer s or `us` microseconds pass; 1 if it moved on. */
static int pool_spin(Pool *p, uint64_t s, double us) {
    double t0 = 0.0;
    for (int i = 0;; i++) {
        if (atomic_load_explicit(&p->seq, memory_order_acquire) != s || atomic_load_explicit(&p->quit, memory_order_relaxed))
            return 1;
        cpu_relax();
        if ((i & 31) == 31) {
            double t = now_us();
            if (t0 == 0.0) t0 = t;
            else if (t - t0 >= us) return 0;
        }
    }
}

/* Sleep until the phase is no longer s (see pool_open_end for why no wake-up is lost). */
static void pool_sleep(Pool *p, uint64_t s) {
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->sleepers, 1, memory_order_seq_cst);
    while (atomic_load_explicit(&p->seq, memory_order_seq_cst) == s && !atomic_load_explicit(&p->quit, memory_order_relaxed))
        pthread_cond_wait(&p->cv, &p->mu);
    atomic_fetch_sub_explicit(&p->sleepers, 1, memory_order_seq_cst);
    pthread_mutex_unlock(&p->mu);
}

static void pool_quit(Pool *p) {
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->quit, 1);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

static void pool_destroy(Pool *p) {
    free(p->st);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
}
