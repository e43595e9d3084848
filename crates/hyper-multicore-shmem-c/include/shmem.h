/*
 * shmem.h -- the OpenSHMEM 1.5 C interface of libhmshmem (hyper_multicore).
 *
 * Written for this project from the names, types and constants of the OpenSHMEM 1.5
 * specification. Build with `hmcc`, launch with `hmrun -n N -- ./prog`. What is covered and
 * how this library differs from the standard: docs/c-api.md.
 *
 * The typed calls are declared from the type lists of hmshmem_types.h, which build.rs generates
 * from the same table as the library's entry points.
 *
 * Errors: the standard's calls have no error returns. When one fails (a bad argument, an address
 * that is not symmetric, a lost peer, a timeout) this PE prints one line naming the PE, the call
 * and the cause, and exits with status 1; hmrun then ends the job.
 */
#ifndef HMSHMEM_SHMEM_H
#define HMSHMEM_SHMEM_H

#include <stddef.h>
#include <stdint.h>

#include "hmshmem_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Library constants ---------------------------------------------------------------- */

#define SHMEM_MAJOR_VERSION 1
#define SHMEM_MINOR_VERSION 5
#define _SHMEM_MAJOR_VERSION SHMEM_MAJOR_VERSION
#define _SHMEM_MINOR_VERSION SHMEM_MINOR_VERSION
#define SHMEM_MAX_NAME_LEN 256
#define _SHMEM_MAX_NAME_LEN SHMEM_MAX_NAME_LEN
#define SHMEM_VENDOR_STRING "hyper_multicore"
#define _SHMEM_VENDOR_STRING SHMEM_VENDOR_STRING

/* Thread levels (every level is provided). */
#define SHMEM_THREAD_SINGLE 0
#define SHMEM_THREAD_FUNNELED 1
#define SHMEM_THREAD_SERIALIZED 2
#define SHMEM_THREAD_MULTIPLE 3

/* Comparisons of the point-to-point synchronisation calls. */
#define SHMEM_CMP_EQ 0
#define SHMEM_CMP_NE 1
#define SHMEM_CMP_GT 2
#define SHMEM_CMP_GE 3
#define SHMEM_CMP_LT 4
#define SHMEM_CMP_LE 5
#define _SHMEM_CMP_EQ SHMEM_CMP_EQ
#define _SHMEM_CMP_NE SHMEM_CMP_NE
#define _SHMEM_CMP_GT SHMEM_CMP_GT
#define _SHMEM_CMP_GE SHMEM_CMP_GE
#define _SHMEM_CMP_LT SHMEM_CMP_LT
#define _SHMEM_CMP_LE SHMEM_CMP_LE

/* Signal operations of the put-with-signal calls. */
#define SHMEM_SIGNAL_SET 0
#define SHMEM_SIGNAL_ADD 1

/* Work-array sizes of the active-set collectives (pSync arrays of long, pWrk arrays). */
#define SHMEM_SYNC_VALUE (-1L)
#define _SHMEM_SYNC_VALUE SHMEM_SYNC_VALUE
#define SHMEM_SYNC_SIZE 64
#define SHMEM_BARRIER_SYNC_SIZE SHMEM_SYNC_SIZE
#define SHMEM_BCAST_SYNC_SIZE SHMEM_SYNC_SIZE
#define SHMEM_COLLECT_SYNC_SIZE SHMEM_SYNC_SIZE
#define SHMEM_REDUCE_SYNC_SIZE SHMEM_SYNC_SIZE
#define SHMEM_ALLTOALL_SYNC_SIZE SHMEM_SYNC_SIZE
#define SHMEM_ALLTOALLS_SYNC_SIZE SHMEM_SYNC_SIZE
#define SHMEM_REDUCE_MIN_WRKDATA_SIZE 1
#define _SHMEM_BARRIER_SYNC_SIZE SHMEM_BARRIER_SYNC_SIZE
#define _SHMEM_BCAST_SYNC_SIZE SHMEM_BCAST_SYNC_SIZE
#define _SHMEM_COLLECT_SYNC_SIZE SHMEM_COLLECT_SYNC_SIZE
#define _SHMEM_REDUCE_SYNC_SIZE SHMEM_REDUCE_SYNC_SIZE
#define _SHMEM_REDUCE_MIN_WRKDATA_SIZE SHMEM_REDUCE_MIN_WRKDATA_SIZE

/* Hints of shmem_malloc_with_hints (accepted, and ignored). */
#define SHMEM_MALLOC_ATOMICS_REMOTE 1L
#define SHMEM_MALLOC_SIGNAL_REMOTE 2L

/* Teams: SHMEM_TEAM_WORLD, SHMEM_TEAM_SHARED (the PEs of this host; usable while every PE
 * shares it) and the teams split from them. */
typedef struct hmshmem_team *shmem_team_t;
#define SHMEM_TEAM_WORLD ((shmem_team_t)1)
#define SHMEM_TEAM_SHARED ((shmem_team_t)2)
#define SHMEM_TEAM_INVALID ((shmem_team_t)0)
#define SHMEM_TEAM_NUM_CONTEXTS 1L

typedef struct {
    int num_contexts;
} shmem_team_config_t;

/* ---- Set-up, queries, information ------------------------------------------------------ */

