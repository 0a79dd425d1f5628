// The dispatch entry's per-call work in C++: a memo from the call's full
// tensor metadata to a loaded artifact, and the artifact call.
//
// run/dispatch.py owns every decision. On a new call it resolves in Python
// (signature, checks, choice, load) and then registers the answer here:
// `register(table, a, b, out, fn, sms, splits, workspace_elems)`. Later
// calls go `call(table, a, b, out, alpha)`: the key is read from the
// DLTensors tvm-ffi already made of the torch tensors (no Python attribute
// reads), looked up, and the artifact is called with the same argument
// views. A miss returns 0 and the Python path runs, as before.
//
// Calls with a bias or an activation (nn.Linear with a bias, a fused MLP)
// go `call_bias(table, a, b, out, bias, act, alpha)` and are registered
// with `register_bias(table, a, b, out, bias, act, fn, sms, splits,
// workspace_elems)`: `bias` is the vector or None, `act` the activation's
// code (run/fastpath.py's ACT_CODES). Both are in the key; an artifact of
// a variant with a bias takes it after `out` (signature.gemm_abi_args).
//
// `table` is the runner's id (run/fastpath.py hands one to each runner):
// one process may open several caches, and a call must only ever hit its
// own runner's answers. The key is that id, the activation code (-1 for
// `call`), then every field a later call could differ in, for each of a,
// b, out and bias: device, dtype, rank, shape and strides (all zero for no
// bias, which no tensor's rank can be). It fails closed: a new layout is a
// miss, never another layout's artifact. Pointer alignment is not in the
// key; the artifact's compiled
// checks refuse a misaligned call, the error surfaces to Python, and the
// Python path routes it (staged, or a clear ArgumentError).
//
// Split-K entries get their fp32 scratch from TVMFFIEnvTensorAlloc: during a
// call from Python with torch tensors, tvm-ffi sets torch's DLPack allocator
// (the caching allocator, on the current stream; a captured CUDA graph's
// pool under capture) and the stream, for the duration of the call.
//
// Thread safety: the table is read under a shared lock and written under an
// exclusive one; tvm-ffi may release the GIL around this call.
//
// Built by build_scripts/build_fastpath.py into run/_fastpath.so (loaded
// by run/fastpath.py with tvm_ffi.load_module); without it, dispatch stays
// all Python.

#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>

#ifndef CUTLASS_AOT_FASTPATH_STAMP
#error "build with -DCUTLASS_AOT_FASTPATH_STAMP=... (build_scripts/build_fastpath.py)"
#endif

#include <array>
#include <cstdint>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <unordered_map>
#include <vector>

namespace {

using tvm::ffi::Any;
using tvm::ffi::AnyView;
using tvm::ffi::Function;

// Table id, activation code, and four tensors of rank <= 3 (a, b, out,
// bias): 4 x (device, dtype, rank, 3 dims, 3 strides).
constexpr int kMaxRank = 3;
constexpr int kPerTensor = 3 + 2 * kMaxRank;
constexpr int kKeyLen = 2 + 4 * kPerTensor;
constexpr int64_t kNoAct = -1;  // `call`: the plain entry (run/fastpath.py NO_ACT)

struct Key {
  std::array<int64_t, kKeyLen> v{};
  bool operator==(const Key& o) const { return v == o.v; }
};

struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the words
    for (int64_t x : k.v) {
      h ^= static_cast<uint64_t>(x);
      h *= 1099511628211ull;
    }
    return static_cast<size_t>(h);
  }
};

struct Entry {
  Function fn;
  bool bias;                // the artifact takes a bias vector after out
  int64_t sms;
  int64_t splits;           // -1: the plain ABI (a, b, d, alpha, sm_count); else the
                            // split-K ABI's split count (0: its stream-K schedule)
  int64_t workspace_elems;  // split-K: fp32 scratch elements
};

using Table = std::unordered_map<Key, Entry, KeyHash>;

// Never destroyed: at process exit the functions it holds may belong to
// unloaded modules or to a finalized Python, so the table is left to the OS.
std::shared_mutex& table_mutex = *new std::shared_mutex();
Table& table = *new Table();

// Fill one tensor's words of the key; false if it is not a tensor this
// path serves (then the call is a miss and Python decides).
bool PutTensor(const AnyView& arg, int64_t* out) {
  std::optional<DLTensor*> maybe = arg.try_cast<DLTensor*>();
  if (!maybe.has_value()) return false;
  const DLTensor* t = *maybe;
  if (t->ndim < 1 || t->ndim > kMaxRank || t->strides == nullptr) return false;
  out[0] = (static_cast<int64_t>(t->device.device_type) << 32) | t->device.device_id;
  out[1] = (static_cast<int64_t>(t->dtype.code) << 16) | (t->dtype.bits << 8) | t->dtype.lanes;
  out[2] = t->ndim;
  for (int i = 0; i < t->ndim; ++i) {
    out[3 + i] = t->shape[i];
    out[3 + kMaxRank + i] = t->strides[i];
  }
  return true;
}

