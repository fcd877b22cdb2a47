// PyTorch's "tandem" process-group backend: a c10d::Backend whose every collective is one call
// into tandem's C comm layer (include/tandem/comm.h). This file only translates: tensors to
// (pointer, count, dtype), c10d's options to roots and ops, tandem's errors to c10d's. The
// algorithms, transports (shm within a host, tcp across), fingerprints, timeouts and dead-peer
// detection are comm's. docs/torch.md says what is supported and why.
//
// Each group has one queue of ops and one worker thread: an op is queued in call order and
// returns at once with a Work whose future completes with the outputs when it has run (what DDP's
// buckets, comm hooks, FSDP and ZeRO wait on), so the caller's thread goes on while data moves.
// Ops run one at a time, in queue order (a td_pg_t is used by one thread at a time), on the
// worker or on a thread that waits on a Work: Work::wait() runs the queue's ops up to its own
// itself instead of sleeping until the worker has woken, run them, and woken it back. That hand-
// off cost ~80 us a call on a 2-CPU VM (two wake-ups), 70x a 4 KiB allreduce; a synchronous
// `dist.all_reduce` now pays neither, while DDP (which waits on futures, late) still overlaps.

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/utils/pybind.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <thread>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

extern "C" {
#include "tandem/comm.h"
#include "tandem/core.h"
}

namespace {

// ---------------------------------------------------------------- errors

// tandem's message (it names the rank, the collective and the fix) as c10d's error type: a
// DistBackendError in Python, like gloo's and NCCL's failures.
[[noreturn]] void throw_td(const char* what) {
    std::string msg = std::string("tandem backend: ") + what + ": " + td_error_msg();
    C10_THROW_ERROR(DistBackendError, msg);
}

void check_td(td_status st, const char* what) {
    if (st != TD_OK) throw_td(what);
}

[[noreturn]] void refuse(const std::string& msg) {
    TORCH_CHECK(false, "tandem backend: ", msg, " (docs/torch.md lists what is supported)");
}

// ---------------------------------------------------------------- tensors and types

td_elem_type dtype_of(const at::Tensor& t, const char* op) {
    switch (t.scalar_type()) {
    case at::kFloat:
        return TD_ELEM_F32;
    case at::kDouble:
        return TD_ELEM_F64;
    case at::kHalf:
        return TD_ELEM_F16;
    case at::kBFloat16:
        return TD_ELEM_BF16;
    case at::kChar:
        return TD_ELEM_I8;
    case at::kByte:
        return TD_ELEM_U8;
    case at::kShort:
        return TD_ELEM_I16;
    case at::kInt:
        return TD_ELEM_I32;
    case at::kLong:
        return TD_ELEM_I64;
    case at::kBool:
        return TD_ELEM_BOOL;
    default:
        refuse(std::string(op) + " of dtype " + c10::toString(t.scalar_type()) +
               " is not supported (reductions take float32/64, float16, bfloat16, int8/16/32/64, "
               "uint8 and bool)");
    }
}

td_reduce_op op_of(const c10d::ReduceOp& op, const at::Tensor& t, const char* what) {
    switch (op.op_) {
    case c10d::ReduceOp::SUM:
        return TD_REDUCE_SUM;
    case c10d::ReduceOp::AVG:
        return TD_REDUCE_AVG;
    case c10d::ReduceOp::PRODUCT:
        return TD_REDUCE_PRODUCT;
    case c10d::ReduceOp::MIN:
        return TD_REDUCE_MIN;
    case c10d::ReduceOp::MAX:
        return TD_REDUCE_MAX;
    case c10d::ReduceOp::BAND:
        return TD_REDUCE_BAND;
    case c10d::ReduceOp::BOR:
        return TD_REDUCE_BOR;
    case c10d::ReduceOp::BXOR:
        return TD_REDUCE_BXOR;
    default:
        break;
    }
    static const char* names[] = {"SUM", "AVG", "PRODUCT", "MIN", "MAX",
                                  "BAND", "BOR", "BXOR", "PREMUL_SUM", "UNUSED"};
    unsigned k = static_cast<unsigned>(op.op_);
    refuse(std::string(what) + "(op=" + (k < 10 ? names[k] : "?") + ", dtype=" +
           c10::toString(t.scalar_type()) +
           ") is not supported: tandem reduces with SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR "
           "and BXOR");
}

void check_cpu(const at::Tensor& t, const char* op) {
    if (!t.device().is_cpu())
        refuse(std::string(op) + " got a tensor on " + t.device().str() +
               ": the tandem backend moves CPU tensors (use \"cpu:tandem,cuda:nccl\" to send "
               "CUDA tensors to NCCL)");
    if (t.is_sparse()) refuse(std::string(op) + " of a sparse tensor is not supported");
}

// A contiguous view of t, or a contiguous copy to write back with done() (c10d allows strided
// tensors; tandem moves flat buffers).
struct Flat {
    at::Tensor orig, flat;
    Flat(const at::Tensor& t, const char* op) : orig(t) {
        check_cpu(t, op);
        flat = t.is_contiguous() ? t : t.contiguous();
    }
    void* data() { return flat.data_ptr(); }
    size_t nbytes() const { return flat.nbytes(); }
    size_t numel() const { return static_cast<size_t>(flat.numel()); }
    void done() {
        if (!flat.is_same(orig)) orig.copy_(flat);
    }
};

at::Tensor one(std::vector<at::Tensor>& ts, const char* op) {
    if (ts.size() != 1)
        refuse(std::string(op) + " takes one tensor per rank (got " + std::to_string(ts.size()) +
               ")");
    return ts[0];
}

// ---------------------------------------------------------------- work

// A finished op: its future already holds the outputs.
class TandemWork : public c10d::Work {
  public:
    TandemWork(c10d::OpType type, std::vector<at::Tensor> outputs)
        : c10d::Work(-1, type), outputs_(std::move(outputs)) {
        future_ = c10::make_intrusive<c10::ivalue::Future>(
            c10::ListType::create(c10::TensorType::get()));
        future_->markCompleted(c10::IValue(outputs_));
    }
    bool isCompleted() override { return true; }
    bool isSuccess() const override { return true; }
    bool wait(std::chrono::milliseconds /*timeout*/) override { return true; }
    void synchronize() override {}
    std::vector<at::Tensor> result() override { return outputs_; }
    c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