void shmem_init(void);
int shmem_init_thread(int requested, int *provided);
void shmem_query_thread(int *provided);
void shmem_finalize(void);
void shmem_query_initialized(int *initialized);
void shmem_query_finalized(int *finalized);
void shmem_pcontrol(const int level, ...);
void shmem_global_exit(int status);
int shmem_my_pe(void);
int shmem_n_pes(void);
int shmem_pe_accessible(int pe);
int shmem_addr_accessible(const void *addr, int pe);
void *shmem_ptr(const void *dest, int pe);
void shmem_info_get_version(int *major, int *minor);
void shmem_info_get_name(char *name);

/* Legacy forms. */
void start_pes(int npes);
int _my_pe(void);
int _num_pes(void);

/* ---- Symmetric heap -------------------------------------------------------------------- */

void *shmem_malloc(size_t size);
void *shmem_malloc_with_hints(size_t size, long hints);
void *shmem_calloc(size_t count, size_t size);
void *shmem_align(size_t alignment, size_t size);
void *shmem_realloc(void *ptr, size_t size);
void shmem_free(void *ptr);
void *shmalloc(size_t size);
void *shmemalign(size_t alignment, size_t size);
void *shrealloc(void *ptr, size_t size);
void shfree(void *ptr);

/* ---- Contexts ------------------------------------------------------------------------- */

/* Every context is the default one (docs/c-api.md); the options are accepted and ignored. */
typedef struct hmshmem_ctx *shmem_ctx_t;
#define SHMEM_CTX_DEFAULT ((shmem_ctx_t)1)
#define SHMEM_CTX_INVALID ((shmem_ctx_t)0)
#define SHMEM_CTX_SERIALIZED 1L
#define SHMEM_CTX_PRIVATE 2L
#define SHMEM_CTX_NOSTORE 4L

int shmem_ctx_create(long options, shmem_ctx_t *ctx);
int shmem_team_create_ctx(shmem_team_t team, long options, shmem_ctx_t *ctx);
void shmem_ctx_destroy(shmem_ctx_t ctx);
int shmem_ctx_get_team(shmem_ctx_t ctx, shmem_team_t *team);
void shmem_ctx_fence(shmem_ctx_t ctx);
void shmem_ctx_quiet(shmem_ctx_t ctx);

/* The RMA and atomic calls come in two forms, declared once: A = plain (shmem_NAME(...)) and
 * A = ctx (shmem_ctx_NAME(shmem_ctx_t ctx, ...)). */
#define HMSHMEM_CAT(a, b) HMSHMEM_CAT_(a, b)
#define HMSHMEM_CAT_(a, b) a##b
#define HMSHMEM_PREFIX_plain shmem_
#define HMSHMEM_PREFIX_ctx shmem_ctx_
#define HMSHMEM_CTX_plain
#define HMSHMEM_CTX_ctx shmem_ctx_t ctx,
#define HMSHMEM_FN(A, NAME) HMSHMEM_CAT(HMSHMEM_PREFIX_##A, NAME)

/* ---- Remote memory access -------------------------------------------------------------- */

#define HMSHMEM_DECLARE_RMA(T, N, A)                                                          \
    void HMSHMEM_FN(A, N##_put)(HMSHMEM_CTX_##A T *dest, const T *source, size_t nelems,      \
                                int pe);                                                       \
    void HMSHMEM_FN(A, N##_get)(HMSHMEM_CTX_##A T *dest, const T *source, size_t nelems,      \
                                int pe);                                                       \
    void HMSHMEM_FN(A, N##_put_nbi)(HMSHMEM_CTX_##A T *dest, const T *source, size_t nelems,  \
                                    int pe);                                                   \
    void HMSHMEM_FN(A, N##_get_nbi)(HMSHMEM_CTX_##A T *dest, const T *source, size_t nelems,  \
                                    int pe);                                                   \
    void HMSHMEM_FN(A, N##_iput)(HMSHMEM_CTX_##A T *dest, const T *source, ptrdiff_t dst,     \
                                 ptrdiff_t sst, size_t nelems, int pe);                        \
    void HMSHMEM_FN(A, N##_iget)(HMSHMEM_CTX_##A T *dest, const T *source, ptrdiff_t dst,     \
                                 ptrdiff_t sst, size_t nelems, int pe);                        \
    void HMSHMEM_FN(A, N##_put_signal)(HMSHMEM_CTX_##A T *dest, const T *source,              \
                                       size_t nelems, uint64_t *sig_addr, uint64_t signal,     \
                                       int sig_op, int pe);                                    \
    void HMSHMEM_FN(A, N##_put_signal_nbi)(HMSHMEM_CTX_##A T *dest, const T *source,          \
                                           size_t nelems, uint64_t *sig_addr, uint64_t signal, \
                                           int sig_op, int pe);
HMSHMEM_RMA_TYPES(HMSHMEM_DECLARE_RMA, plain)
HMSHMEM_RMA_TYPES(HMSHMEM_DECLARE_RMA, ctx)

