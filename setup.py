"""Builds `jobwrap`, the local job wrapper (workflow_engine/sandbox/jobwrap.c), into the
package when it is installed from source (`pip install .`, a wheel, the container image).

Everything else is in pyproject.toml. Local jobs run only through jobwrap: without a C
compiler the package still installs (an engine whose jobs run on worker nodes, or the client
commands, need no jobwrap), but the local sandbox (`WORKFLOW_ENGINE_WORKER=sandbox`, the
default) and `workflow-engine worker-node` refuse to start, saying how to build it. `make
install` (an editable install) builds it in place instead.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py

SOURCE = Path("workflow_engine/sandbox/jobwrap.c")


def compile_jobwrap(target: Path) -> None:
    flags = ["-O2", "-Wall", "-Wextra", "-o", str(target), str(SOURCE)]
    # Against musl where it is installed: glibc's start-up asks the CPU for its cache layout,
    # which a virtual machine traps (see the Makefile).
    musl = shutil.which("musl-gcc")
    if musl and subprocess.run([musl, "-static", *flags], check=False).returncode == 0:
        return
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        print(
            "jobwrap: no C compiler, so jobwrap is not built: the local sandbox and worker-node "
            "will refuse to start; install a C compiler (cc) and reinstall, or use the image"
        )
        return
    # Static where the C library allows it: no dynamic loader to run per job.
    if subprocess.run([compiler, "-static", *flags], check=False).returncode != 0:
        subprocess.run([compiler, *flags], check=True)


class BuildPyWithJobwrap(build_py):
    def run(self) -> None:
        super().run()
        if not self.editable_mode:
            compile_jobwrap(Path(self.build_lib) / SOURCE.with_suffix(""))


class PlatformWheel(bdist_wheel):
    """The wheel holds jobwrap, a program for this machine's processor: tag it for this
    platform (py3-none-linux_x86_64, ...), not as pure Python (py3-none-any), so that pip
    never installs it where jobwrap cannot run."""

    def finalize_options(self) -> None:
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self) -> tuple[str, str, str]:
        _, _, platform = super().get_tag()
        return "py3", "none", platform


setup(cmdclass={"build_py": BuildPyWithJobwrap, "bdist_wheel": PlatformWheel})
