/* executors: the nodes' TCP links back to `tandem run` (src/exec/links.c, the supervisor's end)
 * and the agent that dials them (src/launch/agent_link.c), driven directly, without Slurm.
 *
 * 1. Strangers on the link port cannot keep the run's agents out: four connections that say
 *    nothing (one sends half a line) are opened and held before two real agents dial; the agents
 *    still join within seconds and their logs arrive, a peer with the wrong token is refused, and
 *    the strangers are closed at their handshake deadline and counted. When the supervisor
 *    handshook one peer at a time, each stranger held it for 5 s and the agents' only dial timed
 *    out: "no node connected back".
 * 2. An agent's first dial is retried: refused while nothing listens yet, then a connection that
 *    closes mid-handshake, then one that works; and an agent whose supervisor never appears gives
 *    up at its deadline with a message naming the endpoint.
 *
 * `test_links --bench N` (bench/bench_links.sh) instead has N agent processes join one
 * supervisor and prints the time until all joined and the supervisor's peak RSS. */
#include "test.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>

/* the exec layer's internals (test_slurm_unit reaches them through its include path) */
#include "../../src/exec/internal.h"
#include "tandem/launch.h"
#include "tandem/loop.h"
#include "tandem/mirror.h"
#include "tandem/os.h"

static const char TOKEN[] = "0123456789abcdef0123456789abcdef";
static char tmp[256];

/* Strangers that connect first and say nothing, and how long the agents have to join anyway
 * (they need well under a second; a supervisor that gave each stranger its 5 s in turn took
 * 20 s, and the agents gave up at 10). */
#define STRANGERS 4
#define JOIN_S    8.0

typedef struct {
    td_run run;
    td_exec_job job;
    char run_dir[300], work[300];
} fixture;

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f || fputs(text, f) < 0 || fclose(f) != 0) TEST_FAIL("writing %s", path);
}

static char *read_file(const char *path) {
    td__buf b = {0};
    td__buf_add(&b, "", 0);
    FILE *f = fopen(path, "r");
    if (!f) return b.s;
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof buf, f)) > 0;) td__buf_add(&b, buf, n);
    fclose(f);
    return b.s;
}

static void fixture_init(fixture *fx, const char *name, int nodes) {
    memset(fx, 0, sizeof *fx);
    snprintf(fx->run_dir, sizeof fx->run_dir, "%s/%s/run", tmp, name);
    snprintf(fx->work, sizeof fx->work, "%s/%s/work", tmp, name);
    ASSERT_OK(td_mkdirs(fx->run_dir));
    ASSERT_OK(td_mkdirs(fx->work));
    char path[400];
    snprintf(path, sizeof path, "%s/train.sh", fx->work);
    write_file(path, "echo the run's code\n");
    fx->run.id = "links-1";
    fx->run.nodes = nodes;
    fx->run.run_dir = fx->run_dir;
    fx->job.run = &fx->run;
    fx->job.work_dir = fx->work;
    fx->job.project_dir = fx->work; /* not a git work tree: the code is every file in it */
    fx->job.quiet_output = 1;
    fx->job.out = stdout;
}

static int connect_local(int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0)
        TEST_FAIL("connecting to 127.0.0.1:%d: %s", port, strerror(errno));
    return fd;
}

