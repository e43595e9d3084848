/*
 * oshmem_bench: the data-plane patterns of `hm-bench shmem`, measured with OpenSHMEM 1.4 calls
 * (Open MPI's OSHMEM), printing the same JSON lines with "layer": "oshmem".
 *
 * Build:  oshcc -O2 -std=gnu11 -o oshmem_bench oshmem_bench.c
 * Run:    oshrun --allow-run-as-root --oversubscribe --mca osc ucx -np 2 ./oshmem_bench \
 *             [--quick] [--init-only] [--job-start NS] [--no-pin]
 *         ... -np N ./oshmem_bench --programs [--max-bytes BYTES] [--quick] [--no-pin]
 *
 * --programs runs issue 40's rows instead, the patterns real programs use (see "--programs"
 * below): put/get with the local buffer in the heap or in private memory, windows of puts and
 * the waiting peer at 2 PEs, every collective (legacy and, with OpenSHMEM 1.5, team forms) at
 * any PE count; `hm-bench programs` measures the same through the Rust API. Its heap needs
 * (4 N + 6) x the largest transfer + 64 MiB (SHMEM_SYMMETRIC_SIZE; OSHMEM:
 * SHMEM_SYMMETRIC_HEAP_SIZE).
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
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <semaphore.h>
#include <shmem.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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

/* With --programs: the calibration aims (see calibrate). */
static int aiming = 0;
#define MAX_GROWTH 64
/* Aiming, a single call lasting this many batch targets is a batch at once (see calibrate). */
#define LONG_CALL 5

/* The calls per batch: doubles until two batches in a row reach the target; *last_ns is the
 * second one's duration (PE 0's, so every PE gets the same), *first_trial 1 when the batch
 * that settled it was a long call taken at once (below), so the first trial. When `aiming`, a batch short of
 * the target grows the calls to what should last 1.1x the target (at least 1.25x and one more,
 * at most MAX_GROWTH x) instead of doubling: a few batches of warm-up, not one per doubling
 * (each is a round of barriers, costly on an oversubscribed or busy machine), and batches of
 * about the target rather than up to twice it. A single call that lasts LONG_CALL targets or
 * more is taken at once, unconfirmed (no smaller batch exists; a second call costs a trial),
 * and counts as the first trial. */
static uint64_t calibrate(batch_fn batch, void *state, uint64_t *last_ns, int *first_trial) {
    uint64_t ops = 1;
    *first_trial = 0;
    for (;;) {
        uint64_t first = together(batch, ops, state);
        if (aiming && ops == 1 && (double)first >= LONG_CALL * batch_target_ns) {
            *last_ns = first;
            *first_trial = 1;
            return 1;
        }
        if ((double)first >= batch_target_ns) {
            uint64_t second = together(batch, ops, state);
            if ((double)second >= batch_target_ns) {
                *last_ns = second;
                return ops;
            }
        }
        if (aiming) {
            double aimed = (double)ops * 1.1 * batch_target_ns / (double)(first ? first : 1) + 1;
            uint64_t least = ops + (ops / 4 ? ops / 4 : 1), most = ops * MAX_GROWTH;
            ops = aimed < (double)least ? least : aimed > (double)most ? most : (uint64_t)aimed;
        } else {
            ops *= 2;
        }
        if (ops > (1ull << 40))
            die("a batch of 2^40 calls still took less than the batch target");
    }
}

/* Most batches timed together, and the least trials a budget may leave (see trial_budget_ns). */
#define MAX_BATCHES 24
#define MIN_TRIALS 3

/* With --programs: when `trials` trials of a group of interleaved batches (their calibrated
 * durations summed) would last longer than this, only as many as fit, but at least
 * MIN_TRIALS (the collectives of 16 MiB on 8 PEs sharing 2 cores); 0: always `trials`. */
static double trial_budget_ns = 0;

/* Times n batches in the same stretch of time: each calibrated alone, then one batch of each,
 * in order, per trial (a reference and its operation see the same machine). */
