/*
 * A probe preloaded into `hourglass serve` (LD_PRELOAD) by tests/durability.rs:
 * it wraps fsync and fdatasync, and for each one on a RocksDB write-ahead log
 * file (a name ending in ".log") it waits a little, syncs, and then adds one
 * to a counter kept in the file HOURGLASS_SYNC_PROBE names. A test reads the
 * counter before a call and after its answer: an answer that did not wait for
 * the sync is seen before the counter moves.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static volatile uint64_t *counter;

static void open_counter(void) {
    if (counter) return;
    const char *path = getenv("HOURGLASS_SYNC_PROBE");
    if (!path) return;
    int fd = open(path, O_RDWR);
    if (fd < 0) return;
    void *p = mmap(NULL, sizeof(uint64_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p != MAP_FAILED) counter = p;
}

static int is_wal(int fd) {
    char link[64], target[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n < 4) return 0;
    target[n] = 0;
    return strcmp(target + n - 4, ".log") == 0;
}

static int probed(int fd, const char *name) {
    int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, name);
    if (!is_wal(fd)) return real(fd);
    usleep(30 * 1000);
    int r = real(fd);
    open_counter();
    if (counter && r == 0) __atomic_add_fetch(counter, 1, __ATOMIC_SEQ_CST);
    return r;
}

int fsync(int fd) { return probed(fd, "fsync"); }
int fdatasync(int fd) { return probed(fd, "fdatasync"); }
