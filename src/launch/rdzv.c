/* Rendezvous of node agents over the store, and the small socket helpers it needs.
 *
 * Keys of one attempt, under p->ns:
 *   count        atomic counter; each agent's add() gives it a 1-based arrival slot
 *   slot/<s>     "node_rank nproc addr hostname blas_core level" of the agent in slot s
 *                (blas_core: its OpenBLAS core, tensor.h, the group adopts node 0's; level: the
 *                x86-64 level of its kernels, the group runs the lowest)
 *   final        the agreed number of nodes (first compare_set wins)
 *   master_port  published by the node with group rank 0
 *   resume_step  on a resume: the step every rank resumes from ("-1": none), published by node
 *                0's agent once its own checkpoints are restored and uploaded (launch.c)
 *   ckpt/...     on a resume: that step's checkpoint, from node 0's agent to the others that
 *                lack it (ckpt_peer.c)
 * Slots are dense (1..count), so "slot/N exists" means N agents have registered. */
#include "launch_internal.h"

#include "tandem/loop.h"
#include "tandem/os.h"
#include "tandem/tensor.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

td_status td__parse_endpoint(const char *ep, char *host, size_t nbytes, int *port) {
    const char *colon;
    size_t hlen;
    if (ep[0] == '[') {
        const char *close_br = strchr(ep, ']');
        if (!close_br) goto bad;
        hlen = (size_t)(close_br - ep - 1);
        memcpy(host, ep + 1, TD_MIN(hlen, nbytes - 1));
        colon = close_br[1] == ':' ? close_br + 1 : NULL;
        if (close_br[1] && !colon) goto bad;
    } else {
        colon = strrchr(ep, ':');
        hlen = colon ? (size_t)(colon - ep) : strlen(ep);
        memcpy(host, ep, TD_MIN(hlen, nbytes - 1));
    }
    if (hlen == 0 || hlen >= nbytes) goto bad;
    host[hlen] = '\0';
    *port = 29400; /* torchrun's default rendezvous port */
    if (colon) {
        int64_t v;
        /* 0: any free port, for node rank 0 with an on_store callback (setup_store checks). */
        if (td_parse_i64("port", colon + 1, &v) != TD_OK || v < 0 || v > 65535) goto bad;
        *port = (int)v;
    }
    return TD_OK;
bad:
    return td_error(TD_ERR_USAGE, "--rdzv-endpoint '%s' is not HOST:PORT (e.g. 10.0.0.1:29400)",
                    ep);
}

/* A connected UDP socket sends nothing; it only asks the kernel which source address it would
 * route from, which is the address peers that reach host can reach us at. */
td_status td__local_addr_for(const char *host, int port, char *out, size_t nbytes) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_DGRAM};
    struct addrinfo *res = NULL;
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    int rc = getaddrinfo(host, service, &hints, &res);
    if (rc != 0)
        return td_error(TD_ERR_INVALID, "cannot resolve rendezvous host '%s': %s", host,
                        gai_strerror(rc));
    td_status st = td_error(TD_ERR_SYS, "no route to rendezvous host '%s'", host);
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0);
        if (fd < 0) continue;
        struct sockaddr_storage ss;
        socklen_t len = sizeof ss;
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
            getsockname(fd, (struct sockaddr *)&ss, &len) == 0) {
            const void *src = ss.ss_family == AF_INET
                                  ? (const void *)&((struct sockaddr_in *)&ss)->sin_addr
                                  : (const void *)&((struct sockaddr_in6 *)&ss)->sin6_addr;
            if (inet_ntop(ss.ss_family, src, out, (socklen_t)nbytes)) {
                st = TD_OK;
                td_error_clear();
                close(fd);
                break;
            }
        }
        close(fd);
    }
    freeaddrinfo(res);
    return st;
}

/* A look at the signalfd between two slices of a store wait, never a wait of its own: the
 * signal stays queued there for the agent, which reads it. */
static bool signal_pending(int sig_fd) {
    return sig_fd >= 0 && td_loop_wait_readable(sig_fd, 0);
}

#define REPORT_EVERY_S 5.0

