#!/usr/bin/env bash
# fedrun on a GPU: the checks and measurements a lent GPU machine runs, one stage per call.
#
# A GPU is lent for 15 minutes of device time in all (the machine's start, the copy of the working
# tree, every call and idle wait count), so one loan runs one stage: `draw`.  It does in at most
# 9 minutes on one H100 what matters most (scripts/bench/gpu_draw.py):
#   draw [STEP ...]  cuda     tests/test_cuda.py with FEDRUN_TEST_CAPTURE=on: engines on CUDA, captured
#                             lock-steps included, == each other and the CPU, auto chunk, TF32/bf16
#                             bounds, a population, a CLI run                                    (<= 120 s)
#                    preset   FedNNNN's MNIST non-IID-UB preset, 100 rounds, whole MNIST, whole process,
#                             engine=auto engine.capture=auto: wall time, per-round split, accuracy
#                             vs Table 2                                                         (<= 120 s)
#                    engines  the same workload 3 rounds, batched vs sequential: the ratio      (<= 75 s)
#                    balanced the balanced preset (mnist_noniid_b), the preset's figures         (<= 60 s)
#                    lockstep bench_lockstep.py: both presets' lock-steps, critical path, shapes,
#                             occupancy; ms and kernels a lock-step, eager vs captured; floors  (<= 45 s)
#                    table2   Table 2's 4 MNIST conditions, then its 4 CIFAR-10 ones on the carried JPEG
#                             copy (dataset=cifar10_jpeg), each its 5 methods as one population,
#                             100 rounds, resumed across loans (below)                  (the rest, >= 100 s)
#                    Name steps to rerun only those (e.g. `draw table2`), with GPU_CHECK_BUDGET=<s>.
#   table2's runs go on from loan to loan: it comes back with table2_resume_1.tar.gz (and _2 ... at
#   most 4, each under 15 MiB: the whole state of the table; a finished run keeps no checkpoint).
#   Committed under outputs/reproductions/fednnnn_gpu/resume/, replacing every earlier
#   table2_resume_*.tar.gz there, they travel with the checkout and the next draw unpacks them and
#   resumes each run from its last round (scripts/bench/resume_runs.py: niidbench's mechanism).
#   GPU_CHECK_RUNS=<folder> takes the archives from elsewhere, GPU_CHECK_CONDITIONS=mnist_iid_b,...
#   trains only those conditions, GPU_CHECK_ADD_ROUNDS=N stops each population N rounds on.
#
# Later loans (one stage each, each within 9 minutes; synthetic data or the carried MNIST):
#   bench [WORKLOAD...]  bench.py small, fednnnn_mnist, fednnnn_cifar10 (or the workloads named, e.g.
#                niidbench_mnist) in FP32, both engines side by side, with a profile of a round (~6 min)
#   regularizers bench_regularizers.py: FedProx's, SCAFFOLD's and FedLap's penalty gradients written out vs
#                through autograd, beside FedAvg, on NIID-Bench's CNN, whole-MNIST-sized clients (~1-2 min)
#   chunks       the batched engine with 10, 25, 50 clients a step and auto, both FedNNNN workloads (~4 min)
#   modes        TF32, bf16 and torch.compile vs FP32 (speed, first-round updates), batched engine (~6 min)
#   accuracy     precision_check.py: FedNNNN's MNIST preset, 30 rounds per mode, accuracy vs FP32 (~5 min)
#   bookkeeping  bench_bookkeeping.py: aggregation, diagnostics, rows, checkpoint per round (~3 min)
#   population   bench.py population: FedNNNN's 25-run MNIST grid, 3 rounds one by one vs as one
#                population (~5-8 min)
#   niidbench JOB...  NIID-Bench Table III's whole-MNIST rows: each JOB (a partition c1|c2|c3|dir05|iid:
#                4 methods x seeds 0,1,2, 50 rounds, one population; PART:after_step|gradient: SCAFFOLD
#                alone, one reading; JOB+JOB: one after the other) in its own process, side by side; cut at the budget
# Every stage runs under `timeout` at GPU_CHECK_BUDGET seconds (default 540) and writes at most 8
# files to $OUT (else outputs/gpu_check/<stage>).
#
# Preparation, once, here on the CPU, from the repository root (needs PyPI and ../shared/data/mnist):
#   bash scripts/bench/gpu_check.sh prepare
# It puts the wheels of hydra-core 1.3.8, omegaconf 2.3.1 and antlr4-python3-runtime 4.9.3 in .whl/,
# MNIST's four .gz files in .gpudata/mnist/ and, where it fits in the call, CIFAR-10's JPEG q75 copy
# in .gpudata/cifar10-jpeg/ (GPU_CHECK_CIFAR10; all ignored by git), checks that the wheels
# install and import offline, and that the working tree plus both folders stay under the 64 MiB a
# call carries, then prints the device call.  The device call (device tool, verb `run`):
#   command:   bash scripts/bench/gpu_check.sh draw
#   carry:     [".whl", ".gpudata"]
#   timeout_s: 600
# then `give_back` at once.  The GPU machine has torch but not hydra-core/omegaconf and no network;
# stages install the carried wheels into a temporary folder.
#
# Environment: GPU_CHECK_DEVICE=cuda|cpu (cpu: the CPU check, tests/test_gpu_check.py),
# GPU_CHECK_SIZE=full|tiny, GPU_CHECK_SPLIT=population|run (niidbench: a job's runs as one population, or
# one process a run), GPU_CHECK_DATA (default .gpudata/mnist), GPU_CHECK_WHEELS (default .whl),
# GPU_CHECK_BUDGET (seconds, default 540), GPU_CHECK_RUNS (the runs to go on with: niidbench's folder of
# runs or archives, the draw's folder of table2 archives), GPU_CHECK_CONDITIONS and GPU_CHECK_ADD_ROUNDS
# (the draw's table2, above), PYTHON (default python3).
set -uo pipefail
stage=${1:-}
usage="usage: bash $0 prepare|draw|bench|regularizers|chunks|modes|accuracy|bookkeeping|population|niidbench"
cd "$(dirname "$0")/../.." || exit 2
py=${PYTHON:-python3}
device=${GPU_CHECK_DEVICE:-cuda}
data=${GPU_CHECK_DATA:-.gpudata/mnist}
wheels=${GPU_CHECK_WHEELS:-.whl}
budget=${GPU_CHECK_BUDGET:-540}
WHEELS=(hydra-core==1.3.8 omegaconf==2.3.1 antlr4-python3-runtime==4.9.3)
WHEEL_FILES=(hydra_core-1.3.8-py3-none-any.whl omegaconf-2.3.1-py3-none-any.whl
             antlr4_python3_runtime-4.9.3-py3-none-any.whl)
