# The H200 run of 2026-12-02 (16:10-16:15 UTC), issue 31. Built on the CPU machine: the bundled digits model
# (build --fp16) and Keras Applications MobileNetV2 224x224x3 (scripts/bench_gpu.py:mobilenet_v2_224, build --fp16
# --max-batch 128 with bench_gpu.py's MOBILENET_BUILD_ARGS); carried: digits_fp32 and mobilenetv2_fp16 only,
# 16 MobileNetV2 evaluation samples, this branch's code (git archive), and cp312 wheels (onnxruntime-gpu 1.31.1,
# numpy 1.26.4, nvidia-pytriton 0.7.0, tritonclient 2.73.0, gevent, geventhttpclient, greenlet, python-rapidjson,
# pyzmq, zope.event, zope.interface, brotli) as one tar split into six 57 MiB parts.

## calls 1-5 (one part each, back to back)
mkdir -p /tmp/parts && cp .devcarry/cN/part_* /tmp/parts/

## call 6: run.sh (beside this file); its venv lacked the image's own packages (a venv made from
## /opt/torch/.venv's python3 does not see that venv's site-packages), so the benchmark failed at import.

## call 7: the image's site-packages behind the venv's, then the benchmark
SP=$(python3 -c "import site;print(site.getsitepackages()[0])"); echo $SP > /tmp/venv/lib/python3.12/site-packages/zz_image.pth
export LD_LIBRARY_PATH=<the image's nvidia/*/lib folders>
cd /tmp/code && timeout 500 /tmp/venv/bin/python scripts/bench_served_gpu.py --repository /tmp/repo --calibration-root /tmp/calibration \
  --out /tmp/res --models digits_fp32 mobilenetv2_fp16 --batches 1 32 128 --transports binary system cuda --concurrency 4 --seconds 3

## call 8: in process, numpy in/out vs IO binding with input and outputs on the GPU (inprocess_iobinding.txt):
## the same session (backend's providers and session options), 2 s per row after 20 warm-up runs.
