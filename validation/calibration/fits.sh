#!/usr/bin/env bash
# The global fits behind the [fit] values in hwconfigs/, each with its hold-out check
# (docs/validation.md quotes the results).  Every fit chooses ONE value per GPU or node from a
# grid, on one part of the measured data, and reports the error on data that took no part.
# Usage: bash validation/calibration/fits.sh [OUT]   (about an hour on two cores)
set -euo pipefail
OUT=${1:-out/fit}
PY=${PYTHON:-python}
FIT="$PY validation/calibration/fit.py --out $OUT"
mkdir -p "$OUT"
{
echo "== V100: tensor-core GEMM efficiency on DeepBench's compute-bound GEMMs (random half / other half)"
$FIT --dataset gemm-v100-deepbench --query "2*m*n*k > 1e11" --fixed "gpu.kernel_launch_ns=5.5 us" \
     --param "gpu.gemm_efficiency.fp16=0.84,0.86,0.88,0.90,0.92"
echo "== V100: kernel launch cost on DeepBench's GEMMs up to 1 GFLOP (random half / other half)"
$FIT --dataset gemm-v100-deepbench --query "2*m*n*k <= 1e9" \
     --param "gpu.kernel_launch_ns=4 us,5 us,5.5 us,6 us,7 us"
echo "== MI210: matrix-core GEMM efficiency on the compute-bound GEMMs (random half / other half)"
$FIT --dataset gemm-mi210 --query "3e11 <= 2*m*n*k <= 3e12" \
     --param "gpu.gemm_efficiency.fp16=0.66,0.68,0.70,0.72,0.74"
echo "== MI210: sustained HBM efficiency on large GeLU; held out: the skinny GEMMs (m <= 256)"
$FIT --dataset gelu-mi210 --query "elements >= 2**22" \
     --param "gpu.hbm.sustained_efficiency=0.35,0.40,0.45,0.50,0.55" \
     --holdout-dataset gemm-mi210 --holdout-query "m <= 256 and n == 12288"
echo "== MI210: per-call floor and element-wise memory-level parallelism on GeLU; held out: softmax, then layernorm"
$FIT --dataset gelu-mi210 \
     --param "gpu.kernel_launch_ns=16 us,17 us,18 us,20 us,22 us" --param "gpu.streaming_inflight_bytes_per_thread=2,4,8,16" \
     --holdout-dataset softmax-mi210
$FIT --dataset gelu-mi210 \
     --param "gpu.kernel_launch_ns=16 us,17 us,18 us,20 us,22 us" --param "gpu.streaming_inflight_bytes_per_thread=2,4,8,16" \
     --holdout-dataset layernorm-mi210
echo "== MI210: the part of the L2 that a working set re-read by all CUs keeps, on the softmax (random half / other half); held out: layernorm"
$FIT --dataset softmax-mi210 --param "gpu.l2.shared_fraction=0.5,0.6,0.7,0.8,0.9,1.0"
$FIT --dataset softmax-mi210 --param "gpu.l2.shared_fraction=0.5,0.6,0.7,0.8,0.9,1.0" --holdout-dataset layernorm-mi210
echo "== H200 (and the H100, the same chip): tensor-core GEMM efficiency on the aligned GEMMs above 100 GFLOP (random half / other half)"
$FIT --dataset gemm-h200 --query "2*m*n*k > 1e11" \
     --param "gpu.gemm_efficiency.fp16=0.64,0.66,0.68,0.70,0.72,0.74,0.76"
echo "== H200 (and the H100): the tf32 and fp32 GEMM efficiencies on the H200's squares (tf32 above 100 GFLOP, fp32 from 2048^3); held out: the H100's squares of each type"
$FIT --dataset gemm-h200 --query "dtype == 'tf32' and 2*m*n*k > 1e11" \
     --param "gpu.gemm_efficiency.tf32=0.70,0.73,0.76,0.79,0.82,0.85" \
     --holdout-dataset gemm-h100 --holdout-query "dtype == 'tf32'"
$FIT --dataset gemm-h200 --query "dtype == 'fp32' and 2*m*n*k > 1e10" \
     --param "gpu.gemm_efficiency.fp32=0.74,0.77,0.80,0.83,0.86" \
     --holdout-dataset gemm-h100 --holdout-query "dtype == 'fp32'"
echo "== H200 (and the H100): the mma.sync path's matrix rate and the fallback kernels' cost per narrow access, on the GEMMs whose rows are not 16-byte aligned and FlashAttention-2's published forward calls (random half / other half of each)"
$FIT --dataset gemm-h200-unaligned --dataset attention-h100-published \
     --query "attention-h100-published:direction == 'forward'" \
     --param "gpu.gemm_fallback.mma_fraction=0.50,0.54,0.58,0.62,0.66" \
     --param "gpu.gemm_fallback.access_cycles=0.13,0.16,0.19"
echo "== H100 (and the H200): the exposed share of a lone workgroup's shared-memory traffic, on FlashAttention-2's published backward calls (random half / other half)"
$FIT --dataset attention-h100-published --query "direction == 'backward'" \
     --fixed "gpu.gemm_fallback.mma_fraction=0.58" --fixed "gpu.gemm_fallback.access_cycles=0.16" \
     --param "gpu.cu.lone_workgroup_lds_exposure=0.1,0.2,0.3,0.4,0.5"
echo "== H200 (and the H100): the share of the L2 that writes may hold waiting for their write-back, on the memory-bound GEMMs and element-wise calls after the cold method's flush (random half / other half); held out: every H100 data set"
$FIT --dataset gemm-h200 --dataset elementwise-h200 \
     --query "gemm-h200:m*n*k/(m*k+k*n+m*n) < 130" --query "elementwise-h200:elements <= 2**27" \
     --param "gpu.l2.dirty_fraction=0.4,0.55,0.7,0.85" --seed 1
echo "== A100: tensor-core GEMM efficiency on LLMCompass's GEMMs above 100 GFLOP (random half / other half)"
$FIT --dataset gemm-a100 --query "2*m*n*k > 1e11" \
     --param "gpu.gemm_efficiency.bf16=0.84,0.88,0.90,0.92,0.94,0.96,0.98,1.0"
echo "== A100: activate windows per HBM2e channel (pseudo-channels) on vidur's phi-2 GEMMs; held out: the GPT-3 layer's calls"
$FIT --dataset mlp-a100-phi2 --query "op in ['attn_pre_proj', 'attn_post_proj', 'mlp_up_proj', 'mlp_down_proj']" \
     --param "gpu.hbm.pseudo_channels=1,2" \
     --holdout-dataset transformer-layer-a100 --holdout-query "op != 'softmax'"
echo "== LLMCompass's A100 host: the per-call cost of each kind of call on its smallest calls (random half / other half)"
$FIT --dataset gemm-a100 --query "2*m*n*k < 1e10" --param "gpu.kernel_launch_ns=20 us,22 us,24 us,26 us,28 us,30 us"
$FIT --dataset softmax-a100 --query "m*n <= 2**20" --param "gpu.kernel_launch_ns=6 us,8 us,9 us,10 us,11 us,12 us,14 us"
$FIT --dataset layernorm-a100 --query "m*n <= 2**20" --param "gpu.kernel_launch_ns=40 us,42 us,44 us,46 us,48 us,50 us"
$FIT --dataset gelu-a100 --query "elements <= 2**22" --param "gpu.kernel_launch_ns=40 us,42 us,44 us,46 us,48 us"
echo "== DGX A100: CU in-flight bytes (NCCL channel throughput) and collective launch cost, 2-8 GPUs (random half / other half)"
$FIT --dataset allreduce-dgx-a100 --query "gpus < 16" --points 60 \
     --param "gpu.cu.max_inflight_bytes=16384,20480,24576" --param "collectives.launch_ns=20 us,25 us,30 us"
echo "== DGX A100: links' flow-control window, 2-8 GPUs in a node (random half / other half)"
$FIT --dataset allreduce-dgx-a100 --query "gpus < 16" --points 150 --mode full \
     --param "links.credit_bytes=512 KiB,768 KiB,1 MiB,1536 KiB,2 MiB"
echo "== HGX H100: CU in-flight bytes (NCCL channel throughput) and collective launch cost, 2-8 GPUs (random half / other half)"
$FIT --dataset allreduce-hgx-h100 \
     --param "collectives.launch_ns=2 us,5 us,8 us,10 us,15 us,20 us" \
     --param "gpu.cu.max_inflight_bytes=32768,49152,65536,98304,131072,196608"
echo "== DGX A100 network on two nodes of 1, 2, 4 GPUs; held out: 16 GPUs on two nodes"
$FIT --dataset allreduce-dgx-a100-2nodes --points 30 --mode full \
     --param "network.nic_bandwidth=5 GB/s,6 GB/s" --param "network.node_bandwidth=18 GB/s,22 GB/s" \
     --param "network.latency=15 us,25 us" \
     --holdout-dataset allreduce-dgx-a100 --holdout-query "gpus == 16" --holdout-points 24
echo "== T3 rings: a collective channel's bytes in flight on the dissertation's Fig. 8.4 (8 CUs); held out: 16 CUs"
$PY validation/calibration/channel_inflight_t3.py
} 2>&1 | tee "$OUT/fits.log"
