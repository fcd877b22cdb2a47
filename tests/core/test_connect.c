/* core's one TCP dialler (td_connect_tcp, tandem/os.h): what each outcome reports. */
#include "test.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tandem/os.h"

/* The peer's address as the accepting side sees it must be the one we dialled. */
static void connect_and_accept(const char *host) {
    int lfd, port;
    ASSERT_OK(td_listen_tcp(host, 0, 4, &lfd, &port));
    int fd = -1;
    td_connect_result how = TD_CONNECT_FAILED;
    td_connect_opts o = {.deadline_s = td_now_s() + 5.0};
    ASSERT_OK(td_connect_tcp(host, port, &o, &fd, &how));
    ASSERT_EQ(how, TD_CONNECT_OK);
    ASSERT_GE(fd, 0);
    ASSERT(fcntl(fd, F_GETFD) & FD_CLOEXEC);
    ASSERT_EQ(fcntl(fd, F_GETFL) & O_NONBLOCK, 0); /* handed back blocking */
    int afd = accept(lfd, NULL, NULL);
    ASSERT_GE(afd, 0);
    ASSERT_EQ(write(fd, "x", 1), 1);
    char c = 0;
    ASSERT_EQ(read(afd, &c, 1), 1);
    ASSERT_EQ(c, 'x');
    close(afd);
    close(fd);
    /* no options and no deadline: the kernel's own timeout */
    ASSERT_OK(td_connect_tcp(host, port, NULL, &fd, NULL));
    close(fd);
    close(lfd);
}

