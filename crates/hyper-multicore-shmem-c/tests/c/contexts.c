/* Contexts: created, team-created and default contexts carry the shmem_ctx_* RMA and atomic
 * calls for every type (each maps to the default context), also through the C11 type-generic
 * names taking the context first (shmem_put(ctx, ...), shmem_atomic_fetch_add(ctx, ...)) next
 * to their plain forms; ctx_fence, ctx_quiet, get_team, destroy. */
#include <shmem.h>

#include "check.h"

#define LEN 4

static shmem_ctx_t ctx;

#define DEFINE_CTX_RMA_TEST(T, N, A)                                                           \
    static void rma_##N(void) {                                                                \
        static T dst[LEN];                                                                     \
        T src[LEN], got[LEN];                                                                  \
        for (int i = 0; i < LEN; i++) src[i] = (T)(me + i + 1);                                \
        shmem_ctx_##N##_put_nbi(ctx, dst, src, LEN, next);                                     \
        shmem_ctx_quiet(ctx);                                                                  \
        shmem_barrier_all();                                                                   \
        shmem_ctx_##N##_get(SHMEM_CTX_DEFAULT, got, dst, LEN, me);                             \
        for (int i = 0; i < LEN; i++) CHECK(got[i] == (T)(prev + i + 1));                     \
        shmem_barrier_all();                                                                   \
    }
HMSHMEM_RMA_TYPES(DEFINE_CTX_RMA_TEST, _)

#define DEFINE_CTX_AMO_TEST(T, N, A)                                                           \
    static void amo_##N(void) {                                                                \
        static T counter;                                                                      \
        T fetched;                                                                             \
        counter = (T)0;                                                                        \
        shmem_barrier_all();                                                                   \
        shmem_ctx_##N##_atomic_add(ctx, &counter, (T)2, 0);                                    \
        shmem_ctx_##N##_atomic_fetch_inc_nbi(ctx, &fetched, &counter, 0);                      \
        shmem_ctx_quiet(ctx);                                                                  \
        shmem_barrier_all();                                                                   \
        CHECK(shmem_ctx_##N##_atomic_fetch(ctx, &counter, 0) == (T)(3 * n));                   \
        shmem_barrier_all();                                                                   \
    }
HMSHMEM_AMO_STANDARD_TYPES(DEFINE_CTX_AMO_TEST, _)

/* The type-generic forms with a context first, every generic RMA type. */
#define DEFINE_GENERIC_CTX_RMA_TEST(T, N, A)                                                   \
    static void generic_rma_##N(void) {                                                        \
        static T dst[2 * LEN];                                                                 \
        static uint64_t sig;                                                                   \
        T src[2 * LEN], got[2 * LEN];                                                          \
        for (int i = 0; i < 2 * LEN; i++) src[i] = (T)(me + i + 1);                            \
        sig = 0;                                                                               \
        shmem_barrier_all();                                                                   \
        shmem_put(ctx, dst, src, LEN, next);                                                   \
        shmem_put_nbi(ctx, dst + LEN, src + LEN, LEN, next);                                   \
        shmem_ctx_quiet(ctx);                                                                  \
        shmem_barrier_all();                                                                   \
        shmem_get(ctx, got, dst, LEN, me);                                                     \
        shmem_get_nbi(SHMEM_CTX_DEFAULT, got + LEN, dst + LEN, LEN, me);                       \
        shmem_ctx_quiet(SHMEM_CTX_DEFAULT);                                                    \
        for (int i = 0; i < 2 * LEN; i++) CHECK(got[i] == (T)(prev + i + 1));                 \
        CHECK(shmem_g(ctx, &dst[1], me) == (T)(prev + 2) && shmem_g(&dst[1], me) == (T)(prev + 2)); \
        shmem_barrier_all();                                                                   \
        shmem_p(ctx, &dst[0], (T)(me + 40), next);                                             \
        shmem_iput(ctx, dst + 1, src, 2, 1, 2, next); /* dst[1], dst[3] = src[0], src[1] */    \
        shmem_ctx_quiet(ctx);                                                                  \
        shmem_barrier_all();                                                                   \
        CHECK(dst[0] == (T)(prev + 40) && dst[1] == (T)(prev + 1) && dst[3] == (T)(prev + 2)); \
        shmem_iget(ctx, got, dst, 2, 3, 2, me); /* got[0], got[2] = dst[0], dst[3] */          \
        CHECK(got[0] == (T)(prev + 40) && got[2] == (T)(prev + 2));                            \
        shmem_barrier_all();                                                                   \
        shmem_put_signal(ctx, dst, src, 1, &sig, 1, SHMEM_SIGNAL_ADD, next);                   \
        shmem_put_signal_nbi(ctx, dst + 1, src + 1, 1, &sig, 1, SHMEM_SIGNAL_ADD, next);       \
        shmem_ctx_quiet(ctx);                                                                  \
        CHECK(shmem_signal_wait_until(&sig, SHMEM_CMP_EQ, 2) == 2);                            \
        CHECK(dst[0] == (T)(prev + 1) && dst[1] == (T)(prev + 2));                             \
        shmem_barrier_all();                                                                   \
    }
