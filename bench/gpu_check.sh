#!/usr/bin/env bash
# The learner's figures on a one-GPU machine, in under 8 minutes: `bash bench/gpu_check.sh` from the
# repository root.
#
# Installs the project into the machine's Python (pip --no-deps --no-build-isolation -e ., at most 60 s),
# then runs each part under its own timeout (then 20 s to stop before a kill), so that one stuck part
# cannot take the others' time: 410 s of limits in all, about 7 minutes with start-up:
#   step   (130 s): StepRunner steps on the GPU, transformers backend, max_policy_lag 0 and 1
#   train   (90 s): training tokens/s of a random-weight Qwen2.5-0.5B-shaped model, 8 x 2048, bf16 autocast
#   smoke  (130 s): `coevolve run --preset smoke` with the transformers backend, when the Kafka clients,
#                   Faust, the embedded broker's binary and a tiny-random model source are present;
#                   otherwise what is missing is printed and the part is skipped. The learner trains
#                   and the transformers backend generates on the GPU.
# Figures are JSON lines on stdout and in $OUT/gpu_check.jsonl when OUT is set; logs go to $OUT too.
# PYTHON picks the interpreter (default python3); extra arguments reach both Python parts
# (e.g. `--device cpu --quick` on a machine without a GPU).
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT_DIR=${OUT:-$(mktemp -d)}
mkdir -p "$OUT_DIR"
started=$SECONDS

note() {
    echo "$1" | tee -a "$OUT_DIR/gpu_check.jsonl"
}

part() {
    local name=$1 limit=$2 log=$3 signal=$4
    shift 4
    local begun=$SECONDS rc
    if [ "$log" = "-" ]; then
        timeout --signal="$signal" --kill-after=20 "$limit" "$@"
        rc=$?
    else
        timeout --signal="$signal" --kill-after=20 "$limit" "$@" >"$log" 2>&1
        rc=$?
    fi
    local status=ok
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        status=timeout
    elif [ "$rc" -ne 0 ]; then
        status=failed
    fi
    note "{\"part\": \"$name-done\", \"status\": \"$status\", \"exit_code\": $rc, \"seconds\": $((SECONDS - begun)), \"limit_s\": $limit}"
}

if timeout 60 "$PY" -m pip install --no-deps --no-build-isolation -e . >"$OUT_DIR/pip.log" 2>&1; then
    note "{\"part\": \"install\", \"status\": \"ok\", \"seconds\": $((SECONDS - started))}"
else
    note "{\"part\": \"install\", \"status\": \"failed\", \"log\": \"pip.log\"}"
    tail -20 "$OUT_DIR/pip.log"
fi
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"

part step 130 - TERM "$PY" -m bench.gpu_check --part step --out "$OUT_DIR" "$@"
part train 90 - TERM "$PY" -m bench.gpu_check --part train --out "$OUT_DIR" "$@"

if "$PY" -m bench.gpu_check --part smoke-prereqs --out "$OUT_DIR"; then
    workdir=$(mktemp -d)
    part smoke 130 "$OUT_DIR/smoke.log" INT "$PY" -c "from coevolve.services.cli import main; main()" run \
        --preset smoke --workdir "$workdir/run" --set learner.backend=transformers \
        --set explorer.backend=transformers --set validator.backend=transformers
    tail -25 "$OUT_DIR/smoke.log"
    # A run stopped by the timeout can leave its services (each in its own session) behind: end those
    # whose command line names this run's workdir, by their ids.
    for pid in $(pgrep -f -- "$workdir/run"); do
        kill "$pid" 2>/dev/null
    done
    if [ -f "$workdir/run/summary.json" ]; then
        cp "$workdir/run/summary.json" "$OUT_DIR/smoke_summary.json"
    fi
else
    note "{\"part\": \"smoke\", \"status\": \"skipped\", \"why\": \"prerequisites missing (see smoke-prereqs)\"}"
fi
note "{\"part\": \"total\", \"seconds\": $((SECONDS - started))}"