static bool have_ipv6_loopback(void) {
    int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    bool ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

static void test_connects(void) {
    connect_and_accept("127.0.0.1");
    connect_and_accept("localhost"); /* a name, possibly ::1 first: every address is tried */
    if (have_ipv6_loopback())
        connect_and_accept("::1");
    else
        printf("no IPv6 loopback here: ::1 skipped\n");
}

static void test_refused(void) {
    int lfd, port;
    ASSERT_OK(td_listen_tcp("127.0.0.1", 0, 4, &lfd, &port));
    close(lfd); /* nobody listens there now */
    int fd = 7;
    td_connect_result how = TD_CONNECT_OK;
    td_connect_opts o = {.peer = "the store"};
    ASSERT_STATUS(td_connect_tcp("127.0.0.1", port, &o, &fd, &how), TD_ERR_PEER);
    ASSERT_EQ(how, TD_CONNECT_REFUSED);
    ASSERT_EQ(errno, ECONNREFUSED);
    ASSERT_EQ(fd, -1);
    char expect[64];
    snprintf(expect, sizeof expect, "cannot connect to the store at 127.0.0.1:%d", port);
    ASSERT_CONTAINS(td_error_msg(), expect);
    ASSERT_CONTAINS(td_error_msg(), "Connection refused");
    if (have_ipv6_loopback()) { /* an IPv6 literal is named in brackets */
        ASSERT_STATUS(td_connect_tcp("::1", port, NULL, &fd, &how), TD_ERR_PEER);
        ASSERT_EQ(how, TD_CONNECT_REFUSED);
        snprintf(expect, sizeof expect, "cannot connect to [::1]:%d", port);
        ASSERT_CONTAINS(td_error_msg(), expect);
    }
}

static void test_unresolved(void) {
    int fd;
    td_connect_result how = TD_CONNECT_OK;
    td_connect_opts o = {.peer = "the supervisor"};
    td_status st = td_connect_tcp("nosuch.invalid", 4242, &o, &fd, &how);
    if (how == TD_CONNECT_RESOLVE_AGAIN) { /* a sandbox whose resolver does not answer */
        ASSERT_EQ(st, TD_ERR_IO);
        printf("nosuch.invalid: the resolver failed for now (%s)\n", td_error_msg());
    } else {
        ASSERT_EQ(st, TD_ERR_INVALID);
        ASSERT_EQ(how, TD_CONNECT_UNRESOLVED);
    }
    ASSERT_CONTAINS(td_error_msg(), "cannot resolve the supervisor's host 'nosuch.invalid'");
    ASSERT_CONTAINS(td_error_msg(), "port 4242");
    /* no host at all is not "every interface" as it is for a listener */
    ASSERT_STATUS(td_connect_tcp("", 4242, &o, &fd, &how), TD_ERR_INVALID);
    ASSERT_EQ(how, TD_CONNECT_UNRESOLVED);
    ASSERT_CONTAINS(td_error_msg(), "cannot connect to the supervisor at port 4242: no host given");
    /* a name where a numeric address is required is never looked up */
    td_connect_opts numeric = {.numeric_host = true};
    ASSERT_STATUS(td_connect_tcp("localhost", 4242, &numeric, &fd, &how), TD_ERR_INVALID);
    ASSERT_EQ(how, TD_CONNECT_UNRESOLVED);
    ASSERT_CONTAINS(td_error_msg(), "numeric address");
}

static void test_deadline(void) {
    /* nothing answers there: the deadline ends the wait, or the sandbox has no route at all and
     * the kernel says so at once; either way well before the kernel's minutes of SYN retries */
    int fd;
    td_connect_result how = TD_CONNECT_OK;
    double t0 = td_now_s();
    td_connect_opts o = {.deadline_s = t0 + 0.3};
    td_status st = td_connect_tcp("10.255.255.1", 9, &o, &fd, &how);
    double took = td_now_s() - t0;
    printf("10.255.255.1 with a 0.3 s deadline: %s after %.2f s: %s\n", td_status_name(st), took,
           st == TD_OK ? "connected (this sandbox answers for every address)" : td_error_msg());
    ASSERT_LT(took * 1000, 1000);
    if (st == TD_OK)
        close(fd);
    else
        ASSERT(how == TD_CONNECT_REFUSED || how == TD_CONNECT_FAILED);
    if (st == TD_ERR_TIMEOUT) {
        ASSERT_EQ(how, TD_CONNECT_REFUSED);
        ASSERT_GE(took * 1000, 250);
        ASSERT_CONTAINS(td_error_msg(), "cannot connect to 10.255.255.1:9: no answer within");
    }
    /* the same, certain to be a silent peer: a listener whose accept queue is full drops the
     * SYNs of further connects (Linux), so they stay unanswered until the deadline */
    int lfd, port, first;
    ASSERT_OK(td_listen_tcp("127.0.0.1", 0, 0, &lfd, &port));
    ASSERT_OK(td_connect_tcp("127.0.0.1", port, NULL, &first, NULL)); /* fills the queue */
    t0 = td_now_s();
    o.deadline_s = t0 + 0.3;
    o.peer = "rank 0";
    st = td_connect_tcp("127.0.0.1", port, &o, &fd, &how);
    took = td_now_s() - t0;
    printf("a full listener with a 0.3 s deadline: %s after %.2f s: %s\n", td_status_name(st), took,
           td_error_msg());
    ASSERT_EQ(st, TD_ERR_TIMEOUT);
    ASSERT_EQ(how, TD_CONNECT_REFUSED);
    ASSERT_EQ(errno, ETIMEDOUT);
    ASSERT_GE(took * 1000, 290);
    ASSERT_LT(took * 1000, 1000);
    char expect[80];
    snprintf(expect, sizeof expect, "cannot connect to rank 0 at 127.0.0.1:%d: no answer within",
             port);
    ASSERT_CONTAINS(td_error_msg(), expect);
    close(first);
    close(lfd);

    /* a deadline already past still makes one try, and a listener on loopback answers it */
    ASSERT_OK(td_listen_tcp("127.0.0.1", 0, 4, &lfd, &port));
    td_connect_opts past = {.deadline_s = td_now_s() - 1.0};
    st = td_connect_tcp("127.0.0.1", port, &past, &fd, &how);
    if (st == TD_OK)
        close(fd);
    else
        ASSERT_EQ(st, TD_ERR_TIMEOUT);
    close(lfd);
}

typedef struct {
    int calls;
    int fd;
    int family;
} hook_seen;

static void before(int fd, const struct sockaddr *addr, socklen_t len, void *user) {
    hook_seen *h = user;
    h->calls++;
    h->fd = fd;
    h->family = addr->sa_family;
    ASSERT_EQ(len, (socklen_t)sizeof(struct sockaddr_in));
    int one = 1; /* what a caller does here: an option that must precede the connect */
    ASSERT_EQ(setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one), 0);
}

static void test_before_hook(void) {
    int lfd, port;
    ASSERT_OK(td_listen_tcp("127.0.0.1", 0, 4, &lfd, &port));
    hook_seen h = {.fd = -1};
    td_connect_opts o = {.numeric_host = true, .before = before, .user = &h};
    int fd;
    ASSERT_OK(td_connect_tcp("127.0.0.1", port, &o, &fd, NULL));
    ASSERT_EQ(h.calls, 1);
    ASSERT_EQ(h.fd, fd);
    ASSERT_EQ(h.family, AF_INET);
    int v = 0;
    socklen_t vl = sizeof v;
    ASSERT_EQ(getsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &v, &vl), 0);
    ASSERT_EQ(v, 1);
    close(fd);
    close(lfd);
}

int main(void) {
    test_connects();
    test_refused();
    test_unresolved();
    test_deadline();
    test_before_hook();
    TEST_PASS();
}
