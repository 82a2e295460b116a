/* AddBatch parsing and AddBatchResponse encoding on protobuf wire bytes (see addframe.h). */
#include "addframe.h"
#include "crc32c.h"

#include <stdlib.h>
#include <string.h>

enum { WT_VARINT = 0, WT_I64 = 1, WT_LEN = 2, WT_I32 = 5 };

static int get_varint(const unsigned char **pp, const unsigned char *end, uint64_t *v)
{
    const unsigned char *p = *pp;
    uint64_t r = 0;
    for (int shift = 0; shift < 70 && p < end; shift += 7) {
        unsigned char b = *p++;
        r |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) {
            *pp = p;
            *v = r;
            return 0;
        }
    }
    return -1;
}

/* skip a field's value of wire type wt; a WT_LEN value is returned in val and vlen */
static int field_value(const unsigned char **pp, const unsigned char *end, int wt, uint64_t *num,
                       const unsigned char **val, size_t *vlen, const char **why)
{
    switch (wt) {
    case WT_VARINT:
        if (get_varint(pp, end, num) < 0) {
            *why = "truncated or overlong varint";
            return -1;
        }
        return 0;
    case WT_I64:
    case WT_I32: {
        size_t k = wt == WT_I64 ? 8 : 4;
        if ((size_t)(end - *pp) < k) {
            *why = "truncated fixed-width field";
            return -1;
        }
        *pp += k;
        return 0;
    }
    case WT_LEN: {
        uint64_t n;
        if (get_varint(pp, end, &n) < 0 || n > (uint64_t)(end - *pp)) {
            *why = "length-delimited field runs past the end of its message";
            return -1;
        }
        *val = *pp;
        *vlen = (size_t)n;
        *pp += n;
        return 0;
    }
    default:
        *why = "unsupported wire type (groups are not used by this protocol)";
        return -1;
    }
}

typedef struct {
    uint64_t tag, num;        /* num: a varint field's value */
    const unsigned char *val; /* a length-delimited field's bytes */
    size_t vlen;
} Field;

/* read the next field's tag and value */
static int next_field(const unsigned char **pp, const unsigned char *end, Field *f, const char **why)
{
    const unsigned char *start = *pp;
    f->num = 0;
    f->val = NULL;
    f->vlen = 0;
    if (get_varint(pp, end, &f->tag) < 0) {
        *why = "truncated field tag";
        return -1;
    }
    /* as protobuf: no field 0, a tag of 32 bits in at most 5 bytes */
    if ((f->tag >> 3) == 0 || f->tag > 0xFFFFFFFFu || *pp - start > 5) {
        *why = "invalid field number";
        return -1;
    }
    return field_value(pp, end, (int)(f->tag & 7), &f->num, &f->val, &f->vlen, why);
}

static int parse_add(const unsigned char *p, size_t n, WireAdd *a, const char **why)
{
    const unsigned char *end = p + n;
    memset(a, 0, sizeof *a);
    a->key = a->body = (const unsigned char *)"";
    while (p < end) {
        Field f;
        if (next_field(&p, end, &f, why) < 0)
            return -1;
        switch (f.tag) {
        case (1 << 3) | WT_VARINT: a->ledger = (int64_t)f.num; break;
        case (2 << 3) | WT_VARINT: a->entry = (int64_t)f.num; break;
        case (3 << 3) | WT_LEN: a->key = f.val; a->keylen = f.vlen; break;
        case (4 << 3) | WT_VARINT: a->flags = (uint32_t)f.num; break;
        case (5 << 3) | WT_LEN: a->body = f.val; a->len = f.vlen; break;
        case (6 << 3) | WT_VARINT: a->request_id = f.num; break;
        default: break; /* unknown field (or a known one with another wire type): skipped */
        }
    }
    return 0;
}

/* the next AddBatch.adds element at *pp, parsed into *a: 1, or 0 at the end, -1 with *why */
static int next_add(const unsigned char **pp, const unsigned char *end, WireAdd *a, size_t *len,
                    const char **why)
{
    while (*pp < end) {
        Field f;
        if (next_field(pp, end, &f, why) < 0)
            return -1;
        if (f.tag != ((1 << 3) | WT_LEN))
            continue;
        *len = f.vlen;
        return parse_add(f.val, f.vlen, a, why) < 0 ? -1 : 1;
    }
    return 0;
}

