/* The node-wide budget (see nodebudget.h).
 *
 * Every process of this user running with the same PINSHIM_NODE_BUDGET maps one POSIX shared
 * memory segment, "/pinshim-<uid>-<budget>", mode 0600.  It holds a fixed table of slots
 * {pid, start time, pid namespace, bytes} and the node total, guarded by a process-shared robust
 * mutex: a process killed while holding it leaves it EOWNERDEAD, and the next locker rebuilds
 * the total from the slots (each slot field is one aligned store, so the slots are never torn).
 *
 * A process takes a slot at its first reservation and clears it at exit.  A process that died
 * without clearing its slot is found by a scan when a reservation does not fit: its pid is gone
 * (ESRCH), a zombie, or now belongs to a process started at another time (pid reuse).  Nobody
 * ever takes bytes from a live process.
 *
 * Nothing here allocates (the shim runs inside malloc): the segment is mmapped, /proc is read
 * into stack buffers.  When the segment cannot be used, the node budget becomes a second
 * per-process ceiling: the user asked for a ceiling, and this is the closest one we can keep. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "base/config.h"
#include "base/os.h"
#include "base/log.h"
#include "mem/nodebudget.h"
#include "base/shim.h"

#define NB_SLOTS 512
#define NB_MAGIC UINT64_C(0x31626e6873706970)   /* "pipshnb1" */
#define NB_VERSION 1
/* A reservation that does not fit scans for dead processes at most this often: failed
 * promotions can repeat on every copy of a hot block, the scan costs syscalls per slot. */
#define NB_RESCAN_NS 50000000ull
/* How long an opener waits for another process to finish initializing the segment. */
#define NB_INIT_WAIT_NS 2000000000ull

/* init word: 0 fresh (ftruncate zero-fills), INIT_READY, or (pid << 8 | INIT_BUSY). */
#define INIT_BUSY 1u
#define INIT_READY 2u

struct nb_slot {
    int32_t pid;          /* 0: free */
    uint32_t unused;
    uint64_t start;       /* /proc/<pid>/stat field 22; 0 when unknown */
    uint64_t pidns;       /* inode of /proc/self/ns/pid; pids compare only within one namespace */
    uint64_t bytes;
};

struct nb_seg {
    uint64_t init;
    uint64_t magic, version, size, budget;
    pthread_mutex_t lock;
    uint64_t used;        /* sum of the slots' bytes; rebuilt after EOWNERDEAD */
    struct nb_slot slots[NB_SLOTS];
};

enum { ST_NONE, ST_SHARED, ST_LOCAL };

/* Process-local state.  `state` and `seg` change only under attach_mu; slot and mine, in the
 * shared state, only under the segment's lock. */
static pthread_mutex_t attach_mu = PTHREAD_MUTEX_INITIALIZER;
static int state;
static struct nb_seg *seg;
static uint64_t seg_budget;      /* the budget the segment was attached for */
static pid_t my_pid;
static uint64_t my_start, my_pidns;
static int my_slot = -1;
static int closed;               /* after nodebudget_shutdown: refuse until re-attached */
static uint64_t mine;            /* bytes this process holds (every state) */
static uint64_t last_scan_ns;
static char seg_name[64];

/* ---- /proc ---- */

/* Fields 3 (state) and 22 (start time) of /proc/<pid>/stat; -1 when it cannot be read. */
static int read_stat(pid_t pid, char *st, uint64_t *start)
{
    char path[64], buf[1024];
    if (pid)
        snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    else
        snprintf(path, sizeof path, "/proc/self/stat");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    /* The command name is in parentheses and may hold anything: parse after the last ')'. */
    char *p = strrchr(buf, ')');
    if (!p || p[1] != ' ' || !p[2])
        return -1;
    p += 2;
    *st = *p;
    for (int field = 3; field < 22; field++) {
        p = strchr(p, ' ');
        if (!p)
            return -1;
        p++;
    }
    uint64_t v = 0;
    while (*p >= '0' && *p <= '9')
        v = v * 10 + (uint64_t)(*p++ - '0');
    *start = v;
    return 0;
}

