/* The ssh executor (executor: ssh): one `tandem launch` node agent per host over OpenSSH, no
 * file system shared with the hosts assumed. docs/executors.md ("The ssh executor") describes
 * what it does; the comments here say why.
 *
 * One attempt: node 0's agent first, with --rdzv-endpoint HOST:0, so that it binds a free port
 * on its own host and tells us which (a "store_port" note on its link); then the others,
 * pointed at it. Every agent runs with --forward-stdio: its stdout is a mirror stream of its
 * rank logs and metric files (tandem/mirror.h), written into RUN/logs and RUN/metrics here, and
 * its stdin is how we stop it; its stderr is the agent's own messages. An agent that fails ends
 * the attempt for all (they are told to stop, and cut off after a grace period); with
 * max_restarts the whole group starts again with TANDEM_RESUME=1, which resumes from node 0's
 * checkpoint (rank 0 reads it and broadcasts it: the other hosts need not see it). */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "exec/internal.h"
#include "tandem/loop.h"
#include "tandem/mirror.h"

#define CONNECT_TIMEOUT_S   10    /* ssh -o ConnectTimeout */
#define PREFLIGHT_TIMEOUT_S 60.0  /* log in, make the directories, check tandem */
#define COPY_TIMEOUT_S      900.0 /* the code, to each host */
#define PORT_WAIT_S         60.0  /* node 0's agent binding its store */
#define INGEST_PERIOD_S     0.5   /* as the local executor */
#define LAUNCH_STOP_GRACE_S 30.0  /* the agents' --stop-grace */
/* After "stop", an agent has its grace period to checkpoint and exit; then we cut the
 * connection, and the agent (end of its stdin) stops on its own. */
#define CUT_AFTER_S (LAUNCH_STOP_GRACE_S + 15.0)

/* ---- options ---- */
static char **copy_strv(char *const *v, size_t n) {
    if (!n) return NULL;
    char **c = td_xcalloc(n, sizeof *c);
    for (size_t i = 0; i < n; i++) c[i] = td_xstrdup(v[i]);
    return c;
}

static char *dup_or_null(const char *s) {
    return s ? td_xstrdup(s) : NULL;
}

void td_ssh_options_copy(td_ssh_options *dst, const td_ssh_options *src) {
    dst->hosts = copy_strv(src->hosts, src->nhosts);
    dst->nhosts = src->nhosts;
    dst->hostfile = dup_or_null(src->hostfile);
    dst->work_dir = dup_or_null(src->work_dir);
    dst->ssh_args = copy_strv(src->ssh_args, src->nssh_args);
    dst->nssh_args = src->nssh_args;
    dst->tandem = dup_or_null(src->tandem);
    dst->rdzv_host = dup_or_null(src->rdzv_host);
}

void td_ssh_options_clear(td_ssh_options *o) {
    td_ssh_hosts_free(o->hosts, o->nhosts);
    td_ssh_hosts_free(o->ssh_args, o->nssh_args);
    free(o->hostfile);
    free(o->work_dir);
    free(o->tandem);
    free(o->rdzv_host);
    memset(o, 0, sizeof *o);
}

void td_ssh_hosts_free(char **hosts, size_t count) {
    for (size_t i = 0; hosts && i < count; i++) free(hosts[i]);
    free(hosts);
}

/* [user@]host[:port], host a name, an IPv4 address or [IPv6]. The entry reaches ssh as one
 * argument, but also names the rendezvous host in a shell command: no metacharacters. */
td_status td_ssh_host_check(const char *what, const char *host) {
    if (!*host) return td_error(TD_ERR_INVALID, "%s: an empty host", what);
    for (const char *p = host; *p; p++)
        if (!isalnum((unsigned char)*p) && !strchr("@._-:[]", *p))
            return td_error(TD_ERR_INVALID,
                            "%s: '%s' is not a host ([user@]host[:port]; '%c' is not allowed)",
                            what, host, *p);
    if (host[0] == '-') return td_error(TD_ERR_INVALID, "%s: '%s' starts with '-'", what, host);
    const char *at = strrchr(host, '@'), *h = at ? at + 1 : host;
    const char *colon = h[0] == '[' ? strstr(h, "]:") : strchr(h, ':');
    if (colon && h[0] == '[') colon++;
    if (!*h || h[0] == ':' ||
        (colon && (!colon[1] || strspn(colon + 1, "0123456789") != strlen(colon + 1))))
        return td_error(TD_ERR_INVALID, "%s: '%s' is not [user@]host[:port]", what, host);
    if (colon && (atoi(colon + 1) < 1 || atoi(colon + 1) > 65535))
        return td_error(TD_ERR_INVALID, "%s: '%s': the port must be 1-65535", what, host);
    return TD_OK;
}

td_status td_ssh_hosts(const td_ssh_options *o, const char *project_dir, char ***hosts,
                       size_t *count) {
    *hosts = NULL;
    *count = 0;
    if (!o->hostfile) {
        *hosts = copy_strv(o->hosts, o->nhosts);
        *count = o->nhosts;
        return TD_OK;
    }
    char *path = o->hostfile[0] == '/' || !project_dir
                     ? td_xstrdup(o->hostfile)
                     : td_xasprintf("%s/%s", project_dir, o->hostfile);
    FILE *f = fopen(path, "r");
    if (!f) {
        td_status st = td_error_errno(TD_ERR_IO, "ssh.hostfile %s", path);
        free(path);
        return st;
    }
    char line[1024];
    size_t n = 0;
    char **v = NULL;
    td_status st = TD_OK;
    for (int lineno = 1; fgets(line, sizeof line, f); lineno++) {
        char *hash = strchr(line, '#');
        if (hash) *hash = '\0';
        char *s = line;
        while (isspace((unsigned char)*s)) s++;
        size_t len = strcspn(s, " \t\r\n");
        /* MPI and DeepSpeed hostfiles add "slots=N": the slots are nproc_per_node here. */
        const char *rest = s + len + strspn(s + len, " \t\r\n");
        if (!len) continue;
        s[len] = '\0';
        if (*rest && strncmp(rest, "slots=", 6) != 0) {
            st = td_error(TD_ERR_INVALID,
                          "%s:%d: one host per line ([user@]host[:port], optionally slots=N), "
                          "got '%s %s'",
                          path, lineno, s, rest);
            break;
        }
        char what[1100];
        snprintf(what, sizeof what, "%s:%d", path, lineno);
        if ((st = td_ssh_host_check(what, s)) != TD_OK) break;
        v = td_xrealloc(v, (n + 1) * sizeof *v);
        v[n++] = td_xstrdup(s);
    }
    fclose(f);
    if (st == TD_OK && !n) st = td_error(TD_ERR_INVALID, "ssh.hostfile %s names no host", path);
    free(path);
    if (st != TD_OK) {
        td_ssh_hosts_free(v, n);
        return st;
    }
    *hosts = v;
    *count = n;
    return TD_OK;
}

