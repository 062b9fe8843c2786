/* The node budget (nodebudget.c) without the preload: reserve/release arithmetic, the segment's
 * name and 0600 permissions, a SIGKILLed holder's bytes coming back (reaped and zombie), pid reuse
 * told apart by start time, a live holder never robbed, a process killed holding the segment's
 * lock, a fork child leaving the segment alone, threads, the stats JSON key and report line,
 * several processes reserving and releasing at random (one of them killed, possibly inside the
 * lock) without the slots ever adding up to more than the budget, shutdown, and the per-process
 * fallback when the segment cannot be used, and the registrar's thread never opening a
 * descriptor (refused before the start-up attach; reused pids judged on a program's thread).
 *
 * Every budget is offset by this pid so concurrent runs never share a segment; each segment
 * created is unlinked at the end. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "base/config.h"
#include "base/log.h"
#include "mem/nodebudget.h"
#include "base/shim.h"
#include "stats/stats.h"
#include "testutil.h"

#define M (1024ull * 1024ull)

static char created[16][64];
static int ncreated;

static uint64_t now_ms(void) { return shim_now_ns() / 1000000; }

static void sleep_ms(unsigned ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

/* Switch to budget b (attaching to its segment on first use) and remember the name to unlink. */
static void use_budget(uint64_t b)
{
    shim_cfg.node_budget = b;
    struct nodebudget_audit a;
    nodebudget_audit(&a);
    if (ncreated < 16 && nodebudget_segment_name()[0]) {
        for (int i = 0; i < ncreated; i++)
            if (!strcmp(created[i], nodebudget_segment_name()))
                return;
        snprintf(created[ncreated++], sizeof created[0], "%s", nodebudget_segment_name());
    }
}

static struct nodebudget_audit audit(void)
{
    struct nodebudget_audit a;
    nodebudget_audit(&a);
    return a;
}

/* Try to reserve for up to ms milliseconds; the time it took, or -1. */
static long reserve_within(size_t bytes, unsigned ms)
{
    uint64_t t0 = now_ms();
    do {
        if (nodebudget_reserve(bytes))
            return (long)(now_ms() - t0);
        sleep_ms(5);
    } while (now_ms() - t0 < ms);
    return -1;
}

static uint64_t start_time_of(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    if (!p)
        return 0;
    p += 2;
    for (int field = 3; field < 22 && p; field++) {
        p = strchr(p, ' ');
        if (p)
            p++;
    }
    return p ? strtoull(p, NULL, 10) : 0;
}

/* A child that waits to be killed; with hold > 0 it first reserves that much. */
static pid_t spawn_holder(size_t hold)
{
    int fds[2];
    if (pipe(fds) != 0)
        exit(2);
    pid_t pid = fork();
    if (pid == 0) {
        shim_forked_child = 0;   /* this test is not the shim: the child uses the API itself */
        close(fds[0]);
        char ok = hold ? (char)('0' + nodebudget_reserve(hold)) : '1';
        if (write(fds[1], &ok, 1) != 1)
            _exit(3);
        for (;;)
            pause();
    }
    close(fds[1]);
    char ok = 0;
    if (read(fds[0], &ok, 1) != 1)
        ok = 0;
    close(fds[0]);
    return ok == '1' ? pid : -pid;
}

/* Every open() of the code under test comes here (this definition wins the link over libc's):
 * those made on a thread marked as the shim's own are counted, and must stay 0. */
static int opens_on_shim_threads;

