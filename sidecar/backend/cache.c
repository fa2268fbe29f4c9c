/*
 * cache.c — the response cache's memory tier (cache.h).
 *
 * Entries sit in a chained hash table (indexed by the key's first bytes:
 * the key is already a strong hash) and on one LRU list, most recently
 * used first. Every entry is one allocation: its header, then its records
 * serialized as [name len][name NUL][a len][a][b len][b] with 32-bit
 * lengths (name len 0: no name).
 * `bytes` counts whole allocations, so the cap bounds what the cache
 * really holds. Expired entries are freed when met (a lookup) or when LRU
 * eviction reaches them: an expired entry nobody asks for costs at most
 * its share of the cap.
 */
#include "cache.h"

#include "dlist.h"
#include "strbuf.h"

#include <ctype.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

struct cache_entry {
    struct cache_entry *prev, *next; /* LRU, most recent first */
    struct cache_entry *hnext;       /* bucket chain */
    struct cache_key key;
    double stored_at, expires_at;
    size_t size; /* the whole allocation */
    size_t len;  /* of data; its tags follow: capability NUL namespace NUL */
    char data[];
};

struct cache {
    struct cache_entry **buckets;
    size_t n_buckets; /* a power of two, or 0 */
    struct cache_entry *lru, *lru_tail;
    size_t max_bytes;
    struct cache_stats st;
};

struct cache_fill {
    struct strbuf buf;
    struct strbuf tags; /* capability NUL namespace NUL, or empty */
    size_t max_bytes;
    bool too_big;
};

/* ---- key ---------------------------------------------------------------- */

static void h_add(EVP_MD_CTX *md, char tag, const void *p, size_t n)
{
    uint64_t len = n;
    EVP_DigestUpdate(md, &tag, 1);
    EVP_DigestUpdate(md, &len, sizeof(len));
    if (n)
        EVP_DigestUpdate(md, p, n);
}

/* A container's tag and element count. */
static void h_count(EVP_MD_CTX *md, char tag, uint64_t n)
{
    EVP_DigestUpdate(md, &tag, 1);
    EVP_DigestUpdate(md, &n, sizeof(n));
}

static int kv_cmp(const void *a, const void *b)
{
    const msgpack_object_kv *x = a, *y = b;
    if (x->key.type != MSGPACK_OBJECT_STR || y->key.type != MSGPACK_OBJECT_STR)
        return (int)x->key.type - (int)y->key.type;
    size_t n =
        x->key.via.str.size < y->key.via.str.size ? x->key.via.str.size : y->key.via.str.size;
    int c = memcmp(x->key.via.str.ptr, y->key.via.str.ptr, n);
    if (c)
        return c;
    return x->key.via.str.size < y->key.via.str.size ? -1
        : x->key.via.str.size > y->key.via.str.size  ? 1
                                                     : 0;
}

static bool key_is(const msgpack_object *k, const char *s)
{
    size_t n = strlen(s);
    return k->type == MSGPACK_OBJECT_STR && k->via.str.size == n &&
        memcmp(k->via.str.ptr, s, n) == 0;
}

/* Members that do not change the answer (cache.h). */
static bool member_ignored(const msgpack_object *k)
{
    return key_is(k, "stream") || key_is(k, "stream_options") || key_is(k, "user");
}

