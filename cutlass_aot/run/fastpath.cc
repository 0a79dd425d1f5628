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
// Calls with C (a residual; beta != 0) go `call_c(table, a, b, out, bias,
// act, c, alpha, beta)`, registered with `register_c(table, a, b, out, bias,
// act, c, fn, sms, splits, workspace_elems)`: c's layout is in the key too.
//
// Calls with a bias or an activation (nn.Linear with a bias, a fused MLP)
// go `call_bias(table, a, b, out, bias, act, alpha)` and are registered
// with `register_bias(table, a, b, out, bias, act, fn, sms, splits,
// workspace_elems)`: `bias` is the vector or None, `act` the activation's
// code (run/fastpath.py's ACT_CODES). Both are in the key; an artifact of
// a variant with a bias takes it after `out` (signature.gemm_abi_args).
//
// Neither entry launches a call whose `out` shares memory with a, b, the
// bias or c (the same arithmetic as run/select.py's views_overlap, a few
// integer operations a tensor): that call misses, and the Python path
// raises an ArgumentError that names the operand. A pair this half does
// not answer (a view with no unit-stride dim in two dims of blocks, or more
// block pairs than the test's budget, where byte ranges meet) misses too,
// and the Python path answers it.
//
// `table` is the runner's id (run/fastpath.py hands one to each runner):
// one process may open several caches, and a call must only ever hit its
// own runner's answers. The key is that id, the activation code (-1 for
// `call`; offset by kWithC for `call_c`), then every field a later call
// could differ in, for each of a, b, out, bias and c: device, dtype, rank,
// shape and strides (all zero for no bias or no c, which no tensor's rank
// can be). It fails closed: a new layout is a
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

#include <algorithm>
#include <array>
#include <cstdint>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

using tvm::ffi::Any;
using tvm::ffi::AnyView;
using tvm::ffi::Function;

// Table id, activation code, and five tensors of rank <= 3 (a, b, out,
// bias, c): 5 x (device, dtype, rank, 3 dims, 3 strides).
constexpr int kMaxRank = 3;
constexpr int kPerTensor = 3 + 2 * kMaxRank;
constexpr int kKeyLen = 2 + 5 * kPerTensor;
constexpr int64_t kNoAct = -1;  // `call`: the plain entry (run/fastpath.py NO_ACT)
// `call_c` keys its activation code offset by this, apart from `call_bias`'s.
constexpr int64_t kWithC = 1 << 16;

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
  bool bias;                // the artifact takes a bias vector after out (and c)
  bool c;                   // the artifact takes c after out, and beta after alpha
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
  // No storage of its own (a fake, zero or wrapper tensor): DLPack gives a
  // null pointer, which no launch may take; Python names the tensor. Empty
  // problems, whose pointers may be null, are never registered.
  if (t->data == nullptr) return false;
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

// --- out against the operands: the overlap check (run/select.py's
// views_overlap, the same rules) --------------------------------------
//
// A view's bytes as blocks of evenly pitched rows (select.py's _layout):
// the unit-stride dim's run (one element where none has unit stride); the
// other dims, ordered by stride, merge where each steps exactly the extent
// of the one inside it, and a dim that steps at most the row width widens
// the row. Of two dims left, the larger is the rows and the other places
// blocks (a batch stride with a gap). A view left with three (no unit
// stride) is "cannot tell" here: the call misses, and the Python path,
// which walks any number of block dims, answers it. Size-1 and stride-0
// dims add no bytes.
struct Rows {
  int64_t first, rows, pitch, width;
};

struct Layout {
  Rows rows;
  int64_t count, step;  // blocks: count of them (1: one block), step bytes apart
};

// Block pairs a test walks before it answers "cannot tell"
// (select.py's _BLOCK_PAIRS; the same budget, spent the same way).
constexpr int64_t kBlockPairs = 4096;

int64_t FloorDiv(int64_t a, int64_t b) {  // b > 0
  int64_t q = a / b;
  return (a % b != 0 && a < 0) ? q - 1 : q;
}

const char* First(const DLTensor* t) { return static_cast<const char*>(t->data) + t->byte_offset; }

int64_t Item(const DLTensor* t) { return (t->dtype.bits * t->dtype.lanes + 7) / 8; }

