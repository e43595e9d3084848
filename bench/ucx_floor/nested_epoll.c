/*
 * nested_epoll: what one more epoll set watching a socket's epoll set costs a TCP ping-pong,
 * with no UCX at all (bench/findings.md, round 29).
 *
 * UCX's TCP transport keeps its sockets in an epoll set of its own and polls it with a zero
 * timeout. With the WAKEUP feature (the event fd our progress thread sleeps on), the worker's
 * epoll set watches that set too, so the kernel runs one more wake-up callback for every
 * message received, whether anyone sleeps on the outer set or not. This loop measures that
 * callback alone: two forked processes ping-pong a 24-byte message over loopback TCP (our
 * exchange's header), each polling its socket's epoll set with a zero timeout, as UCX does.
 *
 * Build:  gcc -O2 -o target/nested_epoll bench/ucx_floor/nested_epoll.c
 * Run:    target/nested_epoll [--outer off|on] [--quick]
 *
 * --outer on: a second epoll set watches the first (EPOLLIN), as the worker's does with WAKEUP;
 * --outer off (the default): no second set. 21 trials of 50,000 round trips (--quick: 3 of 200,
 * a check that it works); the parent prints one JSON line, median and min in ns per round trip.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MESSAGE 24
#define MAX_TRIALS 21

static void die(const char *what) {
    perror(what);
    exit(1);
}

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static int compare(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void send_all(int sock, const char *buf) {
    if (send(sock, buf, MESSAGE, 0) != MESSAGE) die("send");
}

/* Polls the socket's epoll set with a zero timeout until the peer's message is in. */
static void receive(int set, int sock, char *buf) {
    size_t got = 0;
    while (got < MESSAGE) {
        struct epoll_event ready;
        int n = epoll_wait(set, &ready, 1, 0);
        if (n < 0) die("epoll_wait");
        if (n == 0) continue;
        ssize_t k = recv(sock, buf + got, MESSAGE - got, MSG_DONTWAIT);
        if (k == 0) {
            fprintf(stderr, "nested_epoll: the peer closed the connection\n");
            exit(1);
        }
        if (k > 0) got += (size_t)k;
    }
}

int main(int argc, char **argv) {
    int outer = 0, quick = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) {
            quick = 1;
        } else if (!strcmp(argv[i], "--outer") && i + 1 < argc &&
                   (!strcmp(argv[i + 1], "on") || !strcmp(argv[i + 1], "off"))) {
            outer = !strcmp(argv[++i], "on");
        } else {
            fprintf(stderr, "usage: nested_epoll [--outer off|on] [--quick]\n");
            return 2;
        }
    }
    int trials = quick ? 3 : MAX_TRIALS;
    long rounds = quick ? 200 : 50000;

    int listener = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in address = {.sin_family = AF_INET,
                                  .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t length = sizeof address;
    if (listener < 0 || bind(listener, (struct sockaddr *)&address, sizeof address) != 0 ||
        getsockname(listener, (struct sockaddr *)&address, &length) != 0 ||
        listen(listener, 1) != 0)
        die("listen on loopback");
    pid_t child = fork();
    if (child < 0) die("fork");
    int me = child == 0, sock;
    if (me) {
        sock = socket(AF_INET, SOCK_STREAM, 0);
        if (sock < 0 || connect(sock, (struct sockaddr *)&address, sizeof address) != 0)
            die("connect");
    } else {
        sock = accept(listener, NULL, NULL);
        if (sock < 0) die("accept");
    }
    close(listener);
    int one = 1;
    if (setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0) die("TCP_NODELAY");
    int set = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event watch = {.events = EPOLLIN, .data.fd = sock};
    if (set < 0 || epoll_ctl(set, EPOLL_CTL_ADD, sock, &watch) != 0) die("epoll set");
    if (outer) {
        int outer_set = epoll_create1(EPOLL_CLOEXEC);
        struct epoll_event nested = {.events = EPOLLIN, .data.fd = set};
        if (outer_set < 0 || epoll_ctl(outer_set, EPOLL_CTL_ADD, set, &nested) != 0)
            die("outer epoll set");
    }

    char buf[MESSAGE] = {0};
    double per_round[MAX_TRIALS];
    for (int t = -1; t < trials; t++) { /* trial -1 warms the connection up */
        double start = now_ns();
        for (long i = 0; i < rounds; i++) {
            if (me) {
                receive(set, sock, buf);
                send_all(sock, buf);
            } else {
                send_all(sock, buf);
                receive(set, sock, buf);
            }
        }
        if (t >= 0) per_round[t] = (now_ns() - start) / (double)rounds;
    }
    close(sock);
    if (me) return 0;
    int status;
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status)) {
        fprintf(stderr, "nested_epoll: the child did not exit cleanly\n");
        return 1;
    }
    qsort(per_round, trials, sizeof per_round[0], compare);
    printf("{\"op\":\"tcp_round_trip\",\"layer\":\"nested-epoll\",\"outer\":\"%s\","
           "\"median_ns\":%.1f,\"min_ns\":%.1f,\"trials\":%d,\"batch_ops\":%ld}\n",
           outer ? "on" : "off", per_round[trials / 2], per_round[0], trials, rounds);
    return 0;
}
