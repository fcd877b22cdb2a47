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

#define TD_STORE_MAX_KEY       4096u
#define TD_STORE_MAX_VALUE     (64u << 20)
#define TD_STORE_MAX_WAIT_BLOB (1u << 20)

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
};

#define TD_STORE_CAS_EXPECT_ABSENT 1u

/* All integers little-endian; structs are packed so their bytes are the wire bytes. */
typedef struct __attribute__((packed)) {
    uint32_t magic;
    uint16_t version;
    uint16_t reserved;
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
    uint32_t status; /* 0 = accepted */
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

/* Test hooks: how long a connection may take to authenticate or to finish a frame it started. */
void td__store_server_set_deadlines(td_store_server_t *srv, int handshake_ms, int frame_ms);

#endif