static void time_interleaved(int n, batch_fn *batches, void **states, timing_t *out) {
    uint64_t ops[MAX_BATCHES], last_ns[MAX_BATCHES];
    int taken[MAX_BATCHES];
    static double samples[MAX_BATCHES][64];
    if (n > MAX_BATCHES)
        die("too many interleaved batches");
    double trial_ns = 0;
    for (int b = 0; b < n; b++) {
        ops[b] = calibrate(batches[b], states[b], &last_ns[b], &taken[b]);
        if (taken[b])
            samples[b][0] = (double)last_ns[b];
        trial_ns += (double)last_ns[b];
    }
    int count = trials;
    if (trial_budget_ns > 0 && trial_ns * count > trial_budget_ns) {
        int least = MIN_TRIALS < trials ? MIN_TRIALS : trials;
        count = (int)(trial_budget_ns / trial_ns);
        if (count < least)
            count = least;
    }
    /* A long call's calibration was its first trial already. */
    for (int t = 0; t < count; t++)
        for (int b = 0; b < n; b++)
            if (taken[b] + t < count)
                samples[b][taken[b] + t] =
                    (double)together(batches[b], ops[b], states[b]) / (double)ops[b];
    for (int b = 0; b < n; b++)
        out[b] = summarise(samples[b], count, ops[b]);
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

/* ---- --programs: the patterns real programs use (issue 40) --------------------------------
 *
 * RMA (2 PEs): put (+ quiet) and get of 1 B to 16 MiB (powers of 4) from PE 0 to PE 1, with the
 * local side in the symmetric heap (a shmem_malloc'd source or landing buffer: put_heap,
 * get_heap) and in private memory (malloc'd: put_private, get_private); message rate: windows
 * of RATE_WINDOW puts then one quiet, 8 B and 4 KiB (per put); the waiting peer: PE 0's memcpy
 * of 1 MiB while PE 1 waits in shmem_barrier_all. Throughout, PE 1 waits in shmem_barrier_all
 * while PE 0 works (see together()). Collectives (any PE count): the legacy active-set forms
 * (pSync and pWrk alternated between two sets, as the standard allows for back-to-back calls)
 * and, with OpenSHMEM 1.5, the team forms on SHMEM_TEAM_WORLD, each at 8 B, 4 KiB, 64 KiB,
 * 1 MiB and 16 MiB: per PE for collect/fcollect, per pair for alltoall(s) (alltoalls with
 * strides of 2 elements), the vector for reductions, the message for broadcast (root PE 0).
 *
 * References, interleaved with the rows as everywhere: memcpy of the same size by PE 0 while
 * every other PE sleeps in the kernel (a POSIX semaphore, so no waiting PE takes CPU time from
 * it), into as many distinct private destinations as the operation writes per PE: 1 for the
 * RMA rows and reductions, N - 1 for the legacy broadcast (the root's target is not written),
 * N for the team broadcast, collect, fcollect and alltoall(s) (memcpy_x<D>). The waiting-peer
 * row's reference is that same memcpy with PE 1 asleep (memcpy_peer_asleep). */

#define RATE_WINDOW 64
#define WAITING_BYTES (1 << 20)
#define RMA_LARGEST (16 << 20)
#define ALLTOALLS_STRIDE 2
#define COLLECTIVE_LARGEST (16 << 20)
static const size_t rate_bytes[] = {8, 4096};
static const size_t collective_bytes[] = {8, 4 << 10, 64 << 10, 1 << 20, 16 << 20};
/* --quick's largest transfer (every operation still runs; --max-bytes overrides), and its
 * trials (the rows are many; quick mode only checks that they work). */
#define QUICK_COLLECTIVE_LARGEST (64 << 10)
#define QUICK_PROGRAMS_TRIALS 3
/* --programs' trial budget per group of interleaved batches (see trial_budget_ns). */
#define PROGRAMS_TRIAL_BUDGET_NS 5e9

/* PE 0's process ID, for the other PEs to open its semaphore. */
static long semaphore_owner;
/* Where the other PEs sleep while PE 0 times a reference alone. */
static sem_t *asleep;

static void open_asleep_semaphore(void) {
    char name[64];
    if (me == 0) {
        snprintf(name, sizeof name, "/oshmem_bench.%ld", (long)getpid());
        sem_unlink(name);
        asleep = sem_open(name, O_CREAT | O_EXCL, 0600, 0);
        if (asleep == SEM_FAILED)
            die("sem_open (create) failed");
        for (int pe = 0; pe < npes; pe++)
            shmem_long_p(&semaphore_owner, (long)getpid(), pe);
    }
    shmem_barrier_all();
    if (me != 0) {
        snprintf(name, sizeof name, "/oshmem_bench.%ld", semaphore_owner);
        asleep = sem_open(name, 0);
        if (asleep == SEM_FAILED)
            die("sem_open of PE 0's semaphore failed");
    }
    shmem_barrier_all();
    if (me == 0)
        sem_unlink(name);
}

/* Sleeps until PE 0 posts (fails after 120 s: PE 0 died). */
static void sleep_until_posted(void) {
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += 120;
    while (sem_timedwait(asleep, &deadline) != 0)
        if (errno != EINTR)
            die("waited 120 s for PE 0 to end a batch");
}

/* A batch PE 0 runs alone while every other PE sleeps on the semaphore. */
typedef struct {
    batch_fn fn;
    void *state;
} alone_t;

static uint64_t batch_alone(uint64_t ops, void *p) {
    alone_t *a = p;
    if (me != 0) {
        sleep_until_posted();
        return 0;
    }
    uint64_t took = a->fn(ops, a->state);
    for (int pe = 1; pe < npes; pe++)
        if (sem_post(asleep) != 0)
            die("sem_post failed");
    return took;
}

static timing_t scale(timing_t t, double factor) {
    t.min_ns *= factor;
    t.median_ns *= factor;
    t.max_ns *= factor;
    return t;
}

static char *private_buffer(size_t bytes, int fill) {
    char *p = aligned_alloc(64, bytes);
    if (!p)
        die("aligned_alloc failed");
    memset(p, fill, bytes);
    return p;
}

static void *symmetric_or_die(size_t bytes) {
    void *p = shmem_malloc(bytes);
    if (!p) {
        fprintf(stderr,
                "oshmem_bench (PE %d): shmem_malloc(%zu) failed; raise the symmetric heap "
                "(SHMEM_SYMMETRIC_SIZE, OSHMEM: SHMEM_SYMMETRIC_HEAP_SIZE)\n",
                me, bytes);
        exit(1);
    }
    memset(p, 0, bytes);
    return p;
}

/* -- RMA, message rate, waiting peer (2 PEs) -- */

typedef struct {
    char *remote;   /* symmetric: PE 1's copy is the puts' target and the gets' source */
    char *heap_src; /* symmetric: PE 0's copy is the heap source of put_heap */
    char *heap_dst; /* symmetric: PE 0's copy is the heap landing of get_heap */
    char *priv_src, *priv_dst, *copy; /* private, cache-line aligned */
    size_t bytes;
} rma_t;

static uint64_t batch_copy(uint64_t ops, void *p) {
    rma_t *r = p;
    if (me != 0)
        return 0;
    uint64_t start = mono();
    for (uint64_t i = 0; i < ops; i++) {
        memcpy(r->copy, r->priv_src, r->bytes);
        __asm__ volatile("" ::"r"(r->copy) : "memory");
    }
    return mono() - start;
}

static uint64_t put_quiet_from(const rma_t *r, const char *source, uint64_t ops) {
    if (me != 0)
        return 0;
    uint64_t start = mono();
    for (uint64_t i = 0; i < ops; i++) {
        shmem_putmem(r->remote, source, r->bytes, 1);
        shmem_quiet();
    }
    return mono() - start;
}

static uint64_t get_into(const rma_t *r, char *landing, uint64_t ops) {
    if (me != 0)
        return 0;
    uint64_t start = mono();
    for (uint64_t i = 0; i < ops; i++) {
        shmem_getmem(landing, r->remote, r->bytes, 1);
        __asm__ volatile("" ::"r"(landing) : "memory");
    }
    return mono() - start;
}

/* One op is a window of RATE_WINDOW puts and a quiet. */
static uint64_t rate_from(const rma_t *r, const char *source, uint64_t ops) {
    if (me != 0)
        return 0;
    uint64_t start = mono();
    for (uint64_t i = 0; i < ops; i++) {
        for (int w = 0; w < RATE_WINDOW; w++)
            shmem_putmem(r->remote, source, r->bytes, 1);
        shmem_quiet();
    }
    return mono() - start;
}

static uint64_t batch_put_heap(uint64_t ops, void *p) {
    return put_quiet_from(p, ((rma_t *)p)->heap_src, ops);
}
static uint64_t batch_put_private(uint64_t ops, void *p) {
    return put_quiet_from(p, ((rma_t *)p)->priv_src, ops);
}
static uint64_t batch_get_heap(uint64_t ops, void *p) {
    return get_into(p, ((rma_t *)p)->heap_dst, ops);
}
static uint64_t batch_get_private(uint64_t ops, void *p) {
    return get_into(p, ((rma_t *)p)->priv_dst, ops);
}
static uint64_t batch_rate_heap(uint64_t ops, void *p) {
    return rate_from(p, ((rma_t *)p)->heap_src, ops);
}
static uint64_t batch_rate_private(uint64_t ops, void *p) {
    return rate_from(p, ((rma_t *)p)->priv_src, ops);
}

/* PE 0 puts `source` (bytes) into PE 1's `remote`, reads it back and compares. */
static void check_put_get(rma_t *r, const char *source, size_t bytes) {
    if (me == 0) {
        shmem_putmem(r->remote, source, bytes, 1);
        shmem_quiet();
        memset(r->priv_dst, 0, bytes);
        shmem_getmem(r->priv_dst, r->remote, bytes, 1);
        if (memcmp(r->priv_dst, source, bytes) != 0)
            die("a put or get of the RMA rows moved the wrong bytes");
    }
    shmem_barrier_all();
}

static void programs_rma(size_t max_bytes) {
    size_t largest = 1;
    while (largest * 4 <= RMA_LARGEST && largest * 4 <= max_bytes)
        largest *= 4;
    /* The buffers also serve the rate rows (4 KiB) and the waiting peer's copy (1 MiB). */
    size_t span = largest > WAITING_BYTES ? largest : WAITING_BYTES;
    rma_t r;
    r.remote = symmetric_or_die(span);
    r.heap_src = symmetric_or_die(span);
    r.heap_dst = symmetric_or_die(span);
    r.priv_src = private_buffer(span, 0);
    r.priv_dst = private_buffer(span, 0xa5);
    r.copy = private_buffer(span, 0x5a);
    for (size_t i = 0; i < span; i++)
        r.priv_src[i] = r.heap_src[i] = (char)(i % 251);
    memset(r.heap_dst, 0xa5, span);
    shmem_barrier_all();
    check_put_get(&r, r.heap_src, largest);
    check_put_get(&r, r.priv_src, largest);
    if (me == 0) {
        memset(r.heap_dst, 0, largest);
        shmem_getmem(r.heap_dst, r.remote, largest, 1);
        if (memcmp(r.heap_dst, r.priv_src, largest) != 0)
            die("a get into the heap moved the wrong bytes");
    }
    shmem_barrier_all();

    timing_t t[5];
    alone_t copy = {batch_copy, &r};
    const char *ref = "memcpy of the same size, PE 1 asleep";
    for (size_t bytes = 1; bytes <= largest; bytes *= 4) {
        r.bytes = bytes;
        batch_fn fns[] = {batch_alone, batch_put_private, batch_put_heap, batch_get_private,
                          batch_get_heap};
        void *states[] = {&copy, &r, &r, &r, &r};
        time_interleaved(5, fns, states, t);
        report_reference("memcpy", bytes, t[0]);
        report("put_private", bytes, t[1], ref, &t[0]);
        report("put_heap", bytes, t[2], ref, &t[0]);
        report("get_private", bytes, t[3], ref, &t[0]);
        report("get_heap", bytes, t[4], ref, &t[0]);
    }
    for (size_t k = 0; k < sizeof rate_bytes / sizeof *rate_bytes; k++) {
        r.bytes = rate_bytes[k];
        batch_fn fns[] = {batch_alone, batch_rate_private, batch_rate_heap};
        void *states[] = {&copy, &r, &r};
        time_interleaved(3, fns, states, t);
        report_reference("memcpy_rate", r.bytes, t[0]);
        timing_t per_put[2] = {scale(t[1], 1.0 / RATE_WINDOW), scale(t[2], 1.0 / RATE_WINDOW)};
        per_put[0].batch_ops *= RATE_WINDOW;
        per_put[1].batch_ops *= RATE_WINDOW;
        report("put_rate_private", r.bytes, per_put[0], ref, &t[0]);
        report("put_rate_heap", r.bytes, per_put[1], ref, &t[0]);
    }
    {
        /* batch_copy on PE 0 while PE 1 returns at once and waits in shmem_barrier_all
         * (together()), against the same copy with PE 1 asleep. */
        r.bytes = WAITING_BYTES;
        batch_fn fns[] = {batch_alone, batch_copy};
        void *states[] = {&copy, &r};
        time_interleaved(2, fns, states, t);
        report_reference("memcpy_peer_asleep", WAITING_BYTES, t[0]);
        report("memcpy_waiting_peer", WAITING_BYTES, t[1], "the same memcpy, PE 1 asleep",
               &t[0]);
    }
    shmem_barrier_all();
    free(r.copy);
    free(r.priv_dst);
    free(r.priv_src);
    shmem_free(r.heap_dst);
    shmem_free(r.heap_src);
    shmem_free(r.remote);
}

/* -- collectives (any PE count) -- */

#if SHMEM_MAJOR_VERSION > 1 || (SHMEM_MAJOR_VERSION == 1 && SHMEM_MINOR_VERSION >= 5)
#define TEAMS 1
#else
#define TEAMS 0
#endif

enum {
    C_BROADCAST,
    C_COLLECT,
    C_FCOLLECT,
    C_ALLTOALL,
    C_ALLTOALLS,
    C_SUM_DOUBLE,
    C_SUM_LONG,
    C_MIN_DOUBLE,
    C_MAX_DOUBLE,
    COLLECTIVES
};
static const char *const legacy_names[COLLECTIVES] = {
    "broadcast64", "collect64",         "fcollect64",      "alltoall64",       "alltoalls64",
    "double_sum_to_all", "long_sum_to_all", "double_min_to_all", "double_max_to_all"};
static const char *const team_names[COLLECTIVES] = {
    "long_broadcast",    "long_collect",    "long_fcollect",     "long_alltoall",
    "long_alltoalls",    "double_sum_reduce", "long_sum_reduce", "double_min_reduce",
    "double_max_reduce"};

#define MAX2(a, b) ((a) > (b) ? (a) : (b))
#define PSYNC_LONGS                                                                            \
    MAX2(MAX2(SHMEM_BCAST_SYNC_SIZE, SHMEM_COLLECT_SYNC_SIZE),                                 \
         MAX2(SHMEM_REDUCE_SYNC_SIZE, MAX2(SHMEM_ALLTOALL_SYNC_SIZE, SHMEM_ALLTOALLS_SYNC_SIZE)))
/* Two pSync arrays, alternated between consecutive legacy calls. */
static long psync[2][PSYNC_LONGS];

typedef struct {
    long *src, *dst; /* symmetric: ALLTOALLS_STRIDE * npes * largest bytes each */
    double *sum_src, *sum_dst; /* symmetric: largest bytes each (reductions over double) */
    long *lsum_src, *lsum_dst; /* the same over long */
    void *work[2];   /* symmetric pWrk, alternated with the pSyncs */
    char *copy_src, *copy_dst; /* private: memcpy references (copy_dst: npes * largest) */
    size_t bytes;
    int parity;
} coll_t;

typedef struct {
    coll_t *c;
    int op;
    int team;  /* 1: the team form */
    int dests; /* memcpy_x<dests> reference */
} coll_batch_t;

static void call_collective(coll_t *c, int op, int team) {
    size_t n = c->bytes / 8;
    long *sync = psync[c->parity];
    void *work = c->work[c->parity];
    c->parity ^= 1;
    if (!team) {
        switch (op) {
        case C_BROADCAST:
            shmem_broadcast64(c->dst, c->src, n, 0, 0, 0, npes, sync);
            break;
        case C_COLLECT:
            shmem_collect64(c->dst, c->src, n, 0, 0, npes, sync);
            break;
        case C_FCOLLECT:
            shmem_fcollect64(c->dst, c->src, n, 0, 0, npes, sync);
            break;
        case C_ALLTOALL:
            shmem_alltoall64(c->dst, c->src, n, 0, 0, npes, sync);
            break;
        case C_ALLTOALLS:
            shmem_alltoalls64(c->dst, c->src, ALLTOALLS_STRIDE, ALLTOALLS_STRIDE, n, 0, 0, npes, sync);
            break;
        case C_SUM_DOUBLE:
            shmem_double_sum_to_all(c->sum_dst, c->sum_src, (int)n, 0, 0, npes, work, sync);
            break;
        case C_SUM_LONG:
            shmem_long_sum_to_all(c->lsum_dst, c->lsum_src, (int)n, 0, 0, npes, work, sync);
            break;
        case C_MIN_DOUBLE:
            shmem_double_min_to_all(c->sum_dst, c->sum_src, (int)n, 0, 0, npes, work, sync);
            break;
        case C_MAX_DOUBLE:
            shmem_double_max_to_all(c->sum_dst, c->sum_src, (int)n, 0, 0, npes, work, sync);
            break;
        }
        return;
    }
#if TEAMS
    int status = 0;
    shmem_team_t world = SHMEM_TEAM_WORLD;
    switch (op) {
    case C_BROADCAST:
        status = shmem_long_broadcast(world, c->dst, c->src, n, 0);
        break;
    case C_COLLECT:
        status = shmem_long_collect(world, c->dst, c->src, n);
        break;
    case C_FCOLLECT:
        status = shmem_long_fcollect(world, c->dst, c->src, n);
        break;
    case C_ALLTOALL:
        status = shmem_long_alltoall(world, c->dst, c->src, n);
        break;
    case C_ALLTOALLS:
        status = shmem_long_alltoalls(world, c->dst, c->src, ALLTOALLS_STRIDE, ALLTOALLS_STRIDE,
                                      n);
        break;
    case C_SUM_DOUBLE:
        status = shmem_double_sum_reduce(world, c->sum_dst, c->sum_src, n);
        break;
    case C_SUM_LONG:
        status = shmem_long_sum_reduce(world, c->lsum_dst, c->lsum_src, n);
        break;
    case C_MIN_DOUBLE:
        status = shmem_double_min_reduce(world, c->sum_dst, c->sum_src, n);
        break;
    case C_MAX_DOUBLE:
        status = shmem_double_max_reduce(world, c->sum_dst, c->sum_src, n);
        break;
    }
    if (status != 0)
        die("a team collective returned nonzero");
#else
    (void)op;
    die("team collectives need OpenSHMEM 1.5");
#endif
}

static uint64_t batch_collective(uint64_t ops, void *p) {
    coll_batch_t *b = p;
    uint64_t start = mono();
    for (uint64_t i = 0; i < ops; i++)
        call_collective(b->c, b->op, b->team);
    return mono() - start;
}

/* PE 0 copies `bytes` into `dests` distinct private destinations (run through batch_alone). */
static uint64_t batch_copy_dests(uint64_t ops, void *p) {
    coll_batch_t *b = p;
    coll_t *c = b->c;
    uint64_t start = mono();
    for (uint64_t i = 0; i < ops; i++)
        for (int d = 0; d < b->dests; d++) {
            memcpy(c->copy_dst + (size_t)d * c->bytes, c->copy_src, c->bytes);
            __asm__ volatile("" ::"r"(c->copy_dst) : "memory");
        }
    return mono() - start;
}

/* The value element j of PE pe's data-movement source holds. */
static long pattern(int pe, size_t j) { return ((long)pe << 40) | (long)j; }

static void wrong(const char *name, size_t bytes, size_t index) {
    fprintf(stderr, "oshmem_bench (PE %d): %s of %zu B: element %zu is wrong\n", me, name, bytes,
            index);
    exit(1);
}

/* One call of the operation on sources filled by fill_sources, checked on every PE. */
static void check_collective(coll_t *c, int op, int team) {
    const char *name = team ? team_names[op] : legacy_names[op];
    size_t n = c->bytes / 8, span = (size_t)npes * n;
    memset(c->dst, 0, ALLTOALLS_STRIDE * span * sizeof(long));
    memset(c->sum_dst, 0, c->bytes);
    memset(c->lsum_dst, 0, c->bytes);
    shmem_barrier_all();
    call_collective(c, op, team);
    shmem_barrier_all();
    for (size_t i = 0; i < n; i++) {
        long k = (long)(i % 7);
        double dk = (double)k;
        switch (op) {
        case C_BROADCAST:
            if ((team || me != 0) && c->dst[i] != pattern(0, i))
                wrong(name, c->bytes, i);
            break;
        case C_SUM_DOUBLE:
            if (c->sum_dst[i] != (double)npes * (npes - 1) / 2 + npes * dk)
                wrong(name, c->bytes, i);
            break;
        case C_SUM_LONG:
            if (c->lsum_dst[i] != (long)npes * (npes - 1) / 2 + npes * k)
                wrong(name, c->bytes, i);
            break;
        case C_MIN_DOUBLE:
            if (c->sum_dst[i] != dk)
                wrong(name, c->bytes, i);
            break;
        case C_MAX_DOUBLE:
            if (c->sum_dst[i] != (double)(npes - 1) + dk)
                wrong(name, c->bytes, i);
            break;
        default:
            for (int pe = 0; pe < npes; pe++) {
                size_t at = (size_t)pe * n + i;
                long expected = op == C_ALLTOALL    ? pattern(pe, (size_t)me * n + i)
                                : op == C_ALLTOALLS ? pattern(pe, ((size_t)me * n + i) * ALLTOALLS_STRIDE)
                                                    : pattern(pe, i);
                if (op == C_ALLTOALLS)
                    at *= ALLTOALLS_STRIDE;
                if (c->dst[at] != expected)
                    wrong(name, c->bytes, at);
            }
        }
    }
    shmem_barrier_all();
}

static void fill_sources(coll_t *c) {
    size_t n = c->bytes / 8, span = ALLTOALLS_STRIDE * (size_t)npes * n;
    for (size_t j = 0; j < span; j++)
        c->src[j] = pattern(me, j);
    for (size_t i = 0; i < n; i++) {
        c->sum_src[i] = (double)me + (double)(i % 7);
        c->lsum_src[i] = (long)me + (long)(i % 7);
    }
}

static int destinations(int op, int team) {
    switch (op) {
    case C_BROADCAST:
        return team ? npes : npes - 1;
    case C_COLLECT:
    case C_FCOLLECT:
    case C_ALLTOALL:
    case C_ALLTOALLS:
        return npes;
    default:
        return 1;
    }
}

static void programs_collectives(size_t max_bytes) {
    size_t largest = 0;
    for (size_t k = 0; k < sizeof collective_bytes / sizeof *collective_bytes; k++)
        if (collective_bytes[k] <= max_bytes)
            largest = collective_bytes[k];
    if (largest == 0)
        return;
    coll_t c;
    memset(&c, 0, sizeof c);
    size_t span = ALLTOALLS_STRIDE * (size_t)npes * largest;
    c.src = symmetric_or_die(span);
    c.dst = symmetric_or_die(span);
    c.sum_src = symmetric_or_die(largest);
    c.sum_dst = symmetric_or_die(largest);
    c.lsum_src = symmetric_or_die(largest);
    c.lsum_dst = symmetric_or_die(largest);
    size_t work = largest / 8 / 2 + 1;
    if (work < SHMEM_REDUCE_MIN_WRKDATA_SIZE)
        work = SHMEM_REDUCE_MIN_WRKDATA_SIZE;
    c.work[0] = symmetric_or_die(work * sizeof(double));
    c.work[1] = symmetric_or_die(work * sizeof(double));
    c.copy_src = private_buffer(largest, 0x3c);
    c.copy_dst = private_buffer((size_t)npes * largest, 0x5a);
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < PSYNC_LONGS; i++)
            psync[s][i] = SHMEM_SYNC_VALUE;
    shmem_barrier_all();

    int forms = TEAMS ? 2 : 1;
    for (size_t k = 0; k < sizeof collective_bytes / sizeof *collective_bytes; k++) {
        if (collective_bytes[k] > max_bytes)
            break;
        c.bytes = collective_bytes[k];
        fill_sources(&c);
        for (int form = 0; form < forms; form++)
            for (int op = 0; op < COLLECTIVES; op++)
                check_collective(&c, op, form);
        /* The references (one per distinct destination count), then every operation. */
        coll_batch_t batches[MAX_BATCHES];
        alone_t alone[3];
        batch_fn fns[MAX_BATCHES];
        void *states[MAX_BATCHES];
        int dests[3], refs = 0, n = 0;
        int wanted[3] = {1, npes - 1, npes};
        for (int w = 0; w < 3; w++) {
            int seen = wanted[w] < 1;
            for (int r = 0; r < refs; r++)
                seen |= dests[r] == wanted[w];
            if (seen)
                continue;
            dests[refs] = wanted[w];
            batches[n] = (coll_batch_t){&c, -1, 0, wanted[w]};
            alone[refs] = (alone_t){batch_copy_dests, &batches[n]};
            fns[n] = batch_alone;
            states[n] = &alone[refs];
            refs++;
            n++;
        }
        for (int form = 0; form < forms; form++)
            for (int op = 0; op < COLLECTIVES; op++) {
                batches[n] = (coll_batch_t){&c, op, form, destinations(op, form)};
                fns[n] = batch_collective;
                states[n] = &batches[n];
                n++;
            }
        timing_t t[MAX_BATCHES];
        time_interleaved(n, fns, states, t);
        char names[3][32], refs_text[3][96];
        for (int r = 0; r < refs; r++) {
            snprintf(names[r], sizeof names[r], "memcpy_x%d", dests[r]);
            if (dests[r] == 1)
                snprintf(refs_text[r], sizeof refs_text[r], "memcpy of the same size, others asleep");
            else
                snprintf(refs_text[r], sizeof refs_text[r],
                         "memcpy of the same size to %d destinations, others asleep", dests[r]);
            report_reference(names[r], c.bytes, t[r]);
        }
        for (int b = refs; b < n; b++) {
            int r = 0;
            while (dests[r] != batches[b].dests)
                r++;
            const char *name = batches[b].team ? team_names[batches[b].op]
                                               : legacy_names[batches[b].op];
            report(name, c.bytes, t[b], refs_text[r], &t[r]);
        }
    }
    shmem_barrier_all();
    free(c.copy_dst);
    free(c.copy_src);
    shmem_free(c.work[1]);
    shmem_free(c.work[0]);
    shmem_free(c.lsum_dst);
    shmem_free(c.lsum_src);
    shmem_free(c.sum_dst);
    shmem_free(c.sum_src);
    shmem_free(c.dst);
    shmem_free(c.src);
}