  private:
    std::vector<at::Tensor> outputs_;
    c10::intrusive_ptr<c10::ivalue::Future> future_;
};

c10::intrusive_ptr<c10d::Work> done(c10d::OpType type, std::vector<at::Tensor> outputs) {
    return c10::make_intrusive<TandemWork>(type, std::move(outputs));
}

// A group's ops, in call order. Shared by the backend and its Works, so a Work waited on while
// its group is being destroyed never touches freed memory.
struct OpQueue {
    std::mutex mu; // guards q and stopping
    std::condition_variable cv;
    std::deque<std::function<void()>> q;
    bool stopping = false;
    // Held while an op runs: one at a time, in queue order. Recursive: an op's future callbacks
    // run on the thread that ran it, and one that waits on a later op of the group (a comm hook
    // calling a synchronous collective) runs it there, nested, after the first has finished.
    std::recursive_mutex running;

    // Runs the next queued op on this thread; false when none was queued.
    bool run_next() {
        std::lock_guard<std::recursive_mutex> run(running);
        std::function<void()> job;
        {
            std::lock_guard<std::mutex> lk(mu);
            if (q.empty()) return false;
            job = std::move(q.front());
            q.pop_front();
        }
        job(); // never throws: the op's error goes to its future
        return true;
    }
};

// An op queued for the group: its future completes (or fails) when it has run. wait() rethrows
// the op's error (a DistBackendError naming the rank and the collective, or a refusal).
class AsyncWork : public c10d::Work {
  public:
    AsyncWork(c10d::OpType type, std::shared_ptr<OpQueue> queue)
        : c10d::Work(-1, type), queue_(std::move(queue)) {
        future_ = c10::make_intrusive<c10::ivalue::Future>(
            c10::ListType::create(c10::TensorType::get()));
    }
    bool isCompleted() override { return future_->completed(); }
    bool isSuccess() const override { return future_->completed() && !future_->hasError(); }
    std::exception_ptr exception() const override {
        return future_->hasError() ? future_->exception_ptr() : nullptr;
    }
    bool wait(std::chrono::milliseconds /*timeout: each collective has tandem's own*/) override {
        // Run the ops queued up to this one here (see the top of the file); the worker may have
        // taken this one already, then wait for it.
        while (!future_->completed() && queue_->run_next()) {
        }
        future_->wait();
        if (future_->hasError()) std::rethrow_exception(future_->exception_ptr());
        return true;
    }
    void synchronize() override {}
    std::vector<at::Tensor> result() override {
        wait(kNoTimeout);
        return future_->value().toTensorVector();
    }
    c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
    const c10::intrusive_ptr<c10::ivalue::Future>& future() const { return future_; }

  private:
    c10::intrusive_ptr<c10::ivalue::Future> future_;
    std::shared_ptr<OpQueue> queue_;
};

// ---------------------------------------------------------------- rendezvous

std::string env_or(const char* name, const char* def) {
    const char* v = std::getenv(name);
    return v && *v ? v : def;
}

// The address other hosts reach this one by: the local end of a route towards MASTER_ADDR (a UDP
// connect sends nothing), 127.0.0.1 on one host or when there is no route.
std::string routed_address() {
    std::string master = env_or("MASTER_ADDR", "127.0.0.1");
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_DGRAM;
    std::string out = "127.0.0.1";
    if (getaddrinfo(master.c_str(), "9", &hints, &res) == 0 && res) {
        int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        sockaddr_in local{};
        socklen_t len = sizeof(local);
        char buf[INET_ADDRSTRLEN];
        if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
            getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
            inet_ntop(AF_INET, &local.sin_addr, buf, sizeof(buf)))
            out = buf;
        if (fd >= 0) close(fd);
        freeaddrinfo(res);
    }
    return out;
}

std::string random_token() {
    unsigned char b[16] = {0};
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    bool ok = fd >= 0 && read(fd, b, sizeof(b)) == static_cast<ssize_t>(sizeof(b));
    if (fd >= 0) close(fd);
    TORCH_CHECK(ok, "tandem backend: cannot read /dev/urandom for the group's store token");
    static const char hex[] = "0123456789abcdef";
    std::string s;
    for (unsigned char c : b) {
        s += hex[c >> 4];
        s += hex[c & 15];
    }
    return s;
}

