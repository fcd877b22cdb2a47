/* Thread control: one OpenMP team size for tandem's kernels; OpenBLAS stays single-threaded
 * because its own threading changes results with the thread count (see tensor.h). */
#include <cblas.h>
#include <omp.h>
#include <pthread.h>

#include "tandem/tensor.h"

/* Not in every cblas.h: OpenBLAS's extension. */
void openblas_set_num_threads(int num_threads);

static int g_threads;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static void apply(int n) {
    if (n <= 0) n = omp_get_num_procs();
    pthread_mutex_lock(&g_lock);
    g_threads = n;
    omp_set_num_threads(n);
    openblas_set_num_threads(1);
    pthread_mutex_unlock(&g_lock);
}

static void init_from_env(void) {
    if (g_threads == 0) apply((int)td_env_int(TD_ENV_NUM_THREADS));
}

void td_set_num_threads(int n) {
    pthread_once(&g_once, init_from_env);
    apply(n);
}

int td_get_num_threads(void) {
    pthread_once(&g_once, init_from_env);
    return __atomic_load_n(&g_threads, __ATOMIC_RELAXED);
}
