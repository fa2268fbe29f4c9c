/* rpc.c — msgpack-RPC message classification, parameter binding, writers. */
#include "rpc.h"

#include <stdio.h>
#include <string.h>

#include "utf8.h"

static bool obj_is_uint(const msgpack_object *o, uint64_t *v)
{
    if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        return false;
    *v = o->via.u64;
    return true;
}

int rpc_parse(const msgpack_object *o, struct rpc_msg *m, const char **why)
{
    const char *dummy;
    uint64_t type, id;

    if (!why)
        why = &dummy;
    memset(m, 0, sizeof(*m));
    if (o->type != MSGPACK_OBJECT_ARRAY) {
        *why = "message is not an array";
        return -1;
    }
    const msgpack_object *a = o->via.array.ptr;
    uint32_t n = o->via.array.size;
    if (n < 3 || n > 4 || !obj_is_uint(&a[0], &type) || type > RPC_NOTIFY) {
        *why = "message is not [type, ...] with type 0, 1 or 2";
        return -1;
    }
    m->type = (enum rpc_type)type;
    if (m->type == RPC_NOTIFY) {
        if (n != 3) {
            *why = "notification must be [2, method, params]";
            return -1;
        }
        if (a[1].type != MSGPACK_OBJECT_STR) {
            *why = "notification method must be a string";
            return -1;
        }
        m->method = a[1].via.str.ptr;
        m->method_len = a[1].via.str.size;
        m->params = &a[2];
        return 0;
    }
    if (n != 4) {
        *why = m->type == RPC_REQUEST ? "request must be [0, msgid, method, params]"
                                      : "response must be [1, msgid, error, result]";
        return -1;
    }
    if (!obj_is_uint(&a[1], &id) || id > UINT32_MAX) {
        *why = "msgid must be an unsigned 32-bit integer";
        return -1;
    }
    m->msgid = (uint32_t)id;
    if (m->type == RPC_REQUEST) {
        if (a[2].type != MSGPACK_OBJECT_STR) {
            *why = "request method must be a string";
            return -1;
        }
        m->method = a[2].via.str.ptr;
        m->method_len = a[2].via.str.size;
        m->params = &a[3];
    } else {
        if (a[2].type != MSGPACK_OBJECT_NIL && a[2].type != MSGPACK_OBJECT_MAP) {
            *why = "response error must be nil or a map";
            return -1;
        }
        m->error = &a[2];
        m->result = &a[3];
    }
    return 0;
}

bool rpc_method_is(const struct rpc_msg *m, const char *name)
{
    size_t n = strlen(name);
    return m->method && m->method_len == n && memcmp(m->method, name, n) == 0;
}

bool rpc_str_is(const msgpack_object *o, const char *s)
{
    size_t n = strlen(s);
    return o && o->type == MSGPACK_OBJECT_STR && o->via.str.size == n &&
        memcmp(o->via.str.ptr, s, n) == 0;
}

int rpc_str_copy(const msgpack_object *o, char *buf, size_t cap)
{
    if (!o || o->type != MSGPACK_OBJECT_STR || o->via.str.size >= cap)
        return -1;
    memcpy(buf, o->via.str.ptr, o->via.str.size);
    buf[o->via.str.size] = '\0';
    return 0;
}

const msgpack_object *rpc_map_get(const msgpack_object *map, const char *key)
{
    if (!map || map->type != MSGPACK_OBJECT_MAP)
        return NULL;
    for (uint32_t i = 0; i < map->via.map.size; i++) {
        if (rpc_str_is(&map->via.map.ptr[i].key, key))
            return &map->via.map.ptr[i].val;
    }
    return NULL;
}

bool rpc_as_double(const msgpack_object *o, double *v)
{
    switch (o->type) {
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        *v = (double)o->via.u64;
        return true;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        *v = (double)o->via.i64;
        return true;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        *v = o->via.f64;
        return true;
    default:
        return false;
    }
}

