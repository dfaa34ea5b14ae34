/* Process-local record of what each allocation cost, so a free releases the bytes it reserved. */
#include "tessera.h"

#include <pthread.h>
#include <stdlib.h>

#define NBUCKETS 4096

struct entry {
    struct entry *next;
    uint64_t key, size;
    int kind;
};

static struct entry *buckets[NBUCKETS];
static pthread_mutex_t table_mu = PTHREAD_MUTEX_INITIALIZER;

static unsigned bucket_of(int kind, uint64_t key) {
    uint64_t h = (key ^ ((uint64_t)kind << 61)) * 0x9e3779b97f4a7c15ull;
    return (unsigned)(h >> 52) % NBUCKETS;
}

void alloc_track(enum alloc_kind kind, uint64_t key, uint64_t size) {
    struct entry *e = malloc(sizeof *e);
    if (!e) return;   /* the bytes stay counted: strict, never lenient */
    e->key = key;
    e->size = size;
    e->kind = kind;
    unsigned b = bucket_of(kind, key);
    pthread_mutex_lock(&table_mu);
    e->next = buckets[b];
    buckets[b] = e;
    pthread_mutex_unlock(&table_mu);
}

uint64_t alloc_untrack(enum alloc_kind kind, uint64_t key) {
    unsigned b = bucket_of(kind, key);
    uint64_t size = 0;
    struct entry *found = NULL;
    pthread_mutex_lock(&table_mu);
    for (struct entry **p = &buckets[b]; *p; p = &(*p)->next) {
        if ((*p)->key == key && (*p)->kind == (int)kind) {
            found = *p;
            *p = found->next;
            size = found->size;
            break;
        }
    }
    pthread_mutex_unlock(&table_mu);
    free(found);
    return size;
}

void alloc_fork_prepare(void) { pthread_mutex_lock(&table_mu); }
void alloc_fork_parent(void) { pthread_mutex_unlock(&table_mu); }

void alloc_after_fork_child(void) {
    /* device memory is not inherited across fork: the child starts with an empty record */
    for (unsigned i = 0; i < NBUCKETS; i++) {
        struct entry *e = buckets[i];
        while (e) {
            struct entry *next = e->next;
            free(e);
            e = next;
        }
        buckets[i] = NULL;
    }
    pthread_mutex_init(&table_mu, NULL);
}