HMSHMEM_RMA_GENERIC_TYPES(DEFINE_GENERIC_CTX_RMA_TEST, _)

#define DEFINE_GENERIC_CTX_EXTENDED_TEST(T, N, A)                                              \
    static void generic_extended_##N(void) {                                                   \
        static T word;                                                                         \
        T fetched = (T)0;                                                                      \
        shmem_barrier_all();                                                                   \
        shmem_atomic_set(ctx, &word, (T)(me + 1), next);                                       \
        shmem_ctx_quiet(ctx);                                                                  \
        shmem_barrier_all();                                                                   \
        CHECK(shmem_atomic_fetch(ctx, &word, me) == (T)(prev + 1));                            \
        CHECK(shmem_atomic_swap(ctx, &word, (T)(me + 9), me) == (T)(prev + 1));                \
        shmem_atomic_fetch_nbi(ctx, &fetched, &word, me);                                      \
        shmem_ctx_quiet(ctx);                                                                  \
        CHECK(fetched == (T)(me + 9));                                                         \
        shmem_atomic_swap_nbi(ctx, &fetched, &word, (T)3, me);                                 \
        shmem_ctx_quiet(ctx);                                                                  \
        CHECK(fetched == (T)(me + 9) && shmem_atomic_fetch(&word, me) == (T)3);                \
        shmem_barrier_all();                                                                   \
    }
HMSHMEM_AMO_EXTENDED_GENERIC_TYPES(DEFINE_GENERIC_CTX_EXTENDED_TEST, _)

#define DEFINE_GENERIC_CTX_STANDARD_TEST(T, N, A)                                              \
    static void generic_standard_##N(void) {                                                   \
        static T counter;                                                                      \
        T fetched = (T)0;                                                                      \
        counter = (T)0;                                                                        \
        shmem_barrier_all();                                                                   \
        shmem_atomic_add(ctx, &counter, (T)2, 0);                                              \
        shmem_atomic_inc(ctx, &counter, 0);                                                    \
        (void)shmem_atomic_fetch_add(ctx, &counter, (T)1, 0);                                  \
        (void)shmem_atomic_fetch_inc(ctx, &counter, 0);                                        \
        shmem_atomic_fetch_add_nbi(ctx, &fetched, &counter, (T)1, 0);                          \
        shmem_atomic_fetch_inc_nbi(ctx, &fetched, &counter, 0);                                \
        shmem_ctx_quiet(ctx);                                                                  \
        shmem_barrier_all();                                                                   \
        CHECK(shmem_atomic_fetch(ctx, &counter, 0) == (T)(7 * n));                             \
        shmem_barrier_all();                                                                   \
        if (me == 0) {                                                                         \
            CHECK(shmem_atomic_compare_swap(ctx, &counter, (T)(7 * n), (T)5, 0) == (T)(7 * n)); \
            shmem_atomic_compare_swap_nbi(ctx, &fetched, &counter, (T)5, (T)6, 0);             \
            shmem_ctx_quiet(ctx);                                                              \
            CHECK(fetched == (T)5 && counter == (T)6);                                         \
        }                                                                                      \
        shmem_barrier_all();                                                                   \
    }
