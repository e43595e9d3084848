/* Atomics for every standard AMO type (the X-macro lists of hmshmem_types.h): fetch, set, swap
 * (extended types, floats included), compare_swap, fetch_inc, inc, fetch_add, add (standard
 * types), and/or/xor (bitwise types), every _nbi fetching form, under contention from every PE
 * on PE 0's word; the C11 generic forms for the generic types. */
#include <shmem.h>

#include "check.h"


#define DEFINE_EXTENDED_TEST(T, N, A)                                                          \
    static void extended_##N(void) {                                                           \
        T *x = shmem_calloc(2, sizeof(T));                                                     \
        shmem_##N##_atomic_set(x, (T)(me + 1), next);                                          \
        shmem_barrier_all();                                                                   \
        CHECK(*x == (T)(prev + 1) && shmem_##N##_atomic_fetch(x, prev) == (T)((prev + n - 1) % n + 1)); \
        shmem_barrier_all();                                                                   \
        CHECK(shmem_##N##_atomic_swap(x, (T)(me + 10), next) == (T)(me + 1));                  \
        shmem_barrier_all();                                                                   \
        CHECK(*x == (T)(prev + 10));                                                           \
        T fetched = (T)0, swapped = (T)0;                                                      \
        shmem_##N##_atomic_fetch_nbi(&fetched, x, next);                                       \
        shmem_quiet();                                                                         \
        CHECK(fetched == (T)(me + 10));                                                        \
        shmem_barrier_all();                                                                   \
        shmem_##N##_atomic_swap_nbi(&swapped, x, (T)(me + 20), next);                          \
        shmem_quiet();                                                                         \
        CHECK(swapped == (T)(me + 10));                                                        \
        shmem_barrier_all();                                                                   \
        CHECK(*x == (T)(prev + 20));                                                           \
        shmem_##N##_atomic_fetch_nbi(&x[1], x, me); /* the result lands in symmetric memory */ \
        shmem_quiet();                                                                         \
        CHECK(x[1] == (T)(prev + 20));                                                         \
        shmem_barrier_all();                                                                   \
        shmem_free(x);                                                                         \
    }
HMSHMEM_AMO_EXTENDED_TYPES(DEFINE_EXTENDED_TEST, _)

#define DEFINE_STANDARD_TEST(T, N, A)                                                          \
    static void standard_##N(void) {                                                           \
        T *counter = shmem_calloc(1, sizeof(T));                                               \
        T *winner = shmem_calloc(1, sizeof(T));                                                \
        T *wins = shmem_calloc(1, sizeof(T));                                                  \
        T fetched = (T)0;                                                                      \
        for (int round = 0; round < 20; round++) {                                             \
            shmem_##N##_atomic_fetch_add(counter, (T)2, 0);                                    \
            shmem_##N##_atomic_inc(counter, 0);                                                \
            shmem_##N##_atomic_add(counter, (T)3, 0);                                          \
            shmem_##N##_atomic_fetch_inc(counter, 0);                                          \
            shmem_##N##_atomic_fetch_add_nbi(&fetched, counter, (T)1, 0);                      \
            shmem_##N##_atomic_fetch_inc_nbi(&fetched, counter, 0);                            \
        }                                                                                      \
        shmem_quiet();                                                                         \
        if (shmem_##N##_atomic_compare_swap(winner, (T)0, (T)(me + 1), 0) == (T)0)             \
            shmem_##N##_atomic_inc(wins, 0);                                                   \
        T old = (T)99;                                                                         \
        shmem_##N##_atomic_compare_swap_nbi(&old, winner, (T)1000, (T)2000, 0);                \
        shmem_quiet();                                                                         \
        CHECK(old != (T)99 && old != (T)0);                                                    \
        shmem_barrier_all();                                                                   \
        if (me == 0) {                                                                         \
            CHECK(*counter == (T)(20 * 9 * n));                                                \
            CHECK(*wins == (T)1 && *winner >= (T)1 && *winner <= (T)n);                        \
        }                                                                                      \
        shmem_barrier_all();                                                                   \
        shmem_free(wins);                                                                      \
        shmem_free(winner);                                                                    \
        shmem_free(counter);                                                                   \
    }
HMSHMEM_AMO_STANDARD_TYPES(DEFINE_STANDARD_TEST, _)

#define DEFINE_BITWISE_TEST(T, N, A)                                                           \
    static void bitwise_##N(void) {                                                            \
        T *bits = shmem_calloc(1, sizeof(T));                                                  \
        T bit = (T)((T)1 << me), fetched = (T)0;                                               \
        shmem_##N##_atomic_or(bits, bit, 0);                                                   \
        shmem_barrier_all();                                                                   \
        CHECK(shmem_##N##_atomic_fetch(bits, 0) == (T)(((T)1 << n) - 1));                      \
        shmem_barrier_all();                                                                   \
        CHECK((shmem_##N##_atomic_fetch_xor(bits, bit, 0) & bit) == bit); /* clears it */      \
        shmem_barrier_all();                                                                   \
        CHECK(shmem_##N##_atomic_fetch(bits, 0) == (T)0);                                      \
        shmem_barrier_all();                                                                   \
        shmem_##N##_atomic_fetch_or_nbi(&fetched, bits, bit, 0);                               \
        shmem_quiet();                                                                         \
        shmem_barrier_all();                                                                   \
        CHECK((shmem_##N##_atomic_fetch_and(bits, (T)~bit, 0) & bit) == bit);                  \
        shmem_barrier_all();                                                                   \
        CHECK(shmem_##N##_atomic_fetch(bits, 0) == (T)0);                                      \
        shmem_barrier_all();                                                                   \
        shmem_##N##_atomic_xor(bits, bit, 0);                                                  \
        shmem_##N##_atomic_fetch_xor_nbi(&fetched, bits, (T)0, 0);                             \
        shmem_quiet();                                                                         \
        shmem_barrier_all();                                                                   \
        shmem_##N##_atomic_and(bits, (T)~bit, 0);                                              \
        shmem_##N##_atomic_fetch_and_nbi(&fetched, bits, (T)~(T)0, 0);                         \
        shmem_quiet();                                                                         \
        shmem_barrier_all();                                                                   \
        CHECK(*bits == (T)0 || me != 0);                                                       \
        shmem_barrier_all();                                                                   \
        shmem_free(bits);                                                                      \
    }
HMSHMEM_AMO_BITWISE_TYPES(DEFINE_BITWISE_TEST, _)

#define DEFINE_GENERIC_TEST(T, N, A)                                                           \
    static void generic_##N(void) {                                                            \
        T *x = shmem_calloc(1, sizeof(T));                                                     \
        shmem_atomic_add(x, (T)2, 0);                                                          \
        shmem_atomic_fetch_inc(x, 0);                                                          \
        shmem_barrier_all();                                                                   \
        CHECK(shmem_atomic_fetch(x, 0) == (T)(3 * n));                                         \
        shmem_barrier_all();                                                                   \
        shmem_free(x);                                                                         \
    }
HMSHMEM_AMO_STANDARD_GENERIC_TYPES(DEFINE_GENERIC_TEST, _)

/* The deprecated names do what their atomic_ successors do. */
#define DEFINE_DEPRECATED_EXTENDED_TEST(T, N, A)                                               \
    static void deprecated_extended_##N(void) {                                                \
        T *x = shmem_calloc(1, sizeof(T));                                                     \
        shmem_##N##_set(x, (T)(me + 1), next);                                                 \
        shmem_barrier_all();                                                                   \
        CHECK(shmem_##N##_fetch(x, me) == (T)(prev + 1));                                      \
        shmem_barrier_all();                                                                   \
        CHECK(shmem_##N##_swap(x, (T)7, next) == (T)(me + 1));                                 \
        shmem_barrier_all();                                                                   \
        shmem_free(x);                                                                         \
    }
HMSHMEM_DEPRECATED_AMO_EXTENDED_TYPES(DEFINE_DEPRECATED_EXTENDED_TEST, _)

#define DEFINE_DEPRECATED_STANDARD_TEST(T, N, A)                                               \
    static void deprecated_standard_##N(void) {                                                \
        T *x = shmem_calloc(1, sizeof(T));                                                     \
        shmem_##N##_fadd(x, (T)2, 0);                                                          \
        shmem_##N##_finc(x, 0);                                                                \
        shmem_##N##_add(x, (T)3, 0);                                                           \
        shmem_##N##_inc(x, 0);                                                                 \
        shmem_barrier_all();                                                                   \
        CHECK(shmem_##N##_cswap(x, (T)(7 * n), (T)(7 * n), 0) == (T)(7 * n));                  \
        shmem_barrier_all();                                                                   \
        shmem_free(x);                                                                         \
    }
HMSHMEM_DEPRECATED_AMO_STANDARD_TYPES(DEFINE_DEPRECATED_STANDARD_TEST, _)

int main(void) {
    start();
#define RUN_EXTENDED(T, N, A) extended_##N();
    HMSHMEM_AMO_EXTENDED_TYPES(RUN_EXTENDED, _)
#define RUN_STANDARD(T, N, A) standard_##N();
    HMSHMEM_AMO_STANDARD_TYPES(RUN_STANDARD, _)
#define RUN_BITWISE(T, N, A) bitwise_##N();
    HMSHMEM_AMO_BITWISE_TYPES(RUN_BITWISE, _)
#define RUN_GENERIC(T, N, A) generic_##N();
    HMSHMEM_AMO_STANDARD_GENERIC_TYPES(RUN_GENERIC, _)
#define RUN_DEPRECATED_EXTENDED(T, N, A) deprecated_extended_##N();
    HMSHMEM_DEPRECATED_AMO_EXTENDED_TYPES(RUN_DEPRECATED_EXTENDED, _)
#define RUN_DEPRECATED_STANDARD(T, N, A) deprecated_standard_##N();
    HMSHMEM_DEPRECATED_AMO_STANDARD_TYPES(RUN_DEPRECATED_STANDARD, _)
    PASS("atomics_types");
    shmem_finalize();
    return 0;
}