// false: the view has more than one dim of blocks (cannot tell here).
bool ToLayout(const DLTensor* t, Layout* l) {
  int64_t item = Item(t);
  int64_t dims[kMaxRank][2];  // (stride, size), sorted by stride
  int n = 0;
  for (int i = 0; i < t->ndim; ++i) {
    if (t->shape[i] > 1 && t->strides[i] != 0) {
      int j = n++;
      while (j > 0 && dims[j - 1][0] > t->strides[i]) {
        dims[j][0] = dims[j - 1][0];
        dims[j][1] = dims[j - 1][1];
        --j;
      }
      dims[j][0] = t->strides[i];
      dims[j][1] = t->shape[i];
    }
  }
  int d = 0;
  int64_t width = item;
  if (n > 0 && dims[0][0] == 1) {
    width = dims[0][1] * item;
    d = 1;
  }
  int64_t runs[kMaxRank][2];  // (count, step in bytes), merged
  int nr = 0;
  for (; d < n; ++d) {
    int64_t step = dims[d][0] * item;
    if (nr > 0 && step == runs[nr - 1][0] * runs[nr - 1][1]) {
      runs[nr - 1][0] *= dims[d][1];
    } else {
      runs[nr][0] = dims[d][1];
      runs[nr][1] = step;
      ++nr;
    }
  }
  int r0 = 0;
  for (; r0 < nr && runs[r0][1] <= width; ++r0) width += (runs[r0][0] - 1) * runs[r0][1];
  int64_t first = reinterpret_cast<int64_t>(First(t));
  switch (nr - r0) {
    case 0:
      *l = Layout{Rows{first, 1, width, width}, 1, 0};
      return true;
    case 1:
      *l = Layout{Rows{first, runs[r0][0], runs[r0][1], width}, 1, 0};
      return true;
    case 2: {
      // the larger run is the rows (the first on a tie, as max() takes it)
      int rows = runs[r0 + 1][0] > runs[r0][0] ? r0 + 1 : r0, blocks = rows == r0 ? r0 + 1 : r0;
      *l = Layout{Rows{first, runs[rows][0], runs[rows][1], width}, runs[blocks][0],
                  runs[blocks][1]};
      return true;
    }
    default:
      return false;
  }
}

// Whether rows first + i * pitch (i < rows), width bytes each, touch [start, end).
bool RowHits(int64_t start, int64_t end, const Rows& r) {
  int64_t lo = FloorDiv(start - r.width - r.first, r.pitch) + 1;
  int64_t hi = -FloorDiv(r.first - end, r.pitch) - 1;
  return std::max<int64_t>(lo, 0) <= std::min<int64_t>(hi, r.rows - 1);
}

// Sum of floor((a t + b) / m) over t in [0, n), a >= 0, m > 0: select.py's
// _floor_sum (Euclid's algorithm on the slope), in 128 bits, as byte
// offsets times row counts outgrow 64.
__int128 FloorSum(__int128 n, __int128 m, __int128 a, __int128 b) {
  __int128 total = 0;
  while (n > 0) {
    if (a >= m) {
      total += (a / m) * (n * (n - 1) / 2);
      a %= m;
    }
    if (b < 0 || b >= m) {
      __int128 q = b / m - ((b % m != 0 && b < 0) ? 1 : 0);
      total += q * n;
      b -= q * m;
    }
    __int128 top = a * n + b;
    if (top < m) break;
    n = top / m;
    b = top % m;
    std::swap(m, a);
  }
  return total;
}

// Whether two views of pitched rows share a byte (select.py's _rows_meet).
bool RowsMeet(const Rows& x, const Rows& y) {
  if (x.rows == 1) return RowHits(x.first, x.first + x.width, y);
  if (y.rows == 1) return RowHits(y.first, y.first + y.width, x);
  if (x.pitch == y.pitch) {
    int64_t dist = y.first - x.first;
    int64_t lo = FloorDiv(-y.width - dist, x.pitch) + 1;
    int64_t hi = -FloorDiv(dist - x.width, x.pitch) - 1;
    return std::max<int64_t>(lo, -(x.rows - 1)) <= std::min<int64_t>(hi, y.rows - 1);
  }
  // Two pitches: y's first and last rows against x's, then the run of x's
  // rows whose windows lie strictly between, counted by FloorSum.
  int64_t last = (y.rows - 1) * y.pitch;
  if (RowHits(y.first, y.first + y.width, x) ||
      RowHits(y.first + last, y.first + last + y.width, x))
    return true;
  int64_t c = x.first - y.first;
  int64_t i0 = std::max<int64_t>(FloorDiv(y.width - 1 - c, x.pitch) + 1, 0);
  int64_t i1 = std::min<int64_t>(-FloorDiv(c + x.width - 1 - last, x.pitch) - 1, x.rows - 1);
  if (i0 > i1) return false;
  __int128 n = i1 - i0 + 1, base = static_cast<__int128>(c) + static_cast<__int128>(i0) * x.pitch;
  return FloorSum(n, y.pitch, x.pitch, base + x.width - 1) > FloorSum(n, y.pitch, x.pitch, base - y.width);
}