long af_parse_batch(const unsigned char *p, size_t n, WireAdd **out, const char **why)
{
    const unsigned char *end = p + n;
    size_t count = 0, cap = 0, len;
    WireAdd *adds = NULL, add;
    int rc;
    *out = NULL;
    while ((rc = next_add(&p, end, &add, &len, why)) > 0) {
        if (count == cap) {
            cap = cap ? cap * 2 : 64;
            WireAdd *grown = realloc(adds, cap * sizeof *adds);
            if (!grown) {
                *why = "out of memory";
                return -1;
            }
            *out = adds = grown;
        }
        adds[count++] = add;
    }
    return rc < 0 ? -1 : (long)count;
}

long af_scan_batch(const unsigned char *p, size_t n, long max_adds, const char **why)
{
    const unsigned char *end = p + n;
    long count = 0;
    size_t len;
    WireAdd add; /* each add parses (no allocation): what passes here, add_batch parses */
    int rc;
    while ((rc = next_add(&p, end, &add, &len, why)) > 0) {
        if (len < AF_MIN_ADD_BYTES) {
            *why = "an add too short to hold a master key";
            return -1;
        }
        if (++count > max_adds) {
            *why = "more adds than max_adds_per_message";
            return -1;
        }
    }
    return rc < 0 ? -1 : count;
}

static unsigned char *put_varint(unsigned char *d, uint64_t v)
{
    while (v >= 0x80) {
        *d++ = (unsigned char)(v | 0x80);
        v >>= 7;
    }
    *d++ = (unsigned char)v;
    return d;
}

static size_t varint_size(uint64_t v)
{
    size_t k = 1;
    while (v >= 0x80) {
        v >>= 7;
        k++;
    }
    return k;
}

static unsigned char *put_be64(unsigned char *d, uint64_t v)
{
    for (int i = 7; i >= 0; i--)
        *d++ = (unsigned char)(v >> (8 * i));
    return d;
}

/* the AddRequest's length: prefix, entry id (field 2), body (field 5) */
static size_t add_request_size(size_t prefix_len, int64_t entry, size_t body_len)
{
    return prefix_len + 1 + varint_size((uint64_t)entry) + 1 + varint_size(body_len) + body_len;
}

size_t af_add_size(size_t prefix_len, int64_t entry, int digest, size_t payload_len)
{
    size_t req = add_request_size(prefix_len, entry, 32 + (size_t)digest + payload_len);
    return 1 + varint_size(req) + req;
}

size_t af_put_add(unsigned char *dst, const unsigned char *prefix, size_t prefix_len, int64_t ledger,
                  int64_t entry, int64_t lac, int64_t length, int digest, const unsigned char *payload,
                  size_t payload_len)
{
    size_t body_len = 32 + (size_t)digest + payload_len;
    unsigned char *d = dst;
    *d++ = 0x0a;
    d = put_varint(d, add_request_size(prefix_len, entry, body_len));
    memcpy(d, prefix, prefix_len);
    d += prefix_len;
    *d++ = 0x10;
    d = put_varint(d, (uint64_t)entry);
    *d++ = 0x2a;
    d = put_varint(d, body_len);
    unsigned char *header = d;
    d = put_be64(d, (uint64_t)ledger);
    d = put_be64(d, (uint64_t)entry);
    d = put_be64(d, (uint64_t)lac);
    d = put_be64(d, (uint64_t)length);
    if (digest == AF_DIGEST_CRC32C) {
        uint32_t crc = bks_crc32c(bks_crc32c(0, header, 32), payload, payload_len);
        for (int i = 3; i >= 0; i--)
            *d++ = (unsigned char)(crc >> (8 * i));
    }
    memcpy(d, payload, payload_len);
    return (size_t)(d + payload_len - dst);
}

size_t af_put_response(unsigned char *dst, int status, int64_t ledger, int64_t entry, uint64_t request_id,
                       const char *msg, size_t msglen)
{
    unsigned char body[4 * 11], *b = body;
    if (status) {
        *b++ = 0x08;
        b = put_varint(b, (uint64_t)(int64_t)status);
    }
    *b++ = 0x10;
    b = put_varint(b, (uint64_t)ledger);
    *b++ = 0x18;
    b = put_varint(b, (uint64_t)entry);
    if (request_id) {
        *b++ = 0x20;
        b = put_varint(b, request_id);
    }
    size_t blen = (size_t)(b - body), total = blen;
    if (msglen) {
        unsigned char lenbuf[11];
        total += 1 + (size_t)(put_varint(lenbuf, msglen) - lenbuf) + msglen;
    }
    unsigned char *d = dst;
    *d++ = 0x0a;
    d = put_varint(d, total);
    memcpy(d, body, blen);
    d += blen;
    if (msglen) {
        *d++ = 0x2a;
        d = put_varint(d, msglen);
        memcpy(d, msg, msglen);
        d += msglen;
    }
    return (size_t)(d - dst);
}