/* ---- an agent: a process of its own, as on a node ---- */
static int agent_main(const char *name, const char *endpoint, int node) {
    char dir[400], path[700];
    snprintf(dir, sizeof dir, "%s/%s/node-%d", tmp, name, node);
    if (td_mkdirs(dir) != TD_OK || chdir(dir) != 0) return 2;
    snprintf(path, sizeof path, "%s/agent.err", dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || dup2(fd, STDERR_FILENO) < 0) return 2;
    close(fd);
    setenv(td_var_name(TD_VAR_TANDEM_TOKEN), TOKEN, 1);
    unsetenv(td_var_name(TD_VAR_TANDEM_CHECKPOINT_DIR));
    char logs[500], metrics[500];
    snprintf(logs, sizeof logs, "%s/logs", dir);
    snprintf(metrics, sizeof metrics, "%s/metrics", dir);
    if (td_mkdirs(logs) != TD_OK || td_mkdirs(metrics) != TD_OK) return 2;
    snprintf(path, sizeof path, "%s/rank-%d.log", logs, node);
    char line[64];
    snprintf(line, sizeof line, "hello from node %d\n", node);
    write_file(path, line);
    double t0 = td_now_s();
    td_agent_link *link = NULL;
    td_status st = td_agent_link_connect(endpoint, node, logs, metrics, &link);
    if (st != TD_OK) {
        fprintf(stderr, "AGENT FAILED after %.1f s: %s\n", td_now_s() - t0, td_error_msg());
        return 3;
    }
    snprintf(path, sizeof path, "%s/joined", dir); /* when it dialled and when it was in */
    FILE *f = fopen(path, "w");
    if (f) {
        fprintf(f, "%.6f %.6f\n", t0, td_now_s());
        fclose(f);
    }
    /* the run's code came down (the retry test's supervisor sends none) */
    if (strcmp(name, "retry") && access("train.sh", F_OK) != 0) return 4;
    st = td_agent_link_close(link);
    if (st != TD_OK) fprintf(stderr, "AGENT CLOSE FAILED: %s\n", td_error_msg());
    return st == TD_OK ? 0 : 5;
}

static pid_t spawn_agent(const char *name, const char *endpoint, int node) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) TEST_FAIL("fork: %s", strerror(errno));
    if (pid == 0) _exit(agent_main(name, endpoint, node));
    return pid;
}

static char *agent_err(const char *name, int node) {
    char path[500];
    snprintf(path, sizeof path, "%s/%s/node-%d/agent.err", tmp, name, node);
    return read_file(path);
}

/* A peer that holds the wrong token: the supervisor must answer "denied", promptly. */
static pid_t spawn_wrong_token(int port) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) TEST_FAIL("fork: %s", strerror(errno));
    if (pid == 0) {
        int fd = connect_local(port);
        td_status st = td_mirror_auth_connect(fd, "ffffffffffffffffffffffffffffffff", 4000);
        _exit(st == TD_ERR_AUTH ? 0 : 3);
    }
    return pid;
}

/* The exit code of a child that ended (-1: still running), reaped. */
static int reap(pid_t pid) {
    int status;
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == 0) return -1;
    if (r != pid) TEST_FAIL("waitpid %d: %s", (int)pid, strerror(errno));
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* Everything the peer sends until it closes; returns 1 when it closed (EOF or reset). */
static int closed_by_peer(int fd) {
    char buf[512];
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 0) <= 0) return 0;
        ssize_t n = read(fd, buf, sizeof buf);
        if (n == 0 || (n < 0 && errno == ECONNRESET)) return 1;
        if (n < 0) return 0;
    }
}

/* The links on an event loop of their own, as the supervisor serves them on its loop. */
static td_loop *attached(td__links *l) {
    td_loop *loop = NULL;
    ASSERT_OK(td_loop_new(&loop));
    ASSERT_OK(td__links_attach(l, loop));
    return loop;
}

static void turn(td_loop *loop, double max_wait_s) {
    ASSERT_OK(td_loop_turn(loop, max_wait_s));
}

/* After the job: what the links still carry, until every agent said its end or seconds pass. */
static void drain(td_loop *loop, td__links *l, double seconds) {
    for (double until = td_now_s() + seconds; td__links_open_count(l) && td_now_s() < until;)
        turn(loop, 0.1);
    td__links_flush_lines(l);
}

static void detach_free(td_loop *loop, td__links *l) {
    td__links_free(l); /* detaches itself */
    td_loop_free(loop);
}

