/* NVML through dlopen: the driver's libnvidia-ml.so.1 when there is one, nothing otherwise. No
 * nvml.h is needed to build: the few entry points and structs used are declared here with the
 * NVML ABI (nvml.h of CUDA 11.x/12.x). NVML stays loaded and initialised for the life of the
 * process (nvmlShutdown only undoes a half-done start): sysmon samples it every few seconds from
 * whichever thread, and NVML's own calls are thread-safe. */
#include "track/nvml.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;
enum { NVML_SUCCESS = 0, NVML_ERROR_NOT_SUPPORTED = 3, NVML_ERROR_INSUFFICIENT_SIZE = 7 };

typedef struct nvmlUtilization_st {
    unsigned int gpu;    /* % of the sample period a kernel ran */
    unsigned int memory; /* % of the sample period device memory was read or written */
} nvmlUtilization_t;

/* nvmlProcessInfo_v2_t, the nvmlProcessInfo_t of the _v2 and _v3 process queries. */
typedef struct nvmlProcessInfo_st {
    unsigned int pid;
    unsigned long long usedGpuMemory; /* NVML_VALUE_NOT_AVAILABLE (~0ULL) when unknown */
    unsigned int gpuInstanceId;       /* MIG: 0xFFFFFFFF when not in MIG mode */
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

static struct {
    nvmlReturn_t (*init)(void);
    nvmlReturn_t (*shutdown)(void);
    nvmlReturn_t (*count)(unsigned int *count);
    nvmlReturn_t (*handle)(unsigned int index, nvmlDevice_t *device);
    nvmlReturn_t (*util)(nvmlDevice_t device, nvmlUtilization_t *util);
    nvmlReturn_t (*procs)(nvmlDevice_t device, unsigned int *count, nvmlProcessInfo_t *infos);
    const char *(*error_string)(nvmlReturn_t r);
} nv;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static int loaded;
static char why_off[256];

static void set_reason(const char *fmt, ...) TD_PRINTF(1, 2);
static void set_reason(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why_off, sizeof why_off, fmt, ap);
    va_end(ap);
}

static const char *nvml_error(nvmlReturn_t r) {
    const char *s = nv.error_string ? nv.error_string(r) : NULL;
    return s ? s : "unknown NVML error";
}

/* dlsym into a function pointer (POSIX: a void * from dlsym converts to a function pointer). */
static int resolve(void *lib, void *slot, const char *name) {
    void *sym = dlsym(lib, name);
    memcpy(slot, &sym, sizeof sym);
    return sym != NULL;
}

static void load(void) {
    static const char soname[] = "libnvidia-ml.so.1";
    void *lib = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *e = dlerror();
        set_reason("%s", e ? e : "libnvidia-ml.so.1: dlopen failed");
        goto off;
    }
    resolve(lib, &nv.error_string, "nvmlErrorString");
    /* _v3 since driver 510; _v2 (the same struct) before it. */
    if (!resolve(lib, &nv.procs, "nvmlDeviceGetComputeRunningProcesses_v3"))
        resolve(lib, &nv.procs, "nvmlDeviceGetComputeRunningProcesses_v2");
    const struct {
        void *slot;
        const char *name;
    } need[] = {
        {&nv.init, "nvmlInit_v2"},
        {&nv.shutdown, "nvmlShutdown"},
        {&nv.count, "nvmlDeviceGetCount_v2"},
        {&nv.handle, "nvmlDeviceGetHandleByIndex_v2"},
        {&nv.util, "nvmlDeviceGetUtilizationRates"},
    };
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
        if (!resolve(lib, need[i].slot, need[i].name)) {
            set_reason("%s: no %s (driver too old?)", soname, need[i].name);
            goto close;
        }
    if (!nv.procs) {
        set_reason("%s: no nvmlDeviceGetComputeRunningProcesses_v3 or _v2 (driver too old?)",
                   soname);
        goto close;
    }
    nvmlReturn_t r = nv.init();
    if (r != NVML_SUCCESS) {
        set_reason("nvmlInit_v2: %s", nvml_error(r));
        goto close;
    }
    unsigned int n = 0;
    r = nv.count(&n);
    if (r != NVML_SUCCESS || n == 0) {
        if (r != NVML_SUCCESS)
            set_reason("nvmlDeviceGetCount_v2: %s", nvml_error(r));
        else
            set_reason("NVML sees no GPU");
        nv.shutdown();
        goto close;
    }
    loaded = 1;
    TD_LOG_DEBUG("GPU metrics from NVML: %u device(s)", n);
    return;
