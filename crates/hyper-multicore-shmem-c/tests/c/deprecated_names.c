/* Names older and other OpenSHMEM programs use: the deprecated atomic names for every standard
 * atomic type (typed and C11 type-generic), shmem_sync in both its forms, and the C11 bitwise
 * atomics and reductions over the signed fixed-width types. */
#include <shmem.h>
#include <stdint.h>

#include "check.h"

static unsigned int word_u;
static uint64_t word_u64;
static size_t word_size;
static double word_d;
static long psync[SHMEM_BARRIER_SYNC_SIZE];

static void typed_names(void) {
    word_u = 0;
    word_u64 = 10;
    word_size = 0;
    shmem_barrier_all();
    CHECK(shmem_uint_finc(&word_u, next) < (unsigned)n);
    shmem_uint_inc(&word_u, next);
    shmem_uint64_add(&word_u64, 5, next);
    shmem_uint64_fadd(&word_u64, 1, next);
    CHECK(shmem_size_cswap(&word_size, 0, 0, next) == 0);
    shmem_barrier_all();
    CHECK(word_u == 2);
    CHECK(word_u64 == 16);
    shmem_size_set(&word_size, (size_t)me, next);
    shmem_barrier_all();
    CHECK(shmem_size_fetch(&word_size, me) == (size_t)prev);
    CHECK(shmem_ptrdiff_swap((ptrdiff_t *)&word_size, 7, me) == (ptrdiff_t)prev);
    shmem_barrier_all();
}

static void generic_names(void) {
    word_d = 0.0;
    word_u = 0;
    shmem_barrier_all();
    shmem_set(&word_d, 1.5, next);
    shmem_inc(&word_u, next);
    shmem_add(&word_u, 2u, next);
    shmem_barrier_all();
    CHECK(shmem_fetch(&word_d, me) == 1.5);
    CHECK(shmem_fetch(&word_u, me) == 3u);
    CHECK(shmem_swap(&word_d, 2.5, me) == 1.5);
    CHECK(shmem_cswap(&word_u, 3u, 9u, me) == 3u);
    CHECK(shmem_finc(&word_u, me) == 9u);
    CHECK(shmem_fadd(&word_u, 5u, me) == 10u);
    shmem_barrier_all();
}

static void syncs(void) {
    shmem_sync(SHMEM_TEAM_WORLD);
    CHECK(shmem_sync(SHMEM_TEAM_WORLD) == 0);
    for (int i = 0; i < SHMEM_BARRIER_SYNC_SIZE; i++)
        psync[i] = SHMEM_SYNC_VALUE;
    shmem_barrier_all();
    shmem_sync(0, 0, n, psync);
    shmem_sync_all();
}

static int32_t bits32;
static int64_t bits64;

static void signed_bitwise_atomics(void) {
    bits32 = -1;
    bits64 = 0;
    shmem_barrier_all();
    shmem_atomic_and(&bits32, ~(int32_t)(1 << (me % 31)), 0);
    shmem_atomic_or(SHMEM_CTX_DEFAULT, &bits64, (int64_t)1 << me, 0);
    shmem_quiet();
    CHECK((shmem_atomic_fetch_xor(&bits64, 0, 0) & ((int64_t)1 << me)) != 0);
    shmem_barrier_all();
    if (me == 0) {
        int32_t expect32 = -1;
        for (int pe = 0; pe < n; pe++)
            expect32 &= ~(int32_t)(1 << (pe % 31));
        CHECK(bits32 == expect32);
        CHECK(bits64 == ((int64_t)1 << n) - 1);
    }
    shmem_barrier_all();
}

static void signed_bitwise_reductions(void) {
    int8_t *source8 = shmem_malloc(sizeof(int8_t)), *dest8 = shmem_malloc(sizeof(int8_t));
    int64_t *source64 = shmem_malloc(sizeof(int64_t)), *dest64 = shmem_malloc(sizeof(int64_t));
    CHECK(source8 && dest8 && source64 && dest64);
    *source8 = (int8_t)(1 << (me % 7));
    *source64 = (int64_t)1 << me;
    shmem_barrier_all();
    CHECK(shmem_or_reduce(SHMEM_TEAM_WORLD, dest8, source8, 1) == 0);
    CHECK(shmem_xor_reduce(SHMEM_TEAM_WORLD, dest64, source64, 1) == 0);
    int8_t expect8 = 0;
    for (int pe = 0; pe < n; pe++)
        expect8 |= (int8_t)(1 << (pe % 7));
    CHECK(*dest8 == expect8);
    CHECK(*dest64 == ((int64_t)1 << n) - 1);
    shmem_free(source8);
    shmem_free(dest8);
    shmem_free(source64);
    shmem_free(dest64);
}

int main(void) {
    start();
    typed_names();
    generic_names();
    syncs();
    signed_bitwise_atomics();
    signed_bitwise_reductions();
    PASS("deprecated_names");
    shmem_finalize();
    return 0;
}
