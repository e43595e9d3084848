/* shmem_global_exit ends every PE with its status. Arguments: EXITER STATUS OTHERS.
 *   PE EXITER calls shmem_global_exit(STATUS) after a first barrier, while every other PE
 *   - OTHERS = barrier: waits in shmem_barrier_all (which the exiter never reaches), or
 *   - OTHERS = compute: computes without calling the library (sleeps in a loop of 1 ms steps,
 *     for at most two minutes).
 * Every PE first prints its process id (flushed), so the harness can check none is left behind,
 * then a line it leaves in stdio's buffer (stdout is a pipe under hmrun, so fully buffered):
 * only a PE whose streams are flushed as it ends shows it. A PE that gets past its part says
 * so, which must not happen. */
#define _POSIX_C_SOURCE 200809L /* nanosleep under -std=c11 */
#include <shmem.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

int main(int argc, char **argv) {
    CHECK(argc == 4);
    int exiter = atoi(argv[1]), status = atoi(argv[2]);
    int compute = strcmp(argv[3], "compute") == 0;
    CHECK(compute || strcmp(argv[3], "barrier") == 0);
    shmem_init();
    int me = shmem_my_pe();
    CHECK(exiter >= 0 && exiter < shmem_n_pes());
    printf("PID %d\n", (int)getpid());
    fflush(stdout);
    printf("PE %d BUFFERED\n", me); /* no fflush: in stdio's buffer until the PE ends */
    shmem_barrier_all();
    if (me == exiter) {
        shmem_global_exit(status);
    } else if (compute) {
        const struct timespec step = {0, 1000000};
        for (int i = 0; i < 120000; i++) nanosleep(&step, NULL);
    } else {
        shmem_barrier_all();
    }
    printf("PE %d reached the end, which it must not\n", me);
    return 0;
}
