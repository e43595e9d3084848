/* Point-to-point synchronisation for every standard sync type (the X-macro lists of
 * hmshmem_types.h): wait_until with every comparison, the legacy wait, test, the _all/_any/_some
 * forms with and without a status mask, their _vector forms, and the C11 generic forms. Peers
 * wake the waiter with p (16-bit types included: neighbouring flags share a 32-bit word, and a
 * lone one is a 2-byte allocation). */
#include <shmem.h>

#include "check.h"


#define DEFINE_SYNC_TEST(T, N, A)                                                              \
    static void sync_##N(void) {                                                               \
        T *one = shmem_calloc(1, sizeof(T));                                                   \
        T *flags = shmem_calloc((size_t)n, sizeof(T));                                         \
        int *status = calloc((size_t)n, sizeof(int));                                          \
        size_t *indices = calloc((size_t)n, sizeof(size_t));                                   \
        T *targets = calloc((size_t)n, sizeof(T));                                             \
        CHECK(shmem_##N##_test(one, SHMEM_CMP_EQ, (T)7) == 0);                                 \
        CHECK(shmem_##N##_test(one, SHMEM_CMP_LE, (T)0) == 1);                                 \
        CHECK(shmem_##N##_test_any(flags, (size_t)n, NULL, SHMEM_CMP_NE, (T)0) == SIZE_MAX);    \
        shmem_barrier_all();                                                                   \
        shmem_##N##_p(one, (T)(me + 5), next);                                                 \
        shmem_##N##_wait_until(one, SHMEM_CMP_EQ, (T)(prev + 5));                              \
        shmem_##N##_wait_until(one, SHMEM_CMP_GE, (T)(prev + 5));                              \
        shmem_##N##_wait_until(one, SHMEM_CMP_GT, (T)(prev + 4));                              \
        shmem_##N##_wait_until(one, SHMEM_CMP_LT, (T)(prev + 6));                              \
        shmem_##N##_wait_until(one, SHMEM_CMP_LE, (T)(prev + 5));                              \
        shmem_##N##_wait_until(one, SHMEM_CMP_NE, (T)0);                                       \
        shmem_##N##_wait(one, (T)0);                                                           \
        CHECK(shmem_##N##_test(one, SHMEM_CMP_EQ, (T)(prev + 5)) == 1);                        \
        shmem_barrier_all();                                                                   \
        /* Everyone raises its flag on every PE; the flags are awaited with all, any, some. */ \
        for (int pe = 0; pe < n; pe++) shmem_##N##_p(&flags[me], (T)(me + 1), pe);              \
        shmem_##N##_wait_until_all(flags, (size_t)n, NULL, SHMEM_CMP_NE, (T)0);                \
        CHECK(shmem_##N##_test_all(flags, (size_t)n, NULL, SHMEM_CMP_GT, (T)0) == 1);          \
        size_t any = shmem_##N##_wait_until_any(flags, (size_t)n, NULL, SHMEM_CMP_GT, (T)0);   \
        CHECK(any < (size_t)n && flags[any] == (T)(any + 1));                                  \
        CHECK(shmem_##N##_wait_until_some(flags, (size_t)n, indices, NULL, SHMEM_CMP_NE, (T)0) \
              == (size_t)n);                                                                   \
        for (int i = 0; i < n; i++) CHECK(indices[i] == (size_t)i);                            \
        /* A mask: only the last PE's flag takes part. */                                      \
        for (int i = 0; i < n; i++) status[i] = i != n - 1;                                    \
        CHECK(shmem_##N##_wait_until_any(flags, (size_t)n, status, SHMEM_CMP_EQ, (T)n)         \
              == (size_t)(n - 1));                                                             \
        CHECK(shmem_##N##_test_some(flags, (size_t)n, indices, status, SHMEM_CMP_NE, (T)0)     \
              == 1 && indices[0] == (size_t)(n - 1));                                          \
        for (int i = 0; i < n; i++) status[i] = 1;                                             \
        CHECK(shmem_##N##_test_any(flags, (size_t)n, status, SHMEM_CMP_EQ, (T)0) == SIZE_MAX); \
        CHECK(shmem_##N##_test_all(flags, (size_t)n, status, SHMEM_CMP_EQ, (T)0) == 1);        \
        /* Vectors: one comparison value per word. */                                          \
        for (int i = 0; i < n; i++) targets[i] = (T)(i + 1);                                   \
        shmem_##N##_wait_until_all_vector(flags, (size_t)n, NULL, SHMEM_CMP_EQ, targets);      \
        CHECK(shmem_##N##_wait_until_any_vector(flags, (size_t)n, NULL, SHMEM_CMP_EQ, targets) \
              == 0);                                                                           \
        CHECK(shmem_##N##_wait_until_some_vector(flags, (size_t)n, indices, NULL,              \
                                                 SHMEM_CMP_LE, targets) == (size_t)n);         \
        CHECK(shmem_##N##_test_all_vector(flags, (size_t)n, NULL, SHMEM_CMP_EQ, targets) == 1); \
        CHECK(shmem_##N##_test_any_vector(flags, (size_t)n, NULL, SHMEM_CMP_GT, targets)       \
              == SIZE_MAX);                                                                    \
        CHECK(shmem_##N##_test_some_vector(flags, (size_t)n, indices, NULL, SHMEM_CMP_GE,      \
                                           targets) == (size_t)n);                             \
        shmem_barrier_all();                                                                   \
        free(targets);                                                                         \
        free(indices);                                                                         \
        free(status);                                                                          \
        shmem_free(flags);                                                                     \
        shmem_free(one);                                                                       \
    }
HMSHMEM_SYNC_TYPES(DEFINE_SYNC_TEST, _)

#define DEFINE_GENERIC_TEST(T, N, A)                                                           \
    static void generic_##N(void) {                                                            \
        T *flag = shmem_calloc(1, sizeof(T));                                                  \
        shmem_p(flag, (T)3, next);                                                             \
        shmem_wait_until(flag, SHMEM_CMP_EQ, (T)3);                                            \
        CHECK(shmem_test(flag, SHMEM_CMP_GE, (T)3) == 1);                                      \
        CHECK(shmem_test_all(flag, 1, NULL, SHMEM_CMP_EQ, (T)3) == 1);                         \
        shmem_barrier_all();                                                                   \
        shmem_free(flag);                                                                      \
    }
HMSHMEM_SYNC_GENERIC_TYPES(DEFINE_GENERIC_TEST, _)

int main(void) {
    start();
#define RUN_SYNC(T, N, A) sync_##N();
    HMSHMEM_SYNC_TYPES(RUN_SYNC, _)
#define RUN_GENERIC(T, N, A) generic_##N();
    HMSHMEM_SYNC_GENERIC_TYPES(RUN_GENERIC, _)
    PASS("sync_types");
    shmem_finalize();
    return 0;
}