/* --programs: the RMA rows (2 PEs only), then the collectives; sizes up to max_bytes. */
static void run_programs(size_t max_bytes) {
    if (npes < 2)
        die("--programs needs at least 2 PEs");
    trial_budget_ns = PROGRAMS_TRIAL_BUDGET_NS;
    aiming = 1;
    open_asleep_semaphore();
    if (npes == 2)
        programs_rma(max_bytes);
    programs_collectives(max_bytes);
    shmem_barrier_all();
    sem_close(asleep);
}

int main(int argc, char **argv) {
    int quick = 0, init_only = 0, no_pin = 0, programs = 0;
    long long job_start = -1, max_bytes = -1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--init-only"))
            init_only = 1;
        else if (!strcmp(argv[i], "--no-pin"))
            no_pin = 1;
        else if (!strcmp(argv[i], "--job-start") && i + 1 < argc)
            job_start = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--programs"))
            programs = 1;
        else if (!strcmp(argv[i], "--max-bytes") && i + 1 < argc && atoll(argv[i + 1]) > 0)
            max_bytes = atoll(argv[++i]);
        else {
            fprintf(stderr,
                    "usage: %s [--quick] [--init-only] [--job-start NS] [--no-pin] "
                    "[--programs [--max-bytes N]]\n",
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

    if (programs) {
        /* Transfers up to 16 MiB, QUICK_COLLECTIVE_LARGEST with --quick, or --max-bytes. */
        size_t largest = quick ? QUICK_COLLECTIVE_LARGEST : COLLECTIVE_LARGEST;
        if (quick)
            trials = QUICK_PROGRAMS_TRIALS;
        run_programs(max_bytes > 0 ? (size_t)max_bytes : largest);
        shmem_finalize();
        return 0;
    }

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