// Groups made so far in this process, per torch group name: the n-th group of a name gets its
// own key namespace, and every rank makes the same groups in the same order (c10d requires it).
std::mutex g_groups_mu;
std::map<std::string, int> g_groups;
bool g_env_group_taken = false;

std::string str_of(const std::vector<uint8_t>& v) {
    return std::string(v.begin(), v.end());
}

// ---------------------------------------------------------------- the backend

class TandemBackend : public c10d::Backend {
  public:
    TandemBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                  const std::string& group_id, std::chrono::milliseconds store_timeout)
        : c10d::Backend(rank, size) {
        int instance;
        bool env_group;
        {
            std::lock_guard<std::mutex> lk(g_groups_mu);
            instance = g_groups[group_id]++;
            // Under `tandem launch`, the first group spanning the whole job is tandem's own
            // group of the job (td_pg_init_from_env): the launcher's stall check watches it.
            const char* ws = std::getenv("WORLD_SIZE");
            env_group = !g_env_group_taken && std::getenv("TANDEM_STORE_ADDR") &&
                        std::getenv("TANDEM_TOKEN") && ws && std::atoi(ws) == size &&
                        std::getenv("RANK") && std::atoi(std::getenv("RANK")) == rank;
            if (env_group) g_env_group_taken = true;
        }
        if (env_group) {
            check_td(td_pg_init_from_env(&pg_, &store_), "joining the job's process group");
            transport_ = "env";
            worker_ = std::thread([this] { loop(); });
            return;
        }
        std::string host, token;
        int port = 0;
        std::string prefix;
        if (std::getenv("TANDEM_STORE_ADDR") && std::getenv("TANDEM_TOKEN")) {
            // tandem launch / tandem run: the job's store; a namespace per group.
            std::string addr = std::getenv("TANDEM_STORE_ADDR");
            size_t colon = addr.rfind(':');
            TORCH_CHECK(colon != std::string::npos && colon > 0,
                        "tandem backend: TANDEM_STORE_ADDR='", addr, "' is not HOST:PORT");
            host = addr.substr(0, colon);
            if (host.size() > 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
            port = std::atoi(addr.c_str() + colon + 1);
            token = std::getenv("TANDEM_TOKEN");
            prefix = "tandem/" + env_or("TANDEM_RUN_ID", "run") + "/restart" +
                     env_or("TANDEM_RESTART_COUNT", "0") + "/torch/" + group_id + "/" +
                     std::to_string(instance);
        } else {
            // torchrun or any other launcher: the group's rank 0 serves a tandem store and
            // publishes where through the c10d store it was given (already namespaced to this
            // group by c10d); the c10d store carries nothing else.
            const std::string key = "tandem/store/" + std::to_string(instance);
            if (rank == 0) {
                token = random_token();
                check_td(td_store_server_start("0.0.0.0", 0, token.c_str(), &server_),
                         "starting the group's store");
                host = routed_address();
                port = td_store_server_port(server_);
                std::string v = host + "\n" + std::to_string(port) + "\n" + token;
                store->set(key, std::vector<uint8_t>(v.begin(), v.end()));
            } else {
                store->setTimeout(store_timeout);
                std::string v = str_of(store->get(key));
                size_t a = v.find('\n'), b = v.find('\n', a + 1);
                TORCH_CHECK(a != std::string::npos && b != std::string::npos,
                            "tandem backend: malformed store address '", v, "' under ", key);
                host = v.substr(0, a);
                port = std::atoi(v.substr(a + 1, b - a - 1).c_str());
                token = v.substr(b + 1);
            }
            prefix = "torch/" + group_id + "/" + std::to_string(instance);
        }
        int timeout = static_cast<int>(store_timeout.count());
        check_td(td_store_connect(host.c_str(), port, token.c_str(), timeout > 0 ? timeout : -1,
                                  &store_),
                 "connecting to the group's store");
        td_pg_options o{};
        o.rank = rank;
        o.world_size = size;
        o.store = store_;
        o.prefix = prefix.c_str();
        std::string tr = td_env_str(TD_ENV_COMM_TRANSPORT);
        if (tr == "shm")
            o.transport = TD_TRANSPORT_SHM;
        else if (tr == "tcp")
            o.transport = TD_TRANSPORT_TCP;
        else if (tr != "auto") {
            TORCH_CHECK(false, "tandem backend: TANDEM_COMM_TRANSPORT=", tr,
                        ": expected auto, shm or tcp");
        }
        std::string hk = td_env_str(TD_ENV_HOST_KEY);
        o.host_key = hk.empty() ? nullptr : hk.c_str();
        td_status st = td_pg_init(&o, &pg_);
        // Past this barrier no rank still reads the store to assemble: rank 0 may stop serving
        // it (a group destroyed before its first collective) without stranding a slower rank.
        if (st == TD_OK) st = td_barrier(pg_);
        if (st != TD_OK) {
            std::string why = td_error_msg();
            release();
            C10_THROW_ERROR(DistBackendError,
                            "tandem backend: building the process group: " + why);
        }
        worker_ = std::thread([this] { loop(); });
    }

    // Runs what was queued, then stops the worker: a group destroyed with ops in flight
    // finishes them (or fails them, when peers are gone, within the collective timeout).
    ~TandemBackend() override {
        {
            std::lock_guard<std::mutex> lk(ops_->mu);
            ops_->stopping = true;
        }
        ops_->cv.notify_all();
        if (worker_.joinable()) {
            // A queued op's future callbacks (a Python comm hook) may need the GIL: never hold
            // it while waiting for them.
            if (Py_IsInitialized() && PyGILState_Check()) {
                py::gil_scoped_release nogil;
                worker_.join();
            } else {
                worker_.join();
            }
        }
        release();
    }

    const std::string getBackendName() const override { return "tandem"; }

    // ---- the ops, run on the worker thread (submit); each returns its completed Work

    // ---- reductions

    c10::intrusive_ptr<c10d::Work> run_allreduce(std::vector<at::Tensor>& tensors,
                                             const c10d::AllreduceOptions& opts) {
        std::lock_guard<std::recursive_mutex> lk(mu_);
        for (auto& t : tensors) {
            Flat f(t, "allreduce");
            td_elem_type dt = dtype_of(t, "allreduce");
            check_td(td_allreduce_typed(pg_, f.data(), f.numel(), dt,
                                        op_of(opts.reduceOp, t, "allreduce")),
                     "allreduce");
            f.done();
        }
        return done(c10d::OpType::ALLREDUCE, tensors);
    }

    // One collective for the whole list when the dtypes agree (DDP's buckets, FSDP's shards):
    // flattened, reduced, copied back.
    c10::intrusive_ptr<c10d::Work> run_allreduce_coalesced(
        std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
        std::lock_guard<std::recursive_mutex> lk(mu_);
        if (tensors.empty()) return done(c10d::OpType::ALLREDUCE_COALESCED, tensors);
        bool same = true;
        for (auto& t : tensors) {
            check_cpu(t, "allreduce_coalesced");
            same = same && t.scalar_type() == tensors[0].scalar_type();
        }
        if (!same || tensors.size() == 1) {
            c10d::AllreduceOptions o;
            o.reduceOp = opts.reduceOp;
            o.timeout = opts.timeout;
            run_allreduce(tensors, o);
            return done(c10d::OpType::ALLREDUCE_COALESCED, tensors);
        }
        std::vector<at::Tensor> flat;
        for (auto& t : tensors) flat.push_back(t.reshape({-1}));
        at::Tensor buf = at::cat(flat);
        check_td(td_allreduce_typed(pg_, buf.data_ptr(), static_cast<size_t>(buf.numel()),
                                    dtype_of(buf, "allreduce_coalesced"),
                                    op_of(opts.reduceOp, buf, "allreduce_coalesced")),
                 "allreduce_coalesced");
        int64_t off = 0;
        for (auto& t : tensors) {
            t.copy_(buf.narrow(0, off, t.numel()).view(t.sizes()));
            off += t.numel();
        }
        return done(c10d::OpType::ALLREDUCE_COALESCED, tensors);
    }

    c10::intrusive_ptr<c10d::Work> run_reduce(std::vector<at::Tensor>& tensors,
                                          const c10d::ReduceOptions& opts) {
        std::lock_guard<std::recursive_mutex> lk(mu_);
        at::Tensor t = one(tensors, "reduce");
        Flat f(t, "reduce");
        check_td(td_reduce(pg_, f.data(), f.numel(), dtype_of(t, "reduce"),
                           op_of(opts.reduceOp, t, "reduce"), static_cast<int>(opts.rootRank)),
                 "reduce");
        f.done();
        return done(c10d::OpType::REDUCE, tensors);
    }

    c10::intrusive_ptr<c10d::Work> run__reduce_scatter_base(
        at::Tensor& out, at::Tensor& in, const c10d::ReduceScatterOptions& opts) {
        std::lock_guard<std::recursive_mutex> lk(mu_);
        check_cpu(in, "reduce_scatter_tensor");
        TORCH_CHECK(in.numel() == out.numel() * getSize(),
                    "tandem backend: reduce_scatter_tensor: input has ", in.numel(),
                    " elements, expected output's ", out.numel(), " x world size ", getSize());
        TORCH_CHECK(in.scalar_type() == out.scalar_type(),
                    "tandem backend: reduce_scatter_tensor: input is ", in.scalar_type(),
                    " but output is ", out.scalar_type());
        Flat fi(in, "reduce_scatter_tensor"), fo(out, "reduce_scatter_tensor");
        check_td(td_reduce_scatter_typed(pg_, fi.data(), fo.data(), fo.numel(),
                                         dtype_of(in, "reduce_scatter_tensor"),
                                         op_of(opts.reduceOp, in, "reduce_scatter_tensor")),
                 "reduce_scatter_tensor");
        fo.done();
        return done(c10d::OpType::_REDUCE_SCATTER_BASE, {out});
    }

    c10::intrusive_ptr<c10d::Work> run_reduce_scatter(std::vector<at::Tensor>& outputs,
                                                  std::vector<std::vector<at::Tensor>>& inputs,
                                                  const c10d::ReduceScatterOptions& opts) {
        std::lock_guard<std::recursive_mutex> lk(mu_);
        at::Tensor out = one(outputs, "reduce_scatter");
        TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(),
                    "tandem backend: reduce_scatter takes one list of world size (", getSize(),
                    ") input tensors");
        std::vector<at::Tensor> flat;
        for (auto& t : inputs[0]) {
            check_cpu(t, "reduce_scatter");
            TORCH_CHECK(t.numel() == out.numel() && t.scalar_type() == out.scalar_type(),
                        "tandem backend: reduce_scatter: every input must match the output's "
                        "shape and dtype");
            flat.push_back(t.reshape({-1}));
        }
        at::Tensor in = at::cat(flat);
        run__reduce_scatter_base(out, in, opts);
        return done(c10d::OpType::REDUCE_SCATTER, outputs);
    }

    c10::intrusive_ptr<c10d::Work> run_reduce_scatter_tensor_coalesced(
        std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
        const c10d::ReduceScatterOptions& opts) {
        std::lock_guard<std::recursive_mutex> lk(mu_);
        TORCH_CHECK(outputs.size() == inputs.size(),
                    "tandem backend: reduce_scatter_tensor_coalesced: ", inputs.size(),
                    " inputs but ", outputs.size(), " outputs");
        for (size_t i = 0; i < inputs.size(); i++)
            run__reduce_scatter_base(outputs[i], inputs[i], opts);
        return done(c10d::OpType::COALESCED, outputs);
    }

    // ---- data movement

    c10::intrusive_ptr<c10d::Work> run_broadcast(std::vector<at::Tensor>& tensors,
                                             const c10d::BroadcastOptions& opts) {
        std::lock_guard<std::recursive_mutex> lk(mu_);
        at::Tensor t = one(tensors, "broadcast");
        Flat f(t, "broadcast");
        check_td(td_broadcast(pg_, f.data(), f.nbytes(), static_cast<int>(opts.rootRank)),
                 "broadcast");
        f.done();
        return done(c10d::OpType::BROADCAST, tensors);
    }

    c10::intrusive_ptr<c10d::Work> run__allgather_base(at::Tensor& out, at::Tensor& in,
                                                   const c10d::AllgatherOptions&) {
        std::lock_guard<std::recursive_mutex> lk(mu_);
        check_cpu(out, "all_gather_into_tensor");
        TORCH_CHECK(out.numel() == in.numel() * getSize() && out.scalar_type() == in.scalar_type(),
                    "tandem backend: all_gather_into_tensor: output must hold world size (",
                    getSize(), ") x the input's ", in.numel(), " elements of ", in.scalar_type());
        Flat fi(in, "all_gather_into_tensor"), fo(out, "all_gather_into_tensor");
        check_td(td_allgather(pg_, fi.data(), fo.data(), fi.nbytes()), "all_gather_into_tensor");
        fo.done();
        return done(c10d::OpType::_ALLGATHER_BASE, {out});
    }

    c10::intrusive_ptr<c10d::Work> run_allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                             std::vector<at::Tensor>& inputs,
                                             const c10d::AllgatherOptions& opts) {
        std::lock_guard<std::recursive_mutex> lk(mu_);
        at::Tensor in = one(inputs, "all_gather");
        TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == getSize(),
                    "tandem backend: all_gather takes one list of world size (", getSize(),
                    ") output tensors");
        for (auto& t : outputs[0])
            TORCH_CHECK(t.numel() == in.numel() && t.scalar_type() == in.scalar_type(),
                        "tandem backend: all_gather: every output must match the input's shape "
                        "and dtype (", in.numel(), " elements of ", in.scalar_type(), ")");
        at::Tensor buf = at::empty({getSize() * in.numel()}, in.options());
        run__allgather_base(buf, in, opts);
        for (int j = 0; j < getSize(); j++)
            outputs[0][j].copy_(
                buf.narrow(0, j * in.numel(), in.numel()).view(outputs[0][j].sizes()));
        return done(c10d::OpType::ALLGATHER, outputs[0]);
    }

    c10::intrusive_ptr<c10d::Work> run_allgather_coalesced(
        std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
        const c10d::AllgatherOptions& opts) {
        std::lock_guard<std::recursive_mutex> lk(mu_);
        TORCH_CHECK(outputs.size() == inputs.size(), "tandem backend: allgather_coalesced: ",
                    inputs.size(), " inputs but ", outputs.size(), " output lists");
        std::vector<at::Tensor> all;
        for (size_t i = 0; i < inputs.size(); i++) {
            std::vector<std::vector<at::Tensor>> o{outputs[i]};
            std::vector<at::Tensor> in{inputs[i]};
            run_allgather(o, in, opts);
            for (auto& t : outputs[i]) all.push_back(t);
        }
        return done(c10d::OpType::ALLGATHER_COALESCED, all);
    }

    c10::intrusive_ptr<c10d::Work> run_allgather_into_tensor_coalesced(
        std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
        const c10d::AllgatherOptions& opts) {
        std::lock_guard<std::recursive_mutex> lk(mu_);
        TORCH_CHECK(outputs.size() == inputs.size(),
                    "tandem backend: allgather_into_tensor_coalesced: ", inputs.size(),
                    " inputs but ", outputs.size(), " outputs");
        for (size_t i = 0; i < inputs.size(); i++) run__allgather_base(outputs[i], inputs[i], opts);
        return done(c10d::OpType::COALESCED, outputs);
    }

    c10::intrusive_ptr<c10d::Work> run_gather(std::vector<std::vector<at::Tensor>>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::GatherOptions& opts) {
        std::lock_guard<std::recursive_mutex> lk(mu_);
        at::Tensor in = one(inputs, "gather");
        Flat fi(in, "gather");
        int root = static_cast<int>(opts.rootRank);
        bool is_root = getRank() == root;
        at::Tensor buf;
        if (is_root) {
            TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == getSize(),
                        "tandem backend: gather: the root takes one list of world size (",
                        getSize(), ") output tensors");
            for (auto& t : outputs[0])
                TORCH_CHECK(t.numel() == in.numel() && t.scalar_type() == in.scalar_type(),
                            "tandem backend: gather: every output must match the input's "
                            "shape and dtype");
            buf = at::empty({getSize() * in.numel()}, in.options());
        }
        check_td(td_gather(pg_, fi.data(), is_root ? buf.data_ptr() : nullptr, fi.nbytes(), root),
                 "gather");
        std::vector<at::Tensor> outs;
        if (is_root) {
            for (int j = 0; j < getSize(); j++)
                outputs[0][j].copy_(
                    buf.narrow(0, j * in.numel(), in.numel()).view(outputs[0][j].sizes()));
            outs = outputs[0];
        }
        return done(c10d::OpType::GATHER, outs);
    }

    c10::intrusive_ptr<c10d::Work> run_scatter(std::vector<at::Tensor>& outputs,
                                           std::vector<std::vector<at::Tensor>>& inputs,
                                           const c10d::ScatterOptions& opts) {
        std::lock_guard<std::recursive_mutex> lk(mu_);
        at::Tensor out = one(outputs, "scatter");
        Flat fo(out, "scatter");
        int root = static_cast<int>(opts.rootRank);
        at::Tensor buf;
        if (getRank() == root) {
            TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(),
                        "tandem backend: scatter: the root takes one list of world size (",
                        getSize(), ") input tensors");
            std::vector<at::Tensor> flat;
            for (auto& t : inputs[0]) {
                check_cpu(t, "scatter");
                TORCH_CHECK(t.numel() == out.numel() && t.scalar_type() == out.scalar_type(),
                            "tandem backend: scatter: every input must match the output's "
                            "shape and dtype");
                flat.push_back(t.reshape({-1}));
            }
            buf = at::cat(flat);
        }
        check_td(td_scatter(pg_, buf.defined() ? buf.data_ptr() : nullptr, fo.data(),
                            fo.nbytes(), root),
                 "scatter");
        fo.done();
        return done(c10d::OpType::SCATTER, outputs);
    }

    c10::intrusive_ptr<c10d::Work> run_alltoall_base(at::Tensor& out, at::Tensor& in,
                                                 std::vector<int64_t>& out_splits,
                                                 std::vector<int64_t>& in_splits,
                                                 const c10d::AllToAllOptions&) {
        std::lock_guard<std::recursive_mutex> lk(mu_);
        check_cpu(out, "all_to_all_single");
        TORCH_CHECK(in.scalar_type() == out.scalar_type(),
                    "tandem backend: all_to_all_single: input is ", in.scalar_type(),
                    " but output is ", out.scalar_type());
        Flat fi(in, "all_to_all_single"), fo(out, "all_to_all_single");
        int W = getSize();
        // Rows along dim 0; equal splits when none are given.
        auto bytes_per_row = [](const at::Tensor& t) -> size_t {
            return t.dim() == 0 || t.size(0) == 0 ? 0 : t.nbytes() / static_cast<size_t>(t.size(0));
        };
        auto plan = [&](const at::Tensor& t, const std::vector<int64_t>& splits,
                        std::vector<size_t>& n, std::vector<size_t>& off, const char* which) {
            size_t row = bytes_per_row(t);
            int64_t rows = t.dim() ? t.size(0) : 0;
            if (splits.empty()) {
                TORCH_CHECK(rows % W == 0, "tandem backend: all_to_all_single: ", which,
                            " has ", rows, " rows, not divisible by the world size ", W);
            } else {
                TORCH_CHECK(static_cast<int>(splits.size()) == W, "tandem backend: ",
                            "all_to_all_single: ", which, " split sizes name ", splits.size(),
                            " ranks, world size is ", W);
            }
            size_t at = 0;
            for (int j = 0; j < W; j++) {
                int64_t r = splits.empty() ? rows / W : splits[j];
                n[j] = static_cast<size_t>(r) * row;
                off[j] = at;
                at += n[j];
            }
            TORCH_CHECK(at <= t.nbytes(), "tandem backend: all_to_all_single: ", which,
                        " split sizes add up past its ", rows, " rows");
        };
        std::vector<size_t> sn(W), so(W), rn(W), ro(W);
        plan(in, in_splits, sn, so, "input");
        plan(out, out_splits, rn, ro, "output");
        check_td(td_alltoallv(pg_, fi.data(), sn.data(), so.data(), fo.data(), rn.data(),
                              ro.data()),
                 "all_to_all_single");
        fo.done();
        return done(c10d::OpType::ALLTOALL_BASE, {out});
    }

    c10::intrusive_ptr<c10d::Work> run_alltoall(std::vector<at::Tensor>& outputs,
                                            std::vector<at::Tensor>& inputs,
                                            const c10d::AllToAllOptions&) {
        std::lock_guard<std::recursive_mutex> lk(mu_);
        int W = getSize();
        TORCH_CHECK(static_cast<int>(inputs.size()) == W && static_cast<int>(outputs.size()) == W,
                    "tandem backend: all_to_all takes world size (", W,
                    ") input and output tensors");
        std::vector<size_t> sn(W), so(W), rn(W), ro(W);
        std::vector<at::Tensor> fi, fo;
        size_t at_in = 0, at_out = 0;
        for (int j = 0; j < W; j++) {
            check_cpu(inputs[j], "all_to_all");
            check_cpu(outputs[j], "all_to_all");
            TORCH_CHECK(inputs[j].scalar_type() == inputs[0].scalar_type() &&
                            outputs[j].scalar_type() == inputs[0].scalar_type(),
                        "tandem backend: all_to_all: all tensors must have one dtype");
            fi.push_back(inputs[j].reshape({-1}));
            fo.push_back(outputs[j].reshape({-1}));
            sn[j] = inputs[j].nbytes();
            so[j] = at_in;
            at_in += sn[j];
            rn[j] = outputs[j].nbytes();
            ro[j] = at_out;
            at_out += rn[j];
        }
        at::Tensor in = at::cat(fi);
        at::Tensor out = at::empty({static_cast<int64_t>(at_out / inputs[0].element_size())},
                                   inputs[0].options());
        check_td(td_alltoallv(pg_, in.data_ptr(), sn.data(), so.data(), out.data_ptr(), rn.data(),
                              ro.data()),
                 "all_to_all");
        int64_t off = 0;
        for (int j = 0; j < W; j++) {
            outputs[j].copy_(out.narrow(0, off, outputs[j].numel()).view(outputs[j].sizes()));
            off += outputs[j].numel();
        }
        return done(c10d::OpType::ALLTOALL, outputs);
    }

    c10::intrusive_ptr<c10d::Work> run_barrier(const c10d::BarrierOptions&) {
        std::lock_guard<std::recursive_mutex> lk(mu_);
        check_td(td_barrier(pg_), "barrier");
        return done(c10d::OpType::BARRIER, {});
    }

    // ---- point to point

    c10::intrusive_ptr<c10d::Work> run_send(std::vector<at::Tensor>& tensors, int dst,
                                        int tag) {
        std::lock_guard<std::recursive_mutex> lk(mu_);
        at::Tensor t = one(tensors, "send");
        Flat f(t, "send");
        check_td(td_send(pg_, dst, f.data(), f.nbytes(), tag), "send");
        return done(c10d::OpType::SEND, tensors);
    }

    c10::intrusive_ptr<c10d::Work> run_recv(std::vector<at::Tensor>& tensors, int src,
                                        int tag) {
        std::lock_guard<std::recursive_mutex> lk(mu_);
        at::Tensor t = one(tensors, "recv");
        Flat f(t, "recv");
        check_td(td_recv(pg_, src, f.data(), f.nbytes(), tag), "recv");
        f.done();
        return done(c10d::OpType::RECV, tensors);
    }

    // ---- what c10d calls: each op is queued for the worker thread, in call order

    c10::intrusive_ptr<c10d::Work> allreduce(
        std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override {
        return submit(c10d::OpType::ALLREDUCE,
                      [=, this]() mutable { return run_allreduce(tensors, opts)->result(); });
    }

    c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
        std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override {
        return submit(c10d::OpType::ALLREDUCE_COALESCED, [=, this]() mutable {
            return run_allreduce_coalesced(tensors, opts)->result();
        });
    }

    c10::intrusive_ptr<c10d::Work> reduce(
        std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override {
        return submit(c10d::OpType::REDUCE,
                      [=, this]() mutable { return run_reduce(tensors, opts)->result(); });
    }

    c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
        at::Tensor& out, at::Tensor& in, const c10d::ReduceScatterOptions& opts) override {
        return submit(c10d::OpType::_REDUCE_SCATTER_BASE, [=, this]() mutable {
            return run__reduce_scatter_base(out, in, opts)->result();
        });
    }

    c10::intrusive_ptr<c10d::Work> reduce_scatter(
        std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
        const c10d::ReduceScatterOptions& opts) override {
        return submit(c10d::OpType::REDUCE_SCATTER, [=, this]() mutable {
            return run_reduce_scatter(outputs, inputs, opts)->result();
        });
    }

    c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
        std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
        const c10d::ReduceScatterOptions& opts) override {
        return submit(c10d::OpType::COALESCED, [=, this]() mutable {
            return run_reduce_scatter_tensor_coalesced(outputs, inputs, opts)->result();
        });
    }

    c10::intrusive_ptr<c10d::Work> broadcast(
        std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) override {
        return submit(c10d::OpType::BROADCAST,
                      [=, this]() mutable { return run_broadcast(tensors, opts)->result(); });
    }

    c10::intrusive_ptr<c10d::Work> _allgather_base(
        at::Tensor& out, at::Tensor& in, const c10d::AllgatherOptions& opts) override {
        return submit(c10d::OpType::_ALLGATHER_BASE,
                      [=, this]() mutable { return run__allgather_base(out, in, opts)->result(); });
    }

    c10::intrusive_ptr<c10d::Work> allgather(
        std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
        const c10d::AllgatherOptions& opts) override {
        return submit(c10d::OpType::ALLGATHER, [=, this]() mutable {
            return run_allgather(outputs, inputs, opts)->result();
        });
    }

    c10::intrusive_ptr<c10d::Work> allgather_coalesced(
        std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
        const c10d::AllgatherOptions& opts) override {
        return submit(c10d::OpType::ALLGATHER_COALESCED, [=, this]() mutable {
            return run_allgather_coalesced(outputs, inputs, opts)->result();
        });
    }

    c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
        std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
        const c10d::AllgatherOptions& opts) override {
        return submit(c10d::OpType::COALESCED, [=, this]() mutable {
            return run_allgather_into_tensor_coalesced(outputs, inputs, opts)->result();
        });
    }

    c10::intrusive_ptr<c10d::Work> gather(
        std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
        const c10d::GatherOptions& opts) override {
        return submit(c10d::OpType::GATHER,
                      [=, this]() mutable { return run_gather(outputs, inputs, opts)->result(); });
    }

    c10::intrusive_ptr<c10d::Work> scatter(
        std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
        const c10d::ScatterOptions& opts) override {
        return submit(c10d::OpType::SCATTER,
                      [=, this]() mutable { return run_scatter(outputs, inputs, opts)->result(); });
    }

    c10::intrusive_ptr<c10d::Work> alltoall_base(
        at::Tensor& out, at::Tensor& in, std::vector<int64_t>& out_splits,
        std::vector<int64_t>& in_splits, const c10d::AllToAllOptions& opts) override {
        return submit(c10d::OpType::ALLTOALL_BASE, [=, this]() mutable {
            return run_alltoall_base(out, in, out_splits, in_splits, opts)->result();
        });
    }

    c10::intrusive_ptr<c10d::Work> alltoall(
        std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
        const c10d::AllToAllOptions& opts) override {
        return submit(c10d::OpType::ALLTOALL, [=, this]() mutable {
            return run_alltoall(outputs, inputs, opts)->result();
        });
    }

    c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
        return submit(c10d::OpType::BARRIER,
                      [=, this]() mutable { return run_barrier(opts)->result(); });
    }

    c10::intrusive_ptr<c10d::Work> send(
        std::vector<at::Tensor>& tensors, int dst, int tag) override {
        return submit(c10d::OpType::SEND,
                      [=, this]() mutable { return run_send(tensors, dst, tag)->result(); });
    }

    c10::intrusive_ptr<c10d::Work> recv(
        std::vector<at::Tensor>& tensors, int src, int tag) override {
        return submit(c10d::OpType::RECV,
                      [=, this]() mutable { return run_recv(tensors, src, tag)->result(); });
    }

    c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>&, int) override {
        refuse("recv without a source rank (recv(src=None)) is not supported: name the sender");
    }

    // For tests and docs/torch.md: which transports this group uses.
    std::string describe() const {
        return std::string("tandem rank ") + std::to_string(getRank()) + "/" +
               std::to_string(getSize()) + (transport_.empty() ? "" : " (" + transport_ + ")");
    }

  private:
    c10::intrusive_ptr<c10d::Work> submit(c10d::OpType type,
                                          std::function<std::vector<at::Tensor>()> body) {
        auto work = c10::make_intrusive<AsyncWork>(type, ops_);
        auto fut = work->future();
        {
            std::lock_guard<std::mutex> lk(ops_->mu);
            TORCH_CHECK(!ops_->stopping,
                        "tandem backend: an op was issued on a group being destroyed");
            ops_->q.push_back([fut, body = std::move(body)]() {
                std::vector<at::Tensor> out;
                try {
                    out = body();
                } catch (...) {
                    fut->setError(std::current_exception());
                    return;
                }
                fut->markCompleted(c10::IValue(out));
            });
        }
        ops_->cv.notify_one();
        return work;
    }

    // The worker: runs the ops no waiting thread has taken, so the caller's thread goes on (DDP's
    // backward, the next bucket) while data moves.
    void loop() {
        // Named so that per-thread CPU accounting (bench/torch_ddp_steps.py, top -H) tells it
        // from the caller's thread, whose name it would inherit.
        pthread_setname_np(pthread_self(), "tandem-worker");
        for (;;) {
            {
                std::unique_lock<std::mutex> lk(ops_->mu);
                ops_->cv.wait(lk, [this] { return ops_->stopping || !ops_->q.empty(); });
                if (ops_->q.empty()) break;
            }
            ops_->run_next();
        }
        // Stopping with nothing queued: an op a waiting thread took may still be running; the
        // group is freed after this returns.
        std::lock_guard<std::recursive_mutex> run(ops_->running);
    }

    void release() {
        td_pg_free(pg_);
        pg_ = nullptr;
        td_store_close(store_);
        store_ = nullptr;
        if (server_) td_store_server_stop(server_);
        server_ = nullptr;
    }

    td_pg_t* pg_ = nullptr;
    td_store_t* store_ = nullptr;
    td_store_server_t* server_ = nullptr;
    std::string transport_;
    // A td_pg_t is used by one thread at a time; c10d lets any thread issue ops. Recursive: the
    // list forms call the flat ones.
    std::recursive_mutex mu_;
    std::shared_ptr<OpQueue> ops_ = std::make_shared<OpQueue>();
    std::thread worker_;
};

} // namespace

PYBIND11_MODULE(_tandem_c10d, m) {
    m.doc() = "tandem's c10d backend (docs/torch.md); use it through tandem.torch";
    py::object backend = py::module::import("torch.distributed").attr("Backend");
    (void)backend;
    py::class_<TandemBackend, c10d::Backend, c10::intrusive_ptr<TandemBackend>>(m, "TandemBackend")
        .def("describe", &TandemBackend::describe);
    m.def(
        "create",
        [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
           const std::string& group_id, double timeout_s) {
            auto ms = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000.0));
            py::gil_scoped_release nogil;
            return c10::make_intrusive<TandemBackend>(store, rank, size, group_id, ms);
        },
        py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("group_id"),
        py::arg("timeout_s"));
}