static uint64_t read_pidns(void)
{
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

/* A slot's owner is gone: no such pid, a zombie, or the pid now names a later process. */
static int owner_dead(const struct nb_slot *s)
{
    if (s->pidns != my_pidns)
        return 0;   /* another pid namespace: its pids mean nothing here, never judge them */
    if (kill(s->pid, 0) != 0 && errno == ESRCH)
        return 1;
    /* Reading /proc takes a descriptor; on the shim's own threads that could meet a program
     * reusing descriptor numbers it did not open (close, then dup2).  A zombie or a reused pid
     * waits for the next scan on a program's thread. */
    if (shim_own_thread)
        return 0;
    char st;
    uint64_t start;
    if (read_stat(s->pid, &st, &start) != 0)
        return 0;   /* alive by kill and unreadable (hidepid): keep it */
    if (st == 'Z' || st == 'X')
        return 1;   /* its memory, pins included, is already gone */
    return s->start && start != s->start;
}

/* ---- the segment ---- */

static void warn_fallback(const char *what, int err)
{
    shim_log(LOG_WARN, "PINSHIM_NODE_BUDGET: cannot share the node budget through shared memory "
             "%s (%s: %s); using it as a second per-process ceiling instead",
             seg_name, what, err ? strerror(err) : "incompatible segment");
}

static void seg_rebuild_total(struct nb_seg *s)
{
    uint64_t sum = 0;
    for (int i = 0; i < NB_SLOTS; i++)
        if (s->slots[i].pid)
            sum += s->slots[i].bytes;
    __atomic_store_n(&s->used, sum, __ATOMIC_RELAXED);
}

/* 0, or an error: the lock is then unusable (ENOTRECOVERABLE) and the caller falls back. */
static int seg_lock(struct nb_seg *s)
{
    int r = pthread_mutex_lock(&s->lock);
    if (r == EOWNERDEAD) {
        /* Its owner died inside: a slot may be half claimed or the total out of step. */
        seg_rebuild_total(s);
        r = pthread_mutex_consistent(&s->lock);
    }
    return r;
}

static void seg_init(struct nb_seg *s, uint64_t budget)
{
    pthread_mutexattr_t a;
    memset(s->slots, 0, sizeof s->slots);   /* a dead initializer may have left anything */
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&s->lock, &a);
    pthread_mutexattr_destroy(&a);
    s->used = 0;
    s->magic = NB_MAGIC;
    s->version = NB_VERSION;
    s->size = sizeof *s;
    s->budget = budget;
}

/* Wait until the segment is initialized, initializing it ourselves when it is fresh or its
 * initializer died halfway.  0 on success. */
static int seg_ready(struct nb_seg *s, uint64_t budget)
{
    uint64_t mine_busy = (uint64_t)my_pid << 8 | INIT_BUSY;
    uint64_t deadline = shim_now_ns() + NB_INIT_WAIT_NS;
    for (;;) {
        uint64_t v = __atomic_load_n(&s->init, __ATOMIC_ACQUIRE);
        if (v == INIT_READY)
            return 0;
        int take = v == 0;
        if (!take && (v & 0xff) == INIT_BUSY && kill((pid_t)(v >> 8), 0) != 0 && errno == ESRCH)
            take = 1;
        if (take && __atomic_compare_exchange_n(&s->init, &v, mine_busy, 0, __ATOMIC_ACQUIRE,
                                                __ATOMIC_ACQUIRE)) {
            seg_init(s, budget);
            __atomic_store_n(&s->init, INIT_READY, __ATOMIC_RELEASE);
            return 0;
        }
        if (shim_now_ns() > deadline)
            return -1;
        struct timespec ts = { 0, 1000000 };
        nanosleep(&ts, NULL);
    }
}

