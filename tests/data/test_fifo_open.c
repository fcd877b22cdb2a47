/* data: the array readers refuse a FIFO (or any non-regular file) at once, named, instead of
 * waiting in open(2) for a writer that never comes (issue 29: `tandem train` refuses one before
 * reading, but the readers are a library: td_npy_read, td_npz_read and td_safetensors_read called
 * directly blocked forever). Nobody opens the FIFO for writing here: a reader that blocks is
 * caught by an alarm, generous for a loaded machine since a refusal takes microseconds. */
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tandem/data.h"
#include "test.h"

static char tmpdir[] = "/tmp/td_test_fifo_XXXXXX";

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "FAIL: a reader blocked in open(2) on a FIFO for 60 s\n";
    (void)!write(2, msg, sizeof msg - 1);
    _exit(1);
}

int main(void) {
    signal(SIGALRM, on_alarm);
    alarm(60);
    ASSERT(mkdtemp(tmpdir));
    char *fifo = td_xasprintf("%s/x.npy", tmpdir);
    ASSERT_EQ(mkfifo(fifo, 0600), 0);
    td_array a;
    ASSERT_STATUS(td_npy_read(fifo, false, &a), TD_ERR_IO);
    ASSERT_CONTAINS(td_error_msg(), "is not a regular file");
    ASSERT_CONTAINS(td_error_msg(), fifo);
    ASSERT_STATUS(td_npz_read(fifo, "x", false, &a), TD_ERR_IO);
    ASSERT_CONTAINS(td_error_msg(), "is not a regular file");
    ASSERT_STATUS(td_safetensors_read(fifo, "x", false, &a), TD_ERR_IO);
    ASSERT_CONTAINS(td_error_msg(), "is not a regular file");
    unlink(fifo);
    rmdir(tmpdir);
    free(fifo);
    TEST_PASS();
}