HMSHMEM_AMO_STANDARD_GENERIC_TYPES(DEFINE_GENERIC_CTX_STANDARD_TEST, _)

#define DEFINE_GENERIC_CTX_BITWISE_TEST(T, N, A)                                               \
    static void generic_bitwise_##N(void) {                                                    \
        static T bits;                                                                         \
        T fetched = (T)0;                                                                      \
        bits = (T)0;                                                                           \
        shmem_barrier_all();                                                                   \
        shmem_atomic_or(ctx, &bits, (T)((T)1 << me), 0);                                       \
        shmem_ctx_quiet(ctx);                                                                  \
        shmem_barrier_all();                                                                   \
        CHECK(shmem_atomic_fetch(ctx, &bits, 0) == (T)(((T)1 << n) - 1));                      \
        shmem_barrier_all();                                                                   \
        if (me == 0) {                                                                         \
            CHECK(shmem_atomic_fetch_and(ctx, &bits, (T)1, 0) == (T)(((T)1 << n) - 1));        \
            CHECK(shmem_atomic_fetch_xor(ctx, &bits, (T)3, 0) == (T)1);                        \
            CHECK(shmem_atomic_fetch_or(ctx, &bits, (T)4, 0) == (T)2);                         \
            shmem_atomic_and(ctx, &bits, (T)6, 0);                                             \
            shmem_atomic_xor(ctx, &bits, (T)1, 0);                                             \
            shmem_atomic_fetch_or_nbi(ctx, &fetched, &bits, (T)8, 0);                          \
            shmem_ctx_quiet(ctx);                                                              \
            CHECK(fetched == (T)7);                                                            \
            shmem_atomic_fetch_and_nbi(ctx, &fetched, &bits, (T)12, 0);                        \
            shmem_atomic_fetch_xor_nbi(ctx, &fetched, &bits, (T)1, 0);                         \
            shmem_ctx_quiet(ctx);                                                              \
            CHECK(fetched == (T)12 && bits == (T)13);                                          \
        }                                                                                      \
        shmem_barrier_all();                                                                   \
    }
HMSHMEM_AMO_BITWISE_GENERIC_TYPES(DEFINE_GENERIC_CTX_BITWISE_TEST, _)

int main(void) {
    start();
    CHECK(shmem_ctx_create(SHMEM_CTX_PRIVATE, &ctx) == 0 && ctx != SHMEM_CTX_INVALID);
    shmem_team_t team = SHMEM_TEAM_INVALID;
    CHECK(shmem_ctx_get_team(ctx, &team) == 0 && team == SHMEM_TEAM_WORLD);
#define RUN_RMA(T, N, A) rma_##N();
    HMSHMEM_RMA_TYPES(RUN_RMA, _)
#define RUN_AMO(T, N, A) amo_##N();
    HMSHMEM_AMO_STANDARD_TYPES(RUN_AMO, _)
#define RUN_GENERIC(T, N, A) generic_##A##_##N();
    HMSHMEM_RMA_GENERIC_TYPES(RUN_GENERIC, rma)
    HMSHMEM_AMO_EXTENDED_GENERIC_TYPES(RUN_GENERIC, extended)
    HMSHMEM_AMO_STANDARD_GENERIC_TYPES(RUN_GENERIC, standard)
    HMSHMEM_AMO_BITWISE_GENERIC_TYPES(RUN_GENERIC, bitwise)
    shmem_ctx_t team_ctx;
    CHECK(shmem_team_create_ctx(SHMEM_TEAM_WORLD, 0, &team_ctx) == 0 && team_ctx != ctx);
    static long word;
    shmem_ctx_long_p(team_ctx, &word, me, next);
    shmem_ctx_fence(team_ctx);
    shmem_ctx_putmem(team_ctx, &word, &me, 0, next);
    shmem_ctx_quiet(team_ctx);
    shmem_barrier_all();
    CHECK(word == prev && shmem_ctx_long_g(team_ctx, &word, next) == me);
    shmem_ctx_destroy(team_ctx);
    shmem_ctx_destroy(ctx);
    shmem_barrier_all();
    PASS("contexts");
    shmem_finalize();
    return 0;
}