const char *rpc_type_name(const msgpack_object *o)
{
    switch (o->type) {
    case MSGPACK_OBJECT_NIL:
        return "nil";
    case MSGPACK_OBJECT_BOOLEAN:
        return "boolean";
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        return "integer";
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        return "negative integer";
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        return "float";
    case MSGPACK_OBJECT_STR:
        return "string";
    case MSGPACK_OBJECT_BIN:
        return "binary";
    case MSGPACK_OBJECT_ARRAY:
        return "array";
    case MSGPACK_OBJECT_MAP:
        return "map";
    case MSGPACK_OBJECT_EXT:
        return "ext";
    default:
        return "unknown";
    }
}

static unsigned type_bit(const msgpack_object *o)
{
    switch (o->type) {
    case MSGPACK_OBJECT_NIL:
        return RPC_T_NIL;
    case MSGPACK_OBJECT_BOOLEAN:
        return RPC_T_BOOL;
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        return RPC_T_UINT;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        return RPC_T_INT;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        return RPC_T_FLOAT;
    case MSGPACK_OBJECT_STR:
        return RPC_T_STR;
    case MSGPACK_OBJECT_BIN:
        return RPC_T_BIN;
    case MSGPACK_OBJECT_ARRAY:
        return RPC_T_ARRAY;
    case MSGPACK_OBJECT_MAP:
        return RPC_T_MAP;
    default:
        return 0;
    }
}

/* Copies at most `max` bytes of the client's string s[0..n) into out[]
 * (max + 1 bytes) as printable UTF-8, for quoting it in an error message.
 * The message goes back as a msgpack str that clients decode as UTF-8, so a
 * name cut inside a multi-byte character or holding invalid bytes must not
 * make the reply undecodable: truncation stops at a character boundary and
 * invalid bytes and control characters become '?'. */
void rpc_quote_client_str(const char *s, size_t n, size_t max, char *out)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, o = 0;

    while (i < n) {
        size_t len = u[i] < 0x80 ? 1 : utf8_seq_len(u + i, u + n);
        bool printable = len > 1 || (len == 1 && u[i] >= 0x20 && u[i] != 0x7f);
        size_t out_len = printable ? len : 1;

        if (o + out_len > max)
            break;
        if (printable)
            memcpy(out + o, s + i, len);
        else
            out[o] = '?';
        o += out_len;
        i += len ? len : 1;
    }
    out[o] = '\0';
}

int rpc_check_ident(const char *what, const char *s, size_t n, size_t max, char *why, size_t whylen)
{
    if (n >= 1 && n <= max && !memchr(s, '\0', n) && utf8_valid_prefix(s, n) == n)
        return 0;
    snprintf(why, whylen, "%s: expected 1 to %zu bytes of UTF-8 without NUL", what, max);
    return -1;
}

int rpc_ident_copy(const char *what, const msgpack_object *o, char *buf, size_t cap, char *why,
                   size_t whylen)
{
    if (rpc_check_ident(what, o->via.str.ptr, o->via.str.size, cap - 1, why, whylen) < 0)
        return -1;
    return rpc_str_copy(o, buf, cap);
}

const char *rpc_types_wanted(unsigned t)
{
    if ((t & ~RPC_T_NIL) == RPC_T_NUMBER)
        return "number";
    if ((t & ~RPC_T_NIL) == (RPC_T_UINT | RPC_T_FLOAT))
        return "non-negative number";
    if (t & RPC_T_STR)
        return "string";
    if (t & RPC_T_MAP)
        return "map";
    if (t & RPC_T_ARRAY)
        return "array";
    if (t & RPC_T_BOOL)
        return "boolean";
    if (t & RPC_T_UINT)
        return "non-negative integer";
    return "other type";
}