/* Map the segment: ST_SHARED, or ST_LOCAL after one warning.  attach_mu held. */
static int seg_attach(uint64_t budget)
{
    snprintf(seg_name, sizeof seg_name, "/pinshim-%u-%llu", (unsigned)getuid(),
             (unsigned long long)budget);
    const char *what = "shm_open";
    int err = 0;
    struct nb_seg *s = NULL;
    int fd = shm_open(seg_name, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        err = errno;
    } else {
        struct stat st;
        what = "fstat";
        if (fstat(fd, &st) != 0) {
            err = errno;
        } else if (st.st_uid != getuid() || (st.st_mode & 077)) {
            /* Someone else's, or open to others: its numbers cannot be trusted. */
            what = "owner or permissions";
            err = EPERM;
        } else if (st.st_size == 0 && (what = "ftruncate", ftruncate(fd, sizeof *s) != 0)) {
            /* Any opener may size a fresh segment: ftruncate to the same size is harmless. */
            err = errno;
        } else if (st.st_size != 0 && st.st_size != (off_t)sizeof *s) {
            what = "size";
        } else {
            /* umask may have narrowed the mode further; owner read-write is what everyone needs. */
            fchmod(fd, 0600);
            what = "mmap";
            void *m = os_map_shared(sizeof *s, fd);
            if (!m) {
                err = errno;
            } else {
                s = m;
                what = "initialization";
                if (seg_ready(s, budget) != 0 || s->magic != NB_MAGIC || s->version != NB_VERSION ||
                    s->size != sizeof *s || s->budget != budget) {
                    os_unmap(s, sizeof *s);
                    s = NULL;
                }
            }
        }
        close(fd);
    }
    if (!s) {
        warn_fallback(what, err);
        return ST_LOCAL;
    }
    seg = s;
    return ST_SHARED;
}

/* The state for the current budget and process; attaches on first use.  Returns ST_NONE in a
 * state that must not be used (no budget). */
static int current_state(uint64_t budget)
{
    pid_t pid = getpid();
    int st = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
    if (SHIM_LIKELY(st != ST_NONE && seg_budget == budget && my_pid == pid))
        return st;
    /* Attaching opens descriptors (shm_open, /proc): never on the shim's own threads (see
     * owner_dead).  nodebudget_attach does it at start-up; until then, refuse. */
    if (shim_own_thread)
        return ST_NONE;
    pthread_mutex_lock(&attach_mu);
    if (state != ST_NONE && my_pid != pid) {
        /* A fork child that uses the API (unit tests; the shim itself never does): the slot is
         * the parent's.  Keep the mapping, start over as a new process. */
        my_slot = -1;
        __atomic_store_n(&mine, 0, __ATOMIC_RELAXED);
        closed = 0;
        last_scan_ns = 0;
        my_pid = pid;
        read_stat(0, &(char){ 0 }, &my_start);
    }
    if (state != ST_NONE && seg_budget != budget) {
        /* The budget changed (tests only): leave the old segment. */
        if (state == ST_SHARED) {
            nodebudget_shutdown();
            os_unmap(seg, sizeof *seg);
            seg = NULL;
        }
        __atomic_store_n(&state, ST_NONE, __ATOMIC_RELEASE);
    }
    if (state == ST_NONE) {
        my_pid = pid;
        my_slot = -1;
        closed = 0;
        last_scan_ns = 0;
        __atomic_store_n(&mine, 0, __ATOMIC_RELAXED);
        my_start = 0;
        char c;
        read_stat(0, &c, &my_start);
        my_pidns = read_pidns();
        seg_budget = budget;
        shim_enter();   /* shm_open and friends must not come back into the shim */
        st = seg_attach(budget);
        shim_leave();
        __atomic_store_n(&state, st, __ATOMIC_RELEASE);
    }
    st = state;
    pthread_mutex_unlock(&attach_mu);
    return st;
}

/* Reclaim the slots of dead processes.  Segment lock held. */
static void scan_dead(void)
{
    __atomic_store_n(&last_scan_ns, shim_now_ns(), __ATOMIC_RELAXED);
    for (int i = 0; i < NB_SLOTS; i++) {
        struct nb_slot *s = &seg->slots[i];
        if (!s->pid || i == my_slot || !owner_dead(s))
            continue;
        shim_log(LOG_INFO, "node budget: reclaimed %llu bytes of dead process %d",
                 (unsigned long long)s->bytes, (int)s->pid);
        __atomic_store_n(&seg->used, seg->used - s->bytes, __ATOMIC_RELAXED);
        s->bytes = 0;
        s->pid = 0;
    }
}

