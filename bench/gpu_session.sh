#!/usr/bin/env bash
# What a lent GPU machine (the `device` tool; results/README.md "GPU runs") runs, as calls on the warm machine:
#
#   GPU_BUDGET_S=300 bash bench/gpu_session.sh check   # CUDA tests (tests/test_cuda.py), GPU timing benchmarks
#   GPU_BUDGET_S=380 bash bench/gpu_session.sh appf    # App. F of global inducing points (gi_mnist500) until then
#   GPU_BUDGET_S=560 bash bench/gpu_session.sh queue   # the GPU queue (bench/gpu_queue.py, `make gpu-queue`) until then
#   GPU_BUDGET_S=520 bash bench/gpu_session.sh probes  # the misses' CPU experiments (results/probes), a core each
#   GPU_BUDGET_S=480 bash bench/gpu_session.sh graphs  # compile=true on the GPU (issue 31, section 3): the MNIST steps
#                                                      # eager and as CUDA graphs, then every CUDA test (compiled too;
#                                                      # TESTS_K=<expr>: those pytest -k selects)
#   GPU_BUDGET_S=570 bash bench/gpu_session.sh eig     # SLANG Table 3's eigensolvers and step variants on the GPU
#                                                      # (bench/slang_gpu_eig.py, issue 31), then every CUDA test
#
# queue: runs `bench/gpu_queue.py --budget <left> --fill` in the repository's runs root (the committed records travel
# with the working tree, so finished cells are skipped) and brings back, in $OUT: queue.txt (its console),
# runs.tar.gz (the records, histories and failures it wrote: `tar -xzf runs.tar.gz -C results/runs`), gpu_queue.tar.gz
# (benchmark JSON, logs, queue.json: `tar -xzf gpu_queue.tar.gz -C results/gpu_queue`) and, where it fits a transfer
# (at most 48 MiB), the resume state of the cell it left unfinished as resume.tar.part-* (`cat resume.tar.part-* |
# tar -xf - -C results/runs`; commit it with `git add -f` after `git rm` of a record of another protocol beside it,
# as tests/run/test_committed_records.py wants; the next lease continues the cell). QUEUE_ARGS adds options (--only ...).
#
# The machine has torch, numpy, scipy, pandas, scikit-learn, matplotlib and pytest but not hydra-core, omegaconf,
# antlr4, platformdirs or laplace-torch (the Laplace methods' tests) and its needs: those and bnnbench itself travel
# as wheels in .whl/ (carry .whl and .gpu), made here by
#   pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl hydra-core==1.3.2 omegaconf==2.3.0 \
#       platformdirs==4.3.6 laplace-torch==0.3 backpack-for-pytorch==1.7.1 curvlinops-for-pytorch==3.0.1 \
#       unfoldNd==0.2.3 einconv==0.1.0 asdfghjkl==0.1a4; pip wheel --no-deps -w .whl antlr4-python3-runtime==4.9.3 .
# and MNIST, boston and two LIBSVM sets travel in .gpu/data (the mirror's layout). Outputs go to $OUT: logs, and
# runs.tar.gz with the finished cells' records to unpack into results/runs.
# BNNBENCH_GIT_COMMIT names the commit the wheel was built from (the machine's copy has no git history).
set -u
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
REPO=$PWD
DEADLINE=$((SECONDS + ${GPU_BUDGET_S:-480}))
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
# PYTHONSAFEPATH: the repository's bnnbench/ (no configs package there) must not shadow the installed one
export PYTHONPATH=/tmp/site PYTHONSAFEPATH=1 PYTHONUNBUFFERED=1 BNNBENCH_MIRROR=$REPO/.gpu/data \
    BNNBENCH_CACHE=/tmp/bnnbench-cache BNNBENCH_OFFLINE=1
left() { echo $((DEADLINE - SECONDS)); }
all_cuda_tests() {
    # every CUDA test, the compiled ones (a compilation each, CPU-bound) spread over the machine's cores
    local x=(); python3 -c "import xdist" 2>/dev/null && x=(-p xdist.plugin -n 12)
    (cd /tmp && PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 timeout "$(( $(left) - 10 ))" python3 -m pytest "$REPO/tests/test_cuda.py" \
        -m "" "${x[@]}" ${TESTS_K:+-k "$TESTS_K"} --rootdir "$REPO" -c "$REPO/pyproject.toml" -p no:cacheprovider -q -rfE --durations=8 2>&1) \
        | tee "$OUT/tests.txt"
}

case "${1:-check}" in
check)
    {
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
        python3 -c "import torch, bnnbench; print('torch', torch.__version__, torch.cuda.get_device_name(0), bnnbench.__file__)"
    } 2>&1 | tee "$OUT/env.txt"
    (cd /tmp && PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 timeout 150 python3 -m pytest "$REPO/tests/test_cuda.py" \
        --rootdir "$REPO" -c "$REPO/pyproject.toml" -p no:cacheprovider -q -rfE --durations=5 2>&1) | tee "$OUT/tests.txt"
    # compile=true's CUDA graphs against eager steps (slow tests: a compilation each), BBB and SGD on both networks
    (cd /tmp && PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 timeout 150 python3 -m pytest "$REPO/tests/test_cuda.py" -m slow \
        -k "follow_the_eager_steps and (bbb or sgd)" --rootdir "$REPO" -c "$REPO/pyproject.toml" -p no:cacheprovider \
        -q -rfE 2>&1) | tee -a "$OUT/tests.txt"
    {
        cd bench
        timeout 70 python3 gi_step_ratios.py --device cuda --rounds 5 --steps 5 --threads 4
        timeout 50 python3 gi_step_ratios.py --device cuda --rounds 3 --steps 3 --threads 4 --arch resnet8 \
            --image 3,32,32 --train 50000 --prior spatial_iw
        timeout "$(left)" python3 step_ratios.py --device cuda --steps 50
        PYTHONSAFEPATH= timeout "$(left)" python3 mnist_epoch.py --device cuda --ranks 1,8,32 --steps 20
    } 2>&1 | tee "$OUT/bench.txt"
    ;;
