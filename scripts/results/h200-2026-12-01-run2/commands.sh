# The commands of this run (2026-12-01, 22:48-23:06 UTC), from the repository root on the H200, after
# the five parts of the packed site-packages were carried (see .gpu/setup.sh in scripts/bench_gpu.py's docstring).

## .gpu/call5.sh
# Call 5 on the H200 (after parts 1-4): unpack, then the fixed-batch-size check in process and served.
set -u
cp .gpu/pkg/c5/* /tmp/parts/ && rm -rf /tmp/run && cp -r .gpu/run /tmp/run
source .gpu/setup.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $OUT/gpu.txt
python3 -c "import onnxruntime as o; print(o.__version__, o.get_available_providers())" | tee -a $OUT/gpu.txt
R=/tmp/run/repository; RES=/tmp/res5; mkdir -p $RES
timeout 520 python3 scripts/bench_gpu.py run --repository $R --out $RES --phase plans --phase verify --phase shapes \
  --phase asitcomes --phase load --load-batches 1 --shape-max 8 --plan-calls 8 --eval-samples 256 2>&1 | tee $OUT/call5.log
grep -h "fixed_batch_sizes\|shared arena\|own arenas" $RES/work/triton/*.log 2>/dev/null | head -20 > $OUT/backend_lines.txt
cd /tmp && tar czf $OUT/res5.tgz --exclude='*.png' --exclude='*.html' --exclude='calibration' res5; ls -la $OUT

## .gpu/call6.sh
# Call 6: batch 32 and max batch after the fix; tune with measured GPU memory; mig-plan from it.
set -u
source .gpu/setup.sh
R=/tmp/run/repository; RES=/tmp/res6; mkdir -p $RES
timeout 540 python3 scripts/bench_gpu.py run --repository $R --out $RES --phase load --phase tune --load-batches 32,128 \
  --tune-models digits_fp32 mobilenetv2_fp16 --slo-p99-ms 50 --max-trials 3 --max-minutes 2.5 --eval-samples 256 2>&1 | tee $OUT/call6.log
for t in $RES/tune_*/tune.json; do [ -f "$t" ] || continue; m=$(basename $(dirname $t))
  $BENCH_CLIENT_PYTHON -m pipeline mig-plan --gpu H200-141GB --from-tune $t > $RES/migplan_$m.txt 2>&1; done
cd /tmp && tar czf $OUT/res6.tgz --exclude='*.png' --exclude='*.html' --exclude='calibration' res6; ls -la $OUT

## .gpu/call7.sh
# Call 7: loadtest --workers scaling with free cores (issue 20); MobileNetV2 FP16 instances 1/2/4 after the fix.
set -u
source .gpu/setup.sh
RES=/tmp/res7; mkdir -p $RES
timeout 200 python3 scripts/bench_workers.py --server-cores 8 --instances 8 --concurrency 64 --workers 1,2,4 --repeats 1 \
  --json $RES/workers_http.json 2>&1 | tee $OUT/workers.log
timeout 300 python3 scripts/bench_gpu.py run --repository /tmp/run/repository --out $RES --phase instances \
  --instance-models mobilenetv2_fp16 --eval-samples 256 2>&1 | tee $OUT/call7.log
cd /tmp && tar czf $OUT/res7.tgz --exclude='*.png' --exclude='*.html' --exclude='calibration' res7; ls -la $OUT

## workers, 3 repeats
python3 scripts/bench_workers.py --server-cores 8 --instances 8 --concurrency 16,64 --workers 1,2,4 --repeats 3
