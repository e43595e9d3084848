/*
 * oshmem_bench: the data-plane patterns of `hm-bench shmem`, measured with OpenSHMEM 1.4 calls
 * (Open MPI's OSHMEM), printing the same JSON lines with "layer": "oshmem".
 *
 * Build:  oshcc -O2 -std=gnu11 -o oshmem_bench oshmem_bench.c
 * Run:    oshrun --allow-run-as-root --oversubscribe --mca osc ucx -np 2 ./oshmem_bench \
 *             [--quick] [--init-only] [--job-start NS] [--no-pin]
 *
 * With 2 PEs every pattern is timed; with any other count only the barrier. --init-only times
 * start-up and exits (run it several times: each launch prints one trial). --job-start takes the
 * CLOCK_REALTIME nanoseconds at which the launcher was started (`date +%s%N`), so "init" is job
 * start -> first allocation usable, as in hm-bench; "init_call" is the slowest PE's shmem_init +
 * first shmem_malloc; "shutdown" is rank 0's shmem_finalize.
 *
 * Method (shared/BENCHMARKS.md, as hm-bench): every batch starts after shmem_barrier_all; root
 * PE 0's duration is handed to every PE (shmem_long_p + barrier) so all calibrate alike; batches
 * double until two in a row last >= 20 ms (2 ms with --quick); then 11 trials (5) of that size,
 * each operation's trials interleaved with those of its same-run reference; min / median / max
 * per operation. Point-to-point patterns run from PE 0 to PE 1, timed by PE 0.
 * After shmem_init, PE r pins itself to CPU r % CPUs (as hm-bench does after initialize).
 *
 * pingpong_put_signal: with OpenSHMEM 1.5 (PUT_WITH_SIGNAL) shmem_putmem_signal and
 * shmem_signal_wait_until, as hm-bench's put_signal; with 1.4 (OSHMEM 4.1) put, fence, shmem_long_p.
 *
 * pingpong_atomic_add: the ping-pong with shmem_long_atomic_add of 1 on the word the peer waits
 * on (a plain atomic, not a put); get_computing_peer: see computing_peer().
 *
 * Deliberately avoided: the 32-bit compare-swap (it smashes the stack in OSHMEM 4.1.4).
 */
#define _GNU_SOURCE
#include <sched.h>
#include <shmem.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* OpenSHMEM 1.5's put-with-signal (libhmshmem has it; OSHMEM 4.1 implements 1.4). */
#if SHMEM_MAJOR_VERSION > 1 || (SHMEM_MAJOR_VERSION == 1 && SHMEM_MINOR_VERSION >= 5)
#define PUT_WITH_SIGNAL 1
#else
#define PUT_WITH_SIGNAL 0
#endif

#define MAX_PES 1024
#define WORD_BYTES 8
#define MALLOC_BYTES 4096
#define A2A_BLOCK (1 << 20)

static const size_t bandwidth_bytes[] = {64 << 10, 1 << 20, 16 << 20};
#define LARGEST (16 << 20)

/* Symmetric (static) words: the root's batch duration, and per-PE start-up figures. */
static long batch_ns_word;
static long startup_ns[MAX_PES][2];

static int me, npes;
static double batch_target_ns = 20e6;
static int trials = 11;

