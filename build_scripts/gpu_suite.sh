#!/usr/bin/env bash
# GPU tests and benchmarks, in one call on the device machine.
#
# Expects, in the repository root: a cache built here with
#   cutlass-aot build --cache-dir .devcache --no-bundle-runtime configs/sm90.yaml
# (carried as .devcache; or, where the working tree would pass the 64 MiB a
# call carries, as .dcx/devcache.tar.xz made by
# `tar cf - .devcache | xz > .dcx/devcache.tar.xz`, unpacked here when
# .devcache is missing), the wheels the device image lacks in .whl/
# (apache-tvm-ffi, platformdirs) and the CuTe DSL runtime library,
# xz-compressed, in .rt/ (from ../shared/device/). Writes logs and result
# tables to $OUT (default ./gpu-out).
# The tracked benchmarks/results/raw/ (about 39 MB at r31) with .rt/ and the
# packed cache puts the tree over the device call's 64 MiB: move raw/ out of
# the tree for the call and back after it, and copy any raws a step reads
# (PROBE_RAWS, SWIZZLE_RAWS, CUBLASK_RAW) to an ignored folder that travels.
#
#   usage: build_scripts/gpu_suite.sh STEP...
#   steps: tests       pytest tests/gpu (every GPU test)
#          tune        cutlass-aot tune configs/sm90.yaml (the shipped table) -> $OUT/table.json
#          fit         bench_selection --sample fit (raw timings for fitting the model)
#          heldout     bench_selection --sample heldout (never fitted on)
#          tablebench  bench_selection --sample table (the table's own shapes)
#          decode      bench_decode.py
#          suite       bench_gemm.py (benchmarks/shapes.yaml vs cuBLAS)
#          host        bench_host.py (host cost per call)
#          model       bench_model.py (transformers Llama + a bias/GELU block, patched; MODEL_TOKENS, default
#                      1,128,2048,8192: issue 11 asks for 1 to 8192 tokens, r36-r42 ran up to 2048; MODEL_MODELS
#                      (llama,block), MODEL_ROUNDS (3), MODEL_PROFILE (token counts profiled: kernel time by
#                      kind), MODEL_TAG)
#          epilogue    bench_epilogue.py (fused bias/GELU vs torch's addmm + gelu)
#          episame     epilogue_same_form.py (plain, bias and bias+GELU on the same forms: the epilogue's own cost; EPISAME_DTYPE, EPISAME_FORMS, EPISAME_SHAPES (default: the llm shapes), EPISAME_TAG)
#          unaligned   bench_unaligned.py (staged and low-alignment routes vs cuBLAS)
#          oddedge     bench_odd_edge.py (an out padded past an odd N: the copy through scratch vs the padded problem and cuBLAS; ODDEDGE_SAMPLES, ODDEDGE_BUDGET_S)
#          splitkdiag  splitk_diag.py (split-K vs its plain sibling, whole waves and tails)
#          swizzlediag swizzle_diag.py (banded walks recorded below the bar, re-timed vs plain)
#          retime      option_retime.py (a shape's options re-timed round by round)
#          pitch       pitch_probe.py (contiguous against 128-byte padded row pitches; PITCH_SHAPES)
#          walkncu     walk_ncu.py under Nsight Compute, clocks untouched (banded against plain walks at long K; WALK_CASES)
#          skorder     streamk_order.py (stream-K's piece order: the same option from an old and this cache; SKORDER_OLD)
#          pitchncu    pitch_ncu.py under Nsight Compute, clocks untouched (the same layouts' L2 and DRAM counters)
#          tileprobe   tile_probe.py (new tiles against a sweep's recorded best; PROBE_TILES)
#          pickab      pick_ab.py time (a model change's old and new picks, timed together; PICKAB_PAIRS)
#          gridprobe   cluster_grid_probe.py (3-4 CTA clusters: SMs // size against the resident grid; GRID_SHAPES, GRID_DTYPE, GRID_TAG)
#          gridretime  cluster_grid_probe.py --from-raw (recorded 3-4 CTA options re-timed on the resident grid; GRID_RAWS, GRID_WITHIN, GRID_BUDGET_S)
#          l2check     l2_check.py (warm against cold L2, the timing harness's policy)
#          copyfloor   copy_floor.py (a copy's and a read's cost per call at the decode weights' sizes)
#          gemvfloor   gemv_floor.py (hand-written CUDA GEMVs beside our pick and cuBLAS at one token: decode's fixed cost; needs nvcc)
#          mufu        mufu_probe.py (tanh f32 / f16x2 / bf16x2 and the GELU body: values a clock an SM, SASS MUFU counts; needs nvcc)
#          cublask     cublas_kernels.py (cuBLAS's kernel names and times where it beats us; CUBLASK_RAW, CUBLASK_BELOW, CUBLASK_SHAPES)
#          harnessab   harness_ab.py (two options per problem under tune's graph/cold harness and bench_epilogue's eager one; HARNESS_PAIRS; HARNESS_B_CACHE: B from a second build; HARNESS_TAG)
#          sustain     sustained_probe.py (options and cuBLAS run for seconds each, nvidia-smi's clocks, power, memory-busy share and clock-event reasons sampled; SUSTAIN_SHAPES)
#          rowabove    row_above_ab.py (dispatch with and without r65's row-above rule at held-out token counts of
#                      the tuned widths, vs cuBLAS; ROWABOVE_DTYPE, ROWABOVE_WITHC=1 (residual calls), ROWABOVE_SEED,
#                      ROWABOVE_SAMPLE, ROWABOVE_TAG)
#          edgerows    edge_rows_probe.py (one option, plain and with C, as M cuts its last row of tiles; EDGE_OPTION,
#                      EDGE_NK (NxK), EDGE_MS, EDGE_DTYPE, EDGE_TAG)
#          accprobe    accuracy_probe.py (options and cuBLAS against an fp64 reference at long K; ACCPROBE_SHAPES,
#                      ACCPROBE_DTYPES, ACCPROBE_WITHC=1 (D = A·B + 0.5·C), ACCPROBE_OPTIONS (labels), ACCPROBE_TAG)
#          smoke       pulled_cache_smoke.py on .pulled (a cache pulled from a registry)
#          memcheck    GPU tests under compute-sanitizer's memcheck with torch's caching allocator off
#                      (every tensor its own allocation, so an access past a tensor is reported even
#                      where it would not fault); MEMCHECK_K (pytest -k; default the hostile-argument
#                      fuzz, r62's illegal memory access), MEMCHECK_TAG; errors exit 9
#          withc       with_c_edge.py (with-C GEMMs from this build and WITHC_OLD's, the pre-fix one: the cost of
#                      r62's bounds-checked C loads in edge tiles; WITHC_DTYPE, WITHC_SHAPES, WITHC_ABOUT, WITHC_TAG;
#                      WITHC_SAMPLE=N WITHC_SEED=S: N shapes held out from configs/sm90.yaml's residual tune: rows
#                      (WITHC_MAX_M: token counts 1..that, default 16384);
#                      WITHC_RANDOM=N (WITHC_MAX_GFLOP): N seeded random shapes at any width, where the model serves;
#                      WITHC_TWIN=1: also the plain call's pick launched as its with-C twin)
#          all         tests suite host decode heldout
# Each step runs under its own time limit (STEP_LIMIT_<step>, seconds);
# TUNE_FORCE=1 re-measures the rows the table already has; TUNE_STEADY_MS=MS times calls of
# 1 ms or more after MS of back-to-back runs (tune --steady-ms; unset: tune's default, 300 since
# r73; 0: in bursts); TUNE_SHAPES=FILE
# measures that shape file's problems instead of configs/sm90.yaml's (the
# table's other rows are kept); FIT_SAMPLE picks the fit step's sample (fit,
# or fit2: a second seed), FIT_COUNT its size before narrowing, FIT_MIN_M its
# smallest M and FIT_TAG its output names' suffix; TUNE_BUDGET_S,
# TABLE_BUDGET_S, FIT_BUDGET_S, HELDOUT_BUDGET_S bound the measuring steps, FIT_DTYPES and HELDOUT_DTYPES narrow the samples (FIT_MAX_M
# and HELDOUT_MAX_M to the shapes with M at most that, HELDOUT_MIN_M at least, HELDOUT_MIN_K
# to those with K at least that), and
# HELDOUT_START skips the held-out sample's first shapes (to continue a run),
# HELDOUT_STEADY_MS re-times its heavy shapes at the power cap's clock (--steady-ms),
# HELDOUT_TAG suffixes its output names (a second run in the same OUT);
# TABLE_START, TABLE_DTYPES, TABLE_MAX_M, TABLE_MIN_M and TABLE_TAG do the same for tablebench;
# DECODE_DTYPES, DECODE_START (skip the grid's first N problems: finish a run a budget stopped) and DECODE_BUDGET_S (default 450, about the whole grid on an H200 in r37: no problem starts later; the
# report covers those measured) drive bench_decode.py;
# SEL_AUTOTUNE sets the fit and held-out runs' autotune mode (options timed,
# default 6; 0 leaves the mode out and shortens the run).
# UNALIGNED_SAMPLES and UNALIGNED_BUDGET_S pick and bound bench_unaligned.py;
# EPILOGUE_GROUP picks bench_epilogue.py's shapes.yaml group (default llm),
# EPILOGUE_SAMPLE=heldout its seeded random sample instead, EPILOGUE_HARNESS=graph
# times it by graph replay with cold L2 (tune.timing; default eager), EPILOGUE_TAG
# suffixes its output names.
# RETIME_SHAPES (required), RETIME_DTYPE, RETIME_OPTIONS, RETIME_TOP,
# RETIME_ROUNDS, RETIME_CUBLAS=1 (torch.mm timed alongside) and RETIME_TAG (output name suffix) drive
# option_retime.py (re-time a shape's options round by round);
# SWIZZLE_THRESHOLD, SWIZZLE_MAX_PAIRS and SWIZZLE_BUDGET_S pick and bound
# swizzle_diag.py's pairs (defaults 0.95, 60, 110); SWIZZLE_RAWS (space-
# separated) names the sweeps it reads (default: r7's), e.g. the r14 raws:
# 303 pairs recorded below 0.90, about 136 s on an H200 (--list estimates).
# SWIZZLE_REGIME=N times N fresh seeded one-band pairs instead (--regime);
# SWIZZLE_SAMPLE=heldout (or fit, fit2) screens every banded pair on that
# selection-benchmark sample instead (--sample), in SWIZZLE_DTYPES (default both), its
# shapes with K >= SWIZZLE_MIN_K (default all), and where set only the shapes
# SWIZZLE_SHAPES (MxNxK,...) and banded variants SWIZZLE_VARIANTS (labels,...);
# SWIZZLE_ROUNDS sets the re-time's rounds (default 7);
# SWIZZLE_TAG suffixes its output name.
# PROBE_TILES (required), PROBE_SAMPLE (heldout), PROBE_DTYPES (bf16), PROBE_MIN_M, PROBE_MAX_M, PROBE_CLUSTERS, PROBE_SPLITS, PROBE_START,
# PROBE_RAWS (space-separated recorded sweeps), PROBE_BUDGET_S and PROBE_TAG drive
# tile_probe.py.
# SUSTAIN_SHAPES (required, MxNxK,...), SUSTAIN_DTYPE (f16), SUSTAIN_OPTIONS (labels; default
# the model's pick; the label pick names it beside others, dispatch what cache.gemm runs), SUSTAIN_SECONDS (4), SUSTAIN_ROUNDS (2),
# SUSTAIN_WINDOW_MS (100), SUSTAIN_COOL_S (idle seconds before each phase, 0),
# SUSTAIN_HARNESS=1 (tune's time_us before and after each phase; SUSTAIN_STEADY_MS, 300, its
# steady_ms for the second figure) and SUSTAIN_TAG drive sustained_probe.py.
# PICKAB_PAIRS (required: a pick_ab.py plan file), PICKAB_ROUNDS, PICKAB_BUDGET_S and PICKAB_TAG
# (output name suffix) drive pick_ab.py time; PICKAB_A_CACHE=DIR launches A's option from an
# old build, PICKAB_B_SAME=1 makes B A's option, PICKAB_SPACER=1 puts a torch kernel after each call.
# The cache must hold each configs/sm90-*.selection.json table (exit 3
# otherwise; ALLOW_STALE_TABLE=1 skips the check), or the table a `tune` step
# of an earlier invocation published into it (named in ${CACHE%/}.suite_tuned_table;
# r57's host step after a tune was refused for want of this).
# CUTLASS_AOT_COMMIT stamps the result files; pass it in the device command
# (CUTLASS_AOT_COMMIT=<sha> bash build_scripts/gpu_suite.sh ...): the device
# copy's git metadata can lag the working tree (r14's files read b3f823f
# for runs of 9ff4e8d).
set -uo pipefail
cd "$(dirname "$0")/.."
CACHE=${CACHE:-.devcache}
if [[ ! -d "$CACHE" && -f .dcx/devcache.tar.xz ]]; then
  tar xJf .dcx/devcache.tar.xz || exit 1