/* Who has joined so far, for the user waiting on the others: "1 of 2 nodes (tdnode1)". */
static void report_joined(const td__rdzv_params *p, double left_s) {
    char key[512], hosts[512] = "";
    int64_t count = 0;
    snprintf(key, sizeof key, "%s/count", p->ns);
    if (td_store_add(p->store, key, 0, &count) != TD_OK) {
        td_error_clear();
        return;
    }
    size_t used = 0;
    for (int64_t s = 1; s <= count && used + 1 < sizeof hosts; s++) {
        void *v = NULL;
        size_t n = 0;
        snprintf(key, sizeof key, "%s/slot/%lld", p->ns, (long long)s);
        if (td_store_get(p->store, key, &v, &n, 0) != TD_OK) {
            td_error_clear();
            continue;
        }
        char host[256] = "?", safe[256];
        int nr = -1, np = 0;
        char addr[256];
        if (sscanf(v, "%d %d %255s %255s", &nr, &np, addr, host) != 4)
            snprintf(host, sizeof host, "?");
        free(v);
        td_escape_text(safe, sizeof safe, host, strlen(host));
        used += (size_t)snprintf(hosts + used, sizeof hosts - used, "%s%s", used ? ", " : "", safe);
    }
    TD_LOG_INFO("rendezvous: %lld of %d node%s joined (%s); waiting for the rest, %.0f s left "
                "(--rdzv-timeout)",
                (long long)count, p->min_nodes, p->min_nodes == 1 ? "" : "s",
                hosts[0] ? hosts : "none", left_s);
}

/* Waits for key in short slices so that a SIGTERM to the agent is noticed (it stays queued on
 * the signalfd for the agent loop to read). missing_ok: a timeout is not an error. report: say
 * every few seconds which nodes have joined. */
static td_status wait_key(const td__rdzv_params *p, const char *key, double timeout_s,
                          bool missing_ok, bool report, char **val) {
    double deadline = td_now_s() + timeout_s, next_report = td_now_s() + REPORT_EVERY_S;
    for (;;) {
        if (report && td_now_s() >= next_report) {
            report_joined(p, deadline - td_now_s());
            next_report += REPORT_EVERY_S;
        }
        double left = deadline - td_now_s();
        int slice = (int)TD_MIN(200.0, TD_MAX(left * 1000.0, 0.0));
        void *v = NULL;
        size_t n = 0;
        td_status st = td_store_get(p->store, key, &v, &n, slice);
        if (st == TD_OK) {
            td_error_clear();
            *val = v;
            return TD_OK;
        }
        if (st != TD_ERR_TIMEOUT && st != TD_ERR_NOTFOUND) return st;
        if (signal_pending(p->sig_fd))
            return td_error(TD_ERR_INTERRUPTED, "rendezvous interrupted by a signal");
        if (td_now_s() >= deadline) {
            *val = NULL;
            if (missing_ok) {
                td_error_clear();
                return TD_ERR_TIMEOUT;
            }
            return td_error(TD_ERR_TIMEOUT,
                            "rendezvous: waited %.0f s for '%s'; fewer than the expected nodes "
                            "joined (start `tandem launch` on every node with the same "
                            "--rdzv-endpoint and --rdzv-id, or raise --rdzv-timeout)",
                            timeout_s, key);
        }
    }
}

typedef struct {
    int slot;
    int node_rank;
    int nproc;
    char addr[256];
    char host[256];
    char blas_core[64];
    char level[32];
} node_info;

/* Registers this node: takes the next arrival slot and publishes what the others need of it. */
static td_status register_node(const td__rdzv_params *p, int64_t *slot) {
    char key[512], addr[256], hostname[256] = "?";
    TD_CHECK(td__local_addr_for(p->store_host, p->store_port, addr, sizeof addr));
    gethostname(hostname, sizeof hostname - 1);
    hostname[sizeof hostname - 1] = '\0';
    snprintf(key, sizeof key, "%s/count", p->ns);
    TD_CHECK(td_store_add(p->store, key, 1, slot));
    char info[700];
    td_numerics num;
    td_numerics_get(&num);
    int ilen = snprintf(info, sizeof info, "%d %d %s %s %s %s", p->node_rank, p->nproc, addr,
                        hostname, num.blas_core, td_isa_level());
    snprintf(key, sizeof key, "%s/slot/%lld", p->ns, (long long)*slot);
    return td_store_set(p->store, key, info, (size_t)ilen);
}

