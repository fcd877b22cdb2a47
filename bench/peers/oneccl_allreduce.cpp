// Peer benchmark: oneCCL's allreduce (float32 sum, in place) at doubling sizes, nccl-tests
// columns, timed as bench/peers/mpi_allreduce.c times MPI_Allreduce (3 warm-up calls, a barrier,
// then a loop; the slowest rank's time per call) so the two read alike, with fewer calls where
// they are slow (below).
//
// oneCCL from PyPI (oneccl-cpu-devel, a static libccl.a built with Intel's compiler): it needs
// oneccl_shim.c (Intel's _intel_fast_memcpy/memset and disabled ITT hooks, which the wheel does
// not ship), hwloc and, at run time, libfabric (ATL "ofi", the default; Debian's libfabric1).
// bench/bench_torch_comm.sh builds it (V: the venv holding the wheel):
//   g++ -O2 -std=c++17 -I$V/include oneccl_allreduce.cpp oneccl_shim.o
//       $V/lib/ccl/cpu/lib/libccl.a -lhwloc -lpthread -ldl -lrt
// Run: under `tandem launch --nproc-per-node N` (RANK, WORLD_SIZE), or any launcher setting
// them: oneccl_allreduce ADDR_FILE [min_bytes max_bytes]. Rank 0 writes oneCCL's key-value
// store address into ADDR_FILE (by rename, so a reader sees all of it or nothing); the others
// read it from there.
#include <oneapi/ccl.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

static int env_int(const char* name) {
    const char* v = std::getenv(name);
    if (!v || !*v) {
        std::fprintf(stderr, "oneccl_allreduce: %s is not set (run it under tandem launch)\n", name);
        std::exit(2);
    }
    return std::atoi(v);
}

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: oneccl_allreduce ADDR_FILE [min_bytes max_bytes]\n");
        return 2;
    }
    ccl::init();
    const int n = env_int("WORLD_SIZE"), rank = env_int("RANK");
    const std::string path = argv[1];
    size_t minb = argc > 3 ? std::strtoull(argv[2], nullptr, 10) : 4096;
    size_t maxb = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : (64u << 20);
    ccl::shared_ptr_class<ccl::kvs> kvs;
    ccl::kvs::address_type addr;
    if (rank == 0) {
        kvs = ccl::create_main_kvs();
        addr = kvs->get_address();
        std::ofstream(path + ".tmp", std::ios::binary)
            .write(reinterpret_cast<const char*>(addr.data()), addr.size());
        std::rename((path + ".tmp").c_str(), path.c_str());
    } else {
        // The bootstrap only: rank 0 is up within seconds; a bench, not a test.
        for (int tries = 0;; tries++) {
            std::ifstream f(path, std::ios::binary);
            if (f && f.read(reinterpret_cast<char*>(addr.data()), addr.size())) break;
            if (tries > 12000) {
                std::fprintf(stderr, "oneccl_allreduce: no address from rank 0 in %s\n", path.c_str());
                return 1;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        kvs = ccl::create_kvs(addr);
    }
    auto comm = ccl::create_communicator(n, rank, kvs);
    std::vector<float> buf(maxb / sizeof(float));
    if (rank == 0)
        std::printf("# %12s %10s %10s %10s %8s\n", "bytes", "time_us", "algbw_GBs", "busbw_GBs",
                    "wrong");
    for (size_t b = minb; b <= maxb; b *= 2) {
        size_t count = b / sizeof(float);
        float* p = buf.data();
        for (size_t i = 0; i < count; i++) p[i] = (float)((rank + 1) * (int)(i % 7 + 1));
        ccl::allreduce(p, p, count, ccl::reduction::sum, comm).wait();
        double wrong = 0;
        float tri = (float)(n * (n + 1) / 2);
        for (size_t i = 0; i < count; i++) wrong += p[i] != tri * (float)(i % 7 + 1);
        for (size_t i = 0; i < count; i++) p[i] = 1e-3f * (float)(i % 5);
        // As many calls as fit in ~0.2 s by the warm-up's pace (at most mpi_allreduce.c's count),
        // the same on every rank: oneCCL's workers poll, and on a machine with fewer free cores
        // than ranks a call can take milliseconds, where a fixed 2000 calls would take minutes.
        auto w0 = std::chrono::steady_clock::now();
        for (int w = 0; w < 3; w++) ccl::allreduce(p, p, count, ccl::reduction::sum, comm).wait();
        double warm = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count() / 3;
        double warm_max = warm;
        ccl::allreduce(&warm, &warm_max, 1, ccl::reduction::max, comm).wait();
        size_t iters = (256u << 20) / b;
        if (warm_max > 0 && (double)iters > 0.2 / warm_max) iters = (size_t)(0.2 / warm_max);
        if (iters < 5) iters = 5;
        if (iters > 2000) iters = 2000;
        ccl::barrier(comm);
        auto t0 = std::chrono::steady_clock::now();
        for (size_t it = 0; it < iters; it++)
            ccl::allreduce(p, p, count, ccl::reduction::sum, comm).wait();
        double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
                   (double)iters;
        double tmax = t, wsum = wrong;
        ccl::allreduce(&t, &tmax, 1, ccl::reduction::max, comm).wait();
        ccl::allreduce(&wrong, &wsum, 1, ccl::reduction::sum, comm).wait();
        if (rank == 0) {
            double algbw = (double)b / tmax / 1e9;
            std::printf("  %12zu %10.2f %10.3f %10.3f %8ld\n", b, tmax * 1e6, algbw,
                        algbw * 2.0 * (n - 1) / n, (long)wsum);
            std::fflush(stdout);
        }
    }
    return 0;
}
