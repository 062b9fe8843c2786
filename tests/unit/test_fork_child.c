/* A fork can come while another thread is changing a block's registration: in the child that
 * thread is gone, so the child must not wait for it.  The child's start-up (forgetting every
 * registration and registration in progress) is driven directly here. */
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>
#include "base/config.h"
#include "mem/heap.h"
#include "mem/policy.h"
#include "base/real.h"
#include "base/shim.h"
#include "mem/table.h"
#include "testutil.h"

static void on_alarm(int sig)
{
    (void)sig;
    static const char msg[] = "FAIL the child's free() waited for a registration change that cannot end\n";
    if (write(1, msg, sizeof msg - 1) < 0)
        _exit(2);
    _exit(1);
}

int main(void)
{
    real_libc_resolve();
    shim_cfg.min_size = 64 << 10;
    shim_cfg.budget = 1ull << 30;
    heap_track_min = (size_t)shim_cfg.min_size;

    void *p = heap_alloc(1 << 20, 16, 0);
    CHECK(p != NULL);
    table_lock();
    struct block *b = table_find_base((uintptr_t)p);
    CHECK(b != NULL);
    /* As if another thread were inside cuMemHostRegister for it when the process forked. */
    b->reg_changing = 1;
    b->inflight = 1;
    table_unlock();

    shim_forked_child = 1;
    policy_forget_registrations();
    signal(SIGALRM, on_alarm);
    alarm(5);
    CHECK(heap_free(p) == 1);
    alarm(0);
    table_lock();
    CHECK(table_find_base((uintptr_t)p) == NULL);
    table_unlock();
    return TEST_SUMMARY();
}
