#!/usr/bin/env bash
# The one prepared command for a lent GPU machine (one CUDA GPU; run from the repository root):
#
#     OUT=/some/folder bash benchmarks/gpu_session.sh [PART ...]
#
# Parts, in order (default: all), each under its own hard time limit so that one hang cannot eat the lease:
#   check      benchmarks/gpu_check.py     kernels, ring schedule, timings, NCCL (results.json, versions.json)
#   hf         benchmarks/gpu_check_hf.py  transformers Qwen3/Llama with fcp's attention vs stock vs fp64 (results_hf.json)
#   window     benchmarks/gpu_check_window.py  sliding windows: fused banded kernel vs dense fp64, and its speed
#   pytest     tests/exec/test_kernels.py (its CUDA test, and the rest on this machine)
#   train      `fcp train` (1 process, NCCL): Qwen3 bf16 FSDP2 on the bundled text; Qwen2.5-VL bf16 on synthetic video;
#              Qwen2.5-VL with --amp float16 (fp32 parameters, fp16 autocast, the loss scaler); Qwen3 with FSDP2's
#              bf16 mixed precision, gradient clipping and a warm-up + cosine schedule; InternVL on the bundled
#              448-px tiles, saved with --save-model and trained again from those weights (--init pretrained)
#   trainer    examples/train_hf_trainer.py --bf16 and --fp16 under torchrun (FCPTrainer, transformers' Trainer)
#   multigpu   benchmarks/ring_vs_dp_check.py on every GPU (2+): training with rings across GPUs (NCCL) has the
#              losses of training without rings (skipped on one GPU)
#   profile    `fcp profile` of one Qwen3-1.7B-shaped layer in bf16, degree 1: the device's measured compute
#              coefficients (check/cost_gpu.json, check/profile_report.json)
#   megatron   examples/train_megatron_gpt.py under torchrun, fp32, --bf16, --bf16 --distributed-optimizer, --fp16 (needs megatron-core: carry its
#              wheel in .whl/, see BENCHMARKS.md)
#   titan      torchtitan's own `torchrun -m torchtitan.train` with examples/torchtitan_fcp.py (FCPTitanTrainer; bf16
#              FSDP2 mixed precision on a GPU; needs torchtitan 0.3 and its trainer's imports: carry wheels in .whl/)
# Everything is printed and also written to $OUT/session.log; the JSON results go to $OUT/check/ (env.json: `fcp env`).
set -u
OUT=${OUT:-/tmp/fcp-gpu-session}
mkdir -p "$OUT/check"
LOG="$OUT/session.log"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
PY=${PY:-python3}
if ls .whl/*.whl >/dev/null 2>&1; then  # wheels carried for packages the machine lacks (megatron-core)
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/fcp-site .whl/*.whl \
        && export PYTHONPATH="$PYTHONPATH:/tmp/fcp-site"
fi
PARTS=${*:-check hf window pytest train trainer megatron titan multigpu profile}
FAILED=()

part() {  # part NAME LIMIT_S COMMAND...: run with a hard limit, log, remember failures
    local name=$1 limit=$2 t0 rc
    shift 2
    echo "=== $name: $*" | tee -a "$LOG"
    t0=$(date +%s)
    timeout -k 5 "$limit" "$@" 2>&1 | grep -v -E "^\s*$|UserWarning|warnings.warn" | tee -a "$LOG"
    rc=${PIPESTATUS[0]}
    echo "=== $name: rc=$rc in $(( $(date +%s) - t0 )) s" | tee -a "$LOG"
    [ "$rc" = 0 ] || FAILED+=("$name(rc=$rc)")
}

want() { [[ " $PARTS " == *" $1 "* ]]; }

{
    date -u
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
        [ "$(nvidia-smi -L | wc -l)" -ge 2 ] && nvidia-smi topo -m  # how the GPUs are linked (NVLink, PCIe)
    else
        echo "no nvidia-smi on this machine"
    fi
    $PY -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'transformers', transformers.__version__)"
    timeout 60 $PY -m fcp_cli env && timeout 60 $PY -m fcp_cli env --json > "$OUT/check/env.json"  # fcp's view
} 2>&1 | tee -a "$LOG"
want check && part check 170 $PY benchmarks/gpu_check.py --out "$OUT/check" --time-limit 130 --mp-timeout 30
want hf && part hf 80 $PY benchmarks/gpu_check_hf.py --out "$OUT/check"
want window && part window 90 $PY benchmarks/gpu_check_window.py --out "$OUT/check"
want pytest && part pytest 60 $PY -m pytest -q -p no:cacheprovider tests/exec/test_kernels.py
if want train; then
    part train-qwen3 60 $PY -m fcp_cli train --model hf:examples/configs/qwen3-tiny.json --nproc 1 --dtype bfloat16 \
        --steps 3 --reducer fsdp2
    part train-qwen2.5-vl 60 $PY -m fcp_cli train --model hf:examples/configs/qwen2_5_vl-tiny.json --data synthetic \
        --nproc 1 --dtype bfloat16 --steps 3
    part train-amp-fp16 60 $PY -m fcp_cli train --model hf:examples/configs/qwen2_5_vl-tiny.json --data synthetic \
        --nproc 1 --amp float16 --steps 3
    part train-fsdp-mp 60 $PY -m fcp_cli train --model hf:examples/configs/qwen3-tiny.json --nproc 1 --steps 4 \
        --reducer fsdp2 --fsdp-mixed-precision bfloat16 --max-grad-norm 1.0 --warmup-steps 1 --lr-schedule cosine
    part train-internvl 60 $PY -m fcp_cli train --model hf:examples/configs/internvl-tiny.json --nproc 1 \
        --dtype bfloat16 --steps 3 --save-model "$OUT/internvl-trained"
    part train-pretrained 60 $PY -m fcp_cli train --model "hf:$OUT/internvl-trained" --init pretrained --nproc 1 \
        --dtype bfloat16 --steps 1
fi
if want trainer; then
    part trainer 75 $PY -m torch.distributed.run --standalone --nproc-per-node 1 \
        examples/train_hf_trainer.py --bf16 --max-steps 3
    part trainer-fp16 75 $PY -m torch.distributed.run --standalone --nproc-per-node 1 \
        examples/train_hf_trainer.py --fp16 --max-steps 3
fi
if want megatron; then
    part megatron-fp32 60 $PY -m torch.distributed.run --standalone --nproc-per-node 1 examples/train_megatron_gpt.py \
        --steps 3
    part megatron-bf16 60 $PY -m torch.distributed.run --standalone --nproc-per-node 1 examples/train_megatron_gpt.py \
        --steps 3 --bf16
    part megatron-bf16-distopt 60 $PY -m torch.distributed.run --standalone --nproc-per-node 1 \
        examples/train_megatron_gpt.py --steps 3 --bf16 --distributed-optimizer
    part megatron-fp16 60 $PY -m torch.distributed.run --standalone --nproc-per-node 1 examples/train_megatron_gpt.py \
        --steps 3 --fp16
fi
want titan && part titan 90 $PY -m torch.distributed.run --standalone --nproc-per-node 1 -m torchtitan.train \
    --module examples.torchtitan_fcp --config qwen3_debug_fcp --dump_folder "$OUT/titan"
if want multigpu; then
    NGPU=$($PY -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
    if [ "${NGPU:-0}" -ge 2 ]; then
        part multigpu 300 $PY benchmarks/ring_vs_dp_check.py --nproc "$NGPU"
    else
        echo "=== multigpu: skipped ($NGPU GPU: a ring across GPUs needs two)" | tee -a "$LOG"
    fi
fi
want profile && part profile 90 $PY -m fcp_cli profile --nproc 1 --layer-like qwen3-1.7b --dtype bfloat16 \
    --seq-lens 2048,4096,8192,16384,32768 --packed-docs 1,4,16 --packed-lens 256,512,1024 --reps 5 --warmup 2 \
    --out "$OUT/check/cost_gpu.json" --report "$OUT/check/profile_report.json"
echo "gpu_session: parts [$PARTS]; failed: ${FAILED[*]:-none}" | tee -a "$LOG"
[ ${#FAILED[@]} = 0 ]
