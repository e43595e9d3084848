/* RMA for every standard type (the X-macro lists of hmshmem_types.h): put, get and their _nbi
 * forms, iput/iget, p/g, put_signal(_nbi), from private and from symmetric sources; the C11
 * generic forms for the generic types; the sized and mem forms. Each PE writes to the next. */
#include <shmem.h>
#include <string.h>

#include "check.h"

#define LEN 16
#define VALUE(T, pe, i) ((T)((pe) * LEN + (i) + 1))

static uint64_t *sig;

#define DEFINE_RMA_TEST(T, N, A)                                                               \
    static void test_##N(void) {                                                               \
        T *dst = shmem_calloc(LEN, sizeof(T));                                                 \
        T *sym = shmem_malloc(LEN * sizeof(T));                                                \
        T src[LEN], got[LEN];                                                                  \
        for (int i = 0; i < LEN; i++) src[i] = sym[i] = VALUE(T, me, i);                       \
        shmem_barrier_all();                                                                   \
        shmem_##N##_put(dst, src, LEN, next);                                                  \
        shmem_barrier_all();                                                                   \
        for (int i = 0; i < LEN; i++) CHECK(dst[i] == VALUE(T, prev, i));                     \
        shmem_##N##_get(got, sym, LEN, next);                                                  \
        for (int i = 0; i < LEN; i++) CHECK(got[i] == VALUE(T, next, i));                     \
        shmem_barrier_all();                                                                   \
        memset(dst, 0, LEN * sizeof(T));                                                       \
        shmem_barrier_all();                                                                   \
        shmem_##N##_put_nbi(dst, sym, LEN, next); /* a symmetric source */                    \
        shmem_quiet();                                                                         \
        shmem_barrier_all();                                                                   \
        for (int i = 0; i < LEN; i++) CHECK(dst[i] == VALUE(T, prev, i));                     \
        memset(got, 0, sizeof got);                                                            \
        shmem_##N##_get_nbi(got, sym, LEN, prev);                                              \
        shmem_quiet();                                                                         \
        for (int i = 0; i < LEN; i++) CHECK(got[i] == VALUE(T, prev, i));                     \
        shmem_barrier_all();                                                                   \
        memset(dst, 0, LEN * sizeof(T));                                                       \
        shmem_barrier_all();                                                                   \
        shmem_##N##_iput(dst, src, 3, 2, 5, next); /* src[0,2,..,8] -> dst[0,3,..,12] */     \
        shmem_barrier_all();                                                                   \
        for (int i = 0; i < 5; i++) CHECK(dst[3 * i] == VALUE(T, prev, 2 * i));               \
        CHECK(dst[1] == (T)0 && dst[14] == (T)0);                                              \
        memset(got, 0, sizeof got);                                                            \
        shmem_##N##_iget(got, sym, 2, 3, 5, next); /* sym[0,3,..,12] -> got[0,2,..,8] */      \
        for (int i = 0; i < 5; i++) CHECK(got[2 * i] == VALUE(T, next, 3 * i));               \
        CHECK(got[1] == (T)0);                                                                 \
        shmem_##N##_p(&dst[LEN - 1], VALUE(T, me, 7), next);                                  \
        shmem_barrier_all();                                                                   \
        CHECK(dst[LEN - 1] == VALUE(T, prev, 7));                                              \
        CHECK(shmem_##N##_g(&sym[5], prev) == VALUE(T, prev, 5));                              \
        shmem_barrier_all();                                                                   \
        memset(dst, 0, LEN * sizeof(T));                                                       \
        *sig = 0;                                                                              \
        shmem_barrier_all();                                                                   \
        shmem_##N##_put_signal(dst, src, 4, sig, 1, SHMEM_SIGNAL_ADD, next);                  \
        shmem_##N##_put_signal_nbi(&dst[4], sym, 4, sig, 1, SHMEM_SIGNAL_ADD, next);          \
        CHECK(shmem_signal_wait_until(sig, SHMEM_CMP_EQ, 2) == 2);                             \
        for (int i = 0; i < 4; i++)                                                            \
            CHECK(dst[i] == VALUE(T, prev, i) && dst[4 + i] == VALUE(T, prev, i));            \
        shmem_barrier_all();                                                                   \
        shmem_free(sym);                                                                       \
        shmem_free(dst);                                                                       \
    }
HMSHMEM_RMA_TYPES(DEFINE_RMA_TEST, _)