// args: table id, a, b, out (then, for the bias entries, bias and act).
bool MakeKey(const AnyView* args, Key* key) {
  std::optional<int64_t> table_id = args[0].try_cast<int64_t>();
  if (!table_id.has_value()) return false;
  key->v[0] = *table_id;
  key->v[1] = kNoAct;
  for (int i = 0; i < 3; ++i) {
    if (!PutTensor(args[1 + i], key->v.data() + 2 + i * kPerTensor)) return false;
  }
  return true;
}

// The bias entries' key: MakeKey's, with the bias (args[4]: a tensor, or
// None: zeros) and the activation code (args[5], >= 0). *has_bias says which.
bool MakeBiasKey(const AnyView* args, Key* key, bool* has_bias) {
  if (!MakeKey(args, key)) return false;
  std::optional<int64_t> act = args[5].try_cast<int64_t>();
  if (!act.has_value() || *act < 0) return false;
  key->v[1] = *act;
  *has_bias = args[4].type_index() != kTVMFFINone;
  return !*has_bias || PutTensor(args[4], key->v.data() + 2 + 3 * kPerTensor);
}

// Launch a registered entry: args[1..3] are a, b, out; bias the bias view
// (unused unless entry.bias), alpha the scale.
void Launch(const Entry& entry, const AnyView* args, const AnyView& bias, const AnyView& alpha) {
  Any ignored;
  AnyView call_args[8];
  int n = 0;
  call_args[n++] = args[1];
  call_args[n++] = args[2];
  call_args[n++] = args[3];
  if (entry.bias) call_args[n++] = bias;
  if (entry.splits < 0) {
    call_args[n++] = alpha;
    call_args[n++] = AnyView(entry.sms);
    entry.fn.CallPacked(call_args, n, &ignored);
    return;
  }
  const DLTensor* out = *args[3].try_cast<DLTensor*>();
  int64_t elems = entry.workspace_elems;
  tvm::ffi::Tensor workspace = tvm::ffi::Tensor::FromEnvAlloc(
      TVMFFIEnvTensorAlloc, tvm::ffi::ShapeView(&elems, 1), DLDataType{kDLFloat, 32, 1},
      out->device);
  call_args[n++] = AnyView(workspace);
  call_args[n++] = alpha;
  call_args[n++] = AnyView(entry.splits);
  call_args[n++] = AnyView(entry.sms);
  entry.fn.CallPacked(call_args, n, &ignored);
}

// Look `key` up; true and *entry filled on a hit.
bool Find(const Key& key, Entry* entry) {
  std::shared_lock<std::shared_mutex> lock(table_mutex);
  auto it = table.find(key);
  if (it == table.end()) return false;
  *entry = it->second;  // a reference on the function: safe if the table is cleared
  return true;
}

// Register fn for key; args[first..first+3] are fn, sms, splits, workspace_elems.
void Register(const Key& key, bool bias, const AnyView* args, int first) {
  Entry entry{args[first].cast<Function>(), bias, args[first + 1].cast<int64_t>(),
              args[first + 2].cast<int64_t>(), args[first + 3].cast<int64_t>()};
  TVM_FFI_CHECK(entry.splits >= -1 && entry.workspace_elems >= 0, ValueError)
      << "register: splits is -1 (plain ABI) or a split count >= 0, workspace_elems >= 0; got "
      << entry.splits << ", " << entry.workspace_elems;
  std::unique_lock<std::shared_mutex> lock(table_mutex);
  table[key] = std::move(entry);
}

}  // namespace