/* The number of nodes: at least min_nodes, then a last call for more up to max_nodes; the first
 * agent to propose a count fixes it for all. A node that arrived after it was fixed is out. */
static td_status agree_node_count(const td__rdzv_params *p, int64_t slot, int *nnodes) {
    char key[512], *val = NULL;
    snprintf(key, sizeof key, "%s/slot/%d", p->ns, p->min_nodes);
    TD_CHECK(wait_key(p, key, p->timeout_s, false, true, &val));
    free(val);
    val = NULL;
    if (p->max_nodes > p->min_nodes) {
        snprintf(key, sizeof key, "%s/slot/%d", p->ns, p->max_nodes);
        td_status st = wait_key(p, key, p->last_call_s, true, false, &val);
        if (st != TD_OK && st != TD_ERR_TIMEOUT) return st;
        free(val);
    }
    int64_t count;
    snprintf(key, sizeof key, "%s/count", p->ns);
    TD_CHECK(td_store_add(p->store, key, 0, &count));
    char want[32];
    int wlen = snprintf(want, sizeof want, "%lld", (long long)TD_MIN(count, (int64_t)p->max_nodes));
    void *actual = NULL;
    size_t actual_n = 0;
    snprintf(key, sizeof key, "%s/final", p->ns);
    TD_CHECK(td_store_compare_set(p->store, key, NULL, 0, want, (size_t)wlen, &actual, &actual_n));
    *nnodes = actual ? atoi((char *)actual) : 0;
    free(actual);
    if (*nnodes < p->min_nodes)
        return td_error(TD_ERR_PROTOCOL, "rendezvous %s: agreed node count %d is below --nnodes %d",
                        p->ns, *nnodes, p->min_nodes);
    if (slot > *nnodes)
        return td_error(TD_ERR_PEER,
                        "rendezvous %s closed with %d nodes before this node joined (arrival "
                        "%lld); start all nodes within the --rdzv-last-call window or raise "
                        "--nnodes",
                        p->ns, *nnodes, (long long)slot);
    return TD_OK;
}

/* Every node's registration, by slot. */
static td_status read_nodes(const td__rdzv_params *p, int nnodes, node_info *nodes) {
    char key[512];
    for (int s = 1; s <= nnodes; s++) {
        char *val = NULL;
        snprintf(key, sizeof key, "%s/slot/%d", p->ns, s);
        TD_CHECK(wait_key(p, key, p->timeout_s, false, false, &val));
        node_info *ni = &nodes[s - 1];
        ni->slot = s;
        int got = sscanf(val, "%d %d %255s %255s %63s %31s", &ni->node_rank, &ni->nproc, ni->addr,
                         ni->host, ni->blas_core, ni->level);
        td_status st = TD_OK;
        if (got != 6)
            st = td_error(TD_ERR_PROTOCOL, "rendezvous: malformed registration '%s' at %s", val,
                          key);
        free(val);
        if (st != TD_OK) return st;
    }
    return TD_OK;
}

/* Explicit --node-rank values are honoured exactly; nodes without one fill the remaining ranks in
 * arrival order. order[g] = index into nodes (by slot) of group rank g. */
static td_status rank_nodes(const node_info *nodes, int nnodes, int *order) {
    for (int g = 0; g < nnodes; g++) order[g] = -1;
    for (int i = 0; i < nnodes; i++) {
        int nr = nodes[i].node_rank;
        if (nr < 0) continue;
        if (nr >= nnodes)
            return td_error(TD_ERR_USAGE,
                            "node %s registered --node-rank %d but only %d nodes joined; node "
                            "ranks must be 0..%d",
                            nodes[i].host, nr, nnodes, nnodes - 1);
        if (order[nr] >= 0)
            return td_error(TD_ERR_USAGE,
                            "two agents registered --node-rank %d (hosts %s and %s); give each "
                            "node a distinct --node-rank",
                            nr, nodes[order[nr]].host, nodes[i].host);
        order[nr] = i;
    }
    for (int i = 0, g = 0; i < nnodes; i++) {
        if (nodes[i].node_rank >= 0) continue;
        while (order[g] >= 0) g++;
        order[g] = i;
    }
    return TD_OK;
}