# Where the resume archives of niidbench's unfinished runs are committed (see the niidbench stage).
RESUME=outputs/reproductions/niidbench_gpu/resume
IDX=(train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte)
LIMIT_MIB=64

fail() { echo "gpu_check: $*" >&2; exit 2; }

case $stage in
prepare|draw|bench|regularizers|chunks|modes|accuracy|bookkeeping|population|niidbench) ;;
"") fail "$usage" ;;
*) fail "stage must be one of prepare, draw, bench, regularizers, chunks, modes, accuracy, bookkeeping, population, niidbench (got '$stage')" ;;
esac

# niidbench's jobs, checked before anything is written.
if [ "$stage" = niidbench ]; then
    [ $# -ge 2 ] || fail "usage: bash $0 niidbench JOB [JOB ...]; JOB: c1|c2|c3|dir05|iid, PART:after_step|gradient, JOB+JOB"
    # A call returns at most 8 files: the device's line, and a log and a resume archive per chain, and the runs.
    [ $# -le 4 ] || fail "niidbench: at most 3 chains side by side (got $(( $# - 1 ))): join jobs with '+' to run them one after the other"
    for chain in "${@:2}"; do
        for job in ${chain//+/ }; do
            case $job in c1|c2|c3|dir05|iid|c1:*|c2:*|c3:*|dir05:*|iid:*) ;; *)
                fail "niidbench: job '$job' must be c1, c2, c3, dir05 or iid, optionally with :after_step or :gradient";;
            esac
            case $job in *:*) case ${job#*:} in after_step|gradient) ;; *)
                fail "niidbench: job '$job': the reading after ':' must be after_step or gradient";; esac;; esac
        done
    done
fi

check_data() {
    for f in "${IDX[@]}"; do
        [ -f "$data/$f.gz" ] || [ -f "$data/$f" ] || fail "$data lacks $f.gz (MNIST's four IDX files): run 'bash scripts/bench/gpu_check.sh prepare' and carry .gpudata"
    done
}

# hydra-core and omegaconf: from the wheels folder when there is one (the device has neither), else
# from this environment.  An incomplete wheels folder is an error here as it would be there.
install_wheels() {
    if [ -e "$wheels" ]; then
        [ -d "$wheels" ] || fail "$wheels is not a folder of wheels"
        for w in "${WHEEL_FILES[@]}"; do
            [ -f "$wheels/$w" ] || fail "$wheels lacks $w (run 'bash scripts/bench/gpu_check.sh prepare')"
        done
        site=$(mktemp -d "${TMPDIR:-/tmp}/fedrun-gpu-site.XXXXXX")
        if ! err=$($py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
                  "${WHEEL_FILES[@]/#/$wheels/}" 2>&1); then
            fail "pip could not install the wheels in $wheels: $(echo "$err" | grep -v '^\s*$' | tail -1)"
        fi
        export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
    elif ! $py -c "import hydra, omegaconf" 2>/dev/null; then
        fail "hydra-core and omegaconf are not installed and there is no $wheels folder of their wheels (run 'bash scripts/bench/gpu_check.sh prepare' and carry .whl)"
    fi
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # fedrun from this checkout, not installed
    err=$($py -c "import hydra, omegaconf, fedrun, pandas, tqdm, matplotlib" 2>&1) \
        || fail "fedrun cannot be imported here: $(echo "$err" | tail -1)"
    if [ "$device" != cpu ]; then
        $py -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null \
            || fail "torch sees no CUDA device here (GPU_CHECK_DEVICE=cpu runs the CPU check)"
    fi
}

# The size a device call carries: tracked and untracked-not-ignored files, plus the carried folders
# (.gpuruns: niidbench's runs to go on with, when there is one).
travel_mib() {
    { git ls-files -z --cached --others --exclude-standard; find .whl .gpudata .gpuruns -type f -print0 2>/dev/null; } \
        | du -bc --files0-from=- 2>/dev/null | tail -1 | awk '{printf "%.1f", $1 / 1048576}'
}

if [ "$stage" = prepare ]; then
    src=${GPU_CHECK_MNIST:-../shared/data/mnist}
    git check-ignore -q .whl/x && git check-ignore -q .gpudata/x || fail ".whl/ and .gpudata/ must be ignored by git (.gitignore)"
    mkdir -p .whl .gpudata/mnist
    for i in 0 1; do
        [ -f ".whl/${WHEEL_FILES[$i]}" ] || $py -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
            --implementation cp -d .whl "${WHEELS[$i]}" 2>&1 | grep -v "^WARNING: Location" >&2
    done
    # antlr4-python3-runtime 4.9.3 is published as source only: build its (pure-Python) wheel here.
    [ -f ".whl/${WHEEL_FILES[2]}" ] || $py -m pip wheel -q --no-deps -w .whl "${WHEELS[2]}" 2>&1 \
        | grep -v "^WARNING: Location" >&2
    for f in "${IDX[@]}"; do
        [ -f "$src/$f.gz" ] || fail "$src lacks $f.gz (set GPU_CHECK_MNIST to the folder of MNIST's .gz files)"
        install -m 0644 "$src/$f.gz" .gpudata/mnist/
    done
    data=.gpudata/mnist wheels=.whl
    check_data
    # The wheels must install and import on their own (no index, as on the device).
    site=$(mktemp -d)
    $py -m pip install -q --no-index --no-deps --no-compile --target "$site" "${WHEEL_FILES[@]/#/.whl/}" \
        || fail "the wheels in .whl do not install offline"
    where=$(PYTHONPATH=$site $py -c "import hydra, omegaconf; print(hydra.__file__)") || fail "hydra does not import from the wheels"
    case $where in "$site"/*) ;; *) fail "hydra imported from $where, not from the wheels";; esac
    rm -rf "$site"
    # CIFAR-10's JPEG q75 copy (18.2 MB), for the draw's CIFAR-10 conditions of Table 2, where it fits.
    cifar=${GPU_CHECK_CIFAR10:-../shared/data/cifar10-jpeg/cifar10_jpeg_q75.npz.xz}
    carried="4 files"
    if [ -f "$cifar" ]; then
        mkdir -p .gpudata/cifar10-jpeg
        install -m 0644 "$cifar" .gpudata/cifar10-jpeg/cifar10_jpeg_q75.npz.xz
        if awk -v s="$(travel_mib)" -v l="$LIMIT_MIB" 'BEGIN { exit !(s < l - 2) }'; then
            carried="4 files, and .gpudata/cifar10-jpeg: CIFAR-10's JPEG copy"
        else
            rm -rf .gpudata/cifar10-jpeg
            echo "prepare: CIFAR-10's JPEG copy left out (it would take the call over ${LIMIT_MIB} MiB): the draw's CIFAR-10 conditions will say 'not reached'" >&2
        fi
    else
        rm -rf .gpudata/cifar10-jpeg
        echo "prepare: no CIFAR-10 copy at $cifar (GPU_CHECK_CIFAR10 names it): the draw's CIFAR-10 conditions will say 'not reached'" >&2
    fi
    size=$(travel_mib)
    echo "prepared: .whl ($(ls .whl | wc -l) wheels), .gpudata/mnist ($carried); the call carries ${size} MiB of ${LIMIT_MIB}"
    awk -v s="$size" -v l="$LIMIT_MIB" 'BEGIN { exit !(s < l - 2) }' \
        || fail "${size} MiB would travel: over the ${LIMIT_MIB} MiB a call takes (less 2 MiB of margin)"
    cat <<EOF
The device call (device tool, verb run), then give_back at once:
  command:   bash scripts/bench/gpu_check.sh draw
  carry:     [".whl", ".gpudata"]
  timeout_s: 600
EOF
    exit 0
fi

out=${OUT:-outputs/gpu_check/$stage}
export PYTHONUNBUFFERED=1
check_data
install_wheels  # both refuse before anything is written
data=$(cd "$data" && pwd)
if [ "$stage" = draw ]; then  # its steps are checked, and $out made, by gpu_draw.py
    exec $py scripts/bench/gpu_draw.py --device "$device" --data "$data" --out "$out" --budget "$budget" "${@:2}"
fi
mkdir -p "$out"
# Every run reads the carried MNIST and never downloads.  A data folder inside the checkout is named
# relative to it (fedrun runs from the repository root), so the runs' config.yaml holds no machine
# path and a run resumes from a checkout anywhere (resume refuses a config whose settings differ).
case $data in "$PWD"/*) data=${data#"$PWD"/} ;; esac
mnist=(dataset=mnist "dataset.load.search=[$data]" dataset.load.download=false)
t0=$(date +%s)
limit() {  # run "$@" within what is left of the stage's budget (all its commands together)
    local left=$(( budget - ($(date +%s) - t0) ))
    if [ "$left" -le 5 ]; then echo "gpu_check: budget of $budget s spent; skipped: $*"; return 124; fi
    timeout --signal=TERM --kill-after=15 "$left" "$@"
}
pack() {  # run folders into one archive (checkpoints and model files left out): $1 folder, $2 archive
    tar -czf "$2" -C "$1" --exclude=checkpoint.pt --exclude=output_layer.csv --exclude=models . && rm -rf "$1"
}

case $stage in
bench)
    workloads=("${@:2}")
    [ ${#workloads[@]} -gt 0 ] || workloads=(small fednnnn_mnist fednnnn_cifar10)
    limit $py scripts/bench/bench.py "${workloads[@]}" --device "$device" --profile 2>&1 \
        | grep -v -e '^USDT' -e 'profiler_st' | tee "$out/bench.log"
    ;;
regularizers)
    # 6,000 images a client: the whole MNIST's parties (94 steps an epoch); tiny: 64 (one step).
    sizing=(--images 6000 --repeat 3)
    [ "${GPU_CHECK_SIZE:-full}" = tiny ] && sizing=(--images 64 --repeat 1)
    limit $py scripts/bench/bench_regularizers.py --device "$device" "${sizing[@]}" 2>&1 | tee "$out/regularizers.log"
    ;;
chunks)
    limit $py scripts/bench/bench.py fednnnn_mnist fednnnn_cifar10 --device "$device" --engines batched \
        --clients-per-step auto,10,25,50 2>&1 | tee "$out/chunks.log"
    ;;
modes)
    for mode in "--precision tf32" "--precision bf16" "--compile"; do
        # shellcheck disable=SC2086 # $mode is two words on purpose
        limit $py scripts/bench/bench.py fednnnn_mnist fednnnn_cifar10 --device "$device" --engines batched $mode 2>&1 \
            | tee -a "$out/modes.log"
    done
    ;;
accuracy)
    limit $py scripts/bench/precision_check.py --out "$out/precision" device="$device" engine=batched \
        experiment=fednnnn/mnist_noniid_b "${mnist[@]}" aggregator=fedavg hyperparams.rounds=30 2>&1 \
        | grep -v INFO | tee "$out/accuracy.log"
    cp "$out/precision/precision_check.csv" "$out/" 2>/dev/null
    pack "$out/precision" "$out/accuracy_runs.tar.gz"
    ;;
bookkeeping)
    for model in mlp mnist_cnn; do
        limit $py scripts/bench/bench_bookkeeping.py --model $model --device "$device" --engine batched --clients 10,100 \
            --aggregators fedavg,fednnnn,fedlayerwise --vanilla 2>&1 | tee -a "$out/bookkeeping.log"
    done
    ;;
population)
    limit $py scripts/bench/bench.py population --workload grid --rounds 3 --repeat 1 --device "$device" 2>&1 \
        | grep -v 'round/s' | tee "$out/population.log"
    ;;
niidbench)
    # docs/reproductions.md's NIID-Bench MNIST rows on the whole MNIST (the CPU ran 10,000 images).
    # Each chain of jobs is its own process, all at once.  The GPU is the bound (docs/performance.md:
    # this CNN's lock-step is ~140-250 small kernels): on one H200 SCAFFOLD's 3 runs took 16.3 s a
    # round alone, 18.5 s beside two 12-run populations; processes side by side add throughput up to
    # about four, and a population shares most kernels among its runs, so populations are the default.
    #   PART             c1|c2|c3|dir05|iid: FedAvg, FedProx, SCAFFOLD, FedNova x seeds 0,1,2 as one
    #                    population, into niidbench/mnist_PART/<method>_seed<seed> (Table III's layout)
    #   PART:READING     SCAFFOLD alone, seeds 0,1,2, with READING = after_step (NIID-Bench's code) or
    #                    gradient (the preset's) of its correction, into readings/mnist_PART_READING/scaffold_seed<seed>
    #   JOB+JOB          one after the other in one process (the second gets what is left of the budget)
    # Every run stops at the stage's budget with the rounds it finished, and goes on at the next call:
    # niidbench_resume_<chain>.tar.gz holds its run folders with their checkpoints.  Committed as
    # outputs/reproductions/niidbench_gpu/resume/niidbench_resume_<chain>.tar.gz (replacing the
    # chain's older one), they travel with the checkout and the next call's jobs resume from them
    # (resume=true: a run with no checkpoint starts at round 1, a finished one is left as it is);
    # unpacked into .gpuruns/ and carried (carry [".whl", ".gpudata", ".gpuruns"]) they do the same
    # within one checkout, and .gpuruns, when there is one, is taken instead.  Git-ignored folders
    # do not outlive a checkout: commit the archives to keep a loan's rounds.
    # Unpack niidbench.tar.gz (no checkpoints) and collect with
    # python scripts/niidbench/table3.py collect <folder>/niidbench.
    size=()
    [ "${GPU_CHECK_SIZE:-full}" = tiny ] && size=(scale=tiny hyperparams.rounds=2)
    subdir='hydra.sweep.subdir=${hydra:runtime.choices.aggregator}_seed${seed}'
    niid_job() {  # one JOB: its sweep, under what is left of the budget
        local part=${1%%:*} what=(aggregator=fedavg,fedprox,scaffold,fednova) dir=$out/niidbench/mnist_${1%%:*}
        if [ "$1" != "$part" ]; then
            what=(aggregator=scaffold "aggregator.correction=${1#*:}") dir=$out/readings/mnist_${part}_${1#*:}
        fi
        if [ "${GPU_CHECK_SPLIT:-population}" = population ]; then
            limit $py -m fedrun -m "experiment=niidbench/mnist_$part" "${what[@]}" seed=0,1,2 "${mnist[@]:1}" \
                device="$device" threads=2 progress=false hydra/launcher=population "${size[@]}" resume=true \
                "hydra.sweep.dir=$dir" "$subdir"
            return
        fi
        # GPU_CHECK_SPLIT=run: every (method, seed) its own process, all at once.  Measured on one
        # H200 (#C=2's 15 runs): 0.52 run-rounds a second, no more than three populations gave, since
        # the GPU and not Python is the bound; kept to measure that again after a change.
        local methods=${what[0]#aggregator=} m s rcs=() pids=() logs=$out/split_logs/${1//:/_}
        mkdir -p "$logs"
        for m in ${methods//,/ }; do
            for s in 0 1 2; do
                limit $py -m fedrun -m "experiment=niidbench/mnist_$part" aggregator=$m "${what[@]:1}" seed=$s \
                    "${mnist[@]:1}" device="$device" threads=1 progress=false "${size[@]}" resume=true \
                    "hydra.sweep.dir=$dir" "$subdir" > "$logs/${m}_seed$s.log" 2>&1 &
                pids+=($!)
            done
        done
        for p in "${pids[@]}"; do wait "$p"; rcs+=($?); done
        for f in "$logs"/*.log; do echo "== $1 $(basename "$f" .log)"; cat "$f"; done
        rm -rf "$logs"
        echo "split $1: exit codes ${rcs[*]}"
        for r in "${rcs[@]}"; do [ "$r" = 0 ] || return "$r"; done
    }
    # The runs to go on with: GPU_CHECK_RUNS, else .gpuruns when there is one, else the resume
    # archives committed under $RESUME (so that a later loan, in a later checkout, continues them).
    # A folder of run folders is copied; a folder of niidbench_resume_*.tar.gz archives is unpacked.
    carried=${GPU_CHECK_RUNS:-.gpuruns}
    [ -n "${GPU_CHECK_RUNS:-}" ] || [ -d "$carried" ] || carried=$RESUME
    # scripts/bench/resume_runs.py: the resume archives' one mechanism (the draw's table2 step uses it too).
    if [ -d "$carried" ]; then
        found=$($py scripts/bench/resume_runs.py take niidbench "$carried" "$out" 2>&1) || fail "niidbench: $found"
        echo "niidbench: continuing the $found checkpointed runs carried in $carried"
    fi
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | tee "$out/niidbench_device.log"
    $py -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$out/niidbench_device.log"
    pids=()
    for chain in "${@:2}"; do
        log=$out/niidbench_${chain//[:+]/_}.log
        ( s=$(date +%s); for job in ${chain//+/ }; do
              j=$(date +%s); niid_job "$job"; echo "job $job: exit $?, $(( $(date +%s) - j )) s wall"
          done; echo "chain $chain: $(( $(date +%s) - s )) s wall" ) > "$log" 2>&1 &
        pids+=($!)
    done
    wait "${pids[@]}"
    rmdir "$out/split_logs" 2>/dev/null
    for chain in "${@:2}"; do tail -n 3 "$out/niidbench_${chain//[:+]/_}.log"; done
    mkdir -p "$out/runs"
    for d in niidbench readings; do [ -d "$out/$d" ] && mv "$out/$d" "$out/runs/"; done
    # Each chain's folders whole, to go on at the next call; a file over 15 MiB would not come back.
    for chain in "${@:2}"; do
        dirs=()
        for job in ${chain//+/ }; do
            d=niidbench/mnist_$job
            [ "$job" != "${job%%:*}" ] && d=readings/mnist_${job%%:*}_${job#*:}
            [ -d "$out/runs/$d" ] && dirs+=("$d")
        done
        [ ${#dirs[@]} -gt 0 ] || continue
        $py scripts/bench/resume_runs.py pack "$out/runs" "$out/niidbench_resume_${chain//[:+]/_}.tar.gz" "${dirs[@]}" \
            || echo "niidbench: $chain's runs with their checkpoints take over 15 MiB: not returned; they start afresh next time"
    done
    pack "$out/runs" "$out/niidbench.tar.gz"
    echo "niidbench: $(( $(date +%s) - t0 )) s wall in all"
    ;;
esac