// Views in blocks (select.py's _blocks_meet, one block dim each): walk
// the blocks of the view with fewer, and for each the other's blocks whose
// bytes meet it (a range of its block index). 1, 0, or -1 past the budget.
int BlocksMeet(Layout x, Layout y) {
  if (y.count > x.count) std::swap(x, y);
  int64_t budget = kBlockPairs - y.count;
  if (budget < 0) return -1;
  int64_t ext_x = (x.rows.rows - 1) * x.rows.pitch + x.rows.width;
  int64_t ext_y = (y.rows.rows - 1) * y.rows.pitch + y.rows.width;
  for (int64_t g = 0; g < y.count; ++g) {
    Rows by = y.rows;
    by.first += g * y.step;
    int64_t lo = 0, hi = 0;
    if (x.count > 1) {
      lo = std::max<int64_t>(FloorDiv(by.first - ext_x - x.rows.first, x.step) + 1, 0);
      hi = std::min<int64_t>(-FloorDiv(x.rows.first - by.first - ext_y, x.step) - 1, x.count - 1);
    } else if (!(x.rows.first < by.first + ext_y && by.first < x.rows.first + ext_x)) {
      continue;
    }
    for (int64_t h = lo; h <= hi; ++h) {
      if (--budget < 0) return -1;
      Rows bx = x.rows;
      bx.first += h * x.step;
      if (RowsMeet(bx, by)) return 1;
    }
  }
  return 0;
}

// 1: x and y share a byte; 0: they do not; -1: cannot tell here.
int Overlap(const DLTensor* x, const DLTensor* y) {
  int64_t last_x = 0, last_y = 0;
  for (int i = 0; i < x->ndim; ++i) {
    if (x->shape[i] == 0) return 0;
    last_x += (x->shape[i] - 1) * x->strides[i];
  }
  for (int i = 0; i < y->ndim; ++i) {
    if (y->shape[i] == 0) return 0;
    last_y += (y->shape[i] - 1) * y->strides[i];
  }
  int64_t lo_x = reinterpret_cast<int64_t>(First(x)), lo_y = reinterpret_cast<int64_t>(First(y));
  if (lo_x + (last_x + 1) * Item(x) <= lo_y || lo_y + (last_y + 1) * Item(y) <= lo_x) return 0;
  Layout lx, ly;
  if (!ToLayout(x, &lx) || !ToLayout(y, &ly)) return -1;
  if (lx.count == 1 && ly.count == 1) return RowsMeet(lx.rows, ly.rows) ? 1 : 0;
  return BlocksMeet(lx, ly);
}

// Whether two views are the same view: pointer, dtype, shape and strides.
bool SameView(const DLTensor* x, const DLTensor* y) {
  if (First(x) != First(y) || x->ndim != y->ndim || x->dtype.code != y->dtype.code ||
      x->dtype.bits != y->dtype.bits || x->dtype.lanes != y->dtype.lanes)
    return false;
  for (int i = 0; i < x->ndim; ++i) {
    if (x->shape[i] != y->shape[i] || x->strides[i] != y->strides[i]) return false;
  }
  return true;
}

