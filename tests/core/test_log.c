/* core: log lines reach a terminal safely. A message quotes outside text (a peer's line, a
 * file or metric name); its control bytes must not retitle or clear the terminal, hide what
 * came before (CR) or forge a second "tandem: error:" line (a newline inside). Asserts, on
 * stderr redirected to a file: td_log and td_error_print write each message as one line with
 * ESC, CR, BEL, DEL and inner newlines as \xNN, keep tabs and UTF-8, and end it with one '\n'. */
#include "test.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char *capture(void (*emit)(void)) {
    char path[] = "/tmp/td_test_log_XXXXXX";
    int fd = mkstemp(path);
    ASSERT(fd >= 0);
    fflush(stderr);
    int saved = dup(2);
    dup2(fd, 2);
    emit();
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    off_t n = lseek(fd, 0, SEEK_END);
    char *text = calloc(1, (size_t)n + 1);
    ASSERT_EQ(pread(fd, text, (size_t)n, 0), (ssize_t)n);
    close(fd);
    unlink(path);
    return text;
}

static void emit_warn(void) {
    TD_LOG_WARN("peer said '%s'", "\033]0;owned\007\033[2J\rok\nmeta\ttab \xc3\xa9\x7f");
}

static void emit_error(void) {
    td_error(TD_ERR_PEER, "node 1: %s", "bad\ntandem: error: forged");
    td_error_print(TD_ERR_PEER);
    td_error_clear();
}

int main(void) {
    char *w = capture(emit_warn);
    ASSERT_STREQ(w, "tandem: warning: peer said '\\x1b]0;owned\\x07\\x1b[2J\\x0dok\\x0ameta\ttab "
                    "\xc3\xa9\\x7f'\n");
    free(w);
    char *e = capture(emit_error);
    ASSERT_STREQ(e, "tandem: error: node 1: bad\\x0atandem: error: forged\n");
    free(e);
    return 0;
}
