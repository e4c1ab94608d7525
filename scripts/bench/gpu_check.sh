#!/usr/bin/env bash
# The GPU measurements and checks of the batched engine, one stage per call on a GPU machine
# (each stage is sized to end within its 10-minute limit on one H100), from the repository root:
# bash scripts/bench/gpu_check.sh STAGE, with STAGE one of
#
#   tests      CUDA tests: engines on the GPU == on the CPU, auto chunk from
#              real free memory, TF32/bf16 bounds, a CLI run (~2 min)
#   bench      bench.py small, fednnnn_mnist, fednnnn_cifar10 in FP32, both
#              engines side by side, with a profile of a round (~6 min)
#   chunks     the batched engine with 10, 25, 50 clients a step and auto (all
#              that fit), both FedNNNN workloads: is all-at-once fastest? (~4 min)
#   modes      TF32, bf16 and torch.compile vs FP32 (speed and first-round
#              updates), batched engine, both FedNNNN workloads (~6 min)
#   accuracy   precision_check.py: FedNNNN's MNIST preset on FashionMNIST,
#              30 rounds per mode, test accuracy of each mode vs FP32 (~5 min)
#   fullrun    the full FedNNNN MNIST run (100 rounds, K = 100, E = 5) from
#              the CLI on FashionMNIST (same shapes): its wall time and the
#              share of each round outside training and evaluation (~1-5 min)
#   bookkeeping  bench_bookkeeping.py: aggregation, diagnostics, rows and
#              checkpoint per round (and host transfers), MLP and MNIST CNN,
#              10 and 100 clients a round, batched engine (~3 min)
#   population  bench.py population: FedNNNN's 25-run MNIST grid (beta x gamma),
#              3 rounds one by one vs as one population (~5-8 min)
#   populationrun [overrides]  the whole 25-run grid, 100 rounds, from the
#              CLI with hydra/launcher=population on FashionMNIST, timed (target
#              < 5 min); overrides such as checkpoint_every=10 are added to it
#   niidbench PARTITION  NIID-Bench Table III's FashionMNIST row for one partition
#              (dir05, c1, c2, c3 or iid): 4 methods x seeds 0,1,2, 50 rounds,
#              as one population (untimed: the CPU cannot hold these cells)
#
# Logs and CSVs go to $OUT if set, else outputs/gpu_check.
# A GPU machine without network access, with torch but not hydra-core/omegaconf: carry them as
# wheels in .whl/ and FashionMNIST's four .gz files in .gpudata/ (both ignored by git), e.g.
#   mkdir -p .git/info && printf '/.whl/\n/.gpudata/\n' >> .git/info/exclude
#   pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl hydra-core==1.3.8 omegaconf==2.3.1
#   pip wheel --no-deps -w .whl antlr4-python3-runtime==4.9.3
#   mkdir -p .gpudata && cp ../shared/data/fashion-mnist/*.gz .gpudata/
# and name both in the call's carry: ["./.whl", "./.gpudata"].
set -uo pipefail
stage=${1:?usage: bash $0 tests|bench|chunks|modes|accuracy|fullrun|bookkeeping|population|populationrun|niidbench}
out=${OUT:-outputs/gpu_check}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}

if ! $py -c "import hydra, omegaconf" 2>/dev/null; then
    [ -d .whl ] || { echo "gpu_check: hydra-core/omegaconf missing and no .whl/ folder to install them from"; exit 2; }
    $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 2
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # fedrun from this checkout, not installed
[ -d .gpudata ] && export FEDRUN_DATA=$PWD/.gpudata
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee "$out/device.txt"
$py -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" | tee -a "$out/device.txt"

case $stage in
tests)
    $py -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_augment.py -k "cuda" 2>&1 | tee "$out/tests.log"
    # The CPU equivalence suite of the engines, on this machine too (fast, and a second platform).
    $py -m pytest -q -p no:cacheprovider tests/test_batched.py 2>&1 | tail -3 | tee -a "$out/tests.log"
    ;;
bench)
    $py scripts/bench/bench.py small fednnnn_mnist fednnnn_cifar10 --device cuda --profile 2>&1 \
        | grep -v -e '^USDT' -e 'profiler_st' | tee "$out/bench.log"
    ;;
chunks)
    $py scripts/bench/bench.py fednnnn_mnist fednnnn_cifar10 --device cuda --engines batched \
        --clients-per-step auto,10,25,50 2>&1 | tee "$out/chunks.log"
    ;;
modes)
    for mode in "--precision tf32" "--precision bf16" "--compile"; do
        $py scripts/bench/bench.py fednnnn_mnist fednnnn_cifar10 --device cuda --engines batched $mode 2>&1 \
            | tee -a "$out/modes.log"
    done
    ;;
