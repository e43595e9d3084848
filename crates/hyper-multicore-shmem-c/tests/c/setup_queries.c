/* Set-up and queries: init_thread/query_thread, PE numbers (standard and legacy), accessibility,
 * shmem_ptr, library information, a second init, finalize. */
#include <shmem.h>
#include <shmemx.h>
#include <string.h>

#include "check.h"

int main(void) {
    int provided = -1;
    CHECK(shmem_init_thread(SHMEM_THREAD_MULTIPLE, &provided) == 0);
    CHECK(provided == SHMEM_THREAD_MULTIPLE);
    shmem_init(); /* a second initialization changes nothing */
    int queried = -1;
    shmem_query_thread(&queried);
    CHECK(queried == SHMEM_THREAD_MULTIPLE);

    int me = shmem_my_pe(), n = shmem_n_pes();
    CHECK(n >= 1 && me >= 0 && me < n);
    CHECK(_my_pe() == me && _num_pes() == n);
    CHECK(shmem_pe_accessible(me) && shmem_pe_accessible(n - 1));
    CHECK(!shmem_pe_accessible(n) && !shmem_pe_accessible(-1));

    int major = 0, minor = 0;
    shmem_info_get_version(&major, &minor);
    CHECK(major == SHMEM_MAJOR_VERSION && minor == SHMEM_MINOR_VERSION);
    char name[SHMEM_MAX_NAME_LEN];
    shmem_info_get_name(name);
    CHECK(strcmp(name, SHMEM_VENDOR_STRING) == 0);

    long *heap = shmem_malloc(4 * sizeof(long));
    CHECK(heap != NULL);
    heap[0] = me;
    shmem_barrier_all();
    long local = 0;
    for (int pe = 0; pe < n; pe++) {
        CHECK(shmem_addr_accessible(heap, pe));
        /* Every PE of one host maps every heap: shmem_ptr reaches them all. */
        long *peer = shmem_ptr(heap, pe);
        CHECK(peer != NULL);
        CHECK(*peer == pe);
    }
    CHECK(shmem_ptr(heap, me) == heap);
    CHECK(!shmem_addr_accessible(&local, 0));
    CHECK(shmemx_last_error() != NULL && strstr(shmemx_last_error(), "not symmetric") != NULL);
    CHECK(!shmem_addr_accessible(heap, n));
    CHECK(strstr(shmemx_debug_state(), "\"allocations\"") != NULL);

    shmem_barrier_all();
    shmem_free(heap);
    PASS("setup_queries");
    shmem_finalize();
    return 0;
}