/* ---- 1. strangers first, then the run's agents ---- */
static void test_strangers(void) {
    fixture fx;
    fixture_init(&fx, "strangers", 2);
    td__links *l = NULL;
    ASSERT_OK(td__links_open(&fx.job, TOKEN, "127.0.0.1", &l));
    td_loop *loop = attached(l);
    const char *endpoint = td__links_endpoint(l);
    int port = atoi(strrchr(endpoint, ':') + 1);

    /* The strangers connect first (the kernel completes their connections before anyone
     * accepts), so they are ahead of the agents in the listen queue. */
    int strangers[STRANGERS];
    for (int i = 0; i < STRANGERS; i++) strangers[i] = connect_local(port);
    ASSERT_EQ(write(strangers[STRANGERS - 1], "0123", 4), 4); /* half an answer, then nothing */

    double t0 = td_now_s();
    pid_t agents[2] = {spawn_agent("strangers", endpoint, 0),
                       spawn_agent("strangers", endpoint, 1)};
    pid_t wrong = spawn_wrong_token(port);
    int codes[2] = {-1, -1}, wrong_code = -1;
    double joined_at = -1;
    while (td_now_s() - t0 < JOIN_S + 10) {
        turn(loop, 0.05);
        if (joined_at < 0 && td__links_nodes_seen(l) == 2) joined_at = td_now_s() - t0;
        for (int i = 0; i < 2; i++)
            if (codes[i] < 0) codes[i] = reap(agents[i]);
        if (wrong_code < 0) wrong_code = reap(wrong);
        if (codes[0] >= 0 && codes[1] >= 0 && wrong_code >= 0) break;
        if (joined_at < 0 && td_now_s() - t0 > JOIN_S) break;
    }
    if (joined_at < 0 || joined_at > JOIN_S) {
        for (double t = td_now_s(); td_now_s() - t < 8 && (codes[0] < 0 || codes[1] < 0);
             usleep(50 * 1000))
            for (int i = 0; i < 2; i++)
                if (codes[i] < 0) codes[i] = reap(agents[i]); /* to show how they ended */
        char *e0 = agent_err("strangers", 0), *e1 = agent_err("strangers", 1);
        TEST_FAIL("with %d silent connections held open, %d of 2 agents joined within %.0f s "
                  "(agent exit codes %d %d)\nnode 0: %s\nnode 1: %s",
                  STRANGERS, td__links_nodes_seen(l), JOIN_S, codes[0], codes[1], e0, e1);
    }
    printf("both agents joined %.2f s after dialling, past %d silent connections\n", joined_at,
           STRANGERS);
    for (int i = 0; i < 2; i++)
        if (codes[i] != 0) {
            char *e = agent_err("strangers", i);
            TEST_FAIL("agent %d exited %d: %s", i, codes[i], e);
        }
    ASSERT_EQ(wrong_code, 0); /* heard "denied" */
    drain(loop, l, 5.0);
    for (int i = 0; i < 2; i++) {
        char path[400], want[64];
        snprintf(path, sizeof path, "%s/logs/rank-%d.log", fx.run_dir, i);
        snprintf(want, sizeof want, "hello from node %d\n", i);
        char *got = read_file(path);
        ASSERT_STREQ(got, want);
        free(got);
    }

    /* The strangers are closed at their deadline (5 s from their connection) and counted, as
     * is the wrong token; the supervisor served everyone else meanwhile. */
    ASSERT_GE(td__links_refused(l), 1);
    while (td__links_refused(l) < STRANGERS + 1 && td_now_s() - t0 < 12) turn(loop, 0.05);
    ASSERT_EQ(td__links_refused(l), STRANGERS + 1);
    for (int i = 0; i < STRANGERS; i++) {
        if (!closed_by_peer(strangers[i])) TEST_FAIL("stranger %d is still connected", i);
        close(strangers[i]);
    }
    printf("the %d strangers were closed %.1f s after they connected; %d refusals counted\n",
           STRANGERS, td_now_s() - t0, td__links_refused(l));
    detach_free(loop, l);
}

/* ---- 2. the agent's first dial is retried ---- */
/* A port that nothing listens on (bound, read, closed). */
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0)
        TEST_FAIL("binding a port: %s", strerror(errno));
    close(fd);
    return ntohs(a.sin_port);
}