/* This node's place in the ranked group; node 0's address and BLAS core are the group's, and the
 * lowest level of the nodes' kernels ("x86-64" < "x86-64-v2" < ... as strings too): every node
 * runs it or has a build of it beside its binary (the portable wheel carries each level), where
 * node 0's could be one another node's CPU lacks. */
static void place_node(const node_info *nodes, const int *order, int nnodes, int64_t slot,
                       td__rdzv_result *out) {
    int offset = 0, world = 0;
    out->group_rank = -1;
    for (int g = 0; g < nnodes; g++) {
        const node_info *ni = &nodes[order[g]];
        if (ni->slot == slot) {
            out->group_rank = g;
            offset = world;
        }
        world += ni->nproc;
    }
    out->nnodes = nnodes;
    out->rank_offset = offset;
    out->world_size = world;
    snprintf(out->master_addr, sizeof out->master_addr, "%s", nodes[order[0]].addr);
    snprintf(out->blas_core, sizeof out->blas_core, "%s", nodes[order[0]].blas_core);
    const char *lowest = nodes[0].level;
    for (int i = 1; i < nnodes; i++)
        if (strcmp(nodes[i].level, lowest) < 0) lowest = nodes[i].level;
    snprintf(out->isa_level, sizeof out->isa_level, "%s", lowest);
}

/* Node 0 picks MASTER_PORT on its host and publishes it; every node reads it. */
static td_status agree_master_port(const td__rdzv_params *p, td__rdzv_result *out) {
    char key[512], *val = NULL;
    snprintf(key, sizeof key, "%s/master_port", p->ns);
    if (out->group_rank == 0) {
        char port[16];
        int port_num;
        TD_CHECK(td_pick_free_port(&port_num));
        int plen = snprintf(port, sizeof port, "%d", port_num);
        TD_CHECK(td_store_set(p->store, key, port, (size_t)plen));
    }
    TD_CHECK(wait_key(p, key, p->timeout_s, false, false, &val));
    out->master_port = atoi(val);
    free(val);
    return TD_OK;
}

td_status td__rdzv_join(const td__rdzv_params *p, td__rdzv_result *out) {
    int64_t slot;
    int nnodes = 0;
    TD_CHECK(register_node(p, &slot));
    TD_CHECK(agree_node_count(p, slot, &nnodes));
    node_info *nodes = td_xcalloc((size_t)nnodes, sizeof *nodes);
    int *order = td_xmalloc(sizeof *order * (size_t)nnodes);
    td_status st = read_nodes(p, nnodes, nodes);
    if (st == TD_OK) st = rank_nodes(nodes, nnodes, order);
    if (st == TD_OK) {
        place_node(nodes, order, nnodes, slot, out);
        st = agree_master_port(p, out);
    }
    free(nodes);
    free(order);
    return st;
}

td_status td__rdzv_publish_step(const td__rdzv_params *p, int64_t step) {
    char key[512], val[32];
    snprintf(key, sizeof key, "%s/resume_step", p->ns);
    int len = snprintf(val, sizeof val, "%lld", (long long)step);
    return td_store_set(p->store, key, val, (size_t)len);
}

td_status td__rdzv_wait_step(const td__rdzv_params *p, int64_t *step) {
    char key[512], *val = NULL;
    snprintf(key, sizeof key, "%s/resume_step", p->ns);
    td_status st = wait_key(p, key, p->timeout_s, true, false, &val);
    if (st == TD_ERR_TIMEOUT)
        return td_error(TD_ERR_TIMEOUT,
                        "waited %.0f s (--rdzv-timeout) for node 0 to say which checkpoint step "
                        "the run resumes from (node 0's agent restores and uploads its "
                        "checkpoints first; is it stuck on S3?)",
                        p->timeout_s);
    if (st != TD_OK) return st;
    int64_t v = -1;
    if (td_parse_i64("resume_step", val, &v) != TD_OK || v < -1) {
        td_error_clear();
        st = td_error(TD_ERR_PROTOCOL, "node 0 published resume step '%.40s', not a step", val);
        free(val);
        return st;
    }
    free(val);
    *step = v;
    return TD_OK;
}