/* ---- the supervisor ---- */
typedef struct {
    char *entry;  /* as written: user@host:port */
    char *dest;   /* what ssh connects to: user@host */
    char *port;   /* -p, or NULL */
    char *addr;   /* host: how the other hosts reach this one (node 0's store) */
    char *remote; /* the run's directory there, absolute (the run directory itself if shared) */
    char *work;   /* remote/work: the commands' working directory there */
    int shared;   /* it sees this machine's run directory at the same path */
} host;

typedef struct {
    int node;
    pid_t pid; /* the local ssh; 0 once reaped */
    int in_fd, out_fd, err_fd;
    int status; /* wait status once reaped */
    td_mirror_in *mirror;
    int mirror_bad; /* its stream broke the protocol: ignored from there on */
    td__buf errline;
    int stop_sent;
} agent;

typedef struct {
    const td_exec_job *job;
    host *hosts;
    size_t nhosts;
    char *ssh;      /* absolute */
    char token[33]; /* the run's RUN/token */
    agent *agents;  /* one per host in an attempt */
    int store_port; /* node 0's, from its link; 0 before */
    td__echo echo;
    td_ingester *ing;
    int failed_code; /* the failing agent's exit code */
    int stop_code;   /* after a stop: 143 when every agent's workers checkpointed, else 1 */
} ssh_sup;

/* A progress line ("tandem: ...") and how a run fails before its job ran: exec.c's. */
#define say(c, ...)          td__exec_say((c)->job->out, __VA_ARGS__)
#define fail_run(c, t0, ...) td__exec_fail((c)->job, (t0), __VA_ARGS__)
#define write_all            td__exec_write_all

static void split_host(const char *entry, host *h) {
    h->entry = td_xstrdup(entry);
    const char *at = strrchr(entry, '@');
    const char *hp = at ? at + 1 : entry;
    const char *colon = hp[0] == '[' ? strstr(hp, "]:") : strchr(hp, ':');
    if (colon && hp[0] == '[') colon++;
    size_t hlen = colon ? (size_t)(colon - hp) : strlen(hp);
    h->port = colon ? td_xstrdup(colon + 1) : NULL;
    h->dest = td_xasprintf("%.*s", (int)(hp - entry + hlen), entry);
    if (hp[0] == '[') /* [v6] -> v6 for ssh and the endpoint's own brackets */
        h->addr = td_xasprintf("%.*s", (int)(hlen - 2), hp + 1);
    else
        h->addr = td_xasprintf("%.*s", (int)hlen, hp);
    if (hp[0] == '[') {
        free(h->dest);
        h->dest = td_xasprintf("%.*s%s", (int)(hp - entry), entry, h->addr);
    }
}

/* ssh [options] DEST COMMAND: batch mode (keys or an agent, never a password prompt), no tty,
 * keepalives so that a dead host is noticed in about 15 s even when the agent is silent. */
static char **ssh_argv(const ssh_sup *c, const host *h, const char *command) {
    const td_ssh_options *o = c->job->ssh;
    size_t n = 0, cap = 16 + o->nssh_args;
    char **v = td_xcalloc(cap, sizeof *v);
    v[n++] = td_xstrdup(c->ssh);
    v[n++] = td_xstrdup("-T");
    v[n++] = td_xstrdup("-o");
    v[n++] = td_xstrdup("BatchMode=yes");
    v[n++] = td_xstrdup("-o");
    v[n++] = td_xasprintf("ConnectTimeout=%d", CONNECT_TIMEOUT_S);
    v[n++] = td_xstrdup("-o");
    v[n++] = td_xstrdup("ServerAliveInterval=5");
    v[n++] = td_xstrdup("-o");
    v[n++] = td_xstrdup("ServerAliveCountMax=3");
    if (h->port) {
        v[n++] = td_xstrdup("-p");
        v[n++] = td_xstrdup(h->port);
    }
    for (size_t i = 0; i < o->nssh_args; i++) v[n++] = td_xstrdup(o->ssh_args[i]);
    v[n++] = td_xstrdup("--");
    v[n++] = td_xstrdup(h->dest);
    v[n++] = td_xstrdup(command);
    return v;
}

static void argv_free(char **v) {
    for (char **p = v; p && *p; p++) free(*p);
    free(v);
}

/* The remote command: a POSIX sh script whatever the login shell is (bash, zsh, dash). */
static char *remote_sh(const char *script) {
    td__buf b = {0};
    td__buf_add(&b, "/bin/sh -c ", 11);
    td__buf_quote(&b, script);
    return b.s;
}

static const char *tandem_on_hosts(const ssh_sup *c) {
    return c->job->ssh->tandem ? c->job->ssh->tandem : c->job->tandem_bin;
}

/* Logs in to each host in turn: makes the run's directory there (or finds that the host
 * sees ours: a shared file system), and checks that tandem runs. The first failure names the
 * host and what ssh or the host said. */
