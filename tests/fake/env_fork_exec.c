/* Processes made every way, under the shim (tests/check_hostile_env.sh).
 *   env_fork_exec child N: a CUDA-using child: N round trips of a hot buffer, data checked.
 *   env_fork_exec PIDFILE: the parent makes buffers hot (promoted under pin/full), then
 *     - fork: the child frees the promoted blocks, allocates more, and exits through exit();
 *     - fork + exec of `child`, vfork + exec of `child`, posix_spawn of `child`;
 *   waits for each (status 0 expected) and copies again.  It writes "parent PID" and one
 *   "exec PID N" line per exec'd child to PIDFILE, so the script can find each stats file
 *   and the copies that child issued.  stdout never depends on pids, the shim or its mode. */
#define _GNU_SOURCE
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include "drvtest.h"

extern char **environ;
static const size_t n = 4u << 20;
static CUdeviceptr dev;

static int child_main(int rounds)
{
    drvtest_init();
    unsigned char *buf = malloc(n), *back = malloc(n);
    CU(cuMemAlloc(&dev, n));
    int ok = 1;
    for (int i = 0; i < rounds; i++) {
        fill_pattern(buf, n, (unsigned)i + 40);
        CU(cuMemcpyHtoD(dev, buf, n));
        memset(back, 0, n);
        CU(cuMemcpyDtoH(back, dev, n));
        ok &= check_pattern(back, n, (unsigned)i + 40);
    }
    CU(cuMemFree(dev));
    free(buf);
    free(back);
    return ok ? 0 : 1;
}

static int wait_ok(pid_t pid)
{
    int status;
    if (pid < 0)
        return 0;
    while (waitpid(pid, &status, 0) < 0)
        ;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "child") == 0)
        return child_main(atoi(argv[2]));
    if (argc < 2) {
        fprintf(stderr, "usage: %s PIDFILE | child N\n", argv[0]);
        return 2;
    }
    FILE *pids = fopen(argv[1], "w");
    if (!pids)
        return 2;
    drvtest_init();
    CU(cuMemAlloc(&dev, n));
    unsigned char *a = malloc(n), *b = malloc(n), *back = malloc(n);
    for (int i = 0; i < 4; i++) {
        fill_pattern(a, n, 1);
        fill_pattern(b, n, 2);
        CU(cuMemcpyHtoD(dev, a, n));
        CU(cuMemcpyHtoD(dev, b, n));
    }
    fprintf(pids, "parent %d\n", (int)getpid());
    fflush(pids);

    /* fork: the child frees the promoted blocks, works with the heap, exits through exit(). */
    pid_t p = fork();
    if (p == 0) {
        int good = check_pattern(a, n, 1) && check_pattern(b, n, 2);
        free(a);
        free(b);
        for (int i = 0; i < 8; i++) {
            unsigned char *c = malloc(n);
            fill_pattern(c, n, (unsigned)i);
            good &= check_pattern(c, n, (unsigned)i);
            free(c);
        }
        exit(good ? 0 : 1);
    }
    CHECKF(wait_ok(p), "fork: the child frees promoted blocks and exits 0");

    char *const child_argv_fork[] = { argv[0], "child", "3", NULL };
    char *const child_argv_vfork[] = { argv[0], "child", "5", NULL };
    char *const child_argv_spawn[] = { argv[0], "child", "7", NULL };

    p = fork();
    if (p == 0) {
        execv("/proc/self/exe", child_argv_fork);
        _exit(127);
    }
    fprintf(pids, "exec %d 3\n", (int)p);
    fflush(pids);
    CHECKF(wait_ok(p), "fork + exec: the CUDA-using child exits 0");

    p = vfork();
    if (p == 0) {
        execv("/proc/self/exe", child_argv_vfork);
        _exit(127);
    }
    fprintf(pids, "exec %d 5\n", (int)p);
    fflush(pids);
    CHECKF(wait_ok(p), "vfork + exec: the CUDA-using child exits 0");

    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    self[len > 0 ? len : 0] = '\0';
    int rc = posix_spawn(&p, self, NULL, NULL, child_argv_spawn, environ);
    CHECKF(rc == 0, "posix_spawn starts the child");
    if (rc == 0) {
        fprintf(pids, "exec %d 7\n", (int)p);
        fflush(pids);
        CHECKF(wait_ok(p), "posix_spawn: the CUDA-using child exits 0");
    }
    fclose(pids);

    /* The parent carries on with its promoted buffers. */
    fill_pattern(a, n, 3);
    CU(cuMemcpyHtoD(dev, a, n));
    memset(back, 0, n);
    CU(cuMemcpyDtoH(back, dev, n));
    CHECKF(check_pattern(back, n, 3), "parent: data after the children");
    CU(cuMemFree(dev));
    free(a);
    free(b);
    free(back);
    return TEST_SUMMARY();
}