static int hash_obj(EVP_MD_CTX *md, const msgpack_object *o, bool top)
{
    switch (o->type) {
    case MSGPACK_OBJECT_NIL:
        h_add(md, 'n', NULL, 0);
        return 0;
    case MSGPACK_OBJECT_BOOLEAN:
        h_add(md, o->via.boolean ? 't' : 'f', NULL, 0);
        return 0;
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        h_add(md, 'u', &o->via.u64, sizeof(o->via.u64));
        return 0;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        h_add(md, 'i', &o->via.i64, sizeof(o->via.i64));
        return 0;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        h_add(md, 'd', &o->via.f64, sizeof(o->via.f64));
        return 0;
    case MSGPACK_OBJECT_STR:
        h_add(md, 's', o->via.str.ptr, o->via.str.size);
        return 0;
    case MSGPACK_OBJECT_BIN:
        h_add(md, 'b', o->via.bin.ptr, o->via.bin.size);
        return 0;
    case MSGPACK_OBJECT_EXT:
        h_add(md, 'e', o->via.ext.ptr, o->via.ext.size);
        return 0;
    case MSGPACK_OBJECT_ARRAY:
        h_count(md, 'a', o->via.array.size);
        for (uint32_t i = 0; i < o->via.array.size; i++)
            if (hash_obj(md, &o->via.array.ptr[i], false) < 0)
                return -1;
        return 0;
    case MSGPACK_OBJECT_MAP: {
        uint32_t n = o->via.map.size;
        msgpack_object_kv *kv = n ? malloc(n * sizeof(*kv)) : NULL;
        if (n && !kv)
            return -1;
        if (n)
            memcpy(kv, o->via.map.ptr, n * sizeof(*kv));
        if (n > 1)
            qsort(kv, n, sizeof(*kv), kv_cmp);
        uint32_t kept = 0;
        for (uint32_t i = 0; i < n; i++)
            kept += !(top && member_ignored(&kv[i].key));
        h_count(md, 'm', kept);
        int rc = 0;
        for (uint32_t i = 0; i < n && rc == 0; i++) {
            if (top && member_ignored(&kv[i].key))
                continue;
            rc = hash_obj(md, &kv[i].key, false);
            if (rc == 0)
                rc = hash_obj(md, &kv[i].val, false);
        }
        free(kv);
        return rc;
    }
    }
    return -1;
}

int cache_key_make(struct cache_key *out, const char *ns, const char *capability, const char *model,
                   size_t model_len, unsigned form, const msgpack_object *body)
{
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    unsigned int n = 0;
    int rc = -1;

    if (!md)
        return -1;
    if (EVP_DigestInit_ex(md, EVP_sha256(), NULL) == 1) {
        h_add(md, 'N', ns, strlen(ns));
        h_add(md, 'C', capability, strlen(capability));
        h_add(md, 'M', model ? model : "", model ? model_len : 0);
        h_add(md, 'F', &form, sizeof(form));
        if (hash_obj(md, body, true) == 0 && EVP_DigestFinal_ex(md, out->h, &n) == 1 &&
            n == CACHE_KEY_BYTES)
            rc = 0;
    }
    EVP_MD_CTX_free(md);
    return rc;
}

/* ---- fill --------------------------------------------------------------- */

struct cache_fill *cache_fill_new(size_t max_bytes)
{
    struct cache_fill *f = calloc(1, sizeof(*f));
    if (!f)
        return NULL;
    strbuf_init(&f->buf);
    strbuf_init(&f->tags);
    f->max_bytes = max_bytes;
    return f;
}

int cache_fill_tag(struct cache_fill *f, const char *capability, const char *ns)
{
    strbuf_reset(&f->tags);
    if (strbuf_put(&f->tags, capability, strlen(capability) + 1) < 0 ||
        strbuf_put(&f->tags, ns, strlen(ns) + 1) < 0) {
        strbuf_reset(&f->tags);
        return -1;
    }
    return 0;
}

void cache_fill_free(struct cache_fill *f)
{
    if (!f)
        return;
    strbuf_fini(&f->buf);
    strbuf_fini(&f->tags);
    free(f);
}

static int fill_part(struct cache_fill *f, const char *p, size_t n)
{
    uint32_t len = (uint32_t)n;
    if (strbuf_put(&f->buf, &len, sizeof(len)) < 0)
        return -1;
    return strbuf_put(&f->buf, p, n);
}

