/* One memory budget per container, shared by all its processes through a small mmap'd file.
 *
 * Each process owns a slot (pid + start time + bytes in use) and the header keeps the total; a
 * robust process-shared mutex guards both. A process that dies, even by SIGKILL while holding the
 * lock, has its slot reclaimed by the next process that needs room: liveness is checked by pid and
 * by the start time in /proc, so a reused pid does not keep a dead process's bytes alive. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "tessera.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define BUDGET_MAGIC 0x3161726573736574ull /* "tessera1" */
#define BUDGET_VERSION 1
#define BUDGET_SLOTS 1024

struct slot {
    int32_t pid;
    uint32_t reserved;
    uint64_t start_time;
    uint64_t used;
};

struct budget_file {
    uint64_t magic;
    uint32_t version, nslots;
    pthread_mutex_t mu;
    uint64_t total;
    uint64_t cap;   /* informational: the cap of the last process that reserved */
    struct slot slots[BUDGET_SLOTS];
};

static struct budget_file *_Atomic g_budget;
static pthread_mutex_t map_mu = PTHREAD_MUTEX_INITIALIZER;
static int map_failed;
static int my_slot = -1;           /* guarded by the budget lock */
static pid_t my_slot_pid;

/* Start time (clock ticks since boot) and state of a process, from /proc/<pid>/stat. */
static int proc_stat(pid_t pid, uint64_t *start, char *state) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return -1;
    buf[n] = 0;
    char *p = strrchr(buf, ')');   /* the command name may hold spaces and parentheses */
    if (!p || p[1] != ' ') return -1;
    *state = p[2];
    p += 2;
    /* field 3 is the state; the start time is field 22 */
    for (int field = 3; field < 22; field++) {
        p = strchr(p, ' ');
        if (!p) return -1;
        p++;
    }
    unsigned long long v;
    if (sscanf(p, "%llu", &v) != 1) return -1;
    *start = v;
    return 0;
}

static int slot_alive(const struct slot *s) {
    if (s->pid <= 0) return 0;
    if (kill(s->pid, 0) != 0 && errno == ESRCH) return 0;
    uint64_t start;
    char state;
    if (proc_stat(s->pid, &start, &state) != 0) return 1;   /* cannot tell: keep its bytes */
    if (state == 'Z' || state == 'X') return 0;             /* exited; the driver freed its memory */
    return start == s->start_time;
}

static void reclaim_dead(struct budget_file *b) {
    for (unsigned i = 0; i < b->nslots; i++) {
        struct slot *s = &b->slots[i];
        if (s->pid == 0 || (int)i == my_slot) continue;
        if (!slot_alive(s)) {
            if (s->used) tlog(TLOG_INFO, "reclaimed %llu bytes of exited pid %d",
                              (unsigned long long)s->used, s->pid);
            b->total -= s->used < b->total ? s->used : b->total;
            memset(s, 0, sizeof *s);
        }
    }
}