static td_status preflight(ssh_sup *c, char *why, size_t nbytes) {
    const td_run *run = c->job->run;
    char marker_name[40], marker_hex[17];
    TD_CHECK(td_random_hex(marker_hex, 8));
    snprintf(marker_name, sizeof marker_name, "ssh-probe-%s", marker_hex);
    char *marker = td_xasprintf("%s/%s", run->run_dir, marker_name);
    td_chunk chunk = {"", 0};
    TD_CHECK(td_write_atomic(marker, "ssh probe file", &chunk, 1));
    char *base =
        c->job->ssh->work_dir ? td_xstrdup(c->job->ssh->work_dir) : td_xstrdup(".tandem-runs");
    td__buf s = {0};
    td__buf_add(&s, "if [ -e ", 8);
    td__buf_quote(&s, marker);
    td__buf_add(&s, " ]; then R=", 11);
    td__buf_quote(&s, run->run_dir);
    td__buf_addf(&s, "; echo shared; else R=");
    td__buf_quote(&s, base);
    td__buf_addf(&s, "/");
    td__buf_quote(&s, run->id);
    td__buf_addf(&s, "; echo separate; fi\n"
                     "mkdir -p \"$R/work\" \"$R/agent/logs\" \"$R/agent/metrics\" "
                     "\"$R/checkpoints\" && cd \"$R\" && pwd || exit 3\n"
                     "command -v ");
    td__buf_quote(&s, tandem_on_hosts(c));
    td__buf_addf(&s, " >/dev/null || { echo \"tandem: no ");
    td__buf_add(&s, tandem_on_hosts(c), strlen(tandem_on_hosts(c)));
    td__buf_addf(&s, " on $(hostname)\" >&2; exit 4; }\n");
    char *cmd = remote_sh(s.s);
    free(s.s);

    /* One host after another: a few hundred ms each. (Dozens of hosts would want these in
     * parallel, and the code copies too; docs/executors.md lists it.) */
    td_status st = TD_OK;
    for (size_t i = 0; i < c->nhosts && st == TD_OK; i++) {
        host *h = &c->hosts[i];
        char **argv = ssh_argv(c, h, cmd);
        char *out = NULL, *err = NULL;
        int code = 0;
        st = td__exec_capture(argv, NULL, PREFLIGHT_TIMEOUT_S, &out, &err, &code);
        argv_free(argv);
        if (st == TD_OK && code != 0) {
            char msg[600];
            td__exec_joined_lines(err && *err ? err : out, msg, sizeof msg);
            snprintf(why, nbytes, "ssh host %s (node %zu): %s (exit code %d)%s", h->entry, i,
                     msg[0] ? msg : "no message", code,
                     code == 255   ? "; check that `ssh -o BatchMode=yes HOST true` works from "
                                     "here: key-based login (ssh-copy-id), known_hosts, the address"
                     : code == 124 ? "; it did not answer within 60 s"
                                   : "");
            st = TD_ERR_IO;
        } else if (st == TD_OK) {
            char *nl = strchr(out, '\n');
            char *path = nl ? nl + 1 : NULL;
            if (path) path[strcspn(path, "\n")] = '\0';
            if (!path || path[0] != '/') {
                snprintf(why, nbytes, "ssh host %s: unexpected answer to the set-up: '%.200s'",
                         h->entry, out);
                st = TD_ERR_IO;
            } else {
                h->shared = !strncmp(out, "shared", 6);
                h->remote = td_xstrdup(path);
                h->work = td_xasprintf("%s/work", path);
            }
        } else {
            snprintf(why, nbytes, "ssh host %s: %s", h->entry, td_error_msg());
            td_error_clear();
            st = TD_ERR_IO;
        }
        free(out);
        free(err);
    }
    unlink(marker);
    free(marker);
    free(cmd);
    free(base);
    return st;
}

/* Runs `[local |] ssh HOST 'remote' [| after]` through /bin/sh, a tar stream between this
 * machine and the host: *code gets the pipeline's exit code, msg (nbytes) what it said. */
static td_status ssh_pipe(const ssh_sup *c, const host *h, const char *local, const char *remote,
                          const char *after, int *code, char *msg, size_t nbytes) {
    char *rcmd = remote_sh(remote);
    char **sargv = ssh_argv(c, h, rcmd);
    free(rcmd);
    td__buf l = {0};
    if (local) td__buf_addf(&l, "%s | ", local);
    for (char **a = sargv; *a; a++) {
        td__buf_quote(&l, *a);
        td__buf_add(&l, " ", 1);
    }
    argv_free(sargv);
    if (after) td__buf_addf(&l, "| %s", after);
    char *argv[] = {"/bin/sh", "-c", l.s, NULL};
    char *out = NULL, *err = NULL;
    td_status st = td__exec_capture(argv, NULL, COPY_TIMEOUT_S, &out, &err, code);
    td__exec_joined_lines(st != TD_OK ? td_error_msg() : err, msg, nbytes);
    td_error_clear();
    free(l.s);
    free(out);
    free(err);
    return st;
}

/* The code, to each host that does not share our file system: the files of the project as
 * RUN/work shows them (its entries are the project's, linked), which for a git work tree are
 * the files git sees (tracked, and untracked but not ignored: what the recorded code version
 * and the user's uncommitted work are made of), else every file but .git and .tandem. The
 * outputs the workflow declares are empty in RUN/work, so they are not copied. */
static td_status copy_code(ssh_sup *c, char *why, size_t nbytes) {
    const td_exec_job *job = c->job;
    /* the file list and the tar stream, the same for every host */
    td__buf l = {.s = td__exec_code_tar_script(job)};
    td_status st = TD_OK;
    for (size_t i = 0; i < c->nhosts && st == TD_OK; i++) {
        host *h = &c->hosts[i];
        if (h->shared) continue;
        td__buf rs = {0};
        td__buf_addf(&rs, "mkdir -p ");
        td__buf_quote(&rs, h->work);
        td__buf_addf(&rs, " && tar -xf - -C ");
        td__buf_quote(&rs, h->work);
        int code = 0;
        char msg[600];
        st = ssh_pipe(c, h, l.s, rs.s, NULL, &code, msg, sizeof msg);
        free(rs.s);
        if (st != TD_OK || code != 0) {
            snprintf(why, nbytes, "copying the code to ssh host %s (%s) failed (exit code %d): %s",
                     h->entry, h->work, code, msg[0] ? msg : "no message");
            st = TD_ERR_IO;
        }
    }
    free(l.s);
    return st;
}

/* What the workers' environment adds to ours (the run's variables, the workflow's env,
 * TANDEM_RESUME), with this machine's run directory replaced by the host's: the host's own
 * login environment is the rest, as for a worker that torchrun starts there. PATH puts the
 * hosts' tandem first. The token goes over the link, never on a command line. */
static void add_env(const ssh_sup *c, const host *h, td__buf *b, int resume) {
    const char *run_dir = c->job->run->run_dir;
    size_t rlen = strlen(run_dir);
    const char *tok = td_var_name(TD_VAR_TANDEM_TOKEN);
    const char *resume_name = td_var_name(TD_VAR_TANDEM_RESUME);
    const char *project = td_var_name(TD_VAR_TANDEM_PROJECT_DIR);
    /* What decides the bits travels too: a login environment's OpenBLAS kernel choice reaches
     * the hosts (an ssh session starts without it), so the nodes compute what this machine
     * would (tandem launch then pins node 0's on every node). Before the job's own variables,
     * which win where they set these. */
    static const char *const numerics[] = {"OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"};
    for (size_t i = 0; i < TD_ARRAY_LEN(numerics); i++) {
        const char *v = getenv(numerics[i]);
        if (!v || !*v) continue;
        td__buf_addf(b, "export %s=", numerics[i]);
        td__buf_quote(b, v);
        td__buf_add(b, "\n", 1);
    }
    for (char *const *e = c->job->env; e && *e; e++) {
        const char *eq = strchr(*e, '=');
        if (!eq) continue;
        size_t klen = (size_t)(eq - *e);
        char *key = td_xasprintf("%.*s", (int)klen, *e);
        const char *old = getenv(key), *val = eq + 1;
        int skip = !strcmp(key, "PATH") || !strcmp(key, tok) || !strcmp(key, resume_name) ||
                   (old && !strcmp(old, val));
        for (const char *p = key; *p && !skip; p++)
            if (!isalnum((unsigned char)*p) && *p != '_') skip = 1;
        if (!skip) {
            char *v;
            if (!strcmp(key, project))
                v = td_xstrdup(h->work);
            else if (!h->shared && !strncmp(val, run_dir, rlen) && (val[rlen] == '/' || !val[rlen]))
                v = td_xasprintf("%s%s", h->remote, val + rlen);
            else
                v = td_xstrdup(val);
            td__buf_addf(b, "export %s=", key);
            td__buf_quote(b, v);
            td__buf_add(b, "\n", 1);
            free(v);
        }
        free(key);
    }
    if (resume) td__buf_addf(b, "export %s=1\n", resume_name);
    /* The agent samples its workers' CPU, memory and GPU (we cannot see the host's /proc). */
    td__buf_addf(b, "export %s=%.3f\n", td_var_name(TD_VAR_TANDEM_SYS_METRICS),
                 c->job->run->created_s);
    char *dir = td_xstrdup(tandem_on_hosts(c));
    char *slash = strrchr(dir, '/');
    if (slash) {
        *slash = '\0';
        td__buf_addf(b, "export PATH=");
        td__buf_quote(b, dir[0] ? dir : "/");
        td__buf_addf(b, ":\"$PATH\"\n");
    }
    free(dir);
}

