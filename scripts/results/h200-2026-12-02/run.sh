# The H200 run of scripts/bench_served_gpu.py (issue 31): unpack the carried wheels into a venv over the
# image's Python (numpy < 2 for the backend stub, onnxruntime-gpu 1.31.1, tritonserver from nvidia-pytriton),
# the CUDA 13 / cuDNN 9 libraries from the image's nvidia-* wheels, then the benchmark.
set -u
REPO=$PWD
export PYTHONUNBUFFERED=1
mkdir -p /tmp/parts && cp .devcarry/p/part_* /tmp/parts/
cd /tmp && cat /tmp/parts/part_* | tar xf - && rm -rf /tmp/parts
python3 -m venv --system-site-packages /tmp/venv
/tmp/venv/bin/python -m pip install -q --no-index --no-deps --no-compile --no-cache-dir /tmp/whl/*.whl 2>&1 | tail -3
NV=$(python3 -c "import nvidia,os;print(':'.join(os.path.join(p,d,'lib') for p in nvidia.__path__ for d in sorted(os.listdir(p)) if os.path.isdir(os.path.join(p,d,'lib'))))")
export LD_LIBRARY_PATH=$NV:${LD_LIBRARY_PATH:-}
mkdir -p /tmp/code && tar xzf $REPO/.devcarry/code.tgz -C /tmp/code && cp -r $REPO/.devcarry/repo /tmp/repo && cp -r $REPO/.devcarry/calibration /tmp/calibration
cd /tmp/code
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $OUT/gpu.txt
/tmp/venv/bin/python -c "import onnxruntime as o, numpy; print('onnxruntime', o.__version__, o.get_available_providers(), 'numpy', numpy.__version__)" | tee -a $OUT/gpu.txt
timeout 480 /tmp/venv/bin/python scripts/bench_served_gpu.py --repository /tmp/repo --calibration-root /tmp/calibration --out /tmp/res \
  --models digits_fp32 mobilenetv2_fp16 --batches 1 32 128 --transports binary system cuda --concurrency 4 --seconds 3 2>&1 | tee $OUT/bench.log
cp /tmp/res/bench_served_gpu.json $OUT/ 2>/dev/null
grep -h "onnxruntime (python) loaded\|error\|Error" /tmp/res/work/triton/*.log 2>/dev/null | cut -c1-400 | tail -20 > $OUT/server_lines.txt
ls -la $OUT