#define HMSHMEM_DECLARE_RMA_VALUE(T, N, A)                                                    \
    void HMSHMEM_FN(A, N##_p)(HMSHMEM_CTX_##A T *dest, T value, int pe);                      \
    T HMSHMEM_FN(A, N##_g)(HMSHMEM_CTX_##A const T *source, int pe);
HMSHMEM_RMA_VALUE_TYPES(HMSHMEM_DECLARE_RMA_VALUE, plain)
HMSHMEM_RMA_VALUE_TYPES(HMSHMEM_DECLARE_RMA_VALUE, ctx)

#define HMSHMEM_DECLARE_SIZED(BITS, A)                                                        \
    void HMSHMEM_FN(A, put##BITS)(HMSHMEM_CTX_##A void *dest, const void *source,             \
                                  size_t nelems, int pe);                                      \
    void HMSHMEM_FN(A, get##BITS)(HMSHMEM_CTX_##A void *dest, const void *source,             \
                                  size_t nelems, int pe);                                      \
    void HMSHMEM_FN(A, put##BITS##_nbi)(HMSHMEM_CTX_##A void *dest, const void *source,       \
                                        size_t nelems, int pe);                                \
    void HMSHMEM_FN(A, get##BITS##_nbi)(HMSHMEM_CTX_##A void *dest, const void *source,       \
                                        size_t nelems, int pe);                                \
    void HMSHMEM_FN(A, iput##BITS)(HMSHMEM_CTX_##A void *dest, const void *source,            \
                                   ptrdiff_t dst, ptrdiff_t sst, size_t nelems, int pe);       \
    void HMSHMEM_FN(A, iget##BITS)(HMSHMEM_CTX_##A void *dest, const void *source,            \
                                   ptrdiff_t dst, ptrdiff_t sst, size_t nelems, int pe);       \
    void HMSHMEM_FN(A, put##BITS##_signal)(HMSHMEM_CTX_##A void *dest, const void *source,    \
                                           size_t nelems, uint64_t *sig_addr, uint64_t signal, \
                                           int sig_op, int pe);                                \
    void HMSHMEM_FN(A, put##BITS##_signal_nbi)(HMSHMEM_CTX_##A void *dest, const void *source,\
                                               size_t nelems, uint64_t *sig_addr,              \
                                               uint64_t signal, int sig_op, int pe);
HMSHMEM_SIZES(HMSHMEM_DECLARE_SIZED, plain)
HMSHMEM_SIZES(HMSHMEM_DECLARE_SIZED, ctx)

#define HMSHMEM_DECLARE_MEM(A)                                                                \
    void HMSHMEM_FN(A, putmem)(HMSHMEM_CTX_##A void *dest, const void *source, size_t nelems, \
                               int pe);                                                        \
    void HMSHMEM_FN(A, getmem)(HMSHMEM_CTX_##A void *dest, const void *source, size_t nelems, \
                               int pe);                                                        \
    void HMSHMEM_FN(A, putmem_nbi)(HMSHMEM_CTX_##A void *dest, const void *source,            \
                                   size_t nelems, int pe);                                     \
    void HMSHMEM_FN(A, getmem_nbi)(HMSHMEM_CTX_##A void *dest, const void *source,            \
                                   size_t nelems, int pe);                                     \
    void HMSHMEM_FN(A, putmem_signal)(HMSHMEM_CTX_##A void *dest, const void *source,         \
                                      size_t nelems, uint64_t *sig_addr, uint64_t signal,      \
                                      int sig_op, int pe);                                     \
    void HMSHMEM_FN(A, putmem_signal_nbi)(HMSHMEM_CTX_##A void *dest, const void *source,     \
                                          size_t nelems, uint64_t *sig_addr, uint64_t signal,  \
                                          int sig_op, int pe);
HMSHMEM_DECLARE_MEM(plain)
HMSHMEM_DECLARE_MEM(ctx)
uint64_t shmem_signal_fetch(const uint64_t *sig_addr);

/* long double is not passed by value across the library boundary: p and g copy its bytes. */
static inline void shmem_longdouble_p(long double *dest, long double value, int pe) {
    shmem_putmem(dest, &value, sizeof value, pe);
}
static inline long double shmem_longdouble_g(const long double *source, int pe) {
    long double value;
    shmem_getmem(&value, source, sizeof value, pe);
    return value;
}
static inline void shmem_ctx_longdouble_p(shmem_ctx_t ctx, long double *dest, long double value,
                                          int pe) {
    shmem_ctx_putmem(ctx, dest, &value, sizeof value, pe);
}
static inline long double shmem_ctx_longdouble_g(shmem_ctx_t ctx, const long double *source,
                                                 int pe) {
    long double value;
    shmem_ctx_getmem(ctx, &value, source, sizeof value, pe);
    return value;
}

/* ---- Atomic memory operations ---------------------------------------------------------- */

#define HMSHMEM_DECLARE_AMO_EXTENDED(T, N, A)                                                 \
    T HMSHMEM_FN(A, N##_atomic_fetch)(HMSHMEM_CTX_##A const T *source, int pe);               \
    void HMSHMEM_FN(A, N##_atomic_fetch_nbi)(HMSHMEM_CTX_##A T *fetch, const T *source,       \
                                             int pe);                                          \
    void HMSHMEM_FN(A, N##_atomic_set)(HMSHMEM_CTX_##A T *dest, T value, int pe);             \
    T HMSHMEM_FN(A, N##_atomic_swap)(HMSHMEM_CTX_##A T *dest, T value, int pe);               \
    void HMSHMEM_FN(A, N##_atomic_swap_nbi)(HMSHMEM_CTX_##A T *fetch, T *dest, T value,       \
                                            int pe);
HMSHMEM_AMO_EXTENDED_TYPES(HMSHMEM_DECLARE_AMO_EXTENDED, plain)
HMSHMEM_AMO_EXTENDED_TYPES(HMSHMEM_DECLARE_AMO_EXTENDED, ctx)

#define HMSHMEM_DECLARE_AMO_STANDARD(T, N, A)                                                 \
    T HMSHMEM_FN(A, N##_atomic_compare_swap)(HMSHMEM_CTX_##A T *dest, T cond, T value,        \
                                             int pe);                                          \
    void HMSHMEM_FN(A, N##_atomic_compare_swap_nbi)(HMSHMEM_CTX_##A T *fetch, T *dest,        \
                                                    T cond, T value, int pe);                  \
    T HMSHMEM_FN(A, N##_atomic_fetch_inc)(HMSHMEM_CTX_##A T *dest, int pe);                   \
    void HMSHMEM_FN(A, N##_atomic_fetch_inc_nbi)(HMSHMEM_CTX_##A T *fetch, T *dest, int pe);  \
    void HMSHMEM_FN(A, N##_atomic_inc)(HMSHMEM_CTX_##A T *dest, int pe);                      \
    T HMSHMEM_FN(A, N##_atomic_fetch_add)(HMSHMEM_CTX_##A T *dest, T value, int pe);          \
    void HMSHMEM_FN(A, N##_atomic_fetch_add_nbi)(HMSHMEM_CTX_##A T *fetch, T *dest, T value,  \
                                                 int pe);                                      \
    void HMSHMEM_FN(A, N##_atomic_add)(HMSHMEM_CTX_##A T *dest, T value, int pe);
HMSHMEM_AMO_STANDARD_TYPES(HMSHMEM_DECLARE_AMO_STANDARD, plain)
HMSHMEM_AMO_STANDARD_TYPES(HMSHMEM_DECLARE_AMO_STANDARD, ctx)

#define HMSHMEM_DECLARE_AMO_BITWISE_OP(T, N, A, OP)                                           \
    T HMSHMEM_FN(A, N##_atomic_fetch_##OP)(HMSHMEM_CTX_##A T *dest, T value, int pe);         \
    void HMSHMEM_FN(A, N##_atomic_fetch_##OP##_nbi)(HMSHMEM_CTX_##A T *fetch, T *dest,        \
                                                    T value, int pe);                          \
    void HMSHMEM_FN(A, N##_atomic_##OP)(HMSHMEM_CTX_##A T *dest, T value, int pe);
#define HMSHMEM_DECLARE_AMO_BITWISE(T, N, A)                                                  \
    HMSHMEM_DECLARE_AMO_BITWISE_OP(T, N, A, and)                                              \
    HMSHMEM_DECLARE_AMO_BITWISE_OP(T, N, A, or)                                               \
    HMSHMEM_DECLARE_AMO_BITWISE_OP(T, N, A, xor)
HMSHMEM_AMO_BITWISE_TYPES(HMSHMEM_DECLARE_AMO_BITWISE, plain)
HMSHMEM_AMO_BITWISE_TYPES(HMSHMEM_DECLARE_AMO_BITWISE, ctx)

/* The deprecated names of the atomics (older programs and benchmarks still use them). */
#define HMSHMEM_DECLARE_DEPRECATED_AMO_EXTENDED(T, N, A)                                      \
    T shmem_##N##_fetch(const T *source, int pe);                                             \
    void shmem_##N##_set(T *dest, T value, int pe);                                           \
    T shmem_##N##_swap(T *dest, T value, int pe);
HMSHMEM_DEPRECATED_AMO_EXTENDED_TYPES(HMSHMEM_DECLARE_DEPRECATED_AMO_EXTENDED, _)
#define HMSHMEM_DECLARE_DEPRECATED_AMO_STANDARD(T, N, A)                                      \
    T shmem_##N##_cswap(T *dest, T cond, T value, int pe);                                    \
    T shmem_##N##_fadd(T *dest, T value, int pe);                                             \
    T shmem_##N##_finc(T *dest, int pe);                                                      \
    void shmem_##N##_add(T *dest, T value, int pe);                                           \
    void shmem_##N##_inc(T *dest, int pe);
HMSHMEM_DEPRECATED_AMO_STANDARD_TYPES(HMSHMEM_DECLARE_DEPRECATED_AMO_STANDARD, _)

/* ---- Point-to-point synchronisation ---------------------------------------------------- */

#define HMSHMEM_DECLARE_SYNC(T, N, A)                                                         \
    void shmem_##N##_wait_until(T *ivar, int cmp, T cmp_value);                               \
    void shmem_##N##_wait(T *ivar, T cmp_value);                                              \
    void shmem_##N##_wait_until_all(T *ivars, size_t nelems, const int *status, int cmp,      \
                                    T cmp_value);                                              \
    size_t shmem_##N##_wait_until_any(T *ivars, size_t nelems, const int *status, int cmp,    \
                                      T cmp_value);                                            \
    size_t shmem_##N##_wait_until_some(T *ivars, size_t nelems, size_t *indices,              \
                                       const int *status, int cmp, T cmp_value);               \
    void shmem_##N##_wait_until_all_vector(T *ivars, size_t nelems, const int *status,        \
                                           int cmp, const T *cmp_values);                      \
    size_t shmem_##N##_wait_until_any_vector(T *ivars, size_t nelems, const int *status,      \
                                             int cmp, const T *cmp_values);                    \
    size_t shmem_##N##_wait_until_some_vector(T *ivars, size_t nelems, size_t *indices,       \
                                              const int *status, int cmp, const T *cmp_values); \
    int shmem_##N##_test(T *ivar, int cmp, T cmp_value);                                      \
    int shmem_##N##_test_all(T *ivars, size_t nelems, const int *status, int cmp,             \
                             T cmp_value);                                                     \
    size_t shmem_##N##_test_any(T *ivars, size_t nelems, const int *status, int cmp,          \
                                T cmp_value);                                                  \
    size_t shmem_##N##_test_some(T *ivars, size_t nelems, size_t *indices, const int *status, \
                                 int cmp, T cmp_value);                                        \
    int shmem_##N##_test_all_vector(T *ivars, size_t nelems, const int *status, int cmp,      \
                                    const T *cmp_values);                                      \
    size_t shmem_##N##_test_any_vector(T *ivars, size_t nelems, const int *status, int cmp,   \
                                       const T *cmp_values);                                   \
    size_t shmem_##N##_test_some_vector(T *ivars, size_t nelems, size_t *indices,             \
                                        const int *status, int cmp, const T *cmp_values);