static uint64_t now_ns(clockid_t clock) {
    struct timespec t;
    clock_gettime(clock, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static uint64_t mono(void) { return now_ns(CLOCK_MONOTONIC); }

static void die(const char *what) {
    fprintf(stderr, "oshmem_bench (PE %d): %s\n", me, what);
    exit(1);
}

/* Min / median / max of one operation, nanoseconds per call. */
typedef struct {
    double min_ns, median_ns, max_ns;
    int trials;
    uint64_t batch_ops;
} timing_t;

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static timing_t summarise(double *samples, int count, uint64_t ops) {
    qsort(samples, count, sizeof *samples, compare_doubles);
    timing_t t;
    t.min_ns = samples[0];
    t.max_ns = samples[count - 1];
    t.median_ns = count % 2 ? samples[count / 2]
                            : (samples[count / 2 - 1] + samples[count / 2]) / 2.0;
    t.trials = count;
    t.batch_ops = ops;
    return t;
}

/* A batch: run `ops` calls on this PE (or nothing), return this PE's nanoseconds. */
typedef uint64_t (*batch_fn)(uint64_t ops, void *state);

/* Barrier, batch on every PE, then every PE learns PE 0's duration. */
static uint64_t together(batch_fn batch, uint64_t ops, void *state) {
    shmem_barrier_all();
    long took = (long)batch(ops, state);
    if (me == 0)
        for (int pe = 0; pe < npes; pe++)
            shmem_long_p(&batch_ns_word, took, pe);
    shmem_barrier_all();
    return (uint64_t)batch_ns_word;
}

static uint64_t calibrate(batch_fn batch, void *state) {
    uint64_t ops = 1;
    while ((double)together(batch, ops, state) < batch_target_ns ||
           (double)together(batch, ops, state) < batch_target_ns) {
        ops *= 2;
        if (ops > (1ull << 40))
            die("a batch of 2^40 calls still took less than the batch target");
    }
    return ops;
}

/* Times n batches in the same stretch of time: each calibrated alone, then one batch of each,
 * in order, per trial (a reference and its operation see the same machine). */
static void time_interleaved(int n, batch_fn *batches, void **states, timing_t *out) {
    uint64_t ops[8];
    double samples[8][64];
    if (n > 8)
        die("too many interleaved batches");
    for (int b = 0; b < n; b++)
        ops[b] = calibrate(batches[b], states[b]);
    for (int t = 0; t < trials; t++)
        for (int b = 0; b < n; b++)
            samples[b][t] = (double)together(batches[b], ops[b], states[b]) / (double)ops[b];
    for (int b = 0; b < n; b++)
        out[b] = summarise(samples[b], trials, ops[b]);
}

static timing_t time_batches(batch_fn batch, void *state) {
    timing_t t;
    time_interleaved(1, &batch, &state, &t);
    return t;
}

static timing_t halve(timing_t t) {
    t.min_ns /= 2;
    t.median_ns /= 2;
    t.max_ns /= 2;
    return t;
}

/* One JSON line, as hm-bench's report writes it. */
static void report(const char *op, size_t bytes, timing_t t, const char *ref_name,
                   const timing_t *ref) {
    if (me != 0)
        return;
    printf("{\"op\":\"%s\",\"layer\":\"oshmem\",\"bytes\":%zu,\"pes\":%d,\"median_ns\":%.1f,"
           "\"min_ns\":%.1f,\"max_ns\":%.1f,\"trials\":%d,\"batch_ops\":%llu,",
           op, bytes, npes, t.median_ns, t.min_ns, t.max_ns, t.trials,
           (unsigned long long)t.batch_ops);
    if (ref)
        printf("\"ref_ns\":%.1f,\"ref\":\"%s\",\"ratio\":%.4f}\n", ref->median_ns, ref_name,
               t.median_ns / ref->median_ns);
    else
        printf("\"ref_ns\":null,\"ref\":null,\"ratio\":null}\n");
    fflush(stdout);
}

static void report_reference(const char *op, size_t bytes, timing_t t) {
    if (me != 0)
        return;
    printf("{\"op\":\"%s\",\"layer\":\"reference_oshmem\",\"bytes\":%zu,\"pes\":%d,"
           "\"median_ns\":%.1f,\"min_ns\":%.1f,\"max_ns\":%.1f,\"trials\":%d,\"batch_ops\":%llu,"
           "\"ref_ns\":null,\"ref\":null,\"ratio\":null}\n",
           op, bytes, npes, t.median_ns, t.min_ns, t.max_ns, t.trials,
           (unsigned long long)t.batch_ops);
    fflush(stdout);
}

/* ---- the patterns ------------------------------------------------------------------------ */

typedef struct {
    long *word;          /* symmetric, 1 long */
    long *flag;          /* symmetric, 1 long: signal word */
    long *data;          /* symmetric, 1 long: put_signal payload */
    long *counter;       /* symmetric, 1 long: fetch-add target */
    char *remote;        /* symmetric, LARGEST bytes */
    char *a2a;           /* symmetric, npes * A2A_BLOCK bytes */
    char *source, *destination; /* private, LARGEST bytes: memcpy reference */
    char *landing;       /* private, LARGEST bytes: where gets land */
    char *a2a_source;    /* private, npes * A2A_BLOCK bytes */
    char *a2a_alone, *a2a_concurrent; /* private, npes * A2A_BLOCK: memcpy references */
    size_t bytes;
} state_t;

/* A raw cache-line ping-pong through shmem_ptr: PE r spins on its own copy of words[r] and
 * stores into the peer's copy of words[peer] (two words: different offsets, as hm-bench's
 * reference; one word twice: the same offset, as a signal word's copies). */
typedef struct {
    long *words[2];
    long sequence;
} raw_t;

/* One ping-pong: its own signal word and count of round trips. */
typedef struct {
    long *flag;
    long *data; /* NULL: signal only; else put 8 B with the signal (see send_signal) */
    long sequence;
    int add;    /* 1: shmem_long_atomic_add of 1 instead of shmem_long_p */
} ping_pong_t;

static uint64_t batch_barrier(uint64_t ops, void *s) {
    (void)s;
    uint64_t start = mono();
    for (uint64_t i = 0; i < ops; i++)
        shmem_barrier_all();
    return mono() - start;
}

static uint64_t batch_put_quiet(uint64_t ops, void *p) {
    state_t *s = p;
    if (me != 0)
        return 0;
    uint64_t start = mono();
    for (uint64_t i = 0; i < ops; i++) {
        long value = (long)i;
        shmem_putmem(s->word, &value, WORD_BYTES, 1);
        shmem_quiet();
    }
    return mono() - start;
}

static uint64_t batch_get(uint64_t ops, void *p) {
    state_t *s = p;
    if (me != 0)
        return 0;
    volatile long sink;
    uint64_t start = mono();
    for (uint64_t i = 0; i < ops; i++) {
        long value;
        shmem_getmem(&value, s->word, WORD_BYTES, 1);
        sink = value;
    }
    (void)sink;
    return mono() - start;
}

static uint64_t batch_memcpy(uint64_t ops, void *p) {
    state_t *s = p;
    if (me != 0)
        return 0;
    uint64_t start = mono();
    for (uint64_t i = 0; i < ops; i++) {
        memcpy(s->destination, s->source, s->bytes);
        __asm__ volatile("" ::"r"(s->destination) : "memory");
    }
    return mono() - start;
}

static uint64_t batch_put_bandwidth(uint64_t ops, void *p) {
    state_t *s = p;
    if (me != 0)
        return 0;
    uint64_t start = mono();
    for (uint64_t i = 0; i < ops; i++) {
        shmem_putmem(s->remote, s->source, s->bytes, 1);
        shmem_quiet();
    }
    return mono() - start;
}

static uint64_t batch_get_bandwidth(uint64_t ops, void *p) {
    state_t *s = p;
    if (me != 0)
        return 0;
    uint64_t start = mono();
    for (uint64_t i = 0; i < ops; i++) {
        shmem_getmem(s->landing, s->remote, s->bytes, 1);
        __asm__ volatile("" ::"r"(s->landing) : "memory");
    }
    return mono() - start;
}

/* Raw cache-line ping-pong through shmem_ptr: the floor for the barrier and the signals. */
static uint64_t batch_raw_round_trip(uint64_t ops, void *p) {
    raw_t *r = p;
    int peer = 1 - me;
    _Atomic long *mine = (_Atomic long *)r->words[me];
    _Atomic long *theirs = (_Atomic long *)shmem_ptr(r->words[peer], peer);
    uint64_t start = mono();
    for (uint64_t i = 0; i < ops; i++) {
        long seq = ++r->sequence;
        if (me == 0) {
            atomic_store_explicit(theirs, seq, memory_order_release);
            while (atomic_load_explicit(mine, memory_order_acquire) != seq)
                __builtin_ia32_pause();
        } else {
            while (atomic_load_explicit(mine, memory_order_acquire) != seq)
                __builtin_ia32_pause();
            atomic_store_explicit(theirs, seq, memory_order_release);
        }
    }
    return mono() - start;
}

static void send_signal(ping_pong_t *p, long seq) {
    int peer = 1 - me;
    if (p->add) {
        /* A plain atomic add on the word the peer waits on (the peer's copy holds seq - 1). */
        shmem_long_atomic_add(p->flag, 1, peer);
        return;
    }
    if (p->data) {
#if PUT_WITH_SIGNAL
        shmem_putmem_signal(p->data, &seq, WORD_BYTES, (uint64_t *)p->flag, (uint64_t)seq,
                            SHMEM_SIGNAL_SET, peer);
        return;
#else
        /* OpenSHMEM 1.4 has no put-with-signal: put, fence (orders the two), signal. */
        shmem_putmem(p->data, &seq, WORD_BYTES, peer);
        shmem_fence();
#endif
    }
    shmem_long_p(p->flag, seq, peer);
}

/* Waits until this PE's copy of the ping-pong's flag holds seq. */
static void wait_signal(ping_pong_t *p, long seq) {
#if PUT_WITH_SIGNAL
    if (p->data) {
        shmem_signal_wait_until((uint64_t *)p->flag, SHMEM_CMP_EQ, (uint64_t)seq);
        return;
    }
#endif
    shmem_long_wait_until(p->flag, SHMEM_CMP_EQ, seq);
}

static uint64_t batch_ping_pong(uint64_t ops, void *state) {
    ping_pong_t *p = state;
    uint64_t start = mono();
    for (uint64_t i = 0; i < ops; i++) {
        long seq = ++p->sequence;
        if (me == 0) {
            send_signal(p, seq);
            wait_signal(p, seq);
        } else {
            wait_signal(p, seq);
            send_signal(p, seq);
        }
    }
    return mono() - start;
}

static uint64_t batch_fetch_add(uint64_t ops, void *p) {
    state_t *s = p;
    if (me != 0)
        return 0;
    volatile long sink;
    uint64_t start = mono();
    for (uint64_t i = 0; i < ops; i++)
        sink = shmem_long_atomic_fetch_add(s->counter, 1, 1);
    (void)sink;
    return mono() - start;
}

static uint64_t batch_malloc_free(uint64_t ops, void *p) {
    (void)p;
    uint64_t start = mono();
    for (uint64_t i = 0; i < ops; i++) {
        void *block = shmem_malloc(MALLOC_BYTES);
        if (!block)
            die("shmem_malloc(4096) failed");
        shmem_free(block);
    }
    return mono() - start;
}

static void copy_blocks(state_t *s, char *destination) {
    for (int b = 0; b < npes; b++)
        memcpy(destination + (size_t)b * A2A_BLOCK, s->a2a_source + (size_t)b * A2A_BLOCK,
               A2A_BLOCK);
    __asm__ volatile("" ::"r"(destination) : "memory");
}

/* The all-to-all reference: PE 0 alone copies what each PE copies. */
static uint64_t batch_memcpy_blocks(uint64_t ops, void *p) {
    state_t *s = p;
    if (me != 0)
        return 0;
    uint64_t start = mono();
    for (uint64_t i = 0; i < ops; i++)
        copy_blocks(s, s->a2a_alone);
    return mono() - start;
}

/* Context: every PE copies at once. */
static uint64_t batch_memcpy_blocks_concurrent(uint64_t ops, void *p) {
    state_t *s = p;
    uint64_t start = mono();
    for (uint64_t i = 0; i < ops; i++)
        copy_blocks(s, s->a2a_concurrent);
    return mono() - start;
}

/* All-to-all as hm-bench's: block j of my source to PE j's block `me`, then a barrier. */
static uint64_t batch_all_to_all(uint64_t ops, void *p) {
    state_t *s = p;
    uint64_t start = mono();
    for (uint64_t i = 0; i < ops; i++) {
        for (int j = 0; j < npes; j++) {
            int pe = (me + j) % npes;
            shmem_putmem(s->a2a + (size_t)me * A2A_BLOCK, s->a2a_source + (size_t)pe * A2A_BLOCK,
                         A2A_BLOCK, pe);
        }
        shmem_barrier_all();
    }
    return mono() - start;
}

/* Arithmetic only, no OpenSHMEM call, for `window_ns`: a PE busy with its own work. */
static void compute_for(uint64_t window_ns) {
    uint64_t end = mono() + window_ns, x = 1;
    while (mono() < end)
        for (int i = 0; i < 1024; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            __asm__ volatile("" : "+r"(x));
        }
}

/* One get of 8 B from PE 1, timed by PE 0; checks the value. */
static double one_get(long *word, long expected) {
    long value = 0;
    uint64_t start = mono();
    shmem_getmem(&value, word, WORD_BYTES, 1);
    double took = (double)(mono() - start);
    if (value != expected)
        die("get from the computing peer returned the wrong value");
    return took;
}

/* As hm-bench's get_computing_peer: per trial, a get while PE 1 waits in a barrier (the
 * reference), then PE 1 tells PE 0 it computes and computes for COMPUTE_WINDOW_NS without any
 * OpenSHMEM call while PE 0 times one get from it. One call per sample.
 *
 * PE 1 tells with a fetching atomic (a swap), as hm-bench's signal does: it returns once PE 0
 * has applied it, so PE 1 is computing, with nothing in flight, when PE 0 sees the word. With
 * shmem_long_p + shmem_quiet instead, OSHMEM over UCX's TCP transport could leave PE 1 inside
 * shmem_quiet, waiting for a flush reply that PE 0 sends only when it next progresses (in its
 * get), so the get was served by the quiet, not by a computing peer (strace, bench/findings.md
 * round 18). */
#define COMPUTE_WINDOW_NS 20000000ull
static void computing_peer(long *word, long *computing) {
    double waiting[64], busy[64];
    const long seen = 0xc0ffee;
    *word = seen;
    *computing = 0;
    shmem_barrier_all();
    for (int t = 0; t < trials; t++) {
        if (me == 0)
            waiting[t] = one_get(word, seen);
        shmem_barrier_all();
        if (me == 0) {
            shmem_long_wait_until(computing, SHMEM_CMP_EQ, t + 1);
            busy[t] = one_get(word, seen);
        } else {
            (void)shmem_long_atomic_swap(computing, t + 1, 0);
            compute_for(COMPUTE_WINDOW_NS);
        }
        shmem_barrier_all();
    }
    if (me == 0) {
        timing_t reference = summarise(waiting, trials, 1);
        report_reference("get_waiting_peer", WORD_BYTES, reference);
        report("get_computing_peer", WORD_BYTES, summarise(busy, trials, 1),
               "get from a peer waiting in a barrier", &reference);
    }
}

static void *symmetric(size_t bytes) {
    void *p = shmem_malloc(bytes);
    if (!p)
        die("shmem_malloc failed");
    memset(p, 0, bytes);
    return p;
}

static void pin(void) {
    cpu_set_t allowed, one;
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0)
        die("sched_getaffinity failed");
    int cpus[CPU_SETSIZE], count = 0;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &allowed))
            cpus[count++] = c;
    CPU_ZERO(&one);
    CPU_SET(cpus[me % count], &one);
    if (sched_setaffinity(0, sizeof one, &one) != 0)
        die("sched_setaffinity failed");
}

