/* The data port's add messages in C: parse an AddBatch and encode an AddBatchResponse
 * (bkspark/proto/bookie.proto) straight from and to protobuf wire bytes, so a batch of adds
 * costs no Python object per entry; and, for the client, frame and encode the AddBatch
 * elements of a batch of entries.  Pure C, no Python and no engine state.
 *
 * Parsing follows protobuf's rules for the fields it knows (the last value of a singular
 * field wins; a field with an unexpected wire type or number is skipped) and refuses what
 * cannot be protobuf at all: truncated varints or lengths, groups, a length past the end.
 */
#ifndef BKS_ADDFRAME_H
#define BKS_ADDFRAME_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int64_t ledger, entry; /* as sent: negative ids are refused by the caller */
    const unsigned char *key;
    size_t keylen;
    uint32_t flags;
    const unsigned char *body; /* points into the parsed buffer */
    size_t len;
    uint64_t request_id;
} WireAdd;

/* Parse an AddBatch message of n bytes; *out is malloc'ed (free() it, also on error).
 * Returns the number of adds, or -1 with *why naming the defect. */
long af_parse_batch(const unsigned char *p, size_t n, WireAdd **out, const char **why);

/* Below this an AddRequest cannot even hold its master key (tag, length, 20 bytes): no
 * client sends one. (A longer invalid add is answered EBADREQ on its own.) */
#define AF_MIN_ADD_BYTES (2 + 20)

/* Walk an AddBatch's top-level fields without decoding an add or allocating: the number of
 * adds, or -1 with *why when the message is not protobuf, holds an add shorter than
 * AF_MIN_ADD_BYTES (a message of empty adds cost the bookie ~400x its size before), or more
 * than max_adds adds. What the bookie spends on an add it answers is then bounded by ~20x
 * the add's size and by max_adds a message. */
long af_scan_batch(const unsigned char *p, size_t n, long max_adds, const char **why);

/* Upper bound of the bytes af_put_response writes for a message of msglen (< 2 MiB) bytes:
 * tag, length, four fields of at most 11 bytes, the message's tag, length and text. */
#define AF_RESPONSE_MAX(msglen) (1 + 3 + 4 * 11 + 1 + 3 + (msglen))

/* Append one AddBatchResponse.responses element (an AddResponse) at dst; return the bytes
 * written.  Zero status and request id are omitted (proto3 defaults); ids are always sent. */
size_t af_put_response(unsigned char *dst, int status, int64_t ledger, int64_t entry, uint64_t request_id,
                       const char *msg, size_t msglen);

/* The client's side: one AddBatch.adds element (tag, length, AddRequest) for an entry.
 * prefix holds the AddRequest's per-ledger fields already encoded (ledger id, master key);
 * the request's body is the entry as bookies store it: the 32-byte big-endian header (ledger,
 * entry, lac, cumulative length), the digest (AF_DIGEST_CRC32C: 4 bytes of CRC-32C over
 * header and payload, big-endian; AF_DIGEST_NONE: none) and the payload. */
enum { AF_DIGEST_NONE = 0, AF_DIGEST_CRC32C = 4 };

/* bytes af_put_add writes (entry >= 0) */
size_t af_add_size(size_t prefix_len, int64_t entry, int digest, size_t payload_len);

/* write the element at dst (af_add_size bytes); returns the bytes written */
size_t af_put_add(unsigned char *dst, const unsigned char *prefix, size_t prefix_len, int64_t ledger,
                  int64_t entry, int64_t lac, int64_t length, int digest, const unsigned char *payload,
                  size_t payload_len);

#endif