static int listen_on(int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 8) != 0)
        TEST_FAIL("listening on 127.0.0.1:%d again: %s", port, strerror(errno));
    return fd;
}

/* The next connection to lfd, from the agent `pid` (named `name` for its messages). */
static int accept_from(int lfd, pid_t pid, const char *name) {
    for (double t0 = td_now_s(); td_now_s() - t0 < 15;) {
        struct pollfd p = {.fd = lfd, .events = POLLIN};
        if (poll(&p, 1, 100) > 0) return accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        int code = reap(pid);
        if (code >= 0) {
            char *e = agent_err(name, 0);
            TEST_FAIL("the agent stopped dialling (exit code %d): %s", code, e);
        }
    }
    TEST_FAIL("the agent did not dial again within 15 s");
}

/* Nobody ever listens here: the agent gives up at its deadline (10 s, so it starts first and
 * ends last) and says where it dialled. */
static int never;
static double t_never;
static pid_t lonely;

static void start_lonely(void) {
    char endpoint[64];
    never = free_port();
    snprintf(endpoint, sizeof endpoint, "127.0.0.1:%d", never);
    t_never = td_now_s();
    lonely = spawn_agent("never", endpoint, 0);
}

static void test_retry(void) {
    char endpoint[64];

    /* Refused for a while, then a connection closed during the handshake, then a supervisor. */
    int port = free_port();
    snprintf(endpoint, sizeof endpoint, "127.0.0.1:%d", port);
    double t0 = td_now_s();
    pid_t agent = spawn_agent("retry", endpoint, 0);
    usleep(400 * 1000);
    int lfd = listen_on(port);
    int fd = accept_from(lfd, agent, "retry");
    ASSERT(fd >= 0);
    close(fd); /* before the challenge: the agent hears the connection close */
    fd = accept_from(lfd, agent, "retry");
    ASSERT(fd >= 0);
    ASSERT_OK(td_mirror_auth_accept(fd, TOKEN, 5000));
    char line[64];
    ASSERT_OK(td_mirror_read_line(fd, line, sizeof line, td_now_ns() + 5000000000ull, "hello"));
    ASSERT_STREQ(line, "hello 0 1");
    ASSERT_EQ(write(fd, "go\n", 3), 3);
    char buf[4096];
    while (read(fd, buf, sizeof buf) > 0) {
    } /* the agent's mirror stream, to its end */
    close(fd);
    close(lfd);
    int code;
    while ((code = reap(agent)) < 0) usleep(10 * 1000);
    if (code != 0) {
        char *e = agent_err("retry", 0);
        TEST_FAIL("the agent whose first dials were refused and cut short exited %d: %s", code, e);
    }
    printf("an agent refused for 0.4 s and then cut off mid-handshake joined after %.2f s\n",
           td_now_s() - t0);

    while ((code = reap(lonely)) < 0) usleep(50 * 1000);
    double took = td_now_s() - t_never;
    char *e = agent_err("never", 0);
    if (code != 3) TEST_FAIL("the agent with nobody to dial exited %d: %s", code, e);
    snprintf(endpoint, sizeof endpoint, "127.0.0.1:%d", never);
    ASSERT_CONTAINS(e, endpoint);
    ASSERT_CONTAINS(e, "attempts");
    ASSERT_CONTAINS(e, "link_host");
    if (took < 5.0) TEST_FAIL("the agent with nobody to dial gave up after %.1f s: %s", took, e);
    printf("an agent with nobody to dial gave up after %.1f s: %s", took, strstr(e, "AGENT"));
    free(e);
}

/* ---- bench: N agents join one supervisor ---- */
static long vm_kib(const char *field) {
    char *s = read_file("/proc/self/status");
    const char *p = strstr(s, field);
    long v = p ? atol(p + strlen(field) + 1) : -1;
    free(s);
    return v;
}