extern "C" {

// call(table, a, b, out, alpha) -> 1 if an artifact was launched, 0 on a miss.
TVM_FFI_DLL_EXPORT int __tvm_ffi_call(void*, const TVMFFIAny* raw, int32_t num_args,
                                      TVMFFIAny* result) {
  TVM_FFI_SAFE_CALL_BEGIN();
  const AnyView* args = reinterpret_cast<const AnyView*>(raw);
  Any* rv = reinterpret_cast<Any*>(result);
  Key key;
  Entry entry;
  if (num_args != 5 || !MakeKey(args, &key) || !Find(key, &entry)) {
    *rv = 0;
    return 0;
  }
  Launch(entry, args, AnyView(), args[4]);
  *rv = 1;
  TVM_FFI_SAFE_CALL_END();
}

// call_bias(table, a, b, out, bias, act, alpha) -> 1 if launched, 0 on a miss.
TVM_FFI_DLL_EXPORT int __tvm_ffi_call_bias(void*, const TVMFFIAny* raw, int32_t num_args,
                                           TVMFFIAny* result) {
  TVM_FFI_SAFE_CALL_BEGIN();
  const AnyView* args = reinterpret_cast<const AnyView*>(raw);
  Any* rv = reinterpret_cast<Any*>(result);
  Key key;
  Entry entry;
  bool has_bias = false;
  if (num_args != 7 || !MakeBiasKey(args, &key, &has_bias) || !Find(key, &entry)) {
    *rv = 0;
    return 0;
  }
  Launch(entry, args, args[4], args[6]);
  *rv = 1;
  TVM_FFI_SAFE_CALL_END();
}

// register(table, a, b, out, fn, sms, splits, workspace_elems) -> 1, or 0 if
// the tensors are not ones this path keys (rank > 3, no strides).
TVM_FFI_DLL_EXPORT int __tvm_ffi_register(void*, const TVMFFIAny* raw, int32_t num_args,
                                          TVMFFIAny* result) {
  TVM_FFI_SAFE_CALL_BEGIN();
  const AnyView* args = reinterpret_cast<const AnyView*>(raw);
  Any* rv = reinterpret_cast<Any*>(result);
  TVM_FFI_CHECK(num_args == 8, TypeError)
      << "register(table, a, b, out, fn, sms, splits, workspace_elems) takes 8 arguments";
  Key key;
  if (!MakeKey(args, &key)) {
    *rv = 0;
    return 0;
  }
  Register(key, false, args, 4);
  *rv = 1;
  TVM_FFI_SAFE_CALL_END();
}

// register_bias(table, a, b, out, bias, act, fn, sms, splits, workspace_elems)
// -> 1, or 0 if the tensors are not ones this path keys. The artifact takes
// the bias after out when bias is a tensor; None registers an activation-only call.
TVM_FFI_DLL_EXPORT int __tvm_ffi_register_bias(void*, const TVMFFIAny* raw, int32_t num_args,
                                               TVMFFIAny* result) {
  TVM_FFI_SAFE_CALL_BEGIN();
  const AnyView* args = reinterpret_cast<const AnyView*>(raw);
  Any* rv = reinterpret_cast<Any*>(result);
  TVM_FFI_CHECK(num_args == 10, TypeError)
      << "register_bias(table, a, b, out, bias, act, fn, sms, splits, workspace_elems) takes "
         "10 arguments";
  Key key;
  bool has_bias = false;
  if (!MakeBiasKey(args, &key, &has_bias)) {
    *rv = 0;
    return 0;
  }
  Register(key, has_bias, args, 6);
  *rv = 1;
  TVM_FFI_SAFE_CALL_END();
}

// clear(table) -> the number of that table's entries dropped.
TVM_FFI_DLL_EXPORT int __tvm_ffi_clear(void*, const TVMFFIAny* raw, int32_t num_args,
                                       TVMFFIAny* result) {
  TVM_FFI_SAFE_CALL_BEGIN();
  TVM_FFI_CHECK(num_args == 1, TypeError) << "clear(table) takes 1 argument";
  int64_t table_id = reinterpret_cast<const AnyView*>(raw)[0].cast<int64_t>();
  std::vector<Entry> dropped;  // released after the lock, outside it
  {
    std::unique_lock<std::shared_mutex> lock(table_mutex);
    for (auto it = table.begin(); it != table.end();) {
      if (it->first.v[0] == table_id) {
        dropped.push_back(std::move(it->second));
        it = table.erase(it);
      } else {
        ++it;
      }
    }
  }
  *reinterpret_cast<Any*>(result) = static_cast<int64_t>(dropped.size());
  TVM_FFI_SAFE_CALL_END();
}

// stamp() -> what this library was built from (build_fastpath.py sets it:
// the source's sha256 and the tvm-ffi version); run/fastpath.py refuses a
// library whose stamp is not the installed source's.
TVM_FFI_DLL_EXPORT int __tvm_ffi_stamp(void*, const TVMFFIAny*, int32_t, TVMFFIAny* result) {
  TVM_FFI_SAFE_CALL_BEGIN();
  *reinterpret_cast<Any*>(result) = tvm::ffi::String(CUTLASS_AOT_FASTPATH_STAMP);
  TVM_FFI_SAFE_CALL_END();
}

// size(table) -> that table's entries.
TVM_FFI_DLL_EXPORT int __tvm_ffi_size(void*, const TVMFFIAny* raw, int32_t num_args,
                                      TVMFFIAny* result) {
  TVM_FFI_SAFE_CALL_BEGIN();
  TVM_FFI_CHECK(num_args == 1, TypeError) << "size(table) takes 1 argument";
  int64_t table_id = reinterpret_cast<const AnyView*>(raw)[0].cast<int64_t>();
  int64_t count = 0;
  {
    std::shared_lock<std::shared_mutex> lock(table_mutex);
    for (const auto& kv : table) count += kv.first.v[0] == table_id;
  }
  *reinterpret_cast<Any*>(result) = count;
  TVM_FFI_SAFE_CALL_END();
}

}  // extern "C"