HMSHMEM_SYNC_TYPES(HMSHMEM_DECLARE_SYNC, _)

uint64_t shmem_signal_wait_until(uint64_t *sig_addr, int cmp, uint64_t cmp_value);

/* ---- Ordering, collectives, locks ---------------------------------------------------------- */

void shmem_fence(void);
void shmem_quiet(void);
void shmem_barrier_all(void);
void shmem_sync_all(void);
/* Deprecated active-set form; in C11, shmem_sync(team) is shmem_team_sync (below). */
void shmem_sync(int PE_start, int logPE_stride, int PE_size, long *pSync);
int shmem_team_sync(shmem_team_t team);
int shmem_team_my_pe(shmem_team_t team);
int shmem_team_n_pes(shmem_team_t team);
int shmem_team_get_config(shmem_team_t team, long config_mask, shmem_team_config_t *config);
int shmem_team_translate_pe(shmem_team_t src_team, int src_pe, shmem_team_t dest_team);
int shmem_team_split_strided(shmem_team_t parent_team, int start, int stride, int size,
                             const shmem_team_config_t *config, long config_mask,
                             shmem_team_t *new_team);
int shmem_team_split_2d(shmem_team_t parent_team, int xrange,
                        const shmem_team_config_t *xaxis_config, long xaxis_mask,
                        shmem_team_t *xaxis_team, const shmem_team_config_t *yaxis_config,
                        long yaxis_mask, shmem_team_t *yaxis_team);
