"""onnxruntime-extensions' custom-op library: where it is, whether a server can load it, sessions with it.

The raw-input graphs (pipeline/stages/image_preprocess.py) use its ``DecodeImage``. Triton's ONNX Runtime
backend loads such a library through ``model_operations { op_library_filename }``; the repository ships
the file inside the preprocessing model's folder, so nothing is fetched when the server starts.

Which file: the PyPI wheel (``onnxruntime-extensions``, a dependency of the project) ships the ops only inside its
CPython module ``_extensions_pydll``: it needs ``libpython`` loaded, which a Python process has (the
embedded server's Python-based ORT backend, this package) and Triton's C++ backend has not (``dlopen``
fails with ``undefined symbol: Py…``, measured). The standalone ``libortextensions.so`` comes from a
source build (onnxruntime-extensions ``build_lib.sh``, CMake ``OCOS_BUILD_SHARED_LIB``, on by default:
``out/Linux/RelWithDebInfo/lib/libortextensions.so``); ``--extensions-library`` names it.

Its ABI against the server's ONNX Runtime: the library asks the running ORT for its API version at load
(microsoft/onnxruntime-extensions ``shared/ortcustomops.cc``: ``GetOrtVersion`` reads the running ORT's version
string, then ``api->GetApi(ver)``) and supports every ORT from ``MIN_ORT_VERSION_SUPPORTED`` 11, i.e. 1.11
(``includes/onnxruntime_customop.hpp``); measured here: ``GetActiveOrtAPIVersion()`` of 0.15.2 answers 11 before
registration. The NGC images the deploy bundle targets ship ONNX Runtime 1.19.2 (24.10) and later
(pipeline/triton/ngc_releases.py, from triton-inference-server/server ``docs/introduction/compatibility.md``), all
at or above it. Triton's ORT backend calls ``RegisterCustomOpsLibrary`` with ``op_library_filename`` as given
(onnxruntime_backend ``src/onnxruntime.cc``), which ``dlopen`` s it with ``RTLD_NOW | RTLD_LOCAL``.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.core.errors import PipelineError, require
from pipeline.core.lazy import import_optional

LIBRARY_FILE = "libortextensions.so"  # its name in the repository, whichever file it came from
MIN_ORT = (1, 11)  # the oldest ONNX Runtime the library supports (its MIN_ORT_VERSION_SUPPORTED)
STANDALONE_HOWTO = ("build the standalone library from onnxruntime-extensions' sources (./build_lib.sh --config Release, "
                    "gives libortextensions.so) and pass --extensions-library PATH")


@dataclass(frozen=True)
class ExtensionsLibrary:
    """One custom-op library file and whether a process without Python can load it."""

    path: Path
    standalone: bool  # no symbol of libpython left to resolve: Triton's C++ ORT backend can dlopen it
    source: str  # where it came from, in words

    def describe(self) -> str:
        where = "loads in any Triton" if self.standalone else "loads only in a Python process (not in Triton's C++ onnxruntime backend)"
        return f"{self.source}: {self.path} ({where})"


def extensions_library(given: Path | None = None) -> ExtensionsLibrary:
    """The library: ``given`` (``--extensions-library``), else the installed onnxruntime-extensions wheel's.
    PipelineError (one line) when neither exists."""
    if given is not None:
        path = Path(given)
        require(path.is_file(), f"--extensions-library {path} does not exist", STANDALONE_HOWTO)
        return ExtensionsLibrary(path, python_symbols(path) == 0, "--extensions-library")
    module = import_optional("onnxruntime_extensions", None, "build --raw-inputs image")
    path = Path(module.get_library_path())
    return ExtensionsLibrary(path, python_symbols(path) == 0, f"onnxruntime-extensions {module.__version__} (PyPI wheel)")


def python_symbols(path: Path) -> int:
    """How many undefined ``Py…`` symbols the shared library ``path`` needs (0: it loads without libpython).
    Read with the ELF dynamic symbol table (``nm -D``); PipelineError when it is not a shared library."""
    try:
        listing = subprocess.run(["nm", "-D", "--undefined-only", str(path)], capture_output=True, text=True, check=True).stdout
    except FileNotFoundError:
        return _python_symbols_from_elf(path)
    except subprocess.CalledProcessError as exc:
        raise PipelineError(f"{path} is not a shared library ({exc.stderr.strip()[:120]})", STANDALONE_HOWTO) from None
    return sum(1 for line in listing.splitlines() if line.split()[-1:] and line.split()[-1].startswith("Py"))


def _python_symbols_from_elf(path: Path) -> int:
    data = path.read_bytes()
    require(data[:4] == b"\x7fELF", f"{path} is not a shared library", STANDALONE_HOWTO)
    return data.count(b"\x00PyInstanceMethod_Type\x00") + data.count(b"\x00PyBaseObject_Type\x00")


def require_loadable_in_triton(library: ExtensionsLibrary, image: str) -> None:
    """PipelineError (one line) when Triton's C++ ONNX Runtime backend in ``image`` cannot load ``library``."""
    if not library.standalone:
        raise PipelineError(
            f"the raw-input ensemble's decoder needs onnxruntime-extensions' custom ops, and {library.path.name} from "
            f"{library.source} is a CPython module that {image}'s C++ onnxruntime backend cannot load (it needs libpython)",
            STANDALONE_HOWTO,
        )


def session_with_extensions(path: Path, library: Path) -> Any:
    """An ONNX Runtime CPU session for ``path`` with the custom ops of ``library`` registered."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.enable_mem_pattern = False  # images differ in size: see pipeline/triton/ensemble.py preprocess_config
    options.register_custom_ops_library(str(library))
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
