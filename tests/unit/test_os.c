/* The raw-OS layer's page population (os_populate), which faults a range in a piece at a time:
 * every page of the range resident afterwards, whatever the range's start, end and length
 * against the pieces; the pages outside it left alone; the contents kept; a range with a hole
 * refused (-1, errno set) like one madvise call over it.  A kernel before 5.14 has no
 * MADV_POPULATE_*: the test then checks that the refusal says EINVAL and stops there. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "base/os.h"
#include "base/shim.h"
#include "testutil.h"

#define M (1024ul * 1024ul)

static size_t resident_pages(const char *p, size_t n)
{
    return os_resident_bytes((uintptr_t)p, n) / SHIM_PAGE_SIZE;
}

int main(void)
{
    size_t pg = SHIM_PAGE_SIZE;
    /* A window of 16 MiB, populated in parts whose ends fall on and off the 2 MiB pieces. */
    size_t win = 16 * M;
    char *w = mmap(NULL, win, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECKF(w != MAP_FAILED, "a 16 MiB window mapped");
    if (w == MAP_FAILED)
        return TEST_SUMMARY();
    /* Page by page, so that "no page outside it" holds where huge pages are always on. */
    madvise(w, win, MADV_NOHUGEPAGE);
    if (os_populate(w, pg, MADV_POPULATE_WRITE) != 0) {
        CHECKF(errno == EINVAL, "a kernel without MADV_POPULATE_WRITE says EINVAL (errno %d)", errno);
        return TEST_SUMMARY();
    }
    static const struct { size_t off, len; } parts[] = {
        { 1 * M + 123, 5 * M + 17 },          /* odd start and end, across two pieces' bounds */
        { 8 * M, OS_POPULATE_PIECE },         /* exactly one piece */
        { 11 * M - 1, 2 },                    /* two bytes across a page boundary */
    };
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        char *p = w + parts[i].off;
        size_t before = resident_pages(w, win);
        CHECKF(os_populate(p, parts[i].len, MADV_POPULATE_WRITE) == 0, "part %zu populated", i);
        uintptr_t lo = page_down((uintptr_t)p), hi = page_up((uintptr_t)p + parts[i].len);
        size_t want = (hi - lo) / pg;
        CHECKF(resident_pages((char *)lo, hi - lo) == want, "part %zu: every page of it resident (%zu of %zu)", i,
               resident_pages((char *)lo, hi - lo), want);
        size_t after = resident_pages(w, win);
        CHECKF(after - before <= want, "part %zu: no page outside it faulted in (%zu more, it has %zu)", i,
               after - before, want);
    }
    /* Pages already written keep their contents. */
    memset(w + 12 * M, 0x5a, 3 * M);
    CHECKF(os_populate(w + 12 * M, 3 * M, MADV_POPULATE_WRITE) == 0, "a written range populated again");
    int kept = 1;
    for (size_t i = 0; i < 3 * M; i++)
        kept &= w[12 * M + i] == 0x5a;
    CHECKF(kept, "its contents kept");
    /* Reading populates too. */
    CHECKF(os_populate(w + 14 * M, M, MADV_POPULATE_READ) == 0, "a range populated for reading");

    /* A hole: refused, as one madvise over the range would be. */
    munmap(w + 4 * M, pg);
    errno = 0;
    CHECKF(os_populate(w + 3 * M, 2 * M, MADV_POPULATE_WRITE) == -1 && errno == ENOMEM,
           "a range with an unmapped page refused with ENOMEM (errno %d)", errno);
    munmap(w, win);
    return TEST_SUMMARY();
}