fi
OUT=${OUT:-gpu-out}
mkdir -p "$OUT" /tmp/rt
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
# Byte-compile what an installed package ships compiled: the image sets
# PYTHONDONTWRITEBYTECODE=1, so without this every fresh process compiled
# tvm_ffi's and cutlass_aot's sources again, about 0.1 s of bench_host's
# cold first GEMM (r44), which a pip-installed cutlass-aot never pays.
python3 -m compileall -q /tmp/site cutlass_aot > /dev/null || exit 1
if [[ -f .rt/libcute_dsl_runtime-4.8.1-cu12.so.xz && ! -f /tmp/rt/libcute_dsl_runtime.so ]]; then
  xz -dc .rt/libcute_dsl_runtime-4.8.1-cu12.so.xz > /tmp/rt/libcute_dsl_runtime.so
fi
[[ -f /tmp/rt/libcute_dsl_runtime.so ]] && export CUTLASS_AOT_RUNTIME_LIB=/tmp/rt/libcute_dsl_runtime.so
export PYTHONPATH="/tmp/site:$PWD:$PWD/benchmarks"
export CUTLASS_AOT_CACHE_DIR="$PWD/$CACHE"
export CUTLASS_AOT_COMMIT=${CUTLASS_AOT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,utilization.gpu --format=csv | tee "$OUT/gpu.txt"
# The carried cache must ship the working tree's tables (configs/sm90.yaml's
# tuning: list, one per GPU): r24's first call ran on a .dcx packed before the
# last re-tune (its gemv rows stale), and only a GPU test noticed.
# ALLOW_STALE_TABLE=1 runs anyway (an old build on purpose).
tuned=$(cat "${CACHE%/}.suite_tuned_table" 2>/dev/null)
for table in configs/sm90-*.selection.json; do
  want=$(sha256sum "$table" | cut -c1-64)
  if [[ ! -f "$CACHE/tables/$want.json" && -n $tuned && -f "$CACHE/tables/$tuned.json" ]]; then
    echo "$CACHE runs tables/$tuned.json, which a tune step published here, not $table" | tee -a "$OUT/gpu.txt"
  elif [[ ! -f "$CACHE/tables/$want.json" && -z ${ALLOW_STALE_TABLE:-} ]]; then
    echo "$CACHE does not hold $table (tables/$want.json): rebuild it, repack .dcx (or set ALLOW_STALE_TABLE=1)" | tee -a "$OUT/gpu.txt"
    exit 3
  fi
done
steps=("$@")
[[ ${#steps[@]} -eq 0 || ${steps[0]} == all ]] && steps=(tests suite host decode heldout)
rc=0
run() {  # run STEP LIMIT CMD...
  local step=$1 limit=$2; shift 2
  # a tag can hold what a variable name cannot (r71: ACCPROBE_TAG=_.dtw4 stopped the step)
  local var="STEP_LIMIT_${step//[^A-Za-z0-9_]/_}"; limit=${!var:-$limit}
  echo "== $step (limit ${limit}s) $(date -u +%H:%M:%S)"
  timeout "$limit" "$@" 2>&1 | tee "$OUT/$step.log"
  local r=${PIPESTATUS[0]}
  echo "== $step rc=$r $(date -u +%H:%M:%S)"
  [[ $r -ne 0 ]] && rc=$r
}
tune_src=(configs/sm90.yaml)
[[ -n ${TUNE_SHAPES:-} ]] && tune_src=(--shapes "$TUNE_SHAPES")
for s in "${steps[@]}"; do
  case $s in
    tests) run tests 300 python3 -m pytest --noconftest -q -p no:cacheprovider --maxfail=20 ${TESTS_K:+-k "$TESTS_K"} tests/gpu ;;
    tune) run tune 320 python3 -m cutlass_aot.cli tune "${tune_src[@]}" --budget-s "${TUNE_BUDGET_S:-290}" ${TUNE_FORCE:+--force} ${TUNE_STEADY_MS:+--steady-ms "$TUNE_STEADY_MS"} --out "$OUT/table.json"
          # the table it published into the cache: later invocations accept it (the check above)
          [[ -f "$OUT/table.json" ]] && sha256sum "$OUT/table.json" | cut -c1-64 > "${CACHE%/}.suite_tuned_table" ;;
    fit) run fit 240 python3 benchmarks/bench_selection.py --sample "${FIT_SAMPLE:-fit}" --count "${FIT_COUNT:-200}" --budget-s "${FIT_BUDGET_S:-220}" --dtypes "${FIT_DTYPES:-bf16,f16}" ${FIT_MAX_M:+--max-m "$FIT_MAX_M"} ${FIT_MIN_M:+--min-m "$FIT_MIN_M"} --autotune "${SEL_AUTOTUNE:-6}" --raw "$OUT/fit${FIT_TAG:-}_raw.json" --out "$OUT/selection_fit${FIT_TAG:-}.md" ;;
    heldout) run heldout 300 python3 benchmarks/bench_selection.py --sample heldout --budget-s "${HELDOUT_BUDGET_S:-260}" --start "${HELDOUT_START:-0}" --dtypes "${HELDOUT_DTYPES:-bf16,f16}" ${HELDOUT_MAX_M:+--max-m "$HELDOUT_MAX_M"} ${HELDOUT_MIN_M:+--min-m "$HELDOUT_MIN_M"} ${HELDOUT_MIN_K:+--min-k "$HELDOUT_MIN_K"} --autotune "${SEL_AUTOTUNE:-6}" ${HELDOUT_STEADY_MS:+--steady-ms "$HELDOUT_STEADY_MS"} --raw "$OUT/heldout${HELDOUT_TAG:-}_raw.json" --out "$OUT/selection_heldout${HELDOUT_TAG:-}.md" ;;
    tablebench) run tablebench 150 python3 benchmarks/bench_selection.py --sample table --budget-s "${TABLE_BUDGET_S:-120}" --start "${TABLE_START:-0}" --dtypes "${TABLE_DTYPES:-bf16,f16}" ${TABLE_MAX_M:+--max-m "$TABLE_MAX_M"} ${TABLE_MIN_M:+--min-m "$TABLE_MIN_M"} --raw "$OUT/table${TABLE_TAG:-}_raw.json" --out "$OUT/selection_table${TABLE_TAG:-}.md" ;;
    decode) run decode 480 python3 benchmarks/bench_decode.py --dtypes "${DECODE_DTYPES:-bf16,f16}" --budget-s "${DECODE_BUDGET_S:-450}" --start "${DECODE_START:-0}" --raw "$OUT/decode_raw.json" --out "$OUT/decode.md" ;;
    suite) run suite 240 python3 benchmarks/bench_gemm.py --out "$OUT/gemm_vs_cublas.md" ;;
    host) run host 200 python3 benchmarks/bench_host.py --out "$OUT/host_overhead.md" ;;
    model) run "model${MODEL_TAG:-}" 180 python3 benchmarks/bench_model.py --tokens "${MODEL_TOKENS:-1,128,2048,8192}" --models "${MODEL_MODELS:-llama,block}" --rounds "${MODEL_ROUNDS:-3}" --reps 5 ${MODEL_PROFILE:+--profile "$MODEL_PROFILE"} --out "$OUT/model${MODEL_TAG:-}.md" ;;
    episame) run "episame${EPISAME_TAG:-}" 240 python3 benchmarks/epilogue_same_form.py --dtype "${EPISAME_DTYPE:-bf16}" ${EPISAME_FORMS:+--forms "$EPISAME_FORMS"} --shapes "${EPISAME_SHAPES:-1024x6144x4096,1024x4096x4096,1024x28672x4096,1024x4096x14336,4096x6144x4096,4096x4096x4096,4096x28672x4096,4096x4096x14336,16384x6144x4096,16384x4096x4096,16384x28672x4096,16384x4096x14336}" --raw "$OUT/epilogue_same_form${EPISAME_TAG:-}_raw.json" --out "$OUT/epilogue_same_form${EPISAME_TAG:-}.md" ;;
    epilogue) run "epilogue${EPILOGUE_TAG:-}" 75 python3 benchmarks/bench_epilogue.py --group "${EPILOGUE_GROUP:-llm}" ${EPILOGUE_SAMPLE:+--sample "$EPILOGUE_SAMPLE"} --harness "${EPILOGUE_HARNESS:-eager}" --out "$OUT/epilogue${EPILOGUE_TAG:-}.md" ;;
    unaligned) run unaligned 150 python3 benchmarks/bench_unaligned.py --samples "${UNALIGNED_SAMPLES:-suite,heldout}" --budget-s "${UNALIGNED_BUDGET_S:-120}" --raw "$OUT/unaligned_raw.json" --out "$OUT/unaligned.md" ;;
    oddedge) run oddedge 150 python3 benchmarks/bench_odd_edge.py --samples "${ODDEDGE_SAMPLES:-suite,heldout}" --budget-s "${ODDEDGE_BUDGET_S:-120}" --raw "$OUT/odd_edge_raw.json" --out "$OUT/odd_edge.md" ;;
    splitkdiag) run splitkdiag 120 python3 benchmarks/splitk_diag.py --out "$OUT/splitk_diag.md" ;;
    swizzlediag) run swizzlediag 150 python3 benchmarks/swizzle_diag.py --threshold "${SWIZZLE_THRESHOLD:-0.95}" --max-pairs "${SWIZZLE_MAX_PAIRS:-60}" --budget-s "${SWIZZLE_BUDGET_S:-110}" ${SWIZZLE_RAWS:+--raw $SWIZZLE_RAWS} ${SWIZZLE_REGIME:+--regime "$SWIZZLE_REGIME"} ${SWIZZLE_SAMPLE:+--sample "$SWIZZLE_SAMPLE" --dtypes "${SWIZZLE_DTYPES:-bf16,f16}" --screen-raw "$OUT/swizzle_screen${SWIZZLE_TAG:-}_raw.json" --min-k "${SWIZZLE_MIN_K:-0}" ${SWIZZLE_SHAPES:+--shapes "$SWIZZLE_SHAPES"} ${SWIZZLE_VARIANTS:+--variants "$SWIZZLE_VARIANTS"}} --rounds "${SWIZZLE_ROUNDS:-7}" --out "$OUT/swizzle_diag${SWIZZLE_TAG:-}.md" ;;
    pitch) run pitch 120 python3 benchmarks/pitch_probe.py ${PITCH_SHAPES:+--shapes "$PITCH_SHAPES"} --out "$OUT/pitch_probe.md" ;;
    pitchncu) run pitchncu 240 bash -c 'ncu --profile-from-start off --clock-control none --nvtx --print-nvtx-rename kernel --csv --page raw --metrics "$(python3 benchmarks/pitch_ncu.py metrics)" --log-file "$0/pitch_ncu.csv" python3 benchmarks/pitch_ncu.py run ${1:+--shapes "$1"} && python3 benchmarks/pitch_ncu.py report "$0/pitch_ncu.csv" --out "$0/pitch_ncu.md"' "$OUT" "${PITCH_SHAPES:-}" ;;
    walkncu) run walkncu 300 bash -c 'ncu --profile-from-start off --clock-control none --nvtx --print-nvtx-rename kernel --csv --page raw --metrics "$(python3 benchmarks/walk_ncu.py metrics)" --log-file "$0/walk_ncu.csv" python3 benchmarks/walk_ncu.py run ${1:+--cases "$1"} && python3 benchmarks/walk_ncu.py report "$0/walk_ncu.csv" --out "$0/walk_ncu.md"' "$OUT" "${WALK_CASES:-}" ;;
    skorder) run skorder 240 python3 benchmarks/streamk_order.py --old "${SKORDER_OLD:?SKORDER_OLD=old cache dir}" --sample "${SKORDER_SAMPLE:-24}" --within "${SKORDER_WITHIN:-1.01}" --budget-s "${SKORDER_BUDGET_S:-150}" ${SKORDER_RAWS:+--from-raw $SKORDER_RAWS} --out "$OUT/streamk_order.md" ;;
    retime) run retime 150 python3 benchmarks/option_retime.py --shapes "${RETIME_SHAPES:?RETIME_SHAPES=MxNxK,...}" --dtype "${RETIME_DTYPE:-bf16}" --top "${RETIME_TOP:-12}" --rounds "${RETIME_ROUNDS:-5}" --options "${RETIME_OPTIONS:-all}" ${RETIME_CUBLAS:+--cublas} --raw "$OUT/option_retime${RETIME_TAG:-}_raw.json" --out "$OUT/option_retime${RETIME_TAG:-}.md" ;;
    tileprobe) run "tileprobe${PROBE_TAG:-}" 400 python3 benchmarks/tile_probe.py --tiles "${PROBE_TILES:?PROBE_TILES=MxN,...}" ${PROBE_CLUSTERS:+--clusters "$PROBE_CLUSTERS"} --sample "${PROBE_SAMPLE:-heldout}" --dtypes "${PROBE_DTYPES:-bf16}" ${PROBE_MIN_M:+--min-m "$PROBE_MIN_M"} ${PROBE_MAX_M:+--max-m "$PROBE_MAX_M"} --start "${PROBE_START:-0}" --splits "${PROBE_SPLITS:-3}" --budget-s "${PROBE_BUDGET_S:-200}" ${PROBE_RAWS:+--from-raw $PROBE_RAWS} --raw "$OUT/tile_probe${PROBE_TAG:-}_raw.json" --out "$OUT/tile_probe${PROBE_TAG:-}.md" ;;
    pickab) run pickab 200 python3 benchmarks/pick_ab.py time "${PICKAB_PAIRS:?PICKAB_PAIRS=pairs.json}" --rounds "${PICKAB_ROUNDS:-5}" --budget-s "${PICKAB_BUDGET_S:-150}" ${PICKAB_A_CACHE:+--a-cache "$PICKAB_A_CACHE"} ${PICKAB_B_SAME:+--b-same} ${PICKAB_SPACER:+--spacer} --raw "$OUT/pick_ab${PICKAB_TAG:-}_raw.json" --out "$OUT/pick_ab${PICKAB_TAG:-}.md" ;;
    gridprobe) run gridprobe 240 python3 benchmarks/cluster_grid_probe.py --dtype "${GRID_DTYPE:-bf16}" ${GRID_SHAPES:+--shapes "$GRID_SHAPES"} --raw "$OUT/cluster_grid${GRID_TAG:-}_raw.json" --out "$OUT/cluster_grid${GRID_TAG:-}.md" ;;
    gridretime) run gridretime 420 python3 benchmarks/cluster_grid_probe.py --from-raw ${GRID_RAWS:?GRID_RAWS=recorded sweeps} --within "${GRID_WITHIN:-1.5}" --budget-s "${GRID_BUDGET_S:-300}" --patched "$OUT/cluster_grid_retime${GRID_TAG:-}_raw.json" --out "$OUT/cluster_grid_retime${GRID_TAG:-}.md" ;;
    l2check) run l2check 90 python3 benchmarks/l2_check.py --out "$OUT/l2_check.md" ;;
    copyfloor) run copyfloor 90 python3 benchmarks/copy_floor.py --out "$OUT/copy_floor.md" ;;
    gemvfloor) run gemvfloor 240 python3 benchmarks/gemv_floor.py ${GEMVFLOOR_DSL_MIX:+--dsl-mix} ${GEMVFLOOR_FRAG:+--frag} ${GEMVFLOOR_VARIANTS:+--variants "$GEMVFLOOR_VARIANTS"} --modes "${GEMVFLOOR_MODES:-plain,pdl,pdl-w}" --out "$OUT/gemv_floor.md" ;;
    mufu) run mufu 120 python3 benchmarks/mufu_probe.py --out "$OUT/mufu_probe.md" ;;
    cublask) run cublask 120 python3 benchmarks/cublas_kernels.py ${CUBLASK_RAW:+--raw "$CUBLASK_RAW"} --below "${CUBLASK_BELOW:-0.90}" --shapes ${CUBLASK_SHAPES:-} --tag "${CUBLASK_TAG:-}" --out-dir "$OUT" ;;
    harnessab) run harnessab 150 python3 benchmarks/harness_ab.py --pairs "${HARNESS_PAIRS:?HARNESS_PAIRS=dtype:epilogue:MxNxK:A:B,...}" --rounds "${HARNESS_ROUNDS:-5}" ${HARNESS_B_CACHE:+--b-cache "$HARNESS_B_CACHE"} --out "$OUT/harness_ab${HARNESS_TAG:-}.md" ;;
    sustain) run "sustain${SUSTAIN_TAG:-}" 240 python3 benchmarks/sustained_probe.py --shapes "${SUSTAIN_SHAPES:?SUSTAIN_SHAPES=MxNxK,...}" --dtype "${SUSTAIN_DTYPE:-f16}" ${SUSTAIN_OPTIONS:+--options "$SUSTAIN_OPTIONS"} --seconds "${SUSTAIN_SECONDS:-4}" --rounds "${SUSTAIN_ROUNDS:-2}" --window-ms "${SUSTAIN_WINDOW_MS:-100}" --cool-s "${SUSTAIN_COOL_S:-0}" ${SUSTAIN_HARNESS:+--harness --steady-ms "${SUSTAIN_STEADY_MS:-300}"} --raw "$OUT/sustained${SUSTAIN_TAG:-}_raw.json" --out "$OUT/sustained${SUSTAIN_TAG:-}.md" ;;
    memcheck) run "memcheck${MEMCHECK_TAG:-}" 480 bash -c 'cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
      [[ -n $cs ]] || { echo "compute-sanitizer: not on this machine"; exit 4; }
      PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$cs" --tool memcheck --error-exitcode 9 --print-limit 50 --log-file "$0/memcheck$1.txt" python3 -m pytest --noconftest -q -p no:cacheprovider -x -k "$2" tests/gpu' "$OUT" "${MEMCHECK_TAG:-}" "${MEMCHECK_K:-test_generated_gpu_calls}" ;;
    withc) run "withc${WITHC_TAG:-}" 200 python3 benchmarks/with_c_edge.py --old-cache "${WITHC_OLD:?WITHC_OLD=the pre-fix cache dir}" --dtype "${WITHC_DTYPE:-bf16}" ${WITHC_SHAPES:+--shapes "$WITHC_SHAPES"} ${WITHC_SAMPLE:+--sample "$WITHC_SAMPLE"} ${WITHC_MAX_M:+--max-m "$WITHC_MAX_M"} ${WITHC_RANDOM:+--random "$WITHC_RANDOM"} ${WITHC_MAX_GFLOP:+--max-gflop "$WITHC_MAX_GFLOP"} ${WITHC_TWIN:+--twin} ${WITHC_SEED:+--seed "$WITHC_SEED"} ${WITHC_ABOUT:+--about "$WITHC_ABOUT"} --out "$OUT/with_c_edge${WITHC_TAG:-}.md" ;;
    rowabove) run "rowabove${ROWABOVE_TAG:-}" 150 python3 benchmarks/row_above_ab.py --dtype "${ROWABOVE_DTYPE:-bf16}" ${ROWABOVE_WITHC:+--with-c} --seed "${ROWABOVE_SEED:-66}" --sample "${ROWABOVE_SAMPLE:-32}" --out "$OUT/row_above${ROWABOVE_TAG:-}.md" ;;
    edgerows) run "edgerows${EDGE_TAG:-}" 120 python3 benchmarks/edge_rows_probe.py --option "${EDGE_OPTION:-128x128/2x1/m1}" --nk "${EDGE_NK:-4096x4096}" --ms "${EDGE_MS:-384,400,424,448,475,500,512}" --dtype "${EDGE_DTYPE:-bf16}" --out "$OUT/edge_rows${EDGE_TAG:-}.md" ;;
    accprobe) run "accprobe${ACCPROBE_TAG:-}" 180 python3 benchmarks/accuracy_probe.py --shapes "${ACCPROBE_SHAPES:?ACCPROBE_SHAPES=MxNxK,...}" --dtypes "${ACCPROBE_DTYPES:-bf16,f16}" ${ACCPROBE_WITHC:+--with-c} ${ACCPROBE_OPTIONS:+--options "$ACCPROBE_OPTIONS"} --out "$OUT/accuracy_probe${ACCPROBE_TAG:-}.md" ;;
    smoke) run smoke 20 python3 benchmarks/pulled_cache_smoke.py .pulled --out "$OUT/pulled_smoke.json" ;;
    *) echo "unknown step $s"; rc=2 ;;
  esac
done
exit $rc