// Whether out (args[3]) may share a byte with a, b, the bias or c (the
// kernel would read what it writes). c may be out itself: an in-place
// residual, whose every element is read before it is written. Such a call
// is a miss: the Python path names the problem, or, where this half cannot
// tell (Overlap's -1), answers it and launches.
bool Aliased(const AnyView* args, const AnyView* bias, const AnyView* c) {
  const DLTensor* out = *args[3].try_cast<DLTensor*>();
  for (int i = 1; i <= 2; ++i) {
    if (Overlap(out, *args[i].try_cast<DLTensor*>()) != 0) return true;
  }
  if (bias != nullptr && Overlap(out, *bias->try_cast<DLTensor*>()) != 0) return true;
  if (c == nullptr) return false;
  const DLTensor* ct = *c->try_cast<DLTensor*>();
  return !SameView(out, ct) && Overlap(out, ct) != 0;
}

// The with-C entries' key: MakeBiasKey's over (table, a, b, out, bias,
// act), then c (args[6], a tensor) in the fifth slot, the activation code
// offset by kWithC.
bool MakeCKey(const AnyView* args, Key* key, bool* has_bias) {
  if (!MakeBiasKey(args, key, has_bias)) return false;
  key->v[1] += kWithC;
  return PutTensor(args[6], key->v.data() + 2 + 4 * kPerTensor);
}