void shmem_team_destroy(shmem_team_t team);
void *shmem_team_ptr(shmem_team_t team, const void *dest, int pe);

int shmem_broadcastmem(shmem_team_t team, void *dest, const void *source, size_t nelems,
                       int PE_root);
int shmem_fcollectmem(shmem_team_t team, void *dest, const void *source, size_t nelems);
int shmem_alltoallmem(shmem_team_t team, void *dest, const void *source, size_t nelems);
int shmem_collectmem(shmem_team_t team, void *dest, const void *source, size_t nelems);
int shmem_alltoallsmem(shmem_team_t team, void *dest, const void *source, ptrdiff_t dst,
                       ptrdiff_t sst, size_t nelems);

#define HMSHMEM_DECLARE_COLLECTIVES(T, N, A)                                                  \
    int shmem_##N##_broadcast(shmem_team_t team, T *dest, const T *source, size_t nelems,     \
                              int PE_root);                                                    \
    int shmem_##N##_fcollect(shmem_team_t team, T *dest, const T *source, size_t nelems);     \
    int shmem_##N##_alltoall(shmem_team_t team, T *dest, const T *source, size_t nelems);     \
    int shmem_##N##_collect(shmem_team_t team, T *dest, const T *source, size_t nelems);      \
    int shmem_##N##_alltoalls(shmem_team_t team, T *dest, const T *source, ptrdiff_t dst,     \
                              ptrdiff_t sst, size_t nelems);
HMSHMEM_RMA_TYPES(HMSHMEM_DECLARE_COLLECTIVES, _)

/* Reductions: and/or/xor, min/max and sum/prod, each over the types the standard lists for it
 * (long double is not reduced: docs/c-api.md). DECLARE(T, N, OP) declares one call; the class
 * macros apply it to their operators, for the team form here and the legacy form below. */
#define HMSHMEM_BITWISE_OPS(T, N, DECLARE) DECLARE(T, N, and) DECLARE(T, N, or) DECLARE(T, N, xor)
#define HMSHMEM_MINMAX_OPS(T, N, DECLARE) DECLARE(T, N, min) DECLARE(T, N, max)
#define HMSHMEM_ARITH_OPS(T, N, DECLARE) DECLARE(T, N, sum) DECLARE(T, N, prod)
#define HMSHMEM_DECLARE_REDUCE(T, N, OP)                                                      \
    int shmem_##N##_##OP##_reduce(shmem_team_t team, T *dest, const T *source, size_t nreduce);
HMSHMEM_REDUCE_BITWISE_TYPES(HMSHMEM_BITWISE_OPS, HMSHMEM_DECLARE_REDUCE)
HMSHMEM_REDUCE_MINMAX_TYPES(HMSHMEM_MINMAX_OPS, HMSHMEM_DECLARE_REDUCE)
HMSHMEM_REDUCE_ARITH_TYPES(HMSHMEM_ARITH_OPS, HMSHMEM_DECLARE_REDUCE)

/* Legacy active-set forms: PE_start, PE_start + 2^logPE_stride, ... (PE_size PEs), the calling
 * PE among them; pSync and pWrk are accepted and not needed. */