accuracy)
    $py scripts/bench/precision_check.py --out "$out/precision" device=cuda engine=batched \
        experiment=fednnnn/mnist_noniid_b dataset=fmnist aggregator=fedavg hyperparams.rounds=30 2>&1 \
        | grep -v INFO | tee "$out/accuracy.log"
    cp "$out/precision/precision_check.csv" "$out/" 2>/dev/null
    rm -rf "$out/precision"  # run dirs: too many files to bring back
    ;;
fullrun)
    start=$(date +%s)
    $py -m fedrun experiment=fednnnn/mnist_iid_b dataset=fmnist device=cuda progress=false \
        hydra.run.dir="$out/fullrun" 2>&1 | tail -5 | tee "$out/fullrun.log"
    echo "full FedNNNN MNIST-shaped run: $(( $(date +%s) - start )) s wall, process start to exit" | tee -a "$out/fullrun.log"
    $py -c "import pandas as pd; r = pd.read_csv('$out/fullrun/rounds.csv').iloc[1:]; rest = r.wall_s - r.train_s - r.eval_s; print(f'rounds 2-{len(r) + 1}: train {r.train_s.mean():.3f} s, eval {r.eval_s.mean():.3f} s, bookkeeping {rest.mean():.3f} s a round ({rest.sum() / r.wall_s.sum():.1%} of the wall time)')" | tee -a "$out/fullrun.log"
    cp "$out/fullrun/rounds.csv" "$out/fullrun_rounds.csv" && rm -rf "$out/fullrun"
    ;;
population)
    # 25 runs of FedNNNN's MNIST grid (beta x gamma): 3 rounds each one by one, then as a population.
    $py scripts/bench/bench.py population --workload grid --rounds 3 --repeat 1 --device cuda 2>&1 \
        | grep -v 'round/s' | tee "$out/population.log"
    ;;
populationrun)
    # The whole 25-run grid from the CLI as one population, 100 rounds (FashionMNIST: MNIST's shapes).
    start=$(date +%s)
    $py -m fedrun -m experiment=fednnnn/mnist_iid_b dataset=fmnist device=cuda progress=false aggregator=fednnnn \
        aggregator.beta=0.5,0.6,0.7,0.8,0.9 aggregator.gamma=0.5,0.6,0.7,0.8,0.9 hydra/launcher=population \
        hydra.sweep.dir="$out/populationrun" "${@:2}" 2>&1 | grep -e 'population of' -e 'runs alone' -e 'error' | tee "$out/populationrun.log"
    echo "25-run FedNNNN MNIST-shaped grid as a population: $(( $(date +%s) - start )) s wall, process start to exit" \
        | tee -a "$out/populationrun.log"
    $py -c "import pandas as pd; r = pd.read_csv('$out/populationrun/0/rounds.csv').iloc[1:]; print(f'rounds 2-{len(r) + 1}: train {r.train_s.mean():.3f} s, eval {r.eval_s.mean():.3f} s, all {r.wall_s.mean():.3f} s a round for the 25 runs')" | tee -a "$out/populationrun.log"
    rm -rf "$out/populationrun"
    ;;
niidbench)
    # docs/reproductions.md's NIID-Bench section: the FashionMNIST cells a 2-core CPU cannot run
    # (25-30 min a run there). Run folders come back without checkpoints; collect them with
    # python scripts/niidbench_table3.py collect <the folder>.
    part=${2:?usage: bash $0 niidbench dir05|c1|c2|c3|iid}
    start=$(date +%s)
    $py scripts/niidbench_table3.py run --population --datasets fmnist --partitions "$part" --seeds 0,1,2 \
        --set device=cuda --out "$out/niidbench" 2>&1 | grep -v INFO | tee -a "$out/niidbench_$part.log"
    echo "NIID-Bench fmnist_$part, 12 runs as one population: $(( $(date +%s) - start )) s wall" | tee -a "$out/niidbench_$part.log"
    find "$out/niidbench" \( -name checkpoint.pt -o -name output_layer.csv \) -delete
    ;;
bookkeeping)
    for model in mlp mnist_cnn; do
        $py scripts/bench/bench_bookkeeping.py --model $model --device cuda --engine batched --clients 10,100 \
            --aggregators fedavg,fednnnn,fedlayerwise --vanilla 2>&1 | tee -a "$out/bookkeeping.log"
    done
    ;;
*)
    echo "gpu_check: stage must be one of tests, bench, chunks, modes, accuracy, fullrun, bookkeeping, population, populationrun, niidbench (got '$stage')"; exit 2
    ;;
esac