appf)
    # the experiment lists its cells most informative first (the Scale prior, then the spatial prior, ...)
    for w in 1 2 3 4; do   # four processes share the queue: a cell claimed by one is skipped by the others
        (cd /tmp && timeout "$(( $(left) - 20 ))" python3 -m bnnbench.cli reproduce gi_mnist500 --runs-root /tmp/runs \
            --out /tmp/tables device=cuda threads=3 > "$OUT/appf_$w.txt" 2>&1) &
        sleep 2
    done
    wait
    # the records only: a transfer takes files of at most 16 MiB, and gi's checkpoints (its pseudo-outputs are feature
    # maps per inducing point, with their Adam moments) are 400 MB, li's 127 MB
    (cd /tmp/runs && find . -name record.json -o -name history.json -o -name failed.json | tar -czf "$OUT/runs.tar.gz" -T -)
    ls -la "$OUT"; find /tmp/runs -name record.json | sort
    ;;
queue)
    touch /tmp/queue.start
    # PYTHONSAFEPATH (above) keeps the repository's bnnbench/ off sys.path; gpu_queue.py lifts it for bench scripts
    # shellcheck disable=SC2086
    python3 bench/gpu_queue.py --budget "$(( $(left) - 45 ))" --fill --out "$REPO/results/gpu_queue" \
        ${QUEUE_ARGS:-} 2>&1 | tee "$OUT/queue.txt"
    # only what this lease wrote: records, histories and failures (a transfer takes files of at most 16 MiB; the
    # checkpoints are large), the queue's own files, and the resume state where it fits
    (cd results/runs && find . -newer /tmp/queue.start \( -name record.json -o -name history.json -o -name failed.json \) \
        | tar -czf "$OUT/runs.tar.gz" -T -)
    (cd results/gpu_queue && tar -czf "$OUT/gpu_queue.tar.gz" .)
    (cd results/runs && find . -newer /tmp/queue.start -name '.*.pt') > /tmp/resume.list
    if [ -s /tmp/resume.list ]; then
        (cd results/runs && tar -cf /tmp/resume.tar -T /tmp/resume.list)
        if [ "$(stat -c %s /tmp/resume.tar)" -le $((48 * 1024 * 1024)) ]; then
            split -b 15m /tmp/resume.tar "$OUT/resume.tar.part-"
        else
            echo "resume state of $(stat -c %s /tmp/resume.tar) bytes cannot travel back (at most 48 MiB):" \
                "$(tr '\n' ' ' < /tmp/resume.list)"
        fi
    fi
    ls -la "$OUT"
    ;;
graphs)
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee "$OUT/env.txt"
    # the timings first, alone on the GPU: Adam, BBB and SLANG L = 1, 8, 32 eager, then as compile=true steps them
    (cd bench && PYTHONSAFEPATH= timeout 240 python3 mnist_epoch.py --device cuda --ranks 1,8,32 --steps 20 --compile \
        --json "$OUT/mnist_epoch_compile.json" 2>&1) | tee "$OUT/bench.txt"
    all_cuda_tests
    ;;
eig)
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee "$OUT/env.txt"
    # alone on the GPU first: the Gram matrices' eigensolvers, the compiled step per variant, a profile
    (cd bench && PYTHONSAFEPATH= timeout "${EIG_S:-250}" python3 slang_gpu_eig.py --device cuda \
        --json "$OUT/slang_gpu_eig.json" 2>&1) | tee "$OUT/eig.txt"
    all_cuda_tests
    ;;
probes)
    # the misses' measured experiments (results/probes/probes.sh) on the machine's 16 cores, one run per core, until
    # the budget; brings back probes.tar.gz (records, histories, logs and the resume state of unfinished runs:
    # `tar -xzf probes.tar.gz -C results/probes`, then finish them here with the same command)
    mkdir -p /tmp/probes
    # shellcheck disable=SC2086
    # one BLAS thread per process: sklearn's GP fits otherwise take every core in each of the 16 (measured: the
    # replayed rounds of a resumed search crawled)
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 BNNBENCH="python3 -m bnnbench.cli" PROBES_PARALLEL=1 PROBES_ROOT=/tmp/probes timeout "$(( $(left) - 25 ))" \
        bash results/probes/probes.sh ${PROBE_GROUPS:-slang_bbb_yacht_bo nng_bbb vadam_energy_bo}
    sleep 2
    (cd /tmp/probes && tar -czf "$OUT/probes.tar.gz" .)
    find /tmp/probes -name record.json | sort; tail -n 3 /tmp/probes/log.* ; ls -la "$OUT"
    ;;
esac