int cache_fill_add(struct cache_fill *f, const char *name, const char *a, size_t a_len,
                   const char *b, size_t b_len)
{
    size_t name_len = name ? strlen(name) + 1 : 0; /* kept with its NUL */
    if (f->too_big)
        return -1;
    if (f->buf.len + name_len + a_len + b_len + 12 > f->max_bytes) {
        f->too_big = true;
        strbuf_fini(&f->buf);
        strbuf_init(&f->buf);
        return -1;
    }
    if (fill_part(f, name, name_len) < 0 || fill_part(f, a, a_len) < 0 ||
        fill_part(f, b, b_len) < 0) {
        f->too_big = true;
        return -1;
    }
    return 0;
}

void cache_key_hex(const struct cache_key *k, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < CACHE_KEY_BYTES; i++) {
        out[2 * i] = digits[k->h[i] >> 4];
        out[2 * i + 1] = digits[k->h[i] & 15];
    }
    out[2 * CACHE_KEY_BYTES] = '\0';
}

/* FNV-1a, 32 bits: a name's part of a shared name (cache.h). */
static uint32_t name_hash(const char *s)
{
    uint32_t h = 2166136261u;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

void cache_shared_name(const struct cache_key *k, const char *capability, const char *ns, char *out)
{
    char full[2 * CACHE_KEY_BYTES + 1];

    snprintf(out, 17, "%08x%08x", (unsigned)name_hash(capability), (unsigned)name_hash(ns));
    cache_key_hex(k, full);
    memcpy(out + 16, full, CACHE_SHARED_NAME_LEN - 16);
    out[CACHE_SHARED_NAME_LEN] = '\0';
}

void cache_shared_pattern(const char *capability, const char *ns, char *out)
{
    if (capability)
        snprintf(out, 9, "%08x", (unsigned)name_hash(capability));
    else
        memcpy(out, "????????", 9);
    if (ns)
        snprintf(out + 8, 9, "%08x", (unsigned)name_hash(ns));
    else if (capability)
        memcpy(out + 8, "????????", 9);
    memcpy(out + strlen(out), "*", 2);
}

const char *cache_fill_bytes(const struct cache_fill *f, size_t *len)
{
    *len = f->too_big ? 0 : f->buf.len;
    return f->buf.data;
}

/* Is data[0..len) a whole list of records: parts of [32-bit len][bytes]
 * in threes, each name empty or NUL-terminated? */
static bool records_ok(const char *data, size_t len)
{
    size_t pos = 0, part = 0;
    while (pos < len) {
        uint32_t n;
        if (len - pos < sizeof(n))
            return false;
        memcpy(&n, data + pos, sizeof(n));
        pos += sizeof(n);
        if (n > len - pos || (part % 3 == 0 && n && data[pos + n - 1] != '\0'))
            return false;
        pos += n;
        part++;
    }
    return part % 3 == 0 && part > 0;
}

struct cache_fill *cache_fill_from(const char *data, size_t len, size_t max_bytes)
{
    struct cache_fill *f;
    if (len > max_bytes || !records_ok(data, len) || !(f = cache_fill_new(max_bytes)))
        return NULL;
    if (strbuf_put(&f->buf, data, len) < 0) {
        cache_fill_free(f);
        return NULL;
    }
    return f;
}

/* ---- table -------------------------------------------------------------- */

static size_t bucket_of(const struct cache *c, const struct cache_key *k)
{
    uint64_t h;
    memcpy(&h, k->h, sizeof(h));
    return (size_t)h & (c->n_buckets - 1);
}

static struct cache_entry **slot_of(struct cache *c, const struct cache_key *k)
{
    struct cache_entry **p = &c->buckets[bucket_of(c, k)];
    while (*p && memcmp((*p)->key.h, k->h, CACHE_KEY_BYTES) != 0)
        p = &(*p)->hnext;
    return p;
}

static void entry_drop(struct cache *c, struct cache_entry *e)
{
    struct cache_entry **p = slot_of(c, &e->key);
    *p = e->hnext;
    DLIST_UNLINK_HT(c->lru, c->lru_tail, e, prev, next);
    c->st.bytes -= e->size;
    c->st.entries--;
    free(e);
}

static void evict_to(struct cache *c, size_t max_bytes)
{
    while (c->lru_tail && c->st.bytes > max_bytes) {
        entry_drop(c, c->lru_tail);
        c->st.evictions++;
    }
}

/* Doubles the table when it holds more entries than buckets. */
static int grow(struct cache *c)
{
    size_t n = c->n_buckets ? c->n_buckets * 2 : 64;
    struct cache_entry **b = calloc(n, sizeof(*b));
    if (!b)
        return -1;
    for (size_t i = 0; i < c->n_buckets; i++) {
        struct cache_entry *e = c->buckets[i], *next;
        for (; e; e = next) {
            next = e->hnext;
            uint64_t h;
            memcpy(&h, e->key.h, sizeof(h));
            size_t j = (size_t)h & (n - 1);
            e->hnext = b[j];
            b[j] = e;
        }
    }
    free(c->buckets);
    c->buckets = b;
    c->n_buckets = n;
    return 0;
}

struct cache *cache_new(size_t max_bytes)
{
    struct cache *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->max_bytes = max_bytes;
    if (grow(c) < 0) {
        free(c);
        return NULL;
    }
    return c;
}

void cache_purge(struct cache *c)
{
    while (c->lru)
        entry_drop(c, c->lru);
}

/* Does `e` carry the tags asked for (NULL: any)? An untagged entry
 * matches only a purge of everything. */
static bool entry_matches(const struct cache_entry *e, const char *capability, const char *ns)
{
    size_t tags = e->size - sizeof(*e) - e->len;
    const char *cap = e->data + e->len;

    if (!capability && !ns)
        return true;
    if (tags < 2)
        return false;
    const char *own_ns = cap + strlen(cap) + 1;
    return (!capability || strcmp(cap, capability) == 0) && (!ns || strcmp(own_ns, ns) == 0);
}

size_t cache_purge_match(struct cache *c, const char *capability, const char *ns)
{
    size_t n = 0;
    for (struct cache_entry *e = c->lru, *next; e; e = next) {
        next = e->next;
        if (entry_matches(e, capability, ns)) {
            entry_drop(c, e);
            n++;
        }
    }
    c->st.purged += n;
    return n;
}

void cache_free(struct cache *c)
{
    if (!c)
        return;
    cache_purge(c);
    free(c->buckets);
    free(c);
}

void cache_set_max_bytes(struct cache *c, size_t max_bytes)
{
    c->max_bytes = max_bytes;
    evict_to(c, max_bytes);
}

void cache_put(struct cache *c, const struct cache_key *k, struct cache_fill *f, double now,
               double expires_at)
{
    size_t size = sizeof(struct cache_entry) + f->buf.len + f->tags.len;
    struct cache_entry *e;

    if (f->too_big || size > c->max_bytes || !(e = malloc(size))) {
        c->st.too_big++;
        cache_fill_free(f);
        return;
    }
    struct cache_entry **p = slot_of(c, k);
    if (*p)
        entry_drop(c, *p);
    memset(e, 0, sizeof(*e));
    e->key = *k;
    e->stored_at = now;
    e->expires_at = expires_at;
    e->size = size;
    e->len = f->buf.len;
    if (f->buf.len)
        memcpy(e->data, f->buf.data, f->buf.len);
    if (f->tags.len)
        memcpy(e->data + f->buf.len, f->tags.data, f->tags.len);
    cache_fill_free(f);
    evict_to(c, c->max_bytes - size);
    if (c->st.entries >= c->n_buckets)
        grow(c); /* on failure the chains just get longer */
    p = &c->buckets[bucket_of(c, k)];
    e->hnext = *p;
    *p = e;
    DLIST_PUSH(c->lru, e, prev, next);
    if (!c->lru_tail)
        c->lru_tail = e;
    c->st.bytes += size;
    c->st.entries++;
    c->st.stores++;
}

const struct cache_entry *cache_get(struct cache *c, const struct cache_key *k, double now,
                                    double max_age_s)
{
    struct cache_entry *e = *slot_of(c, k);
    if (!e || (max_age_s >= 0 && now - e->stored_at > max_age_s))
        return NULL;
    if (now >= e->expires_at) {
        entry_drop(c, e);
        c->st.expired++;
        return NULL;
    }
    if (c->lru != e) {
        DLIST_UNLINK_HT(c->lru, c->lru_tail, e, prev, next);
        DLIST_PUSH(c->lru, e, prev, next);
        if (!c->lru_tail)
            c->lru_tail = e;
    }
    return e;
}

static const char *entry_part(const struct cache_entry *e, size_t *pos, size_t *n)
{
    uint32_t len;
    memcpy(&len, e->data + *pos, sizeof(len));
    *pos += sizeof(len);
    const char *p = e->data + *pos;
    *pos += len;
    *n = len;
    return p;
}

bool cache_entry_next(const struct cache_entry *e, size_t *pos, struct cache_rec *r)
{
    size_t name_len;
    if (*pos >= e->len)
        return false;
    const char *name = entry_part(e, pos, &name_len);
    r->name = name_len ? name : NULL;
    r->a = entry_part(e, pos, &r->a_len);
    r->b = entry_part(e, pos, &r->b_len);
    return true;
}

void cache_count(struct cache *c, enum cache_event ev)
{
    if (ev == CACHE_HIT)
        c->st.hits++;
    else if (ev == CACHE_MISS)
        c->st.misses++;
    else if (ev == CACHE_COALESCED)
        c->st.coalesced++;
    else
        c->st.bypasses++;
}

void cache_get_stats(const struct cache *c, struct cache_stats *out)
{
    *out = c->st;
}

/* ---- Cache-Control ------------------------------------------------------ */

/* Is `tok` one of the comma-separated directives of `v`? */
static bool directive(const char *v, const char *tok, const char **arg)
{
    size_t n = strlen(tok);
    for (const char *p = v; *p;) {
        while (*p == ' ' || *p == '\t' || *p == ',')
            p++;
        if (strncasecmp(p, tok, n) == 0 &&
            (p[n] == '\0' || p[n] == ',' || p[n] == ' ' || p[n] == '=' || p[n] == ';')) {
            if (arg)
                *arg = p[n] == '=' ? p + n + 1 : NULL;
            return true;
        }
        while (*p && *p != ',')
            p++;
    }
    return false;
}

double cache_upstream_ttl(const char *cc, double ttl_s)
{
    const char *arg = NULL;
    if (!cc || !*cc)
        return ttl_s;
    /* no-cache is not refusal: it asks a cache to revalidate, and
     * providers send it on every stream (to keep proxies from buffering). */
    if (directive(cc, "no-store", NULL) || directive(cc, "private", NULL))
        return 0;
    if (directive(cc, "s-maxage", &arg) || directive(cc, "max-age", &arg)) {
        if (!arg || !isdigit((unsigned char)*arg))
            return ttl_s;
        double age = strtod(arg, NULL);
        return age < ttl_s ? age : ttl_s;
    }
    return ttl_s;
}

int cache_parse_mode(const char *v, enum cache_mode *mode, bool *has_max_age, double *max_age_s)
{
    const char *arg = NULL;
    int known = 0;
    if (directive(v, "no-store", NULL))
        *mode = CACHE_NO_STORE, known = 1;
    else if (directive(v, "no-cache", NULL))
        *mode = CACHE_NO_CACHE, known = 1;
    if (directive(v, "max-age", &arg) && arg && isdigit((unsigned char)*arg)) {
        *has_max_age = true;
        *max_age_s = strtod(arg, NULL);
        known = 1;
    }
    return known ? 0 : -1;
}
