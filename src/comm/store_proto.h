/* The rendezvous store's wire format (docs/comm.md describes it). Internal to src/comm. */
#ifndef TD_COMM_STORE_PROTO_H
#define TD_COMM_STORE_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "tandem/comm.h"

#define TD_STORE_MAGIC_HELLO 0x31534454u /* "TDS1" little-endian */
#define TD_STORE_MAGIC_REQ   0x52534454u /* "TDSR" */
#define TD_STORE_MAGIC_RESP  0x41534454u /* "TDSA" */
#define TD_STORE_VERSION     1
#define TD_STORE_NONCE_BYTES 32
#define TD_STORE_MAC_BYTES   32

#define TD_STORE_MAX_KEY 4096u
/* The largest value a request may carry: a bigger frame is a protocol violation and drops the
 * connection. It is also the default limit per value (td__store_limits), which the server may
 * lower; 64 MiB before the store had a total bound (see td__store_limits_default). */
#define TD_STORE_MAX_VALUE     (16u << 20)
#define TD_STORE_MAX_WAIT_BLOB (1u << 20)

/* hello.flags: the server is at its limit of authenticated connections and closes this one at
 * once; the nonce's first 4 bytes hold that limit. A client may try again later. */
#define TD_STORE_HELLO_FULL 1u

/* auth_reply.status */
enum {
    TD_STORE_AUTH_OK = 0,
    TD_STORE_AUTH_REFUSED = 1, /* wrong token */
    TD_STORE_AUTH_FULL = 2,    /* at the connection limit (mac's first 4 bytes: the limit) */
};

enum {
    TD_STORE_OP_SET = 1,
    TD_STORE_OP_GET = 2,
    TD_STORE_OP_ADD = 3,
    TD_STORE_OP_WAIT = 4,
    TD_STORE_OP_CAS = 5,
    TD_STORE_OP_DELETE = 6,
};

/* Response status codes (wire values, not td_status). */
enum {
    TD_STORE_R_OK = 0,
    TD_STORE_R_NOTFOUND = 1,
    TD_STORE_R_TIMEOUT = 2,
    TD_STORE_R_INVALID = 3,
    /* Over one of the server's limits; nothing changed. num: which (TD_STORE_LIMIT_*), data: a
     * sentence naming the limit and its value. Clients of protocol version 1 that predate it
     * report "failed with code 4". */
    TD_STORE_R_LIMIT = 4,
};

enum {
    TD_STORE_LIMIT_KEYS = 1,    /* number of keys */
    TD_STORE_LIMIT_BYTES = 2,   /* bytes of keys and values */
    TD_STORE_LIMIT_VALUE = 3,   /* one value */
    TD_STORE_LIMIT_WAITING = 4, /* bytes of parked requests (GET with a timeout, WAIT) */
};

#define TD_STORE_CAS_EXPECT_ABSENT 1u

/* All integers little-endian; structs are packed so their bytes are the wire bytes. */
typedef struct __attribute__((packed)) {
    uint32_t magic;
    uint16_t version;
    uint16_t flags; /* TD_STORE_HELLO_FULL; 0 otherwise */
    uint8_t nonce[TD_STORE_NONCE_BYTES];
} td_store_hello; /* server -> client, 40 bytes */

typedef struct __attribute__((packed)) {
    uint32_t magic;
    uint16_t version;
    uint16_t reserved;
    uint8_t nonce[TD_STORE_NONCE_BYTES];
    uint8_t mac[TD_STORE_MAC_BYTES];
} td_store_auth; /* client -> server, 72 bytes */

typedef struct __attribute__((packed)) {
    uint32_t status; /* TD_STORE_AUTH_* */
    uint8_t mac[TD_STORE_MAC_BYTES];
} td_store_auth_reply; /* server -> client, 36 bytes */

typedef struct __attribute__((packed)) {
    uint32_t magic;
    uint8_t op;
    uint8_t flags;
    uint16_t reserved;
    uint32_t key_len;
    uint32_t reserved2;
    uint64_t a_len;
    uint64_t b_len;
    int64_t arg; /* GET/WAIT: timeout in ms (0 = don't wait); ADD: delta */
} td_store_req;  /* 40 bytes, then key, a, b */

typedef struct __attribute__((packed)) {
    uint32_t magic;
    uint32_t status;
    uint64_t len; /* bytes of data that follow */
    int64_t num;  /* ADD: the new value; DELETE: existed; CAS: bit0 = a value is stored */
} td_store_resp;  /* 24 bytes, then data */

/* MACs over the two nonces, keyed by the job token; the label keeps the two directions apart. */
void td__store_mac(const char *token, const char *label, const uint8_t *n1, const uint8_t *n2,
                   uint8_t out[TD_STORE_MAC_BYTES]);
int td__store_mac_equal(const uint8_t *a, const uint8_t *b);
/* Fills buf with random bytes from the kernel; 0 on success. */
int td__random_bytes(void *buf, size_t nbytes);

/* Test hooks: how long a connection may take to authenticate or to finish a frame it started
 * (also: how long unsent replies may sit without the client reading any of them). */
void td__store_server_set_deadlines(td_store_server_t *srv, int handshake_ms, int frame_ms);

/* Everything a client can make the server hold (issue 8). The server's memory stays below about
 * max_bytes + max_keys * 100 + max_request_bytes + max_waiting_bytes + max_value_bytes (the copy
 * a SET makes) + (max_conns + max_pending) * 512 bytes: about 230 MiB with the defaults. */
typedef struct {
    size_t max_keys;          /* keys stored */
    size_t max_bytes;         /* bytes of keys and values stored (values still being sent count) */
    size_t max_value_bytes;   /* one value, at most TD_STORE_MAX_VALUE */
    size_t max_conns;         /* authenticated connections; more are closed at once */
    size_t max_pending;       /* connections still authenticating: past it the oldest goes if
                               * it had 1/10 of the handshake deadline, else the new one */
    size_t max_request_bytes; /* request bodies being received, all connections: more wait */
    size_t max_waiting_bytes; /* parked GET/WAIT requests and their unsent timeout replies */
} td__store_limits;

void td__store_limits_default(td__store_limits *limits);
/* Test hook, like td__store_server_set_deadlines: call before clients connect. */
void td__store_server_set_limits(td_store_server_t *srv, const td__store_limits *limits);

#endif
