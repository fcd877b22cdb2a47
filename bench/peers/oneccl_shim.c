/* What bench/peers/oneccl_allreduce.cpp needs besides PyPI's static libccl.a (oneccl-cpu-devel),
 * which was built with Intel's compiler and expects its runtime and ittnotify to be linked in:
 * the two memory routines Intel's compiler calls (plain libc ones here), and the ITT profiling
 * hooks as null pointers (oneCCL checks them before calling: no profiling). */
#include <stddef.h>
#include <string.h>

void *_intel_fast_memcpy(void *dst, const void *src, size_t nbytes);
void *_intel_fast_memset(void *dst, int c, size_t nbytes);

void *_intel_fast_memcpy(void *dst, const void *src, size_t nbytes) {
    return memcpy(dst, src, nbytes);
}

void *_intel_fast_memset(void *dst, int c, size_t nbytes) {
    return memset(dst, c, nbytes);
}

void *__itt_domain_create_ptr__3_0, *__itt_event_create_ptr__3_0, *__itt_event_end_ptr__3_0,
    *__itt_event_start_ptr__3_0, *__itt_metadata_add_ptr__3_0,
    *__itt_string_handle_create_ptr__3_0, *__itt_task_begin_ptr__3_0, *__itt_task_end_ptr__3_0,
    *__itt_thread_set_name_ptr__3_0;