/* Make sure this process owns a slot.  Segment lock held.  0 when the table is full. */
static int own_slot(void)
{
    if (my_slot >= 0) {
        struct nb_slot *s = &seg->slots[my_slot];
        if (s->pid == my_pid && s->start == my_start && s->pidns == my_pidns)
            return 1;
        my_slot = -1;   /* taken from us: cannot happen while we live, but never write another's */
    }
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < NB_SLOTS; i++) {
            struct nb_slot *s = &seg->slots[i];
            if (s->pid)
                continue;
            /* pid last: a claimer dying halfway leaves a free slot or one owned by a dead pid. */
            s->bytes = 0;
            s->start = my_start;
            s->pidns = my_pidns;
            s->pid = my_pid;
            my_slot = i;
            return 1;
        }
        if (pass == 0)
            scan_dead();
    }
    return 0;
}

static void fall_back_local(int err)
{
    pthread_mutex_lock(&attach_mu);
    if (state == ST_SHARED) {
        warn_fallback("pthread_mutex_lock", err);
        __atomic_store_n(&state, ST_LOCAL, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&attach_mu);
}

static int reserve_local(size_t bytes, uint64_t budget)
{
    uint64_t cur = __atomic_load_n(&mine, __ATOMIC_RELAXED);
    do {
        if (cur + bytes > budget)
            return 0;
    } while (!__atomic_compare_exchange_n(&mine, &cur, cur + bytes, 1, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
    return 1;
}

static void sub_mine(uint64_t bytes)
{
    uint64_t cur = __atomic_load_n(&mine, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(&mine, &cur, cur > bytes ? cur - bytes : 0, 1,
                                        __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
}

int nodebudget_reserve(size_t bytes)
{
    uint64_t budget = shim_cfg.node_budget;
    if (!budget) {
        __atomic_add_fetch(&mine, bytes, __ATOMIC_RELAXED);
        return 1;
    }
    if (shim_forked_child)
        return 0;   /* a child never registers; its parent's slot is not its own */
    if (bytes > budget)
        return 0;
    int saved_errno = errno;
    int ok = 0;
    int st = current_state(budget);
    if (st == ST_SHARED) {
        /* Quick refusal without the lock while the node is full and was scanned recently. */
        uint64_t now = shim_now_ns();
        int recent = now - __atomic_load_n(&last_scan_ns, __ATOMIC_RELAXED) < NB_RESCAN_NS;
        if (recent && __atomic_load_n(&seg->used, __ATOMIC_RELAXED) + bytes > budget) {
            errno = saved_errno;
            return 0;
        }
        int r = seg_lock(seg);
        if (r == 0) {
            if (!closed && own_slot()) {
                if (seg->used + bytes > budget && !recent)
                    scan_dead();
                if (seg->used + bytes <= budget) {
                    seg->slots[my_slot].bytes += bytes;
                    __atomic_store_n(&seg->used, seg->used + bytes, __ATOMIC_RELAXED);
                    __atomic_add_fetch(&mine, bytes, __ATOMIC_RELAXED);
                    ok = 1;
                }
            } else if (!closed) {
                shim_log_once(LOG_INFO, "node budget: all %d slots of %s are taken by live "
                              "processes; not promoting", NB_SLOTS, seg_name);
            }
            pthread_mutex_unlock(&seg->lock);
        } else {
            fall_back_local(r);
            st = ST_LOCAL;
        }
    }
    if (st == ST_LOCAL)
        ok = !closed && reserve_local(bytes, budget);
    errno = saved_errno;
    return ok;
}

void nodebudget_attach(void)
{
    uint64_t budget = shim_cfg.node_budget;
    if (budget && !shim_forked_child)
        current_state(budget);
}

void nodebudget_release(size_t bytes)
{
    uint64_t budget = shim_cfg.node_budget;
    if (!budget) {
        sub_mine(bytes);
        return;
    }
    if (shim_forked_child)
        return;
    int saved_errno = errno;
    int st = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
    if (st == ST_SHARED && my_pid == getpid()) {
        int r = seg_lock(seg);
        if (r == 0) {
            if (my_slot >= 0 && seg->slots[my_slot].pid == my_pid) {
                struct nb_slot *s = &seg->slots[my_slot];
                uint64_t b = bytes < s->bytes ? bytes : s->bytes;
                s->bytes -= b;
                __atomic_store_n(&seg->used, seg->used - b, __ATOMIC_RELAXED);
            }
            sub_mine(bytes);
            pthread_mutex_unlock(&seg->lock);
        } else {
            fall_back_local(r);
            sub_mine(bytes);
        }
    } else if (st == ST_LOCAL) {
        sub_mine(bytes);
    }
    errno = saved_errno;
}

void nodebudget_usage(uint64_t *budget, uint64_t *node_used, uint64_t *mine_out)
{
    *budget = shim_cfg.node_budget;
    *mine_out = __atomic_load_n(&mine, __ATOMIC_RELAXED);
    *node_used = *mine_out;
    int st = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
    if (st != ST_SHARED || !*budget || shim_forked_child)
        return;
    int saved_errno = errno;
    /* Under the lock, so that this process's share is never reported above the node's. */
    if (seg_lock(seg) == 0) {
        *mine_out = __atomic_load_n(&mine, __ATOMIC_RELAXED);
        *node_used = seg->used;
        pthread_mutex_unlock(&seg->lock);
    } else {
        *node_used = __atomic_load_n(&seg->used, __ATOMIC_RELAXED);
    }
    errno = saved_errno;
}

void nodebudget_shutdown(void)
{
    if (shim_forked_child || __atomic_load_n(&state, __ATOMIC_ACQUIRE) != ST_SHARED ||
        my_pid != getpid())
        return;
    int saved_errno = errno;
    /* The mapping stays: another thread may still be releasing through it. */
    if (seg_lock(seg) == 0) {
        if (my_slot >= 0 && seg->slots[my_slot].pid == my_pid) {
            struct nb_slot *s = &seg->slots[my_slot];
            __atomic_store_n(&seg->used, seg->used - s->bytes, __ATOMIC_RELAXED);
            s->bytes = 0;
            s->pid = 0;
        }
        my_slot = -1;
        closed = 1;
        __atomic_store_n(&mine, 0, __ATOMIC_RELAXED);
        pthread_mutex_unlock(&seg->lock);
    }
    errno = saved_errno;
}

/* After init.c's destructor (default priority runs first), so the exit report still sees this
 * process's share; registrations die with the process a moment later. */
__attribute__((destructor(101))) static void nodebudget_at_exit(void)
{
    nodebudget_shutdown();
}

const char *nodebudget_segment_name(void)
{
    return seg_name;
}

int nodebudget_audit(struct nodebudget_audit *a)
{
    memset(a, 0, sizeof *a);
    a->budget = shim_cfg.node_budget;
    if (!a->budget)
        return -1;
    int st = current_state(a->budget);
    if (st != ST_SHARED)
        return st == ST_LOCAL ? 1 : -1;
    if (seg_lock(seg) != 0)
        return -1;
    a->used = seg->used;
    for (int i = 0; i < NB_SLOTS; i++) {
        if (!seg->slots[i].pid)
            continue;
        a->slot_sum += seg->slots[i].bytes;
        a->slots_used++;
    }
    a->mine = mine;
    pthread_mutex_unlock(&seg->lock);
    return 0;
}

#ifdef PINSHIM_TEST_SEAMS
/* Test seams: built into the unit tests' copy of this file only (Makefile: obj-seams), never
 * into libpinshim.so. */
int nodebudget_test_plant(int32_t pid, uint64_t start, uint64_t bytes)
{
    uint64_t budget = shim_cfg.node_budget;
    if (!budget || current_state(budget) != ST_SHARED || seg_lock(seg) != 0)
        return -1;
    int planted = -1;
    for (int i = 0; i < NB_SLOTS && planted < 0; i++) {
        struct nb_slot *s = &seg->slots[i];
        if (s->pid)
            continue;
        s->bytes = bytes;
        s->start = start;
        s->pidns = my_pidns;
        s->pid = pid;
        __atomic_store_n(&seg->used, seg->used + bytes, __ATOMIC_RELAXED);
        planted = 0;
    }
    pthread_mutex_unlock(&seg->lock);
    return planted;
}

void nodebudget_test_die_locked(void)
{
    uint64_t budget = shim_cfg.node_budget;
    if (budget && current_state(budget) == ST_SHARED && seg_lock(seg) == 0) {
        __atomic_store_n(&seg->used, seg->used + 12345, __ATOMIC_RELAXED);
        raise(SIGKILL);
    }
    _exit(1);
}
#endif
