/* GPU memory and utilisation from the NVIDIA driver's NVML, loaded at run time (private to the
 * track layer). libnvidia-ml.so.1 is dlopen'ed once per process; where it is missing or cannot
 * initialise (no driver, no GPU) everything here reports "unavailable" and sysmon writes CPU
 * metrics only. The attribution of NVML's process list to ranks is a pure function, tested on its
 * own (tests/track/test_nvml.c). */
#ifndef TD_TRACK_NVML_H
#define TD_TRACK_NVML_H

#include <stddef.h>
#include <sys/types.h>

#include "tandem/core.h"

/* NVML_VALUE_NOT_AVAILABLE: the driver cannot tell a process's memory (e.g. some containers). */
#define TD_NVML_MEM_UNKNOWN (~0ULL)

/* One running compute process on one device, as NVML lists it. pid is in the PID namespace NVML
 * sees (the host's): inside a container without the host's PID namespace nothing matches. */
typedef struct td_nvml_proc {
    unsigned pid;
    int device;                    /* index into td_nvml_snapshot.util */
    unsigned long long used_bytes; /* TD_NVML_MEM_UNKNOWN when NVML cannot tell */
} td_nvml_proc;

/* What every device runs and how busy it is, at one moment. */
typedef struct td_nvml_snapshot {
    int ndevices;
    int *util; /* per device: % of the last sample period a kernel ran; -1 when unknown */
    td_nvml_proc *procs;
    size_t nprocs;
} td_nvml_snapshot;

/* 1 when NVML is loaded and initialised. The first call (any thread; pthread_once) loads it and,
 * when it cannot, logs the reason once at debug level. Otherwise 0, and *reason (may be NULL)
 * receives why: a static string such as "libnvidia-ml.so.1: cannot open shared object file". */
int td_nvml_available(const char **reason);

/* Every device's utilisation and running compute processes. TD_ERR_UNSUPPORTED (reason in the
 * error detail) without NVML; a failed query is an error too, *snap is then empty. */
td_status td_nvml_snapshot_take(td_nvml_snapshot *snap);
void td_nvml_snapshot_free(td_nvml_snapshot *snap);

/* One rank's share of the GPUs. */
typedef struct td_nvml_rank_use {
    int on_gpu;    /* some process of the rank is on a device */
    int mem_known; /* NVML told the memory of at least one of those processes */
    double mem_mb; /* sum of their used memory over all devices, MiB */
    double util;   /* max utilisation % over the devices they are on; -1 when unknown */
} td_nvml_rank_use;

/* Attributes snap's processes to ranks: a process whose pid is pids[i] belongs to ranks[i]
 * (npids pairs, a rank's whole process subtree); others (other users, other runs) are ignored.
 * use[0..nranks) is overwritten; ranks outside [0, nranks) are skipped. Utilisation is the max,
 * not the mean, over the devices the rank's processes are on: a rank normally drives one device,
 * and where it spans several the busiest one is the one that shows whether it keeps them fed. */
void td_nvml_attribute(const td_nvml_snapshot *snap, const pid_t *pids, const int *ranks,
                       size_t npids, td_nvml_rank_use *use, int nranks);

#endif