static struct budget_file *map_budget(void) {
    struct budget_file *b = atomic_load_explicit(&g_budget, memory_order_acquire);
    if (b || map_failed) return b;
    pthread_mutex_lock(&map_mu);
    b = atomic_load_explicit(&g_budget, memory_order_relaxed);
    if (!b && !map_failed) {
        int fd = open(g_cfg.budget_path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
        struct stat st;
        if (fd < 0) {
            tlog(TLOG_ERROR, "cannot open memory budget %s: %s; GPU allocations are refused",
                 g_cfg.budget_path, strerror(errno));
        } else if (flock(fd, LOCK_EX) == 0 && fstat(fd, &st) == 0) {
            int fresh = st.st_size == 0;
            if (fresh && ftruncate(fd, sizeof(struct budget_file)) != 0) {
                tlog(TLOG_ERROR, "cannot size memory budget %s: %s", g_cfg.budget_path, strerror(errno));
            } else if (!fresh && (size_t)st.st_size < sizeof(struct budget_file)) {
                tlog(TLOG_ERROR, "memory budget %s is not a Tessera budget; GPU allocations are refused",
                     g_cfg.budget_path);
            } else {
                void *m = mmap(NULL, sizeof(struct budget_file), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
                if (m == MAP_FAILED) {
                    tlog(TLOG_ERROR, "cannot map memory budget: %s", strerror(errno));
                } else if (fresh) {
                    b = m;
                    pthread_mutexattr_t attr;
                    pthread_mutexattr_init(&attr);
                    pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
                    pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
                    pthread_mutex_init(&b->mu, &attr);
                    pthread_mutexattr_destroy(&attr);
                    b->nslots = BUDGET_SLOTS;
                    b->version = BUDGET_VERSION;
                    __atomic_store_n(&b->magic, BUDGET_MAGIC, __ATOMIC_RELEASE);
                    (void)fchmod(fd, 0666);   /* containers run processes as several users */
                } else if (((struct budget_file *)m)->magic != BUDGET_MAGIC ||
                           ((struct budget_file *)m)->version != BUDGET_VERSION) {
                    tlog(TLOG_ERROR, "memory budget %s has an unknown format; GPU allocations are refused",
                         g_cfg.budget_path);
                    munmap(m, sizeof(struct budget_file));
                } else {
                    b = m;
                }
            }
            flock(fd, LOCK_UN);
        }
        if (fd >= 0) close(fd);
        if (b) atomic_store_explicit(&g_budget, b, memory_order_release);
        else map_failed = 1;
    }
    pthread_mutex_unlock(&map_mu);
    return b;
}

static int lock_budget(struct budget_file *b) {
    int r = pthread_mutex_lock(&b->mu);
    if (r == EOWNERDEAD) {
        /* the holder died mid-update: rebuild the total from the slots */
        uint64_t total = 0;
        for (unsigned i = 0; i < b->nslots; i++) total += b->slots[i].used;
        b->total = total;
        pthread_mutex_consistent(&b->mu);
        tlog(TLOG_WARN, "memory budget lock recovered from a process that died holding it");
        return 0;
    }
    if (r) tlog(TLOG_ERROR, "memory budget lock failed: %s", strerror(r));
    return r;
}

/* Finds or claims this process's slot; the budget lock is held. */
static struct slot *own_slot(struct budget_file *b) {
    pid_t pid = getpid();
    if (my_slot >= 0 && my_slot_pid == pid) return &b->slots[my_slot];
    uint64_t start = 0;
    char state;
    proc_stat(pid, &start, &state);
    for (unsigned i = 0; i < b->nslots; i++) {
        if (b->slots[i].pid == pid && b->slots[i].start_time == start) {
            /* this process before an exec: exec destroyed its contexts, so the driver freed its memory */
            struct slot *s = &b->slots[i];
            b->total -= s->used < b->total ? s->used : b->total;
            s->used = 0;
            my_slot = (int)i;
            my_slot_pid = pid;
            return &b->slots[i];
        }
    }
    for (int pass = 0; pass < 2; pass++) {
        for (unsigned i = 0; i < b->nslots; i++) {
            struct slot *s = &b->slots[i];
            if (s->pid == 0 || (s->pid == pid && !slot_alive(s))) {
                b->total -= s->used < b->total ? s->used : b->total;
                s->pid = pid;
                s->start_time = start;
                s->used = 0;
                my_slot = (int)i;
                my_slot_pid = pid;
                return s;
            }
        }
        reclaim_dead(b);
    }
    tlog(TLOG_ERROR, "memory budget has no free slot (more than %d processes)", BUDGET_SLOTS);
    return NULL;
}

int budget_reserve(uint64_t bytes) {
    if (g_cfg.mem_limit == TESSERA_NO_LIMIT) return 0;
    struct budget_file *b = map_budget();
    if (!b || lock_budget(b)) return -1;
    int ok = 0;
    struct slot *s = own_slot(b);
    if (s) {
        uint64_t cap = g_cfg.mem_limit;
        if (b->total > cap || bytes > cap - b->total) reclaim_dead(b);
        if (b->total <= cap && bytes <= cap - b->total) {
            b->total += bytes;
            s->used += bytes;
            b->cap = cap;
            ok = 1;
        }
    }
    pthread_mutex_unlock(&b->mu);
    return ok ? 0 : -1;
}

void budget_release(uint64_t bytes) {
    if (g_cfg.mem_limit == TESSERA_NO_LIMIT || !bytes) return;
    struct budget_file *b = map_budget();
    if (!b || lock_budget(b)) return;
    struct slot *s = own_slot(b);
    if (s) {
        if (bytes > s->used) bytes = s->used;
        s->used -= bytes;
        b->total -= bytes < b->total ? bytes : b->total;
    }
    pthread_mutex_unlock(&b->mu);
}

uint64_t budget_used(void) {
    if (g_cfg.mem_limit == TESSERA_NO_LIMIT) return 0;
    struct budget_file *b = map_budget();
    if (!b) return g_cfg.mem_limit;   /* fail closed: report the share as full */
    if (lock_budget(b)) return g_cfg.mem_limit;
    reclaim_dead(b);
    uint64_t total = b->total;
    pthread_mutex_unlock(&b->mu);
    return total;
}

void budget_after_fork_child(void) {
    /* the child is a new process: it must claim its own slot (the parent's stays the parent's) */
    my_slot = -1;
    my_slot_pid = 0;
    pthread_mutex_init(&map_mu, NULL);
}
