"""How tensors get from Triton into ONNX Runtime and back, per instance kind.

* CPU instances (and GPU instances without DLPack in ONNX Runtime): every input is a numpy *view* of the
  stub's shared memory (``as_numpy`` copies nothing), a reshape is a view too, and only a merged batch
  of several requests is copied (``np.concatenate``). Outputs go back as numpy arrays (row slices of a
  merged batch are views); the stub copies them into shared memory once.
* GPU instances (``KIND_GPU`` on the CUDA or TensorRT provider, :func:`device_io`): the model config
  carries ``FORCE_CPU_ONLY_INPUT_TENSORS: no`` in the served view, so an input Triton holds on the GPU
  (a client's CUDA shared memory) arrives as a GPU tensor. A group that is one request and needs no
  padding (:func:`on_device`) is bound to ONNX Runtime with IO binding: GPU inputs as ``OrtValue``
  views of the DLPack tensors (no copy), CPU inputs with ``bind_cpu_input`` (ORT's one H2D copy), the
  outputs allocated on the instance's device and returned as DLPack GPU tensors, so Triton copies them
  straight into the client's CUDA shared memory (or once to the host for HTTP). Other groups (several
  requests to merge, or padding to a fixed size) need tensor arithmetic on the device, which ONNX
  Runtime's Python API does not offer: their GPU inputs are copied to the host and they run as on a
  CPU instance.

Part of the backend folder (see ``model.py``): runs in the stub and imports nothing from ``pipeline``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

GPU_PROVIDERS = ("CUDAExecutionProvider", "TensorrtExecutionProvider")


def device_io(kind: str, providers: list[str], dlpack: bool) -> bool:
    """Whether an instance binds tensors on its GPU: a ``KIND_GPU`` instance whose session runs on the
    CUDA or TensorRT provider, in an ONNX Runtime that imports DLPack tensors (``OrtValue.from_dlpack``)."""
    return kind == "GPU" and dlpack and any(name in GPU_PROVIDERS for name in providers)


def on_device(requests: int, rows: int, run_size: int) -> bool:
    """Whether a group of ``requests`` with ``rows`` rows in all, run at ``run_size`` rows, can stay on
    the device: one request and no padding (merging and padding need device arithmetic)."""
    return requests == 1 and rows == run_size


def host_array(tensor: Any) -> np.ndarray:
    """The tensor as a numpy array: a view of the stub's shared memory for a CPU tensor, a copy for a GPU one."""
    if tensor.is_cpu():
        return tensor.as_numpy()
    import onnxruntime as ort

    return ort.OrtValue.from_dlpack(tensor).numpy()


def request_tensors(request: Any, inputs: list[tuple[str, Any]]) -> dict[str, Any]:
    """The request's input tensors by name (an optional input left out is absent): one ``inputs()`` call,
    where ``pb_utils.get_input_tensor_by_name`` builds the whole list again for every name."""
    wanted = {name for name, _ in inputs}
    return {tensor.name(): tensor for tensor in request.inputs() if tensor.name() in wanted}


def host_feed(tensors: dict[str, Any], inputs: list[tuple[str, Any]], batched: bool) -> dict[str, np.ndarray]:
    """numpy inputs for ONNX Runtime, reshaped as the config's ``reshape`` says (views, not copies)."""
    feed = {}
    for name, reshape in inputs:
        tensor = tensors.get(name)
        if tensor is None:
            continue  # an optional input left out; ORT reports it if the model needs it
        array = host_array(tensor)
        if reshape is not None:
            lead = array.shape[:1] if batched else ()
            array = array.reshape(tuple(lead) + tuple(int(d) for d in reshape))
        feed[name] = array
    return feed


def output_tensors(names: list[str], outputs: list[Any]) -> list[Any]:
    """Triton output tensors: numpy arrays as they are (contiguous ones are not copied here), device
    ``OrtValue``s as DLPack tensors."""
    tensors = []
    for name, out in zip(names, outputs, strict=True):
        if isinstance(out, np.ndarray):
            tensors.append(pb_utils.Tensor(name, out if out.flags.c_contiguous else np.ascontiguousarray(out)))
        else:
            tensors.append(pb_utils.Tensor.from_dlpack(name, out))
    return tensors


def run_on_device(
    session: Any, tensors: dict[str, Any], inputs: list[tuple[str, Any]], outputs: list[str], device_id: int, batched: bool
) -> list[Any]:
    """One request through IO binding on the instance's GPU; its outputs stay there (``OrtValue``s).

    Inputs with a ``reshape`` in the config are taken through the host (a device view cannot be reshaped here)."""
    import onnxruntime as ort

    binding = session.io_binding()
    for name, reshape in inputs:
        tensor = tensors.get(name)
        if tensor is None:
            continue
        if tensor.is_cpu() or reshape is not None:
            binding.bind_cpu_input(name, np.ascontiguousarray(host_feed({name: tensor}, [(name, reshape)], batched)[name]))
        else:
            binding.bind_ortvalue_input(name, ort.OrtValue.from_dlpack(tensor))
    for name in outputs:
        binding.bind_output(name, "cuda", device_id)
    session.run_with_iobinding(binding)
    return list(binding.get_outputs())