/* The C11 generic names select the typed call from the pointee type. */
#define DEFINE_GENERIC_TEST(T, N, A)                                                           \
    static void generic_##N(void) {                                                            \
        T *dst = shmem_calloc(LEN, sizeof(T));                                                 \
        T src[LEN], got[LEN];                                                                  \
        for (int i = 0; i < LEN; i++) src[i] = VALUE(T, me, i);                                \
        shmem_put(dst, src, LEN, next);                                                        \
        shmem_barrier_all();                                                                   \
        shmem_get(got, dst, LEN, me);                                                          \
        for (int i = 0; i < LEN; i++) CHECK(got[i] == VALUE(T, prev, i));                     \
        shmem_barrier_all();                                                                   \
        shmem_p(&dst[0], VALUE(T, me, 3), next);                                               \
        shmem_barrier_all();                                                                   \
        CHECK(shmem_g(&dst[0], me) == VALUE(T, prev, 3));                                      \
        shmem_barrier_all();                                                                   \
        shmem_free(dst);                                                                       \
    }
HMSHMEM_RMA_GENERIC_TYPES(DEFINE_GENERIC_TEST, _)

#define DEFINE_SIZED_TEST(BITS, A)                                                              \
    static void sized_##BITS(void) {                                                           \
        enum { BYTES = BITS / 8 };                                                             \
        unsigned char *dst = shmem_calloc(LEN, BYTES);                                         \
        unsigned char src[LEN * BYTES], got[LEN * BYTES], theirs[LEN * BYTES];                 \
        for (int i = 0; i < LEN * BYTES; i++) {                                                \
            src[i] = (unsigned char)(me * 31 + i);                                             \
            theirs[i] = (unsigned char)(prev * 31 + i);                                        \
        }                                                                                      \
        shmem_put##BITS(dst, src, LEN, next);                                                  \
        shmem_barrier_all();                                                                   \
        for (int i = 0; i < LEN * BYTES; i++) CHECK(dst[i] == (unsigned char)(prev * 31 + i)); \
        shmem_get##BITS(got, dst, LEN, next);                                                  \
        for (int i = 0; i < LEN * BYTES; i++) CHECK(got[i] == (unsigned char)(me * 31 + i));   \
        shmem_barrier_all();                                                                   \
        memset(dst, 0, LEN * BYTES);                                                           \
        shmem_barrier_all();                                                                   \
        shmem_iput##BITS(dst, src, 2, 1, 3, next);                                             \
        shmem_put##BITS##_nbi(&dst[8 * BYTES], src, 1, next);                                 \
        shmem_quiet();                                                                         \
        shmem_barrier_all();                                                                   \
        CHECK(memcmp(&dst[2 * BYTES], &theirs[BYTES], BYTES) == 0);                            \
        CHECK(memcmp(&dst[8 * BYTES], theirs, BYTES) == 0);                                    \
        memset(dst, 0, LEN * BYTES);                                                           \
        *sig = 0;                                                                              \
        shmem_barrier_all();                                                                   \
        shmem_put##BITS##_signal(dst, src, 2, sig, 5, SHMEM_SIGNAL_SET, next);                 \
        shmem_wait_until(sig, SHMEM_CMP_EQ, 5);                                                \
        CHECK(memcmp(dst, theirs, 2 * BYTES) == 0);                                            \
        shmem_barrier_all();                                                                   \
        shmem_free(dst);                                                                       \
    }
HMSHMEM_SIZES(DEFINE_SIZED_TEST, _)

int main(void) {
    start();
    sig = shmem_calloc(1, sizeof *sig);
#define RUN(T, N, A) test_##N();
    HMSHMEM_RMA_TYPES(RUN, _)
#define RUN_GENERIC(T, N, A) generic_##N();
    HMSHMEM_RMA_GENERIC_TYPES(RUN_GENERIC, _)
#define RUN_SIZED(BITS, A) sized_##BITS();
    HMSHMEM_SIZES(RUN_SIZED, _)

    char *text = shmem_calloc(64, 1);
    shmem_putmem(text, "hello from the previous PE", 27, next);
    shmem_barrier_all();
    CHECK(strcmp(text, "hello from the previous PE") == 0);
    char copy[27];
    shmem_getmem(copy, text, 27, next);
    shmem_getmem_nbi(copy, text, 27, next);
    shmem_quiet();
    CHECK(strcmp(copy, text) == 0);
    *sig = 0;
    shmem_barrier_all();
    shmem_putmem_signal(&text[32], "signal", 7, sig, 3, SHMEM_SIGNAL_SET, next);
    CHECK(shmem_signal_wait_until(sig, SHMEM_CMP_GE, 3) == 3 && shmem_signal_fetch(sig) == 3);
    CHECK(strcmp(&text[32], "signal") == 0);
    shmem_barrier_all();
    shmem_free(text);
    shmem_free(sig);
    PASS("rma_types");
    shmem_finalize();
    return 0;
}