int rpc_bind(const msgpack_object *params, const struct rpc_param *spec, size_t n,
             const msgpack_object **out, char *why, size_t whylen)
{
    const msgpack_object *map = NULL;

    for (size_t i = 0; i < n; i++)
        out[i] = NULL;
    if (!params || params->type != MSGPACK_OBJECT_ARRAY || params->via.array.size > 1) {
        snprintf(why, whylen, "params must be an array holding one map of named parameters");
        return -1;
    }
    if (params->via.array.size == 1) {
        map = &params->via.array.ptr[0];
        if (map->type == MSGPACK_OBJECT_NIL) {
            map = NULL;
        } else if (map->type != MSGPACK_OBJECT_MAP) {
            snprintf(why, whylen, "params[0] must be a map of named parameters, got %s",
                     rpc_type_name(map));
            return -1;
        }
    }
    for (uint32_t k = 0; map && k < map->via.map.size; k++) {
        const msgpack_object *key = &map->via.map.ptr[k].key;
        const msgpack_object *val = &map->via.map.ptr[k].val;
        size_t i;

        if (key->type != MSGPACK_OBJECT_STR) {
            snprintf(why, whylen, "parameter names must be strings, got %s", rpc_type_name(key));
            return -1;
        }
        for (i = 0; i < n; i++) {
            if (rpc_str_is(key, spec[i].name))
                break;
        }
        if (i == n) {
            char name[65];
            rpc_quote_client_str(key->via.str.ptr, key->via.str.size, sizeof(name) - 1, name);
            snprintf(why, whylen, "unknown parameter '%s'", name);
            return -1;
        }
        /* out[i] holds even a nil value until the end, so that a name given
         * twice is caught when its first value was nil. */
        if (out[i]) {
            snprintf(why, whylen, "parameter '%s' given twice", spec[i].name);
            return -1;
        }
        if (!(type_bit(val) & spec[i].types)) {
            snprintf(why, whylen, "parameter '%s': expected %s, got %s", spec[i].name,
                     rpc_types_wanted(spec[i].types), rpc_type_name(val));
            return -1;
        }
        out[i] = val;
    }
    for (size_t i = 0; i < n; i++) {
        if (out[i] && out[i]->type == MSGPACK_OBJECT_NIL)
            out[i] = NULL;
        if (spec[i].required && !out[i]) {
            snprintf(why, whylen, "missing required parameter '%s'", spec[i].name);
            return -1;
        }
    }
    return 0;
}

/* s[0..n), which is not valid UTF-8, with each maximal invalid subpart
 * replaced by U+FFFD (as utf8_repair, without a copy): packs the pieces
 * when `pk` is not NULL; returns their total length. */
static size_t pack_repaired(msgpack_packer *pk, const char *s, size_t n)
{
    static const char fffd[3] = { (char)0xEF, (char)0xBF, (char)0xBD };
    const unsigned char *u = (const unsigned char *)s;
    size_t out = 0;

    for (size_t i = 0, ok; i < n; i += ok ? ok : utf8_bad_len(u + i, u + n)) {
        ok = utf8_valid_prefix(s + i, n - i);
        if (pk)
            msgpack_pack_str_body(pk, ok ? s + i : fffd, ok ? ok : sizeof(fffd));
        out += ok ? ok : sizeof(fffd);
    }
    return out;
}

void rpc_pack_strn(msgpack_packer *pk, const char *s, size_t n)
{
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

void rpc_pack_text(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);

    if (utf8_valid_prefix(s, n) == n) {
        rpc_pack_strn(pk, s, n);
        return;
    }
    msgpack_pack_str(pk, pack_repaired(NULL, s, n));
    pack_repaired(pk, s, n);
}

void rpc_pack_kv_text(msgpack_packer *pk, const char *key, const char *val)
{
    rpc_pack_str(pk, key);
    rpc_pack_text(pk, val);
}

void rpc_pack_str(msgpack_packer *pk, const char *s)
{
    rpc_pack_strn(pk, s, strlen(s));
}