close:
    dlclose(lib);
    nv.error_string = NULL;
off:
    TD_LOG_DEBUG("no GPU metrics: %s", why_off);
}

int td_nvml_available(const char **reason) {
    pthread_once(&load_once, load);
    if (reason) *reason = loaded ? NULL : why_off;
    return loaded;
}

void td_nvml_snapshot_free(td_nvml_snapshot *snap) {
    if (!snap) return;
    free(snap->util);
    free(snap->procs);
    *snap = (td_nvml_snapshot){0};
}

/* Appends device's compute processes to snap; the list can grow between the two calls. */
static td_status device_procs(nvmlDevice_t dev, int index, td_nvml_snapshot *snap, size_t *cap) {
    unsigned int want = 32;
    nvmlProcessInfo_t *infos = NULL;
    for (int attempt = 0;; attempt++) {
        infos = td_xrealloc(infos, want * sizeof *infos);
        unsigned int n = want;
        nvmlReturn_t r = nv.procs(dev, &n, infos);
        if (r == NVML_ERROR_INSUFFICIENT_SIZE && attempt < 4) {
            want = (n > want ? n : want) * 2;
            continue;
        }
        if (r == NVML_ERROR_NOT_SUPPORTED)
            n = 0;
        else if (r != NVML_SUCCESS) {
            free(infos);
            return td_error(TD_ERR_SYS, "nvmlDeviceGetComputeRunningProcesses (device %d): %s",
                            index, nvml_error(r));
        }
        if (snap->nprocs + n > *cap) {
            *cap = 2 * (snap->nprocs + n);
            snap->procs = td_xrealloc(snap->procs, *cap * sizeof *snap->procs);
        }
        for (unsigned int i = 0; i < n; i++)
            snap->procs[snap->nprocs++] =
                (td_nvml_proc){infos[i].pid, index, infos[i].usedGpuMemory};
        free(infos);
        return TD_OK;
    }
}

td_status td_nvml_snapshot_take(td_nvml_snapshot *snap) {
    *snap = (td_nvml_snapshot){0};
    const char *why;
    if (!td_nvml_available(&why)) return td_error(TD_ERR_UNSUPPORTED, "no NVML: %s", why);
    unsigned int n = 0;
    nvmlReturn_t r = nv.count(&n);
    if (r != NVML_SUCCESS) return td_error(TD_ERR_SYS, "nvmlDeviceGetCount_v2: %s", nvml_error(r));
    snap->ndevices = (int)n;
    snap->util = td_xcalloc(n ? n : 1, sizeof *snap->util);
    size_t cap = 0;
    for (unsigned int d = 0; d < n; d++) {
        nvmlDevice_t dev;
        r = nv.handle(d, &dev);
        if (r != NVML_SUCCESS) {
            td_nvml_snapshot_free(snap);
            return td_error(TD_ERR_SYS, "nvmlDeviceGetHandleByIndex_v2(%u): %s", d, nvml_error(r));
        }
        /* Not supported under MIG, for one: unknown rather than an error. */
        nvmlUtilization_t u;
        snap->util[d] = nv.util(dev, &u) == NVML_SUCCESS ? (int)u.gpu : -1;
        td_status st = device_procs(dev, (int)d, snap, &cap);
        if (st != TD_OK) {
            td_nvml_snapshot_free(snap);
            return st;
        }
    }
    return TD_OK;
}

void td_nvml_attribute(const td_nvml_snapshot *snap, const pid_t *pids, const int *ranks,
                       size_t npids, td_nvml_rank_use *use, int nranks) {
    for (int r = 0; r < nranks; r++) use[r] = (td_nvml_rank_use){0, 0, 0.0, -1.0};
    for (size_t p = 0; p < snap->nprocs; p++) {
        const td_nvml_proc *pr = &snap->procs[p];
        int rank = -1;
        for (size_t i = 0; i < npids && rank < 0; i++)
            if (pids[i] > 0 && (unsigned)pids[i] == pr->pid) rank = ranks[i];
        if (rank < 0 || rank >= nranks) continue;
        td_nvml_rank_use *u = &use[rank];
        u->on_gpu = 1;
        if (pr->used_bytes != TD_NVML_MEM_UNKNOWN) {
            u->mem_known = 1;
            u->mem_mb += (double)pr->used_bytes / (1024.0 * 1024.0);
        }
        if (pr->device >= 0 && pr->device < snap->ndevices && snap->util[pr->device] >= 0 &&
            snap->util[pr->device] > u->util)
            u->util = snap->util[pr->device];
    }
}