/* ---- what comes back ---- */
static void on_note(void *user, const char *key, const char *value) {
    ssh_sup *c = user;
    if (!strcmp(key, "store_port")) c->store_port = atoi(value);
}

/* Rank log bytes, to our stdout as the local launcher prints them ("[rank R] line"). */
static void on_data(void *user, const char *name, const char *bytes, size_t n) {
    ssh_sup *c = user;
    if (!c->job->quiet_output) td__exec_echo_rank_log(&c->echo, name, bytes, n);
}

/* Starts node `node`'s agent: ssh ... 'cd R/work && exec tandem launch --forward-stdio ...',
 * then the opening lines on its stdin (token, what our copies hold, go). */
static td_status start_agent(ssh_sup *c, int node, int resume, agent *a) {
    const td_exec_job *job = c->job;
    const host *h = &c->hosts[node];
    memset(a, 0, sizeof *a);
    a->node = node;
    a->in_fd = a->out_fd = a->err_fd = -1;
    td__buf s = {0};
    add_env(c, h, &s, resume);
    td__buf_addf(&s, "cd ");
    td__buf_quote(&s, h->work);
    td__buf_addf(&s, " || exit 1\nexec ");
    td__buf_quote(&s, tandem_on_hosts(c));
    const host *h0 = &c->hosts[0];
    const char *rdzv = job->ssh->rdzv_host ? job->ssh->rdzv_host : h0->addr;
    int v6 = strchr(rdzv, ':') != NULL;
    td__buf_addf(&s,
                 " launch --forward-stdio --nnodes %zu --node-rank %d --nproc-per-node %d "
                 "--rdzv-endpoint %s%s%s:%d --max-restarts 0 --stop-grace %.0f --rdzv-id ",
                 c->nhosts, node, job->run->nproc_per_node, v6 ? "[" : "", rdzv, v6 ? "]" : "",
                 node == 0 ? 0 : c->store_port, LAUNCH_STOP_GRACE_S);
    td__buf_quote(&s, job->run->id);
    char *logs = td_xasprintf("%s/agent/logs", h->remote);
    char *metrics = td_xasprintf("%s/agent/metrics", h->remote);
    td__buf_addf(&s, " --log-dir ");
    td__buf_quote(&s, logs);
    td__buf_addf(&s, " --metrics-dir ");
    td__buf_quote(&s, metrics);
    free(logs);
    free(metrics);
    td__buf_addf(&s, " -- /bin/sh -c ");
    /* As the local executor: the shell waits for the program on SIGTERM (its checkpoint). */
    char *script = td_xasprintf("trap : TERM\n%s", job->script);
    td__buf_quote(&s, script);
    free(script);
    char *cmd = remote_sh(s.s);
    free(s.s);
    char **argv = ssh_argv(c, h, cmd);
    free(cmd);

    int pi[2] = {-1, -1}, po[2] = {-1, -1}, pe[2] = {-1, -1};
    td_status st = TD_OK;
    if (pipe2(pi, O_CLOEXEC) || pipe2(po, O_CLOEXEC) || pipe2(pe, O_CLOEXEC)) {
        st = td_error_errno(TD_ERR_SYS, "pipes for ssh to %s", h->entry);
    } else {
        td_spawn_opts so;
        td_spawn_opts_init(&so);
        so.argv = argv;
        so.in_fd = pi[0];
        so.out_fd = po[1];
        so.err_fd = pe[1];
        so.new_group = true;       /* a Ctrl-C at the terminal is ours to handle, not ssh's */
        so.death_signal = SIGTERM; /* we die: ssh goes, the agent sees its stdin end, stops */
        st = td_spawn(&so, &a->pid);
    }
    argv_free(argv);
    if (pi[0] >= 0) close(pi[0]);
    if (po[1] >= 0) close(po[1]);
    if (pe[1] >= 0) close(pe[1]);
    a->in_fd = pi[1];
    a->out_fd = po[0];
    a->err_fd = pe[0];
    if (st != TD_OK) return st;
    /* end/: the agent's end record, sent whole as its link closes */
    static const char *const prefixes[] = {"logs", "metrics", "end"};
    td_mirror_callbacks cb = {.note = on_note, .data = on_data, .user = c};
    a->mirror = td_mirror_in_new(job->run->run_dir, prefixes, TD_ARRAY_LEN(prefixes), &cb);
    char *manifest = td_mirror_in_manifest(a->mirror);
    char *opening = td_xasprintf("token %s\n%sgo\n", c->token, manifest);
    write_all(a->in_fd, opening, strlen(opening));
    free(manifest);
    free(opening);
    fcntl(a->out_fd, F_SETFL, O_NONBLOCK);
    fcntl(a->err_fd, F_SETFL, O_NONBLOCK);
    return TD_OK;
}