void rpc_pack_kv_str(msgpack_packer *pk, const char *key, const char *val)
{
    rpc_pack_str(pk, key);
    rpc_pack_str(pk, val);
}

void rpc_pack_kv_u64(msgpack_packer *pk, const char *key, uint64_t val)
{
    rpc_pack_str(pk, key);
    msgpack_pack_uint64(pk, val);
}

void rpc_pack_kv_double(msgpack_packer *pk, const char *key, double val)
{
    rpc_pack_str(pk, key);
    msgpack_pack_double(pk, val);
}

void rpc_pack_request_begin(msgpack_packer *pk, uint32_t msgid, const char *method)
{
    msgpack_pack_array(pk, 4);
    msgpack_pack_uint8(pk, RPC_REQUEST);
    msgpack_pack_uint32(pk, msgid);
    rpc_pack_str(pk, method);
}

void rpc_pack_result_begin(msgpack_packer *pk, uint32_t msgid)
{
    msgpack_pack_array(pk, 4);
    msgpack_pack_uint8(pk, RPC_RESPONSE);
    msgpack_pack_uint32(pk, msgid);
    msgpack_pack_nil(pk);
}

void rpc_pack_error_map(msgpack_packer *pk, enum pgw_code code, const char *message, size_t n_extra)
{
    msgpack_pack_map(pk, 2 + n_extra);
    rpc_pack_str(pk, "code");
    rpc_pack_str(pk, pgw_code_name(code));
    rpc_pack_str(pk, "message");
    rpc_pack_text(pk, message);
}

void rpc_pack_error_begin(msgpack_packer *pk, uint32_t msgid, enum pgw_code code,
                          const char *message, size_t n_extra)
{
    msgpack_pack_array(pk, 4);
    msgpack_pack_uint8(pk, RPC_RESPONSE);
    msgpack_pack_uint32(pk, msgid);
    rpc_pack_error_map(pk, code, message, n_extra);
}

void rpc_pack_error_end(msgpack_packer *pk)
{
    msgpack_pack_nil(pk);
}

void rpc_pack_error(msgpack_packer *pk, uint32_t msgid, enum pgw_code code, const char *message)
{
    rpc_pack_error_begin(pk, msgid, code, message, 0);
    rpc_pack_error_end(pk);
}

void rpc_pack_notify_begin(msgpack_packer *pk, const char *method)
{
    msgpack_pack_array(pk, 3);
    msgpack_pack_uint8(pk, RPC_NOTIFY);
    rpc_pack_str(pk, method);
}

void rpc_pack_fatal(msgpack_packer *pk, enum pgw_code code, const char *message)
{
    rpc_pack_notify_begin(pk, "error");
    msgpack_pack_array(pk, 1);
    rpc_pack_error_map(pk, code, message, 0);
}

int rpc_check_messages(const char *p, size_t n, char *why, size_t whylen)
{
    msgpack_unpacked u;
    size_t off = 0;
    int rc = 0;

    msgpack_unpacked_init(&u);
    while (off < n && rc == 0) {
        size_t at = off;
        msgpack_unpack_return r = msgpack_unpack_next(&u, p, n, &off);
        const msgpack_object *o = &u.data;
        if (r != MSGPACK_UNPACK_SUCCESS && r != MSGPACK_UNPACK_EXTRA_BYTES) {
            if (why && whylen)
                snprintf(why, whylen, "bytes %zu..%zu: not a whole msgpack object", at, n);
            rc = -1;
        } else if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size < 3 ||
                   o->via.array.size > 4 ||
                   o->via.array.ptr[0].type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
                   o->via.array.ptr[0].via.u64 > RPC_NOTIFY) {
            if (why && whylen)
                snprintf(why, whylen, "bytes %zu..%zu: a %s, not a message", at, off,
                         rpc_type_name(o));
            rc = -1;
        }
    }
    msgpack_unpacked_destroy(&u);
    return rc;
}
