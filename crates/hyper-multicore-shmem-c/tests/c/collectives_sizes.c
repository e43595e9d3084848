/* Every collective at odd sizes on odd teams, each result compared with a reference computed
 * here: broadcast, fcollect, collect, alltoall, alltoalls and the reductions, over
 * SHMEM_TEAM_WORLD, a split team of the even PEs, a split team of every PE in reverse order
 * (team order is not world order), and the legacy forms over active sets (every PE, PEs
 * 1..n-1, the odd PEs). Sizes: 0, 1 and 7 bytes (not multiples of any element), a few
 * elements, and sizes past the runtime's thresholds (a broadcast pulled by the members, a
 * reduction combined in shares, over several chunks). Destinations are filled with a sentinel
 * first: nothing may be written past the result. Runs on 1 to 5 PEs. */
#include <shmem.h>
#include <string.h>

#include "check.h"

#define MAX_PES 8
/* The largest block a PE contributes (bytes): past a 64 KiB broadcast, not a multiple of 8. */
#define BIG 65543
#define SENTINEL 0xEE
#define TAIL 16

static long pSync[SHMEM_REDUCE_SYNC_SIZE];
static double pWrk[SHMEM_REDUCE_MIN_WRKDATA_SIZE + 8192];

static unsigned char *src, *dst;
static size_t src_bytes, dst_bytes;

/* The byte PE `pe` contributes at index `i` (`salt` tells calls apart). */
static unsigned char pattern(int pe, size_t i, int salt) {
    return (unsigned char)(pe * 37 + i * 11 + salt * 5 + 1);
}

/* One team as this PE sees it: its size, this PE's place, and each member's world PE. */
struct team {
    shmem_team_t handle; /* SHMEM_TEAM_INVALID for an active set */
    int start, log_stride; /* the active set, when handle is invalid */
    int size, index;
    int pes[MAX_PES];
};

static void sync_team(const struct team *t) {
    if (t->handle != SHMEM_TEAM_INVALID)
        CHECK(shmem_team_sync(t->handle) == 0);
    else
        shmem_barrier(t->start, t->log_stride, t->size, pSync);
}

static void fill_sources(int salt, size_t bytes) {
    for (size_t i = 0; i < bytes; i++) src[i] = pattern(me, i, salt);
}

/* Sentinel in the whole destination, then the team meets (no member writes into a
 * destination that is not ready). */
static void prepare(const struct team *t) {
    memset(dst, SENTINEL, dst_bytes);
    sync_team(t);
}

/* The destination past `bytes` is untouched. */
static void check_tail(size_t bytes) {
    for (size_t i = bytes; i < bytes + TAIL && i < dst_bytes; i++) CHECK(dst[i] == SENTINEL);
}

static void broadcasts(const struct team *t, size_t bytes, int salt) {
    for (int r = 0; r < 2; r++) {
        int root = r == 0 ? 0 : t->size - 1;
        fill_sources(salt + r, bytes);
        prepare(t);
        if (t->handle != SHMEM_TEAM_INVALID) {
            CHECK(shmem_broadcastmem(t->handle, dst, src, bytes, root) == 0);
            for (size_t i = 0; i < bytes; i++) CHECK(dst[i] == pattern(t->pes[root], i, salt + r));
        } else {
            /* Legacy: 32-bit elements (bytes / 4 of them); the root's dest is not written. */
            size_t nelems = bytes / 4;
            shmem_broadcast32(dst, src, nelems, root, t->start, t->log_stride, t->size, pSync);
            for (size_t i = 0; i < 4 * nelems; i++)
                CHECK(dst[i] == (t->index == root ? SENTINEL : pattern(t->pes[root], i, salt + r)));
            bytes = 4 * nelems;
        }
        check_tail(bytes);
        sync_team(t);
    }
}

static void fcollects(const struct team *t, size_t bytes, int salt) {
    fill_sources(salt, bytes);
    prepare(t);
    if (t->handle != SHMEM_TEAM_INVALID) {
        CHECK(shmem_fcollectmem(t->handle, dst, src, bytes) == 0);
    } else {
        bytes = bytes / 8 * 8;
        shmem_fcollect64(dst, src, bytes / 8, t->start, t->log_stride, t->size, pSync);
    }
    for (int k = 0; k < t->size; k++)
        for (size_t i = 0; i < bytes; i++) CHECK(dst[k * bytes + i] == pattern(t->pes[k], i, salt));
    check_tail(t->size * bytes);
    sync_team(t);
}

