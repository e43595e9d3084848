/* Contexts: created, team-created and default contexts carry the shmem_ctx_* RMA and atomic
 * calls for every type (each maps to the default context); ctx_fence, ctx_quiet, get_team,
 * destroy. */
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

int main(void) {
    start();
    CHECK(shmem_ctx_create(SHMEM_CTX_PRIVATE, &ctx) == 0 && ctx != SHMEM_CTX_INVALID);
    shmem_team_t team = SHMEM_TEAM_INVALID;
    CHECK(shmem_ctx_get_team(ctx, &team) == 0 && team == SHMEM_TEAM_WORLD);
#define RUN_RMA(T, N, A) rma_##N();
    HMSHMEM_RMA_TYPES(RUN_RMA, _)
#define RUN_AMO(T, N, A) amo_##N();
    HMSHMEM_AMO_STANDARD_TYPES(RUN_AMO, _)
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