static int bench(int n) {
    fixture fx;
    fixture_init(&fx, "bench", n);
    long hwm0 = vm_kib("VmHWM");
    td__links *l = NULL;
    ASSERT_OK(td__links_open(&fx.job, TOKEN, "127.0.0.1", &l));
    td_loop *loop = attached(l);
    const char *endpoint = td__links_endpoint(l);
    pid_t *pids = td_xcalloc((size_t)n, sizeof *pids);
    int *codes = td_xcalloc((size_t)n, sizeof *codes);
    double t0 = td_now_s(), joined = -1, done = -1;
    for (int i = 0; i < n; i++) pids[i] = spawn_agent("bench", endpoint, i);
    double forked = td_now_s() - t0;
    int left = n;
    for (int i = 0; i < n; i++) codes[i] = -1;
    while (td_now_s() - t0 < 120 && left) {
        turn(loop, 0.02);
        if (joined < 0 && td__links_nodes_seen(l) == n) joined = td_now_s() - t0;
        for (int i = 0; i < n; i++)
            if (codes[i] < 0 && (codes[i] = reap(pids[i])) >= 0) left--;
    }
    drain(loop, l, 10.0);
    done = td_now_s() - t0;
    int failed = 0;
    for (int i = 0; i < n; i++) failed += codes[i] != 0;
    /* each agent's own view: when it began to dial (after fork), how long until it was in */
    double *took = td_xcalloc((size_t)n, sizeof *took), last_start = 0;
    int nt = 0;
    for (int i = 0; i < n; i++) {
        char path[500];
        snprintf(path, sizeof path, "%s/bench/node-%d/joined", tmp, i);
        char *text = read_file(path);
        double a, b;
        if (sscanf(text, "%lf %lf", &a, &b) == 2) {
            took[nt++] = b - a;
            last_start = TD_MAX(last_start, a - t0);
        }
        free(text);
    }
    for (int i = 1; i < nt; i++) /* insertion sort: a few hundred */
        for (int k = i; k > 0 && took[k - 1] > took[k]; k--) {
            double t = took[k];
            took[k] = took[k - 1];
            took[k - 1] = t;
        }
    printf("bench_links: %d agents (processes on this host, each: connect, token handshake, "
           "hello, the code as a tar stream, a log line, end)\n",
           n);
    printf("  forking them took %.2f s\n", forked);
    printf("  all joined after   %.2f s%s\n", joined, joined < 0 ? " (not all joined)" : "");
    printf("  all ended after    %.2f s; %d failed, %d connections refused\n", done, failed,
           td__links_refused(l));
    if (nt)
        printf("  the agents' own dial (connect to go): median %.3f s, 90%% %.3f s, max %.3f s; "
               "the last began %.2f s after the first fork\n",
               took[nt / 2], took[nt * 9 / 10], took[nt - 1], last_start);
    free(took);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru); /* this process and its threads, not the agents */
    printf("  supervisor peak RSS (VmHWM) %ld KiB (%ld KiB before opening the links); its CPU "
           "time %.2f s\n",
           vm_kib("VmHWM"), hwm0,
           (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
               (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6);
    for (int i = 0; i < n && failed; i++)
        if (codes[i] != 0) {
            char *e = agent_err("bench", i);
            printf("  agent %d exited %d: %s", i, codes[i], e);
            free(e);
            break;
        }
    detach_free(loop, l);
    free(pids);
    free(codes);
    return failed ? 1 : 0;
}

int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN);
    snprintf(tmp, sizeof tmp, "%s/tandem-links-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(tmp)) TEST_FAIL("mkdtemp: %s", strerror(errno));
    int rc = 0;
    if (argc == 3 && !strcmp(argv[1], "--bench")) {
        rc = bench(atoi(argv[2]));
    } else {
        /* argv[1] "strangers" or "retry": that part alone */
        if (argc < 2 || !strcmp(argv[1], "retry")) start_lonely();
        if (argc < 2 || !strcmp(argv[1], "strangers")) test_strangers();
        if (argc < 2 || !strcmp(argv[1], "retry")) test_retry();
        printf("ok\n");
    }
    char *rm = td_xasprintf("rm -rf '%s'", tmp);
    if (system(rm) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    free(rm);
    return rc;
}