void shmem_barrier(int PE_start, int logPE_stride, int PE_size, long *pSync);
#define HMSHMEM_DECLARE_LEGACY_SIZED(BITS)                                                    \
    void shmem_broadcast##BITS(void *dest, const void *source, size_t nelems, int PE_root,     \
                               int PE_start, int logPE_stride, int PE_size, long *pSync);      \
    void shmem_fcollect##BITS(void *dest, const void *source, size_t nelems, int PE_start,     \
                              int logPE_stride, int PE_size, long *pSync);                     \
    void shmem_alltoall##BITS(void *dest, const void *source, size_t nelems, int PE_start,     \
                              int logPE_stride, int PE_size, long *pSync);                     \
    void shmem_collect##BITS(void *dest, const void *source, size_t nelems, int PE_start,      \
                             int logPE_stride, int PE_size, long *pSync);                      \
    void shmem_alltoalls##BITS(void *dest, const void *source, ptrdiff_t dst, ptrdiff_t sst,   \
                               size_t nelems, int PE_start, int logPE_stride, int PE_size,     \
                               long *pSync);
HMSHMEM_DECLARE_LEGACY_SIZED(32)
HMSHMEM_DECLARE_LEGACY_SIZED(64)

#define HMSHMEM_DECLARE_TO_ALL(T, N, OP)                                                      \
    void shmem_##N##_##OP##_to_all(T *dest, const T *source, int nreduce, int PE_start,       \
                                   int logPE_stride, int PE_size, T *pWrk, long *pSync);
HMSHMEM_TO_ALL_BITWISE_TYPES(HMSHMEM_BITWISE_OPS, HMSHMEM_DECLARE_TO_ALL)
HMSHMEM_TO_ALL_MINMAX_TYPES(HMSHMEM_MINMAX_OPS, HMSHMEM_DECLARE_TO_ALL)
HMSHMEM_TO_ALL_ARITH_TYPES(HMSHMEM_ARITH_OPS, HMSHMEM_DECLARE_TO_ALL)

/* Distributed locks: a symmetric long, zero before its first use. */
void shmem_set_lock(long *lock);
int shmem_test_lock(long *lock);
void shmem_clear_lock(long *lock);

#ifdef __cplusplus
}
#endif

/* ---- C11 type-generic interfaces ------------------------------------------------------- */

#if !defined(__cplusplus) && defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L

/* The C type selects shmem_TYPENAME_OP (the association lists are generated in
 * hmshmem_types.h). There is no default: a type outside the family is reported by the compiler
 * ("not compatible with any association"); the last association only closes the list and never
 * matches. */
