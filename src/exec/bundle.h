/* The tandem bundle (bundle.c): this tandem as a new machine can run it without building it.
 * A fresh instance image has no tandem, and the binary is linked dynamically to libraries such
 * an image lacks (OpenBLAS, libcurl, SQLite, jansson, expat, nettle, libyaml, libmicrohttpd,
 * libgomp...). The bundle holds the running binary, every shared library it has loaded except
 * those that the target's glibc provides (the C library, its loader, libm, libpthread, libdl,
 * librt, libresolv, ...), the Python SDK and a manifest (arch, the glibc version it needs, each
 * file's SHA-256). It is made once per binary and cached under the user's cache directory, sent
 * over the ssh link the carrier already opens, unpacked into a versioned directory of the host
 * (~/.cache/tandem/bundles/KEY) and run there through a wrapper that puts the bundled libraries
 * first (LD_LIBRARY_PATH) and the SDK on PYTHONPATH. docs/cloud.md ("Shipping tandem") says
 * what the user sees; tests/cloud/test_aws_ship.sh checks it. */
#ifndef TANDEM_EXEC_BUNDLE_H
#define TANDEM_EXEC_BUNDLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tandem/core.h"

typedef struct {
    char key[65];          /* names the bundle in the cache and on a host (hex, 16 digits) */
    char exe_sha256[65];   /* the binary's */
    char os[16];           /* uname -s of this machine: "Linux" */
    char arch[32];         /* uname -m: "x86_64", "aarch64" */
    char glibc_needed[16]; /* the highest GLIBC_x.y version its files reference: "2.34" */
    char *tarball;         /* CACHE/KEY.tar.gz */
    int64_t nbytes;        /* the tarball's size */
    size_t nlibs;          /* libraries bundled */
    bool has_sdk;          /* python/tandem found beside this binary and bundled */
} td__bundle;

/* A portable install's binaries (tools/tandem/isa.c): `tandem` and the builds of its sources per
 * x86-64 level beside it (tandem-x86-64, tandem-x86-64-v2, -v3, -v4), of which the running
 * process may be any. The bundle holds them all, `tandem` as bin/tandem, so a host runs the
 * level its own CPU takes: an AVX-512 build sent alone would not start on a host without
 * AVX-512. Rewrites exe (PATH_MAX bytes) to DIR/tandem when it is DIR/tandem-x86-64* and DIR/tandem
 * exists; returns how many executable level builds DIR holds, their paths in *paths (the caller
 * frees each and the array; NULL for none: a plain build). */
size_t td__bundle_levels(char *exe, char ***paths);

/* The bundle of the running tandem: the cached one when it exists (the key covers the binary,
 * the libraries loaded and the SDK's files), else made now (a second or two). The cache is
 * $TANDEM_BUNDLE_CACHE, else $XDG_CACHE_HOME/tandem/bundles, else ~/.cache/tandem/bundles. */
td_status td__bundle_get(td__bundle *out) TD_NODISCARD;
void td__bundle_clear(td__bundle *b);

/* What a host said about itself (the probe's "KEY VALUE" lines). */
typedef struct {
    char os[32], arch[32], glibc[32]; /* glibc "" when it has none (musl) */
    char dir[1024];                   /* where the bundle goes there (absolute) */
    bool have;                        /* the bundle is there already, whole */
} td__bundle_host;

/* Parses the probe's answer; a line missing is TD_ERR_FORMAT. */
td_status td__bundle_parse_probe(const char *text, td__bundle_host *h) TD_NODISCARD;
/* Whether the bundle runs on a host like h: the same OS and architecture, and a glibc at least
 * as new as the one it needs. A mismatch is TD_ERR_INVALID naming `where` (e.g. "instance i-1
 * (node 1)"), both sides and what to do. */
td_status td__bundle_check_host(const td__bundle *b, const td__bundle_host *h,
                                const char *where) TD_NODISCARD;
/* "x86_64" for the EC2 architecture names ("x86_64", "arm64", "i386"), "aarch64" for "arm64":
 * uname -m's name, to compare an instance type with a bundle before anything is created. */
const char *td__bundle_uname_arch(const char *ec2_arch);

/* Ships the bundle to one host: asks it what it is (uname, glibc, $HOME), refuses a host it
 * cannot run on (td__bundle_check_host), sends it when the host lacks it, and writes the path of
 * its tandem there (the wrapper) into tandem_out. ssh_argv: the ssh command up to and including
 * the destination (NULL-terminated); the remote commands are appended. A host that does not
 * answer (ssh's 255) is TD_ERR_PEER, so that a caller waiting for a new instance's sshd tries
 * again. *sent_nbytes: 0 when the host had it already. The function a carrier (the aws
 * executor, its controller) calls for each host it starts tandem on. */
td_status td__bundle_ship(const td__bundle *b, char *const *ssh_argv, const char *where,
                          char *tandem_out, size_t nbytes, int64_t *sent_nbytes) TD_NODISCARD;

#endif