static timing_t one_trial(double ns) {
    timing_t t = {ns, ns, ns, 1, 1};
    return t;
}

int main(int argc, char **argv) {
    int quick = 0, init_only = 0, no_pin = 0;
    long long job_start = -1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--init-only"))
            init_only = 1;
        else if (!strcmp(argv[i], "--no-pin"))
            no_pin = 1;
        else if (!strcmp(argv[i], "--job-start") && i + 1 < argc)
            job_start = atoll(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--quick] [--init-only] [--job-start NS] [--no-pin]\n",
                    argv[0]);
            return 2;
        }
    }
    if (quick) {
        batch_target_ns = 2e6;
        trials = 5;
    }

    uint64_t started = mono();
    shmem_init();
    void *first = shmem_malloc(MALLOC_BYTES);
    if (!first)
        die("the first shmem_malloc failed");
    uint64_t init_call = mono() - started;
    long since_job = job_start >= 0 ? (long)(now_ns(CLOCK_REALTIME) - (uint64_t)job_start) : -1;
    me = shmem_my_pe();
    npes = shmem_n_pes();
    if (npes > MAX_PES)
        die("too many PEs");

    if (init_only) {
        shmem_long_p(&startup_ns[me][0], (long)init_call, 0);
        shmem_long_p(&startup_ns[me][1], since_job, 0);
        shmem_barrier_all();
        if (me == 0) {
            long slowest_call = 0, slowest_job = 0;
            for (int pe = 0; pe < npes; pe++) {
                if (startup_ns[pe][0] > slowest_call)
                    slowest_call = startup_ns[pe][0];
                if (startup_ns[pe][1] > slowest_job)
                    slowest_job = startup_ns[pe][1];
            }
            if (job_start >= 0)
                report("init", 0, one_trial((double)slowest_job), NULL, NULL);
            report("init_call", 0, one_trial((double)slowest_call), NULL, NULL);
        }
        shmem_free(first);
        uint64_t finalize_started = mono();
        shmem_finalize();
        if (me == 0)
            report("shutdown", 0, one_trial((double)(mono() - finalize_started)), NULL, NULL);
        return 0;
    }
    shmem_free(first);
    if (!no_pin)
        pin();

    state_t s;
    memset(&s, 0, sizeof s);
    if (npes != 2) {
        report("barrier", 0, time_batches(batch_barrier, &s), NULL, NULL);
        shmem_finalize();
        return 0;
    }

    s.word = symmetric(sizeof(long));
    s.counter = symmetric(sizeof(long));
    long *raw_a = symmetric(sizeof(long)), *raw_b = symmetric(sizeof(long));
    long *raw_c = symmetric(sizeof(long)), *raw_d = symmetric(sizeof(long));
    long *raw_same = symmetric(sizeof(long));
    raw_t barrier_pair = {{raw_a, raw_b}, 0};
    raw_t pair = {{raw_c, raw_d}, 0};
    raw_t same_offset = {{raw_same, raw_same}, 0};
    ping_pong_t signal = {symmetric(sizeof(long)), NULL, 0, 0};
    ping_pong_t put_signal = {symmetric(sizeof(long)), symmetric(sizeof(long)), 0, 0};
    ping_pong_t atomic_add = {symmetric(sizeof(long)), NULL, 0, 1};
    s.remote = symmetric(LARGEST);
    s.a2a = symmetric((size_t)npes * A2A_BLOCK);
    /* Private buffers start on a cache line, like the symmetric ones (and as hm-bench's), so
     * memcpy sees the same relative alignment in the reference and in the puts/gets. */
    size_t a2a_bytes = (size_t)npes * A2A_BLOCK;
    s.source = aligned_alloc(64, LARGEST);
    s.destination = aligned_alloc(64, LARGEST);
    s.landing = aligned_alloc(64, LARGEST);
    s.a2a_source = aligned_alloc(64, a2a_bytes);
    s.a2a_alone = aligned_alloc(64, a2a_bytes);
    s.a2a_concurrent = aligned_alloc(64, a2a_bytes);
    if (!s.source || !s.destination || !s.landing || !s.a2a_source || !s.a2a_alone ||
        !s.a2a_concurrent)
        die("aligned_alloc failed");
    for (size_t i = 0; i < LARGEST; i++)
        s.source[i] = (char)(i % 251);
    memset(s.destination, 0x5a, LARGEST);
    memset(s.landing, 0xa5, LARGEST);
    for (size_t i = 0; i < a2a_bytes; i++)
        s.a2a_source[i] = (char)((i % 241) ^ me);
    memset(s.a2a_alone, 0x5a, a2a_bytes);
    memset(s.a2a_concurrent, 0x5a, a2a_bytes);
    memcpy(s.remote, s.source, LARGEST);
    int have_ptr = shmem_ptr(raw_a, 1 - me) != NULL;
    shmem_barrier_all();

    timing_t t[4];
    if (have_ptr) {
        batch_fn fns[] = {batch_raw_round_trip, batch_barrier};
        void *states[] = {&barrier_pair, &s};
        time_interleaved(2, fns, states, t);
        report_reference("raw_round_trip", WORD_BYTES, t[0]);
        report("barrier", 0, t[1], "raw cache-line round trip (shmem_ptr)", &t[0]);
    } else {
        report("barrier", 0, time_batches(batch_barrier, &s), NULL, NULL);
    }
    {
        batch_fn fns[] = {batch_put_quiet, batch_get};
        void *states[] = {&s, &s};
        time_interleaved(2, fns, states, t);
        report("put_quiet", WORD_BYTES, t[0], NULL, NULL);
        report("get", WORD_BYTES, t[1], NULL, NULL);
    }
    for (size_t k = 0; k < sizeof bandwidth_bytes / sizeof *bandwidth_bytes; k++) {
        s.bytes = bandwidth_bytes[k];
        batch_fn fns[] = {batch_memcpy, batch_put_bandwidth, batch_get_bandwidth};
        void *states[] = {&s, &s, &s};
        time_interleaved(3, fns, states, t);
        report_reference("memcpy", s.bytes, t[0]);
        report("put_bandwidth", s.bytes, t[1], "memcpy of the same size", &t[0]);
        report("get_bandwidth", s.bytes, t[2], "memcpy of the same size", &t[0]);
    }
    if (have_ptr) {
        batch_fn fns[] = {batch_raw_round_trip, batch_raw_round_trip, batch_ping_pong,
                          batch_ping_pong};
        void *states[] = {&pair, &same_offset, &signal, &put_signal};
        time_interleaved(4, fns, states, t);
        timing_t one_way = halve(t[0]);
        const char *ref = "raw cache-line ping-pong, one way (shmem_ptr)";
        report_reference("raw_one_way", WORD_BYTES, one_way);
        report_reference("raw_one_way_same_offset", WORD_BYTES, halve(t[1]));
        report("pingpong_signal", WORD_BYTES, halve(t[2]), ref, &one_way);
        report("pingpong_put_signal", WORD_BYTES, halve(t[3]), ref, &one_way);
    } else {
        batch_fn fns[] = {batch_ping_pong, batch_ping_pong};
        void *states[] = {&signal, &put_signal};
        time_interleaved(2, fns, states, t);
        report("pingpong_signal", WORD_BYTES, halve(t[0]), NULL, NULL);
        report("pingpong_put_signal", WORD_BYTES, halve(t[1]), NULL, NULL);
    }
    report("pingpong_atomic_add", WORD_BYTES, halve(time_batches(batch_ping_pong, &atomic_add)),
           NULL, NULL);
    report("fetch_add", WORD_BYTES, time_batches(batch_fetch_add, &s), NULL, NULL);
    report("malloc_free", MALLOC_BYTES, time_batches(batch_malloc_free, &s), NULL, NULL);
    {
        batch_fn fns[] = {batch_memcpy_blocks, batch_memcpy_blocks_concurrent, batch_all_to_all};
        void *states[] = {&s, &s, &s};
        time_interleaved(3, fns, states, t);
        report_reference("memcpy_x2", A2A_BLOCK, t[0]);
        report_reference("memcpy_x2_concurrent", A2A_BLOCK, t[1]);
        report("all_to_all", A2A_BLOCK, t[2], "memcpy of 1 MiB x2", &t[0]);
    }
    long *computing = symmetric(sizeof(long));
    computing_peer(s.counter, computing);

    /* Check the all-to-all delivered: block `pe` of mine came from PE pe's block `me`. */
    for (int pe = 0; pe < npes; pe++)
        for (size_t i = 0; i < A2A_BLOCK; i += 4093) {
            size_t index = (size_t)me * A2A_BLOCK + i;
            if (s.a2a[(size_t)pe * A2A_BLOCK + i] != (char)((index % 241) ^ pe))
                die("all-to-all delivered the wrong bytes");
        }

    shmem_barrier_all();
    shmem_free(computing);
    shmem_free(s.a2a);
    shmem_free(s.remote);
    shmem_free(atomic_add.flag);
    shmem_free(put_signal.data);
    shmem_free(put_signal.flag);
    shmem_free(signal.flag);
    shmem_free(raw_same);
    shmem_free(raw_d);
    shmem_free(raw_c);
    shmem_free(raw_b);
    shmem_free(raw_a);
    shmem_free(s.counter);
    shmem_free(s.word);
    free(s.source);
    free(s.destination);
    free(s.landing);
    free(s.a2a_source);
    free(s.a2a_alone);
    free(s.a2a_concurrent);
    shmem_finalize();
    return 0;
}