/* The agent's stdout: its link. Returns 0 at end of file. */
static int pump_out(ssh_sup *c, agent *a) {
    char buf[65536];
    for (;;) {
        ssize_t n = read(a->out_fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return 1; /* EAGAIN */
        if (n == 0) return 0;
        if (a->mirror_bad) continue;
        td_status st = td_mirror_in_feed(a->mirror, buf, (size_t)n);
        if (st != TD_OK) {
            TD_LOG_WARN("ssh host %s: its agent's link: %s; its logs and metrics are ignored "
                        "from here on",
                        c->hosts[a->node].entry, td_error_msg());
            td_error_clear();
            a->mirror_bad = 1;
        }
    }
}

/* The agent's stderr: its own messages, to ours with the host in front. Nothing is parsed from
 * it: how the agent ended comes in its end record (endrec.h, RUN/end/node-N.json). */
static void err_line(ssh_sup *c, agent *a, const char *text) {
    char line[4200];
    int len = snprintf(line, sizeof line, "[%s] %s\n", c->hosts[a->node].entry, text);
    write_all(STDERR_FILENO, line, (size_t)TD_MIN(len, (int)sizeof line - 1));
}

static int pump_err(ssh_sup *c, agent *a, int final) {
    char buf[8192];
    int open_ = 1;
    for (;;) {
        ssize_t n = read(a->err_fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            open_ = n < 0;
            break;
        }
        td__buf_add(&a->errline, buf, (size_t)n);
    }
    size_t at = 0;
    for (char *nl; a->errline.s && (nl = memchr(a->errline.s + at, '\n', a->errline.len - at));) {
        *nl = '\0';
        err_line(c, a, a->errline.s + at);
        at = (size_t)(nl - a->errline.s) + 1;
    }
    if (a->errline.s) {
        memmove(a->errline.s, a->errline.s + at, a->errline.len - at);
        a->errline.len -= at;
        a->errline.s[a->errline.len] = '\0';
        if ((final || !open_) && a->errline.len) {
            err_line(c, a, a->errline.s);
            a->errline.len = 0;
        }
    }
    return open_;
}

/* ---- one attempt ---- */
typedef enum { END_OK, END_FAILED, END_STOPPED } attempt_end;

/* What stopped the run from our side: a signal (tandem stop, Ctrl-C, SIGHUP, a SIGTERM from
 * outside) or max_duration, as the shared stop decisions (td_exec_stop, exec.h) take them. */
typedef struct {
    td_exec_stop st;
    int first_signal; /* one that came before the supervision began (during the setup) */
    double running_since;
} stops;

static void send_stop(agent *a) {
    if (a->stop_sent || a->in_fd < 0) return;
    write_all(a->in_fd, "stop\n", 5);
    a->stop_sent = 1;
}

/* Ends our side of the connection: the agent reads the end of its stdin and stops by itself,
 * whatever became of the network. */
static void cut(agent *a) {
    if (a->in_fd >= 0) close(a->in_fd);
    a->in_fd = -1;
    a->stop_sent = 1;
    if (a->pid > 0) kill(a->pid, SIGTERM);
}

static void agent_free(agent *a) {
    if (a->in_fd >= 0) close(a->in_fd);
    if (a->out_fd >= 0) close(a->out_fd);
    if (a->err_fd >= 0) close(a->err_fd);
    if (a->pid > 0) {
        kill(a->pid, SIGKILL);
        td_waitpid(a->pid, NULL, 0);
    }
    td_mirror_in_free(a->mirror);
    free(a->errline.s);
    memset(a, 0, sizeof *a);
    a->in_fd = a->out_fd = a->err_fd = -1;
}

/* Reads the signals that arrived and acts on them: the first asks every agent to stop (the
 * workers checkpoint); a later one cuts them off at once only when it is an explicit second
 * request (td_stop_signals_take: Ctrl-C twice, or a signal TD_STOP_REPEAT_GRACE_S after the
 * first); sooner it is the same request delivered twice and must not cost the checkpoint. */
/* What a stop decision asks of the agents started so far. */
static void stop_step(ssh_sup *c, stops *ss, td_exec_stop_step step, agent *agents, int started,
                      double *cut_at) {
    const td_exec_job *job = c->job;
    double now = td_now_s();
    switch (step) {
    case TD_EXEC_STOP_NONE:
        return;
    case TD_EXEC_STOP_SOFT:
        say(c,
            "%s run %s: asking the agents on %zu host%s to checkpoint and stop "
            "(" TD_STOP_ESCALATE_HINT " cuts them off now)",
            ss->st.preempt ? "SIGTERM: preempting" : "stopping", job->run->id, c->nhosts,
            c->nhosts > 1 ? "s" : "");
        for (int i = 0; i < started; i++) send_stop(&agents[i]);
        *cut_at = now + CUT_AFTER_S;
        return;
    case TD_EXEC_STOP_AGAIN:
        say(c,
            "run %s: SIG%s again %.1f s into the stop, taken as the same request; still "
            "waiting for the checkpoint (" TD_STOP_ESCALATE_HINT " cuts the agents off now)",
            job->run->id, sigabbrev_np(ss->st.last_signal), now - ss->st.signals.began_s);
        return;
    case TD_EXEC_STOP_HARD:
        say(c, "run %s: cutting the agents off", job->run->id);
        for (int i = 0; i < started; i++) cut(&agents[i]);
        return;
    }
}

/* The stop signals read since the last look, and max_duration. */
static void handle_stops(ssh_sup *c, stops *ss, agent *agents, int started, double *cut_at) {
    const td_exec_job *job = c->job;
    void *j = (void *)job;
    if (ss->first_signal) {
        int sig = ss->first_signal;
        ss->first_signal = 0;
        stop_step(c, ss, td_exec_stop_signal(&ss->st, sig, td_now_s(), td_exec_stop_asked, j),
                  agents, started, cut_at);
    }
    for (int sig; (sig = td_sigwatch_next(job->sigs));)
        stop_step(c, ss, td_exec_stop_signal(&ss->st, sig, td_now_s(), td_exec_stop_asked, j),
                  agents, started, cut_at);
    double now = td_now_s();
    if (job->max_duration_s > 0 && ss->running_since > 0 &&
        now - ss->running_since > job->max_duration_s)
        stop_step(c, ss, td_exec_stop_max_duration(&ss->st, job->max_duration_s, now), agents,
                  started, cut_at);
}

/* One attempt, on an event loop (core's loop.h): the signalfd and each agent's stdout (its
 * mirror stream) and stderr are watched descriptors; the metrics ingest is a periodic timer, and
 * a tick every 100 ms runs the checks that follow the clock (the stop deadline, node 0's store
 * port, the agents' exits: SIGCHLD on the signalfd wakes it at once too) in the before-sleep
 * hook, which also ends the loop when every agent is gone. */
typedef struct {
    ssh_sup *c;
    stops *ss;
    agent *agents;
    int n, started, resume;
    int *failed;
    char *why;
    size_t nbytes;
    int teardown;
    double t_start, cut_at;
} attempt_ctx;

static void on_agent_fd(td_loop *l, int fd, unsigned events, void *user) {
    (void)events;
    attempt_ctx *t = user;
    for (int i = 0; i < t->started; i++) {
        agent *a = &t->agents[i];
        if (a->out_fd == fd && !pump_out(t->c, a)) {
            td_loop_unwatch(l, fd);
            close(a->out_fd);
            a->out_fd = -1;
        } else if (a->err_fd == fd && !pump_err(t->c, a, 0)) {
            td_loop_unwatch(l, fd);
            close(a->err_fd);
            a->err_fd = -1;
        }
    }
}

static void on_wake(td_loop *l, int fd, unsigned events, void *user) {
    (void)l, (void)fd, (void)events, (void)user; /* the before-sleep hook reads the signals */
}

static void on_tick(td_loop *l, void *user) {
    (void)l, (void)user; /* a turn: the before-sleep hook looks at the clock */
}

static void on_ingest(td_loop *l, void *user) {
    (void)l;
    attempt_ctx *t = user;
    td_status ist = td_ingester_poll(t->c->ing, NULL);
    if (ist != TD_OK && ist != TD_ERR_NOSPACE)
        TD_LOG_WARN("metrics ingest: %s (will retry)", td_error_msg());
    td_error_clear();
}

static td_status start_one(td_loop *l, attempt_ctx *t, int i) {
    TD_CHECK(start_agent(t->c, i, t->resume, &t->agents[i]));
    t->started = i + 1;
    agent *a = &t->agents[i];
    td_status st = td_loop_watch(l, a->out_fd, TD_LOOP_READ, on_agent_fd, t);
    if (st == TD_OK) st = td_loop_watch(l, a->err_fd, TD_LOOP_READ, on_agent_fd, t);
    if (st != TD_OK) cut(a); /* not watched: not left running either */
    return st;
}

/* Every stop reaches the started agents; the teardown cuts them off after CUT_AFTER_S. */
static void stop_all(attempt_ctx *t, double now) {
    for (int i = 0; i < t->started; i++) send_stop(&t->agents[i]);
    t->cut_at = now + CUT_AFTER_S;
}

/* node 0 is up: the others, pointed at its store */
static void start_others(td_loop *l, attempt_ctx *t, double now) {
    ssh_sup *c = t->c;
    for (int i = 1; i < t->n && !t->teardown; i++)
        if (start_one(l, t, i) != TD_OK) {
            snprintf(t->why, t->nbytes, "cannot start ssh to %s: %s", c->hosts[i].entry,
                     td_error_msg());
            td_error_clear();
            *t->failed = i;
            t->teardown = 1;
        }
    if (!t->teardown) {
        say(c, "run %s: %d agents started (store on %s:%d)", c->job->run->id, t->started,
            c->job->ssh->rdzv_host ? c->job->ssh->rdzv_host : c->hosts[0].addr, c->store_port);
        if (t->ss->running_since == 0) t->ss->running_since = now;
    } else {
        stop_all(t, now);
    }
}

/* Agents that exited: the first failure stops the others (they must not train on without it). */
static int reap_agents(attempt_ctx *t, double now) {
    ssh_sup *c = t->c;
    int live = 0;
    for (int i = 0; i < t->started; i++) {
        agent *a = &t->agents[i];
        if (a->pid > 0 && td_waitpid(a->pid, &a->status, WNOHANG) == a->pid) {
            a->pid = 0;
            if (a->in_fd >= 0) close(a->in_fd);
            a->in_fd = -1;
            int code = td_wait_exit_code(a->status);
            if (code != 0 && !a->stop_sent && !t->teardown) {
                *t->failed = i;
                char desc[160];
                td_wait_describe(a->status, desc, sizeof desc);
                pump_err(c, a, 1);
                /* what its end record says replaces this once it has arrived */
                snprintf(t->why, t->nbytes, "node %d (ssh host %s): %s", i, c->hosts[i].entry,
                         code == 255 ? "its agent or its ssh connection ended (ssh exit "
                                       "code 255)"
                                     : desc);
                say(c, "run %s: %s; stopping the other nodes", c->job->run->id, t->why);
                t->teardown = 1;
                char lost[32];
                int len = snprintf(lost, sizeof lost, "lost %d\n", i);
                for (int k = 0; k < t->started; k++)
                    if (t->agents[k].in_fd >= 0) write_all(t->agents[k].in_fd, lost, (size_t)len);
                stop_all(t, now);
            }
        }
        if (a->pid > 0 || a->out_fd >= 0 || a->err_fd >= 0) live++;
    }
    return live;
}

static void attempt_turn(td_loop *l, void *user) {
    attempt_ctx *t = user;
    ssh_sup *c = t->c;
    handle_stops(c, t->ss, t->agents, t->started, &t->cut_at);
    if (t->ss->st.active && !t->teardown) t->teardown = 1;
    double now = td_now_s();
    if (!t->teardown && t->started == 1 && t->n > 1 && c->store_port > 0)
        start_others(l, t, now);
    else if (!t->teardown && t->n == 1 && c->store_port > 0 && t->ss->running_since == 0)
        t->ss->running_since = now;
    if (!t->teardown && t->started < t->n && c->store_port == 0 && now - t->t_start > PORT_WAIT_S) {
        snprintf(t->why, t->nbytes,
                 "node 0's agent on %s did not report its rendezvous store within %.0f s",
                 c->hosts[0].entry, PORT_WAIT_S);
        *t->failed = 0;
        t->teardown = 1;
        cut(&t->agents[0]);
    }
    int live = reap_agents(t, now);
    if (!live && (t->teardown || t->started == t->n)) {
        td_loop_stop(l);
        return;
    }
    if (t->cut_at > 0 && now >= t->cut_at) {
        for (int i = 0; i < t->started; i++)
            if (t->agents[i].pid > 0) cut(&t->agents[i]);
        t->cut_at = now + 5.0; /* and again, should ssh itself hang */
    }
}

/* Runs one attempt: every agent from start to end. *failed gets the first node whose agent
 * failed (-1: none), why what failed. */
static attempt_end run_attempt(ssh_sup *c, int resume, stops *ss, int *failed, char *why,
                               size_t nbytes) {
    const td_exec_job *job = c->job;
    int n = (int)c->nhosts;
    agent *agents = td_xcalloc((size_t)n, sizeof *agents);
    for (int i = 0; i < n; i++) agents[i].in_fd = agents[i].out_fd = agents[i].err_fd = -1;
    *failed = -1;
    why[0] = '\0';
    c->store_port = 0;
    if (td_exec_end_records_reset(job->run, n) != TD_OK) { /* the causes will be vaguer */
        TD_LOG_WARN("%s", td_error_msg());
        td_error_clear();
    }
    attempt_ctx t = {.c = c,
                     .ss = ss,
                     .agents = agents,
                     .n = n,
                     .resume = resume,
                     .failed = failed,
                     .why = why,
                     .nbytes = nbytes,
                     .t_start = td_now_s()};
    td_loop *l = NULL;
    td_status st = td_loop_new(&l);
    if (st == TD_OK) st = td_loop_watch(l, job->sigs->fd, TD_LOOP_READ, on_wake, &t);
    if (st == TD_OK && start_one(l, &t, 0) != TD_OK) {
        snprintf(why, nbytes, "cannot start ssh to %s: %s", c->hosts[0].entry, td_error_msg());
        td_error_clear();
        *failed = 0;
        t.teardown = 1;
    }
    if (st == TD_OK) {
        td_loop_timer(l, 0, INGEST_PERIOD_S, on_ingest, &t);
        td_loop_timer(l, 0.1, 0.1, on_tick, &t);
        td_loop_before_sleep(l, attempt_turn, &t);
        while (!td_loop_stopped(l))
            if (td_loop_turn(l, -1) != TD_OK) { /* epoll failed: keep supervising, slowly */
                TD_LOG_WARN("event loop: %s", td_error_msg());
                td_error_clear();
                usleep(10000);
            }
    } else { /* no loop: nothing can be watched; end what started */
        snprintf(why, nbytes, "supervisor error: %s", td_error_msg());
        td_error_clear();
        *failed = 0;
        for (int i = 0; i < t.started; i++) cut(&agents[i]);
        for (int i = 0; i < t.started; i++)
            if (agents[i].pid > 0) td_waitpid(agents[i].pid, &agents[i].status, 0);
    }
    td_loop_free(l);
    int started = t.started;

    attempt_end end;
    if (ss->st.active) {
        end = END_STOPPED;
        /* 143 when every agent stopped with its workers' checkpoint (or had finished) */
        int checkpointed = started == n;
        for (int i = 0; i < started; i++) {
            int code = td_wait_exit_code(agents[i].status);
            if (code != 0 && code != 143) checkpointed = 0;
        }
        c->stop_code = checkpointed ? 143 : 1;
    } else if (*failed >= 0) {
        end = END_FAILED;
    } else {
        end = END_OK;
        for (int i = 0; i < n; i++) {
            int code = i < started ? td_wait_exit_code(agents[i].status) : -1;
            if (code != 0 && end == END_OK) {
                end = END_FAILED;
                *failed = i;
                snprintf(why, nbytes, "node %d (ssh host %s): its agent failed", i,
                         c->hosts[i].entry);
            }
        }
    }
    if (end == END_FAILED && *failed >= 0) {
        int code = td_wait_exit_code(agents[*failed].status);
        c->failed_code = code == 255 ? 1 : code;
        /* The failing node's own account, every byte of its link read by now. */
        int *codes = td_xcalloc((size_t)n, sizeof *codes);
        for (int i = 0; i < n; i++)
            codes[i] = i < started ? td_wait_exit_code(agents[i].status) : -1;
        td_exec_end_summary sum;
        td_exec_end_records_read(job->run, n, codes, &sum);
        free(codes);
        if (sum.worker_code >= 0) {
            snprintf(why, nbytes, "%s", sum.cause);
            if (sum.worker_code > 0) c->failed_code = sum.worker_code;
        }
    }
    for (int i = 0; i < n; i++) agent_free(&agents[i]);
    free(agents);
    return end;
}

/* ---- artifacts ---- */
/* A pattern the remote shell may expand as a glob: path characters and glob characters only.
 * Anything else is passed quoted (matched literally). */
static int plain_glob(const char *p) {
    for (; *p; p++)
        if (!isalnum((unsigned char)*p) && !strchr("._-/*?[]", *p)) return 0;
    return 1;
}

/* The declared artifacts, from each host that does not share our file system into RUN/work,
 * node 0's last so that its copy wins (rank 0 writes what a run saves). */
static void fetch_artifacts(ssh_sup *c) {
    const td_exec_job *job = c->job;
    if (!job->nartifacts) return;
    td__buf after = {0};
    td__buf_addf(&after, "tar -xf - -C ");
    td__buf_quote(&after, job->work_dir);
    for (size_t k = c->nhosts; k-- > 0;) {
        host *h = &c->hosts[k];
        if (h->shared) continue;
        td__buf rs = {0};
        td__buf_addf(&rs, "cd ");
        td__buf_quote(&rs, h->work);
        td__buf_addf(&rs, " || exit 1\nfor f in");
        for (size_t i = 0; i < job->nartifacts; i++) {
            td__buf_add(&rs, " ", 1);
            if (plain_glob(job->artifacts[i]))
                td__buf_add(&rs, job->artifacts[i], strlen(job->artifacts[i]));
            else
                td__buf_quote(&rs, job->artifacts[i]);
        }
        td__buf_addf(&rs, "; do [ -f \"$f\" ] && printf '%%s\\0' \"$f\"; done | "
                          "tar --null -T - -cf -");
        int code = 0;
        char msg[600];
        td_status st = ssh_pipe(c, h, NULL, rs.s, after.s, &code, msg, sizeof msg);
        if (st != TD_OK || code != 0)
            TD_LOG_WARN("artifacts from ssh host %s: %s (exit code %d)", h->entry, msg, code);
        free(rs.s);
    }
    free(after.s);
}

/* ---- the run ---- */
static char *hosts_file(const td_run *run) {
    return td_xasprintf("%s/ssh-hosts", run->run_dir);
}

/* RUN/ssh-hosts: which executor ran the run (td_executor_of_run) and where ("node host
 * remote-dir shared|copied" lines), for tandem show. */
static void write_hosts_file(const ssh_sup *c) {
    td__buf b = {0};
    td__buf_add(&b, "", 0);
    for (size_t i = 0; i < c->nhosts; i++)
        td__buf_addf(&b, "%zu %s %s %s\n", i, c->hosts[i].entry,
                     c->hosts[i].remote ? c->hosts[i].remote : "-",
                     c->hosts[i].remote ? (c->hosts[i].shared ? "shared" : "copied") : "-");
    char *path = hosts_file(c->job->run);
    td_chunk chunk = {b.s, b.len};
    if (td_write_atomic(path, "ssh host list", &chunk, 1) != TD_OK) {
        TD_LOG_WARN("%s", td_error_msg());
        td_error_clear();
    }
    free(path);
    free(b.s);
}

static int ssh_run(const td_exec_job *job) {
    const td_run *run = job->run;
    ssh_sup c = {.job = job};
    double t0 = td_now_s();
    int cli = 1;
    char why[1024];
    char **list = NULL;
    size_t nlist = 0;
    td_status st = td_ssh_hosts(job->ssh, job->project_dir, &list, &nlist);
    if (st != TD_OK) {
        cli = fail_run(&c, t0, "executor ssh: %s", td_error_msg());
        td_error_clear();
        goto out;
    }
    if ((int)nlist != run->nodes) {
        cli = fail_run(&c, t0,
                       "executor ssh: the hostfile names %zu host%s but the workflow has nodes: "
                       "%d (one node per host); make them agree",
                       nlist, nlist == 1 ? "" : "s", run->nodes);
        goto out;
    }
    c.ssh = td__exec_which("ssh");
    if (!c.ssh) {
        cli = fail_run(&c, t0,
                       "executor ssh: ssh is not on PATH; install OpenSSH's client (Debian: "
                       "openssh-client)");
        goto out;
    }
    c.nhosts = nlist;
    c.hosts = td_xcalloc(nlist, sizeof *c.hosts);
    for (size_t i = 0; i < nlist; i++) split_host(list[i], &c.hosts[i]);
    write_hosts_file(&c);
    st = td__exec_read_token(run, c.token);
    if (st != TD_OK) {
        cli = fail_run(&c, t0, "supervisor error: %s", td_error_msg());
        td_error_clear();
        goto out;
    }
    say(&c, "run %s: %zu ssh host%s (%s%s), %d worker%s each", run->id, c.nhosts,
        c.nhosts > 1 ? "s" : "", c.hosts[0].entry, c.nhosts > 1 ? ", ..." : "", run->nproc_per_node,
        run->nproc_per_node > 1 ? "s" : "");
    if (preflight(&c, why, sizeof why) != TD_OK) {
        cli = fail_run(&c, t0, "executor ssh: %s", why);
        goto out;
    }
    write_hosts_file(&c);
    if (copy_code(&c, why, sizeof why) != TD_OK) {
        cli = fail_run(&c, t0, "executor ssh: %s", why);
        goto out;
    }
    char *metrics_dir = td_xasprintf("%s/metrics", run->run_dir);
    st = td_ingester_new(job->store, run->id, metrics_dir, &c.ing);
    free(metrics_dir);
    char note[512];
    snprintf(note, sizeof note, "on ssh host%s %s%s", c.nhosts > 1 ? "s" : "", c.hosts[0].entry,
             c.nhosts > 1 ? ", ..." : "");
    if (st == TD_OK) st = td_run_set_status(job->store, run->id, TD_RUN_RUNNING, -1, note);
    if (st != TD_OK) {
        cli = fail_run(&c, t0, "supervisor error: %s", td_error_msg());
        td_error_clear();
        goto out;
    }

    stops ss = {.first_signal = job->stop_signal};
    attempt_end end;
    int restarts = 0, failed = -1;
    for (;;) {
        end = run_attempt(&c, job->resuming || restarts > 0, &ss, &failed, why, sizeof why);
        if (end != END_FAILED || restarts >= job->max_restarts) break;
        restarts++;
        if (td_run_set_restarts(job->store, run->id, job->base_restarts + restarts) != TD_OK)
            td_error_clear();
        say(&c, "run %s: restarting every node from the last checkpoint (restart %d of %d)",
            run->id, restarts, job->max_restarts);
        /* A moment for the failed host's sockets and processes to go. */
        if (td_loop_wait_readable(job->sigs->fd, 1.0)) { /* a stop in the pause: no attempt */
            handle_stops(&c, &ss, NULL, 0, &(double){0});
            if (ss.st.active) {
                end = END_STOPPED;
                c.stop_code = 1;
                break;
            }
        }
    }

    td__exec_final_ingest(job->out, c.ing);
    fetch_artifacts(&c);

    td__exec_outcome o = {.exit_code = 0, .cli_code = 0};
    if (end == END_OK) {
        o.status = TD_RUN_SUCCEEDED;
        snprintf(o.note, sizeof o.note, "%s", note);
    } else if (end == END_STOPPED) {
        int code = c.stop_code;
        o.exit_code = code;
        o.cli_code = code;
        if (ss.st.preempt) {
            o.status = code == 143 ? TD_RUN_PREEMPTED : TD_RUN_FAILED;
            snprintf(o.note, sizeof o.note,
                     "SIGTERM from outside tandem: %s; continue with tandem run --resume %s",
                     code == 143 ? "the workers checkpointed" : "not every worker checkpointed",
                     run->id);
        } else {
            o.status = TD_RUN_STOPPED;
            snprintf(o.note, sizeof o.note, "stopped by %s%s", ss.st.stopped_by,
                     code == 143 ? " after the workers checkpointed" : "");
        }
    } else {
        o.status = TD_RUN_FAILED;
        o.exit_code = c.failed_code > 0 ? c.failed_code : 1;
        o.cli_code = 1;
        snprintf(o.note, sizeof o.note, "%s%s", why,
                 job->max_restarts > 0 ? " (no restarts left)" : "");
    }
    cli = td__exec_record_end(job, &o, t0);
out:
    td_ingester_free(c.ing);
    for (size_t i = 0; i < c.nhosts; i++) {
        free(c.hosts[i].entry);
        free(c.hosts[i].dest);
        free(c.hosts[i].port);
        free(c.hosts[i].addr);
        free(c.hosts[i].remote);
        free(c.hosts[i].work);
    }
    free(c.hosts);
    td_ssh_hosts_free(list, nlist);
    free(c.ssh);
    return cli;
}

/* ---- after the supervisor ---- */
/* Nothing outlives a supervisor here: its ssh clients die with it (their death signal), and
 * each agent stops when its stdin ends. */
static td_status ssh_cancel_orphan(const td_run *run, int *cancelled, char *buf, size_t nbytes) {
    (void)run;
    *cancelled = 0;
    if (nbytes) buf[0] = '\0';
    return TD_OK;
}

static char *ssh_describe(const td_run *run) {
    char *path = hosts_file(run);
    FILE *f = fopen(path, "r");
    free(path);
    if (!f) return NULL;
    td__buf b = {0};
    td__buf_addf(&b, "ssh:");
    char line[1200];
    while (fgets(line, sizeof line, f)) {
        char name[300], remote[800], how[16];
        int node;
        if (sscanf(line, "%d %299s %799s %15s", &node, name, remote, how) != 4) continue;
        td__buf_addf(&b, "%s node %d on %s (%s%s%s)", node ? ";" : "", node, name,
                     strcmp(how, "-") ? how : "not reached", strcmp(how, "-") ? " " : "",
                     strcmp(how, "-") ? remote : "");
    }
    fclose(f);
    return b.s;
}

const td_executor td__executor_ssh = {
    .name = "ssh",
    .run = ssh_run,
    .cancel_orphan = ssh_cancel_orphan,
    .describe = ssh_describe,
};