struct hmshmem_never_selected;
#define HMSHMEM_GENERIC(FAMILY, OP, X)                                                        \
    _Generic((X), HMSHMEM_GENERIC_CASES_##FAMILY(OP) struct hmshmem_never_selected *: 0)

/* The RMA and atomic calls also take a context first (shmem_put(ctx, dest, source, nelems,
 * pe)): the number of arguments selects the form -- HMSHMEM_TYPED(FAMILY, OP, N, ...) with N
 * arguments is the plain call, with N + 1 the context form -- and the type of the first pointer
 * selects the typed call, shmem_TYPENAME_OP or shmem_ctx_TYPENAME_OP. */
#define HMSHMEM_COUNT(...) HMSHMEM_COUNT_(__VA_ARGS__, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define HMSHMEM_COUNT_(a1, a2, a3, a4, a5, a6, a7, a8, a9, count, ...) count
#define HMSHMEM_PASTE(a, b) HMSHMEM_PASTE_(a, b)
#define HMSHMEM_PASTE_(a, b) a##b
#define HMSHMEM_TYPED(FAMILY, OP, N, ...)                                                     \
    HMSHMEM_PASTE(HMSHMEM_FORM_##N##_, HMSHMEM_COUNT(__VA_ARGS__))(FAMILY, OP, __VA_ARGS__)
#define HMSHMEM_PLAIN(FAMILY, OP, first, ...)                                                 \
    HMSHMEM_GENERIC(FAMILY, OP, *(first))(first, __VA_ARGS__)
#define HMSHMEM_WITH_CTX(FAMILY, OP, ctx, first, ...)                                         \
    HMSHMEM_GENERIC(CTX_##FAMILY, OP, *(first))(ctx, first, __VA_ARGS__)
/* HMSHMEM_FORM_<plain count>_<count given>; any other count is reported by the compiler as an
 * undeclared HMSHMEM_FORM_… */
#define HMSHMEM_FORM_2_2 HMSHMEM_PLAIN
#define HMSHMEM_FORM_2_3 HMSHMEM_WITH_CTX
#define HMSHMEM_FORM_3_3 HMSHMEM_PLAIN
#define HMSHMEM_FORM_3_4 HMSHMEM_WITH_CTX
#define HMSHMEM_FORM_4_4 HMSHMEM_PLAIN
#define HMSHMEM_FORM_4_5 HMSHMEM_WITH_CTX
#define HMSHMEM_FORM_5_5 HMSHMEM_PLAIN
#define HMSHMEM_FORM_5_6 HMSHMEM_WITH_CTX
#define HMSHMEM_FORM_6_6 HMSHMEM_PLAIN
#define HMSHMEM_FORM_6_7 HMSHMEM_WITH_CTX
#define HMSHMEM_FORM_7_7 HMSHMEM_PLAIN
#define HMSHMEM_FORM_7_8 HMSHMEM_WITH_CTX

#define shmem_put(...) HMSHMEM_TYPED(RMA, put, 4, __VA_ARGS__)
#define shmem_get(...) HMSHMEM_TYPED(RMA, get, 4, __VA_ARGS__)
#define shmem_put_nbi(...) HMSHMEM_TYPED(RMA, put_nbi, 4, __VA_ARGS__)
#define shmem_get_nbi(...) HMSHMEM_TYPED(RMA, get_nbi, 4, __VA_ARGS__)
#define shmem_iput(...) HMSHMEM_TYPED(RMA, iput, 6, __VA_ARGS__)
#define shmem_iget(...) HMSHMEM_TYPED(RMA, iget, 6, __VA_ARGS__)
#define shmem_p(...) HMSHMEM_TYPED(RMA, p, 3, __VA_ARGS__)
#define shmem_g(...) HMSHMEM_TYPED(RMA, g, 2, __VA_ARGS__)
#define shmem_put_signal(...) HMSHMEM_TYPED(RMA, put_signal, 7, __VA_ARGS__)
#define shmem_put_signal_nbi(...) HMSHMEM_TYPED(RMA, put_signal_nbi, 7, __VA_ARGS__)

#define shmem_atomic_fetch(...) HMSHMEM_TYPED(AMO_EXTENDED, atomic_fetch, 2, __VA_ARGS__)
#define shmem_atomic_set(...) HMSHMEM_TYPED(AMO_EXTENDED, atomic_set, 3, __VA_ARGS__)
#define shmem_atomic_swap(...) HMSHMEM_TYPED(AMO_EXTENDED, atomic_swap, 3, __VA_ARGS__)
#define shmem_atomic_fetch_nbi(...) HMSHMEM_TYPED(AMO_EXTENDED, atomic_fetch_nbi, 3, __VA_ARGS__)
#define shmem_atomic_swap_nbi(...) HMSHMEM_TYPED(AMO_EXTENDED, atomic_swap_nbi, 4, __VA_ARGS__)
#define shmem_atomic_compare_swap(...) HMSHMEM_TYPED(AMO_STANDARD, atomic_compare_swap, 4, __VA_ARGS__)
#define shmem_atomic_fetch_inc(...) HMSHMEM_TYPED(AMO_STANDARD, atomic_fetch_inc, 2, __VA_ARGS__)
#define shmem_atomic_inc(...) HMSHMEM_TYPED(AMO_STANDARD, atomic_inc, 2, __VA_ARGS__)
#define shmem_atomic_fetch_add(...) HMSHMEM_TYPED(AMO_STANDARD, atomic_fetch_add, 3, __VA_ARGS__)
#define shmem_atomic_add(...) HMSHMEM_TYPED(AMO_STANDARD, atomic_add, 3, __VA_ARGS__)
#define shmem_atomic_compare_swap_nbi(...) HMSHMEM_TYPED(AMO_STANDARD, atomic_compare_swap_nbi, 5, __VA_ARGS__)
#define shmem_atomic_fetch_inc_nbi(...) HMSHMEM_TYPED(AMO_STANDARD, atomic_fetch_inc_nbi, 3, __VA_ARGS__)
#define shmem_atomic_fetch_add_nbi(...) HMSHMEM_TYPED(AMO_STANDARD, atomic_fetch_add_nbi, 4, __VA_ARGS__)
#define shmem_atomic_fetch_and(...) HMSHMEM_TYPED(AMO_BITWISE, atomic_fetch_and, 3, __VA_ARGS__)
#define shmem_atomic_fetch_or(...) HMSHMEM_TYPED(AMO_BITWISE, atomic_fetch_or, 3, __VA_ARGS__)
#define shmem_atomic_fetch_xor(...) HMSHMEM_TYPED(AMO_BITWISE, atomic_fetch_xor, 3, __VA_ARGS__)
#define shmem_atomic_and(...) HMSHMEM_TYPED(AMO_BITWISE, atomic_and, 3, __VA_ARGS__)
#define shmem_atomic_or(...) HMSHMEM_TYPED(AMO_BITWISE, atomic_or, 3, __VA_ARGS__)
#define shmem_atomic_xor(...) HMSHMEM_TYPED(AMO_BITWISE, atomic_xor, 3, __VA_ARGS__)
#define shmem_atomic_fetch_and_nbi(...) HMSHMEM_TYPED(AMO_BITWISE, atomic_fetch_and_nbi, 4, __VA_ARGS__)
#define shmem_atomic_fetch_or_nbi(...) HMSHMEM_TYPED(AMO_BITWISE, atomic_fetch_or_nbi, 4, __VA_ARGS__)
#define shmem_atomic_fetch_xor_nbi(...) HMSHMEM_TYPED(AMO_BITWISE, atomic_fetch_xor_nbi, 4, __VA_ARGS__)

/* The deprecated atomic names, type-generic. */
#define shmem_fetch(source, pe) HMSHMEM_GENERIC(AMO_EXTENDED, fetch, *(source))(source, pe)
#define shmem_set(dest, ...) HMSHMEM_GENERIC(AMO_EXTENDED, set, *(dest))(dest, __VA_ARGS__)
#define shmem_swap(dest, ...) HMSHMEM_GENERIC(AMO_EXTENDED, swap, *(dest))(dest, __VA_ARGS__)
#define shmem_cswap(dest, ...) HMSHMEM_GENERIC(AMO_STANDARD, cswap, *(dest))(dest, __VA_ARGS__)
#define shmem_fadd(dest, ...) HMSHMEM_GENERIC(AMO_STANDARD, fadd, *(dest))(dest, __VA_ARGS__)
#define shmem_finc(dest, pe) HMSHMEM_GENERIC(AMO_STANDARD, finc, *(dest))(dest, pe)
#define shmem_add(dest, ...) HMSHMEM_GENERIC(AMO_STANDARD, add, *(dest))(dest, __VA_ARGS__)
#define shmem_inc(dest, pe) HMSHMEM_GENERIC(AMO_STANDARD, inc, *(dest))(dest, pe)

/* shmem_sync(team) (OpenSHMEM 1.5) or the deprecated shmem_sync(PE_start, logPE_stride,
 * PE_size, pSync), by the number of arguments. */
#define HMSHMEM_SYNC_1 shmem_team_sync
#define HMSHMEM_SYNC_4 shmem_sync
#define shmem_sync(...) HMSHMEM_PASTE(HMSHMEM_SYNC_, HMSHMEM_COUNT(__VA_ARGS__))(__VA_ARGS__)

#define shmem_and_reduce(team, dest, ...) HMSHMEM_GENERIC(REDUCE_BITWISE, and_reduce, *(dest))(team, dest, __VA_ARGS__)
#define shmem_or_reduce(team, dest, ...) HMSHMEM_GENERIC(REDUCE_BITWISE, or_reduce, *(dest))(team, dest, __VA_ARGS__)
#define shmem_xor_reduce(team, dest, ...) HMSHMEM_GENERIC(REDUCE_BITWISE, xor_reduce, *(dest))(team, dest, __VA_ARGS__)
#define shmem_min_reduce(team, dest, ...) HMSHMEM_GENERIC(REDUCE_MINMAX, min_reduce, *(dest))(team, dest, __VA_ARGS__)
#define shmem_max_reduce(team, dest, ...) HMSHMEM_GENERIC(REDUCE_MINMAX, max_reduce, *(dest))(team, dest, __VA_ARGS__)
#define shmem_sum_reduce(team, dest, ...) HMSHMEM_GENERIC(REDUCE_ARITH, sum_reduce, *(dest))(team, dest, __VA_ARGS__)
#define shmem_prod_reduce(team, dest, ...) HMSHMEM_GENERIC(REDUCE_ARITH, prod_reduce, *(dest))(team, dest, __VA_ARGS__)

#define shmem_broadcast(team, dest, ...) HMSHMEM_GENERIC(RMA, broadcast, *(dest))(team, dest, __VA_ARGS__)
#define shmem_collect(team, dest, ...) HMSHMEM_GENERIC(RMA, collect, *(dest))(team, dest, __VA_ARGS__)
#define shmem_fcollect(team, dest, ...) HMSHMEM_GENERIC(RMA, fcollect, *(dest))(team, dest, __VA_ARGS__)
#define shmem_alltoall(team, dest, ...) HMSHMEM_GENERIC(RMA, alltoall, *(dest))(team, dest, __VA_ARGS__)
#define shmem_alltoalls(team, dest, ...) HMSHMEM_GENERIC(RMA, alltoalls, *(dest))(team, dest, __VA_ARGS__)

#define shmem_wait_until(ivar, ...) HMSHMEM_GENERIC(SYNC, wait_until, *(ivar))(ivar, __VA_ARGS__)
#define shmem_wait_until_all(ivars, ...) HMSHMEM_GENERIC(SYNC, wait_until_all, *(ivars))(ivars, __VA_ARGS__)
#define shmem_wait_until_any(ivars, ...) HMSHMEM_GENERIC(SYNC, wait_until_any, *(ivars))(ivars, __VA_ARGS__)
#define shmem_wait_until_some(ivars, ...) HMSHMEM_GENERIC(SYNC, wait_until_some, *(ivars))(ivars, __VA_ARGS__)
#define shmem_wait_until_all_vector(ivars, ...) HMSHMEM_GENERIC(SYNC, wait_until_all_vector, *(ivars))(ivars, __VA_ARGS__)
#define shmem_wait_until_any_vector(ivars, ...) HMSHMEM_GENERIC(SYNC, wait_until_any_vector, *(ivars))(ivars, __VA_ARGS__)
#define shmem_wait_until_some_vector(ivars, ...) HMSHMEM_GENERIC(SYNC, wait_until_some_vector, *(ivars))(ivars, __VA_ARGS__)
#define shmem_test(ivar, ...) HMSHMEM_GENERIC(SYNC, test, *(ivar))(ivar, __VA_ARGS__)
#define shmem_test_all(ivars, ...) HMSHMEM_GENERIC(SYNC, test_all, *(ivars))(ivars, __VA_ARGS__)
#define shmem_test_any(ivars, ...) HMSHMEM_GENERIC(SYNC, test_any, *(ivars))(ivars, __VA_ARGS__)
#define shmem_test_some(ivars, ...) HMSHMEM_GENERIC(SYNC, test_some, *(ivars))(ivars, __VA_ARGS__)
#define shmem_test_all_vector(ivars, ...) HMSHMEM_GENERIC(SYNC, test_all_vector, *(ivars))(ivars, __VA_ARGS__)
#define shmem_test_any_vector(ivars, ...) HMSHMEM_GENERIC(SYNC, test_any_vector, *(ivars))(ivars, __VA_ARGS__)
#define shmem_test_some_vector(ivars, ...) HMSHMEM_GENERIC(SYNC, test_some_vector, *(ivars))(ivars, __VA_ARGS__)

#endif /* C11 */

#endif /* HMSHMEM_SHMEM_H */