// Launch a registered entry: args[1..3] are a, b, out; c and bias the
// views of C and the bias (each unused unless the entry takes it), alpha
// and beta the scales (beta unused without c).
void Launch(const Entry& entry, const AnyView* args, const AnyView& c, const AnyView& bias,
            const AnyView& alpha, const AnyView& beta) {
  Any ignored;
  AnyView call_args[10];
  int n = 0;
  call_args[n++] = args[1];
  call_args[n++] = args[2];
  call_args[n++] = args[3];
  if (entry.c) call_args[n++] = c;
  if (entry.bias) call_args[n++] = bias;
  if (entry.splits < 0) {
    call_args[n++] = alpha;
    if (entry.c) call_args[n++] = beta;
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
  if (entry.c) call_args[n++] = beta;
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
// Whether the key is new to the table (false: its entry was replaced).
bool Register(const Key& key, bool bias, bool c, const AnyView* args, int first) {
  Entry entry{args[first].cast<Function>(), bias, c, args[first + 1].cast<int64_t>(),
              args[first + 2].cast<int64_t>(), args[first + 3].cast<int64_t>()};
  TVM_FFI_CHECK(entry.splits >= -1 && entry.workspace_elems >= 0, ValueError)
      << "register: splits is -1 (plain ABI) or a split count >= 0, workspace_elems >= 0; got "
      << entry.splits << ", " << entry.workspace_elems;
  std::unique_lock<std::shared_mutex> lock(table_mutex);
  return table.insert_or_assign(key, std::move(entry)).second;
}

// What a call carries beyond a, b and out: nothing (`call`), a bias and an
// activation (`call_bias`), or those and c (`call_c`).
enum class Kind { kPlain, kBias, kWithC };

// The call's key by kind; false if its tensors are not ones this path keys.
// *has_bias says whether the bias is a tensor (args[4]).
bool KeyOf(Kind kind, const AnyView* args, Key* key, bool* has_bias) {
  *has_bias = false;
  switch (kind) {
    case Kind::kPlain:
      return MakeKey(args, key);
    case Kind::kBias:
      return MakeBiasKey(args, key, has_bias);
    case Kind::kWithC:
      return MakeCKey(args, key, has_bias);
  }
  return false;
}

// The call entries' one body: 1 if the registered artifact was launched, 0
// on a miss (another arity, a key this path does not serve, nothing
// registered, or an out that shares memory with an operand). Argument
// places by kind: alpha at 4 (plain) or 6 (bias); c at 6 and alpha, beta
// at 7, 8 (with C).
int Call(Kind kind, int32_t want, const TVMFFIAny* raw, int32_t num_args, TVMFFIAny* result) {
  TVM_FFI_SAFE_CALL_BEGIN();
  const AnyView* args = reinterpret_cast<const AnyView*>(raw);
  Any* rv = reinterpret_cast<Any*>(result);
  Key key;
  Entry entry;
  bool has_bias = false;
  const bool with_c = kind == Kind::kWithC;
  if (num_args != want || !KeyOf(kind, args, &key, &has_bias) || !Find(key, &entry) ||
      Aliased(args, has_bias ? &args[4] : nullptr, with_c ? &args[6] : nullptr)) {
    *rv = 0;
    return 0;
  }
  if (kind == Kind::kPlain) {
    Launch(entry, args, AnyView(), AnyView(), args[4], AnyView());
  } else if (!with_c) {
    Launch(entry, args, AnyView(), args[4], args[6], AnyView());
  } else {
    Launch(entry, args, args[6], args[4], args[7], args[8]);
  }
  *rv = 1;
  TVM_FFI_SAFE_CALL_END();
}

// The register entries' one body: 1 for a new key, 2 where the key's entry
// was replaced (a pair this half cannot tell comes back each call),
// 0 if the tensors are not ones this path keys; `first` is where fn, sms,
// splits, workspace_elems begin.
int RegisterCall(Kind kind, int32_t want, int first, const char* usage, const TVMFFIAny* raw,
                 int32_t num_args, TVMFFIAny* result) {
  TVM_FFI_SAFE_CALL_BEGIN();
  const AnyView* args = reinterpret_cast<const AnyView*>(raw);
  Any* rv = reinterpret_cast<Any*>(result);
  TVM_FFI_CHECK(num_args == want, TypeError) << usage << " takes " << want << " arguments";
  Key key;
  bool has_bias = false;
  if (!KeyOf(kind, args, &key, &has_bias)) {
    *rv = 0;
    return 0;
  }
  *rv = Register(key, has_bias, kind == Kind::kWithC, args, first) ? 1 : 2;
  TVM_FFI_SAFE_CALL_END();
}

}  // namespace

extern "C" {

// call(table, a, b, out, alpha) -> 1 if an artifact was launched, 0 on a miss.
TVM_FFI_DLL_EXPORT int __tvm_ffi_call(void*, const TVMFFIAny* raw, int32_t num_args,
                                      TVMFFIAny* result) {
  return Call(Kind::kPlain, 5, raw, num_args, result);
}

// call_bias(table, a, b, out, bias, act, alpha) -> 1 if launched, 0 on a miss.
TVM_FFI_DLL_EXPORT int __tvm_ffi_call_bias(void*, const TVMFFIAny* raw, int32_t num_args,
                                           TVMFFIAny* result) {
  return Call(Kind::kBias, 7, raw, num_args, result);
}

// call_c(table, a, b, out, bias, act, c, alpha, beta) -> 1 if launched, 0 on
// a miss: a call with C (beta != 0; Python drops c when beta is 0).
TVM_FFI_DLL_EXPORT int __tvm_ffi_call_c(void*, const TVMFFIAny* raw, int32_t num_args,
                                        TVMFFIAny* result) {
  return Call(Kind::kWithC, 9, raw, num_args, result);
}

// register(table, a, b, out, fn, sms, splits, workspace_elems) -> 1, or 0 if
// the tensors are not ones this path keys (rank > 3, no strides).
TVM_FFI_DLL_EXPORT int __tvm_ffi_register(void*, const TVMFFIAny* raw, int32_t num_args,
                                          TVMFFIAny* result) {
  return RegisterCall(Kind::kPlain, 8, 4, "register(table, a, b, out, fn, sms, splits, workspace_elems)",
                      raw, num_args, result);
}

// register_bias(table, a, b, out, bias, act, fn, sms, splits, workspace_elems)
// -> 1, or 0 if the tensors are not ones this path keys. The artifact takes
// the bias after out when bias is a tensor; None registers an activation-only call.
TVM_FFI_DLL_EXPORT int __tvm_ffi_register_bias(void*, const TVMFFIAny* raw, int32_t num_args,
                                               TVMFFIAny* result) {
  return RegisterCall(Kind::kBias, 10, 6,
                      "register_bias(table, a, b, out, bias, act, fn, sms, splits, workspace_elems)",
                      raw, num_args, result);
}

// register_c(table, a, b, out, bias, act, c, fn, sms, splits, workspace_elems)
// -> 1, or 0 if the tensors are not ones this path keys. The artifact takes
// c after out (and the bias after c, when bias is a tensor), beta after alpha.
TVM_FFI_DLL_EXPORT int __tvm_ffi_register_c(void*, const TVMFFIAny* raw, int32_t num_args,
                                            TVMFFIAny* result) {
  return RegisterCall(Kind::kWithC, 11, 7,
                      "register_c(table, a, b, out, bias, act, c, fn, sms, splits, workspace_elems)",
                      raw, num_args, result);
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
