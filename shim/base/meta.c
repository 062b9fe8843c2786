/* Records for the shim itself (see meta.h): power-of-two classes from 16 bytes to 64 KiB, each a
 * free list refilled from 1 MiB raw chunks; anything larger is a mapping of its own. */
#include <pthread.h>
#include <string.h>
#include "base/meta.h"
#include "base/os.h"
#include "base/shim.h"

#define META_MIN_SHIFT 4
#define META_MAX_SHIFT 16
#define META_CHUNK (1ul << 20)

struct meta_free_item { struct meta_free_item *next; };

static pthread_mutex_t meta_mu = PTHREAD_MUTEX_INITIALIZER;
static struct meta_free_item *free_lists[META_MAX_SHIFT + 1];
static char *chunk_next, *chunk_end;

static unsigned class_shift(size_t n)
{
    unsigned s = META_MIN_SHIFT;
    while (((size_t)1 << s) < n)
        s++;
    return s;
}

void *meta_alloc(size_t n)
{
    if (n == 0)
        n = 1;
    if (n > ((size_t)1 << META_MAX_SHIFT))
        return os_map(page_up(n));   /* zero-filled */
    unsigned s = class_shift(n);
    size_t size = (size_t)1 << s;
    void *p = NULL;
    pthread_mutex_lock(&meta_mu);
    if (free_lists[s]) {
        p = free_lists[s];
        free_lists[s] = free_lists[s]->next;
    } else {
        if ((size_t)(chunk_end - chunk_next) < size) {
            char *c = os_map(META_CHUNK);
            if (c) {
                chunk_next = c;
                chunk_end = c + META_CHUNK;
            }
        }
        if ((size_t)(chunk_end - chunk_next) >= size) {
            p = chunk_next;   /* fresh pages: already zero */
            chunk_next += size;
            pthread_mutex_unlock(&meta_mu);
            return p;
        }
    }
    pthread_mutex_unlock(&meta_mu);
    if (p)
        memset(p, 0, size);
    return p;
}

void meta_free(void *p, size_t n)
{
    if (!p)
        return;
    if (n == 0)
        n = 1;
    if (n > ((size_t)1 << META_MAX_SHIFT)) {
        os_unmap(p, page_up(n));
        return;
    }
    unsigned s = class_shift(n);
    struct meta_free_item *item = p;
    pthread_mutex_lock(&meta_mu);
    item->next = free_lists[s];
    free_lists[s] = item;
    pthread_mutex_unlock(&meta_mu);
}

void meta_before_fork(void) { pthread_mutex_lock(&meta_mu); }
void meta_after_fork_parent(void) { pthread_mutex_unlock(&meta_mu); }
void meta_after_fork_child(void) { pthread_mutex_init(&meta_mu, NULL); }