int open(const char *path, int flags, ...)
{
    mode_t mode = 0;
    if ((flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE) {   /* the calls that pass a mode */
        va_list ap;
        va_start(ap, flags);
        mode = (mode_t)va_arg(ap, int);
        va_end(ap);
    }
    if (shim_own_thread)
        __atomic_add_fetch(&opens_on_shim_threads, 1, __ATOMIC_RELAXED);
    return (int)syscall(SYS_openat, AT_FDCWD, path, flags, mode);
}

struct shim_thread_try {
    size_t bytes;
    unsigned ms;
    long result;
};

static void *shim_thread_main(void *p)
{
    struct shim_thread_try *t = p;
    shim_own_thread = 1;   /* what the registrar thread is */
    t->result = reserve_within(t->bytes, t->ms);
    return NULL;
}

/* reserve_within on a thread that is one of the shim's own. */
static long reserve_on_shim_thread(size_t bytes, unsigned ms)
{
    struct shim_thread_try t = { bytes, ms, -2 };
    pthread_t th;
    if (pthread_create(&th, NULL, shim_thread_main, &t) != 0)
        return -2;
    pthread_join(th, NULL);
    return t.result;
}

/* The registrar thread reserves too, and must never open a descriptor: a program that closes
 * the descriptors it did not open and dup2()s its own files onto their numbers could meet it.
 * So the segment is attached at start-up (nodebudget_attach, on the program's thread), and a
 * scan on the shim's thread judges slots by kill() alone: a dead pid's bytes come back there,
 * a zombie's or a reused pid's wait for a program thread's scan. */
static void test_shim_threads(uint64_t B)
{
    char name[64];
    snprintf(name, sizeof name, "/pinshim-%u-%llu", (unsigned)getuid(), (unsigned long long)B);
    shim_cfg.node_budget = B;
    CHECKF(reserve_on_shim_thread(1, 0) == -1,
           "before the start-up attach, a reservation on the shim's thread is refused");
    int fd = shm_open(name, O_RDONLY, 0);
    CHECKF(fd < 0 && errno == ENOENT, "and creates no segment");
    if (fd >= 0)
        close(fd);
    nodebudget_attach();
    use_budget(B);
    CHECKF(!strcmp(nodebudget_segment_name(), name), "nodebudget_attach attached %s", name);
    CHECKF(reserve_on_shim_thread(1, 0) >= 0, "after it, the shim's thread reserves");
    nodebudget_release(1);

    pid_t child = spawn_holder(0);
    uint64_t start = start_time_of(child);
    CHECK(child > 0 && start != 0);
    CHECK(nodebudget_test_plant(child, start + 12345, B) == 0);
    CHECKF(reserve_on_shim_thread(B / 2, 200) == -1,
           "a reused pid's slot is kept by the shim's thread (telling needs /proc)");
    long ms = reserve_within(B / 2, 3000);
    CHECKF(ms >= 0, "and reclaimed by the program's thread");
    nodebudget_release(B / 2);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    CHECK(nodebudget_test_plant(child, start, B) == 0);
    ms = reserve_on_shim_thread(B / 2, 3000);
    CHECKF(ms >= 0, "a dead pid's slot is reclaimed by the shim's thread (kill says ESRCH)");
    nodebudget_release(B / 2);
    CHECK(audit().used == 0);
    CHECKF(opens_on_shim_threads == 0, "the shim's thread opened %d descriptors", opens_on_shim_threads);
}

static void test_no_budget(void)
{
    shim_cfg.node_budget = 0;
    uint64_t b, used, mine;
    CHECK(nodebudget_reserve(1ull << 50) == 1);
    nodebudget_usage(&b, &used, &mine);
    CHECKF(b == 0 && mine == 1ull << 50, "no node budget: reservations always succeed, counted as mine");
    nodebudget_release(1ull << 50);
    nodebudget_usage(&b, &used, &mine);
    CHECK(mine == 0 && used == 0);
}

static void test_arithmetic(uint64_t B)
{
    use_budget(B);
    struct nodebudget_audit a = audit();
    CHECKF(a.budget == B && a.used == 0 && a.slots_used == 0, "fresh segment is empty (used %llu)",
           (unsigned long long)a.used);
    CHECK(nodebudget_reserve(B / 2) == 1);
    CHECK(nodebudget_reserve(B / 2) == 1);
    CHECKF(nodebudget_reserve(1) == 0, "a full node refuses one more byte");
    CHECKF(nodebudget_reserve(B + 1) == 0, "more than the whole budget is refused");
    nodebudget_release(B / 2);
    CHECK(nodebudget_reserve(B / 4) == 1);
    a = audit();
    CHECKF(a.used == 3 * B / 4 && a.slot_sum == a.used && a.mine == a.used && a.slots_used == 1,
           "after +1/2 +1/2 -1/2 +1/4: used %llu, slots %llu, mine %llu (want %llu, one slot)",
           (unsigned long long)a.used, (unsigned long long)a.slot_sum, (unsigned long long)a.mine,
           (unsigned long long)(3 * B / 4));
    uint64_t b, used, mine;
    nodebudget_usage(&b, &used, &mine);
    CHECKF(b == B && used == 3 * B / 4 && mine == 3 * B / 4, "usage: budget, node, mine");
    CHECKF(nodebudget_reserve(B / 4) == 1 && nodebudget_reserve(1) == 0, "exactly the budget fits");
    nodebudget_release(B / 2);
    nodebudget_release(B / 2);
    a = audit();
    CHECKF(a.used == 0 && a.slot_sum == 0 && a.mine == 0, "everything released");
    /* Releasing more than held never takes the total below zero or into another's slot. */
    nodebudget_release(4096);
    a = audit();
    CHECK(a.used == 0 && a.mine == 0);
}

static void test_permissions(void)
{
    char path[128];
    snprintf(path, sizeof path, "/dev/shm%s", nodebudget_segment_name());
    char want[64];
    snprintf(want, sizeof want, "/pinshim-%u-%llu", (unsigned)getuid(),
             (unsigned long long)shim_cfg.node_budget);
    CHECKF(!strcmp(nodebudget_segment_name(), want), "segment name %s", nodebudget_segment_name());
    struct stat st;
    int r = stat(path, &st);
    CHECKF(r == 0 && (st.st_mode & 07777) == 0600 && st.st_uid == getuid(),
           "%s has mode %04o (want 0600), owner %u", path, r == 0 ? (unsigned)(st.st_mode & 07777) : 0u,
           r == 0 ? (unsigned)st.st_uid : 0u);
}

/* A child holding the whole budget is SIGKILLed: reaped, or still a zombie. */
static void test_reclaim(uint64_t B, int reap_first)
{
    pid_t child = spawn_holder(B);
    CHECKF(child > 0, "child reserved the whole budget");
    if (child <= 0)
        return;
    struct nodebudget_audit a = audit();
    CHECKF(a.used == B && a.mine == 0 && a.slots_used == 2, "the child's bytes are in the segment");
    CHECKF(reserve_within(1, 200) < 0, "a live child's budget is never taken (200 ms of tries)");
    kill(child, SIGKILL);
    if (reap_first)
        waitpid(child, NULL, 0);
    else
        sleep_ms(50);   /* dead but unreaped: a zombie */
    long ms = reserve_within(B, 3000);
    CHECKF(ms >= 0 && ms < 1000, "a SIGKILLed holder's budget (%s) is usable again after %ld ms",
           reap_first ? "reaped" : "zombie", ms);
    if (!reap_first)
        waitpid(child, NULL, 0);
    a = audit();
    CHECKF(a.used == B && a.mine == B && a.slots_used == 1, "the dead child's slot is gone");
    nodebudget_release(B);
}

/* Slots left by a pid now reused by another process (start time differs) are reclaimed; the
 * live owner's are not. */
static void test_pid_reuse(uint64_t B)
{
    pid_t child = spawn_holder(0);
    uint64_t start = start_time_of(child);
    CHECK(child > 0 && start != 0);
    CHECK(nodebudget_test_plant(child, start + 12345, B) == 0);
    long ms = reserve_within(B / 2, 3000);
    CHECKF(ms >= 0 && ms < 1000, "a slot whose pid now names a later process is reclaimed (%ld ms)", ms);
    nodebudget_release(B / 2);
    CHECK(nodebudget_test_plant(child, start, B) == 0);
    CHECKF(reserve_within(1, 200) < 0, "a slot whose pid and start time match a live process stays");
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    CHECKF(reserve_within(1, 3000) >= 0, "and goes once that process is dead");
    nodebudget_release(1);
    CHECK(audit().used == 0);
}

/* A forked child of the shim (shim_forked_child set) leaves the segment alone. */
static void test_fork_child_noop(uint64_t B)
{
    CHECK(nodebudget_reserve(B / 4) == 1);
    pid_t pid = fork();
    if (pid == 0) {
        shim_forked_child = 1;
        int r = nodebudget_reserve(1);
        nodebudget_release(B / 4);
        nodebudget_shutdown();
        _exit(r == 0 ? 0 : 1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "a forked child's reserve is refused");
    struct nodebudget_audit a = audit();
    CHECKF(a.used == B / 4 && a.mine == B / 4 && a.slots_used == 1,
           "the child's release and shutdown left the parent's slot alone");
    nodebudget_release(B / 4);
}

/* A process killed inside the lock, with the total half updated: the next locker recovers the
 * lock (EOWNERDEAD) and rebuilds the total from the slots. */
static void test_owner_died(uint64_t B)
{
    CHECK(nodebudget_reserve(B / 4) == 1);
    pid_t pid = fork();
    if (pid == 0) {
        shim_forked_child = 0;
        nodebudget_test_die_locked();
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECKF(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "child died holding the lock");
    struct nodebudget_audit a = audit();
    CHECKF(a.used == B / 4 && a.slot_sum == B / 4 && a.mine == B / 4,
           "lock recovered, total rebuilt from the slots (used %llu, want %llu)",
           (unsigned long long)a.used, (unsigned long long)(B / 4));
    CHECKF(nodebudget_reserve(3 * B / 4) == 1 && nodebudget_reserve(1) == 0,
           "and the budget is exact afterwards");
    nodebudget_release(B);
}

struct thread_arg { uint64_t B; unsigned seed; int bad; };

static void *thread_main(void *p)
{
    struct thread_arg *t = p;
    uint64_t held = 0;
    for (int i = 0; i < 3000; i++) {
        unsigned r = (unsigned)rand_r(&t->seed);
        if (r & 1 && held) {
            nodebudget_release(held);
            held = 0;
        } else if (!held) {
            size_t n = 4096 + (size_t)(r % (t->B / 3));
            if (nodebudget_reserve(n))
                held = n;
        }
    }
    nodebudget_release(held);
    return NULL;
}

static void test_threads(uint64_t B)
{
    pthread_t th[4];
    struct thread_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (struct thread_arg){ B, 77u + (unsigned)i, 0 };
        pthread_create(&th[i], NULL, thread_main, &args[i]);
    }
    int over = 0;
    for (int i = 0; i < 200; i++) {
        struct nodebudget_audit a = audit();
        over |= a.slot_sum > B || a.used != a.slot_sum;
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    struct nodebudget_audit a = audit();
    CHECKF(!over && a.used == 0 && a.mine == 0, "4 threads at random: never over, all returned");
}

/* A process reserving and releasing at random; after each reserve, the slots under the lock
 * must add up to at most the budget.  Exit 0, or 1 on a violation. */
static int stress_child(uint64_t B, int go_fd, unsigned seed, int forever)
{
    shim_forked_child = 0;
    char c;
    if (read(go_fd, &c, 1) < 0)
        return 2;
    uint64_t held = 0;
    int bad = 0;
    for (int i = 0; forever || i < 1500; i++) {
        unsigned r = (unsigned)rand_r(&seed);
        if ((r & 3) == 0 && held) {
            size_t n = held > 4096 ? (size_t)(r % held) + 1 : held;
            nodebudget_release(n);
            held -= n;
        } else {
            size_t n = 4096 + (size_t)(r % (B / 4));
            if (nodebudget_reserve(n)) {
                held += n;
                struct nodebudget_audit a = audit();
                if (a.slot_sum > B || a.used != a.slot_sum || a.mine != held) {
                    printf("FAIL stress child %d: slots %llu, used %llu, budget %llu, mine %llu/%llu\n",
                           (int)getpid(), (unsigned long long)a.slot_sum, (unsigned long long)a.used,
                           (unsigned long long)B, (unsigned long long)a.mine, (unsigned long long)held);
                    bad = 1;
                }
            }
        }
    }
    nodebudget_release(held);
    nodebudget_shutdown();
    return bad;
}

static void test_processes(uint64_t B)
{
    enum { N = 6 };
    int go[2];
    if (pipe(go) != 0)
        exit(2);
    pid_t pids[N + 1];
    for (int i = 0; i <= N; i++) {
        pids[i] = fork();
        if (pids[i] == 0) {
            close(go[1]);
            fflush(stdout);
            _exit(stress_child(B, go[0], 1000u + (unsigned)i * 7919u, i == N));
        }
    }
    close(go[0]);
    close(go[1]);   /* all start together */
    uint64_t t0 = now_ms();
    int over = 0, killed = 0;
    long audits = 0;
    for (;;) {
        struct nodebudget_audit a = audit();
        over |= a.slot_sum > B;
        audits++;
        if (!killed && now_ms() - t0 > 100) {
            kill(pids[N], SIGKILL);   /* maybe inside the lock: the next locker must recover */
            waitpid(pids[N], NULL, 0);
            killed = 1;
        }
        int running = 0;
        for (int i = 0; i < N; i++)
            if (pids[i] > 0) {
                int status;
                pid_t r = waitpid(pids[i], &status, WNOHANG);
                if (r == pids[i]) {
                    CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                           "stress process %d: sum of slots <= budget at every reserve", i);
                    pids[i] = 0;
                } else {
                    running = 1;
                }
            }
        if (!running && killed)
            break;
        sleep_ms(1);
    }
    CHECKF(!over, "the parent's %ld audits never saw the slots above the budget", audits);
    long ms = reserve_within(B, 3000);
    CHECKF(ms >= 0, "after all exit (one SIGKILLed), the whole budget is free again (%ld ms)", ms);
    struct nodebudget_audit a = audit();
    CHECKF(a.used == B && a.slot_sum == B && a.slots_used == 1, "only this process's slot is left");
    nodebudget_release(B);
}

static void test_stats_json(uint64_t B)
{
    /* What top/init.c does at start-up: the report reads the budget through this. */
    stats_set_node_budget_reader(nodebudget_usage);
    CHECK(nodebudget_reserve(B / 2) == 1);
    char path[] = "/tmp/pinshim-nb-stats-XXXXXX";
    int fd = mkstemp(path);
    stats_write_json(fd);
    char buf[1 << 16];
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    close(fd);
    unlink(path);
    buf[n > 0 ? n : 0] = '\0';
    char want[160];
    snprintf(want, sizeof want, "\"node_budget\":{\"bytes\":%llu,\"used_bytes\":%llu,\"mine_bytes\":%llu}",
             (unsigned long long)B, (unsigned long long)(B / 2), (unsigned long long)(B / 2));
    CHECKF(strstr(buf, want) != NULL, "stats JSON has %s", want);
    char path2[] = "/tmp/pinshim-nb-report-XXXXXX";
    fd = mkstemp(path2);
    stats_write_report(fd);
    n = pread(fd, buf, sizeof buf - 1, 0);
    close(fd);
    unlink(path2);
    buf[n > 0 ? n : 0] = '\0';
    CHECKF(strstr(buf, "node budget: ") && strstr(buf, "held on the node"), "report has the node budget line");
    nodebudget_release(B / 2);
}

static void test_shutdown(uint64_t B)
{
    CHECK(nodebudget_reserve(B / 3) == 1);
    nodebudget_shutdown();
    struct nodebudget_audit a = audit();
    CHECKF(a.used == 0 && a.slots_used == 0 && a.mine == 0, "shutdown clears this process's slot");
    CHECKF(nodebudget_reserve(1) == 0, "no reservations after shutdown");
    nodebudget_shutdown();   /* twice is harmless */
}

/* A segment of that name someone made readable by others: not trusted, one warning, and the
 * node budget becomes a per-process ceiling. */
static void test_fallback(uint64_t B)
{
    char name[64];
    snprintf(name, sizeof name, "/pinshim-%u-%llu", (unsigned)getuid(), (unsigned long long)B);
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0644);
    CHECK(fd >= 0);
    if (fd < 0)
        return;
    fchmod(fd, 0644);
    close(fd);
    snprintf(created[ncreated++], sizeof created[0], "%s", name);

    int log_pipe[2];
    if (pipe(log_pipe) != 0)
        exit(2);
    log_set_fd(log_pipe[1]);
    shim_cfg.node_budget = B;
    int r1 = nodebudget_reserve(B / 2);
    int r2 = nodebudget_reserve(B / 2);
    int r3 = nodebudget_reserve(1);
    log_set_fd(2);
    close(log_pipe[1]);
    char buf[2048];
    ssize_t n = read(log_pipe[0], buf, sizeof buf - 1);
    close(log_pipe[0]);
    buf[n > 0 ? n : 0] = '\0';
    int lines = 0;
    for (char *p = buf; (p = strchr(p, '\n')); p++)
        lines++;
    CHECKF(lines == 1 && strstr(buf, "PINSHIM_NODE_BUDGET:") && strstr(buf, "per-process ceiling"),
           "one warning naming the setting and the fallback: %s", buf);
    CHECKF(r1 && r2 && !r3, "fallback: the node budget is still a ceiling for this process");
    struct nodebudget_audit a;
    CHECK(nodebudget_audit(&a) == 1);
    uint64_t b, used, mine;
    nodebudget_usage(&b, &used, &mine);
    CHECK(b == B && mine == B);
    nodebudget_release(B);
    CHECK(nodebudget_reserve(B) == 1);
    nodebudget_release(B);
}

int main(void)
{
    /* Page multiples, distinct per run and per test. */
    uint64_t base = 64 * M + ((uint64_t)getpid() % 4096) * 4 * 4096;
    shim_cfg.log_level = 0;

    test_no_budget();
    test_arithmetic(base);
    test_permissions();
    test_reclaim(base, 1);
    test_reclaim(base, 0);
    test_pid_reuse(base);
    test_fork_child_noop(base);
    test_owner_died(base);
    test_threads(base);
    test_stats_json(base);
    use_budget(base + 4096);
    test_processes(base + 4096);
    test_shutdown(base + 4096);
    test_fallback(base + 2 * 4096);
    test_shim_threads(base + 3 * 4096);
    use_budget(base);
    CHECKF(nodebudget_reserve(1) == 1 && audit().used == 1, "a budget change re-attaches");
    nodebudget_release(1);

    shim_cfg.node_budget = 0;
    for (int i = 0; i < ncreated; i++)
        shm_unlink(created[i]);
    return TEST_SUMMARY();
}