/* The team's k-th member contributes `bytes + k` bytes (legacy: `bytes / 4 + k` ints). */
static void collects(const struct team *t, size_t bytes, int salt) {
    int legacy = t->handle == SHMEM_TEAM_INVALID;
    size_t unit = legacy ? 4 : 1;
    size_t count = (legacy ? bytes / 4 : bytes) + (size_t)t->index;
    fill_sources(salt, count * unit);
    prepare(t);
    if (!legacy)
        CHECK(shmem_collectmem(t->handle, dst, src, count) == 0);
    else
        shmem_collect32(dst, src, count, t->start, t->log_stride, t->size, pSync);
    size_t at = 0;
    for (int k = 0; k < t->size; k++) {
        size_t theirs = ((legacy ? bytes / 4 : bytes) + (size_t)k) * unit;
        for (size_t i = 0; i < theirs; i++, at++) CHECK(dst[at] == pattern(t->pes[k], i, salt));
    }
    check_tail(at);
    sync_team(t);
}

/* Block k (`bytes` long) of this PE's source goes to the team's k-th member. */
static void alltoalls_contiguous(const struct team *t, size_t bytes, int salt) {
    int legacy = t->handle == SHMEM_TEAM_INVALID;
    if (legacy) bytes = bytes / 8 * 8;
    for (int k = 0; k < t->size; k++)
        for (size_t i = 0; i < bytes; i++) src[k * bytes + i] = pattern(me, k * 1000 + i, salt);
    prepare(t);
    if (!legacy)
        CHECK(shmem_alltoallmem(t->handle, dst, src, bytes) == 0);
    else
        shmem_alltoall64(dst, src, bytes / 8, t->start, t->log_stride, t->size, pSync);
    for (int k = 0; k < t->size; k++)
        for (size_t i = 0; i < bytes; i++)
            CHECK(dst[k * bytes + i] == pattern(t->pes[k], t->index * 1000 + i, salt));
    check_tail(t->size * bytes);
    sync_team(t);
}

/* `nelems` ints per member, 3 apart in the source, 2 apart in the destination. */
static void alltoalls_strided(const struct team *t, size_t nelems, int salt) {
    int *from = (int *)src, *into = (int *)dst;
    for (int k = 0; k < t->size; k++)
        for (size_t e = 0; e < nelems; e++)
            from[(k * nelems + e) * 3] = me * 100000 + k * 1000 + (int)e + salt;
    prepare(t);
    if (t->handle != SHMEM_TEAM_INVALID)
        CHECK(shmem_int_alltoalls(t->handle, into, from, 2, 3, nelems) == 0);
    else
        shmem_alltoalls32(into, from, 2, 3, nelems, t->start, t->log_stride, t->size, pSync);
    for (int k = 0; k < t->size; k++)
        for (size_t e = 0; e < nelems; e++) {
            size_t at = (k * nelems + e) * 2;
            CHECK(into[at] == t->pes[k] * 100000 + t->index * 1000 + (int)e + salt);
            if (at + 1 < (size_t)t->size * nelems * 2 - 1) {
                const unsigned char *gap = (const unsigned char *)&into[at + 1];
                for (int b = 0; b < 4; b++) CHECK(gap[b] == SENTINEL);
            }
        }
    sync_team(t);
}

/* Reductions: PE p's value at index i, integers small enough that every sum and product of up
 * to five members is exact in a double and the same in any order. */
static long value(int pe, size_t i) { return (long)((pe * 7 + i * 3) % 11) - 3; }

/* `TEAM` names the team form's type, `LEGACY` the legacy form's (the standard lists different
 * types for each). */
#define REDUCE_CHECK(T, TEAM, LEGACY, OP, COMBINE)                                             \
    static void reduce_##TEAM##_##OP(const struct team *t, size_t count, int in_place) {      \
        T *from = (T *)src, *into = in_place ? (T *)src : (T *)dst;                          \
        for (size_t i = 0; i < count; i++) from[i] = (T)value(me, i);                         \
        prepare(t);                                                                            \
        if (in_place) sync_team(t);                                                            \
        if (t->handle != SHMEM_TEAM_INVALID)                                                   \
            CHECK(shmem_##TEAM##_##OP##_reduce(t->handle, into, from, count) == 0);            \
        else                                                                                   \
            shmem_##LEGACY##_##OP##_to_all(into, from, (int)count, t->start, t->log_stride,    \
                                         t->size, (T *)pWrk, pSync);                           \
        for (size_t i = 0; i < count; i++) {                                                   \
            T want = (T)value(t->pes[0], i);                                                   \
            for (int k = 1; k < t->size; k++) {                                                \
                T a = want, b = (T)value(t->pes[k], i);                                        \
                want = (T)(COMBINE);                                                           \
            }                                                                                  \
            CHECK(into[i] == want);                                                            \
        }                                                                                      \
        if (!in_place) check_tail(count * sizeof(T));                                          \
        sync_team(t);                                                                          \
    }

REDUCE_CHECK(double, double, double, sum, a + b)
REDUCE_CHECK(float, float, float, max, a > b ? a : b)
REDUCE_CHECK(int, int32, int, xor, a ^ b)
REDUCE_CHECK(long, long, long, min, a < b ? a : b)
REDUCE_CHECK(short, short, short, prod, a * b)
/* No legacy form: never called on an active set. */
#define shmem_uchar_and_to_all(...) CHECK(0)
REDUCE_CHECK(unsigned char, uchar, uchar, and, a & b)

static void reductions(const struct team *t, size_t bytes) {
    for (int in_place = 0; in_place < 2; in_place++) {
        reduce_double_sum(t, bytes / sizeof(double), in_place);
        reduce_float_max(t, bytes / sizeof(float), in_place);
        reduce_int32_xor(t, bytes / sizeof(int), in_place);
        reduce_long_min(t, bytes / sizeof(long), in_place);
        reduce_short_prod(t, bytes / sizeof(short), in_place);
        if (t->handle != SHMEM_TEAM_INVALID) reduce_uchar_and(t, bytes, in_place);
    }
}

/* Every put a member made before the team's barrier is seen after it. */
static void barriers(const struct team *t) {
    long *slots = (long *)dst;
    for (int k = 0; k < t->size; k++) slots[k] = -1;
    sync_team(t);
    for (int round = 0; round < 20; round++) {
        for (int k = 0; k < t->size; k++) shmem_long_p(&slots[t->index], round * 100 + t->index, t->pes[k]);
        sync_team(t);
        for (int k = 0; k < t->size; k++) CHECK(slots[k] == round * 100 + k);
        sync_team(t);
    }
}

static void every_collective(const struct team *t) {
    static const size_t sizes[] = {0, 1, 7, 8, 20, 4100, 16411, BIG};
    int salt = 0;
    barriers(t);
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t bytes = sizes[s];
        broadcasts(t, bytes, salt++);
        fcollects(t, bytes, salt++);
        collects(t, bytes, salt++);
        alltoalls_contiguous(t, bytes < 1000 ? bytes : bytes / 8, salt++);
        if (bytes < 100) alltoalls_strided(t, bytes, salt++);
        reductions(t, bytes);
    }
}

/* The team `handle` (or, if invalid, the active set start, log_stride, size). */
static void make_team(struct team *t, shmem_team_t handle, int start, int log_stride, int size) {
    t->handle = handle;
    t->start = start;
    t->log_stride = log_stride;
    if (handle != SHMEM_TEAM_INVALID) {
        t->size = shmem_team_n_pes(handle);
        t->index = shmem_team_my_pe(handle);
        for (int k = 0; k < t->size; k++)
            t->pes[k] = shmem_team_translate_pe(handle, k, SHMEM_TEAM_WORLD);
    } else {
        t->size = size;
        t->index = (me - start) >> log_stride;
        for (int k = 0; k < size; k++) t->pes[k] = start + (k << log_stride);
    }
}

int main(void) {
    start();
    CHECK(n <= MAX_PES);
    for (int i = 0; i < SHMEM_REDUCE_SYNC_SIZE; i++) pSync[i] = SHMEM_SYNC_VALUE;
    src_bytes = (size_t)MAX_PES * BIG + 64;
    dst_bytes = (size_t)MAX_PES * (BIG + MAX_PES) + 64;
    src = shmem_malloc(src_bytes);
    dst = shmem_malloc(dst_bytes);
    CHECK(src && dst);
    shmem_barrier_all();

    struct team t;
    make_team(&t, SHMEM_TEAM_WORLD, 0, 0, 0);
    every_collective(&t);

    shmem_team_t evens, reversed;
    CHECK(shmem_team_split_strided(SHMEM_TEAM_WORLD, 0, 2, (n + 1) / 2, NULL, 0, &evens) == 0);
    CHECK(shmem_team_split_strided(SHMEM_TEAM_WORLD, n - 1, -1, n, NULL, 0, &reversed) == 0);
    if (me % 2 == 0) {
        make_team(&t, evens, 0, 0, 0);
        every_collective(&t);
    }
    shmem_barrier_all();
    make_team(&t, reversed, 0, 0, 0);
    every_collective(&t);
    shmem_barrier_all();

    /* Legacy forms over active sets: every PE, PEs 1..n-1, the odd PEs. */
    make_team(&t, SHMEM_TEAM_INVALID, 0, 0, n);
    every_collective(&t);
    shmem_barrier_all();
    if (me > 0) {
        make_team(&t, SHMEM_TEAM_INVALID, 1, 0, n - 1);
        every_collective(&t);
    }
    shmem_barrier_all();
    if (me % 2 == 1) {
        make_team(&t, SHMEM_TEAM_INVALID, 1, 1, n / 2);
        every_collective(&t);
    }
    shmem_barrier_all();
    shmem_team_destroy(reversed);
    if (evens != SHMEM_TEAM_INVALID) shmem_team_destroy(evens);
    shmem_free(dst);
    shmem_free(src);
    PASS("collectives_sizes");
    shmem_finalize();
    return 0;
}
